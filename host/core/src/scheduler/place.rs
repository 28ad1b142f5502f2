//! The place stage: nodes for every pod of a job, from the capacities and scores the
//! evaluation left. A single pod takes the best-scored node; a gang takes the smallest
//! topology domain that holds all of it, and balloons give way to keep it in a tighter
//! domain than the free nodes alone allow ([`Scheduler::balloons_for_tighter_domain`]);
//! [`TopologyStats`] counts how often gangs ended up in one outermost domain (a block).

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::builtin;
use crate::cluster::ClusterState;
use crate::model::LevelColumn;

use super::{JobId, JobSpec, JobState, Scheduler};

/// A placement found for a job: the pods per node, and the domain it fits in.
pub(super) struct Placement {
    pub node_pods: Vec<(usize, u32)>,
    pub domain: Option<String>,
    /// The level of that domain (an index into the node table's levels, innermost first);
    /// `None` for a single pod or a gang spread over the whole cluster.
    pub level: Option<usize>,
}

/// How gangs were placed against the outermost topology level below the whole cluster (the
/// demo's blocks), for reports: a gang spread over blocks pays for it in every collective,
/// and balloons are there to give way, so a gang that one block's free and balloon-held
/// nodes could hold should land in one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologyStats {
    /// Gangs placed when one domain of that level could hold them in its free nodes and the
    /// nodes balloons held.
    pub gangs_one_domain_possible: u64,
    /// Of those, the gangs placed within one domain of that level.
    pub gangs_in_one_domain: u64,
    /// Balloons evicted by the topology rule: to keep a gang in a tighter domain than the free
    /// nodes allowed, or to give a gang that needed balloons' nodes all of them in one domain.
    pub balloons_evicted_for_topology: u64,
}

impl TopologyStats {
    /// The share of the gangs that could be in one domain that were; `None` before any.
    pub fn share_in_one_domain(&self) -> Option<f64> {
        (self.gangs_one_domain_possible > 0)
            .then(|| self.gangs_in_one_domain as f64 / self.gangs_one_domain_possible as f64)
    }
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
                level: None,
            });
        }
        let need = u64::from(spec.pods);
        let levels = &self.state.nodes.levels;
        let first_level = match spec.topology.level {
            Some(level) if spec.topology.required => level,
            _ => 0,
        };
        for (level_index, level) in levels.iter().enumerate().skip(first_level) {
            let (fit, best_score) = domain_fit(level, capacity, scores);
            // The tightest domain that holds the gang keeps bigger ones whole.
            let chosen = (0..fit.len())
                .filter(|&d| fit[d] >= need)
                .min_by(|&a, &b| fit[a].cmp(&fit[b]).then(best_score[b].cmp(&best_score[a])));
            if let Some(domain) = chosen {
                let nodes: Vec<usize> = (0..n)
                    .filter(|&i| level.node_domain[i] == domain as u32 && capacity[i] > 0)
                    .collect();
                return Some(Placement {
                    node_pods: fill(&nodes, capacity, scores, spec.pods),
                    domain: Some(format!("{} {domain}", self.level_name(level_index))),
                    level: Some(level_index),
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
            level: None,
        })
    }

    /// The balloons to evict so that a gang lands in a tighter domain than `placement` (`None`:
    /// the free nodes cannot hold it at all): at the innermost level below the placement's
    /// where one domain's free nodes and the nodes balloons hold there could take it all,
    /// that domain's balloons, in the order preemption takes them, until its free nodes alone
    /// hold the gang. Preemption picks victims over the whole cluster, so without this a gang
    /// that needs balloons' nodes is spread wherever the newest balloons ran. `capacity` is
    /// what the evaluation left (reservations masked). `None` when no tighter domain is possible, or preemption or
    /// [`super::SchedulerConfig::balloons_for_topology`] is off. Room is counted by the built-in filter (a policy's refusal shows only when the
    /// gang is placed again, and then it still has the nodes it was placed on).
    pub(super) fn balloons_for_tighter_domain(
        &self,
        id: JobId,
        spec: &JobSpec,
        placement: Option<&Placement>,
        capacity: &[u32],
        now_s: f64,
    ) -> Option<Vec<JobId>> {
        if spec.pods == 1
            || spec.balloon
            || !self.config.preemption
            || !self.config.balloons_for_topology
        {
            return None;
        }
        let levels = &self.state.nodes.levels;
        // Past the whole cluster's "level" when it was not placed at all.
        let placed_level = placement.map_or(levels.len() + 1, |p| p.level.unwrap_or(levels.len()));
        let first_level = spec
            .topology
            .level
            .filter(|_| spec.topology.required)
            .unwrap_or(0);
        if placed_level <= first_level {
            return None;
        }
        let (balloons, with_balloons_gone) = self.capacity_without_balloons(id, spec, now_s)?;
        let need = u64::from(spec.pods);
        // A required level is the only one it may take (see `place_in`).
        let last_level = if spec.topology.required {
            first_level + 1
        } else {
            placed_level
        };
        for level in &levels[first_level..last_level.min(placed_level).min(levels.len())] {
            let (possible, _) = domain_fit(level, &with_balloons_gone, &[]);
            let (free, _) = domain_fit(level, capacity, &[]);
            // Of the domains that could hold it, the one with the most free already: the
            // fewest balloons evicted.
            let Some(domain) = (0..possible.len())
                .filter(|&d| possible[d] >= need)
                .max_by(|&a, &b| free[a].cmp(&free[b]).then(b.cmp(&a)))
            else {
                continue;
            };
            let mut state = self.state.clone();
            let mut victims = Vec::new();
            for &balloon in &balloons {
                let slots = self.slots(balloon);
                if !slots
                    .iter()
                    .any(|slot| level.node_domain[slot.node as usize] == domain as u32)
                {
                    continue;
                }
                let shape = &self.job_to_entry[&balloon].spec.shape;
                for &slot in slots {
                    state.release(slot, shape);
                }
                victims.push(balloon);
                let (mut room, _) = builtin_view(spec, &state);
                self.mask_reserved(id, spec, now_s, &mut room);
                if domain_fit(level, &room, &[]).0[domain] >= need {
                    return Some(victims);
                }
            }
            return None;
        }
        None
    }

    /// The running balloons that may give way to `spec` (of its priority or lower, not placed
    /// this cycle), in the order preemption takes them, and the pods of `spec` each node could hold with all of them gone, outside
    /// the reservations of jobs ahead. `None` when there are none.
    fn capacity_without_balloons(
        &self,
        id: JobId,
        spec: &JobSpec,
        now_s: f64,
    ) -> Option<(Vec<JobId>, Vec<u32>)> {
        if self.balloons_held.jobs == 0 {
            return None;
        }
        let mut balloons: Vec<JobId> = self
            .running
            .iter()
            .copied()
            .filter(|running| {
                let entry = &self.job_to_entry[running];
                entry.spec.balloon
                    && entry.spec.priority <= spec.priority
                    && matches!(entry.state, JobState::Running { since_cycle, .. }
                        if since_cycle != self.cycle_no)
            })
            .collect();
        if balloons.is_empty() {
            return None;
        }
        // In the order preemption takes them: lowest priority, then newest, first.
        balloons.sort_by(|a, b| {
            let (a, b) = (&self.job_to_entry[a].spec, &self.job_to_entry[b].spec);
            a.priority
                .cmp(&b.priority)
                .then(b.submit_s.total_cmp(&a.submit_s))
        });
        let mut state = self.state.clone();
        for &balloon in &balloons {
            let shape = &self.job_to_entry[&balloon].spec.shape;
            for &slot in self.slots(balloon) {
                state.release(slot, shape);
            }
        }
        let (mut capacity, _) = builtin_view(spec, &state);
        self.mask_reserved(id, spec, now_s, &mut capacity);
        Some((balloons, capacity))
    }

    /// Counts a gang placed at `level` (see [`TopologyStats`]): whether one domain of the
    /// outermost level could have held it in free and balloon-held nodes, and whether it is
    /// in one. `capacity` is the room the gang was placed in.
    pub(super) fn note_gang_topology(
        &mut self,
        id: JobId,
        spec: &JobSpec,
        level: Option<usize>,
        capacity: &[u32],
        now_s: f64,
    ) {
        let levels = &self.state.nodes.levels;
        let Some(outermost) = levels.len().checked_sub(1) else {
            return;
        };
        if spec.pods == 1 || spec.balloon {
            return;
        }
        let need = u64::from(spec.pods);
        let in_one = level.is_some_and(|l| l <= outermost);
        let possible = in_one
            || self
                .capacity_without_balloons(id, spec, now_s)
                .is_some_and(|(_, room)| {
                    domain_fit(&levels[outermost], &room, &[])
                        .0
                        .iter()
                        .any(|&f| f >= need)
                })
            || domain_fit(&levels[outermost], capacity, &[])
                .0
                .iter()
                .any(|&f| f >= need);
        if possible {
            self.topology_stats.gangs_one_domain_possible += 1;
            self.topology_stats.gangs_in_one_domain += u64::from(in_one);
        }
    }

    /// How gangs were placed against the outermost topology level (see [`TopologyStats`]).
    pub fn topology_stats(&self) -> TopologyStats {
        self.topology_stats
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

/// Pods each domain of `level` holds in `capacity`, and the best score among its nodes with
/// room (`scores` may be empty: all 0).
fn domain_fit(level: &LevelColumn, capacity: &[u32], scores: &[u64]) -> (Vec<u64>, Vec<u64>) {
    let domains = level.domain_gpu_total.len();
    let mut fit = vec![0u64; domains];
    let mut best_score = vec![0u64; domains];
    for (node, &room) in capacity.iter().enumerate() {
        let domain = level.node_domain[node];
        if domain != u32::MAX && room > 0 {
            fit[domain as usize] += u64::from(room);
            let score = scores.get(node).copied().unwrap_or(0);
            best_score[domain as usize] = best_score[domain as usize].max(score);
        }
    }
    (fit, best_score)
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
