//! {{name}}: a filter policy. A node fits when it is healthy and, after the pod's GPUs, still
//! has `reserve_gpus` GPUs free. Config (optional): `{"reserve_gpus": 0}`.

use gantry_policy_sdk::prelude::*;
use serde::Deserialize;

/// Reason codes: each verdict other than FITS names one, and `REASONS` gives its text.
const NOT_HEALTHY: u16 = 1;
const NOT_ENOUGH_GPUS: u16 = 2;

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ThisPolicy {
    reserve_gpus: u32,
}

impl FilterPolicy for ThisPolicy {
    const NAME: &'static str = "{{name}}";
    const REASONS: &'static [(u16, &'static str)] = &[
        (NOT_HEALTHY, "node is not healthy"),
        (NOT_ENOUGH_GPUS, "not enough free GPUs"),
    ];

    fn new(config: &str) -> Result<Self, String> {
        serde_json::from_str(config).map_err(|e| format!("{{name}} config: {e}"))
    }

    fn filter(&self, pod: &Pod, node: &Node) -> u16 {
        if node.health() != Health::Healthy {
            NOT_HEALTHY
        } else if node.gpu_free() < pod.gpus() + self.reserve_gpus {
            NOT_ENOUGH_GPUS
        } else {
            FITS
        }
    }
}

gantry_policy_sdk::export_filter!(ThisPolicy);
