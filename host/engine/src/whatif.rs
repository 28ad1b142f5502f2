//! "What if": when would a job of this shape start, asked without submitting it. The API hands
//! the question to the loop, which answers it between cycles from the same plan its own
//! estimates come from ([`Scheduler::what_if`]); and the words an estimate is shown in.

pub use gantry_contract::{
    EstimateView, WhatIfAnswer, WhatIfJob, WhatIfOutcome, WhatIfShape, duration_text, estimate_text,
};
use std::time::Duration;

use gantry_core::{JobSpec, PodShape, Scheduler, TopologyPref};

use crate::live::{Live, now_ms};

/// Most pods a what-if job may have: beyond any cluster, and cheap to refuse.
const MAX_PODS: u32 = 100_000;
/// Most GPUs per pod a what-if job may ask for.
const MAX_GPUS_PER_POD: u32 = 64;
/// How long the API waits for the loop to answer: a cycle and the answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// Why a what-if was not answered.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WhatIfError {
    /// A field of the question is wrong; the text names it.
    #[error("{0}")]
    BadField(String),
    /// The loop did not answer in time (it is stopped, or stuck in a long cycle).
    #[error("the scheduling loop did not answer within {} s", ANSWER_WITHIN.as_secs())]
    NoAnswer,
}

/// A question waiting for the loop, and where its answer goes.
pub(crate) struct WhatIfAsk {
    job: WhatIfJob,
    reply: tokio::sync::oneshot::Sender<Result<WhatIfAnswer, WhatIfError>>,
}

impl Live {
    /// Asks the loop when a job of `job`'s shape would start; answered between cycles.
    pub async fn what_if(&self, job: WhatIfJob) -> Result<WhatIfAnswer, WhatIfError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.what_ifs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(WhatIfAsk { job, reply });
        self.wake_loop();
        match tokio::time::timeout(ANSWER_WITHIN, answer).await {
            Ok(Ok(answer)) => answer,
            _ => Err(WhatIfError::NoAnswer),
        }
    }

    /// Answers the questions waiting, from `scheduler`'s plan. The loop calls it between
    /// cycles.
    pub fn answer_what_ifs(&self, scheduler: &Scheduler) {
        let asks = std::mem::take(&mut *self.what_ifs.lock().unwrap_or_else(|e| e.into_inner()));
        for ask in asks {
            let _span = tracing::debug_span!("what_if").entered();
            // The caller may have gone: nothing waits for the answer then.
            let _ = ask.reply.send(answer(scheduler, &ask.job));
        }
    }
}

/// The answer to `job` from `scheduler`'s plan.
pub fn answer(scheduler: &Scheduler, job: &WhatIfJob) -> Result<WhatIfAnswer, WhatIfError> {
    let spec = spec_of(scheduler, job)?;
    let now = now_ms();
    let (answer, jobs_ahead) = outcome(scheduler, &spec, String::new(), now);
    let mut variations = Vec::new();
    if job.variations {
        for (change, variant) in variants(scheduler, &spec) {
            variations.push(outcome(scheduler, &variant, change, now).0);
        }
        variations.sort_by_key(|v| v.estimate.as_ref().map_or(u64::MAX, |e| e.p50_ms));
    }
    Ok(WhatIfAnswer {
        at_ms: now,
        jobs_ahead,
        answer,
        variations,
    })
}

fn bad(text: String) -> WhatIfError {
    WhatIfError::BadField(text)
}

/// The job `job` describes, checked field by field.
fn spec_of(scheduler: &Scheduler, job: &WhatIfJob) -> Result<JobSpec, WhatIfError> {
    let symbols = scheduler.symbols();
    let mut spec = match (&job.like, &job.queue) {
        (Some(like), _) => scheduler
            .pending()
            .into_iter()
            .map(|id| scheduler.job(id))
            .find(|spec| spec.name == *like)
            .cloned()
            .ok_or_else(|| bad(format!("like: no pending job is named {like:?}")))?,
        (None, Some(_)) => JobSpec {
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
    Ok(spec)
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
        out.push((format!("{pods} pods instead of {}", spec.pods), v));
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

/// The plan's answer for `spec`, and the jobs ahead of it.
fn outcome(
    scheduler: &Scheduler,
    spec: &JobSpec,
    change: String,
    now_ms: u64,
) -> (WhatIfOutcome, usize) {
    let what = scheduler.what_if(spec);
    let estimate = what
        .start
        .as_ref()
        .map(|start| EstimateView::new(start, scheduler.clock_s(), now_ms));
    let text = match (&estimate, &what.nodes) {
        (Some(e), Some(nodes)) if e.p50_ms <= now_ms + 1000 => {
            format!("would start at once, on {nodes}")
        }
        (Some(e), Some(nodes)) => format!(
            "would start in about {}, 90% within {}, on {nodes}",
            duration_text((e.p50_ms - now_ms) as f64 / 1000.0),
            duration_text((e.p90_ms - now_ms) as f64 / 1000.0)
        ),
        _ => "would not fit this cluster even with every running job gone".to_string(),
    };
    let job = WhatIfShape {
        queue: scheduler.queues.name(spec.queue).to_string(),
        pods: spec.pods,
        gpus_per_pod: spec.shape.gpus,
        gpu_type: if spec.shape.gpu_type == 0 {
            String::new()
        } else {
            scheduler.symbols().resolve(spec.shape.gpu_type).to_string()
        },
    };
    (
        WhatIfOutcome {
            change,
            job,
            estimate,
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
        assert_eq!(duration_text(45.0), "45 s");
        assert_eq!(duration_text(720.0), "12 min");
        assert_eq!(duration_text(7800.0), "2 h 10 min");
        assert_eq!(duration_text(18_000.0), "5 h");
        assert_eq!(duration_text(3.0 * 86_400.0 + 4.0 * 3600.0), "3 days 4 h");
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
