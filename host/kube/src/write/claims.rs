//! DRA claim writes: the devices each pod's ResourceClaims get on its node, written to the
//! claims' status before the pod binds (all or nothing per job, taken back when its binding
//! fails), and released once their pods are gone.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::StreamExt;
use gantry_core::{BindOutcome, JobId};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use super::{CONCURRENCY, NOT_LEADER, Pass, Writer};
use crate::leader::Leadership;
use crate::mapping::PendingPod;
use crate::tracker::{PodKey, Tracker};

/// One pod to bind: its job, the pod, and the node index it goes to.
pub(super) type Bind = (JobId, PendingPod, usize);

/// A claim status this bind pass wrote, and the merge patch that takes it back if its job
/// does not bind.
pub(super) struct ClaimWrite {
    /// The claim's `(namespace, name)`.
    key: PodKey,
    /// `{"metadata": {"resourceVersion"}, "status": {...}}`: the version pins what was read,
    /// so a claim changed meanwhile fails the write instead of being overwritten.
    patch: serde_json::Value,
    /// The status fields to clear if the job does not bind.
    undo: serde_json::Value,
}

/// Whether `pod` names DRA claims.
fn names_claims(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|c| !c.is_empty())
}

/// The claim writes that give `pods` (one job's, each with its node) their devices, and the
/// devices they take; `in_use` holds what every allocated claim and the jobs before this one
/// in the pass hold. All or nothing: the error names the pod and why.
fn plan_claims(
    view: &crate::claims::DraView,
    names: &[String],
    pods: &[(PendingPod, usize)],
    in_use: &BTreeSet<crate::dra::DeviceId>,
) -> std::result::Result<(Vec<ClaimWrite>, BTreeSet<crate::dra::DeviceId>), String> {
    let mut writes = Vec::new();
    let mut taken: BTreeSet<crate::dra::DeviceId> = BTreeSet::new();
    for (pod, node) in pods {
        let node = &names[*node];
        let claims = view
            .resolve(&pod.pod)
            .map_err(|e| format!("pod {}: {e}", pod.key()))?;
        let reservation =
            serde_json::json!([{"resource": "pods", "name": pod.name, "uid": pod.uid}]);
        let version = |c: &crate::claims::PodClaim| c.object.metadata.resource_version.clone();
        let mut fresh = Vec::new();
        for c in claims {
            if !c.allocated() {
                fresh.push(c);
                continue;
            }
            let at = view.allocated_node(&c.object);
            if at.as_deref() != Some(node.as_str()) {
                return Err(format!(
                    "pod {}: ResourceClaim {}/{} is allocated on node {}, not on {node}",
                    pod.key(),
                    c.key.0,
                    c.key.1,
                    at.as_deref().unwrap_or("(a node without slices)")
                ));
            }
            if !c.reserved_for().contains(&pod.uid.as_str()) {
                writes.push(ClaimWrite {
                    patch: serde_json::json!({
                        "metadata": {"resourceVersion": version(&c)},
                        "status": {"reservedFor": reservation},
                    }),
                    undo: serde_json::json!({"status": {"reservedFor": null}}),
                    key: c.key,
                });
            }
        }
        if fresh.is_empty() {
            continue;
        }
        let busy: BTreeSet<crate::dra::DeviceId> = in_use.union(&taken).cloned().collect();
        let wanted: Vec<crate::dra::Claim> = fresh.iter().map(|c| c.claim.clone()).collect();
        let allocation = view.allocate(node, &wanted, &busy).map_err(|e| {
            format!(
                "pod {}: cannot allocate its ResourceClaims on node {node}: {e}",
                pod.key()
            )
        })?;
        for (c, got) in fresh.into_iter().zip(allocation.claims) {
            taken.extend(got.devices.iter().map(|(_, d)| d.clone()));
            writes.push(ClaimWrite {
                patch: serde_json::json!({
                    "metadata": {"resourceVersion": version(&c)},
                    "status": {"allocation": got.result, "reservedFor": reservation},
                }),
                undo: serde_json::json!({"status": {"allocation": null, "reservedFor": null}}),
                key: c.key,
            });
        }
    }
    Ok((writes, taken))
}

/// Merge-patches a claim's status: the claim as written, or the API server's refusal as text
/// naming the claim.
pub(super) async fn patch_claim(
    client: &Client,
    leadership: Option<&Leadership>,
    key: &PodKey,
    patch: &serde_json::Value,
) -> std::result::Result<ResourceClaim, String> {
    // Each write is fenced by the Lease, not once per pass.
    let written = super::fenced(
        leadership,
        Api::<ResourceClaim>::namespaced(client.clone(), &key.0).patch_status(
            &key.1,
            &PatchParams::default(),
            &Patch::Merge(patch),
        ),
    )
    .await;
    let claim = format!("ResourceClaim {}/{}", key.0, key.1);
    match written {
        Ok(written) => written.map_err(|e| format!("cannot write the status of {claim}: {e}")),
        Err(super::Fenced::NotLeader) => Err(NOT_LEADER.to_string()),
        Err(super::Fenced::CutOff) => Err(format!(
            "cannot write the status of {claim}: no answer before the Lease or the call \
             timeout ran out"
        )),
    }
}

impl Writer {
    /// Takes the pods gone since the last pass out of the `reservedFor` of the claims they
    /// held, and clears a claim's `allocation` once nobody is left. kube-controller-manager's
    /// resource claim controller does this in a full cluster; where none runs, the devices
    /// would stay taken forever. Doing it here as well is harmless: each write names the
    /// version it read, so it applies once, and a claim already released is not written.
    pub(super) fn release_claims(&mut self, tracker: &mut Tracker) {
        if self.gone.is_empty() {
            return;
        }
        let gone = std::mem::take(&mut self.gone);
        if !self.may_write() {
            // The leader releases them.
            return;
        }
        let mut patches: Vec<((String, String), PodKey, serde_json::Value)> = Vec::new();
        for (namespace, uid) in gone {
            for (key, claim) in tracker.dra().reserved_for(&namespace, &uid) {
                let rest: Vec<_> = claim
                    .status
                    .iter()
                    .flat_map(|s| s.reserved_for.iter().flatten())
                    .filter(|r| r.uid != uid)
                    .cloned()
                    .collect();
                let status = if rest.is_empty() {
                    serde_json::json!({"reservedFor": null, "allocation": null})
                } else {
                    serde_json::json!({ "reservedFor": rest })
                };
                let patch = serde_json::json!({
                    "metadata": {"resourceVersion": claim.metadata.resource_version},
                    "status": status,
                });
                patches.push(((namespace.clone(), uid.clone()), key, patch));
            }
        }
        let client = &self.client;
        let leadership = self.leadership.as_deref();
        let results: Vec<_> = self.handle.block_on(
            futures::stream::iter(patches)
                .map(|(pod, key, patch)| async move {
                    let result = patch_claim(client, leadership, &key, &patch).await;
                    (pod, key, result)
                })
                .buffer_unordered(CONCURRENCY)
                .collect(),
        );
        for (pod, key, result) in results {
            match result {
                Ok(claim) => {
                    tracing::info!(claim = %format!("{}/{}", key.0, key.1), "released a ResourceClaim its pod no longer needs");
                    tracker.dra_mut().set_claim(key, Some(Arc::new(claim)));
                }
                // Deleted meanwhile: nothing to release.
                Err(e) if e.contains("404") || e.contains("not found") => {}
                Err(error) => {
                    // Changed meanwhile (another pod of a shared claim left), or the API server
                    // is away: tried again at the next pass, against the claim as it is then.
                    tracing::warn!(%error, "cannot release a ResourceClaim yet");
                    self.gone.push(pod);
                }
            }
        }
    }

    /// Allocates the DRA claims of the pods about to bind, all or nothing per job: a job whose
    /// pods cannot all get their devices on their nodes, or whose claim writes fail, binds
    /// none of them and fails with the reason (its writes taken back). Returns the binds that
    /// may go ahead, and per job the claim writes to take back should its binding fail.
    pub(super) fn allocate_claims(
        &mut self,
        tracker: &mut Tracker,
        binds: Vec<Bind>,
        pass: &mut Pass,
    ) -> (Vec<Bind>, BTreeMap<JobId, Vec<ClaimWrite>>) {
        if !binds.iter().any(|(_, p, _)| names_claims(&p.pod)) {
            return (binds, BTreeMap::new());
        }
        let mut job_to_pods: BTreeMap<JobId, Vec<(PendingPod, usize)>> = BTreeMap::new();
        for (job, pod, node) in binds {
            job_to_pods.entry(job).or_default().push((pod, node));
        }
        let view = tracker.dra();
        let names = tracker.node_names();
        let mut in_use = view.in_use();
        let mut planned: Vec<(JobId, ClaimWrite)> = Vec::new();
        let mut refused: Vec<(JobId, String)> = Vec::new();
        for (&job, pods) in &job_to_pods {
            match plan_claims(view, names, pods, &in_use) {
                Ok((writes, taken)) => {
                    in_use.extend(taken);
                    planned.extend(writes.into_iter().map(|w| (job, w)));
                }
                Err(reason) => refused.push((job, reason)),
            }
        }
        let client = &self.client;
        let leadership = self.leadership.as_deref();
        let results: Vec<(
            JobId,
            ClaimWrite,
            std::result::Result<ResourceClaim, String>,
        )> = self.handle.block_on(
            futures::stream::iter(planned)
                .map(|(job, write)| async move {
                    let result = patch_claim(client, leadership, &write.key, &write.patch).await;
                    (job, write, result)
                })
                .buffer_unordered(CONCURRENCY)
                .collect(),
        );
        let mut job_to_writes: BTreeMap<JobId, Vec<ClaimWrite>> = BTreeMap::new();
        for (job, write, result) in results {
            match result {
                Ok(claim) => {
                    tracker
                        .dra_mut()
                        .set_claim(write.key.clone(), Some(Arc::new(claim)));
                    job_to_writes.entry(job).or_default().push(write);
                }
                Err(reason) => {
                    if !refused.iter().any(|(j, _)| *j == job) {
                        refused.push((job, reason));
                    }
                }
            }
        }
        let mut undo: Vec<ClaimWrite> = Vec::new();
        for (job, reason) in refused {
            tracing::warn!(job, %reason, "DRA allocation failed");
            undo.extend(job_to_writes.remove(&job).unwrap_or_default());
            job_to_pods.remove(&job);
            let message = format!("Binding failed: {reason}");
            pass.failed.extend(
                tracker
                    .pods_of(job)
                    .into_iter()
                    .map(|p| (p, message.clone())),
            );
            pass.outcomes.push(BindOutcome::Failed { job, reason });
        }
        self.undo_claims(tracker, undo);
        let binds = job_to_pods
            .into_iter()
            .flat_map(|(job, pods)| pods.into_iter().map(move |(p, n)| (job, p, n)))
            .collect();
        (binds, job_to_writes)
    }

    /// Takes back claim statuses this pass wrote for a job that did not bind.
    pub(super) fn undo_claims(&self, tracker: &mut Tracker, writes: Vec<ClaimWrite>) {
        if writes.is_empty() {
            return;
        }
        let client = &self.client;
        let leadership = self.leadership.as_deref();
        let results: Vec<_> = self.handle.block_on(
            futures::stream::iter(writes)
                .map(|write| async move {
                    let result = patch_claim(client, leadership, &write.key, &write.undo).await;
                    (write.key, result)
                })
                .buffer_unordered(CONCURRENCY)
                .collect(),
        );
        for (key, result) in results {
            match result {
                Ok(claim) => tracker.dra_mut().set_claim(key, Some(Arc::new(claim))),
                Err(error) => tracing::warn!(%error, "cannot take back a ResourceClaim allocation"),
            }
        }
    }
}
