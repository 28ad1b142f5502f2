//! The live cluster: watch caches in, bindings, Events and conditions out.
//!
//! The scheduling loop is synchronous (it shares [`gantry_core::Scheduler`] with nothing and
//! runs Wasm policies), so this type owns a small tokio runtime for the reflectors and blocks
//! on it only to bind and report.
//!
//! [`KubeCluster`] is a thin [`ClusterSource`] and [`Binder`] over its parts: the watch caches
//! ([`crate::watch`]) that come in, the tracker that turns them into the scheduler's view, and
//! the writer ([`crate::write`]) that sends bindings, evictions, claims, preflight pods, Events
//! and statuses out.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gantry_core::{
    BindOutcome, Binder, Changes, ClusterSource, CycleOutput, NodeState, Scheduler, Symbols,
};

use crate::Result;
use crate::config::KubeConfig;
use crate::connect::{CALL_TIMEOUT, client, client_with, runtime};
use crate::leader::Leadership;
use crate::tracker::{NodeSignal, Tracker};
use crate::watch::Watch;
use crate::write::Writer;

/// The cluster source and binder for a live cluster.
pub struct KubeCluster {
    /// The runtime the caches and calls run on; the loop blocks on it. Dropped last, after
    /// the parts holding its handle.
    runtime: tokio::runtime::Runtime,
    config: KubeConfig,
    /// What comes in: the watch caches.
    watch: Watch,
    /// What goes out: bindings, evictions, claims, Events and statuses.
    writer: Writer,
    /// The scheduler's view of the caches, kept up to date by [`ClusterSource::sync`].
    tracker: Tracker,
    /// Whether the first build of the scheduler's view is done: a signal a node showed before
    /// Gantry started stops its gangs then, as one arriving later would.
    built: bool,
}

impl KubeCluster {
    /// Connects with the kubeconfig at `path` and starts the watch caches.
    pub fn connect(path: &Path, config: KubeConfig) -> Result<Self> {
        let runtime = runtime()?;
        let client = client(&runtime, path)?;
        let evict_client = client_with(&runtime, path, false, Some(CALL_TIMEOUT))?;
        // Writes never retry by themselves: kube-rs's retries (15 tries, honouring
        // Retry-After) would hold a binding past the Lease it was sent under. Each write is
        // one attempt, fenced by the Lease (`write::fenced`); a failed one is tried again by
        // the next pass, after the Lease is checked again.
        let write_client = client_with(&runtime, path, false, Some(CALL_TIMEOUT))?;
        let handle = runtime.handle().clone();
        let watch = Watch::start(handle.clone(), client, write_client.clone(), &config);
        let preflights = crate::write::preflight::Preflights::new(
            config.health.preflight.clone(),
            &config.gpu_resource,
        );
        let writer = Writer::new(handle, write_client, evict_client, preflights);
        let tracker = Tracker::new(config.clone(), Symbols::new());
        Ok(Self {
            runtime,
            config,
            watch,
            writer,
            tracker,
            built: false,
        })
    }

    /// Uses `symbols` for the names the scheduler interns (the scheduler's own table).
    pub fn with_symbols(mut self, symbols: Arc<Symbols>) -> Self {
        self.tracker = Tracker::new(self.config.clone(), symbols);
        self
    }

    /// Waits until every cache holds a full list. Schedule nothing before: a half-filled
    /// bound-pod cache would make used GPUs look free.
    pub fn wait_synced(&self, timeout: Duration) -> Result<()> {
        self.watch.wait_synced(timeout)
    }

    /// Counts watch events; equal values mean the caches have not changed.
    pub fn generation(&self) -> u64 {
        self.watch.generation()
    }

    /// Nodes in the cache.
    pub fn node_count(&self) -> usize {
        self.watch.node_count()
    }

    /// Starts leader election on this cluster's runtime and client (see [`crate::leader`]);
    /// from then on every write checks the Lease first.
    pub fn leader_elect(&mut self, settings: crate::LeaderSettings) -> Arc<Leadership> {
        let leadership =
            crate::leader::start(&self.runtime, self.writer.client().clone(), settings);
        self.writer.leadership = Some(leadership.clone());
        leadership
    }

    /// Stops leader election and releases the Lease if held, so a successor starts at once.
    pub fn resign(&self) {
        if let Some(leadership) = &self.writer.leadership {
            self.runtime.block_on(crate::leader::resign(
                self.writer.client().clone(),
                leadership,
            ));
        }
    }
}

impl KubeCluster {
    /// Hands the nodes' signal changes to the lifecycle: a suspect signal that starts firing
    /// stops the node's gangs whole (`Scheduler::node_failed`; the next bind pass evicts their
    /// pods, and their recreated pods go first); one that clears brings the node back. A node
    /// new to the table (every node, at the first build) already showing a signal is taken
    /// the same way; a node Gantry knew keeps its lifecycle across a rebuild (held by the
    /// breaker, it stays in service).
    fn node_signals(&mut self, scheduler: &mut Scheduler, now_s: f64, rebuilt: bool) {
        let mut failed = std::collections::BTreeSet::new();
        for signal in self.tracker.take_node_signals() {
            match signal {
                NodeSignal::Failed { node, cause } => {
                    let Some(index) = self.tracker.node_index(&node) else {
                        continue;
                    };
                    failed.insert(node.clone());
                    let failure = scheduler.node_failed(index, &cause, now_s);
                    tracing::warn!(
                        node,
                        cause,
                        verdict = ?failure.verdict,
                        stopped = failure.stopped.len(),
                        "node signal"
                    );
                    for job in failure.stopped {
                        self.tracker.stopping(scheduler, job);
                    }
                    // The first signal held since the breaker tripped says so, once, on the
                    // node whose signal tripped it.
                    let breaker = &scheduler.lifecycle().breaker;
                    if failure.verdict == gantry_core::health::Verdict::HeldByBreaker
                        && breaker.held == 1
                        && let Some(trip) = &breaker.tripped
                    {
                        let note = format!(
                            "The health breaker tripped: {}. Automated cordons stop until an admin \
                             resets it (gantry health reset); {node} reported {cause} and was left \
                             in service",
                            trip.reason
                        );
                        self.writer.node_events.push(crate::write::NodeEvent {
                            node: node.clone(),
                            type_: "Warning",
                            reason: "HealthBreakerTripped",
                            note,
                        });
                    }
                }
                NodeSignal::PreflightDue {
                    node,
                    after_failure,
                } => {
                    let Some(index) = self.tracker.node_index(&node) else {
                        continue;
                    };
                    let (cause, from, to) = if after_failure {
                        let cause = format!(
                            "its {} annotation was removed: tested again",
                            crate::preflight::FAILED_ANNOTATION
                        );
                        (cause, NodeState::Repair, NodeState::Retest)
                    } else {
                        let cause = format!(
                            "tainted {}: tested before it takes work",
                            crate::preflight::PREFLIGHT_TAINT
                        );
                        (cause, NodeState::Ready, NodeState::Preflight)
                    };
                    tracing::info!(node, cause, "preflight due");
                    // A taint rebuilt the table, whose lifecycle starts the node in Preflight:
                    // the step is recorded; an annotation removed in place is taken here.
                    match scheduler.lifecycle().state(index) {
                        NodeState::Preflight | NodeState::Retest => {
                            scheduler.lifecycle_mut().record(index, from, &cause, now_s)
                        }
                        _ => scheduler.set_node_state(index, to, &cause, now_s),
                    }
                }
                NodeSignal::Cleared { node } => {
                    let Some(index) = self.tracker.node_index(&node) else {
                        continue;
                    };
                    tracing::info!(node, "node signals cleared: back to ready");
                    // Its health is what the node shows (a cordon stays), set already.
                    scheduler.lifecycle_mut().repaired(index, false, now_s);
                }
            }
        }
        let first = rebuilt && !self.built;
        self.built |= rebuilt;
        let new_nodes = self.tracker.take_new_nodes();
        let suspect: Vec<(String, String)> = self
            .tracker
            .suspect_nodes()
            .iter()
            .map(|(n, c)| (n.clone(), c.clone()))
            .collect();
        for (node, cause) in &suspect {
            let Some(index) = self.tracker.node_index(node) else {
                continue;
            };
            if new_nodes.contains(node) && !failed.contains(node) {
                // The signal showed before Gantry saw the node: its gangs run on a failing
                // node, so they stop now (the breaker still applies).
                let cause = if first {
                    format!("{cause}, before Gantry started")
                } else {
                    format!("{cause}, when it joined")
                };
                let failure = scheduler.node_failed(index, &cause, now_s);
                tracing::warn!(node, cause, verdict = ?failure.verdict, stopped = failure.stopped.len(), "node signal when first seen");
                for job in failure.stopped {
                    self.tracker.stopping(scheduler, job);
                }
            }
            // Out of the scheduler's hands whatever an in-place health change set (a node the
            // breaker held stays Ready, and schedulable).
            if scheduler.lifecycle().state(index).out() {
                scheduler.sync_health(index);
            }
        }
    }
}

impl ClusterSource for KubeCluster {
    /// Applies what the watch caches changed since the last sync: the changed keys only, or
    /// everything after a relist or a node-set change.
    fn sync(&mut self, scheduler: &mut Scheduler, now_s: f64) -> Changes {
        if let Some(leadership) = &self.writer.leadership {
            leadership.beat();
        }
        let unix_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.tracker.set_clock(unix_s, now_s);
        // Victims the last cycle evicted leave the scheduler first; their pods hold their room
        // until they are gone.
        let evicted = self.writer.take_evicted();
        self.tracker.evicted(scheduler, &evicted);
        self.watch.discover_if_due();
        self.writer.read_back_unanswered(&mut self.tracker);
        let synced = self.watch.sync(&mut self.tracker, scheduler);
        if synced.rebuilt {
            // A rebuilt scheduler numbers its jobs afresh.
            self.writer.forget_jobs();
        }
        self.writer.gone.extend(synced.gone);
        let mut changes = self.tracker.finish_sync(scheduler, crate::evict::GIVE_UP);
        self.node_signals(scheduler, now_s, synced.rebuilt);
        let preflight_pods = self.watch.preflight_pods();
        self.writer
            .preflights
            .observe(&preflight_pods, &self.tracker, scheduler, unix_s, now_s);
        changes.nodes = synced.nodes;
        changes.queues = synced.queues_changed;
        changes.rebuilt = synced.rebuilt;
        changes
    }

    fn leading(&self) -> bool {
        self.writer.may_write()
    }

    fn describe(&self) -> Option<String> {
        let leadership = self.writer.leadership.as_ref()?;
        Some(if leadership.is_leader() {
            format!("kube (leader {})", leadership.settings.identity)
        } else {
            let holder = leadership.holder().unwrap_or_else(|| "none yet".into());
            format!("kube (follower; leader {holder})")
        })
    }

    fn leader_elsewhere(&self) -> Option<String> {
        let leadership = self.writer.leadership.as_ref()?;
        (!leadership.is_leader()).then(|| leadership.holder().unwrap_or_else(|| "none yet".into()))
    }

    fn binds_after_lease_loss(&self) -> u64 {
        self.writer.binds_after_lease_loss
    }
}

impl Binder for KubeCluster {
    /// Preempts, binds, and reports why the rest wait; one outcome per placed job.
    fn bind(
        &mut self,
        scheduler: &Scheduler,
        output: &CycleOutput,
        _now_s: f64,
    ) -> Vec<BindOutcome> {
        self.writer
            .pass(&mut self.tracker, self.watch.watched(), scheduler, output)
    }
}
