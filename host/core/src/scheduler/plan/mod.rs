//! The plan stage: runtime estimates, reservations of nodes and quota, the backfill rule, and an estimated start for the jobs it planned: the reservations' holders, and the
//! others until [`super::forecast`] gives them theirs.
//!
//! - [`RuntimeModel`]: a job's runtime as it declares it, else as finished jobs of its queue
//!   and shape took (a distribution: p10, p50, p90), else a wide prior. The planner never sees
//!   a job's true duration; the simulator feeds it only what a live cluster would.
//! - Reservations: after a cycle that changed something, while the backlog gate is open, a job
//!   aged past the threshold, whatever blocks it (room, its queue's borrowing limit, its
//!   cohort's idle quota), gets the nodes it would take once enough running jobs end (by their
//!   estimated ends, in order; the same smallest-domain rule as placement), a planned start,
//!   and the quota it will use or borrow ([`ReservationRule`], `QuotaHold`). Younger jobs are
//!   only planned: the smaller jobs that fit pass them, as a greedy cycle lets them. Up to
//!   [`PlanConfig::max_reservations`], holding at most [`PlanConfig::max_reserved_share`] of the
//!   GPUs. Every planned job claims what it takes of each node from its start to its expected
//!   end (a `Claim`); later jobs plan around earlier claims (Slurm's conservative backfill, per
//!   resource).
//! - The quota hold: a job behind an aged reservation's owner may not take, from the owner's
//!   own queue or by borrowing, headroom the owner needs, unless expected (its p90) to end
//!   before the owner's earliest start. Nominal quota of other queues stays guaranteed.
//! - Backfill: a job behind a reservation's owner may use a reserved node only for what the
//!   node keeps beside the reservation, unless it is expected (its p50) to end before the
//!   reservation starts. Balloons ignore reservations: they give way when one comes due. A
//!   preemptor is held off them too (reclaim, balloons, lower priority): its victims are
//!   chosen, and it is placed, outside the reservations of the jobs ahead of it.
//! - Overruns: a job that took a reserved node and runs past its estimate is evicted when the
//!   reservation comes due, if it is preemptible by the reserved job (not of higher priority);
//!   otherwise the reservation slips, and is planned again.
//!
//! Its parts: `runtimes` (the runtime model), `timeline` (free resources as jobs end, claims,
//! the earliest-start walk), `rule` (the reservation rule, quota starts and quota holds),
//! `calibration` (what the plan learns from its own estimates), and here the planner's state,
//! the replan and the backfill rule.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::explain::StartEstimate;
use crate::queues::QueueId;

use super::{JobId, JobSpec, JobState, Scheduler};

mod calibration;
mod forecasts;
mod rule;
mod runtimes;
mod timeline;

use calibration::*;
pub use forecasts::Forecasts;
pub(super) use forecasts::{Arrivals, Forecast, Reach};
use rule::*;
pub use rule::{AGE_RUNTIMES, BACKLOG_RUNTIMES, ReservationRule};
use runtimes::*;
pub use runtimes::{EstimateSource, RuntimeEstimate, RuntimeModel};
use timeline::*;

/// Jobs planned (reserved or only estimated) per replan, in queue order.
const MAX_PLANNED: usize = 64;

/// Knobs of the planner.
#[derive(Debug, Clone)]
pub struct PlanConfig {
    /// Whether the planner runs at all (the anchors never plan): start estimates and what-ifs
    /// behind the jobs ahead. A replan walks one timeline of the running jobs' ends, at most
    /// every `replan_every_s` (`gantry bench schedule` prints its cost at 7,500 nodes).
    pub enabled: bool,
    /// Whether its reservations hold nodes (the backfill rule applies). Without them a big
    /// gang can wait for ever behind a stream of small jobs that take each node as it frees;
    /// the estimates still plan as if they held.
    pub reservations: bool,
    /// Replan at most this often (seconds on the scheduler's clock), besides after a job was
    /// parked for room: a busy cluster changes every cycle.
    pub replan_every_s: f64,
    /// A job waiting (since it was submitted) longer than this gets a reservation of nodes
    /// and quota whatever blocks it (room, its queue's borrowing limit, its cohort's idle
    /// quota), while the backlog gate is open. `None` (the default): the adaptive rule,
    /// [`AGE_RUNTIMES`] learned p90 runtimes (see [`ReservationRule`]).
    pub reserve_after_s: Option<f64>,
    /// The backlog gate: aged jobs get reservations only while the pending work (GPU-seconds
    /// by learned runtimes, over the cluster's GPUs) is under this many seconds. `None` (the
    /// default): the adaptive rule, [`BACKLOG_RUNTIMES`] learned p90 runtimes.
    pub backlog_limit_s: Option<f64>,
    /// Most reservations held at once, given in the order cycles try jobs in: each one holds
    /// capacity idle until it starts, so few keep the cluster busier than many. One by
    /// default, as Slurm's EASY backfill holds: the README's planner section shows what other
    /// values gave.
    pub max_reservations: usize,
    /// Most of the cluster's GPUs all reservations hold together, as a share: a reservation
    /// beyond it waits for an earlier one to start. The first is always given, however big.
    pub max_reserved_share: f64,
    /// Run the forecast (see [`super::forecast`]) at most this often (seconds on the
    /// scheduler's clock); `f64::INFINITY` never runs it. It gives the start estimate of
    /// every pending job it reaches, and costs seven forward runs of the cycle (`gantry bench
    /// schedule` prints it).
    pub forecast_every_s: f64,
    /// Leave the forecast to the caller instead of running it inside the replan: a due
    /// forecast is handed out by [`Scheduler::forecast_to_run`] and its result taken by
    /// [`Scheduler::install_forecast`]. The live loop runs it on a thread of its own, so no
    /// cycle waits for its forward runs; a replay runs it inline, so its report does not
    /// depend on how threads were timed.
    pub forecast_off_loop: bool,
    /// A drawn forecast run steps no more often than this (seconds on the scheduler's clock),
    /// as Slurm's backfill plans at `bf_resolution`: every job end and arrival due by a step
    /// is taken at it. Stepping at every job end, a run on a cluster of thousands of busy
    /// nodes spent its bounded cycles within a second of now.
    pub forecast_step_s: f64,
}

impl Default for PlanConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            reservations: true,
            replan_every_s: 1.0,
            reserve_after_s: None,
            backlog_limit_s: None,
            max_reservations: 1,
            max_reserved_share: 0.5,
            forecast_every_s: 60.0,
            forecast_off_loop: false,
            forecast_step_s: 0.0,
        }
    }
}

/// What the plan says about a job that was not submitted: its runtime estimate, and when it
/// would start behind the pending jobs the last replan covered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WhatIf {
    /// How long the planner expects it to run.
    pub runtime: RuntimeEstimate,
    /// When it would start (seconds on the scheduler's clock); `None` when it would not fit
    /// the cluster even once every running job ended.
    pub start: Option<StartEstimate>,
    /// Where: e.g. `16 nodes in rack 3`.
    pub nodes: Option<String>,
    /// The pending jobs the plan puts ahead of it, whose nodes it keeps off; in a
    /// forecast's answer ([`super::WhatIfRun`]), every pending job of its queue tried before
    /// it.
    pub jobs_ahead: usize,
    /// When the forecast did not reach it: a time it would start later than (seconds on the
    /// scheduler's clock; see [`super::WhatIfRun::run`]).
    pub beyond_s: Option<f64>,
}

/// Nodes held for a job from a planned start.
#[derive(Debug, Clone)]
pub(super) struct Reservation {
    pub(super) nodes: Vec<usize>,
    pub(super) start_s: f64,
}

/// A job's place in the order cycles try jobs in: higher priority first, then earlier
/// submission, then id.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Rank {
    priority: i32,
    submit_s: f64,
    id: JobId,
}

impl Rank {
    pub(super) fn of(id: JobId, spec: &JobSpec) -> Self {
        Self {
            priority: spec.priority,
            submit_s: spec.submit_s,
            id,
        }
    }

    /// The order cycles try jobs in: `Less` when this one goes first.
    pub(super) fn order(&self, other: &Rank) -> std::cmp::Ordering {
        other
            .priority
            .cmp(&self.priority)
            .then(self.submit_s.total_cmp(&other.submit_s))
            .then(self.id.cmp(&other.id))
    }

    /// Whether a job of this rank is tried before one of `other`.
    pub(super) fn ahead_of(&self, other: &Rank) -> bool {
        self.order(other).is_lt()
    }
}

/// The planner's state: what it learned, what it reserved, and what it estimated.
#[derive(Debug, Clone, Default)]
pub(super) struct Plan {
    pub(super) runtimes: RuntimeModel,
    pub(super) job_to_reservation: BTreeMap<JobId, Reservation>,
    /// The reservations' claims, per node they hold: what the backfill rule reads per attempt
    /// (a handful of reservations, so a list beats a per-node table).
    pub(super) reserved_claims: Vec<Claim>,
    /// The quota the reservations hold, one per reservation: what the quota hold reads per
    /// admission (a handful, so a list).
    pub(super) quota_holds: Vec<QuotaHold>,
    /// The rule the last replan gave reservations by.
    pub(super) rule: ReservationRule,
    /// The claims of every job the last replan estimated (held or not), so a what-if plans
    /// around the jobs ahead of it.
    pub(super) planned_claims: Vec<Claim>,
    /// The start estimates of the jobs the last replan covered.
    pub(super) job_to_estimate: BTreeMap<JobId, StartEstimate>,
    /// Each planned job's first estimated wait (when it was made, and how long), until the
    /// job starts and the actual wait is learned from.
    pub(super) job_to_first_wait: BTreeMap<JobId, (f64, f64)>,
    /// How actual waits compared with the plan's first estimates.
    pub(super) calibration: Calibration,
    /// Jobs that took a reserved node by the backfill rule, and the reservation's owner.
    pub(super) backfill_to_owner: BTreeMap<JobId, JobId>,
    /// What the last replan saw: the cluster's releases and the jobs placed so far, so a cycle
    /// that changed nothing does not replan; and when it ran.
    pub(super) planned_for: Option<(u64, u64, usize)>,
    pub(super) planned_at_s: f64,
    /// Set only in the copy of the forecast's late run, which plans on drawn ends (see
    /// `super::forecast`): only its interval makes a replan due, not a new pending job too
    /// (the copy submits the last windows' jobs again, and replanning at each of them is what
    /// made such a copy costly), and it learns no runtime, as its ends are guesses.
    pub(super) drawn_copy: bool,
    /// Which pending jobs got their first estimate, for the cycle's output to list once.
    pub(super) first_estimates: FirstEstimates,
    /// How many reservations went with their owner before it started (withdrawn): a job
    /// parked for room may have been held off their nodes, so each counts as room freed and
    /// wakes it, as a release does. (One that goes as its owner starts frees nothing: the
    /// owner takes the nodes. On a busy cluster a release follows soon anyway; on a quiet one
    /// nothing else would wake the job before the queue's flush.)
    pub(super) reservations_withdrawn: u64,
    /// Counters for reports: reservations made, jobs started on reserved nodes, reservations
    /// that slipped (planned again later than before), backfilled jobs evicted for overrunning.
    pub(super) stats: PlanStats,
    /// Recent submissions, which the forecast expects again.
    pub(super) arrivals: Arrivals,
    /// The last forecast's starts: the estimate of the jobs the timeline does not plan, until
    /// the next one is in.
    pub(super) forecasts: Forecasts,
    /// When the last forecast came due (run inline, or handed out off the loop).
    pub(super) forecast_at_s: Option<f64>,
    /// A job was submitted since the last forecast came due that the next one may reach
    /// (see [`Reach`]): only such a submission makes one due early.
    pub(super) reachable_submitted: bool,
    /// A forecast came due off the loop and was not handed out yet.
    pub(super) forecast_wanted: bool,
}

/// What the planner did, for reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanStats {
    /// Reservations made (a job's first, and each later one after its nodes changed).
    pub reservations: u64,
    /// Jobs started on reserved nodes because they were expected to end in time.
    pub backfilled: u64,
    /// Replans that moved a reservation's start later.
    pub slips: u64,
    /// Backfilled jobs evicted when the reservation they ran on came due.
    pub overrun_evictions: u64,
}

impl Scheduler {
    /// The planner's runtime estimate for `spec`.
    pub fn runtime_estimate(&self, spec: &JobSpec) -> RuntimeEstimate {
        self.plan.runtimes.estimate(spec)
    }

    /// The start estimate of a pending job the last replan covered.
    pub fn start_estimate(&self, id: JobId) -> Option<&StartEstimate> {
        self.plan.job_to_estimate.get(&id)
    }

    /// The jobs whose first start estimate came since the last call and that still have one
    /// (a job that lost it before being listed is listed when it has one again).
    pub fn take_newly_estimated(&mut self) -> Vec<JobId> {
        let job_to_estimate = &self.plan.job_to_estimate;
        self.plan
            .first_estimates
            .take(|id| job_to_estimate.contains_key(&id))
    }

    /// What the planner has done so far.
    pub fn plan_stats(&self) -> PlanStats {
        self.plan.stats
    }

    /// Replans now, on the scheduler's clock, whether or not anything changed since the last
    /// replan (which runs by itself after cycles that changed something): for a caller that
    /// wants fresh estimates, and for the bench.
    pub fn replan_now(&mut self) {
        self.plan.planned_for = None;
        self.plan.planned_at_s = f64::NEG_INFINITY;
        self.replan(self.clock_s);
    }

    /// When a job of `spec` would start if it were submitted now, without submitting it: the
    /// same timeline and placement rule as the replan, keeping off the nodes planned for the
    /// pending jobs ahead of it (all of them: it would join the back of its queue).
    pub fn what_if(&self, spec: &JobSpec) -> WhatIf {
        let now_s = self.clock_s;
        let timeline = self.timeline(now_s);
        let view = self.shape_view(&spec.shape);
        let found = self.earliest_start(spec, &timeline, &view, &self.plan.planned_claims, now_s);
        let jobs_ahead = self.plan.job_to_estimate.len();
        let runtime = self.plan.runtimes.estimate(spec);
        match found {
            Some(planned) => {
                let nodes = planned.nodes();
                let (p10_s, p50_s, p90_s) = self.plan.calibration.apply(now_s, planned.start);
                WhatIf {
                    runtime,
                    start: Some(StartEstimate {
                        planned_at_s: now_s,
                        p10_s,
                        p50_s,
                        p90_s,
                        reservation: None,
                    }),
                    nodes: Some(self.domain_text(&nodes)),
                    jobs_ahead,
                    beyond_s: None,
                }
            }
            None => WhatIf {
                runtime,
                start: None,
                nodes: None,
                jobs_ahead,
                beyond_s: None,
            },
        }
    }

    /// The backfill rule: on a node reserved for a job ahead of `id` whose reservation starts
    /// before `spec` is expected to end (its p50 from `now_s`), `capacity` keeps only the pods
    /// that fit now and in what the node will still have beside the reservation. A
    /// job expected to end before a reservation starts may use its node freely; a job ahead of
    /// the reservation's owner is not held by it (the owner was planned around it). Returns
    /// how many nodes it lowered and whose reservation one of them holds, for the
    /// explanation.
    pub fn mask_reserved(
        &self,
        id: JobId,
        spec: &JobSpec,
        now_s: f64,
        capacity: &mut [u32],
    ) -> Option<(u32, JobId)> {
        if spec.balloon || self.plan.reserved_claims.is_empty() {
            return None;
        }
        let ends = now_s + self.plan.runtimes.estimate(spec).p50_s;
        let needs = pod_needs(&spec.shape);
        let rank = Rank::of(id, spec);
        let mut held: Option<(u32, JobId)> = None;
        for claim in &self.plan.reserved_claims {
            let node = claim.node as usize;
            if !claim.rank.ahead_of(&rank) || node >= capacity.len() || claim.start_s >= ends {
                continue;
            }
            // `capacity` already says what fits now. The claim's spare bounds what may still
            // be held at its start, each pod counted as a whole GPU as the plan counts it. (Not
            // the whole GPUs free now: a fractional pod fits beside others on a GPU in use, so
            // that count falls as other jobs are placed while the room it bounds does not.)
            let left = capacity[node].min(pods_in(claim.spare, needs));
            if left < capacity[node] {
                capacity[node] = left;
                held.get_or_insert((0, claim.rank.id)).0 += 1;
            }
        }
        held
    }

    /// Records that `id` was placed: a placement on reserved nodes counts as backfill.
    pub(super) fn note_placed(&mut self, id: JobId, placement: &[(usize, u32)]) {
        // A scheduler that does not plan (the forecast's copies) learns nothing for the plan.
        if let Some((planned_at_s, estimated)) = self.plan.job_to_first_wait.remove(&id)
            && self.plan_config.enabled
        {
            self.plan
                .calibration
                .observe(self.clock_s - planned_at_s, estimated);
        }
        self.drop_reservation(id);
        let now_s = self.clock_s;
        let owner = self
            .plan
            .reserved_claims
            .iter()
            .find(|claim| {
                claim.rank.id != id
                    && claim.start_s > now_s
                    && placement
                        .iter()
                        .any(|&(node, _)| node == claim.node as usize)
            })
            .map(|claim| claim.rank.id);
        if let Some(owner) = owner {
            self.plan.stats.backfilled += 1;
            self.plan.backfill_to_owner.insert(id, owner);
        }
    }

    /// Replans when the cycle changed something (a release, a placement, a job parked): new
    /// reservations and start estimates from the running jobs' estimated ends. A job whose
    /// reservation is due while backfilled jobs overrun on its nodes is made active, so the
    /// next cycle tries it (and evicts them, see [`Scheduler::overrun_victims`]).
    pub(super) fn replan(&mut self, now_s: f64) {
        if !self.plan_config.enabled {
            return;
        }
        if !self.replan_due(now_s) {
            // Nothing changed for the plan, but time passed: a forecast may have come due (on
            // a quiet cluster it is the only source of the estimates of jobs waiting for
            // quota).
            if self.forecast_if_due(now_s) {
                self.estimate_from_forecast(now_s);
            }
            return;
        }
        self.plan.planned_at_s = now_s;
        self.plan
            .backfill_to_owner
            .retain(|job, _| self.running.contains(job));
        let owners: Vec<JobId> = self.plan.job_to_reservation.keys().copied().collect();
        for owner in owners {
            if !self.overrun_victims(owner, now_s).is_empty() {
                let key = self.job_to_entry[&owner].spec.queue_key();
                self.queue.push(owner, key);
            }
        }
        let rule = self.reservation_rule();
        self.plan.rule = rule;
        let waiting = self.waiting_to_plan(&rule, now_s);

        let timeline = self.timeline(now_s);
        // Most waiting jobs share a few shapes.
        let mut shapes: Vec<ShapeView> = Vec::new();

        let previous = std::mem::take(&mut self.plan.job_to_reservation);
        // Every planned job's claims: later jobs plan around the earlier ones, the order
        // cycles try them in.
        let mut planned_claims: Vec<Claim> = Vec::new();
        let mut reserved_claims: Vec<Claim> = Vec::new();
        let mut quota_holds: Vec<QuotaHold> = Vec::new();
        let max_reserved_gpus =
            (self.plan_config.max_reserved_share * self.total_gpus() as f64) as u64;
        let mut reserved_gpus = 0u64;
        self.plan.job_to_estimate.clear();
        for rank in waiting {
            let id = rank.id;
            let spec = self.job_to_entry[&id].spec.clone();
            let gpus = spec.total().gpus;
            // When its quota admits it, as running jobs end: now, unless quota blocks it.
            let Some(quota_start) = self.quota_start(&spec, &timeline, now_s) else {
                continue;
            };
            // Only a job aged past the threshold, while the gate is open, whatever blocks it: a
            // queue's head is passed by the smaller jobs that fit until then, as a greedy
            // cycle does (reserving for every head, as Slurm's EASY backfill does, made the
            // smaller jobs wait behind it and the big ones no sooner; the README's planner
            // section has the figures).
            let reserve = self.plan.job_to_reservation.len() < self.plan_config.max_reservations
                && (reserved_gpus == 0 || reserved_gpus + gpus <= max_reserved_gpus)
                && self.aged(&rule, &spec, now_s);
            let key = shape_key(&spec.shape);
            let view = match shapes.iter().position(|view| view.key == key) {
                Some(at) => at,
                None => {
                    shapes.push(self.shape_view(&spec.shape));
                    shapes.len() - 1
                }
            };
            let Some(mut planned) =
                self.earliest_start(&spec, &timeline, &shapes[view], &planned_claims, now_s)
            else {
                continue;
            };
            if reserve && self.plan_config.reservations {
                let before = previous.get(&id).map(|r| r.nodes.as_slice());
                planned = self.kept_in_place(
                    &spec,
                    &timeline,
                    &shapes[view],
                    &planned_claims,
                    before,
                    planned,
                    now_s,
                );
            }
            // The nodes free at its room's start stay free (the timeline only frees), so it
            // starts on them once its quota admits it too.
            planned.start = (
                planned.start.0.max(quota_start.0),
                planned.start.1.max(quota_start.1),
                planned.start.2.max(quota_start.2),
            );
            let (nodes, start) = (planned.nodes(), planned.start);
            let holds = reserve && self.plan_config.reservations;
            let claims = planned.claims(rank, holds);
            planned_claims.extend_from_slice(&claims);
            let reservation = holds.then(|| {
                let domain = self.domain_text(&nodes);
                if let Some(before) = previous.get(&id)
                    && start.1 > before.start_s + 1.0
                {
                    self.plan.stats.slips += 1;
                }
                if previous.get(&id).is_none_or(|before| before.nodes != nodes) {
                    self.plan.stats.reservations += 1;
                }
                reserved_claims.extend_from_slice(&claims);
                reserved_gpus += gpus;
                // Held from its earliest start (p10): a job let in ahead on the quota must be
                // gone by then, since what it takes is given back only as it ends.
                quota_holds.push(QuotaHold {
                    rank,
                    queue: spec.queue,
                    gpus,
                    start_s: start.0,
                });
                self.plan.job_to_reservation.insert(
                    id,
                    Reservation {
                        nodes: nodes.clone(),
                        start_s: start.1,
                    },
                );
                format!("{domain} and {}", self.quota_text(spec.queue, gpus))
            });
            // The first estimate's wait, to learn from once the job starts.
            self.plan
                .job_to_first_wait
                .entry(id)
                .or_insert((now_s, start.1 - now_s));
            let (p10_s, p50_s, p90_s) = self.plan.calibration.apply(now_s, start);
            self.plan.job_to_estimate.insert(
                id,
                StartEstimate {
                    planned_at_s: now_s,
                    p10_s,
                    p50_s,
                    p90_s,
                    reservation,
                },
            );
            self.plan.first_estimates.note(id);
        }
        self.plan.reserved_claims = reserved_claims;
        self.plan.quota_holds = quota_holds;
        self.plan.planned_claims = planned_claims;

        // The last forecast's estimates, whether or not one ran now: the replan cleared them.
        self.forecast_if_due(now_s);
        self.estimate_from_forecast(now_s);
    }

    /// Where an aged job's reservation goes: where it already is (`before`), while those nodes
    /// start it no later than `planned`, the best of all nodes. What they drained for it stays
    /// drained: moved to nodes that tie, as placement's scores pick, a reservation left the
    /// drained nodes to fill up while others drained again (the README's planner section has
    /// the figures).
    #[allow(clippy::too_many_arguments)]
    fn kept_in_place(
        &self,
        spec: &JobSpec,
        timeline: &Timeline,
        view: &ShapeView,
        claims: &[Claim],
        before: Option<&[usize]>,
        planned: Planned,
        now_s: f64,
    ) -> Planned {
        before
            .and_then(|nodes| self.earliest_start(spec, timeline, &view.only(nodes), claims, now_s))
            .filter(|kept| kept.start.1 <= planned.start.1)
            .unwrap_or(planned)
    }

    /// Whether the plan is due at `now_s`: something it plans from changed (a release of
    /// resources, the running GPUs, more pending jobs) and the last replan is older than
    /// [`PlanConfig::replan_every_s`], or a reservation came due. Notes what it is planned
    /// for when it is.
    fn replan_due(&mut self, now_s: f64) -> bool {
        let seen = (self.state.releases(), self.running_gpus, self.queue.len());
        let due = self
            .plan
            .job_to_reservation
            .values()
            .any(|r| r.start_s <= now_s);
        let unplanned = self
            .plan
            .planned_for
            .is_none_or(|(_, _, pending)| pending < seen.2);
        let recent = now_s - self.plan.planned_at_s < self.plan_config.replan_every_s;
        // A forecast's planning copy replans on its interval alone (see `drawn_copy`).
        let unplanned = unplanned && !self.plan.drawn_copy;
        if (self.plan.planned_for == Some(seen) || (recent && !unplanned)) && !due {
            return false;
        }
        self.plan.planned_for = Some(seen);
        true
    }

    /// The jobs waiting for room, and while the gate of `rule` is open those aged past its
    /// threshold whatever blocks them, in the order cycles try them (priority, then age): the
    /// first [`MAX_PLANNED`], chosen without sorting them all.
    fn waiting_to_plan(&self, rule: &ReservationRule, now_s: f64) -> Vec<Rank> {
        let mut waiting: Vec<Rank> = self
            .queue
            .parked_for(crate::Blocked::Room)
            .filter_map(|id| {
                let spec = &self.job_to_entry[&id].spec;
                // A balloon only fills what is idle: it is never planned for.
                (!spec.balloon).then(|| Rank::of(id, spec))
            })
            .collect();
        waiting.extend(
            self.queue
                .parked_for(crate::Blocked::Quota)
                .filter_map(|id| {
                    let spec = &self.job_to_entry[&id].spec;
                    (!spec.balloon && self.aged(rule, spec, now_s)).then(|| Rank::of(id, spec))
                }),
        );
        if waiting.len() > MAX_PLANNED {
            waiting.select_nth_unstable_by(MAX_PLANNED, Rank::order);
            waiting.truncate(MAX_PLANNED);
        }
        waiting.sort_by(Rank::order);
        waiting
    }

    /// Every pending job the last forecast reached gets its start, as it is (the calibration
    /// learns only the timeline's bias), never earlier than `now_s`. A reservation's holder
    /// gets the forecast's p50 too, and an interval that spans the plan's and the forecast's:
    /// a reservation slips as the plan changes, which the plan's own start does not see, and
    /// the drawn runs do. The timeline's estimate stands for the jobs the forecast did not
    /// reach, such as one submitted since.
    pub(super) fn estimate_from_forecast(&mut self, now_s: f64) {
        let forecast_at_s = self.plan.forecasts.at_s;
        for (&id, forecast) in &self.plan.forecasts.job_to_forecast {
            let pending = matches!(
                self.job_to_entry.get(&id).map(|entry| &entry.state),
                Some(JobState::Pending)
            );
            if !pending {
                continue;
            }
            let (p10_s, p50_s, p90_s) = (
                forecast.p10_s.max(now_s),
                forecast.p50_s.max(now_s),
                forecast.p90_s.max(now_s),
            );
            match self.plan.job_to_estimate.get_mut(&id) {
                Some(planned) if planned.reservation.is_some() => {
                    planned.p10_s = planned.p10_s.min(p10_s);
                    planned.p50_s = p50_s;
                    planned.p90_s = planned.p90_s.max(p90_s);
                }
                _ => {
                    self.plan.job_to_estimate.insert(
                        id,
                        StartEstimate {
                            planned_at_s: forecast_at_s,
                            p10_s,
                            p50_s,
                            p90_s,
                            reservation: None,
                        },
                    );
                    self.plan.first_estimates.note(id);
                }
            }
        }
    }

    /// When a job of `spec` running since `started_s` is expected to end (p10, p50, p90), seen
    /// at `now_s`, never in the past: a learned runtime by what the finished runs longer than
    /// it has run took (see `Runtimes::remaining`); a declared one or the prior by the
    /// runtime itself, and a job past it soon.
    pub(super) fn expected_end(
        &self,
        spec: &JobSpec,
        started_s: f64,
        now_s: f64,
    ) -> (f64, f64, f64) {
        let runtimes = &self.plan.runtimes;
        if let Some((p10, p50, p90)) = runtimes.remaining(spec, (now_s - started_s).max(0.0)) {
            let end = |left: f64| now_s + left.max(0.0);
            return (end(p10), end(p50), end(p90));
        }
        let estimate = runtimes.estimate(spec);
        let end = |runtime: f64| (started_s + runtime).max(now_s + 0.1 * runtime.min(600.0));
        (
            end(estimate.p10_s),
            end(estimate.p50_s),
            end(estimate.p90_s),
        )
    }

    /// One draw of when a job running since `started_s` ends, seen at `now_s`: a learned
    /// runtime at quantile `u` (in (0, 1)) of what is left of it, a declared one or the prior
    /// at its expected (p50) end.
    pub(super) fn end_at(&self, spec: &JobSpec, started_s: f64, now_s: f64, u: f64) -> f64 {
        let age_s = (now_s - started_s).max(0.0);
        match self.plan.runtimes.remaining_at(spec, age_s, u) {
            Some(left) => now_s + left.max(0.0),
            None => self.expected_end(spec, started_s, now_s).1,
        }
    }

    fn slots_of<'a>(&self, entry: &'a super::JobEntry) -> &'a [crate::Slot] {
        match &entry.state {
            JobState::Running { slots, .. } | JobState::Holding { slots, .. } => slots,
            JobState::Pending => &[],
        }
    }

    /// The backfilled jobs `owner` may evict now: its reservation is due, they run on its
    /// nodes past their estimate (p90), and they do not outrank it.
    pub(super) fn overrun_victims(&self, owner: JobId, now_s: f64) -> Vec<JobId> {
        let (Some(reservation), Some(owner_entry)) = (
            self.plan.job_to_reservation.get(&owner),
            self.job_to_entry.get(&owner),
        ) else {
            return Vec::new();
        };
        if reservation.start_s > now_s || owner_entry.spec.balloon {
            return Vec::new();
        }
        self.plan
            .backfill_to_owner
            .iter()
            .filter(|&(_, &o)| o == owner)
            .filter_map(|(&job, _)| {
                let entry = self.job_to_entry.get(&job)?;
                let JobState::Running { started_s, .. } = entry.state else {
                    return None;
                };
                let overran = now_s > started_s + self.plan.runtimes.estimate(&entry.spec).p90_s;
                let on_reserved = self
                    .slots_of(entry)
                    .iter()
                    .any(|slot| reservation.nodes.contains(&(slot.node as usize)));
                (overran && on_reserved && entry.spec.priority <= owner_entry.spec.priority)
                    .then_some(job)
            })
            .collect()
    }

    /// Whether `spec` would fit (built-in filter, outside others' reservations) once `victims`
    /// gave their nodes back.
    pub(super) fn fits_without(
        &self,
        id: JobId,
        spec: &JobSpec,
        victims: &[JobId],
        now_s: f64,
    ) -> bool {
        let mut state = self.state.clone();
        for victim in victims {
            let entry = &self.job_to_entry[victim];
            for &slot in self.slots_of(entry) {
                state.release(slot, &entry.spec.shape);
            }
        }
        let (mut capacity, scores) = super::place::builtin_view(spec, &state);
        self.mask_reserved(id, spec, now_s, &mut capacity);
        self.place(spec, &capacity, &scores).is_some()
    }

    /// Forgets `id`'s reservation and estimate (placed, or gone), freeing its nodes for
    /// others at once rather than at the next replan. Returns whether it held a reservation.
    pub(super) fn drop_reservation(&mut self, id: JobId) -> bool {
        self.plan.job_to_estimate.remove(&id);
        self.plan.first_estimates.forget(id);
        self.plan.job_to_first_wait.remove(&id);
        self.plan.planned_claims.retain(|claim| claim.rank.id != id);
        let held = self.plan.job_to_reservation.remove(&id).is_some();
        if held {
            self.plan
                .reserved_claims
                .retain(|claim| claim.rank.id != id);
            self.plan.quota_holds.retain(|hold| hold.rank.id != id);
        }
        held
    }

    /// Counts backfilled jobs evicted for a reservation that came due.
    pub(super) fn note_overrun_evictions(&mut self, count: usize) {
        self.plan.stats.overrun_evictions += count as u64;
    }

    /// "16 nodes in rack 3": the reservation's size and its smallest common domain.
    fn domain_text(&self, nodes: &[usize]) -> String {
        let count = if nodes.len() == 1 {
            "1 node".to_string()
        } else {
            format!("{} nodes", nodes.len())
        };
        for (index, level) in self.state.nodes.levels.iter().enumerate() {
            let first = nodes.first().map(|&n| level.node_domain[n]);
            if let Some(domain) = first
                && domain != u32::MAX
                && nodes.iter().all(|&n| level.node_domain[n] == domain)
            {
                return format!("{count} in {} {domain}", self.level_name(index));
            }
        }
        format!("{count} across the cluster")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_waits_for_enough_starts_then_scales_the_planned_wait() {
        let mut calibration = Calibration::default();
        let raw = (100.0, 200.0, 300.0);
        for i in 0..CALIBRATE_AFTER {
            assert_eq!(
                calibration.apply(100.0, raw),
                raw,
                "calibrated after {i} starts"
            );
            // Jobs waited 1.5 to 2.5 times what was planned.
            calibration.observe(100.0 * (1.5 + i as f64 / CALIBRATE_AFTER as f64), 100.0);
        }
        let (p10, p50, p90) = calibration.apply(100.0, raw);
        assert!((150.0..=170.0).contains(&(p10 - 100.0)), "{p10}");
        assert!((190.0..=210.0).contains(&(p50 - 100.0)), "{p50}");
        assert!((230.0..=250.0).contains(&(p90 - 100.0)), "{p90}");
        // A job that can start now stays now.
        assert_eq!(
            calibration.apply(100.0, (100.0, 100.0, 100.0)),
            (100.0, 100.0, 100.0)
        );
    }

    #[test]
    fn a_run_past_the_typical_runtime_is_expected_to_run_as_the_longer_ones_did() {
        let mut runtimes = Runtimes::default();
        assert_eq!(runtimes.remaining(10.0), None, "no history, no estimate");
        // 1,000 runs of 1 to 1,000 s; only the last 256 (745 to 1,000 s) are kept.
        for runtime in 1..=1000 {
            runtimes.add(f64::from(runtime));
        }
        assert_eq!(runtimes.sorted.len(), SAMPLES);
        assert!(runtimes.sorted.is_sorted());
        assert_eq!(runtimes.quantiles(), Some((771.0, 873.0, 975.0)));
        // A young run: any kept runtime, less its age.
        assert_eq!(runtimes.remaining(100.0), Some((671.0, 773.0, 875.0)));
        // Past the median: the 128 longer runs (873 to 1,000 s) less 872 s.
        assert_eq!(runtimes.remaining(872.0), Some((14.0, 65.0, 115.0)));
        // Longer than all but 4: as long again as it has run, p10 a ninth, p90 nine times.
        assert_eq!(
            runtimes.remaining(996.0),
            Some((996.0 / 9.0, 996.0, 8964.0))
        );
        // Draws follow the same distribution.
        assert_eq!(runtimes.remaining_at(872.0, 0.5), Some(65.0));
        assert_eq!(runtimes.remaining_at(872.0, 0.999), Some(128.0));
        assert_eq!(runtimes.remaining_at(996.0, 0.5), Some(996.0));
        let p90 = runtimes.remaining_at(996.0, 0.9).expect("a draw");
        assert!((p90 - 8964.0).abs() < 1e-6, "{p90}");
    }

    #[test]
    fn the_prior_is_drawn_from_above_a_runs_age() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-6 * b;
        assert!(close(PRIOR.quantile(0.1), PRIOR.p10_s));
        assert!(close(PRIOR.quantile(0.5), PRIOR.p50_s));
        assert!(close(PRIOR.quantile(0.9), PRIOR.p90_s));
        // A new run: the prior itself.
        assert!(close(PRIOR.remaining_at(0.0, 0.5), PRIOR.p50_s));
        // A run at the prior's median: its median remainder is the prior's p75 less its age.
        let left = PRIOR.remaining_at(PRIOR.p50_s, 0.5);
        assert!(close(left, PRIOR.quantile(0.75) - PRIOR.p50_s), "{left}");
        assert!(left > 0.0);
    }

    #[test]
    fn a_declared_runtime_is_not_judged_by_its_age() {
        let mut model = RuntimeModel::default();
        let mut spec = JobSpec::one_pod(0.0);
        for runtime in 1..=100 {
            model.observe(&spec, f64::from(runtime));
        }
        assert!(
            model
                .remaining(&spec, 99.5)
                .is_some_and(|(_, p50, _)| p50 == 99.5)
        );
        spec.expected_runtime_s = Some(50.0);
        assert_eq!(model.remaining(&spec, 99.5), None);
    }
}
