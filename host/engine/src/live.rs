//! [`Live`]: what the scheduling loop and the API share. The loop decides each cycle through
//! [`Live::decide`] (active set, shadow set, metrics), records what its binder says happened
//! through [`Live::record`] (store, SSE) and publishes a read-only
//! [`ClusterView`] with [`Live::publish`]; the handlers read that view and the store, and change
//! the policy sets. The loop never waits on a request, and a request never waits on a cycle.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, ArcSwapOption};
use gantry_core::{
    BindOutcome, CohortUsage, CycleOutput, Decision, Explanation, JobId, JobRequest, NodeTable,
    Outcome, PodShape, QueueId, QueueUsage, Queues, QuotaVerdict, Resources, Scheduler, Symbols,
};
use gantry_policy::{
    ActiveSet, CycleGate, NodeCache, Policy, PolicyEngine, PolicyOptions, PolicySet, Role,
    SetEntry, WasmNodes,
};
use gantry_store::{
    Actor, FailurePolicy, NewDecision, NewPolicy, PolicyManifest, PolicyRole, Store,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch};

use crate::error::{EngineError, Result};
use crate::metrics::Metrics;

/// Milliseconds since the Unix epoch: the time stamp of records and audit entries.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Server settings that handlers consult.
#[derive(Debug, Clone)]
pub struct LiveConfig {
    /// Largest accepted policy upload, in bytes.
    pub max_upload_bytes: usize,
    /// Disagreements kept in a shadow report (the counts cover all of them).
    pub shadow_keep: usize,
    /// A job left pending for the same reasons, under the same set, is stored (and streamed)
    /// again only after this long: every cycle retries it, and a record per retry would bury
    /// the history that matters under identical copies.
    pub repeat_pending: Duration,
    /// `/healthz` fails once the loop has not gone round for this long.
    pub stale_after: Duration,
    /// Wall time one cycle's policy calls may take; the jobs the cycle has not reached when it
    /// is spent wait, in order, for the next cycle. The shadow thread has a budget of its own
    /// of the same size.
    pub policy_budget: Duration,
}

impl Default for LiveConfig {
    fn default() -> Self {
        Self {
            max_upload_bytes: 32 << 20,
            shadow_keep: 200,
            repeat_pending: Duration::from_secs(30),
            stale_after: Duration::from_secs(30),
            policy_budget: Duration::from_millis(250),
        }
    }
}

/// What the loop publishes about the cluster, a few times a second. Immutable once published,
/// so a handler reads a consistent picture without a lock.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    /// The cluster's name, as the cluster summary reports it.
    pub cluster: String,
    /// When this view was published (ms since the epoch), so a reader can tell how fresh it is.
    pub at_ms: u64,
    /// The node table as the core sees it; names resolve through the engine's symbols.
    pub nodes: Arc<NodeTable>,
    /// Every queue's quota, usage and fair share, in declaration order: what `/api/queues` serves.
    pub queues: Vec<QueueView>,
    /// Jobs pending or running now, by name.
    pub job_to_state: HashMap<String, JobView>,
    /// Running jobs per node index, for "what runs here".
    pub node_to_jobs: HashMap<u32, Vec<String>>,
    /// The first leaf queue's usage, for the quota self-test of an upload.
    pub sample_usage: Option<(QueueUsage, Option<CohortUsage>)>,
    /// Pods of all pending jobs (each pod of a gang counted), for the cluster summary.
    pub pending_pods: u64,
    /// Pods of all running jobs, for the cluster summary.
    pub running_pods: u64,
}

/// One queue's quota, usage, borrowing and fair share.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct QueueView {
    /// The queue's name, as declared.
    pub name: String,
    /// The cohort it belongs to; `None` for a top-level queue.
    pub parent: Option<String>,
    /// GPUs guaranteed to the queue: declared, or its children's sum when it declares none.
    pub nominal_gpus: u64,
    /// GPUs its running jobs hold now (a cohort's include its children's).
    pub used_gpus: u64,
    /// GPUs used beyond the nominal quota, lent by siblings.
    pub borrowed_gpus: u64,
    /// Of the nominal quota, what is idle and may be lent to siblings.
    pub lendable_gpus: u64,
    /// Of the nominal quota, what other queues use now by borrowing it (see [`lent_gpus`]).
    pub lent_gpus: u64,
    /// Most GPUs it may borrow beyond its nominal quota; `None` = no limit.
    pub borrowing_limit_gpus: Option<u64>,
    /// Most of its idle nominal quota it may lend; `None` = all of it.
    pub lending_limit_gpus: Option<u64>,
    /// Its weight against its siblings' in fair share: a higher weight earns a larger share.
    pub weight: u32,
    /// Dominant share of the queue, decayed over time (0 = idle).
    pub fair_share: f64,
    /// Lower goes first among siblings.
    pub fair_share_key: f64,
    /// Jobs submitted to this queue itself (not its children) that wait to be placed.
    pub pending_jobs: u32,
    /// Jobs submitted to this queue itself (not its children) that run now.
    pub running_jobs: u32,
}

/// A job the loop knows about now.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct JobView {
    /// The queue it was submitted to.
    pub queue: String,
    /// Pods in its gang (1 for a single pod).
    pub pods: u32,
    /// GPUs each pod asks for.
    pub gpus_per_pod: u32,
    /// Its priority: higher goes first within its queue.
    pub priority: i32,
    /// When it was submitted, in seconds on the scheduler's clock: among equal priorities the
    /// oldest goes first.
    pub submitted_s: f64,
    /// When it was submitted, in ms since the epoch: the scheduler's clock mapped onto the
    /// wall clock when the view was published, so the UI can show and sort by how long it has
    /// waited.
    pub submitted_ms: u64,
    /// `pending` or `running`.
    pub state: &'static str,
    /// Place among its queue's pending jobs (1 = next), by priority then age.
    pub queue_position: Option<u32>,
    /// A placeholder that holds idle capacity and gives way to real work; `/api/jobs` leaves
    /// these out.
    pub balloon: bool,
    /// When a pending job is expected to start, from the planner's last replan.
    pub estimate: Option<crate::whatif::EstimateView>,
}

/// The candidate of a shadow run and what it has found so far.
struct Shadow {
    set: Arc<PolicySet>,
    /// Accumulated by the loop, read by the report handler; held briefly by each.
    report: Mutex<ShadowReport>,
}

/// Where a candidate set disagrees with the active one, over the shadow run so far.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct ShadowReport {
    /// The policy-set version under test.
    pub candidate_version: u64,
    /// When the shadow run started (ms since the epoch).
    pub started_ms: u64,
    /// Who started it, as the audit log names them.
    pub started_by: String,
    /// Cycles in which the candidate decided beside the active set.
    pub cycles: u64,
    /// Cycles the candidate sat out because the shadow thread was still busy with an earlier
    /// one: the active set never waits for the candidate.
    pub cycles_skipped: u64,
    /// Decisions of the active set compared with the candidate's: what the counts are out of.
    pub decisions_compared: u64,
    /// Disagreements by kind (`other-nodes`, `other-domain`, `rejected-by-candidate`,
    /// `admitted-by-candidate`).
    pub counts: BTreeMap<String, u64>,
    /// The most recent disagreements, newest last, with both explanations.
    #[cfg_attr(feature = "schema", schema(value_type = Vec<ShadowDisagreement>))]
    pub recent: VecDeque<ShadowDisagreement>,
}

/// One job decided differently by the candidate.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct ShadowDisagreement {
    /// When the cycle that decided ran (ms since the epoch).
    pub time_ms: u64,
    /// The job decided differently.
    pub job: String,
    /// How the two differ: one of the kinds counted in [`ShadowReport::counts`].
    pub kind: String,
    /// The version of the active set that made the real decision.
    pub active_set: u64,
    /// The active set's explanation of what it decided.
    pub active: Explanation,
    /// The candidate's explanation of what it would have decided.
    pub candidate: Explanation,
}

/// What validating an upload found: the policy's own description and its self-test.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Validation {
    /// The name the policy declares.
    pub name: String,
    /// The version the policy declares.
    pub version: String,
    /// `filter`, `score` or `quota`: the interface it exports, so where in a cycle it runs.
    pub role: String,
    /// SHA-256 of the module's bytes: the key it is stored under and sets refer to it by.
    pub sha256: String,
    /// Size of the module, in bytes.
    pub size: u64,
    /// Declared reason codes and their texts, sorted by code: how its verdicts will read in
    /// explanations.
    pub reasons: Vec<(u16, String)>,
    /// One line on how it answered a sample request against the current cluster snapshot.
    pub self_test: String,
}

/// The answer to an upload.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Upload {
    /// The stored policy's manifest.
    pub manifest: PolicyManifest,
    /// True when the same bytes were stored before; the API then answers 200 rather than 201.
    pub already_stored: bool,
    /// What validating the upload found.
    pub validation: Validation,
}

/// A decision as the SSE feed sends it: small, with the one-line summary.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct DecisionEvent {
    /// When the cycle that decided ran (ms since the epoch).
    pub time_ms: u64,
    /// The job decided about.
    pub job: String,
    /// The queue it was submitted to.
    pub queue: String,
    /// True when every pod has a node; false when the job stays pending.
    pub placed: bool,
    /// Pods in its gang (1 for a single pod).
    pub pods: u32,
    /// GPUs each pod asks for.
    pub gpus_per_pod: u32,
    /// Names of the nodes it was placed on; empty when pending.
    pub nodes: Vec<String>,
    /// The topology domain a gang was placed in, e.g. `rack 12`.
    pub domain: Option<String>,
    /// The policy-set version that decided.
    pub policy_set: u64,
    /// The decision's one-line summary, as the live feed shows it.
    pub summary: String,
}

/// How often the queues are sampled for their history.
pub const HISTORY_EVERY: Duration = Duration::from_secs(5);
/// How long a queue's samples are kept: an hour, 720 samples per queue.
pub const HISTORY_KEEP: Duration = Duration::from_secs(3600);
/// Queues with a history, at most: each ring is bounded, and so is their number, should a live
/// cluster's queue labels keep inventing names.
const HISTORY_MAX_QUEUES: usize = 256;

/// One queue at one instant.
#[derive(Debug, Clone, Copy)]
struct QueueSample {
    at_ms: u64,
    used_gpus: u64,
    nominal_gpus: u64,
    borrowed_gpus: u64,
    lent_gpus: u64,
    fair_share: f64,
    fair_share_key: f64,
    pending_jobs: u32,
}

/// The queues' recent past, sampled by the loop.
#[derive(Debug, Default)]
struct QueueHistory {
    /// When the last sample was taken (ms since the epoch; 0 = never).
    last_ms: u64,
    /// Per queue name, its samples oldest first: a ring of at most an hour's worth. Ordered so
    /// the route lists the queues in a stable order.
    queue_to_samples: BTreeMap<String, VecDeque<QueueSample>>,
}

/// One queue's history as columns of equal length, oldest first: what the queues page charts.
#[derive(Debug, Clone, Default, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct QueueSeries {
    /// The queue's name.
    pub name: String,
    /// When each sample was taken (ms since the epoch): the chart's time axis.
    pub at_ms: Vec<u64>,
    /// GPUs in use at each sample.
    pub used_gpus: Vec<u64>,
    /// Nominal quota at each sample.
    pub nominal_gpus: Vec<u64>,
    /// GPUs used beyond the nominal quota at each sample.
    pub borrowed_gpus: Vec<u64>,
    /// GPUs of its nominal quota that other queues used at each sample.
    pub lent_gpus: Vec<u64>,
    /// Fair share at each sample, as [`QueueView::fair_share`].
    pub fair_share: Vec<f64>,
    /// Fair-share key at each sample (lower goes first among siblings).
    pub fair_share_key: Vec<f64>,
    /// Pending jobs at each sample.
    pub pending_jobs: Vec<u32>,
}

/// The queues' history, as the history route serves it.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct QueueHistoryView {
    /// Time between samples.
    pub interval_ms: u64,
    /// How far back samples are kept.
    pub keep_ms: u64,
    /// One series per queue with samples, ordered by name.
    pub queues: Vec<QueueSeries>,
}

/// GPUs of each queue's nominal quota that other queues use now by borrowing them.
///
/// The core records what each queue borrows beyond its quota, not from whom: a borrower draws
/// on its siblings' idle quota as one pool (see `Queues::admission`). So, level by level from
/// the top, what a group of siblings borrows from each other (their borrowing less what their
/// parent borrows from its own siblings) is split over the group's lenders in proportion to
/// what each may lend. What a cohort lends to its siblings is, in turn, its children's idle
/// quota: it is split over them in proportion to what they may still lend.
pub fn lent_gpus(queues: &Queues) -> Vec<u64> {
    let mut lent = vec![0u64; queues.len()];
    let roots: Vec<QueueId> = queues
        .ids()
        .filter(|&id| queues.parent(id).is_none())
        .collect();
    lend_within(queues, &roots, None, &mut lent);
    lent
}

/// Splits the borrowing inside one group of siblings over its lenders, then recurses.
fn lend_within(queues: &Queues, group: &[QueueId], parent: Option<QueueId>, lent: &mut [u64]) {
    let from_above = parent.map_or(0, |p| queues.borrowed(p));
    let borrowed: u64 = group.iter().map(|&q| queues.borrowed(q)).sum();
    let lendable: Vec<u64> = group.iter().map(|&q| queues.lendable(q)).collect();
    let within = split(borrowed.saturating_sub(from_above), &lendable);
    // What the parent lends outwards comes from its children's idle quota that is left.
    let left: Vec<u64> = lendable
        .iter()
        .zip(&within)
        .map(|(l, w)| l.saturating_sub(*w))
        .collect();
    let outwards = split(parent.map_or(0, |p| lent[p]), &left);
    for (i, &q) in group.iter().enumerate() {
        lent[q] = within[i] + outwards[i];
    }
    for &q in group {
        let children = queues.children(q);
        if !children.is_empty() {
            lend_within(queues, children, Some(q), lent);
        }
    }
}

/// `total` (at most the weights' sum) split in proportion to `weights`, each share at most its
/// weight; the remainder of the rounding goes to the largest fractions.
fn split(total: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let total = u128::from(total).min(sum);
    let mut shares: Vec<u64> = Vec::with_capacity(weights.len());
    let mut remainders: Vec<(u128, usize)> = Vec::with_capacity(weights.len());
    for (i, &w) in weights.iter().enumerate() {
        let exact = total * u128::from(w);
        shares.push((exact / sum) as u64);
        remainders.push((exact % sum, i));
    }
    let mut short = (total - shares.iter().map(|&s| u128::from(s)).sum::<u128>()) as usize;
    remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, i) in &remainders {
        if short == 0 {
            break;
        }
        if shares[i] < weights[i] {
            shares[i] += 1;
            short -= 1;
        }
    }
    shares
}

/// A loaded policy is keyed by its bytes, its config, its failure policy and its call deadline
/// (ms): the same entry in two set versions is one instance pool, so rolling back
/// re-initialises nothing.
type EntryKey = (String, String, FailurePolicy, Option<u64>);

/// The state the scheduling loop and the API handlers share. See the module docs.
pub struct Live {
    /// Decisions, policies, sets and the audit log; handlers read it directly.
    pub store: Store,
    /// Server settings the loop and the handlers consult.
    pub config: LiveConfig,
    /// Prometheus metrics: the loop and [`Live`]'s methods update them, `/metrics` renders them.
    pub metrics: Metrics,
    engine: Arc<PolicyEngine>,
    /// The set cycles run on: swapped by activations, loaded once at the start of each cycle.
    active: Arc<ActiveSet>,
    /// The candidate in shadow mode, if any; loaded once per cycle like the active set.
    shadow: ArcSwapOption<Shadow>,
    /// Hands a copy of each cycle's state to the shadow thread, started with the first shadow
    /// run. A rendezvous channel: when the thread is still busy, the cycle is skipped for the
    /// candidate instead of queued, so a slow candidate never delays or piles up behind the
    /// active set.
    shadow_tx: OnceLock<ShadowThread>,
    /// What-if questions from the API, answered by the loop between cycles; held only to push
    /// or take them.
    pub(crate) what_ifs: Mutex<Vec<crate::whatif::WhatIfAsk>>,
    /// Held by the loop while the active set decides; the shadow thread's calls wait on it, so
    /// the candidate runs only in the loop's spare time.
    cycle_gate: Arc<CycleGate>,
    /// The latest cluster picture; replaced whole by each publish.
    view: ArcSwap<ClusterView>,
    /// Decision events for SSE subscribers; lagging subscribers lose the oldest events.
    decisions_tx: broadcast::Sender<Arc<DecisionEvent>>,
    /// Loaded policies, so set versions sharing an entry share its instances. Locked only to
    /// look up or insert, never across a load.
    entry_to_policy: Mutex<HashMap<EntryKey, Arc<Policy>>>,
    /// Serialises activations, so the store's active pointer and the running set always name
    /// the same version.
    activation: Mutex<()>,
    /// Set by an activation to cut the loop's idle wait short, so a new set takes effect on the
    /// next cycle at once rather than after the pause.
    wake: (Mutex<bool>, Condvar),
    /// The set version of the cycle that started last and when it started, for the
    /// activation-latency benchmark.
    cycle_version: watch::Sender<(u64, Instant)>,
    /// True once the loop published its first view.
    ready: AtomicBool,
    /// When the loop last went round (ms since the epoch; 0 = not yet): `/healthz` fails when
    /// it is stale, and a leader stops renewing its Lease.
    heartbeat_ms: AtomicU64,
    /// Per pending job: when its last stored decision was made and a digest of what it said.
    /// Only the loop touches it (once per cycle); placed jobs leave it.
    job_to_last_stored: Mutex<HashMap<String, (u64, u64)>>,
    /// Each queue's recent samples, for the fair-share-over-time chart. The loop writes one
    /// sample per queue every [`HISTORY_EVERY`] (inside `publish`) and the history handler
    /// copies them out; each holds the lock only for that, so neither waits on the other long.
    history: Mutex<QueueHistory>,
}

impl Live {
    /// The shared state, running `initial` until an admin activates another set.
    pub fn new(
        store: Store,
        engine: Arc<PolicyEngine>,
        initial: PolicySet,
        config: LiveConfig,
    ) -> Arc<Self> {
        let version = initial.version();
        let (decisions_tx, _) = broadcast::channel(4096);
        let metrics = Metrics::new();
        metrics.active_set.set(version as i64);
        let cycle_gate = engine.cycle_gate();
        Arc::new(Self {
            store,
            config,
            metrics,
            engine,
            active: Arc::new(ActiveSet::new(initial)),
            shadow: ArcSwapOption::empty(),
            shadow_tx: OnceLock::new(),
            cycle_gate,
            what_ifs: Mutex::default(),
            view: ArcSwap::from_pointee(ClusterView::default()),
            decisions_tx,
            entry_to_policy: Mutex::new(HashMap::new()),
            activation: Mutex::new(()),
            wake: (Mutex::new(false), Condvar::new()),
            cycle_version: watch::Sender::new((version, Instant::now())),
            ready: AtomicBool::new(false),
            heartbeat_ms: AtomicU64::new(0),
            job_to_last_stored: Mutex::new(HashMap::new()),
            history: Mutex::new(QueueHistory::default()),
        })
    }

    /// The engine's interned names, to resolve the node table's names for the API.
    pub fn symbols(&self) -> &Arc<Symbols> {
        self.engine.symbols()
    }

    /// The cluster picture the loop published last; a handler reads it without a lock.
    pub fn view(&self) -> Arc<ClusterView> {
        self.view.load_full()
    }

    /// The loop went round: called once per pass, whatever the pass did.
    pub fn beat(&self) {
        self.heartbeat_ms.store(now_ms(), Ordering::Release);
    }

    /// How long ago the loop last went round; `None` before its first pass.
    pub fn heartbeat_age(&self) -> Option<Duration> {
        match self.heartbeat_ms.load(Ordering::Acquire) {
            0 => None,
            at => Some(Duration::from_millis(now_ms().saturating_sub(at))),
        }
    }

    /// Applies retention (age and size) to the decision history, logging what it removed.
    pub fn compact(&self) {
        match self.store.compact(now_ms()) {
            Ok(report) if report.deleted > 0 => {
                tracing::info!(
                    deleted = report.deleted,
                    bytes = report.bytes_after,
                    "retention"
                )
            }
            Ok(_) => {}
            Err(error) => tracing::error!(%error, "retention failed"),
        }
    }

    /// Whether the loop has published its first view.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The policy set new cycles run on.
    pub fn active_set(&self) -> Arc<PolicySet> {
        self.active.load()
    }

    /// A receiver of decision events for an SSE client; a lagging one loses the oldest.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<DecisionEvent>> {
        self.decisions_tx.subscribe()
    }

    /// Watches the set version each cycle starts with, and when it started.
    pub fn cycle_versions(&self) -> watch::Receiver<(u64, Instant)> {
        self.cycle_version.subscribe()
    }

    /// The loop's pause between cycles: returns early when an activation asks for a cycle.
    pub fn idle(&self, pause: Duration) {
        let (lock, cvar) = &self.wake;
        let guard = lock.lock().unwrap_or_else(|e| e.into_inner());
        let (mut woken, _) = cvar
            .wait_timeout_while(guard, pause, |woken| !*woken)
            .unwrap_or_else(|e| e.into_inner());
        *woken = false;
    }

    pub(crate) fn wake_loop(&self) {
        let (lock, cvar) = &self.wake;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cvar.notify_all();
    }

    /// One scheduling cycle on the active set (and the shadow candidate beside it, binding
    /// nothing). Nothing is stored yet: [`Live::record`] stores what the binder says happened.
    pub fn decide(
        &self,
        scheduler: &mut Scheduler,
        cache: &mut NodeCache,
        now_s: f64,
        time_ms: u64,
    ) -> CycleOutput {
        let _span = tracing::debug_span!("cycle", now_s).entered();
        let set = self.active.load();
        self.cycle_version
            .send_replace((set.version(), Instant::now()));
        // The candidate decides on its own thread, on a copy of the state as the active set
        // sees it. It is handed the copy once the active set has decided, so it starts in the
        // loop's pause, and its calls wait while the active set decides: on a machine with
        // few cores, any work beside a cycle slows it.
        let copy = self
            .shadow
            .load_full()
            .and_then(|shadow| self.shadow_copy(shadow, scheduler));
        let started = Instant::now();
        let output = {
            let _in_cycle = self.cycle_gate.enter();
            let mut bound = set.bind(cache).with_budget(self.config.policy_budget);
            scheduler.cycle(now_s, &mut bound)
        };
        self.metrics.observe_cycle(&output, started.elapsed());
        if let Some((shadow, scheduler)) = copy {
            self.send_shadow(ShadowJob {
                shadow,
                scheduler,
                now_s,
                time_ms,
                active_set: set.version(),
                active: Arc::new(output.clone()),
            });
        }
        output
    }

    /// The shadow thread, started on first use.
    fn shadow_thread(&self) -> &ShadowThread {
        self.shadow_tx.get_or_init(|| {
            spawn_shadow_thread(
                self.cycle_gate.clone(),
                self.metrics.shadow_disagreements.clone(),
                self.config.shadow_keep,
                self.config.policy_budget,
            )
        })
    }

    /// Counts a cycle the shadow thread was too busy to take.
    fn skip_shadow(&self, shadow: &Shadow) {
        self.metrics
            .shadow_cycles
            .with_label_values(&["skipped"])
            .inc();
        shadow
            .report
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .cycles_skipped += 1;
    }

    /// A copy of the scheduler as the active set is about to see it, unless the shadow thread
    /// is still busy with an earlier cycle (copying costs the active cycle; skip it then).
    fn shadow_copy(
        &self,
        shadow: Arc<Shadow>,
        scheduler: &Scheduler,
    ) -> Option<(Arc<Shadow>, Scheduler)> {
        if !self.shadow_thread().idle.load(Ordering::Acquire) {
            self.skip_shadow(&shadow);
            return None;
        }
        Some((shadow, scheduler.clone()))
    }

    /// Gives the shadow thread a cycle, with the active set's output to compare against.
    fn send_shadow(&self, job: ShadowJob) {
        match self.shadow_thread().jobs.try_send(job) {
            Ok(()) => self.metrics.shadow_cycles.with_label_values(&["run"]).inc(),
            Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => {
                self.skip_shadow(&job.shadow);
            }
        }
    }

    /// Stores and streams a cycle's decisions as the binder says they turned out: a placement
    /// whose binding failed, or that waits for its victims to leave, is recorded as pending
    /// with that reason, never as placed.
    ///
    /// `preempted` are the records of the jobs the cycle evicted (pending again), so that a
    /// victim's history says what happened to it.
    pub fn record(
        &self,
        output: &CycleOutput,
        outcomes: &[BindOutcome],
        preempted: &[Decision],
        time_ms: u64,
    ) {
        let job_to_outcome: HashMap<JobId, &BindOutcome> =
            outcomes.iter().map(|o| (o.job(), o)).collect();
        let mut happened = CycleOutput {
            decisions: Vec::with_capacity(output.decisions.len()),
            ..CycleOutput::default()
        };
        for decision in &output.decisions {
            let waiting_for = match job_to_outcome.get(&decision.job) {
                _ if !decision.placed => None,
                Some(BindOutcome::Bound { .. }) => None,
                Some(BindOutcome::Failed { reason, .. }) => {
                    self.metrics.binding_failed();
                    Some(format!("its binding to be retried (it failed: {reason})"))
                }
                Some(BindOutcome::Nominated { waiting_for, .. }) => Some(waiting_for.clone()),
                None => Some("a binding the binder never reported".to_string()),
            };
            let mut decision = decision.clone();
            if let Some(waiting_for) = waiting_for {
                decision.placed = false;
                decision.explanation.outcome = Outcome::Pending { waiting_for };
            }
            happened.decisions.push(decision);
        }
        happened.decisions.extend_from_slice(preempted);
        self.store_decisions(&happened, time_ms);
    }

    /// The decisions worth keeping: every placement, and a pending job's decision when it says
    /// something new (other reasons, another set) or `repeat_pending` has passed.
    fn worth_storing<'a>(&self, output: &'a CycleOutput, time_ms: u64) -> Vec<&'a Decision> {
        let repeat_ms = self.config.repeat_pending.as_millis() as u64;
        let mut last = self
            .job_to_last_stored
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        output
            .decisions
            .iter()
            .filter(|d| {
                let e = &d.explanation;
                if d.placed {
                    last.remove(&e.job);
                    return true;
                }
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                e.summary().hash(&mut hasher);
                e.policy_set.hash(&mut hasher);
                e.faults.hash(&mut hasher);
                let digest = hasher.finish();
                match last.get_mut(&e.job) {
                    Some((at, seen)) if *seen == digest && time_ms < *at + repeat_ms => false,
                    Some(entry) => {
                        *entry = (time_ms, digest);
                        true
                    }
                    None => {
                        last.insert(e.job.clone(), (time_ms, digest));
                        true
                    }
                }
            })
            .collect()
    }

    fn store_decisions(&self, output: &CycleOutput, time_ms: u64) {
        let kept = self.worth_storing(output, time_ms);
        if kept.is_empty() {
            return;
        }
        let batch: Vec<NewDecision> = kept
            .iter()
            .map(|d| NewDecision {
                time_ms,
                explanation: d.explanation.clone(),
            })
            .collect();
        if let Err(error) = self.store.append_decisions(&batch) {
            self.metrics.cycle_failures.inc();
            tracing::error!(%error, "cannot store this cycle's decisions");
        }
        if self.decisions_tx.receiver_count() == 0 {
            return;
        }
        for d in kept {
            let e = &d.explanation;
            let nodes = match &e.outcome {
                Outcome::Placed { nodes } => nodes.iter().map(|(n, _)| n.clone()).collect(),
                Outcome::Pending { .. } => Vec::new(),
            };
            let _ = self.decisions_tx.send(Arc::new(DecisionEvent {
                time_ms,
                job: e.job.clone(),
                queue: e.queue.clone(),
                placed: d.placed,
                pods: e.pods,
                gpus_per_pod: e.gpus_per_pod,
                nodes,
                domain: e.domain.clone(),
                policy_set: e.policy_set,
                summary: e.summary(),
            }));
        }
    }

    /// Records which job each pod belongs to, so decisions can be looked up by pod.
    pub fn record_pods(&self, pod_to_job: &[(String, String)]) {
        if let Err(error) = self.store.record_pods(pod_to_job) {
            tracing::warn!(%error, "cannot record pod names");
        }
    }

    /// Replaces the cluster picture the API serves.
    pub fn publish(&self, scheduler: &Scheduler, cluster: &str) {
        let _span = tracing::debug_span!("publish").entered();
        let queues = &scheduler.queues;
        let mut queue_pending: HashMap<usize, u32> = HashMap::new();
        let mut queue_running: HashMap<usize, u32> = HashMap::new();
        let mut job_to_state: HashMap<String, JobView> = HashMap::new();
        let mut node_to_jobs: HashMap<u32, Vec<String>> = HashMap::new();
        let mut pending_pods = 0u64;
        let mut running_pods = 0u64;
        let mut by_queue: HashMap<usize, Vec<(i32, f64, String)>> = HashMap::new();
        let published_ms = now_ms();
        let clock_s = scheduler.clock_s();
        let view_of = |spec: &gantry_core::JobSpec, state: &'static str| JobView {
            queue: queues.name(spec.queue).to_string(),
            pods: spec.pods,
            gpus_per_pod: spec.shape.gpus,
            priority: spec.priority,
            submitted_s: spec.submit_s,
            submitted_ms: published_ms
                .saturating_sub(((clock_s - spec.submit_s).max(0.0) * 1000.0) as u64),
            state,
            queue_position: None,
            balloon: spec.balloon,
            estimate: None,
        };
        for id in scheduler.pending() {
            let spec = scheduler.job(id);
            pending_pods += u64::from(spec.pods);
            *queue_pending.entry(spec.queue).or_default() += 1;
            by_queue.entry(spec.queue).or_default().push((
                spec.priority,
                spec.submit_s,
                spec.name.clone(),
            ));
            let mut view = view_of(spec, "pending");
            view.estimate = scheduler.start_estimate(id).map(|estimate| {
                crate::whatif::EstimateView::new(estimate, scheduler.clock_s(), published_ms)
            });
            job_to_state.insert(spec.name.clone(), view);
        }
        for jobs in by_queue.values_mut() {
            jobs.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.total_cmp(&b.1)));
            for (i, (_, _, name)) in jobs.iter().enumerate() {
                if let Some(view) = job_to_state.get_mut(name) {
                    view.queue_position = Some(i as u32 + 1);
                }
            }
        }
        for id in scheduler.running() {
            let spec = scheduler.job(id);
            running_pods += u64::from(spec.pods);
            *queue_running.entry(spec.queue).or_default() += 1;
            for slot in scheduler.slots(id) {
                let jobs = node_to_jobs.entry(slot.node).or_default();
                if jobs.last() != Some(&spec.name) {
                    jobs.push(spec.name.clone());
                }
            }
            job_to_state.insert(spec.name.clone(), view_of(spec, "running"));
        }
        let lent = lent_gpus(queues);
        let queue_views: Vec<QueueView> = queues
            .ids()
            .map(|id| {
                let def = queues.def(id);
                QueueView {
                    name: def.name.clone(),
                    parent: def.parent.clone(),
                    nominal_gpus: queues.nominal(id),
                    used_gpus: queues.used(id).gpus,
                    borrowed_gpus: queues.borrowed(id),
                    lendable_gpus: queues.lendable(id),
                    lent_gpus: lent[id],
                    borrowing_limit_gpus: def.borrowing_limit_gpus,
                    lending_limit_gpus: def.lending_limit_gpus,
                    weight: def.weight,
                    fair_share: queues.fair_share(id),
                    fair_share_key: queues.fair_share_key(id),
                    pending_jobs: queue_pending.get(&id).copied().unwrap_or(0),
                    running_jobs: queue_running.get(&id).copied().unwrap_or(0),
                }
            })
            .collect();
        let sample_usage = queues
            .ids()
            .find(|&id| queues.children(id).is_empty())
            .map(|id| scheduler.usage(id));
        self.metrics.pending_pods.set(pending_pods as i64);
        let at_ms = now_ms();
        self.sample_history(&queue_views, at_ms);
        self.view.store(Arc::new(ClusterView {
            cluster: cluster.to_string(),
            at_ms,
            nodes: Arc::new(scheduler.state.nodes.clone()),
            queues: queue_views,
            job_to_state,
            node_to_jobs,
            sample_usage,
            pending_pods,
            running_pods,
        }));
        self.ready.store(true, Ordering::Release);
    }

    /// Adds a sample of every queue to the history when [`HISTORY_EVERY`] has passed since the
    /// last one, and drops samples older than [`HISTORY_KEEP`].
    fn sample_history(&self, queues: &[QueueView], at_ms: u64) {
        let every = HISTORY_EVERY.as_millis() as u64;
        let keep = HISTORY_KEEP.as_millis() as u64;
        let mut history = self.history.lock().unwrap_or_else(|e| e.into_inner());
        // A clock that stepped back restarts the pacing rather than pausing it.
        if history.last_ms != 0 && at_ms < history.last_ms + every && at_ms >= history.last_ms {
            return;
        }
        history.last_ms = at_ms;
        let per_queue = (keep / every) as usize + 1;
        for q in queues {
            if history.queue_to_samples.len() >= HISTORY_MAX_QUEUES
                && !history.queue_to_samples.contains_key(&q.name)
            {
                continue;
            }
            let ring = history.queue_to_samples.entry(q.name.clone()).or_default();
            ring.push_back(QueueSample {
                at_ms,
                used_gpus: q.used_gpus,
                nominal_gpus: q.nominal_gpus,
                borrowed_gpus: q.borrowed_gpus,
                lent_gpus: q.lent_gpus,
                fair_share: q.fair_share,
                fair_share_key: q.fair_share_key,
                pending_jobs: q.pending_jobs,
            });
            while ring.len() > per_queue {
                ring.pop_front();
            }
        }
        // Old samples leave every ring, including those of queues that no longer exist.
        let oldest = at_ms.saturating_sub(keep);
        history.queue_to_samples.retain(|_, ring| {
            while ring.front().is_some_and(|s| s.at_ms < oldest) {
                ring.pop_front();
            }
            !ring.is_empty()
        });
    }

    /// Each queue's samples taken after `since_ms`, oldest first.
    pub fn queue_history(&self, since_ms: u64) -> QueueHistoryView {
        let history = self.history.lock().unwrap_or_else(|e| e.into_inner());
        let queues = history
            .queue_to_samples
            .iter()
            .map(|(name, ring)| {
                let mut series = QueueSeries {
                    name: name.clone(),
                    ..QueueSeries::default()
                };
                for s in ring.iter().filter(|s| s.at_ms > since_ms) {
                    series.at_ms.push(s.at_ms);
                    series.used_gpus.push(s.used_gpus);
                    series.nominal_gpus.push(s.nominal_gpus);
                    series.borrowed_gpus.push(s.borrowed_gpus);
                    series.lent_gpus.push(s.lent_gpus);
                    series.fair_share.push(s.fair_share);
                    series.fair_share_key.push(s.fair_share_key);
                    series.pending_jobs.push(s.pending_jobs);
                }
                series
            })
            .collect();
        QueueHistoryView {
            interval_ms: HISTORY_EVERY.as_millis() as u64,
            keep_ms: HISTORY_KEEP.as_millis() as u64,
            queues,
        }
    }

    /// Compiles `bytes`, initialises it with `config` and runs it once against the current
    /// cluster snapshot. Nothing is stored.
    pub fn validate(
        &self,
        bytes: &[u8],
        config: &str,
        deadline_ms: Option<u64>,
    ) -> Result<(Arc<Policy>, Validation)> {
        if bytes.len() > self.config.max_upload_bytes {
            return Err(EngineError::TooLarge {
                size: bytes.len(),
                limit: self.config.max_upload_bytes,
            });
        }
        let options = PolicyOptions {
            deadline: deadline_ms.map(Duration::from_millis),
            ..PolicyOptions::with_config(config)
        };
        let policy = Arc::new(self.engine.load(bytes, options)?);
        let self_test = self.self_test(&policy)?;
        let info = policy.info();
        let validation = Validation {
            name: info.name.clone(),
            version: info.version.clone(),
            role: info.role.as_str().to_string(),
            sha256: info.sha256.clone(),
            size: bytes.len() as u64,
            reasons: info.reasons.clone(),
            self_test,
        };
        Ok((policy, validation))
    }

    fn self_test(&self, policy: &Policy) -> Result<String> {
        let view = self.view();
        let symbols = self.symbols();
        let queue = view.sample_usage.as_ref().map(|(q, _)| q.name).unwrap_or(0);
        let pod = PodShape {
            name: symbols.intern("gantry-self-test"),
            queue,
            gpus: 8,
            gang_size: 1,
            ..PodShape::default()
        };
        let n = view.nodes.len();
        match policy.role() {
            Role::Filter => {
                let nodes = WasmNodes::new(&view.nodes);
                let codes = policy
                    .filter(&pod, &nodes)
                    .map_err(|f| EngineError::SelfTest(f.to_string()))?;
                Ok(format!(
                    "an 8-GPU pod on the {n} current nodes: {}",
                    policy.describe_verdicts(&codes)
                ))
            }
            Role::Score => {
                let nodes = WasmNodes::new(&view.nodes);
                let scores = policy
                    .score(&pod, &nodes)
                    .map_err(|f| EngineError::SelfTest(f.to_string()))?;
                let best = scores.iter().copied().max().unwrap_or(0);
                let mean =
                    scores.iter().map(|&s| u64::from(s)).sum::<u64>() / scores.len().max(1) as u64;
                Ok(format!(
                    "an 8-GPU pod on the {n} current nodes: best score {best}, mean {mean}"
                ))
            }
            Role::Quota => {
                let Some((queue, cohort)) = view.sample_usage.clone() else {
                    return Ok("no queues yet: quota self-test skipped".into());
                };
                let job = JobRequest {
                    pod: PodShape {
                        gang_size: 8,
                        ..pod
                    },
                    count: 8,
                    total: Resources::gpus(64),
                };
                let verdict = policy
                    .admit(&job, &queue, cohort.as_ref())
                    .map_err(|f| EngineError::SelfTest(f.to_string()))?;
                let verdict = match verdict {
                    QuotaVerdict::Admit => "admit".to_string(),
                    QuotaVerdict::AdmitBorrowing { borrowed } => {
                        format!("admit, borrowing {} GPUs", borrowed.gpus)
                    }
                    QuotaVerdict::Deny { reason } => format!("deny: {reason}"),
                };
                Ok(format!(
                    "a 64-GPU job from {}: {verdict}",
                    symbols.resolve(queue.name)
                ))
            }
        }
    }

    /// Validates and stores a policy (audited as `policy.upload`).
    /// `deadline_ms`: the call deadline the self-test runs under (the engine's when `None`),
    /// so a policy that needs more time can be stored to run in a set entry granting it.
    pub fn upload(
        &self,
        actor: &Actor,
        bytes: &[u8],
        config: &str,
        deadline_ms: Option<u64>,
    ) -> Result<Upload> {
        let (policy, validation) = self.validate(bytes, config, deadline_ms)?;
        let role = match policy.role() {
            Role::Filter => PolicyRole::Filter,
            Role::Score => PolicyRole::Score,
            Role::Quota => PolicyRole::Quota,
        };
        let put = self.store.put_policy(
            actor,
            bytes,
            NewPolicy {
                name: validation.name.clone(),
                role,
                version: validation.version.clone(),
                config: config.to_string(),
            },
            now_ms(),
        )?;
        self.entry_to_policy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((
                validation.sha256.clone(),
                config.to_string(),
                FailurePolicy::Default,
                deadline_ms,
            ))
            .or_insert(policy);
        Ok(Upload {
            manifest: put.manifest,
            already_stored: put.already_stored,
            validation,
        })
    }

    /// The runtime set for a stored set version: each entry loaded (or found loaded).
    pub fn build_set(&self, stored: &gantry_store::PolicySet) -> Result<PolicySet> {
        let mut entries = Vec::with_capacity(stored.entries.len());
        for entry in &stored.entries {
            let key = (
                entry.sha256.clone(),
                entry.config.clone(),
                entry.failure,
                entry.deadline_ms,
            );
            let cached = self
                .entry_to_policy
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&key)
                .cloned();
            let policy = match cached {
                Some(policy) => policy,
                None => {
                    let bytes = self.store.policy_bytes(&entry.sha256)?.ok_or_else(|| {
                        EngineError::NotFound(format!(
                            "no policy with sha256 {} is stored",
                            entry.sha256
                        ))
                    })?;
                    let failure = match entry.failure {
                        FailurePolicy::Default => None,
                        FailurePolicy::FailOpen => Some(gantry_policy::FailurePolicy::FailOpen),
                        FailurePolicy::FailClosed => Some(gantry_policy::FailurePolicy::FailClosed),
                    };
                    let options = PolicyOptions {
                        failure,
                        deadline: entry.deadline_ms.map(Duration::from_millis),
                        ..PolicyOptions::with_config(entry.config.clone())
                    };
                    let policy = Arc::new(self.engine.load(&bytes, options)?);
                    self.entry_to_policy
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(key)
                        .or_insert(policy)
                        .clone()
                }
            };
            entries.push(SetEntry {
                policy,
                weight: entry.weight,
            });
        }
        Ok(PolicySet::new(stored.version, entries))
    }

    /// Makes a stored set version active (audited as `set.activate`, or `set.rollback`): its
    /// policies are loaded first, so a set that cannot run is refused and nothing changes.
    /// Returns once every cycle that starts from now on runs on it.
    pub fn activate(
        &self,
        actor: &Actor,
        version: u64,
        rollback: bool,
    ) -> Result<gantry_store::PolicySet> {
        let _guard = self.activation.lock().unwrap_or_else(|e| e.into_inner());
        let stored = self.store.get_set(version)?.ok_or(EngineError::Store(
            gantry_store::StoreError::UnknownSetVersion(version),
        ))?;
        let runtime = Arc::new(self.build_set(&stored)?);
        let stored = if rollback {
            self.store.rollback_to(actor, version, now_ms())?
        } else {
            self.store.activate(actor, version, now_ms())?
        };
        self.active.activate(runtime);
        self.metrics.active_set.set(version as i64);
        self.metrics.activations.inc();
        self.wake_loop();
        tracing::info!(version, by = %actor.who, rollback, "policy set activated");
        Ok(stored)
    }

    /// Starts a shadow run of a stored set version beside the active set (replacing any run).
    pub fn shadow_start(&self, actor: &Actor, version: u64) -> Result<ShadowReport> {
        let stored = self.store.get_set(version)?.ok_or(EngineError::Store(
            gantry_store::StoreError::UnknownSetVersion(version),
        ))?;
        let set = Arc::new(self.build_set(&stored)?);
        let report = ShadowReport {
            candidate_version: version,
            started_ms: now_ms(),
            started_by: actor.who.clone(),
            cycles: 0,
            cycles_skipped: 0,
            decisions_compared: 0,
            counts: BTreeMap::new(),
            recent: VecDeque::new(),
        };
        self.store.audit(
            actor,
            "shadow.start",
            &format!("version {version}"),
            now_ms(),
        )?;
        self.shadow.store(Some(Arc::new(Shadow {
            set,
            report: Mutex::new(report.clone()),
        })));
        Ok(report)
    }

    /// Stops the shadow run, returning its final report.
    pub fn shadow_stop(&self, actor: &Actor) -> Result<ShadowReport> {
        let Some(shadow) = self.shadow.swap(None) else {
            return Err(EngineError::NotFound("no shadow run is active".into()));
        };
        let report = shadow
            .report
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        self.store.audit(
            actor,
            "shadow.stop",
            &format!(
                "version {}, {} cycles, {} disagreements",
                report.candidate_version,
                report.cycles,
                report.counts.values().sum::<u64>()
            ),
            now_ms(),
        )?;
        Ok(report)
    }

    /// The running shadow report, if a shadow run is active.
    pub fn shadow_report(&self) -> Option<ShadowReport> {
        self.shadow.load_full().map(|shadow| {
            shadow
                .report
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        })
    }

    /// The loaded policies of the active and shadow sets, for per-policy metrics.
    pub fn loaded_policies(&self) -> Vec<Arc<Policy>> {
        let mut out: Vec<Arc<Policy>> = self
            .active
            .load()
            .entries()
            .iter()
            .map(|e| e.policy.clone())
            .collect();
        if let Some(shadow) = self.shadow.load_full() {
            out.extend(shadow.set.entries().iter().map(|e| e.policy.clone()));
        }
        out
    }
}

/// One cycle for the shadow thread: a copy of the scheduler as the active set saw it, and the
/// channel the active cycle's output arrives on.
struct ShadowJob {
    shadow: Arc<Shadow>,
    scheduler: Scheduler,
    now_s: f64,
    time_ms: u64,
    active_set: u64,
    /// What the active set decided in the same cycle.
    active: Arc<CycleOutput>,
}

/// The shadow thread's end of things: where cycles go, and whether it waits for one.
struct ShadowThread {
    /// A rendezvous channel: a send succeeds only while the thread waits.
    jobs: SyncSender<ShadowJob>,
    /// True while the thread waits for a cycle, so the loop copies its state only then.
    idle: Arc<AtomicBool>,
}

/// The shadow thread: decides each cycle it is handed with the candidate set (under its own
/// policy budget, on a node cache of its own, at the OS's lowest priority, and each call only
/// while the loop is between cycles) and records where it disagrees with the active
/// set. It ends when [`Live`] drops its sender.
fn spawn_shadow_thread(
    gate: Arc<CycleGate>,
    disagreements: prometheus::IntCounterVec,
    keep: usize,
    budget: Duration,
) -> ShadowThread {
    let (to_thread, jobs) = std::sync::mpsc::sync_channel::<ShadowJob>(0);
    let idle = Arc::new(AtomicBool::new(true));
    let thread_idle = idle.clone();
    let spawned = std::thread::Builder::new()
        .name("gantry-shadow".into())
        .spawn(move || {
            gantry_policy::yield_to_the_loop();
            for mut job in jobs {
                thread_idle.store(false, Ordering::Release);
                let _span = tracing::debug_span!("shadow", now_s = job.now_s).entered();
                // Fresh each cycle: the copy's change log diverges from the real one.
                let mut cache = NodeCache::default();
                let candidate = {
                    let mut bound = job
                        .shadow
                        .set
                        .bind(&mut cache)
                        .with_budget(budget)
                        .waiting_on(gate.clone());
                    job.scheduler.cycle(job.now_s, &mut bound)
                };
                record_shadow(&job, &job.active, &candidate, &disagreements, keep);
                thread_idle.store(true, Ordering::Release);
            }
        });
    if let Err(error) = spawned {
        // Without the thread every send fails, and each cycle counts as skipped.
        tracing::error!(%error, "cannot start the shadow thread; shadow runs will skip every cycle");
        idle.store(false, Ordering::Release);
    }
    ShadowThread {
        jobs: to_thread,
        idle,
    }
}

/// Adds one cycle's disagreements to the shadow report and the metric.
fn record_shadow(
    job: &ShadowJob,
    active: &CycleOutput,
    candidate: &CycleOutput,
    disagreements: &prometheus::IntCounterVec,
    keep: usize,
) {
    let found = gantry_core::shadow::compare(active, candidate);
    let mut report = job.shadow.report.lock().unwrap_or_else(|e| e.into_inner());
    report.cycles += 1;
    report.decisions_compared += active.decisions.len() as u64;
    for d in found {
        let kind = serde_json::to_value(d.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        disagreements.with_label_values(&[&kind]).inc();
        *report.counts.entry(kind.clone()).or_default() += 1;
        report.recent.push_back(ShadowDisagreement {
            time_ms: job.time_ms,
            job: d.active.job.clone(),
            kind,
            active_set: job.active_set,
            active: d.active,
            candidate: d.candidate,
        });
        while report.recent.len() > keep {
            report.recent.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(dir: &std::path::Path) -> Arc<Live> {
        let store = Store::open(gantry_store::StoreConfig::new(dir)).expect("store");
        let engine = Arc::new(
            PolicyEngine::new(gantry_policy::Limits::default(), Symbols::new()).expect("engine"),
        );
        Live::new(
            store,
            engine,
            PolicySet::new(0, Vec::new()),
            LiveConfig::default(),
        )
    }

    fn decision(job: &str, placed: bool, waiting_for: &str, set: u64) -> Decision {
        let mut explanation = gantry_store::sample_explanation(1);
        explanation.job = job.into();
        explanation.policy_set = set;
        explanation.outcome = if placed {
            Outcome::Placed {
                nodes: vec![("node-1".into(), 1)],
            }
        } else {
            Outcome::Pending {
                waiting_for: waiting_for.into(),
            }
        };
        Decision {
            job: 0,
            placed,
            placement: Vec::new(),
            victims: Vec::new(),
            explanation,
        }
    }

    fn jobs_kept(live: &Live, decisions: Vec<Decision>, time_ms: u64) -> Vec<String> {
        let output = CycleOutput {
            decisions,
            ..CycleOutput::default()
        };
        live.worth_storing(&output, time_ms)
            .iter()
            .map(|d| d.explanation.job.clone())
            .collect()
    }

    fn queue(name: &str, parent: Option<&str>, nominal: u64) -> gantry_core::QueueDef {
        gantry_core::QueueDef {
            name: name.into(),
            parent: parent.map(str::to_string),
            nominal_gpus: nominal,
            weight: 1,
            borrowing_limit_gpus: None,
            lending_limit_gpus: None,
        }
    }

    #[test]
    fn lent_capacity_is_what_borrowers_use_of_each_lenders_idle_quota() {
        // The queues of openai-like-7500.yaml.
        let defs = [
            queue("research", None, 36_000),
            queue("pretraining", Some("research"), 20_000),
            queue("rl", Some("research"), 16_000),
            queue("applied", None, 18_000),
            queue("safety", None, 6_000),
        ];
        let mut queues = Queues::new(&defs, Resources::gpus(60_000), 3600.0).expect("queues");
        let id = |n: &str| queues.id(n).expect("queue");
        let (research, pretraining, rl, applied, safety) = (
            id("research"),
            id("pretraining"),
            id("rl"),
            id("applied"),
            id("safety"),
        );
        assert_eq!(lent_gpus(&queues), vec![0; 5]);
        // rl borrows 4,000 of pretraining's idle 10,000, inside the research cohort.
        queues.charge(pretraining, Resources::gpus(10_000), true);
        queues.charge(rl, Resources::gpus(20_000), true);
        let lent = lent_gpus(&queues);
        assert_eq!(lent[pretraining], 4_000);
        assert_eq!((lent[rl], lent[research]), (0, 0));
        // applied borrows 2,000 at the top: research (6,000 idle) and safety (6,000 idle) lend
        // half each, and research's share comes from pretraining, the child with idle quota.
        queues.charge(applied, Resources::gpus(20_000), true);
        let lent = lent_gpus(&queues);
        assert_eq!((lent[research], lent[safety]), (1_000, 1_000));
        assert_eq!(lent[pretraining], 5_000);
        assert_eq!((lent[rl], lent[applied]), (0, 0));
        // The shares add up to what is borrowed, and none exceeds what its queue may lend.
        assert_eq!(split(7, &[3, 3, 3]), vec![3, 2, 2]);
        assert_eq!(split(7, &[1, 1, 1]), vec![1, 1, 1]);
        assert_eq!(split(10, &[2, 0, 3]), vec![2, 0, 3]);
        assert_eq!(split(5, &[0, 0]), vec![0, 0]);
    }

    #[test]
    fn the_queue_history_is_sampled_every_few_seconds_and_bounded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let live = live(dir.path());
        let view = |used: u64| QueueView {
            name: "a".into(),
            parent: None,
            nominal_gpus: 8,
            used_gpus: used,
            borrowed_gpus: 0,
            lendable_gpus: 8 - used,
            lent_gpus: 0,
            borrowing_limit_gpus: None,
            lending_limit_gpus: None,
            weight: 1,
            fair_share: 1.0,
            fair_share_key: 0.5,
            pending_jobs: 3,
            running_jobs: 1,
        };
        let every = HISTORY_EVERY.as_millis() as u64;
        let t0 = 1_000_000_000;
        live.sample_history(&[view(1)], t0);
        live.sample_history(&[view(2)], t0 + 1);
        live.sample_history(&[view(3)], t0 + every);
        let h = live.queue_history(0);
        assert_eq!(h.queues.len(), 1);
        assert_eq!(h.queues[0].at_ms, vec![t0, t0 + every]);
        assert_eq!(h.queues[0].used_gpus, vec![1, 3]);
        assert_eq!(live.queue_history(t0).queues[0].at_ms, vec![t0 + every]);
        // Two hours of samples keep one hour's.
        for i in 2..(2 * 3600 * 1000 / every) {
            live.sample_history(&[view(4)], t0 + i * every);
        }
        let h = live.queue_history(0);
        let kept = h.queues[0].at_ms.len() as u64;
        assert!(
            kept <= HISTORY_KEEP.as_millis() as u64 / every + 1,
            "{kept}"
        );
        assert!(kept >= HISTORY_KEEP.as_millis() as u64 / every, "{kept}");
    }

    #[test]
    fn a_pending_job_is_stored_again_only_when_something_changed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let live = live(dir.path());
        let a = || decision("a", false, "GPUs", 1);
        assert_eq!(jobs_kept(&live, vec![a()], 1_000), ["a"]);
        // The same reasons a second later: not stored.
        assert_eq!(jobs_kept(&live, vec![a()], 2_000), Vec::<String>::new());
        // Other reasons, or another set: stored.
        assert_eq!(
            jobs_kept(&live, vec![decision("a", false, "quota", 1)], 3_000),
            ["a"]
        );
        assert_eq!(
            jobs_kept(&live, vec![decision("a", false, "quota", 2)], 4_000),
            ["a"]
        );
        // The same again after the repeat interval: stored.
        assert_eq!(
            jobs_kept(&live, vec![decision("a", false, "quota", 2)], 34_000),
            ["a"]
        );
        // A placement is always stored, and forgets the job.
        assert_eq!(
            jobs_kept(&live, vec![decision("a", true, "", 2)], 35_000),
            ["a"]
        );
        assert_eq!(
            jobs_kept(&live, vec![decision("a", false, "quota", 2)], 36_000),
            ["a"]
        );
    }
}
