//! Why pods wait, said the way kube-scheduler says it: FailedScheduling Events with the start
//! estimate, the PodScheduled condition, and Scheduled Events for the pods bound.

use std::collections::BTreeMap;
use std::time::Instant;

use futures::StreamExt;
use gantry_core::{CycleOutput, JobId, Scheduler};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

use super::{COMPONENT, CONCURRENCY, EVENT_CONCURRENCY, Groups, TRIM_EVERY, Writer, fenced};
use crate::leader::Leadership;
use crate::mapping::PendingPod;
use crate::tracker::{PodKey, Tracker};

impl Writer {
    /// Posts a Scheduled Event for each pod bound to its node, in the background, a few at a
    /// time, like kube-scheduler's event broadcaster: the next cycle's bindings never wait for
    /// this cycle's Events, and a burst of Events never crowds bindings out of the API server.
    pub(super) fn post_scheduled_events(&self, scheduled: Vec<(PendingPod, String)>) {
        let notes = scheduled
            .into_iter()
            .map(|(pod, node)| {
                let note = format!("Successfully assigned {} to {node}", pod.key());
                (pod, note)
            })
            .collect();
        self.post_events(("Normal", "Scheduled", "Binding"), notes);
    }

    /// Posts a Warning Event on each bound pod charged elsewhere than the queue it names
    /// (see [`Tracker::take_charge_notes`]), in the background as the Scheduled Events are.
    /// Taken only while this replica may write: a new leader notes them again as it builds.
    pub(super) fn post_charge_events(&self, tracker: &mut Tracker) {
        if !self.may_write() {
            return;
        }
        let notes = tracker.take_charge_notes();
        self.post_events(("Warning", "QueueNotAdmitted", "Charging"), notes);
    }

    /// Posts one Event of `(type, reason, action)` per `(pod, note)`, in the background, a
    /// few at a time.
    fn post_events(
        &self,
        kind: (&'static str, &'static str, &'static str),
        notes: Vec<(PendingPod, String)>,
    ) {
        if notes.is_empty() {
            return;
        }
        let client = self.client.clone();
        let (type_, reason, action) = kind;
        self.handle.spawn(async move {
            futures::stream::iter(notes)
                .for_each_concurrent(EVENT_CONCURRENCY, |(pod, note)| {
                    let client = client.clone();
                    async move {
                        if let Err(e) = event(&client, &pod, type_, reason, action, &note).await {
                            tracing::warn!(pod = %pod.key(), error = %e, reason, "cannot post the event");
                        }
                    }
                })
                .await;
        });
    }

    /// Says why pods wait, the way kube-scheduler does: a FailedScheduling Event when the
    /// reason changed, and the PodScheduled condition. A job the cycle did not try says it
    /// again when its first start estimate comes.
    pub(super) fn report_waiting(
        &mut self,
        tracker: &Tracker,
        groups: Groups<'_>,
        scheduler: &Scheduler,
        output: &CycleOutput,
        failed: Vec<(PendingPod, String)>,
    ) {
        let mut waiting = failed;
        // Each waiting job's message, for all of its pods.
        let mut job_messages: Vec<(JobId, String)> = Vec::new();
        for decision in &output.decisions {
            let job = decision.job;
            let estimate = decision.explanation.estimate.as_ref();
            if decision.placed || estimate.is_some() {
                self.job_to_unestimated_reason.remove(&job);
            }
            // A stopped gang's pods get their Stopped Event with the eviction (see `stop`).
            if decision.placed || output.stopped.contains(&job) {
                continue;
            }
            let reason = decision.explanation.summary();
            if estimate.is_none() {
                self.job_to_unestimated_reason.insert(job, reason.clone());
            }
            job_messages.push((job, waiting_message(tracker, job, reason, estimate)));
        }
        for &job in &output.newly_estimated {
            if let Some(estimate) = scheduler.start_estimate(job)
                && let Some(reason) = self.job_to_unestimated_reason.remove(&job)
            {
                job_messages.push((job, waiting_message(tracker, job, reason, Some(estimate))));
            }
        }
        for (job, message) in job_messages {
            waiting.extend(
                tracker
                    .pods_of(job)
                    .into_iter()
                    .map(|p| (p, message.clone())),
            );
        }
        waiting.extend(tracker.waiting());
        for preemption in self.job_to_preemption.values() {
            let reason = preemption.reason();
            waiting.extend(preemption.pods().map(|p| (p.clone(), reason.clone())));
        }
        let mut group_to_outcome: BTreeMap<PodKey, (bool, String)> = BTreeMap::new();
        for (pod, message) in &waiting {
            let key = (pod.namespace.clone(), pod.name.clone());
            if let Some(group) = tracker.workload_group_of(&key) {
                group_to_outcome
                    .entry(group)
                    .or_insert_with(|| (false, message.clone()));
            }
        }
        self.write_pod_group_conditions(groups, group_to_outcome);
        if self.last_trim.elapsed() >= TRIM_EVERY {
            // Forget pods that are no longer waiting, so the map stays as small as the queue.
            let pending = tracker.pending_uids();
            self.last_failed.retain(|uid, _| pending.contains(uid));
            self.job_to_unestimated_reason
                .retain(|&job, _| !tracker.pods_of(job).is_empty());
            self.last_trim = Instant::now();
        }
        let to_report: Vec<(PendingPod, String, bool)> = waiting
            .into_iter()
            .filter_map(|(pod, message)| {
                let event = self.last_failed.get(&pod.uid) != Some(&message);
                let wanted = Some(("False".into(), "Unschedulable".into(), message.clone()));
                let condition = pod.scheduled_condition != wanted;
                (event || condition).then_some((pod, message, event))
            })
            .collect();
        if to_report.is_empty() || !self.may_write() {
            return;
        }
        let client = &self.client;
        let leadership = self.leadership.as_deref();
        let results: Vec<(String, String, std::result::Result<(), String>)> = self.handle.block_on(
            futures::stream::iter(to_report)
                .map(|(pod, message, post_event)| async move {
                    let report = report_unschedulable(client, &pod, &message, post_event);
                    let result = super::fenced(leadership, report)
                        .await
                        .unwrap_or_else(|fenced| {
                            Err(format!("not reported on pod {}: {fenced}", pod.key()))
                        });
                    (pod.uid, message, result)
                })
                .buffer_unordered(CONCURRENCY)
                .collect(),
        );
        for (uid, message, result) in results {
            match result {
                Ok(()) => {
                    self.last_failed.insert(uid, message);
                }
                Err(error) => tracing::warn!(%error, "binder"),
            }
        }
    }
}

/// A waiting job's FailedScheduling message: why it waits, when it is expected to start,
/// and any warning about its pods.
fn waiting_message(
    tracker: &Tracker,
    job: JobId,
    reason: String,
    estimate: Option<&gantry_core::StartEstimate>,
) -> String {
    let mut message = reason;
    if let Some(estimate) = estimate {
        message.push_str(&format!(" {}", estimate_sentence(estimate)));
    }
    if let Some(warning) = tracker.warning_of(job) {
        message.push_str(&format!(" Warning: {warning}."));
    }
    message
}

/// "Expected to start in about 2 h, 90% within 5 h." for a FailedScheduling message: rounded
/// (10 min under an hour, hours under a day, then days) so that a replan that moves the
/// estimate a little does not post another Event.
fn estimate_sentence(estimate: &gantry_core::StartEstimate) -> String {
    let coarse = |wait_s: f64| {
        let s = wait_s.max(0.0);
        if s < 3600.0 {
            format!("{} min", (((s / 600.0).ceil()) * 10.0).max(10.0) as u64)
        } else if s < 86_400.0 {
            format!("{} h", (s / 3600.0).round() as u64)
        } else {
            format!("{} days", (s / 86_400.0).round() as u64)
        }
    };
    let wait = estimate.p50_s - estimate.planned_at_s;
    if wait < 1.0 {
        // The message follows the reason it was refused: the room is not "free now", the plan
        // only expects what refused it to give way within a cycle or so.
        return "Expected to start at one of its next attempts.".into();
    }
    let within = (estimate.p90_s - estimate.planned_at_s).max(wait);
    let mut text = format!(
        "Expected to start in about {}, 90% within {}",
        coarse(wait),
        coarse(within)
    );
    if let Some(nodes) = &estimate.reservation {
        text.push_str(&format!("; it holds a reservation on {nodes}"));
    }
    text.push('.');
    text
}

/// Posts an events.k8s.io/v1 Event about `pod`, as kube-scheduler does.
pub(super) async fn event(
    client: &Client,
    pod: &PendingPod,
    type_: &str,
    reason: &str,
    action: &str,
    note: &str,
) -> std::result::Result<(), kube::Error> {
    let regarding = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.name.clone()),
        namespace: Some(pod.namespace.clone()),
        uid: Some(pod.uid.clone()),
        ..ObjectReference::default()
    };
    event_about(
        client,
        &pod.namespace,
        regarding,
        type_,
        reason,
        action,
        note,
    )
    .await
}

/// Posts an events.k8s.io/v1 Event about `regarding` in `namespace` (a node's in `default`,
/// where the kubelet posts them).
pub(super) async fn event_about(
    client: &Client,
    namespace: &str,
    regarding: ObjectReference,
    type_: &str,
    reason: &str,
    action: &str,
    note: &str,
) -> std::result::Result<(), kube::Error> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let name = regarding.name.clone().unwrap_or_default();
    let event = Event {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{:x}", now.as_nanosecond())),
            namespace: Some(namespace.into()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(now)),
        type_: Some(type_.into()),
        reason: Some(reason.into()),
        action: Some(action.into()),
        // The API caps a note at 1 kB.
        note: Some(truncate(note, 1000)),
        reporting_controller: Some(format!("{COMPONENT}.dev/scheduler")),
        reporting_instance: Some(COMPONENT.into()),
        regarding: Some(regarding),
        ..Event::default()
    };
    Api::<Event>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &event)
        .await
        .map(|_| ())
}

/// A node, as its Events name it.
fn node_ref(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.into()),
        ..ObjectReference::default()
    }
}

/// Posts an Event on `node` (in `default`, where the kubelet posts a node's), fenced by the
/// Lease; a failure is logged, never fatal: what it reports stands.
pub(super) async fn post_node_event(
    client: &Client,
    leadership: Option<&Leadership>,
    node: &str,
    type_: &str,
    (reason, action): (&str, &str),
    note: &str,
) {
    let post = event_about(
        client,
        NODE_EVENTS,
        node_ref(node),
        type_,
        reason,
        action,
        note,
    );
    match fenced(leadership, post).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::warn!(node, %error, "cannot post the {reason} Event"),
        Err(fenced) => tracing::warn!(node, %fenced, "{reason} Event not posted"),
    }
}

/// The namespace a node's Events go to, as the kubelet posts them.
const NODE_EVENTS: &str = "default";

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.into();
    }
    let mut end = max - 3;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// The FailedScheduling Event (when `post_event`) and the PodScheduled=False condition.
async fn report_unschedulable(
    client: &Client,
    pod: &PendingPod,
    message: &str,
    post_event: bool,
) -> std::result::Result<(), String> {
    if post_event {
        event(
            client,
            pod,
            "Warning",
            "FailedScheduling",
            "Scheduling",
            message,
        )
        .await
        .map_err(|e| format!("cannot post FailedScheduling for pod {}: {e}", pod.key()))?;
    }
    let patch = serde_json::json!({
        "status": {
            "conditions": [{
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
            }]
        }
    });
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    match api
        .patch_status(&pod.name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
    {
        Ok(_) => Ok(()),
        // Deleted meanwhile: nothing left to report on.
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(format!("cannot set PodScheduled on pod {}: {e}", pod.key())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_in_a_failed_scheduling_message_is_rounded() {
        let estimate = |p50_s: f64, p90_s: f64, reservation: Option<&str>| {
            estimate_sentence(&gantry_core::StartEstimate {
                planned_at_s: 100.0,
                p10_s: 100.0,
                p50_s: 100.0 + p50_s,
                p90_s: 100.0 + p90_s,
                reservation: reservation.map(str::to_string),
            })
        };
        assert_eq!(
            estimate(1250.0, 2000.0, None),
            "Expected to start in about 30 min, 90% within 40 min."
        );
        // Minutes of change within the same hour read the same.
        assert_eq!(
            estimate(7000.0, 18_000.0, None),
            estimate(7400.0, 18_200.0, None)
        );
        assert_eq!(
            estimate(7000.0, 3.0 * 86_400.0, Some("16 nodes in rack 3")),
            "Expected to start in about 2 h, 90% within 3 days; it holds a reservation on 16 \
             nodes in rack 3."
        );
        // Beside the refusal it follows, never "room for it is free now".
        assert_eq!(
            estimate(0.0, 0.0, None),
            "Expected to start at one of its next attempts."
        );
    }
}
