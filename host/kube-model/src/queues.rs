//! Gantry's `Queue` objects (`gantry.dev/v1alpha1`, cluster-scoped): the queue tree and its GPU
//! quotas, declared in the cluster instead of a file. The fields are the cluster spec's
//! `queues` entries in Kubernetes' camelCase (`nominalGpus` for `nominal_gpus`, and so on), the
//! name is the object's name. The CRD's schema rejects wrong types and negative numbers; what
//! a schema cannot see (a missing parent, a loop, a lending limit over the quota) is checked
//! here, and such a queue is left out with a reason instead of stopping the scheduler.
//!
//! `spec.namespaceSelector` (a label selector, as Kueue's ClusterQueue has it) says which
//! namespaces' pods may use the queue: absent or null none, `{}` all (see [`crate::tenancy`]).

use std::collections::HashMap;

use gantry_core::{QueueDef, QueueError};
use kube_core::{ApiResource, DynamicObject, GroupVersionKind};

use crate::selector::NamespaceSelector;

/// The API group of [`resource`].
pub const GROUP: &str = "gantry.dev";
/// The API version of [`resource`].
pub const VERSION: &str = "v1alpha1";

/// `queues.gantry.dev`, for the dynamic client.
pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, "Queue"), "queues")
}

/// A usable `Queue`: its place in the tree and quotas, and which namespaces may use it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredQueue {
    /// The queue's place in the tree and its quotas.
    pub def: QueueDef,
    /// `None` when absent or null: no namespace may use the queue.
    pub namespace_selector: Option<NamespaceSelector>,
    /// `spec.stopPolicy`: what a node failure stops of its gangs that say nothing themselves.
    pub stop_policy: gantry_core::StopPolicy,
}

/// One `Queue` object's spec, or why it cannot be used.
pub fn parse(object: &DynamicObject) -> Result<DeclaredQueue, String> {
    let name = object.metadata.name.clone().unwrap_or_default();
    let spec = object.data.get("spec");
    let field = |key: &str| spec.and_then(|s| s.get(key)).filter(|v| !v.is_null());
    let count = |key: &str| -> Result<Option<u64>, String> {
        match field(key) {
            None => Ok(None),
            Some(value) => value.as_u64().map(Some).ok_or_else(|| {
                format!(
                    "queue {name}: spec.{key} must be a whole number of GPUs ≥ 0, found {value}"
                )
            }),
        }
    };
    let parent = match field("parent") {
        None => None,
        Some(value) => Some(
            value
                .as_str()
                .filter(|p| !p.is_empty())
                .ok_or_else(|| {
                    format!("queue {name}: spec.parent must be a queue name, found {value}")
                })?
                .to_string(),
        ),
    };
    let weight = count("weight")?.unwrap_or(1);
    if weight == 0 || weight > u64::from(u32::MAX) {
        return Err(format!(
            "queue {name}: spec.weight must be between 1 and {}, found {weight}",
            u32::MAX
        ));
    }
    let namespace_selector = match field("namespaceSelector") {
        None => None,
        Some(value) => Some(
            NamespaceSelector::parse(value)
                .map_err(|e| format!("queue {name}: spec.namespaceSelector: {e}"))?,
        ),
    };
    let reclaim = match field("reclaimWithinCohort") {
        None => gantry_core::Reclaim::Never,
        Some(value) => value
            .as_str()
            .and_then(gantry_core::Reclaim::parse)
            .ok_or_else(|| {
                format!(
                    "queue {name}: spec.reclaimWithinCohort must be Never or Any, found {value}"
                )
            })?,
    };
    let stop_policy = match field("stopPolicy") {
        None => gantry_core::StopPolicy::Whole,
        Some(value) => match value.as_str() {
            Some("Whole") => gantry_core::StopPolicy::Whole,
            Some("Pod") => gantry_core::StopPolicy::Pod,
            _ => {
                return Err(format!(
                    "queue {name}: spec.stopPolicy must be Whole or Pod, found {value}"
                ));
            }
        },
    };
    let def = QueueDef {
        reclaim,
        name: name.clone(),
        parent,
        nominal_gpus: count("nominalGpus")?.unwrap_or(0),
        weight: weight as u32,
        borrowing_limit_gpus: count("borrowingLimitGpus")?,
        lending_limit_gpus: count("lendingLimitGpus")?,
    };
    if let Some(limit) = def.lending_limit_gpus
        && limit > def.nominal_gpus
    {
        return Err(format!(
            "queue {name}: spec.lendingLimitGpus ({limit}) is more than spec.nominalGpus ({})",
            def.nominal_gpus
        ));
    }
    Ok(DeclaredQueue {
        def,
        namespace_selector,
        stop_policy,
    })
}

/// The usable queues of `objects`, parents before children, and per queue left out its name
/// and one line saying why. A queue whose parent is missing, left out, or part of a loop is
/// left out too.
pub fn check(
    objects: &[std::sync::Arc<DynamicObject>],
) -> (Vec<DeclaredQueue>, Vec<(String, String)>) {
    let mut problems = Vec::new();
    let mut queues: Vec<DeclaredQueue> = Vec::new();
    for object in objects {
        match parse(object) {
            Ok(queue) => queues.push(queue),
            Err(problem) => {
                problems.push((object.metadata.name.clone().unwrap_or_default(), problem))
            }
        }
    }
    queues.sort_by(|a, b| a.def.name.cmp(&b.def.name));
    let name_to_def: HashMap<&str, &QueueDef> = queues
        .iter()
        .map(|q| (q.def.name.as_str(), &q.def))
        .collect();
    // The tree's problems as the core finds them: a queue whose chain reaches a parent left out
    // above (or never declared), or loops, is left out too.
    let defs: Vec<QueueDef> = queues.iter().map(|q| q.def.clone()).collect();
    let tree_problems = QueueDef::check_tree(&defs);
    let mut usable: Vec<DeclaredQueue> = Vec::new();
    for (index, queue) in queues.iter().enumerate() {
        match tree_problems.iter().find(|(at, _)| *at == index) {
            None => usable.push(queue.clone()),
            Some((
                _,
                QueueError::UnknownParent {
                    queue: name,
                    parent,
                },
            )) => {
                problems.push((
                    name.clone(),
                    format!("queue {name}: spec.parent {parent} is not a usable Queue"),
                ));
            }
            Some((_, problem)) => problems.push((queue.def.name.clone(), problem.to_string())),
        }
    }
    // Parents first: the core links a child to a parent it has seen.
    let depth = |def: &QueueDef| {
        let mut depth = 0;
        let mut at = def.parent.as_deref();
        while let Some(parent) = at {
            depth += 1;
            at = name_to_def.get(parent).and_then(|p| p.parent.as_deref());
        }
        depth
    };
    usable.sort_by_key(|q| (depth(&q.def), q.def.name.clone()));
    (usable, problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn queue(name: &str, spec: serde_json::Value) -> Arc<DynamicObject> {
        let mut object = DynamicObject::new(name, &resource());
        object.data = serde_json::json!({ "spec": spec });
        Arc::new(object)
    }

    #[test]
    fn queues_parse_and_bad_ones_are_left_out_with_a_reason() {
        let objects = [
            queue("research", serde_json::json!({"nominalGpus": 16})),
            queue(
                "team-a",
                serde_json::json!({"parent": "research", "nominalGpus": 8, "weight": 2, "borrowingLimitGpus": 4, "namespaceSelector": {}, "reclaimWithinCohort": "Any", "stopPolicy": "Pod"}),
            ),
            queue(
                "team-c",
                serde_json::json!({"parent": "research", "namespaceSelector": null}),
            ),
            queue(
                "bad-selector",
                serde_json::json!({"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In"}]}}),
            ),
            queue("neg", serde_json::json!({"nominalGpus": -1})),
            queue("orphan", serde_json::json!({"parent": "nowhere"})),
            queue("x", serde_json::json!({"parent": "y"})),
            queue("y", serde_json::json!({"parent": "x"})),
            queue(
                "lend",
                serde_json::json!({"nominalGpus": 1, "lendingLimitGpus": 2}),
            ),
            queue(
                "reclaim",
                serde_json::json!({"reclaimWithinCohort": "LowerPriority"}),
            ),
            queue("stop", serde_json::json!({"stopPolicy": "Rank"})),
        ];
        let (queues, problems) = check(&objects);
        let names: Vec<&str> = queues.iter().map(|q| q.def.name.as_str()).collect();
        assert_eq!(names, ["research", "team-a", "team-c"]);
        assert_eq!(queues[1].def.borrowing_limit_gpus, Some(4));
        assert_eq!(queues[1].def.weight, 2);
        assert_eq!(queues[1].def.reclaim, gantry_core::Reclaim::Any);
        assert_eq!(queues[1].stop_policy, gantry_core::StopPolicy::Pod);
        assert_eq!(queues[0].stop_policy, gantry_core::StopPolicy::Whole);
        assert_eq!(
            queues[0].def.reclaim,
            gantry_core::Reclaim::Never,
            "absent: never"
        );
        assert_eq!(queues[0].namespace_selector, None, "absent: no namespace");
        assert_eq!(
            queues[1].namespace_selector,
            Some(NamespaceSelector::default()),
            "{{}}: every namespace"
        );
        let problems: Vec<&str> = problems.iter().map(|(_, p)| p.as_str()).collect();
        assert_eq!(
            problems,
            [
                "queue bad-selector: spec.namespaceSelector: matchExpressions[0]: operator In needs at least one value",
                "queue neg: spec.nominalGpus must be a whole number of GPUs ≥ 0, found -1",
                "queue lend: spec.lendingLimitGpus (2) is more than spec.nominalGpus (1)",
                "queue reclaim: spec.reclaimWithinCohort must be Never or Any, found \"LowerPriority\"",
                "queue stop: spec.stopPolicy must be Whole or Pod, found \"Rank\"",
                "queue orphan: spec.parent nowhere is not a usable Queue",
                "queue x: the parent chain loops: x -> y -> x",
                "queue y: the parent chain loops: y -> x -> y",
            ]
        );
    }
}
