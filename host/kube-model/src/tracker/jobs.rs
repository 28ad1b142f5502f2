//! What the binder asks and tells: the pods behind a job, the bindings and evictions done,
//! the preemptors nominated and the pods that wait.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Instant;

use gantry_core::{JobId, Scheduler};

use crate::mapping::{PendingPod, is_ours};

use super::{BoundPod, Nominated, PodKey, Role, Tracker};

impl Tracker {
    /// The pods of a pending job, in a stable order, or of a running one.
    pub fn pods_of(&self, job: JobId) -> Vec<PendingPod> {
        match self.job_to_gang.get(&job) {
            Some((gang, false)) => self
                .gang_to_pending
                .get(gang)
                .map(|g| g.pods.values().cloned().collect())
                .unwrap_or_default(),
            Some((gang, true)) => self
                .gang_to_running
                .get(gang)
                .map(|g| g.pods.values().map(|(p, _)| p.clone()).collect())
                .unwrap_or_default(),
            None => Vec::new(),
        }
    }

    /// A running job's pods and their nodes.
    pub fn running_pods(&self, job: JobId) -> Vec<(PendingPod, usize)> {
        match self.job_to_gang.get(&job) {
            Some((gang, true)) => self
                .gang_to_running
                .get(gang)
                .map(|g| g.pods.values().cloned().collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// The uids of our pending pods.
    pub fn pending_uids(&self) -> HashSet<String> {
        self.gang_to_pending
            .values()
            .flat_map(|g| g.pods.values().map(|p| p.uid.clone()))
            .collect()
    }

    /// A placed job's pods are bound to `nodes` (by pod, in [`Tracker::pods_of`] order): they
    /// count as bound until the bound cache confirms them.
    pub fn bound(&mut self, job: JobId, pods: &[(PendingPod, usize)]) {
        let Some((gang, false)) = self.job_to_gang.get(&job).cloned() else {
            return;
        };
        let keys: BTreeSet<PodKey> = pods
            .iter()
            .map(|(p, _)| (p.namespace.clone(), p.name.clone()))
            .collect();
        if let Some(entry) = self.gang_to_pending.get_mut(&gang) {
            for key in &keys {
                entry.pods.remove(key);
            }
            entry.job = None;
            if entry.pods.is_empty() {
                self.gang_to_pending.remove(&gang);
            }
        }
        let group = self.gang_to_running.entry(gang.clone()).or_default();
        let fresh = group.pods.is_empty() && group.job.is_none();
        for (pod, node) in pods {
            let key = (pod.namespace.clone(), pod.name.clone());
            self.key_to_pending.remove(&key);
            group.pods.insert(key.clone(), (pod.clone(), *node));
            self.key_to_bound.insert(
                key.clone(),
                BoundPod {
                    uid: pod.uid.clone(),
                    node: *node,
                    role: Role::Member(gang.clone()),
                    assumed: Some(Instant::now()),
                    ours: true,
                },
            );
            self.assumed.insert(key);
        }
        if fresh {
            // The job the core placed is this group's running job.
            group.job = Some((job, keys));
            self.job_to_gang.insert(job, (gang, true));
        } else {
            // Members of the gang ran already (a restarted member): adopt the group afresh.
            self.job_to_gang.remove(&job);
            self.job_to_warning.remove(&job);
            self.dirty_running.insert(gang);
        }
    }

    /// A preemptor is nominated to its nodes and waits for `victims` (pod keys) to go.
    pub fn nominate(&mut self, job: JobId, victims: BTreeSet<PodKey>) {
        self.job_to_nominated.insert(
            job,
            Nominated {
                victims,
                since: Instant::now(),
            },
        );
    }

    /// Preemptors waiting, with their victims.
    pub fn nominated(&self) -> &BTreeMap<JobId, Nominated> {
        &self.job_to_nominated
    }

    /// Jobs the core evicted for a preemptor: they leave the core (their pods are being
    /// evicted) and their pods hold their room until gone.
    pub fn evicted(&mut self, scheduler: &mut Scheduler, jobs: &[JobId]) {
        for &job in jobs {
            self.job_to_warning.remove(&job);
            let Some((gang, true)) = self.job_to_gang.remove(&job) else {
                continue;
            };
            if scheduler.get(job).is_some() {
                scheduler.finish(job);
            }
            let Some(group) = self.gang_to_running.remove(&gang) else {
                continue;
            };
            for (key, (pod, node)) in group.pods {
                let ours = is_ours(&pod.pod, &self.config);
                let role = self.hold(scheduler, &pod.pod, node, ours);
                if let Some(b) = self.key_to_bound.get_mut(&key) {
                    b.role = role;
                }
            }
        }
    }

    /// What the job's pods declared that Gantry worked around, for their FailedScheduling.
    pub fn warning_of(&self, job: JobId) -> Option<&str> {
        self.job_to_warning.get(&job).map(String::as_str)
    }

    /// Pods waiting before any placement is tried, with why: incomplete gangs, unknown
    /// PodGroups.
    pub fn waiting(&self) -> Vec<(PendingPod, String)> {
        self.gang_to_pending
            .values()
            .filter_map(|g| Some((g, g.waiting.clone()?)))
            .flat_map(|(g, why)| g.pods.values().map(move |p| (p.clone(), why.clone())))
            .collect()
    }

    /// How many of our pods are pending, and how many of them wait outside any job.
    pub fn pending_pods(&self) -> usize {
        self.key_to_pending.len()
    }
}
