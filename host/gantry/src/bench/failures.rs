//! `gantry bench failures`: one trace, one failure model, Gantry and every anchor in the same
//! run, and what node failures cost each of them: goodput, GPU-hours lost, the wait from a
//! failure to the restart. One JSON line per scheduler, then one that compares them.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use gantry_core::{BuiltinOnly, Mode, Symbols};
use gantry_sim::{ClusterSpec, FailureModel, Replay, ReplayOptions, Report, Trace};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

#[derive(Args, Debug)]
pub struct FailuresBenchArgs {
    /// Cluster spec YAML.
    #[arg(long)]
    cluster: PathBuf,
    /// Job trace (Gantry trace v1 CSV).
    #[arg(long)]
    trace: PathBuf,
    /// Divide every submit time by this.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// The failure model (YAML), in place of the spec's `failures:` section.
    #[arg(long, value_name = "FILE.yaml")]
    failures: Option<PathBuf>,
    /// Fail each node once per this many days on average, in place of the model's MTBF (or
    /// as the whole model, with its default repair and preflight times).
    #[arg(long, value_name = "DAYS")]
    mtbf_node_days: Option<f64>,
    /// The checkpoint interval of jobs whose trace row declares none, in seconds.
    #[arg(long, value_name = "S")]
    checkpoint_every: Option<f64>,
    /// Seeds the failures (the same for every scheduler).
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// The schedulers compared, Gantry first.
const MODES: [Mode; 4] = [
    Mode::Gantry,
    Mode::Kueue,
    Mode::Coscheduling {
        permit_timeout_s: 60.0,
    },
    Mode::K8sDefault,
];

pub fn run(args: FailuresBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.time_scale.is_finite() && args.time_scale > 0.0,
        "--time-scale must be a positive number"
    );
    let spec = ClusterSpec::load(&args.cluster)?;
    let mut model = match &args.failures {
        Some(path) => Some(FailureModel::load(path)?),
        None => spec.failures.clone(),
    };
    if let Some(days) = args.mtbf_node_days {
        let mut m = model
            .unwrap_or_else(|| serde_yaml::from_str("{}").expect("an empty failure model reads"));
        m.mtbf_node_days = Some(days);
        m.validate()
            .map_err(|message| anyhow::anyhow!("--mtbf-node-days: {message}"))?;
        model = Some(m);
    }
    let model = model.context(
        "no failure model: give --failures FILE, --mtbf-node-days, or a failures: section in \
         the cluster spec",
    )?;
    let checkpoint = crate::simulate::checkpoint_every(args.checkpoint_every)?;
    let mut jobs = Trace::load(&args.trace)?;
    for job in &mut jobs {
        job.submit_s /= args.time_scale;
    }
    let trace_name = args.trace.display().to_string();
    let bar = ProgressBar::new((MODES.len() * jobs.len()) as u64).with_style(
        ProgressStyle::with_template("{spinner} {bar:40} {pos}/{len} jobs finished ({elapsed})")
            .expect("template"),
    );
    let mut rows = Vec::new();
    for (i, mode) in MODES.into_iter().enumerate() {
        let symbols = Symbols::new();
        let cluster = spec.build(&symbols);
        let mut options = ReplayOptions {
            audit: false,
            seed: args.seed,
            failures: Some(model.clone()),
            default_checkpoint_s: checkpoint,
            estimate_baseline: false,
            ..ReplayOptions::default()
        };
        options.scheduler.mode = mode;
        let replay = Replay::new(
            cluster,
            &trace_name,
            jobs.clone(),
            Arc::clone(&symbols),
            options,
        )?;
        let base = (i * jobs.len()) as u64;
        let report = replay.run(
            &mut BuiltinOnly,
            &mut |done| bar.set_position(base + done as u64),
            &mut |_| {},
        )?;
        let row = row_of(&report);
        bar.suspend(|| println!("{row}"));
        rows.push((mode.name(), report));
    }
    bar.finish_and_clear();
    println!("{}", compare(&rows));
    Ok(())
}

/// One scheduler's figures.
fn row_of(r: &Report) -> serde_json::Value {
    let f = r
        .failures
        .as_ref()
        .expect("every run has the failure model");
    json!({
        "scheduler": r.scheduler,
        "jobs": r.jobs_submitted,
        "never_started": r.jobs_never_started,
        "wait_mean_s": r.wait.mean_s,
        "wait_p99_s": r.wait.p99_s,
        "allocation_common_window": r.gpu_allocation_common_window,
        "partial_gangs": r.partial_gangs,
        "signals": f.signals,
        "failures_hitting_jobs": f.failures_hitting_jobs,
        "jobs_stopped": f.jobs_stopped,
        "goodput": f.goodput,
        "gpu_hours_lost_to_failures": f.gpu_hours_lost_to_failures,
        "gpu_hours_idle_while_halted": f.gpu_hours_idle_while_halted,
        "gpu_hours_lost_to_preemption": f.gpu_hours_lost_to_preemption,
        "restarts": f.failure_to_restart_wait.jobs,
        "failure_to_restart_p50_s": f.failure_to_restart_wait.p50_s,
        "failure_to_restart_p99_s": f.failure_to_restart_wait.p99_s,
        "peak_nodes_out": f.peak_nodes_out,
        "breaker_tripped": f.breaker_tripped.as_ref().map(|t| &t.reason),
    })
}

/// Gantry against every anchor: whether its restart waits are lower and its goodput no lower.
fn compare(rows: &[(&str, Report)]) -> serde_json::Value {
    let failures = |r: &Report| r.failures.clone().expect("every run has the failure model");
    let gantry = failures(&rows[0].1);
    let anchors: Vec<_> = rows[1..]
        .iter()
        .map(|(name, r)| (*name, failures(r)))
        .collect();
    let restarts = gantry.failure_to_restart_wait.jobs;
    json!({
        "compare": "gantry against every anchor on the same trace and failures",
        "gantry_restarts": restarts,
        "restart_p50_lower_than_every_anchor": restarts > 0 && anchors.iter().all(|(_, a)|
            gantry.failure_to_restart_wait.p50_s < a.failure_to_restart_wait.p50_s),
        "restart_p99_lower_than_every_anchor": restarts > 0 && anchors.iter().all(|(_, a)|
            gantry.failure_to_restart_wait.p99_s < a.failure_to_restart_wait.p99_s),
        "goodput_no_lower_than_any_anchor": anchors.iter().all(|(_, a)| gantry.goodput >= a.goodput),
        "goodput": rows.iter().map(|(n, r)| (n.to_string(), json!(failures(r).goodput)))
            .collect::<serde_json::Map<_, _>>(),
    })
}
