//! The sync: what the watch caches changed since the last one, applied to the tracker (the
//! changed keys only, or everything after a relist or a node-set change), with the Queues,
//! namespaces, LocalQueues, PodGroups and DRA objects each read the way the rules in
//! `gantry-kube-model` expect.

use std::collections::HashMap;

use futures::FutureExt;
use gantry_core::Scheduler;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::Watch;
use super::cache::{ChangeLog, take};
use crate::mapping::GroupPolicy;
use crate::tracker::{PodKey, Tracker, World};

/// What one sync found, for the loop's [`gantry_core::Changes`] and the writer.
pub(crate) struct Synced {
    /// Nodes whose objects changed.
    pub(crate) nodes: u32,
    /// Whether the queue tree was read again.
    pub(crate) queues_changed: bool,
    /// Whether the scheduler's view was rebuilt, numbering its jobs afresh.
    pub(crate) rebuilt: bool,
    /// Our pods gone since the last sync, as `(namespace, uid)`: the claims reserved for them
    /// are to be released.
    pub(crate) gone: Vec<(String, String)>,
}

/// What an upstream PodGroup's `spec` asks of Gantry: a gang of `minCount`, single pods
/// (`basic`), or a refusal naming the field Gantry does not support, so its pods wait with that
/// message instead of being placed as if the field were not there.
fn workload_group_policy((namespace, name): &PodKey, spec: &serde_json::Value) -> GroupPolicy {
    let refused = |field: &str, what: &str| {
        GroupPolicy::Refused(format!(
            "pod group {namespace}/{name}: spec.{field} is not supported by Gantry ({what}); remove it or use another scheduler"
        ))
    };
    let policy = &spec["schedulingPolicy"];
    let non_empty = |value: &serde_json::Value| value.as_array().is_some_and(|a| !a.is_empty());
    if spec["parentCompositePodGroupName"].is_string() {
        refused(
            "parentCompositePodGroupName",
            "a pod group inside a composite pod group; Gantry places each PodGroup on its own",
        )
    } else if non_empty(&spec["schedulingConstraints"]["topology"]) {
        refused(
            "schedulingConstraints.topology",
            "a gang's topology constraint; Gantry prefers the smallest domain but does not require one",
        )
    } else if non_empty(&spec["resourceClaims"]) {
        refused("resourceClaims", "claims shared by a pod group")
    } else if let Some(min) = policy["gang"]["minCount"].as_u64() {
        GroupPolicy::Gang(u32::try_from(min).unwrap_or(u32::MAX).max(1))
    } else if policy.get("basic").is_some() {
        GroupPolicy::Basic
    } else {
        // The API server validates one policy; a newer release may add one not known here.
        refused(
            "schedulingPolicy",
            "a scheduling policy other than gang and basic",
        )
    }
}

impl Watch {
    /// Applies what the caches changed since the last sync to `tracker` and `scheduler`.
    pub(crate) fn sync(&mut self, tracker: &mut Tracker, scheduler: &mut Scheduler) -> Synced {
        let nodes = take(&self.logs.nodes);
        let pods = take(&self.logs.pods);
        let groups = take(&self.logs.groups);
        let queues = take(&self.logs.queues);
        let namespaces = take(&self.logs.namespaces);
        let local_queues = take(&self.logs.local_queues);
        // A kind's cache counts once it holds a full list (a kind found after start lists
        // first); until then the kind applies as absent.
        self.groups_ready |= groups.relisted;
        self.queues_ready |= queues.relisted;
        self.local_queues_ready |= local_queues.relisted;
        tracker.queues_unknown(self.queues_unknown());
        // Namespaces and LocalQueues before the Queues and pods: which queue a pod may use
        // depends on them.
        if !self.built || namespaces.relisted || !namespaces.keys.is_empty() {
            let mut namespaces = namespaces;
            namespaces.relisted |= !self.built;
            self.refresh_namespaces(tracker, namespaces);
        }
        if !self.built || local_queues.relisted || !local_queues.keys.is_empty() {
            self.refresh_local_queues(tracker);
        }
        let queues_changed = (!self.built || queues.relisted || !queues.keys.is_empty())
            && (self.queues_ready || self.queues.is_none());
        if queues_changed {
            self.refresh_queues(tracker, scheduler);
        }
        if (!self.built || groups.relisted || !groups.keys.is_empty())
            && (self.groups_ready || (self.pod_groups.is_none() && self.workload_groups.is_none()))
        {
            self.refresh_groups(tracker);
        }
        // DRA before the nodes: the GPUs slices publish are in the node table.
        let slices = take(&self.logs.slices);
        let claims = take(&self.logs.claims);
        let templates = take(&self.logs.templates);
        let slices_moved_gpus = self.refresh_dra(tracker, slices, claims, templates);
        // Our pods as the tracker knew them before this sync: those it no longer holds after
        // it are gone, and their claims are released.
        let before: Vec<(PodKey, String)> = pods
            .keys
            .iter()
            .filter_map(|key| Some((key.clone(), tracker.our_uid(key)?)))
            .collect();
        let mut rebuild = !self.built || nodes.relisted || pods.relisted || slices_moved_gpus;
        if !rebuild {
            for (_, name) in &nodes.keys {
                let node = self.nodes.get(&ObjectRef::new(name));
                if tracker.node_changed(scheduler, name, node.as_deref()) {
                    rebuild = true;
                    break;
                }
            }
        }
        if rebuild {
            let (node_list, bound, pending) =
                (self.nodes.state(), self.bound.state(), self.pending.state());
            tracing::info!(
                nodes = node_list.len(),
                bound = bound.len(),
                pending = pending.len(),
                "building the scheduler's view of the cluster"
            );
            tracker.rebuild(
                scheduler,
                &World {
                    nodes: &node_list,
                    bound: &bound,
                    pending: &pending,
                },
            );
            self.built = true;
        } else {
            let mut keys = pods.keys;
            keys.extend(tracker.expired_assumptions());
            for key in keys {
                let at = ObjectRef::new(&key.1).within(&key.0);
                let pending = self.pending.get(&at);
                let bound = self.bound.get(&at);
                tracker.pod_changed(scheduler, key, pending.as_ref(), bound.as_ref());
            }
        }
        let mut gone = Vec::new();
        for ((namespace, name), uid) in before {
            if tracker.our_uid(&(namespace.clone(), name)).as_ref() != Some(&uid) {
                gone.push((namespace, uid));
            }
        }
        Synced {
            nodes: nodes.keys.len() as u32,
            queues_changed,
            rebuilt: rebuild,
            gone,
        }
    }

    /// Reads the Queue objects again, logging each new problem once.
    fn refresh_queues(&mut self, tracker: &mut Tracker, scheduler: &mut Scheduler) {
        let (declared, left_out) = match &self.queues {
            Some(store) => crate::queues::check(&store.state()),
            None => (Vec::new(), Vec::new()),
        };
        let problems: Vec<String> = left_out.iter().map(|(_, p)| p.clone()).collect();
        for problem in problems.iter().filter(|p| !self.queue_problems.contains(p)) {
            tracing::warn!(%problem, "Queue left out");
        }
        self.queue_problems = problems;
        tracker.queues_changed(scheduler, declared, &left_out.into_iter().collect());
    }

    /// Applies the namespaces the cache changed (all of them after a list).
    fn refresh_namespaces(&self, tracker: &mut Tracker, log: ChangeLog) {
        let labels = |ns: &Namespace| ns.metadata.labels.clone().unwrap_or_default();
        if log.relisted {
            let all = self
                .namespaces
                .state()
                .iter()
                .map(|ns| (ns.name_any(), labels(ns)))
                .collect();
            tracker.namespaces_listed(all);
            return;
        }
        for (_, name) in log.keys {
            let namespace = self.namespaces.get(&ObjectRef::new(&name));
            tracker.namespace_changed(&name, namespace.as_deref().map(labels));
        }
    }

    /// Reads the LocalQueues' `spec.clusterQueue` again (a LocalQueue cache counts once it
    /// holds a full list).
    fn refresh_local_queues(&self, tracker: &mut Tracker) {
        let served = self.local_queues.is_some() && self.local_queues_ready;
        let all: HashMap<PodKey, String> = self
            .local_queues
            .iter()
            .filter(|_| served)
            .flat_map(|store| store.state())
            .filter_map(|local| {
                let cluster_queue = local
                    .data
                    .get("spec")
                    .and_then(|s| s.get("clusterQueue"))
                    .and_then(|q| q.as_str())
                    .unwrap_or_default();
                Some((
                    (
                        local.metadata.namespace.clone()?,
                        local.metadata.name.clone()?,
                    ),
                    cluster_queue.to_string(),
                ))
            })
            .collect();
        tracker.local_queues_changed(served, all);
    }

    /// Reads the PodGroups' `minMember` again.
    fn refresh_groups(&self, tracker: &mut Tracker) {
        let group_to_min: HashMap<PodKey, u32> = self
            .pod_groups
            .iter()
            .flat_map(|store| store.state())
            .filter_map(|group| {
                let min = group.data.get("spec")?.get("minMember")?.as_u64()?;
                Some((
                    (
                        group.metadata.namespace.clone()?,
                        group.metadata.name.clone()?,
                    ),
                    u32::try_from(min).ok()?,
                ))
            })
            .collect();
        tracker.pod_groups_changed(group_to_min);
        let group_to_policy: HashMap<PodKey, GroupPolicy> = self
            .workload_groups
            .iter()
            .flat_map(|(store, _)| store.state())
            .filter_map(|group| {
                let key = (
                    group.metadata.namespace.clone()?,
                    group.metadata.name.clone()?,
                );
                let policy = workload_group_policy(&key, &group.data["spec"]);
                Some((key, policy))
            })
            .collect();
        tracker.workload_groups_changed(group_to_policy);
        let group_to_stop = self
            .pod_groups
            .iter()
            .chain(self.workload_groups.iter().map(|(store, _)| store))
            .flat_map(|store| store.state())
            .filter_map(|group| {
                let key = (
                    group.metadata.namespace.clone()?,
                    group.metadata.name.clone()?,
                );
                let what = format!("pod group {}/{}", key.0, key.1);
                let policy =
                    crate::mapping::stop_policy(group.metadata.annotations.as_ref(), &what)
                        .transpose()?;
                Some((key, policy))
            })
            .collect();
        tracker.group_stop_policies_changed(group_to_stop);
    }

    /// Applies what the DRA caches changed to the tracker's view, once they hold full lists.
    /// Returns whether a node's GPU count changed (the node table is rebuilt).
    fn refresh_dra(
        &mut self,
        tracker: &mut Tracker,
        slices: ChangeLog,
        claims: ChangeLog,
        templates: ChangeLog,
    ) -> bool {
        let Some(stores) = &self.dra else {
            return false;
        };
        let first = !self.dra_ready;
        if first {
            // A kind found after start is still listing: until every cache holds a full list,
            // pods with claims wait (as if DRA were not served).
            let ready = stores.slices.wait_until_ready().now_or_never().is_some()
                && stores.classes.wait_until_ready().now_or_never().is_some()
                && stores.claims.wait_until_ready().now_or_never().is_some()
                && stores.templates.wait_until_ready().now_or_never().is_some();
            if !ready {
                return false;
            }
            self.dra_ready = true;
        }
        let view = tracker.dra_mut();
        view.served = true;
        let mut moved = false;
        let slices_changed = first || slices.relisted || !slices.keys.is_empty();
        if slices_changed {
            let all: Vec<ResourceSlice> = stores
                .slices
                .state()
                .iter()
                .map(|s| (**s).clone())
                .collect();
            moved = view.set_slices(&all);
            view.set_classes(
                stores
                    .classes
                    .state()
                    .iter()
                    .map(|c| (**c).clone())
                    .collect(),
            );
        }
        if first || claims.relisted {
            view.set_claims(
                stores
                    .claims
                    .state()
                    .into_iter()
                    .map(|c| ((c.namespace().unwrap_or_default(), c.name_any()), c))
                    .collect(),
            );
        } else {
            for (namespace, name) in &claims.keys {
                let claim = stores.claims.get(&ObjectRef::new(name).within(namespace));
                view.set_claim((namespace.clone(), name.clone()), claim);
            }
        }
        if first || templates.relisted {
            view.set_templates(
                stores
                    .templates
                    .state()
                    .into_iter()
                    .map(|t| ((t.namespace().unwrap_or_default(), t.name_any()), t))
                    .collect(),
            );
        } else {
            for (namespace, name) in &templates.keys {
                let template = stores
                    .templates
                    .get(&ObjectRef::new(name).within(namespace));
                view.set_template((namespace.clone(), name.clone()), template);
            }
        }
        if slices_changed
            || claims.relisted
            || templates.relisted
            || !claims.keys.is_empty()
            || !templates.keys.is_empty()
        {
            tracker.claims_changed();
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_group_spec_becomes_a_gang_single_pods_or_a_refusal_naming_the_field() {
        let key = ("ns".to_string(), "g".to_string());
        let policy = |spec: serde_json::Value| workload_group_policy(&key, &spec);
        let gang = serde_json::json!({"gang": {"minCount": 16}});
        assert_eq!(
            policy(serde_json::json!({"schedulingPolicy": gang})),
            GroupPolicy::Gang(16)
        );
        assert_eq!(
            policy(serde_json::json!({"schedulingPolicy": {"gang": {"minCount": 0}}})),
            GroupPolicy::Gang(1)
        );
        assert_eq!(
            policy(serde_json::json!({"schedulingPolicy": {"basic": {}}})),
            GroupPolicy::Basic
        );
        // Empty lists are what the API server echoes for unset fields: not refused.
        assert_eq!(
            policy(
                serde_json::json!({"schedulingPolicy": gang, "resourceClaims": [],
                "schedulingConstraints": {"topology": []}})
            ),
            GroupPolicy::Gang(16)
        );
        let refusal = |spec: serde_json::Value| match policy(spec) {
            GroupPolicy::Refused(message) => message,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert_eq!(
            refusal(
                serde_json::json!({"schedulingPolicy": gang, "parentCompositePodGroupName": "job"})
            ),
            "pod group ns/g: spec.parentCompositePodGroupName is not supported by Gantry (a pod group inside a composite pod group; Gantry places each PodGroup on its own); remove it or use another scheduler"
        );
        assert!(
            refusal(serde_json::json!({"schedulingPolicy": gang,
            "schedulingConstraints": {"topology": [{"key": "rack"}]}}))
            .contains("spec.schedulingConstraints.topology is not supported")
        );
        assert!(
            refusal(serde_json::json!({"schedulingPolicy": gang,
            "resourceClaims": [{"name": "gpus"}]}))
            .contains("spec.resourceClaims is not supported")
        );
        assert!(refusal(serde_json::json!({"schedulingPolicy": {"quorum": {}}}))
            .contains("spec.schedulingPolicy is not supported by Gantry (a scheduling policy other than gang and basic)"));
    }
}
