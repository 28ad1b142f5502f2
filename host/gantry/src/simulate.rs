//! `gantry simulate`: replay a job trace on a simulated cluster through the real core, with any
//! Wasm policies, and report what happened.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use gantry_core::scheduler::plan::PlanConfig;
use gantry_core::{Mode, Symbols};
use gantry_policy::{Limits, NodeCache, PolicyEngine, PolicyOptions, PolicySet, SetEntry};
use gantry_sim::{ClusterSpec, Replay, ReplayOptions, Report, Trace, TraceJob};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// Cluster spec YAML (for example ../shared/clusters/small-64.yaml).
    #[arg(long)]
    cluster: PathBuf,
    /// Job trace: Gantry trace v1 CSV, or an Alibaba GPU 2023 pod list.
    #[arg(long)]
    trace: PathBuf,
    /// A Wasm policy to run beside the built-ins (repeatable; filter, score or quota).
    #[arg(long = "policy", value_name = "FILE.wasm")]
    policies: Vec<PathBuf>,
    /// Replay as an anchor scheduler instead of Gantry: `k8s-default` (stock kube-scheduler,
    /// pod by pod, no gangs), `coscheduling` (scheduler-plugins Coscheduling, 60 s permit) or
    /// `kueue` (Kueue's quota admission with borrowing, BestEffortFIFO, then stock
    /// kube-scheduler).
    #[arg(long, value_name = "NAME")]
    baseline: Option<Baseline>,
    /// Divide every submit time by this, to turn a light trace into a saturated one.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Recorded in the report. The replay is deterministic; only the `--known-future` draws
    /// (arrivals, process, history) are seeded by it.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where to write the JSON report.
    #[arg(long)]
    report: PathBuf,
    /// Skip the invariant audit after every cycle (faster on big traces).
    #[arg(long)]
    no_audit: bool,
    /// Also write every decision's explanation, one JSON object per line.
    #[arg(long, value_name = "OUT.jsonl")]
    decisions: Option<PathBuf>,
    /// Also write, as CSV, every job the estimate accuracy judges: its first start estimate
    /// (p10, p50, p90), when it was made, and when the job started.
    #[arg(long, value_name = "OUT.csv")]
    estimates: Option<PathBuf>,
    /// Leave the wall-clock figures out of the report, so that two runs compare byte for byte.
    #[arg(long)]
    no_wall_clock: bool,
    /// Plan without holding nodes: no reservations, no backfill rule (as the anchors do);
    /// start estimates are still made.
    #[arg(long)]
    no_reservations: bool,
    #[command(flatten)]
    rule: crate::rule_args::RuleArgs,
    /// Most reservations held at once.
    #[arg(long, value_name = "N", default_value_t = PlanConfig::default().max_reservations)]
    max_reservations: usize,
    /// Forecast the start of the jobs the plan does not cover (waiting for quota, or far down
    /// the queue) at most this often (seconds of the replay's clock), by running the cycle
    /// forward on a copy.
    #[arg(long, value_name = "S", default_value_t = PlanConfig::default().forecast_every_s)]
    forecast_every_s: f64,
    /// Make no forecast: only the jobs the plan covers get a start estimate.
    #[arg(long, conflicts_with = "forecast_every_s")]
    no_forecast: bool,
    /// Diagnostic: hand the forecast the trace's true future when a job is submitted. `exact`
    /// (the default): its submissions to come and every job's true runtime, so each first
    /// estimate should be the replay's own start; it proves the forecast faithful.
    /// `arrivals`: its submissions to come, with runtimes drawn from the trace's durations;
    /// `process`: submissions drawn from the trace's rate and jobs, runtimes too. Those two
    /// estimate each job by its median start over nine draws, about the least error an
    /// estimate can have without knowing the runtimes. No live scheduler knows any of this.
    /// `history`: the same draws from only what a live scheduler knows (the submissions so
    /// far, for a day ahead, and the runtimes of the jobs that ended), each run the engine
    /// exactly as the replay runs it: what the forecast could reach at many times its cost.
    #[arg(
        long,
        value_name = "WHAT",
        num_args = 0..=1,
        default_missing_value = "exact",
        conflicts_with_all = ["no_forecast", "forecast_every_s"]
    )]
    known_future: Option<gantry_sim::KnownFutureMode>,
    /// With `--known-future arrivals|process|history`: the futures drawn per forecast (9 unless
    /// given). Each job's estimate is its median start over them, so more draws bring it
    /// closer to the least error that knowledge allows, at one forward run each.
    #[arg(long, value_name = "N", requires = "known_future", value_parser = clap::value_parser!(u32).range(1..=1000))]
    oracle_draws: Option<u32>,
    /// Skip the Slurm `squeue --start`-style baseline: by default each first estimate is
    /// planned a second time as that baseline (the jobs known then, learned mean runtimes,
    /// nothing new submitted), and the report's `estimates.baseline` judges the estimates
    /// against it. It costs one forward run per step that gave a job its first estimate.
    #[arg(long)]
    no_estimate_baseline: bool,
    /// Fail nodes as this failure model says (YAML: `mtbf_node_days`, `events`, `burst`,
    /// `repair_s`, `preflight_s`, `health`), in place of the cluster spec's `failures:`
    /// section.
    #[arg(long, value_name = "FILE.yaml")]
    failures: Option<PathBuf>,
    /// The checkpoint interval, in seconds, of every job whose trace row declares no
    /// `checkpoint_s`: a failure or a preemption loses only the work since the last one.
    #[arg(long, value_name = "S")]
    checkpoint_every: Option<f64>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Baseline {
    K8sDefault,
    Coscheduling,
    Kueue,
}

/// A trace file in either supported format, told apart by its header.
fn load_trace(path: &Path) -> anyhow::Result<Vec<TraceJob>> {
    let head = std::fs::read_to_string(path)
        .with_context(|| format!("{}: cannot read", path.display()))?;
    let header = head.lines().next().unwrap_or("");
    if header.contains("creation_time") {
        let import = gantry_sim::import_pod_list(path)?;
        if !import.skipped.is_empty() {
            eprintln!(
                "{}: skipped {} pods that cannot run (first: line {}, {})",
                path.display(),
                import.skipped.len(),
                import.skipped[0].line,
                import.skipped[0].reason
            );
        }
        Ok(import.jobs)
    } else {
        Ok(Trace::load(path)?)
    }
}

pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    let symbols = Symbols::new();
    let spec = ClusterSpec::load(&args.cluster)?;
    let cluster = spec.build(&symbols);
    anyhow::ensure!(
        args.time_scale.is_finite() && args.time_scale > 0.0,
        "--time-scale must be a positive number"
    );
    let mut jobs = load_trace(&args.trace)?;
    for job in &mut jobs {
        job.submit_s /= args.time_scale;
    }
    let engine = PolicyEngine::new(Limits::default(), symbols.clone())?;
    let mut entries = Vec::new();
    for path in &args.policies {
        let policy = engine
            .load_file(path, PolicyOptions::default())
            .with_context(|| path.display().to_string())?;
        entries.push(SetEntry {
            policy: Arc::new(policy),
            weight: 1,
        });
    }
    let set = PolicySet::new(1, entries);
    let mut cache = NodeCache::default();
    let total = jobs.len();
    let trace_name = args.trace.file_name().map_or_else(
        || args.trace.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let mut options = ReplayOptions {
        audit: !args.no_audit,
        seed: args.seed,
        ..ReplayOptions::default()
    };
    args.rule.apply(&mut options.plan)?;
    args.rule.apply_to_cycle(&mut options.scheduler);
    options.plan.reservations = !args.no_reservations;
    anyhow::ensure!(
        args.forecast_every_s.is_finite() && args.forecast_every_s >= 0.0,
        "--forecast-every-s must be a number of seconds, 0 or more"
    );
    options.plan.max_reservations = args.max_reservations;
    options.plan.forecast_every_s = if args.no_forecast {
        f64::INFINITY
    } else {
        args.forecast_every_s
    };
    options.known_future = args.known_future;
    if let Some(draws) = args.oracle_draws {
        options.oracle_draws = draws as usize;
    }
    options.estimate_baseline = !args.no_estimate_baseline;
    anyhow::ensure!(
        args.known_future.is_none() || (args.baseline.is_none() && args.policies.is_empty()),
        "--known-future checks Gantry's forecast, which runs the built-in policies only; \
         drop --baseline and --policy"
    );
    options.scheduler.mode = match args.baseline {
        None => Mode::Gantry,
        Some(Baseline::K8sDefault) => Mode::K8sDefault,
        Some(Baseline::Coscheduling) => Mode::Coscheduling {
            permit_timeout_s: 60.0,
        },
        Some(Baseline::Kueue) => Mode::Kueue,
    };
    options.failures = match &args.failures {
        Some(path) => Some(gantry_sim::FailureModel::load(path)?),
        None => None,
    };
    options.default_checkpoint_s = checkpoint_every(args.checkpoint_every)?;
    anyhow::ensure!(
        args.baseline.is_none() || args.policies.is_empty(),
        "--baseline runs an anchor scheduler with its built-ins only; drop --policy"
    );
    let replay = Replay::new(cluster, &trace_name, jobs, symbols, options)?;
    let bar = ProgressBar::new(total as u64).with_style(
        ProgressStyle::with_template("{spinner} {bar:40} {pos}/{len} jobs finished ({elapsed})")
            .expect("template"),
    );
    let mut decisions_out = match &args.decisions {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("{}: cannot create", path.display()))?,
        )),
        None => None,
    };
    let mut write_error: Option<std::io::Error> = None;
    let mut report = replay.run(
        &mut set.bind(&mut cache),
        &mut |done| bar.set_position(done as u64),
        &mut |decision| {
            if let Some(out) = decisions_out.as_mut()
                && write_error.is_none()
            {
                use std::io::Write;
                let line = serde_json::to_string(&decision.explanation).expect("serializable");
                if let Err(e) = writeln!(out, "{line}") {
                    write_error = Some(e);
                }
            }
        },
    )?;
    if let Some(out) = decisions_out.as_mut()
        && write_error.is_none()
    {
        use std::io::Write;
        write_error = out.flush().err();
    }
    if let Some(e) = write_error {
        anyhow::bail!("writing decisions: {e}");
    }
    bar.finish_and_clear();
    print_summary(&report);
    if args.no_wall_clock {
        report.wall_clock.seconds = 0.0;
        report.wall_clock.decisions_per_s = 0.0;
        report.wall_clock.first_attempt_decisions_per_s = 0.0;
    }
    let json = serde_json::to_string_pretty(&report)?;
    std::fs::write(&args.report, json + "\n")
        .with_context(|| format!("{}: cannot write the report", args.report.display()))?;
    if let Some(path) = &args.estimates {
        let file = std::fs::File::create(path)
            .with_context(|| format!("{}: cannot create", path.display()))?;
        gantry_sim::write_first_estimates(&report.first_estimates, std::io::BufWriter::new(file))
            .with_context(|| format!("{}: cannot write the estimates", path.display()))?;
    }
    Ok(())
}

/// `--checkpoint-every`, checked: a positive number of seconds.
pub fn checkpoint_every(every: Option<f64>) -> anyhow::Result<Option<f64>> {
    if let Some(every) = every {
        anyhow::ensure!(
            every.is_finite() && every > 0.0,
            "--checkpoint-every must be a positive number of seconds, not {every}"
        );
    }
    Ok(every)
}

fn print_summary(r: &Report) {
    outln!(
        "{} on {} ({} nodes, {} GPUs), scheduler {}",
        r.trace,
        r.cluster,
        r.nodes,
        r.gpus,
        r.scheduler
    );
    outln!(
        "  jobs: {} submitted, {} started, {} finished, {} never started, at most {} pending",
        r.jobs_submitted,
        r.jobs_started,
        r.jobs_finished,
        r.jobs_never_started,
        r.peak_pending
    );
    outln!(
        "  wait: mean {:.0}s, p50 {:.0}s, p95 {:.0}s, p99 {:.0}s; back in the queue after a preemption: {} jobs, mean {:.0}s",
        r.wait.mean_s,
        r.wait.p50_s,
        r.wait.p95_s,
        r.wait.p99_s,
        r.requeue_wait.jobs,
        r.requeue_wait.mean_s
    );
    outln!(
        "  GPU allocation: {:.1}% over the common window, {:.1}% while work was queued   fragmentation: {:.1}%",
        r.gpu_allocation_common_window * 100.0,
        r.gpu_allocation_while_queued * 100.0,
        r.fragmentation * 100.0
    );
    outln!(
        "  partial gangs: {}   preemptions: {}   makespan: {:.0}s",
        r.partial_gangs,
        r.preemptions,
        r.makespan_s
    );
    let e = &r.estimates;
    if e.jobs > 0 {
        outln!(
            "  first estimates ({} future): {} jobs judged ({} more came after a minute), median wait {:.0}s, median error {:.0}s ({:.1}% of the wait), {:.1}% within p10-p90 (median width {:.0}s)",
            e.future,
            e.jobs,
            e.estimated_after_a_minute,
            e.median_wait_s,
            e.median_abs_error_s,
            e.median_error_share_of_wait * 100.0,
            e.within_interval * 100.0,
            e.median_interval_width_s
        );
    }
    if let Some(b) = &e.baseline {
        outln!(
            "  squeue --start-style baseline on the same {} jobs: median error {:.0}s; the estimates' is {:.2}x it",
            b.jobs,
            b.median_abs_error_s,
            b.error_ratio
        );
    }
    if let Some(f) = &r.failures {
        outln!(
            "  failures: {} signals ({}), {} hit jobs, {} jobs stopped; {:.1} GPU-hours lost to failures, {:.1} to preemption; goodput {:.1}%",
            f.signals.values().sum::<u64>(),
            f.signals
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", "),
            f.failures_hitting_jobs,
            f.jobs_stopped,
            f.gpu_hours_lost_to_failures,
            f.gpu_hours_lost_to_preemption,
            f.goodput * 100.0
        );
        outln!(
            "  failure to restart: {} restarts, p50 {:.0}s, p99 {:.0}s; at most {} nodes out at once{}",
            f.failure_to_restart_wait.jobs,
            f.failure_to_restart_wait.p50_s,
            f.failure_to_restart_wait.p99_s,
            f.peak_nodes_out,
            f.breaker_tripped
                .as_ref()
                .map_or(String::new(), |t| format!(
                    "; the breaker tripped at {:.0}s: {}",
                    t.at_s, t.reason
                ))
        );
    }
    for (name, q) in &r.queues {
        outln!(
            "  queue {name:<12} {:>5} jobs, wait p50 {:>8.0}s p99 {:>8.0}s, GPU share {:>5.1}% (max-min fair target {:>5.1}%, deviation {:>+5.1}%)",
            q.wait.jobs,
            q.wait.p50_s,
            q.wait.p99_s,
            q.gpu_share_common_window * 100.0,
            q.max_min_fair_target * 100.0,
            q.deviation_from_target * 100.0
        );
    }
    outln!(
        "  {} decisions ({} first attempts) in {} cycles, {:.2}s wall clock ({:.0} decisions/s, {:.0} first attempts/s)",
        r.decisions,
        r.first_attempt_decisions,
        r.cycles,
        r.wall_clock.seconds,
        r.wall_clock.decisions_per_s,
        r.wall_clock.first_attempt_decisions_per_s
    );
}
