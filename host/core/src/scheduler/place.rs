//! The place stage: nodes for every pod of a job, from the capacities and scores the
//! evaluation left. A single pod takes the best-scored node; a gang takes the smallest
//! topology domain that holds all of it.

use std::ops::Range;

use crate::builtin;
use crate::cluster::ClusterState;

use super::{JobSpec, Scheduler};

/// A placement found for a job: the pods per node, and the domain it fits in.
pub(super) struct Placement {
    pub node_pods: Vec<(usize, u32)>,
    pub domain: Option<String>,
}

impl Scheduler {
    /// Choose nodes for every pod, or `None`. A single pod takes the best-scored node. A gang
    /// takes the smallest domain that holds all of it, innermost level first (rack, then
    /// block, then the whole cluster), honouring the job's required or preferred level.
    pub(super) fn place(
        &self,
        spec: &JobSpec,
        capacity: &[u32],
        scores: &[u64],
    ) -> Option<Placement> {
        self.place_in(
            spec,
            capacity,
            scores,
            std::slice::from_ref(&(0..capacity.len())),
        )
    }

    /// [`Scheduler::place`] where only the nodes of `searched` can have room (the ranges an
    /// evaluation covered): a single pod reads those, not the whole table. A gang's evaluation
    /// covers every node.
    pub(super) fn place_in(
        &self,
        spec: &JobSpec,
        capacity: &[u32],
        scores: &[u64],
        searched: &[Range<usize>],
    ) -> Option<Placement> {
        let n = capacity.len();
        if spec.pods == 1 {
            let best = searched
                .iter()
                .flat_map(Clone::clone)
                .filter(|&i| capacity[i] > 0)
                .min_by(|&a, &b| scores[b].cmp(&scores[a]).then(a.cmp(&b)))?;
            return Some(Placement {
                node_pods: vec![(best, 1)],
                domain: None,
            });
        }
        let need = u64::from(spec.pods);
        let levels = &self.state.nodes.levels;
        let first_level = match spec.topology.level {
            Some(level) if spec.topology.required => level,
            _ => 0,
        };
        for (level_index, level) in levels.iter().enumerate().skip(first_level) {
            let domains = level.domain_gpu_total.len();
            let mut fit = vec![0u64; domains];
            let mut best_score = vec![0u64; domains];
            for node in 0..n {
                let domain = level.node_domain[node];
                if domain != u32::MAX && capacity[node] > 0 {
                    fit[domain as usize] += u64::from(capacity[node]);
                    best_score[domain as usize] = best_score[domain as usize].max(scores[node]);
                }
            }
            // The tightest domain that holds the gang keeps bigger ones whole.
            let chosen = (0..domains)
                .filter(|&d| fit[d] >= need)
                .min_by(|&a, &b| fit[a].cmp(&fit[b]).then(best_score[b].cmp(&best_score[a])));
            if let Some(domain) = chosen {
                let nodes: Vec<usize> = (0..n)
                    .filter(|&i| level.node_domain[i] == domain as u32 && capacity[i] > 0)
                    .collect();
                return Some(Placement {
                    node_pods: fill(&nodes, capacity, scores, spec.pods),
                    domain: Some(format!("{} {domain}", self.level_name(level_index))),
                });
            }
            if spec.topology.required {
                return None;
            }
        }
        let all: Vec<usize> = (0..n).filter(|&i| capacity[i] > 0).collect();
        let room: u64 = all.iter().map(|&i| u64::from(capacity[i])).sum();
        (room >= need).then(|| Placement {
            node_pods: fill(&all, capacity, scores, spec.pods),
            domain: Some("the whole cluster".into()),
        })
    }

    /// Whether job `id` of `spec` could be placed on `state` by the built-in filter and
    /// score, outside the reservations of the jobs ahead of it (the backfill rule at `now_s`).
    pub(super) fn fits_in(
        &self,
        id: super::JobId,
        spec: &JobSpec,
        state: &ClusterState,
        now_s: f64,
    ) -> bool {
        let (mut capacity, scores) = builtin_view(spec, state);
        self.mask_reserved(id, spec, now_s, &mut capacity);
        self.place(spec, &capacity, &scores).is_some()
    }
}

/// Pods of `spec` each node of `state` holds under the built-in filter, and the built-in
/// score of each node: what placement reads when no policy takes part.
pub(super) fn builtin_view(spec: &JobSpec, state: &ClusterState) -> (Vec<u32>, Vec<u64>) {
    let codes = builtin::gpu_fit(&spec.shape, &state.nodes);
    let capacity = (0..state.len())
        .map(|i| {
            if codes[i] == 0 {
                state.capacity_for(i, &spec.shape)
            } else {
                0
            }
        })
        .collect();
    let mut scores: Vec<u64> = builtin::gpu_binpack(&spec.shape, &state.nodes)
        .into_iter()
        .map(u64::from)
        .collect();
    if let Some(preference) =
        builtin::node_preference_range(&spec.shape, &state.nodes, 0..state.len())
    {
        scores.iter_mut().zip(preference).for_each(|(s, p)| *s += p);
    }
    (capacity, scores)
}

/// Fill the best-scored nodes first, each up to its capacity, until `pods` are placed.
fn fill(nodes: &[usize], capacity: &[u32], scores: &[u64], pods: u32) -> Vec<(usize, u32)> {
    let mut order = nodes.to_vec();
    order.sort_by(|&a, &b| {
        scores[b]
            .cmp(&scores[a])
            .then(capacity[b].cmp(&capacity[a]))
            .then(a.cmp(&b))
    });
    let mut left = pods;
    let mut out = Vec::new();
    for node in order {
        if left == 0 {
            break;
        }
        let take = capacity[node].min(left);
        out.push((node, take));
        left -= take;
    }
    out
}
