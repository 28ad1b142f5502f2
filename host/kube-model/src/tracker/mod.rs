//! The live cluster as the long-lived scheduler sees it, kept up to date one watch event at a
//! time. Pure (no I/O): `gantry_kube::KubeCluster` hands it the objects the watch caches hold for
//! the keys that changed, and it turns them into the scheduler's changes:
//!
//! - **Nodes**: a health change (Ready, cordon) updates one node; a node added or removed, or
//!   one whose capacity, labels or taints changed, rebuilds the node table ([`Tracker::rebuild`]),
//!   and with it every job: the rare path.
//! - **Our unbound pods** gather into gangs (a single pod is a gang of one). A gang that is
//!   complete (its pods plus its members already bound reach `minMember`) is one pending job;
//!   one that is not waits with a reason. A gang whose pods change is submitted again.
//! - **Bound pods**: ours and balloons, grouped by gang, are running jobs the core may preempt
//!   (one job per group; a group that changes is adopted again). Anything else, or a pod that
//!   is terminating, only holds its room.
//! - **Queues** and **PodGroups** replace the queue tree or the gangs' sizes.
//! - **Tenancy**: before a pending gang becomes a job, [`Tenancy::admit`] decides which queue
//!   it may use; a refused gang waits with the reason. A change to the Queues, a namespace's
//!   labels or a LocalQueue decides again for the gangs it may concern.
//!
//! Work is proportional to the keys that changed, never to the cluster.
//!
//! Its parts, one per kind of change: `nodes` (health in place, or a rebuild), `pods` (pending
//! gangs, bound pods, assumed bindings), `queues` (the queue tree and tenancy), `groups`
//! (PodGroups' sizes and policies), `dra` (claims' GPUs), `sync` (the end of a sync: gangs to
//! jobs, preemptors moved on), `health` (node signals out, stopped gangs' restarts in) and
//! `jobs` (what the binder asks and tells).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gantry_core::{JobId, PodShape, QueueDef, Resources, Slot, Symbols};
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::claims::DraView;
use crate::config::KubeConfig;
use crate::mapping::{Gang, GroupPolicy, NodeDigest, PendingPod, created_unix_s};
use crate::tenancy::Tenancy;

mod dra;
mod groups;
mod health;
mod jobs;
mod nodes;
mod pods;
mod queues;
mod sync;

#[cfg(test)]
mod tests;

pub use crate::PodKey;
pub use health::NodeSignal;

/// How long a pod this process bound counts as bound before the bound-pod cache confirms it
/// (kube-scheduler's assume cache).
const ASSUME_TTL: Duration = Duration::from_secs(60);

/// A pending gang: its pods, and the job standing for it while it is complete.
#[derive(Debug, Default)]
struct PendingGang {
    pods: BTreeMap<PodKey, PendingPod>,
    /// The job and the pods it was submitted with.
    job: Option<(JobId, BTreeSet<PodKey>)>,
    /// Why an incomplete gang waits.
    waiting: Option<String>,
}

/// The bound pods of one gang (ours or balloons): one running job while they run.
#[derive(Debug, Default)]
struct RunningGroup {
    pods: BTreeMap<PodKey, (PendingPod, usize)>,
    job: Option<(JobId, BTreeSet<PodKey>)>,
}

/// What a bound pod is to the scheduler.
#[derive(Debug)]
enum Role {
    /// A member of its gang's running job.
    Member(Gang),
    /// Room held directly: someone else's pod, or one terminating. `charged` is the queue
    /// charged for an own pod, with its GPUs.
    Held {
        slot: Slot,
        shape: PodShape,
        charged: Option<(String, u64)>,
    },
}

#[derive(Debug)]
struct BoundPod {
    uid: String,
    node: usize,
    role: Role,
    /// Set while this process bound it and the bound-pod cache has not shown it yet.
    assumed: Option<Instant>,
    /// Whether it is one of ours (`schedulerName`): when it is gone, the claims it holds are
    /// released ([`Tracker::our_uid`]).
    ours: bool,
}

/// A preemptor waiting, placed on its nodes, for its victims to leave.
#[derive(Debug, Clone)]
pub struct Nominated {
    /// The victims' pods still present.
    pub victims: BTreeSet<PodKey>,
    /// When the preemptor was nominated.
    pub since: Instant,
}

/// The scheduler's view of the live cluster, and the pods behind each job.
pub struct Tracker {
    config: KubeConfig,
    symbols: Arc<Symbols>,
    /// Unix seconds at the run's time 0: pods' creation times are put on the run's clock.
    epoch_s: Option<f64>,
    node_names: Vec<String>,
    name_to_node: HashMap<String, usize>,
    /// What each node looked like when the table was built, to tell a health change (cheap)
    /// from a capacity, label or taint change (rebuild).
    name_to_digest: HashMap<String, NodeDigest>,
    capacity: Resources,
    /// The checked `Queue` objects, and every queue name a pod ever named: the tree is both.
    declared_queues: Vec<QueueDef>,
    /// Which queue each pod may use (the Queues' namespaceSelectors, the namespaces' labels,
    /// the LocalQueues).
    tenancy: Tenancy,
    used_queues: BTreeSet<String>,
    /// Bound pods charged elsewhere than the queue they name, with why, not yet taken for
    /// their Events; and the uids of every bound pod noted, so each is noted once.
    charge_notes: Vec<(PendingPod, String)>,
    charge_noted: HashSet<String>,
    /// `minMember` of each scheduler-plugins PodGroup.
    group_to_min: HashMap<PodKey, u32>,
    /// The policy of each upstream `scheduling.k8s.io` PodGroup: it decides whether its pods
    /// are one gang or each a job.
    workload_group_to_policy: HashMap<PodKey, GroupPolicy>,
    /// Our unbound pods, and their gangs.
    key_to_pending: HashMap<PodKey, Gang>,
    gang_to_pending: HashMap<Gang, PendingGang>,
    /// Every bound pod, and the running groups of ours and balloons.
    key_to_bound: HashMap<PodKey, BoundPod>,
    gang_to_running: HashMap<Gang, RunningGroup>,
    /// Which gang each job stands for, and whether it is the running side.
    job_to_gang: HashMap<JobId, (Gang, bool)>,
    /// A job's pods declared something malformed that Gantry worked around (a bad
    /// `gantry.dev/expected-runtime`): said in their FailedScheduling message.
    job_to_warning: HashMap<JobId, String>,
    /// Gangs whose pods changed in this sync, handled at its end.
    dirty_pending: BTreeSet<Gang>,
    dirty_running: BTreeSet<Gang>,
    /// Preemptors waiting for their victims.
    job_to_nominated: BTreeMap<JobId, Nominated>,
    /// Pods bound but not yet confirmed by the bound-pod cache.
    assumed: HashSet<PodKey>,
    /// Pod-to-job names of gangs submitted in this sync.
    pod_to_job: Vec<(String, String)>,
    /// The DRA objects: GPUs the nodes' ResourceSlices publish, and the pods' claims (their
    /// GPUs join the pods' requests; a claim Gantry cannot honour makes its pod wait).
    dra: DraView,
    /// Changes of the nodes' suspect signals not yet taken by the cluster source.
    node_signals: Vec<NodeSignal>,
    /// Gangs a node failure stopped, by gang: what their recreated pods inherit.
    gang_to_restart: HashMap<Gang, health::Restart>,
    /// Nodes showing a suspect signal, by name, with one cause: few, so the cluster source
    /// walks them at each sync.
    suspect_to_cause: BTreeMap<String, String>,
    /// Nodes tainted for preflight, by name, with their status: few, so the cluster source
    /// walks them at each sync to start their tests.
    preflight_nodes: BTreeMap<String, crate::preflight::NodeStatus>,
    /// Nodes the last rebuild found that the table before it did not hold (every node, at the
    /// first), until the cluster source takes them: a signal one shows already is news to
    /// Gantry, while a node it knew keeps its lifecycle across the rebuild.
    new_nodes: BTreeSet<String>,
    /// Per Queue whose `spec.stopPolicy` is Pod, by name: its gangs' default.
    queue_to_stop_policy: HashMap<String, gantry_core::StopPolicy>,
    /// Per PodGroup (either kind) with a `gantry.dev/stop-policy` annotation, its policy or
    /// why the annotation cannot be read.
    group_to_stop_policy: HashMap<PodKey, Result<gantry_core::StopPolicy, String>>,
}

/// Whole-cluster inputs of a rebuild.
pub struct World<'a> {
    /// Every node.
    pub nodes: &'a [Arc<Node>],
    /// Every bound pod.
    pub bound: &'a [Arc<Pod>],
    /// Our unbound pods.
    pub pending: &'a [Arc<Pod>],
}

impl Tracker {
    /// An empty tracker: no nodes, no pods, until the first rebuild.
    pub fn new(config: KubeConfig, symbols: Arc<Symbols>) -> Self {
        Self {
            config,
            symbols,
            epoch_s: None,
            node_names: Vec::new(),
            name_to_node: HashMap::new(),
            name_to_digest: HashMap::new(),
            capacity: Resources::default(),
            declared_queues: Vec::new(),
            tenancy: Tenancy::default(),
            used_queues: BTreeSet::new(),
            charge_notes: Vec::new(),
            charge_noted: HashSet::new(),
            group_to_min: HashMap::new(),
            workload_group_to_policy: HashMap::new(),
            key_to_pending: HashMap::new(),
            gang_to_pending: HashMap::new(),
            key_to_bound: HashMap::new(),
            gang_to_running: HashMap::new(),
            job_to_gang: HashMap::new(),
            job_to_warning: HashMap::new(),
            dirty_pending: BTreeSet::new(),
            dirty_running: BTreeSet::new(),
            job_to_nominated: BTreeMap::new(),
            assumed: HashSet::new(),
            pod_to_job: Vec::new(),
            dra: DraView::default(),
            node_signals: Vec::new(),
            gang_to_restart: HashMap::new(),
            suspect_to_cause: BTreeMap::new(),
            preflight_nodes: BTreeMap::new(),
            new_nodes: BTreeSet::new(),
            queue_to_stop_policy: HashMap::new(),
            group_to_stop_policy: HashMap::new(),
        }
    }

    /// Node names by node index.
    pub fn node_names(&self) -> &[String] {
        &self.node_names
    }

    /// Starts the run's clock: `now_s` on the run's clock is the wall clock now.
    pub fn set_clock(&mut self, unix_now_s: f64, now_s: f64) {
        self.epoch_s.get_or_insert(unix_now_s - now_s);
    }

    fn run_s(&self, pod: &Pod) -> f64 {
        created_unix_s(pod) - self.epoch_s.unwrap_or(0.0)
    }
}
