//! Peak memory stays bounded while hostile policies run. Alone in its own test binary, so the
//! process's peak RSS is this test's.
mod common;

use common::*;
use gantry_policy::{Limits, PolicyOptions, WasmNodes};

fn peak_rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        / 1024
}

#[test]
fn peak_rss_stays_bounded_under_hostile_policies() {
    let limits = Limits::default();
    let cap_mib = (limits.memory_bytes >> 20) as u64;
    let engine = engine_with(limits);
    let symbols = symbols_of(&engine);
    let table = WasmNodes::new(&nodes(&symbols, 7500));
    let pod = pod(&symbols, 1);
    let bomb = engine
        .load(&plugin("hostile-memory-bomb"), PolicyOptions::default())
        .unwrap();
    let flood = engine
        .load(&plugin("hostile-huge-output"), PolicyOptions::default())
        .unwrap();
    let baseline = peak_rss_mib();
    for _ in 0..20 {
        assert!(bomb.filter(&pod, &table).is_err());
        assert!(flood.score(&pod, &table).is_err());
    }
    let peak = peak_rss_mib();
    // Each faulted instance is dropped; at most one of each lives at a time.
    assert!(
        peak <= baseline + 2 * cap_mib + 64,
        "peak RSS {peak} MiB, from {baseline} MiB, with a {cap_mib} MiB cap per instance"
    );
}
