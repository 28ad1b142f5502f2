//! Why a pending job has no start estimate: every pending job has an estimate (from the plan
//! or the forecast) or a sentence saying why none can be given, as `squeue --start` says
//! `N/A` with a reason rather than nothing.
//!
//! [`Scheduler::no_estimate_texts`] gives the sentence for each pending job with no estimate:
//! the forecast is off, it came after the last forecast (and when the next one is due), or
//! the last forecast did not reach it (the jobs of its queue ahead of it, and how long their
//! work takes on the most GPUs the queue may hold, as a time it starts later than).

use std::collections::{BTreeMap, HashMap};

use crate::explain::duration_text;
use crate::queues::QueueId;

use super::plan::Rank;
use super::{JobId, JobSpec, Scheduler};

impl Scheduler {
    /// Per pending job with no start estimate, why it has none, in words. One sort per queue,
    /// not a walk per job: the live view asks it for thousands of pending jobs at each publish.
    pub fn no_estimate_texts(&self) -> BTreeMap<JobId, String> {
        let mut queue_to_pending: HashMap<QueueId, Vec<(Rank, JobId, &JobSpec)>> = HashMap::new();
        for id in self.queue.all() {
            let spec = &self.job_to_entry[&id].spec;
            queue_to_pending
                .entry(spec.queue)
                .or_default()
                .push((Rank::of(id, spec), id, spec));
        }
        let mut job_to_text = BTreeMap::new();
        for (queue, mut pending) in queue_to_pending {
            pending.sort_by(|a, b| a.0.order(&b.0));
            let most_gpus = self.queues.most_gpus(queue, self.total_gpus());
            // The jobs ahead, and their work: balloons give way, so they are neither.
            let (mut jobs_ahead, mut work_ahead) = (0, 0.0);
            for &(rank, id, spec) in &pending {
                if self.start_estimate(id).is_none() {
                    let text =
                        self.no_estimate_text(id, spec, &rank, jobs_ahead, work_ahead, most_gpus);
                    job_to_text.insert(id, text);
                }
                if !spec.balloon {
                    jobs_ahead += 1;
                    work_ahead += self.work_gpu_s(spec);
                }
            }
        }
        job_to_text
    }

    /// A job's work: its GPUs for its learned median runtime (GPU-seconds), what it adds to
    /// the backlog of the jobs behind it.
    pub(super) fn work_gpu_s(&self, spec: &JobSpec) -> f64 {
        spec.total().gpus as f64 * self.plan.runtimes.estimate(spec).p50_s
    }

    /// The least a job a forecast looking `horizon_s` ahead did not reach still waits: that
    /// horizon, or the `work_ahead_gpu_s` ahead of it in `queue` run on the most GPUs the
    /// queue may hold, whichever is longer. The what-if's answer and the no-estimate sentence
    /// both give it.
    pub(super) fn unreached_wait_s(
        &self,
        queue: QueueId,
        work_ahead_gpu_s: f64,
        horizon_s: f64,
    ) -> f64 {
        let most_gpus = self.queues.most_gpus(queue, self.total_gpus());
        horizon_s.max(work_ahead_gpu_s / most_gpus as f64)
    }

    /// The sentence for job `id` of `rank` with no estimate, `jobs_ahead` of it in its queue
    /// (`work_ahead` GPU-seconds), the queue holding at most `most_gpus` GPUs.
    fn no_estimate_text(
        &self,
        id: JobId,
        spec: &JobSpec,
        rank: &Rank,
        jobs_ahead: usize,
        work_ahead: f64,
        most_gpus: u64,
    ) -> String {
        let now_s = self.clock_s;
        let queue = self.queues.name(spec.queue);
        if spec.balloon {
            return "a balloon is never planned: it only fills idle GPUs and gives way to real work"
                .to_string();
        }
        if spec.total().gpus > most_gpus {
            return format!(
                "it can never start as it is: it asks {} GPUs, and queue {queue} may hold at most \
                 {most_gpus} (its nominal quota and the most it may borrow)",
                spec.total().gpus
            );
        }
        if !self.plan_config.enabled {
            return "this scheduler makes no start estimates".to_string();
        }
        let Some(due_s) = self.forecast_due_at(self.plan.forecasts.reach.may_reach(spec, rank))
        else {
            return "the forecast is off: only the first jobs waiting for room, which the plan \
                    covers, get a start estimate"
                .to_string();
        };
        let next = if due_s <= now_s {
            "the next one is due now".to_string()
        } else {
            format!("the next one is due in {}", duration_text(due_s - now_s))
        };
        let forecast = &self.plan.forecasts;
        match self.plan.forecast_at_s {
            None => return format!("not estimated yet: no forecast has run yet; {next}"),
            Some(due) if id >= forecast.reach.first_unseen && due > forecast.at_s => {
                return "not estimated yet: it came after the last forecast, and the next one \
                        is under way"
                    .to_string();
            }
            Some(_) if id >= forecast.reach.first_unseen => {
                return format!(
                    "not estimated yet: it came after the last forecast ({} ago); {next}",
                    duration_text(now_s - forecast.at_s)
                );
            }
            Some(_) => {}
        }
        let work_s = work_ahead / most_gpus as f64;
        let beyond_s = self.unreached_wait_s(spec.queue, work_ahead, forecast.reach.horizon_s);
        format!(
            "not expected to start within {}: the last forecast ({} ago) looked {} ahead and did \
             not reach it, with {jobs_ahead} pending job(s) of queue {queue} tried before it, \
             whose work takes about {} on the {most_gpus} GPUs the queue may hold; {next}",
            duration_text(beyond_s),
            duration_text(now_s - forecast.at_s),
            duration_text(forecast.reach.horizon_s),
            duration_text(work_s),
        )
    }
}
