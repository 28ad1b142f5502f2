//! Scenario tests: small, hand-built situations with exact expectations for where jobs land,
//! who gets evicted and what the explanation says. Every cycle also runs the invariant checks of
//! `common::check_state` and `common::check_cycle`.

mod common;

use std::collections::BTreeMap;

use common::{Fixture, Pool, RACK, queue};
use gantry_core::explain::FilterExplain;
use gantry_core::{Admission, Blocked, Health, JobId, Outcome, Reclaim};

/// Why `id` is parked, if it is.
fn parked(fx: &Fixture, id: JobId) -> Option<Blocked> {
    fx.sched
        .scheduling_queue()
        .parked(id)
        .map(|(blocked, _)| blocked)
}

fn waiting_for(outcome: &Outcome) -> &str {
    match outcome {
        Outcome::Pending { waiting_for } => waiting_for,
        Outcome::Placed { .. } => panic!("expected a pending outcome, got {outcome:?}"),
    }
}

fn builtin_rejections(rejected: &[(&str, u32)]) -> Vec<FilterExplain> {
    vec![FilterExplain {
        policy: "builtin".into(),
        rejected: rejected.iter().map(|&(r, n)| (r.to_string(), n)).collect(),
    }]
}

/// Nodes `first..first + count` of the H100 pool, one pod each.
fn one_pod_each(fx: &Fixture, first: usize, count: usize) -> BTreeMap<usize, u32> {
    (first..first + count)
        .map(|i| (fx.node(&format!("h100-{i}")), 1))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Topology-aware gang placement.

/// 64 nodes of 8 H100s in racks of 16 nodes (as in `openai-like-7500.yaml`) and blocks of 2 racks.
fn racks_of_16() -> Fixture {
    Fixture::single_queue(&[Pool::h100(64, 16, Some(2))], 512)
}

#[test]
fn gang_of_16_by_8_on_an_empty_cluster_lands_in_one_rack() {
    let mut fx = racks_of_16();
    let gang = fx.submit(fx.job("mpi-train", "default", 0, 16, 8));
    let out = fx.checked_cycle();
    let d = fx.decision(&out, gang);
    assert!(d.placed);
    assert_eq!(d.explanation.domain.as_deref(), Some("rack 0"));
    assert_eq!(fx.placement(gang), one_pod_each(&fx, 0, 16));
    assert_eq!(fx.domains(gang, RACK).len(), 1);
    assert_eq!(
        d.explanation.summary(),
        "placed 16 pods on 16 nodes in rack 0"
    );
    assert!(d.explanation.preempted.is_empty());
}

#[test]
fn gang_of_16_by_8_skips_a_rack_that_lost_one_gpu() {
    let mut fx = racks_of_16();
    // A single 1-GPU pod goes to the best-packed node, the first on an empty cluster.
    let small = fx.submit(fx.job("notebook", "default", 0, 1, 1));
    fx.checked_cycle();
    assert_eq!(fx.placement(small), one_pod_each(&fx, 0, 1));
    // Rack 0 now holds only 15 pods of 8 GPUs: the gang takes rack 1, whole.
    let gang = fx.submit(fx.job("mpi-train", "default", 0, 16, 8));
    let out = fx.checked_cycle();
    let d = fx.decision(&out, gang);
    assert!(d.placed);
    assert_eq!(d.explanation.domain.as_deref(), Some("rack 1"));
    assert_eq!(fx.placement(gang), one_pod_each(&fx, 16, 16));
    assert_eq!(
        d.explanation.summary(),
        "placed 16 pods on 16 nodes in rack 1"
    );
}

#[test]
fn gang_too_big_for_any_rack_takes_one_block() {
    let mut fx = racks_of_16();
    let gang = fx.submit(fx.job("big-train", "default", 0, 24, 8));
    let out = fx.checked_cycle();
    let d = fx.decision(&out, gang);
    assert!(d.placed);
    assert_eq!(d.explanation.domain.as_deref(), Some("block 0"));
    assert_eq!(fx.placement(gang), one_pod_each(&fx, 0, 24));
    assert_eq!(fx.domains(gang, common::BLOCK).len(), 1);
}

/// Three blocks of 32 nodes, each partly held by balloons and work, none with room for 24
/// pods free: block 0 has 16 nodes of work, 8 of balloons and 8 free; block 1 has 12 of
/// balloons and 20 free; block 2 has 16 of work, 4 of balloons and 12 free.
fn blocks_partly_held_by_balloons() -> (Fixture, Vec<JobId>) {
    let mut fx = Fixture::single_queue(&[Pool::h100(96, 16, Some(2))], 768);
    let mut balloons = Vec::new();
    let mut hold = |fx: &mut Fixture, name: &str, nodes: std::ops::Range<usize>, balloon: bool| {
        for node in nodes {
            let spec = if balloon {
                fx.balloon(&format!("{name}-{node}"), "default", -100, 1, 8)
            } else {
                fx.job(&format!("{name}-{node}"), "default", 0, 1, 8)
            };
            let id = fx.sched.adopt(spec, &[node]);
            fx.submitted = fx.submitted.max(id + 1);
            if balloon {
                balloons.push(id);
            }
        }
    };
    hold(&mut fx, "work", 0..16, false);
    hold(&mut fx, "balloon", 16..24, true);
    hold(&mut fx, "balloon", 32..44, true);
    hold(&mut fx, "work", 64..80, false);
    hold(&mut fx, "balloon", 80..84, true);
    (fx, balloons)
}

#[test]
fn a_gang_evicts_balloons_to_stay_in_one_block_rather_than_spread() {
    let (mut fx, balloons) = blocks_partly_held_by_balloons();
    let balloon_to_node: BTreeMap<JobId, usize> = balloons
        .iter()
        .map(|&b| {
            (
                b,
                *fx.placement(b).keys().next().expect("a running balloon"),
            )
        })
        .collect();
    let gang = fx.submit(fx.job("big-train", "default", 0, 24, 8));
    let out = fx.checked_cycle();
    let d = fx.decision(&out, gang);
    assert!(d.placed, "{:?}", d.explanation.outcome);
    // Block 1: its 20 free nodes and 4 of its 12 balloons' nodes; nothing but balloons gave way.
    assert_eq!(d.explanation.domain.as_deref(), Some("block 1"));
    assert_eq!(
        fx.domains(gang, common::BLOCK)
            .into_iter()
            .collect::<Vec<_>>(),
        [1]
    );
    assert_eq!(out.evicted.len(), 4, "{:?}", d.explanation.preempted);
    for victim in &out.evicted {
        let node = balloon_to_node
            .get(victim)
            .expect("only balloons are evicted");
        assert!(
            (32..44).contains(node),
            "a balloon outside block 1 gave way: node {node}"
        );
        assert!(!fx.sched.is_running(*victim));
    }
    assert_eq!(
        d.explanation.preempted,
        ["balloon-32", "balloon-33", "balloon-34", "balloon-35"]
    );
    assert_eq!(
        d.explanation.summary(),
        "placed 24 pods on 24 nodes in block 1"
    );
    let stats = fx.sched.topology_stats();
    assert_eq!(stats.gangs_one_domain_possible, 1);
    assert_eq!(stats.gangs_in_one_domain, 1);
    assert_eq!(stats.balloons_evicted_for_topology, 4);
}

#[test]
fn a_gang_no_block_could_hold_spreads_and_evicts_nothing() {
    let (mut fx, _) = blocks_partly_held_by_balloons();
    // 40 pods: more than any block's free and balloon-held nodes (32), fewer than the free
    // nodes of all three (40).
    let gang = fx.submit(fx.job("bigger-train", "default", 0, 40, 8));
    let out = fx.checked_cycle();
    let d = fx.decision(&out, gang);
    assert!(d.placed, "{:?}", d.explanation.outcome);
    assert_eq!(d.explanation.domain.as_deref(), Some("the whole cluster"));
    assert!(out.evicted.is_empty());
    let stats = fx.sched.topology_stats();
    assert_eq!(stats.gangs_one_domain_possible, 0);
    assert_eq!(stats.share_in_one_domain(), None);
}

#[test]
fn gang_requiring_one_rack_waits_when_no_rack_holds_it() {
    let mut fx = racks_of_16();
    let mut spec = fx.job("rack-bound", "default", 0, 17, 8);
    spec.topology.level = Some(RACK);
    spec.topology.required = true;
    let gang = fx.submit(spec);
    let out = fx.checked_cycle();
    let d = fx.decision(&out, gang);
    assert!(!d.placed);
    assert!(fx.sched.slots(gang).is_empty());
    assert_eq!(fx.sched.pending(), [gang]);
    assert_eq!(d.explanation.nodes_feasible, 64);
    assert_eq!(
        waiting_for(&d.explanation.outcome),
        "room for all 17 pods in one rack (64 fit across the cluster)"
    );
    assert_eq!(
        d.explanation.summary(),
        "Waiting for room for all 17 pods in one rack (64 fit across the cluster)."
    );
}

// ---------------------------------------------------------------------------------------------
// Explanations of gangs that fit nowhere.

/// 32 H100 nodes (racks of 8, blocks of 2 racks) and 8 L4 nodes (racks of 4).
fn mixed_cluster() -> Fixture {
    Fixture::single_queue(&[Pool::h100(32, 8, Some(2)), Pool::l4(8, 4)], 512)
}

#[test]
fn gang_that_fits_nowhere_stays_pending_with_a_kube_style_message() {
    let mut fx = mixed_cluster();
    for (node, health) in [("l4-0", Health::Unhealthy), ("l4-1", Health::Preflight)] {
        let node = fx.node(node);
        fx.sched.state.set_health(node, health);
        fx.initial.health[node] = health as u8;
    }
    // Four pods of 8 L4s: the H100 nodes have the wrong type, the L4 nodes only 4 GPUs.
    let mut spec = fx.job("l4-gang", "default", 0, 4, 8);
    spec.shape.gpu_type = fx.symbols.intern("L4");
    let gang = fx.submit(spec);
    let out = fx.checked_cycle();
    let d = fx.decision(&out, gang);
    assert!(!d.placed);
    assert!(out.evicted.is_empty());
    assert!(fx.sched.slots(gang).is_empty());
    assert_eq!(fx.sched.running().count(), 0);
    assert_eq!(fx.sched.pending(), [gang]);
    let e = &d.explanation;
    assert_eq!((e.nodes_total, e.nodes_feasible), (40, 0));
    assert_eq!(
        e.filters,
        builtin_rejections(&[
            ("GPU type does not match", 32),
            ("Insufficient nvidia.com/gpu", 6),
            ("node not ready or not healthy", 2),
        ])
    );
    assert!(e.top_nodes.is_empty());
    assert_eq!(e.domain, None);
    assert_eq!(waiting_for(&e.outcome), "4 pod(s) of 8 GPU(s) to free up");
    assert_eq!(
        e.summary(),
        "0/40 nodes are available: 32 GPU type does not match, 6 Insufficient nvidia.com/gpu, \
         2 node not ready or not healthy. Waiting for 4 pod(s) of 8 GPU(s) to free up."
    );
    // Nothing changed: the next cycle leaves the parked gang alone, at no cost.
    assert_eq!(parked(&fx, gang), Some(Blocked::Room));
    let out = fx.checked_cycle();
    assert!(out.decisions.is_empty());
    assert_eq!(out.attempts, 0);
    assert!(!fx.sched.is_running(gang));
    assert!(fx.sched.slots(gang).is_empty());
}

#[test]
fn gang_larger_than_the_cluster_names_what_fits() {
    let mut fx = mixed_cluster();
    let gang = fx.submit(fx.job("too-big", "default", 0, 40, 8));
    let out = fx.checked_cycle();
    let d = fx.decision(&out, gang);
    assert!(!d.placed);
    assert!(fx.sched.slots(gang).is_empty());
    assert_eq!(
        d.explanation.summary(),
        "32/40 nodes are available: 8 Insufficient nvidia.com/gpu. \
         Waiting for room for all 40 pods at once (32 fit now)."
    );
}

// ---------------------------------------------------------------------------------------------
// Preemption.

/// Four nodes of 8 H100s in one rack.
fn four_nodes(queues: &[gantry_core::QueueDef]) -> Fixture {
    Fixture::new(&[Pool::h100(4, 4, None)], queues)
}

/// Four nodes, each held by one 8-GPU balloon (submitted in order, `balloon-0` oldest).
fn four_nodes_of_balloons() -> (Fixture, Vec<gantry_core::JobId>) {
    let mut fx = four_nodes(&[queue("default", None, 32)]);
    let mut balloons = Vec::new();
    for i in 0..4 {
        let mut spec = fx.balloon(&format!("balloon-{i}"), "default", -100, 1, 8);
        spec.submit_s = f64::from(i);
        balloons.push(fx.submit(spec));
    }
    (fx, balloons)
}

#[test]
fn balloon_gives_way_to_a_normal_job() {
    let (mut fx, balloons) = four_nodes_of_balloons();
    fx.checked_cycle();
    assert!(balloons.iter().all(|&b| fx.sched.is_running(b)));
    // Balloons hold nodes but no quota.
    assert_eq!(fx.sched.queues.used(fx.queue_id("default")).gpus, 0);
    let balloon_3_node = fx.placement(balloons[3]);

    let job = fx.submit(fx.job("train", "default", 0, 1, 8));
    let out = fx.checked_cycle();
    let d = fx.decision(&out, job);
    assert!(d.placed);
    // The newest balloon goes first, and only it.
    assert_eq!(d.explanation.preempted, ["balloon-3"]);
    assert_eq!(out.evicted, [balloons[3]]);
    assert_eq!(fx.placement(job), balloon_3_node);
    assert!(!fx.sched.is_running(balloons[3]));
    assert!(fx.sched.pending().contains(&balloons[3]));
    assert!(balloons[..3].iter().all(|&b| fx.sched.is_running(b)));
    assert_eq!(fx.sched.queues.used(fx.queue_id("default")).gpus, 8);

    // The evicted balloon waits for room; a balloon never preempts anything.
    assert_eq!(parked(&fx, balloons[3]), Some(Blocked::Room));
    fx.finish(balloons[0]);
    let out = fx.checked_cycle();
    assert!(fx.decision(&out, balloons[3]).placed);
    assert!(out.evicted.is_empty());
    assert!(fx.sched.is_running(job));
    let late = fx.submit(fx.balloon("balloon-4", "default", -100, 1, 8));
    let out = fx.checked_cycle();
    let d = fx.decision(&out, late);
    assert!(!d.placed);
    assert!(d.explanation.preempted.is_empty());
    assert!(out.evicted.is_empty());
}

#[test]
fn gang_evicts_as_many_balloons_as_it_needs() {
    let (mut fx, balloons) = four_nodes_of_balloons();
    fx.checked_cycle();
    let gang = fx.submit(fx.job("pair", "default", 0, 2, 8));
    let out = fx.checked_cycle();
    let d = fx.decision(&out, gang);
    assert!(d.placed);
    assert_eq!(d.explanation.preempted, ["balloon-3", "balloon-2"]);
    assert_eq!(out.evicted, [balloons[3], balloons[2]]);
    assert_eq!(fx.sched.slots(gang).len(), 2);
}

#[test]
fn higher_priority_job_is_never_preempted_for_a_lower_one() {
    let mut fx = four_nodes(&[queue("default", None, 64)]);
    let important = fx.submit(fx.job("important", "default", 100, 4, 8));
    fx.checked_cycle();
    let before = fx.placement(important);
    assert_eq!(before.len(), 4);

    let low = fx.submit(fx.job("low", "default", 10, 1, 8));
    let peer = fx.submit(fx.job("peer", "default", 100, 1, 8));
    let out = fx.checked_cycle();
    assert!(out.evicted.is_empty());
    for id in [low, peer] {
        let d = fx.decision(&out, id);
        assert!(!d.placed);
        assert!(d.explanation.preempted.is_empty());
        assert_eq!(
            d.explanation.summary(),
            "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. \
             Waiting for 1 pod(s) of 8 GPU(s) to free up."
        );
    }
    assert!(fx.sched.is_running(important));
    assert_eq!(fx.placement(important), before);
}

#[test]
fn preemption_takes_lower_priority_only_and_only_when_it_makes_room() {
    let mut fx = four_nodes(&[queue("default", None, 64)]);
    // A blocked job holds a reservation at once, not only once aged.
    fx.sched.set_plan_config(gantry_core::PlanConfig {
        reserve_after_s: Some(0.0),
        ..gantry_core::PlanConfig::default()
    });
    let high = fx.submit(fx.job("high", "default", 100, 2, 8));
    let low = fx.submit(fx.job("low", "default", 0, 2, 8));
    fx.checked_cycle();
    assert!(fx.sched.is_running(high) && fx.sched.is_running(low));

    // Three nodes are more than evicting `low` frees: nobody is evicted.
    let wide = fx.submit(fx.job("wide", "default", 50, 3, 8));
    let out = fx.checked_cycle();
    assert!(!fx.decision(&out, wide).placed);
    assert!(out.evicted.is_empty());
    assert!(fx.sched.is_running(high) && fx.sched.is_running(low));

    // Two nodes, for a job behind `wide`: `low` would give way, but its nodes are reserved
    // for `wide`, which goes first (same priority, earlier), so nobody is evicted: preemption
    // respects the reservations of the jobs ahead of the preemptor.
    assert_eq!(parked(&fx, wide), Some(Blocked::Room));
    let medium = fx.submit(fx.job("medium", "default", 50, 2, 8));
    let out = fx.checked_cycle();
    assert!(out.decisions.iter().all(|d| d.job != wide));
    let d = fx.decision(&out, medium);
    assert!(!d.placed);
    assert!(out.evicted.is_empty());
    assert!(fx.sched.is_running(low));

    // Two nodes, for a job that outranks `wide`: `low` gives way, `high` stays (`wide` and
    // `medium`, parked since nothing changed for them, are not tried and evict nobody).
    let urgent = fx.submit(fx.job("urgent", "default", 60, 2, 8));
    let out = fx.checked_cycle();
    assert!(out.decisions.iter().all(|d| d.job != wide));
    assert!(!fx.sched.is_running(wide));
    let d = fx.decision(&out, urgent);
    assert!(d.placed);
    assert_eq!(d.explanation.preempted, ["low"]);
    assert_eq!(out.evicted, [low]);
    assert!(fx.sched.is_running(high));
    assert!(!fx.sched.is_running(low));
}

#[test]
fn reclaiming_nominal_quota_evicts_a_borrower_of_equal_priority() {
    let mut reclaiming = queue("a", None, 16);
    reclaiming.reclaim = Reclaim::Any;
    let mut fx = four_nodes(&[reclaiming, queue("b", None, 16)]);
    // b fills its own quota, then borrows all of a's idle quota with a second job.
    let own = fx.submit(fx.job("b-own", "b", 0, 2, 8));
    let mut extra = fx.job("b-extra", "b", 0, 2, 8);
    extra.submit_s += 1.0;
    let extra = fx.submit(extra);
    let out = fx.checked_cycle();
    assert_eq!(
        fx.decision(&out, own).explanation.quota.builtin,
        Admission::Within
    );
    assert_eq!(
        fx.decision(&out, extra).explanation.quota.builtin,
        Admission::Borrowing { gpus: 16 }
    );
    // a asks for its own nominal quota back: the borrowing job gives way, b's own stays.
    let owner = fx.submit(fx.job("a-pair", "a", 0, 2, 8));
    let out = fx.checked_cycle();
    let d = fx.decision(&out, owner);
    assert!(d.placed);
    assert_eq!(d.explanation.quota.builtin, Admission::Within);
    assert_eq!(d.explanation.preempted, ["b-extra"]);
    assert_eq!(out.evicted, [extra]);
    assert!(fx.sched.is_running(own));
    // The borrower cannot come back while a's quota is in use: it is parked and costs
    // nothing, cycle after cycle.
    assert_eq!(parked(&fx, extra), Some(Blocked::Room));
    for _ in 0..6 {
        let out = fx.checked_cycle();
        assert!(out.decisions.is_empty());
    }
    // a's job ends: the borrower is woken and borrows a's idle quota again.
    fx.finish(owner);
    let out = fx.checked_cycle();
    let d = fx.decision(&out, extra);
    assert!(d.placed);
    assert_eq!(
        d.explanation.quota.builtin,
        Admission::Borrowing { gpus: 16 }
    );
}

#[test]
fn a_queue_within_its_quota_does_not_preempt_its_equals_elsewhere() {
    let mut fx = four_nodes(&[queue("a", None, 16), queue("b", None, 16)]);
    // b borrows 16 GPUs, but in one job of 32: evicting it would push b below its own quota.
    let wide = fx.submit(fx.job("b-wide", "b", 0, 4, 8));
    let out = fx.checked_cycle();
    assert_eq!(
        fx.decision(&out, wide).explanation.quota.builtin,
        Admission::Borrowing { gpus: 16 }
    );
    let owner = fx.submit(fx.job("a-pair", "a", 0, 2, 8));
    let out = fx.checked_cycle();
    let d = fx.decision(&out, owner);
    assert!(!d.placed);
    assert!(d.explanation.preempted.is_empty());
    assert!(out.evicted.is_empty());
    assert!(fx.sched.is_running(wide));
}

#[test]
fn regression_jobs_without_gpus_never_reclaim_from_each_other() {
    // GPU quota is all a queue borrows, so a job asking no GPU borrows nothing and reclaims
    // nothing. Each queue's CPU-only job took the other's as a borrower before: they evicted
    // each other cycle after cycle.
    let mut fx = four_nodes(&[queue("a", None, 16), queue("b", None, 16)]);
    let whole_node = |fx: &Fixture, name: &str, queue: &str| {
        let mut spec = fx.job(name, queue, 0, 1, 0);
        spec.shape.cpu_milli = 192_000;
        spec
    };
    let held: Vec<JobId> = (0..4)
        .map(|i| fx.submit(whole_node(&fx, &format!("b-cpu-{i}"), "b")))
        .collect();
    let out = fx.checked_cycle();
    assert!(out.decisions.iter().all(|d| d.placed));
    let waiting = fx.submit(whole_node(&fx, "a-cpu", "a"));
    for _ in 0..4 {
        let out = fx.checked_cycle();
        assert!(out.evicted.is_empty(), "evicted {:?}", out.evicted);
    }
    assert!(held.iter().all(|&id| fx.sched.is_running(id)));
    assert!(!fx.sched.is_running(waiting));
    assert_eq!(parked(&fx, waiting), Some(Blocked::Room));
}

// ---------------------------------------------------------------------------------------------
// Node health.

#[test]
fn unhealthy_and_preflight_nodes_never_receive_pods() {
    let mut fx = Fixture::single_queue(&[Pool::h100(8, 4, Some(2))], 256);
    let unhealthy = fx.node("h100-0");
    let preflight = fx.node("h100-5");
    fx.sched.state.set_health(unhealthy, Health::Unhealthy);
    fx.sched.state.set_health(preflight, Health::Preflight);
    fx.initial.health[unhealthy] = Health::Unhealthy as u8;
    fx.initial.health[preflight] = Health::Preflight as u8;

    // More whole-node pods than healthy nodes.
    let singles: Vec<_> = (0..10)
        .map(|i| fx.submit(fx.job(&format!("single-{i}"), "default", 0, 1, 8)))
        .collect();
    let out = fx.checked_cycle();
    let placed: Vec<_> = singles
        .iter()
        .copied()
        .filter(|&id| fx.sched.is_running(id))
        .collect();
    assert_eq!(placed.len(), 6);
    for &id in &placed {
        for slot in fx.sched.slots(id) {
            assert!(![unhealthy, preflight].contains(&(slot.node as usize)));
        }
    }
    let waiting = singles
        .iter()
        .find(|&&id| !fx.sched.is_running(id))
        .unwrap();
    assert_eq!(
        fx.decision(&out, *waiting).explanation.summary(),
        "0/8 nodes are available: 6 Insufficient nvidia.com/gpu, 2 node not ready or not healthy. \
         Waiting for 1 pod(s) of 8 GPU(s) to free up."
    );
    for id in singles {
        fx.finish(id);
    }

    // Fractional pods pack onto the remaining nodes only.
    let shared = fx.submit(fx.fractional("notebooks", "default", 0, 16, 500));
    fx.checked_cycle();
    assert_eq!(fx.sched.slots(shared).len(), 16);
    for slot in fx.sched.slots(shared) {
        assert!(![unhealthy, preflight].contains(&(slot.node as usize)));
    }
    fx.finish(shared);

    // A gang that must share a rack: each rack has one bad node, so neither holds 4 pods.
    let mut spec = fx.job("rack-gang", "default", 0, 4, 8);
    spec.topology.level = Some(RACK);
    spec.topology.required = true;
    let gang = fx.submit(spec);
    let out = fx.checked_cycle();
    let d = fx.decision(&out, gang);
    assert!(!d.placed);
    assert_eq!(
        waiting_for(&d.explanation.outcome),
        "room for all 4 pods in one rack (6 fit across the cluster)"
    );
    // Whatever happens to the gang next, the two nodes stay empty.
    for _ in 0..3 {
        fx.checked_cycle();
        for slot in fx.sched.slots(gang) {
            assert!(![unhealthy, preflight].contains(&(slot.node as usize)));
        }
    }
}

#[test]
fn no_node_state_but_healthy_takes_pods() {
    for health in [
        Health::NotReady,
        Health::Unhealthy,
        Health::Preflight,
        Health::Cordoned,
    ] {
        let mut fx = Fixture::single_queue(&[Pool::h100(2, 2, None)], 64);
        let bad = fx.node("h100-1");
        fx.sched.state.set_health(bad, health);
        fx.initial.health[bad] = health as u8;
        let ids: Vec<_> = (0..16)
            .map(|i| fx.submit(fx.job(&format!("p{i}"), "default", 0, 1, 1)))
            .collect();
        fx.checked_cycle();
        let running: Vec<_> = ids
            .into_iter()
            .filter(|&id| fx.sched.is_running(id))
            .collect();
        assert_eq!(running.len(), 8, "{health:?}");
        assert!(
            running
                .iter()
                .all(|&id| fx.sched.slots(id)[0].node as usize != bad),
            "{health:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Quota.

/// research (pretraining 16, rl 16 borrowing at most 8) and applied (16, lending at most 4), on
/// 64 GPUs.
fn quota_fixture() -> Fixture {
    let mut rl = queue("rl", Some("research"), 16);
    rl.borrowing_limit_gpus = Some(8);
    let mut applied = queue("applied", None, 16);
    applied.lending_limit_gpus = Some(4);
    Fixture::new(
        &[Pool::h100(8, 8, None)],
        &[
            queue("research", None, 0),
            queue("pretraining", Some("research"), 16),
            rl,
            applied,
        ],
    )
}

#[test]
fn quota_denial_carries_the_queue_refusal() {
    let mut fx = quota_fixture();
    let job = fx.submit(fx.job("rl-big", "rl", 0, 4, 8));
    let out = fx.checked_cycle();
    let d = fx.decision(&out, job);
    assert!(!d.placed);
    assert!(out.evicted.is_empty());
    assert!(fx.sched.slots(job).is_empty());
    let reason = "queue rl would borrow 16 GPUs, over its borrowing limit of 8";
    let e = &d.explanation;
    assert_eq!(
        e.quota.builtin,
        Admission::Denied {
            reason: reason.into()
        }
    );
    assert_eq!(waiting_for(&e.outcome), format!("quota: {reason}"));
    assert_eq!(e.summary(), format!("Waiting for quota: {reason}."));
    // Refused before any filter ran.
    assert!(e.filters.is_empty() && e.top_nodes.is_empty());
    assert_eq!(e.nodes_feasible, 0);
    assert!(e.preempted.is_empty());
    assert_eq!(fx.sched.queues.used(fx.queue_id("rl")).gpus, 0);
}

#[test]
fn borrowing_within_the_limit_is_admitted_and_explained() {
    let mut fx = quota_fixture();
    let job = fx.submit(fx.job("rl-wide", "rl", 0, 3, 8));
    let out = fx.checked_cycle();
    let d = fx.decision(&out, job);
    assert!(d.placed);
    assert_eq!(
        d.explanation.quota.builtin,
        Admission::Borrowing { gpus: 8 }
    );
    assert_eq!(fx.sched.queues.used(fx.queue_id("rl")).gpus, 24);
    assert_eq!(fx.sched.queues.used(fx.queue_id("research")).gpus, 24);
}

#[test]
fn quota_denial_when_nothing_idle_can_be_borrowed() {
    let mut fx = quota_fixture();
    let a = fx.submit(fx.job("pretraining-full", "pretraining", 0, 2, 8));
    let b = fx.submit(fx.job("rl-full", "rl", 0, 2, 8));
    let c = fx.submit(fx.job("applied-full", "applied", 0, 2, 8));
    fx.checked_cycle();
    assert!([a, b, c].iter().all(|&id| fx.sched.is_running(id)));
    let more = fx.submit(fx.job("applied-more", "applied", 0, 1, 8));
    let out = fx.checked_cycle();
    let d = fx.decision(&out, more);
    assert!(!d.placed);
    let reason = "queue applied is at its quota of 16 GPUs, so the 8 it needs must be borrowed; the other top-level queues have only 0 idle GPUs to lend";
    assert_eq!(
        d.explanation.quota.builtin,
        Admission::Denied {
            reason: reason.into()
        }
    );
    assert_eq!(
        d.explanation.summary(),
        format!("Waiting for quota: {reason}.")
    );
}

// ---------------------------------------------------------------------------------------------
// Regressions: bugs these tests found in the core, now fixed (whole-GPU release freeing a
// shared GPU, running_gpus never shrinking, preemption taking needless victims, a queue
// borrowing the same idle quota twice).

/// One 8-GPU node: a whole-GPU pod on GPU 0, then two 500-milli pods that fill GPU 7 exactly
/// (best fit breaks the tie towards the last GPU).
fn whole_gpu_and_two_halves() -> (Fixture, [gantry_core::JobId; 3]) {
    let mut fx = Fixture::single_queue(&[Pool::h100(1, 1, None)], 8);
    let whole = fx.submit(fx.job("whole", "default", 0, 1, 1));
    fx.checked_cycle();
    assert_eq!(fx.sched.slots(whole)[0].shared_gpu, None);
    let half_a = fx.submit(fx.fractional("half-a", "default", 0, 1, 500));
    let half_b = fx.submit(fx.fractional("half-b", "default", 0, 1, 500));
    fx.checked_cycle();
    assert_eq!(fx.sched.slots(half_a)[0].shared_gpu, Some(7));
    assert_eq!(fx.sched.slots(half_b)[0].shared_gpu, Some(7));
    assert_eq!(fx.sched.state.nodes.gpu_free[0], 6);
    (fx, [whole, half_a, half_b])
}

#[test]
fn a_parked_fractional_job_is_retried_only_once_a_gpu_could_hold_it() {
    // Every GPU is 600/1000 used: a pod asking 500 fits nowhere. A release that frees no GPU
    // fraction (a CPU-only job ending) does not cost it an attempt; one that does, places it.
    let mut fx = Fixture::single_queue(&[Pool::h100(1, 1, None)], 16);
    let sixths: Vec<JobId> = (0..8)
        .map(|i| fx.submit(fx.fractional(&format!("six-{i}"), "default", 0, 1, 600)))
        .collect();
    let cpu_only = fx.submit(fx.job("cpu-only", "default", 0, 1, 0));
    let out = fx.checked_cycle();
    assert!(out.decisions.iter().all(|d| d.placed));
    assert_eq!(fx.sched.state.largest_gpu_fraction_free(), 400);
    assert_eq!(fx.sched.state.gpu_milli_free_total(), 8 * 400);
    let half = fx.submit(fx.fractional("half", "default", 0, 1, 500));
    let out = fx.checked_cycle();
    assert!(!fx.decision(&out, half).placed);
    assert_eq!(parked(&fx, half), Some(Blocked::Room));
    fx.finish(cpu_only);
    let out = fx.checked_cycle();
    assert!(out.decisions.is_empty(), "{:?}", out.decisions);
    fx.finish(sixths[3]);
    let out = fx.checked_cycle();
    assert!(fx.decision(&out, half).placed);
    assert_eq!(fx.sched.state.largest_gpu_fraction_free(), 500);
}

#[test]
fn regression_releasing_whole_gpus_frees_a_shared_gpu() {
    let (mut fx, [whole, half_a, half_b]) = whole_gpu_and_two_halves();
    // The whole-GPU job ends. Its release zeroes the last GPU at 1000 milli, GPU 7, which the
    // halves still share, and leaves GPU 0 (the one it held) marked in use.
    fx.finish(whole);
    assert_eq!(fx.sched.state.nodes.gpu_free[0], 7); // the count is right, the GPU wrong
    let half_c = fx.submit(fx.fractional("half-c", "default", 0, 1, 500));
    fx.checked_cycle();
    assert!(fx.sched.is_running(half_c));
    let on_gpu_7 = [half_a, half_b, half_c]
        .iter()
        .filter(|&&id| fx.sched.slots(id)[0].shared_gpu == Some(7))
        .count();
    assert!(fx.sched.state.audit().is_ok()); // the audit does not see it
    assert!(on_gpu_7 <= 2, "{on_gpu_7} pods of 500 milli share GPU 7");
}

#[test]
fn regression_releasing_whole_gpus_leaks_the_gpu_it_held() {
    let (mut fx, jobs) = whole_gpu_and_two_halves();
    for id in jobs {
        fx.finish(id);
    }
    assert_eq!(fx.sched.running().count(), 0);
    let free_when_idle = fx.sched.state.nodes.gpu_free[0];
    assert_eq!(free_when_idle, 8);
}

#[test]
fn regression_preemption_evicts_jobs_that_cannot_make_room() {
    // Two H100 nodes and two L4 nodes, all busy.
    let mut fx = Fixture::single_queue(&[Pool::h100(2, 2, None), Pool::l4(2, 2)], 64);
    let mut l4 = fx.job("l4-filler", "default", 0, 2, 4);
    l4.shape.gpu_type = fx.symbols.intern("L4");
    let l4 = fx.submit(l4);
    let mut h100 = fx.job("h100-filler", "default", 5, 2, 8);
    h100.shape.gpu_type = fx.symbols.intern("H100-SXM5-80GB");
    let h100 = fx.submit(h100);
    fx.checked_cycle();
    assert!(fx.sched.is_running(l4) && fx.sched.is_running(h100));

    // An urgent H100 pod: only evicting the H100 filler can make room for it.
    let mut urgent = fx.job("urgent", "default", 100, 1, 8);
    urgent.shape.gpu_type = fx.symbols.intern("H100-SXM5-80GB");
    let urgent = fx.submit(urgent);
    let out = fx.checked_cycle();
    let d = fx.decision(&out, urgent);
    assert!(d.placed);
    assert!(d.explanation.preempted.contains(&"h100-filler".to_string()));
    assert!(!fx.sched.is_running(h100));
    assert_eq!(d.explanation.preempted, ["h100-filler"]);
}

#[test]
fn regression_running_gpus_counts_finished_jobs() {
    let mut fx = four_nodes(&[queue("default", None, 32)]);
    let job = fx.submit(fx.job("pair", "default", 0, 2, 8));
    fx.checked_cycle();
    assert_eq!(fx.sched.running_gpus(), 16);
    fx.finish(job);
    assert_eq!(fx.sched.running().count(), 0);
    let after = fx.sched.running_gpus();
    assert_eq!(after, 0);
}

#[test]
fn gang_requiring_a_rack_lands_in_the_rack_that_frees_up() {
    // Two racks of four nodes; one bad node in each, so no rack holds a gang of 4 at first.
    let mut fx = Fixture::single_queue(&[Pool::h100(8, 4, Some(2))], 256);
    let unhealthy = fx.node("h100-0");
    let preflight = fx.node("h100-5");
    fx.sched.state.set_health(unhealthy, Health::Unhealthy);
    fx.sched.state.set_health(preflight, Health::Preflight);
    fx.initial.health[unhealthy] = Health::Unhealthy as u8;
    let mut spec = fx.job("rack-gang", "default", 0, 4, 8);
    spec.topology.level = Some(RACK);
    spec.topology.required = true;
    let gang = fx.submit(spec);
    let out = fx.checked_cycle();
    assert!(!fx.decision(&out, gang).placed);
    // Parked: nothing changes, so it is not tried again.
    for _ in 0..2 {
        let out = fx.checked_cycle();
        assert!(out.decisions.is_empty());
        assert!(fx.sched.slots(gang).is_empty());
    }

    // The preflight node passes its checks: rack 1 (h100-4..7) now holds the gang.
    fx.sched.state.set_health(preflight, Health::Healthy);
    let out = fx.checked_cycle();
    let d = fx.decision(&out, gang);
    assert!(d.placed);
    assert_eq!(d.explanation.domain.as_deref(), Some("rack 1"));
    assert_eq!(fx.placement(gang), one_pod_each(&fx, 4, 4));
}

#[test]
fn balloon_gang_never_holds_quota() {
    let mut fx = four_nodes(&[queue("default", None, 32)]);
    let busy = fx.submit(fx.job("busy", "default", 0, 1, 8));
    fx.checked_cycle();
    // A balloon gang of four whole nodes does not fit until the busy node frees up.
    let balloon = fx.submit(fx.balloon("balloon", "default", -100, 4, 8));
    let out = fx.checked_cycle();
    assert!(!fx.decision(&out, balloon).placed);
    fx.finish(busy);
    let out = fx.checked_cycle();
    assert!(fx.decision(&out, balloon).placed);
    let default = fx.queue_id("default");
    assert_eq!(fx.sched.queues.used(default).gpus, 0);
    fx.finish(balloon);
    assert_eq!(fx.sched.running().count(), 0);
    assert_eq!(
        fx.sched.queues.used(default),
        gantry_core::Resources::default()
    );
}

#[test]
fn regression_a_queue_borrows_the_same_idle_quota_twice() {
    // Two top-level queues of 16 GPUs on 64 GPUs: b may borrow a's 16 idle GPUs, no more.
    let mut fx = Fixture::new(
        &[Pool::h100(8, 8, None)],
        &[queue("a", None, 16), queue("b", None, 16)],
    );
    let wide = fx.submit(fx.job("b-wide", "b", 0, 4, 8));
    let out = fx.checked_cycle();
    assert_eq!(
        fx.decision(&out, wide).explanation.quota.builtin,
        Admission::Borrowing { gpus: 16 }
    );
    assert_eq!(fx.sched.queues.lendable(fx.queue_id("a")), 16);
    // All of a's idle quota is borrowed: 8 more GPUs for b must be refused.
    let more = fx.submit(fx.job("b-more", "b", 0, 1, 8));
    let out = fx.checked_cycle();
    let d = fx.decision(&out, more);
    let refused = Admission::Denied {
        reason: "queue b is at its quota of 16 GPUs, so the 8 it needs must be borrowed; the other top-level queues have only 0 idle GPUs to lend".into(),
    };
    assert_eq!(d.explanation.quota.builtin, refused);
}

// ---------------------------------------------------------------------------------------------
// The scheduling queue.

/// One queue's head is blocked by its quota behind 5,000 jobs while another queue has room:
/// the other queue's jobs are placed in the next cycle, and the blocked jobs cost no attempt
/// (and no decision) until their queue gets quota back.
#[test]
fn a_quota_blocked_queue_does_not_starve_another() {
    let mut safety = queue("safety", None, 16);
    safety.borrowing_limit_gpus = Some(0);
    let config = gantry_core::SchedulerConfig {
        max_attempts: 200,
        ..gantry_core::SchedulerConfig::default()
    };
    let mut fx = Fixture::with_config(
        &[Pool::h100(64, 16, Some(2))],
        &[safety, queue("rl", None, 480)],
        config,
    );
    // rl has used more than safety, so safety's head goes first at equal priority.
    let rl_big = fx.submit(fx.job("rl-big", "rl", 0, 32, 8));
    let holder = fx.submit(fx.job("safety-holder", "safety", 0, 2, 8));
    fx.checked_cycle();
    assert!(fx.sched.is_running(rl_big) && fx.sched.is_running(holder));
    let (safety_id, rl_id) = (fx.queue_id("safety"), fx.queue_id("rl"));
    assert!(fx.sched.queues.fair_share_key(safety_id) < fx.sched.queues.fair_share_key(rl_id));

    let blocked: Vec<JobId> = (0..5000)
        .map(|i| fx.submit(fx.job(&format!("safety-{i}"), "safety", 0, 1, 1)))
        .collect();
    let out = fx.checked_cycle();
    // Each is refused by the built-in quota once, which costs no attempt.
    assert_eq!(out.decisions.len(), 5000);
    assert_eq!(out.attempts, 0);
    assert!(
        blocked
            .iter()
            .all(|&id| parked(&fx, id) == Some(Blocked::Quota))
    );

    let rl_jobs: Vec<JobId> = (0..20)
        .map(|i| fx.submit(fx.job(&format!("rl-{i}"), "rl", 0, 1, 8)))
        .collect();
    let out = fx.checked_cycle();
    assert!(rl_jobs.iter().all(|&id| fx.sched.is_running(id)));
    assert_eq!(out.attempts, 20);
    assert!(out.decisions.iter().all(|d| rl_jobs.contains(&d.job)));

    // Nothing changes: nothing is tried.
    let out = fx.checked_cycle();
    assert!(out.decisions.is_empty());

    // safety gets its 16 GPUs back: the 16 jobs it can now admit are woken and placed, and
    // the rest stay parked without an attempt.
    fx.finish(holder);
    let out = fx.checked_cycle();
    assert_eq!(out.woken, 16);
    assert_eq!(out.attempts, 16);
    assert_eq!(out.decisions.iter().filter(|d| d.placed).count(), 16);
    assert_eq!(fx.sched.queues.used(safety_id).gpus, 16);
    assert_eq!(
        blocked
            .iter()
            .filter(|&&id| fx.sched.is_running(id))
            .count(),
        16
    );
}
