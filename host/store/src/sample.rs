//! A realistic decision record: the fixture the store's, the engine's and the API's tests
//! write, and what `gantry bench store` appends.

use gantry_core::explain::{FilterExplain, NodeScore, QuotaExplain};
use gantry_core::{Admission, Explanation, Outcome, PolicyRef};

/// A realistic decision for job `i`: one in four pending with filter reasons, the rest placed
/// on one to four nodes with their scores. About 350 bytes as stored (880 as JSON).
pub fn sample_explanation(i: u64) -> Explanation {
    let job = format!("team-{}/job-{}", i % 17, i % 5000);
    let placed = !i.is_multiple_of(4);
    let n_nodes = 1 + (i % 4) as usize;
    let node = |k: usize| format!("node-{:05}", (i as usize * 7 + k * 131) % 7500);
    let outcome = if placed {
        Outcome::Placed {
            nodes: (0..n_nodes).map(|k| (node(k), 8)).collect(),
        }
    } else {
        Outcome::Pending {
            waiting_for: "64 GPUs in one rack".into(),
        }
    };
    Explanation {
        job,
        queue: format!("team-{}", i % 17),
        pods: n_nodes as u32,
        gpus_per_pod: 8,
        priority: (i % 3) as i32,
        time_s: i as f64 * 0.001,
        outcome,
        quota: QuotaExplain {
            builtin: Admission::Within,
            policies: vec![],
            fair_share_key: 0.25,
            position: (i % 50) as u32,
        },
        nodes_total: 7500,
        nodes_evaluated: 7500,
        nodes_feasible: if placed { 812 } else { 0 },
        filters: vec![FilterExplain {
            policy: "builtin".into(),
            rejected: vec![
                ("Insufficient nvidia.com/gpu".into(), 6688),
                ("node(s) had untolerated taint".into(), 12),
            ],
        }],
        top_nodes: (0..if placed { n_nodes } else { 0 })
            .map(|k| NodeScore {
                node: node(k),
                total: 900 - k as u64,
                parts: vec![("builtin".into(), 500), ("gpu-binpack".into(), 400)],
                reasons: Vec::new(),
            })
            .collect(),
        domain: placed.then(|| format!("rack {}", i % 120)),
        policy_set: 3,
        policies: vec![PolicyRef {
            name: "gpu-binpack".into(),
            version: "1.2.0".into(),
            role: "score".into(),
            weight: 2,
            sha256: "9f2c".repeat(16),
        }],
        preempted: vec![],
        faults: vec![],
        estimate: None,
        preempted_by: None,
    }
}
