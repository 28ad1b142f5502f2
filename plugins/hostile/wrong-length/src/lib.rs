//! Answers with one verdict more than there are nodes. Written against the raw bindings, since
//! the SDK's per-node view cannot get the length wrong.
use gantry_policy_sdk::bindings::filter::exports::gantry::policy::filter_policy::{
    Guest, Nodes, Pod, PolicyInfo,
};

struct OffByOne;

impl Guest for OffByOne {
    fn init(_config: String) -> Result<PolicyInfo, String> {
        Ok(PolicyInfo {
            name: "hostile-wrong-length".into(),
            version: "0.1.0".into(),
            reasons: Vec::new(),
        })
    }
    fn filter(_pod: Pod, nodes: Nodes) -> Vec<u16> {
        vec![0; nodes.name.len() + 1]
    }
}

gantry_policy_sdk::bindings::filter::export!(OffByOne with_types_in gantry_policy_sdk::bindings::filter);
