//! Prometheus metrics, named like kube-scheduler's where one exists (so existing dashboards and
//! alerts carry over), plus Gantry's own under `gantry_`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gantry_core::CycleOutput;
use gantry_policy::Policy;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// kube-scheduler's label for the scheduler profile; Gantry has one.
const PROFILE: &str = "gantry";

/// The registry and the handles the loop and handlers update.
pub struct Metrics {
    registry: Registry,
    /// `scheduler_schedule_attempts_total{result,profile}`: result is `scheduled` or
    /// `unschedulable` (kube-scheduler's `error` is counted by `gantry_cycle_failures_total`).
    pub attempts: IntCounterVec,
    /// `scheduler_scheduling_attempt_duration_seconds{result,profile}`. The core decides a cycle
    /// in one pass, so each attempt is observed as its cycle's time divided by its attempts.
    pub attempt_duration: HistogramVec,
    /// `scheduler_pending_pods{queue}`: kube-scheduler splits by its internal queues; Gantry has
    /// one, reported as `active`. Real work only, as kube-scheduler counts real pods: balloons
    /// are `gantry_balloon_pods`.
    pub pending_pods: IntGauge,
    /// `gantry_balloon_pods{state}`: balloon pods `pending` and `running`, apart from the work
    /// counts, so a cluster held by balloons does not read as a backlog.
    pub balloon_pods: IntGaugeVec,
    /// `scheduler_queue_incoming_pods_total{event="PodAdd",queue="active"}`: pods submitted.
    pub incoming_pods: IntCounter,
    /// Cycles whose decisions could not be stored.
    pub cycle_failures: IntCounter,
    /// `gantry_cycles_total`: scheduling cycles run, counted once per cycle.
    pub cycles: IntCounter,
    /// `gantry_scheduling_cycle_duration_seconds`: the time of each cycle that decided at least
    /// one job (idle cycles would only pull it down), so a bench can follow cycle time as the
    /// cluster grows.
    pub cycle_duration: Histogram,
    /// `scheduler_preemption_victims_total`: jobs evicted to make room for others.
    pub preemptions: IntCounter,
    /// `gantry_policy_set_active_version`: the policy-set version new cycles run on, set at start
    /// and on each activation.
    pub active_set: IntGauge,
    /// `gantry_policy_set_activations_total`: activations and rollbacks of policy sets.
    pub activations: IntCounter,
    /// `gantry_shadow_disagreements_total{kind}`: decisions where the shadow candidate disagreed
    /// with the active set, by the kind of disagreement.
    pub shadow_disagreements: IntCounterVec,
    /// `gantry_shadow_cycles_total{result}`: cycles the shadow candidate ran (`run`) or sat out
    /// because the shadow thread was still busy (`skipped`).
    pub shadow_cycles: IntCounterVec,
    /// `gantry_cycle_budget_exhausted_total`: cycles whose policy-call budget ran out, leaving
    /// jobs it had not reached for the next cycle.
    pub budget_exhausted: IntCounter,
    /// `gantry_forecast_duration_seconds`: the time of each forecast (the start estimates of
    /// the jobs the plan does not cover), run on a thread of its own beside the loop.
    pub forecast_duration: Histogram,
    /// `gantry_bind_after_lease_loss_total`: bindings answered as applied after this replica
    /// had lost its Lease. The fence on every write keeps it 0; anything else is a bug to page
    /// on, as GPUs may be booked twice.
    pub bind_after_lease_loss: IntCounter,
    /// `gantry_nodes{state}`: nodes in each health-lifecycle state (`ready`, `suspect`,
    /// `repair`, …), so on-call sees the fleet's health at a glance.
    pub nodes_by_state: IntGaugeVec,
    /// `gantry_health_breaker_tripped`: 1 while the breaker holds automated cordons back (a
    /// correlated failure, waiting for an admin), else 0. Page on it.
    pub breaker_tripped: IntGauge,
    /// `gantry_failure_stops_total`: jobs stopped whole because a node failed under them.
    pub failure_stops: IntCounter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The registry with every metric registered at zero; `Live` owns the one instance.
    pub fn new() -> Self {
        let registry = Registry::new();
        let r = &registry;
        let attempts = counter_vec(
            r,
            "scheduler_schedule_attempts_total",
            "Number of attempts to schedule pods, by the result.",
            &["result", "profile"],
        );
        let attempt_duration = histogram_vec(
            r,
            HistogramOpts::new(
                "scheduler_scheduling_attempt_duration_seconds",
                "Scheduling attempt latency in seconds (scheduling algorithm + binding).",
            )
            .buckets(prometheus::exponential_buckets(0.000_01, 2.0, 20).expect("buckets")),
            &["result", "profile"],
        );
        let pending_pods = gauge_vec(
            r,
            "scheduler_pending_pods",
            "Number of pending pods, by the queue type.",
            &["queue"],
        )
        .with_label_values(&["active"]);
        let balloon_pods = gauge_vec(
            r,
            "gantry_balloon_pods",
            "Balloon pods holding idle capacity, by state (pending or running).",
            &["state"],
        );
        let incoming_pods = counter_vec(
            r,
            "scheduler_queue_incoming_pods_total",
            "Number of pods added to scheduling queues by event and queue type.",
            &["event", "queue"],
        )
        .with_label_values(&["PodAdd", "active"]);
        let cycle_duration = histogram(
            r,
            HistogramOpts::new(
                "gantry_scheduling_cycle_duration_seconds",
                "Time of each scheduling cycle that decided at least one job.",
            )
            .buckets(prometheus::exponential_buckets(0.000_1, 2.0, 20).expect("buckets")),
        );
        let forecast_duration = histogram(
            r,
            HistogramOpts::new(
                "gantry_forecast_duration_seconds",
                "Time of each forecast of pending jobs' starts, run beside the loop.",
            )
            .buckets(prometheus::exponential_buckets(0.001, 2.0, 16).expect("buckets")),
        );
        Self {
            attempts,
            attempt_duration,
            pending_pods,
            balloon_pods,
            incoming_pods,
            cycle_failures: counter(
                r,
                "gantry_cycle_failures_total",
                "Scheduling cycles whose decisions could not be stored.",
            ),
            cycles: counter(r, "gantry_cycles_total", "Scheduling cycles run."),
            cycle_duration,
            preemptions: counter(
                r,
                "scheduler_preemption_victims_total",
                "Jobs evicted to make room for others.",
            ),
            active_set: gauge(
                r,
                "gantry_policy_set_active_version",
                "The policy-set version new cycles run on.",
            ),
            activations: counter(
                r,
                "gantry_policy_set_activations_total",
                "Activations and rollbacks of policy sets.",
            ),
            shadow_disagreements: counter_vec(
                r,
                "gantry_shadow_disagreements_total",
                "Decisions where the shadow candidate disagreed with the active set, by kind.",
                &["kind"],
            ),
            shadow_cycles: counter_vec(
                r,
                "gantry_shadow_cycles_total",
                "Cycles the shadow candidate ran, or skipped because its thread was busy.",
                &["result"],
            ),
            budget_exhausted: counter(
                r,
                "gantry_cycle_budget_exhausted_total",
                "Cycles whose policy-call budget ran out before they reached every job.",
            ),
            forecast_duration,
            bind_after_lease_loss: counter(
                r,
                "gantry_bind_after_lease_loss_total",
                "Bindings answered as applied after this replica had lost its Lease.",
            ),
            nodes_by_state: gauge_vec(
                r,
                "gantry_nodes",
                "Nodes in each health-lifecycle state.",
                &["state"],
            ),
            breaker_tripped: gauge(
                r,
                "gantry_health_breaker_tripped",
                "1 while the health breaker holds automated cordons back, else 0.",
            ),
            failure_stops: counter(
                r,
                "gantry_failure_stops_total",
                "Jobs stopped whole because a node failed under them.",
            ),
            registry,
        }
    }

    /// Counts a binding that failed, as kube-scheduler does: an attempt with result `error`.
    pub fn binding_failed(&self) {
        self.attempts.with_label_values(&["error", PROFILE]).inc();
    }

    /// Counts a cycle's attempts and their time.
    pub fn observe_cycle(&self, output: &CycleOutput, elapsed: Duration) {
        self.cycles.inc();
        self.preemptions.inc_by(output.evicted.len() as u64);
        self.failure_stops.inc_by(output.stopped.len() as u64);
        if output.budget_spent {
            self.budget_exhausted.inc();
        }
        if output.decisions.is_empty() {
            return;
        }
        self.cycle_duration.observe(elapsed.as_secs_f64());
        let per_attempt = elapsed.as_secs_f64() / output.decisions.len() as f64;
        for d in &output.decisions {
            let result = if d.placed {
                "scheduled"
            } else {
                "unschedulable"
            };
            self.attempts.with_label_values(&[result, PROFILE]).inc();
            self.attempt_duration
                .with_label_values(&[result, PROFILE])
                .observe(per_attempt);
        }
    }

    /// The text exposition: the registry, then the Wasm footprint, then each loaded policy's
    /// calls, faults and time.
    pub fn render(
        &self,
        policies: &[Arc<Policy>],
        wasm: WasmFootprint,
        history_damage: Option<&gantry_store::HistoryDamage>,
    ) -> String {
        let mut buf = Vec::new();
        if let Err(error) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!(%error, "cannot encode metrics");
        }
        let mut out = String::from_utf8(buf).unwrap_or_default();
        let mut seen = std::collections::HashSet::new();
        let mut lines = [
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ];
        for p in policies {
            let info = p.info();
            if !seen.insert(Arc::as_ptr(p)) {
                continue;
            }
            let labels = format!(
                "policy=\"{}\",version=\"{}\",role=\"{}\",sha256=\"{}\"",
                escape(&info.name),
                escape(&info.version),
                info.role.as_str(),
                &info.sha256[..12.min(info.sha256.len())]
            );
            let calls = p.stats.calls.load(Ordering::Relaxed);
            let faults = p.stats.faults.load(Ordering::Relaxed);
            let busy = p.stats.busy_ns.load(Ordering::Relaxed) as f64 / 1e9;
            lines[0].push_str(&format!("gantry_policy_calls_total{{{labels}}} {calls}\n"));
            lines[1].push_str(&format!(
                "gantry_policy_faults_total{{{labels}}} {faults}\n"
            ));
            lines[2].push_str(&format!(
                "gantry_policy_call_duration_seconds_sum{{{labels}}} {busy}\n\
                 gantry_policy_call_duration_seconds_count{{{labels}}} {calls}\n"
            ));
            let health = p.health();
            lines[3].push_str(&format!(
                "gantry_policy_quarantined{{{labels}}} {}\n",
                u8::from(health.quarantined)
            ));
            lines[4].push_str(&format!(
                "gantry_policy_quarantines_total{{{labels}}} {}\n",
                health.quarantines
            ));
        }
        out.push_str(&format!(
            "# HELP gantry_wasm_budget_bytes Bytes of Wasm memories and tables all instances hold (used), out of the process-wide budget (limit).\n\
             # TYPE gantry_wasm_budget_bytes gauge\n\
             gantry_wasm_budget_bytes{{kind=\"used\"}} {}\n\
             gantry_wasm_budget_bytes{{kind=\"limit\"}} {}\n\
             # HELP gantry_wasm_loaded_policies Policies loaded with their instances: in the active or shadow set, or idle and kept for a while.\n\
             # TYPE gantry_wasm_loaded_policies gauge\n\
             gantry_wasm_loaded_policies {}\n",
            wasm.budget_used_bytes, wasm.budget_limit_bytes, wasm.loaded_policies
        ));
        out.push_str(
            "# HELP gantry_store_history_damaged 1 when the decision history was found damaged at start and moved aside (path: where it was; moved_to: where its bytes are now).\n\
             # TYPE gantry_store_history_damaged gauge\n",
        );
        match history_damage {
            Some(damage) => out.push_str(&format!(
                "gantry_store_history_damaged{{path=\"{}\",moved_to=\"{}\"}} 1\n",
                escape(&damage.path),
                escape(&damage.moved_to)
            )),
            None => out.push_str("gantry_store_history_damaged 0\n"),
        }
        out.push_str("# HELP gantry_policy_calls_total Calls into each loaded Wasm policy.\n# TYPE gantry_policy_calls_total counter\n");
        out.push_str(&lines[0]);
        out.push_str("# HELP gantry_policy_faults_total Faults (timeouts, traps, out of memory, bad output) of each loaded Wasm policy.\n# TYPE gantry_policy_faults_total counter\n");
        out.push_str(&lines[1]);
        out.push_str("# HELP gantry_policy_call_duration_seconds Time spent in each loaded Wasm policy.\n# TYPE gantry_policy_call_duration_seconds summary\n");
        out.push_str(&lines[2]);
        out.push_str("# HELP gantry_policy_quarantined 1 while a policy is quarantined after consecutive faults (its failure policy applies without calling it).\n# TYPE gantry_policy_quarantined gauge\n");
        out.push_str(&lines[3]);
        out.push_str("# HELP gantry_policy_quarantines_total Times each loaded Wasm policy was quarantined.\n# TYPE gantry_policy_quarantines_total counter\n");
        out.push_str(&lines[4]);
        out
    }
}

/// What the loaded Wasm policies hold, for `/metrics`: a budget that only grows, or policies
/// piling up, is what starved uploads and a faulting active policy of instances.
#[derive(Debug, Clone, Copy, Default)]
pub struct WasmFootprint {
    /// Bytes of Wasm memories and tables all live instances hold.
    pub budget_used_bytes: usize,
    /// The process-wide budget they reserve from.
    pub budget_limit_bytes: usize,
    /// Policies loaded (in a set, or idle and kept).
    pub loaded_policies: usize,
}

/// Escapes a label value for the text format.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Registers `collector` and hands it back, so each metric is made and registered in one
/// place and none can be left out of the registry.
fn registered<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    collector: C,
) -> C {
    registry
        .register(Box::new(collector.clone()))
        .expect("unique metric names");
    collector
}

/// A registered counter.
fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    registered(registry, IntCounter::new(name, help).expect("valid metric"))
}

/// A registered gauge.
fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    registered(registry, IntGauge::new(name, help).expect("valid metric"))
}

/// A registered counter with `labels`.
fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    registered(
        registry,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

/// A registered gauge with `labels`.
fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    registered(
        registry,
        IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

/// A registered histogram.
fn histogram(registry: &Registry, opts: HistogramOpts) -> Histogram {
    registered(registry, Histogram::with_opts(opts).expect("valid metric"))
}

/// A registered histogram with `labels`.
fn histogram_vec(registry: &Registry, opts: HistogramOpts, labels: &[&str]) -> HistogramVec {
    registered(
        registry,
        HistogramVec::new(opts, labels).expect("valid metric"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_a_failure_stopped_are_counted_and_every_metric_registers() {
        let metrics = Metrics::new();
        let output = CycleOutput {
            stopped: vec![3, 4],
            ..CycleOutput::default()
        };
        metrics.observe_cycle(&output, Duration::from_millis(1));
        assert_eq!(metrics.failure_stops.get(), 2);
        metrics
            .nodes_by_state
            .with_label_values(&["suspect"])
            .set(1);
        metrics.breaker_tripped.set(1);
        let names: Vec<String> = metrics
            .registry
            .gather()
            .iter()
            .map(|family| family.name().to_string())
            .collect();
        for name in [
            "gantry_nodes",
            "gantry_health_breaker_tripped",
            "gantry_failure_stops_total",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
        }
    }
}
