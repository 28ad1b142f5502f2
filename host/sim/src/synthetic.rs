//! The synthetic load of `gantry serve` with no cluster configured: a cluster source and binder
//! for the engine's one loop. Jobs arrive as a Poisson stream (30% gangs of 2-128 pods of 8
//! GPUs, the rest single pods of 1-8 GPUs), each queue getting work in proportion to its
//! nominal quota, at a rate that asks for a chosen share of the cluster on average; balloon
//! pods hold idle capacity. The binder binds every placement at once and starts the job's run;
//! the source ends it when its run is over. A job's run length is the simulated world's own:
//! the scheduler never sees it. With a failure model ([`SyntheticLoad::with_failures`]) it
//! fails nodes too, and counts the work the failures cost.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use gantry_core::{
    BindOutcome, Binder, Changes, ClusterSource, CycleOutput, JobId, JobSpec, PodShape, QueueId,
    Scheduler, Seconds, TopologyPref,
};

use crate::failures::{FailureModel, Injector};

/// Gang sizes of the synthetic load, each as likely.
const GANG_PODS: [u32; 7] = [2, 4, 8, 16, 32, 64, 128];
/// GPUs of a single pod, each as likely.
const SINGLE_GPUS: [u32; 4] = [1, 2, 4, 8];
/// Share of jobs that are gangs (of 8-GPU pods).
const GANG_SHARE: f64 = 0.3;
/// A job runs between these many seconds, uniformly.
const RUN_S: (f64, f64) = (30.0, 300.0);
/// GPUs of one balloon pod: a whole node.
const BALLOON_GPUS: u32 = 8;

/// What the load looks like.
#[derive(Debug, Clone)]
pub struct SyntheticConfig {
    /// New jobs per second.
    pub jobs_per_s: f64,
    /// Seeds the arrivals, shapes, queues and run lengths.
    pub seed: u64,
    /// Balloon pods to submit at the start.
    pub balloons: u32,
    /// Stop submitting after this many pods (balloons not counted).
    pub max_pods: Option<u64>,
    /// Start as if the load had been running for a while: the jobs that would have arrived
    /// in the last [`WARM_S`] seconds are submitted at once, and each runs for what would be
    /// left of its run. Without it the cluster takes minutes to fill.
    pub warm_start: bool,
}

/// How far back a warm start reaches: the longest run, so every job of a steady state is in.
pub const WARM_S: f64 = RUN_S.1;

impl SyntheticConfig {
    /// The arrival rate at which the load asks, on average, for `share` of `gpus`: mean GPUs
    /// per job times mean run length is what one arrival per second keeps busy.
    pub fn rate_for(share: f64, gpus: u64) -> f64 {
        let gang =
            GANG_PODS.iter().map(|&p| f64::from(p * 8)).sum::<f64>() / GANG_PODS.len() as f64;
        let single =
            SINGLE_GPUS.iter().map(|&g| f64::from(g)).sum::<f64>() / SINGLE_GPUS.len() as f64;
        let per_job = GANG_SHARE * gang + (1.0 - GANG_SHARE) * single;
        let run = (RUN_S.0 + RUN_S.1) / 2.0;
        share * gpus as f64 / (per_job * run)
    }
}

/// A small deterministic generator (xorshift): the demo's load and the failure injector draw
/// from it, so a seed fixes a run.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value, 0 included).
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed.max(1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next() % items.len() as u64) as usize]
    }
}

/// The synthetic world: the source of jobs and the binder that runs them.
#[derive(Debug)]
pub struct SyntheticLoad {
    config: SyntheticConfig,
    rng: Rng,
    /// Leaf queues work goes to, with their cumulative share of nominal quota (ends at 1).
    queues: Vec<(String, QueueId, f64)>,
    next_arrival_s: f64,
    balloons_submitted: bool,
    /// Jobs of the warm start: what is left of the run each had begun before the start.
    warm_to_left_s: HashMap<JobId, f64>,
    /// Runs in progress: when each ends, by job, with the run's number so that a run cut
    /// short by preemption never ends the job's next run.
    ends: BinaryHeap<Reverse<(Seconds, JobId, u32)>>,
    /// Per job in the world: its run length (drawn at arrival, kept across preemptions) and
    /// the number of its current run. Jobs leave when they end.
    job_to_run: HashMap<JobId, (f64, u32)>,
    /// Node failures, when the demo runs with a failure model.
    injector: Option<Injector>,
    /// Per running job (balloons not counted): when its run started and its GPUs, so a run
    /// cut short counts what it lost.
    job_to_started: HashMap<JobId, (f64, u64)>,
    /// What the runs that ended (finished, preempted or stopped by a failure) held, in
    /// GPU-seconds, and what of that the cut-short ones lost (a demo job keeps no checkpoint):
    /// goodput is the one over the other.
    pub run_gpu_s: f64,
    /// See `run_gpu_s`: lost to failures, and to preemptions.
    pub lost_to_failures_gpu_s: f64,
    /// See `run_gpu_s`.
    pub lost_to_preemption_gpu_s: f64,
    /// Jobs a failure stopped.
    pub stopped_by_failures: u64,
    /// Jobs submitted (balloons not counted), their pods, and jobs finished.
    pub submitted: u64,
    /// See `submitted`.
    pub pods_submitted: u64,
    /// See `submitted`.
    pub finished: u64,
}

impl SyntheticLoad {
    /// A load for `scheduler`'s queue tree, sending work to `leaves` (queue names) in
    /// proportion to their nominal quota (evenly when none has any).
    pub fn new(scheduler: &Scheduler, leaves: &[String], config: SyntheticConfig) -> Self {
        let ids: Vec<(String, QueueId, u64)> = leaves
            .iter()
            .filter_map(|name| {
                let id = scheduler.queues.id(name)?;
                Some((name.clone(), id, scheduler.queues.nominal(id)))
            })
            .collect();
        let total: u64 = ids.iter().map(|q| q.2).sum();
        let mut cumulative = 0.0;
        let queues = ids
            .iter()
            .map(|(name, id, nominal)| {
                cumulative += if total > 0 {
                    *nominal as f64 / total as f64
                } else {
                    1.0 / ids.len() as f64
                };
                (name.clone(), *id, cumulative)
            })
            .collect();
        let warm_from = if config.warm_start { -WARM_S } else { 0.0 };
        Self {
            rng: Rng::new(config.seed),
            config,
            queues,
            next_arrival_s: warm_from,
            balloons_submitted: false,
            warm_to_left_s: HashMap::new(),
            ends: BinaryHeap::new(),
            job_to_run: HashMap::new(),
            injector: None,
            job_to_started: HashMap::new(),
            run_gpu_s: 0.0,
            lost_to_failures_gpu_s: 0.0,
            lost_to_preemption_gpu_s: 0.0,
            stopped_by_failures: 0,
            submitted: 0,
            pods_submitted: 0,
            finished: 0,
        }
    }

    /// Fails nodes as `model` says, over `scheduler`'s nodes (an event naming a node the
    /// cluster lacks is refused).
    pub fn with_failures(
        &mut self,
        model: FailureModel,
        scheduler: &mut Scheduler,
    ) -> Result<(), String> {
        self.injector = Some(Injector::new(
            model.clone(),
            scheduler,
            self.config.seed,
            true,
        )?);
        scheduler.lifecycle_mut().config = model.health;
        Ok(())
    }

    /// The failure signals so far, by what became of them (see [`Injector::signals`]).
    pub fn failure_signals(&self) -> Option<&std::collections::BTreeMap<&'static str, u64>> {
        self.injector.as_ref().map(|injector| &injector.signals)
    }

    /// A run ends at `now_s`: what it held, in GPU-seconds, all of it lost when the run was
    /// cut short (a demo job keeps no checkpoint).
    fn run_ended(&mut self, job: JobId, now_s: f64) -> f64 {
        let Some((started, gpus)) = self.job_to_started.remove(&job) else {
            return 0.0;
        };
        let gpu_s = (now_s - started).max(0.0) * gpus as f64;
        self.run_gpu_s += gpu_s;
        gpu_s
    }

    fn pick_queue(&mut self) -> (String, QueueId) {
        let u = self.rng.unit();
        let (name, id, _) = self
            .queues
            .iter()
            .find(|q| u < q.2)
            .or(self.queues.last())
            .expect("a load has queues");
        (name.clone(), *id)
    }

    fn submit_balloons(&mut self, scheduler: &mut Scheduler) {
        let symbols = scheduler.symbols().clone();
        for i in 0..self.config.balloons {
            let name = format!("balloon-{i:04}");
            let (queue_name, queue, _) = self.queues[i as usize % self.queues.len()].clone();
            scheduler.submit(JobSpec {
                name: name.clone(),
                queue,
                priority: i32::MIN,
                pods: 1,
                shape: PodShape {
                    name: symbols.intern(&name),
                    queue: symbols.intern(&queue_name),
                    priority: i32::MIN,
                    gpus: BALLOON_GPUS,
                    gang_size: 1,
                    ..PodShape::default()
                },
                balloon: true,
                topology: TopologyPref::default(),
                submit_s: 0.0,
                expected_runtime_s: None,
            });
        }
    }
}

impl ClusterSource for SyntheticLoad {
    fn sync(&mut self, scheduler: &mut Scheduler, now_s: f64) -> Changes {
        let mut changes = Changes::default();
        if !self.balloons_submitted {
            self.submit_balloons(scheduler);
            self.balloons_submitted = true;
        }
        let symbols = scheduler.symbols().clone();
        while self.next_arrival_s <= now_s
            && self
                .config
                .max_pods
                .is_none_or(|max| self.pods_submitted < max)
        {
            let arrival = self.next_arrival_s;
            self.next_arrival_s += -self.rng.unit().max(1e-9).ln() / self.config.jobs_per_s;
            let (pods, gpus) = if self.rng.unit() < GANG_SHARE {
                (*self.rng.pick(&GANG_PODS), 8)
            } else {
                (1, *self.rng.pick(&SINGLE_GPUS))
            };
            let length = RUN_S.0 + self.rng.unit() * (RUN_S.1 - RUN_S.0);
            // A warm start's job that would have ended before the start never shows up.
            if arrival < 0.0 && length <= -arrival {
                continue;
            }
            let (queue_name, queue) = self.pick_queue();
            let name = format!("job-{:06}", self.submitted);
            if pods > 1 {
                changes
                    .pod_to_job
                    .extend((0..pods).map(|i| (format!("{name}-{i}"), name.clone())));
            }
            let job = scheduler.submit(JobSpec {
                name: name.clone(),
                queue,
                priority: 0,
                pods,
                shape: PodShape {
                    name: symbols.intern(&name),
                    queue: symbols.intern(&queue_name),
                    gpus,
                    gang_size: pods,
                    ..PodShape::default()
                },
                balloon: false,
                topology: TopologyPref::default(),
                submit_s: arrival.max(0.0),
                expected_runtime_s: None,
            });
            self.job_to_run.insert(job, (length, 0));
            if arrival < 0.0 {
                self.warm_to_left_s.insert(job, length + arrival);
            }
            self.submitted += 1;
            self.pods_submitted += u64::from(pods);
            changes.submitted += 1;
            changes.submitted_pods += u64::from(pods);
        }
        while let Some(Reverse((Seconds(end), job, run))) = self.ends.peek().copied() {
            if end > now_s {
                break;
            }
            self.ends.pop();
            let current = self.job_to_run.get(&job).map(|r| r.1);
            if current == Some(run) && scheduler.is_running(job) {
                self.run_ended(job, now_s);
                scheduler.finish(job);
                self.job_to_run.remove(&job);
                self.finished += 1;
                changes.ended += 1;
            }
        }
        if let Some(injector) = self.injector.as_mut() {
            let hits = injector.apply(scheduler, now_s);
            for hit in hits {
                changes.nodes += 1;
                for job in hit.stopped {
                    // Its run is cut short: its end no longer counts, its work is lost.
                    if let Some(run) = self.job_to_run.get_mut(&job) {
                        run.1 += 1;
                        self.stopped_by_failures += 1;
                    }
                    self.lost_to_failures_gpu_s += self.run_ended(job, hit.at_s);
                }
            }
        }
        changes
    }
}

impl Binder for SyntheticLoad {
    fn bind(
        &mut self,
        scheduler: &Scheduler,
        output: &CycleOutput,
        now_s: f64,
    ) -> Vec<BindOutcome> {
        // A victim's run is cut short: its end no longer counts.
        for victim in &output.evicted {
            if let Some(run) = self.job_to_run.get_mut(victim) {
                run.1 += 1;
            }
            self.lost_to_preemption_gpu_s += self.run_ended(*victim, now_s);
        }
        let mut outcomes = Vec::new();
        for decision in output.decisions.iter().filter(|d| d.placed) {
            let job = decision.job;
            outcomes.push(BindOutcome::Bound { job });
            if scheduler.get(job).is_none_or(|spec| spec.balloon) {
                continue;
            }
            let Some(run) = self.job_to_run.get_mut(&job) else {
                continue;
            };
            run.1 += 1;
            // A warm-start job had been running already: its first run is what was left.
            let run_s = match self.warm_to_left_s.remove(&job) {
                Some(left) if run.1 == 1 => left,
                _ => run.0,
            };
            self.ends
                .push(Reverse((Seconds(now_s + run_s), job, run.1)));
            let gpus = scheduler.job(job).total().gpus;
            self.job_to_started.insert(job, (now_s, gpus));
        }
        outcomes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_asks_for_the_share_it_is_given() {
        // 89.7 GPUs per job on average, for 165 s: 0.9 of 60,000 GPUs is about 3.65 jobs/s.
        let rate = SyntheticConfig::rate_for(0.9, 60_000);
        assert!((rate - 3.649).abs() < 0.01, "{rate}");
    }
}
