//! Property tests: random sequences of submissions, cycles and completions on a small cluster
//! with racks and blocks, two nodes out of service and a queue tree with a cohort, borrowing and
//! lending limits. After every cycle (and every completion) the invariants of
//! `common::check_state` and `common::check_cycle` must hold.

mod common;

use common::{BLOCK, Fixture, Pool, RACK, check_cycle, check_state, queue};
use gantry_core::{Health, JobSpec, QueueDef, TopologyPref};
use proptest::prelude::*;
use proptest::sample::Index;

/// research (a cohort of pretraining and rl), applied and safety: 256 GPUs of nominal quota on
/// a cluster of 288 GPUs.
fn queue_tree() -> Vec<QueueDef> {
    let mut pretraining = queue("pretraining", Some("research"), 96);
    pretraining.weight = 2;
    let mut rl = queue("rl", Some("research"), 64);
    rl.borrowing_limit_gpus = Some(32);
    let mut applied = queue("applied", None, 64);
    applied.lending_limit_gpus = Some(16);
    let mut safety = queue("safety", None, 32);
    safety.borrowing_limit_gpus = Some(0);
    vec![queue("research", None, 0), pretraining, rl, applied, safety]
}

const LEAVES: [&str; 4] = ["pretraining", "rl", "applied", "safety"];
const GPU_TYPES: [&str; 3] = ["", "H100-SXM5-80GB", "L4"];

/// 32 H100 nodes (racks of 8, blocks of 2 racks) and 8 L4 nodes (racks of 4, no block);
/// `h100-5` is Unhealthy and `h100-21` in Preflight from the start.
fn fixture() -> Fixture {
    let mut fx = Fixture::new(&[Pool::h100(32, 8, Some(2)), Pool::l4(8, 4)], &queue_tree());
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
        0..LEAVES.len(),
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
    let mut spec = fx.job(&name, LEAVES[g.queue], g.priority, g.pods, 0);
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

/// Run `ops`, checking every invariant after each cycle and each completion.
fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut fx = fixture();
    let mut submitted = 0;
    for op in ops {
        match op {
            Op::Submit(g) => {
                let spec = spec(&fx, submitted, g);
                fx.submit(spec);
                submitted += 1;
            }
            Op::Cycle => {
                let at = fx.now_s;
                let out = fx.cycle();
                STATS.with(|st| {
                    let mut st = st.borrow_mut();
                    st[0] += 1;
                    st[1] += out.decisions.iter().filter(|d| d.placed).count();
                    st[2] += out.evicted.len();
                    st[3] += out
                        .decisions
                        .iter()
                        .filter(|d| {
                            matches!(
                                d.explanation.quota.builtin,
                                gantry_core::Admission::Borrowing { .. }
                            )
                        })
                        .count();
                    st[4] += out
                        .decisions
                        .iter()
                        .filter(|d| {
                            matches!(
                                d.explanation.quota.builtin,
                                gantry_core::Admission::Denied { .. }
                            )
                        })
                        .count();
                    st[5] += out
                        .decisions
                        .iter()
                        .filter(|d| d.placed && d.explanation.pods > 1)
                        .count();
                    st[6] += out.decisions.iter().filter(|d| !d.placed).count();
                });
                check_cycle(&fx, &out)
                    .map_err(|e| TestCaseError::fail(format!("cycle at {at} s: {e}")))?;
                check_state(&fx)
                    .map_err(|e| TestCaseError::fail(format!("after the cycle at {at} s: {e}")))?;
            }
            Op::Finish(index) => {
                let running: Vec<_> = fx.sched.running().collect();
                if !running.is_empty() {
                    let id = running[index.index(running.len())];
                    fx.finish(id);
                    check_state(&fx).map_err(|e| {
                        TestCaseError::fail(format!("after finishing job {id}: {e}"))
                    })?;
                }
            }
        }
    }
    // Drain: a few more cycles with nothing new, so evicted jobs get their turn.
    for _ in 0..3 {
        let out = fx.cycle();
        check_cycle(&fx, &out).map_err(TestCaseError::fail)?;
        check_state(&fx).map_err(TestCaseError::fail)?;
    }
    Ok(())
}

thread_local! { static STATS: std::cell::RefCell<[usize;8]> = const { std::cell::RefCell::new([0;8]) }; }
#[test]
fn zz_stats() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 30000,
        ..ProptestConfig::default()
    });
    if let Err(e) = runner.run(&ops(), |ops| run(&ops)) {
        eprintln!("FAIL1 {e}");
    }
    STATS.with(|st| {
        eprintln!(
            "ops: cycles placed evicted borrowing denied gangs_placed unplaced {:?}",
            st.borrow()
        )
    });
    STATS.with(|st| *st.borrow_mut() = [0; 8]);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 5000,
        ..ProptestConfig::default()
    });
    if let Err(e) = runner.run(&busy_ops(), |ops| run(&ops)) {
        eprintln!("FAIL2 {e}");
    }
    STATS.with(|st| {
        eprintln!(
            "busy: cycles placed evicted borrowing denied gangs_placed unplaced {:?}",
            st.borrow()
        )
    });
}
proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    })]

    /// No over-commitment, gangs all or nothing, quota only through declared borrowing,
    /// preemption never for a lower priority, nothing on unhealthy nodes: after every step.
    #[test]
    fn invariants_hold_over_random_operations(ops in ops()) {
        run(&ops)?;
    }
}

/// Long runs on a busy cluster: many submissions per cycle so preemption and borrowing happen
/// all the time.
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
        cases: 64,
        ..ProptestConfig::default()
    })]

    #[test]
    fn invariants_hold_on_a_busy_cluster(ops in busy_ops()) {
        run(&ops)?;
    }
}
