//! Contract 0.2.0 beside 0.1.0: the real `label-affinity` component (0.2.0) scores in one set
//! with the 0.1.0 `gpu-fit` and `gpu-binpack`, sees the label columns it asked for, resolves
//! topology domain names through `host.domain-name`, and its reasons reach the decision's
//! top-node table; a 0.2.0 policy whose reasons break the bounds is a fault, not a crash.
mod common;

use std::sync::Arc;

use common::*;
use gantry_core::scheduler::CHUNK;
use gantry_core::{
    ClusterState, JobSpec, NodeLabel, NodeTable, Outcome, PolicyHooks, QueueDef, Queues, Resources,
    Scheduler, SchedulerConfig, Symbols, TopologyPref, Verdict, builtin,
};
use gantry_policy::{
    FaultKind, NodeCache, Policy, PolicyEngine, PolicyFault, PolicyOptions, PolicySet,
    SCORE_REASONS_MAX, SetEntry, Version, WasmNodes,
};

const POOL: &str = "gantry.dev/pool";

/// `count` nodes (racks of 4, named `rack-R`) where every third node is in pool `train`, the
/// others in pool `infer` but every fifth, which has no pool label; every node also carries an
/// unrelated `zone` label, which the policy never asks for.
fn labelled(symbols: &Symbols, count: usize) -> NodeTable {
    let mut table = nodes(symbols, count);
    let (pool, zone) = (symbols.intern(POOL), symbols.intern("zone"));
    table.labels = (0..count)
        .map(|i| {
            let mut labels = vec![NodeLabel::new(zone, symbols.intern("z1"), "z1")];
            let value = match i {
                _ if i.is_multiple_of(3) => Some("train"),
                _ if i.is_multiple_of(5) => None,
                _ => Some("infer"),
            };
            if let Some(value) = value {
                labels.push(NodeLabel::new(pool, symbols.intern(value), value));
            }
            labels.sort_by_key(|l| l.key);
            labels.into()
        })
        .collect();
    let racks = table.levels[0].domain_gpu_total.len();
    table.levels[0].domain_name = (0..racks)
        .map(|r| symbols.intern(&format!("rack-{r}")))
        .collect();
    table
}

fn load(engine: &PolicyEngine, name: &str, config: &str) -> Arc<Policy> {
    Arc::new(
        engine
            .load(&plugin(name), PolicyOptions::with_config(config))
            .unwrap_or_else(|e| panic!("{name}: {e}")),
    )
}

fn entry(policy: &Arc<Policy>) -> SetEntry {
    SetEntry {
        policy: policy.clone(),
        weight: 1,
    }
}

const TRAIN: &str = r#"{"value": "train"}"#;

/// What label-affinity says about node `i` of `labelled`.
fn reason(i: usize) -> String {
    format!("label {POOL}=train matches, in rack-{}", i / 4)
}

#[test]
fn a_0_2_score_runs_beside_0_1_policies_in_one_set() {
    let engine = engine();
    let symbols = symbols_of(&engine);
    let fit = load(&engine, "gpu-fit", "{}");
    let binpack = load(&engine, "gpu-binpack", "{}");
    let affinity = load(&engine, "label-affinity", TRAIN);
    assert_eq!(
        [fit.version(), binpack.version(), affinity.version()],
        [Version::V0_1, Version::V0_1, Version::V0_2]
    );
    assert_eq!(affinity.label_keys(), [symbols.intern(POOL)]);
    assert!(binpack.label_keys().is_empty());
    let set = PolicySet::new(1, vec![entry(&fit), entry(&binpack), entry(&affinity)]);
    let mut cache = NodeCache::default();
    let mut set = set.bind(&mut cache);
    let n = CHUNK + 100;
    let state = ClusterState::new(labelled(&symbols, n));
    let pod = pod(&symbols, 1);
    for start in (0..n).step_by(CHUNK) {
        let range = start..(start + CHUNK).min(n);
        let binpack_expected = builtin::gpu_binpack_range(&pod, &state.nodes, range.clone());
        // Every node in play (the cached chunk, lent as is), then one in four (gathered, as
        // under half are in play): reasons must name the node of the range, not of the view.
        let all = vec![true; range.len()];
        let some: Vec<bool> = range.clone().map(|node| node % 4 == 1).collect();
        for in_play in [&all, &some] {
            let answers = set.score_explained(&state, &pod, range.clone(), in_play);
            let names: Vec<&str> = answers.iter().map(|a| a.0.as_str()).collect();
            assert_eq!(names, ["gpu-binpack", "label-affinity"]);
            let Verdict::Answer(binpack_scores) = &answers[0].2 else {
                panic!("gpu-binpack faulted: {:?}", answers[0].2)
            };
            let Verdict::Answer(affinity_scores) = &answers[1].2 else {
                panic!("label-affinity faulted: {:?}", answers[1].2)
            };
            assert!(answers[0].3.is_empty(), "a 0.1.0 policy gives no reasons");
            let playing: Vec<usize> = (0..range.len()).filter(|&i| in_play[i]).collect();
            for &i in &playing {
                let node = range.start + i;
                assert_eq!(binpack_scores[i], binpack_expected[i], "node {node}");
                // The label column it asked for decided its score.
                let train = node.is_multiple_of(3);
                assert_eq!(
                    affinity_scores[i],
                    if train { 100 } else { 0 },
                    "node {node}"
                );
            }
            // Reasons for the first matching nodes in play, each with its rack's name.
            let expected: Vec<(u32, String)> = playing
                .iter()
                .filter(|&&i| (range.start + i).is_multiple_of(3))
                .take(SCORE_REASONS_MAX)
                .map(|&i| (i as u32, reason(range.start + i)))
                .collect();
            assert_eq!(answers[1].3, expected);
            assert!(!expected.is_empty());
        }
    }
}

#[test]
fn score_reasons_reach_the_decisions_top_nodes() {
    let engine = engine();
    let symbols = symbols_of(&engine);
    let binpack = load(&engine, "gpu-binpack", "{}");
    let affinity = load(&engine, "label-affinity", TRAIN);
    let set = PolicySet::new(3, vec![entry(&binpack), entry(&affinity)]);
    let queue = QueueDef {
        name: "team-a".into(),
        parent: None,
        nominal_gpus: 1 << 20,
        weight: 1,
        borrowing_limit_gpus: None,
        lending_limit_gpus: None,
        reclaim: gantry_core::Reclaim::Never,
    };
    let queues = Queues::new(&[queue], Resources::gpus(1 << 20), 3600.0).unwrap();
    let mut scheduler = Scheduler::new(
        ClusterState::new(labelled(&symbols, 64)),
        queues,
        symbols.clone(),
        SchedulerConfig::default(),
    );
    let shape = pod(&symbols, 1);
    scheduler.submit(JobSpec {
        name: "pod-0".into(),
        queue: 0,
        priority: 0,
        pods: 1,
        shape,
        balloon: false,
        topology: TopologyPref::default(),
        submit_s: 0.0,
        expected_runtime_s: None,
    });
    let mut cache = NodeCache::default();
    let out = scheduler.cycle(0.0, &mut set.bind(&mut cache));
    let e = &out.decisions[0].explanation;
    assert!(e.faults.is_empty(), "{:?}", e.faults);
    let Outcome::Placed { nodes } = &e.outcome else {
        panic!("not placed: {:?}", e.outcome)
    };
    // The label outweighs binpacking's preference: the pod lands in pool train.
    let placed: usize = nodes[0].0.trim_start_matches("node-").parse().unwrap();
    assert!(placed.is_multiple_of(3), "placed on {}", nodes[0].0);
    assert!(!e.top_nodes.is_empty());
    for top in &e.top_nodes {
        let i: usize = top.node.trim_start_matches("node-").parse().unwrap();
        let expected = if i.is_multiple_of(3) && i / 3 < SCORE_REASONS_MAX {
            vec![("label-affinity".to_string(), reason(i))]
        } else {
            Vec::new()
        };
        assert_eq!(top.reasons, expected, "{}", top.node);
    }
    assert!(e.top_nodes[0].reasons.len() == 1, "{:?}", e.top_nodes);
}

#[test]
fn domain_names_come_from_the_nodes_of_the_call() {
    let engine = engine();
    let symbols = symbols_of(&engine);
    let affinity = load(&engine, "label-affinity", TRAIN);
    let mut table = labelled(&symbols, 8);
    // A rack the source did not name: the reason leaves the domain out.
    table.levels[0].domain_name[1] = 0;
    let scored = affinity
        .score_explained(&pod(&symbols, 1), &WasmNodes::new(&table))
        .unwrap();
    assert_eq!(
        scored
            .reasons
            .iter()
            .map(|r| (r.node, r.text.as_str()))
            .collect::<Vec<_>>(),
        [
            (0, "label gantry.dev/pool=train matches, in rack-0"),
            (3, "label gantry.dev/pool=train matches, in rack-0"),
            (6, "label gantry.dev/pool=train matches"),
        ]
    );
}

#[test]
fn reasons_over_the_bounds_are_faults_not_crashes() {
    let engine = engine();
    let symbols = symbols_of(&engine);
    let nodes = WasmNodes::new(&nodes(&symbols, 32));
    let pod = pod(&symbols, 1);
    let long = load(&engine, "hostile-long-reason", "{}");
    assert_eq!(long.version(), Version::V0_2);
    let fault = long.score_explained(&pod, &nodes).unwrap_err();
    assert_eq!(fault.kind(), FaultKind::BadOutput);
    assert_eq!(
        fault,
        PolicyFault::BadOutput {
            detail: "score returned a reason of 65535 bytes for node 0; reason texts are at \
                     most 200 bytes"
                .into()
        }
    );
    // Score fails open: the set skips it and goes on.
    assert!(matches!(
        long.guard(Err::<(), _>(fault)),
        gantry_policy::Guarded::Skipped(_)
    ));
    let many = load(&engine, "hostile-long-reason", r#"{"reasons": 17}"#);
    assert_eq!(
        many.score_explained(&pod, &nodes).unwrap_err().to_string(),
        "bad output: score returned 17 reasons; at most 16 may be given per call"
    );
    // The bound is inclusive, and the host keeps serving after the faults.
    let most = load(&engine, "hostile-long-reason", r#"{"reasons": 16}"#);
    assert_eq!(
        most.score_explained(&pod, &nodes).unwrap().reasons.len(),
        16
    );
    assert!(long.wait_ready(std::time::Duration::from_secs(5)));
    assert!(long.score_explained(&pod, &nodes).is_err());
}
