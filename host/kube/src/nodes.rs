//! Fake GPU nodes for a test control plane: Node objects that kwok keeps Ready, with the GPU
//! capacity, GPU model label and topology labels that [`crate::mapping`] reads back.

use std::collections::BTreeMap;
use std::path::Path;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;

use crate::config::KubeConfig;
use crate::{Error, Result};

/// One node to create.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeDef {
    pub name: String,
    pub gpus: u32,
    pub gpu_type: Option<String>,
    pub cpu_milli: u32,
    pub memory_mib: u32,
    /// `(level, domain)`: the node's domain at each topology level, e.g. `("rack", "rack-3")`.
    pub topology: Vec<(String, String)>,
    /// `(key, value, effect)`.
    pub taints: Vec<(String, String, String)>,
}

/// The Node object for `def`. kwok manages nodes with the `kwok.x-k8s.io/node: fake`
/// annotation; capacity and allocatable are set at creation, since no kubelet will.
pub fn node_object(def: &NodeDef, config: &KubeConfig) -> Node {
    let mut labels: BTreeMap<String, String> = BTreeMap::from([
        ("kubernetes.io/hostname".into(), def.name.clone()),
        ("type".into(), "kwok".into()),
    ]);
    if let Some(gpu_type) = &def.gpu_type {
        labels.insert(config.gpu_type_label.clone(), gpu_type.clone());
    }
    for (level, domain) in &def.topology {
        let key = config
            .topology
            .iter()
            .find(|t| &t.level == level)
            .map_or_else(
                || crate::config::default_topology_key(level),
                |t| t.key.clone(),
            );
        labels.insert(key, domain.clone());
    }
    let resources: BTreeMap<String, Quantity> = [
        ("cpu".to_string(), format!("{}m", def.cpu_milli)),
        ("memory".to_string(), format!("{}Mi", def.memory_mib)),
        ("pods".to_string(), "110".to_string()),
        (config.gpu_resource.clone(), def.gpus.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k, Quantity(v)))
    .collect();
    let taints: Vec<Taint> = def
        .taints
        .iter()
        .map(|(key, value, effect)| Taint {
            key: key.clone(),
            value: (!value.is_empty()).then(|| value.clone()),
            effect: effect.clone(),
            ..Taint::default()
        })
        .collect();
    Node {
        metadata: ObjectMeta {
            name: Some(def.name.clone()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                "kwok.x-k8s.io/node".into(),
                "fake".into(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: (!taints.is_empty()).then_some(taints),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            allocatable: Some(resources.clone()),
            capacity: Some(resources),
            ..NodeStatus::default()
        }),
    }
}

/// Creates `nodes` in the cluster of the kubeconfig at `path`. Nodes that exist already are
/// left as they are. Returns how many were created.
pub fn create_nodes(path: &Path, nodes: Vec<Node>) -> Result<usize> {
    let runtime = crate::connect::runtime()?;
    let client = crate::connect::client(&runtime, path)?;
    let api: Api<Node> = Api::all(client);
    let results: Vec<Result<bool>> = runtime.block_on(
        futures::stream::iter(nodes)
            .map(|node| {
                let api = api.clone();
                async move {
                    let name = node.metadata.name.clone().unwrap_or_default();
                    match api.create(&PostParams::default(), &node).await {
                        Ok(_) => Ok(true),
                        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                        Err(e) => Err(Error::CreateNode {
                            node: name,
                            message: e.to_string(),
                        }),
                    }
                }
            })
            .buffer_unordered(16)
            .collect(),
    );
    let mut created = 0;
    for result in results {
        created += usize::from(result?);
    }
    Ok(created)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use gantry_core::Symbols;

    #[test]
    fn created_nodes_read_back_as_written() {
        let config = KubeConfig::default();
        let def = NodeDef {
            name: "h100-0".into(),
            gpus: 8,
            gpu_type: Some("H100".into()),
            cpu_milli: 192_000,
            memory_mib: 2_000_000,
            topology: vec![("rack".into(), "rack-0".into())],
            taints: vec![("team".into(), "rl".into(), "NoSchedule".into())],
        };
        let mut node = node_object(&def, &config);
        // kwok marks it Ready.
        node.status.as_mut().unwrap().conditions =
            Some(vec![k8s_openapi::api::core::v1::NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]);
        let symbols = Symbols::new();
        let (t, _, _) =
            crate::mapping::node_table(&[Arc::new(node)], &config, &symbols, &Default::default());
        assert_eq!(t.gpu_total, [8]);
        assert_eq!(t.cpu_free_milli, [192_000]);
        assert_eq!(t.memory_free_mib, [2_000_000]);
        assert_eq!(&*symbols.resolve(t.gpu_type[0]), "H100");
        assert_eq!(&*symbols.resolve(t.levels[0].name), "rack");
        assert_eq!(t.taints(0).len(), 1);
        assert_eq!(t.health(0), gantry_core::Health::Healthy);
    }
}
