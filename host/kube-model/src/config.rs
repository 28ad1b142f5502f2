//! Which labels, resources and names Gantry reads from a live cluster, and whom it trusts.

use std::collections::BTreeSet;

/// One topology level and the node label that names a node's domain in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyLabel {
    /// The level's name (`rack`, `block`).
    pub level: String,
    /// The node label whose value names the node's domain at this level.
    pub key: String,
}

impl TopologyLabel {
    /// The level `level`, read from the node label `key`.
    pub fn new(level: &str, key: &str) -> Self {
        Self {
            level: level.into(),
            key: key.into(),
        }
    }

    /// Parses `level=label-key`, as `--topology-label` takes it.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.split_once('=') {
            Some((level, key)) if !level.is_empty() && !key.is_empty() => Ok(Self::new(level, key)),
            _ => Err(format!(
                "topology label {text:?}: expected LEVEL=LABEL-KEY, e.g. rack=topology.gantry.dev/rack"
            )),
        }
    }
}

/// The label Gantry writes and reads for topology level `level` by default.
pub fn default_topology_key(level: &str) -> String {
    format!("topology.gantry.dev/{level}")
}

/// The PriorityClass whose pods may be balloons by default.
pub const DEFAULT_BALLOON_PRIORITY_CLASS: &str = "gantry-balloon";

/// The labels and names Gantry reads. The defaults follow kube-scheduler, the NVIDIA device
/// plugin, scheduler-plugins and Kueue, so that existing clusters work unchanged.
#[derive(Debug, Clone)]
pub struct KubeConfig {
    /// Pods whose `spec.schedulerName` is this are ours.
    pub scheduler_name: String,
    /// Topology levels, innermost first. A level no node carries is dropped.
    pub topology: Vec<TopologyLabel>,
    /// The extended resource that counts whole GPUs.
    pub gpu_resource: String,
    /// Node label with the GPU model (the GPU feature discovery label); a pod's node selector on
    /// the same key asks for that model.
    pub gpu_type_label: String,
    /// Pod label naming a Gantry `Queue` directly (subject to its `namespaceSelector`). It wins
    /// over [`KubeConfig::local_queue_label`] when a pod has both.
    pub queue_label: String,
    /// Kueue's pod label: it names a `LocalQueue` in the pod's namespace, whose
    /// `spec.clusterQueue` is the Gantry queue used (see [`crate::tenancy`]).
    pub local_queue_label: String,
    /// The queue of a pod without a queue label.
    pub default_queue: String,
    /// Gantry's own gang labels: the gang's name and its size.
    pub gang_label: String,
    /// The gang's size (see `gang_label`).
    pub gang_size_label: String,
    /// scheduler-plugins' pod label naming the pod's `PodGroup` (in the pod's namespace).
    pub pod_group_label: String,
    /// Pod label that marks a balloon (`"true"`): a placeholder holding capacity, preempted
    /// first by any real work and charged to no queue, as OpenAI's clusters ran them. Honoured
    /// only for pods from a trusted source (the two sets below): any tenant can set a label.
    pub balloon_label: String,
    /// PriorityClasses whose pods may be balloons (`--balloon-priority-class`). Which
    /// namespaces may use a PriorityClass is the cluster admin's to restrict (a ResourceQuota
    /// with a `priorityClass` scope selector).
    pub balloon_priority_classes: BTreeSet<String>,
    /// Namespaces whose pods may be balloons whatever their PriorityClass
    /// (`--balloon-namespace`).
    pub balloon_namespaces: BTreeSet<String>,
    /// Which node signals mean a node is failing, and the lifecycle's knobs
    /// (`--health-config`); by default none beyond `Ready` and cordons.
    pub health: crate::health::HealthSignals,
}

impl Default for KubeConfig {
    fn default() -> Self {
        Self {
            scheduler_name: "gantry".into(),
            topology: ["nvlink", "rack", "block"]
                .iter()
                .map(|level| TopologyLabel::new(level, &default_topology_key(level)))
                .chain([TopologyLabel::new("zone", "topology.kubernetes.io/zone")])
                .collect(),
            gpu_resource: "nvidia.com/gpu".into(),
            gpu_type_label: "nvidia.com/gpu.product".into(),
            queue_label: "gantry.dev/queue".into(),
            local_queue_label: "kueue.x-k8s.io/queue-name".into(),
            default_queue: "default".into(),
            gang_label: "gantry.dev/gang".into(),
            gang_size_label: "gantry.dev/gang-size".into(),
            pod_group_label: "scheduling.x-k8s.io/pod-group".into(),
            balloon_label: "gantry.dev/balloon".into(),
            balloon_priority_classes: [DEFAULT_BALLOON_PRIORITY_CLASS.to_string()].into(),
            balloon_namespaces: BTreeSet::new(),
            health: crate::health::HealthSignals::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_label_parses_and_explains_bad_input() {
        assert_eq!(
            TopologyLabel::parse("rack=example.com/rack").unwrap(),
            TopologyLabel::new("rack", "example.com/rack")
        );
        assert_eq!(
            TopologyLabel::parse("rack").unwrap_err(),
            "topology label \"rack\": expected LEVEL=LABEL-KEY, e.g. rack=topology.gantry.dev/rack"
        );
    }
}
