//! The live cluster: watch caches in, bindings, Events and conditions out.
//!
//! The scheduling loop is synchronous (it shares [`gantry_core::Scheduler`] with nothing and
//! runs Wasm policies), so this type owns a small tokio runtime for the reflectors and blocks
//! on it only to bind and report.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use gantry_core::{CycleOutput, SchedulerConfig, Symbols};
use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};

use crate::config::KubeConfig;
use crate::snapshot::{self, Inputs, PendingPod, Snapshot};
use crate::{Error, Result};

/// The name Gantry reports Events and bindings under.
const COMPONENT: &str = "gantry";
/// How long a pod we bound counts as running before the bound-pod cache confirms it.
const ASSUME_TTL: Duration = Duration::from_secs(60);
/// Queue statuses are written at most this often.
const QUEUE_STATUS_EVERY: Duration = Duration::from_secs(5);
/// Bindings and status patches in flight at once.
pub(crate) const CONCURRENCY: usize = 16;
/// Scheduled Events in flight at once, in the background (see [`KubeCluster::apply`]).
const EVENT_CONCURRENCY: usize = 4;

/// What one [`KubeCluster::apply`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ApplyReport {
    pub bound: usize,
    pub unschedulable: usize,
    /// One line per failed binding or report.
    pub errors: Vec<String>,
    /// Per placed job: bound (every pod), or failed with the API server's message for the
    /// first pod that failed.
    pub outcomes: Vec<gantry_core::BindOutcome>,
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
    /// Bumped by every watch event (any cache); a loop rebuilds its snapshot when it moved.
    generation: Arc<AtomicU64>,
    /// Pods this process bound, by uid, with their node and when: kube-scheduler's assume
    /// cache, so the next cycle does not hand their room out again before the watch confirms.
    assumed: HashMap<String, (Arc<Pod>, String, Instant)>,
    /// The last FailedScheduling message posted per pod uid: the same reason is not posted
    /// again every cycle.
    last_failed: HashMap<String, String>,
    /// Gantry's `Queue` objects; `None` when the cluster has no such CRD.
    queues: Option<Store<DynamicObject>>,
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
    /// Preemptions under way, by preemptor job name: the preemptor waits, nominated, until
    /// its victims are gone (see [`crate::evict`]).
    preemptions: HashMap<String, crate::evict::Preemption>,
}

/// A small runtime for the caches and calls; the scheduling loop blocks on it.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
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
pub(crate) fn client(runtime: &tokio::runtime::Runtime, path: &Path) -> Result<Client> {
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
        // One discovery call at start: watching a kind the cluster does not serve would keep
        // the caches from ever syncing.
        let serves = |group_version: &str, plural: &str| {
            runtime.block_on(async {
                client
                    .list_api_group_resources(group_version)
                    .await
                    .is_ok_and(|list| list.resources.iter().any(|r| r.name == plural))
            })
        };
        let has_pod_groups = serves("scheduling.x-k8s.io/v1alpha1", "podgroups");
        let has_queues = serves("gantry.dev/v1alpha1", "queues");
        let generation = Arc::new(AtomicU64::new(0));
        let nodes = reflect(
            &runtime,
            Api::<Node>::all(client.clone()),
            watcher::Config::default(),
            generation.clone(),
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
            "unbound pods",
            (),
        );
        let bound = reflect(
            &runtime,
            Api::<Pod>::all(client.clone()),
            watcher::Config::default()
                .fields("spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"),
            generation.clone(),
            "bound pods",
            (),
        );
        let pod_groups = has_pod_groups.then(|| {
            let resource = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("scheduling.x-k8s.io", "v1alpha1", "PodGroup"),
                "podgroups",
            );
            reflect(
                &runtime,
                Api::<DynamicObject>::all_with(client.clone(), &resource),
                watcher::Config::default(),
                generation.clone(),
                "pod groups",
                resource,
            )
        });
        let queues = has_queues.then(|| {
            let resource = crate::queues::resource();
            reflect(
                &runtime,
                Api::<DynamicObject>::all_with(client.clone(), &resource),
                watcher::Config::default(),
                generation.clone(),
                "queues",
                resource,
            )
        });
        if !has_queues {
            tracing::info!(
                "no gantry.dev/v1alpha1 Queue in this cluster: every queue may use the whole cluster"
            );
        }
        if !has_pod_groups {
            tracing::info!(
                "no scheduling.x-k8s.io/v1alpha1 PodGroup in this cluster: gangs come from Gantry's labels"
            );
        }
        Ok(Self {
            runtime,
            client,
            config,
            nodes,
            pending,
            bound,
            pod_groups,
            generation,
            assumed: HashMap::new(),
            last_failed: HashMap::new(),
            queues,
            evict_client,
            write_client,
            queue_problems: Vec::new(),
            queue_status: HashMap::new(),
            queue_status_at: None,
            preemptions: HashMap::new(),
        })
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
                if let Some(queues) = &self.queues {
                    let _ = queues.wait_until_ready().await;
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

    /// The cycle's input, built from the caches (no API call).
    pub fn snapshot(&mut self, symbols: &Arc<Symbols>, config: SchedulerConfig) -> Snapshot {
        let bound = self.bound.state();
        let bound_uids: std::collections::HashSet<&str> = bound
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        self.assumed.retain(|uid, (_, _, at)| {
            !bound_uids.contains(uid.as_str()) && at.elapsed() < ASSUME_TTL
        });
        let assumed: Vec<(Arc<Pod>, String)> = self
            .assumed
            .values()
            .map(|(pod, node, _)| (pod.clone(), node.clone()))
            .collect();
        let pod_groups: HashMap<(String, String), u32> = self
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
        let pending = self.pending.state();
        let (held, nominated) = crate::evict::hold(&mut self.preemptions, &bound, &pending);
        let (queues, problems) = match &self.queues {
            Some(store) => crate::queues::check(&store.state()),
            None => (Vec::new(), Vec::new()),
        };
        for problem in problems.iter().filter(|p| !self.queue_problems.contains(p)) {
            tracing::warn!(%problem, "Queue left out");
        }
        self.queue_problems = problems;
        snapshot::build(
            &Inputs {
                nodes: &self.nodes.state(),
                bound: &bound,
                pending: &pending,
                assumed: &assumed,
                pod_groups: &pod_groups,
                held: &held,
                nominated: &nominated,
                queues: &queues,
            },
            &self.config,
            symbols,
            config,
        )
    }

    /// Starts leader election on this cluster's runtime and client (see [`crate::leader`]).
    pub fn leader_elect(&self, settings: crate::LeaderSettings) -> Arc<crate::Leadership> {
        crate::leader::start(&self.runtime, self.client.clone(), settings)
    }

    /// Stops leader election and releases the Lease if held, so a successor starts at once.
    pub fn resign(&self, leadership: &crate::Leadership) {
        self.runtime
            .block_on(crate::leader::resign(self.client.clone(), leadership));
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

    /// The Queue objects the last snapshot left out, one line each.
    pub fn queue_problems(&self) -> &[String] {
        &self.queue_problems
    }

    /// Acts on the cycle's preemptions before [`KubeCluster::apply`] binds anything: evicts
    /// each preemptor's victims through the Eviction API, posts `Preempted` on them, and
    /// nominates the preemptor's nodes instead of binding (victims hold their GPUs until they
    /// are gone). Evictions a PodDisruptionBudget blocked are tried again. Returns the output
    /// `apply` should act on: without the preemptors, and without any decision after the
    /// first preemption (it may have counted room a victim still holds), which the next cycle
    /// makes again.
    pub fn preempt(&mut self, snap: &Snapshot, output: &CycleOutput) -> (CycleOutput, usize) {
        let client = self.evict_client.clone();
        let (rest, started) = self.runtime.block_on(crate::evict::run(
            &client,
            &mut self.preemptions,
            snap,
            output,
        ));
        (rest, started)
    }

    /// Acts on a cycle's decisions: binds placed jobs' pods, and reports why the others wait
    /// (a FailedScheduling Event when the reason changed, and the PodScheduled condition).
    pub fn apply(&mut self, snap: &Snapshot, output: &CycleOutput) -> ApplyReport {
        let mut binds: Vec<(gantry_core::JobId, PendingPod, String)> = Vec::new();
        let mut unschedulable: Vec<(PendingPod, String)> = snap.waiting.clone();
        for decision in &output.decisions {
            let Some((_, pods)) = snap.jobs.get(decision.job as usize) else {
                continue;
            };
            if decision.placed {
                let slots = snap.scheduler.slots(decision.job);
                for (pod, slot) in pods.iter().zip(slots) {
                    binds.push((
                        decision.job,
                        pod.clone(),
                        snap.node_names[slot.node as usize].clone(),
                    ));
                }
            } else {
                let message = decision.explanation.summary();
                unschedulable.extend(pods.iter().map(|p| (p.clone(), message.clone())));
            }
        }
        // Forget pods that are no longer waiting, so the map stays as small as the queue.
        let waiting_now: std::collections::HashSet<&str> = unschedulable
            .iter()
            .map(|(p, _)| p.uid.as_str())
            .chain(
                snap.jobs
                    .iter()
                    .flat_map(|(_, p)| p.iter().map(|p| p.uid.as_str())),
            )
            .collect();
        self.last_failed
            .retain(|uid, _| waiting_now.contains(uid.as_str()));
        let to_report: Vec<(PendingPod, String, bool)> = unschedulable
            .into_iter()
            .filter_map(|(pod, message)| {
                let event = self.last_failed.get(&pod.uid) != Some(&message);
                let wanted = Some(("False".into(), "Unschedulable".into(), message.clone()));
                let condition = pod.scheduled_condition != wanted;
                (event || condition).then_some((pod, message, event))
            })
            .collect();
        let mut report = ApplyReport {
            unschedulable: to_report.len(),
            ..ApplyReport::default()
        };
        let client = &self.write_client;
        let bind_results: Vec<(gantry_core::JobId, PendingPod, String, Result<()>)> =
            self.runtime.block_on(
                futures::stream::iter(binds)
                    .map(|(job, pod, node)| async move {
                        let result = bind(client, &pod, &node).await;
                        (job, pod, node, result)
                    })
                    .buffer_unordered(CONCURRENCY)
                    .collect(),
            );
        let mut scheduled: Vec<(PendingPod, String)> = Vec::new();
        // Per job, the first failure, if any: the job's outcome.
        let mut job_to_failure: std::collections::BTreeMap<gantry_core::JobId, Option<String>> =
            std::collections::BTreeMap::new();
        for (job, pod, node, result) in bind_results {
            let failure = job_to_failure.entry(job).or_default();
            match result {
                Ok(()) => {
                    report.bound += 1;
                    self.assumed.insert(
                        pod.uid.clone(),
                        (pod.pod.clone(), node.clone(), Instant::now()),
                    );
                    scheduled.push((pod, node));
                }
                Err(error) => {
                    failure.get_or_insert_with(|| error.to_string());
                    report.errors.push(error.to_string());
                }
            }
        }
        report.outcomes = job_to_failure
            .into_iter()
            .map(|(job, failure)| match failure {
                None => gantry_core::BindOutcome::Bound { job },
                Some(reason) => gantry_core::BindOutcome::Failed { job, reason },
            })
            .collect();
        // The Scheduled Events go out in the background, a few at a time, like kube-scheduler's
        // event broadcaster: the next cycle's bindings never wait for this cycle's Events, and
        // a burst of Events never crowds bindings out of the API server.
        if !scheduled.is_empty() {
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
        let report_results: Vec<(String, String, std::result::Result<(), String>)> =
            self.runtime.block_on(
                futures::stream::iter(to_report)
                    .map(|(pod, message, post_event)| async move {
                        let result = report_unschedulable(client, &pod, &message, post_event).await;
                        (pod.uid, message, result)
                    })
                    .buffer_unordered(CONCURRENCY)
                    .collect(),
            );
        for (uid, message, result) in report_results {
            match result {
                Ok(()) => {
                    self.last_failed.insert(uid, message);
                }
                Err(error) => report.errors.push(error),
            }
        }
        report
    }
}

/// Binds `pod` to `node` through the `pods/binding` subresource. A 409 means the pod is bound
/// already: fine when to `node` (a retry after a lost answer), an error otherwise.
async fn bind(client: &Client, pod: &PendingPod, node: &str) -> Result<()> {
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
    match api
        .create_subresource::<_, serde_json::Value>(
            "binding",
            &pod.name,
            &PostParams::default(),
            &binding,
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let current = api
                .get(&pod.name)
                .await
                .map_err(|e| bind_error(e.to_string()))?;
            match current.spec.and_then(|s| s.node_name) {
                Some(actual) if actual == node => Ok(()),
                Some(actual) => Err(Error::BoundElsewhere {
                    pod: pod.key(),
                    wanted: node.into(),
                    actual,
                }),
                None => Err(bind_error(status.message.clone())),
            }
        }
        Err(error) => Err(bind_error(error.to_string())),
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
