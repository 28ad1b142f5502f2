//! Property tests of the health lifecycle: random gangs, cycles, completions, node failures,
//! repairs and re-tests on a 40-node cluster. After every cycle:
//! - no pod was placed on a node that is not Ready;
//! - a job stopped by a failure runs whole again or not at all;
//! - no stopped gang is placed on a node of its bad-node list while the entry lasts;
//! - no running job has a pod on a node a failure took out.

mod common;

use std::collections::BTreeSet;

use common::{Fixture, Pool, property_queue_tree};
use gantry_core::{Health, JobId, NodeState};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// A gang of this many pods × 8 GPUs (1 = a single pod) in queue `pretraining`.
    Submit(u32),
    Cycle,
    /// A failure signal on this node.
    Fail(usize),
    /// Repair (then re-test, then Ready) every node in repair.
    Repair,
    /// Finish the running job at this index of those running.
    Finish(prop::sample::Index),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            4 => prop_oneof![Just(1u32), 2u32..=12].prop_map(Op::Submit),
            4 => Just(Op::Cycle),
            2 => (0usize..40).prop_map(Op::Fail),
            1 => Just(Op::Repair),
            1 => any::<prop::sample::Index>().prop_map(Op::Finish),
        ],
        1..90,
    )
}

fn run(ops: &[Op]) -> Result<(u64, u64), TestCaseError> {
    let mut fx = Fixture::new(
        &[Pool::h100(32, 8, Some(2)), Pool::l4(8, 4)],
        &property_queue_tree(),
    );
    let mut stopped_ever: BTreeSet<JobId> = BTreeSet::new();
    let (mut stops, mut restarts) = (0u64, 0u64);
    for (n, op) in ops.iter().enumerate() {
        match op {
            Op::Submit(pods) => {
                let spec = fx.job(&format!("job-{n}"), "pretraining", 0, *pods, 8);
                fx.submit(spec);
            }
            Op::Fail(node) => {
                let now = fx.now_s;
                let failure = fx.sched.node_failed(*node, "Xid 79", now);
                stops += failure.stopped.len() as u64;
                stopped_ever.extend(failure.stopped);
            }
            Op::Repair => {
                let now = fx.now_s;
                for node in 0..fx.sched.state.len() {
                    if fx.sched.lifecycle().state(node) == NodeState::Repair {
                        fx.sched.lifecycle_mut().repaired(node, true, now);
                        fx.sched.lifecycle_mut().passed(node, now);
                        fx.sched.sync_health(node);
                    }
                }
            }
            Op::Finish(index) => {
                let running: Vec<JobId> = fx.sched.running().collect();
                if !running.is_empty() {
                    fx.finish(running[index.index(running.len())]);
                }
            }
            Op::Cycle => {
                let now = fx.now_s;
                let bad_before: Vec<(JobId, Vec<usize>)> = stopped_ever
                    .iter()
                    .map(|&id| (id, fx.sched.bad_nodes(id, now)))
                    .collect();
                let out = fx.cycle();
                for decision in out.decisions.iter().filter(|d| d.placed) {
                    for &(node, _) in &decision.placement {
                        prop_assert_eq!(
                            fx.sched.state.nodes.health(node),
                            Health::Healthy,
                            "job {} placed on node {} in state {:?}",
                            decision.job,
                            node,
                            fx.sched.lifecycle().state(node)
                        );
                    }
                    if let Some((_, bad)) = bad_before.iter().find(|(id, _)| *id == decision.job) {
                        restarts += 1;
                        for &(node, _) in &decision.placement {
                            prop_assert!(
                                !bad.contains(&node),
                                "job {} restarted on node {node}, which failed under it",
                                decision.job
                            );
                        }
                    }
                }
                for &id in &stopped_ever {
                    if fx.sched.get(id).is_none() {
                        continue;
                    }
                    let held = fx.sched.slots(id).len();
                    let pods = fx.sched.job(id).pods as usize;
                    prop_assert!(
                        held == 0 || (held == pods && fx.sched.is_running(id)),
                        "stopped job {id} holds {held} of its {pods} pods' nodes"
                    );
                }
            }
        }
        for id in fx.sched.running().collect::<Vec<_>>() {
            for slot in fx.sched.slots(id) {
                let state = fx.sched.lifecycle().state(slot.node as usize);
                prop_assert!(
                    state == NodeState::Ready,
                    "job {id} runs on node {} in state {state:?}",
                    slot.node
                );
            }
        }
    }
    Ok((stops, restarts))
}

#[test]
fn failures_never_leave_a_pod_on_a_bad_node_and_gangs_restart_whole() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(96),
        ..ProptestConfig::default()
    });
    let totals = std::cell::Cell::new((0u64, 0u64));
    runner
        .run(&ops(), |ops| {
            let (stops, restarts) = run(&ops)?;
            let (s, r) = totals.get();
            totals.set((s + stops, r + restarts));
            Ok(())
        })
        .unwrap();
    // The generator reaches the paths under test: failures stop jobs, and stopped jobs restart.
    let totals = totals.get();
    assert!(
        totals.0 > 0 && totals.1 > 0,
        "stops and restarts: {totals:?}"
    );
}

/// A live cluster's node set changes and the scheduler is rebuilt (`Scheduler::reset`): the
/// nodes a failure took out stay out, a node the breaker held stays in service, and the breaker
/// stays tripped. Before, every node started afresh from the node table, which shows none of
/// this, and a cluster source put every node still signalling out, past the breaker's cap.
#[test]
fn a_rebuild_keeps_each_nodes_lifecycle_and_the_tripped_breaker() {
    let pools = [Pool::h100(16, 4, None), Pool::l4(4, 4)];
    let mut fx = Fixture::new(&pools, &property_queue_tree());
    let names = ["h100-0", "h100-1", "h100-2"];
    // 10% of 20 nodes: two may be out, and the third signal trips the breaker.
    for name in names {
        let node = fx.node(name);
        fx.sched.node_failed(node, "Xid 79", 0.0);
    }
    let states = |fx: &Fixture| -> Vec<NodeState> {
        names
            .iter()
            .map(|n| fx.sched.lifecycle().state(fx.node(n)))
            .collect()
    };
    let expected = [NodeState::Repair, NodeState::Repair, NodeState::Ready];
    assert_eq!(states(&fx), expected);
    assert!(fx.sched.lifecycle().breaker.tripped.is_some());

    // The same nodes in another order, as a rebuilt table may number them.
    let reordered = [pools[1].clone(), pools[0].clone()];
    let table = common::node_table(&fx.symbols, &reordered);
    let queues = gantry_core::Queues::new(&fx.queue_defs, common::capacity(&table), 3600.0)
        .expect("valid queue tree");
    fx.sched
        .reset(gantry_core::ClusterState::new(table), queues);
    assert_eq!(
        fx.node("h100-0"),
        4,
        "the rebuilt table numbers the nodes anew"
    );
    assert_eq!(states(&fx), expected);
    let repair = NodeState::ALL.iter().position(|s| *s == NodeState::Repair);
    assert_eq!(fx.sched.lifecycle().counts()[repair.unwrap()], 2);
    for name in &names[..2] {
        assert_eq!(
            fx.sched.state.nodes.health(fx.node(name)),
            Health::Unhealthy,
            "{name} is out of the scheduler's hands in the new table too"
        );
    }
    assert!(fx.sched.lifecycle().breaker.tripped.is_some());
    // Still tripped: a new signal is held, and no third node goes out.
    let held = fx.sched.node_failed(fx.node("h100-2"), "Xid 79", 1.0);
    assert_eq!(held.verdict, gantry_core::health::Verdict::HeldByBreaker);
}
