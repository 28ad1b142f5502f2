//! The simulated cluster of `gantry serve` (no `--kubeconfig`): a cluster spec under a steady
//! synthetic load of single pods and gangs, with balloons, scheduled by the engine's loop.

use std::sync::Arc;
use std::time::Duration;

use gantry_core::{ClusterState, Scheduler, SchedulerConfig, Symbols};
use gantry_engine::Shutdown;
use gantry_sim::ClusterSpec;

use super::{API_PATIENCE, ServeArgs, start_api, start_live};

/// The simulated cluster, ready to schedule: the scheduler, the queues work is submitted to,
/// the cluster's name and its GPU count.
pub struct SimCluster {
    pub scheduler: Scheduler,
    pub leaves: Vec<String>,
    pub name: String,
    pub total_gpus: u64,
}

impl SimCluster {
    pub fn load(path: &std::path::Path, symbols: &Arc<Symbols>) -> anyhow::Result<Self> {
        let spec = ClusterSpec::load(path)?;
        let cluster = spec.build(symbols);
        let leaves = cluster.leaf_queues();
        anyhow::ensure!(
            !leaves.is_empty(),
            "{}: no queues to submit to",
            path.display()
        );
        let total_gpus: u64 = cluster.nodes.gpu_total.iter().map(|&g| u64::from(g)).sum();
        let queues = cluster.queue_tree(600.0)?;
        let config = SchedulerConfig {
            max_attempts: 200,
            ..SchedulerConfig::default()
        };
        let scheduler = Scheduler::new(
            ClusterState::new(cluster.nodes),
            queues,
            symbols.clone(),
            config,
        );
        Ok(Self {
            scheduler,
            leaves,
            name: cluster.name,
            total_gpus,
        })
    }
}

/// The synthetic load and how long to run it.
#[derive(Debug, Clone)]
pub struct Load {
    pub jobs_per_s: f64,
    pub seed: u64,
    pub balloons: u32,
    pub max_pods: Option<u64>,
    /// Start as if the load had been running (see `SyntheticConfig::warm_start`).
    pub warm_start: bool,
    pub duration_s: Option<f64>,
    /// Progress lines on stdout every so often; `None` is quiet.
    pub log_every_s: Option<f64>,
    /// How nodes fail; `None`: they never do.
    pub failures: Option<gantry_sim::FailureModel>,
}

/// The demo's default failure rate: one node failure this often, whatever the cluster's
/// size. Real fleets fail far less often (Llama 3's rate is about one an hour at 7,500
/// nodes); the demo is faster so that a visitor sees the lifecycle.
pub const DEMO_FAILURE_EVERY_S: f64 = 180.0;

/// `--failures`: `on` (the demo's default model), `off`, or a model file.
fn failure_model(arg: &str, nodes: usize) -> anyhow::Result<Option<gantry_sim::FailureModel>> {
    Ok(match arg {
        "off" => None,
        "on" => {
            let mut model: gantry_sim::FailureModel =
                serde_yaml::from_str("{repair_s: 600, preflight_s: 120}")
                    .expect("the demo's failure model reads");
            model.mtbf_node_days = Some(nodes as f64 * DEMO_FAILURE_EVERY_S / 86_400.0);
            Some(model)
        }
        path => Some(gantry_sim::FailureModel::load(std::path::Path::new(path))?),
    })
}

/// What `gantry serve --report` writes: the engine's figures of the run, and what node
/// failures cost.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DemoReport {
    #[serde(flatten)]
    pub stats: gantry_engine::RunStats,
    /// `None` with `--failures off`.
    pub failures: Option<DemoFailures>,
}

/// What node failures did in the demo.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DemoFailures {
    /// Failure signals, by what became of them (cordoned, held by the breaker, …).
    pub signals: std::collections::BTreeMap<String, u64>,
    /// Jobs a failure stopped.
    pub jobs_stopped: u64,
    /// GPU-seconds of work kept over GPU-seconds held, over the runs that ended (finished,
    /// preempted or stopped; balloons not counted). A demo job keeps no checkpoint.
    pub goodput: f64,
    /// GPU-hours of runs cut short by failures, and by preemption.
    pub gpu_hours_lost_to_failures: f64,
    pub gpu_hours_lost_to_preemption: f64,
}

/// What a run did, for the last line.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoopSummary {
    pub submitted: u64,
    pub pods_submitted: u64,
    pub placed: u64,
    pub finished: u64,
}

/// Simulates the cluster of `args.cluster` under the synthetic load, with the API in front,
/// until interrupted or `duration_s`.
pub(super) fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let symbols = Symbols::new();
    let cluster = match &args.cluster {
        Some(path) => path.clone(),
        None => super::find_default_cluster(&std::env::current_dir()?)?,
    };
    let mut sim = SimCluster::load(&cluster, &symbols)?;
    args.rule.set_on(&mut sim.scheduler)?;
    // Failures are on in the demo unless asked otherwise.
    let failures_arg = args.failures.as_deref().unwrap_or("on");
    let failures = failure_model(failures_arg, sim.scheduler.state.len())?;
    if let Some(model) = &failures {
        // Refused here, naming the field, rather than once the loop runs.
        gantry_sim::failures::Injector::new(model.clone(), &sim.scheduler, args.seed, true)
            .map_err(|message| anyhow::anyhow!("--failures {failures_arg}: {message}"))?;
    }
    outln!(
        "gantry serve: simulating {} ({} nodes, {} GPUs) under synthetic load; Ctrl-C stops",
        sim.name,
        sim.scheduler.state.len(),
        sim.total_gpus
    );
    let (live, door) = start_live(
        &args.server,
        symbols.clone(),
        (!args.no_policies).then_some(&args.plugins),
        true,
    )?;
    let stop = Shutdown::new();
    let (bound, api) = start_api(live.clone(), door, args.listen, stop.clone())?;
    let jobs_per_s = args
        .jobs_per_s
        .unwrap_or_else(|| gantry_sim::SyntheticConfig::rate_for(args.load, sim.total_gpus));
    let share = jobs_per_s / gantry_sim::SyntheticConfig::rate_for(1.0, sim.total_gpus);
    let balloons = args.balloons.unwrap_or_else(|| {
        ((1.0 - share + 0.15).max(0.15) * sim.total_gpus as f64 / 8.0).ceil() as u32
    });
    let names: Vec<String> = live
        .active_set()
        .entries()
        .iter()
        .map(|e| e.policy.info().name.clone())
        .collect();
    outln!(
        "  API on {}://{bound}/api (OpenAPI at /api/openapi.json), data in {}",
        args.server.scheme(),
        args.server.data_dir.display()
    );
    outln!(
        "  policies: {} (set version {}); {} balloon pods hold idle capacity",
        if names.is_empty() {
            "built-ins only".to_string()
        } else {
            names.join(", ")
        },
        live.active_set().version(),
        balloons
    );
    outln!(
        "  synthetic load: {jobs_per_s:.2} jobs/s (about {:.0}% of the GPUs on average)",
        100.0 * share
    );
    if failures_arg == "on" {
        outln!(
            "  node failures: one every {DEMO_FAILURE_EVERY_S:.0} s on average, far more often than a real fleet, so the lifecycle shows (--failures off turns them off)"
        );
    }
    let load = Load {
        jobs_per_s,
        seed: args.seed,
        balloons,
        max_pods: args.max_pods,
        // A warm start brings in the last few minutes of arrivals at once: sized for the
        // steady load of --load, not for an overload asked with --jobs-per-s.
        warm_start: !args.cold_start && args.jobs_per_s.is_none(),
        duration_s: args.duration_s,
        log_every_s: Some(args.log_every_s),
        failures,
    };
    let (summary, stats) = run_loop(sim, live.clone(), &stop, &load);
    stop.trigger();
    if let Some(path) = &args.report {
        std::fs::write(path, serde_json::to_string_pretty(&stats)? + "\n")
            .map_err(|e| anyhow::anyhow!("{}: cannot write the report: {e}", path.display()))?;
        outln!(
            "  report in {}: GPU allocation {:.1}% ({:.1}% by work) after the first {:.0} s; idle while wanted {:.2}%; pending mean {:.0} (minutes 2-5) and {:.0} (last 5 minutes); cycle p50 {:.1} ms, p99 {:.1} ms",
            path.display(),
            stats.stats.gpu_allocation * 100.0,
            stats.stats.gpu_allocation_by_work * 100.0,
            stats.stats.warmup_s,
            stats.stats.idle_while_wanted * 100.0,
            stats.stats.pending_mean_minutes_2_5,
            stats.stats.pending_mean_last_5_minutes,
            stats.stats.cycle_ms_p50,
            stats.stats.cycle_ms_p99
        );
        outln!(
            "  gangs in one block: {} of the {} that one block's free and balloon nodes could hold ({} balloons evicted for it)",
            stats.stats.topology.gangs_in_one_domain,
            stats.stats.topology.gangs_one_domain_possible,
            stats.stats.topology.balloons_evicted_for_topology
        );
        if let Some(f) = &stats.failures {
            outln!(
                "  failures: {} signals, {} jobs stopped; goodput {:.1}%; {:.1} GPU-hours lost to failures, {:.1} to preemption",
                f.signals.values().sum::<u64>(),
                f.jobs_stopped,
                f.goodput * 100.0,
                f.gpu_hours_lost_to_failures,
                f.gpu_hours_lost_to_preemption
            );
        }
    }
    live.store.flush()?;
    Shutdown::join_by(api, API_PATIENCE);
    outln!(
        "gantry serve: stopped after {} jobs ({} pods) submitted, {} placed, {} finished; {} cycle failures",
        summary.submitted,
        summary.pods_submitted,
        summary.placed,
        summary.finished,
        live.metrics.cycle_failures.get()
    );
    Ok(())
}

/// Schedules the simulated cluster under `load` through the engine until the duration ends or
/// `stop` is triggered; what it did, and the run's figures.
pub fn run_loop(
    sim: SimCluster,
    live: Arc<gantry_engine::Live>,
    stop: &Shutdown,
    load: &Load,
) -> (LoopSummary, DemoReport) {
    let SimCluster {
        mut scheduler,
        leaves,
        name,
        total_gpus,
    } = sim;
    let mut world = gantry_sim::SyntheticLoad::new(
        &scheduler,
        &leaves,
        gantry_sim::SyntheticConfig {
            jobs_per_s: load.jobs_per_s,
            seed: load.seed,
            balloons: load.balloons,
            max_pods: load.max_pods,
            warm_start: load.warm_start,
        },
    );
    // `serve` checked the model against these nodes already.
    if let Some(model) = load.failures.clone()
        && let Err(message) = world.with_failures(model, &mut scheduler)
    {
        outln!("  node failures off: {message}");
    }
    let mut engine = gantry_engine::Engine::new(
        live,
        scheduler,
        gantry_engine::EngineConfig {
            cluster_name: name,
            ..gantry_engine::EngineConfig::default()
        },
    );
    let mut next_log = load.log_every_s.unwrap_or(f64::INFINITY);
    let (mut placed, mut preempted, mut decisions) = (0u64, 0u64, 0u64);
    let mut cycle_time = Duration::ZERO;
    let (mut submitted, mut pods_submitted, mut finished) = (0u64, 0u64, 0u64);
    engine.run(
        &mut world,
        stop,
        load.duration_s,
        &mut |engine, now, pass| {
            let scheduler = engine.scheduler();
            placed += pass
                .outcomes
                .iter()
                .filter(|o| matches!(o, gantry_core::BindOutcome::Bound { job } if scheduler.get(*job).is_some_and(|s| !s.balloon)))
                .count() as u64;
            preempted += pass.output.evicted.len() as u64;
            decisions += pass.output.decisions.len() as u64;
            cycle_time += pass.cycle_time;
            submitted += u64::from(pass.changes.submitted);
            pods_submitted += pass.changes.submitted_pods;
            finished += u64::from(pass.changes.ended);
            if now < next_log {
                return;
            }
            let free: u64 = scheduler.state.pods_fit(1);
            let allocated = total_gpus.saturating_sub(free);
            let balloons_running = scheduler
                .running()
                .filter(|&id| scheduler.job(id).balloon)
                .count();
            let pending = scheduler
                .pending()
                .into_iter()
                .filter(|&id| !scheduler.job(id).balloon)
                .count();
            outln!(
                "t={now:>6.0}s  submitted {}  placed {placed}  finished {}  pending {pending}  balloons running {balloons_running}  preempted {preempted}  GPUs allocated {:.1}% ({:.1}% by work)  {:.0} decisions/s of cycle time  set v{}",
                submitted,
                finished,
                allocated as f64 * 100.0 / total_gpus.max(1) as f64,
                allocated.saturating_sub(8 * balloons_running as u64) as f64 * 100.0
                    / total_gpus.max(1) as f64,
                decisions as f64 / cycle_time.as_secs_f64().max(1e-9),
                engine.live().active_set().version(),
            );
            next_log += load.log_every_s.unwrap_or(f64::INFINITY);
        },
    );
    engine.publish();
    let failures = world.failure_signals().map(|signals| DemoFailures {
        signals: signals
            .iter()
            .map(|(k, v)| ((*k).to_string(), *v))
            .collect(),
        jobs_stopped: world.stopped_by_failures,
        goodput: if world.run_gpu_s > 0.0 {
            1.0 - (world.lost_to_failures_gpu_s + world.lost_to_preemption_gpu_s) / world.run_gpu_s
        } else {
            0.0
        },
        gpu_hours_lost_to_failures: world.lost_to_failures_gpu_s / 3600.0,
        gpu_hours_lost_to_preemption: world.lost_to_preemption_gpu_s / 3600.0,
    });
    let stats = DemoReport {
        stats: engine.stats(),
        failures,
    };
    (
        LoopSummary {
            submitted,
            pods_submitted,
            placed,
            finished,
        },
        stats,
    )
}
