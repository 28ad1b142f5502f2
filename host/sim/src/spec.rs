//! Cluster spec v1: the YAML files under `shared/clusters/`, describing a simulated cluster as
//! node pools (identical nodes with a topology) and a queue tree.
//!
//! ```yaml
//! name: small-64
//! node_pools:
//!   - name: h100
//!     count: 48
//!     gpus_per_node: 8
//!     gpu_type: H100-SXM5-80GB      # optional
//!     cpu_milli: 192000
//!     memory_mib: 2000000
//!     topology:                     # optional; innermost level first
//!       - level: rack
//!         size: 8                   # 8 nodes per rack
//!       - level: block
//!         size: 3                   # 3 racks per block
//! queues:                           # optional
//!   - name: team-a
//!     parent: research              # optional; a queue with children is a cohort
//!     nominal_gpus: 256             # default 0
//!     weight: 2                     # default 1
//!     borrowing_limit_gpus: 128     # optional; absent = may borrow without limit
//!     lending_limit_gpus: 64        # optional; absent = lends all idle nominal quota
//!     reclaim_within_cohort: any    # optional; never (the default) or any
//! ```
//!
//! Nodes are numbered in pool order and, inside a pool, fill each level's domains in order; the
//! last domain of a level may be partial. Pools never share a domain.

use std::collections::HashMap;
use std::path::Path;

use gantry_core::{
    LevelColumn, NodeRow, NodeTable, QueueDef, QueueError, Queues, Reclaim, Resources, Symbols,
};
use serde::{Deserialize, Serialize};

/// Most GPUs one node may have. A node's GPUs must fit one `u64` bitmask of per-GPU state, and
/// no real machine comes near it, so a larger number is a typo.
pub const MAX_GPUS_PER_NODE: u32 = 64;

/// Most nodes one spec may describe: over 100 times the 7,500-node target. A larger count is a
/// typo that would otherwise exhaust memory building the node table.
pub const MAX_NODES: u64 = 1_000_000;

/// A cluster spec as written in YAML. Kept separate from [`Cluster`] so that a spec can be
/// checked, printed and written back (the node-list importer produces one) before any symbol is
/// interned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    pub name: String,
    pub node_pools: Vec<NodePoolSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<QueueSpec>,
    /// How its nodes fail, when the replay (or the demo) should fail them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<crate::failures::FailureModel>,
}

/// A run of identical nodes. Pools, not nodes, because real GPU fleets are bought in batches of
/// one machine type, and 7,500 node entries would bury the shape of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodePoolSpec {
    pub name: String,
    pub count: u32,
    pub gpus_per_node: u32,
    /// Absent for CPU-only pools; interned to symbol 0 ("none").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    pub cpu_milli: u32,
    pub memory_mib: u32,
    /// Innermost level first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology: Vec<TopologyLevelSpec>,
}

/// One topology level of a pool: each domain groups `size` units of the level below it (nodes,
/// for the innermost). Sizes rather than explicit node lists, because the simulated clusters are
/// regular and a size is what a reader can check at a glance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologyLevelSpec {
    pub level: String,
    pub size: u32,
}

/// One queue (team) and its GPU quota, Kueue-style. The tree is kept as parent names, as
/// written, because quota policies walk it by name and the simulator reports by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSpec {
    pub name: String,
    /// The cohort this queue belongs to; `None` for a root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    #[serde(default)]
    pub nominal_gpus: u64,
    /// Share of idle quota relative to sibling queues.
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// `None` = may borrow without limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowing_limit_gpus: Option<u64>,
    /// `None` = lends all idle nominal quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lending_limit_gpus: Option<u64>,
    /// Whether its jobs evict borrowers to take its nominal quota back: `never` (the
    /// default, as Kueue's) or `any`.
    #[serde(default, skip_serializing_if = "Reclaim::is_never")]
    pub reclaim_within_cohort: Reclaim,
}

fn default_weight() -> u32 {
    1
}

impl QueueSpec {
    /// The queue as the core declares it.
    pub fn def(&self) -> QueueDef {
        QueueDef {
            name: self.name.clone(),
            parent: self.parent.clone(),
            nominal_gpus: self.nominal_gpus,
            weight: self.weight,
            borrowing_limit_gpus: self.borrowing_limit_gpus,
            lending_limit_gpus: self.lending_limit_gpus,
            reclaim: self.reclaim_within_cohort,
        }
    }
}

/// A spec turned into the core's model: what the simulated cluster source hands the scheduler.
/// The node table is built once here, with every column filled, so the cycle never needs the
/// spec again.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    pub name: String,
    pub nodes: NodeTable,
    pub queues: Vec<QueueSpec>,
    /// The spec's failure model, if it has one.
    pub failures: Option<crate::failures::FailureModel>,
}

impl Cluster {
    /// The queue tree as the core declares it.
    pub fn queue_defs(&self) -> Vec<QueueDef> {
        self.queues.iter().map(QueueSpec::def).collect()
    }

    /// Queues with no children: the ones jobs are submitted to.
    pub fn leaf_queues(&self) -> Vec<String> {
        self.queues
            .iter()
            .filter(|q| {
                !self
                    .queues
                    .iter()
                    .any(|c| c.parent.as_deref() == Some(&q.name))
            })
            .map(|q| q.name.clone())
            .collect()
    }

    /// Everything the cluster has, the denominator of dominant-resource shares.
    pub fn capacity(&self) -> Resources {
        let sum = |column: &[u32]| column.iter().map(|&v| u64::from(v)).sum();
        Resources {
            gpus: sum(&self.nodes.gpu_total),
            cpu_milli: sum(&self.nodes.cpu_free_milli),
            memory_mib: sum(&self.nodes.memory_free_mib),
        }
    }

    /// The core's queue tree for this cluster, with fair-share usage halving every
    /// `half_life_s`.
    pub fn queue_tree(&self, half_life_s: f64) -> Result<Queues, QueueError> {
        Queues::new(&self.queue_defs(), self.capacity(), half_life_s)
    }
}

/// Why a spec was refused. Each message names the file, then the pool or queue, then the field,
/// because the reader has to find the line to fix.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// Bad YAML, a wrong type or an unknown field; the message carries the YAML line and column.
    #[error("{file}: {message}")]
    Yaml { file: String, message: String },
    #[error("{file}: failures: {message}")]
    Failures { file: String, message: String },
    #[error("{file}: field node_pools: is empty; a cluster needs at least one node pool")]
    NoPools { file: String },
    /// An entry of a named list (`node_pools`, `queues`) without a name.
    #[error("{file}: {list}[{index}], field name: must not be empty")]
    EmptyName {
        file: String,
        list: &'static str,
        index: usize,
    },
    /// An entry of a named list whose name an earlier one took.
    #[error(
        "{file}: {what} {name:?} ({list}[{index}]), field name: already used by {list}[{first}]"
    )]
    DuplicateName {
        file: String,
        list: &'static str,
        what: &'static str,
        name: String,
        index: usize,
        first: usize,
    },
    #[error("{file}: node pool {pool:?}, field count: must be at least 1")]
    ZeroCount { file: String, pool: String },
    #[error(
        "{file}: node pool {pool:?}, field gpus_per_node: {gpus} is more than {MAX_GPUS_PER_NODE}"
    )]
    TooManyGpus {
        file: String,
        pool: String,
        gpus: u32,
    },
    #[error("{file}: node pool {pool:?}, field topology[{index}].level: must not be empty")]
    EmptyLevelName {
        file: String,
        pool: String,
        index: usize,
    },
    #[error(
        "{file}: node pool {pool:?}, field topology[{index}].size: level {level:?} must group at least 1 unit"
    )]
    ZeroTopologySize {
        file: String,
        pool: String,
        index: usize,
        level: String,
    },
    #[error(
        "{file}: node pool {pool:?}, field topology[{index}].level: {level:?} appears twice in this pool"
    )]
    RepeatedLevel {
        file: String,
        pool: String,
        index: usize,
        level: String,
    },
    #[error(
        "{file}: node pool {pool:?}, field topology: level {inner:?} is inside {outer:?} here, but outside it in node pool {other:?}"
    )]
    LevelOrder {
        file: String,
        pool: String,
        inner: String,
        outer: String,
        other: String,
    },
    #[error(
        "{file}: field topology: levels {levels} have no inner-to-outer order that every node pool agrees with"
    )]
    LevelCycle { file: String, levels: String },
    #[error("{file}: field node_pools: {nodes} nodes in all; at most {MAX_NODES} are supported")]
    TooManyNodes { file: String, nodes: u64 },
    #[error("{file}: queue {queue:?}, field parent: no queue is named {parent:?}")]
    UnknownParent {
        file: String,
        queue: String,
        parent: String,
    },
    #[error("{file}: queue {queue:?}, field parent: the parent chain loops: {chain}")]
    QueueCycle {
        file: String,
        queue: String,
        chain: String,
    },
    #[error("{file}: queue {queue:?}, field weight: must be at least 1")]
    ZeroWeight { file: String, queue: String },
    #[error(
        "{file}: queue {queue:?}, field lending_limit_gpus: {limit} is more than nominal_gpus ({nominal})"
    )]
    LendingOverNominal {
        file: String,
        queue: String,
        limit: u64,
        nominal: u64,
    },
}

impl ClusterSpec {
    /// Parses and validates a spec. `file` names the source in error messages.
    pub fn from_yaml_str(yaml: &str, file: &str) -> Result<Self, SpecError> {
        let spec: ClusterSpec = serde_yaml::from_str(yaml).map_err(|e| SpecError::Yaml {
            file: file.to_owned(),
            message: e.to_string(),
        })?;
        spec.validate(file)?;
        Ok(spec)
    }

    /// Reads, parses and validates a spec file. Messages name the path as given.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, SpecError> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let yaml = std::fs::read_to_string(path).map_err(|source| SpecError::Read {
            file: file.clone(),
            source,
        })?;
        Self::from_yaml_str(&yaml, &file)
    }

    /// The spec as YAML that [`ClusterSpec::from_yaml_str`] reads back.
    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(self).expect("a ClusterSpec always serialises")
    }

    /// Every rule a spec must meet; `from_yaml_str` and `load` call it. Public for specs built
    /// in code, such as the Alibaba node-list importer's.
    pub fn validate(&self, file: &str) -> Result<(), SpecError> {
        let file = || file.to_owned();
        if let Some(model) = &self.failures {
            model.validate().map_err(|message| SpecError::Failures {
                file: file(),
                message,
            })?;
        }
        if self.node_pools.is_empty() {
            return Err(SpecError::NoPools { file: file() });
        }
        check_names(
            file,
            "node_pools",
            "node pool",
            self.node_pools.iter().map(|p| &p.name),
        )?;
        let mut nodes: u64 = 0;
        for pool in &self.node_pools {
            if pool.count == 0 {
                return Err(SpecError::ZeroCount {
                    file: file(),
                    pool: pool.name.clone(),
                });
            }
            if pool.gpus_per_node > MAX_GPUS_PER_NODE {
                return Err(SpecError::TooManyGpus {
                    file: file(),
                    pool: pool.name.clone(),
                    gpus: pool.gpus_per_node,
                });
            }
            for (index, level) in pool.topology.iter().enumerate() {
                if level.level.is_empty() {
                    return Err(SpecError::EmptyLevelName {
                        file: file(),
                        pool: pool.name.clone(),
                        index,
                    });
                }
                if level.size == 0 {
                    return Err(SpecError::ZeroTopologySize {
                        file: file(),
                        pool: pool.name.clone(),
                        index,
                        level: level.level.clone(),
                    });
                }
                if pool.topology[..index]
                    .iter()
                    .any(|l| l.level == level.level)
                {
                    return Err(SpecError::RepeatedLevel {
                        file: file(),
                        pool: pool.name.clone(),
                        index,
                        level: level.level.clone(),
                    });
                }
            }
            nodes += u64::from(pool.count);
        }
        if nodes > MAX_NODES {
            return Err(SpecError::TooManyNodes {
                file: file(),
                nodes,
            });
        }
        self.check_level_order(&file())?;
        self.check_queues(&file())
    }

    /// Two pools must not nest the same two levels both ways round.
    fn check_level_order(&self, file: &str) -> Result<(), SpecError> {
        // (inner, outer) -> the first pool that nests them so.
        let mut nesting: HashMap<(&str, &str), &str> = HashMap::new();
        for pool in &self.node_pools {
            for (i, inner) in pool.topology.iter().enumerate() {
                for outer in &pool.topology[i + 1..] {
                    let pair = (inner.level.as_str(), outer.level.as_str());
                    if let Some(other) = nesting.get(&(pair.1, pair.0)) {
                        return Err(SpecError::LevelOrder {
                            file: file.to_owned(),
                            pool: pool.name.clone(),
                            inner: inner.level.clone(),
                            outer: outer.level.clone(),
                            other: (*other).to_owned(),
                        });
                    }
                    nesting.entry(pair).or_insert(&pool.name);
                }
            }
        }
        // Pairwise agreement still allows a cycle through three or more pools.
        let (_, cyclic) = self.level_order();
        if !cyclic.is_empty() {
            return Err(SpecError::LevelCycle {
                file: file.to_owned(),
                levels: cyclic.join(", "),
            });
        }
        Ok(())
    }

    fn check_queues(&self, file: &str) -> Result<(), SpecError> {
        let file = || file.to_owned();
        check_names(file, "queues", "queue", self.queues.iter().map(|q| &q.name))?;
        // The tree's own problems (names are unique by now), per queue, as the core finds them.
        let problems =
            QueueDef::check_tree(&self.queues.iter().map(QueueSpec::def).collect::<Vec<_>>());
        let problem_of = |index: usize| {
            problems
                .iter()
                .find(|(at, _)| *at == index)
                .map(|(_, problem)| problem)
        };
        for (index, queue) in self.queues.iter().enumerate() {
            if queue.weight == 0 {
                return Err(SpecError::ZeroWeight {
                    file: file(),
                    queue: queue.name.clone(),
                });
            }
            if let Some(limit) = queue.lending_limit_gpus
                && limit > queue.nominal_gpus
            {
                return Err(SpecError::LendingOverNominal {
                    file: file(),
                    queue: queue.name.clone(),
                    limit,
                    nominal: queue.nominal_gpus,
                });
            }
            // Only the queue that names the missing parent itself (its descendants meet the
            // same name walking up).
            if let Some(QueueError::UnknownParent { parent, .. }) = problem_of(index)
                && queue.parent.as_ref() == Some(parent)
            {
                return Err(SpecError::UnknownParent {
                    file: file(),
                    queue: queue.name.clone(),
                    parent: parent.clone(),
                });
            }
        }
        for (_, problem) in &problems {
            if let QueueError::Cycle { chain, .. } = problem {
                // Report the loop itself, not the path into it.
                let repeat = chain.last().cloned().unwrap_or_default();
                let start = chain.iter().position(|name| *name == repeat).unwrap_or(0);
                return Err(SpecError::QueueCycle {
                    file: file(),
                    queue: repeat,
                    chain: chain[start..].join(" -> "),
                });
            }
        }
        Ok(())
    }

    /// Every level name across pools, innermost first: a topological order of "inside" edges
    /// that breaks ties by first appearance. Also returns the levels left on a cycle (empty for
    /// a valid spec; `build` then appends them in appearance order).
    fn level_order(&self) -> (Vec<String>, Vec<String>) {
        let mut names: Vec<&str> = Vec::new();
        for pool in &self.node_pools {
            for level in &pool.topology {
                if !names.contains(&level.level.as_str()) {
                    names.push(&level.level);
                }
            }
        }
        let id = |name: &str| names.iter().position(|&n| n == name).unwrap_or(0);
        // inner[j] = the levels that must come before j.
        let mut inner: Vec<Vec<usize>> = vec![Vec::new(); names.len()];
        for pool in &self.node_pools {
            for pair in pool.topology.windows(2) {
                let (a, b) = (id(&pair[0].level), id(&pair[1].level));
                if a != b && !inner[b].contains(&a) {
                    inner[b].push(a);
                }
            }
        }
        let mut placed = vec![false; names.len()];
        let mut order = Vec::with_capacity(names.len());
        while let Some(next) =
            (0..names.len()).find(|&j| !placed[j] && inner[j].iter().all(|&i| placed[i]))
        {
            placed[next] = true;
            order.push(names[next].to_owned());
        }
        let cyclic: Vec<String> = (0..names.len())
            .filter(|&j| !placed[j])
            .map(|j| names[j].to_owned())
            .collect();
        (order, cyclic)
    }

    /// Total nodes across pools.
    pub fn node_count(&self) -> u64 {
        self.node_pools.iter().map(|p| u64::from(p.count)).sum()
    }

    /// Total GPUs across pools.
    pub fn gpu_count(&self) -> u64 {
        self.node_pools
            .iter()
            .map(|p| u64::from(p.count) * u64::from(p.gpus_per_node))
            .sum()
    }

    /// The cluster as the core sees it, every node healthy, untainted and wholly free. Meant
    /// for a validated spec; on an invalid one it still returns without panicking (a size of 0
    /// counts as 1, a repeated level keeps its last entry).
    pub fn build(&self, symbols: &Symbols) -> Cluster {
        let total = usize::try_from(self.node_count()).unwrap_or(usize::MAX);
        let (mut level_names, cyclic) = self.level_order();
        level_names.extend(cyclic);
        let mut nodes = NodeTable {
            name: Vec::with_capacity(total),
            gpu_total: Vec::with_capacity(total),
            gpu_free: Vec::with_capacity(total),
            gpu_milli_free_max: Vec::with_capacity(total),
            gpu_type: Vec::with_capacity(total),
            cpu_free_milli: Vec::with_capacity(total),
            memory_free_mib: Vec::with_capacity(total),
            health: Vec::with_capacity(total),
            taint_set: Vec::with_capacity(total),
            taint_sets: vec![Vec::new()],
            levels: level_names
                .iter()
                .map(|name| LevelColumn {
                    name: symbols.intern(name),
                    node_domain: Vec::with_capacity(total),
                    domain_gpu_free: Vec::new(),
                    domain_gpu_total: Vec::new(),
                    domain_name: Vec::new(),
                })
                .collect(),
            // Spec nodes carry no labels and no resources beyond GPUs, CPU and memory.
            labels: Vec::new(),
            resources: Vec::new(),
        };
        for pool in &self.node_pools {
            let gpu_type = symbols.intern(pool.gpu_type.as_deref().unwrap_or(""));
            let gpus = pool.gpus_per_node;
            let count = u64::from(pool.count);
            // Per global level: (nodes per domain, first domain id) when this pool has it.
            let mut spans: Vec<Option<(u64, u32)>> = vec![None; level_names.len()];
            let mut span: u64 = 1;
            for level in &pool.topology {
                span = span.saturating_mul(u64::from(level.size.max(1)));
                let Some(global) = level_names.iter().position(|n| *n == level.level) else {
                    continue;
                };
                let column = &mut nodes.levels[global];
                let first = u32::try_from(column.domain_gpu_total.len()).unwrap_or(u32::MAX);
                for domain in 0..count.div_ceil(span) {
                    let members = span.min(count - domain * span);
                    let gpu_sum = u32::try_from(members * u64::from(gpus)).unwrap_or(u32::MAX);
                    // Spec domains have no names of their own: the level and the id ("rack-12").
                    let id = column.domain_gpu_total.len();
                    column
                        .domain_name
                        .push(symbols.intern(&format!("{}-{id}", level.level)));
                    column.domain_gpu_total.push(gpu_sum);
                    column.domain_gpu_free.push(gpu_sum);
                }
                spans[global] = Some((span, first));
            }
            for index in 0..count {
                nodes.push(NodeRow::new(
                    symbols.intern(&format!("{}-{index}", pool.name)),
                    gpus,
                    gpu_type,
                    pool.cpu_milli,
                    pool.memory_mib,
                ));
                for (column, span) in nodes.levels.iter_mut().zip(&spans) {
                    column.node_domain.push(match span {
                        Some((span, first)) => {
                            first.saturating_add(u32::try_from(index / span).unwrap_or(u32::MAX))
                        }
                        None => u32::MAX,
                    });
                }
            }
        }
        Cluster {
            name: self.name.clone(),
            nodes,
            queues: self.queues.clone(),
            failures: self.failures.clone(),
        }
    }
}

/// Names of a list (`node_pools`, `queues`) must be set and used once: the error for the first
/// entry that is empty or whose name an earlier one took, naming the list and what its
/// entries are.
fn check_names<'a>(
    file: impl Fn() -> String,
    list: &'static str,
    what: &'static str,
    names: impl IntoIterator<Item = &'a String>,
) -> Result<(), SpecError> {
    let mut name_to_index: HashMap<&str, usize> = HashMap::new();
    for (index, name) in names.into_iter().enumerate() {
        if name.is_empty() {
            return Err(SpecError::EmptyName {
                file: file(),
                list,
                index,
            });
        }
        if let Some(&first) = name_to_index.get(name.as_str()) {
            return Err(SpecError::DuplicateName {
                file: file(),
                list,
                what,
                name: name.clone(),
                index,
                first,
            });
        }
        name_to_index.insert(name, index);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(file: &str) -> String {
        format!(
            "{}/../../../shared/clusters/{file}",
            env!("CARGO_MANIFEST_DIR")
        )
    }

    fn gpus(cluster: &Cluster) -> u64 {
        cluster.nodes.gpu_total.iter().map(|&g| u64::from(g)).sum()
    }

    fn level<'a>(cluster: &'a Cluster, symbols: &Symbols, name: &str) -> &'a LevelColumn {
        cluster
            .nodes
            .levels
            .iter()
            .find(|l| &*symbols.resolve(l.name) == name)
            .expect("level present")
    }

    /// Every column has one entry per node, and each domain's totals add up from its nodes.
    fn assert_consistent(cluster: &Cluster) {
        let nodes = &cluster.nodes;
        let n = nodes.len();
        for column in [
            nodes.gpu_total.len(),
            nodes.gpu_free.len(),
            nodes.gpu_milli_free_max.len(),
            nodes.gpu_type.len(),
            nodes.cpu_free_milli.len(),
            nodes.memory_free_mib.len(),
            nodes.health.len(),
            nodes.taint_set.len(),
        ] {
            assert_eq!(column, n);
        }
        assert_eq!(nodes.taint_sets, vec![Vec::new()]);
        assert!(
            nodes
                .health
                .iter()
                .all(|&h| h == gantry_core::Health::Healthy as u8)
        );
        assert_eq!(nodes.gpu_total, nodes.gpu_free);
        for level in &nodes.levels {
            assert_eq!(level.node_domain.len(), n);
            let mut sums = vec![0u32; level.domain_gpu_total.len()];
            for (node, &domain) in level.node_domain.iter().enumerate() {
                if domain != u32::MAX {
                    sums[domain as usize] += nodes.gpu_total[node];
                }
            }
            assert_eq!(sums, level.domain_gpu_total);
            assert_eq!(level.domain_gpu_free, level.domain_gpu_total);
        }
    }

    #[test]
    fn small_64_loads() {
        let spec = ClusterSpec::load(shared("small-64.yaml")).unwrap();
        let symbols = Symbols::new();
        let cluster = spec.build(&symbols);
        assert_consistent(&cluster);
        assert_eq!(cluster.name, "small-64");
        assert_eq!(cluster.nodes.len(), 64);
        assert_eq!(gpus(&cluster), 48 * 8 + 16 * 4);
        let names: Vec<_> = cluster
            .nodes
            .levels
            .iter()
            .map(|l| symbols.resolve(l.name).to_string())
            .collect();
        assert_eq!(names, ["rack", "block"]);
        let rack = level(&cluster, &symbols, "rack");
        let block = level(&cluster, &symbols, "block");
        // h100: 6 racks of 8; l4: 2 racks of 8 of its own.
        assert_eq!(rack.domain_gpu_total, [64, 64, 64, 64, 64, 64, 32, 32]);
        // h100: 2 blocks of 3 racks; l4 has no block.
        assert_eq!(block.domain_gpu_total, [192, 192]);
        assert_eq!(block.node_domain[23], 0);
        assert_eq!(block.node_domain[24], 1);
        assert_eq!(block.node_domain[48], u32::MAX);
        assert_eq!(rack.node_domain[48], 6);
        assert_eq!(&*symbols.resolve(cluster.nodes.name[0]), "h100-0");
        assert_eq!(&*symbols.resolve(cluster.nodes.name[63]), "l4-15");
        assert_eq!(&*symbols.resolve(cluster.nodes.gpu_type[63]), "L4");
        assert_eq!(cluster.nodes.cpu_free_milli[63], 48000);
        assert_eq!(cluster.nodes.memory_free_mib[0], 2_000_000);
        assert!(cluster.nodes.gpu_milli_free_max.iter().all(|&m| m == 1000));
        let queues: Vec<_> = cluster.queues.iter().map(|q| q.name.as_str()).collect();
        assert_eq!(queues, ["team-a", "team-b", "default"]);
        assert_eq!(cluster.queues[0].borrowing_limit_gpus, Some(128));
        assert_eq!(cluster.queues[1].weight, 1);
    }

    #[test]
    fn openai_like_7500_loads() {
        let spec = ClusterSpec::load(shared("openai-like-7500.yaml")).unwrap();
        let symbols = Symbols::new();
        let cluster = spec.build(&symbols);
        assert_consistent(&cluster);
        assert_eq!(cluster.nodes.len(), 7500);
        assert_eq!(gpus(&cluster), 60_000);
        let rack = level(&cluster, &symbols, "rack");
        let block = level(&cluster, &symbols, "block");
        assert_eq!(rack.domain_gpu_total.len(), 469);
        assert_eq!(*rack.domain_gpu_total.last().unwrap(), 12 * 8);
        assert_eq!(block.domain_gpu_total.len(), 15);
        assert_eq!(
            *block.domain_gpu_total.last().unwrap(),
            (7500 - 14 * 512) * 8
        );
        assert_eq!(rack.node_domain[7499], 468);
        assert_eq!(block.node_domain[7499], 14);
        let rl = cluster.queues.iter().find(|q| q.name == "rl").unwrap();
        assert_eq!(rl.parent.as_deref(), Some("research"));
        assert_eq!(rl.borrowing_limit_gpus, Some(8000));
        let pretraining = cluster
            .queues
            .iter()
            .find(|q| q.name == "pretraining")
            .unwrap();
        assert_eq!(pretraining.weight, 2);
        let applied = cluster.queues.iter().find(|q| q.name == "applied").unwrap();
        assert_eq!(applied.lending_limit_gpus, Some(6000));
    }

    #[test]
    fn alibaba_openb_2023_loads() {
        let spec = ClusterSpec::load(shared("alibaba-openb-2023.yaml")).unwrap();
        let symbols = Symbols::new();
        let cluster = spec.build(&symbols);
        assert_consistent(&cluster);
        assert_eq!(cluster.nodes.len(), 1213);
        assert_eq!(gpus(&cluster), 6212);
        let rack = level(&cluster, &symbols, "rack");
        let expected: u64 = spec
            .node_pools
            .iter()
            .map(|p| u64::from(p.count).div_ceil(16))
            .sum();
        assert_eq!(rack.domain_gpu_total.len() as u64, expected);
        assert_eq!(expected, 86);
        assert_eq!(cluster.queues.len(), 4);
    }

    #[test]
    fn yaml_round_trips() {
        let spec = ClusterSpec::load(shared("openai-like-7500.yaml")).unwrap();
        let again = ClusterSpec::from_yaml_str(&spec.to_yaml(), "again.yaml").unwrap();
        assert_eq!(spec, again);
    }

    #[test]
    fn levels_merge_across_pools_innermost_first() {
        let yaml = "name: t
node_pools:
  - {name: a, count: 4, gpus_per_node: 8, cpu_milli: 1, memory_mib: 1,
     topology: [{level: rack, size: 2}, {level: block, size: 2}]}
  - {name: b, count: 3, gpus_per_node: 4, cpu_milli: 1, memory_mib: 1,
     topology: [{level: nvlink, size: 1}, {level: rack, size: 2}]}
";
        let spec = ClusterSpec::from_yaml_str(yaml, "t.yaml").unwrap();
        let symbols = Symbols::new();
        let cluster = spec.build(&symbols);
        assert_consistent(&cluster);
        let names: Vec<_> = cluster
            .nodes
            .levels
            .iter()
            .map(|l| symbols.resolve(l.name).to_string())
            .collect();
        assert_eq!(names, ["nvlink", "rack", "block"]);
        let nvlink = level(&cluster, &symbols, "nvlink");
        assert_eq!(
            nvlink.node_domain,
            [u32::MAX, u32::MAX, u32::MAX, u32::MAX, 0, 1, 2]
        );
        let rack = level(&cluster, &symbols, "rack");
        assert_eq!(rack.node_domain, [0, 0, 1, 1, 2, 2, 3]);
        assert_eq!(rack.domain_gpu_total, [16, 16, 8, 4]);
        let block = level(&cluster, &symbols, "block");
        assert_eq!(
            block.node_domain,
            [0, 0, 0, 0, u32::MAX, u32::MAX, u32::MAX]
        );
    }

    #[test]
    fn cpu_only_pool_has_no_gpu_milli() {
        let yaml = "name: t
node_pools:
  - {name: cpu, count: 2, gpus_per_node: 0, cpu_milli: 64000, memory_mib: 1024}
";
        let spec = ClusterSpec::from_yaml_str(yaml, "t.yaml").unwrap();
        let cluster = spec.build(&Symbols::new());
        assert_consistent(&cluster);
        assert_eq!(cluster.nodes.gpu_milli_free_max, [0, 0]);
        assert_eq!(cluster.nodes.gpu_type, [0, 0]);
        assert!(cluster.nodes.levels.is_empty());
    }

    fn error(yaml: &str) -> String {
        ClusterSpec::from_yaml_str(yaml, "bad.yaml")
            .unwrap_err()
            .to_string()
    }

    const POOL: &str = "name: t
node_pools:
  - name: h100
    count: 4
    gpus_per_node: 8
    cpu_milli: 1000
    memory_mib: 1024
    topology:
      - level: rack
        size: 2
";

    #[test]
    fn spec_error_texts() {
        assert_eq!(
            error(&POOL.replace("count: 4", "count: 0")),
            r#"bad.yaml: node pool "h100", field count: must be at least 1"#
        );
        assert_eq!(
            error(&POOL.replace("gpus_per_node: 8", "gpus_per_node: 65")),
            r#"bad.yaml: node pool "h100", field gpus_per_node: 65 is more than 64"#
        );
        assert_eq!(
            error(&POOL.replace("size: 2", "size: 0")),
            r#"bad.yaml: node pool "h100", field topology[0].size: level "rack" must group at least 1 unit"#
        );
        let twice = format!(
            "{POOL}  - {{name: h100, count: 1, gpus_per_node: 1, cpu_milli: 1, memory_mib: 1}}\n"
        );
        assert_eq!(
            error(&twice),
            r#"bad.yaml: node pool "h100" (node_pools[1]), field name: already used by node_pools[0]"#
        );
        let queues = |q: &str| format!("{POOL}queues:\n{q}");
        assert_eq!(
            error(&queues("  - {name: a, parent: reserch}\n")),
            r#"bad.yaml: queue "a", field parent: no queue is named "reserch""#
        );
        assert_eq!(
            error(&queues("  - {name: a}\n  - {name: a}\n")),
            r#"bad.yaml: queue "a" (queues[1]), field name: already used by queues[0]"#
        );
        assert_eq!(
            error(&queues("  - {name: a}\n  - {name: ''}\n")),
            "bad.yaml: queues[1], field name: must not be empty"
        );
        assert_eq!(
            error(&twice.replace("name: h100, count: 1", "name: '', count: 1")),
            "bad.yaml: node_pools[1], field name: must not be empty"
        );
        assert_eq!(
            error(&queues(
                "  - {name: x}\n  - {name: a, parent: b}\n  - {name: b, parent: c}\n  - {name: c, parent: a}\n"
            )),
            r#"bad.yaml: queue "a", field parent: the parent chain loops: a -> b -> c -> a"#
        );
        assert_eq!(
            error(&queues("  - {name: a, parent: a}\n")),
            r#"bad.yaml: queue "a", field parent: the parent chain loops: a -> a"#
        );
        assert_eq!(
            error(&queues("  - {name: a, weight: 0}\n")),
            r#"bad.yaml: queue "a", field weight: must be at least 1"#
        );
        assert_eq!(
            error(&queues(
                "  - {name: a, nominal_gpus: 8, lending_limit_gpus: 9}\n"
            )),
            r#"bad.yaml: queue "a", field lending_limit_gpus: 9 is more than nominal_gpus (8)"#
        );
        assert_eq!(
            error(&POOL.replace(
                "      - level: rack\n        size: 2\n",
                "      - {level: rack, size: 2}\n      - {level: rack, size: 3}\n"
            )),
            r#"bad.yaml: node pool "h100", field topology[1].level: "rack" appears twice in this pool"#
        );
        let crossed = format!(
            "{POOL}      - {{level: block, size: 2}}\n  - {{name: b, count: 1, gpus_per_node: 1, cpu_milli: 1, memory_mib: 1, topology: [{{level: block, size: 1}}, {{level: rack, size: 1}}]}}\n"
        );
        assert_eq!(
            error(&crossed),
            r#"bad.yaml: node pool "b", field topology: level "block" is inside "rack" here, but outside it in node pool "h100""#
        );
        assert_eq!(
            error("name: t\nnode_pools: []\n"),
            "bad.yaml: field node_pools: is empty; a cluster needs at least one node pool"
        );
    }

    #[test]
    fn three_pool_level_cycle_is_refused() {
        let pool = |name: &str, inner: &str, outer: &str| {
            format!(
                "  - {{name: {name}, count: 1, gpus_per_node: 1, cpu_milli: 1, memory_mib: 1, topology: [{{level: {inner}, size: 1}}, {{level: {outer}, size: 1}}]}}\n"
            )
        };
        let yaml = format!(
            "name: t\nnode_pools:\n{}{}{}",
            pool("a", "x", "y"),
            pool("b", "y", "z"),
            pool("c", "z", "x")
        );
        assert_eq!(
            error(&yaml),
            "bad.yaml: field topology: levels x, y, z have no inner-to-outer order that every node pool agrees with"
        );
    }

    #[test]
    fn typos_are_errors_with_a_location() {
        let message = error(&POOL.replace("gpus_per_node", "gpu_per_node"));
        assert!(
            message.starts_with("bad.yaml: node_pools[0]: unknown field `gpu_per_node`"),
            "{message}"
        );
        assert!(message.contains("at line 5 column 5"), "{message}");
        let message = error(&POOL.replace("level: rack", "levle: rack"));
        assert!(message.contains("unknown field `levle`"), "{message}");
        let message = error("name: t\nnodepools: []\n");
        assert!(message.contains("unknown field `nodepools`"), "{message}");
    }

    #[test]
    fn a_queue_reclaims_only_when_it_says_so() {
        let queues = |reclaim: &str| {
            format!(
                "{POOL}queues:\n  - {{name: a, nominal_gpus: 8{reclaim}}}\n  - {{name: b, nominal_gpus: 8}}\n"
            )
        };
        let spec =
            ClusterSpec::from_yaml_str(&queues(", reclaim_within_cohort: any"), "t.yaml").unwrap();
        let defs: Vec<QueueDef> = spec.queues.iter().map(QueueSpec::def).collect();
        assert_eq!(
            (defs[0].reclaim, defs[1].reclaim),
            (Reclaim::Any, Reclaim::Never)
        );
        // Kueue's spelling reads too, and the default is not written back.
        let spec =
            ClusterSpec::from_yaml_str(&queues(", reclaim_within_cohort: Any"), "t.yaml").unwrap();
        assert_eq!(spec.queues[0].def().reclaim, Reclaim::Any);
        assert_eq!(spec.to_yaml().matches("reclaim_within_cohort").count(), 1);
        let message = error(&queues(", reclaim_within_cohort: sometimes"));
        assert!(
            message.contains("queues[0].reclaim_within_cohort: unknown variant `sometimes`"),
            "{message}"
        );
    }

    #[test]
    fn missing_file_names_the_path() {
        let message = ClusterSpec::load("/nonexistent/x.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with("/nonexistent/x.yaml: cannot read: "),
            "{message}"
        );
    }
}
