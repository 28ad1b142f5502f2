//! `gpu-binpack`: prefer fuller nodes and fuller topology domains, so that whole nodes and whole
//! racks stay free for large gangs. Config (all optional): `{"node_weight": 70,
//! "domain_weight": 30}`; domain fullness counts the innermost level most and each outer level
//! half as much as the one inside it.

use gantry_policy_sdk::prelude::*;
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuBinpack {
    node_weight: u32,
    domain_weight: u32,
}

impl Default for GpuBinpack {
    fn default() -> Self {
        Self {
            node_weight: 70,
            domain_weight: 30,
        }
    }
}

impl ScorePolicy for GpuBinpack {
    const NAME: &'static str = "gpu-binpack";

    fn new(config: &str) -> Result<Self, String> {
        let policy: Self =
            serde_json::from_str(config).map_err(|e| format!("gpu-binpack config: {e}"))?;
        if policy.node_weight + policy.domain_weight == 0 {
            return Err("gpu-binpack config: node_weight and domain_weight are both 0".into());
        }
        Ok(policy)
    }

    fn score(&self, pod: &Pod, node: &Node) -> u32 {
        let total = node.gpu_total();
        if total == 0 {
            return 0;
        }
        // Fullness after placing the pod, in percent: 100 means the pod fills the node.
        let asked_milli = if pod.gpu_milli() > 0 {
            pod.gpu_milli()
        } else {
            pod.gpus() * 1000
        };
        let used_milli = (total - node.gpu_free().min(total)) * 1000 + asked_milli;
        let node_full = (used_milli / total / 10).min(100);

        let (mut domain_full, mut domain_parts, mut part) = (0, 0, 64);
        let mut level = 0;
        while let Some((free, dtotal)) = node.domain_gpus(level) {
            if dtotal > 0 {
                domain_full += part * (dtotal - free.min(dtotal)) * 100 / dtotal;
                domain_parts += part;
            }
            part /= 2;
            level += 1;
        }
        let domain_full = if domain_parts > 0 {
            domain_full / domain_parts
        } else {
            node_full
        };
        (self.node_weight * node_full + self.domain_weight * domain_full)
            / (self.node_weight + self.domain_weight)
    }
}

gantry_policy_sdk::export_score!(GpuBinpack);
