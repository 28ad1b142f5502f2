//! Status writes: an upstream PodGroup's scheduled condition, and each Queue's used GPUs and
//! pending jobs.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use futures::StreamExt;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};

use super::{CONCURRENCY, Groups, QUEUE_STATUS_EVERY, Writer};
use crate::tracker::PodKey;

/// The PodGroup condition kube-scheduler sets when a group is first placed: `PodGroupScheduled`
/// in v1alpha2 (1.36), renamed `PodGroupInitiallyScheduled` from v1alpha3 and v1beta1 (1.37).
/// Gantry writes the name of the version it reads, so `kubectl wait --for=condition=…` written
/// for that release works unchanged.
fn scheduled_condition_type(version: &str) -> &'static str {
    if version == "v1alpha2" {
        "PodGroupScheduled"
    } else {
        "PodGroupInitiallyScheduled"
    }
}

impl Writer {
    /// Writes each upstream PodGroup's scheduled condition ([`scheduled_condition_type`]) as
    /// kube-scheduler does:
    /// True ("Scheduled") once its pods are bound, False ("Unschedulable", with the pods'
    /// FailedScheduling message) while they wait; never back to False once True (extra pods
    /// do not unschedule a group), and only when it changed.
    pub(super) fn write_pod_group_conditions(
        &self,
        groups: Groups<'_>,
        group_to_outcome: BTreeMap<PodKey, (bool, String)>,
    ) {
        let Some((store, resource)) = groups else {
            return;
        };
        if group_to_outcome.is_empty() || !self.may_write() {
            return;
        }
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let condition_type = scheduled_condition_type(&resource.version);
        let mut patches = Vec::new();
        for ((namespace, name), (scheduled, message)) in group_to_outcome {
            let Some(group) =
                store.get(&ObjectRef::new_with(&name, resource.clone()).within(&namespace))
            else {
                continue;
            };
            let conditions = group.data["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let existing = conditions.iter().find(|c| c["type"] == condition_type);
            if existing.is_some_and(|c| c["status"] == "True") && !scheduled {
                continue;
            }
            let (status, reason) = if scheduled {
                ("True", "Scheduled")
            } else {
                ("False", "Unschedulable")
            };
            let generation = group.metadata.generation.unwrap_or_default();
            if existing.is_some_and(|c| {
                c["status"] == status
                    && c["reason"] == reason
                    && c["message"] == message.as_str()
                    && c["observedGeneration"] == generation
            }) {
                continue;
            }
            let since = match existing {
                Some(c) if c["status"] == status => c["lastTransitionTime"].clone(),
                _ => serde_json::Value::from(now.as_str()),
            };
            let mut list: Vec<serde_json::Value> = conditions
                .iter()
                .filter(|c| c["type"] != condition_type)
                .cloned()
                .collect();
            list.push(serde_json::json!({
                "type": condition_type,
                "status": status,
                "reason": reason,
                "message": message,
                "observedGeneration": generation,
                "lastTransitionTime": since,
            }));
            patches.push((namespace, name, list));
        }
        let client = &self.client;
        let leadership = self.leadership.as_deref();
        self.handle
            .block_on(futures::stream::iter(patches).for_each_concurrent(
                CONCURRENCY,
                |(namespace, name, conditions)| async move {
                    let api: Api<DynamicObject> =
                        Api::namespaced_with(client.clone(), &namespace, resource);
                    let patch = serde_json::json!({"status": {"conditions": conditions}});
                    let written = super::fenced(
                        leadership,
                        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(patch)),
                    )
                    .await;
                    let Ok(written) = written else {
                        // Not the leader, or no answer in time: the next pass writes it.
                        return;
                    };
                    match written {
                        Ok(_) => {}
                        // Deleted meanwhile: nothing left to report on.
                        Err(kube::Error::Api(status)) if status.code == 404 => {}
                        Err(error) => tracing::warn!(
                            group = %format!("{namespace}/{name}"), %error,
                            "cannot set {condition_type}"
                        ),
                    }
                },
            ));
    }

    /// Writes each Queue's status when it changed: the GPUs its running jobs hold and its
    /// pending jobs, after the cycle on `scheduler`, or why the scheduler left it out.
    pub(super) fn report_queues(
        &mut self,
        queues: Option<&Store<DynamicObject>>,
        problems: &[String],
        scheduler: &gantry_core::Scheduler,
    ) {
        let Some(store) = queues else {
            return;
        };
        if self
            .queue_status_at
            .is_some_and(|at| at.elapsed() < QUEUE_STATUS_EVERY)
        {
            return;
        }
        self.queue_status_at = Some(Instant::now());
        let mut pending: HashMap<&str, u32> = HashMap::new();
        for id in scheduler.pending() {
            *pending
                .entry(scheduler.queues.name(scheduler.job(id).queue))
                .or_default() += 1;
        }
        let mut changed: Vec<(String, serde_json::Value)> = Vec::new();
        for object in store.state() {
            let name = object.name_any();
            let prefix = format!("queue {name}:");
            let status = match problems.iter().find(|p| p.starts_with(&prefix)) {
                Some(problem) => {
                    serde_json::json!({"problem": problem, "usedGpus": null, "pendingJobs": null})
                }
                None => match scheduler.queues.id(&name) {
                    Some(id) => serde_json::json!({
                        "usedGpus": scheduler.queues.used(id).gpus,
                        "pendingJobs": pending.get(name.as_str()).copied().unwrap_or(0),
                        "problem": null,
                    }),
                    None => continue,
                },
            };
            if self.queue_status.get(&name) != Some(&status) {
                changed.push((name, status));
            }
        }
        let api: Api<DynamicObject> =
            Api::all_with(self.client.clone(), &crate::queues::resource());
        let leadership = self.leadership.as_deref();
        let results = self
            .handle
            .block_on(futures::future::join_all(changed.iter().map(
                |(name, status)| {
                    let patch = serde_json::json!({ "status": status });
                    let api = api.clone();
                    async move {
                        let (params, patch) = (PatchParams::default(), Patch::Merge(patch));
                        let write = api.patch_status(name, &params, &patch);
                        super::fenced(leadership, write).await
                    }
                },
            )));
        for ((name, status), result) in changed.into_iter().zip(results) {
            match result {
                Ok(Ok(_)) => {
                    self.queue_status.insert(name, status);
                }
                Ok(Err(error)) => {
                    tracing::warn!(queue = %name, %error, "cannot write the Queue status")
                }
                // Not the leader, or no answer in time: written again when it changes.
                Err(fenced) => tracing::debug!(queue = %name, ?fenced, "Queue status not written"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheduled_condition_has_the_name_of_the_version_read() {
        assert_eq!(scheduled_condition_type("v1alpha2"), "PodGroupScheduled");
        assert_eq!(
            scheduled_condition_type("v1alpha3"),
            "PodGroupInitiallyScheduled"
        );
        assert_eq!(
            scheduled_condition_type("v1beta1"),
            "PodGroupInitiallyScheduled"
        );
    }
}
