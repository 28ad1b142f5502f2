//! The two seams of the one scheduling loop, in the core's own types: a [`ClusterSource`] tells
//! the scheduler what changed, and a [`Binder`] applies a cycle's decisions and reports what
//! happened to each. They are the only parts that differ between the simulator and a live
//! cluster; the loop itself (`gantry-engine`) is the same for both.

use crate::scheduler::{CycleOutput, JobId, Scheduler};

/// What a source brought in on one sync: for the loop's figures and the store's pod index.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Changes {
    /// Jobs submitted.
    pub submitted: u32,
    /// Pods of those jobs (kube-scheduler's incoming pods).
    pub submitted_pods: u64,
    /// Jobs that ended or were withdrawn.
    pub ended: u32,
    /// Nodes added, changed or removed.
    pub nodes: u32,
    /// Whether the queue tree changed.
    pub queues: bool,
    /// `(pod, job)` for each pod of a new gang, so decisions can be found by pod name.
    pub pod_to_job: Vec<(String, String)>,
    /// Whether the scheduler was built again from scratch (a live cluster's node set changed):
    /// whatever was derived from its node table must be derived again.
    pub rebuilt: bool,
}

impl Changes {
    /// Whether anything changed.
    pub fn any(&self) -> bool {
        self.submitted > 0 || self.ended > 0 || self.nodes > 0 || self.queues || self.rebuilt
    }
}

/// Where the scheduler learns what changed: jobs submitted or withdrawn, jobs that ended,
/// nodes and queues. A simulator makes the changes up; a live cluster reads them from watches.
pub trait ClusterSource {
    /// Apply to `scheduler` everything that changed up to `now_s` since the last call.
    fn sync(&mut self, scheduler: &mut Scheduler, now_s: f64) -> Changes;

    /// Whether this replica may schedule now (a live cluster's follower may not: it keeps its
    /// view current and waits for the Lease).
    fn leading(&self) -> bool {
        true
    }

    /// What the published view calls the cluster now, when the source has something to say
    /// (leader or follower).
    fn describe(&self) -> Option<String> {
        None
    }

    /// The replica that leads while this one follows (a live cluster's Lease holder, or "none
    /// yet"), so the API can refuse writes here and name it; `None` while this one leads or
    /// nothing is elected.
    fn leader_elsewhere(&self) -> Option<String> {
        None
    }

    /// Bindings answered as applied after this replica had lost its Lease, since it started
    /// (`gantry_bind_after_lease_loss_total`): a fence that holds keeps it 0.
    fn binds_after_lease_loss(&self) -> u64 {
        0
    }
}

/// What happened to one placed job when its decision was applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindOutcome {
    /// Every pod is bound where the decision put it.
    Bound {
        /// The job.
        job: JobId,
    },
    /// The binding failed; whatever was bound of it was rolled back.
    Failed {
        /// The job.
        job: JobId,
        /// Why, as the cluster said it.
        reason: String,
    },
    /// Nominated to its nodes, waiting for its preemption victims to leave.
    Nominated {
        /// The job.
        job: JobId,
        /// What it waits for.
        waiting_for: String,
    },
}

impl BindOutcome {
    /// The job this outcome is about.
    pub fn job(&self) -> JobId {
        match self {
            Self::Bound { job } | Self::Failed { job, .. } | Self::Nominated { job, .. } => *job,
        }
    }
}

/// Applies a cycle's decisions (bindings and evictions) and reports an outcome for every job
/// the cycle placed.
pub trait Binder {
    /// Apply `output`'s placements and evictions, decided on `scheduler`'s state, at `now_s`.
    fn bind(&mut self, scheduler: &Scheduler, output: &CycleOutput, now_s: f64)
    -> Vec<BindOutcome>;
}

/// A cluster as the loop sees it: where changes come from and where decisions go. A simulated
/// world is both at once; so is a live cluster's client.
pub trait Cluster: ClusterSource + Binder {}

impl<T: ClusterSource + Binder> Cluster for T {}

/// What one pass of the loop did.
#[derive(Debug, Clone, Default)]
pub struct Step {
    /// What the source brought in.
    pub changes: Changes,
    /// The cycle's output, as decided; empty when `decide` declined to run one.
    pub output: CycleOutput,
    /// The binder's outcome per placed job.
    pub outcomes: Vec<BindOutcome>,
}

/// One pass of the one scheduling loop, in its one order: the cluster brings `scheduler` up to
/// date, `decide` runs the cycle (with whatever policies; `None` declines, as a follower does),
/// the cluster applies it and reports each outcome, and each failed binding goes back to the
/// queue with a backoff. The engine runs it on the wall clock; the replay on a virtual one.
pub fn step(
    scheduler: &mut Scheduler,
    cluster: &mut dyn Cluster,
    now_s: f64,
    decide: &mut dyn FnMut(&mut Scheduler, &Changes) -> Option<CycleOutput>,
) -> Step {
    scheduler.advance_clock(now_s);
    let changes = cluster.sync(scheduler, now_s);
    let Some(output) = decide(scheduler, &changes) else {
        return Step {
            changes,
            ..Step::default()
        };
    };
    let outcomes = cluster.bind(scheduler, &output, now_s);
    for outcome in &outcomes {
        if let BindOutcome::Failed { job, .. } = outcome {
            scheduler.binding_failed(*job, now_s);
        }
    }
    Step {
        changes,
        output,
        outcomes,
    }
}

/// How often a scheduler with pending work on a virtual clock cycles again when nothing
/// arrives or ends: a real scheduler keeps retrying (and Coscheduling's permit timeout fires),
/// and time alone changes what it decides (a job ages into a reservation, fair-share usage
/// decays).
pub const RETRY_S: f64 = 30.0;
/// Retries in a row that change nothing, with nothing running, before a virtual clock stops.
pub const MAX_IDLE_RETRIES: u32 = 40;

/// When the loop steps on a virtual clock: at each change the cluster expects (an arrival, an
/// end) and, while work is pending, every [`RETRY_S`]. The replay and the forecast's known-future
/// run step by the same clock, so a forecast handed the true future steps exactly as the replay
/// does.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct VirtualClock {
    /// The time of the last step.
    pub now_s: f64,
    /// Retries in a row that changed nothing with nothing running.
    idle_retries: u32,
    /// Whether the step about to run is a retry only (nothing arrives or ends at it).
    retrying: bool,
}

impl VirtualClock {
    /// A clock at `now_s`, as it stands after a step at which something arrived or ended.
    pub fn at(now_s: f64) -> Self {
        Self {
            now_s,
            ..Self::default()
        }
    }

    /// Moves to the next step's time, given the cluster's next expected change: `None` when
    /// nothing will arrive or end and retrying is over.
    pub fn advance(&mut self, scheduler: &Scheduler, next_change_s: Option<f64>) -> Option<f64> {
        let retry = (scheduler.pending_count() > 0 && self.idle_retries < MAX_IDLE_RETRIES)
            .then_some(self.now_s + RETRY_S);
        let next = [next_change_s, retry]
            .into_iter()
            .flatten()
            .min_by(f64::total_cmp)?;
        self.retrying = retry == Some(next) && next_change_s != Some(next);
        self.now_s = next;
        Some(next)
    }

    /// Notes what the step at [`VirtualClock::now_s`] did: a retry that placed and evicted
    /// nothing, with nothing running, counts towards giving up.
    pub fn stepped(&mut self, scheduler: &Scheduler, step: &Step) {
        let progressed =
            step.output.decisions.iter().any(|d| d.placed) || !step.output.evicted.is_empty();
        let running = scheduler.running().next().is_some();
        self.idle_retries = if self.retrying && !progressed && !running {
            self.idle_retries + 1
        } else {
            0
        };
    }
}
