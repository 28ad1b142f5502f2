//! The measuring side of `tests/cluster/bench.sh`, which races Gantry, kube-scheduler with the
//! Coscheduling plugin, and a raw binder on the same cluster and the same pods:
//!
//! - [`create_pods`]: the workload, a fixed mix of single pods and gangs (scheduler-plugins
//!   `PodGroup`s, which both Gantry and Coscheduling read), created before any scheduler runs;
//! - [`watch`]: starts the scheduler under test once every pod exists, and times each binding as
//!   the watch sees it, until every pod is bound or time runs out;
//! - [`raw_bind`]: the ceiling, binding pods to nodes decided up front, with no scheduling.
//!
//! All three talk to the API server through this crate's client, with the binder's concurrency.

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

use crate::cluster::{CONCURRENCY as BIND_CONCURRENCY, client, runtime};
use crate::{Error, Result};

/// Every benchmark pod carries this label, so the watch and the raw binder see only them.
pub const BENCH_LABEL: &str = "gantry.dev/bench";
/// scheduler-plugins' PodGroup label, read by Coscheduling and by Gantry alike.
const POD_GROUP_LABEL: &str = "scheduling.x-k8s.io/pod-group";

/// One pod of the workload: its name, GPUs, and gang (name, size) if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchPod {
    pub name: String,
    pub gpus: u32,
    pub gang: Option<(String, u32)>,
}

/// The workload for `pods` pods: half of them in gangs of 4, 8, 16 and 32 one-GPU pods (in
/// turn; the last gang is cut to fit), the rest single pods asking for 1, 1, 1 and 2 GPUs (in
/// turn). Deterministic, so every contender gets the same pods; 1.125 GPUs per pod on average,
/// so 5,000 pods fill 70% of 1,000 eight-GPU nodes and everything fits.
pub fn workload(pods: usize) -> Vec<BenchPod> {
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

fn pod_object(pod: &BenchPod, scheduler_name: &str) -> Pod {
    let mut labels = json!({BENCH_LABEL: "1"});
    if let Some((gang, _)) = &pod.gang {
        labels[POD_GROUP_LABEL] = json!(gang);
    }
    serde_json::from_value(json!({
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
    }))
    .expect("a valid pod")
}

/// Creates the PodGroups and pods of [`workload`] in `namespace`, for `scheduler_name`.
/// Objects that exist already are left alone. Calls `progress` after each pod.
pub fn create_pods(
    kubeconfig: &Path,
    namespace: &str,
    pods: usize,
    scheduler_name: &str,
    progress: &(dyn Fn() + Sync),
) -> Result<usize> {
    let runtime = runtime()?;
    let client = client(&runtime, kubeconfig)?;
    let workload = workload(pods);
    let groups: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &pod_group_resource());
    let pods_api: Api<Pod> = Api::namespaced(client, namespace);
    let mut gang_to_size: BTreeMap<&str, u32> = BTreeMap::new();
    for pod in &workload {
        if let Some((gang, size)) = &pod.gang {
            gang_to_size.insert(gang, *size);
        }
    }
    runtime.block_on(async {
        let created: Vec<Result<()>> = futures::stream::iter(gang_to_size)
            .map(|(gang, size)| {
                let groups = groups.clone();
                async move {
                    let mut group = DynamicObject::new(gang, &pod_group_resource());
                    group.data = json!({"spec": {"minMember": size}});
                    create_tolerating_conflict(groups.create(&PostParams::default(), &group).await)
                        .map_err(|message| Error::Bench(format!("PodGroup {gang}: {message}")))
                }
            })
            .buffer_unordered(BIND_CONCURRENCY)
            .collect()
            .await;
        created.into_iter().collect::<Result<Vec<()>>>()?;
        let created: Vec<Result<()>> = futures::stream::iter(&workload)
            .map(|pod| {
                let pods_api = pods_api.clone();
                async move {
                    let result = create_tolerating_conflict(
                        pods_api
                            .create(&PostParams::default(), &pod_object(pod, scheduler_name))
                            .await,
                    )
                    .map_err(|message| Error::Bench(format!("pod {}: {message}", pod.name)));
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
    crate::mapping::pod_request(pod, &crate::KubeConfig::default()).gpus
}

/// A node's allocatable GPUs.
fn allocatable_gpus(node: &Node) -> u32 {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(&crate::KubeConfig::default().gpu_resource))
        .and_then(|q| crate::quantity::count(&q.0))
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
                        return Err(Error::Bench(format!(
                            "only {} of the {pods} benchmark pods exist; create them first",
                            name_to_pod.len()
                        )));
                    }
                    if let Some(start) = start.take() {
                        started = Some(Instant::now());
                        start().map_err(Error::Bench)?;
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
            .map_err(|e| Error::Bench(format!("cannot list nodes: {e}")))?;
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
        if let Some(gang) = pod.labels().get(POD_GROUP_LABEL) {
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
            .map_err(|e| Error::Bench(format!("cannot list nodes: {e}")))?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let mut list = pods
            .list(&ListParams::default().labels(BENCH_LABEL))
            .await
            .map_err(|e| Error::Bench(format!("cannot list pods: {e}")))?
            .items;
        list.retain(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_none()));
        // Gang members next to each other, so first fit keeps a gang together.
        list.sort_by(|a, b| {
            let key = |p: &Pod| (p.labels().get(POD_GROUP_LABEL).cloned(), p.name_any());
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
                return Err(Error::Bench(format!(
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
    .map_err(|e| Error::Bind {
        pod,
        node,
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_is_half_gangs_and_fits_seventy_percent_of_eight_gpu_nodes() {
        let pods = workload(5000);
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
        assert_eq!(workload(10).len(), 10);
    }
}
