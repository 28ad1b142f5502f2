//! A write benchmark the CLI runs as `gantry bench store`: how many decision records per second
//! the store takes, batched the way the scheduler writes them (one batch per cycle).

use std::path::Path;
use std::time::Instant;

use gantry_core::explain::{FilterExplain, NodeScore, QuotaExplain};
use gantry_core::{Admission, Explanation, Outcome, PolicyRef};
use serde::{Deserialize, Serialize};

use crate::{NewDecision, Result, Store, StoreConfig};

/// The benchmark's figures, serialisable for `--json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    pub records: u64,
    pub batch: u64,
    /// Wall time for all appends plus a final flush to disk.
    pub seconds: f64,
    pub records_per_s: f64,
    /// The store's byte accounting of the history written ([`Store::decision_bytes`]).
    pub decision_bytes: u64,
    /// sled's own on-disk figure after the flush.
    pub size_on_disk: u64,
}

/// A realistic decision for job `i`: one in four pending with filter reasons, the rest placed
/// on one to four nodes with their scores. About 350 bytes as stored (880 as JSON).
pub fn sample_explanation(i: u64) -> Explanation {
    let job = format!("team-{}/job-{}", i % 17, i % 5000);
    let placed = !i.is_multiple_of(4);
    let n_nodes = 1 + (i % 4) as usize;
    let node = |k: usize| format!("node-{:05}", (i as usize * 7 + k * 131) % 7500);
    let outcome = if placed {
        Outcome::Placed {
            nodes: (0..n_nodes).map(|k| (node(k), 8)).collect(),
        }
    } else {
        Outcome::Pending {
            waiting_for: "64 GPUs in one rack".into(),
        }
    };
    Explanation {
        job,
        queue: format!("team-{}", i % 17),
        pods: n_nodes as u32,
        gpus_per_pod: 8,
        priority: (i % 3) as i32,
        time_s: i as f64 * 0.001,
        outcome,
        quota: QuotaExplain {
            builtin: Admission::Within,
            policies: vec![],
            fair_share_key: 0.25,
            position: (i % 50) as u32,
        },
        nodes_total: 7500,
        nodes_evaluated: 7500,
        nodes_feasible: if placed { 812 } else { 0 },
        filters: vec![FilterExplain {
            policy: "builtin".into(),
            rejected: vec![
                ("Insufficient nvidia.com/gpu".into(), 6688),
                ("node(s) had untolerated taint".into(), 12),
            ],
        }],
        top_nodes: (0..if placed { n_nodes } else { 0 })
            .map(|k| NodeScore {
                node: node(k),
                total: 900 - k as u64,
                parts: vec![("builtin".into(), 500), ("gpu-binpack".into(), 400)],
                reasons: Vec::new(),
            })
            .collect(),
        domain: placed.then(|| format!("rack {}", i % 120)),
        policy_set: 3,
        policies: vec![PolicyRef {
            name: "gpu-binpack".into(),
            version: "1.2.0".into(),
            role: "score".into(),
            weight: 2,
            sha256: "9f2c".repeat(16),
        }],
        preempted: vec![],
        faults: vec![],
        estimate: None,
        preempted_by: None,
    }
}

/// Writes `records` sample decisions in batches of `batch` into a fresh store at `dir` (which
/// should be empty or absent), flushes, and reports the rate. Retention is not applied.
pub fn bench_append(dir: &Path, records: u64, batch: u64) -> Result<BenchResult> {
    let mut config = StoreConfig::new(dir);
    config.max_bytes = u64::MAX;
    let store = Store::open(config)?;
    let batch = batch.max(1);
    // Build the records before timing: the scheduler has them in hand already.
    let all: Vec<NewDecision> = (0..records)
        .map(|i| NewDecision {
            time_ms: 1_700_000_000_000 + i,
            explanation: sample_explanation(i),
        })
        .collect();
    let start = Instant::now();
    for chunk in all.chunks(batch as usize) {
        store.append_decisions(chunk)?;
    }
    store.flush()?;
    let seconds = start.elapsed().as_secs_f64();
    Ok(BenchResult {
        records,
        batch,
        seconds,
        records_per_s: records as f64 / seconds.max(1e-9),
        decision_bytes: store.decision_bytes()?,
        size_on_disk: store.size_on_disk()?,
    })
}
