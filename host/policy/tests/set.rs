//! The policy set keeps its Wasm-shaped node chunks in step with the cluster: after placements,
//! releases and health changes, the Wasm gpu-fit and gpu-binpack answer exactly as the
//! built-ins do on the live table.
mod common;

use std::sync::Arc;

use common::*;
use gantry_core::scheduler::CHUNK;
use gantry_core::{ClusterState, Health, PolicyHooks, Verdict, builtin};
use gantry_policy::{ActiveSet, NodeCache, PolicyOptions, PolicySet, SetEntry};

#[test]
fn chunks_follow_the_cluster_through_changes() {
    let engine = engine();
    let symbols = symbols_of(&engine);
    let entry = |name: &str| SetEntry {
        policy: Arc::new(
            engine
                .load(&plugin(name), PolicyOptions::default())
                .unwrap(),
        ),
        weight: 1,
    };
    let set = PolicySet::new(7, vec![entry("gpu-fit"), entry("gpu-binpack")]);
    let mut cache = NodeCache::default();
    let mut set = set.bind(&mut cache);
    let n = 2 * CHUNK + 300;
    let mut state = ClusterState::new(nodes(&symbols, n));
    let pod = pod(&symbols, 4);
    // Every node in play (the cached chunk is lent as is), then one in five (those are
    // gathered): the nodes in play get the answers the built-ins give, the rest none.
    let check = |set: &mut gantry_policy::BoundSet<'_>, state: &ClusterState| {
        for start in (0..n).step_by(CHUNK) {
            let range = start..(start + CHUNK).min(n);
            let fit = builtin::gpu_fit_range(&pod, &state.nodes, range.clone());
            let binpack = builtin::gpu_binpack_range(&pod, &state.nodes, range.clone());
            let all = vec![true; range.len()];
            let some: Vec<bool> = range.clone().map(|node| node % 5 == 0).collect();
            for in_play in [&all, &some] {
                let filters = set.filter(state, &pod, range.clone(), in_play);
                let Verdict::Answer(codes) = &filters[0].1 else {
                    panic!("gpu-fit faulted")
                };
                let scores = set.score(state, &pod, range.clone(), in_play);
                let Verdict::Answer(scores) = &scores[0].2 else {
                    panic!("gpu-binpack faulted")
                };
                for (i, &playing) in in_play.iter().enumerate() {
                    let (code, score) = if playing {
                        (fit[i], binpack[i])
                    } else {
                        (0, 0)
                    };
                    assert_eq!((codes[i], scores[i]), (code, score), "node {}", start + i);
                }
            }
        }
    };
    check(&mut set, &state);
    // Fill some nodes in every chunk, free one, mark another unhealthy.
    let mut slots = Vec::new();
    for node in [3, CHUNK + 8, 2 * CHUNK + 17, n - 1] {
        while state.capacity_for(node, &pod) > 0 {
            slots.push(state.reserve(node, &pod));
        }
    }
    check(&mut set, &state);
    state.release(slots.pop().unwrap(), &pod);
    state.set_health(CHUNK + 40, Health::Unhealthy);
    check(&mut set, &state);
    assert_eq!(set.set_version(), 7);
    assert_eq!(set.policies().len(), 2);
}

#[test]
fn activation_swaps_whole_sets_between_cycles() {
    use gantry_core::{
        JobSpec, QueueDef, Queues, Resources, Scheduler, SchedulerConfig, TopologyPref,
    };
    let engine = engine();
    let symbols = symbols_of(&engine);
    let load = |name: &str| {
        Arc::new(
            engine
                .load(&plugin(name), PolicyOptions::default())
                .unwrap(),
        )
    };
    let (fit, binpack) = (load("gpu-fit"), load("gpu-binpack"));
    let entry = |policy: &Arc<gantry_policy::Policy>| SetEntry {
        policy: policy.clone(),
        weight: 1,
    };
    let v1 = Arc::new(PolicySet::new(1, vec![entry(&fit), entry(&binpack)]));
    let v2 = Arc::new(PolicySet::new(2, vec![entry(&fit)]));
    let active = ActiveSet::new(PolicySet::new(1, vec![entry(&fit), entry(&binpack)]));
    let queue = QueueDef {
        name: "team-a".into(),
        parent: None,
        nominal_gpus: 1 << 20,
        weight: 1,
        borrowing_limit_gpus: None,
        lending_limit_gpus: None,
        reclaim: gantry_core::Reclaim::Never,
    };
    let table = nodes(&symbols, 3 * CHUNK);
    let queues = Queues::new(&[queue], Resources::gpus(1 << 20), 3600.0).unwrap();
    let mut scheduler = Scheduler::new(
        ClusterState::new(table),
        queues,
        symbols.clone(),
        SchedulerConfig::default(),
    );
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut seen = std::collections::BTreeSet::new();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for swap in 0..20 {
                let next = if swap % 2 == 0 {
                    v2.clone()
                } else {
                    v1.clone()
                };
                active.activate(next);
                std::thread::sleep(std::time::Duration::from_millis(3));
            }
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let mut cache = NodeCache::default();
        let mut i = 0;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) || i < 50 {
            let name = format!("pod-{i}");
            let mut shape = pod(&symbols, 1);
            shape.name = symbols.intern(&name);
            scheduler.submit(JobSpec {
                name,
                queue: 0,
                priority: 0,
                pods: 1,
                shape,
                balloon: false,
                topology: TopologyPref::default(),
                submit_s: i as f64,
                expected_runtime_s: None,
            });
            let set = active.load();
            let out = scheduler.cycle(i as f64, &mut set.bind(&mut cache));
            for decision in &out.decisions {
                let e = &decision.explanation;
                // Each decision names the one set its cycle ran on, and only that set's
                // policies took part.
                assert_eq!(e.policy_set, set.version());
                let names: Vec<&str> = e.policies.iter().map(|p| p.name.as_str()).collect();
                let expected: &[&str] = if set.version() == 1 {
                    &["gpu-fit", "gpu-binpack"]
                } else {
                    &["gpu-fit"]
                };
                assert_eq!(names, expected);
                let scored_by: Vec<&str> = e.top_nodes[0]
                    .parts
                    .iter()
                    .map(|(p, _)| p.as_str())
                    .collect();
                let expected: &[&str] = if set.version() == 1 {
                    &["gpu-binpack"]
                } else {
                    &["builtin:binpack"]
                };
                assert_eq!(scored_by, expected);
                seen.insert(e.policy_set);
            }
            i += 1;
        }
    });
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![1, 2]);
}
