//! The example policies from `plugins/`, run as real components.
mod common;

use std::sync::Arc;

use common::*;
use gantry_core::{
    CohortUsage, Health, JobRequest, QueueUsage, QuotaVerdict, Resources, Toleration,
};
use gantry_policy::{Guarded, Limits, PolicyOptions, PolicyRole, WasmNodes};

#[test]
fn gpu_fit_gives_a_declared_reason_per_node() {
    let engine = engine();
    let symbols = symbols_of(&engine);
    let policy = engine
        .load(&plugin("gpu-fit"), PolicyOptions::default())
        .unwrap();
    assert_eq!(policy.role(), PolicyRole::Filter);
    assert_eq!(policy.info().name, "gpu-fit");
    assert_eq!(policy.reason_text(3), Some("Insufficient nvidia.com/gpu"));

    let mut table = nodes(&symbols, 12);
    table.health[8] = Health::Unhealthy as u8; // 8 free GPUs, but unhealthy
    table.health[7] = Health::Preflight as u8;
    taint(&mut table, &symbols, 6, "team", "rl"); // 6 free GPUs, tainted
    table.gpu_type[5] = symbols.intern("H100");
    let pod = pod(&symbols, 4);
    let codes = policy.filter(&pod, &WasmNodes::new(&table)).unwrap();
    // Node i has i % 9 GPUs free: 0..=3 are too small, 4 fits, 5 is an H100 (any type will do),
    // 6 is tainted, 7 and 8 unverified or unhealthy, 9 has 0 free, 10 and 11 have 1 and 2.
    assert_eq!(codes, vec![3, 3, 3, 3, 0, 0, 4, 1, 1, 3, 3, 3]);

    // Tolerating the taint lets the pod onto node 6.
    let mut tolerant = pod.clone();
    tolerant.tolerations.push(Toleration {
        key: symbols.intern("team"),
        exists: true,
        value: 0,
        effect: None,
    });
    let codes = policy.filter(&tolerant, &WasmNodes::new(&table)).unwrap();
    assert_eq!(&codes[4..7], &[0, 0, 0]);

    // A typed request rejects the other type.
    let mut typed = pod.clone();
    typed.gpu_type = symbols.intern("A100");
    let codes = policy.filter(&typed, &WasmNodes::new(&table)).unwrap();
    assert_eq!(codes[5], 2);
}

#[test]
fn gpu_binpack_prefers_fuller_nodes_and_racks() {
    let engine = engine();
    let symbols = symbols_of(&engine);
    let policy = engine
        .load(&plugin("gpu-binpack"), PolicyOptions::default())
        .unwrap();
    assert_eq!(policy.role(), PolicyRole::Score);
    let table = nodes(&symbols, 8);
    let scores = policy
        .score(&pod(&symbols, 1), &WasmNodes::new(&table))
        .unwrap();
    assert_eq!(scores.len(), 8);
    assert!(scores.iter().all(|&s| s <= gantry_policy::MAX_SCORE));
    // Within rack 1 (nodes 4..8, 4..7 GPUs free), fewer free GPUs scores higher.
    assert!(scores[4] > scores[5] && scores[5] > scores[6] && scores[6] > scores[7]);
    // Node 1 (1 free, rack 0 with 6 free) beats node 7 (7 free, rack 1 with 22 free).
    assert!(scores[1] > scores[7]);

    let refused = engine
        .load(
            &plugin("gpu-binpack"),
            PolicyOptions::with_config(r#"{"node_weight": "lots"}"#),
        )
        .err()
        .expect("bad config refused")
        .to_string();
    assert!(
        refused.starts_with(
            "the policy refused its config: gpu-binpack config: invalid type: string \"lots\""
        ),
        "{refused}"
    );
}

fn queue(symbols: &gantry_core::Symbols, name: &str, nominal: u64, used: u64) -> QueueUsage {
    QueueUsage {
        name: symbols.intern(name),
        nominal: Resources::gpus(nominal),
        used: Resources::gpus(used),
        weight: 1,
        ..QueueUsage::default()
    }
}

#[test]
fn team_quota_admits_borrows_and_refuses() {
    let engine = engine();
    let symbols = symbols_of(&engine);
    let policy = engine
        .load(&plugin("team-quota"), PolicyOptions::default())
        .unwrap();
    assert_eq!(policy.role(), PolicyRole::Quota);
    let job = |gpus: u64| JobRequest {
        pod: pod(&symbols, 8),
        count: (gpus / 8) as u32,
        total: Resources::gpus(gpus),
    };
    let mut a = queue(&symbols, "team-a", 64, 32);
    a.borrowing_limit = Some(Resources::gpus(32));
    let b = queue(&symbols, "team-b", 64, 40);
    let cohort = CohortUsage {
        name: symbols.intern("research"),
        nominal: Resources::gpus(128),
        used: Resources::gpus(72),
        queues: vec![a.clone(), b],
    };
    assert_eq!(
        policy.admit(&job(32), &a, Some(&cohort)).unwrap(),
        QuotaVerdict::Admit
    );
    assert_eq!(
        policy.admit(&job(48), &a, Some(&cohort)).unwrap(),
        QuotaVerdict::AdmitBorrowing {
            borrowed: Resources::gpus(16)
        }
    );
    assert_eq!(
        policy.admit(&job(72), &a, Some(&cohort)).unwrap(),
        QuotaVerdict::Deny {
            reason: "queue team-a would borrow 40 GPUs, over its borrowing limit of 32".into()
        }
    );
    let mut greedy = a.clone();
    greedy.borrowing_limit = None;
    assert_eq!(
        policy.admit(&job(64), &greedy, Some(&cohort)).unwrap(),
        QuotaVerdict::Deny {
            reason: "queue team-a would borrow 32 GPUs, but its cohort has only 24 idle".into()
        }
    );
    assert_eq!(
        policy.admit(&job(40), &a, None).unwrap(),
        QuotaVerdict::Deny {
            reason: "queue team-a is at its quota of 64 GPUs and has no cohort to borrow from"
                .into()
        }
    );
}

#[test]
fn the_same_bytes_compile_once() {
    let engine = engine();
    let bytes = plugin("gpu-fit");
    let first = engine.compile(&bytes, &Default::default()).unwrap();
    let second = engine.compile(&bytes, &Default::default()).unwrap();
    assert!(Arc::ptr_eq(&first, &second));
    assert_eq!(first.sha256.len(), 64);
}

#[test]
fn concurrent_calls_share_a_bounded_pool() {
    let engine = engine_with(Limits {
        concurrency: 2,
        ..Limits::default()
    });
    let symbols = symbols_of(&engine);
    let policy = engine
        .load(&plugin("gpu-fit"), PolicyOptions::default())
        .unwrap();
    let table = WasmNodes::new(&nodes(&symbols, 100));
    let pod = pod(&symbols, 8);
    let expected = policy.filter(&pod, &table).unwrap();
    std::thread::scope(|scope| {
        for _ in 0..6 {
            scope.spawn(|| {
                for _ in 0..50 {
                    assert_eq!(policy.filter(&pod, &table).unwrap(), expected);
                }
            });
        }
    });
    let created = policy
        .stats
        .instances_created
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        (1..=2).contains(&created),
        "{created} instances for a cap of 2"
    );
}

#[test]
fn failure_policy_defaults_by_role_and_can_be_overridden() {
    let engine = engine();
    let fault = || {
        Err::<(), _>(gantry_policy::PolicyFault::Trap {
            message: "x".into(),
        })
    };
    let fit = engine
        .load(&plugin("gpu-fit"), PolicyOptions::default())
        .unwrap();
    assert!(matches!(fit.guard(fault()), Guarded::Rejected(_)));
    let binpack = engine
        .load(&plugin("gpu-binpack"), PolicyOptions::default())
        .unwrap();
    assert!(matches!(binpack.guard(fault()), Guarded::Skipped(_)));
    let quota = engine
        .load(&plugin("team-quota"), PolicyOptions::default())
        .unwrap();
    assert!(matches!(quota.guard(fault()), Guarded::Rejected(_)));
    let open_fit = engine
        .load(
            &plugin("gpu-fit"),
            PolicyOptions {
                failure: gantry_policy::FailurePolicy::FailOpen,
                ..PolicyOptions::default()
            },
        )
        .unwrap();
    assert!(matches!(open_fit.guard(fault()), Guarded::Skipped(_)));
    assert_eq!(binpack.guard(Ok(7)), Guarded::Answer(7));
}
