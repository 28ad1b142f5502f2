//! The policy set keeps its Wasm-shaped node chunks in step with the cluster: after placements,
//! releases and health changes, the Wasm gpu-fit and gpu-binpack answer exactly as the
//! built-ins do on the live table.
mod common;

use std::sync::Arc;

use common::*;
use gantry_core::scheduler::CHUNK;
use gantry_core::{ClusterState, Health, PolicyHooks, Verdict, builtin};
use gantry_policy::{PolicyOptions, PolicySet, SetEntry};

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
    let mut set = PolicySet::new(7, vec![entry("gpu-fit"), entry("gpu-binpack")]);
    let n = 2 * CHUNK + 300;
    let mut state = ClusterState::new(nodes(&symbols, n));
    let pod = pod(&symbols, 4);
    let check = |set: &mut PolicySet, state: &ClusterState| {
        for start in (0..n).step_by(CHUNK) {
            let range = start..(start + CHUNK).min(n);
            let filters = set.filter(state, &pod, range.clone());
            let Verdict::Answer(codes) = &filters[0].1 else {
                panic!("gpu-fit faulted")
            };
            assert_eq!(
                codes,
                &builtin::gpu_fit_range(&pod, &state.nodes, range.clone())
            );
            let scores = set.score(state, &pod, range.clone());
            let Verdict::Answer(scores) = &scores[0].2 else {
                panic!("gpu-binpack faulted")
            };
            assert_eq!(
                scores,
                &builtin::gpu_binpack_range(&pod, &state.nodes, range)
            );
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
