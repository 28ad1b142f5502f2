//! The `kueue` baseline: Kueue's quota admission (BestEffortFIFO, borrowing within the cohort,
//! quota charged at admission), then stock kube-scheduler's pod-by-pod placement.
//!
//! Scenarios for each rule, and random operations on the property tests' queue tree (a cohort,
//! borrowing and lending limits) checked by `common::check_state` after every step: no queue
//! is ever charged beyond its nominal quota plus its borrowing limit, nodes are never
//! over-committed, and no pod of an unadmitted workload holds a node.

mod common;

use common::{Fixture, Pool, check_state, property_queue_tree, queue};
use gantry_core::{Admission, JobId, Mode, Outcome, QueueDef, SchedulerConfig};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::strategy::ValueTree;
use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};

fn kueue(pools: &[Pool], queues: &[QueueDef]) -> Fixture {
    Fixture::with_config(
        pools,
        queues,
        SchedulerConfig {
            mode: Mode::Kueue,
            ..SchedulerConfig::default()
        },
    )
}

fn checked_cycle(fx: &mut Fixture) -> gantry_core::CycleOutput {
    let out = fx.cycle();
    if let Err(e) = check_state(fx) {
        panic!("after the cycle at {} s: {e}", fx.now_s - 60.0);
    }
    assert!(out.evicted.is_empty(), "kueue preempted {:?}", out.evicted);
    out
}

#[test]
fn an_inadmissible_workload_does_not_block_the_ones_behind_it() {
    let mut team = queue("team", None, 16);
    team.borrowing_limit_gpus = Some(0);
    let mut fx = kueue(&[Pool::h100(4, 4, None)], &[team, queue("other", None, 16)]);
    let big = fx.submit(fx.job("big", "team", 0, 3, 8));
    let small = fx.submit(fx.job("small", "team", 0, 1, 8));
    let out = checked_cycle(&mut fx);
    let d = fx.decision(&out, big);
    assert!(!d.placed);
    assert!(
        matches!(d.explanation.quota.builtin, Admission::Denied { .. }),
        "{:?}",
        d.explanation
    );
    assert!(fx.sched.is_running(small), "the workload behind it runs");
    assert_eq!(fx.sched.queues.used(fx.queue_id("team")).gpus, 8);
}

#[test]
fn quota_is_charged_at_admission_while_pods_wait_for_nodes() {
    let mut fx = kueue(&[Pool::h100(2, 2, None)], &[queue("q", None, 16)]);
    let small = fx.submit(fx.job("small", "q", 0, 1, 4));
    checked_cycle(&mut fx);
    // 4 + 12 GPUs fit the quota of 16, so the gang is admitted whole; its first pod takes the
    // empty node, its second does not fit the 4 GPUs left beside `small` and waits, bound
    // sibling and all (kube-scheduler has no gangs).
    let gang = fx.submit(fx.job("gang", "q", 0, 2, 6));
    let out = checked_cycle(&mut fx);
    assert!(!fx.decision(&out, gang).placed);
    assert_eq!(fx.sched.slots(gang).len(), 1);
    assert!(fx.sched.charged(gang));
    assert_eq!(fx.sched.queues.used(0).gpus, 16);
    // A 1-GPU job would fit the node, but the queue's quota is all charged: not admitted.
    let late = fx.submit(fx.job("late", "q", 0, 1, 1));
    let out = checked_cycle(&mut fx);
    let d = fx.decision(&out, late);
    assert!(
        matches!(d.explanation.outcome, Outcome::Pending { ref waiting_for } if waiting_for.starts_with("quota: ")),
        "{:?}",
        d.explanation.outcome
    );
    assert!(fx.sched.slots(late).is_empty());
    // `small` ends: the gang's second pod fits, and the released quota admits `late`.
    fx.finish(small);
    checked_cycle(&mut fx);
    assert!(fx.sched.is_running(gang));
    assert!(fx.sched.is_running(late));
    assert_eq!(fx.sched.queues.used(0).gpus, 13);
}

#[test]
fn a_queue_borrows_idle_quota_of_its_cohort_up_to_its_limit() {
    let mut rl = queue("rl", None, 8);
    rl.borrowing_limit_gpus = Some(8);
    let mut fx = kueue(&[Pool::h100(8, 8, None)], &[rl, queue("idle", None, 56)]);
    let jobs: Vec<JobId> = (0..4)
        .map(|i| {
            let spec = fx.job(&format!("rl-{i}"), "rl", 0, 1, 8);
            fx.submit(spec)
        })
        .collect();
    let out = checked_cycle(&mut fx);
    // Within quota, then borrowing 8 of the idle queue's GPUs, then the limit.
    let verdicts: Vec<&Admission> = jobs
        .iter()
        .map(|&id| &fx.decision(&out, id).explanation.quota.builtin)
        .collect();
    assert_eq!(verdicts[0], &Admission::Within);
    assert_eq!(verdicts[1], &Admission::Borrowing { gpus: 8 });
    assert!(matches!(verdicts[2], Admission::Denied { .. }));
    assert!(matches!(verdicts[3], Admission::Denied { .. }));
    assert_eq!(fx.sched.queues.used(0).gpus, 16);
}

const QUEUES: [&str; 4] = ["pretraining", "rl", "applied", "safety"];

#[derive(Debug, Clone)]
enum Op {
    /// queue, priority, pods, GPUs per pod (0 = a quarter of a GPU).
    Submit(usize, i32, u32, u32),
    Cycle,
    Finish(Index),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let submit = (
        0..QUEUES.len(),
        prop::sample::select(vec![0, 0, 10]),
        prop_oneof![3 => Just(1u32), 2 => 2u32..=12],
        prop::sample::select(vec![0u32, 1, 2, 4, 8, 8]),
    )
        .prop_map(|(q, p, pods, gpus)| Op::Submit(q, p, pods, gpus));
    prop::collection::vec(
        prop_oneof![
            6 => submit,
            2 => Just(Op::Cycle),
            2 => any::<Index>().prop_map(Op::Finish),
        ],
        20..150,
    )
}

/// What a run exercised: the generator is worth its cases only if workloads are refused,
/// borrow, and hold nodes while their siblings wait.
#[derive(Debug, Default)]
struct Coverage {
    denied: usize,
    borrowing: usize,
    holding: usize,
}

/// Run `ops` on the tree, checking every invariant after each cycle and each completion.
fn run(ops: &[Op], seen: &mut Coverage) -> Result<(), TestCaseError> {
    let mut fx = kueue(
        &[Pool::h100(32, 8, Some(2)), Pool::l4(8, 4)],
        &property_queue_tree(),
    );
    let roots = ["research", "applied", "safety"].map(|q| fx.queue_id(q));
    let nominal: u64 = roots.iter().map(|&q| fx.sched.queues.nominal(q)).sum();
    for (n, op) in ops.iter().enumerate() {
        match op {
            Op::Submit(q, priority, pods, gpus) => {
                let name = format!("job-{n}");
                let spec = if *gpus == 0 {
                    fx.fractional(&name, QUEUES[*q], *priority, *pods, 250)
                } else {
                    fx.job(&name, QUEUES[*q], *priority, *pods, *gpus)
                };
                fx.submit(spec);
            }
            Op::Cycle => {
                let out = fx.cycle();
                check_state(&fx).map_err(TestCaseError::fail)?;
                prop_assert!(out.evicted.is_empty());
                for d in &out.decisions {
                    match d.explanation.quota.builtin {
                        Admission::Denied { .. } => seen.denied += 1,
                        Admission::Borrowing { .. } => seen.borrowing += 1,
                        Admission::Within => {}
                    }
                    seen.holding += usize::from(!d.placed && !fx.sched.slots(d.job).is_empty());
                }
            }
            Op::Finish(index) => {
                let running: Vec<JobId> = fx.sched.running().collect();
                if !running.is_empty() {
                    fx.finish(running[index.index(running.len())]);
                    check_state(&fx).map_err(TestCaseError::fail)?;
                }
            }
        }
        // Borrowing only ever lends idle quota: all queues together stay within their quotas.
        let charged: u64 = roots.iter().map(|&q| fx.sched.queues.used(q).gpus).sum();
        prop_assert!(
            charged <= nominal,
            "{charged} GPUs charged of {nominal} nominal"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(128),
        ..ProptestConfig::default()
    })]

    /// After every cycle and every completion: every queue within its nominal quota plus its
    /// borrowing limit, all queues together within their nominal quotas, nodes never
    /// over-committed, unadmitted workloads holding no node, no preemption.
    #[test]
    fn kueue_never_lets_a_queue_exceed_nominal_plus_borrowing(ops in ops()) {
        run(&ops, &mut Coverage::default())?;
    }
}

#[test]
fn the_generator_reaches_every_path() {
    let mut runner = TestRunner::new_with_rng(
        ProptestConfig {
            failure_persistence: None,
            ..ProptestConfig::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let mut seen = Coverage::default();
    for _ in 0..32 {
        let ops = ops().new_tree(&mut runner).unwrap().current();
        run(&ops, &mut seen).unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(
        seen.denied > 0 && seen.borrowing > 0 && seen.holding > 0,
        "{seen:?}"
    );
}
