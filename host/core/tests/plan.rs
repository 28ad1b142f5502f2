//! The planner: runtime estimates from what jobs declare or what finished jobs took, a
//! reservation for a gang blocked for room, and the backfill rule around it.

mod common;

use common::{Fixture, Pool};
use gantry_core::scheduler::plan::EstimateSource;
use std::collections::BTreeMap;

use gantry_core::{JobId, JobSpec};

/// Teaches the planner that single 8-GPU jobs of `default` run `runtime_s`.
fn teach(fx: &mut Fixture, runtime_s: f64, jobs: usize) {
    teach_each(fx, &vec![runtime_s; jobs]);
}

/// Teaches the planner that single 8-GPU jobs of `default` ran `runtimes_s`, one job each.
fn teach_each(fx: &mut Fixture, runtimes_s: &[f64]) {
    for (i, &runtime_s) in runtimes_s.iter().enumerate() {
        let id = fx.submit(fx.job(&format!("past-{i}"), "default", 0, 1, 8));
        fx.cycle();
        assert!(fx.sched.is_running(id));
        let started = fx.now_s - 60.0;
        fx.sched.advance_clock(started + runtime_s);
        fx.finish(id);
        fx.now_s = started + runtime_s;
    }
}

/// Four nodes of 8 GPUs in one rack, one queue of `quota` GPUs, planned with `config`.
fn four_nodes(quota: u64, config: gantry_core::PlanConfig) -> Fixture {
    let mut fx = Fixture::single_queue(&[Pool::h100(4, 4, None)], quota);
    fx.sched.set_plan_config(config);
    fx
}

/// The default plan, but every waiting job is aged at once: a blocked job gets its reservation
/// in the cycle that blocks it, as Slurm's EASY backfill gives the head one. For the tests of
/// what a reservation does, apart from when it comes.
fn reserving_at_once() -> gantry_core::PlanConfig {
    gantry_core::PlanConfig {
        reserve_after_s: Some(0.0),
        ..gantry_core::PlanConfig::default()
    }
}

/// A job of `default` of `pods` × `gpus` that declares it runs `runtime_s`.
fn declaring(fx: &Fixture, name: &str, pods: u32, gpus: u32, runtime_s: f64) -> JobSpec {
    JobSpec {
        expected_runtime_s: Some(runtime_s),
        ..fx.job(name, "default", 0, pods, gpus)
    }
}

/// Four single 8-GPU jobs fill the four nodes, then a gang of 4 × 8 waits behind them:
/// when they started, and the gang.
fn busy_then_gang(fx: &mut Fixture) -> (f64, JobId) {
    let t0 = fx.now_s;
    for i in 0..4 {
        fx.submit(fx.job(&format!("run-{i}"), "default", 0, 1, 8));
    }
    fx.checked_cycle();
    let gang = fx.submit(fx.job("gang", "default", 0, 4, 8));
    fx.checked_cycle();
    (t0, gang)
}

/// What [`gang_then_long_as_a_node_frees`] set up.
struct GangThenLong {
    gang: JobId,
    long: JobId,
    /// When the long job was told it would start, after t0 (before the node freed).
    long_told_s: f64,
}

/// Four single 8-GPU jobs fill the four nodes at t0, declared to end at t0 + 100 s (one) and
/// t0 + 600 s (three); a gang of 4 × 8 waits for all four, and a long 8-GPU job behind it.
/// Then the first node frees at t0 + 100 s, and no cycle has seen it yet.
fn gang_then_long_as_a_node_frees(fx: &mut Fixture) -> GangThenLong {
    let t0 = fx.now_s;
    let running: Vec<_> = [100.0, 600.0, 600.0, 600.0]
        .iter()
        .enumerate()
        .map(|(i, &runtime_s)| fx.submit(declaring(fx, &format!("run-{i}"), 1, 8, runtime_s)))
        .collect();
    fx.checked_cycle();
    let gang = fx.submit(declaring(fx, "gang", 4, 8, 600.0));
    let long = fx.submit(declaring(fx, "long", 1, 8, 1000.0));
    fx.checked_cycle();
    let long_told_s = fx.sched.start_estimate(long).expect("an estimate").p50_s - t0;
    fx.sched.advance_clock(t0 + 100.0);
    fx.finish(running[0]);
    fx.now_s = t0 + 100.0;
    GangThenLong {
        gang,
        long,
        long_told_s,
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
    let mut fx = four_nodes(64, reserving_at_once());
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
    assert_eq!(
        estimate.reservation.as_deref(),
        Some("4 nodes in rack 0 and 32 GPUs of queue default's quota")
    );
    // One node frees early. A job declared to end before the reservation starts may use it;
    // one declared to run past it may not, though the node is idle.
    fx.sched.advance_clock(t0 + 200.0);
    fx.finish(running[0]);
    fx.now_s = t0 + 200.0;
    let long = fx.submit(declaring(&fx, "long", 1, 8, 1000.0));
    let short = fx.submit(declaring(&fx, "short", 1, 8, 100.0));
    let out = fx.checked_cycle();
    assert!(fx.sched.is_running(short), "the short job backfills");
    assert!(
        !fx.sched.is_running(long),
        "the long job would delay the gang"
    );
    // And its explanation says so.
    match &fx.decision(&out, long).explanation.outcome {
        gantry_core::Outcome::Pending { waiting_for } => assert!(
            waiting_for.ends_with(
                "; 1 node is held for the reservation of gang, which starts before this job \
                 is expected to end"
            ),
            "{waiting_for}"
        ),
        other => panic!("long: {other:?}"),
    }
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
fn a_job_waiting_for_quota_gets_its_start_from_the_forecast() {
    // One node's worth of quota (8 GPUs) on four nodes; single 8-GPU jobs are known to run
    // 600 s. The second job waits for quota, not room, so only the forecast estimates it.
    let run = |forecast_every_s: f64| {
        let mut fx = four_nodes(
            8,
            gantry_core::PlanConfig {
                forecast_every_s,
                ..gantry_core::PlanConfig::default()
            },
        );
        teach(&mut fx, 600.0, 5);
        let t0 = fx.now_s;
        let first = fx.submit(fx.job("first", "default", 0, 1, 8));
        fx.checked_cycle();
        assert!(fx.sched.is_running(first));
        let next = fx.submit(fx.job("next", "default", 0, 1, 8));
        let out = fx.checked_cycle();
        match &fx.decision(&out, next).explanation.outcome {
            gantry_core::Outcome::Pending { waiting_for } => {
                assert!(waiting_for.starts_with("quota"), "{waiting_for}")
            }
            other => panic!("next: {other:?}"),
        }
        (t0, fx.decision(&out, next).explanation.estimate.clone())
    };
    let (t0, estimate) = run(gantry_core::PlanConfig::default().forecast_every_s);
    let estimate = estimate.expect("the forecast estimates a job waiting for quota");
    // It starts when `first` gives its quota back, in every scenario (no runtime varies).
    assert_eq!(
        (estimate.p10_s, estimate.p50_s, estimate.p90_s),
        (t0 + 600.0, t0 + 600.0, t0 + 600.0)
    );
    assert_eq!(estimate.reservation, None);
    let (_, without) = run(f64::INFINITY);
    assert_eq!(
        without, None,
        "without the forecast, only the timeline estimates"
    );
}

#[test]
fn a_forecast_comes_due_on_a_quiet_cluster() {
    // One node's worth of quota; the second job waits for quota, which only the forecast
    // estimates. It was submitted just after a forecast, and then nothing changes: no replan
    // is needed, but the forecast still comes due once its interval has passed.
    let mut fx = four_nodes(
        8,
        gantry_core::PlanConfig {
            forecast_every_s: 600.0,
            ..gantry_core::PlanConfig::default()
        },
    );
    let first = fx.submit(fx.job("first", "default", 0, 1, 8));
    fx.checked_cycle();
    assert!(fx.sched.is_running(first));
    let forecast_at = fx.now_s - 60.0;
    let next = fx.submit(fx.job("next", "default", 0, 1, 8));
    let mut told_at = None;
    // The cycles that list it as newly estimated, though none tries it (it is parked).
    let mut listed_at = Vec::new();
    for _ in 0..15 {
        let out = fx.checked_cycle();
        let at = fx.now_s - 60.0;
        if out.newly_estimated.contains(&next) {
            listed_at.push(at);
        }
        if told_at.is_none() && fx.sched.start_estimate(next).is_some() {
            told_at = Some(at);
        }
    }
    assert_eq!(told_at, Some(forecast_at + 600.0));
    assert_eq!(
        listed_at,
        vec![forecast_at + 600.0],
        "listed once, when told"
    );
}

#[test]
fn a_reservations_holder_is_told_when_the_last_of_its_blockers_is_likely_to_end() {
    // Four nodes of 8 GPUs; single 8-GPU jobs ran 100, 300, 500, 700 and 900 s.
    let mut fx = four_nodes(
        64,
        gantry_core::PlanConfig {
            forecast_every_s: 1.0,
            ..reserving_at_once()
        },
    );
    teach_each(&mut fx, &[100.0, 300.0, 500.0, 700.0, 900.0]);
    let (t0, gang) = busy_then_gang(&mut fx);
    let estimate = fx.sched.start_estimate(gang).expect("an estimate");
    assert!(estimate.reservation.is_some(), "{estimate:?}");
    // The plan reserves the nodes from the running jobs' median end (t0 + 500 s), but the
    // gang needs all four, so it starts when the last of them ends: in most of the
    // forecast's drawn runs, later than that.
    assert!(estimate.p50_s > t0 + 500.0, "{estimate:?}");
    assert!(estimate.p10_s <= t0 + 500.0, "{estimate:?}");
    assert!(estimate.p90_s >= estimate.p50_s, "{estimate:?}");
}

#[test]
fn a_job_behind_a_gang_without_a_reservation_is_told_it_starts_first() {
    // Four nodes of 8 GPUs, busy: one frees at t0 + 100 s, three at t0 + 600 s. A gang of
    // 4 × 8 waits for all four; a long 8-GPU job behind it could start on the first node to
    // free. Whether it does depends on the gang's reservation, and its estimate says the same.
    let run = |reservations: bool| {
        let mut fx = four_nodes(
            64,
            gantry_core::PlanConfig {
                reservations,
                forecast_every_s: f64::INFINITY,
                ..reserving_at_once()
            },
        );
        let busy = gang_then_long_as_a_node_frees(&mut fx);
        // What the cycle does when the first node frees.
        fx.checked_cycle();
        assert!(!fx.sched.is_running(busy.gang));
        (busy.long_told_s, fx.sched.is_running(busy.long))
    };
    // Held, the gang's nodes are kept from a job that would run across its start: the long
    // job waits for the gang to start and end.
    assert_eq!(run(true), (1200.0, false));
    // Not held, the first cycle the long job fits places it, ahead of the gang.
    assert_eq!(run(false), (100.0, true));
}

#[test]
fn a_job_held_off_a_reserved_node_wakes_when_the_reservation_goes() {
    // Four nodes of 8 GPUs, busy: one frees at t0 + 100 s, three at t0 + 600 s. A gang of
    // 4 × 8 holds all four from t0 + 600 s, so a long job behind it is held off the node that
    // frees first, and parked for room.
    let mut fx = four_nodes(
        64,
        gantry_core::PlanConfig {
            forecast_every_s: f64::INFINITY,
            ..reserving_at_once()
        },
    );
    let GangThenLong { gang, long, .. } = gang_then_long_as_a_node_frees(&mut fx);
    fx.checked_cycle();
    assert!(!fx.sched.is_running(long));
    assert_eq!(
        fx.sched
            .scheduling_queue()
            .parked(long)
            .map(|(blocked, _)| blocked),
        Some(gantry_core::Blocked::Room)
    );
    // The gang is withdrawn: nothing is freed, but its reservation no longer holds the node,
    // and the next cycle places the long job there (not a flush five minutes later).
    fx.finish(gang);
    fx.checked_cycle();
    assert!(
        fx.sched.is_running(long),
        "the long job starts once the reservation goes"
    );
}

#[test]
fn what_if_answers_from_the_plan_without_submitting() {
    // Four nodes of 8 GPUs, all busy with jobs known to run 600 s; a gang of 4 × 8 waits.
    let mut fx = Fixture::single_queue(&[Pool::h100(4, 4, None)], 64);
    teach(&mut fx, 600.0, 5);
    let (t0, gang) = busy_then_gang(&mut fx);
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

/// Four nodes of 8 GPUs and a queue of 16: two 8-GPU jobs (known to run 600 s) use its quota,
/// and `waiting` more (`wait-0` first) wait for it though room is free, each tried once.
fn queue_at_quota(waiting: usize) -> (Fixture, Vec<JobId>) {
    let mut fx = Fixture::single_queue(&[Pool::h100(4, 4, None)], 16);
    teach(&mut fx, 600.0, 5);
    for i in 0..2 {
        fx.submit(fx.job(&format!("run-{i}"), "default", 0, 1, 8));
    }
    fx.checked_cycle();
    let ids = (0..waiting)
        .map(|i| fx.submit(fx.job(&format!("wait-{i}"), "default", 0, 1, 8)))
        .collect();
    fx.checked_cycle();
    (fx, ids)
}

#[test]
fn a_what_if_counts_quota_and_every_job_ahead_in_its_queue() {
    // Three jobs wait for the queue's quota though room is free.
    let (fx, ahead) = queue_at_quota(3);
    let now_s = fx.sched.clock_s();
    let spec = fx.job("one", "default", 0, 1, 8);

    // The plan alone sees free room and answers "now": what the forecast corrects.
    let plan = fx.sched.what_if(&spec);
    assert_eq!(plan.start.map(|s| s.p50_s), Some(now_s));

    let pending_before = fx.sched.pending().len();
    let answer = fx.sched.what_if_run(&spec, None).run();
    assert_eq!(answer.jobs_ahead, 3, "every job of its queue ahead of it");
    let start = answer.start.expect("the forecast reaches it");
    // The queue runs two at a time: the three ahead take the next two turns, so it waits for
    // the third (two runtimes), never less.
    assert!(start.p50_s >= now_s + 1000.0, "{start:?} at {now_s}");
    assert!(
        start.p10_s <= start.p50_s && start.p50_s <= start.p90_s,
        "{start:?}"
    );
    // Nothing was submitted.
    assert_eq!(fx.sched.pending().len(), pending_before);

    // Made like the last job ahead, it is tried after it: never earlier than its estimate.
    let last = *ahead.last().expect("three");
    let like = fx.sched.what_if_run(fx.sched.job(last), Some(last)).run();
    let own = fx.sched.start_estimate(last).map(|e| e.p50_s);
    let like_start = like.start.as_ref().map(|s| s.p50_s).or(like.beyond_s);
    assert!(
        own.is_some_and(|own| like_start.is_some_and(|s| s >= own)),
        "{like:?} against {own:?}"
    );
}

/// The what-if line of the planner issue, where most of a queue is beyond the forecast: a job
/// asked about behind 1,500 others of a queue at its quota answers later than every job ahead
/// of it, those estimated and those given only a bound (the work ahead of them on the GPUs the
/// queue may hold), and it says it is not reached rather than give a start.
#[test]
fn a_what_if_behind_a_queue_beyond_the_forecast_answers_later_than_every_job_ahead() {
    const WAITING: usize = 1500;
    let (fx, waiting) = queue_at_quota(WAITING);
    let now_s = fx.sched.clock_s();
    let answer = fx
        .sched
        .what_if_run(&fx.job("asked", "default", 0, 2, 8), None)
        .run();
    assert_eq!(answer.jobs_ahead, WAITING, "{answer:?}");
    assert!(answer.start.is_none(), "beyond the forecast: {answer:?}");
    let beyond_s = answer.beyond_s.expect("a bound");
    let estimated: Vec<f64> = waiting
        .iter()
        .filter_map(|&id| fx.sched.start_estimate(id).map(|e| e.p50_s))
        .collect();
    assert!(!estimated.is_empty(), "the head of the queue is estimated");
    let latest = estimated.iter().copied().fold(now_s, f64::max);
    assert!(
        beyond_s > latest,
        "{beyond_s} against the latest estimate {latest}"
    );
    // The last job ahead waits for the work of the 1,499 before it, 600 s each on 8 GPUs, two
    // at a time on the queue's 16: the asked job, after it too, waits at least that.
    let work_before_last_s = (WAITING - 1) as f64 * 600.0 * 8.0 / 16.0;
    assert!(
        beyond_s >= now_s + work_before_last_s,
        "{beyond_s} against {work_before_last_s} s of work ahead of the last job, from {now_s}"
    );
}

#[test]
fn every_pending_job_has_an_estimate_or_a_sentence_saying_why_not() {
    // 1,500 jobs wait for the queue's quota, far more than a bounded forecast run reaches.
    const WAITING: usize = 1500;
    let (mut fx, waiting) = queue_at_quota(WAITING);
    let texts = fx.sched.no_estimate_texts();
    for &id in &fx.sched.pending() {
        assert!(
            fx.sched.start_estimate(id).is_some() != texts.contains_key(&id),
            "{}: an estimate or a sentence, never both nor neither",
            fx.sched.job(id).name
        );
    }
    assert!(
        fx.sched.start_estimate(waiting[0]).is_some(),
        "the head is estimated"
    );
    let last = texts
        .get(&waiting[WAITING - 1])
        .expect("the last is not reached");
    assert!(
        last.starts_with("not expected to start within ")
            && last.contains(&format!(
                "{} pending job(s) of queue default tried before it",
                WAITING - 1
            ))
            && last.contains("on the 16 GPUs the queue may hold"),
        "{last}"
    );

    // One submitted after the forecast is told so, and when the next is due.
    let late = fx.submit(fx.job("late", "default", 0, 1, 8));
    let text = &fx.sched.no_estimate_texts()[&late];
    assert!(
        text.starts_with("not estimated yet: it came after the last forecast"),
        "{text}"
    );

    // With the forecast off, the jobs the plan does not cover are told that.
    let mut off = four_nodes(
        8,
        gantry_core::PlanConfig {
            forecast_every_s: f64::INFINITY,
            ..gantry_core::PlanConfig::default()
        },
    );
    off.submit(off.job("first", "default", 0, 1, 8));
    off.checked_cycle();
    let next = off.submit(off.job("next", "default", 0, 1, 8));
    off.checked_cycle();
    assert_eq!(
        off.sched.no_estimate_texts().get(&next).map(String::as_str),
        Some(
            "the forecast is off: only the first jobs waiting for room, which the plan covers, \
             get a start estimate"
        )
    );
}

#[test]
fn a_forecast_steps_at_its_resolution_and_so_looks_further_ahead() {
    // Four nodes of 8 GPUs; single 8-GPU jobs are known to run 10 s, and 2,000 wait: a run
    // stepping at every job end (four at once, every 10 s) spends its bounded cycles on the
    // next 43 minutes.
    let horizon_s = |forecast_step_s: f64| {
        let mut fx = four_nodes(
            32,
            gantry_core::PlanConfig {
                forecast_step_s,
                ..gantry_core::PlanConfig::default()
            },
        );
        teach(&mut fx, 10.0, 5);
        for i in 0..2000 {
            fx.submit(fx.job(&format!("wait-{i}"), "default", 0, 1, 8));
        }
        fx.checked_cycle();
        fx.sched.forecast_run_now().run().horizon_s()
    };
    let (each_end, by_minute) = (horizon_s(0.0), horizon_s(60.0));
    assert!(
        by_minute >= 5.0 * each_end && by_minute >= 3600.0,
        "stepping at every end looked {each_end} s ahead, by the minute {by_minute} s"
    );
}

/// One small job of the stream: GPUs (of one 8-GPU node), declared runtime, and the share of
/// it that it truly runs (the planner sees only the declaration).
#[derive(Debug, Clone, Copy)]
struct Small {
    gpus: u32,
    declared_s: u32,
    true_share: f64,
}

fn small() -> impl proptest::strategy::Strategy<Value = Small> {
    use proptest::prelude::*;
    (
        prop::sample::select(vec![1u32, 2, 4, 8]),
        60u32..=900,
        0.5f64..=1.0,
    )
        .prop_map(|(gpus, declared_s, true_share)| Small {
            gpus,
            declared_s,
            true_share,
        })
}

/// What a stream run saw: when the gang started (if it did) and when it arrived.
struct StreamRun {
    gang_arrived_s: f64,
    /// Small jobs pending when the gang arrived: ahead of it in its queue.
    ahead: usize,
    gang_started_s: Option<f64>,
    /// Small jobs placed after the gang arrived: the stream kept flowing around it.
    placed_after_arrival: usize,
    /// The longest age threshold the planner's rule gave while the gang waited: past it, the
    /// gang holds a reservation.
    age_threshold_s: f64,
}

/// `nodes` 8-GPU nodes; a stream of small jobs (up to `nodes / 2` of `arrivals[i]` submitted
/// before cycle `i`, one cycle a minute: about 70% of the GPUs on average), and at cycle
/// `gang_at` a gang of `gang_pods` × 8 GPUs declared to run an
/// hour. Jobs end at their true runtime; the planner knows only what they declare.
fn run_stream(
    nodes: u32,
    gang_pods: u32,
    gang_at: usize,
    arrivals: &[Vec<Small>],
    reservations: bool,
) -> StreamRun {
    // Quota well above the cluster: what blocks the gang is room, not its queue.
    let mut fx = Fixture::single_queue(&[Pool::h100(nodes, 4, None)], u64::from(nodes) * 16);
    fx.sched
        .set_plan_config(gantry_core::scheduler::plan::PlanConfig {
            enabled: true,
            reservations,
            ..Default::default()
        });
    // Job id → (true runtime, started at).
    let mut true_runtime = std::collections::BTreeMap::new();
    let mut started = std::collections::BTreeMap::<gantry_core::JobId, f64>::new();
    let mut gang = None;
    let mut gang_arrived_s = 0.0;
    let mut ahead = 0;
    let mut placed_after_arrival = 0;
    let mut age_threshold_s: f64 = 0.0;
    for (cycle, batch) in arrivals.iter().enumerate() {
        // Jobs end, in order of their true ends, up to this cycle.
        let mut ending: Vec<(f64, gantry_core::JobId)> = started
            .iter()
            .map(|(&id, &at)| (at + true_runtime[&id], id))
            .filter(|&(end, _)| end <= fx.now_s)
            .collect();
        ending.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (end, id) in ending {
            fx.sched.advance_clock(end);
            fx.finish(id);
            started.remove(&id);
        }
        if cycle == gang_at {
            let spec = gantry_core::JobSpec {
                expected_runtime_s: Some(3600.0),
                ..fx.job("gang", "default", 0, gang_pods, 8)
            };
            gang_arrived_s = fx.now_s;
            ahead = fx.sched.pending().len();
            let id = fx.submit(spec);
            true_runtime.insert(id, 3600.0);
            gang = Some(id);
        }
        for (i, s) in batch.iter().take(nodes as usize / 2).enumerate() {
            let spec = gantry_core::JobSpec {
                expected_runtime_s: Some(f64::from(s.declared_s)),
                ..fx.job(&format!("small-{cycle}-{i}"), "default", 0, 1, s.gpus)
            };
            let id = fx.submit(spec);
            true_runtime.insert(id, f64::from(s.declared_s) * s.true_share);
        }
        let at = fx.now_s;
        fx.sched.advance_clock(at);
        fx.checked_cycle();
        if gang.is_some() {
            age_threshold_s =
                age_threshold_s.max(fx.sched.reservation_rule_in_force().age_threshold_s);
        }
        for id in fx.sched.running().collect::<Vec<_>>() {
            if let std::collections::btree_map::Entry::Vacant(e) = started.entry(id) {
                e.insert(at);
                if gang.is_some() && Some(id) != gang {
                    placed_after_arrival += 1;
                }
            }
        }
        if let Some(id) = gang
            && started.contains_key(&id)
        {
            return StreamRun {
                gang_arrived_s,
                ahead,
                gang_started_s: Some(started[&id]),
                placed_after_arrival,
                age_threshold_s,
            };
        }
    }
    StreamRun {
        gang_arrived_s,
        ahead,
        gang_started_s: None,
        placed_after_arrival,
        age_threshold_s,
    }
}

/// Arrivals for `cycles` minutes: up to 5 small jobs a minute (`run_stream` takes as many as
/// the cluster's size calls for).
fn stream(cycles: usize) -> impl proptest::strategy::Strategy<Value = Vec<Vec<Small>>> {
    use proptest::prelude::*;
    prop::collection::vec(prop::collection::vec(small(), 0..=5), cycles)
}

/// The latest start the reservations promise a gang that arrived behind `ahead` jobs of its
/// queue: once it has waited the age threshold, each aged job ahead of it in turn, then the
/// gang, holds a reservation that starts once the jobs running then end (within the stream's
/// `longest` declared runtime, since no job placed later may run on its nodes past it) and
/// starts in the next cycle (a minute).
fn promised_start(run: &StreamRun, longest: f64) -> f64 {
    run.gang_arrived_s + run.age_threshold_s + (run.ahead as f64 + 1.0) * (longest + 60.0)
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(24),
        ..proptest::test_runner::Config::default()
    })]

    /// Liveness: a gang that fits the cluster, arriving into a steady stream of small jobs
    /// that declare their runtimes (and end at or before them), starts by the time
    /// [`promised_start`] derives from those runtimes and the jobs ahead of it.
    #[test]
    fn a_gang_in_a_stream_of_small_jobs_starts_within_a_bound_from_the_runtimes(
        nodes in 4u32..=10,
        gang_share in 0.5f64..=1.0,
        gang_at in 20usize..40,
        arrivals in stream(150),
    ) {
        let gang_pods = ((f64::from(nodes) * gang_share).ceil() as u32).clamp(1, nodes);
        let longest = arrivals
            .iter()
            .flatten()
            .map(|s| f64::from(s.declared_s))
            .fold(0.0, f64::max);
        let run = run_stream(nodes, gang_pods, gang_at, &arrivals, true);
        let bound = promised_start(&run, longest);
        let started = run.gang_started_s;
        proptest::prop_assert!(
            started.is_some_and(|s| s <= bound),
            "a gang of {gang_pods} × 8 GPUs on {nodes} nodes arrived at {} s behind {} jobs \
             and started at {started:?}, past the bound {bound} s",
            run.gang_arrived_s,
            run.ahead,
        );
    }
}

#[test]
fn without_reservations_the_same_stream_starves_the_gang() {
    // The check above can fail: with reservations off, a whole-cluster gang in a stream that
    // keeps every node partly busy waits far past the bound (here, to the end of the run).
    use proptest::strategy::{Strategy, ValueTree};
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let arrivals = stream(150)
        .new_tree(&mut runner)
        .expect("a stream")
        .current();
    let longest = arrivals
        .iter()
        .flatten()
        .map(|s| f64::from(s.declared_s))
        .fold(0.0, f64::max);
    let starved = run_stream(6, 6, 20, &arrivals, false);
    let bound = promised_start(&starved, longest);
    assert!(
        starved.gang_started_s.is_none_or(|s| s > bound),
        "without reservations the gang started at {:?}, within {bound} s",
        starved.gang_started_s
    );
    assert!(starved.placed_after_arrival > 50, "the stream kept flowing");
    let reserved = run_stream(6, 6, 20, &arrivals, true);
    assert!(
        reserved
            .gang_started_s
            .is_some_and(|s| s <= promised_start(&reserved, longest)),
        "with reservations the gang started at {:?}",
        reserved.gang_started_s
    );
    assert!(
        reserved.placed_after_arrival > 0,
        "small jobs backfilled around the reservation"
    );
}

/// Liveness: a big gang never starves behind a stream of smaller jobs, under quota as well as
/// for room. Eight nodes of 8 GPUs; a cohort of four queues of 16 GPUs: `lender` (no jobs of
/// its own), `a` (may borrow 16 more), `b` and `c`. A random stream of single pods of 1 to 8
/// GPUs from `a`, `b` and `c`, each running 100 to 1,000 s, keeps `a`'s own quota and the
/// lender's idle quota in use; into it comes a gang of 4 × 8 in `a`, which needs all of `a`'s
/// quota and all it may borrow. Without a reservation holding quota, `a`'s smaller jobs and
/// the other queues' borrowers keep taking what frees.
mod liveness {
    use super::*;
    use common::queue;
    use proptest::prelude::*;

    /// A stream job: the gap since the one before, its queue (`a`, `b` or `c`), GPUs and
    /// true runtime (which only the test knows; the planner learns runtimes as jobs end).
    #[derive(Debug, Clone)]
    struct Arrival {
        gap_s: f64,
        queue: usize,
        gpus: u32,
        runtime_s: f64,
    }

    fn stream() -> impl Strategy<Value = Vec<Arrival>> {
        prop::collection::vec(
            (
                0.0..90.0f64,
                0..3usize,
                prop_oneof![Just(1u32), Just(2), Just(4), Just(8)],
                100.0..1000.0f64,
            )
                .prop_map(|(gap_s, queue, gpus, runtime_s)| Arrival {
                    gap_s,
                    queue,
                    gpus,
                    runtime_s,
                }),
            150..220,
        )
    }

    fn fixture() -> Fixture {
        let mut a = queue("a", Some("cohort"), 16);
        a.borrowing_limit_gpus = Some(16);
        let defs = [
            queue("cohort", None, 0),
            queue("lender", Some("cohort"), 16),
            a,
            queue("b", Some("cohort"), 16),
            queue("c", Some("cohort"), 16),
        ];
        let mut fx = Fixture::new(&[Pool::h100(8, 4, None)], &defs);
        // The gate is pinned open: this checks what a reservation guarantees once given; the
        // gate's own effect is what the gang-burst scenarios measure.
        fx.sched.set_plan_config(gantry_core::PlanConfig {
            backlog_limit_s: Some(f64::INFINITY),
            ..gantry_core::PlanConfig::default()
        });
        fx
    }

    /// Replays `stream` with the gang submitted after its `gang_after`th job, a cycle a
    /// minute: the gang's wait, and the bound it must start within.
    fn gang_wait(stream: &[Arrival], gang_after: usize) -> (f64, f64) {
        let mut fx = fixture();
        let mut id_to_run: BTreeMap<JobId, (f64, Option<f64>)> = BTreeMap::new();
        let mut next_s = 0.0;
        let mut arrivals = stream.iter().enumerate().map(|(i, arrival)| {
            next_s += arrival.gap_s;
            (i, next_s, arrival)
        });
        let mut pending_arrival = arrivals.next();
        let mut gang: Option<(JobId, f64)> = None;
        let (mut age_s, mut p90_s) = (0.0f64, 0.0f64);
        loop {
            let now_s = fx.now_s;
            while let Some((i, at_s, arrival)) = pending_arrival
                && at_s <= now_s
            {
                let name = ["a", "b", "c"][arrival.queue];
                let id = fx.submit(fx.job(&format!("s{i}"), name, 0, 1, arrival.gpus));
                id_to_run.insert(id, (arrival.runtime_s, None));
                if i + 1 == gang_after {
                    let id = fx.submit(fx.job("gang", "a", 0, 4, 8));
                    gang = Some((id, now_s));
                }
                pending_arrival = arrivals.next();
            }
            let ended: Vec<JobId> = id_to_run
                .iter()
                .filter(|(_, (runtime_s, started))| started.is_some_and(|s| s + runtime_s <= now_s))
                .map(|(&id, _)| id)
                .collect();
            for id in ended {
                fx.sched.advance_clock(now_s);
                fx.finish(id);
                id_to_run.remove(&id);
            }
            let out = fx.checked_cycle();
            for id in &out.evicted {
                if let Some(run) = id_to_run.get_mut(id) {
                    run.1 = None;
                }
            }
            for decision in out.decisions.iter().filter(|d| d.placed) {
                if let Some(run) = id_to_run.get_mut(&decision.job) {
                    run.1 = Some(now_s);
                }
            }
            let Some((gang, submitted_s)) = gang else {
                continue;
            };
            if fx.sched.is_running(gang) {
                // The bound: the age threshold, then every job running when the reservation
                // was made ends, then a job let in ahead because it was expected to end in
                // time overruns to the longest runtime; a cycle a minute, twice over.
                return (now_s - submitted_s, age_s + 3.0 * p90_s + 120.0);
            }
            let rule = fx.sched.reservation_rule_in_force();
            age_s = age_s.max(rule.age_threshold_s);
            p90_s = p90_s.max(fx.sched.runtime_estimate(&fx.job("x", "a", 0, 1, 8)).p90_s);
            assert!(
                now_s - submitted_s <= 20_000.0,
                "the gang has waited {} s and not started",
                now_s - submitted_s
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

        #[test]
        fn an_aged_gang_starts_within_a_bound_under_quota_and_room(
            stream in stream(),
            gang_after in 20usize..60,
        ) {
            let (wait_s, bound_s) = gang_wait(&stream, gang_after);
            prop_assert!(wait_s <= bound_s, "waited {wait_s} s, bound {bound_s} s");
        }
    }
}
