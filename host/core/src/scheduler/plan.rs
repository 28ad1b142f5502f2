//! The plan stage: runtime estimates, reservations for jobs blocked for room, the backfill
//! rule, and an estimated start for the jobs it planned.
//!
//! - [`RuntimeModel`]: a job's runtime as it declares it, else as finished jobs of its queue
//!   and shape took (a distribution: p10, p50, p90), else a wide prior. The planner never sees
//!   a job's true duration; the simulator feeds it only what a live cluster would.
//! - Reservations: after a cycle that changed something, the head of each queue that waits for
//!   room, and any job that has waited for room longer than
//!   [`PlanConfig::reserve_after_s`], gets the nodes it would take once enough running jobs
//!   end (by their estimated ends, in order; the same smallest-domain rule as placement) and a
//!   planned start. Later reservations keep off earlier ones' nodes (Slurm's conservative
//!   backfill).
//! - Backfill: a job may take a reserved node only if it is expected (its p90) to end before
//!   that reservation starts. Balloons ignore reservations: they give way when one comes due.
//! - Overruns: a job that took a reserved node and runs past its estimate is evicted when the
//!   reservation comes due, if it is preemptible by the reserved job (not of higher priority);
//!   otherwise the reservation slips, and is planned again.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::queues::QueueId;

use super::{JobId, JobSpec, JobState, Scheduler};

/// Finished runtimes kept per class (and per queue, and overall): enough for stable p90s,
/// small enough that a change of behaviour shows within a few hundred jobs.
const SAMPLES: usize = 256;
/// Samples a class needs before its own distribution is used rather than its queue's.
const MIN_SAMPLES: usize = 5;
/// With no history at all: about an hour, anywhere from minutes to a working day.
const PRIOR: RuntimeEstimate = RuntimeEstimate {
    p10_s: 300.0,
    p50_s: 3600.0,
    p90_s: 28_800.0,
    source: EstimateSource::Prior,
};
/// Jobs planned (reserved or only estimated) per replan, in queue order.
const MAX_PLANNED: usize = 64;

/// Knobs of the planner.
#[derive(Debug, Clone)]
pub struct PlanConfig {
    /// Whether the planner runs at all (the anchors never plan): start estimates. Off by
    /// default until replanning is cheap enough for the live loop: at 7,500 nodes it cost the
    /// steady-state cycle several times its time (`gantry bench schedule`); the replay turns
    /// it on.
    pub enabled: bool,
    /// Whether its reservations hold nodes (the backfill rule applies). Off by default: on the
    /// gang-burst trace, holding nodes for queue heads cost more than it gained (see the
    /// README's planner section); the estimates still plan as if they held.
    pub reservations: bool,
    /// Replan at most this often (seconds on the scheduler's clock), besides after a job was
    /// parked for room: a busy cluster changes every cycle.
    pub replan_every_s: f64,
    /// A job waiting for room longer than this gets a reservation even when it is not its
    /// queue's head.
    pub reserve_after_s: f64,
    /// Most reservations held at once.
    pub max_reservations: usize,
}

impl Default for PlanConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            reservations: false,
            replan_every_s: 1.0,
            reserve_after_s: 1800.0,
            max_reservations: 16,
        }
    }
}

/// Where a runtime estimate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum EstimateSource {
    /// The job said how long it runs (`gantry.dev/expected-runtime`, `expected_runtime_s`).
    Declared,
    /// Finished jobs of the same queue (and shape, when there were enough of them).
    Learned {
        /// How many finished jobs it rests on.
        samples: u32,
    },
    /// Nothing known yet: a wide prior.
    Prior,
}

/// A job's runtime as the planner believes it, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RuntimeEstimate {
    pub p10_s: f64,
    pub p50_s: f64,
    pub p90_s: f64,
    pub source: EstimateSource,
}

/// When a pending job is expected to start (seconds, on the scheduler's clock), and what holds
/// it: a reservation, or only the estimate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartEstimate {
    /// When the plan was made.
    pub planned_at_s: f64,
    pub p10_s: f64,
    pub p50_s: f64,
    pub p90_s: f64,
    /// The nodes held for it, when it holds a reservation: e.g. `16 nodes in rack 3`.
    pub reservation: Option<String>,
}

/// A runtime class: queue, gang size (powers of two) and GPUs per pod.
type Class = (QueueId, u8, u32);

/// Finished runtimes, newest last, and their quantiles, recomputed on each new sample.
#[derive(Debug, Clone, Default)]
struct Runtimes {
    samples: VecDeque<f32>,
    quantiles: Option<(f64, f64, f64)>,
}

impl Runtimes {
    fn add(&mut self, runtime_s: f64) {
        if self.samples.len() == SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(runtime_s as f32);
        let mut sorted: Vec<f32> = self.samples.iter().copied().collect();
        sorted.sort_by(f32::total_cmp);
        let at = |q: f64| f64::from(sorted[((sorted.len() - 1) as f64 * q).round() as usize]);
        self.quantiles = Some((at(0.1), at(0.5), at(0.9)));
    }

    fn estimate(&self) -> Option<RuntimeEstimate> {
        if self.samples.len() < MIN_SAMPLES {
            return None;
        }
        let (p10_s, p50_s, p90_s) = self.quantiles?;
        Some(RuntimeEstimate {
            p10_s,
            p50_s,
            p90_s,
            source: EstimateSource::Learned {
                samples: self.samples.len() as u32,
            },
        })
    }
}

/// What finished jobs took, by class, by queue and overall: the learned half of the estimates.
#[derive(Debug, Clone, Default)]
pub struct RuntimeModel {
    class_to_runtimes: HashMap<Class, Runtimes>,
    queue_to_runtimes: HashMap<QueueId, Runtimes>,
    all: Runtimes,
}

fn class_of(spec: &JobSpec) -> Class {
    let pods_class = 32 - spec.pods.max(1).leading_zeros();
    (spec.queue, pods_class as u8, spec.shape.gpus)
}

impl RuntimeModel {
    /// A job of `spec` ran for `runtime_s` and finished.
    pub fn observe(&mut self, spec: &JobSpec, runtime_s: f64) {
        if !runtime_s.is_finite() || runtime_s <= 0.0 || spec.balloon {
            return;
        }
        self.class_to_runtimes
            .entry(class_of(spec))
            .or_default()
            .add(runtime_s);
        self.queue_to_runtimes
            .entry(spec.queue)
            .or_default()
            .add(runtime_s);
        self.all.add(runtime_s);
    }

    /// The runtime of a job of `spec`: declared, else learned (its class, its queue, all
    /// jobs), else the prior.
    pub fn estimate(&self, spec: &JobSpec) -> RuntimeEstimate {
        if let Some(declared) = spec
            .expected_runtime_s
            .filter(|d| d.is_finite() && *d > 0.0)
        {
            return RuntimeEstimate {
                p10_s: declared,
                p50_s: declared,
                p90_s: declared,
                source: EstimateSource::Declared,
            };
        }
        self.class_to_runtimes
            .get(&class_of(spec))
            .and_then(Runtimes::estimate)
            .or_else(|| {
                self.queue_to_runtimes
                    .get(&spec.queue)
                    .and_then(Runtimes::estimate)
            })
            .or_else(|| self.all.estimate())
            .unwrap_or(PRIOR)
    }
}

/// Nodes held for a job from a planned start.
#[derive(Debug, Clone)]
pub(super) struct Reservation {
    pub(super) nodes: Vec<usize>,
    pub(super) start_s: f64,
}

/// The planner's state: what it learned, what it reserved, and what it estimated.
#[derive(Debug, Clone, Default)]
pub(super) struct Plan {
    pub(super) runtimes: RuntimeModel,
    pub(super) job_to_reservation: BTreeMap<JobId, Reservation>,
    /// Per node: the earliest start of a reservation holding it (`INFINITY` when none), and
    /// whose it is. What the backfill rule reads, per node, per attempt.
    pub(super) node_to_reserved: Vec<(f64, JobId)>,
    /// The start estimates of the jobs the last replan covered.
    pub(super) job_to_estimate: BTreeMap<JobId, StartEstimate>,
    /// Jobs that took a reserved node by the backfill rule, and the reservation's owner.
    pub(super) backfill_to_owner: BTreeMap<JobId, JobId>,
    /// What the last replan saw: the cluster's releases and the jobs placed so far, so a cycle
    /// that changed nothing does not replan; and when it ran.
    pub(super) planned_for: Option<(u64, u64, usize)>,
    pub(super) planned_at_s: f64,
    /// Counters for reports: reservations made, jobs started on reserved nodes, reservations
    /// that slipped (planned again later than before), backfilled jobs evicted for overrunning.
    pub(super) stats: PlanStats,
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

    /// What the planner has done so far.
    pub fn plan_stats(&self) -> PlanStats {
        self.plan.stats
    }

    /// Zeroes `capacity` on the nodes reserved for other jobs whose reservations start before
    /// `spec` is expected to end (its p90 from `now_s`): the backfill rule. Returns whether any
    /// reserved node is left to it (so a placement there is a backfill).
    pub fn mask_reserved(
        &self,
        id: JobId,
        spec: &JobSpec,
        now_s: f64,
        capacity: &mut [u32],
    ) -> bool {
        if spec.balloon || self.plan.job_to_reservation.is_empty() {
            return false;
        }
        let ends = now_s + self.plan.runtimes.estimate(spec).p50_s;
        let mut backfill = false;
        for (node, &(start_s, owner)) in self.plan.node_to_reserved.iter().enumerate() {
            if owner == id || start_s.is_infinite() || node >= capacity.len() {
                continue;
            }
            if start_s < ends {
                capacity[node] = 0;
            } else if capacity[node] > 0 {
                backfill = true;
            }
        }
        backfill
    }

    /// Records that `id` was placed: a placement on reserved nodes counts as backfill.
    pub(super) fn note_placed(&mut self, id: JobId, placement: &[(usize, u32)]) {
        self.drop_reservation(id);
        let owner = placement.iter().find_map(|&(node, _)| {
            self.plan
                .node_to_reserved
                .get(node)
                .filter(|(start, owner)| start.is_finite() && *owner != id)
                .map(|&(_, owner)| owner)
        });
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
        if (self.plan.planned_for == Some(seen) || (recent && !unplanned)) && !due {
            return;
        }
        self.plan.planned_for = Some(seen);
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

        // The jobs waiting for room, in the order cycles try them (priority, then age).
        let mut waiting: Vec<(JobId, f64)> = self
            .queue
            .all()
            .into_iter()
            .filter_map(|id| match self.queue.parked(id) {
                Some((crate::Blocked::Room, since_s)) => Some((id, since_s)),
                _ => None,
            })
            .collect();
        waiting.sort_by(|a, b| {
            let (x, y) = (&self.job_to_entry[&a.0].spec, &self.job_to_entry[&b.0].spec);
            y.priority
                .cmp(&x.priority)
                .then(x.submit_s.total_cmp(&y.submit_s))
                .then(a.0.cmp(&b.0))
        });
        waiting.truncate(MAX_PLANNED);

        // Running jobs by estimated end; balloons give way, so their nodes count as free.
        let mut ends: Vec<(f64, f64, f64, JobId)> = self
            .running
            .iter()
            .filter_map(|&id| {
                let entry = &self.job_to_entry[&id];
                let JobState::Running { started_s, .. } = entry.state else {
                    return None;
                };
                if entry.spec.balloon {
                    return None;
                }
                let estimate = self.plan.runtimes.estimate(&entry.spec);
                // A job past its estimate is expected to end soon, not in the past.
                let end =
                    |runtime: f64| (started_s + runtime).max(now_s + 0.1 * runtime.min(600.0));
                Some((
                    end(estimate.p10_s),
                    end(estimate.p50_s),
                    end(estimate.p90_s),
                    id,
                ))
            })
            .collect();
        ends.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.3.cmp(&b.3)));

        let mut base = self.state.clone();
        for &id in &self.running {
            let entry = &self.job_to_entry[&id];
            if entry.spec.balloon
                && let JobState::Running { slots, .. } = &entry.state
            {
                for &slot in slots {
                    base.release(slot, &entry.spec.shape);
                }
            }
        }

        let previous = std::mem::take(&mut self.plan.job_to_reservation);
        let n = self.state.len();
        let mut node_to_reserved = vec![(f64::INFINITY, JobId::MAX); n];
        let mut queues_reserved: Vec<QueueId> = Vec::new();
        self.plan.job_to_estimate.clear();
        for (id, since_s) in waiting {
            let spec = self.job_to_entry[&id].spec.clone();
            let reserve = self.plan.job_to_reservation.len() < self.plan_config.max_reservations
                && (!queues_reserved.contains(&spec.queue)
                    || now_s - since_s >= self.plan_config.reserve_after_s);
            let Some((nodes, start)) =
                self.earliest_start(&spec, &base, &ends, &node_to_reserved, now_s)
            else {
                continue;
            };
            let holds = reserve && self.plan_config.reservations;
            // Without reservations, later estimates still keep off the nodes earlier jobs will
            // take: the order cycles try them in.
            if !self.plan_config.reservations {
                for &node in &nodes {
                    if start.1 < node_to_reserved[node].0 {
                        node_to_reserved[node] = (start.1, id);
                    }
                }
            }
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
                for &node in &nodes {
                    if start.1 < node_to_reserved[node].0 {
                        node_to_reserved[node] = (start.1, id);
                    }
                }
                queues_reserved.push(spec.queue);
                self.plan.job_to_reservation.insert(
                    id,
                    Reservation {
                        nodes: nodes.clone(),
                        start_s: start.1,
                    },
                );
                domain
            });
            self.plan.job_to_estimate.insert(
                id,
                StartEstimate {
                    planned_at_s: now_s,
                    p10_s: start.0,
                    p50_s: start.1,
                    p90_s: start.2,
                    reservation,
                },
            );
        }
        if self.plan_config.reservations {
            self.plan.node_to_reserved = node_to_reserved;
        }
    }

    /// The nodes `spec` would take, and when (p10, p50, p90), as running jobs end in
    /// estimated order, keeping off nodes already reserved. `None` when it would not fit even
    /// on an empty cluster.
    fn earliest_start(
        &self,
        spec: &JobSpec,
        base: &crate::ClusterState,
        ends: &[(f64, f64, f64, JobId)],
        reserved: &[(f64, JobId)],
        now_s: f64,
    ) -> Option<(Vec<usize>, (f64, f64, f64))> {
        let mut state = base.clone();
        let need = u64::from(spec.pods);
        let try_place = |state: &crate::ClusterState| -> Option<Vec<usize>> {
            if spec.shape.gpus > 0 && state.pods_fit(spec.shape.gpus) < need {
                return None;
            }
            let (mut capacity, scores) = super::place::builtin_view(spec, state);
            for (node, cap) in capacity.iter_mut().enumerate() {
                if reserved[node].0.is_finite() {
                    *cap = 0;
                }
            }
            self.place(spec, &capacity, &scores)
                .map(|p| p.node_pods.iter().map(|&(node, _)| node).collect())
        };
        if let Some(nodes) = try_place(&state) {
            return Some((nodes, (now_s, now_s, now_s)));
        }
        let mut freed: Vec<usize> = Vec::new();
        let mut i = 0;
        while i < ends.len() {
            // Release every job ending at the same time together.
            let at = ends[i].1;
            while i < ends.len() && ends[i].1 <= at {
                let id = ends[i].3;
                let entry = &self.job_to_entry[&id];
                if let JobState::Running { slots, .. } = &entry.state {
                    for &slot in slots {
                        state.release(slot, &entry.spec.shape);
                    }
                }
                freed.push(i);
                i += 1;
            }
            if let Some(nodes) = try_place(&state) {
                // The jobs that had to end: those released so far that held a chosen node.
                let mut start = (now_s, at, at);
                for &k in &freed {
                    let entry = &self.job_to_entry[&ends[k].3];
                    if self
                        .slots_of(entry)
                        .iter()
                        .any(|slot| nodes.contains(&(slot.node as usize)))
                    {
                        start.0 = start.0.max(ends[k].0);
                        start.2 = start.2.max(ends[k].2);
                    }
                }
                start.0 = start.0.min(start.1);
                start.2 = start.2.max(start.1);
                return Some((nodes, start));
            }
        }
        None
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
        if reservation.start_s > now_s {
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
    /// others at once rather than at the next replan.
    pub(super) fn drop_reservation(&mut self, id: JobId) {
        self.plan.job_to_estimate.remove(&id);
        if let Some(reservation) = self.plan.job_to_reservation.remove(&id) {
            for node in reservation.nodes {
                if let Some(entry) = self.plan.node_to_reserved.get_mut(node)
                    && entry.1 == id
                {
                    *entry = (f64::INFINITY, JobId::MAX);
                }
            }
        }
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
