//! The sandbox's bounds on a loaded policy: quarantine, warm spares, string bounds, the log rate
//! limit and the process memory budget, with the hostile policies of `plugins/hostile`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use gantry_core::{JobRequest, QueueUsage, QuotaVerdict};

use crate::{
    Capabilities, FaultKind, Limits, PolicyEngine, PolicyError, PolicyFault, PolicyOptions,
    WasmNodes,
};

/// Long enough for any init on a loaded test machine; a wait, never a measured threshold.
const READY: Duration = Duration::from_secs(60);

fn misbehave(engine: &PolicyEngine, config: &str) -> crate::Result<crate::Policy> {
    engine.load(
        &plugin("hostile-misbehave"),
        PolicyOptions {
            config: config.into(),
            capabilities: Capabilities {
                clock: true,
                ..Capabilities::default()
            },
            ..PolicyOptions::default()
        },
    )
}

#[test]
fn a_slow_init_policy_that_always_traps_is_quarantined_after_k_faults_and_probed_back() {
    let engine = engine_with(Limits {
        init_deadline: Duration::from_secs(10),
        // Long enough that the quarantined calls below run before the first probe is due (the
        // probe's warm instance takes 900 ms to make), short enough to wait for twice.
        quarantine_backoff: Duration::from_secs(3),
        ..Limits::default()
    });
    let k = engine.limits().quarantine_after;
    assert_eq!(k, 5);
    let symbols = symbols_of(&engine);
    let table = WasmNodes::new(&nodes(&symbols, 16));
    let policy = misbehave(&engine, r#"{"init_ms": 900, "trap": true}"#).unwrap();
    let created = || policy.stats.instances_created.load(Ordering::Relaxed);
    let mut trap = None;
    for fault_number in 1..=k {
        assert!(!policy.health().quarantined, "quarantined early");
        assert!(policy.wait_ready(READY), "no warm instance");
        let fault = policy.filter(&pod(&symbols, 1), &table).unwrap_err();
        assert_eq!(fault.kind(), FaultKind::Trap, "{fault}");
        assert_eq!(policy.health().consecutive_faults, fault_number);
        trap = Some(fault);
    }
    let trap = trap.unwrap();
    assert_eq!(
        trap.to_string(),
        "trapped: hostile-misbehave: trapping on a pod that wants 1 GPUs \
         (wasm trap: wasm `unreachable` instruction executed)"
    );
    let health = policy.health();
    assert!(health.quarantined);
    assert_eq!(health.quarantines, 1);
    assert_eq!(health.backoff, Some(Duration::from_secs(3)));
    assert_eq!(health.last_fault.as_ref(), Some(&trap));
    // One instance at load, one refill after each fault (the last one for the probe).
    assert!(policy.wait_ready(READY));
    assert_eq!(created(), 1 + u64::from(k));

    // Quarantined: faults at once, with no Wasm and no new instance.
    for _ in 0..10 {
        let fault = policy.filter(&pod(&symbols, 0), &table).unwrap_err();
        let PolicyFault::Quarantined { faults, last, .. } = &fault else {
            panic!("not quarantined: {fault}");
        };
        assert_eq!((*faults, &**last), (k, &trap));
        assert!(
            fault.to_string().starts_with(&format!(
                "quarantined after 5 consecutive faults (last: {trap}); next probe in "
            )),
            "{fault}"
        );
    }
    assert_eq!(created(), 1 + u64::from(k));
    assert_eq!(policy.stats.quarantined_calls.load(Ordering::Relaxed), 10);
    // How it reads in an explanation.
    assert_eq!(
        PolicyFault::Quarantined {
            faults: 5,
            last: Box::new(trap.clone()),
            probe_in_ms: 3200,
        }
        .to_string(),
        "quarantined after 5 consecutive faults (last: trapped: hostile-misbehave: trapping on \
         a pod that wants 1 GPUs (wasm trap: wasm `unreachable` instruction executed)); next \
         probe in 4 s"
    );

    // A probe that faults doubles the backoff.
    std::thread::sleep(policy.health().probe_in.unwrap());
    let fault = policy.filter(&pod(&symbols, 1), &table).unwrap_err();
    assert_eq!(fault, trap);
    let health = policy.health();
    assert!(health.quarantined);
    assert_eq!(health.backoff, Some(Duration::from_secs(6)));
    assert_eq!(health.consecutive_faults, k + 1);

    // A probe that succeeds lifts the quarantine.
    assert!(policy.wait_ready(READY));
    std::thread::sleep(policy.health().probe_in.unwrap());
    assert_eq!(
        policy.filter(&pod(&symbols, 0), &table).unwrap(),
        vec![0; 16]
    );
    let health = policy.health();
    assert_eq!(
        (
            health.quarantined,
            health.consecutive_faults,
            health.quarantines
        ),
        (false, 0, 1)
    );
    assert_eq!(health.probe_in, None);
}

#[test]
fn a_call_never_instantiates_on_the_callers_thread() {
    let engine = engine_with(Limits {
        init_deadline: Duration::from_secs(10),
        quarantine_after: 100,
        ..Limits::default()
    });
    let symbols = symbols_of(&engine);
    let table = WasmNodes::new(&nodes(&symbols, 16));
    let policy = misbehave(&engine, r#"{"init_ms": 900, "trap": true}"#).unwrap();
    assert!(policy.filter(&pod(&symbols, 1), &table).is_err());
    // The refill takes 900 ms; this call waits at most its deadline, then says why.
    let fault = policy.filter(&pod(&symbols, 0), &table).unwrap_err();
    assert_eq!(
        fault,
        PolicyFault::NotReady {
            waited_ms: 50,
            last_refill: None
        }
    );
    assert_eq!(fault.to_string(), "no warm instance was ready within 50 ms");
    assert!(policy.wait_ready(READY));
    assert_eq!(
        policy.filter(&pod(&symbols, 0), &table).unwrap(),
        vec![0; 16]
    );
}

#[test]
fn strings_a_policy_hands_the_host_are_bounded() {
    let engine = engine();
    let refused = |config: &str| match misbehave(&engine, config) {
        Ok(_) => panic!("{config} loaded"),
        Err(error) => error.to_string(),
    };
    assert_eq!(
        refused(r#"{"name_len": 65}"#),
        "the policy faulted during init: bad output: init returned a name of 65 bytes; names \
         are at most 64 bytes"
    );
    assert_eq!(
        refused(r#"{"version_len": 100}"#),
        "the policy faulted during init: bad output: init returned a version of 100 bytes; \
         versions are at most 64 bytes"
    );
    assert_eq!(
        refused(r#"{"reason_len": 201}"#),
        "the policy faulted during init: bad output: init declared a text of 201 bytes for \
         reason code 1; reason texts are at most 200 bytes"
    );
    assert_eq!(
        refused(r#"{"reasons": 257}"#),
        "the policy faulted during init: bad output: init declared 257 reasons; at most 256 may \
         be declared"
    );
    // At the bounds, it loads.
    misbehave(
        &engine,
        r#"{"name_len": 64, "version_len": 64, "reasons": 256, "reason_len": 200}"#,
    )
    .unwrap();

    let symbols = symbols_of(&engine);
    let job = JobRequest {
        pod: pod(&symbols, 1),
        count: 1,
        ..JobRequest::default()
    };
    let queue = QueueUsage::default();
    let deny = |len: usize| {
        engine
            .load(
                &plugin("hostile-long-deny"),
                PolicyOptions::with_config(len.to_string()),
            )
            .unwrap()
            .admit(&job, &queue, None)
    };
    assert_eq!(
        deny(1025).unwrap_err().to_string(),
        "bad output: admit returned a deny reason of 1025 bytes; deny reasons are at most 1024 \
         bytes"
    );
    assert_eq!(
        deny(1024).unwrap(),
        QuotaVerdict::Deny {
            reason: "x".repeat(1024)
        }
    );
}

/// A `tracing` writer into a shared buffer, so a test reads the lines a policy caused.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_policy_logging_in_a_loop_gets_its_burst_and_one_dropped_line() {
    // No refill, so the count is exact whatever the machine's speed.
    let engine = engine_with(Limits {
        log_lines_per_s: 0,
        log_burst: 100,
        ..Limits::default()
    });
    let symbols = symbols_of(&engine);
    let table = WasmNodes::new(&nodes(&symbols, 4));
    let policy = misbehave(&engine, r#"{"log_lines": 1000}"#).unwrap();
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        policy.filter(&pod(&symbols, 0), &table).unwrap();
    });
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let policy_lines = lines
        .iter()
        .filter(|l| l.contains("hostile-misbehave: line "))
        .count();
    let dropped: Vec<&&str> = lines.iter().filter(|l| l.contains("dropped")).collect();
    assert_eq!(policy_lines, 100, "{text}");
    assert_eq!(dropped.len(), 1, "{text}");
    assert!(
        dropped[0].ends_with(
            "policy=\"hostile-misbehave\" dropped 900 log lines over the rate limit (0/s, \
             bursts of 100)"
        ) || dropped[0].contains("dropped 900 log lines over the rate limit (0/s, bursts of 100)"),
        "{}",
        dropped[0]
    );
    assert_eq!(lines.len(), 101, "{text}");
    assert_eq!(policy.stats.log_lines.load(Ordering::Relaxed), 100);
    assert_eq!(policy.stats.log_dropped.load(Ordering::Relaxed), 900);
}

#[test]
fn policies_past_the_process_budget_are_refused_and_dropping_gives_it_back() {
    let engine = engine_with(Limits {
        process_memory_bytes: 8 << 20,
        ..Limits::default()
    });
    let one = engine
        .load(&plugin("gpu-fit"), PolicyOptions::default())
        .unwrap();
    let each = engine.process_memory_used();
    assert!(each > 0);
    let fit = (8 << 20) / each;
    let mut loaded = vec![one];
    let error = loop {
        match engine.load(&plugin("gpu-fit"), PolicyOptions::default()) {
            Ok(policy) => loaded.push(policy),
            Err(error) => break error,
        }
        assert!(loaded.len() <= fit, "more policies than the budget holds");
    };
    assert_eq!(loaded.len(), fit);
    assert!(matches!(
        error,
        PolicyError::InitFault(PolicyFault::ProcessMemory { budget_mib: 8 })
    ));
    assert_eq!(
        error.to_string(),
        "the policy faulted during init: the process's Wasm memory budget of 8 MiB is spent \
         (all policies' instances together); this instance could not get its memory"
    );
    assert_eq!(engine.process_memory_used(), fit * each);
    drop(loaded);
    assert_eq!(engine.process_memory_used(), 0);
    let _again = engine
        .load(&plugin("gpu-fit"), PolicyOptions::default())
        .unwrap();
    assert_eq!(engine.process_memory_used(), each);
}

#[test]
fn uploads_stop_short_of_the_sets_reserve_which_a_set_policy_still_gets() {
    let (cap, reserve) = (8 << 20, 4 << 20);
    let engine = engine_with(Limits {
        process_memory_bytes: cap,
        set_reserve_bytes: reserve,
        ..Limits::default()
    });
    let upload = || PolicyOptions {
        upload: true,
        ..PolicyOptions::default()
    };
    let first = engine
        .load(&plugin("gpu-fit"), upload())
        .expect("one upload fits");
    let each = engine.process_memory_used();
    assert!(each <= reserve / 2, "{each} bytes per instance");
    let mut uploads = vec![first];
    let error = loop {
        match engine.load(&plugin("gpu-fit"), upload()) {
            Ok(policy) => uploads.push(policy),
            Err(error) => break error,
        }
        assert!(
            uploads.len() <= cap / each,
            "more uploads than the budget holds"
        );
    };
    assert_eq!(uploads.len(), (cap - reserve) / each);
    assert_eq!(
        error.to_string(),
        "the policy faulted during init: the Wasm memory uploads may use (4 MiB; 4 MiB of the \
         budget are kept for the active and shadow sets) is spent; try again once other uploads \
         are done"
    );
    // A set's policy takes the reserve.
    let _in_set = engine
        .load(&plugin("gpu-fit"), PolicyOptions::default())
        .expect("a set's policy loads past the uploads' share");
    assert!(engine.process_memory_used() > cap - reserve);
    // With the uploads gone, an upload fits again.
    drop(uploads);
    assert!(engine.load(&plugin("gpu-fit"), upload()).is_ok());
}

#[test]
fn a_spare_nobody_waits_for_pauses_while_the_loop_cycles_and_one_a_caller_waits_for_does_not() {
    let engine = engine_with(Limits {
        init_deadline: Duration::from_secs(10),
        // Callers wait up to the deadline for an instance: long enough for a 300 ms init.
        deadline: Duration::from_secs(10),
        ..Limits::default()
    });
    let symbols = symbols_of(&engine);
    let table = WasmNodes::new(&nodes(&symbols, 16));
    let policy = misbehave(&engine, r#"{"init_ms": 300, "trap": true}"#).unwrap();
    let created = || policy.stats.instances_created.load(Ordering::Relaxed);
    assert!(policy.wait_ready(READY));
    assert_eq!(created(), 1);

    let gate = engine.cycle_gate();
    let cycle = gate.enter();
    // The trap discards the only instance; its spare starts with nobody waiting, so it pauses
    // while the loop is in its cycle: more than three inits' time later, none is ready.
    let fault = policy.filter(&pod(&symbols, 1), &table).unwrap_err();
    assert_eq!(fault.kind(), FaultKind::Trap, "{fault}");
    assert!(
        !policy.wait_ready(Duration::from_secs(1)),
        "a spare was made while the loop cycled"
    );
    assert_eq!(created(), 2, "the spare was not started");
    // A caller now waits for it, so it goes on, inside the cycle.
    let fault = policy.filter(&pod(&symbols, 1), &table).unwrap_err();
    assert_eq!(fault.kind(), FaultKind::Trap, "{fault}");
    // Its own spare waits for the cycle to end, and is made once it has.
    assert!(!policy.wait_ready(Duration::from_secs(1)));
    drop(cycle);
    assert!(policy.wait_ready(READY));
}

#[test]
fn a_shadow_call_pauses_in_the_guest_while_the_loop_cycles_and_the_pause_is_not_its_time() {
    use gantry_core::{ClusterState, PolicyHooks, Verdict};
    let deadline = Duration::from_millis(200);
    let engine = engine_with(Limits {
        deadline,
        ..Limits::default()
    });
    let symbols = symbols_of(&engine);
    let policy = Arc::new(
        engine
            .load(&plugin("hostile-loop"), PolicyOptions::default())
            .unwrap(),
    );
    assert!(policy.wait_ready(READY));
    let set = crate::PolicySet::new(1, vec![crate::SetEntry { policy, weight: 1 }]);
    let state = ClusterState::new(nodes(&symbols, 16));
    let gate = engine.cycle_gate();
    let held = Duration::from_millis(600);
    let (verdict, took) = std::thread::scope(|scope| {
        let shadow = scope.spawn(|| {
            let mut cache = crate::NodeCache::default();
            let mut bound = set.bind(&mut cache).waiting_on(gate.clone());
            let started = std::time::Instant::now();
            let mut verdicts = bound.filter(&state, &pod(&symbols, 1), 0..16, &[true; 16]);
            (verdicts.remove(0).1, started.elapsed())
        });
        // Let the call get into its loop, then cycle for three deadlines' time.
        std::thread::sleep(Duration::from_millis(50));
        let cycle = gate.enter();
        std::thread::sleep(held);
        drop(cycle);
        shadow.join().unwrap()
    });
    let Verdict::Rejected(fault) = verdict else {
        panic!("the loop answered: {verdict:?}");
    };
    assert_eq!(fault, "timed out after 200 ms");
    // Without the pause it would have timed out inside the cycle, at about 200 ms.
    assert!(
        took >= held,
        "timed out after {took:?}, inside the loop's cycle"
    );
}
