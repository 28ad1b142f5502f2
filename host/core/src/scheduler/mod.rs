//! The scheduler: the jobs, the cluster and the queues, and the cycle that places jobs and
//! explains every decision. One module per stage of the cycle:
//! - [`queue`]: the order stage, the scheduling queue (per-queue heads in fair-share order,
//!   parked jobs, backoff);
//! - [`quota`]: the built-in quota check and the quota policies;
//! - [`evaluate`]: the filters and scores, chunk by chunk;
//! - [`place`]: the nodes for every pod, topology-aware for gangs;
//! - [`preempt`]: the victims that make room;
//! - [`plan`]: runtime estimates, reservations of nodes and quota, the backfill rule and
//!   start estimates;
//! - [`forecast`]: start estimates for the jobs the plan does not cover, from the cycle run
//!   forward on a copy, with the last hour's submissions expected again;
//! - [`baselines`]: the anchors Gantry is measured against (`k8s-default`, `coscheduling`);
//! - [`explain`]: the explanation record's blank and its "waiting for" texts;
//! - [`health`]: what a failing node does to the jobs on it (stopped whole, back to the head
//!   of the queue, the node avoided).
//!
//! This module holds the jobs' life cycle (submit, adopt, place, evict, finish) and Gantry's
//! own cycle, which ties the stages together.

mod baselines;
mod evaluate;
mod explain;
mod forecast;
mod health;
mod place;
pub mod plan;
mod preempt;
pub mod queue;
mod quota;
mod unestimated;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::cluster::{ClusterState, Slot};
use crate::explain::{Explanation, Outcome};
use crate::hooks::PolicyHooks;
use crate::model::{PodShape, Resources};
use crate::queues::{Admission, QueueId, Queues};
use crate::symbols::Symbols;

pub use forecast::{ForecastRun, KnownFuture, WhatIfRun};
pub use health::{BadNode, HALT_S, NodeFailure, StopPolicy};
pub use place::TopologyStats;
pub use plan::Forecasts;
pub use queue::{Blocked, Epochs, JobKey, RoomAsk, SchedulingQueue};

/// A job's key in the scheduler: stable for the job's life and never reused, so a caller may
/// keep it across cycles. Finished jobs are forgotten.
pub type JobId = u32;

/// Nodes evaluated per policy call. Policies see the cluster a chunk at a time, so a single
/// pod can stop early; a gang always sees every chunk. Small enough that a pod needing 5% of a
/// 7,500-node cluster reads little more than it needs, large enough that the per-call cost of
/// crossing into Wasm stays small beside the per-node work.
pub const CHUNK: usize = 512;

/// Where a gang wants to run: within one domain of `level` (an index into the node table's
/// levels, innermost first), as a hard requirement or a preference.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologyPref {
    pub level: Option<usize>,
    pub required: bool,
}

/// A job as submitted: a gang of `pods` identical pods (1 for a single pod).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    pub name: String,
    pub queue: QueueId,
    pub priority: i32,
    pub pods: u32,
    pub shape: PodShape,
    /// A placeholder that holds capacity and gives way at once to real work.
    pub balloon: bool,
    pub topology: TopologyPref,
    pub submit_s: f64,
    /// How long the job says it runs once started (a pod's `gantry.dev/expected-runtime`, a
    /// trace's `expected_runtime_s`); the planner learns an estimate when it is absent.
    #[serde(default)]
    pub expected_runtime_s: Option<f64>,
}

#[cfg(test)]
impl JobSpec {
    /// A one-pod job of queue 0 submitted at `submit_s`, for unit tests.
    pub(crate) fn one_pod(submit_s: f64) -> Self {
        JobSpec {
            name: format!("j{submit_s}"),
            queue: 0,
            priority: 0,
            pods: 1,
            shape: crate::PodShape::default(),
            balloon: false,
            topology: Default::default(),
            submit_s,
            expected_runtime_s: None,
        }
    }
}

impl JobSpec {
    pub fn total(&self) -> Resources {
        let pods = u64::from(self.pods);
        Resources {
            // One count of GPUs for quota and for the room check: the ask's.
            gpus: self.room_ask().gpus(),
            cpu_milli: u64::from(self.shape.cpu_milli) * pods,
            memory_mib: u64::from(self.shape.memory_mib) * pods,
        }
    }

    fn queue_key(&self) -> JobKey {
        JobKey {
            queue: self.queue,
            priority: self.priority,
            submit_s: self.submit_s,
            gpus: if self.balloon { 0 } else { self.total().gpus },
            ask: self.room_ask(),
        }
    }

    /// What the job asks of the GPUs, as the room check counts it.
    fn room_ask(&self) -> RoomAsk {
        RoomAsk {
            pods: self.pods,
            gpus_per_pod: self.shape.gpus,
            gpu_milli: self.shape.gpu_milli,
            balloon: self.balloon,
        }
    }
}

/// Running jobs and the GPUs they hold, of one priority or of the balloons.
#[derive(Debug, Clone, Copy, Default)]
struct Held {
    jobs: u64,
    gpus: u64,
}

impl Held {
    fn add(&mut self, gpus: u64) {
        self.jobs += 1;
        self.gpus += gpus;
    }

    fn remove(&mut self, gpus: u64) {
        self.jobs -= 1;
        self.gpus -= gpus;
    }
}

#[derive(Debug, Clone)]
enum JobState {
    Pending,
    Running {
        slots: Vec<Slot>,
        /// The cycle that placed it: a cycle never evicts what it placed itself.
        since_cycle: u64,
        /// When it started, on the scheduler's clock: the planner's estimated end, and the
        /// runtime it learns when the job finishes.
        started_s: f64,
    },
    /// The baselines only: some pods hold nodes while their siblings wait (bound and running
    /// under `K8sDefault`, assumed at the permit stage under `Coscheduling`).
    Holding {
        slots: Vec<Slot>,
        since_s: f64,
    },
}

/// How the cycle places jobs: Gantry's way, or as one of the anchors it is measured against.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Whole gangs at once, topology-aware, with quota, fair share and preemption.
    Gantry,
    /// Stock kube-scheduler: one pod at a time, priority then FIFO, least-allocated spreading,
    /// no gang awareness: a gang's placed pods run and hold their GPUs while siblings wait.
    K8sDefault,
    /// kube-scheduler with the scheduler-plugins Coscheduling plugin: pods are assumed one at
    /// a time and wait at the permit stage until the whole gang is assumed; after
    /// `permit_timeout_s` the assumed pods are released and the gang waits again.
    Coscheduling { permit_timeout_s: f64 },
    /// Kueue as most users run it, in front of stock kube-scheduler: a workload (a whole job)
    /// is admitted when its ClusterQueue's quota, with borrowing from its cohort, admits it
    /// (BestEffortFIFO: an inadmissible workload waits for quota to be released and does not
    /// block the ones behind it), its quota is charged at admission, and only then are its
    /// pods placed one by one as under `K8sDefault`: pods that do not fit hold and wait. No
    /// preemption (Kueue's default), so quota lent to another queue comes back only when the
    /// borrower's workloads finish.
    Kueue,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Gantry => "gantry",
            Mode::K8sDefault => "k8s-default",
            Mode::Coscheduling { .. } => "coscheduling",
            Mode::Kueue => "kueue",
        }
    }
}

#[derive(Debug, Clone)]
struct JobEntry {
    spec: JobSpec,
    state: JobState,
}

/// What a cycle did.
#[derive(Debug, Default, Clone)]
pub struct CycleOutput {
    /// One per job considered, placed or not.
    pub decisions: Vec<Decision>,
    /// Jobs evicted (whole gangs) to make room; they are pending again.
    pub evicted: Vec<JobId>,
    /// Jobs evaluated against the nodes or the quota policies: what `max_attempts` bounds.
    /// A job refused by the built-in quota or known not to fit costs no attempt.
    pub attempts: u32,
    /// Parked jobs woken at the start of the cycle.
    pub woken: u32,
    /// The policy-call budget ran out before the cycle reached every job it would have tried;
    /// those wait, in order, for the next cycle (see [`PolicyHooks::budget_spent`]).
    pub budget_spent: bool,
    /// Jobs stopped whole since the last cycle because a node failed under them
    /// ([`Scheduler::node_failed`]): pending again, their pods to be evicted by the binder.
    /// Each has its decision, with the reason, first in `decisions`.
    pub stopped: Vec<JobId>,
    /// Pending jobs whose first start estimate came since the last cycle (from this cycle's
    /// replan, or a forecast installed since), whether or not this cycle tried them: a job
    /// parked since its first attempt is tried again only when woken, so whoever shows
    /// estimates (a pod's message, the replay's report) learns of it here, once, rather than
    /// looking up every pending job after every cycle.
    pub newly_estimated: Vec<JobId>,
}

/// One job's decision in one cycle: the typed result, and its explanation for people.
#[derive(Debug, Clone)]
pub struct Decision {
    pub job: JobId,
    pub placed: bool,
    /// Where its pods go when placed: `(node index, pods on it)`.
    pub placement: Vec<(usize, u32)>,
    /// Jobs evicted to make room for it.
    pub victims: Vec<JobId>,
    pub explanation: Explanation,
}

/// What a gang waits for when a policy rejects the nodes balloons gave up for its topology.
const BALLOONS_REJECTED: &str =
    "the nodes freed by evicting balloons for its topology (a policy rejected them)";

/// Knobs of the cycle.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Most jobs attempted per cycle (see [`CycleOutput::attempts`]); the rest wait for the
    /// next cycle.
    pub max_attempts: usize,
    /// Top nodes kept in an explanation.
    pub top_nodes: usize,
    pub preemption: bool,
    pub mode: Mode,
    /// A single pod is placed once this many feasible nodes are found (or 5% of the cluster,
    /// if more), like kube-scheduler's minFeasibleNodesToFind.
    pub min_feasible_nodes: usize,
    /// Balloons give way to keep a gang in one tighter domain (rack, block) when the free
    /// nodes alone would spread it over several (see `place`); off, a gang takes the free
    /// nodes as they are.
    pub balloons_for_topology: bool,
    /// How a gang stopped by a node failure comes back ([`Scheduler::node_failed`]).
    pub restart: RestartBy,
}

/// How a gang stopped by a node failure comes back. The simulator owns its jobs and sends the
/// same one back to the queue; a live cluster's pods are evicted and recreated by their
/// controller, and the recreated pods are a new job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RestartBy {
    /// The job is released at once and goes back to its place at the head of its queue.
    #[default]
    Requeue,
    /// The job stays placed while its pods are evicted (a terminating pod still holds its
    /// GPUs); the recreated pods' job is put first by [`Scheduler::restarted`], with the
    /// nodes the stopped one avoided ([`Scheduler::avoided`]).
    Recreated,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_attempts: 1000,
            top_nodes: 5,
            preemption: true,
            mode: Mode::Gantry,
            min_feasible_nodes: 100,
            balloons_for_topology: true,
            restart: RestartBy::Requeue,
        }
    }
}

/// The pure scheduler: cluster, queues and jobs, driven by [`Scheduler::cycle`].
#[derive(Clone)]
pub struct Scheduler {
    pub state: ClusterState,
    pub queues: Queues,
    pub config: SchedulerConfig,
    symbols: Arc<Symbols>,
    /// Pending and running jobs by key; a finished job leaves, so memory follows what is live,
    /// not history. Ordered so every iteration is deterministic.
    job_to_entry: BTreeMap<JobId, JobEntry>,
    next_id: JobId,
    /// The pending jobs, in the order cycles try them.
    queue: SchedulingQueue,
    /// Running jobs (and the baselines' partly placed ones): preemption scans these, not
    /// every job ever submitted.
    running: BTreeSet<JobId>,
    /// GPUs held by jobs whose every pod runs: the allocation that does work.
    running_gpus: u64,
    /// What running non-balloon jobs hold, by priority, and what running balloons hold: what a
    /// job could preempt, for the queue's cheap "could it fit at all" check and for skipping
    /// the preemption search when no running job could be a victim. A priority leaves when its
    /// last job does.
    priority_to_held: BTreeMap<i32, Held>,
    balloons_held: Held,
    /// Cycles run so far; the current one while a cycle runs.
    cycle_no: u64,
    /// The policy-set version of the last cycle: a new one wakes every parked job.
    policy_set: u64,
    /// Bumped when the queue tree is replaced, so quota-parked jobs look again.
    queue_changes: u64,
    /// The chunk the next single pod starts evaluating at, so decisions spread their reads
    /// over the cluster. A `Cell` because evaluation borrows the scheduler immutably.
    next_chunk: std::cell::Cell<usize>,
    /// What each distinct node affinity allows and prefers, per chunk, so pods sharing one pay
    /// for its label checks once. A `RefCell` because evaluation borrows the scheduler
    /// immutably; dropped by [`Scheduler::reset`] with the node table it describes.
    affinity_index: std::cell::RefCell<crate::AffinityIndex>,
    /// The scheduler's clock: the latest time a cycle or the loop told it (seconds).
    clock_s: f64,
    /// Reservations, estimates and what finished jobs took (see [`plan`]).
    plan: plan::Plan,
    plan_config: plan::PlanConfig,
    /// How gangs landed against the outermost topology level, for reports.
    topology_stats: place::TopologyStats,
    /// Every node's health lifecycle and the breaker over automated cordons.
    lifecycle: crate::health::Lifecycle,
    /// Per job stopped by a node failure, the nodes it avoids for a while: the per-workload
    /// bad-node list. Dropped when the job finishes.
    job_to_bad_nodes: BTreeMap<JobId, Vec<BadNode>>,
    /// Per job whose stop policy is not the default (whole), its policy: few jobs, set by the
    /// cluster source. Dropped when the job finishes.
    job_to_stop_policy: BTreeMap<JobId, health::StopPolicy>,
    /// Decisions of the stops since the last cycle, and their jobs: the next cycle's output
    /// carries them, so that what a binder applies and the store keeps comes in one place.
    stops: Vec<Decision>,
    stopped_jobs: Vec<JobId>,
    /// An anchor's gangs halted by a failure, holding their GPUs until then (release time,
    /// job); and stopped jobs whose recreated pods reach the queue then (time, job). Short
    /// lists: failures are rare.
    halted: Vec<(f64, JobId)>,
    recreating: Vec<(f64, JobId)>,
    /// Gangs Gantry stopped for a failure: the next cycle tries them before any other job,
    /// so the nodes they freed are not given away first.
    restart_first: Vec<JobId>,
}

impl Scheduler {
    pub fn new(
        state: ClusterState,
        queues: Queues,
        symbols: Arc<Symbols>,
        config: SchedulerConfig,
    ) -> Self {
        let lifecycle = crate::health::Lifecycle::new(&state.nodes.health, Default::default());
        Self {
            lifecycle,
            job_to_bad_nodes: BTreeMap::new(),
            job_to_stop_policy: BTreeMap::new(),
            stops: Vec::new(),
            stopped_jobs: Vec::new(),
            halted: Vec::new(),
            recreating: Vec::new(),
            restart_first: Vec::new(),
            state,
            queues,
            config,
            symbols,
            job_to_entry: BTreeMap::new(),
            next_id: 0,
            queue: SchedulingQueue::default(),
            running: BTreeSet::new(),
            running_gpus: 0,
            priority_to_held: BTreeMap::new(),
            balloons_held: Held::default(),
            cycle_no: 0,
            policy_set: 0,
            queue_changes: 0,
            next_chunk: std::cell::Cell::new(0),
            affinity_index: std::cell::RefCell::default(),
            clock_s: 0.0,
            plan: plan::Plan::default(),
            plan_config: plan::PlanConfig::default(),
            topology_stats: place::TopologyStats::default(),
        }
    }

    /// Sets the planner's knobs (on by default for Gantry's cycle).
    pub fn set_plan_config(&mut self, config: plan::PlanConfig) {
        self.plan_config = config;
    }

    /// The planner's knobs, as set.
    pub fn plan_config(&self) -> &plan::PlanConfig {
        &self.plan_config
    }

    /// The scheduler's clock, in seconds: what start times and estimates are measured on.
    pub fn clock_s(&self) -> f64 {
        self.clock_s
    }

    /// Moves the scheduler's clock to `now_s` (never back): start and end times of jobs are
    /// read from it. The loop calls it before the cluster syncs.
    pub fn advance_clock(&mut self, now_s: f64) {
        self.clock_s = self.clock_s.max(now_s);
    }

    /// GPUs held by jobs whose every pod is running (not by the baselines' partial gangs).
    pub fn running_gpus(&self) -> u64 {
        self.running_gpus
    }

    /// Jobs with some but not all pods running: only `K8sDefault` ever has any.
    pub fn partially_running(&self) -> impl Iterator<Item = JobId> + '_ {
        let bound = self.config.mode == Mode::K8sDefault;
        self.running.iter().copied().filter(move |&id| {
            bound && matches!(self.job_to_entry[&id].state, JobState::Holding { .. })
        })
    }

    pub fn symbols(&self) -> &Arc<Symbols> {
        &self.symbols
    }

    /// Replace the queue tree (a Queue object changed, or a pod named a new queue). Jobs keep
    /// their queue by name (one the new tree lacks falls to its first queue), running jobs are
    /// charged to the new tree, each queue keeps its decayed usage, and every pending job is
    /// tried again, since its quota may have changed.
    pub fn set_queues(&mut self, mut queues: Queues) {
        let (clock, usage) = self.queues.decay_state();
        queues.restore_decay(clock, &usage.into_iter().collect());
        let old = std::mem::replace(&mut self.queues, queues);
        let pending = self.queue.all();
        for id in &pending {
            self.queue.remove(*id);
        }
        for entry in self.job_to_entry.values_mut() {
            let name = old.name(entry.spec.queue);
            entry.spec.queue = self.queues.id(name).unwrap_or(0);
            if matches!(entry.state, JobState::Running { .. }) && !entry.spec.balloon {
                self.queues
                    .charge(entry.spec.queue, entry.spec.total(), true);
            }
        }
        for id in pending {
            let key = self.job_to_entry[&id].spec.queue_key();
            self.queue.push(id, key);
        }
        self.queue_changes += 1;
    }

    /// Start over on a new cluster and queue tree (a live cluster's node set changed, or a
    /// watch had to relist): every job is dropped, to be submitted or adopted again. Job ids
    /// keep counting, so none is ever reused. Each node's lifecycle goes on by name (see
    /// [`crate::health::Lifecycle::carry_from`]), with the breaker.
    pub fn reset(&mut self, state: ClusterState, queues: Queues) {
        let next_id = self.next_id;
        let cycle_no = self.cycle_no;
        let runtimes = std::mem::take(&mut self.plan.runtimes);
        let arrivals = std::mem::take(&mut self.plan.arrivals);
        let (clock_s, plan_config) = (self.clock_s, self.plan_config.clone());
        let lifecycle = std::mem::take(&mut self.lifecycle);
        let name_to_old: HashMap<String, usize> = (0..self.state.len())
            .map(|node| (self.node_name(node), node))
            .collect();
        *self = Self::new(state, queues, self.symbols.clone(), self.config.clone());
        self.next_id = next_id;
        self.cycle_no = cycle_no;
        self.clock_s = clock_s;
        self.plan_config = plan_config;
        self.plan.runtimes = runtimes;
        self.plan.arrivals = arrivals;
        let names: Vec<String> = (0..self.state.len()).map(|n| self.node_name(n)).collect();
        let carried = self
            .lifecycle
            .carry_from(lifecycle, |node| name_to_old.get(&names[node]).copied());
        for node in carried {
            self.sync_health(node);
        }
    }

    /// Take a placed job off its nodes and back to the front of its queue, to be placed again
    /// by the next cycle: a live cluster's preemptor whose victims are gone, or whose wait ran
    /// out.
    pub fn unplace(&mut self, id: JobId) {
        if !self.job_to_entry.contains_key(&id) {
            return;
        }
        self.release(id);
        let key = self.job_to_entry[&id].spec.queue_key();
        self.queue.push(id, key);
    }

    pub fn submit(&mut self, spec: JobSpec) -> JobId {
        if self.plan_config.enabled && self.plan.arrivals.record(&spec) {
            let rank = plan::Rank::of(self.next_id, &spec);
            self.plan.reachable_submitted |= self.plan.forecasts.reach.may_reach(&spec, &rank);
        }
        self.enqueue(spec)
    }

    /// A job into the queue, pending, and nothing else: the planner does not count it as an
    /// arrival (a what-if's job on a copy of the scheduler is none).
    fn enqueue(&mut self, spec: JobSpec) -> JobId {
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push(id, spec.queue_key());
        self.job_to_entry.insert(
            id,
            JobEntry {
                spec,
                state: JobState::Pending,
            },
        );
        id
    }

    /// A job that already runs on `nodes` (one entry per pod), as a live cluster's bound pods
    /// are found: reserved, charged to its queue, and preemptable like a job the cycle placed.
    /// The caller checked each node's room with [`ClusterState::capacity_for`].
    pub fn adopt(&mut self, spec: JobSpec, nodes: &[usize]) -> JobId {
        let slots = nodes
            .iter()
            .map(|&node| self.state.reserve(node, &spec.shape))
            .collect();
        let id = self.next_id;
        self.next_id += 1;
        self.job_to_entry.insert(
            id,
            JobEntry {
                spec,
                state: JobState::Pending,
            },
        );
        self.start(id, slots);
        id
    }

    /// The job's spec. Panics for a job that finished (finished jobs are forgotten).
    pub fn job(&self, id: JobId) -> &JobSpec {
        &self.job_to_entry[&id].spec
    }

    /// The job's spec, or `None` once it finished.
    pub fn get(&self, id: JobId) -> Option<&JobSpec> {
        self.job_to_entry.get(&id).map(|e| &e.spec)
    }

    /// Pending jobs (active and parked), by key.
    pub fn pending(&self) -> Vec<JobId> {
        self.queue.all()
    }

    /// How many jobs are pending.
    pub fn pending_count(&self) -> usize {
        self.queue.len()
    }

    /// The scheduling queue, read-only: why a job is parked, what runs out next.
    pub fn scheduling_queue(&self) -> &SchedulingQueue {
        &self.queue
    }

    pub fn is_running(&self, id: JobId) -> bool {
        matches!(
            self.job_to_entry.get(&id).map(|e| &e.state),
            Some(JobState::Running { .. })
        )
    }

    /// The slots of a running job, or of a baseline's partly placed one.
    pub fn slots(&self, id: JobId) -> &[Slot] {
        match self.job_to_entry.get(&id).map(|e| &e.state) {
            Some(JobState::Running { slots, .. } | JobState::Holding { slots, .. }) => slots,
            _ => &[],
        }
    }

    /// Running jobs, by key.
    pub fn running(&self) -> impl Iterator<Item = JobId> + '_ {
        self.running
            .iter()
            .copied()
            .filter(|&id| self.is_running(id))
    }

    /// A job ends (or is withdrawn): free its nodes and its quota, and forget it. A running
    /// job's runtime so far teaches the planner what jobs like it take.
    pub fn finish(&mut self, id: JobId) {
        if let Some(entry) = self.job_to_entry.get(&id)
            && let JobState::Running { started_s, .. } = entry.state
            && self.plan_config.enabled
            && !self.plan.drawn_copy
        {
            self.plan
                .runtimes
                .observe(&entry.spec, self.clock_s - started_s);
        }
        // Only a pending job holds a reservation (its owner's start drops it).
        if self.drop_reservation(id) {
            self.plan.reservations_withdrawn += 1;
        }
        self.plan.backfill_to_owner.remove(&id);
        self.job_to_bad_nodes.remove(&id);
        self.job_to_stop_policy.remove(&id);
        self.release(id);
        self.queue.placed(id);
        self.job_to_entry.remove(&id);
    }

    /// A job's binding failed: it is pending again (its nodes and quota given back) and parked
    /// with a backoff, as kube-scheduler backs off a pod whose binding failed.
    pub fn binding_failed(&mut self, id: JobId, now_s: f64) {
        if !self.job_to_entry.contains_key(&id) {
            return;
        }
        self.release(id);
        let key = self.job_to_entry[&id].spec.queue_key();
        self.queue.push(id, key);
        self.queue.park(id, Blocked::Binding, now_s, self.epochs());
    }

    /// The events parked jobs wait for, as counted now.
    fn epochs(&self) -> Epochs {
        Epochs {
            quota: self.queues.releases() + self.queue_changes,
            room: self.state.releases() + self.plan.reservations_withdrawn,
            policy_set: self.policy_set,
        }
    }

    /// Mark `id` running on `slots`: reserve bookkeeping, quota, counters.
    fn start(&mut self, id: JobId, slots: Vec<Slot>) {
        let entry = self.job_to_entry.get_mut(&id).expect("a live job");
        let total = entry.spec.total();
        if entry.spec.balloon {
            self.balloons_held.add(total.gpus);
        } else {
            self.queues.charge(entry.spec.queue, total, true);
            self.priority_to_held
                .entry(entry.spec.priority)
                .or_default()
                .add(total.gpus);
        }
        self.running_gpus += total.gpus;
        entry.state = JobState::Running {
            slots,
            since_cycle: self.cycle_no,
            started_s: self.clock_s,
        };
        self.running.insert(id);
        self.queue.placed(id);
    }

    /// Give back what a running (or holding) job has; it is left `Pending`, outside the queue.
    fn release(&mut self, id: JobId) {
        let Some(entry) = self.job_to_entry.get_mut(&id) else {
            return;
        };
        match std::mem::replace(&mut entry.state, JobState::Pending) {
            JobState::Running { slots, .. } => {
                for slot in slots {
                    self.state.release(slot, &entry.spec.shape);
                }
                let total = entry.spec.total();
                self.running_gpus -= total.gpus;
                if entry.spec.balloon {
                    self.balloons_held.remove(total.gpus);
                } else {
                    self.queues.charge(entry.spec.queue, total, false);
                    if let Some(held) = self.priority_to_held.get_mut(&entry.spec.priority) {
                        held.remove(total.gpus);
                        if held.jobs == 0 {
                            self.priority_to_held.remove(&entry.spec.priority);
                        }
                    }
                }
            }
            JobState::Holding { slots, .. } => {
                for slot in slots {
                    self.state.release(slot, &entry.spec.shape);
                }
            }
            JobState::Pending => {}
        }
        self.running.remove(&id);
    }

    /// Evict a running job (all of its pods) back to pending. It waits for room again.
    fn evict(&mut self, id: JobId, now_s: f64) {
        self.release(id);
        let key = self.job_to_entry[&id].spec.queue_key();
        self.queue.push(id, key);
        self.queue.park(id, Blocked::Room, now_s, self.epochs());
    }

    /// The cycle `hooks` would run now, on a copy: nothing is placed, evicted or charged.
    /// Run it before the real cycle to shadow a candidate policy set on the same state.
    pub fn shadow_cycle(&self, now_s: f64, hooks: &mut dyn PolicyHooks) -> CycleOutput {
        self.clone().cycle(now_s, hooks)
    }

    /// One scheduling cycle at time `now_s`.
    pub fn cycle(&mut self, now_s: f64, hooks: &mut dyn PolicyHooks) -> CycleOutput {
        self.cycle_no += 1;
        self.stopped_jobs_due(now_s);
        let (stops, stopped) = self.take_stops();
        let mut out = match self.config.mode {
            Mode::Gantry => self.cycle_gantry(now_s, hooks),
            Mode::K8sDefault => self.cycle_pod_by_pod(now_s, None),
            Mode::Coscheduling { permit_timeout_s } => {
                self.cycle_pod_by_pod(now_s, Some(permit_timeout_s))
            }
            Mode::Kueue => self.cycle_kueue(now_s),
        };
        out.decisions.splice(0..0, stops);
        out.stopped = stopped;
        out
    }

    /// Gantry's cycle: wake the parked jobs whose wait is over, then take queue heads in
    /// priority and fair-share order, re-reading a queue's key after each admission, until
    /// no job is active or the attempt budget is spent.
    fn cycle_gantry(&mut self, now_s: f64, hooks: &mut dyn PolicyHooks) -> CycleOutput {
        self.advance_clock(now_s);
        self.queues.decay_to(now_s);
        let mut out = CycleOutput::default();
        let version = hooks.set_version();
        self.policy_set = version;
        let epochs = self.epochs();
        let reclaimable = self.reclaimable_gpus();
        let mut queue = std::mem::take(&mut self.queue);
        let check = WakeProbe {
            scheduler: self,
            reclaimable,
        };
        out.woken = queue.wake(now_s, epochs, &check) as u32;
        self.queue = queue;
        let policies = hooks.policies();
        let mut position = 0u32;
        // Gangs a node failure stopped go first, before the nodes they freed go to anyone.
        let mut restart_first = std::mem::take(&mut self.restart_first).into_iter();
        while (out.attempts as usize) < self.config.max_attempts {
            let id = match restart_first.find(|&id| self.queue.contains(id)) {
                Some(id) => id,
                None => {
                    if out.attempts > 0 && hooks.budget_spent() {
                        out.budget_spent = true;
                        break;
                    }
                    let queues = &self.queues;
                    let Some(next) = self.queue.next_queue(&|q| queues.fair_share_key(q)) else {
                        break;
                    };
                    self.queue.head(next).expect("the chosen queue has a head")
                }
            };
            let spec = self.job_to_entry[&id].spec.clone();
            let mut decision = self.attempt(id, &spec, now_s, position, hooks, &mut out);
            position += 1;
            decision.explanation.policy_set = version;
            decision.explanation.policies.clone_from(&policies);
            out.decisions.push(decision);
        }
        // The plan, after what this cycle changed; each pending decision says when it expects
        // to start.
        self.replan(now_s);
        for decision in &mut out.decisions {
            if !decision.placed {
                decision.explanation.estimate =
                    self.plan.job_to_estimate.get(&decision.job).cloned();
            }
        }
        out.newly_estimated = self.take_newly_estimated();
        out
    }

    /// One job through quota, the cheap room check, evaluation, placement and preemption. A
    /// job not placed is parked with what blocked it.
    fn attempt(
        &mut self,
        id: JobId,
        spec: &JobSpec,
        now_s: f64,
        position: u32,
        hooks: &mut dyn PolicyHooks,
        out: &mut CycleOutput,
    ) -> Decision {
        let mut explanation = self.blank_explanation(spec, now_s, position);
        let decision = |explanation: Explanation| Decision {
            job: id,
            placed: false,
            placement: Vec::new(),
            victims: Vec::new(),
            explanation,
        };
        // The built-in quota, free of charge.
        let admission = if spec.balloon {
            Admission::Within
        } else {
            self.queues.admission(spec.queue, spec.total().gpus)
        };
        explanation.quota.builtin = admission.clone();
        if let Admission::Denied { reason } = &admission {
            explanation.outcome = Outcome::Pending {
                waiting_for: format!("quota: {reason}"),
            };
            self.queue.park(id, Blocked::Quota, now_s, self.epochs());
            return decision(explanation);
        }
        // The quota a reservation of a job ahead holds, also free of charge.
        if let Some(owner) = self.quota_hold_against(id, spec, &admission, now_s) {
            explanation.outcome = Outcome::Pending {
                waiting_for: self.quota_held_text(owner),
            };
            self.queue.park(id, Blocked::Quota, now_s, self.epochs());
            return decision(explanation);
        }
        // Room, as far as counting GPUs can tell: a job tried before that cannot fit now is
        // not evaluated again. A new job is, once, so its record names every filter's reasons.
        if self.queue.failures(id) > 0 && !self.room_possible(spec, self.reclaimable_gpus()) {
            explanation.outcome = Outcome::Pending {
                waiting_for: self.no_room_text(spec),
            };
            self.queue.park(id, Blocked::Room, now_s, self.epochs());
            return decision(explanation);
        }
        out.attempts += 1;
        if let Err(waiting_for) = self.quota_policies(spec, hooks, &mut explanation) {
            explanation.outcome = Outcome::Pending { waiting_for };
            self.queue.park(id, Blocked::Quota, now_s, self.epochs());
            return decision(explanation);
        }

        // Filter and score, keep off other jobs' reservations unless done in time, then place.
        let (mut capacity, scores, searched) =
            self.evaluate(spec, &self.bad_nodes(id, now_s), hooks, &mut explanation);
        let held = self.mask_reserved(id, spec, now_s, &mut capacity);
        if let Some(placement) = self.place_in(spec, &capacity, &scores, &searched) {
            let Some(balloons) =
                self.balloons_for_tighter_domain(id, spec, Some(&placement), &capacity, now_s)
            else {
                self.note_gang_topology(id, spec, placement.level, &capacity, now_s);
                return self.commit(id, spec, placement, explanation, Vec::new());
            };
            // Balloons give way to keep the gang in one tighter domain; it still has the
            // nodes it was placed on, so it is placed again, wherever that now puts it.
            return self.place_in_one_domain((id, spec, now_s), balloons, explanation, hooks, out);
        }

        // Its reservation is due, and jobs backfilled onto its nodes ran past their estimate:
        // they give way, if that lets it start.
        let overran = self.overrun_victims(id, now_s);
        if !overran.is_empty() && self.fits_without(id, spec, &overran, now_s) {
            self.note_overrun_evictions(overran.len());
            return self.place_after_evicting(
                (id, spec, now_s),
                overran,
                explanation,
                hooks,
                out,
                "the rest of its reservation's nodes (it evicted the jobs that overran there)",
            );
        }

        // A gang that needs balloons' nodes takes them in one domain when one can hold it.
        if let Some(balloons) = self.balloons_for_tighter_domain(id, spec, None, &capacity, now_s) {
            return self.place_in_one_domain((id, spec, now_s), balloons, explanation, hooks, out);
        }
        // Preemption: make room by evicting whole gangs that may give way to this job.
        if self.config.preemption
            && let Some(victims) = self.find_victims(id, spec, now_s)
        {
            return self.place_after_evicting(
                (id, spec, now_s),
                victims,
                explanation,
                hooks,
                out,
                "the nodes freed by preemption (a policy rejected them)",
            );
        }
        let mut waiting_for = self.waiting_for_room(spec, &capacity, &explanation);
        if let Some((nodes, owner)) = held {
            // The backfill rule held it back: say whose reservation, and why.
            waiting_for.push_str(&format!(
                "; {} held for the reservation of {}, which starts before this job is \
                 expected to end",
                if nodes == 1 {
                    "1 node is".to_string()
                } else {
                    format!("{nodes} nodes are")
                },
                self.job_to_entry
                    .get(&owner)
                    .map_or("a job ahead", |entry| entry.spec.name.as_str()),
            ));
        }
        explanation.outcome = Outcome::Pending { waiting_for };
        self.queue.park(id, Blocked::Room, now_s, self.epochs());
        decision(explanation)
    }

    /// Evicts the `balloons` that keep gang `id` out of one domain (counted in
    /// [`TopologyStats`]), then places it again.
    fn place_in_one_domain(
        &mut self,
        job: (JobId, &JobSpec, f64),
        balloons: Vec<JobId>,
        explanation: Explanation,
        hooks: &mut dyn PolicyHooks,
        out: &mut CycleOutput,
    ) -> Decision {
        self.topology_stats.balloons_evicted_for_topology += balloons.len() as u64;
        self.place_after_evicting(job, balloons, explanation, hooks, out, BALLOONS_REJECTED)
    }

    /// Evicts `victims` for job `id`, then evaluates and places it again, held off the
    /// reservations of jobs ahead of it as the victims were chosen (one it outranks slips and
    /// is planned again). When a policy rejects the freed nodes, it is parked waiting for
    /// `rejected`.
    fn place_after_evicting(
        &mut self,
        (id, spec, now_s): (JobId, &JobSpec, f64),
        victims: Vec<JobId>,
        mut explanation: Explanation,
        hooks: &mut dyn PolicyHooks,
        out: &mut CycleOutput,
        rejected: &str,
    ) -> Decision {
        for &victim in &victims {
            explanation
                .preempted
                .push(self.job_to_entry[&victim].spec.name.clone());
            self.evict(victim, now_s);
        }
        out.evicted.extend(&victims);
        let (mut capacity, scores, searched) =
            self.evaluate(spec, &self.bad_nodes(id, now_s), hooks, &mut explanation);
        self.mask_reserved(id, spec, now_s, &mut capacity);
        if let Some(placement) = self.place_in(spec, &capacity, &scores, &searched) {
            self.note_gang_topology(id, spec, placement.level, &capacity, now_s);
            return self.commit(id, spec, placement, explanation, victims);
        }
        explanation.outcome = Outcome::Pending {
            waiting_for: rejected.into(),
        };
        self.queue.park(id, Blocked::Room, now_s, self.epochs());
        Decision {
            job: id,
            placed: false,
            placement: Vec::new(),
            victims,
            explanation,
        }
    }

    /// Reserve the placement's nodes and mark the job running: the placed decision, with the
    /// jobs evicted to make room for it.
    fn commit(
        &mut self,
        id: JobId,
        spec: &JobSpec,
        placement: place::Placement,
        mut explanation: Explanation,
        victims: Vec<JobId>,
    ) -> Decision {
        let mut slots = Vec::with_capacity(spec.pods as usize);
        let mut nodes = Vec::new();
        for &(node, pods) in &placement.node_pods {
            for _ in 0..pods {
                slots.push(self.state.reserve(node, &spec.shape));
            }
            nodes.push((self.node_name(node), pods));
        }
        self.start(id, slots);
        self.note_placed(id, &placement.node_pods);
        explanation.domain = placement.domain;
        explanation.outcome = Outcome::Placed { nodes };
        Decision {
            job: id,
            placed: true,
            placement: placement.node_pods,
            victims,
            explanation,
        }
    }

    /// GPUs that borrowing queues hold beyond their quota: what reclaiming could free for a
    /// job within its own quota. None when no queue reclaims.
    fn reclaimable_gpus(&self) -> u64 {
        let reclaims = self
            .queues
            .ids()
            .any(|q| self.queues.def(q).reclaim == crate::Reclaim::Any);
        if !reclaims {
            return 0;
        }
        self.queues
            .ids()
            .filter(|&q| self.queues.children(q).is_empty())
            .map(|q| self.queues.borrowed(q))
            .sum()
    }

    /// Whether `spec` could possibly fit: enough GPUs free (whole ones node by node, or
    /// fractions), or enough GPUs held by jobs it may preempt. A necessary condition only;
    /// GPU-less jobs always pass.
    fn room_possible(&self, spec: &JobSpec, reclaimable: u64) -> bool {
        self.room_for(spec.room_ask(), spec.priority, reclaimable, 0)
    }

    /// [`Scheduler::room_possible`] after `claimed` GPUs went to other jobs woken before it:
    /// those take the free GPUs first, node-sized, so a job of whole nodes is counted against
    /// whole free nodes less what was claimed, and a fractional job against the free
    /// milli-GPUs less a thousand per GPU claimed.
    /// It reads only the ask and the priority, so the queue checks each class of jobs with
    /// both alike until it fails once per wake-up.
    fn room_for(&self, ask: RoomAsk, priority: i32, reclaimable: u64, claimed: u64) -> bool {
        let milli = u64::from(ask.gpu_milli);
        if milli == 0 && ask.gpus_per_pod == 0 {
            return true;
        }
        let fits_free = if milli > 0 {
            // Each pod needs `milli` on one GPU, and all of them that much in total.
            u64::from(self.state.largest_gpu_fraction_free()) >= milli
                && self
                    .state
                    .gpu_milli_free_total()
                    .saturating_sub(claimed * 1000)
                    >= milli * u64::from(ask.pods)
        } else {
            let gpus = u64::from(ask.gpus_per_pod);
            self.state
                .pods_fit(ask.gpus_per_pod)
                .saturating_sub(claimed.div_ceil(gpus))
                >= u64::from(ask.pods)
        };
        if fits_free {
            return true;
        }
        if ask.balloon || !self.config.preemption {
            return false;
        }
        let lower: u64 = self
            .priority_to_held
            .range(..priority)
            .map(|(_, held)| held.gpus)
            .sum();
        let preemptable = self.balloons_held.gpus + lower + reclaimable;
        if preemptable == 0 {
            // Nothing to preempt: only free room counts, and it did not suffice.
            return false;
        }
        if milli > 0 {
            // A victim frees its GPUs whole or in fractions; count them all as fractions.
            return (self.state.gpu_milli_free_total() + preemptable * 1000)
                .saturating_sub(claimed * 1000)
                >= milli * u64::from(ask.pods);
        }
        let free = self.state.pods_fit(1);
        (free + preemptable).saturating_sub(claimed) >= ask.gpus()
    }

    /// The queue's usage as a quota policy sees it, and its cohort's: what a cycle passes to
    /// quota policies, and what the API's policy self-test passes too.
    pub fn usage(
        &self,
        queue: QueueId,
    ) -> (crate::model::QueueUsage, Option<crate::model::CohortUsage>) {
        quota::usage(self, queue)
    }

    pub fn node_name(&self, node: usize) -> String {
        self.symbols
            .resolve(self.state.nodes.name[node])
            .to_string()
    }

    fn level_name(&self, level: usize) -> String {
        self.state.nodes.levels.get(level).map_or_else(
            || "domain".into(),
            |l| self.symbols.resolve(l.name).to_string(),
        )
    }
}

/// The scheduler's answers to the queue's wake-up checks.
struct WakeProbe<'a> {
    scheduler: &'a Scheduler,
    reclaimable: u64,
}

impl queue::WakeCheck for WakeProbe<'_> {
    fn quota_admits(&self, queue: QueueId, gpus: u64) -> bool {
        self.scheduler.queues.admits(queue, gpus)
    }

    fn room_possible(&self, key: &JobKey, claimed: u64) -> bool {
        self.scheduler
            .room_for(key.ask, key.priority, self.reclaimable, claimed)
    }

    fn quota_holders(&self) -> Vec<JobId> {
        self.scheduler.quota_holders()
    }
}
