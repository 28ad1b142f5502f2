//! Answers `score` with 100 MB (25 million scores), whatever the node count.
use gantry_policy_sdk::bindings::score::exports::gantry::policy::score_policy::{
    Guest, Nodes, Pod, PolicyInfo,
};

struct Flood;

const SCORES: usize = 25_000_000;

impl Guest for Flood {
    fn init(_config: String) -> Result<PolicyInfo, String> {
        Ok(PolicyInfo {
            name: "hostile-huge-output".into(),
            version: "0.1.0".into(),
            reasons: Vec::new(),
        })
    }
    fn score(_pod: Pod, _nodes: Nodes) -> Vec<u32> {
        vec![50; SCORES]
    }
}

gantry_policy_sdk::bindings::score::export!(Flood with_types_in gantry_policy_sdk::bindings::score);
