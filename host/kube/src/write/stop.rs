//! Gangs stopped by a node failure (`CycleOutput::stopped`): every pod of each is evicted
//! through the Eviction API (PodDisruptionBudgets honoured, its uid as a precondition) with a
//! `Stopped` Event naming the node and the signal, so that its controller recreates the pods;
//! the recreated pods go first (see `gantry_kube_model::tracker`'s `health`). A gang whose
//! stop policy is `pod` loses only its pods on the failed node. An eviction a
//! budget blocks is tried again every [`RETRY_BLOCKED`] until [`GIVE_UP`].

use std::time::{Duration, Instant};

use gantry_core::CycleOutput;

use super::Writer;
use super::evict::{GIVE_UP, evict};
use crate::mapping::PendingPod;
use crate::tracker::Tracker;

/// A blocked stop is tried again this often.
const RETRY_BLOCKED: Duration = Duration::from_secs(5);

/// The Event a stop's eviction posts: reason and action.
const STOPPED: (&str, &str) = ("Stopped", "Stopping");

/// A pod of a stopped gang whose eviction a budget (or an error) blocked.
#[derive(Debug, Clone)]
pub(crate) struct BlockedStop {
    pod: PendingPod,
    note: String,
    since: Instant,
    last_try: Instant,
}

impl Writer {
    /// Evicts the pods of the gangs the cycle stopped, and tries the blocked ones again.
    pub(super) fn stop_gangs(
        &mut self,
        tracker: &Tracker,
        scheduler: &gantry_core::Scheduler,
        output: &CycleOutput,
    ) {
        if !self.may_write() {
            return;
        }
        let mut pods: Vec<(PendingPod, String)> = Vec::new();
        for &job in &output.stopped {
            let note = output
                .decisions
                .iter()
                .find(|d| d.job == job && !d.placed)
                .map(|d| d.explanation.summary())
                .unwrap_or_else(|| "Stopped: a node under it failed".into());
            let mut running = tracker.running_pods(job);
            // Stop policy pod: only its pods on the node that failed (the latest it avoids).
            let failed = scheduler
                .avoided(job)
                .iter()
                .max_by(|a, b| a.until_s.total_cmp(&b.until_s))
                .map(|b| b.node);
            if scheduler.stop_policy(job) == gantry_core::StopPolicy::Pod
                && let Some(node) = failed
            {
                running.retain(|(_, on)| *on == node);
                tracing::warn!(job, pods = running.len(), %note, "stopping a gang's pods on a failed node");
            } else {
                tracing::warn!(job, pods = running.len(), %note, "stopping a gang whole");
            }
            pods.extend(running.into_iter().map(|(p, _)| (p, note.clone())));
        }
        let now = Instant::now();
        self.blocked_stops.retain(|b| {
            b.since.elapsed() < GIVE_UP
                && tracker.our_uid(&b.pod_key()).as_deref() == Some(b.pod.uid.as_str())
        });
        for blocked in self
            .blocked_stops
            .iter_mut()
            .filter(|b| b.last_try.elapsed() >= RETRY_BLOCKED)
        {
            blocked.last_try = now;
            pods.push((blocked.pod.clone(), blocked.note.clone()));
        }
        if pods.is_empty() {
            return;
        }
        let (client, leadership) = (&self.evict_client, self.leadership.as_deref());
        let results = self.handle.block_on(futures::future::join_all(
            pods.iter()
                .map(|(pod, note)| evict(client, leadership, pod, STOPPED, note)),
        ));
        for ((pod, note), blocked) in pods.into_iter().zip(results) {
            let known = self.blocked_stops.iter().position(|b| b.pod.uid == pod.uid);
            match (blocked, known) {
                (None, Some(i)) => {
                    self.blocked_stops.swap_remove(i);
                }
                (None, None) => {}
                (Some(why), known) => {
                    tracing::warn!(pod = %pod.key(), %why, "stop blocked; trying again");
                    if known.is_none() {
                        self.blocked_stops.push(BlockedStop {
                            pod,
                            note,
                            since: now,
                            last_try: now,
                        });
                    }
                }
            }
        }
    }
}

impl BlockedStop {
    fn pod_key(&self) -> (String, String) {
        (self.pod.namespace.clone(), self.pod.name.clone())
    }
}
