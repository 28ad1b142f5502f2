//! Binding: each pod through the `pods/binding` subresource, idempotently with its uid; a
//! gang whole or not at all (members bound already are evicted again); bindings that went
//! unanswered read back; and preemption, through [`crate::evict`].

use std::collections::{BTreeMap, BTreeSet, HashSet};

use futures::StreamExt;
use gantry_core::{BindOutcome, CycleOutput, JobId, Scheduler};
use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::{Api, Client};

use super::claims::Bind;
use super::{CONCURRENCY, ClaimWrite, Groups, NOT_LEADER, Pass, Writer};
use crate::mapping::PendingPod;
use crate::tracker::{PodKey, Tracker};
use crate::{Error, Result};

impl Writer {
    /// The cycle's preemptions: evicts each preemptor's victims through the Eviction API and
    /// nominates the preemptor's nodes instead of binding (victims hold their GPUs until they
    /// are gone). Returns the outcome per preemptor and the nodes victims are leaving.
    pub(super) fn preempt(
        &mut self,
        tracker: &mut Tracker,
        scheduler: &Scheduler,
        output: &CycleOutput,
        pass: &mut Pass,
    ) -> HashSet<usize> {
        let mut victim_nodes = HashSet::new();
        self.evicted.extend_from_slice(&output.evicted);
        for decision in output
            .decisions
            .iter()
            .filter(|d| d.placed && !d.victims.is_empty())
        {
            let victims: Vec<(PendingPod, usize)> = decision
                .victims
                .iter()
                .flat_map(|&v| tracker.running_pods(v))
                .collect();
            victim_nodes.extend(victims.iter().map(|(_, node)| *node));
            if !self.may_write() {
                pass.outcomes.push(BindOutcome::Failed {
                    job: decision.job,
                    reason: NOT_LEADER.into(),
                });
                continue;
            }
            let names = tracker.node_names();
            let nominated: Vec<(PendingPod, String)> = tracker
                .pods_of(decision.job)
                .into_iter()
                .zip(scheduler.slots(decision.job))
                .map(|(pod, slot)| (pod, names[slot.node as usize].clone()))
                .collect();
            tracing::info!(
                preemptor = %decision.explanation.job,
                victims = ?victims.iter().map(|(p, _)| p.key()).collect::<Vec<_>>(),
                "preempting"
            );
            let victim_keys: BTreeSet<PodKey> = victims
                .iter()
                .map(|(p, _)| (p.namespace.clone(), p.name.clone()))
                .collect();
            let victims: Vec<PendingPod> = victims.into_iter().map(|(p, _)| p).collect();
            let preemption = self.handle.block_on(crate::evict::start(
                &self.evict_client,
                self.leadership.as_deref(),
                victims,
                nominated,
            ));
            tracker.nominate(decision.job, victim_keys);
            pass.outcomes.push(BindOutcome::Nominated {
                job: decision.job,
                waiting_for: preemption.reason(),
            });
            self.job_to_preemption.insert(decision.job, preemption);
        }
        // Preemptions the tracker let go of (victims gone, preemptor gone or timed out) are
        // over; blocked evictions of the rest are tried again.
        let nominated = tracker.nominated();
        self.job_to_preemption.retain(|job, preemption| {
            let Some(n) = nominated.get(job) else {
                return false;
            };
            preemption
                .retain_victims(|p| n.victims.contains(&(p.namespace.clone(), p.name.clone())));
            true
        });
        if self.may_write() {
            self.handle.block_on(crate::evict::retry_blocked(
                &self.evict_client,
                self.leadership.as_deref(),
                &mut self.job_to_preemption,
            ));
        }
        victim_nodes
    }

    /// The pods to bind, each with its job and node: those of the cycle's placed jobs that
    /// preempt nothing. A job whose nodes victims still hold, whose pods are not the ones
    /// placed, or that this replica may not write for, fails instead.
    fn binds_of(
        &self,
        tracker: &Tracker,
        scheduler: &Scheduler,
        output: &CycleOutput,
        victim_nodes: &HashSet<usize>,
        pass: &mut Pass,
    ) -> Vec<Bind> {
        let mut binds: Vec<Bind> = Vec::new();
        for decision in output
            .decisions
            .iter()
            .filter(|d| d.placed && d.victims.is_empty())
        {
            let slots = scheduler.slots(decision.job);
            let pods = tracker.pods_of(decision.job);
            let reason = if slots
                .iter()
                .any(|s| victim_nodes.contains(&(s.node as usize)))
            {
                // Its room is still held by pods this cycle is evicting.
                Some("its nodes are still held by pods being preempted".to_string())
            } else if pods.len() != slots.len() {
                Some(format!(
                    "it has {} pods, not the {} placed",
                    pods.len(),
                    slots.len()
                ))
            } else if !self.may_write() {
                Some(NOT_LEADER.to_string())
            } else {
                None
            };
            match reason {
                Some(reason) => pass.outcomes.push(BindOutcome::Failed {
                    job: decision.job,
                    reason,
                }),
                None => binds.extend(
                    pods.into_iter()
                        .zip(slots)
                        .map(|(pod, slot)| (decision.job, pod, slot.node as usize)),
                ),
            }
        }
        binds
    }

    /// Binds the cycle's placed jobs (those not preempting). A gang binds whole or not at all:
    /// when a member's binding fails, the members already bound are deleted, and the job
    /// fails with the API server's message.
    pub(super) fn bind_placed(
        &mut self,
        tracker: &mut Tracker,
        groups: Groups<'_>,
        scheduler: &Scheduler,
        output: &CycleOutput,
        victim_nodes: &HashSet<usize>,
        pass: &mut Pass,
    ) {
        let binds = self.binds_of(tracker, scheduler, output, victim_nodes, pass);
        let (binds, mut job_to_claim_writes) = self.allocate_claims(tracker, binds, pass);
        if binds.is_empty() {
            return;
        }
        let client = &self.client;
        let names = tracker.node_names();
        let leadership = self.leadership.as_deref();
        let results: Vec<(JobId, PendingPod, usize, Result<Bound>, bool)> = self.handle.block_on(
            futures::stream::iter(binds)
                .map(|(job, pod, node)| async move {
                    // Each binding is fenced, not once per cycle: sent only under the
                    // Lease, and dropped if the Lease would run out before its answer.
                    let result =
                        match super::fenced(leadership, bind(client, &pod, &names[node])).await {
                            Ok(result) => result,
                            Err(super::Fenced::NotLeader) => Err(Error::NotLeader),
                            // It may have been applied: read back, as an unanswered one is.
                            Err(super::Fenced::CutOff) => Ok(Bound::Unanswered),
                        };
                    let after_loss = matches!(result, Ok(Bound::Now))
                        && leadership.is_some_and(|l| !l.is_leader());
                    (job, pod, node, result, after_loss)
                })
                .buffer_unordered(CONCURRENCY)
                .collect(),
        );
        // Per job: its pods bound (and how), and its first failure.
        type JobResult = (Vec<(PendingPod, usize, Bound)>, Option<String>);
        let mut job_to_result: BTreeMap<JobId, JobResult> = BTreeMap::new();
        for (job, pod, node, result, after_loss) in results {
            if after_loss {
                self.binds_after_lease_loss += 1;
                tracing::error!(pod = %pod.key(), "binder: a binding was answered after the Lease was lost");
            }
            let entry = job_to_result.entry(job).or_default();
            match result {
                Ok(how) => {
                    if how == Bound::Unanswered {
                        let name = tracker.node_names()[node].clone();
                        tracing::warn!(
                            pod = %pod.key(),
                            node = %name,
                            "binder: the binding went out but no answer came back, and the pod \
                             could not be read back; it counts as bound until it can be"
                        );
                        self.unanswered.push((pod.clone(), name));
                    }
                    entry.0.push((pod, node, how));
                }
                Err(error) => {
                    tracing::warn!(%error, "binder");
                    entry.1.get_or_insert_with(|| error.to_string());
                }
            }
        }
        let mut scheduled: Vec<(PendingPod, String)> = Vec::new();
        let mut rollback: Vec<PendingPod> = Vec::new();
        let mut group_to_outcome: BTreeMap<PodKey, (bool, String)> = BTreeMap::new();
        // The claim writes of jobs that did not bind, to take back.
        let mut claims_back: Vec<ClaimWrite> = Vec::new();
        for (job, (bound, failure)) in job_to_result {
            match failure {
                None => {
                    scheduled.extend(
                        bound
                            .iter()
                            .filter(|(_, _, how)| *how == Bound::Now)
                            .map(|(p, node, _)| (p.clone(), tracker.node_names()[*node].clone())),
                    );
                    let bound: Vec<(PendingPod, usize)> =
                        bound.into_iter().map(|(p, node, _)| (p, node)).collect();
                    for (pod, _) in &bound {
                        let key = (pod.namespace.clone(), pod.name.clone());
                        if let Some(group) = tracker.workload_group_of(&key) {
                            group_to_outcome.insert(group, (true, String::new()));
                        }
                    }
                    tracker.bound(job, &bound);
                    pass.outcomes.push(BindOutcome::Bound { job });
                }
                Some(reason) => {
                    let message = if bound.is_empty() {
                        format!("Binding failed: {reason}")
                    } else {
                        format!(
                            "Binding failed: {reason}; the {} members bound already were deleted so the gang starts whole",
                            bound.len()
                        )
                    };
                    pass.failed.extend(
                        tracker
                            .pods_of(job)
                            .into_iter()
                            .map(|p| (p, message.clone())),
                    );
                    // A member whose binding went unanswered is not deleted: it may be
                    // pending still, and deleting a pending pod loses it. If it was bound,
                    // the caches show it, and its gang is adopted as it runs.
                    rollback.extend(
                        bound
                            .into_iter()
                            .filter(|(_, _, how)| *how != Bound::Unanswered)
                            .map(|(p, _, _)| p),
                    );
                    claims_back.extend(job_to_claim_writes.remove(&job).unwrap_or_default());
                    pass.outcomes.push(BindOutcome::Failed { job, reason });
                }
            }
        }
        if !rollback.is_empty() {
            let client = &self.client;
            self.handle
                .block_on(futures::stream::iter(rollback).for_each_concurrent(
                CONCURRENCY,
                |pod| async move {
                    if let Err(error) = delete(client, &pod).await {
                        tracing::warn!(pod = %pod.key(), %error, "cannot roll back a gang member");
                    }
                },
            ));
        }
        self.undo_claims(tracker, claims_back);
        self.write_pod_group_conditions(groups, group_to_outcome);
        self.post_scheduled_events(scheduled);
    }

    /// Reads back the pods whose binding went unanswered. One bound where it was sent stays
    /// as it is (the bound cache will show it) and gets the Scheduled Event its binding did
    /// not; one not bound there, or gone, is judged by the caches at this sync instead of when
    /// its assumption runs out; one that still cannot be read is kept for the next sync.
    pub(crate) fn read_back_unanswered(&mut self, tracker: &mut Tracker) {
        if self.unanswered.is_empty() {
            return;
        }
        let client = &self.client;
        let results: Vec<(PendingPod, String, kube::Result<Option<Pod>>)> = self.handle.block_on(
            futures::stream::iter(std::mem::take(&mut self.unanswered))
                .map(|(pod, node)| async move {
                    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
                    let current = api.get_opt(&pod.name).await;
                    (pod, node, current)
                })
                .buffer_unordered(CONCURRENCY)
                .collect(),
        );
        let mut scheduled: Vec<(PendingPod, String)> = Vec::new();
        for (pod, node, current) in results {
            match read_back(&pod, &node, current) {
                ReadBack::Unread => self.unanswered.push((pod, node)),
                ReadBack::Applied => {
                    tracing::info!(pod = %pod.key(), %node, "binder: the unanswered binding was applied");
                    scheduled.push((pod, node));
                }
                ReadBack::NotApplied => {
                    tracing::info!(pod = %pod.key(), %node, "binder: the unanswered binding was not applied; the pod is pending again");
                    tracker.unassume(&(pod.namespace.clone(), pod.name.clone()));
                }
            }
        }
        self.post_scheduled_events(scheduled);
    }
}

/// Deletes a gang member bound by a binding that went through while another member's failed,
/// through the Eviction API: the RBAC grants no plain delete on pods, and an eviction honours
/// PodDisruptionBudgets (the uid keeps a pod recreated under the same name out of it).
async fn delete(client: &Client, pod: &PendingPod) -> std::result::Result<(), kube::Error> {
    let evicted = super::evict::post_eviction(client, pod).await;
    match evicted {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(error) => Err(error),
    }
}

/// What one binding call came to, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bound {
    /// This call bound the pod: it gets a Scheduled Event.
    Now,
    /// The pod was bound to the node already (a retry after a lost answer): no second Event.
    Already,
    /// The request went out and no answer came back, nor could the pod be read back: the API
    /// server may have applied it (one killed mid-request does). The pod counts as bound, as
    /// an assumed binding does, until the caches say otherwise; otherwise a rebuild from a
    /// cache that has not relisted yet would place it again, elsewhere.
    Unanswered,
}

/// Binds `pod` to `node` through the `pods/binding` subresource. A 409 means the pod is bound
/// already: fine when to `node` ([`Bound::Already`]), an error otherwise. A request that may
/// have been applied without an answer (see [`unanswered`]) is settled by reading the pod
/// back, else it is [`Bound::Unanswered`].
async fn bind(client: &Client, pod: &PendingPod, node: &str) -> Result<Bound> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            // The uid makes the binding fail for a pod deleted and recreated under the name.
            uid: Some(pod.uid.clone()),
            ..ObjectMeta::default()
        },
        target: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            ..ObjectReference::default()
        },
    };
    let bind_error = |message: String| Error::Bind {
        pod: pod.key(),
        node: node.into(),
        message,
    };
    // What the pod read back says: bound to `node` (`there`), elsewhere, or not at all.
    let settle = |current: Pod, there: Bound, unbound: String| match bound_node(pod, &current) {
        Some(actual) if actual == node => Ok(there),
        Some(actual) => Err(Error::BoundElsewhere {
            pod: pod.key(),
            wanted: node.into(),
            actual: actual.into(),
        }),
        None => Err(bind_error(unbound)),
    };
    match api
        .create_subresource::<_, serde_json::Value>(
            "binding",
            &pod.name,
            &PostParams::default(),
            &binding,
        )
        .await
    {
        Ok(_) => Ok(Bound::Now),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let current = api
                .get(&pod.name)
                .await
                .map_err(|e| bind_error(e.to_string()))?;
            settle(current, Bound::Already, status.message.clone())
        }
        Err(error) if unanswered(&error) => match api.get(&pod.name).await {
            Ok(current) => settle(current, Bound::Now, error.to_string()),
            Err(_) => Ok(Bound::Unanswered),
        },
        Err(error) => Err(bind_error(error.to_string())),
    }
}

/// What reading back a pod whose binding to a node went unanswered says of that binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadBack {
    /// The pod is bound to the node: the binding was applied.
    Applied,
    /// The pod is unbound, bound elsewhere, gone, or recreated under its name.
    NotApplied,
    /// The read failed too: nothing is known yet.
    Unread,
}

/// Judges the read-back `current` of `pod`, whose binding to `node` went unanswered.
fn read_back(pod: &PendingPod, node: &str, current: kube::Result<Option<Pod>>) -> ReadBack {
    match current {
        Err(_) => ReadBack::Unread,
        Ok(Some(current)) if bound_node(pod, &current) == Some(node) => ReadBack::Applied,
        Ok(_) => ReadBack::NotApplied,
    }
}

/// The node `current` is bound to, if it is still `pod` (the same uid, not one recreated
/// under its name).
fn bound_node<'a>(pod: &PendingPod, current: &'a Pod) -> Option<&'a str> {
    (current.metadata.uid.as_deref() == Some(pod.uid.as_str()))
        .then(|| current.spec.as_ref()?.node_name.as_deref())
        .flatten()
}

/// Whether a failed write may have been applied all the same: the request went out and no
/// answer came (a connection reset or closed mid-request, a read timeout), or the API server
/// said it timed out or failed inside (500, 504), which it says of writes it may still
/// commit. A refused connection sent nothing, and any other status is an answer.
fn unanswered(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => matches!(status.code, 500 | 504),
        kube::Error::HyperError(_) | kube::Error::Service(_) => {
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
            while let Some(e) = cause {
                if e.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
                {
                    return false;
                }
                cause = e.source();
            }
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_may_have_been_applied_unless_its_connection_was_refused_or_it_was_answered() {
        use std::io::{Error as IoError, ErrorKind};
        let io = |kind: ErrorKind| kube::Error::Service(Box::new(IoError::new(kind, "io")));
        let status = |code: u16| {
            kube::Error::Api(Box::new(
                kube::core::Status::failure("no", "No").with_code(code),
            ))
        };
        // Nothing was sent.
        assert!(!unanswered(&io(ErrorKind::ConnectionRefused)));
        // Sent, and the connection went away or timed out before the answer.
        assert!(unanswered(&io(ErrorKind::ConnectionReset)));
        assert!(unanswered(&io(ErrorKind::TimedOut)));
        assert!(unanswered(&io(ErrorKind::UnexpectedEof)));
        // A refusal found deeper in the chain of causes still means nothing was sent.
        #[derive(Debug, thiserror::Error)]
        #[error("tcp connect error")]
        struct Connect(#[source] IoError);
        let wrapped = Connect(IoError::new(ErrorKind::ConnectionRefused, "refused"));
        assert!(!unanswered(&kube::Error::Service(Box::new(wrapped))));
        // The API server's own timeouts and internal errors may still commit; other answers
        // are answers.
        assert!(unanswered(&status(504)));
        assert!(unanswered(&status(500)));
        for code in [400, 403, 404, 409, 422, 429, 503] {
            assert!(!unanswered(&status(code)), "{code}");
        }
    }

    #[test]
    fn a_read_back_pod_says_whether_its_unanswered_binding_was_applied() {
        let pod = |uid: &str, node: Option<&str>| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "default", "uid": uid},
                "spec": {"containers": [], "nodeName": node},
            }))
            .unwrap()
        };
        let pending = PendingPod::of(&std::sync::Arc::new(pod("u1", None)));
        let judge = |current| read_back(&pending, "n1", current);
        assert_eq!(judge(Ok(Some(pod("u1", Some("n1"))))), ReadBack::Applied);
        assert_eq!(judge(Ok(Some(pod("u1", None)))), ReadBack::NotApplied);
        assert_eq!(judge(Ok(Some(pod("u1", Some("n2"))))), ReadBack::NotApplied);
        // Recreated under its name and bound there by someone else: not our binding.
        assert_eq!(judge(Ok(Some(pod("u2", Some("n1"))))), ReadBack::NotApplied);
        assert_eq!(judge(Ok(None)), ReadBack::NotApplied);
        let timed_out = kube::Error::Service(Box::new(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "timed out",
        )));
        assert_eq!(judge(Err(timed_out)), ReadBack::Unread);
    }

    #[test]
    fn a_refused_connection_from_a_real_client_sent_nothing() {
        // Port 1 on loopback: nothing listens there, so the connection is refused.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let error = runtime.block_on(async {
            let mut config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
            config.connect_timeout = Some(crate::connect::CALL_TIMEOUT);
            let client = Client::try_from(config).unwrap();
            let pods: Api<Pod> = Api::namespaced(client, "default");
            pods.get("p").await.expect_err("nothing listens on port 1")
        });
        assert!(!unanswered(&error), "{error:?}");
    }
}
