//! Preflight on a live cluster (the rules are `gantry_kube_model::preflight`'s): a node tainted
//! `gantry.dev/preflight` gets a pod from the `--health-config` template, bound to it by name;
//! when the pod succeeds the taint is removed and the node takes work, and when it fails (or
//! runs out of time) the node keeps the taint, gains the `gantry.dev/preflight-failed`
//! annotation with the reason, and is in repair. Each step posts an Event on the node.
//!
//! Idle nodes are re-tested when the template says how often (`retest_every_s`): a few at a
//! time, tainted again by Gantry, only while no job waits; a job that starts waiting ends the
//! re-tests under way (pod deleted, taint removed).
//!
//! [`Preflights::observe`] runs in the sync: it reads the preflight pods' cache and moves the
//! lifecycle (every replica keeps its view). [`Preflights::write`] runs in the bind pass, on
//! the leader only: it creates the pods due and writes each result, retried at the next pass
//! until it lands.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gantry_core::Scheduler;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client};

use super::fenced;
use super::report::post_node_event;
use crate::leader::Leadership;
use crate::preflight::{
    FAILED_ANNOTATION, NodeStatus, Outcome, PREFLIGHT_TAINT, PreflightTemplate, outcome, pod,
    pod_node,
};
use crate::tracker::Tracker;

/// After a test is started or its result written, no other pod is started on the node for
/// this long: the caches show our own writes only after a while.
const SETTLE: Duration = Duration::from_secs(30);

/// Idle nodes are looked for re-tests at most this often: the look walks every node.
const RETEST_SCAN: Duration = Duration::from_secs(10);

/// A preflight result seen in the cache and not yet written back.
#[derive(Debug, Clone)]
struct Due {
    /// The pod that gave it: deleted once the result is written.
    pod: String,
    uid: String,
    /// `None` when it passed, else why it failed.
    failure: Option<String>,
}

/// What preflight remembers between passes. Why here: the writes of a result (the taint or
/// the annotation, then the pod) may fail and are tried again, and a result is applied to the
/// lifecycle once, by the pod's uid.
#[derive(Debug, Default)]
pub(crate) struct Preflights {
    /// The configured test; `None`: Gantry runs none (a tainted node waits for whatever
    /// removes the taint).
    template: Option<PreflightTemplate>,
    /// The GPU resource a preflight pod asks all of.
    gpu_resource: String,
    /// Results seen and not yet written, by node name.
    node_to_due: BTreeMap<String, Due>,
    /// Uids of the preflight pods whose result the lifecycle has: each is applied once.
    handled: HashSet<String>,
    /// Nodes with a preflight pod in the cache now.
    testing: HashSet<String>,
    /// When a test was last started, or a result written, per node (see [`SETTLE`]).
    node_to_last: HashMap<String, Instant>,
    /// When each node last passed a test this process saw: re-tests count from it, or from
    /// [`Preflights::since`].
    node_to_passed: HashMap<String, Instant>,
    /// When this process started: a node never tested since counts from here.
    since: Option<Instant>,
    /// Nodes this process tainted for a re-test, still tainted: at most
    /// `retest_at_once`, and each gives way to waiting work.
    retesting: HashSet<String>,
    /// When idle nodes were last looked for (see [`RETEST_SCAN`]).
    last_scan: Option<Instant>,
}

impl Preflights {
    /// Preflight with `template`, whose pods ask every GPU of `gpu_resource`.
    pub(crate) fn new(template: Option<PreflightTemplate>, gpu_resource: &str) -> Self {
        Self {
            template,
            gpu_resource: gpu_resource.into(),
            since: Some(Instant::now()),
            ..Self::default()
        }
    }

    /// Reads the preflight pods (`pods`, the cache) at `now_unix_s`: a pod that passed, failed
    /// or ran out of time moves its node's lifecycle (Ready, or Repair with the reason) and is
    /// due to be written back.
    pub(crate) fn observe(
        &mut self,
        pods: &[Arc<Pod>],
        tracker: &Tracker,
        scheduler: &mut Scheduler,
        now_unix_s: f64,
        now_s: f64,
    ) {
        let Some(template) = &self.template else {
            return;
        };
        let mut present = HashSet::new();
        self.testing.clear();
        for p in pods
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(template.namespace.as_str()))
        {
            let (Some(uid), Some(node)) = (p.metadata.uid.clone(), pod_node(p)) else {
                continue;
            };
            self.testing.insert(node.to_string());
            present.insert(uid.clone());
            if self.handled.contains(&uid) {
                continue;
            }
            let failure = match outcome(p, template.timeout_s, now_unix_s) {
                Outcome::Running => continue,
                Outcome::Passed => None,
                Outcome::Failed(reason) => Some(reason),
            };
            let name = p.metadata.name.clone().unwrap_or_default();
            if let Some(index) = tracker.node_index(node) {
                match &failure {
                    None => scheduler.lifecycle_mut().passed(index, now_s),
                    Some(reason) => scheduler.lifecycle_mut().test_failed(index, reason, now_s),
                }
                scheduler.sync_health(index);
            }
            if failure.is_none() {
                self.node_to_passed.insert(node.to_string(), Instant::now());
            }
            match &failure {
                None => tracing::info!(node, pod = %name, "preflight passed"),
                Some(reason) => tracing::warn!(node, pod = %name, %reason, "preflight failed"),
            }
            self.handled.insert(uid.clone());
            self.node_to_due.insert(
                node.to_string(),
                Due {
                    pod: name,
                    uid,
                    failure,
                },
            );
        }
        self.handled.retain(|uid| present.contains(uid));
    }

    /// Writes the results due and starts the tests due: on the leader only, each write fenced
    /// by the Lease.
    pub(crate) fn write(&mut self, io: Io<'_>, tracker: &Tracker, scheduler: &Scheduler) {
        let Io {
            handle,
            client,
            leadership,
        } = io;
        let Some(template) = self.template.clone() else {
            return;
        };
        let namespace = template.namespace.clone();
        let due: Vec<(String, Due)> = self
            .node_to_due
            .iter()
            .map(|(n, d)| (n.clone(), d.clone()))
            .collect();
        for (node, due) in due {
            let written =
                handle.block_on(write_result(client, leadership, &namespace, &node, &due));
            match written {
                Ok(()) => {
                    self.node_to_due.remove(&node);
                    self.node_to_last.insert(node, Instant::now());
                }
                Err(why) => {
                    tracing::warn!(node, %why, "preflight result not written; trying again")
                }
            }
        }
        self.node_to_last.retain(|_, at| at.elapsed() < SETTLE);
        let starts: Vec<(String, u32)> = tracker
            .preflight_nodes()
            .iter()
            .filter(|(_, status)| **status == NodeStatus::Testing)
            .filter(|(node, _)| {
                !self.testing.contains(*node)
                    && !self.node_to_due.contains_key(*node)
                    && !self.node_to_last.contains_key(*node)
            })
            .filter_map(|(node, _)| {
                let index = tracker.node_index(node)?;
                let gpus = scheduler.state.nodes.gpu_total.get(index).copied()?;
                Some((node.clone(), gpus))
            })
            .collect();
        for (node, gpus) in starts {
            let pod = pod(&template, &node, gpus, &self.gpu_resource);
            match handle.block_on(start(client, leadership, &namespace, &node, &pod)) {
                Ok(()) => {
                    tracing::info!(node, "preflight started");
                    self.node_to_last.insert(node, Instant::now());
                }
                Err(why) => tracing::warn!(node, %why, "cannot start the preflight pod"),
            }
        }
        if let Some(every_s) = template.retest_every_s {
            let retest = Retest {
                every: Duration::from_secs(every_s),
                at_once: template.retest_at_once,
                namespace: &namespace,
            };
            self.retests(io, tracker, scheduler, retest);
        }
    }

    /// Re-tests idle nodes, a few at a time, while no job waits; a job waiting ends the
    /// re-tests under way, which give their nodes back.
    fn retests(
        &mut self,
        io: Io<'_>,
        tracker: &Tracker,
        scheduler: &Scheduler,
        retest: Retest<'_>,
    ) {
        let Io {
            handle,
            client,
            leadership,
        } = io;
        self.retesting
            .retain(|node| tracker.preflight_nodes().get(node) == Some(&NodeStatus::Testing));
        let waiting = scheduler
            .pending()
            .into_iter()
            .any(|id| scheduler.get(id).is_some_and(|spec| !spec.balloon));
        if waiting {
            for node in std::mem::take(&mut self.retesting) {
                let note = "A job waits: the re-test gives the node back";
                match handle.block_on(give_way(client, leadership, retest.namespace, &node)) {
                    Ok(()) => {
                        tracing::info!(node, "re-test gave way to waiting work");
                        self.node_to_last.insert(node.clone(), Instant::now());
                        // Not tested: it is due again once idle.
                        handle.block_on(post_node_event(
                            client,
                            leadership,
                            &node,
                            "Normal",
                            ("PreflightYielded", "Preflight"),
                            note,
                        ));
                    }
                    Err(why) => {
                        tracing::warn!(node, %why, "re-test could not give way; trying again");
                        self.retesting.insert(node);
                    }
                }
            }
            return;
        }
        if self.last_scan.is_some_and(|at| at.elapsed() < RETEST_SCAN) {
            return;
        }
        self.last_scan = Some(Instant::now());
        let since = self.since.unwrap_or_else(Instant::now);
        let nodes = &scheduler.state.nodes;
        let mut due: Vec<(Duration, String)> = tracker
            .node_names()
            .iter()
            .enumerate()
            .filter(|&(i, _)| {
                nodes.gpu_total[i] > 0
                    && nodes.gpu_free[i] == nodes.gpu_total[i]
                    && scheduler.lifecycle().state(i) == gantry_core::NodeState::Ready
                    && nodes.health(i) == gantry_core::Health::Healthy
            })
            .filter(|(_, name)| {
                !self.retesting.contains(*name) && !self.node_to_last.contains_key(*name)
            })
            .filter_map(|(_, name)| {
                let idle = self
                    .node_to_passed
                    .get(name)
                    .copied()
                    .unwrap_or(since)
                    .elapsed();
                (idle >= retest.every).then(|| (idle, name.clone()))
            })
            .collect();
        // The longest untested first.
        due.sort_by_key(|d| std::cmp::Reverse(d.0));
        let room = retest.at_once.saturating_sub(self.retesting.len());
        for (untested, node) in due.into_iter().take(room) {
            match handle.block_on(taint(client, leadership, &node)) {
                Ok(()) => {
                    let note = format!(
                        "Re-testing an idle node, untested for {} s",
                        untested.as_secs()
                    );
                    tracing::info!(node, "{note}");
                    handle.block_on(post_node_event(
                        client,
                        leadership,
                        &node,
                        "Normal",
                        ("PreflightRetest", "Preflight"),
                        &note,
                    ));
                    self.retesting.insert(node);
                }
                Err(why) => tracing::warn!(node, %why, "cannot taint the node for a re-test"),
            }
        }
    }
}

/// What preflight writes with: the runtime a pass blocks on, the write client, and the Lease
/// every write checks.
#[derive(Clone, Copy)]
pub(crate) struct Io<'a> {
    pub(crate) handle: &'a tokio::runtime::Handle,
    pub(crate) client: &'a Client,
    pub(crate) leadership: Option<&'a Leadership>,
}

/// What the re-tests are configured to do.
struct Retest<'a> {
    /// A node idle this long after its last test is re-tested.
    every: Duration,
    /// Most re-tests at once.
    at_once: usize,
    /// Where the preflight pods run.
    namespace: &'a str,
}

/// Taints `node` for a re-test, as read: a node changed since is tried at the next scan.
async fn taint(client: &Client, leadership: Option<&Leadership>, node: &str) -> Result<(), String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let current = fenced(leadership, nodes.get(node))
        .await
        .map_err(|f| f.to_string())?
        .map_err(|e| e.to_string())?;
    let mut taints = current
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    if taints.iter().any(|t| t.key == PREFLIGHT_TAINT) {
        return Ok(());
    }
    taints.push(k8s_openapi::api::core::v1::Taint {
        key: PREFLIGHT_TAINT.into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    });
    set_taints(&nodes, leadership, &current, taints).await
}

/// Ends `node`'s re-test early: its pod is deleted and the taint removed.
async fn give_way(
    client: &Client,
    leadership: Option<&Leadership>,
    namespace: &str,
    node: &str,
) -> Result<(), String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let name = PreflightTemplate::pod_name(node);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    match fenced(leadership, pods.delete(&name, &params)).await {
        Err(fenced) => return Err(fenced.to_string()),
        Ok(Err(kube::Error::Api(status))) if status.code == 404 => {}
        Ok(Err(error)) => return Err(error.to_string()),
        Ok(Ok(_)) => {}
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let current = fenced(leadership, nodes.get_opt(node))
        .await
        .map_err(|f| f.to_string())?
        .map_err(|e| e.to_string())?;
    match current {
        Some(current) => remove_taint(&nodes, leadership, &current).await,
        None => Ok(()),
    }
}

/// Creates `node`'s preflight pod (one that exists already is its test running) and posts
/// PreflightStarted on the node.
async fn start(
    client: &Client,
    leadership: Option<&Leadership>,
    namespace: &str,
    node: &str,
    pod: &Pod,
) -> Result<(), String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    match fenced(leadership, api.create(&PostParams::default(), pod)).await {
        Err(fenced) => return Err(fenced.to_string()),
        Ok(Err(kube::Error::Api(status))) if status.code == 409 => return Ok(()),
        Ok(Err(error)) => return Err(error.to_string()),
        Ok(Ok(_)) => {}
    }
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let note = format!("Testing the node before it takes work: preflight pod {namespace}/{name}");
    post_node_event(
        client,
        leadership,
        node,
        "Normal",
        ("PreflightStarted", "Preflight"),
        &note,
    )
    .await;
    Ok(())
}

/// Writes one result: a pass removes the taint, a failure annotates the node with its reason;
/// then the pod is deleted and the node's Event posted.
async fn write_result(
    client: &Client,
    leadership: Option<&Leadership>,
    namespace: &str,
    node: &str,
    due: &Due,
) -> Result<(), String> {
    let nodes: Api<Node> = Api::all(client.clone());
    match &due.failure {
        None => {
            let current = fenced(leadership, nodes.get_opt(node))
                .await
                .map_err(|f| f.to_string())?
                .map_err(|e| e.to_string())?;
            // A node gone has nothing to remove.
            if let Some(current) = current {
                remove_taint(&nodes, leadership, &current).await?;
            }
        }
        Some(reason) => {
            let mut value = reason.clone();
            value.truncate(1000);
            let patch =
                serde_json::json!({"metadata": {"annotations": {FAILED_ANNOTATION: value}}});
            let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
            let write = nodes.patch(node, &params, &patch);
            match fenced(leadership, write).await.map_err(|f| f.to_string())? {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => return Err(error.to_string()),
            }
        }
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = DeleteParams {
        // Finished, or out of time: nothing to shut down gracefully.
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(due.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match fenced(leadership, pods.delete(&due.pod, &params)).await {
        Err(fenced) => return Err(fenced.to_string()),
        Ok(Err(kube::Error::Api(status))) if status.code == 404 || status.code == 409 => {}
        Ok(Err(error)) => return Err(error.to_string()),
        Ok(Ok(_)) => {}
    }
    let (type_, reason, note) = match &due.failure {
        None => (
            "Normal",
            "PreflightPassed",
            format!(
                "Preflight pod {namespace}/{} succeeded: the node takes work",
                due.pod
            ),
        ),
        Some(why) => (
            "Warning",
            "PreflightFailed",
            format!(
                "Preflight failed: {why}. The node keeps the {PREFLIGHT_TAINT} taint and is in \
                 repair; remove its {FAILED_ANNOTATION} annotation to test it again"
            ),
        ),
    };
    post_node_event(
        client,
        leadership,
        node,
        type_,
        (reason, "Preflight"),
        &note,
    )
    .await;
    Ok(())
}

/// Removes the preflight taint from `node`, as read.
async fn remove_taint(
    nodes: &Api<Node>,
    leadership: Option<&Leadership>,
    node: &Node,
) -> Result<(), String> {
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    if !taints.iter().any(|t| t.key == PREFLIGHT_TAINT) {
        return Ok(());
    }
    let kept = taints
        .into_iter()
        .filter(|t| t.key != PREFLIGHT_TAINT)
        .collect();
    set_taints(nodes, leadership, node, kept)
        .await
        .map_err(|e| format!("cannot remove the {PREFLIGHT_TAINT} taint: {e}"))
}

/// Sets `node`'s taints to `taints`: the merge patch carries the resourceVersion read, so a
/// node changed since is refused (409) and read again next time rather than overwritten.
async fn set_taints(
    nodes: &Api<Node>,
    leadership: Option<&Leadership>,
    node: &Node,
    taints: Vec<k8s_openapi::api::core::v1::Taint>,
) -> Result<(), String> {
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": node.metadata.resource_version},
        "spec": {"taints": taints},
    });
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
    let write = nodes.patch(name, &params, &patch);
    fenced(leadership, write)
        .await
        .map_err(|f| f.to_string())?
        .map(|_| ())
        .map_err(|e| e.to_string())
}
