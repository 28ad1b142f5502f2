//! The plan stage: runtime estimates, reservations of nodes and quota, the backfill rule, and an estimated start for the jobs it planned: the reservations' holders, and the
//! others until [`super::forecast`] gives them theirs.
//!
//! - [`RuntimeModel`]: a job's runtime as it declares it, else as finished jobs of its queue
//!   and shape took (a distribution: p10, p50, p90), else a wide prior. The planner never sees
//!   a job's true duration; the simulator feeds it only what a live cluster would.
//! - Reservations: after a cycle that changed something, the head of each queue that waits for
//!   room gets the nodes it would take once enough running jobs end (by their estimated ends,
//!   in order; the same smallest-domain rule as placement) and a planned start. While the
//!   backlog gate is open, so does any job aged past the threshold, whatever blocks it (room,
//!   its queue's borrowing limit, its cohort's idle quota), and its reservation also holds the
//!   quota it will use or borrow ([`ReservationRule`], `QuotaHold`). Up to
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

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

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
    /// capacity idle until it starts, so a few (Slurm's EASY backfill holds one) keep the
    /// cluster busier than many. The README's planner section shows what other values gave.
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
}

impl Default for PlanConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            reservations: true,
            replan_every_s: 1.0,
            reserve_after_s: None,
            backlog_limit_s: None,
            max_reservations: 4,
            max_reserved_share: 0.5,
            forecast_every_s: 60.0,
            forecast_off_loop: false,
        }
    }
}

/// The adaptive rule's age threshold, in learned p90 runtimes: a job that has waited as long
/// as three of the cluster's long jobs take, while the cluster turned its queue over, is being
/// passed over, not merely queued.
pub const AGE_RUNTIMES: f64 = 3.0;

/// The adaptive rule's backlog gate, in learned p90 runtimes: while the pending work would
/// keep the whole cluster busy for less than this many of its long jobs, the cluster is
/// turning its queue over, so a job that still waits past the age threshold is being passed
/// over, and a reservation is what starts it. Past it the cluster is far over capacity, every
/// job waits about as long as the backlog, and reservations only hold capacity idle.
pub const BACKLOG_RUNTIMES: f64 = 6.0;

/// When aged jobs get reservations, as the last replan judged it: its age threshold, and the
/// backlog gate's reading and limit. Shown in reports and explanations, so an admin sees why a
/// job has, or has no, reservation.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ReservationRule {
    /// A job that has waited this long gets a reservation, whatever blocks it.
    pub age_threshold_s: f64,
    /// The pending work, in seconds of the whole cluster (GPU-seconds by learned median
    /// runtimes, over the cluster's GPUs).
    pub backlog_s: f64,
    /// The gate: aged jobs get reservations only while `backlog_s` is under it.
    pub backlog_limit_s: f64,
    /// Whether the gate is open.
    pub open: bool,
}

/// The quota a reservation holds: jobs behind its owner may not start borrowing, nor take
/// from the owner's own queue, what the owner needs, unless they are expected to end before
/// the owner's planned start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct QuotaHold {
    rank: Rank,
    queue: QueueId,
    gpus: u64,
    start_s: f64,
}

/// Where a runtime estimate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct RuntimeEstimate {
    /// As short as this (10%).
    pub p10_s: f64,
    /// Most likely about this long (the median).
    pub p50_s: f64,
    /// At most this long, 90% of the time.
    pub p90_s: f64,
    /// Where the figures came from.
    pub source: EstimateSource,
}

impl RuntimeEstimate {
    /// Its quantile `u` (in (0, 1)): log-linear through its p10, p50 and p90, and beyond them
    /// along the nearest segment.
    fn quantile(&self, u: f64) -> f64 {
        let (l10, l50, l90) = (self.p10_s.ln(), self.p50_s.ln(), self.p90_s.ln());
        let slope = if u < 0.5 { l50 - l10 } else { l90 - l50 };
        (l50 + slope * (u - 0.5) / 0.4).exp()
    }

    /// One draw at quantile `u` (in (0, 1)) of what is left of a run that has lasted `age_s`:
    /// of the runtimes above the age, less the age.
    fn remaining_at(&self, age_s: f64, u: f64) -> f64 {
        // The quantile the age is at, by bisection (the quantile function rises).
        let (mut below, mut above) = (0.0f64, 1.0f64);
        for _ in 0..48 {
            let mid = (below + above) / 2.0;
            if self.quantile(mid) <= age_s {
                below = mid;
            } else {
                above = mid;
            }
        }
        (self.quantile(below + u * (1.0 - below)) - age_s).max(0.0)
    }
}

/// When a pending job is expected to start (seconds, on the scheduler's clock), and what holds
/// it: a reservation, or only the estimate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct StartEstimate {
    /// When the plan was made.
    pub planned_at_s: f64,
    /// As early as this (10%).
    pub p10_s: f64,
    /// Most likely about then (the median).
    pub p50_s: f64,
    /// By then, 90% of the time.
    pub p90_s: f64,
    /// The nodes held for it, when it holds a reservation: e.g. `16 nodes in rack 3`.
    pub reservation: Option<String>,
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
    /// The pending jobs the plan puts ahead of it, whose nodes it keeps off.
    pub jobs_ahead: usize,
}

/// A runtime class: queue, gang size (powers of two) and GPUs per pod.
type Class = (QueueId, u8, u32);

/// Finished runtimes, newest last, and the same in ascending order (kept sorted as samples
/// come and go): quantiles of all of them, and of those longer than a running job's age.
#[derive(Debug, Clone, Default)]
struct Runtimes {
    samples: VecDeque<f32>,
    sorted: Vec<f32>,
}

/// The p10, p50 and p90 of `sorted` (ascending, not empty), each less `minus`.
fn quantiles_of(sorted: &[f32], minus: f64) -> (f64, f64, f64) {
    let at = |q: f64| f64::from(sorted[((sorted.len() - 1) as f64 * q).round() as usize]) - minus;
    (at(0.1), at(0.5), at(0.9))
}

impl Runtimes {
    fn add(&mut self, runtime_s: f64) {
        if self.samples.len() == SAMPLES
            && let Some(oldest) = self.samples.pop_front()
        {
            let at = self.sorted.partition_point(|&x| x < oldest);
            self.sorted.remove(at);
        }
        let runtime = runtime_s as f32;
        self.samples.push_back(runtime);
        let at = self.sorted.partition_point(|&x| x < runtime);
        self.sorted.insert(at, runtime);
    }

    /// The p10, p50 and p90 of every sample, once there are [`MIN_SAMPLES`].
    fn quantiles(&self) -> Option<(f64, f64, f64)> {
        (self.sorted.len() >= MIN_SAMPLES).then(|| quantiles_of(&self.sorted, 0.0))
    }

    fn estimate(&self) -> Option<RuntimeEstimate> {
        let (p10_s, p50_s, p90_s) = self.quantiles()?;
        Some(RuntimeEstimate {
            p10_s,
            p50_s,
            p90_s,
            source: EstimateSource::Learned {
                samples: self.samples.len() as u32,
            },
        })
    }

    /// The finished runs longer than `age_s`.
    fn longer_than(&self, age_s: f64) -> &[f32] {
        &self.sorted[self.sorted.partition_point(|&x| f64::from(x) <= age_s)..]
    }

    /// What is left of a run that has lasted `age_s` (p10, p50, p90): what the finished runs
    /// longer than that took beyond it. A run longer than all but a few finished ones is out
    /// on the tail, where runtimes are heavy-tailed and what is left is about as long as what
    /// has run (a Pareto tail of index 1: p10 age / 9, p50 age, p90 9 × age). Without this, a
    /// job past its median was expected to end at once, and a reservation behind a job that
    /// had run for days kept its nodes idle for it.
    fn remaining(&self, age_s: f64) -> Option<(f64, f64, f64)> {
        if self.sorted.len() < MIN_SAMPLES {
            return None;
        }
        let longer = self.longer_than(age_s);
        Some(if longer.len() >= MIN_SAMPLES {
            quantiles_of(longer, age_s)
        } else {
            (age_s / 9.0, age_s, 9.0 * age_s)
        })
    }

    /// One draw of what is left of a run that has lasted `age_s`, at quantile `u` (in (0, 1))
    /// of the distribution [`Runtimes::remaining`] summarises.
    fn remaining_at(&self, age_s: f64, u: f64) -> Option<f64> {
        if self.sorted.len() < MIN_SAMPLES {
            return None;
        }
        let longer = self.longer_than(age_s);
        Some(if longer.len() >= MIN_SAMPLES {
            let at = ((u * longer.len() as f64) as usize).min(longer.len() - 1);
            f64::from(longer[at]) - age_s
        } else {
            age_s * u / (1.0 - u)
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
        if let Some(declared) = declared(spec) {
            return RuntimeEstimate {
                p10_s: declared,
                p50_s: declared,
                p90_s: declared,
                source: EstimateSource::Declared,
            };
        }
        self.learned(spec)
            .and_then(Runtimes::estimate)
            .unwrap_or(PRIOR)
    }

    /// What is left (p10, p50, p90) of a job of `spec` that has run `age_s`, when its runtime
    /// is learned (see `Runtimes::remaining`); `None` when it is declared or only the prior.
    fn remaining(&self, spec: &JobSpec, age_s: f64) -> Option<(f64, f64, f64)> {
        if declared(spec).is_some() {
            return None;
        }
        self.learned(spec)?.remaining(age_s)
    }

    /// One draw (at quantile `u`, in (0, 1)) of what is left of a job of `spec` that has run
    /// `age_s`: from the finished runs, else from the prior; `None` when its runtime is
    /// declared (a point, not a distribution).
    pub(super) fn remaining_at(&self, spec: &JobSpec, age_s: f64, u: f64) -> Option<f64> {
        if declared(spec).is_some() {
            return None;
        }
        Some(match self.learned(spec) {
            Some(runtimes) => runtimes.remaining_at(age_s, u)?,
            None => PRIOR.remaining_at(age_s, u),
        })
    }

    /// What all finished jobs took: the cluster's typical runtime, which the adaptive
    /// reservation rule is measured in; the prior until there is history.
    pub fn typical(&self) -> RuntimeEstimate {
        self.all.estimate().unwrap_or(PRIOR)
    }

    /// The finished runs a job of `spec` is judged by: its class's, else its queue's, else
    /// all jobs', the first with enough samples.
    fn learned(&self, spec: &JobSpec) -> Option<&Runtimes> {
        let enough = |runtimes: &&Runtimes| runtimes.sorted.len() >= MIN_SAMPLES;
        self.class_to_runtimes
            .get(&class_of(spec))
            .filter(enough)
            .or_else(|| self.queue_to_runtimes.get(&spec.queue).filter(enough))
            .or_else(|| Some(&self.all).filter(enough))
    }
}

/// The runtime a job of `spec` declares, if a usable one.
fn declared(spec: &JobSpec) -> Option<f64> {
    spec.expected_runtime_s
        .filter(|d| d.is_finite() && *d > 0.0)
}

/// Nodes held for a job from a planned start.
#[derive(Debug, Clone)]
pub(super) struct Reservation {
    pub(super) nodes: Vec<usize>,
    pub(super) start_s: f64,
}

/// What a planned job takes of one node, and when: from its planned start to its expected end
/// (start plus its p50 runtime). Later jobs plan around it, and may run there before it
/// starts or beside it, never in its way once a reservation holds it: conservative backfill,
/// per node and per resource rather than whole nodes held forever.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Claim {
    node: u32,
    /// Its owner (`rank.id`) and the owner's place in the order cycles try jobs in: only jobs
    /// behind it plan around it, and only they are held off its nodes.
    rank: Rank,
    start_s: f64,
    end_s: f64,
    /// `[gpus, cpu, memory]` its pods take there.
    takes: [u32; 3],
    /// What the node has left beyond this claim (and the claims planned before it) at its
    /// start, by the plan: the most a job running across the start may hold there.
    spare: [u32; 3],
    /// Whether a reservation holds it. Only then is a job behind kept from running across
    /// its start (the backfill rule); without one, a job behind that fits first is placed
    /// first, as a cycle would, and the owner waits.
    held: bool,
}

/// Where and when a job would start: its pods per node, its start (p10, p50, p90) and, per
/// chosen node, what is left there beyond it at that start; and what each pod takes and for
/// how long (p50), which its claims last.
struct Planned {
    node_pods: Vec<(usize, u32)>,
    start: (f64, f64, f64),
    spare: Vec<[u32; 3]>,
    needs: [u32; 3],
    runtime_s: f64,
}

impl Planned {
    fn nodes(&self) -> Vec<usize> {
        self.node_pods.iter().map(|&(node, _)| node).collect()
    }

    /// Its claims, as the job of `rank`, `held` by a reservation or not.
    fn claims(&self, rank: Rank, held: bool) -> Vec<Claim> {
        self.node_pods
            .iter()
            .zip(&self.spare)
            .map(|(&(node, pods), &spare)| Claim {
                node: node as u32,
                rank,
                start_s: self.start.1,
                end_s: self.start.1 + self.runtime_s,
                takes: self.needs.map(|need| need.saturating_mul(pods)),
                spare,
                held,
            })
            .collect()
    }
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
    fn of(id: JobId, spec: &JobSpec) -> Self {
        Self {
            priority: spec.priority,
            submit_s: spec.submit_s,
            id,
        }
    }

    /// The order cycles try jobs in: `Less` when this one goes first.
    fn order(&self, other: &Rank) -> std::cmp::Ordering {
        other
            .priority
            .cmp(&self.priority)
            .then(self.submit_s.total_cmp(&other.submit_s))
            .then(self.id.cmp(&other.id))
    }

    /// Whether a job of this rank is tried before one of `other`.
    fn ahead_of(&self, other: &Rank) -> bool {
        self.order(other).is_lt()
    }
}

/// `a − b`, per resource, floored at zero.
fn minus(a: [u32; 3], b: [u32; 3]) -> [u32; 3] {
    [0, 1, 2].map(|k| a[k].saturating_sub(b[k]))
}

/// Samples of actual wait over first estimated wait needed before estimates are calibrated.
const CALIBRATE_AFTER: usize = 20;

/// How the plan's first estimates of waits compared with the waits that followed, over the
/// last jobs that started: the plan cannot see arrivals of higher priority, preemptions or
/// jobs ending early, so its raw waits are biased and its interval too narrow. Reported
/// estimates scale the planned wait by the ratio's p10, p50 and p90 (split conformal
/// prediction), learned only from jobs that already started.
#[derive(Debug, Clone, Default)]
pub(super) struct Calibration {
    ratios: Runtimes,
}

impl Calibration {
    /// A job planned to wait `estimated` seconds waited `actual`.
    fn observe(&mut self, actual: f64, estimated: f64) {
        // A wait planned as none has no ratio; the floor keeps tiny plans from dominating.
        if estimated >= 1.0 && actual.is_finite() && actual >= 0.0 {
            self.ratios.add(actual / estimated);
        }
    }

    /// The reported (p10, p50, p90) start for a raw plan `start` made at `now_s`.
    fn apply(&self, now_s: f64, start: (f64, f64, f64)) -> (f64, f64, f64) {
        let wait = start.1 - now_s;
        match self.ratios.quantiles() {
            Some((q10, q50, q90))
                if self.ratios.samples.len() >= CALIBRATE_AFTER && wait >= 1.0 =>
            {
                (now_s + q10 * wait, now_s + q50 * wait, now_s + q90 * wait)
            }
            _ => start,
        }
    }
}

/// The cluster's free resources now and as running jobs end (by estimated end): what every
/// start estimate of one replan walks, built once per replan instead of a cluster copy per job.
#[derive(Debug, Clone, Default)]
pub(super) struct Timeline {
    /// Per node: free whole GPUs, CPU (milli) and memory (MiB) now, balloons' counted free.
    free_now: Vec<[u32; 3]>,
    /// Running jobs by estimated end (p50).
    steps: Vec<Step>,
    /// What the steps give back, per node: one list for all of them (a list per running job
    /// was thousands of allocations per replan), each step its own range of it.
    node_frees: Vec<(u32, [u32; 3])>,
}

impl Timeline {
    /// What `step` gives back, per node.
    fn frees(&self, step: &Step) -> &[(u32, [u32; 3])] {
        &self.node_frees[step.frees.clone()]
    }
}

/// One running job's end: when (p10, p50, p90) and what it gives back (a range of
/// [`Timeline::node_frees`]).
#[derive(Debug, Clone)]
struct Step {
    p10_s: f64,
    p50_s: f64,
    p90_s: f64,
    frees: std::ops::Range<usize>,
    /// The ending job's queue and the GPUs its quota gives back: when a job blocked by quota
    /// is expected to be admitted.
    queue: QueueId,
    gpus: u64,
}

/// What a replan knows of one pod shape, shared by the waiting jobs of that shape: the nodes
/// it may ever run on, and (once a job of it first fits) the built-in scores of the nodes.
struct ShapeView {
    key: ShapeKey,
    eligible: Vec<bool>,
    scores: std::cell::OnceCell<Vec<u64>>,
    /// Pods of the shape each node holds now, and their sum, before any claim: the same for
    /// every job of the shape, so counted once per replan, not once per job.
    capacity_now: std::cell::OnceCell<(Vec<u32>, u64)>,
}

/// What one pod of `shape` takes of a node's `[gpus, cpu, memory]` (a fractional pod is
/// planned as a whole GPU: the plan errs late, never early).
fn pod_needs(shape: &crate::PodShape) -> [u32; 3] {
    let gpus = if shape.gpu_milli > 0 { 1 } else { shape.gpus };
    [gpus, shape.cpu_milli, shape.memory_mib]
}

/// What a shape's eligibility, scores and capacities depend on: GPU type, tolerations, GPUs,
/// milli-GPUs, CPU and memory, node affinity and other resources.
type ShapeKey = (
    crate::Sym,
    Vec<crate::Toleration>,
    [u32; 4],
    Option<std::sync::Arc<crate::NodeAffinity>>,
    Vec<(crate::Sym, u32)>,
);

/// What a shape's eligibility and scores depend on.
fn shape_key(shape: &crate::PodShape) -> ShapeKey {
    (
        shape.gpu_type,
        shape.tolerations.clone(),
        [
            shape.gpus,
            shape.gpu_milli,
            shape.cpu_milli,
            shape.memory_mib,
        ],
        shape.node_affinity.clone(),
        shape.resources.clone(),
    )
}

/// Which pending jobs have had a start estimate, and which got their first since the last
/// cycle's output listed them (see [`super::CycleOutput::newly_estimated`]).
#[derive(Debug, Clone, Default)]
pub(super) struct FirstEstimates {
    /// Pending jobs that have had an estimate: each is listed once.
    estimated: BTreeSet<JobId>,
    /// Jobs whose first estimate came since the last [`FirstEstimates::take`].
    newly: Vec<JobId>,
}

impl FirstEstimates {
    /// `id` has an estimate now: listed as newly estimated if it is its first.
    fn note(&mut self, id: JobId) {
        if self.estimated.insert(id) {
            self.newly.push(id);
        }
    }

    /// `id` started or went: it is no longer pending.
    fn forget(&mut self, id: JobId) {
        self.estimated.remove(&id);
    }

    /// The jobs newly estimated since the last call that `still_estimated` says still have
    /// an estimate; one that lost it before being listed is listed when it has one again.
    fn take(&mut self, still_estimated: impl Fn(JobId) -> bool) -> Vec<JobId> {
        let mut newly = std::mem::take(&mut self.newly);
        newly.retain(|&id| {
            let estimated = still_estimated(id);
            if !estimated {
                self.estimated.remove(&id);
            }
            estimated
        });
        newly
    }
}

/// Pods of `needs` that `free` holds.
fn pods_in(free: [u32; 3], needs: [u32; 3]) -> u32 {
    (0..3)
        .map(|k| free[k].checked_div(needs[k]).unwrap_or(u32::MAX))
        .min()
        .unwrap_or(0)
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
    pub(super) arrivals: super::forecast::Arrivals,
    /// The last forecast's starts: the estimate of the jobs the timeline does not plan, until
    /// the next one is in.
    pub(super) forecasts: super::forecast::Forecasts,
    /// When the last forecast came due (run inline, or handed out off the loop).
    pub(super) forecast_at_s: Option<f64>,
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
    pub(super) fn take_newly_estimated(&mut self) -> Vec<JobId> {
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
                }
            }
            None => WhatIf {
                runtime,
                start: None,
                nodes: None,
                jobs_ahead,
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
            // Nothing changed for the plan, but time passed: a forecast may have come due (on
            // a quiet cluster it is the only source of the estimates of jobs waiting for
            // quota).
            if self.forecast_if_due(now_s) {
                self.estimate_from_forecast(now_s);
            }
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

        // The jobs waiting for room, and while the gate is open those aged past the threshold
        // whatever blocks them, in the order cycles try them (priority, then age): the first
        // `MAX_PLANNED`, chosen without sorting them all.
        let rule = self.reservation_rule();
        self.plan.rule = rule;
        let aged = |spec: &JobSpec| rule.open && now_s - spec.submit_s >= rule.age_threshold_s;
        let mut waiting: Vec<Rank> = self
            .queue
            .parked_for(crate::Blocked::Room)
            .filter_map(|id| {
                let spec = &self.job_to_entry[&id].spec;
                // A balloon only fills what is idle: it is never planned for.
                (!spec.balloon).then(|| Rank::of(id, spec))
            })
            .collect();
        if rule.open {
            waiting.extend(
                self.queue
                    .parked_for(crate::Blocked::Quota)
                    .filter_map(|id| {
                        let spec = &self.job_to_entry[&id].spec;
                        (!spec.balloon && aged(spec)).then(|| Rank::of(id, spec))
                    }),
            );
        }
        if waiting.len() > MAX_PLANNED {
            waiting.select_nth_unstable_by(MAX_PLANNED, Rank::order);
            waiting.truncate(MAX_PLANNED);
        }
        waiting.sort_by(Rank::order);

        let timeline = self.timeline(now_s);
        // Most waiting jobs share a few shapes.
        let mut shapes: Vec<ShapeView> = Vec::new();

        let previous = std::mem::take(&mut self.plan.job_to_reservation);
        // Every planned job's claims: later jobs plan around the earlier ones, the order
        // cycles try them in.
        let mut planned_claims: Vec<Claim> = Vec::new();
        let mut reserved_claims: Vec<Claim> = Vec::new();
        let mut queues_reserved: Vec<QueueId> = Vec::new();
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
            let quota_blocked = quota_start.1 > now_s;
            // Today's rule for the heads of the queues waiting for room (one reservation per
            // queue, as Slurm's EASY backfill holds one), and an aged job whatever blocks it.
            let head = !quota_blocked && !queues_reserved.contains(&spec.queue);
            let reserve = self.plan.job_to_reservation.len() < self.plan_config.max_reservations
                && (reserved_gpus == 0 || reserved_gpus + gpus <= max_reserved_gpus)
                && (head || aged(&spec));
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
                queues_reserved.push(spec.queue);
                reserved_gpus += gpus;
                // Held from its earliest start (p10): a job let in ahead on the quota must be
                // gone by then, since what it takes is given back only as it ends.
                // Only an aged job's reservation holds quota: a head waiting for room holds
                // its nodes alone, as before the rule (past the gate, that keeps the cluster
                // busiest).
                if aged(&spec) {
                    quota_holds.push(QuotaHold {
                        rank,
                        queue: spec.queue,
                        gpus,
                        start_s: start.0,
                    });
                }
                self.plan.job_to_reservation.insert(
                    id,
                    Reservation {
                        nodes: nodes.clone(),
                        start_s: start.1,
                    },
                );
                if aged(&spec) {
                    format!("{domain} and {}", self.quota_text(spec.queue, gpus))
                } else {
                    domain
                }
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

    /// Free resources from now on, as the running jobs end by their estimates (a job past its
    /// estimate is expected to end soon, not in the past). Balloons give way, so what they
    /// hold counts as free now.
    pub(super) fn timeline(&self, now_s: f64) -> Timeline {
        let t = &self.state.nodes;
        let mut free_now: Vec<[u32; 3]> = (0..self.state.len())
            .map(|i| [t.gpu_free[i], t.cpu_free_milli[i], t.memory_free_mib[i]])
            .collect();
        let mut steps = Vec::new();
        let mut node_frees: Vec<(u32, [u32; 3])> = Vec::new();
        // Every entry, not a lookup per running job: the running are about half of them, and
        // a walk of the map costs less than that many lookups.
        for entry in self.job_to_entry.values() {
            let JobState::Running {
                started_s, slots, ..
            } = &entry.state
            else {
                continue;
            };
            let shape = &entry.spec.shape;
            // A fractional pod frees a whole GPU only when its GPU empties: planned as none.
            let gives = [
                if shape.gpu_milli > 0 { 0 } else { shape.gpus },
                shape.cpu_milli,
                shape.memory_mib,
            ];
            if entry.spec.balloon {
                for slot in slots {
                    let free = &mut free_now[slot.node as usize];
                    (0..3).for_each(|k| free[k] += gives[k]);
                }
                continue;
            }
            let from = node_frees.len();
            for slot in slots {
                match node_frees[from..]
                    .iter_mut()
                    .find(|(node, _)| *node == slot.node)
                {
                    Some((_, sum)) => (0..3).for_each(|k| sum[k] += gives[k]),
                    None => node_frees.push((slot.node, gives)),
                }
            }
            let (p10_s, p50_s, p90_s) = self.expected_end(&entry.spec, *started_s, now_s);
            steps.push(Step {
                p10_s,
                p50_s,
                p90_s,
                frees: from..node_frees.len(),
                queue: entry.spec.queue,
                gpus: entry.spec.total().gpus,
            });
        }
        // Stable: equal ends keep job order.
        steps.sort_by(|a, b| a.p50_s.total_cmp(&b.p50_s));
        Timeline {
            free_now,
            steps,
            node_frees,
        }
    }

    /// Per node, whether a pod of `shape` may ever run there (healthy, its GPU type, its
    /// taints tolerated): what no job ending can change. Scores come when first asked for.
    fn shape_view(&self, shape: &crate::PodShape) -> ShapeView {
        let t = &self.state.nodes;
        ShapeView {
            key: shape_key(shape),
            eligible: (0..self.state.len())
                .map(|i| {
                    t.health[i] == crate::Health::Healthy as u8
                        && (shape.gpu_type == 0 || shape.gpu_type == t.gpu_type[i])
                        && shape.tolerates_all(t.taints(i))
                        && shape.node_allowed(t, i)
                        && shape.lacking_resource(t, i) != Some(usize::MAX)
                })
                .collect(),
            scores: std::cell::OnceCell::new(),
            capacity_now: std::cell::OnceCell::new(),
        }
    }

    /// Where `spec` would start and when (p10, p50, p90), as running jobs end in estimated
    /// order, planning around `claims` (a node's claimed resources are kept from `spec` until
    /// the claim ends, from `spec`'s expected runtime before the claim starts when a
    /// reservation holds it, else from its start). Walks
    /// `timeline` and the claims' edges, updating only the nodes each changes; places (the
    /// same smallest-domain rule as a cycle) only once enough pods fit in total. `None` when
    /// it would not fit even once every job ended.
    fn earliest_start(
        &self,
        spec: &JobSpec,
        timeline: &Timeline,
        view: &ShapeView,
        claims: &[Claim],
        now_s: f64,
    ) -> Option<Planned> {
        let eligible = &view.eligible;
        let n = timeline.free_now.len();
        let needs = pod_needs(&spec.shape);
        let need = u64::from(spec.pods);
        let runtime_s = self.plan.runtimes.estimate(spec).p50_s;
        let mut free = timeline.free_now.clone();
        // Per node: what claims keep from `spec` if it started now, and the nodes they are on.
        let mut claimed = vec![[0u32; 3]; n];
        let mut claimed_now: Vec<usize> = Vec::new();
        // Claims' edges after now: (when, claim, whether it starts keeping resources).
        let mut edges: Vec<(f64, usize, bool)> = Vec::new();
        for (index, claim) in claims.iter().enumerate() {
            // A held claim keeps `spec` off from its expected runtime before the start; one not
            // held, only from the start (before it, the owner does not fit, and `spec` may).
            let from = if claim.held {
                claim.start_s - runtime_s
            } else {
                claim.start_s
            };
            let until = claim.end_s;
            if until <= now_s || claim.node as usize >= n {
                continue;
            }
            if from <= now_s {
                let c = &mut claimed[claim.node as usize];
                (0..3).for_each(|k| c[k] = c[k].saturating_add(claim.takes[k]));
                claimed_now.push(claim.node as usize);
            } else {
                edges.push((from, index, true));
            }
            edges.push((until, index, false));
        }
        edges.sort_by(|a, b| a.0.total_cmp(&b.0));
        let pods_at = |free: &[[u32; 3]], claimed: &[[u32; 3]], i: usize| {
            if eligible[i] {
                pods_in(minus(free[i], claimed[i]), needs)
            } else {
                0
            }
        };
        let (capacity_now, total_now) = view.capacity_now.get_or_init(|| {
            let unclaimed = vec![[0u32; 3]; n];
            let capacity: Vec<u32> = (0..n).map(|i| pods_at(&free, &unclaimed, i)).collect();
            let total = capacity.iter().map(|&c| u64::from(c)).sum();
            (capacity, total)
        });
        let (mut capacity, mut total) = (capacity_now.clone(), *total_now);
        for node in claimed_now {
            let pods = pods_at(&free, &claimed, node);
            total = total - u64::from(capacity[node]) + u64::from(pods);
            capacity[node] = pods;
        }
        let try_place = |capacity: &[u32], total: u64| -> Option<Vec<(usize, u32)>> {
            if total < need {
                return None;
            }
            let scores = view
                .scores
                .get_or_init(|| super::place::builtin_view(spec, &self.state).1);
            self.place(spec, capacity, scores).map(|p| p.node_pods)
        };
        let planned = |node_pods: Vec<(usize, u32)>,
                       start: (f64, f64, f64),
                       free: &[[u32; 3]],
                       claimed: &[[u32; 3]]| {
            let spare = node_pods
                .iter()
                .map(|&(node, pods)| {
                    minus(
                        minus(free[node], claimed[node]),
                        needs.map(|need| need.saturating_mul(pods)),
                    )
                })
                .collect();
            Planned {
                node_pods,
                start,
                spare,
                needs,
                runtime_s,
            }
        };
        if let Some(node_pods) = try_place(&capacity, total) {
            return Some(planned(node_pods, (now_s, now_s, now_s), &free, &claimed));
        }
        let steps = &timeline.steps;
        let (mut i, mut e) = (0, 0);
        let mut touched: Vec<usize> = Vec::new();
        while i < steps.len() || e < edges.len() {
            // Every job ending (and every claim edge) at the same time changes nodes together.
            let at = steps
                .get(i)
                .map_or(f64::INFINITY, |s| s.p50_s)
                .min(edges.get(e).map_or(f64::INFINITY, |edge| edge.0));
            touched.clear();
            while i < steps.len() && steps[i].p50_s <= at {
                for &(node, gives) in timeline.frees(&steps[i]) {
                    let node = node as usize;
                    (0..3).for_each(|k| free[node][k] += gives[k]);
                    touched.push(node);
                }
                i += 1;
            }
            while e < edges.len() && edges[e].0 <= at {
                let (_, index, keeps) = edges[e];
                let claim = &claims[index];
                let c = &mut claimed[claim.node as usize];
                (0..3).for_each(|k| {
                    c[k] = if keeps {
                        c[k].saturating_add(claim.takes[k])
                    } else {
                        c[k].saturating_sub(claim.takes[k])
                    }
                });
                touched.push(claim.node as usize);
                e += 1;
            }
            for &node in &touched {
                let pods = pods_at(&free, &claimed, node);
                total = total - u64::from(capacity[node]) + u64::from(pods);
                capacity[node] = pods;
            }
            if let Some(node_pods) = try_place(&capacity, total) {
                // The interval: the jobs that had to end are those that held a chosen node.
                let mut chosen = vec![false; n];
                node_pods.iter().for_each(|&(node, _)| chosen[node] = true);
                let mut start = (now_s, at, at);
                for step in &steps[..i] {
                    if timeline
                        .frees(step)
                        .iter()
                        .any(|&(node, _)| chosen[node as usize])
                    {
                        start.0 = start.0.max(step.p10_s);
                        start.2 = start.2.max(step.p90_s);
                    }
                }
                start.0 = start.0.min(start.1);
                start.2 = start.2.max(start.1);
                return Some(planned(node_pods, start, &free, &claimed));
            }
        }
        None
    }

    /// The cluster's GPUs: what the backlog and the reservations' cap are measured against.
    fn total_gpus(&self) -> u64 {
        self.state
            .nodes
            .gpu_total
            .iter()
            .map(|&g| u64::from(g))
            .sum()
    }

    /// When aged jobs get reservations now (see [`ReservationRule`]): a job is aged once it
    /// waited [`AGE_RUNTIMES`] learned p90 runtimes, and the gate is open while the pending
    /// work, by learned median runtimes, would keep the cluster busy for less than
    /// [`BACKLOG_RUNTIMES`] of them. Both follow what this cluster's finished jobs took, not a
    /// constant; a setting pins either.
    pub(super) fn reservation_rule(&self) -> ReservationRule {
        let long_s = self.plan.runtimes.typical().p90_s;
        let age_threshold_s = self
            .plan_config
            .reserve_after_s
            .unwrap_or(AGE_RUNTIMES * long_s);
        let backlog_limit_s = self
            .plan_config
            .backlog_limit_s
            .unwrap_or(BACKLOG_RUNTIMES * long_s);
        let total = self.total_gpus().max(1) as f64;
        let mut work = 0.0;
        for id in self.queue.all() {
            let spec = &self.job_to_entry[&id].spec;
            if !spec.balloon {
                work += spec.total().gpus as f64 * self.plan.runtimes.estimate(spec).p50_s;
            }
        }
        let backlog_s = work / total;
        ReservationRule {
            age_threshold_s,
            backlog_s,
            backlog_limit_s,
            open: backlog_s < backlog_limit_s,
        }
    }

    /// When `spec`'s queue admits it (p10, p50, p90), as running jobs end by their estimates
    /// and give their quota back: `now_s` when it admits it now, `None` when it would not even
    /// once every running job ended.
    fn quota_start(
        &self,
        spec: &JobSpec,
        timeline: &Timeline,
        now_s: f64,
    ) -> Option<(f64, f64, f64)> {
        let gpus = spec.total().gpus;
        if spec.balloon || self.queues.admits(spec.queue, gpus) {
            return Some((now_s, now_s, now_s));
        }
        let mut queues = self.queues.clone();
        let mut start = (now_s, now_s, now_s);
        for step in &timeline.steps {
            queues.charge(step.queue, crate::Resources::gpus(step.gpus), false);
            start = (start.0.max(step.p10_s), step.p50_s, start.2.max(step.p90_s));
            if queues.admits(spec.queue, gpus) {
                return Some((start.0.min(start.1), start.1, start.2.max(start.1)));
            }
        }
        None
    }

    /// "128 GPUs of queue rl's quota, 64 of them borrowed from cohort research": the quota a
    /// reservation holds.
    fn quota_text(&self, queue: QueueId, gpus: u64) -> String {
        let name = self.queues.name(queue);
        let borrowed = gpus.saturating_sub(self.queues.nominal(queue));
        if borrowed == 0 {
            return format!("{gpus} GPUs of queue {name}'s quota");
        }
        let lenders = match self.queues.parent(queue) {
            Some(parent) => format!("cohort {}", self.queues.name(parent)),
            None => "the other top-level queues".to_string(),
        };
        format!("{gpus} GPUs of queue {name}'s quota, {borrowed} of them borrowed from {lenders}")
    }

    /// The quota hold: the reservation `spec`'s admission would delay, if any. A job behind a
    /// reservation's owner that would borrow, or that is of the owner's own queue, may not
    /// take what the owner needs of its queue's headroom, unless it is expected to end (by its
    /// p90) before the owner's planned start. A job within its own queue's nominal quota in
    /// another queue is never held: nominal quota is guaranteed.
    pub(super) fn quota_hold_against(
        &self,
        id: JobId,
        spec: &JobSpec,
        admission: &crate::Admission,
        now_s: f64,
    ) -> Option<JobId> {
        let gpus = spec.total().gpus;
        if spec.balloon || gpus == 0 || self.plan.quota_holds.is_empty() {
            return None;
        }
        let rank = Rank::of(id, spec);
        // Its p90, not its p50 as on nodes: a job that overruns on a reserved node is evicted
        // when the reservation comes due, while quota it took is given back only as it ends.
        let ends = now_s + self.plan.runtimes.estimate(spec).p90_s;
        let borrowing = matches!(admission, crate::Admission::Borrowing { .. });
        let mut after: Option<crate::Queues> = None;
        for hold in &self.plan.quota_holds {
            if hold.rank.id == id
                || !hold.rank.ahead_of(&rank)
                || ends <= hold.start_s
                || !(borrowing || hold.queue == spec.queue)
            {
                continue;
            }
            let before = self.queues.headroom(hold.queue);
            let after = after.get_or_insert_with(|| {
                let mut queues = self.queues.clone();
                queues.charge(spec.queue, crate::Resources::gpus(gpus), true);
                queues
            });
            let left = after.headroom(hold.queue);
            if left < hold.gpus && left < before {
                return Some(hold.rank.id);
            }
        }
        None
    }

    /// The job whose reservation's quota hold would keep pending job `id` back at `now_s`, if
    /// any: what a cycle would refuse it for after the built-in quota admitted it.
    pub fn quota_hold_of(&self, id: JobId, now_s: f64) -> Option<JobId> {
        let spec = &self.job_to_entry.get(&id)?.spec;
        let admission = self.queues.admission(spec.queue, spec.total().gpus);
        if matches!(admission, crate::Admission::Denied { .. }) {
            return None;
        }
        self.quota_hold_against(id, spec, &admission, now_s)
    }

    /// Whether `id` holds a reservation's quota (see [`Scheduler::quota_hold_against`]).
    pub(super) fn holds_quota(&self, id: JobId) -> bool {
        self.plan.quota_holds.iter().any(|hold| hold.rank.id == id)
    }

    /// The rule the last replan gave reservations by.
    pub fn reservation_rule_in_force(&self) -> ReservationRule {
        self.plan.rule
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
