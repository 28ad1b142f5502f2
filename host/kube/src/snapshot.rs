//! The watch caches turned into the core's model, once per cycle: a node table with what bound
//! pods use already reserved, a queue per queue label, and one job per single pod or complete
//! gang. Pure (no I/O), so every mapping rule is unit-tested without a cluster.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use gantry_core::{
    ClusterState, Health, JobSpec, LevelColumn, NodeTable, PodShape, QueueDef, Queues, Resources,
    Scheduler, SchedulerConfig, Symbols, Taint, TaintEffect, Toleration, TopologyPref,
};
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::config::KubeConfig;
use crate::quantity;

/// A pod Gantry is deciding about, with what the binder needs to act on it.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingPod {
    /// The cached object: once bound, it counts as running until the bound-pod cache has it.
    pub pod: Arc<Pod>,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The pod's `PodScheduled` condition as the cache has it: `(status, reason, message)`.
    /// The binder patches only when the new one differs.
    pub scheduled_condition: Option<(String, String, String)>,
}

impl PendingPod {
    pub(crate) fn of(pod: &Arc<Pod>) -> Self {
        let condition = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
            .map(|c| {
                (
                    c.status.clone(),
                    c.reason.clone().unwrap_or_default(),
                    c.message.clone().unwrap_or_default(),
                )
            });
        Self {
            pod: pod.clone(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            scheduled_condition: condition,
        }
    }

    /// `namespace/name`, as kube-scheduler's messages name a pod.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// One cycle's input: the scheduler with the cluster as it is, the pods behind each job, and
/// the pods that cannot be a job yet.
pub struct Snapshot {
    pub scheduler: Scheduler,
    /// Indexed by `JobId`: the job's name and its pods, in submission order. The first
    /// [`Snapshot::adopted`] are bound pods the core may preempt (running jobs); the rest are
    /// pending.
    pub jobs: Vec<(String, Vec<PendingPod>)>,
    /// How many of `jobs` are adopted bound pods.
    pub adopted: usize,
    /// Pods waiting before any placement is tried (an incomplete gang, an unknown PodGroup),
    /// with the reason in kube-scheduler's words.
    pub waiting: Vec<(PendingPod, String)>,
    /// Node names by node index.
    pub node_names: Vec<String>,
}

impl Snapshot {
    /// `(pod, job)` names for every gang member, for the API's pod lookup.
    pub fn pod_to_job(&self) -> Vec<(String, String)> {
        self.jobs
            .iter()
            .filter(|(_, pods)| pods.len() > 1)
            .flat_map(|(job, pods)| pods.iter().map(move |p| (p.key(), job.clone())))
            .collect()
    }
}

/// What one pod asks for, summed over its containers (extended resources count their limit
/// when no request is given, as the API server defaults them).
pub(crate) fn pod_request(pod: &Pod, config: &KubeConfig) -> (u32, u32, u32) {
    let (mut gpus, mut cpu, mut mem) = (0u64, 0u64, 0u64);
    for container in pod.spec.iter().flat_map(|s| &s.containers) {
        let Some(resources) = &container.resources else {
            continue;
        };
        let get = |name: &str| {
            resources
                .requests
                .as_ref()
                .and_then(|r| r.get(name))
                .or_else(|| resources.limits.as_ref().and_then(|l| l.get(name)))
                .map(|q| q.0.as_str())
        };
        gpus += get(&config.gpu_resource)
            .and_then(quantity::count)
            .unwrap_or(0);
        cpu += get("cpu").and_then(quantity::cpu_milli).unwrap_or(0);
        mem += get("memory").and_then(quantity::memory_mib).unwrap_or(0);
    }
    let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    (clamp(gpus), clamp(cpu), clamp(mem))
}

fn taint_effect(effect: &str) -> Option<TaintEffect> {
    match effect {
        "NoSchedule" => Some(TaintEffect::NoSchedule),
        "PreferNoSchedule" => Some(TaintEffect::PreferNoSchedule),
        "NoExecute" => Some(TaintEffect::NoExecute),
        _ => None,
    }
}

/// The pod's shape as the core sees it (name and queue filled in by the caller).
fn pod_shape(pod: &Pod, config: &KubeConfig, symbols: &Symbols) -> PodShape {
    let (gpus, cpu_milli, memory_mib) = pod_request(pod, config);
    let spec = pod.spec.as_ref();
    let tolerations = spec
        .and_then(|s| s.tolerations.as_ref())
        .into_iter()
        .flatten()
        .map(|t| Toleration {
            key: symbols.intern(t.key.as_deref().unwrap_or("")),
            exists: t.operator.as_deref() == Some("Exists"),
            value: symbols.intern(t.value.as_deref().unwrap_or("")),
            effect: t.effect.as_deref().and_then(taint_effect),
        })
        .collect();
    let gpu_type = spec
        .and_then(|s| s.node_selector.as_ref())
        .and_then(|s| s.get(&config.gpu_type_label))
        .map_or(0, |t| symbols.intern(t));
    PodShape {
        priority: spec.and_then(|s| s.priority).unwrap_or(0),
        gpus,
        gpu_type,
        cpu_milli,
        memory_mib,
        tolerations,
        gang_size: 1,
        ..PodShape::default()
    }
}

fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// Whether a bound pod is a balloon: a placeholder holding capacity that gives way at once.
fn is_balloon(pod: &Pod, config: &KubeConfig) -> bool {
    label(pod, &config.balloon_label) == Some("true")
}

fn queue_of(pod: &Pod, config: &KubeConfig) -> String {
    config
        .queue_labels
        .iter()
        .find_map(|key| label(pod, key))
        .unwrap_or(&config.default_queue)
        .to_string()
}

/// How a pod belongs to a gang.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Gang {
    Single,
    /// `(namespace, name)`; the size comes from the `PodGroup`'s `minMember`.
    PodGroup(String, String),
    /// `(namespace, name)` and the size label's text.
    Labels(String, String, Option<String>),
}

fn gang_of(pod: &Pod, config: &KubeConfig) -> Gang {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    if let Some(group) = label(pod, &config.pod_group_label) {
        Gang::PodGroup(namespace, group.into())
    } else if let Some(gang) = label(pod, &config.gang_label) {
        Gang::Labels(
            namespace,
            gang.into(),
            label(pod, &config.gang_size_label).map(str::to_string),
        )
    } else {
        Gang::Single
    }
}

fn node_health(node: &Node) -> Health {
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        return Health::Cordoned;
    }
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    if ready {
        Health::Healthy
    } else {
        Health::NotReady
    }
}

/// The caches, as [`build`] reads them.
pub struct Inputs<'a> {
    pub nodes: &'a [Arc<Node>],
    /// Pods bound to a node and not finished, ours or not.
    pub bound: &'a [Arc<Pod>],
    /// Our unbound pods.
    pub pending: &'a [Arc<Pod>],
    /// Pods this process bound whose binding the caches may not show yet, and their nodes.
    pub assumed: &'a [(Arc<Pod>, String)],
    /// `minMember` of each `PodGroup`, by `(namespace, name)`.
    pub pod_groups: &'a HashMap<(String, String), u32>,
    /// Pending pods (by uid) that wait on a preemption in progress, with the reason: they are
    /// not scheduled again until their victims are gone.
    pub held: &'a HashMap<String, String>,
    /// Preemptors' pods and their nominated nodes: room held for them as their victims leave,
    /// as kube-scheduler counts nominated pods.
    pub nominated: &'a [(Arc<Pod>, String)],
    /// The declared queues (`Queue` objects, checked); empty means every queue may use the
    /// whole cluster.
    pub queues: &'a [QueueDef],
}

/// Builds the cycle's scheduler from the caches.
pub fn build(
    inputs: &Inputs<'_>,
    config: &KubeConfig,
    symbols: &Arc<Symbols>,
    scheduler_config: SchedulerConfig,
) -> Snapshot {
    // Nodes in name order, so node indexes are stable while the node set is.
    let mut nodes: Vec<&Node> = inputs.nodes.iter().map(Arc::as_ref).collect();
    nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut table = NodeTable {
        taint_sets: vec![Vec::new()],
        ..NodeTable::default()
    };
    let mut taint_set_ids: HashMap<Vec<Taint>, u32> = HashMap::new();
    let mut node_names = Vec::with_capacity(nodes.len());
    for node in &nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        let get = |key: &str, parse: fn(&str) -> Option<u64>| {
            allocatable
                .and_then(|a| a.get(key))
                .and_then(|q| parse(&q.0))
                .unwrap_or(0)
        };
        let gpus = get(&config.gpu_resource, quantity::count).min(u64::from(u16::MAX)) as u32;
        let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        table.name.push(symbols.intern(&name));
        table.gpu_total.push(gpus);
        table.gpu_free.push(gpus);
        table
            .gpu_milli_free_max
            .push(if gpus > 0 { 1000 } else { 0 });
        let gpu_type = node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(&config.gpu_type_label))
            .map_or(0, |t| symbols.intern(t));
        table.gpu_type.push(gpu_type);
        table
            .cpu_free_milli
            .push(clamp(get("cpu", quantity::cpu_milli)));
        table
            .memory_free_mib
            .push(clamp(get("memory", quantity::memory_mib)));
        table.health.push(node_health(node) as u8);
        let mut taints: Vec<Taint> = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|t| {
                Some(Taint {
                    key: symbols.intern(&t.key),
                    value: symbols.intern(t.value.as_deref().unwrap_or("")),
                    effect: taint_effect(&t.effect)?,
                })
            })
            .collect();
        let set = if taints.is_empty() {
            0
        } else {
            taints.sort_by_key(|t| (t.key, t.value, t.effect as u8));
            let next = table.taint_sets.len() as u32;
            *taint_set_ids.entry(taints.clone()).or_insert_with(|| {
                table.taint_sets.push(taints);
                next
            })
        };
        table.taint_set.push(set);
        node_names.push(name);
    }
    // Topology: each configured level whose label some node carries, domains numbered in node
    // order.
    for level in &config.topology {
        let mut domains: HashMap<&str, u32> = HashMap::new();
        let node_domain: Vec<u32> = nodes
            .iter()
            .map(|node| {
                match node
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(&level.key))
                {
                    Some(value) => {
                        let next = domains.len() as u32;
                        *domains.entry(value.as_str()).or_insert(next)
                    }
                    None => u32::MAX,
                }
            })
            .collect();
        if !domains.is_empty() {
            let column =
                LevelColumn::from_node_domains(symbols.intern(&level.level), node_domain, &table);
            table.levels.push(column);
        }
    }
    let node_index: HashMap<&str, usize> = node_names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    let capacity = Resources {
        gpus: table.gpu_total.iter().map(|&g| u64::from(g)).sum(),
        cpu_milli: table.cpu_free_milli.iter().map(|&c| u64::from(c)).sum(),
        memory_mib: table.memory_free_mib.iter().map(|&m| u64::from(m)).sum(),
    };
    let mut state = ClusterState::new(table);

    // What runs already: every bound pod, and the ones we bound that the cache lags behind on.
    let bound_uids: std::collections::HashSet<&str> = inputs
        .bound
        .iter()
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    let assumed = inputs
        .assumed
        .iter()
        .filter(|(pod, _)| !bound_uids.contains(pod.metadata.uid.as_deref().unwrap_or("")))
        .map(|(pod, node)| (pod, Some(node.as_str())));
    let running: Vec<(&Arc<Pod>, Option<&str>)> = inputs
        .bound
        .iter()
        .map(|pod| (pod, pod.spec.as_ref().and_then(|s| s.node_name.as_deref())))
        .chain(assumed)
        .collect();
    let mut queue_used: BTreeMap<String, u64> = BTreeMap::new();
    let mut gang_bound: HashMap<Gang, u32> = HashMap::new();
    // Bound pods the core may preempt, grouped as jobs (a gang is evicted whole): ours and
    // balloons, unless already terminating. Everything else is a plain reservation.
    type Members<'p> = Vec<(&'p Arc<Pod>, usize)>;
    let mut adoptable: Vec<(Gang, Members<'_>)> = Vec::new();
    let mut adoptable_index: HashMap<Gang, usize> = HashMap::new();
    for (pod, node) in &running {
        let Some(&index) = node.and_then(|n| node_index.get(n)) else {
            continue;
        };
        let ours = pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref())
            == Some(config.scheduler_name.as_str());
        let gang = gang_of(pod, config);
        if ours && gang != Gang::Single {
            *gang_bound.entry(gang.clone()).or_default() += 1;
        }
        let terminating = pod.metadata.deletion_timestamp.is_some();
        if (ours || is_balloon(pod, config)) && !terminating {
            if gang == Gang::Single {
                adoptable.push((gang, vec![(pod, index)]));
            } else if let Some(&i) = adoptable_index.get(&gang) {
                adoptable[i].1.push((pod, index));
            } else {
                adoptable_index.insert(gang.clone(), adoptable.len());
                adoptable.push((gang, vec![(pod, index)]));
            }
            continue;
        }
        let request = pod_request(pod, config);
        if ours {
            *queue_used.entry(queue_of(pod, config)).or_default() += u64::from(request.0);
        }
        reserve_clamped(&mut state, index, request);
    }

    // Our pending pods, grouped into jobs. Pods we just bound are not pending any more, and
    // neither is a pod the bound-pod cache already holds: the two caches are separate watches,
    // so the unbound one may still list a pod the other has seen bound (and the assumption for
    // it is dropped once the bound cache has it).
    let assumed_uids: std::collections::HashSet<&str> = inputs
        .assumed
        .iter()
        .filter_map(|(p, _)| p.metadata.uid.as_deref())
        .chain(
            inputs
                .bound
                .iter()
                .filter_map(|p| p.metadata.uid.as_deref()),
        )
        .collect();
    let mut waiting = Vec::new();
    let mut pending: Vec<&Arc<Pod>> = Vec::new();
    for pod in inputs
        .pending
        .iter()
        .filter(|p| !assumed_uids.contains(p.metadata.uid.as_deref().unwrap_or("")))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        match inputs.held.get(pod.metadata.uid.as_deref().unwrap_or("")) {
            Some(why) => waiting.push((PendingPod::of(pod), why.clone())),
            None => pending.push(pod),
        }
    }
    // Oldest first, as kube-scheduler's FIFO within one priority.
    pending.sort_by(|a, b| {
        (&a.metadata.creation_timestamp, &a.metadata.name)
            .cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
    });
    let mut groups: Vec<(Gang, Vec<&Arc<Pod>>)> = Vec::new();
    let mut group_index: HashMap<Gang, usize> = HashMap::new();
    for pod in pending {
        let gang = gang_of(pod, config);
        if gang == Gang::Single {
            groups.push((gang, vec![pod]));
            continue;
        }
        match group_index.get(&gang) {
            Some(&i) => groups[i].1.push(pod),
            None => {
                group_index.insert(gang.clone(), groups.len());
                groups.push((gang, vec![pod]));
            }
        }
    }

    let mut queue_names: Vec<String> = queue_used.keys().cloned().collect();
    for pod in groups
        .iter()
        .map(|(_, pods)| pods[0])
        .chain(adoptable.iter().map(|(_, pods)| pods[0].0))
    {
        let queue = queue_of(pod, config);
        if !queue_names.contains(&queue) {
            queue_names.push(queue);
        }
    }
    let queues = queue_tree(inputs.queues, &queue_names, capacity);
    let mut scheduler = Scheduler::new(state, queues, symbols.clone(), scheduler_config);

    // Adopted jobs first, so their ids index `jobs` from 0. A group the node table cannot hold
    // whole (someone overcommitted the node) is only reserved, never preempted.
    let mut jobs = Vec::new();
    for (gang, pods) in adoptable {
        let mut per_node: HashMap<usize, u32> = HashMap::new();
        let mut shape = pod_shape(pods[0].0, config, symbols);
        for (pod, node) in &pods {
            let other = pod_shape(pod, config, symbols);
            shape.gpus = shape.gpus.max(other.gpus);
            shape.cpu_milli = shape.cpu_milli.max(other.cpu_milli);
            shape.memory_mib = shape.memory_mib.max(other.memory_mib);
            shape.priority = shape.priority.max(other.priority);
            *per_node.entry(*node).or_default() += 1;
        }
        let fits = per_node
            .iter()
            .all(|(&node, &n)| scheduler.state.capacity_for(node, &shape) >= n);
        let first = pods[0].0;
        let queue = queue_of(first, config);
        let ours = first
            .spec
            .as_ref()
            .and_then(|s| s.scheduler_name.as_deref())
            == Some(config.scheduler_name.as_str());
        if !fits {
            for (pod, node) in &pods {
                let request = pod_request(pod, config);
                if ours && let Some(id) = scheduler.queues.id(&queue) {
                    scheduler
                        .queues
                        .charge(id, Resources::gpus(u64::from(request.0)), true);
                }
                reserve_clamped(&mut scheduler.state, *node, request);
            }
            continue;
        }
        let namespace = first.metadata.namespace.clone().unwrap_or_default();
        let name = match &gang {
            Gang::Single => format!(
                "{namespace}/{}",
                first.metadata.name.as_deref().unwrap_or_default()
            ),
            Gang::PodGroup(ns, group) | Gang::Labels(ns, group, _) => format!("{ns}/{group}"),
        };
        shape.name = symbols.intern(&name);
        shape.queue = symbols.intern(&queue);
        shape.gang_size = pods.len() as u32;
        let nodes: Vec<usize> = pods.iter().map(|(_, node)| *node).collect();
        let spec = JobSpec {
            name: name.clone(),
            queue: scheduler.queues.id(&queue).unwrap_or(0),
            priority: shape.priority,
            pods: pods.len() as u32,
            shape,
            balloon: is_balloon(first, config),
            topology: TopologyPref::default(),
            submit_s: created_s(first),
        };
        scheduler.adopt(spec, &nodes);
        jobs.push((name, pods.iter().map(|(p, _)| PendingPod::of(p)).collect()));
    }
    let adopted = jobs.len();
    for (name, gpus) in &queue_used {
        if let Some(id) = scheduler.queues.id(name) {
            scheduler.queues.charge(id, Resources::gpus(*gpus), true);
        }
    }
    // Room held for preemptors, out of what their victims leave behind.
    for (pod, node) in inputs.nominated {
        if let Some(&index) = node_index.get(node.as_str()) {
            reserve_clamped(&mut scheduler.state, index, pod_request(pod, config));
        }
    }

    for (gang, pods) in groups {
        let members: Vec<PendingPod> = pods.iter().map(|p| PendingPod::of(p)).collect();
        let (job_name, min_member) = match &gang {
            Gang::Single => (members[0].key(), 1),
            Gang::PodGroup(ns, group) => {
                match inputs.pod_groups.get(&(ns.clone(), group.clone())) {
                    Some(&min) => (format!("{ns}/{group}"), min),
                    None => {
                        let why = format!(
                            "pod group {ns}/{group} not found (scheduling.x-k8s.io PodGroup named by label {})",
                            config.pod_group_label
                        );
                        waiting.extend(members.into_iter().map(|m| (m, why.clone())));
                        continue;
                    }
                }
            }
            Gang::Labels(ns, name, size) => match size.as_deref().map(str::parse::<u32>) {
                Some(Ok(size)) if size > 0 => (format!("{ns}/{name}"), size),
                _ => {
                    let why = format!(
                        "gang {ns}/{name}: label {} must be a positive number of pods, found {}",
                        config.gang_size_label,
                        size.as_deref()
                            .map_or("none".to_string(), |s| format!("{s:?}"))
                    );
                    waiting.extend(members.into_iter().map(|m| (m, why.clone())));
                    continue;
                }
            },
        };
        let already = gang_bound.get(&gang).copied().unwrap_or(0);
        let needed = min_member.saturating_sub(already);
        if (members.len() as u32) < needed {
            let why = format!(
                "gang {job_name} has {} of its {min_member} pods ({already} bound, {} pending)",
                already as usize + members.len(),
                members.len()
            );
            waiting.extend(members.into_iter().map(|m| (m, why.clone())));
            continue;
        }
        // A gang's pods share one shape: the largest ask of each resource among them.
        let mut shape = pod_shape(pods[0], config, symbols);
        for pod in &pods[1..] {
            let other = pod_shape(pod, config, symbols);
            shape.gpus = shape.gpus.max(other.gpus);
            shape.cpu_milli = shape.cpu_milli.max(other.cpu_milli);
            shape.memory_mib = shape.memory_mib.max(other.memory_mib);
            shape.priority = shape.priority.max(other.priority);
        }
        let queue = queue_of(pods[0], config);
        shape.name = symbols.intern(&job_name);
        shape.queue = symbols.intern(&queue);
        shape.gang_size = members.len() as u32;
        let submit_s = created_s(pods[0]);
        scheduler.submit(JobSpec {
            name: job_name.clone(),
            queue: scheduler.queues.id(&queue).unwrap_or(0),
            priority: shape.priority,
            pods: members.len() as u32,
            shape,
            balloon: false,
            topology: TopologyPref::default(),
            submit_s,
        });
        jobs.push((job_name, members));
    }
    Snapshot {
        scheduler,
        jobs,
        adopted,
        waiting,
        node_names,
    }
}

fn created_s(pod: &Pod) -> f64 {
    pod.metadata
        .creation_timestamp
        .as_ref()
        .map_or(0.0, |t| t.0.as_second() as f64)
}

/// Reserves what a pod asks for on `node`, never more than the node has left: pods bound by
/// someone else may overcommit it.
fn reserve_clamped(state: &mut ClusterState, node: usize, (gpus, cpu, mem): (u32, u32, u32)) {
    let shape = PodShape {
        gpus: gpus.min(state.nodes.gpu_free[node]),
        cpu_milli: cpu.min(state.nodes.cpu_free_milli[node]),
        memory_mib: mem.min(state.nodes.memory_free_mib[node]),
        ..PodShape::default()
    };
    state.reserve(node, &shape);
}

/// The core's queue tree: the declared queues, plus a root of nominal 0 (it may borrow idle
/// quota) for each queue a pod names that none declares. With nothing declared, every queue
/// is a root that may use the whole cluster.
fn queue_tree(declared: &[QueueDef], used: &[String], capacity: Resources) -> Queues {
    let mut defs: Vec<QueueDef> = declared.to_vec();
    for name in used {
        if !defs.iter().any(|d| &d.name == name) {
            defs.push(QueueDef {
                name: name.clone(),
                parent: None,
                nominal_gpus: if declared.is_empty() {
                    capacity.gpus
                } else {
                    0
                },
                weight: 1,
                borrowing_limit_gpus: None,
                lending_limit_gpus: None,
            });
        }
    }
    // `crate::queues::check` left only unique names whose parents exist.
    Queues::new(&defs, capacity, 600.0).unwrap_or_else(|error| {
        tracing::error!(%error, "the declared queues do not form a tree; ignoring them");
        queue_tree(&[], used, capacity)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, NodeCondition, NodeSpec, NodeStatus, PodSpec, ResourceRequirements,
        Taint as KTaint,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(name: &str, gpus: u32, labels: &[(&str, &str)], ready: bool) -> Arc<Node> {
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec::default()),
            status: Some(NodeStatus {
                allocatable: Some(
                    [
                        ("nvidia.com/gpu", gpus.to_string()),
                        ("cpu", "64".into()),
                        ("memory", "512Gi".into()),
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
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
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

    fn snapshot(
        nodes: &[Arc<Node>],
        bound: &[Arc<Pod>],
        pending: &[Arc<Pod>],
        groups: &[((&str, &str), u32)],
    ) -> Snapshot {
        let pod_groups = groups
            .iter()
            .map(|((ns, n), m)| ((ns.to_string(), n.to_string()), *m))
            .collect();
        build(
            &Inputs {
                nodes,
                bound,
                pending,
                assumed: &[],
                pod_groups: &pod_groups,
                held: &HashMap::new(),
                nominated: &[],
                queues: &[],
            },
            &KubeConfig::default(),
            &Symbols::new(),
            SchedulerConfig::default(),
        )
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
        let snap = snapshot(&nodes, &[], &[], &[]);
        let t = &snap.scheduler.state.nodes;
        assert_eq!(snap.node_names, ["a", "b", "c"]);
        assert_eq!(t.gpu_total, [8, 8, 4]);
        assert_eq!(t.cpu_free_milli, [64_000; 3]);
        assert_eq!(t.memory_free_mib, [512 * 1024; 3]);
        assert_eq!(t.health(0), Health::NotReady);
        assert_eq!(t.health(1), Health::Healthy);
        assert_eq!(t.levels.len(), 1, "only the rack level is labelled");
        assert_eq!(t.levels[0].node_domain, [0, 1, u32::MAX]);
        assert_eq!(t.taints(2).len(), 1);
        assert!(t.taints(0).is_empty());
        let symbols = snap.scheduler.symbols();
        assert_eq!(&*symbols.resolve(t.gpu_type[1]), "H100");
    }

    #[test]
    fn bound_pods_use_capacity_and_queues() {
        let nodes = [node("a", 8, &[], true)];
        let bound = [pod("x", 6, &[("gantry.dev/queue", "team-a")], Some("a"))];
        let snap = snapshot(&nodes, &bound, &[], &[]);
        assert_eq!(snap.scheduler.state.nodes.gpu_free, [2]);
        let queues = &snap.scheduler.queues;
        assert_eq!(queues.used(queues.id("team-a").unwrap()).gpus, 6);
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
        let snap = snapshot(&nodes, &[], &pending, &[(("ns", "pg"), 2)]);
        let names: Vec<_> = snap
            .jobs
            .iter()
            .map(|(n, p)| (n.as_str(), p.len()))
            .collect();
        // Oldest first; equal creation times fall back to the name.
        assert_eq!(names, [("ns/g", 2), ("ns/pg", 2), ("ns/single", 1)]);
        let s = &snap.scheduler;
        assert_eq!(s.job(1).shape.gpus, 2, "a gang's shape is its largest ask");
        assert_eq!(s.queues.name(s.job(2).queue), "team-b");
        assert_eq!(s.queues.name(s.job(1).queue), "default");
        assert!(snap.waiting.is_empty());
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
        let snap = snapshot(&nodes, &[], &pending, &[(("ns", "pg"), 3)]);
        assert!(snap.jobs.is_empty());
        let reasons: Vec<_> = snap.waiting.iter().map(|(_, r)| r.as_str()).collect();
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
        let snap = snapshot(&nodes, &bound, &pending, &[(("ns", "pg"), 2)]);
        assert_eq!(snap.adopted, 1, "the bound member is a running job");
        assert_eq!(snap.jobs.len(), 2, "and the pending one completes the gang");
    }
    #[test]
    fn bound_balloons_and_our_pods_are_preemptable_jobs() {
        let nodes = [node("a", 8, &[], true), node("b", 8, &[], true)];
        let mut balloon =
            (*pod("balloon", 8, &[("gantry.dev/balloon", "true")], Some("a"))).clone();
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
        let mut snap = snapshot(&nodes, &bound, &[Arc::new(urgent)], &[]);
        assert_eq!(
            snap.adopted, 1,
            "only the balloon: the others are foreign or leaving"
        );
        assert_eq!(snap.jobs[0].0, "ns/balloon");
        assert!(snap.scheduler.job(0).balloon);
        assert_eq!(snap.scheduler.state.nodes.gpu_free, [0, 0]);
        let output = snap.scheduler.cycle(0.0, &mut gantry_core::BuiltinOnly);
        assert_eq!(output.evicted, [0]);
        assert!(output.decisions[0].placed);
        assert_eq!(output.decisions[0].explanation.preempted, ["ns/balloon"]);
    }

    #[test]
    fn held_preemptors_wait_and_their_room_is_kept() {
        let nodes = [node("a", 8, &[], true)];
        let p = pod("p", 8, &[], None);
        let held: HashMap<String, String> = [("uid-p".to_string(), "waiting".to_string())].into();
        let snap = build(
            &Inputs {
                nodes: &nodes,
                bound: &[],
                pending: &[p.clone(), pod("q", 8, &[], None)],
                assumed: &[],
                pod_groups: &HashMap::new(),
                held: &held,
                nominated: &[(p, "a".into())],
                queues: &[],
            },
            &KubeConfig::default(),
            &Symbols::new(),
            SchedulerConfig::default(),
        );
        assert_eq!(snap.waiting.len(), 1);
        assert_eq!(snap.waiting[0].1, "waiting");
        assert_eq!(snap.jobs.len(), 1, "only q is tried");
        assert_eq!(snap.scheduler.state.nodes.gpu_free, [0], "p's room is held");
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
        let mut snap = build(
            &Inputs {
                nodes: &nodes,
                bound: &bound,
                pending: &pending,
                assumed: &[],
                pod_groups: &HashMap::new(),
                held: &HashMap::new(),
                nominated: &[],
                queues: &[small],
            },
            &KubeConfig::default(),
            &Symbols::new(),
            SchedulerConfig::default(),
        );
        let output = snap.scheduler.cycle(0.0, &mut gantry_core::BuiltinOnly);
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
        let pending_pods = |snap: &Snapshot| {
            snap.jobs
                .iter()
                .flat_map(|(_, pods)| pods)
                .filter(|p| p.pod.spec.as_ref().is_some_and(|s| s.node_name.is_none()))
                .count()
        };
        let snap = snapshot(&nodes, &[bound], std::slice::from_ref(&unbound), &[]);
        assert_eq!(pending_pods(&snap), 0, "{:?}", snap.jobs);
        assert_eq!(snap.scheduler.state.nodes.gpu_free, [6, 8]);
        // Without the bound copy it is pending as usual.
        let snap = snapshot(&nodes, &[], &[unbound], &[]);
        assert_eq!(pending_pods(&snap), 1);
    }
}
