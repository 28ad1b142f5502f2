//! `noop`: passes every node without reading it. `gantry bench policy` runs it to show what the
//! boundary itself costs per node (copying the columns in and the verdicts out).

use gantry_policy_sdk::bindings::filter::exports::gantry::policy::filter_policy::{
    Guest, Nodes, Pod, PolicyInfo,
};

struct Noop;

impl Guest for Noop {
    fn init(_config: String) -> Result<PolicyInfo, String> {
        Ok(PolicyInfo {
            name: "noop".into(),
            version: "0.1.0".into(),
            reasons: Vec::new(),
        })
    }
    fn filter(_pod: Pod, nodes: Nodes) -> Vec<u16> {
        vec![0; nodes.name.len()]
    }
}

gantry_policy_sdk::bindings::filter::export!(Noop with_types_in gantry_policy_sdk::bindings::filter);
