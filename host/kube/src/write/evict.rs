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

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Preconditions};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

use crate::leader::Leadership;
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
    leadership: Option<&Leadership>,
    victims: Vec<PendingPod>,
    pods: Vec<(PendingPod, String)>,
) -> Preemption {
    let note = match pods.first() {
        Some((pod, node)) => format!("Preempted by pod {} on node {node}", pod.key()),
        None => "Preempted".to_string(),
    };
    let results = futures::future::join_all(
        victims
            .iter()
            .map(|v| evict(client, leadership, v, PREEMPTED, &note)),
    )
    .await;
    let victims = victims
        .into_iter()
        .zip(results)
        .map(|(pod, blocked)| Victim { pod, blocked })
        .collect();
    futures::future::join_all(
        pods.iter()
            .map(|(p, node)| nominate(client, leadership, p, node)),
    )
    .await;
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
    leadership: Option<&Leadership>,
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
            victim.blocked = evict(client, leadership, &victim.pod, PREEMPTED, &note).await;
            if victim.blocked.is_none() {
                tracing::info!(preemptor = ?job, victim = %victim.pod.key(), "blocked eviction went through");
            }
        }
    }
}

/// Posts `pod`'s eviction through the `pods/eviction` subresource, with its uid as a
/// precondition, so a pod recreated under the same name is not evicted in its place.
pub(super) async fn post_eviction(
    client: &Client,
    pod: &PendingPod,
) -> Result<serde_json::Value, kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let eviction = Eviction {
        metadata: ObjectMeta {
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            ..ObjectMeta::default()
        },
        delete_options: Some(DeleteOptions {
            preconditions: Some(Preconditions {
                uid: Some(pod.uid.clone()),
                ..Preconditions::default()
            }),
            ..DeleteOptions::default()
        }),
    };
    api.create_subresource("eviction", &pod.name, &PostParams::default(), &eviction)
        .await
}

/// The Event a preemption's eviction posts: reason and action.
const PREEMPTED: (&str, &str) = ("Preempted", "Preempting");

/// Evicts `victim`, fenced by the Lease (see [`super::fenced`]), and posts `event` (reason,
/// action) with `note`; `None` when it is evicted (or gone), else why not.
pub(super) async fn evict(
    client: &Client,
    leadership: Option<&Leadership>,
    victim: &PendingPod,
    event: (&str, &str),
    note: &str,
) -> Option<String> {
    let result = match super::fenced(leadership, post_eviction(client, victim)).await {
        Ok(result) => result,
        Err(fenced) => return Some(format!("eviction not sent or not answered: {fenced}")),
    };
    match result {
        Ok(_) => {
            if let Err(error) =
                super::report::event(client, victim, "Normal", event.0, event.1, note).await
            {
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
async fn nominate(client: &Client, leadership: Option<&Leadership>, pod: &PendingPod, node: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let patch = serde_json::json!({"status": {"nominatedNodeName": node}});
    let (params, patch) = (PatchParams::default(), Patch::Merge(patch));
    let write = api.patch_status(&pod.name, &params, &patch);
    match super::fenced(leadership, write).await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => tracing::warn!(pod = %pod.key(), %error, "cannot set nominatedNodeName"),
        Err(fenced) => tracing::warn!(pod = %pod.key(), ?fenced, "nominatedNodeName not set"),
    }
}
