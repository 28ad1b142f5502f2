use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::affinity::{NodeAffinity, NodeLabel};
use crate::symbols::Sym;

/// Node health as the scheduler sees it. Only `Healthy` nodes take new pods; `Preflight` marks a
/// node not yet verified by health checks, where a gang must never land.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[repr(u8)]
pub enum Health {
    Healthy = 0,
    NotReady = 1,
    Unhealthy = 2,
    Preflight = 3,
    Cordoned = 4,
}

impl Health {
    pub fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            0 => Self::Healthy,
            1 => Self::NotReady,
            2 => Self::Unhealthy,
            3 => Self::Preflight,
            4 => Self::Cordoned,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

/// A node taint with interned key and value (value 0 = none), as Kubernetes defines it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Taint {
    pub key: Sym,
    pub value: Sym,
    pub effect: TaintEffect,
}

/// A pod's toleration. `key` 0 with `exists` tolerates everything; `effect` `None` any effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Toleration {
    pub key: Sym,
    pub exists: bool,
    pub value: Sym,
    pub effect: Option<TaintEffect>,
}

impl Toleration {
    /// Kubernetes' matching rule: same key (or empty key with Exists), same value unless Exists,
    /// and same effect unless the toleration names none.
    pub fn tolerates(&self, taint: &Taint) -> bool {
        let key_ok = if self.key == 0 {
            self.exists
        } else {
            self.key == taint.key
        };
        let value_ok = self.exists || self.value == taint.value;
        let effect_ok = self.effect.is_none_or(|effect| effect == taint.effect);
        key_ok && value_ok && effect_ok
    }
}

/// One topology level over the node table (for example rack or block).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LevelColumn {
    pub name: Sym,
    /// Per node, its domain id at this level, or `u32::MAX` when it has none.
    pub node_domain: Vec<u32>,
    /// Per domain, free whole GPUs across all its nodes.
    pub domain_gpu_free: Vec<u32>,
    /// Per domain, total GPUs across all its nodes.
    pub domain_gpu_total: Vec<u32>,
    /// Per domain, its name interned (the value of the label the level is read from, say
    /// "rack-12"), or 0 where the source named none; empty when it named none at all. What a
    /// 0.2.0 policy's `host.domain-name` answers. Absent from tables stored before it.
    #[serde(default)]
    pub domain_name: Vec<Sym>,
}

impl LevelColumn {
    /// A level from each node's domain id (`u32::MAX` for none), with each domain's free and
    /// total GPUs summed from `table`'s columns.
    pub fn from_node_domains(name: Sym, node_domain: Vec<u32>, table: &NodeTable) -> Self {
        let domains = node_domain
            .iter()
            .filter(|&&d| d != u32::MAX)
            .max()
            .map_or(0, |&d| d as usize + 1);
        let mut level = Self {
            name,
            node_domain,
            domain_gpu_free: vec![0; domains],
            domain_gpu_total: vec![0; domains],
            domain_name: Vec::new(),
        };
        for (node, &domain) in level.node_domain.iter().enumerate() {
            if domain != u32::MAX {
                level.domain_gpu_free[domain as usize] += table.gpu_free[node];
                level.domain_gpu_total[domain as usize] += table.gpu_total[node];
            }
        }
        level
    }
}

/// The cluster's nodes as columns: entry `i` of every vector describes node `i`. Columns, not
/// rows, because policies scan one or two attributes over thousands of nodes, and because this
/// is the layout that crosses the Wasm boundary at a few nanoseconds per node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeTable {
    pub name: Vec<Sym>,
    pub gpu_total: Vec<u32>,
    pub gpu_free: Vec<u32>,
    /// Most milli-GPUs free on one GPU of the node (1000 when a GPU is wholly free).
    pub gpu_milli_free_max: Vec<u32>,
    pub gpu_type: Vec<Sym>,
    pub cpu_free_milli: Vec<u32>,
    pub memory_free_mib: Vec<u32>,
    /// `Health as u8`, so the column crosses as bytes.
    pub health: Vec<u8>,
    /// Index into `taint_sets`.
    pub taint_set: Vec<u32>,
    /// Distinct taint sets; entry 0 is the empty set.
    pub taint_sets: Vec<Vec<Taint>>,
    /// Innermost level first.
    pub levels: Vec<LevelColumn>,
    /// Per node, its labels sorted by key (shared, so a copy of the table costs a count per
    /// node). Empty when the source gives none; then only selector-free pods match.
    pub labels: Vec<Arc<[NodeLabel]>>,
    /// Resources beyond GPUs, CPU and memory that a source accounts: pod slots, ephemeral
    /// storage, extended resources such as RDMA devices. A pod asking for one no column names
    /// fits nowhere, as in Kubernetes.
    pub resources: Vec<ResourceColumn>,
}

/// One resource beyond GPUs, CPU and memory, free per node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceColumn {
    /// As Kubernetes names it: `pods`, `ephemeral-storage`, `rdma/hca`.
    pub name: Sym,
    /// Per node, what is free: a count, or MiB for `ephemeral-storage`.
    pub free: Vec<u32>,
}

/// One node as a source reads it: what [`NodeTable::push`] appends to every per-node column.
/// Topology levels, labels and resource columns are the source's to fill, since their domains
/// and names come from all the nodes at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    pub name: Sym,
    pub gpu_total: u32,
    pub gpu_free: u32,
    /// Most milli-GPUs free on one GPU (1000 when a GPU is wholly free).
    pub gpu_milli_free_max: u32,
    pub gpu_type: Sym,
    pub cpu_free_milli: u32,
    pub memory_free_mib: u32,
    pub health: Health,
    /// In any order: the table keeps each distinct set once.
    pub taints: Vec<Taint>,
}

impl NodeRow {
    /// A healthy, untainted node with all of its `gpus` free.
    pub fn new(
        name: Sym,
        gpus: u32,
        gpu_type: Sym,
        cpu_free_milli: u32,
        memory_free_mib: u32,
    ) -> Self {
        Self {
            name,
            gpu_total: gpus,
            gpu_free: gpus,
            gpu_milli_free_max: if gpus > 0 { 1000 } else { 0 },
            gpu_type,
            cpu_free_milli,
            memory_free_mib,
            health: Health::Healthy,
            taints: Vec::new(),
        }
    }
}

impl NodeTable {
    /// Appends `row` as the next node, returning its index: the one way every source (cluster
    /// spec, Kubernetes nodes, policy test cases, samples) fills the per-node columns, so a
    /// column added later is filled everywhere. Its taint set is shared with any node that has
    /// the same taints (set 0 is the empty set).
    pub fn push(&mut self, row: NodeRow) -> usize {
        let mut taints = row.taints;
        let set = if taints.is_empty() {
            0
        } else {
            taints.sort_by_key(|t| (t.key, t.value, t.effect as u8));
            if self.taint_sets.is_empty() {
                self.taint_sets.push(Vec::new());
            }
            match self.taint_sets.iter().position(|set| *set == taints) {
                Some(set) => set,
                None => {
                    self.taint_sets.push(taints);
                    self.taint_sets.len() - 1
                }
            }
        };
        self.name.push(row.name);
        self.gpu_total.push(row.gpu_total);
        self.gpu_free.push(row.gpu_free);
        self.gpu_milli_free_max.push(row.gpu_milli_free_max);
        self.gpu_type.push(row.gpu_type);
        self.cpu_free_milli.push(row.cpu_free_milli);
        self.memory_free_mib.push(row.memory_free_mib);
        self.health.push(row.health as u8);
        self.taint_set.push(u32::try_from(set).unwrap_or(u32::MAX));
        self.name.len() - 1
    }

    pub fn len(&self) -> usize {
        self.name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.name.is_empty()
    }

    pub fn health(&self, node: usize) -> Health {
        Health::from_u8(self.health[node]).unwrap_or(Health::NotReady)
    }

    /// The node's labels, sorted by key.
    #[inline]
    pub fn labels(&self, node: usize) -> &[NodeLabel] {
        self.labels.get(node).map_or(&[], |l| l)
    }

    /// Most nodes have no taints (set 0), which costs one load.
    #[inline]
    pub fn taints(&self, node: usize) -> &[Taint] {
        match self.taint_set[node] {
            0 => &[],
            set => self.taint_sets.get(set as usize).map_or(&[], Vec::as_slice),
        }
    }
}

/// Whole-cluster resource amounts, as quota counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Resources {
    pub gpus: u64,
    pub cpu_milli: u64,
    pub memory_mib: u64,
}

impl Resources {
    pub fn gpus(gpus: u64) -> Self {
        Self {
            gpus,
            ..Self::default()
        }
    }
}

/// What one pod asks for. A gang's pods share one shape.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodShape {
    pub name: Sym,
    pub queue: Sym,
    pub priority: i32,
    pub gpus: u32,
    /// 1..=999 for a fraction of one GPU, 0 for whole GPUs.
    pub gpu_milli: u32,
    /// 0 for any type.
    pub gpu_type: Sym,
    pub cpu_milli: u32,
    pub memory_mib: u32,
    pub tolerations: Vec<Toleration>,
    pub gang_size: u32,
    /// `nodeSelector` and node affinity; `None` for a pod that names no node constraint.
    pub node_affinity: Option<Arc<NodeAffinity>>,
    /// Asks beyond GPUs, CPU and memory, by [`ResourceColumn::name`], sorted by name.
    pub resources: Vec<(Sym, u32)>,
}

impl PodShape {
    /// Whether the pod's node selector and required node affinity let it onto `node`.
    #[inline]
    pub fn node_allowed(&self, t: &NodeTable, node: usize) -> bool {
        self.node_affinity
            .as_ref()
            .is_none_or(|a| a.allows(t.labels(node), t.name[node]))
    }

    /// The first resource beyond GPUs, CPU and memory that `node` lacks, as an index into
    /// [`NodeTable::resources`] (`usize::MAX` when no column names it).
    #[inline]
    pub fn lacking_resource(&self, t: &NodeTable, node: usize) -> Option<usize> {
        self.resources.iter().find_map(|&(name, asked)| {
            match t.resources.iter().position(|c| c.name == name) {
                Some(column) => (t.resources[column].free[node] < asked).then_some(column),
                None => Some(usize::MAX),
            }
        })
    }

    pub fn tolerates_all(&self, taints: &[Taint]) -> bool {
        taints.is_empty()
            || taints.iter().all(|taint| {
                taint.effect == TaintEffect::PreferNoSchedule
                    || self.tolerations.iter().any(|t| t.tolerates(taint))
            })
    }
}

/// A job asking quota for `count` pods of one shape.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRequest {
    pub pod: PodShape,
    pub count: u32,
    pub total: Resources,
}

/// One queue's quota and current use, as a quota policy sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueUsage {
    pub name: Sym,
    pub nominal: Resources,
    /// `None` = may borrow without limit.
    pub borrowing_limit: Option<Resources>,
    /// `None` = lends all idle nominal quota.
    pub lending_limit: Option<Resources>,
    pub used: Resources,
    pub weight: u32,
}

/// The queues that share quota with each other.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CohortUsage {
    pub name: Sym,
    pub nominal: Resources,
    pub used: Resources,
    pub queues: Vec<QueueUsage>,
}

/// A quota decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "kebab-case")]
pub enum QuotaVerdict {
    Admit,
    AdmitBorrowing { borrowed: Resources },
    Deny { reason: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toleration_matching_follows_kubernetes() {
        let taint = Taint {
            key: 5,
            value: 6,
            effect: TaintEffect::NoSchedule,
        };
        let equal = Toleration {
            key: 5,
            exists: false,
            value: 6,
            effect: None,
        };
        let wrong_value = Toleration { value: 7, ..equal };
        let exists_any = Toleration {
            key: 0,
            exists: true,
            value: 0,
            effect: None,
        };
        let wrong_effect = Toleration {
            effect: Some(TaintEffect::NoExecute),
            ..equal
        };
        assert!(equal.tolerates(&taint));
        assert!(!wrong_value.tolerates(&taint));
        assert!(exists_any.tolerates(&taint));
        assert!(!wrong_effect.tolerates(&taint));
    }

    #[test]
    fn prefer_no_schedule_never_blocks() {
        let pod = PodShape::default();
        let soft = Taint {
            key: 1,
            value: 0,
            effect: TaintEffect::PreferNoSchedule,
        };
        let hard = Taint {
            effect: TaintEffect::NoSchedule,
            ..soft
        };
        assert!(pod.tolerates_all(&[soft]));
        assert!(!pod.tolerates_all(&[hard]));
    }
}

/// Seconds (virtual or wall) with a total order, so times can key a heap or a sorted set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seconds(pub f64);

impl Eq for Seconds {}

impl PartialOrd for Seconds {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Seconds {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The nearest-rank `p`th percentile of `sorted` (ascending), or the zero value when it is
/// empty: the one definition the simulator's waits, the engine's cycle times and the benches'
/// latencies (seconds or `Duration`s) share.
pub fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
