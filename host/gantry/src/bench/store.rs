//! A write benchmark the CLI runs as `gantry bench store`: how many decision records per second
//! the store takes, batched the way the scheduler writes them (one batch per cycle).

use std::path::Path;
use std::time::Instant;

use gantry_store::{NewDecision, Result, Store, StoreConfig, sample_explanation};
use serde::{Deserialize, Serialize};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_append_reports_a_rate() {
        let dir = tempfile::tempdir().unwrap();
        let r = bench_append(&dir.path().join("bench"), 50_000, 1000).unwrap();
        assert_eq!(r.records, 50_000);
        assert!(r.records_per_s > 0.0);
        assert!(r.decision_bytes > 0);
        eprintln!("{}", serde_json::to_string(&r).unwrap());
    }
}
