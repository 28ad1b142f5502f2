//! The core model to and from the WIT types. Node columns are converted once per snapshot into
//! [`WasmNodes`] and then lent to every call, so a call copies nothing on the host side.

use gantry_core::{
    CohortUsage, JobRequest, NodeLabel, NodeTable, PodShape, QueueUsage, Resources, Sym, Taint,
    TaintEffect, Toleration,
};

use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::bindings::{types, v2};

/// Per topology level (as `nodes.levels`), per domain id, the domain's name interned (0 for
/// none): what a 0.2.0 policy's `host.domain-name` reads during a call.
pub(crate) type DomainNames = Arc<Vec<Vec<Sym>>>;

/// Label columns made for one list of keys, in its order.
type LabelColumns = Arc<Vec<v2::labels::LabelColumn>>;

/// The node table in the shape that crosses the boundary. Built from a [`NodeTable`] once and
/// reused for every call on the same snapshot.
///
/// The columns are contract 0.1.0's record, which 0.2.0 shares unchanged, so a policy of either
/// version is lent the same columns. For 0.2.0 policies it also holds each node's labels (a
/// shared pointer per node, no copy) and the domain names; a label column is made the first
/// time a policy asks for its key on these nodes, and kept until the nodes change.
#[derive(Debug)]
pub struct WasmNodes {
    raw: types::Nodes,
    /// Per node of `raw`, its labels sorted by key (empty when the table has none).
    labels: Vec<Arc<[NodeLabel]>>,
    domain_names: DomainNames,
    /// Label columns made so far, by the list of keys they were made for. A set holds a few
    /// 0.2.0 policies at most, so a short list searched in order.
    label_columns: Mutex<Vec<(Vec<Sym>, LabelColumns)>>,
}

impl Clone for WasmNodes {
    fn clone(&self) -> Self {
        Self {
            raw: self.raw.clone(),
            labels: self.labels.clone(),
            domain_names: self.domain_names.clone(),
            label_columns: Mutex::new(self.memo().clone()),
        }
    }
}

impl WasmNodes {
    /// Every node of `table`, in Wasm shape.
    pub fn new(table: &NodeTable) -> Self {
        Self::new_range(table, 0..table.len())
    }

    /// The nodes of `nodes` only (a chunk of the table). Domain totals stay cluster-wide.
    pub fn new_range(table: &NodeTable, nodes: Range<usize>) -> Self {
        let no_labels: Arc<[NodeLabel]> = Arc::from(Vec::new());
        Self {
            labels: nodes
                .clone()
                .map(|node| table.labels.get(node).unwrap_or(&no_labels).clone())
                .collect(),
            domain_names: Arc::new(
                table
                    .levels
                    .iter()
                    .map(|level| level.domain_name.clone())
                    .collect(),
            ),
            label_columns: Mutex::new(Vec::new()),
            raw: types::Nodes {
                name: table.name[nodes.clone()].to_vec(),
                gpu_total: table.gpu_total[nodes.clone()].to_vec(),
                gpu_free: table.gpu_free[nodes.clone()].to_vec(),
                gpu_milli_free_max: table.gpu_milli_free_max[nodes.clone()].to_vec(),
                gpu_type: table.gpu_type[nodes.clone()].to_vec(),
                cpu_free_milli: table.cpu_free_milli[nodes.clone()].to_vec(),
                memory_free_mib: table.memory_free_mib[nodes.clone()].to_vec(),
                health: table.health[nodes.clone()].to_vec(),
                taint_set: table.taint_set[nodes.clone()].to_vec(),
                taint_sets: table
                    .taint_sets
                    .iter()
                    .map(|set| set.iter().map(taint).collect())
                    .collect(),
                levels: table
                    .levels
                    .iter()
                    .map(|level| types::Level {
                        name: level.name,
                        node_domain: level.node_domain[nodes.clone()].to_vec(),
                        domain_gpu_free: level.domain_gpu_free.clone(),
                        domain_gpu_total: level.domain_gpu_total.clone(),
                    })
                    .collect(),
            },
        }
    }

    /// Makes this the nodes of `chunk` at `offsets` (ascending), reusing this value's
    /// allocations: what a call is asked about when only a few nodes of a chunk are still in
    /// play. Domain totals and taint sets are the chunk's, which are cluster-wide.
    pub fn gather_from(&mut self, chunk: &WasmNodes, offsets: &[usize]) {
        fn pick<T: Copy>(into: &mut Vec<T>, column: &[T], offsets: &[usize]) {
            into.clear();
            into.extend(offsets.iter().map(|&i| column[i]));
        }
        self.labels.clear();
        self.labels
            .extend(offsets.iter().map(|&i| chunk.labels[i].clone()));
        self.domain_names.clone_from(&chunk.domain_names);
        self.memo().clear();
        let (to, from) = (&mut self.raw, &chunk.raw);
        pick(&mut to.name, &from.name, offsets);
        pick(&mut to.gpu_total, &from.gpu_total, offsets);
        pick(&mut to.gpu_free, &from.gpu_free, offsets);
        pick(
            &mut to.gpu_milli_free_max,
            &from.gpu_milli_free_max,
            offsets,
        );
        pick(&mut to.gpu_type, &from.gpu_type, offsets);
        pick(&mut to.cpu_free_milli, &from.cpu_free_milli, offsets);
        pick(&mut to.memory_free_mib, &from.memory_free_mib, offsets);
        pick(&mut to.health, &from.health, offsets);
        pick(&mut to.taint_set, &from.taint_set, offsets);
        to.taint_sets.clone_from(&from.taint_sets);
        to.levels.truncate(from.levels.len());
        while to.levels.len() < from.levels.len() {
            to.levels.push(from.levels[to.levels.len()].clone());
        }
        for (to, from) in to.levels.iter_mut().zip(&from.levels) {
            to.name = from.name;
            pick(&mut to.node_domain, &from.node_domain, offsets);
            to.domain_gpu_free.clone_from(&from.domain_gpu_free);
            to.domain_gpu_total.clone_from(&from.domain_gpu_total);
        }
    }

    /// Nodes held.
    pub fn len(&self) -> usize {
        self.raw.name.len()
    }

    /// Whether no node is held.
    pub fn is_empty(&self) -> bool {
        self.raw.name.is_empty()
    }

    /// Copy node `node` of `table` (entry `local` here) after a placement, a release or a
    /// health change: its free capacity and health.
    pub fn refresh(&mut self, local: usize, node: usize, table: &NodeTable) {
        self.raw.health[local] = table.health[node];
        self.raw.gpu_free[local] = table.gpu_free[node];
        self.raw.gpu_milli_free_max[local] = table.gpu_milli_free_max[node];
        self.raw.cpu_free_milli[local] = table.cpu_free_milli[node];
        self.raw.memory_free_mib[local] = table.memory_free_mib[node];
    }

    /// Copy the free GPUs of node `node`'s domains, which every chunk carries.
    pub fn refresh_domains(&mut self, node: usize, table: &NodeTable) {
        for (raw, level) in self.raw.levels.iter_mut().zip(&table.levels) {
            if let Some(&domain) = level.node_domain.get(node)
                && let Some(free) = level.domain_gpu_free.get(domain as usize)
            {
                raw.domain_gpu_free[domain as usize] = *free;
            }
        }
    }

    pub(crate) fn raw(&self) -> &types::Nodes {
        &self.raw
    }

    /// The domain names, for `host.domain-name` during a 0.2.0 call on these nodes.
    pub(crate) fn domain_names(&self) -> DomainNames {
        self.domain_names.clone()
    }

    fn memo(&self) -> std::sync::MutexGuard<'_, Vec<(Vec<Sym>, LabelColumns)>> {
        self.label_columns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A column per key of `keys`, in order: each node's value for the key, 0 where it has
    /// none. Made once per list of keys and kept with these nodes (labels change only with the
    /// table, which rebuilds them); an empty list costs nothing.
    pub(crate) fn label_columns(&self, keys: &[Sym]) -> LabelColumns {
        if let Some((_, columns)) = self.memo().iter().find(|(k, _)| k == keys) {
            return columns.clone();
        }
        let columns: LabelColumns = Arc::new(
            keys.iter()
                .map(|&key| v2::labels::LabelColumn {
                    key,
                    values: self
                        .labels
                        .iter()
                        .map(
                            |labels| match labels.binary_search_by_key(&key, |l| l.key) {
                                Ok(i) => labels[i].value,
                                Err(_) => 0,
                            },
                        )
                        .collect(),
                })
                .collect(),
        );
        self.memo().push((keys.to_vec(), columns.clone()));
        columns
    }
}

fn effect(effect: TaintEffect) -> types::TaintEffect {
    match effect {
        TaintEffect::NoSchedule => types::TaintEffect::NoSchedule,
        TaintEffect::PreferNoSchedule => types::TaintEffect::PreferNoSchedule,
        TaintEffect::NoExecute => types::TaintEffect::NoExecute,
    }
}

fn taint(taint: &Taint) -> types::Taint {
    types::Taint {
        key: taint.key,
        value: taint.value,
        effect: effect(taint.effect),
    }
}

fn toleration(t: &Toleration) -> types::Toleration {
    types::Toleration {
        key: t.key,
        exists: t.exists,
        value: t.value,
        effect: t.effect.map(effect),
    }
}

pub(crate) fn pod(pod: &PodShape) -> types::Pod {
    types::Pod {
        name: pod.name,
        queue: pod.queue,
        priority: pod.priority,
        gpus: pod.gpus,
        gpu_milli: pod.gpu_milli,
        gpu_type: pod.gpu_type,
        cpu_milli: pod.cpu_milli,
        memory_mib: pod.memory_mib,
        tolerations: pod.tolerations.iter().map(toleration).collect(),
        gang_size: pod.gang_size.max(1),
    }
}

fn resources(r: &Resources) -> types::Resources {
    types::Resources {
        gpus: r.gpus,
        cpu_milli: r.cpu_milli,
        memory_mib: r.memory_mib,
    }
}

pub(crate) fn resources_from(r: types::Resources) -> Resources {
    Resources {
        gpus: r.gpus,
        cpu_milli: r.cpu_milli,
        memory_mib: r.memory_mib,
    }
}

pub(crate) fn job(job: &JobRequest) -> types::Job {
    types::Job {
        pod: pod(&job.pod),
        count: job.count,
        total: resources(&job.total),
    }
}

pub(crate) fn queue(q: &QueueUsage) -> types::QueueUsage {
    types::QueueUsage {
        name: q.name,
        nominal: resources(&q.nominal),
        borrowing_limit: q.borrowing_limit.as_ref().map(resources),
        lending_limit: q.lending_limit.as_ref().map(resources),
        used: resources(&q.used),
        weight: q.weight,
    }
}

pub(crate) fn cohort(c: &CohortUsage) -> types::CohortUsage {
    types::CohortUsage {
        name: c.name,
        nominal: resources(&c.nominal),
        used: resources(&c.used),
        queues: c.queues.iter().map(queue).collect(),
    }
}
