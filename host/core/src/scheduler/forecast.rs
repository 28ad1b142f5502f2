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
//! - [`Arrivals`]: the jobs submitted in the last [`ARRIVAL_WINDOW_S`]. A copy of them, one
//!   window later, is what the forecast expects to be submitted next: later jobs of a queue
//!   below its fair share overtake, and a forecast without them is far too early.
//! - [`DRAWS`] runs in which each running job ends at a draw from what is left of its
//!   runtime, and the last window's submissions come again: a job's p50 start is its median
//!   start over them. [`BOUNDS`]: two more runs, early (every running job ends at its p10,
//!   nothing new arrives) and late (p90 ends, twice those submissions), whose starts are its
//!   p10 and p90.
//! - [`Scheduler::forecast_if_due`]: runs them at most every
//!   [`super::plan::PlanConfig::forecast_every_s`] when a job was submitted since the last
//!   one, else every [`REFRESH_EVERY`] intervals; bounded in cycles and attempts.
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
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};

use crate::model::Seconds;

use super::{JobId, JobSpec, JobState, Scheduler};

/// How far back submissions are remembered, and how far ahead one copy of them is expected.
pub const ARRIVAL_WINDOW_S: f64 = 3600.0;
/// Most cycles one scenario runs (one per expected end or expected submission).
const SIMULATED_CYCLES: usize = 256;
/// Most jobs one scenario tries, over all its cycles. A job no scenario reached has no
/// forecast.
const SIMULATED_ATTEMPTS: u64 = 1024;
/// Most attempts × nodes one scenario spends: an attempt costs about one filter and score
/// pass over the nodes, so a big cluster gets fewer attempts and a forecast costs about the
/// same everywhere (`gantry bench schedule` prints it at 7,500 nodes).
const SIMULATED_NODE_ATTEMPTS: u64 = 1 << 21;
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

/// One forward run: when running jobs end, and how many windows of recent submissions arrive.
#[derive(Debug, Clone, Copy)]
struct Scenario {
    ends: Ends,
    arrival_windows: u32,
}

/// The bounds of a job's interval: early (every running job ends at its p10 and nothing new
/// arrives) and late (p90 ends, and twice the last window's submissions).
const BOUNDS: [Scenario; 2] = [
    Scenario {
        ends: Ends::P10,
        arrival_windows: 0,
    },
    Scenario {
        ends: Ends::P90,
        arrival_windows: 2,
    },
];

/// Runs with drawn runtimes (and the last window's submissions again) whose median start is a
/// job's p50. A run in which every job ends at its p50 starts the next job too late: the first
/// of many running jobs to end does so well before the first of their p50 ends. Odd, so the
/// median is a run's start; each costs one forward run (`gantry bench schedule` prints the
/// forecast's cost).
const DRAWS: u64 = 5;

/// The jobs submitted in the last [`ARRIVAL_WINDOW_S`] (balloons aside), oldest first: what
/// the forecast expects the next window to bring.
#[derive(Debug, Clone, Default)]
pub(super) struct Arrivals {
    recent: VecDeque<JobSpec>,
}

impl Arrivals {
    /// A job was submitted (at its `submit_s`); submissions older than the window go.
    pub(super) fn record(&mut self, spec: &JobSpec) {
        // A balloon is no demand; a job submitted long ago (a live cluster's relist submits
        // every pending job again) is no arrival.
        let stale = self
            .recent
            .back()
            .is_some_and(|newest| spec.submit_s <= newest.submit_s - ARRIVAL_WINDOW_S);
        if spec.balloon || stale {
            return;
        }
        while self
            .recent
            .front()
            .is_some_and(|old| old.submit_s <= spec.submit_s - ARRIVAL_WINDOW_S)
        {
            self.recent.pop_front();
        }
        self.recent.push_back(spec.clone());
    }

    /// When the latest job was submitted.
    fn latest_s(&self) -> Option<f64> {
        self.recent.back().map(|spec| spec.submit_s)
    }

    /// The submissions expected after `now_s`: each of the last window's, `windows` times,
    /// one window apart, latest first (so the next is popped from the end).
    fn expected(&self, now_s: f64, windows: u32) -> Vec<JobSpec> {
        let mut expected: Vec<JobSpec> = (1..=windows)
            .flat_map(|k| {
                self.recent
                    .iter()
                    .filter(move |spec| spec.submit_s > now_s - ARRIVAL_WINDOW_S)
                    .map(move |spec| JobSpec {
                        submit_s: spec.submit_s + ARRIVAL_WINDOW_S * f64::from(k),
                        ..spec.clone()
                    })
            })
            .filter(|spec| spec.submit_s > now_s)
            .collect();
        expected.sort_by(|a, b| b.submit_s.total_cmp(&a.submit_s));
        expected
    }
}

/// A pending job's forecast start (seconds on the scheduler's clock).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Forecast {
    pub(super) p10_s: f64,
    pub(super) p50_s: f64,
    pub(super) p90_s: f64,
}

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
        let at_s = self.base.clock_s;
        Forecasts {
            at_s,
            job_to_forecast: self.base.forecast_starts(at_s),
        }
    }
}

/// One forecast's starts: each pending job it reached, and when the forecast was of (a job's
/// estimate says it was planned then).
#[derive(Debug, Clone, Default)]
pub struct Forecasts {
    pub(super) at_s: f64,
    /// Per pending job it reached, its p10, p50 and p90 start.
    pub(super) job_to_forecast: BTreeMap<JobId, Forecast>,
}

impl Forecasts {
    /// How many pending jobs it reached.
    pub fn len(&self) -> usize {
        self.job_to_forecast.len()
    }

    /// Whether it reached none.
    pub fn is_empty(&self) -> bool {
        self.job_to_forecast.is_empty()
    }
}

impl Scheduler {
    /// Whether a forecast is due at `now_s`: the last one is older than the configured
    /// interval and a job was submitted since, or it is [`REFRESH_EVERY`] intervals old.
    fn forecast_due(&self, now_s: f64) -> bool {
        let every_s = self.plan_config.forecast_every_s;
        match self.plan.forecast_at_s {
            _ if !every_s.is_finite() => false,
            None => true,
            // Between refreshes, only a new submission makes one worth its cost.
            Some(at_s) => {
                now_s - at_s >= every_s
                    && (now_s - at_s >= REFRESH_EVERY * every_s
                        || self.plan.arrivals.latest_s().is_some_and(|s| s > at_s))
            }
        }
    }

    /// Runs the forecast if it is due, or, off the loop, marks it wanted for
    /// [`Scheduler::forecast_to_run`]. Returns whether it ran here.
    pub(super) fn forecast_if_due(&mut self, now_s: f64) -> bool {
        if !self.forecast_due(now_s) {
            return false;
        }
        self.plan.forecast_at_s = Some(now_s);
        if self.plan_config.forecast_off_loop {
            self.plan.forecast_wanted = true;
            false
        } else {
            self.plan.forecasts = Forecasts {
                at_s: now_s,
                job_to_forecast: self.forecast_starts(now_s),
            };
            true
        }
    }

    /// The forecast that came due off the loop, if one did since the last call: the caller
    /// runs it on a thread of its own and hands the result to
    /// [`Scheduler::install_forecast`]. Costs one copy of the scheduler.
    pub fn forecast_to_run(&mut self) -> Option<ForecastRun> {
        std::mem::take(&mut self.plan.forecast_wanted).then(|| self.forecast_run_now())
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

    /// The runs from `now_s`, and each pending job's forecast: its p50 the median of its
    /// starts in the [`DRAWS`] runs, where most of them reached it; its p10 and p90 the
    /// [`BOUNDS`]' starts (the late run not reaching it puts its p90 at twice its expected
    /// wait).
    fn forecast_starts(&self, now_s: f64) -> BTreeMap<JobId, Forecast> {
        let [early, late] = BOUNDS.map(|scenario| self.simulate_starts(now_s, scenario));
        let drawn: Vec<BTreeMap<JobId, f64>> = (0..DRAWS)
            .map(|seed| {
                let scenario = Scenario {
                    ends: Ends::Drawn(seed),
                    arrival_windows: 1,
                };
                self.simulate_starts(now_s, scenario)
            })
            .collect();
        let mut reached: BTreeMap<JobId, Vec<f64>> = BTreeMap::new();
        for starts in &drawn {
            for (&id, &start_s) in starts {
                reached.entry(id).or_default().push(start_s);
            }
        }
        reached
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
            .collect()
    }

    /// When each pending job (balloons aside) starts in one scenario: a copy of the
    /// scheduler, with the built-in policies and the reservations as they stand, runs a cycle
    /// at each expected end and each expected submission, as the live loop would. A job it
    /// did not reach within [`SIMULATED_CYCLES`] and its attempt budget is absent.
    fn simulate_starts(&self, now_s: f64, scenario: Scenario) -> BTreeMap<JobId, f64> {
        let mut waiting: BTreeSet<JobId> = self
            .queue
            .all()
            .into_iter()
            .filter(|id| !self.job_to_entry[id].spec.balloon)
            .collect();
        let mut starts = BTreeMap::new();
        if waiting.is_empty() {
            return starts;
        }
        let mut sim = self.clone();
        // A copy that does not plan learns nothing: its ends are guesses, not runtimes, and
        // its starts are not waits to calibrate by.
        sim.plan_config.enabled = false;
        // Its decisions are read for whether they placed a job, never shown: ranking the best
        // nodes for an explanation nobody reads is waste.
        sim.config.top_nodes = 0;
        let end_of = |id: JobId, spec: &JobSpec, started_s: f64, at_s: f64| match scenario.ends {
            Ends::P10 => self.expected_end(spec, started_s, at_s).0,
            Ends::P90 => self.expected_end(spec, started_s, at_s).2,
            Ends::Drawn(seed) => self.end_at(spec, started_s, at_s, draw(seed, id, started_s)),
        };
        // Expected ends: (when, job, when it started), so an end planned for a run the
        // simulation preempted does not end the job's next run.
        let mut ends: BinaryHeap<Reverse<(Seconds, JobId, Seconds)>> = BinaryHeap::new();
        for &id in &self.running {
            let entry = &self.job_to_entry[&id];
            if let JobState::Running { started_s, .. } = entry.state
                && !entry.spec.balloon
            {
                let end = end_of(id, &entry.spec, started_s, now_s);
                ends.push(Reverse((Seconds(end), id, Seconds(started_s))));
            }
        }
        let mut submissions = self.plan.arrivals.expected(now_s, scenario.arrival_windows);
        let mut hooks = crate::hooks::BuiltinOnly;
        let mut attempts = 0u64;
        let budget = (SIMULATED_NODE_ATTEMPTS / (self.state.len() as u64).max(1))
            .clamp(MIN_SIMULATED_ATTEMPTS, SIMULATED_ATTEMPTS);
        for _ in 0..SIMULATED_CYCLES {
            let next_end = ends.peek().map(|Reverse((Seconds(at_s), ..))| *at_s);
            let next_submission = submissions.last().map(|spec| spec.submit_s);
            let Some(at_s) = [next_end, next_submission]
                .into_iter()
                .flatten()
                .reduce(f64::min)
            else {
                break;
            };
            sim.advance_clock(at_s);
            while let Some(&Reverse((Seconds(end_s), id, Seconds(started)))) = ends.peek()
                && end_s <= at_s
            {
                ends.pop();
                let runs_that = sim.job_to_entry.get(&id).is_some_and(|entry| {
                    matches!(entry.state, JobState::Running { started_s, .. } if started_s == started)
                });
                if runs_that {
                    sim.finish(id);
                }
            }
            while submissions.last().is_some_and(|spec| spec.submit_s <= at_s) {
                sim.submit(submissions.pop().expect("peeked"));
            }
            let out = sim.cycle(at_s, &mut hooks);
            attempts += u64::from(out.attempts);
            for decision in out.decisions.iter().filter(|d| d.placed) {
                if waiting.remove(&decision.job) {
                    starts.insert(decision.job, at_s);
                }
                let spec = &sim.job_to_entry[&decision.job].spec;
                if !spec.balloon {
                    let end = end_of(decision.job, spec, at_s, at_s);
                    ends.push(Reverse((Seconds(end), decision.job, Seconds(at_s))));
                }
            }
            if waiting.is_empty() || attempts > budget {
                break;
            }
        }
        starts
    }
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
