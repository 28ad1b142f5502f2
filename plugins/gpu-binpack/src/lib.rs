//! `gpu-binpack`: prefer fuller nodes and fuller topology domains, so that whole nodes and whole
//! racks stay free for large gangs. Config (all optional): `{"node_weight": 70,
//! "domain_weight": 30}`. A node's domain fullness counts its innermost level most and each
//! outer level half as much as the one inside it. Scores are 0..=100.
//!
//! The arithmetic is integer multiply-and-shift by reciprocals computed at init, so scoring a
//! node costs no division: this policy runs once per pod over every node of the cluster.

use gantry_policy_sdk::prelude::*;
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Config {
    node_weight: u32,
    domain_weight: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            node_weight: 70,
            domain_weight: 30,
        }
    }
}

pub struct GpuBinpack {
    node_weight: u64,
    domain_weight: u64,
    /// 2^32 / (node_weight + domain_weight), rounded up.
    weights_recip: u64,
}

/// 2^32 / d rounded up: `x * recip(d) >> 32` is `x / d` for the small `x` used here.
const fn recip(d: u64) -> u64 {
    (1u64 << 32).div_ceil(d)
}

/// `recip(10 * total)` for every node size up to 64 GPUs, computed at compile time.
const RECIP_10_TOTAL: [u64; 65] = {
    let mut table = [0; 65];
    let mut total = 1;
    while total <= 64 {
        table[total] = recip(10 * total as u64);
        total += 1;
    }
    table
};

/// Percent of a node in use once `asked` milli-GPUs are added (100 = the pod fills it).
fn node_full(total: u32, free: u32, asked: u32) -> u64 {
    let used = u64::from(total - free.min(total)) * 1000 + u64::from(asked);
    let recip_10_total = match RECIP_10_TOTAL.get(total as usize) {
        Some(&r) => r,
        None => recip(10 * u64::from(total)),
    };
    ((used * recip_10_total) >> 32).min(100)
}

/// Fullness of the domains a node sits in, innermost weighted most, in percent.
fn domain_full(node: &Node) -> Option<u64> {
    let (mut sum, mut parts, mut part) = (0u64, 0u64, 1u64 << 8);
    for (level, _) in node.domains() {
        sum += part * u64::from(node.domain_used_pct(level).unwrap_or(0));
        parts += part;
        part /= 2;
    }
    (parts > 0).then(|| sum / parts)
}

impl GpuBinpack {
    fn combine(&self, pod: &Pod, node: &Node, domain_full: Option<u64>) -> u32 {
        let total = node.gpu_total();
        if total == 0 {
            return 0;
        }
        let asked = if pod.gpu_milli() > 0 {
            pod.gpu_milli()
        } else {
            pod.gpus() * 1000
        };
        let node_full = node_full(total, node.gpu_free(), asked);
        let domain_full = domain_full.unwrap_or(node_full);
        let weighted = self.node_weight * node_full + self.domain_weight * domain_full;
        ((weighted * self.weights_recip) >> 32) as u32
    }
}

impl ScorePolicy for GpuBinpack {
    const NAME: &'static str = "gpu-binpack";

    fn new(config: &str) -> Result<Self, String> {
        let config: Config =
            serde_json::from_str(config).map_err(|e| format!("gpu-binpack config: {e}"))?;
        let sum = u64::from(config.node_weight) + u64::from(config.domain_weight);
        if sum == 0 {
            return Err("gpu-binpack config: node_weight and domain_weight are both 0".into());
        }
        if sum > 10_000 {
            return Err(
                "gpu-binpack config: node_weight + domain_weight must be at most 10000".into(),
            );
        }
        Ok(Self {
            node_weight: config.node_weight.into(),
            domain_weight: config.domain_weight.into(),
            weights_recip: recip(sum),
        })
    }

    fn score(&self, pod: &Pod, node: &Node) -> u32 {
        self.combine(pod, node, domain_full(node))
    }

    /// A node's domain fullness depends only on its innermost domain (topology is a tree), so
    /// it is computed once per innermost domain, not once per node.
    fn score_all(&self, pod: &Pod, nodes: &Nodes) -> Vec<u32> {
        const UNKNOWN: u8 = u8::MAX;
        let mut inner_to_full = vec![UNKNOWN; nodes.domain_count(0)];
        nodes
            .iter()
            .map(|node| {
                let full = node.domain(0).and_then(|inner| {
                    let slot = inner_to_full.get_mut(inner as usize)?;
                    if *slot == UNKNOWN {
                        // Fullness is a percent, so it fits a byte below the marker.
                        *slot = domain_full(&node).map_or(UNKNOWN - 1, |full| full as u8);
                    }
                    (*slot < UNKNOWN - 1).then_some(u64::from(*slot))
                });
                self.combine(pod, &node, full)
            })
            .collect()
    }
}

gantry_policy_sdk::export_score!(GpuBinpack);
