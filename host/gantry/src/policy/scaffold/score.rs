//! {{name}}: a score policy. Scores each node 0 to 100 by how full its GPUs would be with the
//! pod on it: fuller first packs pods together and keeps whole nodes free for big jobs;
//! `{"spread": true}` prefers emptier nodes instead. For a gang, Gantry adds the scores of a
//! topology domain's best nodes, so packing also steers gangs into fuller racks.

use gantry_policy_sdk::prelude::*;
use serde::Deserialize;

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ThisPolicy {
    spread: bool,
}

impl ScorePolicy for ThisPolicy {
    const NAME: &'static str = "{{name}}";

    fn new(config: &str) -> Result<Self, String> {
        serde_json::from_str(config).map_err(|e| format!("{{name}} config: {e}"))
    }

    fn score(&self, pod: &Pod, node: &Node) -> u32 {
        let total = node.gpu_total();
        if total == 0 {
            return 0;
        }
        let free = node.gpu_free().min(total);
        let used_after = total - free + pod.gpus().min(free);
        let full = MAX_SCORE * used_after / total;
        if self.spread { MAX_SCORE - full } else { full }
    }
}

gantry_policy_sdk::export_score!(ThisPolicy);
