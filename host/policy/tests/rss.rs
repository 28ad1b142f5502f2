//! Peak memory stays within the process's Wasm budget while the whole hostile set runs at once.
//! Alone in its own test binary, so the process's peak RSS is this test's.
mod common;

use std::time::Duration;

use common::*;
use gantry_policy::{Limits, PolicyOptions, PolicyRole, WasmNodes};

fn status_mib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        / 1024
}

/// What the host itself may add while the calls run: lifted call results and arguments, the
/// callers' and refill threads' stacks, allocator slack. Stated, not measured.
const HOST_MARGIN_MIB: u64 = 96;

#[test]
fn peak_rss_stays_within_the_process_budget_under_the_whole_hostile_set() {
    let budget_mib: u64 = 256;
    let limits = Limits {
        // Long enough for a bomb to reach its cap rather than the deadline.
        deadline: Duration::from_millis(500),
        process_memory_bytes: (budget_mib as usize) << 20,
        // Keep every policy running Wasm: quarantine would take the pressure off.
        quarantine_after: u32::MAX,
        ..Limits::default()
    };
    let cap_mib = (limits.memory_bytes >> 20) as u64;
    let concurrency = limits.concurrency;
    let engine = engine_with(limits);
    let symbols = symbols_of(&engine);
    let table = WasmNodes::new(&nodes(&symbols, 7500));
    let pod = pod(&symbols, 1);
    let hostile: Vec<_> = [
        "hostile-memory-bomb",
        "hostile-huge-output",
        "hostile-loop",
        "hostile-recursion",
        "hostile-panic",
        "hostile-wrong-length",
        "hostile-undeclared-reason",
        "hostile_python_loop",
    ]
    .iter()
    .map(|name| {
        engine
            .load(&plugin(name), PolicyOptions::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    })
    .collect();
    let baseline = status_mib("VmHWM:");
    std::thread::scope(|scope| {
        for policy in &hostile {
            for _ in 0..concurrency {
                scope.spawn(|| {
                    for _ in 0..5 {
                        let result = match policy.role() {
                            PolicyRole::Score => policy.score(&pod, &table).map(|_| ()),
                            _ => policy.filter(&pod, &table).map(|_| ()),
                        };
                        assert!(result.is_err(), "{} answered", policy.info().name);
                    }
                });
            }
        }
    });
    let peak = status_mib("VmHWM:");
    let demand = 2 * concurrency as u64 * cap_mib;
    // Without the budget, the bombs and floods alone could hold `demand` MiB at once.
    assert!(demand > budget_mib + HOST_MARGIN_MIB);
    assert!(
        peak <= baseline + budget_mib + HOST_MARGIN_MIB,
        "peak RSS {peak} MiB, from {baseline} MiB, with a {budget_mib} MiB process budget \
         (the bombs alone could ask {demand} MiB)"
    );
    drop(hostile);
    assert_eq!(engine.process_memory_used(), 0);
    eprintln!(
        "peak RSS {peak} MiB from {baseline} MiB; now {} MiB",
        status_mib("VmRSS:")
    );
}
