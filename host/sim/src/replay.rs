//! Trace replay in virtual time: the same core scheduler, driven by job arrivals and
//! completions instead of a clock, and measured as it goes. The report is a function of the
//! inputs alone (its `wall_clock` part aside), so two runs compare byte for byte.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;
use std::time::Instant;

use gantry_core::scheduler::KnownFuture;
use gantry_core::{
    ClusterState, JobId, JobSpec, Mode, PodShape, PolicyHooks, QueueId, Scheduler, SchedulerConfig,
    Seconds, Symbols, TopologyPref, VirtualClock,
};
use serde::Serialize;

use crate::failures::{FailureModel, FailureReport, Injector, Losses, StateIntegrals};
use crate::fair;
use crate::oracle::{KnownFutureMode, Oracle};
use crate::spec::Cluster;
use crate::trace::TraceJob;

/// Why a replay could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{origin} line {line}: queue \"{queue}\" is not declared in cluster spec {cluster}")]
    UnknownQueue {
        origin: String,
        line: u64,
        queue: String,
        cluster: String,
    },
    #[error("cluster spec {cluster}: {message}")]
    Queues { cluster: String, message: String },
    #[error("failure model of {cluster}: {message}")]
    Failures { cluster: String, message: String },
    #[error("the invariant audit failed at t={time_s}s: {message}")]
    Audit { time_s: f64, message: String },
}

/// How to replay.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Fair-share usage half-life.
    pub half_life_s: f64,
    /// Check every GPU's allocation and every gang after each cycle.
    pub audit: bool,
    /// Recorded in the report; the replay itself is deterministic.
    pub seed: u64,
    pub scheduler: SchedulerConfig,
    /// The planner's knobs (Gantry's cycle only).
    pub plan: gantry_core::scheduler::plan::PlanConfig,
    /// The diagnostic modes: each job's first estimate is the forecast handed the trace's
    /// true future (its submissions to come and every job's true runtime), which a faithful
    /// forecast turns into the replay's own starts, or draws of it ([`KnownFutureMode`]).
    /// Never what a live scheduler can know.
    pub known_future: Option<KnownFutureMode>,
    /// Futures the `arrivals` and `process` modes draw per forecast (each job's estimate is
    /// its median start over them): more draws bound the error more tightly, at one forward
    /// run each.
    pub oracle_draws: usize,
    /// Plan a Slurm `squeue --start`-style estimate for each job when it gets its first one
    /// (the jobs known then, learned mean runtimes, no future submissions): the baseline the
    /// report judges the estimates against.
    pub estimate_baseline: bool,
    /// How nodes fail, overriding the cluster spec's `failures:` section (`--failures`).
    pub failures: Option<FailureModel>,
    /// The checkpoint interval of a job whose trace row declares none (`--checkpoint-every`);
    /// `None`: such a job starts over after a failure or a preemption.
    pub default_checkpoint_s: Option<f64>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            half_life_s: 3600.0,
            audit: true,
            seed: 0,
            scheduler: SchedulerConfig::default(),
            plan: gantry_core::scheduler::plan::PlanConfig {
                enabled: true,
                ..Default::default()
            },
            known_future: None,
            oracle_draws: crate::oracle::ORACLE_DRAWS,
            estimate_baseline: false,
            failures: None,
            default_checkpoint_s: None,
        }
    }
}

/// One job's first start estimate against its actual start: a row of
/// `gantry simulate --estimates`, and what [`EstimateReport`] sums up. Times are on the
/// replay's clock, in seconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FirstEstimate {
    pub job: String,
    pub queue: String,
    /// GPUs the job asked for in all (fractional pods rounded up, as quota counts them).
    pub gpus: u64,
    pub submitted_s: f64,
    /// When the job was first told an estimate.
    pub estimated_at_s: f64,
    pub p10_s: f64,
    pub p50_s: f64,
    pub p90_s: f64,
    pub started_s: f64,
    /// The `squeue --start`-style baseline's start, planned when the first estimate was made
    /// (with `estimate_baseline`, for a first estimate made within [`PROMPT_ESTIMATE_S`] of
    /// submission, the ones judged; empty otherwise, or when its run did not reach the job).
    pub baseline_s: Option<f64>,
}

impl FirstEstimate {
    fn wait_s(&self) -> f64 {
        self.started_s - self.submitted_s
    }

    /// How long after its submission the estimate was made.
    fn delay_s(&self) -> f64 {
        self.estimated_at_s - self.submitted_s
    }

    fn error_s(&self) -> f64 {
        (self.started_s - self.p50_s).abs()
    }

    fn baseline_error_s(&self) -> Option<f64> {
        self.baseline_s.map(|b| (self.started_s - b).abs())
    }

    /// Whether the start fell within the p10–p90 interval (a second's slack for rounding).
    fn within(&self) -> bool {
        (self.p10_s - 1.0..=self.p90_s + 1.0).contains(&self.started_s)
    }
}

/// A first estimate counts only if it came within this long of the job's submission: an
/// estimate made well into a wait is an easy one.
pub const PROMPT_ESTIMATE_S: f64 = 60.0;

/// The planner's start estimates against the actual starts, over the jobs that waited and got
/// their first estimate within [`PROMPT_ESTIMATE_S`] of submission.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EstimateReport {
    /// What the forecast was told of the future: `drawn` from history, as a live scheduler
    /// knows it, or `known` (the diagnostic mode: the trace's true submissions and runtimes).
    pub future: &'static str,
    /// Jobs whose first estimate is judged.
    pub jobs: usize,
    /// Jobs that waited and got their first estimate later than [`PROMPT_ESTIMATE_S`] after
    /// submission: not judged.
    pub estimated_after_a_minute: usize,
    /// The judged jobs' median wait.
    pub median_wait_s: f64,
    /// Median of |actual start − first estimate's p50|, in seconds.
    pub median_abs_error_s: f64,
    /// That error over the job's actual wait, median over jobs.
    pub median_error_share_of_wait: f64,
    /// Share of jobs that started within their first estimate's p10–p90 interval.
    pub within_interval: f64,
    /// The median width of the first estimate's p10–p90 interval.
    pub median_interval_width_s: f64,
    /// Jobs whose first estimate came more than a tenth of their wait after they were
    /// submitted: judged on the whole wait, such an estimate looks better than it was.
    pub late_first_estimates: usize,
    /// The error over the wait left when the first estimate was made, median over jobs.
    pub median_error_share_of_wait_left: f64,
    /// The same jobs against the `squeue --start`-style baseline, when it was planned.
    pub baseline: Option<BaselineReport>,
}

/// The first estimates against the `squeue --start`-style baseline planned at the same moment
/// (the jobs known then, learned mean runtimes, no future submissions), on the judged jobs
/// the baseline reached.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BaselineReport {
    /// Judged jobs the baseline reached.
    pub jobs: usize,
    /// The baseline's median |actual start − its start|.
    pub median_abs_error_s: f64,
    /// The first estimates' median absolute error on the same jobs.
    pub estimate_median_abs_error_s: f64,
    /// The estimates' median error over the baseline's: under 1, the forecast beats it.
    pub error_ratio: f64,
}

fn estimate_report(all: &[FirstEstimate], known_future: Option<KnownFutureMode>) -> EstimateReport {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        round6(gantry_core::percentile(&v, 50.0))
    };
    let outcomes: Vec<&FirstEstimate> = all
        .iter()
        .filter(|o| o.delay_s() <= PROMPT_ESTIMATE_S)
        .collect();
    let with_baseline: Vec<&&FirstEstimate> =
        outcomes.iter().filter(|o| o.baseline_s.is_some()).collect();
    let baseline = (!with_baseline.is_empty()).then(|| {
        let ours = median(with_baseline.iter().map(|o| o.error_s()).collect());
        let theirs = median(
            with_baseline
                .iter()
                .filter_map(|o| o.baseline_error_s())
                .collect(),
        );
        BaselineReport {
            jobs: with_baseline.len(),
            median_abs_error_s: theirs,
            estimate_median_abs_error_s: ours,
            error_ratio: round6(ratio(ours, theirs)),
        }
    });
    EstimateReport {
        future: known_future.map_or("drawn", KnownFutureMode::name),
        jobs: outcomes.len(),
        estimated_after_a_minute: all.len() - outcomes.len(),
        median_wait_s: median(outcomes.iter().map(|o| o.wait_s()).collect()),
        median_abs_error_s: median(outcomes.iter().map(|o| o.error_s()).collect()),
        median_error_share_of_wait: median(
            outcomes
                .iter()
                .filter(|o| o.wait_s() > 0.0)
                .map(|o| o.error_s() / o.wait_s())
                .collect(),
        ),
        within_interval: round6(ratio(
            outcomes.iter().filter(|o| o.within()).count() as f64,
            outcomes.len() as f64,
        )),
        median_interval_width_s: median(outcomes.iter().map(|o| o.p90_s - o.p10_s).collect()),
        late_first_estimates: outcomes
            .iter()
            .filter(|o| o.delay_s() > 0.1 * o.wait_s())
            .count(),
        median_error_share_of_wait_left: median(
            outcomes
                .iter()
                .filter(|o| o.wait_s() > o.delay_s())
                .map(|o| o.error_s() / (o.wait_s() - o.delay_s()))
                .collect(),
        ),
        baseline,
    }
}

/// Writes `rows` as CSV with a header, one job per row, for `gantry simulate --estimates`.
pub fn write_first_estimates(
    rows: &[FirstEstimate],
    out: impl std::io::Write,
) -> Result<(), csv::Error> {
    let mut writer = csv::Writer::from_writer(out);
    for row in rows {
        writer.serialize(row)?;
    }
    writer.flush()?;
    Ok(())
}

/// Wait-time percentiles, in seconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WaitStats {
    pub jobs: usize,
    pub mean_s: f64,
    pub p50_s: f64,
    pub p95_s: f64,
    pub p99_s: f64,
    /// The longest wait: what a starved job sees.
    pub max_s: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct QueueReport {
    pub wait: WaitStats,
    /// Time-averaged share of the cluster's GPUs held by the queue's jobs whose every pod runs
    /// (its quota charge aside), while work was queued.
    pub gpu_share: f64,
    /// Its share by weight, down the queue tree.
    pub fair_share: f64,
    /// The same share over the common window (see [`Report::gpu_allocation_common_window`]).
    pub gpu_share_common_window: f64,
    /// Its max-min fair target over the same window, as a share of the cluster's GPUs: at each
    /// instant, min(its demand, its fair share) by water-filling down the tree, with nominal
    /// quota guaranteed first and the rest shared by weight (`fair::max_min_targets`), then
    /// time-averaged. A queue with no demand has a target of 0.
    pub max_min_fair_target: f64,
    /// `gpu_share_common_window - max_min_fair_target`: below 0, the queue got less than it
    /// could have used of its fair share (starved); near 0, it got its due; above 0, it used
    /// what others left idle or could not use.
    pub deviation_from_target: f64,
}

/// What `gantry simulate --report` writes.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    pub cluster: String,
    pub trace: String,
    pub scheduler: String,
    pub seed: u64,
    pub nodes: usize,
    pub gpus: u64,
    pub jobs_submitted: usize,
    pub jobs_started: usize,
    pub jobs_finished: usize,
    /// Jobs that never started: larger than the cluster, or starved (a scheduler deadlock).
    pub jobs_never_started: usize,
    /// Most jobs pending at once (after a cycle).
    pub peak_pending: usize,
    /// GPUs held by jobs whose every pod runs, over total GPUs, time-weighted over the time
    /// when work was queued. GPUs held by a partly placed gang do no work and do not count.
    /// The window depends on the scheduler: compare schedulers with
    /// `gpu_allocation_common_window`.
    pub gpu_allocation_while_queued: f64,
    /// The same over one window that depends on the trace alone, so it is the same for every
    /// scheduler given the same trace: from the first submission to the last.
    pub gpu_allocation_common_window: f64,
    /// The same over the whole run, from the first submission to the last completion: the
    /// same work done sooner shows here as a higher figure.
    pub gpu_allocation_over_makespan: f64,
    /// Over every submitted job: the time from submission to its first start, plus any time
    /// spent pending again after a preemption (`requeue_wait`). A job that never started (or
    /// never restarted) counts its wait until the end.
    pub wait: WaitStats,
    /// Over the jobs preempted at least once: the time each spent pending again after its
    /// preemptions, summed per job.
    pub requeue_wait: WaitStats,
    /// The same, by the GPUs a job asks in all (pods × GPUs per pod).
    pub wait_by_gpus: BTreeMap<u64, WaitStats>,
    pub queues: BTreeMap<String, QueueReport>,
    /// Gangs that ever ran with some but not all of their pods. Must be 0.
    pub partial_gangs: u64,
    pub preemptions: u64,
    /// What Gantry's planner did: reservations made, jobs started on reserved nodes, slips,
    /// backfilled jobs evicted for overrunning (all zero for the anchors, which do not plan).
    pub planner: gantry_core::scheduler::plan::PlanStats,
    /// How the planner's start estimates held up.
    pub estimates: EstimateReport,
    /// Every judged job's first estimate and start, in the order they started: written by
    /// `--estimates`, not in the JSON report, which stays a summary.
    #[serde(skip)]
    pub first_estimates: Vec<FirstEstimate>,
    /// Free GPUs no pending pod shape could use, as a fraction of free GPUs, averaged over the
    /// cycles that had work pending.
    pub fragmentation: f64,
    /// What node failures did, when the run had a failure model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failures: Option<FailureReport>,
    pub makespan_s: f64,
    pub cycles: u64,
    /// Every decision, retries of a pending job included.
    pub decisions: u64,
    /// Decisions that were a job's first.
    pub first_attempt_decisions: u64,
    pub wall_clock: WallClock,
}

/// The only part of the report that varies between identical runs.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WallClock {
    pub seconds: f64,
    /// Every decision per second, retries included.
    pub decisions_per_s: f64,
    /// Decisions that were a job's first, per second: jobs decided on per second.
    pub first_attempt_decisions_per_s: f64,
}

/// Stale completions (of jobs evicted since) kept in the heap before it is swept.
const STALE_SWEEP: usize = 64;

/// Every decision the replay made, for callers that keep them (the store, the UI).
pub type OnDecision<'a> = dyn FnMut(&gantry_core::Decision) + 'a;

/// A cluster and a trace, ready to replay.
pub struct Replay {
    cluster_name: String,
    trace_name: String,
    scheduler: Scheduler,
    /// The trace in submit order; the replay consumes it as jobs arrive.
    jobs: Vec<TraceJob>,
    options: ReplayOptions,
    /// Node failures to inject, when there is a failure model.
    injector: Option<Injector>,
}

/// What the replay keeps of a job while it is live (pending or running). It is dropped when
/// the job finishes, leaving only its wait, so memory follows what is live, not history.
struct Live {
    queue: QueueId,
    submit_s: f64,
    duration_s: f64,
    gpus: u64,
    shape: Option<ShapeKey>,
    /// Bumped by each eviction: a completion pushed before it is stale.
    generation: u32,
    started_s: Option<f64>,
    /// When it was last evicted, while it waits to run again.
    evicted_s: Option<f64>,
    /// Time spent pending again after its preemptions, so far.
    requeue_s: f64,
    preempted: bool,
    partial: bool,
    decided: bool,
    /// The planner's first start estimate for it: (p10, p50, p90), on the replay's clock, and
    /// when it was made.
    first_estimate: Option<((f64, f64, f64), f64)>,
    /// The `squeue --start`-style baseline's start, planned with its first estimate.
    baseline_s: Option<f64>,
    /// How often it checkpoints; `None`: a restart starts over.
    checkpoint_s: Option<f64>,
    /// Work kept so far (checkpointed before a failure or preemption), in seconds of its run.
    done_s: f64,
    /// When its current run started, while every pod runs.
    run_started_s: Option<f64>,
    /// When a node failure stopped it, while it waits to restart.
    failed_s: Option<f64>,
}

impl Live {
    /// Its run ends early (a failure or a preemption) at `now_s`: the work since its last
    /// checkpoint is lost. The GPU-seconds lost.
    fn end_run(&mut self, now_s: f64) -> f64 {
        let Some(started) = self.run_started_s.take() else {
            return 0.0;
        };
        let ran = (now_s - started).max(0.0);
        let kept = self
            .checkpoint_s
            .map_or(0.0, |every| (ran / every).floor() * every);
        self.done_s += kept;
        (ran - kept) * self.gpus as f64
    }
}

/// A pod shape as fragmentation sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ShapeKey {
    /// Whole GPUs of a type (0 = any).
    Whole { gpu_type: u32, gpus: u32 },
    /// A fraction of one GPU, in milli-GPUs.
    Milli(u32),
}

impl ShapeKey {
    fn of(shape: &PodShape) -> Option<Self> {
        if shape.gpu_milli > 0 {
            Some(Self::Milli(shape.gpu_milli))
        } else if shape.gpus > 0 {
            Some(Self::Whole {
                gpu_type: shape.gpu_type,
                gpus: shape.gpus,
            })
        } else {
            None
        }
    }
}

/// The pending jobs' pod shapes, counted as jobs arrive, start and are evicted, so that
/// fragmentation costs the distinct shapes and the nodes, not the pending jobs.
#[derive(Default)]
struct PendingShapes(BTreeMap<ShapeKey, u64>);

impl PendingShapes {
    fn add(&mut self, shape: Option<ShapeKey>) {
        if let Some(shape) = shape {
            *self.0.entry(shape).or_default() += 1;
        }
    }

    fn remove(&mut self, shape: Option<ShapeKey>) {
        if let Some(shape) = shape
            && let Some(count) = self.0.get_mut(&shape)
        {
            *count -= 1;
            if *count == 0 {
                self.0.remove(&shape);
            }
        }
    }
}

/// Each job's wait, kept when it finishes (or when the replay ends).
struct Waits {
    by_queue: Vec<Vec<f64>>,
    /// By the GPUs a job asks in all: the big gangs' waits apart from the stream of small
    /// jobs that hides them in the overall percentiles.
    by_gpus: BTreeMap<u64, Vec<f64>>,
    /// Of the jobs preempted at least once: their time pending again.
    requeue: Vec<f64>,
}

impl Waits {
    fn record(&mut self, job: &Live, end_s: f64) {
        let requeue = job.requeue_s + job.evicted_s.map_or(0.0, |t| end_s - t);
        let first = job.started_s.unwrap_or(end_s.max(job.submit_s)) - job.submit_s;
        self.by_queue[job.queue].push(first + requeue);
        self.by_gpus
            .entry(job.gpus)
            .or_default()
            .push(first + requeue);
        if job.preempted {
            self.requeue.push(requeue);
        }
    }
}

impl Replay {
    pub fn new(
        cluster: Cluster,
        trace_name: &str,
        jobs: Vec<TraceJob>,
        symbols: Arc<Symbols>,
        options: ReplayOptions,
    ) -> Result<Self, ReplayError> {
        let queues = cluster
            .queue_tree(options.half_life_s)
            .map_err(|e| ReplayError::Queues {
                cluster: cluster.name.clone(),
                message: e.to_string(),
            })?;
        for job in &jobs {
            if queues.id(&job.queue).is_none() {
                return Err(ReplayError::UnknownQueue {
                    origin: trace_name.to_string(),
                    line: job.line,
                    queue: job.queue.clone(),
                    cluster: cluster.name.clone(),
                });
            }
        }
        let mut scheduler = Scheduler::new(
            ClusterState::new(cluster.nodes),
            queues,
            symbols,
            options.scheduler.clone(),
        );
        let mut plan = options.plan.clone();
        if options.known_future.is_some() {
            // Every first estimate comes from the known future (see `known_future`): the
            // scheduler runs no drawn forecast of its own.
            plan.forecast_every_s = f64::INFINITY;
        }
        scheduler.set_plan_config(plan);
        let injector = match options.failures.clone().or(cluster.failures) {
            None => None,
            Some(model) => {
                let gantry = scheduler.config.mode == Mode::Gantry;
                scheduler.lifecycle_mut().config = if gantry {
                    model.health.clone()
                } else {
                    // The anchors have no breaker and no bad-node list: a failing node is
                    // cordoned by whatever taints it, however many fail.
                    gantry_core::HealthConfig {
                        max_out_share: 1.0,
                        max_cordons_per_hour: u32::MAX,
                        avoid_s: 0.0,
                        ..model.health.clone()
                    }
                };
                let injector =
                    Injector::new(model, &scheduler, options.seed, gantry).map_err(|message| {
                        ReplayError::Failures {
                            cluster: cluster.name.clone(),
                            message,
                        }
                    })?;
                Some(injector)
            }
        };
        Ok(Self {
            cluster_name: cluster.name,
            trace_name: trace_name.to_string(),
            scheduler,
            jobs,
            options,
            injector,
        })
    }

    /// The oracle the `--known-future` modes that draw their futures need, over `jobs` (the
    /// whole trace); none for the exact future or a plain replay.
    fn oracle_of(&self, jobs: &[TraceJob]) -> Option<Oracle> {
        let options = &self.options;
        options
            .known_future
            .filter(|&mode| mode != KnownFutureMode::Exact)
            .map(|mode| Oracle::new(mode, jobs, options.oracle_draws, options.seed))
    }

    /// Replay the whole trace. `progress` is told how many jobs have finished, now and then.
    ///
    /// The replay drives [`gantry_core::step`], the engine's own pass, on a virtual clock: the
    /// trace's arrivals and the jobs' completions are its cluster source, and its binder books
    /// what each cycle started (see [`World`]). Each step costs what is live, never what is
    /// past: the jobs arriving or ending, the cycle itself, the decisions it made, the queues,
    /// the nodes and the distinct pending pod shapes. A finished job leaves nothing behind but
    /// its wait.
    pub fn run(
        mut self,
        hooks: &mut dyn PolicyHooks,
        progress: &mut dyn FnMut(usize),
        on_decision: &mut OnDecision<'_>,
    ) -> Result<Report, ReplayError> {
        let started = Instant::now();
        let total_gpus: u64 = self
            .scheduler
            .state
            .nodes
            .gpu_total
            .iter()
            .map(|&g| u64::from(g))
            .sum();
        let (first_submit, last_submit) = self.trace_window();
        let jobs_submitted = self.jobs.len();
        let queue_count = self.scheduler.queues.len();
        let mut world = self.world(progress, on_decision);
        let mut cycles = 0u64;
        let mut peak_pending = 0usize;
        let window = (first_submit, last_submit);
        let mut integrals = Integrals::new(queue_count);
        let (mut frag_sum, mut frag_cycles) = (0.0, 0u64);
        let mut now = 0.0f64;
        let mut clock = VirtualClock::at(now);
        loop {
            let next_change = self.next_change(&mut world);
            let Some(next) = clock.advance(&self.scheduler, next_change) else {
                break;
            };
            integrals.add(&self.scheduler, &world, (now, next), window, total_gpus);
            now = next;
            let step = gantry_core::step(&mut self.scheduler, &mut world, now, &mut |s, _| {
                Some(s.cycle(now, hooks))
            });
            cycles += 1;
            clock.stepped(&self.scheduler, &step);
            world.note_first_estimates(&mut self.scheduler, &step, clock, &self.options);
            let pending = self.scheduler.pending_count();
            peak_pending = peak_pending.max(pending);
            if world.injector.is_some() {
                integrals.states.note(&self.scheduler);
            }
            if pending > 0 {
                frag_sum += self.fragmentation(&world.shapes);
                frag_cycles += 1;
            }
            if self.options.audit {
                self.scheduler
                    .state
                    .audit()
                    .map_err(|message| ReplayError::Audit {
                        time_s: now,
                        message,
                    })?;
            }
        }
        let World {
            live,
            mut waits,
            started_jobs,
            finished,
            partial_gangs,
            preemptions,
            decisions,
            first_decisions,
            estimates,
            last_end,
            progress,
            injector,
            mut losses,
            ..
        } = world;
        progress(finished);

        // A job that never started (or never restarted) counts its wait until the replay
        // ended: leaving it out would make a scheduler that starves jobs look fast.
        for job in live.values() {
            waits.record(job, now);
            if let Some(failed) = job.failed_s {
                losses.restart_waits.push(now - failed);
            }
        }
        let failures = injector.map(|injector| {
            let (busy, span_s) = (integrals.busy, now - first_submit);
            let scheduler = &self.scheduler;
            crate::failures::report(
                scheduler,
                &injector,
                losses,
                &integrals.states,
                busy,
                span_s,
            )
        });
        let window_gpu_s = (last_submit - first_submit) * total_gpus as f64;
        let queues = self.queue_reports(&mut waits, &integrals, window_gpu_s, total_gpus);
        let all_waits: Vec<f64> = waits.by_queue.concat();
        let seconds = started.elapsed().as_secs_f64();
        Ok(Report {
            cluster: self.cluster_name,
            trace: self.trace_name,
            scheduler: self.scheduler.config.mode.name().into(),
            seed: self.options.seed,
            nodes: self.scheduler.state.len(),
            gpus: total_gpus,
            jobs_submitted,
            jobs_started: started_jobs,
            jobs_finished: finished,
            jobs_never_started: jobs_submitted - started_jobs,
            peak_pending,
            gpu_allocation_while_queued: round6(ratio(
                integrals.allocated,
                integrals.queued_time * total_gpus as f64,
            )),
            gpu_allocation_common_window: round6(ratio(integrals.window_allocated, window_gpu_s)),
            gpu_allocation_over_makespan: round6(ratio(
                integrals.busy,
                (last_end - first_submit) * total_gpus as f64,
            )),
            wait: wait_stats(all_waits),
            requeue_wait: wait_stats(waits.requeue),
            wait_by_gpus: waits
                .by_gpus
                .into_iter()
                .map(|(gpus, waits)| (gpus, wait_stats(waits)))
                .collect(),
            queues,
            partial_gangs,
            preemptions,
            planner: self.scheduler.plan_stats(),
            estimates: estimate_report(&estimates, self.options.known_future),
            first_estimates: estimates,
            fragmentation: round6(ratio(frag_sum, frag_cycles as f64)),
            failures,
            makespan_s: round6(last_end - first_submit),
            cycles,
            decisions,
            first_attempt_decisions: first_decisions,
            wall_clock: WallClock {
                seconds: round6(seconds),
                decisions_per_s: round6(ratio(decisions as f64, seconds)),
                first_attempt_decisions_per_s: round6(ratio(first_decisions as f64, seconds)),
            },
        })
    }

    /// The world the replay runs in, its trace taken out of the replay.
    fn world<'a, 'b>(
        &mut self,
        progress: &'a mut dyn FnMut(usize),
        on_decision: &'a mut OnDecision<'b>,
    ) -> World<'a, 'b> {
        let binds_pods = matches!(self.scheduler.config.mode, Mode::K8sDefault | Mode::Kueue);
        let jobs = std::mem::take(&mut self.jobs);
        let oracle = self.oracle_of(&jobs);
        let queue_count = self.scheduler.queues.len();
        let mut world = World::new(jobs, binds_pods, queue_count, progress, on_decision);
        world.oracle = oracle;
        world.injector = self.injector.take();
        world.default_checkpoint_s = self.options.default_checkpoint_s;
        world
    }

    /// When the world next changes: an arrival, a completion, a node failure, repair or test
    /// (failures only while work is left that they could touch), a stopped job moving on.
    /// With work pending, the clock also retries every `RETRY_S` when none of these comes,
    /// until a few retries in a row change nothing and nothing runs that could.
    fn next_change(&self, world: &mut World<'_, '_>) -> Option<f64> {
        let next_arrival = world.arrivals.peek().map(|j| j.submit_s);
        let next_completion = world
            .completions
            .peek()
            .map(|Reverse((Seconds(t), _, _))| *t);
        let work_left = next_arrival.is_some() || self.scheduler.running().next().is_some();
        let next_failure = world
            .injector
            .as_ref()
            .and_then(|injector| injector.next_s(work_left));
        let next_restart = self.scheduler.next_restart_s();
        [next_arrival, next_completion, next_failure, next_restart]
            .into_iter()
            .flatten()
            .min_by(f64::total_cmp)
    }

    /// The trace's first and last submission.
    fn trace_window(&self) -> (f64, f64) {
        let first = self
            .jobs
            .iter()
            .map(|j| j.submit_s)
            .reduce(f64::min)
            .unwrap_or(0.0);
        let last = self.jobs.iter().map(|j| j.submit_s).fold(first, f64::max);
        (first, last)
    }

    /// Per queue (every leaf, and a parent with jobs of its own): its waits, its share of
    /// the GPUs while work waited and within the common window (`window_gpu_s`), and its
    /// max-min fair target there.
    fn queue_reports(
        &self,
        waits: &mut Waits,
        integrals: &Integrals,
        window_gpu_s: f64,
        total_gpus: u64,
    ) -> BTreeMap<String, QueueReport> {
        let mut queues = BTreeMap::new();
        for q in self.scheduler.queues.ids() {
            let mine = std::mem::take(&mut waits.by_queue[q]);
            if self.scheduler.queues.children(q).is_empty() || !mine.is_empty() {
                let share = ratio(integrals.window_queue[q], window_gpu_s);
                let target = ratio(integrals.window_target[q], window_gpu_s);
                queues.insert(
                    self.scheduler.queues.name(q).to_string(),
                    QueueReport {
                        wait: wait_stats(mine.clone()),
                        gpu_share: round6(ratio(
                            integrals.queue[q],
                            integrals.queued_time * total_gpus as f64,
                        )),
                        fair_share: round6(self.scheduler.queues.fair_share(q)),
                        gpu_share_common_window: round6(share),
                        max_min_fair_target: round6(target),
                        deviation_from_target: round6(share - target),
                    },
                );
                waits.by_queue[q] = mine;
            }
        }
        queues
    }

    /// Free GPUs that no pending job's pod shape can use, over all free GPUs.
    fn fragmentation(&self, shapes: &PendingShapes) -> f64 {
        let nodes = &self.scheduler.state.nodes;
        // The smallest whole-GPU ask per GPU type (0 = any type), and the smallest fraction.
        let mut any_min = u32::MAX;
        let mut type_min: BTreeMap<u32, u32> = BTreeMap::new();
        let mut milli_min = u32::MAX;
        for &shape in shapes.0.keys() {
            match shape {
                ShapeKey::Milli(milli) => milli_min = milli_min.min(milli),
                ShapeKey::Whole { gpu_type: 0, gpus } => any_min = any_min.min(gpus),
                ShapeKey::Whole { gpu_type, gpus } => {
                    let entry = type_min.entry(gpu_type).or_insert(u32::MAX);
                    *entry = (*entry).min(gpus);
                }
            }
        }
        let (mut free, mut unusable) = (0u64, 0u64);
        for i in 0..nodes.len() {
            let node_free = nodes.gpu_free[i];
            free += u64::from(node_free);
            let need = any_min.min(
                type_min
                    .get(&nodes.gpu_type[i])
                    .copied()
                    .unwrap_or(u32::MAX),
            );
            let usable = node_free >= need
                || (milli_min != u32::MAX && nodes.gpu_milli_free_max[i] >= milli_min);
            if !usable {
                unusable += u64::from(node_free);
            }
        }
        ratio(unusable as f64, free as f64)
    }
}

/// Per queue, `own` summed over the queue and its descendants.
/// What the replay integrates over time for the report: allocated GPU-seconds while work
/// waits, over the makespan and within the common window (first to last submission), each
/// queue's share and max-min fair target.
struct Integrals {
    /// Seconds during which some job was pending.
    queued_time: f64,
    /// GPU-seconds allocated while some job was pending.
    allocated: f64,
    /// GPU-seconds allocated from the first submission on.
    busy: f64,
    /// Per queue, its GPU-seconds while some job was pending.
    queue: Vec<f64>,
    /// GPU-seconds allocated within the common window.
    window_allocated: f64,
    /// Per queue, its GPU-seconds and its max-min fair target's, within the common window.
    window_queue: Vec<f64>,
    window_target: Vec<f64>,
    /// With a failure model: what goodput and the nodes by state need.
    states: StateIntegrals,
}

impl Integrals {
    fn new(queue_count: usize) -> Self {
        Self {
            queued_time: 0.0,
            allocated: 0.0,
            busy: 0.0,
            queue: vec![0.0; queue_count],
            window_allocated: 0.0,
            window_queue: vec![0.0; queue_count],
            window_target: vec![0.0; queue_count],
            states: StateIntegrals::default(),
        }
    }

    /// Integrates over `[now, next)`: allocation always, while work waits, and within the
    /// common `window` (first and last submission); each queue's use and max-min fair target
    /// within the window.
    fn add(
        &mut self,
        scheduler: &Scheduler,
        world: &World<'_, '_>,
        (now, next): (f64, f64),
        (first_submit, last_submit): (f64, f64),
        total_gpus: u64,
    ) {
        if next <= now {
            return;
        }
        let dt = next - now;
        let running = scheduler.running_gpus() as f64;
        let queues = &scheduler.queues;
        let queue_running = subtree_sums(queues, &world.own_running);
        if now >= first_submit {
            self.busy += running * dt;
            if world.injector.is_some() {
                self.states.add_allocated(scheduler, total_gpus, dt);
            }
        }
        if world.injector.is_some() {
            self.states.add_states(dt);
        }
        if scheduler.pending_count() > 0 {
            self.queued_time += dt;
            self.allocated += running * dt;
            for (q, integral) in self.queue.iter_mut().enumerate() {
                if queues.parent(q).is_some() || queues.children(q).is_empty() {
                    *integral += queue_running[q] as f64 * dt;
                }
            }
        }
        let overlap = next.min(last_submit) - now.max(first_submit);
        if overlap > 0.0 {
            self.window_allocated += running * overlap;
            let targets = fair::max_min_targets(queues, &world.own_demand, total_gpus);
            for q in queues.ids() {
                self.window_queue[q] += queue_running[q] as f64 * overlap;
                self.window_target[q] += targets[q] * overlap;
            }
        }
    }
}

/// The replay's side of the loop: the trace's arrivals and the jobs' completions are its
/// cluster source, and its binder books what each cycle started, evicted or split, for the
/// report. Every placed job binds (a replay has no API server to refuse it).
struct World<'a, 'b> {
    binds_pods: bool,
    /// The trace in submit order, consumed as jobs arrive.
    arrivals: std::iter::Peekable<std::vec::IntoIter<TraceJob>>,
    /// The futures a drawn `--known-future` mode hands the forecast.
    oracle: Option<Oracle>,
    /// Node failures, when the run has a failure model.
    injector: Option<Injector>,
    /// The checkpoint interval of a job that declares none.
    default_checkpoint_s: Option<f64>,
    /// What failures and preemptions cost.
    losses: Losses,
    live: BTreeMap<JobId, Live>,
    /// Completions: (end time, job, generation); an eviction bumps the job's generation so
    /// its completion goes stale, and stale ones are swept once they outnumber the others.
    completions: BinaryHeap<Reverse<(Seconds, JobId, u32)>>,
    stale: usize,
    waits: Waits,
    shapes: PendingShapes,
    /// GPUs of each queue's own pending and running jobs (its demand), and of its own jobs
    /// whose every pod runs: a queue's share counts the GPUs doing work, not its quota charge
    /// (Kueue charges an admitted workload whose pods still wait).
    own_demand: Vec<u64>,
    own_running: Vec<u64>,
    started_jobs: usize,
    finished: usize,
    partial_gangs: u64,
    preemptions: u64,
    decisions: u64,
    first_decisions: u64,
    /// Per job that waited and had an estimate: its first estimate against its actual start.
    estimates: Vec<FirstEstimate>,
    last_end: f64,
    progress: &'a mut dyn FnMut(usize),
    on_decision: &'a mut OnDecision<'b>,
}

impl<'a, 'b> World<'a, 'b> {
    /// The world of a replay of `jobs` (in submit order) over `queue_count` queues, nothing
    /// arrived yet. `binds_pods`: the baseline binds placed pods while their siblings wait.
    fn new(
        jobs: Vec<TraceJob>,
        binds_pods: bool,
        queue_count: usize,
        progress: &'a mut dyn FnMut(usize),
        on_decision: &'a mut OnDecision<'b>,
    ) -> Self {
        World {
            // Baselines whose placed pods are bound and run while their siblings wait: a gang
            // holding some nodes there is a partial gang. (Coscheduling's wait unbound, at
            // permit.)
            binds_pods,
            arrivals: jobs.into_iter().peekable(),
            oracle: None,
            injector: None,
            default_checkpoint_s: None,
            losses: Losses::default(),
            live: BTreeMap::new(),
            completions: BinaryHeap::new(),
            stale: 0,
            waits: Waits {
                by_queue: vec![Vec::new(); queue_count],
                by_gpus: BTreeMap::new(),
                requeue: Vec::new(),
            },
            shapes: PendingShapes::default(),
            own_demand: vec![0u64; queue_count],
            own_running: vec![0u64; queue_count],
            started_jobs: 0,
            finished: 0,
            partial_gangs: 0,
            preemptions: 0,
            decisions: 0,
            first_decisions: 0,
            estimates: Vec::new(),
            last_end: 0.0,
            progress,
            on_decision,
        }
    }
}

impl World<'_, '_> {
    /// A node failure stopped `id` at `at_s` (the scheduler has put it back in its queue): its
    /// run ends, losing the work since its last checkpoint, and it waits to restart.
    fn stopped(&mut self, id: JobId, at_s: f64) {
        let Some(job) = self.live.get_mut(&id) else {
            return;
        };
        self.losses.jobs_stopped += 1;
        if job.run_started_s.is_some() {
            // A run ends: its completion goes stale, and it waits to run again. (A baseline's
            // partly placed gang had no run to end; it only waits on.)
            self.losses.failure_gpu_s += job.end_run(at_s);
            job.generation += 1;
            self.stale += 1;
            job.failed_s = Some(at_s);
            job.evicted_s = Some(at_s);
            self.own_running[job.queue] -= job.gpus;
            self.shapes.add(job.shape);
        }
    }

    /// Notes the first estimate each pending job shows after a step, as a user polling
    /// `/api/explain` would read it, whether or not the cycle tried the job (a job parked
    /// since its first attempt is tried again only when woken). In the known-future mode a
    /// job submitted in the step gets the forecast handed the true future first; with the
    /// baseline on, each job noted gets the baseline planned now.
    fn note_first_estimates(
        &mut self,
        scheduler: &mut Scheduler,
        step: &gantry_core::Step,
        clock: VirtualClock,
        options: &ReplayOptions,
    ) {
        let unestimated = |job: &Live| job.started_s.is_none() && job.first_estimate.is_none();
        let mut newly = step.output.newly_estimated.clone();
        if options.known_future.is_some()
            && step.changes.submitted > 0
            && self.live.values().any(unestimated)
        {
            let future = self.known_future(scheduler);
            let run = scheduler.forecast_run_now();
            let forecasts = match self.oracle.as_mut() {
                Some(oracle) => {
                    let id_to_elapsed_s = self
                        .live
                        .iter()
                        .map(|(&id, job)| {
                            let running = job.started_s.filter(|_| job.evicted_s.is_none());
                            (id, running.map(|s| clock.now_s - s))
                        })
                        .collect();
                    let futures = oracle.futures(&future, &id_to_elapsed_s, clock.now_s, |job| {
                        spec_of(scheduler, job)
                    });
                    run.run_known_draws(&futures, clock)
                }
                None => run.run_known(&future, clock),
            };
            scheduler.install_forecast(forecasts);
            newly.extend(scheduler.take_newly_estimated());
        }
        // The jobs whose first estimate is judged: only they get the baseline, whose run
        // stops once they have all started.
        let mut judged = Vec::new();
        for id in newly {
            if let Some(job) = self.live.get_mut(&id)
                && unestimated(job)
                && let Some(e) = scheduler.start_estimate(id)
            {
                job.first_estimate = Some(((e.p10_s, e.p50_s, e.p90_s), clock.now_s));
                if clock.now_s - job.submit_s <= PROMPT_ESTIMATE_S {
                    judged.push(id);
                }
            }
        }
        if options.estimate_baseline && !judged.is_empty() {
            let starts = scheduler.forecast_run_now().run_baseline(clock, &judged);
            for id in judged {
                if let Some(job) = self.live.get_mut(&id) {
                    job.baseline_s = starts.get(&id).copied();
                }
            }
        }
    }

    /// What only the replay knows: the trace's submissions to come and every live job's
    /// true runtime.
    fn known_future(&self, scheduler: &Scheduler) -> KnownFuture {
        KnownFuture {
            submissions: self
                .arrivals
                .clone()
                .map(|job| (spec_of(scheduler, &job), job.duration_s))
                .collect(),
            job_to_runtime_s: self
                .live
                .iter()
                .map(|(&id, job)| (id, job.duration_s))
                .collect(),
            evicted_ends_s: self
                .completions
                .iter()
                .filter(|Reverse((_, id, generation))| {
                    self.live
                        .get(id)
                        .is_none_or(|j| j.generation != *generation)
                })
                .map(|Reverse((Seconds(t), _, _))| *t)
                .collect(),
        }
    }
}

impl gantry_core::ClusterSource for World<'_, '_> {
    /// Submits the jobs that arrived by `now_s`, then ends the jobs whose time is up.
    fn sync(&mut self, scheduler: &mut Scheduler, now_s: f64) -> gantry_core::Changes {
        let mut changes = gantry_core::Changes::default();
        while let Some(job) = self.arrivals.next_if(|j| j.submit_s <= now_s) {
            let spec = spec_of(scheduler, &job);
            let (queue, gpus, shape) = (spec.queue, spec.total().gpus, ShapeKey::of(&spec.shape));
            changes.submitted += 1;
            changes.submitted_pods += u64::from(spec.pods);
            let id = scheduler.submit(spec);
            self.own_demand[queue] += gpus;
            self.shapes.add(shape);
            self.live.insert(
                id,
                Live {
                    queue,
                    submit_s: job.submit_s,
                    duration_s: job.duration_s,
                    gpus,
                    shape,
                    generation: 0,
                    started_s: None,
                    first_estimate: None,
                    baseline_s: None,
                    evicted_s: None,
                    requeue_s: 0.0,
                    preempted: false,
                    partial: false,
                    decided: false,
                    checkpoint_s: job.checkpoint_s.or(self.default_checkpoint_s),
                    done_s: 0.0,
                    run_started_s: None,
                    failed_s: None,
                },
            );
        }
        while let Some(&Reverse((Seconds(t), id, generation))) = self.completions.peek() {
            if t > now_s {
                break;
            }
            self.completions.pop();
            let current = self
                .live
                .get(&id)
                .is_some_and(|j| j.generation == generation);
            if !current {
                self.stale = self.stale.saturating_sub(1);
                continue;
            }
            if scheduler.is_running(id) {
                scheduler.finish(id);
                let job = self.live.remove(&id).expect("a live job");
                if let Some(oracle) = self.oracle.as_mut() {
                    oracle.ended(job.duration_s);
                }
                self.own_demand[job.queue] -= job.gpus;
                self.own_running[job.queue] -= job.gpus;
                self.waits.record(&job, now_s);
                self.finished += 1;
                changes.ended += 1;
                self.last_end = now_s;
                if self.finished.is_multiple_of(256) {
                    (self.progress)(self.finished);
                }
            }
        }
        if let Some(injector) = self.injector.as_mut() {
            for hit in injector.apply(scheduler, now_s) {
                changes.nodes += 1;
                self.losses.failures_hitting_jobs += 1;
                for id in hit.stopped {
                    if scheduler.is_running(id)
                        && let Some(job) = self.live.get(&id)
                    {
                        // An anchor's halted gang: it holds its GPUs until torn down.
                        self.losses.halted_gpu_s +=
                            job.gpus as f64 * gantry_core::scheduler::HALT_S;
                    }
                    self.stopped(id, hit.at_s);
                }
            }
        }
        changes
    }
}

impl gantry_core::Binder for World<'_, '_> {
    /// Books the cycle: evictions make their jobs' completions stale; each job started (or
    /// restarted) gets its completion, at its true duration from now (the replay's clock, not
    /// the scheduler, knows it).
    fn bind(
        &mut self,
        scheduler: &Scheduler,
        output: &gantry_core::CycleOutput,
        now_s: f64,
    ) -> Vec<gantry_core::BindOutcome> {
        let mut outcomes = Vec::new();
        self.decisions += output.decisions.len() as u64;
        for &victim in &output.evicted {
            self.preemptions += 1;
            if let Some(job) = self.live.get_mut(&victim) {
                self.losses.preemption_gpu_s += job.end_run(now_s);
                job.generation += 1;
                self.stale += 1;
                job.preempted = true;
                job.evicted_s = Some(now_s);
                self.own_running[job.queue] -= job.gpus;
                self.shapes.add(job.shape);
            }
        }
        for decision in &output.decisions {
            (self.on_decision)(decision);
            let id = decision.job;
            if decision.placed {
                outcomes.push(gantry_core::BindOutcome::Bound { job: id });
            }
            let Some(job) = self.live.get_mut(&id) else {
                continue;
            };
            if !job.decided {
                job.decided = true;
                self.first_decisions += 1;
            }
            let held = scheduler.slots(id).len();
            let running = scheduler.is_running(id);
            // Some but not all of its pods hold nodes and run: a running job short of pods, or
            // under a binding baseline a pending one that holds any node.
            let partial = if running {
                held != scheduler.job(id).pods as usize
            } else {
                self.binds_pods && held > 0
            };
            if partial && !job.partial {
                job.partial = true;
                self.partial_gangs += 1;
            }
            if !(decision.placed && running) {
                continue;
            }
            self.shapes.remove(job.shape);
            self.own_running[job.queue] += job.gpus;
            match job.started_s {
                None => {
                    job.started_s = Some(now_s);
                    self.started_jobs += 1;
                    if let Some(((p10, p50, p90), made_s)) = job.first_estimate {
                        self.estimates.push(FirstEstimate {
                            job: decision.explanation.job.clone(),
                            queue: decision.explanation.queue.clone(),
                            gpus: job.gpus,
                            submitted_s: job.submit_s,
                            estimated_at_s: made_s,
                            p10_s: p10,
                            p50_s: p50,
                            p90_s: p90,
                            started_s: now_s,
                            baseline_s: job.baseline_s,
                        });
                    }
                }
                Some(_) => {
                    if let Some(evicted) = job.evicted_s.take() {
                        job.requeue_s += now_s - evicted;
                    }
                }
            }
            if let Some(failed) = job.failed_s.take() {
                self.losses.restart_waits.push(now_s - failed);
            }
            job.run_started_s = Some(now_s);
            self.completions.push(Reverse((
                Seconds(now_s + (job.duration_s - job.done_s)),
                id,
                job.generation,
            )));
        }
        if self.stale > STALE_SWEEP && self.stale * 2 > self.completions.len() {
            let live = &self.live;
            self.completions.retain(|Reverse((_, id, generation))| {
                live.get(id).is_some_and(|j| j.generation == *generation)
            });
            self.stale = 0;
        }
        outcomes
    }
}

/// A trace job as the core's job.
fn spec_of(scheduler: &Scheduler, job: &TraceJob) -> JobSpec {
    let symbols = scheduler.symbols();
    let queue = scheduler.queues.id(&job.queue).unwrap_or(0);
    JobSpec {
        name: job.job_id.clone(),
        queue,
        priority: job.priority,
        pods: job.pods,
        shape: PodShape {
            name: symbols.intern(&job.job_id),
            queue: symbols.intern(&job.queue),
            priority: job.priority,
            gpus: job.gpus_per_pod,
            gpu_milli: job.gpu_milli.unwrap_or(0),
            gpu_type: job.gpu_type.as_deref().map_or(0, |t| symbols.intern(t)),
            cpu_milli: job
                .cpu_milli
                .map_or(0, |c| u32::try_from(c).unwrap_or(u32::MAX)),
            memory_mib: job
                .memory_mib
                .map_or(0, |m| u32::try_from(m).unwrap_or(u32::MAX)),
            tolerations: Vec::new(),
            gang_size: job.pods,
            // Traces name no node constraints and no resources beyond GPUs, CPU and memory.
            node_affinity: None,
            resources: Vec::new(),
        },
        balloon: false,
        topology: TopologyPref::default(),
        submit_s: job.submit_s,
        expected_runtime_s: job.expected_runtime_s,
    }
}

fn subtree_sums(queues: &gantry_core::Queues, own: &[u64]) -> Vec<u64> {
    let mut sums = vec![0u64; own.len()];
    for q in queues.ids() {
        let mut at = Some(q);
        while let Some(a) = at {
            sums[a] += own[q];
            at = queues.parent(a);
        }
    }
    sums
}

pub(crate) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

pub(crate) fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

pub(crate) fn wait_stats(mut waits: Vec<f64>) -> WaitStats {
    waits.sort_by(f64::total_cmp);
    let pct = |p: f64| gantry_core::percentile(&waits, p);
    WaitStats {
        jobs: waits.len(),
        mean_s: round6(ratio(waits.iter().sum(), waits.len() as f64)),
        p50_s: round6(pct(50.0)),
        p95_s: round6(pct(95.0)),
        p99_s: round6(pct(99.0)),
        max_s: round6(waits.last().copied().unwrap_or(0.0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_prompt_first_estimates_are_judged_and_against_the_baseline_on_the_same_jobs() {
        let outcome =
            |wait_s: f64, delay_s: f64, error_s: f64, baseline_error_s: f64| FirstEstimate {
                job: "j".into(),
                queue: "q".into(),
                gpus: 1,
                submitted_s: 0.0,
                estimated_at_s: delay_s,
                p10_s: 0.0,
                p50_s: wait_s - error_s,
                p90_s: 2.0 * wait_s,
                started_s: wait_s,
                baseline_s: Some(wait_s + baseline_error_s),
            };
        // Two told at submission, 100 s and 300 s off a 1,000 s wait; one told 50 s into a
        // 100 s wait, 25 s off: a quarter of the whole wait, half of what was left of it.
        // One told 900 s into its wait is not judged at all.
        let report = estimate_report(
            &[
                outcome(1000.0, 0.0, 100.0, 400.0),
                outcome(1000.0, 0.0, 300.0, -600.0),
                outcome(100.0, 50.0, 25.0, 50.0),
                outcome(1000.0, 900.0, 0.0, 0.0),
            ],
            None,
        );
        assert_eq!(report.jobs, 3);
        assert_eq!(report.estimated_after_a_minute, 1);
        assert_eq!(report.late_first_estimates, 1);
        // 0.1, 0.25, 0.3 of the whole wait; 0.1, 0.3, 0.5 of the wait left.
        assert_eq!(report.median_error_share_of_wait, 0.25);
        assert_eq!(report.median_error_share_of_wait_left, 0.3);
        assert_eq!(report.median_wait_s, 1000.0);
        let baseline = report.baseline.expect("every judged job had a baseline");
        assert_eq!(baseline.jobs, 3);
        assert_eq!(baseline.median_abs_error_s, 400.0);
        assert_eq!(baseline.estimate_median_abs_error_s, 100.0);
        assert_eq!(baseline.error_ratio, 0.25);
    }
}
