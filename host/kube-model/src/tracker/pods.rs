//! One pod changed: pending pods gather into gangs, bound pods hold their room or join
//! their running group, and the bindings this process assumed.

use std::sync::Arc;

use gantry_core::{PodShape, Resources, Scheduler};
use k8s_openapi::api::core::v1::Pod;

use crate::mapping::{PendingPod, gang_of, is_balloon, is_ours, pod_request};

use super::{ASSUME_TTL, BoundPod, PodKey, Role, Tracker};

impl Tracker {
    /// The uid of our pod at `key` as last seen (bound or pending), to tell when it is gone.
    pub fn our_uid(&self, key: &PodKey) -> Option<String> {
        if let Some(b) = self.key_to_bound.get(key) {
            return b.ours.then(|| b.uid.clone());
        }
        let gang = self.key_to_pending.get(key)?;
        Some(self.gang_to_pending.get(gang)?.pods.get(key)?.uid.clone())
    }

    /// The pod at `key` changed: `pending` and `bound` are what the unbound-pod and bound-pod
    /// caches now hold for it.
    pub fn pod_changed(
        &mut self,
        scheduler: &mut Scheduler,
        key: PodKey,
        pending: Option<&Arc<Pod>>,
        bound: Option<&Arc<Pod>>,
    ) {
        let bound_node = bound.and_then(|p| {
            let name = p.spec.as_ref()?.node_name.as_deref()?;
            self.name_to_node.get(name).copied()
        });
        if let (Some(pod), Some(node)) = (bound, bound_node) {
            self.forget_pending(scheduler, &key);
            self.set_bound(scheduler, key, pod, node);
            return;
        }
        // Not in the bound cache (yet): a pod this process bound stays bound for a while.
        let assumed = self
            .key_to_bound
            .get(&key)
            .and_then(|b| b.assumed)
            .is_some_and(|at| at.elapsed() < ASSUME_TTL);
        if assumed {
            return;
        }
        self.forget_bound(scheduler, &key);
        match pending.filter(|p| p.metadata.deletion_timestamp.is_none()) {
            Some(pod) => self.set_pending(key, pod),
            None => self.forget_pending(scheduler, &key),
        }
    }

    pub(super) fn set_pending(&mut self, key: PodKey, pod: &Arc<Pod>) {
        let gang = gang_of(pod, &self.config, &self.workload_group_to_policy);
        let member = PendingPod::of(pod);
        if let Some(old) = self.key_to_pending.get(&key)
            && *old != gang
        {
            let old = old.clone();
            if let Some(g) = self.gang_to_pending.get_mut(&old) {
                g.pods.remove(&key);
            }
            self.dirty_pending.insert(old);
        }
        self.key_to_pending.insert(key.clone(), gang.clone());
        let entry = self.gang_to_pending.entry(gang.clone()).or_default();
        let same = entry
            .pods
            .get(&key)
            .is_some_and(|p| p.uid == member.uid && decides_the_same(&p.pod, pod));
        entry.pods.insert(key, member);
        if !same {
            self.dirty_pending.insert(gang);
        }
    }

    /// The gang whose pod `key` is pending, if it is: what a cycle would decide for it.
    #[cfg(test)]
    pub(super) fn pending_is_dirty(&self, key: &PodKey) -> bool {
        self.key_to_pending
            .get(key)
            .is_some_and(|gang| self.dirty_pending.contains(gang))
    }

    fn forget_pending(&mut self, _scheduler: &mut Scheduler, key: &PodKey) {
        if let Some(gang) = self.key_to_pending.remove(key) {
            if let Some(g) = self.gang_to_pending.get_mut(&gang) {
                g.pods.remove(key);
            }
            self.dirty_pending.insert(gang);
        }
    }

    fn set_bound(&mut self, scheduler: &mut Scheduler, key: PodKey, pod: &Arc<Pod>, node: usize) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let ours = is_ours(pod, &self.config);
        let terminating = pod.metadata.deletion_timestamp.is_some();
        let member_of = ((ours || is_balloon(pod, &self.config)) && !terminating)
            .then(|| gang_of(pod, &self.config, &self.workload_group_to_policy));
        if let Some(old) = self.key_to_bound.get_mut(&key)
            && old.uid == uid
            && old.node == node
        {
            let same = match (&old.role, &member_of) {
                (Role::Member(a), Some(b)) => a == b,
                (Role::Held { .. }, None) => true,
                _ => false,
            };
            if same {
                // Confirmed, or an update that changes nothing here.
                old.assumed = None;
                self.assumed.remove(&key);
                if let Role::Member(gang) = &old.role
                    && let Some(group) = self.gang_to_running.get_mut(gang)
                    && let Some(entry) = group.pods.get_mut(&key)
                {
                    entry.0 = PendingPod::of(pod);
                }
                return;
            }
        }
        self.forget_bound(scheduler, &key);
        let role = match member_of {
            Some(gang) => {
                let group = self.gang_to_running.entry(gang.clone()).or_default();
                group.pods.insert(key.clone(), (PendingPod::of(pod), node));
                self.dirty_running.insert(gang.clone());
                // The pending side counts bound members toward minMember.
                if self.gang_to_pending.contains_key(&gang) {
                    self.dirty_pending.insert(gang.clone());
                }
                Role::Member(gang)
            }
            None => self.hold(scheduler, pod, node, ours),
        };
        self.key_to_bound.insert(
            key,
            BoundPod {
                uid,
                node,
                role,
                assumed: None,
                ours,
            },
        );
    }

    /// Holds a pod's room directly, never more than the node has left (pods bound by someone
    /// else may overcommit it, and a preemptor may already sit in a victim's room).
    pub(super) fn hold(
        &mut self,
        scheduler: &mut Scheduler,
        pod: &Arc<Pod>,
        node: usize,
        ours: bool,
    ) -> Role {
        let request = pod_request(pod, &self.config);
        let gpus = request.gpus.saturating_add(self.dra.gpus(pod).0);
        let n = &scheduler.state.nodes;
        let resources = request
            .other
            .iter()
            .filter_map(|(name, &v)| {
                let name = self.symbols.intern(name);
                let column = n.resources.iter().find(|c| c.name == name)?;
                Some((name, v.min(column.free[node])))
            })
            .collect();
        let shape = PodShape {
            gpus: gpus.min(n.gpu_free[node]),
            cpu_milli: request.cpu_milli.min(n.cpu_free_milli[node]),
            memory_mib: request.memory_mib.min(n.memory_free_mib[node]),
            resources,
            ..PodShape::default()
        };
        let slot = scheduler.state.reserve(node, &shape);
        let charged = if ours {
            self.charge(pod).map(|queue| (queue, u64::from(gpus)))
        } else {
            None
        };
        if let Some((queue, gpus)) = &charged {
            self.ensure_queue(scheduler, queue);
            if let Some(id) = scheduler.queues.id(queue) {
                scheduler.queues.charge(id, Resources::gpus(*gpus), true);
            }
        }
        Role::Held {
            slot,
            shape,
            charged,
        }
    }

    fn forget_bound(&mut self, scheduler: &mut Scheduler, key: &PodKey) {
        let Some(bound) = self.key_to_bound.remove(key) else {
            return;
        };
        self.assumed.remove(key);
        match bound.role {
            Role::Member(gang) => {
                if let Some(group) = self.gang_to_running.get_mut(&gang) {
                    group.pods.remove(key);
                }
                if self.gang_to_pending.contains_key(&gang) {
                    self.dirty_pending.insert(gang.clone());
                }
                self.dirty_running.insert(gang);
            }
            Role::Held {
                slot,
                shape,
                charged,
            } => {
                scheduler.state.release(slot, &shape);
                if let Some((queue, gpus)) = charged
                    && let Some(id) = scheduler.queues.id(&queue)
                {
                    scheduler.queues.charge(id, Resources::gpus(gpus), false);
                }
            }
        }
        for nominated in self.job_to_nominated.values_mut() {
            nominated.victims.remove(key);
        }
    }

    /// A binding this process assumed did not happen after all (the pod was read back
    /// unbound): its assumption ends now, so [`Tracker::expired_assumptions`] hands it back
    /// to be judged by the caches.
    pub fn unassume(&mut self, key: &PodKey) {
        if let Some(bound) = self.key_to_bound.get_mut(key) {
            bound.assumed = None;
        }
    }

    /// Pods bound by this process that the bound cache never confirmed within the assume
    /// window: looked up again by the caller.
    pub fn expired_assumptions(&self) -> Vec<PodKey> {
        self.assumed
            .iter()
            .filter(|k| {
                self.key_to_bound
                    .get(*k)
                    .and_then(|b| b.assumed)
                    .is_none_or(|at| at.elapsed() >= ASSUME_TTL)
            })
            .cloned()
            .collect()
    }
}

/// Whether an update of a pending pod leaves what Gantry decides for it unchanged: the same
/// spec, and the same ResourceClaims created for it (a claim made from a template reaches the
/// pod through its status, and the pod could not be placed before it did).
fn decides_the_same(old: &Pod, new: &Pod) -> bool {
    let claims = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.clone())
    };
    old.spec == new.spec && claims(old) == claims(new)
}
