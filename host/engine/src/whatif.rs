//! "What if": when would a job of this shape start, asked without submitting it. The API hands
//! the question to the loop, which copies the scheduler with the job submitted between cycles
//! ([`Scheduler::what_if_run`]); the copy's forecast, the same one the pending jobs' estimates
//! come from, runs on a thread of its own; and the words an estimate is shown in.

use gantry_contract::wall_ms;
pub use gantry_contract::{
    EstimateView, WhatIfAnswer, WhatIfJob, WhatIfOutcome, WhatIfShape, duration_text, estimate_text,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gantry_core::{JobId, JobSpec, PodShape, Scheduler, TopologyPref, WhatIf, WhatIfRun};

use crate::now_ms;

/// Most pods a what-if job may have: beyond any cluster, and cheap to refuse.
const MAX_PODS: u32 = 100_000;
/// Most GPUs per pod a what-if job may ask for.
const MAX_GPUS_PER_POD: u32 = 64;
/// How long the API waits for the answer: the loop's cycle, the job's own forecast and a
/// forecast per variation, on a machine that may be busy with the loop itself.
const ANSWER_WITHIN: Duration = Duration::from_secs(20);
/// By when, counted from the question, the variations' forecasts must be done: one starts only
/// if the slowest forecast so far would end by then, and the rest are listed unanswered, so the
/// answer comes within [`ANSWER_WITHIN`] however slow the forecasts are.
const VARIATIONS_WITHIN: Duration = Duration::from_secs(12);
/// Most what-ifs answered at once (each on a thread of its own, a forecast per variation):
/// more are refused, so questions cannot pile up threads.
const MAX_RUNNING: usize = 2;

/// Why a what-if was not answered.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WhatIfError {
    /// A field of the question is wrong; the text names it.
    #[error("{0}")]
    BadField(String),
    /// The loop did not answer in time (it is stopped, or stuck in a long cycle).
    #[error("the scheduling loop did not answer within {} s", ANSWER_WITHIN.as_secs())]
    NoAnswer,
    /// As many what-ifs as are answered at once are being answered.
    #[error("{MAX_RUNNING} what-ifs are being answered already: ask again in a few seconds")]
    Busy,
}

/// A question waiting for the loop, and where its answer goes.
struct WhatIfAsk {
    job: WhatIfJob,
    /// When it was asked: the variations' deadline counts from here.
    asked: Instant,
    reply: tokio::sync::oneshot::Sender<Result<WhatIfAnswer, WhatIfError>>,
}

/// Where what-if questions wait for the loop, and how many are being answered: the API asks
/// here, and the loop takes the questions between cycles.
#[derive(Default)]
pub struct WhatIfDesk {
    /// The questions waiting for the loop; held only to push or take them.
    asks: std::sync::Mutex<Vec<WhatIfAsk>>,
    /// What-ifs whose forecasts run on threads of their own now: a bound, so questions cannot
    /// pile up threads (each answer costs a forecast per variation).
    running: Arc<AtomicUsize>,
}

impl WhatIfDesk {
    /// Asks when a job of `job`'s shape would start, and calls `wake` so the loop takes the
    /// question; waits at most [`ANSWER_WITHIN`] for the answer.
    pub async fn ask(
        &self,
        job: WhatIfJob,
        wake: impl FnOnce(),
    ) -> Result<WhatIfAnswer, WhatIfError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.asks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(WhatIfAsk {
                job,
                asked: Instant::now(),
                reply,
            });
        wake();
        match tokio::time::timeout(ANSWER_WITHIN, answer).await {
            Ok(Ok(answer)) => answer,
            _ => Err(WhatIfError::NoAnswer),
        }
    }

    /// Takes the questions waiting: each gets its copies of `scheduler` here (the loop calls
    /// this between cycles) and its answer from their forecasts on a thread of its own.
    pub fn answer_waiting(&self, scheduler: &Scheduler) {
        let asks = std::mem::take(&mut *self.asks.lock().unwrap_or_else(|e| e.into_inner()));
        for ask in asks {
            let _span = tracing::debug_span!("what_if").entered();
            let runs = match runs(scheduler, &ask.job) {
                Ok(runs) => runs,
                Err(error) => {
                    // The caller may have gone: nothing waits for the answer then.
                    let _ = ask.reply.send(Err(error));
                    continue;
                }
            };
            let Some(slot) = Slot::take(&self.running) else {
                let _ = ask.reply.send(Err(WhatIfError::Busy));
                continue;
            };
            let spawned = std::thread::Builder::new()
                .name("gantry-what-if".into())
                .spawn(move || {
                    let _slot = slot;
                    let _span = tracing::debug_span!("what_if_forecast").entered();
                    let _ = ask
                        .reply
                        .send(Ok(runs.answer(ask.asked + VARIATIONS_WITHIN)));
                });
            if let Err(error) = spawned {
                tracing::warn!(%error, "could not start a what-if's thread");
            }
        }
    }
}

/// One of the [`MAX_RUNNING`] places for a what-if being answered, given back when dropped.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(running: &Arc<AtomicUsize>) -> Option<Self> {
        running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_RUNNING).then_some(n + 1)
            })
            .ok()
            .map(|_| Self(running.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A question's runs, made on the loop: one per job asked about (the job, then each
/// variation), with what the answer's words need of the scheduler.
pub struct WhatIfRuns {
    /// Per job: what changed (empty for the job itself), its shape in words, and its run.
    runs: Vec<(String, WhatIfShape, WhatIfRun)>,
    /// The scheduler's clock when they were made, and the wall clock then.
    clock_s: f64,
    at_ms: u64,
}

impl WhatIfRuns {
    /// Runs each forecast and answers: the job's own, then each variation's whose forecast,
    /// if it takes as long as the slowest so far, ends by `variations_by`; a variation that
    /// would not says it was not answered.
    pub fn answer(self, variations_by: Instant) -> WhatIfAnswer {
        let (clock_s, at_ms) = (self.clock_s, self.at_ms);
        let mut slowest = Duration::ZERO;
        let mut outcomes = self.runs.into_iter().map(|(change, job, run)| {
            let started = Instant::now();
            if !change.is_empty() && started + slowest > variations_by {
                let not_answered = WhatIf {
                    start: None,
                    ..run.plan_only()
                };
                let (mut outcome, ahead) = outcome(not_answered, change, job, clock_s, at_ms);
                outcome.text = format!(
                    "not answered: each variation costs a forecast, and this one would not \
                     end within the {} s a what-if has for them",
                    VARIATIONS_WITHIN.as_secs()
                );
                return (outcome, ahead);
            }
            let answered = outcome(run.run(), change, job, clock_s, at_ms);
            slowest = slowest.max(started.elapsed());
            answered
        });
        let (answer, jobs_ahead) = outcomes.next().expect("the job itself is always run");
        let mut variations: Vec<WhatIfOutcome> = outcomes.map(|(outcome, _)| outcome).collect();
        variations.sort_by_key(|v| v.estimate.as_ref().map_or(u64::MAX, |e| e.p50_ms));
        WhatIfAnswer {
            at_ms,
            jobs_ahead,
            answer,
            variations,
        }
    }
}

/// The runs for `job` from `scheduler`: the job itself and, if asked, its variations.
pub fn runs(scheduler: &Scheduler, job: &WhatIfJob) -> Result<WhatIfRuns, WhatIfError> {
    let (spec, like) = spec_of(scheduler, job)?;
    let mut specs = vec![(String::new(), spec.clone())];
    if job.variations {
        specs.extend(variants(scheduler, &spec));
    }
    let runs = specs
        .into_iter()
        .map(|(change, spec)| {
            let shape = shape_of(scheduler, &spec);
            (change, shape, scheduler.what_if_run(&spec, like))
        })
        .collect();
    Ok(WhatIfRuns {
        runs,
        clock_s: scheduler.clock_s(),
        at_ms: now_ms(),
    })
}

fn bad(text: String) -> WhatIfError {
    WhatIfError::BadField(text)
}

/// The job `job` describes, checked field by field, and the pending job it is like.
fn spec_of(
    scheduler: &Scheduler,
    job: &WhatIfJob,
) -> Result<(JobSpec, Option<JobId>), WhatIfError> {
    let symbols = scheduler.symbols();
    let (mut spec, like) = match (&job.like, &job.queue) {
        (Some(like), _) => scheduler
            .pending()
            .into_iter()
            .find(|&id| scheduler.job(id).name == *like)
            .map(|id| (scheduler.job(id).clone(), Some(id)))
            .ok_or_else(|| bad(format!("like: no pending job is named {like:?}")))?,
        (None, Some(_)) => (
            JobSpec {
                name: String::new(),
                queue: 0,
                priority: 0,
                pods: 1,
                shape: PodShape {
                    gpus: 1,
                    ..PodShape::default()
                },
                balloon: false,
                topology: TopologyPref::default(),
                submit_s: scheduler.clock_s(),
                expected_runtime_s: None,
            },
            None,
        ),
        (None, None) => {
            return Err(bad(
                "queue: give the queue to submit to, or `like`, a pending job to start from".into(),
            ));
        }
    };
    spec.name = "what-if".into();
    spec.balloon = false;
    if let Some(queue) = &job.queue {
        spec.queue = scheduler
            .queues
            .id(queue)
            .ok_or_else(|| bad(format!("queue: no queue is named {queue:?}")))?;
    }
    if let Some(pods) = job.pods {
        if !(1..=MAX_PODS).contains(&pods) {
            return Err(bad(format!("pods: {pods} is not between 1 and {MAX_PODS}")));
        }
        spec.pods = pods;
    }
    if let Some(gpus) = job.gpus_per_pod {
        if gpus > MAX_GPUS_PER_POD {
            return Err(bad(format!(
                "gpus_per_pod: {gpus} is more than {MAX_GPUS_PER_POD}"
            )));
        }
        spec.shape.gpus = gpus;
        spec.shape.gpu_milli = 0;
    }
    if let Some(model) = &job.gpu_type {
        spec.shape.gpu_type = if model.is_empty() {
            0
        } else {
            symbols
                .lookup(model)
                .filter(|sym| scheduler.state.nodes.gpu_type.contains(sym))
                .ok_or_else(|| bad(format!("gpu_type: no node has GPUs of type {model:?}")))?
        };
    }
    if let Some(runtime) = job.expected_runtime_s {
        if !(runtime.is_finite() && runtime > 0.0) {
            return Err(bad(format!(
                "expected_runtime_s: {runtime} is not a positive number of seconds"
            )));
        }
        spec.expected_runtime_s = Some(runtime);
    }
    spec.shape.queue = symbols.intern(scheduler.queues.name(spec.queue));
    spec.shape.gang_size = spec.pods;
    // A `like` job changed in any field is another job: no longer tried after the original.
    let unchanged = job.queue.is_none()
        && job.pods.is_none()
        && job.gpus_per_pod.is_none()
        && job.gpu_type.is_none()
        && job.expected_runtime_s.is_none();
    Ok((spec, like.filter(|_| unchanged)))
}

/// The variations of `spec` worth trying, each with what changed.
fn variants(scheduler: &Scheduler, spec: &JobSpec) -> Vec<(String, JobSpec)> {
    let mut out = Vec::new();
    if spec.shape.gpus > 1 {
        let gpus = spec.shape.gpus / 2;
        let mut v = spec.clone();
        v.shape.gpus = gpus;
        out.push((
            format!("{gpus} GPUs per pod instead of {}", spec.shape.gpus),
            v,
        ));
    }
    if spec.pods > 1 {
        let pods = (spec.pods * 3 / 4).max(1);
        let mut v = spec.clone();
        v.pods = pods;
        v.shape.gang_size = pods;
        out.push((
            format!(
                "{} instead of {}",
                gantry_core::explain::count_text(pods, "pod"),
                spec.pods
            ),
            v,
        ));
    }
    let queues = &scheduler.queues;
    for id in (0..queues.len()).filter(|&id| queues.children(id).is_empty()) {
        let queue = queues.name(id).to_string();
        if id != spec.queue {
            let mut v = spec.clone();
            v.queue = id;
            v.shape.queue = scheduler.symbols().intern(&queue);
            out.push((format!("queue {queue}"), v));
        }
    }
    let mut models: Vec<gantry_core::Sym> = scheduler.state.nodes.gpu_type.clone();
    models.sort_unstable();
    models.dedup();
    for model in models {
        if model != 0 && model != spec.shape.gpu_type {
            let mut v = spec.clone();
            v.shape.gpu_type = model;
            out.push((
                format!("GPU type {}", scheduler.symbols().resolve(model)),
                v,
            ));
        }
    }
    out
}

/// `spec`'s shape, in the names the answer shows.
fn shape_of(scheduler: &Scheduler, spec: &JobSpec) -> WhatIfShape {
    WhatIfShape {
        queue: scheduler.queues.name(spec.queue).to_string(),
        pods: spec.pods,
        gpus_per_pod: spec.shape.gpus,
        gpu_type: if spec.shape.gpu_type == 0 {
            String::new()
        } else {
            scheduler.symbols().resolve(spec.shape.gpu_type).to_string()
        },
    }
}

/// What `what` says in words, and the jobs ahead of it; `clock_s` and `now_ms` are the
/// scheduler's clock and the wall clock when it was asked.
fn outcome(
    what: WhatIf,
    change: String,
    job: WhatIfShape,
    clock_s: f64,
    now_ms: u64,
) -> (WhatIfOutcome, usize) {
    let estimate = what
        .start
        .as_ref()
        // A job not submitted yet: nothing has refused it.
        .map(|start| EstimateView::new(start, clock_s, now_ms, None));
    let ahead = match what.jobs_ahead {
        0 => String::new(),
        1 => format!(
            ", behind the 1 pending job of queue {} ahead of it",
            job.queue
        ),
        n => format!(
            ", behind the {n} pending jobs of queue {} ahead of it",
            job.queue
        ),
    };
    let nodes = what.nodes.as_deref().unwrap_or("the cluster");
    let text = match (&estimate, what.beyond_s) {
        (Some(e), _) if e.p50_ms <= now_ms + 1000 => {
            format!("would start at once, on {nodes}")
        }
        (Some(e), _) => format!(
            "would start in about {}, 90% within {}{ahead}",
            duration_text((e.p50_ms - now_ms) as f64 / 1000.0),
            duration_text((e.p90_ms - now_ms) as f64 / 1000.0)
        ),
        (None, Some(beyond_s)) => format!(
            "would start in more than {}{ahead}: the forecast does not reach it, and the work \
             ahead of it takes that long on the most GPUs queue {} may use",
            duration_text((beyond_s - clock_s).max(0.0)),
            job.queue
        ),
        (None, None) => "would not fit this cluster even with every running job gone".to_string(),
    };
    let not_before_ms = (what.beyond_s)
        .filter(|_| estimate.is_none())
        .map(|beyond_s| wall_ms(beyond_s, clock_s, now_ms));
    (
        WhatIfOutcome {
            change,
            job,
            estimate,
            not_before_ms,
            nodes: what.nodes,
            runtime: what.runtime,
            text,
        },
        what.jobs_ahead,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_estimates_read_as_people_say_them() {
        // duration_text's own cases are beside it, in gantry_core::explain.
        // 14:20 UTC on some day.
        let at = (20_000 * 86_400 + 14 * 3600 + 20 * 60) * 1000;
        assert_eq!(
            estimate_text(7800.0, 18_000.0, Some("16 nodes in rack 3"), at),
            "expected to start in about 2 h 10 min, 90% within 5 h; it holds a reservation \
             on 16 nodes in rack 3 from 14:20 UTC"
        );
        assert_eq!(
            estimate_text(0.0, 0.0, None, at),
            "room for it is free now: it is expected to start at its next attempt"
        );
    }
}
