//! Preflight: a node tainted `gantry.dev/preflight` takes no work until a test passes on it, as
//! OpenAI's cluster ran it ("Scaling Kubernetes to 7,500 nodes"). Pure rules; `gantry-kube`
//! creates the pods and writes the results.
//!
//! - [`PreflightTemplate`]: the `preflight:` section of `--health-config`: the admin's image
//!   and command (DCGM diagnostics, an NCCL test), the namespace its pods run in, and how long
//!   one may take.
//! - [`node_status`]: what a node shows: tainted and waiting for (or running) its test, or
//!   tainted and failed ([`FAILED_ANNOTATION`] holds the reason, so a restart of Gantry, or a
//!   successor replica, keeps it out without testing it again).
//! - [`pod`]: the preflight pod for a node: bound to it by `spec.nodeName`, tolerating the
//!   taint, asking every GPU of the node, never restarted.
//! - [`outcome`]: what a preflight pod's status says: still running, passed, failed with the
//!   container's exit reason, or out of time.
//! - Re-tests ([`PreflightTemplate::retest_every_s`]): idle nodes are tainted again, a few at
//!   a time, while no job waits, and a waiting job ends a re-test early.
//!
//! A failed node stays tainted, with the annotation: it is out of the scheduler's hands
//! (Repair) until an admin removes the annotation, when it is tested again.

use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Deserialize;
use serde_json::json;

/// The taint that keeps a node out until its preflight passes (any effect).
pub const PREFLIGHT_TAINT: &str = "gantry.dev/preflight";

/// The node annotation a failed preflight leaves, holding its reason.
pub const FAILED_ANNOTATION: &str = "gantry.dev/preflight-failed";

/// The label every preflight pod carries (`"true"`): what Gantry watches them by.
pub const POD_LABEL: &str = "gantry.dev/preflight";

/// The pod annotation naming the node a preflight pod tests (a label value is too short for
/// every node name).
pub const NODE_ANNOTATION: &str = "gantry.dev/preflight-node";

/// The `preflight:` section of `--health-config`: the pod Gantry runs on each node tainted
/// [`PREFLIGHT_TAINT`]. Why a template of the admin's: the test that proves a node good
/// (DCGM's diagnostics, an NCCL all-reduce, a burn-in) is the fleet's, not the scheduler's.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreflightTemplate {
    /// The test's container image.
    pub image: String,
    /// Its command (the image's entrypoint when empty).
    #[serde(default)]
    pub command: Vec<String>,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// The namespace its pods run in.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// The service account its pods run as (the namespace's default when absent).
    #[serde(default)]
    pub service_account: Option<String>,
    /// A pod that has not finished this long after its creation fails the node (seconds).
    #[serde(default = "default_timeout_s")]
    pub timeout_s: u64,
    /// Re-test a node idle this long after its last test (or since Gantry started), seconds;
    /// `None`: no re-tests. A re-test runs only while no job waits, and gives way to one.
    #[serde(default)]
    pub retest_every_s: Option<u64>,
    /// Most nodes re-tested at once.
    #[serde(default = "default_retest_at_once")]
    pub retest_at_once: usize,
}

fn default_retest_at_once() -> usize {
    1
}

fn default_namespace() -> String {
    "default".into()
}

fn default_timeout_s() -> u64 {
    900
}

impl PreflightTemplate {
    /// Every rule the template must meet, naming the field that breaks one.
    pub fn validate(&self) -> Result<(), String> {
        if self.image.trim().is_empty() {
            return Err("field image: the test's container image is empty".into());
        }
        if self.namespace.trim().is_empty() {
            return Err("field namespace: empty".into());
        }
        if self.timeout_s == 0 {
            return Err("field timeout_s: must be at least 1 second".into());
        }
        if self.retest_every_s == Some(0) {
            return Err("field retest_every_s: must be at least 1 second".into());
        }
        if self.retest_at_once == 0 {
            return Err("field retest_at_once: must be at least 1 (leave out retest_every_s to re-test none)".into());
        }
        Ok(())
    }

    /// The name of `node`'s preflight pod: one per node at a time, so a create whose answer
    /// was lost is refused as existing, never run twice.
    pub fn pod_name(node: &str) -> String {
        // A pod name is a DNS subdomain of at most 253 characters.
        let mut name = format!("gantry-preflight-{node}");
        name.truncate(253);
        name.trim_end_matches(['-', '.']).to_string()
    }
}

/// What a node shows of its preflight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeStatus {
    /// Tainted: its test is due or running.
    Testing,
    /// Tainted, and its test failed: the reason.
    Failed(String),
}

/// `node`'s preflight status; `None` when it carries no [`PREFLIGHT_TAINT`].
pub fn node_status(node: &Node) -> Option<NodeStatus> {
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| taints.iter().any(|t| t.key == PREFLIGHT_TAINT));
    if !tainted {
        return None;
    }
    let failed = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(FAILED_ANNOTATION));
    Some(match failed {
        Some(reason) => NodeStatus::Failed(reason.clone()),
        None => NodeStatus::Testing,
    })
}

/// The preflight pod for `node`, asking its `gpus` GPUs of `gpu_resource` so that the test
/// sees every GPU and nothing else runs beside it.
pub fn pod(template: &PreflightTemplate, node: &str, gpus: u32, gpu_resource: &str) -> Pod {
    let mut container = json!({
        "name": "preflight",
        "image": template.image,
    });
    if !template.command.is_empty() {
        container["command"] = json!(template.command);
    }
    if !template.args.is_empty() {
        container["args"] = json!(template.args);
    }
    if gpus > 0 {
        container["resources"] = json!({
            "limits": {gpu_resource: gpus.to_string()},
            "requests": {gpu_resource: gpus.to_string()},
        });
    }
    let mut spec = json!({
        // Bound by name: no scheduler places it, and no other node may run it.
        "nodeName": node,
        "restartPolicy": "Never",
        "tolerations": [{"key": PREFLIGHT_TAINT, "operator": "Exists"}],
        "containers": [container],
    });
    if let Some(account) = &template.service_account {
        spec["serviceAccountName"] = json!(account);
    }
    serde_json::from_value(json!({
        "metadata": {
            "name": PreflightTemplate::pod_name(node),
            "namespace": template.namespace,
            "labels": {POD_LABEL: "true"},
            "annotations": {NODE_ANNOTATION: node},
        },
        "spec": spec,
    }))
    .expect("a preflight pod is a valid Pod")
}

/// The node a preflight pod tests.
pub fn pod_node(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(NODE_ANNOTATION)
        .map(String::as_str)
}

/// What a preflight pod's status says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Not finished, and within its time.
    Running,
    /// It succeeded: the node takes work.
    Passed,
    /// It failed, or ran out of time: the reason, in words.
    Failed(String),
}

/// What `pod` says at `now_unix_s`, given `timeout_s`.
pub fn outcome(pod: &Pod, timeout_s: u64, now_unix_s: f64) -> Outcome {
    let status = pod.status.as_ref();
    match status.and_then(|s| s.phase.as_deref()) {
        Some("Succeeded") => return Outcome::Passed,
        Some("Failed") => return Outcome::Failed(failure_reason(pod)),
        _ => {}
    }
    let created_s = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second() as f64);
    match created_s {
        Some(created_s) if now_unix_s - created_s > timeout_s as f64 => {
            let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
            Outcome::Failed(format!(
                "the preflight pod did not finish within {timeout_s} s (still {phase})"
            ))
        }
        _ => Outcome::Running,
    }
}

/// Why a failed preflight pod failed: its container's exit code, reason and message, else
/// the pod's own reason and message (an eviction, say).
fn failure_reason(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let terminated = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .find_map(|c| {
            let t = c.state.as_ref()?.terminated.as_ref()?;
            (t.exit_code != 0).then_some((c.name.clone(), t))
        });
    if let Some((name, t)) = terminated {
        let mut reason = format!("container {name} exited {}", t.exit_code);
        if let Some(why) = t.reason.as_deref().filter(|r| !r.is_empty()) {
            reason.push_str(&format!(" ({why})"));
        }
        if let Some(message) = t
            .message
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty())
        {
            reason.push_str(&format!(": {message}"));
        }
        return reason;
    }
    let why = status.and_then(|s| s.reason.as_deref()).unwrap_or("");
    let message = status.and_then(|s| s.message.as_deref()).unwrap_or("");
    match (why.is_empty(), message.is_empty()) {
        (true, true) => "the preflight pod failed, giving no reason".into(),
        (false, true) => format!("the preflight pod failed: {why}"),
        (true, false) => format!("the preflight pod failed: {message}"),
        (false, false) => format!("the preflight pod failed: {why}: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template() -> PreflightTemplate {
        serde_yaml::from_str("{image: dcgm:4, command: [dcgmi, diag, -r, '2']}").unwrap()
    }

    fn node(taints: serde_json::Value, annotations: serde_json::Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n0", "annotations": annotations},
            "spec": {"taints": taints},
        }))
        .unwrap()
    }

    #[test]
    fn a_tainted_node_is_testing_until_its_failure_is_annotated() {
        let taint = json!([{"key": PREFLIGHT_TAINT, "effect": "NoSchedule"}]);
        assert_eq!(node_status(&node(json!([]), json!({}))), None);
        assert_eq!(
            node_status(&node(taint.clone(), json!({}))),
            Some(NodeStatus::Testing)
        );
        assert_eq!(
            node_status(&node(
                taint,
                json!({FAILED_ANNOTATION: "container exited 1"})
            )),
            Some(NodeStatus::Failed("container exited 1".into()))
        );
        // The annotation alone keeps nothing out: the taint is what the test removes.
        assert_eq!(
            node_status(&node(json!([]), json!({FAILED_ANNOTATION: "x"}))),
            None
        );
    }

    #[test]
    fn the_pod_is_bound_to_its_node_tolerates_the_taint_and_asks_every_gpu() {
        let p = pod(&template(), "h100-7", 8, "nvidia.com/gpu");
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("h100-7"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let toleration = &spec.tolerations.as_ref().unwrap()[0];
        assert_eq!(toleration.key.as_deref(), Some(PREFLIGHT_TAINT));
        assert_eq!(toleration.operator.as_deref(), Some("Exists"));
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("dcgm:4"));
        assert_eq!(c.command.as_ref().unwrap(), &["dcgmi", "diag", "-r", "2"]);
        let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert_eq!(limits["nvidia.com/gpu"].0, "8");
        assert_eq!(p.metadata.name.as_deref(), Some("gantry-preflight-h100-7"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(pod_node(&p), Some("h100-7"));
        assert_eq!(p.metadata.labels.as_ref().unwrap()[POD_LABEL], "true");
    }

    #[test]
    fn a_template_without_an_image_is_refused_naming_the_field() {
        let err = serde_yaml::from_str::<PreflightTemplate>("{command: [true]}").unwrap_err();
        assert!(err.to_string().contains("missing field `image`"), "{err}");
        let empty: PreflightTemplate = serde_yaml::from_str("{image: ' '}").unwrap();
        assert_eq!(
            empty.validate().unwrap_err(),
            "field image: the test's container image is empty"
        );
        let zero: PreflightTemplate = serde_yaml::from_str("{image: a, timeout_s: 0}").unwrap();
        assert!(zero.validate().unwrap_err().starts_with("field timeout_s"));
        let err = serde_yaml::from_str::<PreflightTemplate>("{image: a, cmd: [x]}").unwrap_err();
        assert!(err.to_string().contains("unknown field `cmd`"), "{err}");
    }

    fn with_status(status: serde_json::Value, created: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "creationTimestamp": created},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_passes_fails_with_its_exit_reason_or_runs_out_of_time() {
        let created = "2026-12-04T00:00:00Z";
        let at = |s: f64| 1_796_342_400.0 + s;
        assert_eq!(
            outcome(
                &with_status(json!({"phase": "Succeeded"}), created),
                60,
                at(5.0)
            ),
            Outcome::Passed
        );
        let failed = with_status(
            json!({"phase": "Failed", "containerStatuses": [{
                "name": "preflight", "image": "dcgm:4", "imageID": "", "ready": false,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 1, "reason": "Error",
                    "message": "dcgmi diag: GPU 3 failed the memory test\n"}},
            }]}),
            created,
        );
        assert_eq!(
            outcome(&failed, 60, at(5.0)),
            Outcome::Failed(
                "container preflight exited 1 (Error): dcgmi diag: GPU 3 failed the memory test"
                    .into()
            )
        );
        let evicted = with_status(
            json!({"phase": "Failed", "reason": "Evicted", "message": "low on memory"}),
            created,
        );
        assert_eq!(
            outcome(&evicted, 60, at(5.0)),
            Outcome::Failed("the preflight pod failed: Evicted: low on memory".into())
        );
        let running = with_status(json!({"phase": "Running"}), created);
        assert_eq!(outcome(&running, 60, at(59.0)), Outcome::Running);
        assert_eq!(
            outcome(&running, 60, at(61.0)),
            Outcome::Failed("the preflight pod did not finish within 60 s (still Running)".into())
        );
    }
}
