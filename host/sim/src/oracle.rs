//! The oracle diagnostics of `gantry simulate --known-future`: what the forecast is handed in
//! place of what a live scheduler knows, to measure the forecast and the estimate lines.
//!
//! - [`KnownFutureMode`]: the exact future (every estimate must be the replay's own start),
//!   the realised submissions with drawn runtimes, the trace's arrival process with drawn
//!   runtimes, or that process as the history so far shows it.
//! - [`Oracle`]: draws those futures from the trace itself, [`ORACLE_DRAWS`] per forecast
//!   unless told otherwise, seeded so that a replay is reproducible.
//!
//! A forecast fed the realised submissions, or the process that made them, and runtimes from
//! the trace's own durations knows more than any live scheduler can: only the runtimes each
//! job will really have are hidden. Its median over the draws is the start that minimises a
//! job's expected absolute error given that knowledge, so its error is about the least any
//! estimate that does not know the runtimes can have. The `history` mode knows only what a
//! live scheduler does (the submissions and the ends so far), but runs the engine exactly as
//! the replay does, with no budget: what the forecast could reach at many times its cost.

use std::collections::BTreeMap;

use gantry_core::scheduler::{JobId, JobSpec, KnownFuture};

use crate::trace::TraceJob;

/// What the diagnostic forecast is told of the future (`--known-future MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KnownFutureMode {
    /// The trace's submissions to come and every job's true runtime: a faithful forecast
    /// starts every job when the replay does.
    Exact,
    /// The trace's submissions to come, with runtimes drawn from the trace's durations
    /// (a running job's given how long it has run).
    Arrivals,
    /// As many submissions as the trace has left, at its mean rate, each a job of the trace
    /// picked at random, with runtimes drawn as for `Arrivals`: the process that made the
    /// trace, not its realisation.
    Process,
    /// What a live scheduler knows, drawn as `Process` draws the trace's: submissions at the
    /// rate seen so far, each a job already submitted picked at random, for
    /// [`HISTORY_HORIZON_S`] (how many more come is unknown); every runtime drawn from the jobs
    /// that have ended.
    History,
}

/// How far ahead the `history` mode draws submissions: a day, as no live scheduler knows when
/// its users stop submitting.
pub const HISTORY_HORIZON_S: f64 = 86_400.0;

/// A runtime drawn in the `history` mode before any job has ended (an hour, the runtime
/// model's own prior).
const NO_HISTORY_RUNTIME_S: f64 = 3_600.0;

impl std::str::FromStr for KnownFutureMode {
    type Err = String;

    /// `exact`, `arrivals` or `process`, as `--known-future` takes them.
    fn from_str(name: &str) -> Result<Self, String> {
        match name {
            "exact" => Ok(Self::Exact),
            "arrivals" => Ok(Self::Arrivals),
            "process" => Ok(Self::Process),
            "history" => Ok(Self::History),
            other => Err(format!(
                "unknown future {other:?}: exact, arrivals, process or history"
            )),
        }
    }
}

impl KnownFutureMode {
    /// How the report names it (`estimates.future`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Exact => "known",
            Self::Arrivals => "known-arrivals",
            Self::Process => "trace-process",
            Self::History => "history-process",
        }
    }
}

/// Futures drawn per forecast in the `Arrivals`, `Process` and `History` modes unless
/// `ReplayOptions::oracle_draws` says otherwise: each costs one forward run to the last
/// pending job's start, so the mode is a diagnostic, not a default.
pub const ORACLE_DRAWS: usize = 9;

/// Draws futures from the trace: its durations, its jobs and its arrival rate.
pub(crate) struct Oracle {
    mode: KnownFutureMode,
    /// Every job of the trace, to pick submissions from (`Process`).
    jobs: Vec<TraceJob>,
    /// The durations runtimes are drawn from, ascending: every one of the trace's, or in the
    /// `History` mode only those of the jobs that have ended ([`Oracle::ended`]).
    durations_s: Vec<f64>,
    /// Submissions per second over the trace.
    rate: f64,
    /// In the `History` mode, the runtime distribution the ended runs and the running ones'
    /// ages give (Kaplan–Meier), made again at each forecast: the ended runs alone are the
    /// short ones, since the long ones are still running.
    survival: Option<Survival>,
    /// Futures per forecast: more draws make each median start closer to the one that
    /// minimises the job's expected error, at one forward run each.
    draws: usize,
    /// The generator's state (splitmix64).
    state: u64,
}

impl Oracle {
    /// The oracle of `jobs` (the whole trace, in submit order) for `mode` (not `Exact`, which
    /// needs none), drawing `draws` futures per forecast (at least one), seeded with `seed`.
    pub(crate) fn new(mode: KnownFutureMode, jobs: &[TraceJob], draws: usize, seed: u64) -> Self {
        let mut durations_s: Vec<f64> = match mode {
            KnownFutureMode::History => Vec::new(),
            _ => jobs.iter().map(|j| j.duration_s).collect(),
        };
        durations_s.sort_by(f64::total_cmp);
        let span_s = match (jobs.first(), jobs.last()) {
            (Some(first), Some(last)) => last.submit_s - first.submit_s,
            _ => 0.0,
        };
        Self {
            mode,
            jobs: jobs.to_vec(),
            durations_s,
            rate: jobs.len() as f64 / span_s.max(1.0),
            draws: draws.max(1),
            survival: None,
            state: seed ^ 0x6A09_E667_F3BC_C908,
        }
    }

    /// Learns that a job that ran for `duration_s` has ended: the `History` mode draws
    /// runtimes from those.
    pub(crate) fn ended(&mut self, duration_s: f64) {
        if self.mode == KnownFutureMode::History {
            let at = self.durations_s.partition_point(|&d| d < duration_s);
            self.durations_s.insert(at, duration_s);
        }
    }

    /// A number in (0, 1).
    fn uniform(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut x = self.state;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 31;
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// A runtime for a run that has lasted `elapsed_s`: one of the trace's durations longer
    /// than that, at random (the longest, if none is).
    fn runtime_s(&mut self, elapsed_s: f64) -> f64 {
        if self.survival.is_some() {
            let u = self.uniform();
            if let Some(survival) = &self.survival {
                return survival.draw_s(elapsed_s, u);
            }
        }
        let Some(last) = self.durations_s.len().checked_sub(1) else {
            return elapsed_s.max(NO_HISTORY_RUNTIME_S);
        };
        let from = self
            .durations_s
            .partition_point(|&d| d <= elapsed_s)
            .min(last);
        let u = self.uniform();
        let pick = from + ((u * (last + 1 - from) as f64) as usize).min(last - from);
        self.durations_s[pick].max(elapsed_s)
    }

    /// `draws` futures in place of `exact` (the true one) at `now_s`: `elapsed_s`
    /// says how long each live job's current run has lasted (`None`: pending), and `spec_of`
    /// turns a trace job into the scheduler's spec.
    pub(crate) fn futures(
        &mut self,
        exact: &KnownFuture,
        id_to_elapsed_s: &BTreeMap<JobId, Option<f64>>,
        now_s: f64,
        spec_of: impl Fn(&TraceJob) -> JobSpec,
    ) -> Vec<KnownFuture> {
        if self.mode == KnownFutureMode::History && !self.durations_s.is_empty() {
            let mut running_s: Vec<f64> = id_to_elapsed_s.values().flatten().copied().collect();
            running_s.sort_by(f64::total_cmp);
            self.survival = Some(Survival::of(&self.durations_s, &running_s));
        }
        (0..self.draws)
            .map(|_| {
                let job_to_runtime_s = exact
                    .job_to_runtime_s
                    .keys()
                    .map(|&id| {
                        let elapsed_s = id_to_elapsed_s.get(&id).copied().flatten();
                        (id, self.runtime_s(elapsed_s.unwrap_or(0.0)))
                    })
                    .collect();
                let submissions = match self.mode {
                    KnownFutureMode::Exact => exact.submissions.clone(),
                    KnownFutureMode::Arrivals => exact
                        .submissions
                        .iter()
                        .map(|(spec, _)| (spec.clone(), self.runtime_s(0.0)))
                        .collect(),
                    KnownFutureMode::History => self.history_submissions(now_s, &spec_of),
                    KnownFutureMode::Process => {
                        let mut at_s = now_s;
                        (0..exact.submissions.len())
                            .map(|_| {
                                at_s += -self.uniform().ln() / self.rate;
                                let pick = ((self.uniform() * self.jobs.len() as f64) as usize)
                                    .min(self.jobs.len() - 1);
                                let job = TraceJob {
                                    submit_s: at_s,
                                    ..self.jobs[pick].clone()
                                };
                                (spec_of(&job), self.runtime_s(0.0))
                            })
                            .collect()
                    }
                };
                KnownFuture {
                    submissions,
                    job_to_runtime_s,
                    evicted_ends_s: exact.evicted_ends_s.clone(),
                }
            })
            .collect()
    }
}

impl Oracle {
    /// The `History` mode's submissions from `now_s`: at the rate of the submissions so far,
    /// each one of them at random, for [`HISTORY_HORIZON_S`].
    fn history_submissions(
        &mut self,
        now_s: f64,
        spec_of: &impl Fn(&TraceJob) -> JobSpec,
    ) -> Vec<(JobSpec, f64)> {
        let seen = self.jobs.partition_point(|j| j.submit_s <= now_s);
        let Some(first) = self.jobs.first().filter(|_| seen > 0) else {
            return Vec::new();
        };
        let rate = seen as f64 / (now_s - first.submit_s).max(1.0);
        let mut submissions = Vec::new();
        let mut at_s = now_s - self.uniform().ln() / rate;
        while at_s <= now_s + HISTORY_HORIZON_S {
            let pick = ((self.uniform() * seen as f64) as usize).min(seen - 1);
            let job = TraceJob {
                submit_s: at_s,
                ..self.jobs[pick].clone()
            };
            submissions.push((spec_of(&job), self.runtime_s(0.0)));
            at_s -= self.uniform().ln() / rate;
        }
        submissions
    }
}

/// A Kaplan–Meier estimate of the runtime distribution: ended runs are its events, running
/// ones are censored at their ages, so it is not biased to the short runs that ended first.
struct Survival {
    /// The distinct ended runtimes, ascending.
    event_s: Vec<f64>,
    /// The share of runs that last longer than each of them.
    survival: Vec<f64>,
    /// The longest runtime or age seen: where a draw past the last event lands.
    last_s: f64,
}

impl Survival {
    /// From the ended runtimes and the running ages, each ascending.
    fn of(ended_s: &[f64], running_s: &[f64]) -> Self {
        let at_risk = |sorted: &[f64], t: f64| sorted.len() - sorted.partition_point(|&x| x < t);
        let (mut event_s, mut survival) = (Vec::new(), Vec::new());
        let mut s = 1.0;
        let mut i = 0;
        while i < ended_s.len() {
            let t = ended_s[i];
            let ended = ended_s[i..].partition_point(|&x| x <= t);
            let n = at_risk(ended_s, t) + at_risk(running_s, t);
            s *= 1.0 - ended as f64 / n as f64;
            event_s.push(t);
            survival.push(s);
            i += ended;
        }
        let last_s = ended_s.iter().chain(running_s).copied().fold(0.0, f64::max);
        Self {
            event_s,
            survival,
            last_s,
        }
    }

    /// A runtime for a run that has lasted `elapsed_s`, at quantile `u` of what is left: the
    /// first ended runtime past its age whose survival falls to `u` of the survival at its age.
    fn draw_s(&self, elapsed_s: f64, u: f64) -> f64 {
        let from = self.event_s.partition_point(|&t| t <= elapsed_s);
        let at_age = from.checked_sub(1).map_or(1.0, |i| self.survival[i]);
        let target = at_age * u;
        (from..self.event_s.len())
            .find(|&i| self.survival[i] <= target)
            .map_or(self.last_s.max(elapsed_s), |i| self.event_s[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(submit_s: f64, duration_s: f64) -> TraceJob {
        TraceJob {
            job_id: format!("j{submit_s}"),
            submit_s,
            duration_s,
            pods: 1,
            gpus_per_pod: 1,
            queue: "q".into(),
            priority: 0,
            gpu_milli: None,
            gpu_type: None,
            cpu_milli: None,
            memory_mib: None,
            expected_runtime_s: None,
            checkpoint_s: None,
            line: 0,
        }
    }

    #[test]
    fn the_runs_still_going_keep_the_runtime_distribution_from_favouring_short_ones() {
        // Two runs ended at 100 s; two run on past 1,000 s. The ended ones alone say every
        // run takes 100 s; with the running ones censored, half last past 100 s.
        let survival = Survival::of(&[100.0, 100.0], &[1_000.0, 1_200.0]);
        assert_eq!(survival.survival, [0.5]);
        assert_eq!(survival.draw_s(0.0, 0.6), 100.0);
        // Past the last ended runtime: the longest seen.
        assert_eq!(survival.draw_s(0.0, 0.4), 1_200.0);
        assert_eq!(survival.draw_s(1_300.0, 0.4), 1_300.0);
    }

    #[test]
    fn a_running_job_is_drawn_a_runtime_longer_than_it_has_run() {
        let jobs: Vec<TraceJob> = (0..10)
            .map(|i| job(f64::from(i), 100.0 * f64::from(i + 1)))
            .collect();
        let mut oracle = Oracle::new(KnownFutureMode::Arrivals, &jobs, ORACLE_DRAWS, 1);
        for _ in 0..200 {
            let r = oracle.runtime_s(450.0);
            assert!((500.0..=1000.0).contains(&r), "{r}");
        }
        // Run past the longest: it ends no earlier than now.
        assert_eq!(oracle.runtime_s(5000.0), 5000.0);
        let drawn: std::collections::BTreeSet<u64> =
            (0..200).map(|_| oracle.runtime_s(0.0) as u64).collect();
        assert_eq!(drawn.len(), 10, "every duration is drawn: {drawn:?}");
    }
}
