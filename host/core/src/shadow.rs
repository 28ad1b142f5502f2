//! Shadow mode: a candidate policy set decides beside the active one, on the same state, and
//! binds nothing. What an admin reads before activating is where the two disagree.

use serde::{Deserialize, Serialize};

use crate::explain::{Explanation, Outcome};
use crate::scheduler::{CycleOutput, JobId};

/// How a candidate's decision differs from the active set's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DisagreementKind {
    /// Both place the job, on different nodes.
    OtherNodes,
    /// Both place the gang, in different topology domains.
    OtherDomain,
    /// The active set places the job; the candidate would leave it pending.
    RejectedByCandidate,
    /// The active set leaves the job pending; the candidate would place it.
    AdmittedByCandidate,
}

/// One job the two sets decide differently, with both explanations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Disagreement {
    pub job: JobId,
    pub kind: DisagreementKind,
    pub active: Explanation,
    pub candidate: Explanation,
}

/// Where `candidate` (a shadow cycle) disagrees with `active` (the real one), job by job.
pub fn compare(active: &CycleOutput, candidate: &CycleOutput) -> Vec<Disagreement> {
    let mut out = Vec::new();
    for decision in &active.decisions {
        let Some(shadow) = candidate.decisions.iter().find(|d| d.job == decision.job) else {
            continue;
        };
        let (a, c) = (&decision.explanation, &shadow.explanation);
        let kind = match (&a.outcome, &c.outcome) {
            (Outcome::Placed { nodes: x }, Outcome::Placed { nodes: y }) => {
                if a.domain != c.domain && a.pods > 1 {
                    Some(DisagreementKind::OtherDomain)
                } else if sorted(x) != sorted(y) {
                    Some(DisagreementKind::OtherNodes)
                } else {
                    None
                }
            }
            (Outcome::Placed { .. }, Outcome::Pending { .. }) => {
                Some(DisagreementKind::RejectedByCandidate)
            }
            (Outcome::Pending { .. }, Outcome::Placed { .. }) => {
                Some(DisagreementKind::AdmittedByCandidate)
            }
            (Outcome::Pending { .. }, Outcome::Pending { .. }) => None,
        };
        if let Some(kind) = kind {
            out.push(Disagreement {
                job: decision.job,
                kind,
                active: a.clone(),
                candidate: c.clone(),
            });
        }
    }
    out
}

fn sorted(nodes: &[(String, u32)]) -> Vec<(String, u32)> {
    let mut nodes = nodes.to_vec();
    nodes.sort();
    nodes
}
