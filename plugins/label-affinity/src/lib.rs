//! `label-affinity`, a score policy of contract `gantry:policy@0.2.0`: prefer the nodes whose
//! label `key` has the value `value` (a team's pool, say), and say so in the explanation.
//!
//! Config: `{"key": "gantry.dev/pool", "value": "train", "score": 100}`; `key` defaults to
//! `gantry.dev/pool`, `score` (what a matching node gets; others get 0) to 100, and `value` is
//! required. It asks the host for the one label column it reads, so the cluster's other labels
//! cost it nothing.
//!
//! Reasons: the first 16 matching nodes of each call (the most a call may give) get
//! "label KEY=VALUE matches", followed by the node's innermost topology domain when the cluster
//! names it ("label gantry.dev/pool=train matches, in rack-3"). Nodes that tie keep node order
//! in the top-node table, so these are the matching nodes an explanation shows.

use gantry_policy_sdk::prelude::*;
use gantry_policy_sdk::v0_2::{self, Labels, SCORE_REASONS_MAX, Scored};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_key")]
    key: String,
    value: String,
    #[serde(default = "default_score")]
    score: u32,
}

fn default_key() -> String {
    "gantry.dev/pool".into()
}

fn default_score() -> u32 {
    MAX_SCORE
}

pub struct LabelAffinity {
    key: String,
    value: String,
    score: u32,
}

impl v0_2::ScorePolicy for LabelAffinity {
    const NAME: &'static str = "label-affinity";

    fn new(config: &str) -> Result<Self, String> {
        let config: Config =
            serde_json::from_str(config).map_err(|e| format!("bad label-affinity config: {e}"))?;
        if config.key.is_empty() || config.value.is_empty() {
            return Err("bad label-affinity config: `key` and `value` must not be empty".into());
        }
        if config.score > MAX_SCORE {
            return Err(format!(
                "bad label-affinity config: `score` is at most {MAX_SCORE}, not {}",
                config.score
            ));
        }
        Ok(Self {
            key: config.key,
            value: config.value,
            score: config.score,
        })
    }

    fn label_keys(&self) -> Vec<String> {
        vec![self.key.clone()]
    }

    fn score_all(&self, _pod: &Pod, nodes: &Nodes<'_>, labels: &Labels<'_>) -> Scored {
        let mut scored = Scored::new(nodes.len());
        // A value no node carries has no id: then nothing matches.
        let Some(wanted) = v0_2::lookup(&self.value) else {
            return scored;
        };
        for node in nodes.iter() {
            if labels.of(0, &node) != Some(wanted) {
                continue;
            }
            scored.scores[node.index()] = self.score;
            if scored.reasons.len() < SCORE_REASONS_MAX {
                let mut text = format!("label {}={} matches", self.key, self.value);
                if let Some(domain) = node
                    .domain(0)
                    .and_then(|domain| v0_2::domain_name(0, domain))
                {
                    text.push_str(", in ");
                    text.push_str(&domain);
                }
                // The host refuses a reason over 200 bytes: keep within it on long values.
                if text.len() > v0_2::REASON_TEXT_MAX_BYTES {
                    let mut cut = v0_2::REASON_TEXT_MAX_BYTES;
                    while !text.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    text.truncate(cut);
                }
                scored.reasons.push((node.index() as u32, text));
            }
        }
        scored
    }
}

gantry_policy_sdk::export_score_v0_2!(LabelAffinity);
