//! The live cluster as the long-lived scheduler sees it, kept up to date one watch event at a
//! time. Pure (no I/O): [`crate::KubeCluster`] hands it the objects the watch caches hold for
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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gantry_core::{
    Changes, ClusterState, Field, JobId, JobSpec, LabelOp, PodShape, QueueDef, Requirement,
    Resources, Scheduler, Slot, Symbols, TopologyPref,
};
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::claims::DraView;
use crate::config::KubeConfig;
use crate::mapping::{
    self, Gang, GroupPolicy, NodeDigest, PendingPod, created_unix_s, gang_of, is_balloon, is_ours,
    pod_request, pod_shape, queue_claim, widen,
};
use crate::queues::DeclaredQueue;
use crate::tenancy::{Affected, Labels, Tenancy};

/// A pod's `(namespace, name)`: how the watch caches key it.
pub type PodKey = (String, String);

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
}

/// Whole-cluster inputs of a rebuild.
pub struct World<'a> {
    pub nodes: &'a [Arc<Node>],
    pub bound: &'a [Arc<Pod>],
    pub pending: &'a [Arc<Pod>],
}

impl Tracker {
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

    /// Whether `node` (as the cache now holds it, `None` when deleted) needs a rebuild; a
    /// health-only change is applied here.
    pub fn node_changed(
        &mut self,
        scheduler: &mut Scheduler,
        name: &str,
        node: Option<&Node>,
    ) -> bool {
        let (Some(node), Some(old)) = (node, self.name_to_digest.get(name)) else {
            // Added, or removed.
            return node.is_some() || self.name_to_digest.contains_key(name);
        };
        let digest = NodeDigest::of(node, &self.config, self.dra.node_gpus(name));
        if digest == *old {
            return false;
        }
        if digest.same_but_health(old) {
            let index = self.name_to_node[name];
            scheduler.state.set_health(index, digest.health);
            self.name_to_digest.insert(name.to_string(), digest);
            return false;
        }
        true
    }

    /// Builds everything again from the whole caches: a new node table and queue tree, every
    /// pod applied anew. Job ids keep counting.
    pub fn rebuild(&mut self, scheduler: &mut Scheduler, world: &World<'_>) {
        // Pods this process bound that the bound cache has not shown yet stay bound: the
        // unbound cache may still list them, and binding them again would only post a second
        // Scheduled Event (or fail, naming the node they are on).
        let assumed: Vec<(PodKey, Arc<Pod>, Instant)> = self
            .assumed
            .iter()
            .filter_map(|key| {
                let bound = self.key_to_bound.get(key)?;
                let at = bound.assumed.filter(|at| at.elapsed() < ASSUME_TTL)?;
                let Role::Member(gang) = &bound.role else {
                    return None;
                };
                let (pod, _) = self.gang_to_running.get(gang)?.pods.get(key)?;
                let node = self.node_names.get(bound.node)?.clone();
                let mut object = (*pod.pod).clone();
                object.spec.get_or_insert_with(Default::default).node_name = Some(node);
                Some((key.clone(), Arc::new(object), at))
            })
            .collect();
        let (table, names, digests) = mapping::node_table(
            world.nodes,
            &self.config,
            &self.symbols,
            self.dra.gpus_by_node(),
        );
        self.capacity = Resources {
            gpus: table.gpu_total.iter().map(|&g| u64::from(g)).sum(),
            cpu_milli: table.cpu_free_milli.iter().map(|&c| u64::from(c)).sum(),
            memory_mib: table.memory_free_mib.iter().map(|&m| u64::from(m)).sum(),
        };
        self.name_to_node = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        self.node_names = names;
        self.name_to_digest = digests;
        let queues = mapping::queue_tree(&self.declared_queues, &self.used_names(), self.capacity);
        scheduler.reset(ClusterState::new(table), queues);
        self.key_to_pending.clear();
        self.gang_to_pending.clear();
        self.key_to_bound.clear();
        self.gang_to_running.clear();
        self.job_to_gang.clear();
        self.dirty_pending.clear();
        self.dirty_running.clear();
        self.job_to_nominated.clear();
        self.assumed.clear();
        let key = |p: &Arc<Pod>| -> PodKey {
            (
                p.metadata.namespace.clone().unwrap_or_default(),
                p.metadata.name.clone().unwrap_or_default(),
            )
        };
        // Bound pods first, so gangs count their bound members; pending ones oldest first,
        // as kube-scheduler's FIFO within one priority.
        for pod in world.bound {
            self.pod_changed(scheduler, key(pod), None, Some(pod));
        }
        for (at_key, pod, at) in assumed {
            if self.key_to_bound.contains_key(&at_key) {
                continue;
            }
            self.pod_changed(scheduler, at_key.clone(), None, Some(&pod));
            if let Some(bound) = self.key_to_bound.get_mut(&at_key) {
                bound.assumed = Some(at);
                self.assumed.insert(at_key);
            }
        }
        let mut pending: Vec<&Arc<Pod>> = world.pending.iter().collect();
        pending.sort_by(|a, b| {
            (&a.metadata.creation_timestamp, &a.metadata.name)
                .cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
        });
        for pod in pending {
            self.pod_changed(scheduler, key(pod), Some(pod), None);
        }
    }

    fn used_names(&self) -> Vec<String> {
        self.used_queues.iter().cloned().collect()
    }

    /// The Queue objects changed: `declared` are the usable ones, `left_out` those left out
    /// (by name, with why).
    pub fn queues_changed(
        &mut self,
        scheduler: &mut Scheduler,
        declared: Vec<DeclaredQueue>,
        left_out: &BTreeMap<String, String>,
    ) {
        let affected = self.tenancy.set_queues(&declared, left_out);
        self.mark(affected);
        let defs: Vec<QueueDef> = declared.into_iter().map(|q| q.def).collect();
        if defs == self.declared_queues {
            return;
        }
        self.declared_queues = defs;
        self.replace_queues(scheduler);
    }

    /// Namespace `name` changed (`None`: deleted).
    pub fn namespace_changed(&mut self, name: &str, labels: Option<Labels>) {
        if self.tenancy.set_namespace(name, labels) {
            self.mark(Affected::Namespaces([name.to_string()].into()));
        }
    }

    /// Every namespace, after the Namespace cache listed (again).
    pub fn namespaces_listed(&mut self, all: HashMap<String, Labels>) {
        let affected = self.tenancy.set_namespaces(all);
        self.mark(affected);
    }

    /// Kueue's LocalQueues: whether the kind is served and listed, and each one's
    /// `spec.clusterQueue` by `(namespace, name)`.
    pub fn local_queues_changed(&mut self, served: bool, all: HashMap<PodKey, String>) {
        let affected = self.tenancy.set_local_queues(served, all);
        self.mark(affected);
    }

    /// Pending gangs a tenancy change may concern are decided again at the sync's end.
    fn mark(&mut self, affected: Affected) {
        let gangs: Vec<Gang> = match affected {
            Affected::Nothing => return,
            Affected::All => self.gang_to_pending.keys().cloned().collect(),
            Affected::Namespaces(namespaces) => self
                .gang_to_pending
                .keys()
                .filter(|g| namespaces.contains(g.namespace()))
                .cloned()
                .collect(),
        };
        self.dirty_pending.extend(gangs);
    }

    /// The queue a bound pod is charged to (see [`Tenancy::charged_queue`]).
    fn charged_queue(&self, pod: &Pod) -> String {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        self.tenancy
            .charged_queue(namespace, &queue_claim(pod, &self.config), &self.config)
    }

    fn replace_queues(&mut self, scheduler: &mut Scheduler) {
        let queues = mapping::queue_tree(&self.declared_queues, &self.used_names(), self.capacity);
        scheduler.set_queues(queues);
        // Own pods that only hold room are charged outside any job.
        for bound in self.key_to_bound.values() {
            if let Role::Held {
                charged: Some((queue, gpus)),
                ..
            } = &bound.role
                && let Some(id) = scheduler.queues.id(queue)
            {
                scheduler.queues.charge(id, Resources::gpus(*gpus), true);
            }
        }
    }

    /// Makes sure `queue` is in the tree (a pod named a queue nobody declared).
    fn ensure_queue(&mut self, scheduler: &mut Scheduler, queue: &str) {
        if self.used_queues.insert(queue.to_string()) && scheduler.queues.id(queue).is_none() {
            self.replace_queues(scheduler);
        }
    }

    /// PodGroups' `minMember` changed: every PodGroup gang is looked at again.
    pub fn pod_groups_changed(&mut self, group_to_min: HashMap<PodKey, u32>) {
        if group_to_min == self.group_to_min {
            return;
        }
        self.group_to_min = group_to_min;
        let groups: Vec<Gang> = self
            .gang_to_pending
            .keys()
            .filter(|g| matches!(g, Gang::PodGroup(..)))
            .cloned()
            .collect();
        self.dirty_pending.extend(groups);
    }

    /// The upstream PodGroups changed: their pods are grouped again (a `basic` group's pods
    /// are jobs of their own, a gang's one job of at least `minCount`).
    pub fn workload_groups_changed(&mut self, group_to_policy: HashMap<PodKey, GroupPolicy>) {
        if group_to_policy == self.workload_group_to_policy {
            return;
        }
        self.workload_group_to_policy = group_to_policy;
        let regroup: Vec<(PodKey, Arc<Pod>)> = self
            .gang_to_pending
            .values()
            .flat_map(|g| g.pods.iter())
            .filter(|(_, p)| mapping::scheduling_group(&p.pod).is_some())
            .map(|(key, p)| (key.clone(), p.pod.clone()))
            .collect();
        for (key, pod) in regroup {
            self.set_pending(key, &pod);
        }
        let gangs: Vec<Gang> = self
            .gang_to_pending
            .keys()
            .filter(|g| matches!(g, Gang::Workload(..)))
            .cloned()
            .collect();
        self.dirty_pending.extend(gangs);
    }

    /// The upstream PodGroup a pending or bound pod of ours belongs to as a gang member.
    pub fn workload_group_of(&self, key: &PodKey) -> Option<PodKey> {
        let gang =
            self.key_to_pending
                .get(key)
                .or_else(|| match &self.key_to_bound.get(key)?.role {
                    Role::Member(gang) => Some(gang),
                    Role::Held { .. } => None,
                })?;
        match gang {
            Gang::Workload(ns, name) => Some((ns.clone(), name.clone())),
            _ => None,
        }
    }

    /// The pod's shape as the core sees it: [`pod_shape`], plus the GPUs its DRA claims ask,
    /// and, when its claims are allocated already, only their node.
    fn shape_of(&self, pod: &Pod) -> PodShape {
        let mut shape = pod_shape(pod, &self.config, &self.symbols);
        let (gpus, node) = self.dra.gpus(pod);
        shape.gpus = shape.gpus.saturating_add(gpus);
        if let Some(node) = node {
            let mut affinity = shape.node_affinity.as_deref().cloned().unwrap_or_default();
            affinity.selector.push(Requirement {
                field: Field::NodeName,
                op: LabelOp::In(vec![self.symbols.intern(&node)]),
            });
            shape.node_affinity = Some(Arc::new(affinity));
        }
        shape
    }

    /// The DRA objects as last handed in.
    pub fn dra(&self) -> &DraView {
        &self.dra
    }

    /// The DRA objects, to update. After claims, templates or classes change, call
    /// [`Tracker::claims_changed`]; after slices, rebuild when [`DraView::set_slices`] says so.
    pub fn dra_mut(&mut self) -> &mut DraView {
        &mut self.dra
    }

    /// Claims, templates or DeviceClasses changed: the pending gangs whose pods name claims
    /// are decided again (a claim created or refused changes whether they wait, and how many
    /// GPUs they ask). Gangs without claims are untouched.
    pub fn claims_changed(&mut self) {
        for (gang, pending) in &self.gang_to_pending {
            let names_claims = pending.pods.values().any(|p| {
                p.pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.resource_claims.as_ref())
                    .is_some_and(|c| !c.is_empty())
            });
            if names_claims {
                self.dirty_pending.insert(gang.clone());
            }
        }
    }

    /// The uid of our pod at `key` as last seen (bound or pending), to tell when it is gone.
    pub fn our_uid(&self, key: &PodKey) -> Option<String> {
        if let Some(b) = self.key_to_bound.get(key) {
            return b.ours.then(|| b.uid.clone());
        }
        let gang = self.key_to_pending.get(key)?;
        Some(self.gang_to_pending.get(gang)?.pods.get(key)?.uid.clone())
    }

    /// The pod at `key` changed: `pending` and `bound` are what the unbound-pod and bound-pod
    /// caches now hold for it.
    pub fn pod_changed(
        &mut self,
        scheduler: &mut Scheduler,
        key: PodKey,
        pending: Option<&Arc<Pod>>,
        bound: Option<&Arc<Pod>>,
    ) {
        let bound_node = bound.and_then(|p| {
            let name = p.spec.as_ref()?.node_name.as_deref()?;
            self.name_to_node.get(name).copied()
        });
        if let (Some(pod), Some(node)) = (bound, bound_node) {
            self.forget_pending(scheduler, &key);
            self.set_bound(scheduler, key, pod, node);
            return;
        }
        // Not in the bound cache (yet): a pod this process bound stays bound for a while.
        let assumed = self
            .key_to_bound
            .get(&key)
            .and_then(|b| b.assumed)
            .is_some_and(|at| at.elapsed() < ASSUME_TTL);
        if assumed {
            return;
        }
        self.forget_bound(scheduler, &key);
        match pending.filter(|p| p.metadata.deletion_timestamp.is_none()) {
            Some(pod) => self.set_pending(key, pod),
            None => self.forget_pending(scheduler, &key),
        }
    }

    fn set_pending(&mut self, key: PodKey, pod: &Arc<Pod>) {
        let gang = gang_of(pod, &self.config, &self.workload_group_to_policy);
        let member = PendingPod::of(pod);
        if let Some(old) = self.key_to_pending.get(&key)
            && *old != gang
        {
            let old = old.clone();
            if let Some(g) = self.gang_to_pending.get_mut(&old) {
                g.pods.remove(&key);
            }
            self.dirty_pending.insert(old);
        }
        self.key_to_pending.insert(key.clone(), gang.clone());
        let entry = self.gang_to_pending.entry(gang.clone()).or_default();
        let same = entry
            .pods
            .get(&key)
            .is_some_and(|p| p.uid == member.uid && decides_the_same(&p.pod, pod));
        entry.pods.insert(key, member);
        if !same {
            self.dirty_pending.insert(gang);
        }
    }

    /// The gang whose pod `key` is pending, if it is: what a cycle would decide for it.
    #[cfg(test)]
    fn pending_is_dirty(&self, key: &PodKey) -> bool {
        self.key_to_pending
            .get(key)
            .is_some_and(|gang| self.dirty_pending.contains(gang))
    }

    fn forget_pending(&mut self, _scheduler: &mut Scheduler, key: &PodKey) {
        if let Some(gang) = self.key_to_pending.remove(key) {
            if let Some(g) = self.gang_to_pending.get_mut(&gang) {
                g.pods.remove(key);
            }
            self.dirty_pending.insert(gang);
        }
    }

    fn set_bound(&mut self, scheduler: &mut Scheduler, key: PodKey, pod: &Arc<Pod>, node: usize) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let ours = is_ours(pod, &self.config);
        let terminating = pod.metadata.deletion_timestamp.is_some();
        let member_of = ((ours || is_balloon(pod, &self.config)) && !terminating)
            .then(|| gang_of(pod, &self.config, &self.workload_group_to_policy));
        if let Some(old) = self.key_to_bound.get_mut(&key)
            && old.uid == uid
            && old.node == node
        {
            let same = match (&old.role, &member_of) {
                (Role::Member(a), Some(b)) => a == b,
                (Role::Held { .. }, None) => true,
                _ => false,
            };
            if same {
                // Confirmed, or an update that changes nothing here.
                old.assumed = None;
                self.assumed.remove(&key);
                if let Role::Member(gang) = &old.role
                    && let Some(group) = self.gang_to_running.get_mut(gang)
                    && let Some(entry) = group.pods.get_mut(&key)
                {
                    entry.0 = PendingPod::of(pod);
                }
                return;
            }
        }
        self.forget_bound(scheduler, &key);
        let role = match member_of {
            Some(gang) => {
                let group = self.gang_to_running.entry(gang.clone()).or_default();
                group.pods.insert(key.clone(), (PendingPod::of(pod), node));
                self.dirty_running.insert(gang.clone());
                // The pending side counts bound members toward minMember.
                if self.gang_to_pending.contains_key(&gang) {
                    self.dirty_pending.insert(gang.clone());
                }
                Role::Member(gang)
            }
            None => self.hold(scheduler, pod, node, ours),
        };
        self.key_to_bound.insert(
            key,
            BoundPod {
                uid,
                node,
                role,
                assumed: None,
                ours,
            },
        );
    }

    /// Holds a pod's room directly, never more than the node has left (pods bound by someone
    /// else may overcommit it, and a preemptor may already sit in a victim's room).
    fn hold(&mut self, scheduler: &mut Scheduler, pod: &Pod, node: usize, ours: bool) -> Role {
        let request = pod_request(pod, &self.config);
        let gpus = request.gpus.saturating_add(self.dra.gpus(pod).0);
        let n = &scheduler.state.nodes;
        let resources = request
            .other
            .iter()
            .filter_map(|(name, &v)| {
                let name = self.symbols.intern(name);
                let column = n.resources.iter().find(|c| c.name == name)?;
                Some((name, v.min(column.free[node])))
            })
            .collect();
        let shape = PodShape {
            gpus: gpus.min(n.gpu_free[node]),
            cpu_milli: request.cpu_milli.min(n.cpu_free_milli[node]),
            memory_mib: request.memory_mib.min(n.memory_free_mib[node]),
            resources,
            ..PodShape::default()
        };
        let slot = scheduler.state.reserve(node, &shape);
        let charged = ours.then(|| (self.charged_queue(pod), u64::from(gpus)));
        if let Some((queue, gpus)) = &charged {
            self.ensure_queue(scheduler, queue);
            if let Some(id) = scheduler.queues.id(queue) {
                scheduler.queues.charge(id, Resources::gpus(*gpus), true);
            }
        }
        Role::Held {
            slot,
            shape,
            charged,
        }
    }

    fn forget_bound(&mut self, scheduler: &mut Scheduler, key: &PodKey) {
        let Some(bound) = self.key_to_bound.remove(key) else {
            return;
        };
        self.assumed.remove(key);
        match bound.role {
            Role::Member(gang) => {
                if let Some(group) = self.gang_to_running.get_mut(&gang) {
                    group.pods.remove(key);
                }
                if self.gang_to_pending.contains_key(&gang) {
                    self.dirty_pending.insert(gang.clone());
                }
                self.dirty_running.insert(gang);
            }
            Role::Held {
                slot,
                shape,
                charged,
            } => {
                scheduler.state.release(slot, &shape);
                if let Some((queue, gpus)) = charged
                    && let Some(id) = scheduler.queues.id(&queue)
                {
                    scheduler.queues.charge(id, Resources::gpus(gpus), false);
                }
            }
        }
        for nominated in self.job_to_nominated.values_mut() {
            nominated.victims.remove(key);
        }
    }

    /// A binding this process assumed did not happen after all (the pod was read back
    /// unbound): its assumption ends now, so [`Tracker::expired_assumptions`] hands it back
    /// to be judged by the caches.
    pub fn unassume(&mut self, key: &PodKey) {
        if let Some(bound) = self.key_to_bound.get_mut(key) {
            bound.assumed = None;
        }
    }

    /// Pods bound by this process that the bound cache never confirmed within the assume
    /// window: looked up again by the caller.
    pub fn expired_assumptions(&self) -> Vec<PodKey> {
        self.assumed
            .iter()
            .filter(|k| {
                self.key_to_bound
                    .get(*k)
                    .and_then(|b| b.assumed)
                    .is_none_or(|at| at.elapsed() >= ASSUME_TTL)
            })
            .cloned()
            .collect()
    }

    /// After the changed keys: submits, withdraws and adopts what the changed gangs now are,
    /// and moves on preemptors whose victims are gone. Returns what changed.
    pub fn finish_sync(&mut self, scheduler: &mut Scheduler, give_up: Duration) -> Changes {
        let mut changes = Changes::default();
        for gang in std::mem::take(&mut self.dirty_running) {
            self.settle_running(scheduler, &gang, &mut changes);
        }
        for gang in std::mem::take(&mut self.dirty_pending) {
            self.settle_pending(scheduler, &gang, &mut changes);
        }
        // Preemptors whose victims have left, or whose wait ran out, go back to the front of
        // their queue: the cycle about to run places them on the room now free.
        let ready: Vec<JobId> = self
            .job_to_nominated
            .iter()
            .filter(|(_, n)| n.victims.is_empty() || n.since.elapsed() >= give_up)
            .map(|(&id, _)| id)
            .collect();
        for id in ready {
            if let Some(n) = self.job_to_nominated.remove(&id)
                && !n.victims.is_empty()
            {
                tracing::info!(job = %scheduler.job(id).name, "preemption dropped (timed out); choosing again");
            }
            scheduler.unplace(id);
        }
        changes.pod_to_job = std::mem::take(&mut self.pod_to_job);
        changes
    }

    fn settle_running(&mut self, scheduler: &mut Scheduler, gang: &Gang, changes: &mut Changes) {
        let Some(group) = self.gang_to_running.get_mut(gang) else {
            return;
        };
        let now: BTreeSet<PodKey> = group.pods.keys().cloned().collect();
        if let Some((job, pods)) = &group.job {
            if *pods == now && scheduler.is_running(*job) {
                return;
            }
            let job = *job;
            group.job = None;
            self.job_to_gang.remove(&job);
            self.job_to_warning.remove(&job);
            tracing::debug!(job, gang = ?gang, "running pods changed");
            if scheduler.get(job).is_some() {
                scheduler.finish(job);
                changes.ended += 1;
            }
        }
        if group.pods.is_empty() {
            self.gang_to_running.remove(gang);
            return;
        }
        let members: Vec<(PendingPod, usize)> = group.pods.values().cloned().collect();
        let first = members[0].0.pod.clone();
        let mut shape = self.shape_of(&first);
        let mut per_node: HashMap<usize, u32> = HashMap::new();
        for (pod, node) in &members {
            widen(&mut shape, &self.shape_of(&pod.pod));
            *per_node.entry(*node).or_default() += 1;
        }
        let queue = self.charged_queue(&first);
        self.ensure_queue(scheduler, &queue);
        let fits = per_node
            .iter()
            .all(|(&node, &n)| scheduler.state.capacity_for(node, &shape) >= n);
        if !fits {
            // Someone overcommitted a node: the pods only hold what room is left, and are
            // never preempted.
            let ours = is_ours(&first, &self.config);
            if let Some(group) = self.gang_to_running.remove(gang) {
                for (key, (pod, node)) in group.pods {
                    let role = self.hold(scheduler, &pod.pod, node, ours);
                    if let Some(b) = self.key_to_bound.get_mut(&key) {
                        b.role = role;
                    }
                }
            }
            return;
        }
        let name = gang.job_name();
        shape.name = self.symbols.intern(&name);
        shape.queue = self.symbols.intern(&queue);
        shape.gang_size = members.len() as u32;
        let nodes: Vec<usize> = members.iter().map(|(_, node)| *node).collect();
        let spec = JobSpec {
            name,
            queue: scheduler.queues.id(&queue).unwrap_or(0),
            priority: shape.priority,
            pods: members.len() as u32,
            shape,
            balloon: is_balloon(&first, &self.config),
            topology: TopologyPref::default(),
            submit_s: self.run_s(&first),
            expected_runtime_s: crate::mapping::expected_runtime(&first).ok().flatten(),
        };
        let id = scheduler.adopt(spec, &nodes);
        tracing::debug!(job = id, gang = ?gang, pods = nodes.len(), "adopted running pods");
        self.job_to_gang.insert(id, (gang.clone(), true));
        if let Some(group) = self.gang_to_running.get_mut(gang) {
            group.job = Some((id, now));
        }
    }

    fn settle_pending(&mut self, scheduler: &mut Scheduler, gang: &Gang, changes: &mut Changes) {
        let bound_members = self
            .gang_to_running
            .get(gang)
            .map_or(0, |g| g.pods.len() as u32);
        let Some(entry) = self.gang_to_pending.get_mut(gang) else {
            return;
        };
        let now: BTreeSet<PodKey> = entry.pods.keys().cloned().collect();
        let first = entry.pods.values().next().map(|p| p.pod.clone());
        let balloon = first.as_ref().is_some_and(|p| is_balloon(p, &self.config));
        // The queue the gang may use, or why it may not: the tenant trust boundary. A trusted
        // balloon is charged to no queue, so the one it names is not checked.
        let admitted = first.as_ref().map(|pod| {
            let claim = queue_claim(pod, &self.config);
            if balloon {
                Ok(self
                    .tenancy
                    .charged_queue(gang.namespace(), &claim, &self.config))
            } else {
                self.tenancy.admit(gang.namespace(), &claim, &self.config)
            }
        });
        let (queue, refused) = match admitted {
            Some(Ok(queue)) => (Some(queue), None),
            Some(Err(why)) => (None, Some(why)),
            None => (None, None),
        };
        // A field Gantry does not honour refuses the gang, naming the field and the pod; so
        // do pods of one gang that ask for different nodes (a gang is placed as one shape).
        let refused = refused.or_else(|| {
            let mut affinities = entry.pods.values().map(|p| {
                crate::podspec::node_affinity(&p.pod, &self.symbols).unwrap_or_default()
            });
            let first_affinity = affinities.next();
            entry
                .pods
                .values()
                .find_map(|p| {
                    crate::podspec::unsupported(&p.pod, &self.symbols)
                        .or_else(|| self.dra.resolve(&p.pod).err())
                        .map(|why| format!("pod {}: {why}", p.key()))
                })
                .or_else(|| {
                    affinities.any(|a| Some(&a) != first_affinity.as_ref()).then(|| {
                        format!(
                            "gang {} has pods with different node selectors or node affinity; Gantry places a gang's pods by one",
                            gang.job_name()
                        )
                    })
                })
        });
        // Why the gang cannot be a job yet, if it cannot.
        let waiting = refused.or_else(|| first.as_ref().and_then(|_| {
            let name = gang.job_name();
            let min = match gang {
                Gang::Single(..) => 1,
                Gang::PodGroup(ns, group) => match self.group_to_min.get(&(ns.clone(), group.clone())) {
                    Some(&min) => min,
                    None => {
                        return Some(format!(
                            "pod group {ns}/{group} not found (scheduling.x-k8s.io PodGroup named by label {})",
                            self.config.pod_group_label
                        ));
                    }
                },
                Gang::Workload(ns, group) => match self.workload_group_to_policy.get(&(ns.clone(), group.clone())) {
                    Some(GroupPolicy::Gang(min)) => *min,
                    Some(GroupPolicy::Refused(why)) => return Some(why.clone()),
                    // A basic group's pods are single jobs: never keyed here.
                    Some(GroupPolicy::Basic) => 1,
                    None => {
                        return Some(format!(
                            "pod group {ns}/{group} not found (scheduling.k8s.io PodGroup named by spec.schedulingGroup.podGroupName)"
                        ));
                    }
                },
                Gang::Labels(ns, group, size) => match size.as_deref().map(str::parse::<u32>) {
                    Some(Ok(size)) if size > 0 => size,
                    _ => {
                        return Some(format!(
                            "gang {ns}/{group}: label {} must be a positive number of pods, found {}",
                            self.config.gang_size_label,
                            size.as_deref().map_or("none".to_string(), |s| format!("{s:?}"))
                        ));
                    }
                },
            };
            let pending = entry.pods.len() as u32;
            (pending < min.saturating_sub(bound_members)).then(|| {
                format!(
                    "gang {name} has {} of its {min} pods ({bound_members} bound, {pending} pending)",
                    bound_members + pending
                )
            })
        }));
        if let Some((job, pods)) = &entry.job {
            // The same pods in the same queue: nothing to do. A queue that changed (its
            // LocalQueue was pointed elsewhere) submits the gang again.
            let same_queue = scheduler
                .get(*job)
                .is_some_and(|spec| Some(scheduler.queues.name(spec.queue)) == queue.as_deref());
            if *pods == now && waiting.is_none() && same_queue {
                return;
            }
            let job = *job;
            entry.job = None;
            self.job_to_gang.remove(&job);
            self.job_to_warning.remove(&job);
            self.job_to_nominated.remove(&job);
            tracing::debug!(job, gang = ?gang, "withdrawn: its pods changed");
            if scheduler.get(job).is_some() {
                scheduler.finish(job);
                changes.ended += 1;
            }
        }
        entry.waiting = waiting;
        let Some(first) = first else {
            self.gang_to_pending.remove(gang);
            return;
        };
        let (None, Some(queue)) = (&entry.waiting, queue) else {
            return;
        };
        let members: Vec<PendingPod> = entry.pods.values().cloned().collect();
        let mut shape = self.shape_of(&first);
        for pod in &members[1..] {
            widen(&mut shape, &self.shape_of(&pod.pod));
        }
        let name = gang.job_name();
        shape.name = self.symbols.intern(&name);
        shape.queue = self.symbols.intern(&queue);
        shape.gang_size = members.len() as u32;
        let submit_s = self.run_s(&first);
        self.ensure_queue(scheduler, &queue);
        let spec = JobSpec {
            name: name.clone(),
            queue: scheduler.queues.id(&queue).unwrap_or(0),
            priority: shape.priority,
            pods: members.len() as u32,
            shape,
            // A balloon is charged to no queue and gives way to any work, pending or bound.
            balloon,
            topology: TopologyPref::default(),
            submit_s,
            expected_runtime_s: None,
        };
        let (spec, warning) = declared_runtime(spec, &members);
        let id = scheduler.submit(spec);
        if let Some(warning) = warning {
            self.job_to_warning.insert(id, warning);
        }
        tracing::debug!(job = id, gang = ?gang, pods = members.len(), "submitted");
        changes.submitted += 1;
        changes.submitted_pods += members.len() as u64;
        if members.len() > 1 {
            self.pod_to_job
                .extend(members.iter().map(|p| (p.key(), name.clone())));
        }
        self.job_to_gang.insert(id, (gang.clone(), false));
        if let Some(entry) = self.gang_to_pending.get_mut(gang) {
            entry.job = Some((id, now));
        }
    }

    /// The pods of a pending job, in a stable order, or of a running one.
    pub fn pods_of(&self, job: JobId) -> Vec<PendingPod> {
        match self.job_to_gang.get(&job) {
            Some((gang, false)) => self
                .gang_to_pending
                .get(gang)
                .map(|g| g.pods.values().cloned().collect())
                .unwrap_or_default(),
            Some((gang, true)) => self
                .gang_to_running
                .get(gang)
                .map(|g| g.pods.values().map(|(p, _)| p.clone()).collect())
                .unwrap_or_default(),
            None => Vec::new(),
        }
    }

    /// A running job's pods and their nodes.
    pub fn running_pods(&self, job: JobId) -> Vec<(PendingPod, usize)> {
        match self.job_to_gang.get(&job) {
            Some((gang, true)) => self
                .gang_to_running
                .get(gang)
                .map(|g| g.pods.values().cloned().collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// The uids of our pending pods.
    pub fn pending_uids(&self) -> HashSet<String> {
        self.gang_to_pending
            .values()
            .flat_map(|g| g.pods.values().map(|p| p.uid.clone()))
            .collect()
    }

    /// A placed job's pods are bound to `nodes` (by pod, in [`Tracker::pods_of`] order): they
    /// count as bound until the bound cache confirms them.
    pub fn bound(&mut self, job: JobId, pods: &[(PendingPod, usize)]) {
        let Some((gang, false)) = self.job_to_gang.get(&job).cloned() else {
            return;
        };
        let keys: BTreeSet<PodKey> = pods
            .iter()
            .map(|(p, _)| (p.namespace.clone(), p.name.clone()))
            .collect();
        if let Some(entry) = self.gang_to_pending.get_mut(&gang) {
            for key in &keys {
                entry.pods.remove(key);
            }
            entry.job = None;
            if entry.pods.is_empty() {
                self.gang_to_pending.remove(&gang);
            }
        }
        let group = self.gang_to_running.entry(gang.clone()).or_default();
        let fresh = group.pods.is_empty() && group.job.is_none();
        for (pod, node) in pods {
            let key = (pod.namespace.clone(), pod.name.clone());
            self.key_to_pending.remove(&key);
            group.pods.insert(key.clone(), (pod.clone(), *node));
            self.key_to_bound.insert(
                key.clone(),
                BoundPod {
                    uid: pod.uid.clone(),
                    node: *node,
                    role: Role::Member(gang.clone()),
                    assumed: Some(Instant::now()),
                    ours: true,
                },
            );
            self.assumed.insert(key);
        }
        if fresh {
            // The job the core placed is this group's running job.
            group.job = Some((job, keys));
            self.job_to_gang.insert(job, (gang, true));
        } else {
            // Members of the gang ran already (a restarted member): adopt the group afresh.
            self.job_to_gang.remove(&job);
            self.job_to_warning.remove(&job);
            self.dirty_running.insert(gang);
        }
    }

    /// A preemptor is nominated to its nodes and waits for `victims` (pod keys) to go.
    pub fn nominate(&mut self, job: JobId, victims: BTreeSet<PodKey>) {
        self.job_to_nominated.insert(
            job,
            Nominated {
                victims,
                since: Instant::now(),
            },
        );
    }

    /// Preemptors waiting, with their victims.
    pub fn nominated(&self) -> &BTreeMap<JobId, Nominated> {
        &self.job_to_nominated
    }

    /// Jobs the core evicted for a preemptor: they leave the core (their pods are being
    /// evicted) and their pods hold their room until gone.
    pub fn evicted(&mut self, scheduler: &mut Scheduler, jobs: &[JobId]) {
        for &job in jobs {
            self.job_to_warning.remove(&job);
            let Some((gang, true)) = self.job_to_gang.remove(&job) else {
                continue;
            };
            if scheduler.get(job).is_some() {
                scheduler.finish(job);
            }
            let Some(group) = self.gang_to_running.remove(&gang) else {
                continue;
            };
            for (key, (pod, node)) in group.pods {
                let ours = is_ours(&pod.pod, &self.config);
                let role = self.hold(scheduler, &pod.pod, node, ours);
                if let Some(b) = self.key_to_bound.get_mut(&key) {
                    b.role = role;
                }
            }
        }
    }

    /// What the job's pods declared that Gantry worked around, for their FailedScheduling.
    pub(crate) fn warning_of(&self, job: JobId) -> Option<&str> {
        self.job_to_warning.get(&job).map(String::as_str)
    }

    /// Pods waiting before any placement is tried, with why: incomplete gangs, unknown
    /// PodGroups.
    pub fn waiting(&self) -> Vec<(PendingPod, String)> {
        self.gang_to_pending
            .values()
            .filter_map(|g| Some((g, g.waiting.clone()?)))
            .flat_map(|(g, why)| g.pods.values().map(move |p| (p.clone(), why.clone())))
            .collect()
    }

    /// How many of our pods are pending, and how many of them wait outside any job.
    pub fn pending_pods(&self) -> usize {
        self.key_to_pending.len()
    }
}

/// `spec` with the runtime its pods declare (the longest of them), and the warning to show
/// when one declares it malformed (the planner then learns the runtime instead).
fn declared_runtime(mut spec: JobSpec, members: &[PendingPod]) -> (JobSpec, Option<String>) {
    let mut warning = None;
    for member in members {
        match crate::mapping::expected_runtime(&member.pod) {
            Ok(Some(s)) => {
                spec.expected_runtime_s = Some(spec.expected_runtime_s.map_or(s, |d| d.max(s)));
            }
            Ok(None) => {}
            Err(text) => warning = Some(text),
        }
    }
    if warning.is_some() {
        spec.expected_runtime_s = None;
    }
    (spec, warning)
}

/// Whether an update of a pending pod leaves what Gantry decides for it unchanged: the same
/// spec, and the same ResourceClaims created for it (a claim made from a template reaches the
/// pod through its status, and the pod could not be placed before it did).
fn decides_the_same(old: &Pod, new: &Pod) -> bool {
    let claims = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.clone())
    };
    old.spec == new.spec && claims(old) == claims(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_core::{BuiltinOnly, Health, Queues, SchedulerConfig};
    use k8s_openapi::api::core::v1::{
        Container, NodeCondition, NodeSpec, NodeStatus, PodSpec, ResourceRequirements,
        Taint as KTaint,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn label_map(labels: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn node(name: &str, gpus: u32, labels: &[(&str, &str)], ready: bool) -> Arc<Node> {
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(label_map(labels)),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec::default()),
            status: Some(NodeStatus {
                allocatable: Some(
                    [
                        ("nvidia.com/gpu", gpus.to_string()),
                        ("cpu", "64".into()),
                        ("memory", "512Gi".into()),
                        ("pods", "110".into()),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v)))
                    .collect(),
                ),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            }),
        })
    }

    fn pod(name: &str, gpus: u32, labels: &[(&str, &str)], node: Option<&str>) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                labels: Some(label_map(labels)),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                scheduler_name: Some("gantry".into()),
                node_name: node.map(str::to_string),
                containers: vec![Container {
                    name: "main".into(),
                    resources: Some(ResourceRequirements {
                        limits: Some(
                            [("nvidia.com/gpu".to_string(), Quantity(gpus.to_string()))].into(),
                        ),
                        ..ResourceRequirements::default()
                    }),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: None,
        })
    }

    /// `pod` with a PriorityClass.
    fn with_class(pod: Arc<Pod>, class: &str) -> Arc<Pod> {
        let mut pod = (*pod).clone();
        pod.spec.as_mut().unwrap().priority_class_name = Some(class.into());
        Arc::new(pod)
    }

    fn key(name: &str) -> PodKey {
        ("ns".to_string(), name.to_string())
    }

    /// A tracker and its scheduler, built from whole caches.
    fn build(
        nodes: &[Arc<Node>],
        bound: &[Arc<Pod>],
        pending: &[Arc<Pod>],
        groups: &[(&str, u32)],
        queues: &[QueueDef],
    ) -> (Tracker, Scheduler) {
        let symbols = Symbols::new();
        let mut scheduler = Scheduler::new(
            ClusterState::new(gantry_core::NodeTable::default()),
            Queues::new(&[], Resources::default(), 600.0).unwrap(),
            symbols.clone(),
            SchedulerConfig::default(),
        );
        let mut tracker = Tracker::new(KubeConfig::default(), symbols);
        tracker.set_clock(0.0, 0.0);
        tracker.namespace_changed("ns", Some(Labels::new()));
        // Every namespace may use these queues: the tenancy tests below say otherwise.
        let declared = queues
            .iter()
            .map(|def| DeclaredQueue {
                def: def.clone(),
                namespace_selector: Some(Default::default()),
            })
            .collect();
        tracker.queues_changed(&mut scheduler, declared, &BTreeMap::new());
        tracker.pod_groups_changed(groups.iter().map(|(name, min)| (key(name), *min)).collect());
        tracker.rebuild(
            &mut scheduler,
            &World {
                nodes,
                bound,
                pending,
            },
        );
        tracker.finish_sync(&mut scheduler, Duration::from_secs(120));
        (tracker, scheduler)
    }

    /// `(name, pods)` of every job, by id.
    fn jobs(s: &Scheduler) -> Vec<(String, u32)> {
        let mut ids: Vec<JobId> = s.pending().into_iter().chain(s.running()).collect();
        ids.sort_unstable();
        ids.into_iter()
            .map(|id| (s.job(id).name.clone(), s.job(id).pods))
            .collect()
    }

    /// What the binder reports after binding every pod of `job` to node 0.
    fn bind_on_first_node(tracker: &mut Tracker, job: JobId) {
        let pods: Vec<(PendingPod, usize)> =
            tracker.pods_of(job).into_iter().map(|p| (p, 0)).collect();
        tracker.bound(job, &pods);
    }

    fn cycle(s: &mut Scheduler) -> gantry_core::CycleOutput {
        s.cycle(0.0, &mut BuiltinOnly)
    }

    #[test]
    fn nodes_map_gpus_topology_health_and_taints() {
        let mut tainted = (*node("c", 4, &[], true)).clone();
        tainted.spec.as_mut().unwrap().taints = Some(vec![KTaint {
            key: "team".into(),
            value: Some("rl".into()),
            effect: "NoSchedule".into(),
            ..KTaint::default()
        }]);
        let nodes = [
            node(
                "b",
                8,
                &[
                    ("topology.gantry.dev/rack", "r2"),
                    ("nvidia.com/gpu.product", "H100"),
                ],
                true,
            ),
            node("a", 8, &[("topology.gantry.dev/rack", "r1")], false),
            Arc::new(tainted),
        ];
        let (tracker, s) = build(&nodes, &[], &[], &[], &[]);
        let t = &s.state.nodes;
        assert_eq!(tracker.node_names(), ["a", "b", "c"]);
        assert_eq!(t.gpu_total, [8, 8, 4]);
        assert_eq!(t.cpu_free_milli, [64_000; 3]);
        assert_eq!(t.memory_free_mib, [512 * 1024; 3]);
        assert_eq!(t.health(0), Health::NotReady);
        assert_eq!(t.health(1), Health::Healthy);
        assert_eq!(t.levels.len(), 1, "only the rack level is labelled");
        assert_eq!(t.levels[0].node_domain, [0, 1, u32::MAX]);
        assert_eq!(t.taints(2).len(), 1);
        assert!(t.taints(0).is_empty());
        assert_eq!(&*s.symbols().resolve(t.gpu_type[1]), "H100");
    }

    #[test]
    fn a_pending_pod_is_decided_again_when_its_template_claim_reaches_its_status() {
        let nodes = [node("a", 8, &[], true)];
        let waiting = pod("p", 1, &[], None);
        let (mut tracker, mut s) = build(&nodes, &[], &[], &[], &[]);
        let key: PodKey = ("default".into(), "p".into());
        tracker.pod_changed(&mut s, key.clone(), Some(&waiting), None);
        tracker.dirty_pending.clear();
        // Our own PodScheduled condition changes nothing we decide on.
        let mut noted = (*waiting).clone();
        noted.status.get_or_insert_with(Default::default).conditions =
            Some(vec![k8s_openapi::api::core::v1::PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                ..Default::default()
            }]);
        let noted = Arc::new(noted);
        tracker.pod_changed(&mut s, key.clone(), Some(&noted), None);
        assert!(!tracker.pending_is_dirty(&key));
        let mut claimed = (*noted).clone();
        claimed
            .status
            .get_or_insert_with(Default::default)
            .resource_claim_statuses =
            Some(vec![k8s_openapi::api::core::v1::PodResourceClaimStatus {
                name: "gpus".into(),
                resource_claim_name: Some("p-gpus".into()),
            }]);
        tracker.pod_changed(&mut s, key.clone(), Some(&Arc::new(claimed)), None);
        assert!(
            tracker.pending_is_dirty(&key),
            "the claim's name must be read again"
        );
    }

    #[test]
    fn a_health_change_updates_one_node_and_anything_else_asks_for_a_rebuild() {
        let nodes = [node("a", 8, &[], true), node("b", 8, &[], true)];
        let (mut tracker, mut s) = build(&nodes, &[], &[], &[], &[]);
        let sick = node("a", 8, &[], false);
        assert!(!tracker.node_changed(&mut s, "a", Some(&sick)));
        assert_eq!(s.state.nodes.health(0), Health::NotReady);
        assert!(!tracker.node_changed(&mut s, "a", Some(&sick)), "no change");
        let bigger = node("b", 16, &[], true);
        assert!(tracker.node_changed(&mut s, "b", Some(&bigger)));
        assert!(tracker.node_changed(&mut s, "c", Some(&node("c", 8, &[], true))));
        assert!(tracker.node_changed(&mut s, "b", None));
    }

    #[test]
    fn bound_pods_use_capacity_and_queues() {
        let nodes = [node("a", 8, &[], true)];
        let mut foreign = (*pod("x", 6, &[("gantry.dev/queue", "team-a")], Some("a"))).clone();
        foreign.spec.as_mut().unwrap().scheduler_name = Some("default-scheduler".into());
        let (_, s) = build(&nodes, &[Arc::new(foreign)], &[], &[], &[]);
        assert_eq!(s.state.nodes.gpu_free, [2]);
        let ours = [pod("y", 6, &[("gantry.dev/queue", "team-a")], Some("a"))];
        let (_, s) = build(&nodes, &ours, &[], &[], &[]);
        assert_eq!(s.state.nodes.gpu_free, [2]);
        assert_eq!(s.queues.used(s.queues.id("team-a").unwrap()).gpus, 6);
    }

    #[test]
    fn gangs_from_pod_groups_and_labels_become_one_job() {
        let nodes = [node("a", 8, &[], true)];
        let pg = [("scheduling.x-k8s.io/pod-group", "pg")];
        let own = [("gantry.dev/gang", "g"), ("gantry.dev/gang-size", "2")];
        let pending = [
            pod("p0", 1, &pg, None),
            pod("p1", 2, &pg, None),
            pod("g0", 1, &own, None),
            pod("g1", 1, &own, None),
            pod(
                "single",
                1,
                &[("kueue.x-k8s.io/queue-name", "team-b")],
                None,
            ),
        ];
        let (tracker, s) = build(&nodes, &[], &pending, &[("pg", 2)], &[]);
        let mut names = jobs(&s);
        names.sort();
        assert_eq!(
            names,
            [
                ("ns/g".into(), 2),
                ("ns/pg".into(), 2),
                ("ns/single".into(), 1)
            ]
        );
        let id = |name: &str| {
            s.pending()
                .into_iter()
                .find(|&id| s.job(id).name == name)
                .unwrap()
        };
        assert_eq!(
            s.job(id("ns/pg")).shape.gpus,
            2,
            "a gang's shape is its largest ask"
        );
        assert_eq!(s.queues.name(s.job(id("ns/single")).queue), "team-b");
        assert_eq!(s.queues.name(s.job(id("ns/g")).queue), "default");
        assert!(tracker.waiting().is_empty());
    }

    /// `pod` naming an upstream PodGroup in `spec.schedulingGroup`.
    fn in_group(pod: Arc<Pod>, group: &str) -> Arc<Pod> {
        let mut pod = (*pod).clone();
        pod.spec.as_mut().unwrap().scheduling_group =
            Some(k8s_openapi::api::core::v1::PodSchedulingGroup {
                pod_group_name: Some(group.into()),
            });
        Arc::new(pod)
    }

    #[test]
    fn upstream_pod_groups_make_gangs_by_min_count_and_basic_ones_single_jobs() {
        let nodes = [node("a", 8, &[], true), node("b", 8, &[], true)];
        let pending = [
            in_group(pod("w0", 1, &[], None), "train"),
            in_group(pod("w1", 1, &[], None), "train"),
            in_group(pod("w2", 1, &[], None), "big"),
            in_group(pod("s0", 1, &[], None), "serve"),
            in_group(pod("s1", 1, &[], None), "serve"),
            in_group(pod("t0", 1, &[], None), "topo"),
        ];
        // The pods come before their PodGroups: they wait, naming what they wait for.
        let (mut tracker, mut s) = build(&nodes, &[], &pending, &[], &[]);
        assert!(jobs(&s).is_empty());
        let mut reasons: Vec<String> = tracker.waiting().into_iter().map(|(_, r)| r).collect();
        reasons.sort();
        reasons.dedup();
        assert_eq!(
            reasons,
            [
                "pod group ns/big not found (scheduling.k8s.io PodGroup named by spec.schedulingGroup.podGroupName)",
                "pod group ns/serve not found (scheduling.k8s.io PodGroup named by spec.schedulingGroup.podGroupName)",
                "pod group ns/topo not found (scheduling.k8s.io PodGroup named by spec.schedulingGroup.podGroupName)",
                "pod group ns/train not found (scheduling.k8s.io PodGroup named by spec.schedulingGroup.podGroupName)",
            ]
        );
        let refused = "pod group ns/topo: spec.schedulingConstraints.topology is not supported";
        tracker.workload_groups_changed(
            [
                (key("train"), GroupPolicy::Gang(2)),
                (key("big"), GroupPolicy::Gang(4)),
                (key("serve"), GroupPolicy::Basic),
                (key("topo"), GroupPolicy::Refused(refused.into())),
            ]
            .into(),
        );
        tracker.finish_sync(&mut s, Duration::from_secs(120));
        let mut names = jobs(&s);
        names.sort();
        assert_eq!(
            names,
            [
                ("ns/s0".into(), 1),
                ("ns/s1".into(), 1),
                ("ns/train".into(), 2)
            ],
            "a gang of minCount 2, and a basic group's pods each on their own"
        );
        let mut reasons: Vec<String> = tracker.waiting().into_iter().map(|(_, r)| r).collect();
        reasons.sort();
        assert_eq!(
            reasons,
            [
                "gang ns/big has 1 of its 4 pods (0 bound, 1 pending)",
                refused
            ],
            "a group asking what Gantry does not honour waits, saying so"
        );
        assert_eq!(tracker.workload_group_of(&key("w0")), Some(key("train")));
        assert_eq!(
            tracker.workload_group_of(&key("s0")),
            None,
            "basic: no gang"
        );
    }

    #[test]
    fn incomplete_gangs_wait_with_a_reason() {
        let nodes = [node("a", 8, &[], true)];
        let pending = [
            pod("p0", 1, &[("scheduling.x-k8s.io/pod-group", "pg")], None),
            pod(
                "q0",
                1,
                &[("scheduling.x-k8s.io/pod-group", "missing")],
                None,
            ),
            pod("g0", 1, &[("gantry.dev/gang", "g")], None),
        ];
        let (tracker, s) = build(&nodes, &[], &pending, &[("pg", 3)], &[]);
        assert!(jobs(&s).is_empty());
        let mut reasons: Vec<String> = tracker.waiting().into_iter().map(|(_, r)| r).collect();
        reasons.sort();
        assert_eq!(
            reasons,
            [
                "gang ns/g: label gantry.dev/gang-size must be a positive number of pods, found none",
                "gang ns/pg has 1 of its 3 pods (0 bound, 1 pending)",
                "pod group ns/missing not found (scheduling.x-k8s.io PodGroup named by label scheduling.x-k8s.io/pod-group)",
            ]
        );
    }

    #[test]
    fn bound_members_count_toward_min_member() {
        let nodes = [node("a", 8, &[], true)];
        let pg = [("scheduling.x-k8s.io/pod-group", "pg")];
        let bound = [pod("p0", 1, &pg, Some("a"))];
        let pending = [pod("p1", 1, &pg, None)];
        let (_, s) = build(&nodes, &bound, &pending, &[("pg", 2)], &[]);
        assert_eq!(s.running().count(), 1, "the bound member is a running job");
        assert_eq!(
            s.pending_count(),
            1,
            "and the pending one completes the gang"
        );
    }

    #[test]
    fn bound_balloons_and_our_pods_are_preemptable_jobs() {
        let nodes = [node("a", 8, &[], true), node("b", 8, &[], true)];
        let mut balloon = (*with_class(
            pod("balloon", 8, &[("gantry.dev/balloon", "true")], Some("a")),
            "gantry-balloon",
        ))
        .clone();
        balloon.spec.as_mut().unwrap().scheduler_name = Some("default-scheduler".into());
        let mut foreign = (*pod("foreign", 4, &[], Some("b"))).clone();
        foreign.spec.as_mut().unwrap().scheduler_name = Some("default-scheduler".into());
        let mut leaving = (*pod("leaving", 4, &[], Some("b"))).clone();
        leaving.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        let bound = [Arc::new(balloon), Arc::new(foreign), Arc::new(leaving)];
        let mut urgent = (*pod("urgent", 8, &[], None)).clone();
        urgent.spec.as_mut().unwrap().priority = Some(1000);
        let (_, mut s) = build(&nodes, &bound, &[Arc::new(urgent)], &[], &[]);
        let running: Vec<JobId> = s.running().collect();
        assert_eq!(
            running.len(),
            1,
            "only the balloon: the others are foreign or leaving"
        );
        assert!(s.job(running[0]).balloon);
        assert_eq!(s.state.nodes.gpu_free, [0, 0]);
        let output = cycle(&mut s);
        assert_eq!(output.evicted, running);
        assert!(output.decisions[0].placed);
        assert_eq!(output.decisions[0].explanation.preempted, ["ns/balloon"]);
    }

    #[test]
    fn a_preemptor_keeps_its_room_while_victims_leave_then_is_placed_again() {
        let nodes = [node("a", 8, &[], true)];
        let bound = [with_class(
            pod("victim", 8, &[("gantry.dev/balloon", "true")], Some("a")),
            "gantry-balloon",
        )];
        let mut urgent = (*pod("urgent", 8, &[], None)).clone();
        urgent.spec.as_mut().unwrap().priority = Some(1000);
        let (mut tracker, mut s) = build(&nodes, &bound, &[Arc::new(urgent)], &[], &[]);
        let output = cycle(&mut s);
        let preemptor = output.decisions[0].job;
        assert_eq!(tracker.running_pods(output.evicted[0]).len(), 1);
        tracker.nominate(preemptor, [key("victim")].into());
        // The next sync: the victim leaves the scheduler, its pod holds only what is left
        // (nothing: the preemptor sits in its room), and nothing else fits.
        tracker.evicted(&mut s, &output.evicted);
        tracker.pod_changed(&mut s, key("q"), Some(&pod("q", 8, &[], None)), None);
        tracker.finish_sync(&mut s, Duration::from_secs(120));
        assert!(s.is_running(preemptor), "nominated: placed on its nodes");
        assert_eq!(s.state.nodes.gpu_free, [0]);
        assert_eq!(s.running().count(), 1);
        assert!(cycle(&mut s).decisions.iter().all(|d| !d.placed));
        // The victim is gone: the preemptor goes back to be placed by the next cycle.
        tracker.pod_changed(&mut s, key("victim"), None, None);
        tracker.finish_sync(&mut s, Duration::from_secs(120));
        assert!(!s.is_running(preemptor));
        assert!(tracker.nominated().is_empty());
        let output = cycle(&mut s);
        assert!(
            output
                .decisions
                .iter()
                .any(|d| d.job == preemptor && d.placed)
        );
    }

    #[test]
    fn declared_queues_bound_what_their_pods_use() {
        let nodes = [node("a", 8, &[], true)];
        let bound = [pod("x", 2, &[("gantry.dev/queue", "small")], Some("a"))];
        let pending = [pod("y", 1, &[("gantry.dev/queue", "small")], None)];
        let small = QueueDef {
            name: "small".into(),
            parent: None,
            nominal_gpus: 2,
            weight: 1,
            borrowing_limit_gpus: Some(0),
            lending_limit_gpus: None,
        };
        let (_, mut s) = build(&nodes, &bound, &pending, &[], &[small]);
        let output = cycle(&mut s);
        let decision = output.decisions.last().unwrap();
        assert!(!decision.placed);
        assert_eq!(
            decision.explanation.summary(),
            "Waiting for quota: queue small would borrow 1 GPUs, over its borrowing limit of 0."
        );
    }

    #[test]
    fn a_pod_the_bound_cache_holds_is_not_pending_even_if_the_unbound_cache_still_lists_it() {
        let nodes = [node("n0", 8, &[], true), node("n1", 8, &[], true)];
        let unbound = pod("p", 2, &[], None);
        let bound = pod("p", 2, &[], Some("n0"));
        let (mut tracker, mut s) = build(&nodes, &[], std::slice::from_ref(&unbound), &[], &[]);
        assert_eq!(s.pending_count(), 1);
        tracker.pod_changed(&mut s, key("p"), Some(&unbound), Some(&bound));
        tracker.finish_sync(&mut s, Duration::from_secs(120));
        assert_eq!(s.pending_count(), 0);
        assert_eq!(s.running().count(), 1);
        assert_eq!(s.state.nodes.gpu_free, [6, 8]);
    }

    #[test]
    fn pods_coming_and_going_submit_withdraw_and_finish_jobs() {
        let nodes = [node("a", 8, &[], true)];
        let (mut tracker, mut s) = build(&nodes, &[], &[], &[], &[]);
        let p = pod("p", 8, &[], None);
        tracker.pod_changed(&mut s, key("p"), Some(&p), None);
        let changes = tracker.finish_sync(&mut s, Duration::from_secs(120));
        assert_eq!((changes.submitted, s.pending_count()), (1, 1));
        // An update that changes nothing the scheduler reads leaves the job alone.
        let id = s.pending()[0];
        tracker.pod_changed(&mut s, key("p"), Some(&p), None);
        tracker.finish_sync(&mut s, Duration::from_secs(120));
        assert_eq!(s.pending(), [id]);
        // Deleted before it was placed: withdrawn.
        tracker.pod_changed(&mut s, key("p"), None, None);
        let changes = tracker.finish_sync(&mut s, Duration::from_secs(120));
        assert_eq!((changes.ended, s.pending_count()), (1, 0));
        // Placed, bound, confirmed, then finished.
        tracker.pod_changed(&mut s, key("p"), Some(&p), None);
        tracker.finish_sync(&mut s, Duration::from_secs(120));
        let output = cycle(&mut s);
        let job = output.decisions[0].job;
        bind_on_first_node(&mut tracker, job);
        let on_a = pod("p", 8, &[], Some("a"));
        tracker.pod_changed(&mut s, key("p"), None, Some(&on_a));
        tracker.finish_sync(&mut s, Duration::from_secs(120));
        assert_eq!(
            s.running().collect::<Vec<_>>(),
            [job],
            "the same job, confirmed"
        );
        assert_eq!(s.state.nodes.gpu_free, [0]);
        tracker.pod_changed(&mut s, key("p"), None, None);
        tracker.finish_sync(&mut s, Duration::from_secs(120));
        assert_eq!(s.running().count(), 0);
        assert_eq!(s.state.nodes.gpu_free, [8]);
    }

    #[test]
    fn a_gang_member_leaving_leaves_the_rest_running_as_one_job() {
        let nodes = [node("a", 8, &[], true)];
        let own = [("gantry.dev/gang", "g"), ("gantry.dev/gang-size", "2")];
        let bound = [pod("g0", 2, &own, Some("a")), pod("g1", 2, &own, Some("a"))];
        let (mut tracker, mut s) = build(&nodes, &bound, &[], &[], &[]);
        assert_eq!(jobs(&s), [("ns/g".into(), 2)]);
        tracker.pod_changed(&mut s, key("g1"), None, None);
        tracker.finish_sync(&mut s, Duration::from_secs(120));
        assert_eq!(jobs(&s), [("ns/g".into(), 1)]);
        assert_eq!(s.state.nodes.gpu_free, [6]);
    }

    #[test]
    fn a_new_queue_or_a_changed_quota_keeps_what_runs_charged() {
        let nodes = [node("a", 8, &[], true)];
        let bound = [pod("x", 2, &[("gantry.dev/queue", "small")], Some("a"))];
        let (mut tracker, mut s) = build(&nodes, &bound, &[], &[], &[]);
        tracker.pod_changed(
            &mut s,
            key("y"),
            Some(&pod("y", 1, &[("gantry.dev/queue", "new")], None)),
            None,
        );
        tracker.finish_sync(&mut s, Duration::from_secs(120));
        assert!(s.queues.id("new").is_some());
        assert_eq!(s.queues.used(s.queues.id("small").unwrap()).gpus, 2);
        let small = QueueDef {
            name: "small".into(),
            parent: None,
            nominal_gpus: 4,
            weight: 1,
            borrowing_limit_gpus: None,
            lending_limit_gpus: None,
        };
        let small = DeclaredQueue {
            def: small,
            namespace_selector: Some(Default::default()),
        };
        tracker.queues_changed(&mut s, vec![small], &BTreeMap::new());
        assert_eq!(s.queues.nominal(s.queues.id("small").unwrap()), 4);
        assert_eq!(s.queues.used(s.queues.id("small").unwrap()).gpus, 2);
        let y = s.pending()[0];
        assert_eq!(s.queues.name(s.job(y).queue), "new");
        // Once checked (at the sync's end), "new" is no declared queue: y waits, refused.
        tracker.finish_sync(&mut s, Duration::from_secs(120));
        assert_eq!(s.pending_count(), 0);
        assert_eq!(
            tracker.waiting()[0].1,
            "queue \"new\" is not declared: declared queues are small"
        );
        assert_eq!(s.queues.used(s.queues.id("small").unwrap()).gpus, 2);
    }

    #[test]
    fn a_rebuild_keeps_pods_this_process_bound_before_the_cache_shows_them() {
        let nodes = [node("a", 8, &[], true)];
        let p = pod("p", 8, &[], None);
        let (mut tracker, mut s) = build(&nodes, &[], std::slice::from_ref(&p), &[], &[]);
        let job = cycle(&mut s).decisions[0].job;
        bind_on_first_node(&mut tracker, job);
        // A relist: the unbound cache still lists the pod, the bound cache does not have it.
        tracker.rebuild(
            &mut s,
            &World {
                nodes: &nodes,
                bound: &[],
                pending: &[p],
            },
        );
        tracker.finish_sync(&mut s, Duration::from_secs(120));
        assert_eq!(s.pending_count(), 0, "bound, not pending again");
        assert_eq!(s.running().count(), 1);
        assert_eq!(s.state.nodes.gpu_free, [0]);
    }

    #[test]
    fn a_binding_read_back_unapplied_is_pending_again_at_once() {
        let nodes = [node("a", 8, &[], true)];
        let p = pod("p", 8, &[], None);
        let (mut tracker, mut s) = build(&nodes, &[], std::slice::from_ref(&p), &[], &[]);
        let job = cycle(&mut s).decisions[0].job;
        // The binder could not tell whether the binding landed: it assumes it did.
        bind_on_first_node(&mut tracker, job);
        assert!(tracker.expired_assumptions().is_empty(), "assumed for now");
        // Read back: the pod is still unbound, so its assumption ends at once.
        let key = ("ns".to_string(), "p".to_string());
        tracker.unassume(&key);
        assert_eq!(tracker.expired_assumptions(), std::slice::from_ref(&key));
        tracker.pod_changed(&mut s, key, Some(&p), None);
        tracker.finish_sync(&mut s, Duration::from_secs(120));
        assert_eq!(
            s.running().count(),
            0,
            "not running on a binding that did not happen"
        );
        assert_eq!(s.pending_count(), 1, "pending again");
        assert_eq!(s.state.nodes.gpu_free, [8]);
    }

    fn queue_def(name: &str, nominal: u64, borrowing_limit: Option<u64>) -> QueueDef {
        QueueDef {
            name: name.into(),
            parent: None,
            nominal_gpus: nominal,
            weight: 1,
            borrowing_limit_gpus: borrowing_limit,
            lending_limit_gpus: None,
        }
    }

    #[test]
    fn a_balloon_label_counts_only_from_a_trusted_priority_class_or_namespace() {
        let nodes = [node("a", 8, &[], true), node("b", 8, &[], true)];
        let labels = [("gantry.dev/balloon", "true"), ("gantry.dev/queue", "team")];
        let tenant = pod("tenant", 4, &labels, Some("a"));
        let trusted = with_class(pod("trusted", 4, &labels, Some("b")), "gantry-balloon");
        let other_class = with_class(pod("other", 4, &labels, None), "high");
        let config = KubeConfig::default();
        assert!(!is_balloon(&tenant, &config), "a label alone is a claim");
        assert!(is_balloon(&trusted, &config));
        assert!(!is_balloon(&other_class, &config));
        let mut by_namespace = config.clone();
        by_namespace.balloon_namespaces = ["ns".to_string()].into();
        assert!(is_balloon(&tenant, &by_namespace), "a trusted namespace");
        let mut unlabelled = (*trusted).clone();
        unlabelled.metadata.labels = None;
        assert!(
            !is_balloon(&unlabelled, &config),
            "the class alone is no balloon"
        );
        // Bound: the tenant's pod is charged to its queue and is not preempted first; the
        // trusted balloon is charged to none.
        let (_, s) = build(
            &nodes,
            &[tenant, trusted],
            &[],
            &[],
            &[queue_def("team", 8, Some(0))],
        );
        let team = s.queues.id("team").unwrap();
        assert_eq!(
            s.queues.used(team).gpus,
            4,
            "only the tenant's pod is charged"
        );
        let balloons: Vec<bool> = s.running().map(|id| s.job(id).balloon).collect();
        assert_eq!(balloons.iter().filter(|&&b| b).count(), 1);
        assert_eq!(balloons.len(), 2);
    }

    /// `pod` with a node selector, a required node-affinity term and extra container asks.
    fn constrained(
        name: &str,
        selector: &[(&str, &str)],
        required: Option<(&str, &str, &[&str])>,
        asks: &[(&str, &str)],
    ) -> Arc<Pod> {
        use k8s_openapi::api::core::v1::{
            Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
        };
        let mut pod = (*pod(name, 1, &[], None)).clone();
        let spec = pod.spec.as_mut().unwrap();
        spec.node_selector = (!selector.is_empty()).then(|| label_map(selector));
        spec.affinity = required.map(|(key, operator, values)| Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: key.into(),
                            operator: operator.into(),
                            values: Some(values.iter().map(|v| v.to_string()).collect()),
                        }]),
                        match_fields: None,
                    }],
                }),
                ..NodeAffinity::default()
            }),
            ..Affinity::default()
        });
        let requests = &mut spec.containers[0].resources.as_mut().unwrap().limits;
        for (resource, amount) in asks {
            requests
                .as_mut()
                .unwrap()
                .insert(resource.to_string(), Quantity(amount.to_string()));
        }
        Arc::new(pod)
    }

    fn with_allocatable(node: Arc<Node>, extra: &[(&str, &str)]) -> Arc<Node> {
        let mut node = (*node).clone();
        let allocatable = node.status.as_mut().unwrap().allocatable.as_mut().unwrap();
        for (resource, amount) in extra {
            allocatable.insert(resource.to_string(), Quantity(amount.to_string()));
        }
        Arc::new(node)
    }

    /// One cycle: where each placed job went, and each unplaced one's rejection counts, by
    /// job name.
    #[allow(clippy::type_complexity)]
    fn placements(
        s: &mut Scheduler,
    ) -> (
        BTreeMap<String, Vec<String>>,
        BTreeMap<String, BTreeMap<String, u32>>,
    ) {
        let output = cycle(s);
        let (mut placed, mut refused) = (BTreeMap::new(), BTreeMap::new());
        for d in &output.decisions {
            let name = s.job(d.job).name.clone();
            if d.placed {
                placed.insert(
                    name,
                    d.placement.iter().map(|&(n, _)| s.node_name(n)).collect(),
                );
            } else {
                let reasons = d
                    .explanation
                    .filters
                    .iter()
                    .flat_map(|f| f.rejected.iter().cloned())
                    .collect();
                refused.insert(name, reasons);
            }
        }
        (placed, refused)
    }

    #[test]
    fn node_selector_affinity_and_extended_resources_steer_pods_to_their_nodes() {
        let nodes = [
            node("a-train", 8, &[("pool", "train"), ("gen", "3")], true),
            node("b-eval", 8, &[("pool", "eval"), ("gen", "5")], true),
            with_allocatable(
                node("c-rdma", 8, &[("pool", "eval"), ("gen", "4")], true),
                &[("rdma/hca", "1")],
            ),
        ];
        let pending = [
            constrained("to-train", &[("pool", "train")], None, &[]),
            constrained("newer-than-4", &[], Some(("gen", "Gt", &["4"])), &[]),
            constrained(
                "not-train-no-rdma",
                &[],
                Some(("pool", "NotIn", &["train"])),
                &[],
            ),
            constrained("wants-rdma", &[], None, &[("rdma/hca", "1")]),
            constrained("nowhere", &[("pool", "inference")], None, &[]),
        ];
        let (_tracker, mut s) = build(&nodes, &[], &pending, &[], &[]);
        let (placed, refused) = placements(&mut s);
        assert_eq!(placed["ns/to-train"], ["a-train"]);
        assert_eq!(placed["ns/newer-than-4"], ["b-eval"]);
        assert_ne!(placed["ns/not-train-no-rdma"], ["a-train"]);
        assert_eq!(placed["ns/wants-rdma"], ["c-rdma"]);
        assert_eq!(
            refused["ns/nowhere"],
            [(
                "node(s) didn't match Pod's node affinity/selector".to_string(),
                3
            )]
            .into()
        );
        // A second rdma pod: the one device is held by a bound pod, and the reason names it.
        let mut holder = (*pending[3]).clone();
        holder.spec.as_mut().unwrap().node_name = Some("c-rdma".into());
        let more = [constrained(
            "wants-rdma-too",
            &[],
            None,
            &[("rdma/hca", "1")],
        )];
        let (_tracker, mut s) = build(&nodes, &[Arc::new(holder)], &more, &[], &[]);
        let (placed, refused) = placements(&mut s);
        assert!(placed.is_empty());
        assert_eq!(
            refused["ns/wants-rdma-too"],
            [("Insufficient rdma/hca".to_string(), 3)].into(),
            "c-rdma's device is taken; the others have none"
        );
    }

    #[test]
    fn a_preferred_node_affinity_outweighs_bin_packing() {
        use k8s_openapi::api::core::v1::{
            Affinity, NodeAffinity, NodeSelectorRequirement, NodeSelectorTerm,
            PreferredSchedulingTerm,
        };
        // Bin packing alone prefers the fuller node "a" (4 of 8 GPUs held).
        let nodes = [
            node("a", 8, &[("pool", "train")], true),
            node("b", 8, &[("pool", "eval")], true),
        ];
        let bound = [pod("held", 4, &[], Some("a"))];
        let prefer = |pool: &str| {
            let mut p = (*pod(&format!("prefers-{pool}"), 1, &[], None)).clone();
            p.spec.as_mut().unwrap().affinity = Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    preferred_during_scheduling_ignored_during_execution: Some(vec![
                        PreferredSchedulingTerm {
                            weight: 10,
                            preference: NodeSelectorTerm {
                                match_expressions: Some(vec![NodeSelectorRequirement {
                                    key: "pool".into(),
                                    operator: "In".into(),
                                    values: Some(vec![pool.into()]),
                                }]),
                                match_fields: None,
                            },
                        },
                    ]),
                    ..NodeAffinity::default()
                }),
                ..Affinity::default()
            });
            Arc::new(p)
        };
        let pending = [pod("plain", 1, &[], None), prefer("eval")];
        let (_tracker, mut s) = build(&nodes, &bound, &pending, &[], &[]);
        let (placed, _) = placements(&mut s);
        assert_eq!(placed["ns/plain"], ["a"], "bin packing alone");
        assert_eq!(placed["ns/prefers-eval"], ["b"], "the preference wins");
    }

    #[test]
    fn a_pod_asking_what_gantry_does_not_honour_waits_naming_the_field() {
        let nodes = [node("a", 8, &[], true)];
        let mut spread = (*pod("spread", 1, &[], None)).clone();
        spread.spec.as_mut().unwrap().topology_spread_constraints = Some(vec![
            k8s_openapi::api::core::v1::TopologySpreadConstraint::default(),
        ]);
        let (tracker, s) = build(&nodes, &[], &[Arc::new(spread)], &[], &[]);
        assert_eq!(s.pending_count(), 0, "never a job");
        let waiting: Vec<(String, String)> = tracker
            .waiting()
            .into_iter()
            .map(|(p, why)| (p.key(), why))
            .collect();
        assert_eq!(
            waiting,
            [(
                "ns/spread".to_string(),
                "pod ns/spread: spec.topologySpreadConstraints is not supported by Gantry (topology spread); remove it or use another scheduler".to_string()
            )]
        );
    }

    #[test]
    fn dra_gpus_fill_the_node_table_and_claims_join_the_pod_request() {
        use crate::claims::tests::{claim_pod, resource_claim, view};
        // Nodes with no nvidia.com/gpu: their GPUs are only in ResourceSlices.
        let nodes = [node("n0", 0, &[], true), node("n1", 0, &[], true)];
        let (mut tracker, mut s) = build(&nodes, &[], &[], &[], &[]);
        assert_eq!(s.state.nodes.gpu_total, [0, 0]);
        *tracker.dra_mut() = view();
        tracker.namespace_changed("default", Some(Labels::new()));
        tracker.dra_mut().set_claim(
            ("default".into(), "c".into()),
            Some(Arc::new(resource_claim("c", 4))),
        );
        let pending = [
            Arc::new(claim_pod("p", "u1", &[("gpus", Some("c"))])),
            Arc::new(claim_pod("q", "u2", &[("gpus", Some("absent"))])),
        ];
        tracker.rebuild(
            &mut s,
            &World {
                nodes: &nodes,
                bound: &[],
                pending: &pending,
            },
        );
        tracker.finish_sync(&mut s, Duration::from_secs(120));
        assert_eq!(s.state.nodes.gpu_total, [8, 8]);
        let asked: Vec<(String, u32)> = s
            .pending()
            .into_iter()
            .map(|id| (s.job(id).name.clone(), s.job(id).shape.gpus))
            .collect();
        assert_eq!(asked, [("default/p".to_string(), 4)]);
        let waiting: Vec<(String, String)> = tracker
            .waiting()
            .into_iter()
            .map(|(p, why)| (p.key(), why))
            .collect();
        assert_eq!(
            waiting,
            [(
                "default/q".to_string(),
                "pod default/q: spec.resourceClaims[0] (gpus): ResourceClaim default/absent does \
                 not exist (yet)"
                    .to_string()
            )]
        );
        // The claim appears: the pod becomes a job.
        tracker.dra_mut().set_claim(
            ("default".into(), "absent".into()),
            Some(Arc::new(resource_claim("absent", 8))),
        );
        tracker.claims_changed();
        tracker.finish_sync(&mut s, Duration::from_secs(120));
        assert!(tracker.waiting().is_empty());
        assert_eq!(s.pending_count(), 2);
    }

    #[test]
    fn a_refused_pod_waits_with_why_until_its_namespace_is_admitted() {
        let nodes = [node("a", 8, &[], true)];
        let pending = [pod("p", 1, &[("gantry.dev/queue", "team-a")], None)];
        let (mut tracker, mut s) = build(&nodes, &[], &pending, &[], &[]);
        assert_eq!(s.pending_count(), 1, "no Queue declared: nothing enforced");
        let team_a = DeclaredQueue {
            def: queue_def("team-a", 8, None),
            namespace_selector: Some(
                crate::tenancy::NamespaceSelector::parse(
                    &serde_json::json!({"matchLabels": {"team": "a"}}),
                )
                .unwrap(),
            ),
        };
        tracker.queues_changed(&mut s, vec![team_a], &BTreeMap::new());
        let changes = tracker.finish_sync(&mut s, Duration::from_secs(120));
        assert_eq!((changes.ended, s.pending_count()), (1, 0), "withdrawn");
        let waiting: Vec<(String, String)> = tracker
            .waiting()
            .into_iter()
            .map(|(p, why)| (p.key(), why))
            .collect();
        assert_eq!(
            waiting,
            [(
                "ns/p".to_string(),
                "queue \"team-a\" does not admit pods from namespace \"ns\" (its namespaceSelector does not select it)".to_string()
            )]
        );
        // A label on another namespace changes nothing here; one on "ns" admits the pod.
        tracker.namespace_changed("other", Some([("team".into(), "a".into())].into()));
        tracker.finish_sync(&mut s, Duration::from_secs(120));
        assert_eq!(s.pending_count(), 0);
        tracker.namespace_changed("ns", Some([("team".into(), "a".into())].into()));
        let changes = tracker.finish_sync(&mut s, Duration::from_secs(120));
        assert_eq!((changes.submitted, s.pending_count()), (1, 1));
        assert!(tracker.waiting().is_empty());
        let job = s.pending()[0];
        assert_eq!(s.queues.name(s.job(job).queue), "team-a");
    }

    #[test]
    fn a_local_queue_pointed_elsewhere_moves_its_pods_to_the_new_queue() {
        let nodes = [node("a", 8, &[], true)];
        let pending = [pod("p", 1, &[("kueue.x-k8s.io/queue-name", "main")], None)];
        let queues = [queue_def("one", 4, None), queue_def("two", 4, None)];
        let (mut tracker, mut s) = build(&nodes, &[], &pending, &[], &queues);
        let (_, why) = &tracker.waiting()[0];
        assert!(
            why.contains("Kueue's LocalQueue (kueue.x-k8s.io) is not installed"),
            "{why}"
        );
        let local =
            |queue: &str| -> HashMap<PodKey, String> { [(key("main"), queue.into())].into() };
        tracker.local_queues_changed(true, local("one"));
        tracker.finish_sync(&mut s, Duration::from_secs(120));
        let job = s.pending()[0];
        assert_eq!(s.queues.name(s.job(job).queue), "one");
        tracker.local_queues_changed(true, local("two"));
        tracker.finish_sync(&mut s, Duration::from_secs(120));
        assert_eq!(s.pending_count(), 1);
        let moved = s.pending()[0];
        assert_ne!(moved, job, "submitted again");
        assert_eq!(s.queues.name(s.job(moved).queue), "two");
    }

    #[test]
    fn a_declared_runtime_reaches_the_planner_and_a_malformed_one_is_a_warning() {
        let nodes = [node("a", 8, &[], true)];
        let annotated = |name: &str, text: &str| {
            let mut pod = (*pod(name, 1, &[], None)).clone();
            pod.metadata.annotations = Some(
                [("gantry.dev/expected-runtime".to_string(), text.to_string())]
                    .into_iter()
                    .collect(),
            );
            Arc::new(pod)
        };
        let pending = [annotated("good", "2h30m"), annotated("bad", "soon")];
        let (tracker, s) = build(&nodes, &[], &pending, &[], &[]);
        let job = |name: &str| {
            s.pending()
                .into_iter()
                .find(|&id| s.job(id).name.ends_with(name))
                .expect("submitted")
        };
        let (good, bad) = (job("good"), job("bad"));
        assert_eq!(s.job(good).expected_runtime_s, Some(9000.0));
        assert_eq!(tracker.warning_of(good), None);
        // Still submitted; the planner learns its runtime instead.
        assert_eq!(s.job(bad).expected_runtime_s, None);
        assert_eq!(
            tracker.warning_of(bad),
            Some(
                "annotation gantry.dev/expected-runtime: \"soon\" is not a duration like 90m, \
                 2h30m or 3600; the runtime is learned from finished jobs instead"
            )
        );
    }
}
