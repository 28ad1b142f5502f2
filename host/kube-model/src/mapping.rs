//! What Kubernetes objects mean to the core: a node's row in the node table (GPUs, model,
//! topology from labels, health from conditions and taints), a pod's shape, queue and gang,
//! and the queue tree. Pure (no I/O), so every mapping rule is unit-tested without a cluster;
//! [`crate::tracker`] applies them as objects change.

use std::collections::HashMap;
use std::sync::Arc;

use gantry_core::{
    Health, LevelColumn, NodeLabel, NodeRow, NodeTable, PodShape, QueueDef, Queues, ResourceColumn,
    Resources, Sym, Symbols, Taint, TaintEffect, Toleration,
};
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::config::KubeConfig;
use crate::health::Firing;
use crate::preflight::NodeStatus as PreflightStatus;
use crate::quantity;

/// A pod Gantry is deciding about, with what the binder needs to act on it.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingPod {
    /// The cached object: once bound, it counts as running until the bound-pod cache has it.
    pub pod: Arc<Pod>,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's uid, to tell it from a later pod of the same name.
    pub uid: String,
    /// The pod's `PodScheduled` condition as the cache has it: `(status, reason, message)`.
    /// The binder patches only when the new one differs.
    pub scheduled_condition: Option<(String, String, String)>,
}

impl PendingPod {
    /// The pod Gantry decides about for the cached object `pod`.
    pub fn of(pod: &Arc<Pod>) -> Self {
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

pub use crate::podspec::pod_request;

/// The annotation a pod declares its expected runtime in.
pub(crate) const EXPECTED_RUNTIME: &str = "gantry.dev/expected-runtime";

/// A pod's declared runtime in seconds: its `gantry.dev/expected-runtime` annotation ("90m",
/// "2h30m", "45s", "1d", or a bare number of seconds), capped by the pod's
/// `activeDeadlineSeconds` (it cannot run longer), or that deadline alone. `Err` carries the
/// warning a user reads when the annotation is malformed; the planner then learns the runtime
/// from finished jobs instead.
pub(crate) fn expected_runtime(pod: &Pod) -> Result<Option<f64>, String> {
    let deadline = pod
        .spec
        .as_ref()
        .and_then(|s| s.active_deadline_seconds)
        .filter(|&d| d > 0)
        .map(|d| d as f64);
    let declared = match pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EXPECTED_RUNTIME))
    {
        None => None,
        Some(text) => Some(parse_duration_s(text).ok_or_else(|| {
            format!(
                "annotation {EXPECTED_RUNTIME}: {text:?} is not a duration like 90m, 2h30m or 3600; the runtime is learned from finished jobs instead"
            )
        })?),
    };
    Ok(match (declared, deadline) {
        (Some(d), Some(limit)) => Some(d.min(limit)),
        (d, limit) => d.or(limit),
    })
}

/// "2h30m" → 9000; "90m", "45s", "1d", "1.5h", "3600". `None` for anything else, zero, or more
/// than a year.
fn parse_duration_s(text: &str) -> Option<f64> {
    let text = text.trim();
    if let Ok(seconds) = text.parse::<f64>() {
        return (seconds.is_finite() && seconds > 0.0 && seconds <= 366.0 * 86_400.0)
            .then_some(seconds);
    }
    let mut total = 0.0;
    let mut number = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let unit = match c {
            'd' => 86_400.0,
            'h' => 3600.0,
            'm' => 60.0,
            's' => 1.0,
            _ => return None,
        };
        total += number.parse::<f64>().ok()? * unit;
        number.clear();
    }
    (number.is_empty() && total > 0.0 && total <= 366.0 * 86_400.0).then_some(total)
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
pub(crate) fn pod_shape(pod: &Pod, config: &KubeConfig, symbols: &Symbols) -> PodShape {
    let request = pod_request(pod, config);
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
    let mut resources: Vec<(Sym, u32)> = request
        .other
        .iter()
        .map(|(name, &v)| (symbols.intern(name), v))
        .collect();
    resources.sort_unstable();
    PodShape {
        priority: spec.and_then(|s| s.priority).unwrap_or(0),
        gpus: request.gpus,
        gpu_type,
        cpu_milli: request.cpu_milli,
        memory_mib: request.memory_mib,
        tolerations,
        gang_size: 1,
        // A node affinity that cannot be read refuses the pod before it becomes a job
        // ([`crate::podspec::unsupported`]); here it is only ever `Ok`.
        node_affinity: crate::podspec::node_affinity(pod, symbols)
            .ok()
            .flatten()
            .map(Arc::new),
        resources,
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

/// Whether a pod is a balloon: a placeholder holding capacity that gives way at once and is
/// charged to no queue. The label alone is a tenant's claim; it counts only for a pod whose
/// PriorityClass or namespace is trusted ([`KubeConfig::balloon_priority_classes`],
/// [`KubeConfig::balloon_namespaces`]), otherwise the pod is ordinary work, charged to its queue.
pub(crate) fn is_balloon(pod: &Pod, config: &KubeConfig) -> bool {
    if label(pod, &config.balloon_label) != Some("true") {
        return false;
    }
    let class = pod
        .spec
        .as_ref()
        .and_then(|s| s.priority_class_name.as_deref());
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    class.is_some_and(|c| config.balloon_priority_classes.contains(c))
        || config.balloon_namespaces.contains(namespace)
}

/// What a pod's labels say about its queue, before anything is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueClaim {
    /// [`KubeConfig::queue_label`]: a Gantry `Queue` by name.
    Queue(String),
    /// [`KubeConfig::local_queue_label`]: a Kueue `LocalQueue` in the pod's namespace.
    LocalQueue(String),
    /// No queue label: [`KubeConfig::default_queue`].
    Default,
}

/// The pod's queue label, Gantry's first.
pub(crate) fn queue_claim(pod: &Pod, config: &KubeConfig) -> QueueClaim {
    if let Some(queue) = label(pod, &config.queue_label) {
        QueueClaim::Queue(queue.into())
    } else if let Some(local) = label(pod, &config.local_queue_label) {
        QueueClaim::LocalQueue(local.into())
    } else {
        QueueClaim::Default
    }
}

/// How a pod belongs to a gang: the key its job is grouped by.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Gang {
    /// A pod of its own: `(namespace, name)`.
    Single(String, String),
    /// `(namespace, name)`; the size comes from the `PodGroup`'s `minMember`.
    PodGroup(String, String),
    /// `(namespace, name)` of an upstream `scheduling.k8s.io` PodGroup (KEP-4671) with the gang
    /// policy, named by the pod's `spec.schedulingGroup.podGroupName`; the size is its
    /// `minCount`.
    Workload(String, String),
    /// `(namespace, name)` and the size label's text.
    Labels(String, String, Option<String>),
}

impl Gang {
    /// The namespace its pods are in.
    pub(crate) fn namespace(&self) -> &str {
        match self {
            Gang::Single(ns, _)
            | Gang::PodGroup(ns, _)
            | Gang::Workload(ns, _)
            | Gang::Labels(ns, _, _) => ns,
        }
    }

    /// The job's name: `namespace/pod` for a single pod, `namespace/group` for a gang.
    pub(crate) fn job_name(&self) -> String {
        match self {
            Gang::Single(ns, name)
            | Gang::PodGroup(ns, name)
            | Gang::Workload(ns, name)
            | Gang::Labels(ns, name, _) => format!("{ns}/{name}"),
        }
    }
}

/// An upstream `scheduling.k8s.io` PodGroup's scheduling policy (`spec.schedulingPolicy`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupPolicy {
    /// `gang: {minCount}`: all-or-nothing, once `minCount` pods exist.
    Gang(u32),
    /// `basic`: each pod is scheduled on its own, as kube-scheduler does.
    Basic,
    /// The group asks for something Gantry does not honour (the text names the field): its
    /// pods wait with that reason rather than be placed without it.
    Refused(String),
}

/// The upstream PodGroup a pod names in `spec.schedulingGroup.podGroupName`.
pub(crate) fn scheduling_group(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()?
        .scheduling_group
        .as_ref()?
        .pod_group_name
        .as_deref()
}

/// The pod's gang. `workload_groups` holds the upstream PodGroups' policies: a pod of a
/// `basic` group is a job of its own; one whose group is not known yet waits as a member.
pub(crate) fn gang_of(
    pod: &Pod,
    config: &KubeConfig,
    workload_groups: &HashMap<crate::PodKey, GroupPolicy>,
) -> Gang {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    if let Some(group) = scheduling_group(pod) {
        let key = (namespace, group.to_string());
        return match workload_groups.get(&key) {
            Some(GroupPolicy::Basic) => {
                Gang::Single(key.0, pod.metadata.name.clone().unwrap_or_default())
            }
            _ => Gang::Workload(key.0, key.1),
        };
    }
    if let Some(group) = label(pod, &config.pod_group_label) {
        Gang::PodGroup(namespace, group.into())
    } else if let Some(gang) = label(pod, &config.gang_label) {
        Gang::Labels(
            namespace,
            gang.into(),
            label(pod, &config.gang_size_label).map(str::to_string),
        )
    } else {
        Gang::Single(namespace, pod.metadata.name.clone().unwrap_or_default())
    }
}

/// Whether the pod is ours to schedule (`spec.schedulerName`).
pub(crate) fn is_ours(pod: &Pod, config: &KubeConfig) -> bool {
    pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref())
        == Some(config.scheduler_name.as_str())
}

/// A gang's pods share one shape: the largest ask of each resource among them.
pub(crate) fn widen(shape: &mut PodShape, other: &PodShape) {
    shape.gpus = shape.gpus.max(other.gpus);
    shape.cpu_milli = shape.cpu_milli.max(other.cpu_milli);
    shape.memory_mib = shape.memory_mib.max(other.memory_mib);
    shape.priority = shape.priority.max(other.priority);
    for &(name, v) in &other.resources {
        match shape.resources.iter_mut().find(|(n, _)| *n == name) {
            Some((_, mine)) => *mine = (*mine).max(v),
            None => shape.resources.push((name, v)),
        }
    }
    shape.resources.sort_unstable();
}

/// The annotation that says what a node failure stops of a gang: `whole` (the default) or
/// `pod` (only its pods on the node), on a pod of the gang or on its PodGroup.
pub const STOP_POLICY_ANNOTATION: &str = "gantry.dev/stop-policy";

/// The stop policy `annotations` declare (of `what`, for the error), if any, or why the value
/// cannot be read.
pub fn stop_policy(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
    what: &str,
) -> Result<Option<gantry_core::StopPolicy>, String> {
    let Some(value) = annotations.and_then(|a| a.get(STOP_POLICY_ANNOTATION)) else {
        return Ok(None);
    };
    match value.trim().to_ascii_lowercase().as_str() {
        "whole" => Ok(Some(gantry_core::StopPolicy::Whole)),
        "pod" => Ok(Some(gantry_core::StopPolicy::Pod)),
        _ => Err(format!(
            "{what}: annotation {STOP_POLICY_ANNOTATION}: {value:?} is neither whole (stop the gang whole when a node under it fails) nor pod (only its pods on that node)"
        )),
    }
}

/// What the node table reads of a node's DRA devices.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeDra<'a> {
    /// The GPUs its ResourceSlices publish ([`crate::dra::gpus_on_node`]).
    pub gpus: u32,
    /// Its devices' taints: health signals.
    pub device_taints: &'a [crate::health::DeviceTaint],
}

/// A node's health as the node shows it: a failed preflight is Unhealthy and a pending one
/// Preflight (see [`crate::preflight`]), a cordon is Cordoned, a `not_ready` signal or its
/// `Ready` condition NotReady. A suspect signal is the lifecycle's to act on (and its breaker's
/// to hold): the cluster source hands it to `Scheduler::node_failed`.
fn node_health(node: &Node, firing: &Firing, preflight: Option<&PreflightStatus>) -> Health {
    match preflight {
        Some(PreflightStatus::Failed(_)) => return Health::Unhealthy,
        Some(PreflightStatus::Testing) => return Health::Preflight,
        None => {}
    }
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        return Health::Cordoned;
    }
    if !firing.not_ready.is_empty() {
        return Health::NotReady;
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

/// What a node's row is made of: a health change is applied in place, anything else
/// rebuilds the node table.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeDigest {
    /// GPUs (the GPU resource's allocatable plus the GPUs the node's ResourceSlices publish),
    /// CPU (milli) and memory (MiB) allocatable.
    allocatable: (u32, u32, u32),
    gpu_type: Option<String>,
    /// The value of each configured topology label.
    topology: Vec<Option<String>>,
    taints: Vec<(String, String, String)>,
    pub(crate) health: Health,
    /// The configured health signals it shows (see [`crate::health`]).
    pub(crate) firing: Firing,
    /// Its preflight, while it carries the taint (see [`crate::preflight`]).
    pub(crate) preflight: Option<PreflightStatus>,
    /// Every label, for node selectors and affinity.
    labels: std::collections::BTreeMap<String, String>,
    /// Allocatable beyond GPUs, CPU and memory (`pods`, `ephemeral-storage`, extended
    /// resources), in [`crate::podspec::amount`]'s units.
    other: std::collections::BTreeMap<String, u32>,
}

impl NodeDigest {
    /// `dra`: the GPUs the node's ResourceSlices publish ([`crate::dra::gpus_on_node`]),
    /// counted in the GPU column like the GPU resource, so policies and quotas see both alike,
    /// and its devices' taints.
    pub(crate) fn of(node: &Node, config: &KubeConfig, dra: NodeDra<'_>) -> Self {
        let dra_gpus = dra.gpus;
        let firing = config.health.firing(node, dra.device_taints);
        let preflight = crate::preflight::node_status(node);
        let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        let get = |key: &str, parse: fn(&str) -> Option<u64>| {
            allocatable
                .and_then(|a| a.get(key))
                .and_then(|q| parse(&q.0))
                .unwrap_or(0)
        };
        let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        let labels = node.metadata.labels.as_ref();
        Self {
            allocatable: (
                (get(&config.gpu_resource, quantity::count) + u64::from(dra_gpus))
                    .min(u64::from(u16::MAX)) as u32,
                clamp(get("cpu", quantity::cpu_milli)),
                clamp(get("memory", quantity::memory_mib)),
            ),
            gpu_type: labels.and_then(|l| l.get(&config.gpu_type_label)).cloned(),
            topology: config
                .topology
                .iter()
                .map(|level| labels.and_then(|l| l.get(&level.key)).cloned())
                .collect(),
            taints: node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .into_iter()
                .flatten()
                .map(|t| {
                    (
                        t.key.clone(),
                        t.value.clone().unwrap_or_default(),
                        t.effect.clone(),
                    )
                })
                .collect(),
            health: node_health(node, &firing, preflight.as_ref()),
            firing,
            preflight,
            labels: labels.cloned().unwrap_or_default(),
            other: allocatable
                .into_iter()
                .flatten()
                .filter(|(name, _)| {
                    !matches!(name.as_str(), "cpu" | "memory") && **name != config.gpu_resource
                })
                .filter_map(|(name, q)| {
                    Some((name.clone(), clamp(crate::podspec::amount(name, &q.0)?)))
                })
                .collect(),
        }
    }

    /// Whether only the health differs.
    pub(crate) fn same_but_health(&self, other: &Self) -> bool {
        Self {
            health: other.health,
            firing: other.firing.clone(),
            preflight: other.preflight.clone(),
            ..self.clone()
        } == *other
    }
}

/// The node table of `nodes` (in name order, so indexes are stable while the node set is),
/// the node names by index, and each node's digest. `dra`: what each node's ResourceSlices
/// publish (GPUs, device taints).
pub fn node_table(
    nodes: &[Arc<Node>],
    config: &KubeConfig,
    symbols: &Symbols,
    dra: &crate::claims::DraView,
) -> (NodeTable, Vec<String>, HashMap<String, NodeDigest>) {
    let mut nodes: Vec<&Node> = nodes.iter().map(Arc::as_ref).collect();
    nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut table = NodeTable {
        taint_sets: vec![Vec::new()],
        ..NodeTable::default()
    };
    let mut node_names = Vec::with_capacity(nodes.len());
    let mut digests = HashMap::with_capacity(nodes.len());
    for node in &nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let digest = NodeDigest::of(node, config, dra.node_devices(&name));
        let (gpus, cpu, memory) = digest.allocatable;
        let taints: Vec<Taint> = digest
            .taints
            .iter()
            .filter_map(|(key, value, effect)| {
                Some(Taint {
                    key: symbols.intern(key),
                    value: symbols.intern(value),
                    effect: taint_effect(effect)?,
                })
            })
            .collect();
        table.push(NodeRow {
            health: digest.health,
            taints,
            ..NodeRow::new(
                symbols.intern(&name),
                gpus,
                digest.gpu_type.as_deref().map_or(0, |t| symbols.intern(t)),
                cpu,
                memory,
            )
        });
        let mut labels: Vec<NodeLabel> = digest
            .labels
            .iter()
            .map(|(k, v)| NodeLabel::new(symbols.intern(k), symbols.intern(v), v))
            .collect();
        labels.sort_unstable_by_key(|l| l.key);
        table.labels.push(labels.into());
        digests.insert(name.clone(), digest);
        node_names.push(name);
    }
    // A column per resource beyond GPUs, CPU and memory that some node offers, and always
    // pod slots and ephemeral storage, which every node has.
    let mut names: std::collections::BTreeSet<&str> =
        [crate::podspec::PODS, crate::podspec::EPHEMERAL_STORAGE].into();
    names.extend(
        digests
            .values()
            .flat_map(|d| d.other.keys().map(String::as_str)),
    );
    table.resources = names
        .into_iter()
        .map(|resource| ResourceColumn {
            name: symbols.intern(resource),
            free: node_names
                .iter()
                .map(|n| digests[n].other.get(resource).copied().unwrap_or(0))
                .collect(),
        })
        .collect();
    // Topology: each configured level whose label some node carries, domains numbered in node
    // order.
    for (i, level) in config.topology.iter().enumerate() {
        let mut domains: HashMap<&str, u32> = HashMap::new();
        let node_domain: Vec<u32> = node_names
            .iter()
            .map(|name| match digests[name].topology[i].as_deref() {
                Some(value) => {
                    let next = domains.len() as u32;
                    *domains.entry(value).or_insert(next)
                }
                None => u32::MAX,
            })
            .collect();
        if !domains.is_empty() {
            let mut column =
                LevelColumn::from_node_domains(symbols.intern(&level.level), node_domain, &table);
            // Each domain is named by the label value it was read from.
            column.domain_name = vec![0; domains.len()];
            for (value, &id) in &domains {
                column.domain_name[id as usize] = symbols.intern(value);
            }
            table.levels.push(column);
        }
    }
    (table, node_names, digests)
}

/// A pod's creation time, in Unix seconds.
pub(crate) fn created_unix_s(pod: &Pod) -> f64 {
    pod.metadata
        .creation_timestamp
        .as_ref()
        .map_or(0.0, |t| t.0.as_second() as f64)
}

/// The core's queue tree: the declared queues, plus a root of nominal 0 (it may borrow idle
/// quota) for each queue a pod names that none declares. With nothing declared, every queue
/// is a root that may use the whole cluster.
pub(crate) fn queue_tree(declared: &[QueueDef], used: &[String], capacity: Resources) -> Queues {
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
                reclaim: gantry_core::Reclaim::Never,
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

    fn pod(annotation: Option<&str>, deadline: Option<i64>) -> Pod {
        let mut pod = Pod::default();
        if let Some(text) = annotation {
            pod.metadata.annotations = Some(
                [(EXPECTED_RUNTIME.to_string(), text.to_string())]
                    .into_iter()
                    .collect(),
            );
        }
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            active_deadline_seconds: deadline,
            ..Default::default()
        });
        pod
    }

    #[test]
    fn a_declared_runtime_is_read_capped_by_the_deadline_and_a_bad_one_is_a_warning() {
        for (text, seconds) in [
            ("2h30m", 9000.0),
            ("90m", 5400.0),
            ("45s", 45.0),
            ("1d", 86_400.0),
            ("1.5h", 5400.0),
            ("3600", 3600.0),
        ] {
            assert_eq!(
                expected_runtime(&pod(Some(text), None)),
                Ok(Some(seconds)),
                "{text}"
            );
        }
        assert_eq!(
            expected_runtime(&pod(Some("2h"), Some(600))),
            Ok(Some(600.0))
        );
        assert_eq!(expected_runtime(&pod(None, Some(600))), Ok(Some(600.0)));
        assert_eq!(expected_runtime(&pod(None, None)), Ok(None));
        for bad in ["soon", "2 hours", "-5", "0", "h", "5x", "400d"] {
            assert_eq!(
                expected_runtime(&pod(Some(bad), None)),
                Err(format!(
                    "annotation gantry.dev/expected-runtime: {bad:?} is not a duration like 90m, \
                     2h30m or 3600; the runtime is learned from finished jobs instead"
                )),
                "{bad}"
            );
        }
    }
}
