//! Preemption on a live cluster. The core chooses victims (balloons first, then borrowers, then
//! lower priority; whole gangs); this module carries the choice out the way kube-scheduler
//! does, but through the Eviction API so that PodDisruptionBudgets are honoured:
//!
//! - each victim gets a `pods/eviction` (with its uid as a precondition) and a `Preempted`
//!   Event; a 429 means a budget blocks it: the victim stays, the reason goes into the
//!   preemptor's FailedScheduling message, and the eviction is tried again;
//! - the preemptor is not bound: its pods get `status.nominatedNodeName`, and wait (held out of
//!   the cycle, their room reserved as victims leave) until every victim is gone, since a
//!   terminating pod still holds its GPUs;
//! - a preemption that has not finished after [`GIVE_UP`] is dropped, so the next cycle
//!   chooses again.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gantry_core::CycleOutput;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    DeleteOptions, MicroTime, ObjectMeta, Preconditions,
};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

use crate::snapshot::{PendingPod, Snapshot};

/// A blocked eviction is tried again this often.
const RETRY_BLOCKED: Duration = Duration::from_secs(5);
/// A preemption still waiting after this long is dropped and chosen afresh.
pub const GIVE_UP: Duration = Duration::from_secs(120);

/// One victim pod and, while a budget (or an error) keeps it, why.
#[derive(Debug, Clone)]
struct Victim {
    pod: PendingPod,
    blocked: Option<String>,
}

/// A preemption under way.
#[derive(Debug, Clone)]
pub struct Preemption {
    /// The preemptor's pods and the node nominated for each.
    pods: Vec<(PendingPod, String)>,
    victims: Vec<Victim>,
    since: Instant,
    last_try: Instant,
}

/// Pending pods held out of the cycle (by uid, with the reason), and the room kept for
/// preemptors' pods on their nominated nodes.
pub type Holds = (HashMap<String, String>, Vec<(Arc<Pod>, String)>);

/// Drops finished, abandoned and timed-out preemptions; for the rest, the preemptors' pods to
/// hold out of the cycle (by uid, with the reason) and the room to reserve for them.
pub fn hold(
    preemptions: &mut HashMap<String, Preemption>,
    bound: &[Arc<Pod>],
    pending: &[Arc<Pod>],
) -> Holds {
    let present: HashSet<&str> = bound
        .iter()
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    let waiting: HashSet<&str> = pending
        .iter()
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    preemptions.retain(|job, preemption| {
        preemption
            .victims
            .retain(|v| present.contains(v.pod.uid.as_str()));
        let keep = !preemption.victims.is_empty()
            && preemption
                .pods
                .iter()
                .all(|(p, _)| waiting.contains(p.uid.as_str()))
            && preemption.since.elapsed() < GIVE_UP;
        if !keep && !preemption.victims.is_empty() {
            tracing::info!(%job, "preemption dropped (timed out or preemptor gone); choosing again");
        }
        keep
    });
    let mut held = HashMap::new();
    let mut nominated = Vec::new();
    for preemption in preemptions.values() {
        let reason = preemption.reason();
        for (pod, node) in &preemption.pods {
            held.insert(pod.uid.clone(), reason.clone());
            nominated.push((pod.pod.clone(), node.clone()));
        }
    }
    (held, nominated)
}

impl Preemption {
    /// What the preemptor waits for, in a stable wording (the binder posts it when it changes).
    fn reason(&self) -> String {
        let mut nodes: Vec<&str> = self.pods.iter().map(|(_, n)| n.as_str()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        let blocked: Vec<String> = self
            .victims
            .iter()
            .filter_map(|v| Some(format!("{} ({})", v.pod.key(), v.blocked.as_deref()?)))
            .collect();
        let leaving: Vec<String> = self
            .victims
            .iter()
            .filter(|v| v.blocked.is_none())
            .map(|v| v.pod.key())
            .collect();
        let mut parts = Vec::new();
        if !blocked.is_empty() {
            parts.push(format!(
                "preemption blocked: cannot evict {}; retrying",
                blocked.join(", ")
            ));
        }
        if !leaving.is_empty() {
            parts.push(format!(
                "waiting for preempted pod(s) {} to terminate",
                leaving.join(", ")
            ));
        }
        format!(
            "{} (nominated node(s) {}).",
            parts.join("; "),
            nodes.join(", ")
        )
    }
}

/// Starts the cycle's new preemptions and retries blocked evictions of earlier ones; returns
/// the output left for the binder and how many preemptions started.
pub async fn run(
    client: &Client,
    preemptions: &mut HashMap<String, Preemption>,
    snap: &Snapshot,
    output: &CycleOutput,
) -> (CycleOutput, usize) {
    let evicted: HashSet<u32> = output.evicted.iter().copied().collect();
    let mut rest = CycleOutput {
        attempts: output.attempts,
        woken: output.woken,
        ..CycleOutput::default()
    };
    let mut started = 0;
    let mut after_preemption = false;
    for decision in &output.decisions {
        let preempting = decision.placed && !decision.explanation.preempted.is_empty();
        if !preempting {
            // A decision after a preemption may use room a victim still holds: the next
            // cycle makes it again, on the cluster as it then is.
            if !(after_preemption && decision.placed) {
                rest.decisions.push(decision.clone());
            }
            continue;
        }
        after_preemption = true;
        let Some((job, pods)) = snap.jobs.get(decision.job as usize) else {
            continue;
        };
        let slots = snap.scheduler.slots(decision.job);
        let nominated: Vec<(PendingPod, String)> = pods
            .iter()
            .zip(slots)
            .map(|(p, slot)| (p.clone(), snap.node_names[slot.node as usize].clone()))
            .collect();
        // The victims: adopted jobs the cycle evicted, named in the explanation.
        let victims: Vec<PendingPod> = (0..snap.adopted)
            .filter(|&id| evicted.contains(&(id as u32)))
            .filter(|&id| decision.explanation.preempted.contains(&snap.jobs[id].0))
            .flat_map(|id| snap.jobs[id].1.iter().cloned())
            .collect();
        let Some(first) = nominated.first() else {
            continue;
        };
        let note = format!("Preempted by pod {} on node {}", first.0.key(), first.1);
        tracing::info!(
            preemptor = %job,
            victims = ?victims.iter().map(PendingPod::key).collect::<Vec<_>>(),
            "preempting"
        );
        let results =
            futures::future::join_all(victims.iter().map(|v| evict(client, v, &note))).await;
        let victims = victims
            .into_iter()
            .zip(results)
            .map(|(pod, blocked)| Victim { pod, blocked })
            .collect();
        futures::future::join_all(nominated.iter().map(|(p, node)| nominate(client, p, node)))
            .await;
        preemptions.insert(
            job.clone(),
            Preemption {
                pods: nominated,
                victims,
                since: Instant::now(),
                last_try: Instant::now(),
            },
        );
        started += 1;
    }
    // Blocked evictions of earlier preemptions, again.
    for (job, preemption) in preemptions.iter_mut() {
        if preemption.last_try.elapsed() < RETRY_BLOCKED
            || preemption.victims.iter().all(|v| v.blocked.is_none())
        {
            continue;
        }
        preemption.last_try = Instant::now();
        let note = match preemption.pods.first() {
            Some((pod, node)) => format!("Preempted by pod {} on node {node}", pod.key()),
            None => continue,
        };
        for victim in preemption
            .victims
            .iter_mut()
            .filter(|v| v.blocked.is_some())
        {
            victim.blocked = evict(client, &victim.pod, &note).await;
            if victim.blocked.is_none() {
                tracing::info!(preemptor = %job, victim = %victim.pod.key(), "blocked eviction went through");
            }
        }
    }
    (rest, started)
}

/// Evicts `victim`; `None` when it is evicted (or gone), else why not.
async fn evict(client: &Client, victim: &PendingPod, note: &str) -> Option<String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &victim.namespace);
    let eviction = Eviction {
        metadata: ObjectMeta {
            name: Some(victim.name.clone()),
            namespace: Some(victim.namespace.clone()),
            ..ObjectMeta::default()
        },
        // The uid keeps a pod recreated under the same name out of it.
        delete_options: Some(DeleteOptions {
            preconditions: Some(Preconditions {
                uid: Some(victim.uid.clone()),
                ..Preconditions::default()
            }),
            ..DeleteOptions::default()
        }),
    };
    let result = api
        .create_subresource::<_, serde_json::Value>(
            "eviction",
            &victim.name,
            &PostParams::default(),
            &eviction,
        )
        .await;
    match result {
        Ok(_) => {
            if let Err(error) = preempted_event(client, victim, note).await {
                tracing::warn!(pod = %victim.key(), %error, "cannot post the Preempted event");
            }
            None
        }
        // Gone already, or a pod of the same name with another uid.
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => None,
        Err(kube::Error::Api(status)) if status.code == 429 => {
            tracing::info!(pod = %victim.key(), reason = %status.message, "eviction blocked");
            Some(status.message.trim_end_matches('.').to_string())
        }
        Err(error) => {
            tracing::warn!(pod = %victim.key(), %error, "eviction failed");
            Some(format!("eviction failed: {error}"))
        }
    }
}

/// Sets `status.nominatedNodeName`, as kube-scheduler does for a preemptor.
async fn nominate(client: &Client, pod: &PendingPod, node: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let patch = serde_json::json!({"status": {"nominatedNodeName": node}});
    if let Err(error) = api
        .patch_status(&pod.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        tracing::warn!(pod = %pod.key(), %error, "cannot set nominatedNodeName");
    }
}

/// The `Preempted` Event on a victim (events.k8s.io/v1, as kube-scheduler posts it).
async fn preempted_event(
    client: &Client,
    victim: &PendingPod,
    note: &str,
) -> Result<(), kube::Error> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let event = Event {
        metadata: ObjectMeta {
            name: Some(format!("{}.{:x}", victim.name, now.as_nanosecond())),
            namespace: Some(victim.namespace.clone()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(now)),
        type_: Some("Normal".into()),
        reason: Some("Preempted".into()),
        action: Some("Preempting".into()),
        note: Some(note.chars().take(1000).collect()),
        reporting_controller: Some("gantry.dev/scheduler".into()),
        reporting_instance: Some("gantry".into()),
        regarding: Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(victim.name.clone()),
            namespace: Some(victim.namespace.clone()),
            uid: Some(victim.uid.clone()),
            ..ObjectReference::default()
        }),
        ..Event::default()
    };
    Api::<Event>::namespaced(client.clone(), &victim.namespace)
        .create(&PostParams::default(), &event)
        .await
        .map(|_| ())
}
