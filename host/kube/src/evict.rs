//! Preemption on a live cluster. The core chooses victims (balloons first, then borrowers, then
//! lower priority; whole gangs); this module carries the choice out the way kube-scheduler
//! does, but through the Eviction API so that PodDisruptionBudgets are honoured:
//!
//! - each victim gets a `pods/eviction` (with its uid as a precondition) and a `Preempted`
//!   Event; a 429 means a budget blocks it: the victim stays, the reason goes into the
//!   preemptor's FailedScheduling message, and the eviction is tried again;
//! - the preemptor is not bound: its pods get `status.nominatedNodeName`, and it stays placed
//!   on its nodes in the scheduler (so nobody else takes the room) until every victim is gone,
//!   since a terminating pod still holds its GPUs; then the next cycle places it again;
//! - a preemption that has not finished after [`GIVE_UP`] is dropped, so the next cycle
//!   chooses again.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    DeleteOptions, MicroTime, ObjectMeta, Preconditions,
};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

use crate::mapping::PendingPod;

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
    /// The victims still present.
    victims: Vec<Victim>,
    last_try: Instant,
}

impl Preemption {
    /// The preemptor's pods.
    pub fn pods(&self) -> impl Iterator<Item = &PendingPod> {
        self.pods.iter().map(|(p, _)| p)
    }

    /// Keeps the victims `present` says are still there.
    pub fn retain_victims(&mut self, present: impl Fn(&PendingPod) -> bool) {
        self.victims.retain(|v| present(&v.pod));
    }

    /// What the preemptor waits for, in a stable wording (the binder posts it when it changes).
    pub fn reason(&self) -> String {
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

/// Starts a preemption: evicts `victims` and nominates the preemptor's `pods` to their nodes.
pub async fn start(
    client: &Client,
    victims: Vec<PendingPod>,
    pods: Vec<(PendingPod, String)>,
) -> Preemption {
    let note = match pods.first() {
        Some((pod, node)) => format!("Preempted by pod {} on node {node}", pod.key()),
        None => "Preempted".to_string(),
    };
    let results = futures::future::join_all(victims.iter().map(|v| evict(client, v, &note))).await;
    let victims = victims
        .into_iter()
        .zip(results)
        .map(|(pod, blocked)| Victim { pod, blocked })
        .collect();
    futures::future::join_all(pods.iter().map(|(p, node)| nominate(client, p, node))).await;
    Preemption {
        pods,
        victims,
        last_try: Instant::now(),
    }
}

/// Tries again the evictions a PodDisruptionBudget (or an error) blocked, every
/// [`RETRY_BLOCKED`].
pub async fn retry_blocked<K: std::fmt::Debug>(
    client: &Client,
    preemptions: &mut std::collections::BTreeMap<K, Preemption>,
) {
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
                tracing::info!(preemptor = ?job, victim = %victim.pod.key(), "blocked eviction went through");
            }
        }
    }
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
