//! [`Live`]: what the scheduling loop and the API share. The loop decides each cycle through
//! [`Live::decide`] (active set, shadow set, metrics), records what its binder says happened
//! through [`Live::record`] (store, SSE) and publishes a read-only
//! [`ClusterView`] with [`Live::publish`]; the handlers read that view and the store, and change
//! the policy sets. The loop never waits on a request, and a request never waits on a cycle.
//!
//! Its parts: `view` (the published picture and the feed's events), `history` (queue samples
//! over time), `health` (the node lifecycle's transitions and breaker, and breaker resets),
//! `registry` (upload, validation, sets, activation) and `shadow` (a candidate set deciding
//! beside the active one); here, [`Live`] itself, the cycle's decide and record, and
//! the loop's heartbeat and wake-ups.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, ArcSwapOption};
use gantry_core::{
    BindOutcome, CohortUsage, CycleOutput, Decision, JobId, JobRequest, NodeTable, Outcome,
    PodShape, QueueId, QueueUsage, Queues, QuotaVerdict, Resources, Scheduler, Symbols,
};
use gantry_policy::{
    ActiveSet, CycleGate, NodeCache, Policy, PolicyEngine, PolicyOptions, PolicyRole, PolicySet,
    SetEntry, WasmNodes,
};
use gantry_store::{Actor, FailurePolicy, NewDecision, NewPolicy, Store};
use tokio::sync::{broadcast, watch};

use crate::error::{EngineError, Result};
use crate::metrics::Metrics;
use crate::whatif::{WhatIfAnswer, WhatIfDesk, WhatIfError, WhatIfJob};

mod health;
mod history;
mod registry;
mod shadow;
mod view;

// The views the API serves are the contract's: the engine fills them.
pub use gantry_contract::{
    DecisionEvent, JobView, QueueHistoryView, QueueSeries, QueueView, ShadowDisagreement,
    ShadowReport, Upload, Validation,
};
pub use health::{RESET_WITHIN, ResetError, TRANSITIONS_KEPT};
use history::*;
pub use history::{HISTORY_EVERY, HISTORY_KEEP};
use shadow::*;
pub use view::{BalloonPods, ClusterView, lent_gpus};

pub(crate) use crate::now_ms;

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
    /// What-if questions from the API, answered by the loop between cycles, and the bound on
    /// those being answered.
    what_ifs: WhatIfDesk,
    /// Held by the loop while the active set decides; the shadow thread's calls wait on it, so
    /// the candidate runs only in the loop's spare time.
    cycle_gate: Arc<CycleGate>,
    /// The latest cluster picture; replaced whole by each publish.
    view: ArcSwap<ClusterView>,
    /// Decision events for SSE subscribers; lagging subscribers lose the oldest events.
    decisions_tx: broadcast::Sender<Arc<DecisionEvent>>,
    /// Loaded policies, so set versions sharing an entry share its instances; idle ones
    /// beyond a few are dropped. Locked only to look up or insert, never across a load.
    loaded_policies: Mutex<registry::LoadedPolicies>,
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
    /// Per pending job: its last stored decision, so a repeat is stored only when it says
    /// something new, and the published estimate waits for what the stored record says. Only
    /// the loop touches it (once per cycle, and in `publish`); placed jobs leave it.
    job_to_last_stored: Mutex<HashMap<String, LastStored>>,
    /// Each queue's recent samples, for the fair-share-over-time chart. The loop writes one
    /// sample per queue every [`HISTORY_EVERY`] (inside `publish`) and the history handler
    /// copies them out; each holds the lock only for that, so neither waits on the other long.
    history: Mutex<QueueHistory>,
    /// The replica that leads while this one follows, as the loop last saw it (`None` while
    /// this one leads, or nothing is elected): the API refuses writes here with 409 naming
    /// it. Written once per pass, read per write request; held only to copy.
    leader_elsewhere: Mutex<Option<String>>,
    /// The node lifecycle as the loop last took it: the latest transitions (bounded), each
    /// node's state, the counts and the breaker. The loop writes it after each pass and at
    /// each publish, the health handlers copy out of it; each holds the lock only for that.
    health: Mutex<health::HealthRecord>,
    /// Breaker resets admins asked for, made by the loop between cycles (the breaker is the
    /// scheduler's, which only the loop touches); held only to push or take them.
    breaker_resets: Mutex<Vec<health::ResetAsk>>,
}

/// A pending job's last stored decision, as `Live::worth_storing` keeps it.
struct LastStored {
    /// When it was made (ms since the epoch).
    at_ms: u64,
    /// A digest of what it said: its summary, policy set and faults.
    digest: u64,
    /// What it waits for, as the record says it.
    waiting_for: String,
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
            what_ifs: WhatIfDesk::default(),
            view: ArcSwap::from_pointee(ClusterView::default()),
            decisions_tx,
            loaded_policies: Mutex::new(registry::LoadedPolicies::default()),
            activation: Mutex::new(()),
            wake: (Mutex::new(false), Condvar::new()),
            cycle_version: watch::Sender::new((version, Instant::now())),
            ready: AtomicBool::new(false),
            heartbeat_ms: AtomicU64::new(0),
            job_to_last_stored: Mutex::new(HashMap::new()),
            history: Mutex::new(QueueHistory::default()),
            leader_elsewhere: Mutex::new(None),
            health: Mutex::new(health::HealthRecord::default()),
            breaker_resets: Mutex::new(Vec::new()),
        })
    }

    /// Which replica leads while this one follows (see [`ClusterSource::leader_elsewhere`]);
    /// set by the loop each pass.
    ///
    /// [`ClusterSource::leader_elsewhere`]: gantry_core::ClusterSource::leader_elsewhere
    pub fn set_leader_elsewhere(&self, leader: Option<String>) {
        *self
            .leader_elsewhere
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = leader;
    }

    /// The replica that leads while this one follows, if it follows: writes belong there.
    pub fn leader_elsewhere(&self) -> Option<String> {
        self.leader_elsewhere
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The engine's interned names, to resolve the node table's names for the API.
    pub fn symbols(&self) -> &Arc<Symbols> {
        self.engine.symbols()
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

    /// Asks the loop when a job of `job`'s shape would start; the loop copies the scheduler
    /// between cycles and the forecast runs beside it.
    pub async fn what_if(&self, job: WhatIfJob) -> Result<WhatIfAnswer, WhatIfError> {
        self.what_ifs.ask(job, || self.wake_loop()).await
    }

    /// Takes the what-if questions waiting and answers them from copies of `scheduler` (the
    /// loop calls this between cycles).
    pub fn answer_what_ifs(&self, scheduler: &gantry_core::Scheduler) {
        self.what_ifs.answer_waiting(scheduler);
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

    /// Stores and streams a cycle's decisions as the binder says they turned out: a placement
    /// whose binding failed, or that waits for its victims to leave, is recorded as pending
    /// with that reason, never as placed.
    ///
    /// `preempted` are the records of the jobs the cycle evicted (pending again), so that a
    /// victim's history says what happened to it. `balloons` are the jobs among them that are
    /// balloons, which the live feed marks so a reader can hide their churn.
    pub fn record(
        &self,
        output: &CycleOutput,
        outcomes: &[BindOutcome],
        preempted: &[Decision],
        balloons: &HashSet<JobId>,
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
        self.store_decisions(&happened, balloons, time_ms);
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
                let stored = || LastStored {
                    at_ms: time_ms,
                    digest,
                    waiting_for: match &e.outcome {
                        Outcome::Pending { waiting_for } => waiting_for.clone(),
                        Outcome::Placed { .. } => String::new(),
                    },
                };
                match last.get_mut(&e.job) {
                    Some(seen) if seen.digest == digest && time_ms < seen.at_ms + repeat_ms => {
                        false
                    }
                    Some(entry) => {
                        *entry = stored();
                        true
                    }
                    None => {
                        last.insert(e.job.clone(), stored());
                        true
                    }
                }
            })
            .collect()
    }

    fn store_decisions(&self, output: &CycleOutput, balloons: &HashSet<JobId>, time_ms: u64) {
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
                balloon: balloons.contains(&d.job),
            }));
        }
    }

    /// Records which job each pod belongs to, so decisions can be looked up by pod.
    pub fn record_pods(&self, pod_to_job: &[(String, String)]) {
        if let Err(error) = self.store.record_pods(pod_to_job) {
            tracing::warn!(%error, "cannot record pod names");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::view::split;
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
            reclaim: gantry_core::Reclaim::Never,
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
            balloon_pending_jobs: 0,
            balloon_running_jobs: 0,
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
