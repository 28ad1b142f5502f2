//! A 0.2.0 score policy whose scores are fine but whose reason for node 0 is 64 KiB, far over
//! the 200 bytes the host allows: the host must refuse it as bad output (a fault, which the
//! score's fail-open policy skips), never pass it on to the explanation or crash. With config
//! `{"reasons": N}` it instead gives N short reasons, for the bound on their count.
use gantry_policy_sdk::prelude::*;
use gantry_policy_sdk::v0_2::{self, Labels, Scored};

pub struct LongReason {
    /// Short reasons to give instead of one long one; 0 for the long one.
    reasons: u32,
}

impl v0_2::ScorePolicy for LongReason {
    const NAME: &'static str = "hostile-long-reason";

    fn new(config: &str) -> Result<Self, String> {
        let reasons = config
            .split("\"reasons\":")
            .nth(1)
            .and_then(|rest| rest.trim().trim_end_matches('}').trim().parse().ok())
            .unwrap_or(0);
        Ok(Self { reasons })
    }

    fn score_all(&self, _pod: &Pod, nodes: &Nodes<'_>, _labels: &Labels<'_>) -> Scored {
        let mut scored = Scored::new(nodes.len());
        if self.reasons == 0 {
            scored.reasons.push((0, "why? ".repeat((64 << 10) / 5)));
        } else {
            let nodes = nodes.len() as u32;
            scored.reasons = (0..self.reasons)
                .map(|i| (i % nodes.max(1), format!("reason {i}")))
                .collect();
        }
        scored
    }
}

gantry_policy_sdk::export_score_v0_2!(LongReason);
