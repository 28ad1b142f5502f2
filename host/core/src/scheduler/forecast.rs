//! The forecast: when the pending jobs are expected to start, all but those holding a
//! reservation.
//!
//! The timeline ([`super::plan`]) plans only the first jobs waiting for room, each around the
//! claims of every job ahead of it, though only the reservations hold nodes: a small job
//! behind an unreserved gang starts in the gaps the gang cannot use. A job waiting for
//! quota, or far down a long queue, starts when the cycles get to it, and that depends on
//! fair share, quota given back and the jobs submitted after it. So the forecast runs the
//! cycles themselves forward, on a copy of the scheduler, and its starts are the estimates
//! of every pending job it reached that holds no reservation (a reservation's start is the
//! plan's own):
//!
//! - `Arrivals` (kept with the plan's state, `plan/forecasts.rs`, with the results below): the
//!   jobs submitted in the last `ARRIVAL_WINDOW_S`. Copies of them, one and two windows
//!   later ([`DRAWN_ARRIVAL_WINDOWS`]), are what the forecast expects to be submitted next:
//!   later jobs of a queue below its fair share overtake, and a forecast without them is far
//!   too early.
//! - [`DRAWS`] runs in which each running job ends at a draw from what is left of its
//!   runtime, the last window's submissions come again, twice, and the copy plans as the
//!   scheduler does: a job's p50 start is its median start over them. [`BOUNDS`]: two more runs, early (every running job ends at its p10,
//!   nothing new arrives) and late (p90 ends, twice those submissions), whose starts are its
//!   p10 and p90.
//! - [`Scheduler::forecast_if_due`]: runs them at most every
//!   [`super::plan::PlanConfig::forecast_every_s`] when a job was submitted since the last
//!   one, else every [`REFRESH_EVERY`] intervals; bounded in cycles and attempts.
//! - `ForwardWorld`: the cluster of one run. Each run steps [`crate::step`], the loop's own
//!   pass, on a copy of the scheduler, under the built-ins at the copied scheduler's policy-set
//!   version ([`crate::hooks::BuiltinsAt`]).
//! - [`KnownFuture`] and [`ForecastRun::run_known`]: the diagnostic mode, in which a simulator
//!   hands the forecast the true future; the run plans as the scheduler does and steps by the
//!   replay's [`crate::VirtualClock`], so every start it gives is the replay's own.
//!   [`ForecastRun::run_baseline`]: the `squeue --start`-style baseline estimates are judged
//!   against.
//! - [`ForecastRun`] and [`Forecasts`]: off the loop
//!   ([`super::plan::PlanConfig::forecast_off_loop`]), a due forecast is a copy of the
//!   scheduler handed out by [`Scheduler::forecast_to_run`], run on the caller's thread, and
//!   its starts taken back by [`Scheduler::install_forecast`].
//!
//! It knows what a live scheduler knows: runtimes from [`super::plan::RuntimeModel`] (its
//! draws are seeded by the run, the job and its start, so a replay is reproducible), never a
//! job's true duration; submissions that already happened, never the trace's next row. It
//! runs the built-in filters, scores and quota, not the policy set's Wasm components: a
//! forecast calls no plugin.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use crate::VirtualClock;
use crate::model::Seconds;

use super::plan::{Forecast, Forecasts, Rank, Reach, WhatIf};
use super::{JobId, JobSpec, JobState, Scheduler};

/// Most cycles one scenario runs (one per expected end or expected submission). With two
/// windows of expected submissions the cycles go to them sooner, so this and the attempt
/// bounds below are twice what one window needed to reach as many pending jobs.
const SIMULATED_CYCLES: usize = 512;
/// Most jobs one scenario tries, over all its cycles. A job no scenario reached has no
/// forecast.
const SIMULATED_ATTEMPTS: u64 = 2048;
/// Most attempts × nodes one scenario spends: an attempt costs about one filter and score
/// pass over the nodes, so a big cluster gets fewer attempts and a forecast costs about the
/// same everywhere (`gantry bench schedule` prints it at 7,500 nodes).
const SIMULATED_NODE_ATTEMPTS: u64 = 1 << 22;
/// One cycle of a scenario tries at most this share of its attempts (1 / this).
const CYCLE_SHARE_OF_BUDGET: u64 = 8;
/// Fewest attempts one scenario gets, however big the cluster.
const MIN_SIMULATED_ATTEMPTS: u64 = 64;
/// With no new submission, a forecast is made again only after this many intervals: the
/// cluster moved on, but its last forecast mostly still holds.
const REFRESH_EVERY: f64 = 10.0;

/// When a scenario expects each running job to end.
#[derive(Debug, Clone, Copy)]
enum Ends {
    /// Every job at its p10 end.
    P10,
    /// Every job at its p90 end.
    P90,
    /// Each job at a draw from its own runtime distribution (given its age), drawn with this
    /// seed: see [`DRAWS`].
    Drawn(u64),
}

/// One forward run: when running jobs end, how many windows of recent submissions arrive, and
/// whether its copy plans.
#[derive(Debug, Clone, Copy)]
struct Scenario {
    ends: Ends,
    arrival_windows: u32,
    /// The copy plans (reservations, quota holds), replanning every [`REFRESH_EVERY`]
    /// forecast intervals: see [`BOUNDS`].
    plans: bool,
}

/// The bounds of a job's interval: early (every running job ends at its p10 and nothing new
/// arrives) and late (p90 ends, and twice the last window's submissions). The late run plans:
/// the reservations of jobs that age later hold the cluster back from mid-sized gangs, which
/// a copy that does not plan starts too soon, so they started after their p90 (the README's
/// planner section has the figures). It and the drawn runs plan at most every
/// [`REFRESH_EVERY`] intervals: planning in every run, at every change, made replays many
/// times slower. The early run does not plan: it is the start with nothing in the way.
const BOUNDS: [Scenario; 2] = [
    Scenario {
        ends: Ends::P10,
        arrival_windows: 0,
        plans: false,
    },
    Scenario {
        ends: Ends::P90,
        arrival_windows: 2,
        plans: true,
    },
];

/// Runs with drawn runtimes (and the last window's submissions again) whose median start is a
/// job's p50. A run in which every job ends at its p50 starts the next job too late: the first
/// of many running jobs to end does so well before the first of their p50 ends. Odd, so the
/// median is a run's start; each costs one forward run (`gantry bench schedule` prints the
/// forecast's cost). Their copies plan: one that does not starts a mid-sized gang in room a
/// reservation holds, too soon (the README's planner section has the figures).
const DRAWS: u64 = 5;

/// How many windows of the last window's submissions a drawn run expects: with one, the
/// submissions stop an hour ahead and a job waiting longer is forecast too soon; with more,
/// the runs spend their cycles on expected jobs and reach fewer pending ones (the README's
/// planner section has the figures).
const DRAWN_ARRIVAL_WINDOWS: u32 = 2;

/// A forecast to run away from the loop (see [`super::plan::PlanConfig::forecast_off_loop`]):
/// a copy of the scheduler as it stood when the forecast came due. Running it takes the seven
/// scenarios' time (`gantry bench schedule` prints it) and touches nothing the loop holds.
#[derive(Clone)]
pub struct ForecastRun {
    /// The scheduler as it stood; its clock is when the forecast is of.
    base: Box<Scheduler>,
}

impl ForecastRun {
    /// Runs the forecast's runs; [`Scheduler::install_forecast`] takes what it returns.
    pub fn run(self) -> Forecasts {
        self.base.forecast(self.base.clock_s)
    }

    /// The diagnostic mode: one run handed the true future, stepping by the replay's
    /// `clock`, whose starts are every reached job's p10, p50 and p90. A faithful forecast
    /// starts each job when the replay does; only a simulator can call this.
    pub fn run_known(self, future: &KnownFuture, clock: VirtualClock) -> Forecasts {
        // One draw: each job's p10, p50 and p90 are its one start.
        self.run_known_draws(std::slice::from_ref(future), clock)
    }

    /// The oracle diagnostics: one run per draw of a future (`futures`, each with its own
    /// submissions and runtimes), stepping by the replay's `clock`; a job's p50 is its median
    /// start over them and its p10 and p90 their 10th and 90th percentiles. Fed draws from
    /// what the trace alone could know (its realised submissions, or its arrival process, with
    /// runtimes drawn from its own distribution), its error is about the least an estimate
    /// that does not know the realised runtimes can have. Only a simulator can call this.
    pub fn run_known_draws(self, futures: &[KnownFuture], clock: VirtualClock) -> Forecasts {
        let at_s = self.base.clock_s;
        let mut id_to_starts: BTreeMap<JobId, Vec<f64>> = BTreeMap::new();
        for future in futures {
            let run = self
                .base
                .forward_starts(at_s, Future::Known(future), clock, None);
            for (id, start_s) in run.starts {
                id_to_starts.entry(id).or_default().push(start_s);
            }
        }
        let job_to_forecast: BTreeMap<JobId, Forecast> = id_to_starts
            .into_iter()
            .filter(|(_, starts)| 2 * starts.len() > futures.len())
            .map(|(id, mut starts)| {
                // A run that did not reach the job started it later than any that did.
                starts.resize(futures.len(), f64::INFINITY);
                starts.sort_by(f64::total_cmp);
                let at =
                    |share: f64| starts[((share * (starts.len() - 1) as f64).round()) as usize];
                let p50_s = starts[starts.len() / 2];
                let forecast = Forecast {
                    p10_s: at(0.1),
                    p50_s,
                    p90_s: Some(at(0.9))
                        .filter(|s| s.is_finite())
                        .unwrap_or(p50_s + 2.0 * (p50_s - at_s)),
                };
                (id, forecast)
            })
            .collect();
        Forecasts {
            at_s,
            reach: Reach::of(&self.base, &job_to_forecast, 0.0),
            job_to_forecast,
        }
    }

    /// The baseline the estimates are judged against, as Slurm's `squeue --start` gives it:
    /// when each pending job starts if the jobs known now run for their learned means and
    /// nothing more is submitted. Steps by `clock`, as the replay does, until every job of
    /// `jobs` (pending ones; others are ignored) has started.
    pub fn run_baseline(self, clock: VirtualClock, jobs: &[JobId]) -> BTreeMap<JobId, f64> {
        let at_s = self.base.clock_s;
        self.base
            .forward_starts(at_s, Future::Baseline, clock, Some(jobs))
            .starts
    }
}

/// A what-if to answer away from the loop: the same forecast as the pending jobs' estimates,
/// on a copy of the scheduler with one more job submitted now, so its answer counts quota,
/// borrowing, fair share and every job ahead of it, as its own estimate would once submitted.
/// Made by [`Scheduler::what_if_run`]; [`WhatIfRun::run`] takes the forecast's time.
#[derive(Clone)]
pub struct WhatIfRun {
    /// The copy, with the job submitted.
    base: Box<Scheduler>,
    /// The job's id in the copy.
    id: JobId,
    /// A pending job it was made like, which is tried before it: with that job's estimate
    /// now, no answer is earlier than either.
    like: Option<(JobId, Option<f64>)>,
    /// The plan's answer: where it would go, and the fallback with no forecast.
    timeline: WhatIf,
}

impl WhatIfRun {
    /// The plan's answer alone, without running the forecast: where it would go, and its
    /// runtime.
    pub fn plan_only(&self) -> WhatIf {
        self.timeline.clone()
    }

    /// Runs the forecast and answers: the job's p10, p50 and p90 start as a forecast gives
    /// every pending job's; when the forecast did not reach it, no start, and the latest of how
    /// far the forecast looked, how long the work ahead of it in its queue takes on the
    /// most GPUs the queue may use, and the latest estimate of a job ahead (it would start
    /// no earlier than that). Without a forecast (`--no-forecast`), the
    /// plan's answer. `jobs_ahead` counts every pending job of its queue tried before it.
    pub fn run(self) -> WhatIf {
        let base = &self.base;
        let spec = &base.job_to_entry[&self.id].spec;
        let rank = Rank::of(self.id, spec);
        let ahead: Vec<(JobId, &JobSpec)> = base
            .queue
            .all()
            .into_iter()
            .filter(|&id| id != self.id)
            .map(|id| (id, &base.job_to_entry[&id].spec))
            .filter(|(id, other)| {
                !other.balloon && other.queue == spec.queue && Rank::of(*id, other).ahead_of(&rank)
            })
            .collect();
        let jobs_ahead = ahead.len();
        let mut answer = WhatIf {
            jobs_ahead,
            ..self.timeline
        };
        if !base.plan_config.forecast_every_s.is_finite() || answer.start.is_none() {
            // No forecast, or it would not fit even with every running job gone.
            return answer;
        }
        let at_s = base.clock_s;
        let forecasts = base.forecast(at_s);
        // A job like another is tried after it: never earlier than it, in this run or as it
        // is estimated now.
        let floor_s = self.like.map_or(at_s, |(like, estimate_s)| {
            let in_run = forecasts.job_to_forecast.get(&like).map(|f| f.p50_s);
            [Some(at_s), in_run, estimate_s]
                .into_iter()
                .flatten()
                .fold(f64::NEG_INFINITY, f64::max)
        });
        // Tried after a job that has no start now, in this run or as estimated, it has none
        // either: a start for it would be earlier than that job's.
        let like_unreached = self.like.is_some_and(|(like, estimate_s)| {
            estimate_s.is_none() && !forecasts.job_to_forecast.contains_key(&like)
        });
        let reached = forecasts
            .job_to_forecast
            .get(&self.id)
            .filter(|_| !like_unreached);
        let Some(forecast) = reached else {
            // Not before the forecast's horizon, nor before the work ahead of it in its queue
            // (GPU-seconds by learned runtimes) could run on the most GPUs the queue may use.
            let work_ahead: f64 = ahead.iter().map(|(_, other)| base.work_gpu_s(other)).sum();
            let wait_s = base.unreached_wait_s(spec.queue, work_ahead, forecasts.reach.horizon_s);
            // Nor before the jobs ahead of it as they are estimated now: those estimates
            // come from the last forecast, which may have looked further than this one.
            let ahead_estimated_s = ahead
                .iter()
                .filter_map(|(id, _)| base.start_estimate(*id).map(|e| e.p50_s))
                .fold(floor_s, f64::max);
            answer.start = None;
            answer.beyond_s = Some((at_s + wait_s).max(ahead_estimated_s));
            return answer;
        };
        let p50_s = forecast.p50_s.max(floor_s);
        answer.start = Some(crate::explain::StartEstimate {
            planned_at_s: at_s,
            p10_s: forecast.p10_s.max(at_s).min(p50_s),
            p50_s,
            p90_s: forecast.p90_s.max(p50_s),
            reservation: None,
        });
        answer
    }
}

impl Scheduler {
    /// Whether a forecast is due at `now_s`: the last one is older than the configured
    /// interval and a job was submitted since, or it is [`REFRESH_EVERY`] intervals old.
    fn forecast_due(&self, now_s: f64) -> bool {
        self.forecast_due_at(self.plan.reachable_submitted)
            .is_some_and(|due_s| now_s >= due_s)
    }

    /// When the next forecast comes due (`None`: never, the forecast is off): the configured
    /// interval after the last, if a job it may reach was submitted (`reachable_submitted`),
    /// else [`REFRESH_EVERY`] intervals or half its horizon after it.
    pub(super) fn forecast_due_at(&self, reachable_submitted: bool) -> Option<f64> {
        let every_s = self.plan_config.forecast_every_s;
        match self.plan.forecast_at_s {
            _ if !every_s.is_finite() => None,
            None => Some(f64::NEG_INFINITY),
            // Between refreshes, only a submission it may reach makes one worth its cost (see
            // `Reach`).
            Some(at_s) if reachable_submitted => Some(at_s + every_s),
            Some(at_s) => Some(
                at_s + (REFRESH_EVERY * every_s).max(self.plan.forecasts.reach.horizon_s / 2.0),
            ),
        }
    }

    /// Runs the forecast if it is due, or, off the loop, marks it wanted for
    /// [`Scheduler::forecast_to_run`]. Returns whether it ran here.
    pub(super) fn forecast_if_due(&mut self, now_s: f64) -> bool {
        if !self.forecast_due(now_s) {
            return false;
        }
        self.plan.forecast_at_s = Some(now_s);
        self.plan.reachable_submitted = false;
        if self.plan_config.forecast_off_loop {
            self.plan.forecast_wanted = true;
            false
        } else {
            self.plan.forecasts = self.forecast(now_s);
            true
        }
    }

    /// The forecast that came due off the loop, if one did since the last call: the caller
    /// runs it on a thread of its own and hands the result to
    /// [`Scheduler::install_forecast`]. Costs one copy of the scheduler.
    pub fn forecast_to_run(&mut self) -> Option<ForecastRun> {
        std::mem::take(&mut self.plan.forecast_wanted).then(|| self.forecast_run_now())
    }

    /// A what-if for `spec` (optionally made like the pending job `like`) to run away from
    /// the loop: one copy of the scheduler, with the job submitted now. See [`WhatIfRun`].
    pub fn what_if_run(&self, spec: &JobSpec, like: Option<JobId>) -> WhatIfRun {
        let timeline = self.what_if(spec);
        let like = like.map(|id| (id, self.start_estimate(id).map(|e| e.p50_s)));
        let mut base = Box::new(self.clone());
        let id = base.enqueue(JobSpec {
            submit_s: self.clock_s,
            ..spec.clone()
        });
        WhatIfRun {
            base,
            id,
            like,
            timeline,
        }
    }

    /// A forecast of the scheduler as it stands, due or not (for the bench): one copy of it.
    pub fn forecast_run_now(&self) -> ForecastRun {
        ForecastRun {
            base: Box::new(self.clone()),
        }
    }

    /// Takes a forecast's starts as the estimates of the pending jobs the timeline does not
    /// plan, unless a newer one is already in. Returns whether it was taken.
    pub fn install_forecast(&mut self, forecasts: Forecasts) -> bool {
        if forecasts.at_s < self.plan.forecasts.at_s {
            return false;
        }
        self.plan.forecasts = forecasts;
        self.estimate_from_forecast(self.clock_s);
        true
    }

    /// The forecast from `now_s`: its starts, and how far it reached.
    fn forecast(&self, now_s: f64) -> Forecasts {
        let (job_to_forecast, until_s) = self.forecast_starts(now_s);
        Forecasts {
            at_s: now_s,
            reach: Reach::of(self, &job_to_forecast, until_s - now_s),
            job_to_forecast,
        }
    }

    /// The runs from `now_s`, and each pending job's forecast: its p50 the median of its
    /// starts in the [`DRAWS`] runs, where most of them reached it; its p10 and p90 the
    /// [`BOUNDS`]' starts (the late run not reaching it puts its p90 at twice its expected
    /// wait).
    /// Also returns how far the drawn runs looked ahead (the median of their last steps).
    fn forecast_starts(&self, now_s: f64) -> (BTreeMap<JobId, Forecast>, f64) {
        let [early, late] = BOUNDS.map(|scenario| {
            self.forward_starts(
                now_s,
                Future::Drawn(scenario),
                VirtualClock::at(now_s),
                None,
            )
            .starts
        });
        let drawn: Vec<ForwardRun> = (0..DRAWS)
            .map(|seed| {
                let scenario = Scenario {
                    ends: Ends::Drawn(seed),
                    arrival_windows: DRAWN_ARRIVAL_WINDOWS,
                    plans: true,
                };
                self.forward_starts(
                    now_s,
                    Future::Drawn(scenario),
                    VirtualClock::at(now_s),
                    None,
                )
            })
            .collect();
        let mut untils: Vec<f64> = drawn.iter().map(|run| run.until_s).collect();
        untils.sort_by(f64::total_cmp);
        let until_s = untils[untils.len() / 2];
        let mut reached: BTreeMap<JobId, Vec<f64>> = BTreeMap::new();
        for run in &drawn {
            for (&id, &start_s) in &run.starts {
                reached.entry(id).or_default().push(start_s);
            }
        }
        let job_to_forecast = reached
            .into_iter()
            .filter(|(_, starts)| 2 * starts.len() as u64 > DRAWS)
            .map(|(id, mut starts)| {
                // Runs that did not reach it started it later than any that did.
                starts.sort_by(f64::total_cmp);
                let p50_s = starts[(DRAWS / 2) as usize];
                let p10_s = early.get(&id).map_or(p50_s, |&s| s.min(p50_s));
                let p90_s = late
                    .get(&id)
                    .map_or(p50_s + 2.0 * (p50_s - now_s), |&s| s.max(p50_s));
                (
                    id,
                    Forecast {
                        p10_s,
                        p50_s,
                        p90_s,
                    },
                )
            })
            .collect();
        (job_to_forecast, until_s)
    }

    /// When each pending job (balloons aside) starts in one forward run: a copy of the
    /// scheduler, with the built-in policies and the reservations as they stand, steps the
    /// loop ([`crate::step`]) on a virtual clock, with a [`ForwardWorld`] for its cluster. A
    /// drawn scenario steps at each expected end and submission, at most [`SIMULATED_CYCLES`]
    /// times and within its attempt budget, and its copy plans but in the early bound's run; a
    /// known future and the baseline step by `clock` as the replay does, with the copy
    /// planning as the scheduler does, until every job pending now (or every one of `only`)
    /// has started. A job a run did not reach is absent.
    fn forward_starts(
        &self,
        now_s: f64,
        future: Future<'_>,
        clock: VirtualClock,
        only: Option<&[JobId]>,
    ) -> ForwardRun {
        let pending = |id: &JobId| {
            self.job_to_entry.get(id).is_some_and(|entry| {
                matches!(entry.state, JobState::Pending) && !entry.spec.balloon
            })
        };
        let waiting: BTreeSet<JobId> = match only {
            Some(jobs) => jobs.iter().copied().filter(pending).collect(),
            None => self.queue.all().into_iter().filter(pending).collect(),
        };
        if waiting.is_empty() {
            return ForwardRun {
                starts: BTreeMap::new(),
                until_s: now_s,
            };
        }
        let mut sim = self.clone();
        let drawn = matches!(future, Future::Drawn(_));
        // A drawn copy plans, but for the early bound's (see [`BOUNDS`]), and replans only on
        // its interval: planning at every change costs a replan per change. A copy of the
        // true future plans, as the scheduler
        // it copies does, or it could not start jobs where the scheduler will.
        let plans = match future {
            Future::Drawn(scenario) => scenario.plans,
            Future::Known(_) | Future::Baseline => true,
        };
        sim.plan_config.enabled = plans;
        if drawn && plans {
            sim.plan_config.replan_every_s = sim
                .plan_config
                .replan_every_s
                .max(REFRESH_EVERY * self.plan_config.forecast_every_s);
            sim.plan.drawn_copy = true;
        }
        // Never a forecast inside a forecast.
        sim.plan_config.forecast_every_s = f64::INFINITY;
        // Its decisions are read for whether they placed a job, never shown: ranking the best
        // nodes for an explanation nobody reads is waste.
        sim.config.top_nodes = 0;
        let mut world = ForwardWorld::new(self, future, now_s, waiting);
        let mut hooks = crate::hooks::BuiltinsAt(self.policy_set);
        let (max_cycles, budget) = if drawn {
            let budget = (SIMULATED_NODE_ATTEMPTS / (self.state.len() as u64).max(1))
                .clamp(MIN_SIMULATED_ATTEMPTS, SIMULATED_ATTEMPTS);
            // A deep backlog of jobs not tried yet would spend the whole budget in the first
            // cycle, and the run would look no further ahead than now.
            sim.config.max_attempts = sim
                .config
                .max_attempts
                .min((budget / CYCLE_SHARE_OF_BUDGET).max(1) as usize);
            (SIMULATED_CYCLES, budget)
        } else {
            (usize::MAX, u64::MAX)
        };
        let mut clock = clock;
        for _ in 0..max_cycles {
            let next_change = world.next_change_s();
            let at_s = if drawn {
                let step_s = self.plan_config.forecast_step_s;
                next_change.map(|at_s| at_s.max(sim.clock_s + step_s))
            } else {
                clock.advance(&sim, next_change)
            };
            let Some(at_s) = at_s else {
                break;
            };
            let step = crate::step(&mut sim, &mut world, at_s, &mut |s, _| {
                Some(s.cycle(at_s, &mut hooks))
            });
            clock.stepped(&sim, &step);
            if world.waiting.is_empty() || world.attempts > budget {
                break;
            }
        }
        ForwardRun {
            starts: world.starts,
            until_s: sim.clock_s,
        }
    }
}

/// What one forward run gave: when each job it reached started, and how far it ran.
struct ForwardRun {
    starts: BTreeMap<JobId, f64>,
    /// Its last step (seconds on the scheduler's clock).
    until_s: f64,
}

/// What a forward run is told of the future.
#[derive(Debug, Clone, Copy)]
enum Future<'a> {
    /// A scenario drawn from history: all a live forecast knows.
    Drawn(Scenario),
    /// The true future, which only a simulator knows: the diagnostic mode.
    Known(&'a KnownFuture),
    /// A Slurm `squeue --start`-style plan: the jobs known now, each running for its learned
    /// mean, and nothing new submitted.
    Baseline,
}

/// The true future of a replay, handed to the forecast in the diagnostic mode
/// ([`ForecastRun::run_known`]): a forecast that steps the engine's own loop must then start
/// every job when the replay does. It is never used for an estimate a user is shown.
#[derive(Debug, Clone, Default)]
pub struct KnownFuture {
    /// The jobs still to be submitted, in submission order, each with its true runtime.
    pub submissions: Vec<(JobSpec, f64)>,
    /// The true runtime of each live job (pending, or running: of its current run).
    pub job_to_runtime_s: BTreeMap<JobId, f64>,
    /// The ends the replay booked for runs evicted since: it steps at them all the same, so
    /// the forecast does too.
    pub evicted_ends_s: Vec<f64>,
}

/// The cluster of a forward run: it submits the expected jobs and ends the running ones at
/// their expected ends (the loop's [`crate::ClusterSource`]), and books what each cycle
/// started (its [`crate::Binder`]).
struct ForwardWorld<'a> {
    /// The scheduler as it stood: whose runtime model the expected ends come from.
    base: &'a Scheduler,
    future: Future<'a>,
    /// The submissions still to come, latest first (the next is popped from the end), with
    /// the true runtime when the future is known.
    submissions: Vec<(JobSpec, Option<f64>)>,
    /// The true runtimes, when the future is known, of the jobs submitted so far.
    job_to_runtime_s: BTreeMap<JobId, f64>,
    /// Expected ends: (when, job, when it started), so an end planned for a run the copy
    /// preempted does not end the job's next run.
    ends: BinaryHeap<Reverse<(Seconds, JobId, Seconds)>>,
    /// The jobs pending when the run began that have not started yet.
    waiting: BTreeSet<JobId>,
    /// When each of them started.
    starts: BTreeMap<JobId, f64>,
    /// Jobs tried so far, over all cycles.
    attempts: u64,
}

impl<'a> ForwardWorld<'a> {
    fn new(base: &'a Scheduler, future: Future<'a>, now_s: f64, waiting: BTreeSet<JobId>) -> Self {
        let (mut submissions, job_to_runtime_s) = match future {
            Future::Drawn(scenario) => (
                base.plan
                    .arrivals
                    .expected(now_s, scenario.arrival_windows)
                    .into_iter()
                    .map(|spec| (spec, None))
                    .collect(),
                BTreeMap::new(),
            ),
            Future::Known(known) => (
                known
                    .submissions
                    .iter()
                    .map(|(spec, runtime_s)| (spec.clone(), Some(*runtime_s)))
                    .collect(),
                known.job_to_runtime_s.clone(),
            ),
            Future::Baseline => (Vec::new(), BTreeMap::new()),
        };
        if matches!(future, Future::Known(_)) {
            submissions.reverse();
        }
        let mut world = Self {
            base,
            future,
            submissions,
            job_to_runtime_s,
            ends: BinaryHeap::new(),
            waiting,
            starts: BTreeMap::new(),
            attempts: 0,
        };
        if let Future::Known(known) = future {
            // An end no run matches: a step, and nothing ends.
            world.ends.extend(
                known.evicted_ends_s.iter().map(|&end_s| {
                    Reverse((Seconds(end_s), JobId::MAX, Seconds(f64::NEG_INFINITY)))
                }),
            );
        }
        for &id in &base.running {
            let entry = &base.job_to_entry[&id];
            if let JobState::Running { started_s, .. } = entry.state {
                world.expect_end(id, &entry.spec, started_s, now_s);
            }
        }
        world
    }

    /// Books when the run of `id` started at `started_s` is expected to end, seen at `at_s`:
    /// a balloon only when its runtime is known (it otherwise runs until it gives way).
    fn expect_end(&mut self, id: JobId, spec: &JobSpec, started_s: f64, at_s: f64) {
        let base = self.base;
        let end_s = match self.future {
            Future::Known(_) => match self.job_to_runtime_s.get(&id) {
                Some(runtime_s) => started_s + runtime_s,
                None if spec.balloon => return,
                None => base.expected_end(spec, started_s, at_s).1,
            },
            _ if spec.balloon => return,
            Future::Drawn(scenario) => match scenario.ends {
                Ends::P10 => base.expected_end(spec, started_s, at_s).0,
                Ends::P90 => base.expected_end(spec, started_s, at_s).2,
                Ends::Drawn(seed) => base.end_at(spec, started_s, at_s, draw(seed, id, started_s)),
            },
            Future::Baseline => (started_s + base.plan.runtimes.mean_s(spec)).max(at_s),
        };
        self.ends
            .push(Reverse((Seconds(end_s), id, Seconds(started_s))));
    }

    /// When the next job is expected to be submitted or to end (an end booked for a run
    /// preempted since included: the replay steps at those too).
    fn next_change_s(&self) -> Option<f64> {
        let next_end = self.ends.peek().map(|Reverse((Seconds(at_s), ..))| *at_s);
        let next_submission = self.submissions.last().map(|(spec, _)| spec.submit_s);
        [next_end, next_submission]
            .into_iter()
            .flatten()
            .reduce(f64::min)
    }
}

impl crate::ClusterSource for ForwardWorld<'_> {
    /// Submits the jobs expected by `now_s`, then ends the runs expected to be over, in the
    /// replay's order.
    fn sync(&mut self, scheduler: &mut Scheduler, now_s: f64) -> crate::Changes {
        let mut changes = crate::Changes::default();
        while self
            .submissions
            .last()
            .is_some_and(|(spec, _)| spec.submit_s <= now_s)
        {
            let (spec, runtime_s) = self.submissions.pop().expect("peeked");
            let id = scheduler.submit(spec);
            if let Some(runtime_s) = runtime_s {
                self.job_to_runtime_s.insert(id, runtime_s);
            }
            changes.submitted += 1;
        }
        while let Some(&Reverse((Seconds(end_s), id, Seconds(started)))) = self.ends.peek()
            && end_s <= now_s
        {
            self.ends.pop();
            if runs_since(scheduler, id, started) {
                scheduler.finish(id);
                changes.ended += 1;
            }
        }
        changes
    }
}

impl crate::Binder for ForwardWorld<'_> {
    /// Notes each start, and when the job is expected to end.
    fn bind(
        &mut self,
        scheduler: &Scheduler,
        output: &crate::CycleOutput,
        now_s: f64,
    ) -> Vec<crate::BindOutcome> {
        self.attempts += u64::from(output.attempts);
        let mut outcomes = Vec::new();
        for decision in output.decisions.iter().filter(|d| d.placed) {
            let id = decision.job;
            outcomes.push(crate::BindOutcome::Bound { job: id });
            if !scheduler.is_running(id) {
                continue;
            }
            if self.waiting.remove(&id) {
                self.starts.insert(id, now_s);
            }
            let spec = &scheduler.job_to_entry[&id].spec;
            self.expect_end(id, spec, now_s, now_s);
        }
        outcomes
    }
}

/// Whether job `id` runs the run that started at `started_s`.
fn runs_since(scheduler: &Scheduler, id: JobId, started_s: f64) -> bool {
    scheduler.job_to_entry.get(&id).is_some_and(
        |entry| matches!(entry.state, JobState::Running { started_s: s, .. } if s == started_s),
    )
}

/// A quantile in (0, 1) for one run's draw of one job's end: the same for the same seed, job
/// and start, so a replay gives the same report every time (splitmix64).
fn draw(seed: u64, id: JobId, started_s: f64) -> f64 {
    let mut x = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(id).rotate_left(32))
        ^ started_s.to_bits();
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    // The top 53 bits, centred in their step: never 0 nor 1.
    ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::super::plan::Arrivals;
    use super::*;

    fn spec(submit_s: f64) -> JobSpec {
        JobSpec::one_pod(submit_s)
    }

    #[test]
    fn the_next_window_brings_the_last_windows_submissions_again() {
        let mut arrivals = Arrivals::default();
        for t in [0.0, 100.0, 3000.0, 4000.0] {
            arrivals.record(&spec(t));
        }
        // 0 fell out of the window when 4000 came; at 4000 the window is (400, 4000].
        let once: Vec<f64> = arrivals
            .expected(4000.0, 1)
            .iter()
            .map(|s| s.submit_s)
            .collect();
        assert_eq!(once, vec![7600.0, 6600.0]);
        let twice: Vec<f64> = arrivals
            .expected(4000.0, 2)
            .iter()
            .map(|s| s.submit_s)
            .collect();
        assert_eq!(twice, vec![11_200.0, 10_200.0, 7600.0, 6600.0]);
        assert!(arrivals.expected(4000.0, 0).is_empty());
        let mut balloon = spec(4100.0);
        balloon.balloon = true;
        arrivals.record(&balloon);
        assert_eq!(
            arrivals.expected(4100.0, 1).len(),
            2,
            "a balloon is not expected again"
        );
    }
}
