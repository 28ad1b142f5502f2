//! Synthetic clusters and requests for `validate` and `bench`: realistic enough to exercise every
//! branch of the example policies, and deterministic so runs compare.

use gantry_core::{
    CohortUsage, Health, JobRequest, LevelColumn, NodeRow, NodeTable, PodShape, QueueUsage,
    Resources, Symbols, Taint, TaintEffect,
};

/// `count` 8-GPU A100 nodes in racks of 16 and blocks of 32 racks, with a spread of free GPUs,
/// a few unhealthy, preflight or tainted nodes, and a few H100s.
pub fn cluster(symbols: &Symbols, count: usize) -> NodeTable {
    let a100 = symbols.intern("A100-SXM4-80GB");
    let h100 = symbols.intern("H100-SXM5-80GB");
    let team_rl = vec![Taint {
        key: symbols.intern("gantry.dev/team"),
        value: symbols.intern("rl"),
        effect: TaintEffect::NoSchedule,
    }];
    let mut table = NodeTable {
        taint_sets: vec![vec![]],
        ..NodeTable::default()
    };
    // A small xorshift keeps the spread deterministic without a dependency.
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for i in 0..count {
        let roll = next();
        let free = (roll % 9) as u32;
        let gpu_type = if i % 50 == 49 { h100 } else { a100 };
        let name = symbols.intern(&format!("node-{i:05}"));
        let (cpu, memory) = (
            96_000 - (8 - free) * 10_000,
            1_843_200 - (8 - free) * 200_000,
        );
        table.push(NodeRow {
            gpu_free: free,
            gpu_milli_free_max: if free > 0 {
                1000
            } else {
                (roll >> 8) as u32 % 1000
            },
            health: match (roll >> 20) % 100 {
                0 => Health::Unhealthy,
                1 => Health::Preflight,
                2 => Health::NotReady,
                _ => Health::Healthy,
            },
            // The one taint set declared above.
            taints: if (roll >> 32) % 40 == 0 {
                team_rl.clone()
            } else {
                Vec::new()
            },
            ..NodeRow::new(name, 8, gpu_type, cpu, memory)
        });
    }
    for (name, size) in [("rack", 16u32), ("block", 512u32)] {
        let node_domain = (0..count as u32).map(|i| i / size).collect();
        let level = LevelColumn::from_node_domains(symbols.intern(name), node_domain, &table);
        table.levels.push(level);
    }
    table
}

/// A pod asking for `gpus` GPUs of any type, from queue `team-a`.
pub fn pod(symbols: &Symbols, gpus: u32) -> PodShape {
    PodShape {
        name: symbols.intern("sample-pod"),
        queue: symbols.intern("team-a"),
        priority: 0,
        gpus,
        cpu_milli: 8_000,
        memory_mib: 64_000,
        gang_size: 1,
        ..PodShape::default()
    }
}

/// A 16-pod × 8-GPU job from `team-a`, which is near its quota in a cohort with idle capacity.
pub fn quota_case(symbols: &Symbols) -> (JobRequest, QueueUsage, CohortUsage) {
    let pod = PodShape {
        gang_size: 16,
        ..pod(symbols, 8)
    };
    let job = JobRequest {
        pod,
        count: 16,
        total: Resources::gpus(128),
    };
    let queue = |name: &str, nominal: u64, used: u64| QueueUsage {
        name: symbols.intern(name),
        nominal: Resources::gpus(nominal),
        borrowing_limit: Some(Resources::gpus(nominal / 2)),
        lending_limit: None,
        used: Resources::gpus(used),
        weight: 1,
    };
    let team_a = queue("team-a", 256, 200);
    let team_b = queue("team-b", 256, 64);
    let cohort = CohortUsage {
        name: symbols.intern("research"),
        nominal: Resources::gpus(512),
        used: Resources::gpus(264),
        queues: vec![team_a.clone(), team_b],
    };
    (job, team_a, cohort)
}
