//! Node failures in the simulator: a cluster spec's (or `--failures` file's) failure model,
//! and the injector that turns it into failure signals, repairs and re-tests on the replay's
//! clock. What a failure does to jobs is the core's (`Scheduler::node_failed`); this module
//! only says when nodes fail and come back.
//!
//! - [`FailureModel`]: the YAML section: a per-node MTBF, explicit events, a correlated burst,
//!   the repair and preflight times, the lifecycle's knobs.
//! - [`Injector`]: the model on a virtual clock, deterministic for a seed.
//! - [`FailureReport`]: what failures cost a replay, and what the replay tallies for it.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use gantry_core::health::{HealthConfig, NodeState, Verdict};
use gantry_core::{JobId, Mode, Scheduler, Seconds};
use serde::{Deserialize, Serialize};

use crate::replay::{WaitStats, ratio, round6, wait_stats};
use crate::synthetic::Rng;

/// How nodes fail, as a cluster spec's `failures:` section or a `--failures` file gives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureModel {
    /// Mean time between failures of one node, in days: failures arrive at random, at
    /// `nodes / mtbf` per day over the cluster, each on a node drawn uniformly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtbf_node_days: Option<f64>,
    /// Failures at given times on given nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<FailureEvent>,
    /// A correlated failure: a share of the nodes fails within a short window (a bad driver
    /// rollout), what the breaker exists for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<Burst>,
    /// How long a failed node is in repair, in seconds.
    #[serde(default = "default_repair_s")]
    pub repair_s: f64,
    /// How long a repaired node's preflight test runs before it takes work again, in seconds.
    #[serde(default = "default_preflight_s")]
    pub preflight_s: f64,
    /// The lifecycle's and the breaker's knobs.
    #[serde(default)]
    pub health: HealthConfig,
}

fn default_repair_s() -> f64 {
    4.0 * 3600.0
}

fn default_preflight_s() -> f64 {
    600.0
}

/// One failure at a given time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureEvent {
    /// When, in seconds from the start of the trace.
    pub at_s: f64,
    /// The node's name.
    pub node: String,
    /// What the node reported.
    #[serde(default = "default_cause")]
    pub cause: String,
}

fn default_cause() -> String {
    "Xid 79 (GPU fell off the bus)".into()
}

/// A correlated failure of `share` of the nodes within `within_s` from `at_s`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Burst {
    pub at_s: f64,
    /// The share of the nodes that fail (0–1).
    pub share: f64,
    pub within_s: f64,
    #[serde(default = "default_burst_cause")]
    pub cause: String,
}

fn default_burst_cause() -> String {
    "GpuXidError after a driver rollout".into()
}

/// A failure model that breaks a rule: the message names the field.
#[derive(Debug, thiserror::Error)]
#[error("{origin}: failures: {message}")]
pub struct FailureModelError {
    /// The file it came from.
    pub origin: String,
    /// What is wrong, naming the field.
    pub message: String,
}

impl FailureModel {
    /// Reads a `--failures` file: the same fields as a cluster spec's `failures:` section.
    pub fn load(path: &std::path::Path) -> Result<Self, FailureModelError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| FailureModelError {
            origin: origin.clone(),
            message: format!("cannot read: {e}"),
        })?;
        let model: Self = serde_yaml::from_str(&text).map_err(|e| FailureModelError {
            origin: origin.clone(),
            message: e.to_string(),
        })?;
        model
            .validate()
            .map_err(|message| FailureModelError { origin, message })?;
        Ok(model)
    }

    /// Every rule the model must meet; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        let seconds = |field: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(format!(
                    "field {field}: {v} must be a number of seconds, 0 or more"
                ))
            }
        };
        if let Some(mtbf) = self.mtbf_node_days
            && !(mtbf.is_finite() && mtbf > 0.0)
        {
            return Err(format!(
                "field mtbf_node_days: {mtbf} must be a number of days above 0"
            ));
        }
        seconds("repair_s", self.repair_s)?;
        seconds("preflight_s", self.preflight_s)?;
        for (i, event) in self.events.iter().enumerate() {
            seconds(&format!("events[{i}].at_s"), event.at_s)?;
            if event.node.is_empty() {
                return Err(format!("field events[{i}].node: must name a node"));
            }
        }
        if let Some(burst) = &self.burst {
            seconds("burst.at_s", burst.at_s)?;
            seconds("burst.within_s", burst.within_s)?;
            if !(burst.share > 0.0 && burst.share <= 1.0) {
                return Err(format!(
                    "field burst.share: {} must be above 0 and at most 1",
                    burst.share
                ));
            }
        }
        self.health
            .validate()
            .map_err(|message| format!("health: {message}"))
    }
}

/// What the injector does at a time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Fail { node: usize, cause: String },
    Repaired(usize),
    Tested(usize),
}

/// A failure that stopped jobs.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    /// When the node failed.
    pub at_s: f64,
    /// The jobs stopped.
    pub stopped: Vec<JobId>,
}

/// The failure model on the replay's clock. Deterministic: the same model, seed and scheduler
/// decisions give the same failures.
#[derive(Debug, Clone)]
pub struct Injector {
    model: FailureModel,
    rng: Rng,
    nodes: usize,
    /// The next random failure, if the model has an MTBF.
    next_random_s: Option<f64>,
    /// Failures, repairs and test ends to come: (time, order of scheduling, event).
    events: BinaryHeap<Reverse<(Seconds, u64, Event)>>,
    scheduled: u64,
    /// Whether a repaired node is tested again before it takes work (Gantry's lifecycle; the
    /// anchors have no preflight, so a repaired node is Ready at once).
    retest: bool,
    /// Failure signals by what became of them: cordoned, held by the breaker, on a node not
    /// Ready.
    pub signals: BTreeMap<&'static str, u64>,
}

impl Injector {
    /// The model over `scheduler`'s nodes: every event's node is looked up by name, and an
    /// unknown one is refused.
    pub fn new(
        model: FailureModel,
        scheduler: &Scheduler,
        seed: u64,
        retest: bool,
    ) -> Result<Self, String> {
        let nodes = scheduler.state.len();
        let name_to_node: BTreeMap<String, usize> =
            (0..nodes).map(|i| (scheduler.node_name(i), i)).collect();
        let mut injector = Self {
            rng: Rng::new(seed ^ 0xFA11_0000),
            nodes,
            next_random_s: None,
            events: BinaryHeap::new(),
            scheduled: 0,
            retest,
            signals: BTreeMap::new(),
            model: model.clone(),
        };
        for (i, event) in model.events.iter().enumerate() {
            let Some(&node) = name_to_node.get(&event.node) else {
                return Err(format!(
                    "field events[{i}].node: the cluster has no node {:?}",
                    event.node
                ));
            };
            let cause = event.cause.clone();
            injector.schedule(event.at_s, Event::Fail { node, cause });
        }
        if let Some(burst) = &model.burst {
            let count = ((nodes as f64) * burst.share).round() as usize;
            // Nodes spread over the cluster, at times spread over the window.
            let mut order: Vec<usize> = (0..nodes).collect();
            for i in (1..order.len()).rev() {
                let j = (injector.rng.next() % (i as u64 + 1)) as usize;
                order.swap(i, j);
            }
            for (k, &node) in order.iter().take(count).enumerate() {
                let at_s = burst.at_s + burst.within_s * k as f64 / count.max(1) as f64;
                let cause = burst.cause.clone();
                injector.schedule(at_s, Event::Fail { node, cause });
            }
        }
        if model.mtbf_node_days.is_some() {
            injector.next_random_s = Some(injector.draw_gap());
        }
        Ok(injector)
    }

    fn schedule(&mut self, at_s: f64, event: Event) {
        self.scheduled += 1;
        self.events
            .push(Reverse((Seconds(at_s), self.scheduled, event)));
    }

    /// The gap to the next random failure over the whole cluster.
    fn draw_gap(&mut self) -> f64 {
        let mtbf_s = self.model.mtbf_node_days.unwrap_or(f64::INFINITY) * 86_400.0;
        let rate = self.nodes as f64 / mtbf_s;
        -self.rng.unit().max(1e-12).ln() / rate
    }

    /// When the injector next has something to do. Random failures count only while
    /// `running` (something runs or will arrive that they could hit); repairs, tests and the
    /// model's own events always do, since pending jobs may wait for the nodes they bring back.
    pub fn next_s(&self, running: bool) -> Option<f64> {
        let queued = self.events.peek().map(|Reverse((Seconds(t), _, _))| *t);
        [queued, self.next_random_s.filter(|_| running)]
            .into_iter()
            .flatten()
            .min_by(f64::total_cmp)
    }

    /// Applies everything due by `now_s` to `scheduler`: failures (stopping the jobs on the
    /// node), repairs and test ends. The failures that stopped jobs are returned. Random
    /// failures fall only while something runs, as [`Injector::next_s`] steps to them.
    pub fn apply(&mut self, scheduler: &mut Scheduler, now_s: f64) -> Vec<Hit> {
        if scheduler.running().next().is_none() {
            // Nothing runs that a failure could hit (the trace is over, or not begun): the
            // random failures of the gap are not caught up later in one burst.
            while let Some(t) = self.next_random_s.filter(|&t| t <= now_s) {
                self.next_random_s = Some(t + self.draw_gap());
            }
        }
        while let Some(t) = self.next_random_s.filter(|&t| t <= now_s) {
            let node = (self.rng.next() % self.nodes.max(1) as u64) as usize;
            self.schedule(
                t,
                Event::Fail {
                    node,
                    cause: default_cause(),
                },
            );
            self.next_random_s = Some(t + self.draw_gap());
        }
        let mut hits = Vec::new();
        while let Some(Reverse((Seconds(t), _, _))) = self.events.peek() {
            let at_s = *t;
            if at_s > now_s {
                break;
            }
            let Some(Reverse((_, _, event))) = self.events.pop() else {
                break;
            };
            match event {
                Event::Fail { node, cause } => {
                    let failure = scheduler.node_failed(node, &cause, now_s);
                    let signal = match failure.verdict {
                        Verdict::Cordoned => "cordoned",
                        Verdict::HeldByBreaker => "held_by_breaker",
                        Verdict::NotReady => "on_a_node_not_ready",
                    };
                    *self.signals.entry(signal).or_default() += 1;
                    if scheduler.lifecycle().state(node) == NodeState::Repair {
                        self.schedule(now_s + self.model.repair_s, Event::Repaired(node));
                    }
                    if !failure.stopped.is_empty() {
                        hits.push(Hit {
                            at_s,
                            stopped: failure.stopped,
                        });
                    }
                }
                Event::Repaired(node) => {
                    scheduler.lifecycle_mut().repaired(node, self.retest, now_s);
                    scheduler.sync_health(node);
                    if self.retest {
                        self.schedule(now_s + self.model.preflight_s, Event::Tested(node));
                    }
                }
                Event::Tested(node) => {
                    scheduler.lifecycle_mut().passed(node, now_s);
                    scheduler.sync_health(node);
                }
            }
        }
        hits
    }
}

/// What the replay integrates for the failure report: GPU-seconds allocated to any pod (a
/// partly placed gang's too, goodput's denominator), node-seconds in each lifecycle state,
/// the most nodes in each at once, and the most out at once.
#[derive(Debug, Default)]
pub(crate) struct StateIntegrals {
    pub(crate) allocated_all: f64,
    state_node_s: [f64; 7],
    state_now: [u32; 7],
    state_peak: [u32; 7],
    peak_out: u32,
}

impl StateIntegrals {
    /// The nodes' lifecycle states after a step, for the next interval's integral and the
    /// peaks.
    pub(crate) fn note(&mut self, scheduler: &Scheduler) {
        let lifecycle = scheduler.lifecycle();
        self.state_now = lifecycle.counts();
        let out: u32 = gantry_core::NodeState::ALL
            .iter()
            .zip(self.state_now)
            .filter(|(s, _)| s.out())
            .map(|(_, n)| n)
            .sum();
        self.peak_out = self.peak_out.max(out);
        for (peak, now) in self.state_peak.iter_mut().zip(self.state_now) {
            *peak = (*peak).max(now);
        }
    }

    /// GPUs allocated to any pod over `dt`.
    pub(crate) fn add_allocated(&mut self, scheduler: &Scheduler, total_gpus: u64, dt: f64) {
        let free: u64 = scheduler
            .state
            .nodes
            .gpu_free
            .iter()
            .map(|&g| u64::from(g))
            .sum();
        self.allocated_all += (total_gpus - free) as f64 * dt;
    }

    /// The nodes in each state over `dt`, as last noted.
    pub(crate) fn add_states(&mut self, dt: f64) {
        for (integral, &n) in self.state_node_s.iter_mut().zip(&self.state_now) {
            *integral += f64::from(n) * dt;
        }
    }
}

/// What failures and preemptions cost, as the replay books them.
#[derive(Default)]
pub(crate) struct Losses {
    pub(crate) failures_hitting_jobs: u64,
    pub(crate) jobs_stopped: u64,
    pub(crate) failure_gpu_s: f64,
    pub(crate) halted_gpu_s: f64,
    pub(crate) preemption_gpu_s: f64,
    /// Per restart, the wait from its failure.
    pub(crate) restart_waits: Vec<f64>,
}

/// What node failures did to a run (with a failure model only).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FailureReport {
    /// How the scheduler's runs are modelled after a failure, in words.
    pub model: String,
    /// Failure signals, by what became of them: `cordoned`, `held_by_breaker`,
    /// `on_a_node_not_ready` (already out or in a test).
    pub signals: BTreeMap<String, u64>,
    /// Failures that stopped at least one job.
    pub failures_hitting_jobs: u64,
    /// Jobs stopped by a failure (a job stopped twice counts twice).
    pub jobs_stopped: u64,
    /// GPU-hours failures cost: the two parts below together.
    pub gpu_hours_lost_to_failures: f64,
    /// Work run since the stopped job's last checkpoint, in GPU-hours.
    pub gpu_hours_lost_since_checkpoint: f64,
    /// GPU-hours a halted gang's other pods held, doing no work, until it was torn down (the
    /// anchors; 0 for Gantry, which stops the gang at the signal).
    pub gpu_hours_idle_while_halted: f64,
    /// GPU-hours of work lost to preemptions, the same way.
    pub gpu_hours_lost_to_preemption: f64,
    /// GPU-seconds of work kept over GPU-seconds allocated (a partly placed gang's GPUs are
    /// allocated and do no work), from the first submission on.
    pub goodput: f64,
    /// From a failure to the stopped job's restart; a job never restarted counts until the end.
    pub failure_to_restart_wait: WaitStats,
    /// Nodes in each lifecycle state, time-averaged over the run, and at most at once.
    pub nodes_by_state_mean: BTreeMap<String, f64>,
    pub nodes_by_state_peak: BTreeMap<String, u32>,
    /// Most nodes out for health at once (suspect, draining, repair or retired).
    pub peak_nodes_out: u32,
    /// When the breaker tripped and why; `None` if it never did.
    pub breaker_tripped: Option<gantry_core::health::Trip>,
}

/// What failures did to a replay, from the injector's signals, the losses booked, the
/// states integrated over `span_s` and the GPU-seconds of work (`busy_gpu_s`).
pub(crate) fn report(
    scheduler: &Scheduler,
    injector: &Injector,
    losses: Losses,
    integrals: &StateIntegrals,
    busy_gpu_s: f64,
    span_s: f64,
) -> FailureReport {
    let lifecycle = scheduler.lifecycle();
    let model = match scheduler.config.mode {
        Mode::Gantry => {
            "the gang is stopped whole at the signal (its pods evicted) and tried first in \
                 the same cycle, before the nodes it freed go to anyone else (its recreated pods \
                 bind as they appear); it keeps its place at the head of its queue and avoids \
                 the failed node; a repaired node is tested again before it takes work; the \
                 breaker caps automated cordons"
        }
        Mode::Kueue => {
            "the gang halts: its other pods hold their GPUs, doing no work, until their \
                 collective times out (600 s); Kueue then evicts the workload (waitForPodsReady) \
                 and requeues it at the tail after 60 s; nothing remembers the failed node; a \
                 repaired node is Ready at once; no breaker"
        }
        _ => {
            "the gang halts: its other pods hold their GPUs, doing no work, until their \
                 collective times out (600 s); the Job controller recreates the pods after its \
                 10 s backoff, at the tail of the queue; nothing remembers the failed node; a \
                 repaired node is Ready at once; no breaker"
        }
    };
    let lost = losses.failure_gpu_s + losses.preemption_gpu_s;
    let names = gantry_core::NodeState::ALL.map(|s| s.name().to_string());
    FailureReport {
        model: model.to_string(),
        signals: injector
            .signals
            .iter()
            .map(|(k, v)| ((*k).to_string(), *v))
            .collect(),
        failures_hitting_jobs: losses.failures_hitting_jobs,
        jobs_stopped: losses.jobs_stopped,
        gpu_hours_lost_to_failures: round6((losses.failure_gpu_s + losses.halted_gpu_s) / 3600.0),
        gpu_hours_lost_since_checkpoint: round6(losses.failure_gpu_s / 3600.0),
        gpu_hours_idle_while_halted: round6(losses.halted_gpu_s / 3600.0),
        gpu_hours_lost_to_preemption: round6(losses.preemption_gpu_s / 3600.0),
        goodput: round6(ratio(busy_gpu_s - lost, integrals.allocated_all)),
        failure_to_restart_wait: wait_stats(losses.restart_waits),
        nodes_by_state_mean: names
            .iter()
            .zip(integrals.state_node_s)
            .map(|(n, v)| (n.clone(), round6(ratio(v, span_s))))
            .collect(),
        nodes_by_state_peak: names
            .iter()
            .zip(integrals.state_peak)
            .map(|(n, v)| (n.clone(), v))
            .collect(),
        peak_nodes_out: integrals.peak_out,
        breaker_tripped: lifecycle.breaker.tripped.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_negative_mtbf_and_a_bad_share_are_refused_naming_the_field() {
        let model: FailureModel = serde_yaml::from_str("mtbf_node_days: -3").unwrap();
        assert!(
            model
                .validate()
                .unwrap_err()
                .contains("field mtbf_node_days: -3")
        );
        let model: FailureModel =
            serde_yaml::from_str("burst: {at_s: 60, share: 1.5, within_s: 60}").unwrap();
        assert!(model.validate().unwrap_err().contains("field burst.share"));
        let model: FailureModel = serde_yaml::from_str("health: {max_out_share: 2}").unwrap();
        assert!(
            model
                .validate()
                .unwrap_err()
                .contains("health: field max_out_share")
        );
        let unknown = serde_yaml::from_str::<FailureModel>("mtbf_days: 3").unwrap_err();
        assert!(
            unknown.to_string().contains("unknown field `mtbf_days`"),
            "{unknown}"
        );
    }
}
