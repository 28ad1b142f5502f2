//! Policy sets as the scheduling core consults them. A [`PolicySet`] is immutable: the ordered
//! Wasm policies of each role under one version, the unit admins activate and roll back.
//! [`ActiveSet`] swaps the active one atomically: a cycle loads it once and runs on it to the
//! end, so no cycle ever sees a mix. The node columns in Wasm shape live in a [`NodeCache`]
//! that outlives sets, refreshed only where the cluster changed.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use gantry_core::scheduler::CHUNK;
use gantry_core::{
    ClusterState, CohortUsage, JobRequest, PodShape, PolicyHooks, PolicyRef, QueueUsage,
    QuotaVerdict, Verdict,
};

use crate::convert::WasmNodes;
use crate::policy::{Guarded, Policy};
use gantry_core::PolicyRole;

/// One policy in a set, with its weight (for scores).
#[derive(Clone)]
pub struct SetEntry {
    /// The loaded policy.
    pub policy: Arc<Policy>,
    /// Its scores are multiplied by this (ignored for filters and quotas).
    pub weight: u32,
}

/// An ordered list of policies under one version, the unit admins activate and roll back.
pub struct PolicySet {
    version: u64,
    entries: Vec<SetEntry>,
}

impl PolicySet {
    /// A set of `entries`, in order, under `version`.
    pub fn new(version: u64, entries: Vec<SetEntry>) -> Self {
        Self { version, entries }
    }

    /// The set's version, as stored.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The policies, in the order they run.
    pub fn entries(&self) -> &[SetEntry] {
        &self.entries
    }

    fn of_role(&self, role: PolicyRole) -> impl Iterator<Item = &SetEntry> {
        self.entries.iter().filter(move |e| e.policy.role() == role)
    }

    /// This set, with `cache` for the node columns: what a cycle runs on. Its policy calls
    /// have no wall-time budget until [`BoundSet::with_budget`] gives them one.
    pub fn bind<'a>(&'a self, cache: &'a mut NodeCache) -> BoundSet<'a> {
        BoundSet {
            set: self,
            cache,
            budget: None,
            spent: Duration::ZERO,
            gate: None,
        }
    }
}

/// Whether the scheduling loop is inside a cycle. A shadow set bound with
/// [`BoundSet::waiting_on`] makes each of its calls wait until the loop is not, so a candidate
/// being compared runs only in the loop's spare time and never slows the cycles that bind
/// pods, even on a machine with as few cores as threads that want them.
#[derive(Debug, Default)]
pub struct CycleGate {
    /// True while the loop is in a cycle; a mutex (not an atomic) so a waiter can sleep on it.
    cycling: Mutex<bool>,
    /// Signalled when a cycle ends.
    ended: Condvar,
}

/// The loop's side of a [`CycleGate`]: the cycle lasts as long as this lives.
pub struct InCycle<'a>(&'a CycleGate);

impl CycleGate {
    /// Marks the loop as in a cycle until the returned guard drops.
    pub fn enter(&self) -> InCycle<'_> {
        *self.cycling.lock().unwrap_or_else(|e| e.into_inner()) = true;
        InCycle(self)
    }

    /// Returns once the loop is not in a cycle.
    pub fn wait_idle(&self) {
        let cycling = self.cycling.lock().unwrap_or_else(|e| e.into_inner());
        let _idle = self
            .ended
            .wait_while(cycling, |cycling| *cycling)
            .unwrap_or_else(|e| e.into_inner());
    }

    /// Returns once the loop is not in a cycle, or `unless` is set (checked each millisecond).
    pub(crate) fn wait_idle_unless(&self, unless: Option<&AtomicBool>) {
        let Some(unless) = unless else {
            return self.wait_idle();
        };
        let mut cycling = self.cycling.lock().unwrap_or_else(|e| e.into_inner());
        while *cycling && !unless.load(Ordering::Acquire) {
            cycling = self
                .ended
                .wait_timeout(cycling, Duration::from_millis(1))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl CycleGate {
    /// Whether the loop is in a cycle now.
    pub fn cycling(&self) -> bool {
        *self.cycling.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a thread's Wasm pauses on: the loop's gate, unless the flag is set.
pub(crate) type Pause = (Arc<CycleGate>, Option<Arc<AtomicBool>>);

thread_local! {
    /// What this thread's Wasm (a shadow set's calls, a spare's init) pauses on, read when a
    /// call or an init arms its deadline: see `instance::arm_deadline`.
    static PAUSE_ON: std::cell::RefCell<Option<Pause>> = const { std::cell::RefCell::new(None) };
}

/// Sets this thread's [`PAUSE_ON`] until dropped.
pub(crate) struct PausingOn(Option<Pause>);

impl PausingOn {
    /// Pause on `gate` unless `unless` is set.
    pub(crate) fn set(gate: Arc<CycleGate>, unless: Option<Arc<AtomicBool>>) -> Self {
        Self(PAUSE_ON.with(|cell| cell.replace(Some((gate, unless)))))
    }
}

impl Drop for PausingOn {
    fn drop(&mut self) {
        let previous = self.0.take();
        PAUSE_ON.with(|cell| *cell.borrow_mut() = previous);
    }
}

/// What this thread's Wasm pauses on, if anything.
pub(crate) fn pausing_on() -> Option<Pause> {
    PAUSE_ON.with(|cell| cell.borrow().clone())
}

impl Drop for InCycle<'_> {
    fn drop(&mut self) {
        *self.0.cycling.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.0.ended.notify_all();
    }
}

/// The active policy set. Activation is one atomic pointer swap: a cycle that loaded the old
/// set finishes on it, and the next load sees the new one.
pub struct ActiveSet {
    /// Swapped by admins, loaded once per cycle by the scheduler; never locked.
    current: arc_swap::ArcSwap<PolicySet>,
}

impl ActiveSet {
    /// `set` active.
    pub fn new(set: PolicySet) -> Self {
        Self {
            current: arc_swap::ArcSwap::from_pointee(set),
        }
    }

    /// The set a cycle runs on, from start to end.
    pub fn load(&self) -> Arc<PolicySet> {
        self.current.load_full()
    }

    /// Make `set` active for every cycle that starts from now on; the previous set is returned.
    pub fn activate(&self, set: Arc<PolicySet>) -> Arc<PolicySet> {
        self.current.swap(set)
    }
}

/// The node table in Wasm shape, one [`WasmNodes`] per `CHUNK` of nodes, kept between cycles
/// and across set activations and refreshed from the cluster's change log.
#[derive(Default)]
pub struct NodeCache {
    chunks: Vec<WasmNodes>,
    /// Node count the chunks were built for.
    built_for: Option<usize>,
    /// Position in `ClusterState`'s change log up to which the chunks are current.
    cursor: u64,
    /// The nodes of a call that asks about a few nodes of a chunk, gathered into allocations
    /// kept from call to call (or, for a range that is not a chunk, built for the call).
    gathered: Option<WasmNodes>,
}

/// How a call sees the nodes it is asked about.
enum View<'a> {
    /// Every node of the range: asking a policy about a few nodes out of play costs less
    /// than gathering the rest, and their answers are ignored.
    Whole(&'a WasmNodes),
    /// Only the nodes in play, at these offsets into the range.
    InPlay(&'a WasmNodes, Vec<usize>),
}

impl View<'_> {
    fn nodes(&self) -> &WasmNodes {
        match self {
            View::Whole(nodes) => nodes,
            View::InPlay(nodes, _) => nodes,
        }
    }

    /// The offset into the range of node `index` of the view.
    fn offset(&self, index: u32) -> u32 {
        match self {
            View::Whole(_) => index,
            View::InPlay(_, offsets) => offsets
                .get(index as usize)
                .map_or(index, |&offset| offset as u32),
        }
    }

    /// An answer per node of a range of `len` nodes from the answers for the view's nodes
    /// (as many, in order: the policy host checks the count); out of play, the default.
    fn spread<T: Copy + Default>(&self, len: usize, answers: Vec<T>) -> Vec<T> {
        match self {
            View::Whole(_) => answers,
            View::InPlay(_, offsets) => {
                let mut all = vec![T::default(); len];
                for (&offset, answer) in offsets.iter().zip(answers) {
                    all[offset] = answer;
                }
                all
            }
        }
    }
}

impl NodeCache {
    /// The nodes of `nodes` in Wasm shape, current with `state`: the cached chunk when
    /// `in_play` keeps at least half of it, else just the nodes in play, gathered.
    fn view(&mut self, state: &ClusterState, nodes: Range<usize>, in_play: &[bool]) -> View<'_> {
        let (changed, cursor) = state.changes_since(self.cursor);
        let n = state.len();
        match (changed, self.built_for == Some(n)) {
            (Some(changed), true) => {
                for &node in changed {
                    let node = node as usize;
                    self.chunks[node / CHUNK].refresh(node % CHUNK, node, &state.nodes);
                    for chunk in &mut self.chunks {
                        chunk.refresh_domains(node, &state.nodes);
                    }
                }
            }
            _ => {
                self.chunks = (0..n.div_ceil(CHUNK))
                    .map(|c| {
                        WasmNodes::new_range(&state.nodes, c * CHUNK..((c + 1) * CHUNK).min(n))
                    })
                    .collect();
                self.built_for = Some(n);
            }
        }
        self.cursor = cursor;
        let chunk = nodes.start / CHUNK;
        let aligned =
            nodes.start.is_multiple_of(CHUNK) && nodes.end == ((chunk + 1) * CHUNK).min(n);
        let Some(cached) = self.chunks.get(chunk).filter(|_| aligned) else {
            // Not a chunk of the cache (the core asks by chunk): built for this call.
            let built = self
                .gathered
                .insert(WasmNodes::new_range(&state.nodes, nodes));
            return View::Whole(built);
        };
        // A node the core said nothing about is in play.
        let in_play = |i: usize| in_play.get(i).copied().unwrap_or(true);
        if (0..cached.len()).filter(|&i| in_play(i)).count() * 2 >= cached.len() {
            return View::Whole(cached);
        }
        let offsets: Vec<usize> = (0..cached.len()).filter(|&i| in_play(i)).collect();
        let gathered = self.gathered.get_or_insert_with(|| cached.clone());
        gathered.gather_from(cached, &offsets);
        View::InPlay(gathered, offsets)
    }
}

fn verdict<T>(guarded: Guarded<T>) -> Verdict<T> {
    match guarded {
        Guarded::Answer(answer) => Verdict::Answer(answer),
        Guarded::Skipped(fault) => Verdict::Skipped(fault.to_string()),
        Guarded::Rejected(fault) => Verdict::Rejected(fault.to_string()),
    }
}

/// A policy set bound to a node cache for one cycle: the core's [`PolicyHooks`].
pub struct BoundSet<'a> {
    set: &'a PolicySet,
    cache: &'a mut NodeCache,
    /// Wall time this cycle's policy calls may take before the cycle defers the jobs it has
    /// not reached; `None` = unbounded (benches, tests, replays).
    budget: Option<Duration>,
    /// Wall time spent in policy calls so far this cycle.
    spent: Duration,
    /// For a shadow set: the loop's gate, which each call waits on before it runs and at
    /// every epoch tick while it runs.
    gate: Option<Arc<CycleGate>>,
}

impl<'a> BoundSet<'a> {
    /// Bounds this cycle's policy calls to `budget` of wall time, so a slow or failing policy
    /// delays the jobs a cycle has not reached instead of stalling the loop.
    pub fn with_budget(mut self, budget: Duration) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Makes each call wait until the loop is between cycles (see [`CycleGate`]), and pause
    /// inside the guest, at the next epoch tick, whenever the loop enters one: how a shadow set
    /// runs. Time spent waiting counts neither against the budget nor the call deadline.
    pub fn waiting_on(mut self, gate: Arc<CycleGate>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Wall time spent in policy calls so far.
    pub fn spent(&self) -> Duration {
        self.spent
    }

    /// Waits for the loop to leave its cycle, when this set runs beside it, and has the
    /// policy calls until the returned guard drops pause in the guest while the loop cycles.
    fn yield_to_the_loop(&self) -> Option<PausingOn> {
        let gate = self.gate.as_ref()?;
        gate.wait_idle();
        Some(PausingOn::set(gate.clone(), None))
    }
}

impl PolicyHooks for BoundSet<'_> {
    fn policies(&self) -> Vec<PolicyRef> {
        self.set
            .entries
            .iter()
            .map(|e| {
                let info = e.policy.info();
                PolicyRef {
                    name: info.name.clone(),
                    version: info.version.clone(),
                    role: info.role.to_string(),
                    weight: e.weight,
                    sha256: info.sha256.clone(),
                }
            })
            .collect()
    }

    fn set_version(&self) -> u64 {
        self.set.version
    }

    fn filter(
        &mut self,
        state: &ClusterState,
        pod: &PodShape,
        nodes: Range<usize>,
        in_play: &[bool],
    ) -> Vec<(String, Verdict<Vec<u16>>)> {
        let _pausing = self.yield_to_the_loop();
        if self.set.of_role(PolicyRole::Filter).next().is_none() {
            return Vec::new();
        }
        let filters: Vec<Arc<Policy>> = self
            .set
            .of_role(PolicyRole::Filter)
            .map(|e| e.policy.clone())
            .collect();
        let started = Instant::now();
        let len = nodes.len();
        let view = self.cache.view(state, nodes, in_play);
        let verdicts = filters
            .iter()
            .map(|policy| {
                let codes = policy.filter(pod, view.nodes());
                let codes = codes.map(|codes| view.spread(len, codes));
                (policy.info().name.clone(), verdict(policy.guard(codes)))
            })
            .collect();
        self.spent += started.elapsed();
        verdicts
    }

    fn reason_text(&self, index: usize, code: u16) -> String {
        self.set
            .of_role(PolicyRole::Filter)
            .nth(index)
            .and_then(|e| e.policy.reason_text(code).map(str::to_string))
            .unwrap_or_else(|| format!("reason {code}"))
    }

    fn score(
        &mut self,
        state: &ClusterState,
        pod: &PodShape,
        nodes: Range<usize>,
        in_play: &[bool],
    ) -> Vec<(String, u32, Verdict<Vec<u32>>)> {
        self.score_explained(state, pod, nodes, in_play)
            .into_iter()
            .map(|(policy, weight, verdict, _)| (policy, weight, verdict))
            .collect()
    }

    fn score_explained(
        &mut self,
        state: &ClusterState,
        pod: &PodShape,
        nodes: Range<usize>,
        in_play: &[bool],
    ) -> Vec<(String, u32, Verdict<Vec<u32>>, Vec<(u32, String)>)> {
        let _pausing = self.yield_to_the_loop();
        if self.set.of_role(PolicyRole::Score).next().is_none() {
            return Vec::new();
        }
        let scores: Vec<SetEntry> = self.set.of_role(PolicyRole::Score).cloned().collect();
        let started = Instant::now();
        let len = nodes.len();
        let view = self.cache.view(state, nodes, in_play);
        let verdicts = scores
            .iter()
            .map(|e| {
                let policy = &e.policy;
                let mut reasons = Vec::new();
                let scores = policy.score_explained(pod, view.nodes()).map(|scored| {
                    reasons = scored
                        .reasons
                        .into_iter()
                        .map(|reason| (view.offset(reason.node), reason.text))
                        .collect();
                    view.spread(len, scored.scores)
                });
                (
                    policy.info().name.clone(),
                    e.weight,
                    verdict(policy.guard(scores)),
                    reasons,
                )
            })
            .collect();
        self.spent += started.elapsed();
        verdicts
    }

    fn admit(
        &mut self,
        job: &JobRequest,
        queue: &QueueUsage,
        cohort: Option<&CohortUsage>,
    ) -> Vec<(String, Verdict<QuotaVerdict>)> {
        let _pausing = self.yield_to_the_loop();
        let started = Instant::now();
        let verdicts = self
            .set
            .of_role(PolicyRole::Quota)
            .map(|e| {
                let policy = &e.policy;
                (
                    policy.info().name.clone(),
                    verdict(policy.guard(policy.admit(job, queue, cohort))),
                )
            })
            .collect();
        self.spent += started.elapsed();
        verdicts
    }

    fn budget_spent(&self) -> bool {
        self.budget.is_some_and(|budget| self.spent >= budget)
    }
}
