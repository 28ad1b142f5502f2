//! Shared fixtures for the policy engine's tests: real components built from `plugins/` by
//! `scripts/build-plugins.sh`, and small node tables.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use gantry_core::{LevelColumn, NodeRow, NodeTable, PodShape, Symbols, Taint, TaintEffect};
use gantry_policy::{Limits, PolicyEngine};

/// A policy built by `scripts/build-plugins.sh`, by crate name (`gpu-fit`, `hostile-loop`).
pub fn plugin(name: &str) -> Vec<u8> {
    let path = plugin_dir().join(format!("{}.wasm", name.replace('-', "_")));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}. Build the policies first: scripts/build-plugins.sh",
            path.display()
        )
    })
}

pub fn plugin_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target")));
    target.join("wasm32-wasip2/plugin")
}

/// A WAT file from plugins/hostile/wat.
pub fn wat(name: &str) -> Vec<u8> {
    let path = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../plugins/hostile/wat"
    ))
    .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn engine() -> PolicyEngine {
    engine_with(Limits::default())
}

pub fn engine_with(limits: Limits) -> PolicyEngine {
    PolicyEngine::new(limits, Symbols::new()).expect("engine")
}

/// `count` A100 nodes with 8 GPUs, racks of 4. Node `i` has `i % 9` GPUs free (capped at 8).
pub fn nodes(symbols: &Symbols, count: usize) -> NodeTable {
    let a100 = symbols.intern("A100");
    let mut table = NodeTable {
        taint_sets: vec![vec![]],
        ..NodeTable::default()
    };
    for i in 0..count {
        let free = (i % 9).min(8) as u32;
        table.push(NodeRow {
            gpu_free: free,
            gpu_milli_free_max: if free > 0 { 1000 } else { 0 },
            ..NodeRow::new(
                symbols.intern(&format!("node-{i}")),
                8,
                a100,
                96_000,
                1 << 20,
            )
        });
    }
    let rack = LevelColumn::from_node_domains(
        symbols.intern("rack"),
        (0..count as u32).map(|i| i / 4).collect(),
        &table,
    );
    table.levels.push(rack);
    table
}

/// Add a NoSchedule taint `key=value` to `node`.
pub fn taint(table: &mut NodeTable, symbols: &Symbols, node: usize, key: &str, value: &str) {
    table.taint_sets.push(vec![Taint {
        key: symbols.intern(key),
        value: symbols.intern(value),
        effect: TaintEffect::NoSchedule,
    }]);
    table.taint_set[node] = (table.taint_sets.len() - 1) as u32;
}

pub fn pod(symbols: &Symbols, gpus: u32) -> PodShape {
    PodShape {
        name: symbols.intern("pod-a"),
        queue: symbols.intern("team-a"),
        gpus,
        gang_size: 1,
        ..PodShape::default()
    }
}

pub fn symbols_of(engine: &PolicyEngine) -> Arc<Symbols> {
    engine.symbols().clone()
}
