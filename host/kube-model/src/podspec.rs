//! What a pod's spec asks of a node, beyond its queue and gang, read the way kube-scheduler reads
//! it:
//!
//! - [`PodRequest`]: resources summed over containers, with init containers by the max rule
//!   (restartable sidecars added), pod overhead, pod slots, ephemeral storage and any extended
//!   resource;
//! - [`node_affinity`]: `nodeSelector` and node affinity compiled to interned requirements, once
//!   per pod, so a cycle compares numbers, never strings;
//! - [`unsupported`]: the fields Gantry does not honour, named in a refusal rather than ignored.

use std::collections::BTreeMap;

use gantry_core::{Field, LabelOp, NodeAffinity, Requirement, Symbols, Term};
use k8s_openapi::api::core::v1::{
    Container, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::config::KubeConfig;
use crate::quantity;

/// The resource columns every node has beside GPUs, CPU and memory.
pub(crate) const PODS: &str = "pods";
pub(crate) const EPHEMERAL_STORAGE: &str = "ephemeral-storage";

/// A resource name's amount as the core counts it: MiB for storage and huge pages, a count for
/// anything else.
pub(crate) fn amount(name: &str, text: &str) -> Option<u64> {
    if name == EPHEMERAL_STORAGE || name.starts_with("hugepages-") {
        quantity::memory_mib(text)
    } else {
        quantity::count(text)
    }
}

/// What one pod asks of a node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodRequest {
    /// GPUs (the GPU resource).
    pub gpus: u32,
    /// CPU, in millicores.
    pub cpu_milli: u32,
    /// Memory, in MiB.
    pub memory_mib: u32,
    /// Every other resource by name (one `pods` slot always), in [`amount`]'s units.
    pub other: BTreeMap<String, u32>,
}

/// Per resource name, what one container asks (its request, else its limit, as the API server
/// defaults a request from a limit).
fn container_asks(container: &Container, config: &KubeConfig) -> BTreeMap<String, u64> {
    let Some(resources) = &container.resources else {
        return BTreeMap::new();
    };
    let mut asks: BTreeMap<String, u64> = BTreeMap::new();
    for (name, q) in resources.limits.iter().flatten() {
        asks.insert(name.clone(), amount_of(name, q, config));
    }
    for (name, q) in resources.requests.iter().flatten() {
        asks.insert(name.clone(), amount_of(name, q, config));
    }
    asks
}

fn amount_of(name: &str, q: &Quantity, config: &KubeConfig) -> u64 {
    let text = q.0.as_str();
    match name {
        "cpu" => quantity::cpu_milli(text),
        "memory" => quantity::memory_mib(text),
        _ if name == config.gpu_resource => quantity::count(text),
        _ => amount(name, text),
    }
    .unwrap_or(0)
}

fn add(sum: &mut BTreeMap<String, u64>, asks: &BTreeMap<String, u64>) {
    for (name, &v) in asks {
        *sum.entry(name.clone()).or_default() += v;
    }
}

fn max_into(max: &mut BTreeMap<String, u64>, asks: &BTreeMap<String, u64>) {
    for (name, &v) in asks {
        let m = max.entry(name.clone()).or_default();
        *m = (*m).max(v);
    }
}

/// What `pod` asks, as kube-scheduler computes a pod's request: the containers' sum, or the
/// largest init container's ask if more (a restartable init container, a sidecar, runs beside
/// the ones after it, so it adds to both), plus the pod's overhead, plus one pod slot.
pub fn pod_request(pod: &Pod, config: &KubeConfig) -> PodRequest {
    let mut total: BTreeMap<String, u64> = BTreeMap::new();
    if let Some(spec) = &pod.spec {
        let mut sidecars: BTreeMap<String, u64> = BTreeMap::new();
        let mut init_max: BTreeMap<String, u64> = BTreeMap::new();
        for init in spec.init_containers.iter().flatten() {
            let asks = container_asks(init, config);
            if init.restart_policy.as_deref() == Some("Always") {
                add(&mut sidecars, &asks);
                max_into(&mut init_max, &sidecars);
            } else {
                let mut during = sidecars.clone();
                add(&mut during, &asks);
                max_into(&mut init_max, &during);
            }
        }
        for container in &spec.containers {
            add(&mut total, &container_asks(container, config));
        }
        add(&mut total, &sidecars);
        max_into(&mut total, &init_max);
        let overhead: BTreeMap<String, u64> = spec
            .overhead
            .iter()
            .flatten()
            .map(|(name, q)| (name.clone(), amount_of(name, q, config)))
            .collect();
        add(&mut total, &overhead);
    }
    let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    let take =
        |total: &mut BTreeMap<String, u64>, name: &str| clamp(total.remove(name).unwrap_or(0));
    let gpus = take(&mut total, &config.gpu_resource);
    let cpu_milli = take(&mut total, "cpu");
    let memory_mib = take(&mut total, "memory");
    let mut other: BTreeMap<String, u32> = total
        .into_iter()
        .filter(|&(_, v)| v > 0)
        .map(|(name, v)| (name, clamp(v)))
        .collect();
    *other.entry(PODS.to_string()).or_default() += 1;
    PodRequest {
        gpus,
        cpu_milli,
        memory_mib,
        other,
    }
}

fn requirement(
    r: &NodeSelectorRequirement,
    field: Field,
    symbols: &Symbols,
    at: &str,
) -> Result<Requirement, String> {
    let values = r.values.as_deref().unwrap_or_default();
    let number = || -> Result<i64, String> {
        match values {
            [one] => one.parse().map_err(|_| {
                format!(
                    "{at}: operator {} needs an integer, found {one:?}",
                    r.operator
                )
            }),
            _ => Err(format!(
                "{at}: operator {} needs exactly one value, found {}",
                r.operator,
                values.len()
            )),
        }
    };
    let interned = || values.iter().map(|v| symbols.intern(v)).collect();
    let op = match r.operator.as_str() {
        "In" => LabelOp::In(interned()),
        "NotIn" => LabelOp::NotIn(interned()),
        "Exists" => LabelOp::Exists,
        "DoesNotExist" => LabelOp::DoesNotExist,
        "Gt" => LabelOp::Gt(number()?),
        "Lt" => LabelOp::Lt(number()?),
        other => return Err(format!("{at}: unknown operator {other:?}")),
    };
    Ok(Requirement { field, op })
}

fn term(t: &NodeSelectorTerm, symbols: &Symbols, at: &str) -> Result<Term, String> {
    let mut requirements = Vec::new();
    for (i, r) in t.match_expressions.iter().flatten().enumerate() {
        let field = Field::Label(symbols.intern(&r.key));
        requirements.push(requirement(
            r,
            field,
            symbols,
            &format!("{at}.matchExpressions[{i}]"),
        )?);
    }
    for (i, r) in t.match_fields.iter().flatten().enumerate() {
        let at = format!("{at}.matchFields[{i}]");
        if r.key != "metadata.name" {
            return Err(format!(
                "{at}: field {:?} is not supported; Kubernetes allows only metadata.name",
                r.key
            ));
        }
        requirements.push(requirement(r, Field::NodeName, symbols, &at)?);
    }
    Ok(Term { requirements })
}

/// The pod's `nodeSelector` and node affinity, compiled. `Ok(None)` when it names neither;
/// `Err` names the field that cannot be honoured.
pub(crate) fn node_affinity(pod: &Pod, symbols: &Symbols) -> Result<Option<NodeAffinity>, String> {
    let Some(spec) = &pod.spec else {
        return Ok(None);
    };
    let mut affinity = NodeAffinity::default();
    for (key, value) in spec.node_selector.iter().flatten() {
        affinity.selector.push(Requirement {
            field: Field::Label(symbols.intern(key)),
            op: LabelOp::In(vec![symbols.intern(value)]),
        });
    }
    if let Some(node) = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
    {
        let at = "spec.affinity.nodeAffinity";
        if let Some(required) = &node.required_during_scheduling_ignored_during_execution {
            for (i, t) in required.node_selector_terms.iter().enumerate() {
                affinity.required.push(term(
                    t,
                    symbols,
                    &format!(
                        "{at}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]"
                    ),
                )?);
            }
            if affinity.required.is_empty() {
                // An empty term list matches no node, as in Kubernetes.
                affinity.required.push(Term::default());
            }
        }
        for (i, p) in node
            .preferred_during_scheduling_ignored_during_execution
            .iter()
            .flatten()
            .enumerate()
        {
            let at = format!("{at}.preferredDuringSchedulingIgnoredDuringExecution[{i}]");
            if !(1..=100).contains(&p.weight) {
                return Err(format!("{at}: weight {} is outside 1..100", p.weight));
            }
            affinity.preferred.push((
                p.weight as u32,
                term(&p.preference, symbols, &format!("{at}.preference"))?,
            ));
        }
    }
    Ok((affinity != NodeAffinity::default()).then_some(affinity))
}

/// Why Gantry cannot schedule `pod` as written, naming the field: what it does not honour
/// (inter-pod affinity, topology spread, volumes bound to a topology) and a node affinity it
/// cannot read. `None` when it honours every field. `spec.resourceClaims` is read by
/// [`crate::claims::DraView::resolve`], which refuses what DRA asks that Gantry cannot honour.
pub(crate) fn unsupported(pod: &Pod, symbols: &Symbols) -> Option<String> {
    let spec: &PodSpec = pod.spec.as_ref()?;
    let refuse = |field: &str, what: &str| {
        Some(format!(
            "{field} is not supported by Gantry ({what}); remove it or use another scheduler"
        ))
    };
    if let Some(affinity) = &spec.affinity {
        if affinity.pod_affinity.is_some() {
            return refuse("spec.affinity.podAffinity", "inter-pod affinity");
        }
        if affinity.pod_anti_affinity.is_some() {
            return refuse("spec.affinity.podAntiAffinity", "inter-pod anti-affinity");
        }
    }
    if spec
        .topology_spread_constraints
        .as_ref()
        .is_some_and(|c| !c.is_empty())
    {
        return refuse("spec.topologySpreadConstraints", "topology spread");
    }
    for (i, volume) in spec.volumes.iter().flatten().enumerate() {
        if volume.persistent_volume_claim.is_some() {
            return refuse(
                &format!("spec.volumes[{i}].persistentVolumeClaim ({})", volume.name),
                "volume topology is not checked",
            );
        }
        if volume.ephemeral.is_some() {
            return refuse(
                &format!("spec.volumes[{i}].ephemeral ({})", volume.name),
                "volume topology is not checked",
            );
        }
    }
    node_affinity(pod, symbols).err()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Affinity, NodeAffinity as KNodeAffinity, NodeSelector, PodAntiAffinity,
        PreferredSchedulingTerm, ResourceRequirements, TopologySpreadConstraint, Volume,
    };

    fn container(asks: &[(&str, &str)]) -> Container {
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                requests: Some(
                    asks.iter()
                        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(spec: PodSpec) -> Pod {
        Pod {
            spec: Some(spec),
            ..Default::default()
        }
    }

    #[test]
    fn requests_follow_the_init_container_max_rule_sidecars_and_overhead() {
        let mut sidecar = container(&[("cpu", "100m"), ("memory", "64Mi")]);
        sidecar.restart_policy = Some("Always".into());
        let spec = PodSpec {
            containers: vec![
                container(&[("cpu", "1"), ("nvidia.com/gpu", "8"), ("rdma/hca", "1")]),
                container(&[
                    ("cpu", "500m"),
                    ("memory", "1Gi"),
                    ("ephemeral-storage", "10Gi"),
                ]),
            ],
            init_containers: Some(vec![
                sidecar,
                // Runs beside the sidecar: 4.1 CPUs at once, more than the 1.6 after it.
                container(&[("cpu", "4"), ("memory", "128Mi")]),
            ]),
            overhead: Some(
                [("cpu".to_string(), Quantity("250m".into()))]
                    .into_iter()
                    .collect(),
            ),
            ..Default::default()
        };
        let request = pod_request(&pod(spec), &KubeConfig::default());
        assert_eq!(request.gpus, 8);
        assert_eq!(
            request.cpu_milli,
            4100 + 250,
            "init max beats the 1.6 CPU sum"
        );
        assert_eq!(
            request.memory_mib,
            1024 + 64,
            "containers plus sidecar beat 192 MiB"
        );
        assert_eq!(
            request.other,
            [
                ("ephemeral-storage".to_string(), 10 * 1024),
                ("pods".to_string(), 1),
                ("rdma/hca".to_string(), 1)
            ]
            .into_iter()
            .collect()
        );
    }

    fn expr(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn with_node_affinity(node_affinity: KNodeAffinity) -> Pod {
        pod(PodSpec {
            affinity: Some(Affinity {
                node_affinity: Some(node_affinity),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    #[test]
    fn node_selector_and_affinity_compile_and_a_bad_one_names_its_field() {
        let symbols = Symbols::new();
        let mut pod = with_node_affinity(KNodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![
                        expr("pool", "In", &["train", "eval"]),
                        expr("gpus", "Gt", &["4"]),
                    ]),
                    match_fields: Some(vec![expr("metadata.name", "NotIn", &["bad-node"])]),
                }],
            }),
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                PreferredSchedulingTerm {
                    weight: 40,
                    preference: NodeSelectorTerm {
                        match_expressions: Some(vec![expr("zone", "Exists", &[])]),
                        match_fields: None,
                    },
                },
            ]),
        });
        pod.spec.as_mut().unwrap().node_selector = Some(
            [("team".to_string(), "a".to_string())]
                .into_iter()
                .collect(),
        );
        let affinity = node_affinity(&pod, &symbols).unwrap().unwrap();
        assert_eq!(affinity.selector.len(), 1);
        assert_eq!(affinity.required[0].requirements.len(), 3);
        assert_eq!(affinity.required[0].requirements[1].op, LabelOp::Gt(4));
        assert_eq!(affinity.required[0].requirements[2].field, Field::NodeName);
        assert_eq!(affinity.preferred[0].0, 40);
        assert_eq!(unsupported(&pod, &symbols), None);

        let bad = with_node_affinity(KNodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![expr("gpus", "Gt", &["many"])]),
                    match_fields: None,
                }],
            }),
            ..Default::default()
        });
        assert_eq!(
            unsupported(&bad, &symbols).as_deref(),
            Some(
                "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0]: operator Gt needs an integer, found \"many\""
            )
        );
        assert_eq!(node_affinity(&Pod::default(), &symbols), Ok(None));
    }

    #[test]
    fn what_gantry_does_not_honour_is_refused_by_name() {
        let symbols = Symbols::new();
        let anti = pod(PodSpec {
            affinity: Some(Affinity {
                pod_anti_affinity: Some(PodAntiAffinity::default()),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(
            unsupported(&anti, &symbols).as_deref(),
            Some(
                "spec.affinity.podAntiAffinity is not supported by Gantry (inter-pod anti-affinity); remove it or use another scheduler"
            )
        );
        let spread = pod(PodSpec {
            topology_spread_constraints: Some(vec![TopologySpreadConstraint::default()]),
            ..Default::default()
        });
        assert!(
            unsupported(&spread, &symbols)
                .unwrap()
                .starts_with("spec.topologySpreadConstraints is not supported")
        );
        let claim = pod(PodSpec {
            volumes: Some(vec![Volume {
                name: "data".into(),
                persistent_volume_claim: Some(Default::default()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert!(
            unsupported(&claim, &symbols)
                .unwrap()
                .starts_with("spec.volumes[0].persistentVolumeClaim (data) is not supported")
        );
    }
}
