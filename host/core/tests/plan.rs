//! The planner: runtime estimates from what jobs declare or what finished jobs took, a
//! reservation for a gang blocked for room, and the backfill rule around it.

mod common;

use common::{Fixture, Pool};
use gantry_core::scheduler::plan::EstimateSource;

/// Teaches the planner that single 8-GPU jobs of `default` run `runtime_s`.
fn teach(fx: &mut Fixture, runtime_s: f64, jobs: usize) {
    for i in 0..jobs {
        let id = fx.submit(fx.job(&format!("past-{i}"), "default", 0, 1, 8));
        fx.cycle();
        assert!(fx.sched.is_running(id));
        let started = fx.now_s - 60.0;
        fx.sched.advance_clock(started + runtime_s);
        fx.finish(id);
        fx.now_s = started + runtime_s;
    }
}

#[test]
fn estimates_come_from_the_declaration_else_from_finished_jobs_else_a_prior() {
    let mut fx = Fixture::single_queue(&[Pool::h100(4, 4, None)], 32);
    let spec = fx.job("next", "default", 0, 1, 8);
    let prior = fx.sched.runtime_estimate(&spec);
    assert_eq!(prior.source, EstimateSource::Prior);
    teach(&mut fx, 100.0, 4);
    // Four samples are not enough for a distribution of their own.
    assert_eq!(
        fx.sched.runtime_estimate(&spec).source,
        EstimateSource::Prior
    );
    teach(&mut fx, 300.0, 6);
    let learned = fx.sched.runtime_estimate(&spec);
    assert_eq!(learned.source, EstimateSource::Learned { samples: 10 });
    assert_eq!(
        (learned.p10_s, learned.p50_s, learned.p90_s),
        (100.0, 300.0, 300.0)
    );
    // Another shape of the same queue falls back to the queue's history.
    let gang = fx.job("gang", "default", 0, 4, 8);
    assert_eq!(
        fx.sched.runtime_estimate(&gang).source,
        EstimateSource::Learned { samples: 10 }
    );
    let declared = gantry_core::JobSpec {
        expected_runtime_s: Some(42.0),
        ..spec
    };
    let estimate = fx.sched.runtime_estimate(&declared);
    assert_eq!(estimate.source, EstimateSource::Declared);
    assert_eq!(estimate.p90_s, 42.0);
}

#[test]
fn a_blocked_gang_holds_a_reservation_and_only_short_jobs_backfill_it() {
    // Four nodes of 8 GPUs; single 8-GPU jobs are known to run 600 s.
    let mut fx = Fixture::single_queue(&[Pool::h100(4, 4, None)], 64);
    teach(&mut fx, 600.0, 5);
    let t0 = fx.now_s;
    let running: Vec<_> = (0..4)
        .map(|i| fx.submit(fx.job(&format!("run-{i}"), "default", 0, 1, 8)))
        .collect();
    fx.checked_cycle();
    assert!(running.iter().all(|&id| fx.sched.is_running(id)));
    // The gang of 4 × 8 waits for all four; it gets a reservation when they are due to end.
    let gang = fx.submit(fx.job("gang", "default", 0, 4, 8));
    let out = fx.checked_cycle();
    let estimate = fx
        .decision(&out, gang)
        .explanation
        .estimate
        .clone()
        .expect("the blocked gang has a start estimate");
    assert_eq!(estimate.p50_s, t0 + 600.0);
    assert_eq!(estimate.reservation.as_deref(), Some("4 nodes in rack 0"));
    // One node frees early. A job declared to end before the reservation starts may use it;
    // one declared to run past it may not, though the node is idle.
    fx.sched.advance_clock(t0 + 200.0);
    fx.finish(running[0]);
    fx.now_s = t0 + 200.0;
    let long = fx.submit(gantry_core::JobSpec {
        expected_runtime_s: Some(1000.0),
        ..fx.job("long", "default", 0, 1, 8)
    });
    let short = fx.submit(gantry_core::JobSpec {
        expected_runtime_s: Some(100.0),
        ..fx.job("short", "default", 0, 1, 8)
    });
    fx.checked_cycle();
    assert!(fx.sched.is_running(short), "the short job backfills");
    assert!(
        !fx.sched.is_running(long),
        "the long job would delay the gang"
    );
    assert_eq!(fx.sched.plan_stats().backfilled, 1);
    // When the rest end, the gang starts first.
    fx.sched.advance_clock(t0 + 600.0);
    for &id in &running[1..] {
        fx.finish(id);
    }
    fx.finish(short);
    fx.now_s = t0 + 600.0;
    fx.checked_cycle();
    assert!(fx.sched.is_running(gang));
    assert!(!fx.sched.is_running(long));
}

#[test]
fn what_if_answers_from_the_plan_without_submitting() {
    // Four nodes of 8 GPUs, all busy with jobs known to run 600 s; a gang of 4 × 8 waits.
    let mut fx = Fixture::single_queue(&[Pool::h100(4, 4, None)], 64);
    teach(&mut fx, 600.0, 5);
    let t0 = fx.now_s;
    for i in 0..4 {
        fx.submit(fx.job(&format!("run-{i}"), "default", 0, 1, 8));
    }
    fx.checked_cycle();
    let gang = fx.submit(fx.job("gang", "default", 0, 4, 8));
    fx.checked_cycle();
    let pending_before = fx.sched.pending().len();

    // One more 8-GPU job would wait for the gang ahead of it to run: 600 s, then 600 s more.
    let one = fx.sched.what_if(&fx.job("one", "default", 0, 1, 8));
    let start = one.start.expect("it fits the cluster");
    assert_eq!(start.p50_s, t0 + 1200.0);
    assert_eq!(one.jobs_ahead, 1);
    assert_eq!(one.nodes.as_deref(), Some("1 node in rack 0"));
    assert_eq!(one.runtime.p50_s, 600.0);
    // Nor could a 1-GPU job start sooner: every node is busy, then planned for the gang.
    let small = fx.sched.what_if(&fx.job("small", "default", 0, 1, 1));
    assert_eq!(small.start.map(|s| s.p50_s), Some(t0 + 1200.0));
    // Sixteen 8-GPU pods never fit four nodes.
    let wide = fx.sched.what_if(&fx.job("wide", "default", 0, 16, 8));
    assert_eq!((wide.start, wide.nodes), (None, None));
    // Nothing was submitted, and the gang's estimate stands.
    assert_eq!(fx.sched.pending().len(), pending_before);
    assert_eq!(
        fx.sched.start_estimate(gang).map(|e| e.p50_s),
        Some(t0 + 600.0)
    );
}
