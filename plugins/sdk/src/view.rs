//! Readable views over the column lists: `node.gpu_free()` instead of `nodes.gpu_free[i]`.
//! Each accessor is one indexed load, so a loop over `Node`s compiles to a loop over columns.

use std::cell::OnceCell;

use crate::NO_DOMAIN;
use crate::bindings::types::{self, Health, Sym, Taint, Toleration};

/// The pod (or gang) being placed.
pub struct Pod<'a> {
    raw: &'a types::Pod,
}

impl<'a> Pod<'a> {
    #[inline]
    pub fn new(raw: &'a types::Pod) -> Self {
        Self { raw }
    }

    #[inline]
    pub fn raw(&self) -> &'a types::Pod {
        self.raw
    }
    #[inline]
    pub fn name(&self) -> Sym {
        self.raw.name
    }
    #[inline]
    pub fn queue(&self) -> Sym {
        self.raw.queue
    }
    #[inline]
    pub fn priority(&self) -> i32 {
        self.raw.priority
    }
    /// Whole GPUs per pod.
    #[inline]
    pub fn gpus(&self) -> u32 {
        self.raw.gpus
    }
    /// A fraction of one GPU in milli-GPUs (1..=999), or 0 for whole GPUs.
    #[inline]
    pub fn gpu_milli(&self) -> u32 {
        self.raw.gpu_milli
    }
    /// The required GPU type, if any.
    #[inline]
    pub fn gpu_type(&self) -> Option<Sym> {
        (self.raw.gpu_type != 0).then_some(self.raw.gpu_type)
    }
    #[inline]
    pub fn cpu_milli(&self) -> u32 {
        self.raw.cpu_milli
    }
    #[inline]
    pub fn memory_mib(&self) -> u32 {
        self.raw.memory_mib
    }
    #[inline]
    pub fn gang_size(&self) -> u32 {
        self.raw.gang_size
    }
    #[inline]
    pub fn tolerations(&self) -> &'a [Toleration] {
        &self.raw.tolerations
    }

    /// Whether one toleration matches `taint` (Kubernetes' rule).
    #[inline]
    pub fn tolerates(&self, taint: &Taint) -> bool {
        self.raw.tolerations.iter().any(|t| {
            let key_ok = if t.key == 0 {
                t.exists
            } else {
                t.key == taint.key
            };
            key_ok
                && (t.exists || t.value == taint.value)
                && t.effect.is_none_or(|e| e == taint.effect)
        })
    }

    /// Whether every taint that keeps pods off (`NoSchedule`, `NoExecute`) is tolerated. Most
    /// nodes have no taints: that case stays inline in a policy's per-node loop.
    #[inline]
    pub fn tolerates_all(&self, taints: &[Taint]) -> bool {
        taints.is_empty() || self.tolerates_every(taints)
    }

    #[cold]
    #[inline(never)]
    fn tolerates_every(&self, taints: &[Taint]) -> bool {
        taints.iter().all(|taint| {
            taint.effect == types::TaintEffect::PreferNoSchedule || self.tolerates(taint)
        })
    }
}

/// All candidate nodes of one call. Each column is sliced to the node count once, here, so the
/// per-node accessors below compile to plain loads without bounds checks.
pub struct Nodes<'a> {
    raw: &'a types::Nodes,
    name: &'a [Sym],
    gpu_total: &'a [u32],
    gpu_free: &'a [u32],
    gpu_milli_free_max: &'a [u32],
    gpu_type: &'a [Sym],
    cpu_free_milli: &'a [u32],
    memory_free_mib: &'a [u32],
    health: &'a [u8],
    taint_set: &'a [u32],
    /// Per level, each node's domain, sliced like the columns above.
    node_domain: Vec<&'a [u32]>,
    /// Per level, per domain: percent of the domain's GPUs in use. Computed on first use, once
    /// per call, so a score that ranks by domain fullness pays per domain, not per node.
    domain_used_pct: Vec<OnceCell<Vec<u32>>>,
}

impl<'a> Nodes<'a> {
    /// Panics (a trap, for the host) if the host sent columns of unequal length.
    #[inline]
    pub fn new(raw: &'a types::Nodes) -> Self {
        let n = raw.name.len();
        Self {
            raw,
            name: &raw.name[..n],
            gpu_total: &raw.gpu_total[..n],
            gpu_free: &raw.gpu_free[..n],
            gpu_milli_free_max: &raw.gpu_milli_free_max[..n],
            gpu_type: &raw.gpu_type[..n],
            cpu_free_milli: &raw.cpu_free_milli[..n],
            memory_free_mib: &raw.memory_free_mib[..n],
            health: &raw.health[..n],
            taint_set: &raw.taint_set[..n],
            node_domain: raw
                .levels
                .iter()
                .map(|level| &level.node_domain[..n])
                .collect(),
            domain_used_pct: raw.levels.iter().map(|_| OnceCell::new()).collect(),
        }
    }

    #[inline]
    pub fn raw(&self) -> &'a types::Nodes {
        self.raw
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.name.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.name.is_empty()
    }

    #[inline]
    pub fn get(&self, index: usize) -> Node<'_, 'a> {
        Node { nodes: self, index }
    }

    #[inline]
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Node<'_, 'a>> {
        (0..self.len()).map(|index| Node { nodes: self, index })
    }

    /// The number of topology levels, innermost first.
    #[inline]
    pub fn levels(&self) -> usize {
        self.raw.levels.len()
    }

    /// The number of domains at `level` (domain ids run from 0 to this, exclusive).
    #[inline]
    pub fn domain_count(&self, level: usize) -> usize {
        self.raw
            .levels
            .get(level)
            .map_or(0, |level| level.domain_gpu_total.len())
    }

    /// The index of the level called `name` (for example "rack").
    #[inline]
    pub fn level(&self, name: &str) -> Option<usize> {
        let sym = crate::lookup(name)?;
        self.raw.levels.iter().position(|level| level.name == sym)
    }

    /// Per domain at `level`: percent of its GPUs in use (0..=100).
    #[inline]
    pub fn domain_used_pct(&self, level: usize) -> &[u32] {
        self.domain_used_pct[level].get_or_init(|| {
            let level = &self.raw.levels[level];
            level
                .domain_gpu_total
                .iter()
                .zip(&level.domain_gpu_free)
                .map(|(&total, &free)| {
                    ((total - free.min(total)) * 100)
                        .checked_div(total)
                        .unwrap_or(0)
                })
                .collect()
        })
    }
}

/// One candidate node.
#[derive(Clone, Copy)]
pub struct Node<'n, 'a> {
    nodes: &'n Nodes<'a>,
    index: usize,
}

impl<'n, 'a> Node<'n, 'a> {
    /// Position in the call's node list.
    #[inline]
    pub fn index(&self) -> usize {
        self.index
    }
    #[inline]
    pub fn name(&self) -> Sym {
        self.nodes.name[self.index]
    }
    #[inline]
    pub fn gpu_total(&self) -> u32 {
        self.nodes.gpu_total[self.index]
    }
    #[inline]
    pub fn gpu_free(&self) -> u32 {
        self.nodes.gpu_free[self.index]
    }
    #[inline]
    pub fn gpu_milli_free_max(&self) -> u32 {
        self.nodes.gpu_milli_free_max[self.index]
    }
    #[inline]
    pub fn gpu_type(&self) -> Sym {
        self.nodes.gpu_type[self.index]
    }
    #[inline]
    pub fn cpu_free_milli(&self) -> u32 {
        self.nodes.cpu_free_milli[self.index]
    }
    #[inline]
    pub fn memory_free_mib(&self) -> u32 {
        self.nodes.memory_free_mib[self.index]
    }
    /// Unknown codes read as `NotReady`, so a newer host never makes a node look healthy.
    #[inline]
    pub fn health(&self) -> Health {
        match self.nodes.health[self.index] {
            0 => Health::Healthy,
            2 => Health::Unhealthy,
            3 => Health::Preflight,
            4 => Health::Cordoned,
            _ => Health::NotReady,
        }
    }
    /// The node's taints. Most nodes have none (taint set 0), which costs one load.
    #[inline]
    pub fn taints(&self) -> &'a [Taint] {
        match self.nodes.taint_set[self.index] {
            0 => &[],
            set => self
                .nodes
                .raw
                .taint_sets
                .get(set as usize)
                .map_or(&[], Vec::as_slice),
        }
    }
    /// The node's domain at topology level `level` (an index, innermost first), if any.
    #[inline]
    pub fn domain(&self, level: usize) -> Option<u32> {
        let domain = self.nodes.node_domain.get(level)?[self.index];
        (domain != NO_DOMAIN).then_some(domain)
    }
    /// The node's domain at each level in turn, innermost first, up to the first level it
    /// has no domain at.
    #[inline]
    pub fn domains(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        (0..self.nodes.levels()).map_while(|level| Some((level, self.domain(level)?)))
    }
    /// Free and total GPUs of the node's domain at `level`, over the whole cluster.
    #[inline]
    pub fn domain_gpus(&self, level: usize) -> Option<(u32, u32)> {
        let domain = self.domain(level)? as usize;
        let level = &self.nodes.raw.levels[level];
        Some((
            *level.domain_gpu_free.get(domain)?,
            *level.domain_gpu_total.get(domain)?,
        ))
    }
    /// Percent of the GPUs in use in the node's domain at `level` (0..=100), if it has one.
    #[inline]
    pub fn domain_used_pct(&self, level: usize) -> Option<u32> {
        let domain = self.domain(level)? as usize;
        self.nodes.domain_used_pct(level).get(domain).copied()
    }
    /// Whether a pod of this shape fits the node's free GPUs (whole or fractional).
    #[inline]
    pub fn has_gpus_for(&self, pod: &Pod) -> bool {
        if pod.gpu_milli() > 0 {
            self.gpu_milli_free_max() >= pod.gpu_milli()
        } else {
            self.gpu_free() >= pod.gpus()
        }
    }
}
