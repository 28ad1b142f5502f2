//! What the last forecast said, kept with the plan that shows it: each reached job's start,
//! how far it reached, and the submissions the next one expects again. The runs that make a
//! forecast are the forecast module's (`scheduler/forecast.rs`); these are the results and inputs it and the plan
//! share, here so the planner needs nothing from the forecast's runner.

use std::collections::{BTreeMap, VecDeque};

use super::Rank;
use crate::queues::QueueId;
use crate::scheduler::{JobId, JobSpec, Scheduler};

/// How far back submissions are remembered, and how far ahead one copy of them is expected.
pub const ARRIVAL_WINDOW_S: f64 = 3600.0;

/// The jobs submitted in the last [`ARRIVAL_WINDOW_S`] (balloons aside), oldest first: what
/// the forecast expects the next window to bring.
#[derive(Debug, Clone, Default)]
pub(in crate::scheduler) struct Arrivals {
    recent: VecDeque<JobSpec>,
}

impl Arrivals {
    /// A job was submitted (at its `submit_s`); submissions older than the window go.
    /// Returns whether it counts as an arrival.
    pub(in crate::scheduler) fn record(&mut self, spec: &JobSpec) -> bool {
        // A balloon is no demand; a job submitted long ago (a live cluster's relist submits
        // every pending job again) is no arrival.
        let stale = self
            .recent
            .back()
            .is_some_and(|newest| spec.submit_s <= newest.submit_s - ARRIVAL_WINDOW_S);
        if spec.balloon || stale {
            return false;
        }
        while self
            .recent
            .front()
            .is_some_and(|old| old.submit_s <= spec.submit_s - ARRIVAL_WINDOW_S)
        {
            self.recent.pop_front();
        }
        self.recent.push_back(spec.clone());
        true
    }

    /// The submissions expected after `now_s`: each of the last window's, `windows` times,
    /// one window apart, latest first (so the next is popped from the end).
    pub(in crate::scheduler) fn expected(&self, now_s: f64, windows: u32) -> Vec<JobSpec> {
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
pub(in crate::scheduler) struct Forecast {
    pub(in crate::scheduler) p10_s: f64,
    pub(in crate::scheduler) p50_s: f64,
    pub(in crate::scheduler) p90_s: f64,
}

/// One forecast's starts: each pending job it reached, and when the forecast was of (a job's
/// estimate says it was planned then).
#[derive(Debug, Clone, Default)]
pub struct Forecasts {
    pub(in crate::scheduler) at_s: f64,
    /// Per pending job it reached, its p10, p50 and p90 start.
    pub(in crate::scheduler) job_to_forecast: BTreeMap<JobId, Forecast>,
    /// How far it reached: when the next one is worth its cost.
    pub(in crate::scheduler) reach: Reach,
}

/// How far a forecast reached, which says when the next one is worth its cost. Its runs are
/// bounded, so with a long backlog they reach only the first jobs of each queue, and a job
/// submitted behind one they did not reach is reached only if it can pass it, as smaller jobs
/// reached behind it did: a submission that can do neither changes no estimate the next
/// forecast can give, so it makes none due. And its estimates go stale as the cluster moves
/// past them, so with no new submission the next is due once half of how far it looked ahead
/// has passed, or the forecast's refresh interval (`REFRESH_EVERY` intervals), whichever is later. Without this, a replay of a deep
/// backlog ran a full forecast for every submission and every ten minutes for as long as the
/// backlog lasted (`alibaba-openb-128` at `--time-scale 4` did not finish in 25 minutes).
#[derive(Debug, Clone, Default)]
pub(in crate::scheduler) struct Reach {
    /// Per queue it did not reach whole: its first pending job (in the order cycles try them)
    /// the forecast did not reach, and the most GPUs any job it reached behind that one asks.
    queue_to_frontier: BTreeMap<QueueId, (Rank, Option<u64>)>,
    /// How far ahead its drawn runs looked: the median of their last steps, from when the
    /// forecast was of.
    pub(in crate::scheduler) horizon_s: f64,
    /// The first job id its scheduler had not yet given: every job from it on was submitted
    /// after the forecast (a submission at the same clock second may be either side).
    pub(in crate::scheduler) first_unseen: JobId,
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

    /// How far ahead its drawn runs looked (seconds): the median of their last steps.
    pub fn horizon_s(&self) -> f64 {
        self.reach.horizon_s
    }
}

impl Reach {
    /// How far the forecast of `base` that gave `job_to_forecast` and looked `horizon_s`
    /// ahead reached.
    pub(in crate::scheduler) fn of(
        base: &Scheduler,
        job_to_forecast: &BTreeMap<JobId, Forecast>,
        horizon_s: f64,
    ) -> Self {
        let pending: Vec<(JobId, &JobSpec)> = base
            .queue
            .all()
            .into_iter()
            .map(|id| (id, &base.job_to_entry[&id].spec))
            .filter(|(_, spec)| !spec.balloon)
            .collect();
        let mut queue_to_frontier: BTreeMap<QueueId, (Rank, Option<u64>)> = BTreeMap::new();
        for &(id, spec) in pending
            .iter()
            .filter(|(id, _)| !job_to_forecast.contains_key(id))
        {
            let rank = Rank::of(id, spec);
            queue_to_frontier
                .entry(spec.queue)
                .and_modify(|(first, _)| {
                    if rank.ahead_of(first) {
                        *first = rank;
                    }
                })
                .or_insert((rank, None));
        }
        for &(id, spec) in pending
            .iter()
            .filter(|(id, _)| job_to_forecast.contains_key(id))
        {
            if let Some((first, passed)) = queue_to_frontier.get_mut(&spec.queue)
                && first.ahead_of(&Rank::of(id, spec))
            {
                *passed = (*passed).max(Some(spec.total().gpus));
            }
        }
        Self {
            queue_to_frontier,
            horizon_s,
            first_unseen: base.next_id,
        }
    }

    /// Whether a job of `spec` and `rank` may be reached by the next forecast: it is tried
    /// before the first job of its queue this one did not reach, or it asks no more GPUs than
    /// a job this one reached behind that one.
    pub(in crate::scheduler) fn may_reach(&self, spec: &JobSpec, rank: &Rank) -> bool {
        self.queue_to_frontier
            .get(&spec.queue)
            .is_none_or(|(first, passed)| {
                rank.ahead_of(first) || passed.is_some_and(|gpus| spec.total().gpus <= gpus)
            })
    }
}
