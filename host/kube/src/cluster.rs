//! The live cluster: watch caches in, bindings, Events and conditions out.
//!
//! The scheduling loop is synchronous (it shares [`gantry_core::Scheduler`] with nothing and
//! runs Wasm policies), so this type owns a small tokio runtime for the reflectors and blocks
//! on it only to bind and report.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use gantry_core::{
    BindOutcome, Binder, Changes, ClusterSource, CycleOutput, JobId, Scheduler, Symbols,
};
use k8s_openapi::api::core::v1::{Binding, Namespace, Node, ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};

use crate::config::KubeConfig;
use crate::evict::Preemption;
use crate::leader::Leadership;
use crate::mapping::{GroupPolicy, PendingPod};
use crate::tracker::{PodKey, Tracker, World};
use crate::{Error, Result};

/// The name Gantry reports Events and bindings under.
const COMPONENT: &str = "gantry";
/// Queue statuses are written at most this often.
const QUEUE_STATUS_EVERY: Duration = Duration::from_secs(5);
/// Bindings and status patches in flight at once (the cluster bench binds with the same).
pub const CONCURRENCY: usize = 16;
/// Scheduled Events in flight at once, in the background (see
/// [`KubeCluster::post_scheduled_events`]).
const EVENT_CONCURRENCY: usize = 4;

/// How often the FailedScheduling memory is trimmed to the pods still pending.
const TRIM_EVERY: Duration = Duration::from_secs(60);

/// The keys one watch cache changed since the last sync; `relisted` when it had to list
/// again (its first list included), so every key may have changed.
#[derive(Debug, Default)]
struct ChangeLog {
    keys: HashSet<PodKey>,
    relisted: bool,
}

/// Shared between a reflector's task (which writes) and the sync (which takes).
type SharedLog = Arc<Mutex<ChangeLog>>;

fn take(log: &SharedLog) -> ChangeLog {
    std::mem::take(&mut *log.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The caches of Dynamic Resource Allocation (`resource.k8s.io/v1`), watched once the API
/// server serves it.
struct DraStores {
    /// The devices drivers publish: the inventory, and the GPUs in the node table.
    slices: Store<ResourceSlice>,
    /// What a claim's request names: the class's selectors and configuration.
    classes: Store<DeviceClass>,
    /// The claims pods name, with their allocation and reservations.
    claims: Store<ResourceClaim>,
    /// The templates pods name: checked before kube-controller-manager creates their claims.
    templates: Store<ResourceClaimTemplate>,
}

/// One pod to bind: its job, the pod, and the node index it goes to.
type Bind = (JobId, PendingPod, usize);

/// A claim status this bind pass wrote, and the merge patch that takes it back if its job
/// does not bind.
struct ClaimWrite {
    /// The claim's `(namespace, name)`.
    key: PodKey,
    /// `{"metadata": {"resourceVersion"}, "status": {...}}`: the version pins what was read,
    /// so a claim changed meanwhile fails the write instead of being overwritten.
    patch: serde_json::Value,
    /// The status fields to clear if the job does not bind.
    undo: serde_json::Value,
}

/// The cluster source and binder for a live cluster.
pub struct KubeCluster {
    runtime: tokio::runtime::Runtime,
    client: Client,
    config: KubeConfig,
    nodes: Store<Node>,
    /// Our pods with no node yet.
    pending: Store<Pod>,
    /// Every pod bound to a node and not finished.
    bound: Store<Pod>,
    /// scheduler-plugins' PodGroups; `None` when the cluster has no such CRD.
    pod_groups: Option<Store<DynamicObject>>,
    /// Upstream `scheduling.k8s.io` PodGroups (KEP-4671), in the version the API server
    /// serves (kept for the status writes); `None` while it serves none.
    workload_groups: Option<(Store<DynamicObject>, ApiResource)>,
    /// Gantry's `Queue` objects; `None` when the cluster has no such CRD.
    queues: Option<Store<DynamicObject>>,
    /// Every namespace: their labels decide which Queues their pods may use.
    namespaces: Store<Namespace>,
    /// Kueue's `LocalQueue`s, through which `kueue.x-k8s.io/queue-name` names a queue; `None`
    /// when the cluster has no such CRD.
    local_queues: Option<Store<DynamicObject>>,
    /// The DRA caches; `None` while the cluster does not serve `resource.k8s.io/v1`.
    dra: Option<DraStores>,
    /// What each cache changed since the last sync (both pod caches share one log).
    node_log: SharedLog,
    pod_log: SharedLog,
    group_log: SharedLog,
    queue_log: SharedLog,
    namespace_log: SharedLog,
    local_queue_log: SharedLog,
    /// What the DRA caches changed: slices and DeviceClasses (the inventory is read again
    /// whole; they change rarely), claims and templates (by key; claims change at every bind).
    slice_log: SharedLog,
    claim_log: SharedLog,
    template_log: SharedLog,
    /// Bumped by every watch event (any cache), so an idle loop can tell nothing happened.
    generation: Arc<AtomicU64>,
    /// The scheduler's view of the caches, kept up to date by [`ClusterSource::sync`].
    tracker: Tracker,
    /// Whether the tracker has been built once.
    built: bool,
    /// Jobs the last cycle evicted: they leave the scheduler on the next sync.
    evicted: Vec<JobId>,
    /// Set when leader election runs: every write checks it first.
    leadership: Option<Arc<Leadership>>,
    /// The last FailedScheduling message posted per pod uid: the same reason is not posted
    /// again every cycle.
    last_failed: HashMap<String, String>,
    /// Waiting jobs whose last FailedScheduling message had no start estimate, with that
    /// message's reason: a job parked since is tried again only when woken, so its message
    /// gets the estimate (once) when the plan or the forecast first gives it one.
    job_to_unestimated_reason: BTreeMap<JobId, String>,
    last_trim: Instant,
    /// A client without kube-rs's automatic retries, for evictions (see [`client_with`]),
    /// each call bounded by [`CALL_TIMEOUT`].
    evict_client: Client,
    /// The client for bindings, Events and statuses: each call bounded by [`CALL_TIMEOUT`].
    write_client: Client,
    /// The Queue problems logged last, so each is logged when it appears, not every cycle.
    queue_problems: Vec<String>,
    /// The status last written to each Queue, by name, and when statuses were last written:
    /// a status is written when it changed, at most every [`QUEUE_STATUS_EVERY`].
    queue_status: HashMap<String, serde_json::Value>,
    queue_status_at: Option<Instant>,
    /// Preemptions under way, by preemptor job: the preemptor waits, nominated, until its
    /// victims are gone (see [`crate::evict`]).
    job_to_preemption: BTreeMap<JobId, Preemption>,
    /// When the optional kinds were last looked for.
    last_discovery: Instant,
    /// Whether the PodGroup and Queue caches hold a full list: until then (a kind found after
    /// start is still listing) what they hold is not applied.
    groups_ready: bool,
    queues_ready: bool,
    local_queues_ready: bool,
    /// Whether the DRA caches hold full lists: until then pods with claims wait.
    dra_ready: bool,
    /// Our pods gone (deleted, or finished) since the last bind pass, as `(namespace, uid)`:
    /// the claims reserved for them are released there.
    gone: Vec<(String, String)>,
    /// Pods whose binding went unanswered ([`Bound::Unanswered`]) and the node it named: read
    /// back at each sync until the API server answers, so one that was not bound waits for
    /// the next cycle, not for its assumption to run out.
    unanswered: Vec<(PendingPod, String)>,
}

/// Kueue's API group, and the versions of `LocalQueue` Gantry reads, preferred first (only
/// `spec.clusterQueue` is read, which both have).
const KUEUE_GROUP: &str = "kueue.x-k8s.io";
const KUEUE_VERSIONS: [&str; 2] = ["v1beta2", "v1beta1"];

/// The upstream gang API's group, and the versions of its `PodGroup` Gantry reads, preferred
/// first: alpha in 1.35 (v1alpha1, a different shape, not read), v1alpha2 in 1.36, beta (and
/// v1alpha3) in 1.37. All three have `spec.schedulingPolicy` and `status.conditions` as read
/// here; only the condition's name changed (see [`scheduled_condition_type`]).
const WORKLOAD_GROUP: &str = "scheduling.k8s.io";
const WORKLOAD_VERSIONS: [&str; 3] = ["v1beta1", "v1alpha3", "v1alpha2"];

/// What an upstream PodGroup's `spec` asks of Gantry: a gang of `minCount`, single pods
/// (`basic`), or a refusal naming the field Gantry does not support, so its pods wait with that
/// message instead of being placed as if the field were not there.
fn workload_group_policy((namespace, name): &PodKey, spec: &serde_json::Value) -> GroupPolicy {
    let refused = |field: &str, what: &str| {
        GroupPolicy::Refused(format!(
            "pod group {namespace}/{name}: spec.{field} is not supported by Gantry ({what}); remove it or use another scheduler"
        ))
    };
    let policy = &spec["schedulingPolicy"];
    let non_empty = |value: &serde_json::Value| value.as_array().is_some_and(|a| !a.is_empty());
    if spec["parentCompositePodGroupName"].is_string() {
        refused(
            "parentCompositePodGroupName",
            "a pod group inside a composite pod group; Gantry places each PodGroup on its own",
        )
    } else if non_empty(&spec["schedulingConstraints"]["topology"]) {
        refused(
            "schedulingConstraints.topology",
            "a gang's topology constraint; Gantry prefers the smallest domain but does not require one",
        )
    } else if non_empty(&spec["resourceClaims"]) {
        refused("resourceClaims", "claims shared by a pod group")
    } else if let Some(min) = policy["gang"]["minCount"].as_u64() {
        GroupPolicy::Gang(u32::try_from(min).unwrap_or(u32::MAX).max(1))
    } else if policy.get("basic").is_some() {
        GroupPolicy::Basic
    } else {
        // The API server validates one policy; a newer release may add one not known here.
        refused(
            "schedulingPolicy",
            "a scheduling policy other than gang and basic",
        )
    }
}

/// The PodGroup condition kube-scheduler sets when a group is first placed: `PodGroupScheduled`
/// in v1alpha2 (1.36), renamed `PodGroupInitiallyScheduled` from v1alpha3 and v1beta1 (1.37).
/// Gantry writes the name of the version it reads, so `kubectl wait --for=condition=…` written
/// for that release works unchanged.
fn scheduled_condition_type(version: &str) -> &'static str {
    if version == "v1alpha2" {
        "PodGroupScheduled"
    } else {
        "PodGroupInitiallyScheduled"
    }
}

/// Dynamic Resource Allocation's API, GA since Kubernetes 1.34; the beta versions before it
/// are not read.
const DRA_VERSION: &str = "resource.k8s.io/v1";

/// How often kinds the cluster did not serve are looked for again.
const DISCOVER_EVERY: Duration = Duration::from_secs(30);

/// A small runtime for the caches and calls; the scheduling loop blocks on it.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("gantry-kube")
        .enable_all()
        .build()
        .map_err(|e| Error::Runtime(e.to_string()))
}

/// The `--kubeconfig` value that means "the pod's own service account" (in a Deployment).
pub const IN_CLUSTER: &str = "in-cluster";

/// A client from the kubeconfig at `path` (its current context), or from the pod's service
/// account when `path` is [`IN_CLUSTER`].
pub fn client(runtime: &tokio::runtime::Runtime, path: &Path) -> Result<Client> {
    client_with(runtime, path, true, None)
}

/// How long one write to the API server (a binding, an eviction, an Event, a status) may take
/// before it fails: a slow or vanished API server never holds the scheduling loop longer.
/// Watches keep the client default, since a watch is a long poll.
pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// [`client`], with kube-rs's retries of 429/503/504 on or off. Evictions turn them off: a 429
/// there is a PodDisruptionBudget's answer, and retrying it in place (Retry-After 10 s, 15
/// times) would stall the scheduling loop.
///
/// With `timeout`, every request (connect, send, read) fails after that long.
pub(crate) fn client_with(
    runtime: &tokio::runtime::Runtime,
    path: &Path,
    retry: bool,
    timeout: Option<std::time::Duration>,
) -> Result<Client> {
    let bounded = |cfg: &mut kube::Config| {
        if let Some(timeout) = timeout {
            cfg.connect_timeout = Some(timeout);
            cfg.read_timeout = Some(timeout);
            cfg.write_timeout = Some(timeout);
        }
    };
    let unreadable = |message: String| Error::Kubeconfig {
        path: path.display().to_string(),
        message,
    };
    if path == Path::new(IN_CLUSTER) {
        let mut cfg = kube::Config::incluster().map_err(|e| unreadable(e.to_string()))?;
        cfg.default_retry = retry;
        bounded(&mut cfg);
        let _guard = runtime.enter();
        return Client::try_from(cfg).map_err(|e| Error::Connect(e.to_string()));
    }
    let kubeconfig =
        kube::config::Kubeconfig::read_from(path).map_err(|e| unreadable(e.to_string()))?;
    runtime.block_on(async {
        let options = kube::config::KubeConfigOptions::default();
        let mut cfg = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(|e| unreadable(e.to_string()))?;
        cfg.default_retry = retry;
        bounded(&mut cfg);
        Client::try_from(cfg).map_err(|e| Error::Connect(e.to_string()))
    })
}

/// Starts a reflector over `api` and returns its cache.
fn reflect<K>(
    runtime: &tokio::runtime::Runtime,
    api: Api<K>,
    config: watcher::Config,
    generation: Arc<AtomicU64>,
    log: SharedLog,
    what: &'static str,
    dyntype: K::DynamicType,
) -> Store<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    let writer = reflector::store::Writer::new(dyntype);
    let reader = writer.as_reader();
    let stream = watcher(api, config)
        .default_backoff()
        // Nobody reads managedFields, and they are often the largest part of an object.
        .modify(|object: &mut K| object.managed_fields_mut().clear())
        .reflect(writer);
    runtime.spawn(async move {
        let mut stream = std::pin::pin!(stream);
        // Full lists so far: the first fills the cache; any later one means the watch could
        // not resume (the API server answered 410 Gone: it no longer had the resource version
        // the cache had reached), so the cache was rebuilt from a fresh list.
        let mut lists = 0u64;
        while let Some(event) = stream.next().await {
            generation.fetch_add(1, Ordering::Relaxed);
            {
                let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                match &event {
                    Ok(
                        watcher::Event::Apply(o)
                        | watcher::Event::Delete(o)
                        | watcher::Event::InitApply(o),
                    ) => {
                        log.keys
                            .insert((o.namespace().unwrap_or_default(), o.name_any()));
                    }
                    Ok(watcher::Event::InitDone) => log.relisted = true,
                    _ => {}
                }
            }
            match event {
                Ok(watcher::Event::Init) => {
                    lists += 1;
                    if lists > 1 {
                        tracing::info!(
                            cache = what,
                            relists = lists - 1,
                            "watch expired; relisting"
                        );
                    }
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, cache = what, "watch failed; retrying with backoff");
                }
            }
        }
    });
    reader
}

impl KubeCluster {
    /// Connects with the kubeconfig at `path` and starts the watch caches.
    pub fn connect(path: &Path, config: KubeConfig) -> Result<Self> {
        let runtime = runtime()?;
        let client = client(&runtime, path)?;
        let evict_client = client_with(&runtime, path, false, Some(CALL_TIMEOUT))?;
        let write_client = client_with(&runtime, path, true, Some(CALL_TIMEOUT))?;
        let generation = Arc::new(AtomicU64::new(0));
        let [
            node_log,
            pod_log,
            group_log,
            queue_log,
            namespace_log,
            local_queue_log,
            slice_log,
            claim_log,
            template_log,
        ] = std::array::from_fn(|_| SharedLog::default());
        let nodes = reflect(
            &runtime,
            Api::<Node>::all(client.clone()),
            watcher::Config::default(),
            generation.clone(),
            node_log.clone(),
            "nodes",
            (),
        );
        let pending = reflect(
            &runtime,
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().fields(&format!(
                "spec.schedulerName={},spec.nodeName=",
                config.scheduler_name
            )),
            generation.clone(),
            pod_log.clone(),
            "unbound pods",
            (),
        );
        let bound = reflect(
            &runtime,
            Api::<Pod>::all(client.clone()),
            watcher::Config::default()
                .fields("spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"),
            generation.clone(),
            pod_log.clone(),
            "bound pods",
            (),
        );
        let namespaces = reflect(
            &runtime,
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default(),
            generation.clone(),
            namespace_log.clone(),
            "namespaces",
            (),
        );
        let tracker = Tracker::new(config.clone(), Symbols::new());
        let mut cluster = Self {
            runtime,
            client,
            config,
            nodes,
            pending,
            bound,
            pod_groups: None,
            workload_groups: None,
            queues: None,
            namespaces,
            local_queues: None,
            dra: None,
            node_log,
            pod_log,
            group_log,
            queue_log,
            namespace_log,
            local_queue_log,
            slice_log,
            claim_log,
            template_log,
            generation,
            tracker,
            built: false,
            evicted: Vec::new(),
            leadership: None,
            last_failed: HashMap::new(),
            job_to_unestimated_reason: BTreeMap::new(),
            last_trim: Instant::now(),
            evict_client,
            write_client,
            queue_problems: Vec::new(),
            queue_status: HashMap::new(),
            queue_status_at: None,
            job_to_preemption: BTreeMap::new(),
            last_discovery: Instant::now(),
            groups_ready: false,
            queues_ready: false,
            local_queues_ready: false,
            dra_ready: false,
            gone: Vec::new(),
            unanswered: Vec::new(),
        };
        // The optional kinds: a kind the cluster does not serve is not watched (its cache
        // would never sync), and is looked for again every DISCOVER_EVERY, so a CRD installed
        // later is picked up without a restart.
        for (kind, found) in cluster.discover() {
            if !found {
                tracing::info!("{kind}");
            }
        }
        Ok(cluster)
    }

    /// Looks for the optional kinds not watched yet (scheduler-plugins' PodGroup, Gantry's
    /// Queue) and starts a cache for each the cluster now serves. A kind is absent when the
    /// API server says its group or resource is not there (404); any other answer is an error,
    /// logged and tried again next time. Returns, per kind still or newly looked for, what
    /// it means for scheduling and whether it was found.
    fn discover(&mut self) -> Vec<(&'static str, bool)> {
        self.last_discovery = Instant::now();
        let mut found = Vec::new();
        if self.pod_groups.is_none() {
            let resource = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("scheduling.x-k8s.io", "v1alpha1", "PodGroup"),
                "podgroups",
            );
            let served = self.serves("scheduling.x-k8s.io/v1alpha1", "podgroups");
            if served {
                self.pod_groups = Some(reflect(
                    &self.runtime,
                    Api::<DynamicObject>::all_with(self.client.clone(), &resource),
                    watcher::Config::default(),
                    self.generation.clone(),
                    self.group_log.clone(),
                    "pod groups",
                    resource,
                ));
            }
            found.push((
                if served {
                    "scheduling.x-k8s.io/v1alpha1 PodGroup found: gangs follow their PodGroups"
                } else {
                    "no scheduling.x-k8s.io/v1alpha1 PodGroup in this cluster (yet): gangs come from Gantry's labels"
                },
                served,
            ));
        }
        if self.workload_groups.is_none() {
            let version = WORKLOAD_VERSIONS
                .into_iter()
                .find(|v| self.serves(&format!("{WORKLOAD_GROUP}/{v}"), "podgroups"));
            if let Some(version) = version {
                let resource = ApiResource::from_gvk_with_plural(
                    &GroupVersionKind::gvk(WORKLOAD_GROUP, version, "PodGroup"),
                    "podgroups",
                );
                let store = reflect(
                    &self.runtime,
                    Api::<DynamicObject>::all_with(self.client.clone(), &resource),
                    watcher::Config::default(),
                    self.generation.clone(),
                    self.group_log.clone(),
                    "workload pod groups",
                    resource.clone(),
                );
                self.workload_groups = Some((store, resource));
            }
            found.push((
                if version.is_some() {
                    "scheduling.k8s.io PodGroup found: pods naming one in spec.schedulingGroup follow its gang policy"
                } else {
                    "no scheduling.k8s.io PodGroup in this cluster (yet; the GenericWorkload feature gate): spec.schedulingGroup is not read"
                },
                version.is_some(),
            ));
        }
        if self.queues.is_none() {
            let resource = crate::queues::resource();
            let served = self.serves("gantry.dev/v1alpha1", "queues");
            if served {
                self.queues = Some(reflect(
                    &self.runtime,
                    Api::<DynamicObject>::all_with(self.client.clone(), &resource),
                    watcher::Config::default(),
                    self.generation.clone(),
                    self.queue_log.clone(),
                    "queues",
                    resource,
                ));
            }
            found.push((
                if served {
                    "gantry.dev/v1alpha1 Queue found: its quotas apply"
                } else {
                    "no gantry.dev/v1alpha1 Queue in this cluster (yet): every queue may use the whole cluster"
                },
                served,
            ));
        }
        if self.local_queues.is_none() {
            let version = KUEUE_VERSIONS
                .into_iter()
                .find(|v| self.serves(&format!("{KUEUE_GROUP}/{v}"), "localqueues"));
            if let Some(version) = version {
                let resource = ApiResource::from_gvk_with_plural(
                    &GroupVersionKind::gvk(KUEUE_GROUP, version, "LocalQueue"),
                    "localqueues",
                );
                self.local_queues = Some(reflect(
                    &self.runtime,
                    Api::<DynamicObject>::all_with(self.client.clone(), &resource),
                    watcher::Config::default(),
                    self.generation.clone(),
                    self.local_queue_log.clone(),
                    "local queues",
                    resource,
                ));
            }
            found.push((
                if version.is_some() {
                    "kueue.x-k8s.io LocalQueue found: kueue.x-k8s.io/queue-name names a LocalQueue in the pod's namespace"
                } else {
                    "no kueue.x-k8s.io LocalQueue in this cluster (yet): while Queues are declared, pods labelled kueue.x-k8s.io/queue-name are refused"
                },
                version.is_some(),
            ));
        }
        if self.dra.is_none() {
            let served = [
                "resourceslices",
                "deviceclasses",
                "resourceclaims",
                "resourceclaimtemplates",
            ]
            .iter()
            .all(|plural| self.serves(DRA_VERSION, plural));
            if served {
                let client = &self.client;
                let slices = reflect(
                    &self.runtime,
                    Api::<ResourceSlice>::all(client.clone()),
                    watcher::Config::default(),
                    self.generation.clone(),
                    self.slice_log.clone(),
                    "resource slices",
                    (),
                );
                let classes = reflect(
                    &self.runtime,
                    Api::<DeviceClass>::all(client.clone()),
                    watcher::Config::default(),
                    self.generation.clone(),
                    self.slice_log.clone(),
                    "device classes",
                    (),
                );
                let claims = reflect(
                    &self.runtime,
                    Api::<ResourceClaim>::all(client.clone()),
                    watcher::Config::default(),
                    self.generation.clone(),
                    self.claim_log.clone(),
                    "resource claims",
                    (),
                );
                let templates = reflect(
                    &self.runtime,
                    Api::<ResourceClaimTemplate>::all(client.clone()),
                    watcher::Config::default(),
                    self.generation.clone(),
                    self.template_log.clone(),
                    "resource claim templates",
                    (),
                );
                self.dra = Some(DraStores {
                    slices,
                    classes,
                    claims,
                    templates,
                });
            }
            found.push((
                if served {
                    "resource.k8s.io/v1 found: GPUs published in ResourceSlices count, and pods' ResourceClaims are allocated at bind"
                } else {
                    "no resource.k8s.io/v1 in this cluster (yet): pods with spec.resourceClaims wait"
                },
                served,
            ));
        }
        found
    }

    /// Whether the API server serves `plural` in `group_version`: `false` when it says the
    /// group is not there (404) or lists it without the resource; an error is logged and
    /// counts as not yet.
    fn serves(&self, group_version: &str, plural: &str) -> bool {
        let answer = self
            .runtime
            .block_on(self.write_client.list_api_group_resources(group_version));
        match answer {
            Ok(list) => list.resources.iter().any(|r| r.name == plural),
            Err(kube::Error::Api(status)) if status.code == 404 => false,
            Err(error) => {
                tracing::warn!(%group_version, %error, "API discovery failed; trying again later");
                false
            }
        }
    }

    /// Uses `symbols` for the names the scheduler interns (the scheduler's own table).
    pub fn with_symbols(mut self, symbols: Arc<Symbols>) -> Self {
        self.tracker = Tracker::new(self.config.clone(), symbols);
        self
    }

    /// Waits until every cache holds a full list. Schedule nothing before: a half-filled
    /// bound-pod cache would make used GPUs look free.
    pub fn wait_synced(&self, timeout: Duration) -> Result<()> {
        self.runtime.block_on(async {
            let all = async {
                let _ = self.nodes.wait_until_ready().await;
                let _ = self.pending.wait_until_ready().await;
                let _ = self.bound.wait_until_ready().await;
                if let Some(groups) = &self.pod_groups {
                    let _ = groups.wait_until_ready().await;
                }
                if let Some((groups, _)) = &self.workload_groups {
                    let _ = groups.wait_until_ready().await;
                }
                if let Some(queues) = &self.queues {
                    let _ = queues.wait_until_ready().await;
                }
                let _ = self.namespaces.wait_until_ready().await;
                if let Some(local_queues) = &self.local_queues {
                    let _ = local_queues.wait_until_ready().await;
                }
                if let Some(dra) = &self.dra {
                    let _ = dra.slices.wait_until_ready().await;
                    let _ = dra.classes.wait_until_ready().await;
                    let _ = dra.claims.wait_until_ready().await;
                    let _ = dra.templates.wait_until_ready().await;
                }
            };
            tokio::time::timeout(timeout, all)
                .await
                .map_err(|_| Error::SyncTimeout(timeout.as_secs()))
        })
    }

    /// Counts watch events; equal values mean the caches have not changed.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Nodes in the cache.
    pub fn node_count(&self) -> usize {
        self.nodes.state().len()
    }

    /// Starts leader election on this cluster's runtime and client (see [`crate::leader`]);
    /// from then on every write checks the Lease first.
    pub fn leader_elect(&mut self, settings: crate::LeaderSettings) -> Arc<Leadership> {
        let leadership = crate::leader::start(&self.runtime, self.client.clone(), settings);
        self.leadership = Some(leadership.clone());
        leadership
    }

    /// Stops leader election and releases the Lease if held, so a successor starts at once.
    pub fn resign(&self) {
        if let Some(leadership) = &self.leadership {
            self.runtime
                .block_on(crate::leader::resign(self.client.clone(), leadership));
        }
    }

    /// Reads back the pods whose binding went unanswered. One bound where it was sent stays
    /// as it is (the bound cache will show it) and gets the Scheduled Event its binding did
    /// not; one not bound there, or gone, is judged by the caches at this sync instead of when
    /// its assumption runs out; one that still cannot be read is kept for the next sync.
    fn read_back_unanswered(&mut self) {
        if self.unanswered.is_empty() {
            return;
        }
        let client = &self.write_client;
        let results: Vec<(PendingPod, String, kube::Result<Option<Pod>>)> = self.runtime.block_on(
            futures::stream::iter(std::mem::take(&mut self.unanswered))
                .map(|(pod, node)| async move {
                    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
                    let current = api.get_opt(&pod.name).await;
                    (pod, node, current)
                })
                .buffer_unordered(CONCURRENCY)
                .collect(),
        );
        let mut scheduled: Vec<(PendingPod, String)> = Vec::new();
        for (pod, node, current) in results {
            match read_back(&pod, &node, current) {
                ReadBack::Unread => self.unanswered.push((pod, node)),
                ReadBack::Applied => {
                    tracing::info!(pod = %pod.key(), %node, "binder: the unanswered binding was applied");
                    scheduled.push((pod, node));
                }
                ReadBack::NotApplied => {
                    tracing::info!(pod = %pod.key(), %node, "binder: the unanswered binding was not applied; the pod is pending again");
                    self.tracker
                        .unassume(&(pod.namespace.clone(), pod.name.clone()));
                }
            }
        }
        self.post_scheduled_events(scheduled);
    }

    /// Posts a Scheduled Event for each pod bound to its node, in the background, a few at a
    /// time, like kube-scheduler's event broadcaster: the next cycle's bindings never wait for
    /// this cycle's Events, and a burst of Events never crowds bindings out of the API server.
    fn post_scheduled_events(&self, scheduled: Vec<(PendingPod, String)>) {
        if scheduled.is_empty() {
            return;
        }
        let client = self.write_client.clone();
        self.runtime.spawn(async move {
            futures::stream::iter(scheduled)
                .for_each_concurrent(EVENT_CONCURRENCY, |(pod, node)| {
                    let client = client.clone();
                    async move {
                        let note = format!("Successfully assigned {} to {node}", pod.key());
                        if let Err(e) =
                            event(&client, &pod, "Normal", "Scheduled", "Binding", &note).await
                        {
                            tracing::warn!(pod = %pod.key(), error = %e, "cannot post the Scheduled event");
                        }
                    }
                })
                .await;
        });
    }

    /// Whether this replica may write now: no election, or it holds the Lease.
    fn may_write(&self) -> bool {
        self.leadership.as_ref().is_none_or(|l| l.is_leader())
    }

    /// Reads the Queue objects again, logging each new problem once.
    fn refresh_queues(&mut self, scheduler: &mut Scheduler) {
        let (declared, left_out) = match &self.queues {
            Some(store) => crate::queues::check(&store.state()),
            None => (Vec::new(), Vec::new()),
        };
        let problems: Vec<String> = left_out.iter().map(|(_, p)| p.clone()).collect();
        for problem in problems.iter().filter(|p| !self.queue_problems.contains(p)) {
            tracing::warn!(%problem, "Queue left out");
        }
        self.queue_problems = problems;
        self.tracker
            .queues_changed(scheduler, declared, &left_out.into_iter().collect());
    }

    /// Applies the namespaces the cache changed (all of them after a list).
    fn refresh_namespaces(&mut self, log: ChangeLog) {
        let labels = |ns: &Namespace| ns.metadata.labels.clone().unwrap_or_default();
        if log.relisted {
            let all = self
                .namespaces
                .state()
                .iter()
                .map(|ns| (ns.name_any(), labels(ns)))
                .collect();
            self.tracker.namespaces_listed(all);
            return;
        }
        for (_, name) in log.keys {
            let namespace = self.namespaces.get(&ObjectRef::new(&name));
            self.tracker
                .namespace_changed(&name, namespace.as_deref().map(labels));
        }
    }

    /// Reads the LocalQueues' `spec.clusterQueue` again (a LocalQueue cache counts once it
    /// holds a full list).
    fn refresh_local_queues(&mut self) {
        let served = self.local_queues.is_some() && self.local_queues_ready;
        let all: HashMap<PodKey, String> = self
            .local_queues
            .iter()
            .filter(|_| served)
            .flat_map(|store| store.state())
            .filter_map(|local| {
                let cluster_queue = local
                    .data
                    .get("spec")
                    .and_then(|s| s.get("clusterQueue"))
                    .and_then(|q| q.as_str())
                    .unwrap_or_default();
                Some((
                    (
                        local.metadata.namespace.clone()?,
                        local.metadata.name.clone()?,
                    ),
                    cluster_queue.to_string(),
                ))
            })
            .collect();
        self.tracker.local_queues_changed(served, all);
    }

    /// Reads the PodGroups' `minMember` again.
    fn refresh_groups(&mut self) {
        let group_to_min: HashMap<PodKey, u32> = self
            .pod_groups
            .iter()
            .flat_map(|store| store.state())
            .filter_map(|group| {
                let min = group.data.get("spec")?.get("minMember")?.as_u64()?;
                Some((
                    (
                        group.metadata.namespace.clone()?,
                        group.metadata.name.clone()?,
                    ),
                    u32::try_from(min).ok()?,
                ))
            })
            .collect();
        self.tracker.pod_groups_changed(group_to_min);
        let group_to_policy: HashMap<PodKey, GroupPolicy> = self
            .workload_groups
            .iter()
            .flat_map(|(store, _)| store.state())
            .filter_map(|group| {
                let key = (
                    group.metadata.namespace.clone()?,
                    group.metadata.name.clone()?,
                );
                let policy = workload_group_policy(&key, &group.data["spec"]);
                Some((key, policy))
            })
            .collect();
        self.tracker.workload_groups_changed(group_to_policy);
    }

    /// Writes each upstream PodGroup's scheduled condition ([`scheduled_condition_type`]) as
    /// kube-scheduler does:
    /// True ("Scheduled") once its pods are bound, False ("Unschedulable", with the pods'
    /// FailedScheduling message) while they wait; never back to False once True (extra pods
    /// do not unschedule a group), and only when it changed.
    fn write_pod_group_conditions(&mut self, group_to_outcome: BTreeMap<PodKey, (bool, String)>) {
        let Some((store, resource)) = &self.workload_groups else {
            return;
        };
        if group_to_outcome.is_empty() || !self.may_write() {
            return;
        }
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let condition_type = scheduled_condition_type(&resource.version);
        let mut patches = Vec::new();
        for ((namespace, name), (scheduled, message)) in group_to_outcome {
            let Some(group) =
                store.get(&ObjectRef::new_with(&name, resource.clone()).within(&namespace))
            else {
                continue;
            };
            let conditions = group.data["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let existing = conditions.iter().find(|c| c["type"] == condition_type);
            if existing.is_some_and(|c| c["status"] == "True") && !scheduled {
                continue;
            }
            let (status, reason) = if scheduled {
                ("True", "Scheduled")
            } else {
                ("False", "Unschedulable")
            };
            let generation = group.metadata.generation.unwrap_or_default();
            if existing.is_some_and(|c| {
                c["status"] == status
                    && c["reason"] == reason
                    && c["message"] == message.as_str()
                    && c["observedGeneration"] == generation
            }) {
                continue;
            }
            let since = match existing {
                Some(c) if c["status"] == status => c["lastTransitionTime"].clone(),
                _ => serde_json::Value::from(now.as_str()),
            };
            let mut list: Vec<serde_json::Value> = conditions
                .iter()
                .filter(|c| c["type"] != condition_type)
                .cloned()
                .collect();
            list.push(serde_json::json!({
                "type": condition_type,
                "status": status,
                "reason": reason,
                "message": message,
                "observedGeneration": generation,
                "lastTransitionTime": since,
            }));
            patches.push((namespace, name, list));
        }
        let client = &self.write_client;
        let leadership = self.leadership.as_deref();
        self.runtime
            .block_on(futures::stream::iter(patches).for_each_concurrent(
                CONCURRENCY,
                |(namespace, name, conditions)| async move {
                    if leadership.is_some_and(|l| !l.is_leader()) {
                        return;
                    }
                    let api: Api<DynamicObject> =
                        Api::namespaced_with(client.clone(), &namespace, resource);
                    let patch = serde_json::json!({"status": {"conditions": conditions}});
                    match api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
                        .await
                    {
                        Ok(_) => {}
                        // Deleted meanwhile: nothing left to report on.
                        Err(kube::Error::Api(status)) if status.code == 404 => {}
                        Err(error) => tracing::warn!(
                            group = %format!("{namespace}/{name}"), %error,
                            "cannot set {condition_type}"
                        ),
                    }
                },
            ));
    }

    /// Writes each Queue's status when it changed: the GPUs its running jobs hold and its
    /// pending jobs, after the cycle on `scheduler`, or why the scheduler left it out.
    pub fn report_queues(&mut self, scheduler: &gantry_core::Scheduler) {
        let Some(store) = &self.queues else {
            return;
        };
        if self
            .queue_status_at
            .is_some_and(|at| at.elapsed() < QUEUE_STATUS_EVERY)
        {
            return;
        }
        self.queue_status_at = Some(Instant::now());
        let mut pending: HashMap<&str, u32> = HashMap::new();
        for id in scheduler.pending() {
            *pending
                .entry(scheduler.queues.name(scheduler.job(id).queue))
                .or_default() += 1;
        }
        let mut changed: Vec<(String, serde_json::Value)> = Vec::new();
        for object in store.state() {
            let name = object.name_any();
            let prefix = format!("queue {name}:");
            let status = match self.queue_problems.iter().find(|p| p.starts_with(&prefix)) {
                Some(problem) => {
                    serde_json::json!({"problem": problem, "usedGpus": null, "pendingJobs": null})
                }
                None => match scheduler.queues.id(&name) {
                    Some(id) => serde_json::json!({
                        "usedGpus": scheduler.queues.used(id).gpus,
                        "pendingJobs": pending.get(name.as_str()).copied().unwrap_or(0),
                        "problem": null,
                    }),
                    None => continue,
                },
            };
            if self.queue_status.get(&name) != Some(&status) {
                changed.push((name, status));
            }
        }
        let api: Api<DynamicObject> =
            Api::all_with(self.write_client.clone(), &crate::queues::resource());
        let results = self
            .runtime
            .block_on(futures::future::join_all(changed.iter().map(
                |(name, status)| {
                    let patch = serde_json::json!({ "status": status });
                    let api = api.clone();
                    async move {
                        api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
                            .await
                    }
                },
            )));
        for ((name, status), result) in changed.into_iter().zip(results) {
            match result {
                Ok(_) => {
                    self.queue_status.insert(name, status);
                }
                Err(error) => {
                    tracing::warn!(queue = %name, %error, "cannot write the Queue status")
                }
            }
        }
    }

    /// The Queue objects left out of the queue tree, one line each.
    pub fn queue_problems(&self) -> &[String] {
        &self.queue_problems
    }

    /// The cycle's preemptions: evicts each preemptor's victims through the Eviction API and
    /// nominates the preemptor's nodes instead of binding (victims hold their GPUs until they
    /// are gone). Returns the outcome per preemptor and the nodes victims are leaving.
    fn preempt(
        &mut self,
        scheduler: &Scheduler,
        output: &CycleOutput,
        outcomes: &mut Vec<BindOutcome>,
    ) -> HashSet<usize> {
        let mut victim_nodes = HashSet::new();
        self.evicted.extend_from_slice(&output.evicted);
        for decision in output
            .decisions
            .iter()
            .filter(|d| d.placed && !d.victims.is_empty())
        {
            let victims: Vec<(PendingPod, usize)> = decision
                .victims
                .iter()
                .flat_map(|&v| self.tracker.running_pods(v))
                .collect();
            victim_nodes.extend(victims.iter().map(|(_, node)| *node));
            if !self.may_write() {
                outcomes.push(BindOutcome::Failed {
                    job: decision.job,
                    reason: NOT_LEADER.into(),
                });
                continue;
            }
            let names = self.tracker.node_names();
            let nominated: Vec<(PendingPod, String)> = self
                .tracker
                .pods_of(decision.job)
                .into_iter()
                .zip(scheduler.slots(decision.job))
                .map(|(pod, slot)| (pod, names[slot.node as usize].clone()))
                .collect();
            tracing::info!(
                preemptor = %decision.explanation.job,
                victims = ?victims.iter().map(|(p, _)| p.key()).collect::<Vec<_>>(),
                "preempting"
            );
            let victim_keys: BTreeSet<PodKey> = victims
                .iter()
                .map(|(p, _)| (p.namespace.clone(), p.name.clone()))
                .collect();
            let victims: Vec<PendingPod> = victims.into_iter().map(|(p, _)| p).collect();
            let preemption =
                self.runtime
                    .block_on(crate::evict::start(&self.evict_client, victims, nominated));
            self.tracker.nominate(decision.job, victim_keys);
            outcomes.push(BindOutcome::Nominated {
                job: decision.job,
                waiting_for: preemption.reason(),
            });
            self.job_to_preemption.insert(decision.job, preemption);
        }
        // Preemptions the tracker let go of (victims gone, preemptor gone or timed out) are
        // over; blocked evictions of the rest are tried again.
        let nominated = self.tracker.nominated();
        self.job_to_preemption.retain(|job, preemption| {
            let Some(n) = nominated.get(job) else {
                return false;
            };
            preemption
                .retain_victims(|p| n.victims.contains(&(p.namespace.clone(), p.name.clone())));
            true
        });
        if self.may_write() {
            self.runtime.block_on(crate::evict::retry_blocked(
                &self.evict_client,
                &mut self.job_to_preemption,
            ));
        }
        victim_nodes
    }

    /// Binds the cycle's placed jobs (those not preempting). A gang binds whole or not at all:
    /// when a member's binding fails, the members already bound are deleted, and the job
    /// fails with the API server's message.
    fn bind_placed(
        &mut self,
        scheduler: &Scheduler,
        output: &CycleOutput,
        victim_nodes: &HashSet<usize>,
        outcomes: &mut Vec<BindOutcome>,
        failed: &mut Vec<(PendingPod, String)>,
    ) {
        let mut binds: Vec<(JobId, PendingPod, usize)> = Vec::new();
        for decision in output
            .decisions
            .iter()
            .filter(|d| d.placed && d.victims.is_empty())
        {
            let slots = scheduler.slots(decision.job);
            let pods = self.tracker.pods_of(decision.job);
            let reason = if slots
                .iter()
                .any(|s| victim_nodes.contains(&(s.node as usize)))
            {
                // Its room is still held by pods this cycle is evicting.
                Some("its nodes are still held by pods being preempted".to_string())
            } else if pods.len() != slots.len() {
                Some(format!(
                    "it has {} pods, not the {} placed",
                    pods.len(),
                    slots.len()
                ))
            } else if !self.may_write() {
                Some(NOT_LEADER.to_string())
            } else {
                None
            };
            match reason {
                Some(reason) => outcomes.push(BindOutcome::Failed {
                    job: decision.job,
                    reason,
                }),
                None => binds.extend(
                    pods.into_iter()
                        .zip(slots)
                        .map(|(pod, slot)| (decision.job, pod, slot.node as usize)),
                ),
            }
        }
        let (binds, mut job_to_claim_writes) = self.allocate_claims(binds, outcomes, failed);
        if binds.is_empty() {
            return;
        }
        let client = &self.write_client;
        let names = self.tracker.node_names();
        let leadership = self.leadership.as_deref();
        let results: Vec<(JobId, PendingPod, usize, Result<Bound>)> = self.runtime.block_on(
            futures::stream::iter(binds)
                .map(|(job, pod, node)| async move {
                    // The Lease is checked before each binding, not once per cycle.
                    let result = if leadership.is_some_and(|l| !l.is_leader()) {
                        Err(Error::NotLeader)
                    } else {
                        bind(client, &pod, &names[node]).await
                    };
                    (job, pod, node, result)
                })
                .buffer_unordered(CONCURRENCY)
                .collect(),
        );
        // Per job: its pods bound (and how), and its first failure.
        type JobResult = (Vec<(PendingPod, usize, Bound)>, Option<String>);
        let mut job_to_result: BTreeMap<JobId, JobResult> = BTreeMap::new();
        for (job, pod, node, result) in results {
            let entry = job_to_result.entry(job).or_default();
            match result {
                Ok(how) => {
                    if how == Bound::Unanswered {
                        let name = self.tracker.node_names()[node].clone();
                        tracing::warn!(
                            pod = %pod.key(),
                            node = %name,
                            "binder: the binding went out but no answer came back, and the pod \
                             could not be read back; it counts as bound until it can be"
                        );
                        self.unanswered.push((pod.clone(), name));
                    }
                    entry.0.push((pod, node, how));
                }
                Err(error) => {
                    tracing::warn!(%error, "binder");
                    entry.1.get_or_insert_with(|| error.to_string());
                }
            }
        }
        let mut scheduled: Vec<(PendingPod, String)> = Vec::new();
        let mut rollback: Vec<PendingPod> = Vec::new();
        let mut group_to_outcome: BTreeMap<PodKey, (bool, String)> = BTreeMap::new();
        // The claim writes of jobs that did not bind, to take back.
        let mut claims_back: Vec<ClaimWrite> = Vec::new();
        for (job, (bound, failure)) in job_to_result {
            match failure {
                None => {
                    scheduled.extend(
                        bound.iter().filter(|(_, _, how)| *how == Bound::Now).map(
                            |(p, node, _)| (p.clone(), self.tracker.node_names()[*node].clone()),
                        ),
                    );
                    let bound: Vec<(PendingPod, usize)> =
                        bound.into_iter().map(|(p, node, _)| (p, node)).collect();
                    for (pod, _) in &bound {
                        let key = (pod.namespace.clone(), pod.name.clone());
                        if let Some(group) = self.tracker.workload_group_of(&key) {
                            group_to_outcome.insert(group, (true, String::new()));
                        }
                    }
                    self.tracker.bound(job, &bound);
                    outcomes.push(BindOutcome::Bound { job });
                }
                Some(reason) => {
                    let message = if bound.is_empty() {
                        format!("Binding failed: {reason}")
                    } else {
                        format!(
                            "Binding failed: {reason}; the {} members bound already were deleted so the gang starts whole",
                            bound.len()
                        )
                    };
                    failed.extend(
                        self.tracker
                            .pods_of(job)
                            .into_iter()
                            .map(|p| (p, message.clone())),
                    );
                    // A member whose binding went unanswered is not deleted: it may be
                    // pending still, and deleting a pending pod loses it. If it was bound,
                    // the caches show it, and its gang is adopted as it runs.
                    rollback.extend(
                        bound
                            .into_iter()
                            .filter(|(_, _, how)| *how != Bound::Unanswered)
                            .map(|(p, _, _)| p),
                    );
                    claims_back.extend(job_to_claim_writes.remove(&job).unwrap_or_default());
                    outcomes.push(BindOutcome::Failed { job, reason });
                }
            }
        }
        if !rollback.is_empty() {
            let client = &self.write_client;
            self.runtime
                .block_on(futures::stream::iter(rollback).for_each_concurrent(
                CONCURRENCY,
                |pod| async move {
                    if let Err(error) = delete(client, &pod).await {
                        tracing::warn!(pod = %pod.key(), %error, "cannot roll back a gang member");
                    }
                },
            ));
        }
        self.undo_claims(claims_back);
        self.write_pod_group_conditions(group_to_outcome);
        self.post_scheduled_events(scheduled);
    }

    /// Says why pods wait, the way kube-scheduler does: a FailedScheduling Event when the
    /// reason changed, and the PodScheduled condition. A job the cycle did not try says it
    /// again when its first start estimate comes.
    fn report_waiting(
        &mut self,
        scheduler: &Scheduler,
        output: &CycleOutput,
        failed: Vec<(PendingPod, String)>,
    ) {
        let mut waiting = failed;
        // Each waiting job's message, for all of its pods.
        let mut job_messages: Vec<(JobId, String)> = Vec::new();
        for decision in &output.decisions {
            let job = decision.job;
            let estimate = decision.explanation.estimate.as_ref();
            if decision.placed || estimate.is_some() {
                self.job_to_unestimated_reason.remove(&job);
            }
            if decision.placed {
                continue;
            }
            let reason = decision.explanation.summary();
            if estimate.is_none() {
                self.job_to_unestimated_reason.insert(job, reason.clone());
            }
            job_messages.push((job, self.waiting_message(job, reason, estimate)));
        }
        for &job in &output.newly_estimated {
            if let Some(estimate) = scheduler.start_estimate(job)
                && let Some(reason) = self.job_to_unestimated_reason.remove(&job)
            {
                job_messages.push((job, self.waiting_message(job, reason, Some(estimate))));
            }
        }
        for (job, message) in job_messages {
            waiting.extend(
                self.tracker
                    .pods_of(job)
                    .into_iter()
                    .map(|p| (p, message.clone())),
            );
        }
        waiting.extend(self.tracker.waiting());
        for preemption in self.job_to_preemption.values() {
            let reason = preemption.reason();
            waiting.extend(preemption.pods().map(|p| (p.clone(), reason.clone())));
        }
        let mut group_to_outcome: BTreeMap<PodKey, (bool, String)> = BTreeMap::new();
        for (pod, message) in &waiting {
            let key = (pod.namespace.clone(), pod.name.clone());
            if let Some(group) = self.tracker.workload_group_of(&key) {
                group_to_outcome
                    .entry(group)
                    .or_insert_with(|| (false, message.clone()));
            }
        }
        self.write_pod_group_conditions(group_to_outcome);
        if self.last_trim.elapsed() >= TRIM_EVERY {
            // Forget pods that are no longer waiting, so the map stays as small as the queue.
            let pending = self.tracker.pending_uids();
            self.last_failed.retain(|uid, _| pending.contains(uid));
            let tracker = &self.tracker;
            self.job_to_unestimated_reason
                .retain(|&job, _| !tracker.pods_of(job).is_empty());
            self.last_trim = Instant::now();
        }
        let to_report: Vec<(PendingPod, String, bool)> = waiting
            .into_iter()
            .filter_map(|(pod, message)| {
                let event = self.last_failed.get(&pod.uid) != Some(&message);
                let wanted = Some(("False".into(), "Unschedulable".into(), message.clone()));
                let condition = pod.scheduled_condition != wanted;
                (event || condition).then_some((pod, message, event))
            })
            .collect();
        if to_report.is_empty() || !self.may_write() {
            return;
        }
        let client = &self.write_client;
        let results: Vec<(String, String, std::result::Result<(), String>)> =
            self.runtime.block_on(
                futures::stream::iter(to_report)
                    .map(|(pod, message, post_event)| async move {
                        let result = report_unschedulable(client, &pod, &message, post_event).await;
                        (pod.uid, message, result)
                    })
                    .buffer_unordered(CONCURRENCY)
                    .collect(),
            );
        for (uid, message, result) in results {
            match result {
                Ok(()) => {
                    self.last_failed.insert(uid, message);
                }
                Err(error) => tracing::warn!(%error, "binder"),
            }
        }
    }

    /// A waiting job's FailedScheduling message: why it waits, when it is expected to start,
    /// and any warning about its pods.
    fn waiting_message(
        &self,
        job: JobId,
        reason: String,
        estimate: Option<&gantry_core::StartEstimate>,
    ) -> String {
        let mut message = reason;
        if let Some(estimate) = estimate {
            message.push_str(&format!(" {}", estimate_sentence(estimate)));
        }
        if let Some(warning) = self.tracker.warning_of(job) {
            message.push_str(&format!(" Warning: {warning}."));
        }
        message
    }
}

/// Whether `pod` names DRA claims.
fn names_claims(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|c| !c.is_empty())
}

/// The claim writes that give `pods` (one job's, each with its node) their devices, and the
/// devices they take; `in_use` holds what every allocated claim and the jobs before this one
/// in the pass hold. All or nothing: the error names the pod and why.
fn plan_claims(
    view: &crate::claims::DraView,
    names: &[String],
    pods: &[(PendingPod, usize)],
    in_use: &BTreeSet<crate::dra::DeviceId>,
) -> std::result::Result<(Vec<ClaimWrite>, BTreeSet<crate::dra::DeviceId>), String> {
    let mut writes = Vec::new();
    let mut taken: BTreeSet<crate::dra::DeviceId> = BTreeSet::new();
    for (pod, node) in pods {
        let node = &names[*node];
        let claims = view
            .resolve(&pod.pod)
            .map_err(|e| format!("pod {}: {e}", pod.key()))?;
        let reservation =
            serde_json::json!([{"resource": "pods", "name": pod.name, "uid": pod.uid}]);
        let version = |c: &crate::claims::PodClaim| c.object.metadata.resource_version.clone();
        let mut fresh = Vec::new();
        for c in claims {
            if !c.allocated() {
                fresh.push(c);
                continue;
            }
            let at = view.allocated_node(&c.object);
            if at.as_deref() != Some(node.as_str()) {
                return Err(format!(
                    "pod {}: ResourceClaim {}/{} is allocated on node {}, not on {node}",
                    pod.key(),
                    c.key.0,
                    c.key.1,
                    at.as_deref().unwrap_or("(a node without slices)")
                ));
            }
            if !c.reserved_for().contains(&pod.uid.as_str()) {
                writes.push(ClaimWrite {
                    patch: serde_json::json!({
                        "metadata": {"resourceVersion": version(&c)},
                        "status": {"reservedFor": reservation},
                    }),
                    undo: serde_json::json!({"status": {"reservedFor": null}}),
                    key: c.key,
                });
            }
        }
        if fresh.is_empty() {
            continue;
        }
        let busy: BTreeSet<crate::dra::DeviceId> = in_use.union(&taken).cloned().collect();
        let wanted: Vec<crate::dra::Claim> = fresh.iter().map(|c| c.claim.clone()).collect();
        let allocation = view.allocate(node, &wanted, &busy).map_err(|e| {
            format!(
                "pod {}: cannot allocate its ResourceClaims on node {node}: {e}",
                pod.key()
            )
        })?;
        for (c, got) in fresh.into_iter().zip(allocation.claims) {
            taken.extend(got.devices.iter().map(|(_, d)| d.clone()));
            writes.push(ClaimWrite {
                patch: serde_json::json!({
                    "metadata": {"resourceVersion": version(&c)},
                    "status": {"allocation": got.result, "reservedFor": reservation},
                }),
                undo: serde_json::json!({"status": {"allocation": null, "reservedFor": null}}),
                key: c.key,
            });
        }
    }
    Ok((writes, taken))
}

/// Merge-patches a claim's status: the claim as written, or the API server's refusal as text
/// naming the claim.
async fn patch_claim(
    client: &Client,
    leadership: Option<&Leadership>,
    key: &PodKey,
    patch: &serde_json::Value,
) -> std::result::Result<ResourceClaim, String> {
    // The Lease is checked before each write, not once per pass.
    if leadership.is_some_and(|l| !l.is_leader()) {
        return Err(NOT_LEADER.to_string());
    }
    Api::<ResourceClaim>::namespaced(client.clone(), &key.0)
        .patch_status(&key.1, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(|e| {
            format!(
                "cannot write the status of ResourceClaim {}/{}: {e}",
                key.0, key.1
            )
        })
}

impl KubeCluster {
    /// Applies what the DRA caches changed to the tracker's view, once they hold full lists.
    /// Returns whether a node's GPU count changed (the node table is rebuilt).
    fn refresh_dra(&mut self, slices: ChangeLog, claims: ChangeLog, templates: ChangeLog) -> bool {
        let Some(stores) = &self.dra else {
            return false;
        };
        let first = !self.dra_ready;
        if first {
            // A kind found after start is still listing: until every cache holds a full list,
            // pods with claims wait (as if DRA were not served).
            let ready = stores.slices.wait_until_ready().now_or_never().is_some()
                && stores.classes.wait_until_ready().now_or_never().is_some()
                && stores.claims.wait_until_ready().now_or_never().is_some()
                && stores.templates.wait_until_ready().now_or_never().is_some();
            if !ready {
                return false;
            }
            self.dra_ready = true;
        }
        let view = self.tracker.dra_mut();
        view.served = true;
        let mut moved = false;
        let slices_changed = first || slices.relisted || !slices.keys.is_empty();
        if slices_changed {
            let all: Vec<ResourceSlice> = stores
                .slices
                .state()
                .iter()
                .map(|s| (**s).clone())
                .collect();
            moved = view.set_slices(&all);
            view.set_classes(
                stores
                    .classes
                    .state()
                    .iter()
                    .map(|c| (**c).clone())
                    .collect(),
            );
        }
        if first || claims.relisted {
            view.set_claims(
                stores
                    .claims
                    .state()
                    .into_iter()
                    .map(|c| ((c.namespace().unwrap_or_default(), c.name_any()), c))
                    .collect(),
            );
        } else {
            for (namespace, name) in &claims.keys {
                let claim = stores.claims.get(&ObjectRef::new(name).within(namespace));
                view.set_claim((namespace.clone(), name.clone()), claim);
            }
        }
        if first || templates.relisted {
            view.set_templates(
                stores
                    .templates
                    .state()
                    .into_iter()
                    .map(|t| ((t.namespace().unwrap_or_default(), t.name_any()), t))
                    .collect(),
            );
        } else {
            for (namespace, name) in &templates.keys {
                let template = stores
                    .templates
                    .get(&ObjectRef::new(name).within(namespace));
                view.set_template((namespace.clone(), name.clone()), template);
            }
        }
        if slices_changed
            || claims.relisted
            || templates.relisted
            || !claims.keys.is_empty()
            || !templates.keys.is_empty()
        {
            self.tracker.claims_changed();
        }
        moved
    }

    /// Takes the pods gone since the last pass out of the `reservedFor` of the claims they
    /// held, and clears a claim's `allocation` once nobody is left. kube-controller-manager's
    /// resource claim controller does this in a full cluster; where none runs, the devices
    /// would stay taken forever. Doing it here as well is harmless: each write names the
    /// version it read, so it applies once, and a claim already released is not written.
    fn release_claims(&mut self) {
        if self.gone.is_empty() {
            return;
        }
        let gone = std::mem::take(&mut self.gone);
        if !self.may_write() {
            // The leader releases them.
            return;
        }
        let mut patches: Vec<((String, String), PodKey, serde_json::Value)> = Vec::new();
        for (namespace, uid) in gone {
            for (key, claim) in self.tracker.dra().reserved_for(&namespace, &uid) {
                let rest: Vec<_> = claim
                    .status
                    .iter()
                    .flat_map(|s| s.reserved_for.iter().flatten())
                    .filter(|r| r.uid != uid)
                    .cloned()
                    .collect();
                let status = if rest.is_empty() {
                    serde_json::json!({"reservedFor": null, "allocation": null})
                } else {
                    serde_json::json!({ "reservedFor": rest })
                };
                let patch = serde_json::json!({
                    "metadata": {"resourceVersion": claim.metadata.resource_version},
                    "status": status,
                });
                patches.push(((namespace.clone(), uid.clone()), key, patch));
            }
        }
        let client = &self.write_client;
        let leadership = self.leadership.as_deref();
        let results: Vec<_> = self.runtime.block_on(
            futures::stream::iter(patches)
                .map(|(pod, key, patch)| async move {
                    let result = patch_claim(client, leadership, &key, &patch).await;
                    (pod, key, result)
                })
                .buffer_unordered(CONCURRENCY)
                .collect(),
        );
        for (pod, key, result) in results {
            match result {
                Ok(claim) => {
                    tracing::info!(claim = %format!("{}/{}", key.0, key.1), "released a ResourceClaim its pod no longer needs");
                    self.tracker.dra_mut().set_claim(key, Some(Arc::new(claim)));
                }
                // Deleted meanwhile: nothing to release.
                Err(e) if e.contains("404") || e.contains("not found") => {}
                Err(error) => {
                    // Changed meanwhile (another pod of a shared claim left), or the API server
                    // is away: tried again at the next pass, against the claim as it is then.
                    tracing::warn!(%error, "cannot release a ResourceClaim yet");
                    self.gone.push(pod);
                }
            }
        }
    }

    /// Allocates the DRA claims of the pods about to bind, all or nothing per job: a job whose
    /// pods cannot all get their devices on their nodes, or whose claim writes fail, binds
    /// none of them and fails with the reason (its writes taken back). Returns the binds that
    /// may go ahead, and per job the claim writes to take back should its binding fail.
    fn allocate_claims(
        &mut self,
        binds: Vec<Bind>,
        outcomes: &mut Vec<BindOutcome>,
        failed: &mut Vec<(PendingPod, String)>,
    ) -> (Vec<Bind>, BTreeMap<JobId, Vec<ClaimWrite>>) {
        if !binds.iter().any(|(_, p, _)| names_claims(&p.pod)) {
            return (binds, BTreeMap::new());
        }
        let mut job_to_pods: BTreeMap<JobId, Vec<(PendingPod, usize)>> = BTreeMap::new();
        for (job, pod, node) in binds {
            job_to_pods.entry(job).or_default().push((pod, node));
        }
        let view = self.tracker.dra();
        let names = self.tracker.node_names();
        let mut in_use = view.in_use();
        let mut planned: Vec<(JobId, ClaimWrite)> = Vec::new();
        let mut refused: Vec<(JobId, String)> = Vec::new();
        for (&job, pods) in &job_to_pods {
            match plan_claims(view, names, pods, &in_use) {
                Ok((writes, taken)) => {
                    in_use.extend(taken);
                    planned.extend(writes.into_iter().map(|w| (job, w)));
                }
                Err(reason) => refused.push((job, reason)),
            }
        }
        let client = &self.write_client;
        let leadership = self.leadership.as_deref();
        let results: Vec<(
            JobId,
            ClaimWrite,
            std::result::Result<ResourceClaim, String>,
        )> = self.runtime.block_on(
            futures::stream::iter(planned)
                .map(|(job, write)| async move {
                    let result = patch_claim(client, leadership, &write.key, &write.patch).await;
                    (job, write, result)
                })
                .buffer_unordered(CONCURRENCY)
                .collect(),
        );
        let mut job_to_writes: BTreeMap<JobId, Vec<ClaimWrite>> = BTreeMap::new();
        for (job, write, result) in results {
            match result {
                Ok(claim) => {
                    self.tracker
                        .dra_mut()
                        .set_claim(write.key.clone(), Some(Arc::new(claim)));
                    job_to_writes.entry(job).or_default().push(write);
                }
                Err(reason) => {
                    if !refused.iter().any(|(j, _)| *j == job) {
                        refused.push((job, reason));
                    }
                }
            }
        }
        let mut undo: Vec<ClaimWrite> = Vec::new();
        for (job, reason) in refused {
            tracing::warn!(job, %reason, "DRA allocation failed");
            undo.extend(job_to_writes.remove(&job).unwrap_or_default());
            job_to_pods.remove(&job);
            let message = format!("Binding failed: {reason}");
            failed.extend(
                self.tracker
                    .pods_of(job)
                    .into_iter()
                    .map(|p| (p, message.clone())),
            );
            outcomes.push(BindOutcome::Failed { job, reason });
        }
        self.undo_claims(undo);
        let binds = job_to_pods
            .into_iter()
            .flat_map(|(job, pods)| pods.into_iter().map(move |(p, n)| (job, p, n)))
            .collect();
        (binds, job_to_writes)
    }

    /// Takes back claim statuses this pass wrote for a job that did not bind.
    fn undo_claims(&mut self, writes: Vec<ClaimWrite>) {
        if writes.is_empty() {
            return;
        }
        let client = &self.write_client;
        let leadership = self.leadership.as_deref();
        let results: Vec<_> = self.runtime.block_on(
            futures::stream::iter(writes)
                .map(|write| async move {
                    let result = patch_claim(client, leadership, &write.key, &write.undo).await;
                    (write.key, result)
                })
                .buffer_unordered(CONCURRENCY)
                .collect(),
        );
        for (key, result) in results {
            match result {
                Ok(claim) => self.tracker.dra_mut().set_claim(key, Some(Arc::new(claim))),
                Err(error) => tracing::warn!(%error, "cannot take back a ResourceClaim allocation"),
            }
        }
    }
}

/// "Expected to start in about 2 h, 90% within 5 h." for a FailedScheduling message: rounded
/// (10 min under an hour, hours under a day, then days) so that a replan that moves the
/// estimate a little does not post another Event.
fn estimate_sentence(estimate: &gantry_core::StartEstimate) -> String {
    let coarse = |wait_s: f64| {
        let s = wait_s.max(0.0);
        if s < 3600.0 {
            format!("{} min", (((s / 600.0).ceil()) * 10.0).max(10.0) as u64)
        } else if s < 86_400.0 {
            format!("{} h", (s / 3600.0).round() as u64)
        } else {
            format!("{} days", (s / 86_400.0).round() as u64)
        }
    };
    let wait = estimate.p50_s - estimate.planned_at_s;
    if wait < 1.0 {
        return "Room for it is free now: expected to start at its next attempt.".into();
    }
    let within = (estimate.p90_s - estimate.planned_at_s).max(wait);
    let mut text = format!(
        "Expected to start in about {}, 90% within {}",
        coarse(wait),
        coarse(within)
    );
    if let Some(nodes) = &estimate.reservation {
        text.push_str(&format!("; it holds a reservation on {nodes}"));
    }
    text.push('.');
    text
}

/// Why a write was refused: this replica does not hold the Lease (any more).
const NOT_LEADER: &str = "this replica is not the leader (its Lease ran out)";

impl ClusterSource for KubeCluster {
    /// Applies what the watch caches changed since the last sync: the changed keys only, or
    /// everything after a relist or a node-set change.
    fn sync(&mut self, scheduler: &mut Scheduler, now_s: f64) -> Changes {
        if let Some(leadership) = &self.leadership {
            leadership.beat();
        }
        let unix_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.tracker.set_clock(unix_s, now_s);
        // Victims the last cycle evicted leave the scheduler first; their pods hold their room
        // until they are gone.
        let evicted = std::mem::take(&mut self.evicted);
        self.tracker.evicted(scheduler, &evicted);
        if (self.pod_groups.is_none()
            || self.workload_groups.is_none()
            || self.queues.is_none()
            || self.local_queues.is_none()
            || self.dra.is_none())
            && self.last_discovery.elapsed() >= DISCOVER_EVERY
        {
            for (what, found) in self.discover() {
                if found {
                    tracing::info!("{what}");
                }
            }
        }
        let nodes = take(&self.node_log);
        let pods = take(&self.pod_log);
        let groups = take(&self.group_log);
        let queues = take(&self.queue_log);
        let namespaces = take(&self.namespace_log);
        let local_queues = take(&self.local_queue_log);
        // A kind's cache counts once it holds a full list (a kind found after start lists
        // first); until then the kind applies as absent.
        self.groups_ready |= groups.relisted;
        self.queues_ready |= queues.relisted;
        self.local_queues_ready |= local_queues.relisted;
        // Namespaces and LocalQueues before the Queues and pods: which queue a pod may use
        // depends on them.
        if !self.built || namespaces.relisted || !namespaces.keys.is_empty() {
            let mut namespaces = namespaces;
            namespaces.relisted |= !self.built;
            self.refresh_namespaces(namespaces);
        }
        if !self.built || local_queues.relisted || !local_queues.keys.is_empty() {
            self.refresh_local_queues();
        }
        let queues_changed = (!self.built || queues.relisted || !queues.keys.is_empty())
            && (self.queues_ready || self.queues.is_none());
        if queues_changed {
            self.refresh_queues(scheduler);
        }
        if (!self.built || groups.relisted || !groups.keys.is_empty())
            && (self.groups_ready || (self.pod_groups.is_none() && self.workload_groups.is_none()))
        {
            self.refresh_groups();
        }
        // DRA before the nodes: the GPUs slices publish are in the node table.
        let slices = take(&self.slice_log);
        let claims = take(&self.claim_log);
        let templates = take(&self.template_log);
        let slices_moved_gpus = self.refresh_dra(slices, claims, templates);
        // Our pods as the tracker knew them before this sync: those it no longer holds after
        // it are gone, and their claims are released.
        let before: Vec<(PodKey, String)> = pods
            .keys
            .iter()
            .filter_map(|key| Some((key.clone(), self.tracker.our_uid(key)?)))
            .collect();
        self.read_back_unanswered();
        let mut rebuild = !self.built || nodes.relisted || pods.relisted || slices_moved_gpus;
        if !rebuild {
            for (_, name) in &nodes.keys {
                let node = self.nodes.get(&ObjectRef::new(name));
                if self.tracker.node_changed(scheduler, name, node.as_deref()) {
                    rebuild = true;
                    break;
                }
            }
        }
        if rebuild {
            let (node_list, bound, pending) =
                (self.nodes.state(), self.bound.state(), self.pending.state());
            tracing::info!(
                nodes = node_list.len(),
                bound = bound.len(),
                pending = pending.len(),
                "building the scheduler's view of the cluster"
            );
            self.tracker.rebuild(
                scheduler,
                &World {
                    nodes: &node_list,
                    bound: &bound,
                    pending: &pending,
                },
            );
            // A rebuilt scheduler numbers its jobs afresh.
            self.job_to_preemption.clear();
            self.job_to_unestimated_reason.clear();
            self.built = true;
        } else {
            let mut keys = pods.keys;
            keys.extend(self.tracker.expired_assumptions());
            for key in keys {
                let at = ObjectRef::new(&key.1).within(&key.0);
                let pending = self.pending.get(&at);
                let bound = self.bound.get(&at);
                self.tracker
                    .pod_changed(scheduler, key, pending.as_ref(), bound.as_ref());
            }
        }
        for ((namespace, name), uid) in before {
            if self.tracker.our_uid(&(namespace.clone(), name)).as_ref() != Some(&uid) {
                self.gone.push((namespace, uid));
            }
        }
        let mut changes = self.tracker.finish_sync(scheduler, crate::evict::GIVE_UP);
        changes.nodes = nodes.keys.len() as u32;
        changes.queues = queues_changed;
        changes.rebuilt = rebuild;
        changes
    }

    fn leading(&self) -> bool {
        self.may_write()
    }

    fn describe(&self) -> Option<String> {
        let leadership = self.leadership.as_ref()?;
        Some(if leadership.is_leader() {
            format!("kube (leader {})", leadership.settings.identity)
        } else {
            let holder = leadership.holder().unwrap_or_else(|| "none yet".into());
            format!("kube (follower; leader {holder})")
        })
    }
}

impl Binder for KubeCluster {
    /// Preempts, binds, and reports why the rest wait; one outcome per placed job.
    fn bind(
        &mut self,
        scheduler: &Scheduler,
        output: &CycleOutput,
        _now_s: f64,
    ) -> Vec<BindOutcome> {
        let mut outcomes = Vec::new();
        let mut failed = Vec::new();
        self.release_claims();
        let victim_nodes = self.preempt(scheduler, output, &mut outcomes);
        self.bind_placed(scheduler, output, &victim_nodes, &mut outcomes, &mut failed);
        self.report_waiting(scheduler, output, failed);
        if self.may_write() {
            self.report_queues(scheduler);
        }
        outcomes
    }
}

/// Deletes a gang member bound by a binding that went through while another member's failed,
/// through the Eviction API: the RBAC grants no plain delete on pods, and an eviction honours
/// PodDisruptionBudgets (the uid keeps a pod recreated under the same name out of it).
async fn delete(client: &Client, pod: &PendingPod) -> std::result::Result<(), kube::Error> {
    use k8s_openapi::api::policy::v1::Eviction;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, Preconditions};
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let eviction = Eviction {
        metadata: ObjectMeta {
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            ..ObjectMeta::default()
        },
        delete_options: Some(DeleteOptions {
            preconditions: Some(Preconditions {
                uid: Some(pod.uid.clone()),
                ..Preconditions::default()
            }),
            ..DeleteOptions::default()
        }),
    };
    let evicted = api
        .create_subresource::<_, serde_json::Value>(
            "eviction",
            &pod.name,
            &PostParams::default(),
            &eviction,
        )
        .await;
    match evicted {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(error) => Err(error),
    }
}

/// What one binding call came to, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bound {
    /// This call bound the pod: it gets a Scheduled Event.
    Now,
    /// The pod was bound to the node already (a retry after a lost answer): no second Event.
    Already,
    /// The request went out and no answer came back, nor could the pod be read back: the API
    /// server may have applied it (one killed mid-request does). The pod counts as bound, as
    /// an assumed binding does, until the caches say otherwise; otherwise a rebuild from a
    /// cache that has not relisted yet would place it again, elsewhere.
    Unanswered,
}

/// Binds `pod` to `node` through the `pods/binding` subresource. A 409 means the pod is bound
/// already: fine when to `node` ([`Bound::Already`]), an error otherwise. A request that may
/// have been applied without an answer (see [`unanswered`]) is settled by reading the pod
/// back, else it is [`Bound::Unanswered`].
async fn bind(client: &Client, pod: &PendingPod, node: &str) -> Result<Bound> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            // The uid makes the binding fail for a pod deleted and recreated under the name.
            uid: Some(pod.uid.clone()),
            ..ObjectMeta::default()
        },
        target: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            ..ObjectReference::default()
        },
    };
    let bind_error = |message: String| Error::Bind {
        pod: pod.key(),
        node: node.into(),
        message,
    };
    // What the pod read back says: bound to `node` (`there`), elsewhere, or not at all.
    let settle = |current: Pod, there: Bound, unbound: String| match bound_node(pod, &current) {
        Some(actual) if actual == node => Ok(there),
        Some(actual) => Err(Error::BoundElsewhere {
            pod: pod.key(),
            wanted: node.into(),
            actual: actual.into(),
        }),
        None => Err(bind_error(unbound)),
    };
    match api
        .create_subresource::<_, serde_json::Value>(
            "binding",
            &pod.name,
            &PostParams::default(),
            &binding,
        )
        .await
    {
        Ok(_) => Ok(Bound::Now),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let current = api
                .get(&pod.name)
                .await
                .map_err(|e| bind_error(e.to_string()))?;
            settle(current, Bound::Already, status.message.clone())
        }
        Err(error) if unanswered(&error) => match api.get(&pod.name).await {
            Ok(current) => settle(current, Bound::Now, error.to_string()),
            Err(_) => Ok(Bound::Unanswered),
        },
        Err(error) => Err(bind_error(error.to_string())),
    }
}

/// What reading back a pod whose binding to a node went unanswered says of that binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadBack {
    /// The pod is bound to the node: the binding was applied.
    Applied,
    /// The pod is unbound, bound elsewhere, gone, or recreated under its name.
    NotApplied,
    /// The read failed too: nothing is known yet.
    Unread,
}

/// Judges the read-back `current` of `pod`, whose binding to `node` went unanswered.
fn read_back(pod: &PendingPod, node: &str, current: kube::Result<Option<Pod>>) -> ReadBack {
    match current {
        Err(_) => ReadBack::Unread,
        Ok(Some(current)) if bound_node(pod, &current) == Some(node) => ReadBack::Applied,
        Ok(_) => ReadBack::NotApplied,
    }
}

/// The node `current` is bound to, if it is still `pod` (the same uid, not one recreated
/// under its name).
fn bound_node<'a>(pod: &PendingPod, current: &'a Pod) -> Option<&'a str> {
    (current.metadata.uid.as_deref() == Some(pod.uid.as_str()))
        .then(|| current.spec.as_ref()?.node_name.as_deref())
        .flatten()
}

/// Whether a failed write may have been applied all the same: the request went out and no
/// answer came (a connection reset or closed mid-request, a read timeout), or the API server
/// said it timed out or failed inside (500, 504), which it says of writes it may still
/// commit. A refused connection sent nothing, and any other status is an answer.
fn unanswered(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => matches!(status.code, 500 | 504),
        kube::Error::HyperError(_) | kube::Error::Service(_) => {
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
            while let Some(e) = cause {
                if e.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
                {
                    return false;
                }
                cause = e.source();
            }
            true
        }
        _ => false,
    }
}

/// Posts an events.k8s.io/v1 Event about `pod`, as kube-scheduler does.
async fn event(
    client: &Client,
    pod: &PendingPod,
    type_: &str,
    reason: &str,
    action: &str,
    note: &str,
) -> std::result::Result<(), kube::Error> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let event = Event {
        metadata: ObjectMeta {
            name: Some(format!("{}.{:x}", pod.name, now.as_nanosecond())),
            namespace: Some(pod.namespace.clone()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(now)),
        type_: Some(type_.into()),
        reason: Some(reason.into()),
        action: Some(action.into()),
        // The API caps a note at 1 kB.
        note: Some(truncate(note, 1000)),
        reporting_controller: Some(format!("{COMPONENT}.dev/scheduler")),
        reporting_instance: Some(COMPONENT.into()),
        regarding: Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            uid: Some(pod.uid.clone()),
            ..ObjectReference::default()
        }),
        ..Event::default()
    };
    Api::<Event>::namespaced(client.clone(), &pod.namespace)
        .create(&PostParams::default(), &event)
        .await
        .map(|_| ())
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.into();
    }
    let mut end = max - 3;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// The FailedScheduling Event (when `post_event`) and the PodScheduled=False condition.
async fn report_unschedulable(
    client: &Client,
    pod: &PendingPod,
    message: &str,
    post_event: bool,
) -> std::result::Result<(), String> {
    if post_event {
        event(
            client,
            pod,
            "Warning",
            "FailedScheduling",
            "Scheduling",
            message,
        )
        .await
        .map_err(|e| format!("cannot post FailedScheduling for pod {}: {e}", pod.key()))?;
    }
    let patch = serde_json::json!({
        "status": {
            "conditions": [{
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
            }]
        }
    });
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    match api
        .patch_status(&pod.name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
    {
        Ok(_) => Ok(()),
        // Deleted meanwhile: nothing left to report on.
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(format!("cannot set PodScheduled on pod {}: {e}", pod.key())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_group_spec_becomes_a_gang_single_pods_or_a_refusal_naming_the_field() {
        let key = ("ns".to_string(), "g".to_string());
        let policy = |spec: serde_json::Value| workload_group_policy(&key, &spec);
        let gang = serde_json::json!({"gang": {"minCount": 16}});
        assert_eq!(
            policy(serde_json::json!({"schedulingPolicy": gang})),
            GroupPolicy::Gang(16)
        );
        assert_eq!(
            policy(serde_json::json!({"schedulingPolicy": {"gang": {"minCount": 0}}})),
            GroupPolicy::Gang(1)
        );
        assert_eq!(
            policy(serde_json::json!({"schedulingPolicy": {"basic": {}}})),
            GroupPolicy::Basic
        );
        // Empty lists are what the API server echoes for unset fields: not refused.
        assert_eq!(
            policy(
                serde_json::json!({"schedulingPolicy": gang, "resourceClaims": [],
                "schedulingConstraints": {"topology": []}})
            ),
            GroupPolicy::Gang(16)
        );
        let refusal = |spec: serde_json::Value| match policy(spec) {
            GroupPolicy::Refused(message) => message,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert_eq!(
            refusal(
                serde_json::json!({"schedulingPolicy": gang, "parentCompositePodGroupName": "job"})
            ),
            "pod group ns/g: spec.parentCompositePodGroupName is not supported by Gantry (a pod group inside a composite pod group; Gantry places each PodGroup on its own); remove it or use another scheduler"
        );
        assert!(
            refusal(serde_json::json!({"schedulingPolicy": gang,
            "schedulingConstraints": {"topology": [{"key": "rack"}]}}))
            .contains("spec.schedulingConstraints.topology is not supported")
        );
        assert!(
            refusal(serde_json::json!({"schedulingPolicy": gang,
            "resourceClaims": [{"name": "gpus"}]}))
            .contains("spec.resourceClaims is not supported")
        );
        assert!(refusal(serde_json::json!({"schedulingPolicy": {"quorum": {}}}))
            .contains("spec.schedulingPolicy is not supported by Gantry (a scheduling policy other than gang and basic)"));
    }

    #[test]
    fn the_scheduled_condition_has_the_name_of_the_version_read() {
        assert_eq!(scheduled_condition_type("v1alpha2"), "PodGroupScheduled");
        assert_eq!(
            scheduled_condition_type("v1alpha3"),
            "PodGroupInitiallyScheduled"
        );
        assert_eq!(
            scheduled_condition_type("v1beta1"),
            "PodGroupInitiallyScheduled"
        );
    }

    #[test]
    fn the_estimate_in_a_failed_scheduling_message_is_rounded() {
        let estimate = |p50_s: f64, p90_s: f64, reservation: Option<&str>| {
            estimate_sentence(&gantry_core::StartEstimate {
                planned_at_s: 100.0,
                p10_s: 100.0,
                p50_s: 100.0 + p50_s,
                p90_s: 100.0 + p90_s,
                reservation: reservation.map(str::to_string),
            })
        };
        assert_eq!(
            estimate(1250.0, 2000.0, None),
            "Expected to start in about 30 min, 90% within 40 min."
        );
        // Minutes of change within the same hour read the same.
        assert_eq!(
            estimate(7000.0, 18_000.0, None),
            estimate(7400.0, 18_200.0, None)
        );
        assert_eq!(
            estimate(7000.0, 3.0 * 86_400.0, Some("16 nodes in rack 3")),
            "Expected to start in about 2 h, 90% within 3 days; it holds a reservation on 16 \
             nodes in rack 3."
        );
        assert_eq!(
            estimate(0.0, 0.0, None),
            "Room for it is free now: expected to start at its next attempt."
        );
    }

    #[test]
    fn a_write_may_have_been_applied_unless_its_connection_was_refused_or_it_was_answered() {
        use std::io::{Error as IoError, ErrorKind};
        let io = |kind: ErrorKind| kube::Error::Service(Box::new(IoError::new(kind, "io")));
        let status = |code: u16| {
            kube::Error::Api(Box::new(
                kube::core::Status::failure("no", "No").with_code(code),
            ))
        };
        // Nothing was sent.
        assert!(!unanswered(&io(ErrorKind::ConnectionRefused)));
        // Sent, and the connection went away or timed out before the answer.
        assert!(unanswered(&io(ErrorKind::ConnectionReset)));
        assert!(unanswered(&io(ErrorKind::TimedOut)));
        assert!(unanswered(&io(ErrorKind::UnexpectedEof)));
        // A refusal found deeper in the chain of causes still means nothing was sent.
        #[derive(Debug, thiserror::Error)]
        #[error("tcp connect error")]
        struct Connect(#[source] IoError);
        let wrapped = Connect(IoError::new(ErrorKind::ConnectionRefused, "refused"));
        assert!(!unanswered(&kube::Error::Service(Box::new(wrapped))));
        // The API server's own timeouts and internal errors may still commit; other answers
        // are answers.
        assert!(unanswered(&status(504)));
        assert!(unanswered(&status(500)));
        for code in [400, 403, 404, 409, 422, 429, 503] {
            assert!(!unanswered(&status(code)), "{code}");
        }
    }

    #[test]
    fn a_read_back_pod_says_whether_its_unanswered_binding_was_applied() {
        let pod = |uid: &str, node: Option<&str>| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "default", "uid": uid},
                "spec": {"containers": [], "nodeName": node},
            }))
            .unwrap()
        };
        let pending = PendingPod::of(&std::sync::Arc::new(pod("u1", None)));
        let judge = |current| read_back(&pending, "n1", current);
        assert_eq!(judge(Ok(Some(pod("u1", Some("n1"))))), ReadBack::Applied);
        assert_eq!(judge(Ok(Some(pod("u1", None)))), ReadBack::NotApplied);
        assert_eq!(judge(Ok(Some(pod("u1", Some("n2"))))), ReadBack::NotApplied);
        // Recreated under its name and bound there by someone else: not our binding.
        assert_eq!(judge(Ok(Some(pod("u2", Some("n1"))))), ReadBack::NotApplied);
        assert_eq!(judge(Ok(None)), ReadBack::NotApplied);
        let timed_out = kube::Error::Service(Box::new(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "timed out",
        )));
        assert_eq!(judge(Err(timed_out)), ReadBack::Unread);
    }

    #[test]
    fn a_refused_connection_from_a_real_client_sent_nothing() {
        // Port 1 on loopback: nothing listens there, so the connection is refused.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let error = runtime.block_on(async {
            let mut config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
            config.connect_timeout = Some(CALL_TIMEOUT);
            let client = Client::try_from(config).unwrap();
            let pods: Api<Pod> = Api::namespaced(client, "default");
            pods.get("p").await.expect_err("nothing listens on port 1")
        });
        assert!(!unanswered(&error), "{error:?}");
    }
}
