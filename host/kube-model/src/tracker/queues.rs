//! The queue tree and tenancy: the Queue objects, namespaces' labels and LocalQueues, and which
//! queue each pod is charged to.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use gantry_core::{QueueDef, Resources, Scheduler};
use k8s_openapi::api::core::v1::Pod;

use crate::mapping::{self, Gang, PendingPod, queue_claim};
use crate::queues::DeclaredQueue;
use crate::tenancy::{Affected, Labels};

use super::{PodKey, Role, Tracker};

impl Tracker {
    /// The Queue objects changed: `declared` are the usable ones, `left_out` those left out
    /// (by name, with why).
    pub fn queues_changed(
        &mut self,
        scheduler: &mut Scheduler,
        declared: Vec<DeclaredQueue>,
        left_out: &BTreeMap<String, String>,
    ) {
        let affected = self.tenancy.set_queues(&declared, left_out);
        self.mark(affected);
        self.queue_to_stop_policy = declared
            .iter()
            .filter(|q| q.stop_policy != gantry_core::StopPolicy::Whole)
            .map(|q| (q.def.name.clone(), q.stop_policy))
            .collect();
        let defs: Vec<QueueDef> = declared.into_iter().map(|q| q.def).collect();
        if defs == self.declared_queues {
            return;
        }
        self.declared_queues = defs;
        self.replace_queues(scheduler);
    }

    /// Namespace `name` changed (`None`: deleted).
    pub fn namespace_changed(&mut self, name: &str, labels: Option<Labels>) {
        if self.tenancy.set_namespace(name, labels) {
            self.mark(Affected::Namespaces([name.to_string()].into()));
        }
    }

    /// Every namespace, after the Namespace cache listed (again).
    pub fn namespaces_listed(&mut self, all: HashMap<String, Labels>) {
        let affected = self.tenancy.set_namespaces(all);
        self.mark(affected);
    }

    /// Kueue's LocalQueues: whether the kind is served and listed, and each one's
    /// `spec.clusterQueue` by `(namespace, name)`.
    pub fn local_queues_changed(&mut self, served: bool, all: HashMap<PodKey, String>) {
        let affected = self.tenancy.set_local_queues(served, all);
        self.mark(affected);
    }

    /// Pending gangs a tenancy change may concern are decided again at the sync's end.
    fn mark(&mut self, affected: Affected) {
        let gangs: Vec<Gang> = match affected {
            Affected::Nothing => return,
            Affected::All => self.gang_to_pending.keys().cloned().collect(),
            Affected::Namespaces(namespaces) => self
                .gang_to_pending
                .keys()
                .filter(|g| namespaces.contains(g.namespace()))
                .cloned()
                .collect(),
        };
        self.dirty_pending.extend(gangs);
    }

    /// Whether the API server serves the Queue kind is unknown (`Some`: why) or known: while
    /// unknown, pending pods that name a queue wait (see [`Tenancy::set_queues_unknown`]).
    pub fn queues_unknown(&mut self, why: Option<String>) {
        let affected = self.tenancy.set_queues_unknown(why);
        self.mark(affected);
    }

    /// The queue a bound pod of ours is charged to, if any (see [`Tenancy::charge`]). When it
    /// is not the one the pod names, why is noted once per pod, for its Event
    /// ([`Tracker::take_charge_notes`]).
    pub(super) fn charge(&mut self, pod: &Arc<Pod>) -> Option<String> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let charge = self
            .tenancy
            .charge(namespace, &queue_claim(pod, &self.config), &self.config);
        if let Some(note) = charge.redirected {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if self.charge_noted.insert(uid) {
                self.charge_notes.push((PendingPod::of(pod), note));
            }
        }
        charge.queue
    }

    /// The bound pods charged elsewhere than the queue they name since the last call, each
    /// with why: the binder posts each as a Warning Event on the pod.
    pub fn take_charge_notes(&mut self) -> Vec<(PendingPod, String)> {
        // A pod's uid is forgotten only once it is gone: one that is held and read back as a
        // member again (a status update) is not told twice.
        if self.charge_noted.len() > 2 * self.key_to_bound.len() + 64 {
            let bound: HashSet<&str> = self.key_to_bound.values().map(|b| b.uid.as_str()).collect();
            self.charge_noted.retain(|uid| bound.contains(uid.as_str()));
        }
        std::mem::take(&mut self.charge_notes)
    }

    fn replace_queues(&mut self, scheduler: &mut Scheduler) {
        let queues = mapping::queue_tree(&self.declared_queues, &self.used_names(), self.capacity);
        scheduler.set_queues(queues);
        // Own pods that only hold room are charged outside any job.
        for bound in self.key_to_bound.values() {
            if let Role::Held {
                charged: Some((queue, gpus)),
                ..
            } = &bound.role
                && let Some(id) = scheduler.queues.id(queue)
            {
                scheduler.queues.charge(id, Resources::gpus(*gpus), true);
            }
        }
    }

    /// Makes sure `queue` is in the tree (a pod named a queue nobody declared).
    pub(super) fn ensure_queue(&mut self, scheduler: &mut Scheduler, queue: &str) {
        if self.used_queues.insert(queue.to_string()) && scheduler.queues.id(queue).is_none() {
            self.replace_queues(scheduler);
        }
    }
}
