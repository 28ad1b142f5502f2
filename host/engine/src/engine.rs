//! The one scheduling loop. Each pass: the cluster (a [`gantry_core::ClusterSource`]) brings the
//! long-lived scheduler up to date, [`Live::decide`] runs a cycle on the active set (with the
//! shadow set beside it), the cluster (a [`gantry_core::Binder`]) applies it and reports each job's outcome, the scheduler hears of failed
//! bindings, and [`Live::record`] stores what happened. Between passes it publishes the view
//! the API serves, applies retention, beats the heartbeat and keeps the run's figures.
//!
//! Only the source, the binder and the clock differ between a simulated cluster and a live
//! one; this loop does not know which it drives.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gantry_core::{
    BindOutcome, Changes, Cluster, CycleOutput, Decision, Forecasts, JobId, Scheduler,
};
use gantry_policy::NodeCache;
use serde::Serialize;

use crate::live::Live;
use crate::now_ms;

/// How the loop paces itself.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The cluster's name in the published view.
    pub cluster_name: String,
    /// The longest pause between passes; an activation cuts it short.
    pub pause: Duration,
    /// How often the view is published.
    pub publish_every: Duration,
    /// How often retention runs.
    pub compact_every: Duration,
    /// The run's figures leave out this first stretch (the cluster filling up).
    pub warmup_s: f64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            cluster_name: "cluster".into(),
            pause: Duration::from_millis(50),
            publish_every: Duration::from_millis(500),
            compact_every: Duration::from_secs(60),
            warmup_s: 60.0,
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default)]
pub struct Pass {
    /// What the source brought in.
    pub changes: Changes,
    /// The cycle's output, as decided.
    pub output: CycleOutput,
    /// The binder's outcome per placed job.
    pub outcomes: Vec<BindOutcome>,
    /// How long the cycle took to decide.
    pub cycle_time: Duration,
}

/// The figures of a run (`gantry serve --report`): what a new user sees in the progress lines,
/// measured over the whole run after the warm-up.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunStats {
    /// Seconds the run lasted.
    pub duration_s: f64,
    /// The warm-up left out of the time-weighted figures.
    pub warmup_s: f64,
    /// GPUs in the cluster.
    pub gpus: u64,
    /// Time-weighted share of GPUs allocated (work and balloons) after the warm-up.
    pub gpu_allocation: f64,
    /// The same, counting only work (balloons left out).
    pub gpu_allocation_by_work: f64,
    /// Share of GPU-seconds after the warm-up in which a GPU sat idle while a pending job could
    /// have used it: that job's queue admitted it and enough idle GPUs of its shape existed.
    pub idle_while_wanted: f64,
    /// Share of GPU-seconds after the warm-up held by balloons while a pending job of the
    /// same shape waited that preempting balloons would have admitted: room kept for work
    /// that did not get it (normally the time until the next cycle).
    pub balloons_while_wanted: f64,
    /// Pending jobs (balloons left out), sampled every few seconds: `(t_s, jobs)`.
    pub pending: Vec<(f64, u64)>,
    /// Mean pending jobs over minutes 2-5, and over the last 5 minutes.
    pub pending_mean_minutes_2_5: f64,
    /// See `pending_mean_minutes_2_5`.
    pub pending_mean_last_5_minutes: f64,
    /// Cycles run.
    pub cycles: u64,
    /// Jobs evaluated per cycle: mean and most.
    pub attempts_per_cycle_mean: f64,
    /// See `attempts_per_cycle_mean`.
    pub attempts_per_cycle_max: u32,
    /// Cycle time percentiles, in milliseconds.
    pub cycle_ms_p50: f64,
    /// See `cycle_ms_p50`.
    pub cycle_ms_p99: f64,
    /// Jobs placed (and bound), jobs whose binding failed, jobs evicted.
    pub placed: u64,
    /// See `placed`.
    pub binding_failures: u64,
    /// See `placed`.
    pub evicted: u64,
    /// How gangs landed against the outermost topology level (blocks): how many one block's
    /// free and balloon-held nodes could have held, how many of those were placed in one
    /// block, and the balloons evicted to keep them there.
    pub topology: gantry_core::TopologyStats,
    /// `topology`'s share of gangs placed within one block, of those that could have been
    /// (`None` before any such gang).
    pub gangs_in_one_block_share: Option<f64>,
}

/// The integrals and samples behind [`RunStats`].
#[derive(Debug, Default)]
struct Tally {
    last_s: Option<f64>,
    measured_s: f64,
    allocated: f64,
    by_work: f64,
    idle_wanted: f64,
    balloons_wanted: f64,
    cycle_ms: Vec<f64>,
    attempts: u64,
    attempts_max: u32,
    next_sample_s: f64,
    /// What the last pass left, credited to the interval up to the next pass.
    last_measure: Option<Measure>,
}

/// How coarsely a live forecast's drawn runs step (seconds; see
/// [`gantry_core::PlanConfig::forecast_step_s`]).
const LIVE_FORECAST_STEP_S: f64 = 60.0;

/// How often pending work is sampled for [`RunStats::pending`].
const SAMPLE_EVERY_S: f64 = 5.0;

/// The loop: one long-lived scheduler, the shared [`Live`], and the run's figures.
pub struct Engine {
    live: Arc<Live>,
    scheduler: Scheduler,
    /// The active set's view of the node table, refreshed from the state's change log.
    cache: NodeCache,
    config: EngineConfig,
    stats: RunStats,
    tally: Tally,
    /// The forecast running on its own thread, if one is: a pass takes its result once it is
    /// done, and hands out the next due one only then, so at most one runs.
    forecast: Option<std::thread::JoinHandle<Forecasts>>,
}

impl Engine {
    /// An engine for `scheduler` (its cluster and queues set up, no jobs needed yet).
    pub fn new(live: Arc<Live>, mut scheduler: Scheduler, config: EngineConfig) -> Self {
        let gpus = total_gpus(&scheduler);
        // A forecast's seven forward runs would pause a cycle; the loop runs them beside it.
        // They step by the minute, as Slurm's backfill plans at its default `bf_resolution`:
        // on thousands of busy nodes a job ends every few milliseconds, and a run stepping at
        // each spent its bounded cycles within a second of now.
        scheduler.set_plan_config(gantry_core::PlanConfig {
            forecast_off_loop: true,
            forecast_step_s: LIVE_FORECAST_STEP_S,
            ..scheduler.plan_config().clone()
        });
        let stats = RunStats {
            gpus,
            warmup_s: config.warmup_s,
            ..RunStats::default()
        };
        Self {
            live,
            scheduler,
            cache: NodeCache::default(),
            config,
            stats,
            tally: Tally::default(),
            forecast: None,
        }
    }

    /// The scheduler as the last pass left it.
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// The shared state.
    pub fn live(&self) -> &Arc<Live> {
        &self.live
    }

    /// One pass at `now_s` (seconds on the run's clock): [`gantry_core::step`], with the
    /// active policy set deciding, and what happened recorded.
    pub fn step(&mut self, cluster: &mut dyn Cluster, now_s: f64) -> Pass {
        let _span = tracing::debug_span!("pass", now_s).entered();
        self.take_forecast();
        let time_ms = now_ms();
        let mut cycle_time = Duration::ZERO;
        let leading = cluster.leading();
        if let Some(name) = cluster.describe() {
            self.config.cluster_name = name;
        }
        self.live.set_leader_elsewhere(cluster.leader_elsewhere());
        let breaches = cluster.binds_after_lease_loss();
        let counted = self.live.metrics.bind_after_lease_loss.get();
        if breaches > counted {
            self.live
                .metrics
                .bind_after_lease_loss
                .inc_by(breaches - counted);
        }
        let (live, cache, stats) = (&self.live, &mut self.cache, &mut self.stats);
        let step = gantry_core::step(
            &mut self.scheduler,
            cluster,
            now_s,
            &mut |scheduler, changes| {
                if changes.submitted_pods > 0 {
                    live.metrics.incoming_pods.inc_by(changes.submitted_pods);
                }
                if !changes.pod_to_job.is_empty() {
                    live.record_pods(&changes.pod_to_job);
                }
                if changes.rebuilt {
                    // A new node table: the policies' node view and the GPU count start over.
                    *cache = NodeCache::default();
                    stats.gpus = total_gpus(scheduler);
                }
                if !leading {
                    // A follower keeps its view current and decides nothing.
                    return None;
                }
                let started = Instant::now();
                let output = live.decide(scheduler, cache, now_s, time_ms);
                cycle_time = started.elapsed();
                Some(output)
            },
        );
        let gantry_core::Step {
            changes,
            output,
            outcomes,
        } = step;
        // One take holds what the source's sync (failures, repairs, tests) and the cycle did
        // to the lifecycle; a follower's step ends after its sync, and it is taken there too.
        // Taken every pass, the transitions never pile up in the scheduler.
        self.live.take_health(&mut self.scheduler, time_ms);
        if !leading {
            self.live.beat();
            return Pass {
                changes,
                ..Pass::default()
            };
        }
        for outcome in &outcomes {
            match outcome {
                BindOutcome::Failed { .. } => self.stats.binding_failures += 1,
                BindOutcome::Bound { .. } => self.stats.placed += 1,
                BindOutcome::Nominated { .. } => {}
            }
        }
        self.stats.evicted += output.evicted.len() as u64;
        let preempted: Vec<Decision> = output
            .decisions
            .iter()
            .flat_map(|d| d.victims.iter().map(move |&v| (v, &d.explanation)))
            .filter_map(|(victim, by)| {
                let mut explanation = self
                    .scheduler
                    .preempted_explanation(victim, &by.job, now_s)?;
                explanation.policy_set = by.policy_set;
                explanation.policies.clone_from(&by.policies);
                Some(Decision {
                    job: victim,
                    placed: false,
                    placement: Vec::new(),
                    victims: Vec::new(),
                    explanation,
                })
            })
            .collect();
        let balloons: HashSet<JobId> = output
            .decisions
            .iter()
            .chain(&preempted)
            .map(|d| d.job)
            .filter(|&id| self.scheduler.get(id).is_some_and(|spec| spec.balloon))
            .collect();
        self.live
            .record(&output, &outcomes, &preempted, &balloons, time_ms);
        self.observe(now_s, &output, cycle_time);
        self.start_forecast();
        self.live.beat();
        Pass {
            changes,
            output,
            outcomes,
            cycle_time,
        }
    }

    /// Takes the forecast that finished on its thread, if one did: the pending jobs the plan
    /// does not cover get its estimates.
    fn take_forecast(&mut self) {
        if !self.forecast.as_ref().is_some_and(|run| run.is_finished()) {
            return;
        }
        let Some(run) = self.forecast.take() else {
            return;
        };
        match run.join() {
            Ok(forecasts) => {
                self.scheduler.install_forecast(forecasts);
            }
            Err(_) => tracing::error!(
                "the forecast failed on its thread; pending jobs keep their last forecast"
            ),
        }
    }

    /// Hands a forecast that came due to a thread of its own, unless one is still running
    /// (the scheduler keeps it wanted until then).
    fn start_forecast(&mut self) {
        if self.forecast.is_some() {
            return;
        }
        let Some(run) = self.scheduler.forecast_to_run() else {
            return;
        };
        let duration = self.live.metrics.forecast_duration.clone();
        let spawned = std::thread::Builder::new()
            .name("gantry-forecast".into())
            .spawn(move || {
                let _span = tracing::debug_span!("forecast").entered();
                let _timer = duration.start_timer();
                run.run()
            });
        match spawned {
            Ok(handle) => self.forecast = Some(handle),
            Err(error) => tracing::warn!(
                %error,
                "could not start the forecast's thread; pending jobs keep their last forecast"
            ),
        }
    }

    /// Runs passes on the wall clock until `stop` is triggered or `duration_s` has passed,
    /// publishing the view, applying retention and calling `progress` after every pass.
    pub fn run(
        &mut self,
        cluster: &mut dyn Cluster,
        stop: &crate::Shutdown,
        duration_s: Option<f64>,
        progress: &mut dyn FnMut(&Engine, f64, &Pass),
    ) {
        let started = Instant::now();
        let mut last_publish: Option<Instant> = None;
        let mut last_compact = Instant::now();
        loop {
            let now_s = started.elapsed().as_secs_f64();
            if duration_s.is_some_and(|d| now_s >= d) || stop.is_triggered() {
                break;
            }
            // Questions asked while the loop waited, from the plan as the last pass left it.
            self.live.answer_what_ifs(&self.scheduler);
            // An admin's breaker reset, made here so that no cycle runs while it changes.
            self.live.answer_breaker_resets(&mut self.scheduler);
            let pass = self.step(cluster, now_s);
            if last_publish.is_none_or(|t| t.elapsed() >= self.config.publish_every) {
                self.publish();
                last_publish = Some(Instant::now());
            }
            if last_compact.elapsed() >= self.config.compact_every {
                self.live.compact();
                last_compact = Instant::now();
            }
            progress(self, now_s, &pass);
            self.live.idle(self.config.pause);
        }
        self.stats.duration_s = started.elapsed().as_secs_f64();
    }

    /// Publishes the view the API serves.
    pub fn publish(&self) {
        self.live
            .publish(&self.scheduler, &self.config.cluster_name);
    }

    /// The run's figures so far.
    pub fn stats(&self) -> RunStats {
        let t = &self.tally;
        let gpu_s = t.measured_s * self.stats.gpus as f64;
        let ratio = |x: f64| if gpu_s > 0.0 { x / gpu_s } else { 0.0 };
        let mut cycle_ms = t.cycle_ms.clone();
        cycle_ms.sort_by(f64::total_cmp);
        let pct = |p: f64| gantry_core::percentile(&cycle_ms, p);
        let mean_between = |from: f64, to: f64| {
            let inside: Vec<f64> = self
                .stats
                .pending
                .iter()
                .filter(|(at, _)| *at >= from && *at < to)
                .map(|(_, n)| *n as f64)
                .collect();
            if inside.is_empty() {
                0.0
            } else {
                inside.iter().sum::<f64>() / inside.len() as f64
            }
        };
        let end = self.stats.duration_s.max(t.last_s.unwrap_or(0.0));
        RunStats {
            duration_s: end,
            gpu_allocation: ratio(t.allocated),
            gpu_allocation_by_work: ratio(t.by_work),
            idle_while_wanted: ratio(t.idle_wanted),
            balloons_while_wanted: ratio(t.balloons_wanted),
            pending_mean_minutes_2_5: mean_between(120.0, 300.0),
            pending_mean_last_5_minutes: mean_between(end - 300.0, f64::INFINITY),
            attempts_per_cycle_mean: if self.stats.cycles > 0 {
                t.attempts as f64 / self.stats.cycles as f64
            } else {
                0.0
            },
            attempts_per_cycle_max: t.attempts_max,
            cycle_ms_p50: pct(50.0),
            cycle_ms_p99: pct(99.0),
            topology: self.scheduler.topology_stats(),
            gangs_in_one_block_share: self.scheduler.topology_stats().share_in_one_domain(),
            ..self.stats.clone()
        }
    }

    /// Integrates the state the pass left over the time until the next pass, and counts the
    /// cycle.
    fn observe(&mut self, now_s: f64, output: &CycleOutput, cycle_time: Duration) {
        self.stats.cycles += 1;
        let t = &mut self.tally;
        t.cycle_ms.push(cycle_time.as_secs_f64() * 1000.0);
        t.attempts += u64::from(output.attempts);
        t.attempts_max = t.attempts_max.max(output.attempts);
        // What the last pass left held from then until now; what this pass leaves is
        // measured for the next interval.
        let measure = self.measure();
        let t = &mut self.tally;
        if let (Some(last), Some(held)) = (t.last_s, t.last_measure.take()) {
            let from = last.max(self.config.warmup_s);
            let dt = now_s - from;
            if dt > 0.0 {
                t.measured_s += dt;
                t.allocated += held.allocated * dt;
                t.by_work += held.by_work * dt;
                t.idle_wanted += held.idle_wanted * dt;
                t.balloons_wanted += held.balloons_wanted * dt;
            }
        }
        t.last_s = Some(now_s);
        if now_s >= t.next_sample_s {
            self.stats.pending.push((now_s, measure.pending));
            t.next_sample_s = now_s + SAMPLE_EVERY_S;
        }
        t.last_measure = Some(measure);
    }

    /// The instantaneous figures of the current state.
    fn measure(&self) -> Measure {
        let s = &self.scheduler;
        let free = s.state.pods_fit(1);
        let allocated = self.stats.gpus.saturating_sub(free) as f64;
        let mut balloon_gpus = 0u64;
        for id in s.running() {
            let spec = s.job(id);
            if spec.balloon {
                balloon_gpus += spec.total().gpus;
            }
        }
        let by_work = s.running_gpus().saturating_sub(balloon_gpus) as f64;
        let mut pending = 0u64;
        let (mut wanted_idle, mut wanted_balloons) = (false, false);
        for id in s.pending() {
            let spec = s.job(id);
            if spec.balloon {
                continue;
            }
            pending += 1;
            if wanted_idle && wanted_balloons {
                continue;
            }
            if !s.queues.admits(spec.queue, spec.total().gpus) {
                continue;
            }
            let gpus = spec.shape.gpus;
            if gpus > 0 && s.state.pods_fit(gpus) >= u64::from(spec.pods) {
                wanted_idle = true;
            }
            // Balloons hold whole nodes: count the nodes they could give back.
            if gpus > 0 && free + balloon_gpus >= spec.total().gpus {
                wanted_balloons = true;
            }
        }
        Measure {
            allocated,
            by_work,
            idle_wanted: if wanted_idle { free as f64 } else { 0.0 },
            balloons_wanted: if wanted_balloons {
                balloon_gpus as f64
            } else {
                0.0
            },
            pending,
        }
    }
}

/// GPUs in the scheduler's cluster.
fn total_gpus(scheduler: &Scheduler) -> u64 {
    scheduler
        .state
        .nodes
        .gpu_total
        .iter()
        .map(|&g| u64::from(g))
        .sum()
}

/// One instant's figures.
#[derive(Debug)]
struct Measure {
    allocated: f64,
    by_work: f64,
    idle_wanted: f64,
    balloons_wanted: f64,
    pending: u64,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use gantry_core::{
        ClusterSource, JobId, JobSpec, NodeState, Outcome, PodShape, SchedulerConfig, Symbols,
        TopologyPref,
    };
    use gantry_policy::{PolicyEngine, PolicySet};
    use gantry_store::Store;

    use super::*;
    use crate::live::LiveConfig;

    /// Four nodes of 8 GPUs in one queue of 32.
    fn scheduler(symbols: &Arc<Symbols>) -> Scheduler {
        scheduler_with_quota(symbols, 32, None)
    }

    /// Four nodes of 8 GPUs in one queue of `nominal_gpus`, borrowing at most `borrowing`.
    fn scheduler_with_quota(
        symbols: &Arc<Symbols>,
        nominal_gpus: u64,
        borrowing: Option<u64>,
    ) -> Scheduler {
        gantry_core::fixtures::one_rack(
            symbols,
            4,
            nominal_gpus,
            borrowing,
            SchedulerConfig::default(),
        )
    }

    /// A job of `pods` pods of `gpus` GPUs each in the one queue, submitted at `now_s`.
    fn job(symbols: &Symbols, name: &str, pods: u32, gpus: u32, now_s: f64) -> JobSpec {
        JobSpec {
            name: name.to_string(),
            queue: 0,
            priority: 0,
            pods,
            shape: PodShape {
                name: symbols.intern(name),
                gpus,
                gang_size: pods,
                ..PodShape::default()
            },
            balloon: false,
            topology: TopologyPref::default(),
            submit_s: now_s,
            expected_runtime_s: None,
        }
    }

    /// An in-memory cluster: submits the jobs it is given, and fails the binding of the jobs
    /// named in `fail_once` the first time they are bound.
    #[derive(Default)]
    struct Memory {
        to_submit: Vec<(String, u32, u32)>,
        /// Balloons to submit: (name, GPUs).
        balloons: Vec<(String, u32)>,
        fail_once: BTreeSet<String>,
        bound: Vec<String>,
    }

    impl ClusterSource for Memory {
        fn sync(&mut self, scheduler: &mut Scheduler, now_s: f64) -> Changes {
            let mut changes = Changes::default();
            let symbols = scheduler.symbols().clone();
            for (name, pods, gpus) in self.to_submit.drain(..) {
                scheduler.submit(job(&symbols, &name, pods, gpus, now_s));
                changes.submitted += 1;
            }
            for (name, gpus) in self.balloons.drain(..) {
                let mut balloon = job(&symbols, &name, 1, gpus, now_s);
                balloon.balloon = true;
                balloon.priority = i32::MIN;
                scheduler.submit(balloon);
                changes.submitted += 1;
            }
            changes
        }
    }

    impl gantry_core::Binder for Memory {
        fn bind(
            &mut self,
            scheduler: &Scheduler,
            output: &CycleOutput,
            _now_s: f64,
        ) -> Vec<BindOutcome> {
            let placed: Vec<JobId> = output
                .decisions
                .iter()
                .filter(|d| d.placed)
                .map(|d| d.job)
                .collect();
            placed
                .into_iter()
                .map(|job| {
                    let name = scheduler.job(job).name.clone();
                    if self.fail_once.remove(&name) {
                        BindOutcome::Failed {
                            job,
                            reason: "admission webhook denied the binding".into(),
                        }
                    } else {
                        self.bound.push(name);
                        BindOutcome::Bound { job }
                    }
                })
                .collect()
        }
    }

    fn engine(dir: &std::path::Path) -> Engine {
        engine_with(gantry_store::StoreConfig::new(dir))
    }

    fn engine_with(store: gantry_store::StoreConfig) -> Engine {
        engine_on(store, scheduler)
    }

    /// An engine on the scheduler `make` builds, storing in `store`.
    fn engine_on(store: gantry_store::StoreConfig, make: fn(&Arc<Symbols>) -> Scheduler) -> Engine {
        let symbols = Symbols::new();
        let store = Store::open(store).expect("store");
        let policies = Arc::new(
            PolicyEngine::new(gantry_policy::Limits::default(), symbols.clone()).expect("engine"),
        );
        let live = Live::new(
            store,
            policies,
            PolicySet::new(0, Vec::new()),
            LiveConfig::default(),
        );
        Engine::new(live, make(&symbols), EngineConfig::default())
    }

    /// The pending job called `name`, if one is.
    fn pending_named(engine: &Engine, name: &str) -> Option<JobId> {
        let scheduler = engine.scheduler();
        scheduler
            .pending()
            .into_iter()
            .find(|&id| scheduler.job(id).name == name)
    }

    fn waiting_for(outcome: &Outcome) -> Option<&str> {
        match outcome {
            Outcome::Pending { waiting_for } => Some(waiting_for),
            Outcome::Placed { .. } => None,
        }
    }

    #[test]
    fn balloons_are_counted_apart_from_work_everywhere_a_count_is_shown() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut engine = engine(dir.path());
        // Six 8-GPU balloons on four 8-GPU nodes, and no work: four hold, two wait.
        let mut cluster = Memory {
            balloons: (0..6).map(|i| (format!("balloon-{i}"), 8)).collect(),
            ..Memory::default()
        };
        engine.step(&mut cluster, 0.0);
        engine.publish();
        let view = engine.live().view();
        assert_eq!((view.pending_pods, view.running_pods), (0, 0));
        assert_eq!(
            view.balloon_pods,
            crate::live::BalloonPods {
                pending: 2,
                running: 4
            }
        );
        let queue = &view.queues[0];
        assert_eq!((queue.pending_jobs, queue.running_jobs), (0, 0));
        assert_eq!(
            (queue.balloon_pending_jobs, queue.balloon_running_jobs),
            (2, 4)
        );
        assert_eq!(view.node_to_balloon_gpus.values().sum::<u32>(), 32);
        let metrics = &engine.live().metrics;
        assert_eq!(metrics.pending_pods.get(), 0);
        assert_eq!(
            metrics.balloon_pods.with_label_values(&["pending"]).get(),
            2
        );
        assert_eq!(
            metrics.balloon_pods.with_label_values(&["running"]).get(),
            4
        );
        // Work arriving counts as work, and the balloons it displaces stay balloons.
        cluster.to_submit.push(("work".into(), 1, 8));
        engine.step(&mut cluster, 1.0);
        engine.publish();
        let view = engine.live().view();
        assert_eq!(view.pending_pods + view.running_pods, 1, "{view:?}");
        assert_eq!(view.balloon_pods.pending + view.balloon_pods.running, 6);
    }

    #[test]
    fn a_failed_binding_is_recorded_as_pending_and_retried_after_its_backoff() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut engine = engine(dir.path());
        let mut cluster = Memory {
            to_submit: vec![("ok".into(), 1, 8), ("denied".into(), 2, 8)],
            fail_once: ["denied".to_string()].into(),
            ..Memory::default()
        };
        assert_eq!(engine.live().heartbeat_age(), None);
        let pass = engine.step(&mut cluster, 0.0);
        assert_eq!(pass.outcomes.len(), 2);
        assert_eq!(cluster.bound, ["ok"]);
        assert!(engine.live().heartbeat_age().is_some());
        let store = &engine.live().store;
        let ok = store.job_history("ok").expect("history");
        assert!(matches!(
            ok.last().map(|r| &r.explanation.outcome),
            Some(Outcome::Placed { .. })
        ));
        // The failed one is stored as what happened: pending, with the API server's reason.
        let denied = store.job_history("denied").expect("history");
        let last = &denied.last().expect("a record").explanation;
        assert_eq!(
            waiting_for(&last.outcome),
            Some("its binding to be retried (it failed: admission webhook denied the binding)")
        );
        let id = pending_named(&engine, "denied").expect("the failed job is pending again");
        assert!(!engine.scheduler().is_running(id));
        // Within its backoff it is not tried again; after it, it binds.
        let pass = engine.step(&mut cluster, 0.5);
        assert!(pass.output.decisions.is_empty());
        let pass = engine.step(&mut cluster, 1.5);
        assert_eq!(pass.outcomes, [BindOutcome::Bound { job: id }]);
        assert_eq!(cluster.bound, ["ok", "denied"]);
        let stats = engine.stats();
        assert_eq!((stats.placed, stats.binding_failures), (2, 1));
    }

    #[test]
    fn the_forecast_runs_beside_the_loop_and_reaches_a_job_waiting_for_quota() {
        let dir = tempfile::tempdir().expect("tempdir");
        // One queue of 8 GPUs that may not borrow: the second job waits for quota, which the
        // timeline does not plan; only the forecast gives it a start.
        let mut engine = engine_on(gantry_store::StoreConfig::new(dir.path()), |symbols| {
            scheduler_with_quota(symbols, 8, Some(0))
        });
        let mut cluster = Memory {
            to_submit: vec![("first".into(), 1, 8), ("second".into(), 1, 8)],
            ..Memory::default()
        };
        engine.step(&mut cluster, 0.0);
        assert_eq!(cluster.bound, ["first"]);
        let second = pending_named(&engine, "second").expect("the second job waits");
        assert!(
            engine.forecast.is_some() || engine.scheduler().start_estimate(second).is_some(),
            "the pass handed the due forecast to its thread"
        );
        // Passes go on while it runs; one of them takes its result. The wait is bounded by
        // passes, not by a time the test asserts.
        let mut now_s = 0.0;
        while engine.scheduler().start_estimate(second).is_none() && now_s < 600.0 {
            std::thread::sleep(Duration::from_millis(20));
            now_s += 1.0;
            engine.step(&mut cluster, now_s);
        }
        let estimate = engine
            .scheduler()
            .start_estimate(second)
            .expect("the forecast's estimate reached the job waiting for quota");
        // It is the forecast of the state at 0 s: the second job starts when the first ends,
        // early at its runtime's p10, late at its p90, and in between in the drawn runs.
        assert_eq!(estimate.planned_at_s, 0.0);
        let runtime = engine
            .scheduler()
            .runtime_estimate(engine.scheduler().job(second));
        assert_eq!(
            (estimate.p10_s, estimate.p90_s),
            (runtime.p10_s, runtime.p90_s)
        );
        assert!(
            runtime.p10_s < estimate.p50_s && estimate.p50_s < runtime.p90_s,
            "{estimate:?}"
        );
        assert!(engine.forecast.is_none(), "no second forecast was due");
        assert_eq!(
            engine.live().metrics.forecast_duration.get_sample_count(),
            1
        );
    }

    #[test]
    fn the_run_reports_allocation_over_the_time_after_the_warmup() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut engine = engine(dir.path());
        engine.config.warmup_s = 10.0;
        let mut cluster = Memory {
            to_submit: vec![("half".into(), 2, 8)],
            ..Memory::default()
        };
        for t in [0.0, 5.0, 10.0, 20.0, 30.0] {
            engine.step(&mut cluster, t);
        }
        let stats = engine.stats();
        // Half the GPUs from 10 s to 30 s; nothing was pending.
        assert!((stats.gpu_allocation - 0.5).abs() < 1e-9, "{stats:?}");
        assert_eq!(stats.idle_while_wanted, 0.0);
        assert_eq!(stats.cycles, 5);
    }

    /// Every job it submits runs for one pass: each pass places a cluster's worth of jobs.
    struct Churn {
        next: u64,
    }

    impl ClusterSource for Churn {
        fn sync(&mut self, scheduler: &mut Scheduler, now_s: f64) -> Changes {
            let mut changes = Changes::default();
            for id in scheduler.running().collect::<Vec<_>>() {
                scheduler.finish(id);
                changes.ended += 1;
            }
            let symbols = scheduler.symbols().clone();
            for _ in 0..32 {
                let name = format!("job-{}", self.next);
                self.next += 1;
                scheduler.submit(job(&symbols, &name, 1, 1, now_s));
                changes.submitted += 1;
            }
            changes
        }
    }

    impl gantry_core::Binder for Churn {
        fn bind(
            &mut self,
            _scheduler: &Scheduler,
            output: &CycleOutput,
            _now_s: f64,
        ) -> Vec<BindOutcome> {
            output
                .decisions
                .iter()
                .filter(|d| d.placed)
                .map(|d| BindOutcome::Bound { job: d.job })
                .collect()
        }
    }

    /// Flips node 1 between Ready and Repair `flips` times a sync, each with its own cause.
    struct Flapping {
        flips: usize,
        done: usize,
    }

    impl ClusterSource for Flapping {
        fn sync(&mut self, scheduler: &mut Scheduler, now_s: f64) -> Changes {
            for _ in 0..self.flips {
                let to = if scheduler.lifecycle().state(1) == NodeState::Ready {
                    NodeState::Repair
                } else {
                    NodeState::Ready
                };
                scheduler.set_node_state(1, to, &format!("flip {}", self.done), now_s);
                self.done += 1;
            }
            Changes::default()
        }
    }

    impl gantry_core::Binder for Flapping {
        fn bind(&mut self, _: &Scheduler, _: &CycleOutput, _: f64) -> Vec<BindOutcome> {
            Vec::new()
        }
    }

    #[test]
    fn the_loop_takes_every_transition_and_keeps_the_latest_ten_thousand() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut engine = engine(dir.path());
        let mut cluster = Flapping {
            flips: 3_000,
            done: 0,
        };
        for t in 0..5 {
            engine.step(&mut cluster, f64::from(t));
            // Nothing piles up in the scheduler between passes.
            assert!(
                engine
                    .scheduler
                    .lifecycle_mut()
                    .take_transitions()
                    .is_empty()
            );
        }
        let health = engine.live().health(usize::MAX);
        assert_eq!(health.transitions_kept, crate::live::TRANSITIONS_KEPT);
        assert_eq!(health.transitions.len(), crate::live::TRANSITIONS_KEPT);
        // Newest first, named, the oldest 5,000 of 15,000 gone.
        let newest = &health.transitions[0];
        assert_eq!(
            (newest.node.as_str(), newest.cause.as_str(), newest.at_s),
            ("node-1", "flip 14999", 4.0)
        );
        assert_eq!(
            health.transitions.last().map(|t| t.cause.as_str()),
            Some("flip 5000")
        );
        // 15,000 flips from Ready end in Ready; the counts say so.
        assert_eq!(health.nodes["ready"], 4);
        assert_eq!(health.nodes["repair"], 0);
        assert!(!health.breaker.tripped);
    }

    #[test]
    fn the_loop_keeps_the_decision_history_within_its_retention_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = gantry_store::StoreConfig::new(dir.path());
        config.max_bytes = 1 << 20;
        let mut engine = engine_with(config);
        engine.config.pause = Duration::ZERO;
        engine.config.compact_every = Duration::from_millis(200);
        let stop = crate::Shutdown::new();
        let (mut placed, mut peak) = (0u64, 0u64);
        let mut cluster = Churn { next: 0 };
        engine.run(&mut cluster, &stop, None, &mut |engine, _, pass| {
            placed += pass.outcomes.len() as u64;
            let bytes = engine.live().store.decision_bytes().expect("bytes");
            peak = peak.max(bytes);
            if placed >= 200_000 {
                stop.trigger();
            }
        });
        engine.live().compact();
        let store = &engine.live().store;
        let bytes = store.decision_bytes().expect("bytes");
        assert!(bytes <= 1 << 20, "{bytes} bytes kept over a 1 MiB bound");
        // Between two compactions the history grows by what the loop wrote meanwhile; it
        // never runs away (200,000 placements are about 70 MB of records).
        assert!(peak < 16 << 20, "the history reached {peak} bytes");
        // The newest decisions are kept, the oldest went (each job's final outcome stays
        // apart from the history, by the store's design).
        let kept = store
            .decisions_between(0, u64::MAX, usize::MAX)
            .expect("records");
        assert!(kept.len() < 20_000, "{} records kept", kept.len());
        let last = format!("job-{}", cluster.next - 1);
        assert!(kept.iter().any(|r| r.explanation.job == last));
        assert!(kept.iter().all(|r| r.explanation.job != "job-0"));
    }
}
