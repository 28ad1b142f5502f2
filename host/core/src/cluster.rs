//! The live node table: what is free where, kept consistent on every reservation and release.

use serde::{Deserialize, Serialize};

use crate::model::{NodeTable, PodShape};

/// Where one pod runs: a node, and for a fractional pod, the GPU it shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Slot {
    pub node: u32,
    /// The GPU index on the node for a fractional pod; `None` for whole GPUs.
    pub shared_gpu: Option<u16>,
}

/// How a GPU used whole is marked in `gpu_milli_used`, so that releasing a whole-GPU pod
/// frees a GPU it took and never one that fractional pods share.
const WHOLE: u16 = u16::MAX;

/// Milli-GPUs a GPU has free.
fn milli_free(used: u16) -> u32 {
    if used == WHOLE {
        0
    } else {
        1000 - u32::from(used.min(1000))
    }
}

/// The cluster as the scheduler sees it between cycles.
#[derive(Debug, Clone)]
pub struct ClusterState {
    pub nodes: NodeTable,
    /// Milli-GPUs in use on each GPU (`WHOLE` for a GPU a pod uses whole), flattened: node
    /// `i`'s GPUs start at `gpu_offset[i]`.
    gpu_milli_used: Vec<u16>,
    gpu_offset: Vec<u32>,
    /// Nodes changed since the start, in order. Policy adapters keep a cursor into it to
    /// refresh only what changed; `changes_base` counts entries dropped from the front.
    changes: Vec<u32>,
    changes_base: u64,
    /// `free_to_nodes[k]`: nodes with exactly `k` whole GPUs free. The scheduling queue asks it
    /// whether a parked job could fit at all before paying for an attempt.
    free_to_nodes: Vec<u32>,
    /// `largest_fraction_to_nodes[m]`: nodes whose emptiest GPU has exactly `m` milli-GPUs
    /// free. The queue's wake-up check asks it for the largest fraction free anywhere, so a
    /// parked fractional job is not retried while no GPU could hold one of its pods.
    largest_fraction_to_nodes: Vec<u32>,
    /// The highest `m` with nodes in `largest_fraction_to_nodes`, kept as it changes: the
    /// wake-up check reads it once per parked job, and scanning the counts each time cost
    /// more than the check saves.
    largest_fraction_free: u32,
    /// Milli-GPUs free on each node, summed over its GPUs: kept so that a change to one node
    /// updates `milli_free_total` without reading the others.
    node_to_milli_free: Vec<u32>,
    /// Milli-GPUs free in the whole cluster: fractional pods need at least this much between
    /// them, so the wake-up check counts against it.
    milli_free_total: u64,
    /// Releases and node changes so far: a parked job waiting for room is woken only once this
    /// moved since it was parked.
    releases: u64,
}

impl ClusterState {
    pub fn new(nodes: NodeTable) -> Self {
        let mut gpu_offset = Vec::with_capacity(nodes.len());
        let mut total = 0u32;
        for &gpus in &nodes.gpu_total {
            gpu_offset.push(total);
            total += gpus;
        }
        let mut state = Self {
            gpu_milli_used: vec![0; total as usize],
            gpu_offset,
            nodes,
            changes: Vec::new(),
            changes_base: 0,
            free_to_nodes: Vec::new(),
            largest_fraction_to_nodes: vec![0; 1001],
            largest_fraction_free: 0,
            node_to_milli_free: Vec::new(),
            milli_free_total: 0,
            releases: 0,
        };
        let most = state.nodes.gpu_total.iter().copied().max().unwrap_or(0) as usize;
        state.free_to_nodes = vec![0; most + 1];
        // `refresh` moves each node from the count the table says to the one its GPUs say.
        for node in 0..state.nodes.len() {
            let free = state.nodes.gpu_free[node].min(state.nodes.gpu_total[node]);
            state.nodes.gpu_free[node] = free;
            state.free_to_nodes[free as usize] += 1;
            let largest = state.nodes.gpu_milli_free_max[node].min(1000);
            state.nodes.gpu_milli_free_max[node] = largest;
            state.largest_fraction_to_nodes[largest as usize] += 1;
            state.largest_fraction_free = state.largest_fraction_free.max(largest);
        }
        state.node_to_milli_free = vec![0; state.nodes.len()];
        for node in 0..state.nodes.len() {
            state.refresh(node);
        }
        state.changes.clear();
        state
    }

    /// Releases and node changes so far (see [`ClusterState::release`], [`ClusterState::set_health`]).
    pub fn releases(&self) -> u64 {
        self.releases
    }

    /// How many pods of `gpus` whole GPUs each the free GPUs could hold, node by node, ignoring
    /// filters, CPU and memory: an upper bound, so `pods_fit(g) < n` proves `n` pods cannot fit.
    pub fn pods_fit(&self, gpus: u32) -> u64 {
        if gpus == 0 {
            return u64::MAX;
        }
        self.free_to_nodes
            .iter()
            .enumerate()
            .map(|(free, &nodes)| u64::from(nodes) * (free as u64 / u64::from(gpus)))
            .sum()
    }

    /// The most milli-GPUs free on any one GPU: a fractional pod asking for more fits nowhere.
    pub fn largest_gpu_fraction_free(&self) -> u32 {
        self.largest_fraction_free
    }

    /// Milli-GPUs free in the whole cluster, a whole free GPU counting 1,000: what fractional
    /// pods could share at most, ignoring filters, CPU and memory.
    pub fn gpu_milli_free_total(&self) -> u64 {
        self.milli_free_total
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    fn gpus(&self, node: usize) -> std::ops::Range<usize> {
        let start = self.gpu_offset[node] as usize;
        start..start + self.nodes.gpu_total[node] as usize
    }

    /// Recompute the node's free-GPU columns and its domains' totals from the per-GPU usage.
    fn refresh(&mut self, node: usize) {
        let range = self.gpus(node);
        // One pass over the node's GPUs: idle ones, the largest free fraction, free in all.
        let (free, max_free_milli, milli_free_sum) =
            self.gpu_milli_used[range]
                .iter()
                .fold((0u32, 0u32, 0u32), |(free, max, sum), &m| {
                    let f = milli_free(m);
                    (free + u32::from(m == 0), max.max(f), sum + f)
                });
        let old_free = self.nodes.gpu_free[node];
        self.nodes.gpu_free[node] = free;
        self.free_to_nodes[old_free as usize] -= 1;
        self.free_to_nodes[free as usize] += 1;
        let old_largest = self.nodes.gpu_milli_free_max[node];
        self.largest_fraction_to_nodes[old_largest as usize] -= 1;
        self.largest_fraction_to_nodes[max_free_milli as usize] += 1;
        if max_free_milli >= self.largest_fraction_free {
            self.largest_fraction_free = max_free_milli;
        } else if old_largest == self.largest_fraction_free
            && self.largest_fraction_to_nodes[old_largest as usize] == 0
        {
            // The last node at the top went down: find the new top, at most once per change.
            self.largest_fraction_free = self.largest_fraction_to_nodes[..old_largest as usize]
                .iter()
                .rposition(|&nodes| nodes > 0)
                .unwrap_or(0) as u32;
        }
        self.nodes.gpu_milli_free_max[node] = max_free_milli;
        let old_sum = std::mem::replace(&mut self.node_to_milli_free[node], milli_free_sum);
        self.milli_free_total =
            self.milli_free_total - u64::from(old_sum) + u64::from(milli_free_sum);
        for level in &mut self.nodes.levels {
            let domain = level.node_domain[node];
            if domain != u32::MAX {
                let d = &mut level.domain_gpu_free[domain as usize];
                *d = *d - old_free + free;
            }
        }
        self.log_change(node);
    }

    /// Logs that `node` changed. The log keeps about the last twice-the-nodes changes (at
    /// least 1,024): a cursor further back refreshes every node, which costs about what reading
    /// that many changes would, and a log this short keeps every copy of the state cheap (a
    /// preemption trial copies it per victim set; it grew with the whole run before).
    fn log_change(&mut self, node: usize) {
        self.changes.push(node as u32);
        let keep = 2 * self.nodes.len().max(512);
        if self.changes.len() > keep {
            let drop = self.changes.len() - keep / 2;
            self.changes.drain(..drop);
            self.changes_base += drop as u64;
        }
    }

    /// How many pods of `shape` fit on `node` now (resources only; filters come first).
    pub fn capacity_for(&self, node: usize, shape: &PodShape) -> u32 {
        let t = &self.nodes;
        let by_cpu = t.cpu_free_milli[node]
            .checked_div(shape.cpu_milli)
            .unwrap_or(u32::MAX);
        let by_mem = t.memory_free_mib[node]
            .checked_div(shape.memory_mib)
            .unwrap_or(u32::MAX);
        let by_gpu = if shape.gpu_milli > 0 {
            self.gpu_milli_used[self.gpus(node)]
                .iter()
                .map(|&m| milli_free(m) / shape.gpu_milli)
                .sum()
        } else {
            t.gpu_free[node].checked_div(shape.gpus).unwrap_or(u32::MAX)
        };
        let by_other = shape
            .resources
            .iter()
            .map(|&(name, asked)| {
                t.resources
                    .iter()
                    .find(|c| c.name == name)
                    .map_or(0, |c| c.free[node].checked_div(asked).unwrap_or(u32::MAX))
            })
            .min()
            .unwrap_or(u32::MAX);
        by_cpu.min(by_mem).min(by_gpu).min(by_other)
    }

    /// Take (or with `give_back`, return) what `shape` asks beyond GPUs, CPU and memory.
    fn account_resources(&mut self, node: usize, shape: &PodShape, give_back: bool) {
        for &(name, asked) in &shape.resources {
            if let Some(column) = self.nodes.resources.iter_mut().find(|c| c.name == name) {
                let free = &mut column.free[node];
                *free = if give_back {
                    free.saturating_add(asked)
                } else {
                    free.saturating_sub(asked)
                };
            }
        }
    }

    /// Reserve one pod of `shape` on `node`. The caller checked `capacity_for`.
    pub fn reserve(&mut self, node: usize, shape: &PodShape) -> Slot {
        let range = self.gpus(node);
        let shared_gpu = if shape.gpu_milli > 0 {
            // Best fit: the GPU with the least room that still holds the pod.
            let (index, used) = self.gpu_milli_used[range.clone()]
                .iter_mut()
                .enumerate()
                .filter(|(_, m)| milli_free(**m) >= shape.gpu_milli)
                .max_by_key(|(_, m)| **m)
                .expect("capacity checked before reserving");
            *used += shape.gpu_milli as u16;
            Some(index as u16)
        } else {
            let mut left = shape.gpus;
            for used in &mut self.gpu_milli_used[range] {
                if left == 0 {
                    break;
                }
                if *used == 0 {
                    *used = WHOLE;
                    left -= 1;
                }
            }
            assert_eq!(left, 0, "capacity checked before reserving");
            None
        };
        self.nodes.cpu_free_milli[node] -= shape.cpu_milli;
        self.nodes.memory_free_mib[node] -= shape.memory_mib;
        self.account_resources(node, shape, false);
        self.refresh(node);
        Slot {
            node: node as u32,
            shared_gpu,
        }
    }

    /// Give back what `reserve` took.
    pub fn release(&mut self, slot: Slot, shape: &PodShape) {
        let node = slot.node as usize;
        let range = self.gpus(node);
        match slot.shared_gpu {
            Some(index) => {
                let used = &mut self.gpu_milli_used[range][index as usize];
                *used = used.saturating_sub(shape.gpu_milli as u16);
            }
            None => {
                let mut left = shape.gpus;
                for used in self.gpu_milli_used[range].iter_mut().rev() {
                    if left == 0 {
                        break;
                    }
                    if *used == WHOLE {
                        *used = 0;
                        left -= 1;
                    }
                }
            }
        }
        self.nodes.cpu_free_milli[node] += shape.cpu_milli;
        self.nodes.memory_free_mib[node] += shape.memory_mib;
        self.account_resources(node, shape, true);
        self.releases += 1;
        self.refresh(node);
    }

    /// Mark a node's health (a health check tainting or clearing it).
    pub fn set_health(&mut self, node: usize, health: crate::model::Health) {
        self.nodes.health[node] = health as u8;
        self.releases += 1;
        self.log_change(node);
    }

    /// Nodes changed since `cursor` (from an earlier call), and the new cursor. `None` when the
    /// log no longer reaches back that far: refresh everything.
    pub fn changes_since(&self, cursor: u64) -> (Option<&[u32]>, u64) {
        let end = self.changes_base + self.changes.len() as u64;
        if cursor < self.changes_base {
            return (None, end);
        }
        let start = (cursor - self.changes_base) as usize;
        (Some(&self.changes[start.min(self.changes.len())..]), end)
    }

    /// Every GPU's milli usage is 0 or within 0..=1000, and every column matches it: the
    /// invariant audit the simulator runs after each cycle.
    pub fn audit(&self) -> Result<(), String> {
        for node in 0..self.len() {
            let gpus = &self.gpu_milli_used[self.gpus(node)];
            if let Some(m) = gpus.iter().find(|&&m| m > 1000 && m != WHOLE) {
                return Err(format!("node {node}: a GPU is {m}/1000 allocated"));
            }
            let free = gpus.iter().filter(|&&m| m == 0).count() as u32;
            if free != self.nodes.gpu_free[node] {
                return Err(format!(
                    "node {node}: gpu_free says {} but {free} GPUs are idle",
                    self.nodes.gpu_free[node]
                ));
            }
        }
        for level in &self.nodes.levels {
            let mut free = vec![0u32; level.domain_gpu_free.len()];
            for node in 0..self.len() {
                if let Some(d) = free.get_mut(level.node_domain[node] as usize) {
                    *d += self.nodes.gpu_free[node];
                }
            }
            if free != level.domain_gpu_free {
                return Err("a topology domain's free-GPU count disagrees with its nodes".into());
            }
        }
        let mut free_to_nodes = vec![0u32; self.free_to_nodes.len()];
        for &free in &self.nodes.gpu_free {
            free_to_nodes[free as usize] += 1;
        }
        if free_to_nodes != self.free_to_nodes {
            return Err("the count of nodes by free GPUs disagrees with the nodes".into());
        }
        let mut largest_fraction_to_nodes = vec![0u32; 1001];
        let mut milli_free_total = 0u64;
        for node in 0..self.len() {
            let gpus = &self.gpu_milli_used[self.gpus(node)];
            let largest = gpus.iter().map(|&m| milli_free(m)).max().unwrap_or(0);
            largest_fraction_to_nodes[largest as usize] += 1;
            milli_free_total += gpus.iter().map(|&m| u64::from(milli_free(m))).sum::<u64>();
        }
        let top = largest_fraction_to_nodes
            .iter()
            .rposition(|&nodes| nodes > 0)
            .unwrap_or(0) as u32;
        if top != self.largest_fraction_free {
            return Err(format!(
                "the largest free GPU fraction is {top}, but the count says {}",
                self.largest_fraction_free
            ));
        }
        if largest_fraction_to_nodes != self.largest_fraction_to_nodes {
            return Err(
                "the count of nodes by largest free GPU fraction disagrees with the nodes".into(),
            );
        }
        if milli_free_total != self.milli_free_total {
            return Err(format!(
                "the cluster's free milli-GPUs are {milli_free_total}, but the count says {}",
                self.milli_free_total
            ));
        }
        Ok(())
    }
}
