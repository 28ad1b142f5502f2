//! The core model to and from the WIT types. Node columns are converted once per snapshot into
//! [`WasmNodes`] and then lent to every call, so a call copies nothing on the host side.

use gantry_core::{
    CohortUsage, JobRequest, NodeTable, PodShape, QueueUsage, Resources, Taint, TaintEffect,
    Toleration,
};

use std::ops::Range;

use crate::bindings::types;

/// The node table in the shape that crosses the boundary. Built from a [`NodeTable`] once and
/// reused for every call on the same snapshot.
#[derive(Debug, Clone)]
pub struct WasmNodes {
    raw: types::Nodes,
}

impl WasmNodes {
    /// Every node of `table`, in Wasm shape.
    pub fn new(table: &NodeTable) -> Self {
        Self::new_range(table, 0..table.len())
    }

    /// The nodes of `nodes` only (a chunk of the table). Domain totals stay cluster-wide.
    pub fn new_range(table: &NodeTable, nodes: Range<usize>) -> Self {
        Self {
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
