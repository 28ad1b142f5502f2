//! Hostile policies are contained: each fault has its exact kind, the host keeps serving, and a
//! faulted instance is never reused.
mod common;

use std::time::{Duration, Instant};

use common::*;
use gantry_policy::{FaultKind, Limits, PolicyFault, PolicyOptions, WasmNodes};

fn fault_of(name: &str, limits: Limits) -> PolicyFault {
    let engine = engine_with(limits);
    let symbols = symbols_of(&engine);
    let policy = engine
        .load(&plugin(name), PolicyOptions::default())
        .unwrap();
    let table = WasmNodes::new(&nodes(&symbols, 16));
    let pod = pod(&symbols, 1);
    let result = if policy.role() == gantry_policy::PolicyRole::Score {
        policy.score(&pod, &table).map(|_| ())
    } else {
        policy.filter(&pod, &table).map(|_| ())
    };
    result.expect_err("hostile policy answered")
}

#[test]
fn an_infinite_loop_times_out_with_a_timeout_fault() {
    let deadline = Duration::from_millis(50);
    let engine = engine_with(Limits {
        deadline,
        ..Limits::default()
    });
    let symbols = symbols_of(&engine);
    let policy = engine
        .load(&plugin("hostile-loop"), PolicyOptions::default())
        .unwrap();
    let table = WasmNodes::new(&nodes(&symbols, 16));
    for _ in 0..3 {
        // The refill after each timeout runs on the policy's own thread: wait for it, so the
        // call under test meets the loop, not an empty pool.
        assert!(policy.wait_ready(Duration::from_secs(60)));
        let started = Instant::now();
        let fault = policy.filter(&pod(&symbols, 1), &table).unwrap_err();
        // The fault is asserted; how long it took is only printed (`gantry bench faults`
        // measures it): on a loaded machine the call may overrun the deadline.
        assert_eq!(fault, PolicyFault::Timeout { deadline_ms: 50 });
        println!(
            "a 50 ms deadline ended the loop after {:?}",
            started.elapsed()
        );
    }
    assert_eq!(
        fault_of("hostile-loop", Limits::default()).to_string(),
        "timed out after 50 ms"
    );
}

#[test]
fn a_policy_given_its_own_deadline_is_stopped_at_it_not_the_engines() {
    let engine = engine_with(Limits::default());
    let symbols = symbols_of(&engine);
    let with_deadline = |ms: u64| PolicyOptions {
        deadline: Some(Duration::from_millis(ms)),
        ..PolicyOptions::default()
    };
    let policy = engine
        .load(&plugin("hostile-loop"), with_deadline(120))
        .unwrap();
    let table = WasmNodes::new(&nodes(&symbols, 16));
    let fault = policy.filter(&pod(&symbols, 1), &table).unwrap_err();
    assert_eq!(fault, PolicyFault::Timeout { deadline_ms: 120 });
    for ms in [0, 10_001] {
        let error = engine
            .load(&plugin("hostile-loop"), with_deadline(ms))
            .err()
            .expect("a deadline out of range is refused");
        assert_eq!(
            error.to_string(),
            format!("a policy's call deadline must be 1 to 10000 ms; {ms} ms was asked for")
        );
    }
}

/// Filling 64 MiB takes tens of milliseconds on a busy machine: give the bomb time to reach the
/// cap, so the test sees the memory limit rather than the deadline.
fn patient() -> Limits {
    Limits {
        deadline: Duration::from_secs(2),
        ..Limits::default()
    }
}

#[test]
fn a_memory_bomb_is_out_of_memory() {
    assert_eq!(
        fault_of("hostile-memory-bomb", patient()),
        PolicyFault::OutOfMemory { limit_mib: 64 }
    );
}

#[test]
fn unbounded_recursion_traps() {
    let fault = fault_of("hostile-recursion", Limits::default());
    assert_eq!(fault.kind(), FaultKind::Trap);
    assert_eq!(
        fault.to_string(),
        "trapped: call stack exhausted (unbounded recursion?)"
    );
}

#[test]
fn a_panic_traps_with_its_message_and_the_next_call_is_fresh() {
    let engine = engine();
    let symbols = symbols_of(&engine);
    let policy = engine
        .load(&plugin("hostile-panic"), PolicyOptions::default())
        .unwrap();
    let table = WasmNodes::new(&nodes(&symbols, 16));
    let fault = policy.filter(&pod(&symbols, 2), &table).unwrap_err();
    assert_eq!(fault.kind(), FaultKind::Trap);
    let text = fault.to_string();
    assert!(
        text.contains("hostile-panic: refusing pods that want 2 GPUs"),
        "{text}"
    );
    // The same policy answers a pod it accepts, on a new instance made by its refill thread.
    let created = || {
        policy
            .stats
            .instances_created
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    assert!(policy.wait_ready(Duration::from_secs(60)));
    assert_eq!(created(), 2, "the trapped instance was reused");
    assert_eq!(
        policy.filter(&pod(&symbols, 0), &table).unwrap(),
        vec![0; 16]
    );
    assert_eq!(created(), 2);
}

#[test]
fn output_of_the_wrong_length_is_bad_output() {
    assert_eq!(
        fault_of("hostile-wrong-length", Limits::default()),
        PolicyFault::BadOutput {
            detail: "filter returned 17 verdicts for 16 nodes".into()
        }
    );
}

#[test]
fn an_undeclared_reason_is_bad_output() {
    assert_eq!(
        fault_of("hostile-undeclared-reason", Limits::default()),
        PolicyFault::BadOutput {
            detail: "filter returned reason code 77, which it did not declare at init".into()
        }
    );
}

#[test]
fn a_100_mb_output_is_contained() {
    // Under the default 64 MiB cap the guest cannot even build it.
    assert_eq!(
        fault_of("hostile-huge-output", patient()),
        PolicyFault::OutOfMemory { limit_mib: 64 }
    );
    // With room to build it, the host refuses it for its length.
    let roomy = Limits {
        memory_bytes: 256 << 20,
        ..patient()
    };
    assert_eq!(
        fault_of("hostile-huge-output", roomy),
        PolicyFault::BadOutput {
            detail: "score returned 25000000 scores for 16 nodes".into()
        }
    );
}

#[test]
fn a_thousand_calls_alternating_hostile_and_good() {
    let engine = engine_with(Limits {
        deadline: Duration::from_millis(20),
        ..Limits::default()
    });
    let symbols = symbols_of(&engine);
    let good = engine
        .load(&plugin("gpu-fit"), PolicyOptions::default())
        .unwrap();
    let hostile: Vec<_> = [
        "hostile-loop",
        "hostile-memory-bomb",
        "hostile-recursion",
        "hostile-panic",
        "hostile-wrong-length",
    ]
    .iter()
    .map(|name| {
        engine
            .load(&plugin(name), PolicyOptions::default())
            .unwrap()
    })
    .collect();
    let table = WasmNodes::new(&nodes(&symbols, 64));
    let pod = pod(&symbols, 4);
    let expected = good.filter(&pod, &table).unwrap();
    assert!(expected.contains(&0) && expected.contains(&3));
    let (mut correct, mut contained) = (0, 0);
    for i in 0..1000 {
        if i % 2 == 0 {
            if good.filter(&pod, &table).unwrap() == expected {
                correct += 1;
            }
        } else if hostile[(i / 2) % hostile.len()]
            .filter(&pod, &table)
            .is_err()
        {
            contained += 1;
        }
    }
    assert_eq!((correct, contained), (500, 500));
}
