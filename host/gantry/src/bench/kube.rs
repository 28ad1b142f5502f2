//! The measuring side of `tests/cluster/bench.sh`, which races Gantry, upstream kube-scheduler
//! with its native gang scheduling, kube-scheduler with the Coscheduling plugin, and a raw
//! binder on the same cluster and the same pods:
//!
//! - [`Workload`], [`workload`]: the pods, a fixed mix of single pods and gangs (`mixed`), or
//!   OpenAI's shape (`openai`: 8-GPU pods, one per node, in gangs of 16 to 256);
//! - [`GangApi`], [`create_pods`]: the pods and their gangs, as scheduler-plugins `PodGroup`s
//!   (Coscheduling's, also read by Gantry) or as the upstream `scheduling.k8s.io` Workload and
//!   PodGroup (kube-scheduler's native gangs, also read by Gantry), created before any
//!   scheduler runs;
//! - [`watch`]: starts the scheduler under test once every pod exists, and times each binding as
//!   the watch sees it, until every pod is bound or time runs out;
//! - [`raw_bind`]: the ceiling, binding pods to nodes decided up front, with no scheduling.
//!
//! All of them talk to the API server through `gantry_kube`'s client, with the binder's
//! concurrency.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams, ResourceExt,
};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde::Serialize;
use serde_json::json;

use anyhow::{Result, anyhow};
use gantry_kube::connect::{CONCURRENCY as BIND_CONCURRENCY, client, runtime};

/// Every benchmark pod carries this label, so the watch and the raw binder see only them.
pub const BENCH_LABEL: &str = "gantry.dev/bench";
/// scheduler-plugins' PodGroup label, read by Coscheduling and by Gantry alike.
const POD_GROUP_LABEL: &str = "scheduling.x-k8s.io/pod-group";
/// Every gang member carries its gang's name here too, whichever gang API the run uses, so the
/// watch and the raw binder group pods the same way for every contender.
const BENCH_GANG_LABEL: &str = "gantry.dev/bench-gang";

/// Which pods a run creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Half one-GPU gang pods (gangs of 4 to 32), half 1–2-GPU single pods, 70% of the GPUs at
    /// five pods per node: the first live bench.
    Mixed,
    /// OpenAI's shape: every gang pod and most single pods ask for 8 GPUs (a node each), gangs
    /// of 16 to 256 pods hold about 70% of the GPUs asked for, and the burst asks for about 90%
    /// of the cluster's GPUs.
    Openai,
}

impl std::str::FromStr for Workload {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "mixed" => Ok(Self::Mixed),
            "openai" => Ok(Self::Openai),
            other => Err(format!("unknown workload {other:?}: use mixed or openai")),
        }
    }
}

/// How a run declares its gangs to the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GangApi {
    /// scheduler-plugins' `PodGroup` (`minMember`) and the `scheduling.x-k8s.io/pod-group` label:
    /// what Coscheduling reads.
    Plugins,
    /// The upstream gang API (KEP-4671, `scheduling.k8s.io/v1beta1`): a Workload with a gang
    /// template, its PodGroup, and each pod's `spec.schedulingGroup`: what kube-scheduler's
    /// native gang scheduling reads.
    Upstream,
}

impl std::str::FromStr for GangApi {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "plugins" => Ok(Self::Plugins),
            "upstream" => Ok(Self::Upstream),
            other => Err(format!(
                "unknown gang API {other:?}: use plugins or upstream"
            )),
        }
    }
}

/// Node counts the `openai` workload is defined for: enough nodes for a 16-pod gang inside
/// 70% of 90%, and no more than the modelled cluster.
pub const OPENAI_NODES: std::ops::RangeInclusive<usize> = 32..=7500;

/// One pod of the workload: its name, GPUs, and gang (name, size) if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchPod {
    pub name: String,
    pub gpus: u32,
    pub gang: Option<(String, u32)>,
}

/// The pods of `kind`: [`mixed_workload`] of `pods` pods, or [`openai_workload`] for `nodes`
/// eight-GPU nodes (which sets its own pod count). An error names what cannot be served.
pub fn workload(kind: Workload, pods: usize, nodes: usize) -> Result<Vec<BenchPod>> {
    match kind {
        Workload::Mixed if pods == 0 => Err(anyhow!("the mixed workload needs --pods")),
        Workload::Mixed => Ok(mixed_workload(pods)),
        Workload::Openai if !OPENAI_NODES.contains(&nodes) => Err(anyhow!(format!(
            "the openai workload is defined for {} to {} nodes, not {nodes}",
            OPENAI_NODES.start(),
            OPENAI_NODES.end()
        ))),
        Workload::Openai => Ok(openai_workload(nodes)),
    }
}

/// OpenAI's shape on `nodes` eight-GPU nodes: a burst asking for 90% of the GPUs, 70% of that
/// in gangs of 16, 32, 64, 128 and 256 eight-GPU pods (in turn; the last cut to fit, none
/// under 16), the rest single pods, of which one in eight asks for 1, 2 or 4 GPUs (in turn)
/// and the others for 8. Deterministic, so every contender gets the same pods.
pub fn openai_workload(nodes: usize) -> Vec<BenchPod> {
    let budget = nodes * 8 * 9 / 10;
    let gang_pods = budget * 7 / 10 / 8;
    let mut out = Vec::new();
    let sizes = [16usize, 32, 64, 128, 256];
    let mut gang = 0;
    let mut placed = 0;
    while gang_pods - placed >= sizes[0] {
        let size = sizes[gang % sizes.len()].min(gang_pods - placed);
        let name = format!("gang-{gang}");
        out.extend((0..size).map(|i| BenchPod {
            name: format!("{name}-{i}"),
            gpus: 8,
            gang: Some((name.clone(), size as u32)),
        }));
        placed += size;
        gang += 1;
    }
    let mut left = budget - placed * 8;
    let mut single = 0;
    while left > 0 {
        let gpus = if single % 8 == 7 {
            [1, 2, 4][(single / 8) % 3]
        } else {
            8
        }
        .min(left);
        out.push(BenchPod {
            name: format!("single-{single}"),
            gpus: gpus as u32,
            gang: None,
        });
        left -= gpus;
        single += 1;
    }
    out
}

/// The workload for `pods` pods: half of them in gangs of 4, 8, 16 and 32 one-GPU pods (in
/// turn; the last gang is cut to fit), the rest single pods asking for 1, 1, 1 and 2 GPUs (in
/// turn). Deterministic, so every contender gets the same pods; 1.125 GPUs per pod on average,
/// so 5,000 pods fill 70% of 1,000 eight-GPU nodes and everything fits.
pub fn mixed_workload(pods: usize) -> Vec<BenchPod> {
    let mut out = Vec::with_capacity(pods);
    let in_gangs = pods / 2;
    let sizes = [4usize, 8, 16, 32];
    let mut gang = 0;
    while out.len() < in_gangs {
        let size = sizes[gang % sizes.len()].min(in_gangs - out.len());
        let name = format!("gang-{gang}");
        for i in 0..size {
            out.push(BenchPod {
                name: format!("{name}-{i}"),
                gpus: 1,
                gang: Some((name.clone(), size as u32)),
            });
        }
        gang += 1;
    }
    let mut single = 0;
    while out.len() < pods {
        out.push(BenchPod {
            name: format!("single-{single}"),
            gpus: [1, 1, 1, 2][single % 4],
            gang: None,
        });
        single += 1;
    }
    out
}

fn pod_group_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("scheduling.x-k8s.io", "v1alpha1", "PodGroup"),
        "podgroups",
    )
}

/// The upstream gang API's kinds, at the version the test control plane serves.
fn upstream_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("scheduling.k8s.io", "v1beta1", kind),
        plural,
    )
}

/// The objects that declare gang `gang` of `size` pods under `api`: a scheduler-plugins
/// PodGroup, or an upstream Workload and its PodGroup (named `<gang>-workers`).
fn gang_objects(gang: &str, size: u32, api: GangApi) -> Vec<(ApiResource, DynamicObject)> {
    match api {
        GangApi::Plugins => {
            let mut group = DynamicObject::new(gang, &pod_group_resource());
            group.data = json!({"spec": {"minMember": size}});
            vec![(pod_group_resource(), group)]
        }
        GangApi::Upstream => {
            let policy = json!({"gang": {"minCount": size}});
            let workload_kind = upstream_resource("Workload", "workloads");
            let group_kind = upstream_resource("PodGroup", "podgroups");
            let mut workload = DynamicObject::new(gang, &workload_kind);
            workload.data = json!({"spec": {"podGroupTemplates": [
                {"name": "workers", "schedulingPolicy": policy}
            ]}});
            let mut group = DynamicObject::new(&format!("{gang}-workers"), &group_kind);
            group.data = json!({"spec": {
                "workloadRef": {"workloadName": gang, "templateName": "workers"},
                "schedulingPolicy": policy,
            }});
            vec![(workload_kind, workload), (group_kind, group)]
        }
    }
}

fn pod_object(pod: &BenchPod, scheduler_name: &str, api: GangApi) -> Pod {
    let mut labels = json!({BENCH_LABEL: "1"});
    let mut scheduling_group = serde_json::Value::Null;
    if let Some((gang, _)) = &pod.gang {
        labels[BENCH_GANG_LABEL] = json!(gang);
        match api {
            GangApi::Plugins => labels[POD_GROUP_LABEL] = json!(gang),
            GangApi::Upstream => {
                scheduling_group = json!({"podGroupName": format!("{gang}-workers")});
            }
        }
    }
    let mut object = json!({
        "metadata": {"name": pod.name, "labels": labels},
        "spec": {
            "schedulerName": scheduler_name,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main",
                "image": "trainer",
                "resources": {
                    "requests": {"nvidia.com/gpu": pod.gpus.to_string(), "cpu": "1", "memory": "1Gi"},
                    "limits": {"nvidia.com/gpu": pod.gpus.to_string()}
                }
            }]
        }
    });
    if !scheduling_group.is_null() {
        object["spec"]["schedulingGroup"] = scheduling_group;
    }
    serde_json::from_value(object).expect("a valid pod")
}

/// Creates the gangs (under `api`) and pods of `workload` in `namespace`, for
/// `scheduler_name`. Objects that exist already are left alone. Calls `progress` after each
/// pod.
pub fn create_pods(
    kubeconfig: &Path,
    namespace: &str,
    workload: &[BenchPod],
    scheduler_name: &str,
    api: GangApi,
    progress: &(dyn Fn() + Sync),
) -> Result<usize> {
    let runtime = runtime()?;
    let client = client(&runtime, kubeconfig)?;
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut gang_to_size: BTreeMap<&str, u32> = BTreeMap::new();
    for pod in workload {
        if let Some((gang, size)) = &pod.gang {
            gang_to_size.insert(gang, *size);
        }
    }
    // A Workload before its PodGroup: the PodGroup names it.
    let objects: Vec<(ApiResource, DynamicObject)> = gang_to_size
        .into_iter()
        .flat_map(|(gang, size)| gang_objects(gang, size, api))
        .collect();
    runtime.block_on(async {
        for (kind, object) in &objects {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, kind);
            create_tolerating_conflict(api.create(&PostParams::default(), object).await).map_err(
                |message| anyhow!(format!("{} {}: {message}", kind.kind, object.name_any())),
            )?;
        }
        let created: Vec<Result<()>> = futures::stream::iter(workload)
            .map(|pod| {
                let pods_api = pods_api.clone();
                async move {
                    let result = create_tolerating_conflict(
                        pods_api
                            .create(
                                &PostParams::default(),
                                &pod_object(pod, scheduler_name, api),
                            )
                            .await,
                    )
                    .map_err(|message| anyhow!(format!("pod {}: {message}", pod.name)));
                    progress();
                    result
                }
            })
            .buffer_unordered(BIND_CONCURRENCY)
            .collect()
            .await;
        created.into_iter().collect::<Result<Vec<()>>>()?;
        Ok(workload.len())
    })
}

/// GPUs a pod asks for, read the way the scheduler reads it.
fn gpus_of(pod: &Pod) -> u32 {
    gantry_kube::mapping::pod_request(pod, &gantry_kube::KubeConfig::default()).gpus
}

/// A node's allocatable GPUs.
fn allocatable_gpus(node: &Node) -> u32 {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(&gantry_kube::KubeConfig::default().gpu_resource))
        .and_then(|q| gantry_kube::quantity::count(&q.0))
        .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

fn create_tolerating_conflict<T>(result: kube::Result<T>) -> std::result::Result<(), String> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// What one contender achieved, as `bench.sh --json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub pods: usize,
    pub pods_bound: usize,
    pub pods_unbound: usize,
    /// From the contender's start to the first binding the watch saw.
    pub first_bind_s: Option<f64>,
    /// From the contender's start to the last binding.
    pub last_bind_s: Option<f64>,
    /// Pods bound per second from the contender's start to the last binding.
    pub pods_per_s: f64,
    pub gangs: usize,
    /// From the contender's start until every gang had all of its pods bound (None if some
    /// never did).
    pub all_gangs_placed_s: Option<f64>,
    /// Gangs with some, but not all, of their pods bound at the end.
    pub partial_gangs: usize,
    /// Pods in the largest gang.
    pub largest_gang_pods: usize,
    /// From the contender's start until the largest gang had all of its pods bound (None if it
    /// never did). Every pod was created before the start, so this is its wait less the same
    /// creation lead for every contender.
    pub largest_gang_bound_s: Option<f64>,
    pub gpus_bound: u64,
    pub gpus_total: u64,
    pub gpu_allocation: f64,
    pub timed_out: bool,
}

/// Waits until the `pods` benchmark pods exist, then calls `start` (which starts the contender)
/// and times every binding the watch sees, until all are bound or `timeout` passes.
pub fn watch(
    kubeconfig: &Path,
    namespace: &str,
    pods: usize,
    timeout: Duration,
    start: impl FnOnce() -> std::result::Result<(), String>,
    progress: &dyn Fn(usize),
) -> Result<Outcome> {
    let runtime = runtime()?;
    let client = client(&runtime, kubeconfig)?;
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    runtime.block_on(async {
        let stream = watcher(api, watcher::Config::default().labels(BENCH_LABEL));
        let mut stream = std::pin::pin!(stream);
        let mut name_to_pod: HashMap<String, Pod> = HashMap::new();
        let mut name_to_bound_at: HashMap<String, Duration> = HashMap::new();
        let mut started: Option<Instant> = None;
        let mut start = Some(start);
        let deadline = Instant::now() + timeout;
        let mut timed_out = false;
        loop {
            let now = Instant::now();
            if now >= deadline {
                timed_out = true;
                break;
            }
            let event = match tokio::time::timeout(deadline - now, stream.next()).await {
                Ok(Some(event)) => event,
                Ok(None) => break,
                Err(_) => {
                    timed_out = true;
                    break;
                }
            };
            let pod = match event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
                Ok(watcher::Event::InitDone) => {
                    if started.is_none() && name_to_pod.len() < pods {
                        return Err(anyhow!(format!(
                            "only {} of the {pods} benchmark pods exist; create them first",
                            name_to_pod.len()
                        )));
                    }
                    if let Some(start) = start.take() {
                        started = Some(Instant::now());
                        start().map_err(anyhow::Error::msg)?;
                    }
                    continue;
                }
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "bench watch; retrying");
                    continue;
                }
            };
            let name = pod.name_any();
            if let Some(at) = started
                && pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_some()
                && !name_to_bound_at.contains_key(&name)
            {
                name_to_bound_at.insert(name.clone(), at.elapsed());
                progress(name_to_bound_at.len());
            }
            name_to_pod.insert(name, pod);
            if started.is_some() && name_to_bound_at.len() >= pods {
                break;
            }
        }
        // Pods bound before the contender started (none, on a fresh cluster) count as bound
        // at time zero.
        for (name, pod) in &name_to_pod {
            if pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some()
            {
                name_to_bound_at.entry(name.clone()).or_default();
            }
        }
        let nodes = Api::<Node>::all(client)
            .list(&ListParams::default())
            .await
            .map_err(|e| anyhow!(format!("cannot list nodes: {e}")))?;
        let gpus_total: u64 = nodes
            .items
            .iter()
            .map(|n| u64::from(allocatable_gpus(n)))
            .sum();
        Ok(summarise(
            &name_to_pod,
            &name_to_bound_at,
            pods,
            gpus_total,
            timed_out,
        ))
    })
}

fn summarise(
    name_to_pod: &HashMap<String, Pod>,
    name_to_bound_at: &HashMap<String, Duration>,
    pods: usize,
    gpus_total: u64,
    timed_out: bool,
) -> Outcome {
    // gang -> (pods seen, pods bound, when the last of them bound)
    let mut gang_to_progress: HashMap<String, (usize, usize, Duration)> = HashMap::new();
    let mut gpus_bound = 0u64;
    for (name, pod) in name_to_pod {
        let bound_at = name_to_bound_at.get(name).copied();
        if bound_at.is_some() {
            gpus_bound += u64::from(gpus_of(pod));
        }
        if let Some(gang) = pod.labels().get(BENCH_GANG_LABEL) {
            let entry = gang_to_progress.entry(gang.clone()).or_default();
            entry.0 += 1;
            if let Some(at) = bound_at {
                entry.1 += 1;
                entry.2 = entry.2.max(at);
            }
        }
    }
    let partial_gangs = gang_to_progress
        .values()
        .filter(|(seen, bound, _)| *bound > 0 && bound < seen)
        .count();
    let all_placed = gang_to_progress
        .values()
        .all(|(seen, bound, _)| bound == seen);
    let all_gangs_placed_s = all_placed.then(|| {
        gang_to_progress
            .values()
            .map(|(_, _, at)| at.as_secs_f64())
            .fold(0.0, f64::max)
    });
    // The largest gang; of equal ones, the first by name, so every contender is timed on the
    // same gang.
    let largest = gang_to_progress
        .iter()
        .max_by(|a, b| a.1.0.cmp(&b.1.0).then(b.0.cmp(a.0)))
        .map(|(_, progress)| *progress);
    let first = name_to_bound_at.values().min().map(Duration::as_secs_f64);
    let last = name_to_bound_at.values().max().map(Duration::as_secs_f64);
    let bound = name_to_bound_at.len();
    Outcome {
        pods,
        pods_bound: bound,
        pods_unbound: pods.saturating_sub(bound),
        first_bind_s: first,
        last_bind_s: last,
        pods_per_s: match last {
            Some(last) if last > 0.0 => bound as f64 / last,
            _ => 0.0,
        },
        gangs: gang_to_progress.len(),
        all_gangs_placed_s,
        partial_gangs,
        largest_gang_pods: largest.map_or(0, |(seen, _, _)| seen),
        largest_gang_bound_s: largest
            .filter(|(seen, bound, _)| seen == bound)
            .map(|(_, _, at)| at.as_secs_f64()),
        gpus_bound,
        gpus_total,
        gpu_allocation: if gpus_total == 0 {
            0.0
        } else {
            gpus_bound as f64 / gpus_total as f64
        },
        timed_out,
    }
}

/// The ceiling: lists the nodes and the unbound benchmark pods, decides every pod's node up
/// front (first fit by free GPUs, gangs kept whole), then binds them all, `BIND_CONCURRENCY` at
/// a time, the way Gantry's binder does. Returns how many it bound.
pub fn raw_bind(kubeconfig: &Path, namespace: &str) -> Result<usize> {
    let runtime = runtime()?;
    let client = client(&runtime, kubeconfig)?;
    runtime.block_on(async {
        let nodes = Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| anyhow!(format!("cannot list nodes: {e}")))?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let mut list = pods
            .list(&ListParams::default().labels(BENCH_LABEL))
            .await
            .map_err(|e| anyhow!(format!("cannot list pods: {e}")))?
            .items;
        list.retain(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_none()));
        // Gang members next to each other, so first fit keeps a gang together.
        list.sort_by(|a, b| {
            let key = |p: &Pod| (p.labels().get(BENCH_GANG_LABEL).cloned(), p.name_any());
            key(a).cmp(&key(b))
        });
        let mut free: Vec<(String, u32)> = nodes
            .items
            .iter()
            .map(|n| (n.name_any(), allocatable_gpus(n)))
            .collect();
        let mut plan: Vec<(String, String)> = Vec::with_capacity(list.len());
        let mut cursor = 0;
        for pod in &list {
            let want = gpus_of(pod);
            let Some(offset) = (0..free.len())
                .map(|i| (cursor + i) % free.len())
                .find(|&i| free[i].1 >= want)
            else {
                return Err(anyhow!(format!(
                    "no node has {want} free GPUs for pod {}",
                    pod.name_any()
                )));
            };
            free[offset].1 -= want;
            cursor = offset;
            plan.push((pod.name_any(), free[offset].0.clone()));
        }
        let results: Vec<Result<()>> = futures::stream::iter(plan)
            .map(|(pod, node)| bind_one(&client, namespace, pod, node))
            .buffer_unordered(BIND_CONCURRENCY)
            .collect()
            .await;
        let bound = results.iter().filter(|r| r.is_ok()).count();
        if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
            return Err(e);
        }
        Ok(bound)
    })
}

async fn bind_one(client: &Client, namespace: &str, pod: String, node: String) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(pod.clone()),
            namespace: Some(namespace.to_string()),
            ..ObjectMeta::default()
        },
        target: ObjectReference {
            kind: Some("Node".into()),
            name: Some(node.clone()),
            api_version: Some("v1".into()),
            ..ObjectReference::default()
        },
    };
    pods.create_subresource::<_, serde_json::Value>(
        "binding",
        &pod,
        &PostParams::default(),
        &binding,
    )
    .await
    .map(|_| ())
    .map_err(|e| {
        gantry_kube::Error::Bind {
            pod,
            node,
            message: e.to_string(),
        }
        .into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_openai_workload_asks_for_ninety_percent_with_seventy_in_big_gangs() {
        for nodes in [32, 1000, 2500, 5000, 7500] {
            let pods = workload(Workload::Openai, 0, nodes).unwrap();
            let gpus: usize = pods.iter().map(|p| p.gpus as usize).sum();
            assert_eq!(gpus, nodes * 8 * 9 / 10, "{nodes} nodes");
            let in_gangs: Vec<&BenchPod> = pods.iter().filter(|p| p.gang.is_some()).collect();
            assert!(in_gangs.iter().all(|p| p.gpus == 8));
            let gang_share = (in_gangs.len() * 8) as f64 / gpus as f64;
            // Gangs come in steps of 16 pods, so a small cluster falls short of 70%.
            let low = if nodes >= 1000 { 0.65 } else { 0.5 };
            assert!((low..=0.70).contains(&gang_share), "{nodes}: {gang_share}");
            let mut gang_to_count: BTreeMap<&str, (u32, u32)> = BTreeMap::new();
            for p in &in_gangs {
                let (g, size) = p.gang.as_ref().unwrap();
                let e = gang_to_count.entry(g).or_default();
                e.0 += 1;
                e.1 = *size;
            }
            assert!(
                gang_to_count
                    .values()
                    .all(|(n, size)| n == size && *n >= 16)
            );
            let largest = gang_to_count.values().map(|(n, _)| *n).max().unwrap();
            assert_eq!(largest, if nodes >= 1000 { 256 } else { 16 }, "{nodes}");
            let small = pods.iter().filter(|p| p.gpus < 8).count();
            assert!(
                small > 0 && small * 10 < pods.len(),
                "a few small pods: {small}"
            );
        }
    }

    #[test]
    fn a_workload_that_cannot_be_served_is_refused_naming_why() {
        let too_big = workload(Workload::Openai, 0, 7501).unwrap_err().to_string();
        assert!(
            too_big.contains("openai workload is defined for 32 to 7500 nodes, not 7501"),
            "{too_big}"
        );
        assert!(workload(Workload::Mixed, 0, 100).is_err());
        let unknown = "slurm".parse::<Workload>().unwrap_err();
        assert_eq!(unknown, "unknown workload \"slurm\": use mixed or openai");
        assert!("upstream".parse::<GangApi>().is_ok());
    }

    #[test]
    fn gang_members_name_their_gang_in_the_api_asked_for() {
        let pod = BenchPod {
            name: "g-0".into(),
            gpus: 8,
            gang: Some(("g".into(), 16)),
        };
        let plugins = pod_object(&pod, "s", GangApi::Plugins);
        assert_eq!(
            plugins.labels().get(POD_GROUP_LABEL).map(String::as_str),
            Some("g")
        );
        let upstream = serde_json::to_value(pod_object(&pod, "s", GangApi::Upstream)).unwrap();
        assert_eq!(
            upstream["spec"]["schedulingGroup"]["podGroupName"],
            "g-workers"
        );
        assert_eq!(upstream["metadata"]["labels"][BENCH_GANG_LABEL], "g");
        assert!(
            upstream["metadata"]["labels"]
                .get(POD_GROUP_LABEL)
                .is_none()
        );
        let objects = gang_objects("g", 16, GangApi::Upstream);
        assert_eq!(objects[0].0.kind, "Workload");
        assert_eq!(
            objects[1].1.data["spec"]["workloadRef"]["workloadName"],
            "g"
        );
        assert_eq!(
            objects[1].1.data["spec"]["schedulingPolicy"]["gang"]["minCount"],
            16
        );
    }

    #[test]
    fn the_workload_is_half_gangs_and_fits_seventy_percent_of_eight_gpu_nodes() {
        let pods = mixed_workload(5000);
        assert_eq!(pods.len(), 5000);
        let in_gangs = pods.iter().filter(|p| p.gang.is_some()).count();
        assert_eq!(in_gangs, 2500);
        let gpus: u32 = pods.iter().map(|p| p.gpus).sum();
        assert_eq!(gpus, 2500 + 2500 * 5 / 4);
        assert!(f64::from(gpus) / 8000.0 <= 0.71);
        // Every gang's declared size is the number of its pods.
        let mut gang_to_count: BTreeMap<String, (u32, u32)> = BTreeMap::new();
        for p in &pods {
            if let Some((g, size)) = &p.gang {
                let e = gang_to_count.entry(g.clone()).or_default();
                e.0 += 1;
                e.1 = *size;
            }
        }
        assert!(gang_to_count.values().all(|(n, size)| n == size));
        assert_eq!(mixed_workload(10).len(), 10);
    }
}
