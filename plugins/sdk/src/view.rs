//! Readable views over the column lists: `node.gpu_free()` instead of `nodes.gpu_free[i]`.
//! Each accessor is one indexed load, so a loop over `Node`s compiles to a loop over columns.

use crate::NO_DOMAIN;
use crate::bindings::types::{self, Health, Sym, Taint, Toleration};

/// The pod (or gang) being placed.
pub struct Pod<'a> {
    raw: &'a types::Pod,
}

impl<'a> Pod<'a> {
    pub fn new(raw: &'a types::Pod) -> Self {
        Self { raw }
    }

    pub fn raw(&self) -> &'a types::Pod {
        self.raw
    }
    pub fn name(&self) -> Sym {
        self.raw.name
    }
    pub fn queue(&self) -> Sym {
        self.raw.queue
    }
    pub fn priority(&self) -> i32 {
        self.raw.priority
    }
    /// Whole GPUs per pod.
    pub fn gpus(&self) -> u32 {
        self.raw.gpus
    }
    /// A fraction of one GPU in milli-GPUs (1..=999), or 0 for whole GPUs.
    pub fn gpu_milli(&self) -> u32 {
        self.raw.gpu_milli
    }
    /// The required GPU type, if any.
    pub fn gpu_type(&self) -> Option<Sym> {
        (self.raw.gpu_type != 0).then_some(self.raw.gpu_type)
    }
    pub fn cpu_milli(&self) -> u64 {
        self.raw.cpu_milli
    }
    pub fn memory_mib(&self) -> u64 {
        self.raw.memory_mib
    }
    pub fn gang_size(&self) -> u32 {
        self.raw.gang_size
    }
    pub fn tolerations(&self) -> &'a [Toleration] {
        &self.raw.tolerations
    }

    /// Whether one toleration matches `taint` (Kubernetes' rule).
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

    /// Whether every taint that keeps pods off (`NoSchedule`, `NoExecute`) is tolerated.
    pub fn tolerates_all(&self, taints: &[Taint]) -> bool {
        taints.iter().all(|taint| {
            taint.effect == types::TaintEffect::PreferNoSchedule || self.tolerates(taint)
        })
    }
}

/// All candidate nodes of one call.
#[derive(Clone, Copy)]
pub struct Nodes<'a> {
    raw: &'a types::Nodes,
}

impl<'a> Nodes<'a> {
    pub fn new(raw: &'a types::Nodes) -> Self {
        Self { raw }
    }

    pub fn raw(&self) -> &'a types::Nodes {
        self.raw
    }

    pub fn len(&self) -> usize {
        self.raw.name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.raw.name.is_empty()
    }

    pub fn get(&self, index: usize) -> Node<'a> {
        Node {
            nodes: self.raw,
            index,
        }
    }

    pub fn iter(&self) -> NodeIter<'a> {
        NodeIter {
            nodes: self.raw,
            next: 0,
            len: self.len(),
        }
    }

    /// The index of the level called `name` (for example "rack"), innermost first.
    pub fn level(&self, name: &str) -> Option<usize> {
        let sym = crate::lookup(name)?;
        self.raw.levels.iter().position(|level| level.name == sym)
    }
}

pub struct NodeIter<'a> {
    nodes: &'a types::Nodes,
    next: usize,
    len: usize,
}

impl<'a> Iterator for NodeIter<'a> {
    type Item = Node<'a>;

    fn next(&mut self) -> Option<Node<'a>> {
        (self.next < self.len).then(|| {
            let node = Node {
                nodes: self.nodes,
                index: self.next,
            };
            self.next += 1;
            node
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.len - self.next;
        (left, Some(left))
    }
}

impl ExactSizeIterator for NodeIter<'_> {}

/// One candidate node.
#[derive(Clone, Copy)]
pub struct Node<'a> {
    nodes: &'a types::Nodes,
    index: usize,
}

impl<'a> Node<'a> {
    /// Position in the call's node list.
    pub fn index(&self) -> usize {
        self.index
    }
    pub fn name(&self) -> Sym {
        self.nodes.name[self.index]
    }
    pub fn gpu_total(&self) -> u32 {
        self.nodes.gpu_total[self.index]
    }
    pub fn gpu_free(&self) -> u32 {
        self.nodes.gpu_free[self.index]
    }
    pub fn gpu_milli_free_max(&self) -> u32 {
        self.nodes.gpu_milli_free_max[self.index]
    }
    pub fn gpu_type(&self) -> Sym {
        self.nodes.gpu_type[self.index]
    }
    pub fn cpu_free_milli(&self) -> u64 {
        self.nodes.cpu_free_milli[self.index]
    }
    pub fn memory_free_mib(&self) -> u64 {
        self.nodes.memory_free_mib[self.index]
    }
    /// Unknown codes read as `NotReady`, so a newer host never makes a node look healthy.
    pub fn health(&self) -> Health {
        match self.nodes.health[self.index] {
            0 => Health::Healthy,
            2 => Health::Unhealthy,
            3 => Health::Preflight,
            4 => Health::Cordoned,
            _ => Health::NotReady,
        }
    }
    pub fn taints(&self) -> &'a [Taint] {
        let set = self.nodes.taint_set[self.index] as usize;
        self.nodes.taint_sets.get(set).map_or(&[], Vec::as_slice)
    }
    /// The node's domain at topology level `level` (an index into `levels`), if any.
    pub fn domain(&self, level: usize) -> Option<u32> {
        let domain = *self.nodes.levels.get(level)?.node_domain.get(self.index)?;
        (domain != NO_DOMAIN).then_some(domain)
    }
    /// Free and total GPUs of the node's domain at `level`, over the whole cluster.
    pub fn domain_gpus(&self, level: usize) -> Option<(u32, u32)> {
        let domain = self.domain(level)? as usize;
        let level = &self.nodes.levels[level];
        Some((
            *level.domain_gpu_free.get(domain)?,
            *level.domain_gpu_total.get(domain)?,
        ))
    }
    /// Whether a pod of this shape fits the node's free GPUs (whole or fractional).
    pub fn has_gpus_for(&self, pod: &Pod) -> bool {
        if pod.gpu_milli() > 0 {
            self.gpu_milli_free_max() >= pod.gpu_milli()
        } else {
            self.gpu_free() >= pod.gpus()
        }
    }
}
