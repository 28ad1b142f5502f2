//! An overloaded replay: a seeded trace whose demand exceeds small-64's 448 GPUs by half for
//! days (about 2.5 days per 2,000 jobs), so pending grows as long as jobs arrive. It checks
//! correctness only (every job started and finished, no partial gang), never a time, and
//! prints what the replay cost at N and 2N jobs, and the ratios, so the growth shows.
//!
//! `GANTRY_OVERLOAD_JOBS=20000 cargo test --release -p gantry-sim --test overload -- --nocapture`
//! prints the figure at 20,000 and 40,000 jobs; with `GANTRY_OVERLOAD_FORECAST=1` the planner's
//! forecast runs too.

use gantry_core::{BuiltinOnly, Symbols};
use gantry_sim::{ClusterSpec, Replay, ReplayOptions, TraceJob};

/// splitmix64: a seeded stream, so the trace is the same on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[(self.next() % items.len() as u64) as usize]
    }
}

/// `jobs` jobs: 55% single pods of 1–8 GPUs, 45% gangs of 2–8 pods × 8 GPUs, 10 min to 2 h,
/// arriving every 110 s on average: about 1.5× what 448 GPUs can run.
fn overloaded_trace(jobs: usize, seed: u64) -> Vec<TraceJob> {
    let mut rng = Rng(seed);
    let mut t = 0.0;
    (0..jobs)
        .map(|i| {
            t += -110.0 * (1.0 - rng.unit()).ln();
            let (pods, gpus) = if rng.unit() < 0.45 {
                (rng.pick(&[2, 4, 8]), 8)
            } else {
                (1, rng.pick(&[1, 2, 4, 8]))
            };
            TraceJob {
                job_id: format!("over-{i:06}"),
                submit_s: t.round(),
                duration_s: (600.0 + rng.unit() * 6600.0).round(),
                pods,
                gpus_per_pod: gpus,
                queue: rng.pick(&["team-a", "team-a", "team-b", "default"]).into(),
                priority: 0,
                gpu_milli: None,
                gpu_type: None,
                cpu_milli: None,
                memory_mib: None,
                expected_runtime_s: None,
                checkpoint_s: None,
                line: i as u64 + 2,
            }
        })
        .collect()
}

fn replay(jobs: usize) -> serde_json::Value {
    let spec = ClusterSpec::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/clusters/small-64.yaml"
    ))
    .expect("small-64.yaml");
    let symbols = Symbols::new();
    let cluster = spec.build(&symbols);
    let mut options = ReplayOptions {
        audit: false,
        ..ReplayOptions::default()
    };
    // The scheduling's own cost: the forecast, three forward runs of the cycle a minute while
    // jobs arrive, is a cost of its own (the README's planner section gives it).
    if std::env::var_os("GANTRY_OVERLOAD_FORECAST").is_none() {
        options.plan.forecast_every_s = f64::INFINITY;
    }
    let trace = overloaded_trace(jobs, 42);
    let days = trace.last().map_or(0.0, |j| j.submit_s) / 86_400.0;
    let replay = Replay::new(cluster, "overloaded", trace, symbols, options).expect("replay");
    let report = replay
        .run(&mut BuiltinOnly, &mut |_| {}, &mut |_| {})
        .expect("no audit failure");
    // Every job fits the cluster, so the replay drains: each one started and finished, and no
    // gang ever ran in part.
    assert_eq!(report.jobs_submitted, jobs);
    assert_eq!(report.jobs_started, jobs);
    assert_eq!(report.jobs_finished, jobs);
    assert_eq!(report.partial_gangs, 0);
    serde_json::json!({
        "jobs": jobs,
        "arrivals_over_days": (days * 10.0).round() / 10.0,
        "wall_s": report.wall_clock.seconds,
        "cycles": report.cycles,
        "peak_pending": report.peak_pending,
        "decisions": report.decisions,
        "first_attempt_decisions": report.first_attempt_decisions,
        "gpu_allocation_common_window": report.gpu_allocation_common_window,
    })
}

/// `GANTRY_OVERLOAD_JOBS` when set (20000 for the figure in the report), else a size that
/// runs in a few seconds.
fn jobs() -> usize {
    std::env::var("GANTRY_OVERLOAD_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000)
}

#[test]
fn an_overloaded_replay_at_n_and_2n_jobs() {
    let n = jobs();
    let small = replay(n);
    let large = replay(2 * n);
    println!("{small}");
    println!("{large}");
    let growth = |key: &str| {
        let ratio = large[key].as_f64().unwrap_or(0.0) / small[key].as_f64().unwrap_or(1.0);
        (ratio * 100.0).round() / 100.0
    };
    println!(
        "{}",
        serde_json::json!({
            "growth_at_2x_jobs": {
                "wall_s": growth("wall_s"),
                "cycles": growth("cycles"),
                "peak_pending": growth("peak_pending"),
                "decisions": growth("decisions"),
            }
        })
    );
}
