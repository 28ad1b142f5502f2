//! Property tests: random sequences of submissions (single pods and gangs of 2..=16, whole or
//! fractional GPUs, any GPU type, random priorities, queues and topology, some balloons at the
//! lowest priority), cycles and completions, on a 40-node cluster with racks and blocks (and on
//! a 1,200-node one, more than one evaluation chunk), two nodes out of service and a queue tree
//! with a cohort, borrowing and lending limits. After every cycle and every completion the
//! invariants of `common::check_state` and `common::check_cycle` must hold.
//!
//! Case counts are modest so the file runs in a second or two; set `PROPTEST_CASES` to run more.

mod common;

use common::{BLOCK, Fixture, Pool, RACK, check_cycle, check_state, property_queue_tree};
use gantry_core::{Admission, Health, JobId, JobSpec, TopologyPref};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::strategy::ValueTree;
use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};

/// The leaves, then the cohort: a job may name a cohort directly (a pod label can), and the
/// invariants must hold for it too.
const QUEUES: [&str; 5] = ["pretraining", "rl", "applied", "safety", "research"];
const GPU_TYPES: [&str; 3] = ["", "H100-SXM5-80GB", "L4"];

/// 32 H100 nodes (racks of 8, blocks of 2 racks) and 8 L4 nodes (racks of 4, no block);
/// `h100-5` is Unhealthy and `h100-21` in Preflight from the start.
fn fixture() -> Fixture {
    let mut fx = Fixture::new(
        &[Pool::h100(32, 8, Some(2)), Pool::l4(8, 4)],
        &property_queue_tree(),
    );
    let unhealthy = fx.node("h100-5");
    let preflight = fx.node("h100-21");
    fx.sched.state.set_health(unhealthy, Health::Unhealthy);
    fx.sched.state.set_health(preflight, Health::Preflight);
    fx.initial.health[unhealthy] = Health::Unhealthy as u8;
    fx.initial.health[preflight] = Health::Preflight as u8;
    fx
}

#[derive(Debug, Clone, Copy)]
enum Gpus {
    Whole(u32),
    Milli(u32),
}

#[derive(Debug, Clone)]
struct JobGen {
    queue: usize,
    priority: i32,
    pods: u32,
    gpus: Gpus,
    gpu_type: usize,
    cpu_milli: u32,
    memory_mib: u32,
    balloon: bool,
    topology: TopologyPref,
}

#[derive(Debug, Clone)]
enum Op {
    Submit(JobGen),
    Cycle,
    /// Finish the running job at this index (of those running), if any runs.
    Finish(Index),
}

fn gpus() -> impl Strategy<Value = Gpus> {
    prop_oneof![
        3 => prop_oneof![Just(1u32), Just(2), Just(4), Just(8), 1u32..=8].prop_map(Gpus::Whole),
        // Fractions that add up to whole GPUs often, so shared GPUs fill exactly.
        1 => prop_oneof![Just(250u32), Just(500), Just(125), Just(750), 1u32..=999]
            .prop_map(Gpus::Milli),
    ]
}

fn topology() -> impl Strategy<Value = TopologyPref> {
    prop_oneof![
        4 => Just(TopologyPref::default()),
        1 => Just(TopologyPref { level: Some(RACK), required: true }),
        1 => Just(TopologyPref { level: Some(BLOCK), required: true }),
        1 => Just(TopologyPref { level: Some(BLOCK), required: false }),
    ]
}

fn job() -> impl Strategy<Value = JobGen> {
    (
        prop_oneof![8 => 0..4usize, 1 => Just(4usize)],
        prop::sample::select(vec![-5, 0, 0, 10, 100]),
        prop_oneof![3 => Just(1u32), 2 => 2u32..=16],
        gpus(),
        prop_oneof![6 => Just(0usize), 1 => 1usize..=2],
        0u32..=24_000,
        0u32..=256_000,
        prop::bool::weighted(0.15),
        topology(),
    )
        .prop_map(
            |(queue, priority, pods, gpus, gpu_type, cpu_milli, memory_mib, balloon, topology)| {
                JobGen {
                    queue,
                    // Balloons hold capacity at the lowest priority.
                    priority: if balloon { -100 } else { priority },
                    pods,
                    gpus,
                    gpu_type,
                    cpu_milli,
                    memory_mib,
                    balloon,
                    topology,
                }
            },
        )
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            5 => job().prop_map(Op::Submit),
            3 => Just(Op::Cycle),
            2 => any::<Index>().prop_map(Op::Finish),
        ],
        1..80,
    )
}

fn spec(fx: &Fixture, n: usize, g: &JobGen) -> JobSpec {
    let name = format!("job-{n}");
    let mut spec = fx.job(&name, QUEUES[g.queue], g.priority, g.pods, 0);
    match g.gpus {
        Gpus::Whole(gpus) => spec.shape.gpus = gpus,
        Gpus::Milli(milli) => spec.shape.gpu_milli = milli,
    }
    spec.shape.gpu_type = fx.symbols.intern(GPU_TYPES[g.gpu_type]);
    spec.shape.cpu_milli = g.cpu_milli;
    spec.shape.memory_mib = g.memory_mib;
    spec.balloon = g.balloon;
    spec.topology = g.topology;
    spec
}

/// `PROPTEST_CASES` when set (to stress the core for longer), else `default`: a modest count,
/// so the file runs in a second or two.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What a run exercised, so that a test can tell the generator reaches every path.
#[derive(Debug, Default, Clone, Copy)]
struct Coverage {
    cycles: usize,
    placed: usize,
    gangs_placed: usize,
    gangs_in_one_rack: usize,
    fractional_placed: usize,
    evicted: usize,
    balloons_evicted: usize,
    borrowing: usize,
    denied: usize,
    finished: usize,
    /// Decisions that stopped evaluating before the last node (single pods on a big cluster).
    stopped_early: usize,
}

impl std::ops::AddAssign for Coverage {
    fn add_assign(&mut self, o: Self) {
        self.cycles += o.cycles;
        self.placed += o.placed;
        self.gangs_placed += o.gangs_placed;
        self.gangs_in_one_rack += o.gangs_in_one_rack;
        self.fractional_placed += o.fractional_placed;
        self.evicted += o.evicted;
        self.balloons_evicted += o.balloons_evicted;
        self.borrowing += o.borrowing;
        self.denied += o.denied;
        self.finished += o.finished;
        self.stopped_early += o.stopped_early;
    }
}

/// Per node, the pods of `id` the built-in filter leaves room for now, and, when `masked`,
/// what the planner's reservations as they stand (the backfill rule, judged at `now_s`) leave
/// of that.
fn room_for(fx: &Fixture, id: JobId, now_s: f64, masked: bool) -> Vec<u32> {
    let spec = fx.sched.job(id);
    let state = &fx.sched.state;
    let codes = gantry_core::builtin::gpu_fit(&spec.shape, &state.nodes);
    let mut capacity: Vec<u32> = (0..state.len())
        .map(|node| {
            if codes[node] == 0 {
                state.capacity_for(node, &spec.shape)
            } else {
                0
            }
        })
        .collect();
    if masked {
        fx.sched.mask_reserved(id, spec, now_s, &mut capacity);
    }
    capacity
}

/// Whether `spec` fits its queue's quota, as the built-in quota sees it: with the room
/// `room_for` leaves it, what the liveness property promises placement within one cycle for.
/// Jobs that require a topology level are left out (`None`): whether one domain holds them is
/// the placement's own question. A job an aged reservation's quota hold keeps back is not
/// admitted, as the cycle at `fx.now_s` sees it.
fn admitted(fx: &Fixture, id: JobId) -> Option<bool> {
    let spec = fx.sched.get(id)?;
    if spec.topology.required {
        return None;
    }
    Some(
        spec.balloon
            || (!matches!(
                fx.sched.queues.admission(spec.queue, spec.total().gpus),
                Admission::Denied { .. }
            ) && fx.sched.quota_hold_of(id, fx.now_s).is_none()),
    )
}

fn cycle_checked(
    fx: &mut Fixture,
    seen: &mut Coverage,
    new_jobs: &mut Vec<JobId>,
) -> Result<(), TestCaseError> {
    let at = fx.now_s;
    // Liveness: a new job that fits its quota and the idle capacity is placed in this cycle,
    // unless the cycle placed others in the room it saw. (Evictions free room mid-cycle that
    // an earlier decision could not see, so a cycle that evicted is not judged.)
    // The reservations the cycle's attempts see are the ones planned before it, so the room
    // a job is judged by after the cycle is what is still free of the room it had before it:
    // the replan at the cycle's end may move a reservation off a node, which the next cycle
    // may use.
    let fitting: Vec<(JobId, Vec<u32>)> = new_jobs
        .drain(..)
        .filter(|&id| admitted(fx, id) == Some(true))
        .map(|id| (id, room_for(fx, id, at, true)))
        .filter(|(id, room)| {
            room.iter().map(|&n| u64::from(n)).sum::<u64>() >= u64::from(fx.sched.job(*id).pods)
        })
        .collect();
    let out = fx.cycle();
    check_cycle(fx, &out).map_err(|e| TestCaseError::fail(format!("cycle at {at} s: {e}")))?;
    check_state(fx).map_err(|e| TestCaseError::fail(format!("after the cycle at {at} s: {e}")))?;
    if out.evicted.is_empty() {
        for (id, before) in fitting {
            let spec = fx.sched.job(id);
            let still: u64 = room_for(fx, id, at, false)
                .into_iter()
                .zip(before)
                .map(|(now, before)| u64::from(now.min(before)))
                .sum();
            let said = out
                .decisions
                .iter()
                .find(|d| d.job == id)
                .map(|d| format!("{:?}", d.explanation.outcome));
            prop_assert!(
                fx.sched.is_running(id)
                    || admitted(fx, id) == Some(false)
                    || still < u64::from(spec.pods),
                "cycle at {at} s: job {} fitted its quota and the idle capacity, and still does, \
                 but was not placed (the cycle said: {})",
                spec.name,
                said.as_deref().unwrap_or("nothing")
            );
        }
    }
    seen.cycles += 1;
    for d in &out.decisions {
        let spec = fx.sched.job(d.job);
        if d.placed {
            seen.placed += 1;
            seen.gangs_placed += usize::from(spec.pods > 1);
            seen.fractional_placed += usize::from(spec.shape.gpu_milli > 0);
            seen.gangs_in_one_rack += usize::from(
                spec.pods > 1
                    && d.explanation
                        .domain
                        .as_deref()
                        .is_some_and(|d| d.starts_with("rack ")),
            );
        }
        seen.stopped_early +=
            usize::from(d.explanation.nodes_evaluated < d.explanation.nodes_total);
        match d.explanation.quota.builtin {
            Admission::Borrowing { .. } => seen.borrowing += 1,
            Admission::Denied { .. } => seen.denied += 1,
            Admission::Within => {}
        }
    }
    seen.evicted += out.evicted.len();
    seen.balloons_evicted += out
        .evicted
        .iter()
        .filter(|&&id| fx.sched.job(id).balloon)
        .count();
    Ok(())
}

/// Run `ops`, checking every invariant after each cycle and each completion.
fn run(ops: &[Op]) -> Result<Coverage, TestCaseError> {
    run_on(fixture(), ops)
}

fn run_on(mut fx: Fixture, ops: &[Op]) -> Result<Coverage, TestCaseError> {
    let mut seen = Coverage::default();
    let mut submitted = 0;
    let mut new_jobs = Vec::new();
    for op in ops {
        match op {
            Op::Submit(g) => {
                let spec = spec(&fx, submitted, g);
                new_jobs.push(fx.submit(spec));
                submitted += 1;
            }
            Op::Cycle => cycle_checked(&mut fx, &mut seen, &mut new_jobs)?,
            Op::Finish(index) => {
                let running: Vec<_> = fx.sched.running().collect();
                if !running.is_empty() {
                    let id = running[index.index(running.len())];
                    fx.finish(id);
                    seen.finished += 1;
                    check_state(&fx).map_err(|e| {
                        TestCaseError::fail(format!("after finishing job {id}: {e}"))
                    })?;
                }
            }
        }
    }
    // Drain: a few more cycles with nothing new, so evicted jobs get their turn.
    for _ in 0..3 {
        cycle_checked(&mut fx, &mut seen, &mut new_jobs)?;
    }
    Ok(seen)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(512),
        ..ProptestConfig::default()
    })]

    /// No over-commitment, gangs all or nothing, quota only through declared borrowing,
    /// preemption never for a lower priority, nothing on unhealthy nodes: after every step.
    #[test]
    fn invariants_hold_over_random_operations(ops in ops()) {
        run(&ops)?;
    }
}

/// Long runs on a busy cluster: many submissions per cycle, so that preemption, borrowing and
/// quota denials happen all the time.
fn busy_ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            6 => job().prop_map(Op::Submit),
            2 => Just(Op::Cycle),
            1 => any::<Index>().prop_map(Op::Finish),
        ],
        100..200,
    )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(128),
        ..ProptestConfig::default()
    })]

    #[test]
    fn invariants_hold_on_a_busy_cluster(ops in busy_ops()) {
        run(&ops)?;
    }
}

/// 1,200 nodes, more than one chunk of `gantry_core::scheduler::CHUNK`: a single pod stops
/// evaluating once it has found enough feasible nodes, a gang evaluates them all. Racks of 16
/// and blocks of 8 racks; the L4 pool lies in the second chunk.
fn large_fixture() -> Fixture {
    let mut fx = Fixture::new(
        &[Pool::h100(1100, 16, Some(8)), Pool::l4(100, 4)],
        &property_queue_tree(),
    );
    for (name, health) in [
        ("h100-5", Health::Unhealthy),
        ("h100-1030", Health::Preflight),
    ] {
        let node = fx.node(name);
        fx.sched.state.set_health(node, health);
        fx.initial.health[node] = health as u8;
    }
    fx
}

/// Jobs big enough to fill a good part of 9,200 GPUs in a few cycles.
fn large_ops() -> impl Strategy<Value = Vec<Op>> {
    let big_job = (job(), 1u32..=32).prop_map(|(mut g, times)| {
        if g.pods > 1 {
            g.pods = (g.pods * times).min(256);
        }
        g
    });
    prop::collection::vec(
        prop_oneof![
            6 => big_job.prop_map(Op::Submit),
            2 => Just(Op::Cycle),
            1 => any::<Index>().prop_map(Op::Finish),
        ],
        1..120,
    )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(64),
        ..ProptestConfig::default()
    })]

    #[test]
    fn invariants_hold_on_a_cluster_of_several_chunks(ops in large_ops()) {
        run_on(large_fixture(), &ops)?;
    }
}

/// The generators are worth their cases only if they reach every path: a fixed-seed run must
/// place gangs (in one rack, too) and fractional pods, evict balloons and others, borrow and
/// be denied quota, and stop evaluating early on the big cluster.
#[test]
fn generators_reach_every_path() {
    let mut seen = Coverage::default();
    let config = ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    for strategy in [ops().boxed(), busy_ops().boxed()] {
        for _ in 0..64 {
            let ops = strategy.new_tree(&mut runner).unwrap().current();
            seen += run(&ops).unwrap_or_else(|e| panic!("{e}"));
        }
    }
    for _ in 0..16 {
        let ops = large_ops().new_tree(&mut runner).unwrap().current();
        seen += run_on(large_fixture(), &ops).unwrap_or_else(|e| panic!("{e}"));
    }
    eprintln!("{seen:?}");
    assert!(seen.gangs_placed > 0, "{seen:?}");
    assert!(seen.gangs_in_one_rack > 0, "{seen:?}");
    assert!(seen.fractional_placed > 0, "{seen:?}");
    assert!(seen.balloons_evicted > 0, "{seen:?}");
    assert!(seen.evicted > seen.balloons_evicted, "{seen:?}");
    assert!(seen.borrowing > 0, "{seen:?}");
    assert!(seen.denied > 0, "{seen:?}");
    assert!(seen.finished > 0, "{seen:?}");
    assert!(seen.stopped_early > 0, "{seen:?}");
}
