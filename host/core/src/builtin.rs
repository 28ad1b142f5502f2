//! The built-in filter and score: the same logic as the example `gpu-fit` and `gpu-binpack`
//! policies, in native Rust. The cycle always runs the built-in filter (a pod never goes where
//! it does not fit); the built-in score ranks when no score policy is active. `gantry bench
//! policy` also uses them as the native twins the Wasm policies are measured against.

use std::ops::Range;

use crate::affinity::ChunkAffinity;
use crate::model::{Health, NodeTable, PodShape};

/// The built-in filter's reason codes, as `gpu-fit` declares them.
pub const NOT_HEALTHY: u16 = 1;
pub const WRONG_GPU_TYPE: u16 = 2;
pub const NOT_ENOUGH_GPUS: u16 = 3;
pub const TAINT_NOT_TOLERATED: u16 = 4;
pub const NOT_ENOUGH_CPU_OR_MEMORY: u16 = 5;
pub const NODE_AFFINITY_MISMATCH: u16 = 6;
/// The pod asks for a resource (beyond GPUs, CPU and memory) that no node offers.
pub const RESOURCE_NOWHERE: u16 = 7;
/// The node failed under this job not long ago: the job avoids it for a while (the
/// scheduler's per-job bad-node list; no policy returns it).
pub const FAILED_UNDER_JOB: u16 = 15;
/// Its text.
pub const FAILED_UNDER_JOB_TEXT: &str = "node failed under this job (avoided for a while)";
/// `RESOURCE_SHORT + c`: not enough of [`NodeTable::resources`]`[c]`.
pub const RESOURCE_SHORT: u16 = 16;

/// Texts of the fixed built-in reason codes, indexed by code; see [`reason_text`] for all.
pub const FILTER_REASONS: [&str; 8] = [
    "fits",
    "node not ready or not healthy",
    "GPU type does not match",
    "Insufficient nvidia.com/gpu",
    "node has a taint the pod does not tolerate",
    "Insufficient cpu or memory",
    "node(s) didn't match Pod's node affinity/selector",
    "the pod asks for a resource no node offers",
];

/// The text of any built-in reason code: "Insufficient rdma/hca" names the resource, as
/// kube-scheduler does.
pub fn reason_text(code: u16, t: &NodeTable, resolve: impl Fn(crate::Sym) -> String) -> String {
    match FILTER_REASONS.get(code as usize) {
        Some(text) => (*text).to_string(),
        None if code == FAILED_UNDER_JOB => FAILED_UNDER_JOB_TEXT.to_string(),
        None => t
            .resources
            .get(usize::from(code.saturating_sub(RESOURCE_SHORT)))
            .map_or_else(
                || "rejected".to_string(),
                |column| format!("Insufficient {}", resolve(column.name)),
            ),
    }
}

/// One reason code per node: 0 fits.
pub fn gpu_fit(pod: &PodShape, t: &NodeTable) -> Vec<u16> {
    gpu_fit_range(pod, t, 0..t.len())
}

/// One reason code per node of `nodes`.
pub fn gpu_fit_range(pod: &PodShape, t: &NodeTable, nodes: Range<usize>) -> Vec<u16> {
    gpu_fit_chunk(pod, t, nodes, None)
}

/// One reason code per node of `nodes`, with what the pod's affinity says about them when the
/// caller knows it already ([`crate::AffinityIndex`]); otherwise each node's labels are read.
pub fn gpu_fit_chunk(
    pod: &PodShape,
    t: &NodeTable,
    nodes: Range<usize>,
    known: Option<&ChunkAffinity>,
) -> Vec<u16> {
    let fit = Fit::new(pod, t);
    match (&pod.node_affinity, known) {
        (None, _) => nodes.map(|i| fit.code(i, true)).collect(),
        (Some(_), Some(chunk)) => {
            let start = nodes.start;
            nodes
                .map(|i| fit.code(i, chunk.allows(i - start)))
                .collect()
        }
        (Some(affinity), None) => nodes
            .map(|i| fit.code(i, affinity.allows(t.labels(i), t.name[i])))
            .collect(),
    }
}

/// One pod's built-in filter over one table, with its extra resources' columns looked up once
/// rather than per node.
struct Fit<'a> {
    pod: &'a PodShape,
    t: &'a NodeTable,
    /// Per resource the pod asks beyond GPUs, CPU and memory: its column (`None`: no node
    /// offers it) and the amount.
    columns: Vec<(Option<&'a [u32]>, u32, u16)>,
}

impl<'a> Fit<'a> {
    fn new(pod: &'a PodShape, t: &'a NodeTable) -> Self {
        let columns = pod
            .resources
            .iter()
            .map(
                |&(name, asked)| match t.resources.iter().position(|c| c.name == name) {
                    Some(c) => (
                        Some(t.resources[c].free.as_slice()),
                        asked,
                        u16::try_from(c)
                            .ok()
                            .and_then(|c| c.checked_add(RESOURCE_SHORT))
                            .unwrap_or(RESOURCE_NOWHERE),
                    ),
                    None => (None, asked, RESOURCE_NOWHERE),
                },
            )
            .collect();
        Self { pod, t, columns }
    }

    /// `allowed`: whether the pod's node affinity lets it onto node `i`.
    #[inline]
    fn code(&self, i: usize, allowed: bool) -> u16 {
        let (pod, t) = (self.pod, self.t);
        let has_gpus = if pod.gpu_milli > 0 {
            t.gpu_milli_free_max[i] >= pod.gpu_milli
        } else {
            t.gpu_free[i] >= pod.gpus
        };
        if t.health[i] != Health::Healthy as u8 {
            NOT_HEALTHY
        } else if !allowed {
            NODE_AFFINITY_MISMATCH
        } else if pod.gpu_type != 0 && pod.gpu_type != t.gpu_type[i] {
            WRONG_GPU_TYPE
        } else if !has_gpus {
            NOT_ENOUGH_GPUS
        } else if t.cpu_free_milli[i] < pod.cpu_milli || t.memory_free_mib[i] < pod.memory_mib {
            NOT_ENOUGH_CPU_OR_MEMORY
        } else if let Some(&(_, _, code)) = self
            .columns
            .iter()
            .find(|(column, asked, _)| column.is_none_or(|free| free[i] < *asked))
        {
            code
        } else if !pod.tolerates_all(t.taints(i)) {
            TAINT_NOT_TOLERATED
        } else {
            0
        }
    }
}

/// Weight of the preferred-node-affinity part beside a score policy of weight 1, as
/// kube-scheduler's default profile weighs its NodeAffinity score plugin.
pub const NODE_AFFINITY_WEIGHT: u64 = 2;

/// The preferred-node-affinity part of each node's score in `nodes`: the weights of the
/// preferred terms it meets, scaled to 0..=100 and weighted by [`NODE_AFFINITY_WEIGHT`].
/// `None` when the pod prefers nothing, so most pods pay nothing.
pub fn node_preference_range(
    pod: &PodShape,
    t: &NodeTable,
    nodes: Range<usize>,
) -> Option<Vec<u64>> {
    node_preference_chunk(pod, t, nodes, None)
}

/// [`node_preference_range`], from what the caller knows of the chunk already when it does.
pub fn node_preference_chunk(
    pod: &PodShape,
    t: &NodeTable,
    nodes: Range<usize>,
    known: Option<&ChunkAffinity>,
) -> Option<Vec<u64>> {
    let affinity = pod.node_affinity.as_ref()?;
    if let Some(chunk) = known {
        let start = nodes.start;
        return chunk.prefers().then(|| {
            nodes
                .map(|i| u64::from(chunk.preference(i - start).unwrap_or(0)) * NODE_AFFINITY_WEIGHT)
                .collect()
        });
    }
    let max = u64::from(affinity.preference_max());
    (max > 0).then(|| {
        nodes
            .map(|i| {
                u64::from(affinity.preference(t.labels(i), t.name[i])) * 100 / max
                    * NODE_AFFINITY_WEIGHT
            })
            .collect()
    })
}

/// 2^32 / d rounded up: `x * recip(d) >> 32` is `x / d` for the small `x` used here.
const fn recip(d: u64) -> u64 {
    (1u64 << 32).div_ceil(d)
}

const RECIP_10_TOTAL: [u64; 65] = {
    let mut table = [0; 65];
    let mut total = 1;
    while total <= 64 {
        table[total] = recip(10 * total as u64);
        total += 1;
    }
    table
};

/// Bin-packing scores in 0..=100, exactly as `gpu-binpack` computes them with its default
/// weights (70 for the node, 30 for its domains).
pub fn gpu_binpack(pod: &PodShape, t: &NodeTable) -> Vec<u32> {
    binpack_with(pod, t, 0..t.len(), 70, 30)
}

/// [`gpu_binpack`] for the nodes of `nodes` only.
pub fn gpu_binpack_range(pod: &PodShape, t: &NodeTable, nodes: Range<usize>) -> Vec<u32> {
    binpack_with(pod, t, nodes, 70, 30)
}

/// Least-allocated spreading (kube-scheduler's default): emptier nodes score higher.
pub fn least_allocated(pod: &PodShape, t: &NodeTable) -> Vec<u32> {
    binpack_with(pod, t, 0..t.len(), 1, 0)
        .into_iter()
        .map(|full| 100 - full.min(100))
        .collect()
}

fn binpack_with(
    pod: &PodShape,
    t: &NodeTable,
    nodes: Range<usize>,
    node_weight: u64,
    domain_weight: u64,
) -> Vec<u32> {
    let weights_recip = recip(node_weight + domain_weight);
    let level_pct: Vec<Vec<u64>> = t
        .levels
        .iter()
        .map(|level| {
            level
                .domain_gpu_total
                .iter()
                .zip(&level.domain_gpu_free)
                .map(|(&total, &free)| {
                    u64::from(
                        ((total - free.min(total)) * 100)
                            .checked_div(total)
                            .unwrap_or(0),
                    )
                })
                .collect()
        })
        .collect();
    let domain_full = |node: usize| {
        let (mut sum, mut parts, mut part) = (0u64, 0u64, 1u64 << 8);
        for (level, pct) in t.levels.iter().zip(&level_pct) {
            let domain = level.node_domain[node];
            if domain == u32::MAX {
                break;
            }
            sum += part * pct[domain as usize];
            parts += part;
            part /= 2;
        }
        (parts > 0).then(|| sum / parts)
    };
    let asked = u64::from(if pod.gpu_milli > 0 {
        pod.gpu_milli
    } else {
        pod.gpus * 1000
    });
    const UNKNOWN: u8 = u8::MAX;
    let mut inner_to_full = vec![UNKNOWN; t.levels.first().map_or(0, |l| l.domain_gpu_total.len())];
    nodes
        .map(|i| {
            let total = t.gpu_total[i];
            if total == 0 {
                return 0;
            }
            let full = match t.levels.first().map(|level| level.node_domain[i]) {
                None | Some(u32::MAX) => None,
                Some(inner) => inner_to_full.get_mut(inner as usize).and_then(|slot| {
                    if *slot == UNKNOWN {
                        *slot = domain_full(i).map_or(UNKNOWN - 1, |full| full as u8);
                    }
                    (*slot < UNKNOWN - 1).then_some(u64::from(*slot))
                }),
            };
            let used = u64::from(total - t.gpu_free[i].min(total)) * 1000 + asked;
            let recip_10_total = match RECIP_10_TOTAL.get(total as usize) {
                Some(&r) => r,
                None => recip(10 * u64::from(total)),
            };
            let node_full = ((used * recip_10_total) >> 32).min(100);
            let domain_full = full.unwrap_or(node_full);
            let weighted = node_weight * node_full + domain_weight * domain_full;
            ((weighted * weights_recip) >> 32) as u32
        })
        .collect()
}
