//! Kubernetes objects for tests, here and in `gantry-kube`'s (its `fixtures` feature): a
//! GPU node, a pod of ours, and a tracker with its scheduler built from them, each built the
//! one way every test builds them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gantry_core::{ClusterState, QueueDef, Queues, Resources, Scheduler, SchedulerConfig, Symbols};

use k8s_openapi::api::core::v1::{
    Container, Node, NodeCondition, NodeSpec, NodeStatus, Pod, PodSpec, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::config::KubeConfig;
use crate::queues::DeclaredQueue;
use crate::tenancy::Labels;
use crate::tracker::{PodKey, Tracker, World};

/// `labels` as an object's label map.
pub fn label_map(labels: &[(&str, &str)]) -> BTreeMap<String, String> {
    labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A node with `gpus` GPUs (`nvidia.com/gpu`), 64 CPUs, 512 GiB and 110 pod slots, and its
/// `Ready` condition.
pub fn node(name: &str, gpus: u32, labels: &[(&str, &str)], ready: bool) -> Arc<Node> {
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

/// A pod of ours (`schedulerName: gantry`) in namespace `ns` with uid `uid-<name>`, asking
/// for `gpus` GPUs, bound to `node` if given.
pub fn pod(name: &str, gpus: u32, labels: &[(&str, &str)], node: Option<&str>) -> Arc<Pod> {
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

/// A tracker and its scheduler, built from whole caches: `groups` are PodGroups' `(name,
/// minMember)` and `queues` Queues every namespace may use, all in namespace `ns`.
pub fn build(
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
            stop_policy: Default::default(),
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

/// The key of object `name` in namespace `ns`.
pub fn key(name: &str) -> PodKey {
    ("ns".to_string(), name.to_string())
}
