//! The gangs' sizes and policies: scheduler-plugins PodGroups' `minMember` and upstream
//! `scheduling.k8s.io` PodGroups.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::mapping::{self, Gang, GroupPolicy};

use super::{PodKey, Role, Tracker};

impl Tracker {
    /// The `gantry.dev/stop-policy` annotations of the PodGroups (both kinds), by
    /// `(namespace, name)`: what a node failure stops of their gangs, from their next job on.
    pub fn group_stop_policies_changed(
        &mut self,
        group_to_policy: HashMap<PodKey, Result<gantry_core::StopPolicy, String>>,
    ) {
        self.group_to_stop_policy = group_to_policy;
    }

    /// PodGroups' `minMember` changed: every PodGroup gang is looked at again.
    pub fn pod_groups_changed(&mut self, group_to_min: HashMap<PodKey, u32>) {
        if group_to_min == self.group_to_min {
            return;
        }
        self.group_to_min = group_to_min;
        let groups: Vec<Gang> = self
            .gang_to_pending
            .keys()
            .filter(|g| matches!(g, Gang::PodGroup(..)))
            .cloned()
            .collect();
        self.dirty_pending.extend(groups);
    }

    /// The upstream PodGroups changed: their pods are grouped again (a `basic` group's pods
    /// are jobs of their own, a gang's one job of at least `minCount`).
    pub fn workload_groups_changed(&mut self, group_to_policy: HashMap<PodKey, GroupPolicy>) {
        if group_to_policy == self.workload_group_to_policy {
            return;
        }
        self.workload_group_to_policy = group_to_policy;
        let regroup: Vec<(PodKey, Arc<Pod>)> = self
            .gang_to_pending
            .values()
            .flat_map(|g| g.pods.iter())
            .filter(|(_, p)| mapping::scheduling_group(&p.pod).is_some())
            .map(|(key, p)| (key.clone(), p.pod.clone()))
            .collect();
        for (key, pod) in regroup {
            self.set_pending(key, &pod);
        }
        let gangs: Vec<Gang> = self
            .gang_to_pending
            .keys()
            .filter(|g| matches!(g, Gang::Workload(..)))
            .cloned()
            .collect();
        self.dirty_pending.extend(gangs);
    }

    /// The upstream PodGroup a pending or bound pod of ours belongs to as a gang member.
    pub fn workload_group_of(&self, key: &PodKey) -> Option<PodKey> {
        let gang =
            self.key_to_pending
                .get(key)
                .or_else(|| match &self.key_to_bound.get(key)?.role {
                    Role::Member(gang) => Some(gang),
                    Role::Held { .. } => None,
                })?;
        match gang {
            Gang::Workload(ns, name) => Some((ns.clone(), name.clone())),
            _ => None,
        }
    }
}
