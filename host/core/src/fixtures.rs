//! A small scheduler for tests, here and in the crates downstream (their `fixtures` feature):
//! identical 8-GPU nodes in one rack and one queue, and an 8-GPU one-pod job, built the one way
//! every such test builds them.

use std::sync::Arc;

use crate::cluster::ClusterState;
use crate::model::{LevelColumn, NodeRow, NodeTable, PodShape, Resources};
use crate::queues::{QueueDef, Queues, Reclaim};
use crate::scheduler::{JobSpec, Scheduler, SchedulerConfig, TopologyPref};
use crate::symbols::Symbols;

/// `nodes` nodes of 8 GPUs, 64 cores and 500 GiB, `node-0` onwards, in one rack, with one queue
/// `default` of `nominal_gpus` that borrows at most `borrowing_gpus` (`None`: no limit).
pub fn one_rack(
    symbols: &Arc<Symbols>,
    nodes: usize,
    nominal_gpus: u64,
    borrowing_gpus: Option<u64>,
    config: SchedulerConfig,
) -> Scheduler {
    let mut table = NodeTable {
        taint_sets: vec![Vec::new()],
        ..NodeTable::default()
    };
    for i in 0..nodes {
        let name = symbols.intern(&format!("node-{i}"));
        table.push(NodeRow::new(name, 8, 0, 64_000, 512_000));
    }
    let rack = LevelColumn::from_node_domains(symbols.intern("rack"), vec![0; nodes], &table);
    table.levels.push(rack);
    let capacity = Resources::gpus(8 * nodes as u64);
    let queues = Queues::new(
        &[QueueDef {
            name: "default".into(),
            parent: None,
            nominal_gpus,
            weight: 1,
            borrowing_limit_gpus: borrowing_gpus,
            lending_limit_gpus: None,
            reclaim: Reclaim::Never,
        }],
        capacity,
        3600.0,
    )
    .expect("one valid queue");
    Scheduler::new(ClusterState::new(table), queues, symbols.clone(), config)
}

/// A one-pod job of queue `default` asking 8 GPUs, 8 cores and 64 GiB, submitted at 0.
pub fn job(scheduler: &Scheduler, name: &str) -> JobSpec {
    JobSpec {
        name: name.into(),
        queue: 0,
        priority: 0,
        pods: 1,
        shape: PodShape {
            name: scheduler.symbols().intern(name),
            gpus: 8,
            cpu_milli: 8_000,
            memory_mib: 65_536,
            gang_size: 1,
            ..PodShape::default()
        },
        balloon: false,
        topology: TopologyPref::default(),
        submit_s: 0.0,
        expected_runtime_s: None,
    }
}
