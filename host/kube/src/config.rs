//! Which labels, resources and names Gantry reads from a live cluster.

/// One topology level and the node label that names a node's domain in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyLabel {
    pub level: String,
    pub key: String,
}

impl TopologyLabel {
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
    /// Pod labels naming the queue, first match wins.
    pub queue_labels: Vec<String>,
    /// The queue of a pod without a queue label.
    pub default_queue: String,
    /// Gantry's own gang labels: the gang's name and its size.
    pub gang_label: String,
    pub gang_size_label: String,
    /// scheduler-plugins' pod label naming the pod's `PodGroup` (in the pod's namespace).
    pub pod_group_label: String,
    /// Pod label that marks a balloon (`"true"`): a placeholder holding capacity, preempted
    /// first by any real work, as OpenAI's clusters ran them.
    pub balloon_label: String,
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
            queue_labels: vec![
                "gantry.dev/queue".into(),
                "kueue.x-k8s.io/queue-name".into(),
            ],
            default_queue: "default".into(),
            gang_label: "gantry.dev/gang".into(),
            gang_size_label: "gantry.dev/gang-size".into(),
            pod_group_label: "scheduling.x-k8s.io/pod-group".into(),
            balloon_label: "gantry.dev/balloon".into(),
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
