//! The explanation record kept for every decision: what the store keeps, what the API serves and
//! what the UI shows a researcher asking "why here?" or "why still pending?".

use serde::{Deserialize, Serialize};

use crate::queues::Admission;
pub use crate::words::{count_text, duration_text};

/// One decision about one job in one cycle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Explanation {
    /// The job decided about.
    pub job: String,
    /// The queue it was submitted to.
    pub queue: String,
    /// Pods in its gang (1 for a single pod).
    pub pods: u32,
    /// GPUs each pod asks for.
    pub gpus_per_pod: u32,
    /// Higher goes first within its queue.
    pub priority: i32,
    /// Virtual or wall time of the attempt, in seconds.
    pub time_s: f64,
    pub outcome: Outcome,
    pub quota: QuotaExplain,
    /// Nodes in the cluster, nodes evaluated (a single pod stops once enough fit), and how
    /// many of those passed every filter.
    pub nodes_total: u32,
    /// Nodes the cycle evaluated for it.
    pub nodes_evaluated: u32,
    /// Evaluated nodes that passed every filter.
    pub nodes_feasible: u32,
    /// Per filter (built-in first), how many nodes it rejected for each reason.
    pub filters: Vec<FilterExplain>,
    /// The best-scored feasible nodes, with each score policy's weighted part.
    pub top_nodes: Vec<NodeScore>,
    /// The topology domain the job was placed in (gangs), e.g. `rack 12`.
    pub domain: Option<String>,
    /// The policy-set version and the policies that took part.
    pub policy_set: u64,
    /// The policies of that set that took part, in the order they ran.
    pub policies: Vec<PolicyRef>,
    /// Jobs evicted to make room for this one.
    pub preempted: Vec<String>,
    /// Policy faults in this decision, as `policy: fault`.
    pub faults: Vec<String>,
    /// For a pending job the planner covered: when it is expected to start, and the
    /// reservation it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<StartEstimate>,
    /// On the record of a preemption: the job whose placement evicted this one. Kept as data,
    /// not only in `waiting_for`'s words, so a job's history can say who preempted it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted_by: Option<String>,
}

// The planner makes it; it lives here, beside the record that carries it, so the record
// depends on no stage of the scheduler.
/// When a pending job is expected to start (seconds, on the scheduler's clock), and what holds
/// it: a reservation, or only the estimate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct StartEstimate {
    /// When the plan was made.
    pub planned_at_s: f64,
    /// As early as this (10%).
    pub p10_s: f64,
    /// Most likely about then (the median).
    pub p50_s: f64,
    /// By then, 90% of the time.
    pub p90_s: f64,
    /// The nodes held for it, when it holds a reservation: e.g. `16 nodes in rack 3`.
    pub reservation: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
/// What the cycle decided for the job, tagged by `kind`.
pub enum Outcome {
    /// Every pod has a node: `(node name, pods on it)`.
    Placed { nodes: Vec<(String, u32)> },
    /// Not placed this cycle; `waiting_for` says what would change that, in plain words.
    Pending { waiting_for: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
/// How the job's queue stood: the built-in quota's answer, each quota policy's verdict and the
/// queue's fair-share place.
pub struct QuotaExplain {
    /// The built-in quota's answer, before any Wasm quota policy.
    pub builtin: Admission,
    /// Each Wasm quota policy's verdict, as `(policy, verdict text)`.
    pub policies: Vec<(String, String)>,
    /// The queue's fair-share position: its key (lower goes first) and its place in this cycle.
    pub fair_share_key: f64,
    /// The queue's place in this cycle's fair-share order (1 = first).
    pub position: u32,
}

impl QuotaExplain {
    /// The quota's one verdict in words, for `gantry explain` and the UI: a quota policy that
    /// denied (or faulted, which refuses too) decides it, with what the built-in limits alone
    /// would have said beside it, so "borrowing 772 GPUs" never reads as an admission the
    /// policy refused.
    pub fn verdict_text(&self) -> String {
        let builtin = match &self.builtin {
            Admission::Within => "within its quota".to_string(),
            Admission::Borrowing { gpus } => format!("borrowing {}", count_text(*gpus, "GPU")),
            Admission::Denied { reason } => return format!("denied: {reason}"),
        };
        let refusing = self
            .policies
            .iter()
            .find(|(_, verdict)| verdict.starts_with("deny") || verdict.starts_with("faulted"));
        if let Some((policy, verdict)) = refusing {
            return format!(
                "denied by quota policy {policy} ({verdict}); the built-in limits alone would \
                 admit it, {builtin}"
            );
        }
        let agreeing: Vec<String> = self
            .policies
            .iter()
            .map(|(policy, verdict)| format!("{policy}: {verdict}"))
            .collect();
        if agreeing.is_empty() {
            format!("admitted, {builtin}")
        } else {
            format!("admitted, {builtin} ({})", agreeing.join("; "))
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
/// One filter's rejections, by reason.
pub struct FilterExplain {
    /// The filter: `builtin` or the policy's name.
    pub policy: String,
    /// `(reason text, nodes rejected for it)`, most first.
    pub rejected: Vec<(String, u32)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
/// One feasible node's score and what each score policy added to it.
pub struct NodeScore {
    /// The node's name.
    pub node: String,
    /// The sum of the weighted parts: higher is preferred.
    pub total: u64,
    /// `(policy, weighted score)`.
    pub parts: Vec<(String, u64)>,
    /// `(policy, reason)`: why a score policy of contract 0.2.0 scored the node as it did, when
    /// it said. Absent from records of policies that did not (and from older records).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<(String, String)>,
}

/// A policy taking part in a cycle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct PolicyRef {
    /// The name the policy declares.
    pub name: String,
    /// The version the policy declares.
    pub version: String,
    /// `filter`, `score` or `quota`.
    pub role: String,
    /// Its weight in the set (score policies).
    pub weight: u32,
    /// The sha256 of its bytes.
    pub sha256: String,
}

impl Explanation {
    /// kube-scheduler's aggregated message: "0/7500 nodes are available: 7000 Insufficient
    /// nvidia.com/gpu, 500 rejected by policy gpu-binpack: rack full."
    pub fn summary(&self) -> String {
        match &self.outcome {
            Outcome::Placed { nodes } => {
                let pods: u32 = nodes.iter().map(|(_, n)| n).sum();
                let domain = self
                    .domain
                    .as_ref()
                    .map(|d| format!(" in {d}"))
                    .unwrap_or_default();
                format!(
                    "placed {} on {}{domain}",
                    count_text(pods, "pod"),
                    count_text(nodes.len() as u64, "node")
                )
            }
            Outcome::Pending { waiting_for } => {
                let mut parts: Vec<String> = Vec::new();
                for filter in &self.filters {
                    for (reason, count) in &filter.rejected {
                        if filter.policy == "builtin" {
                            parts.push(format!("{count} {reason}"));
                        } else {
                            parts.push(format!(
                                "{count} rejected by policy {}: {reason}",
                                filter.policy
                            ));
                        }
                    }
                }
                let nodes = if parts.is_empty() {
                    String::new()
                } else {
                    format!(
                        "{}/{} nodes are available: {}. ",
                        self.nodes_feasible,
                        self.nodes_total,
                        parts.join(", ")
                    )
                };
                format!("{nodes}Waiting for {waiting_for}.")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denying_quota_policy_is_the_verdict_with_the_builtin_beside_it() {
        let mut quota = QuotaExplain {
            builtin: Admission::Borrowing { gpus: 772 },
            policies: vec![("team-quota".into(), "deny: rl is at its cap".into())],
            fair_share_key: 0.0,
            position: 1,
        };
        assert_eq!(
            quota.verdict_text(),
            "denied by quota policy team-quota (deny: rl is at its cap); the built-in limits \
             alone would admit it, borrowing 772 GPUs"
        );
        quota.policies = vec![("team-quota".into(), "admit".into())];
        assert_eq!(
            quota.verdict_text(),
            "admitted, borrowing 772 GPUs (team-quota: admit)"
        );
        quota.builtin = Admission::Denied {
            reason: "rl is at its borrowing limit".into(),
        };
        assert_eq!(quota.verdict_text(), "denied: rl is at its borrowing limit");
    }
}
