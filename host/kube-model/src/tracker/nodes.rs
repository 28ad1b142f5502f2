//! The node table: a health change applied in place, anything else a rebuild of the table and
//! of every job with it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use gantry_core::{ClusterState, Resources, Scheduler};
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::mapping::{self, NodeDigest};

use super::{ASSUME_TTL, PodKey, Role, Tracker, World};

impl Tracker {
    /// Whether `node` (as the cache now holds it, `None` when deleted) needs a rebuild; a
    /// health-only change is applied here.
    pub fn node_changed(
        &mut self,
        scheduler: &mut Scheduler,
        name: &str,
        node: Option<&Node>,
    ) -> bool {
        let (Some(node), Some(old)) = (node, self.name_to_digest.get(name)) else {
            // Added, or removed.
            return node.is_some() || self.name_to_digest.contains_key(name);
        };
        let digest = NodeDigest::of(node, &self.config, self.dra.node_devices(name));
        if digest == *old {
            return false;
        }
        if digest.same_but_health(old) {
            let index = self.name_to_node[name];
            let (suspect, preflight) = (old.firing.suspect.clone(), old.preflight.clone());
            self.note_signals(name, &suspect, &digest.firing.suspect);
            self.note_preflight(name, preflight.as_ref(), digest.preflight.as_ref());
            scheduler.state.set_health(index, digest.health);
            self.name_to_digest.insert(name.to_string(), digest);
            return false;
        }
        true
    }

    /// Builds everything again from the whole caches: a new node table and queue tree, every
    /// pod applied anew. Job ids keep counting.
    pub fn rebuild(&mut self, scheduler: &mut Scheduler, world: &World<'_>) {
        // Pods this process bound that the bound cache has not shown yet stay bound: the
        // unbound cache may still list them, and binding them again would only post a second
        // Scheduled Event (or fail, naming the node they are on).
        let assumed: Vec<(PodKey, Arc<Pod>, Instant)> = self
            .assumed
            .iter()
            .filter_map(|key| {
                let bound = self.key_to_bound.get(key)?;
                let at = bound.assumed.filter(|at| at.elapsed() < ASSUME_TTL)?;
                let Role::Member(gang) = &bound.role else {
                    return None;
                };
                let (pod, _) = self.gang_to_running.get(gang)?.pods.get(key)?;
                let node = self.node_names.get(bound.node)?.clone();
                let mut object = (*pod.pod).clone();
                object.spec.get_or_insert_with(Default::default).node_name = Some(node);
                Some((key.clone(), Arc::new(object), at))
            })
            .collect();
        let (table, names, digests) =
            mapping::node_table(world.nodes, &self.config, &self.symbols, &self.dra);
        // A node known before whose signals changed (a taint is part of the table, so a taint
        // signal arrives here) is reported as in the in-place path; a node new to the table
        // reports nothing: what it showed before Gantry saw it is no event.
        for (name, digest) in &digests {
            if let Some(old) = self.name_to_digest.get(name) {
                let (suspect, preflight) = (old.firing.suspect.clone(), old.preflight.clone());
                self.note_signals(name, &suspect, &digest.firing.suspect);
                self.note_preflight(name, preflight.as_ref(), digest.preflight.as_ref());
            }
        }
        self.new_nodes = digests
            .keys()
            .filter(|name| !self.name_to_digest.contains_key(*name))
            .cloned()
            .collect();
        self.preflight_nodes = digests
            .iter()
            .filter_map(|(name, d)| Some((name.clone(), d.preflight.clone()?)))
            .collect();
        self.suspect_to_cause = digests
            .iter()
            .filter_map(|(name, d)| Some((name.clone(), d.firing.suspect.iter().next()?.clone())))
            .collect();
        self.capacity = Resources {
            gpus: table.gpu_total.iter().map(|&g| u64::from(g)).sum(),
            cpu_milli: table.cpu_free_milli.iter().map(|&c| u64::from(c)).sum(),
            memory_mib: table.memory_free_mib.iter().map(|&m| u64::from(m)).sum(),
        };
        self.name_to_node = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        self.node_names = names;
        self.name_to_digest = digests;
        let queues = mapping::queue_tree(&self.declared_queues, &self.used_names(), self.capacity);
        scheduler.reset(ClusterState::new(table), queues);
        self.key_to_pending.clear();
        self.gang_to_pending.clear();
        self.key_to_bound.clear();
        self.gang_to_running.clear();
        self.job_to_gang.clear();
        self.dirty_pending.clear();
        self.dirty_running.clear();
        self.job_to_nominated.clear();
        self.assumed.clear();
        let key = |p: &Arc<Pod>| -> PodKey {
            (
                p.metadata.namespace.clone().unwrap_or_default(),
                p.metadata.name.clone().unwrap_or_default(),
            )
        };
        // Bound pods first, so gangs count their bound members; pending ones oldest first,
        // as kube-scheduler's FIFO within one priority.
        for pod in world.bound {
            self.pod_changed(scheduler, key(pod), None, Some(pod));
        }
        for (at_key, pod, at) in assumed {
            if self.key_to_bound.contains_key(&at_key) {
                continue;
            }
            self.pod_changed(scheduler, at_key.clone(), None, Some(&pod));
            if let Some(bound) = self.key_to_bound.get_mut(&at_key) {
                bound.assumed = Some(at);
                self.assumed.insert(at_key);
            }
        }
        let mut pending: Vec<&Arc<Pod>> = world.pending.iter().collect();
        pending.sort_by(|a, b| {
            (&a.metadata.creation_timestamp, &a.metadata.name)
                .cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
        });
        // A pod both caches list is bound: a binding is never undone, so the unbound cache is
        // behind (its watch broke, say, and it has not relisted yet while the bound one has).
        // Applied as pending, it would be placed again and its binding refused, naming the
        // node it is on.
        let bound_uids: HashSet<(PodKey, &str)> = world
            .bound
            .iter()
            .filter_map(|p| Some((key(p), p.metadata.uid.as_deref()?)))
            .collect();
        for pod in pending {
            let at = key(pod);
            if let Some(uid) = pod.metadata.uid.as_deref()
                && bound_uids.contains(&(at.clone(), uid))
            {
                continue;
            }
            self.pod_changed(scheduler, at, Some(pod), None);
        }
    }

    pub(super) fn used_names(&self) -> Vec<String> {
        self.used_queues.iter().cloned().collect()
    }
}
