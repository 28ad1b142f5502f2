use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gantry_core::{
    CohortUsage, FailurePolicy, JobRequest, PodShape, PolicyRole, QueueUsage, QuotaVerdict,
};
use serde::Serialize;
use wasmtime::Trap;

use crate::bindings::types;
use crate::convert::{self, WasmNodes};
use crate::engine::{Capabilities, CompiledPolicy, EngineShared, Version};
use crate::error::{PolicyError, PolicyFault, Result};
use crate::instance::{Exports, Instance, InstanceHost, LogBucket, Refusal};

/// Longest policy name `init` may return, in bytes: it is shown in every explanation.
pub const NAME_MAX_BYTES: usize = 64;
/// Longest policy version `init` may return, in bytes.
pub const VERSION_MAX_BYTES: usize = 64;
/// Longest reason text `init` may declare, in bytes: one line a researcher reads.
pub const REASON_TEXT_MAX_BYTES: usize = 200;
/// Most reason codes `init` may declare; each is kept for the policy's life.
pub const REASONS_MAX: usize = 256;
/// Longest deny reason `admit` may return, in bytes: it is stored with every decision.
pub const DENY_REASON_MAX_BYTES: usize = 1024;
/// Most label keys a 0.2.0 policy may ask for (`label-keys`): each is a column per call.
pub const LABEL_KEYS_MAX: usize = 16;
/// Longest label key a 0.2.0 policy may ask for, in bytes: a Kubernetes label key is a prefix of
/// at most 253 bytes, `/`, and a name of at most 63. Keys are interned for the process's life.
pub const LABEL_KEY_MAX_BYTES: usize = 317;
/// Most reasons one 0.2.0 `score` call may give: a bound per call, not per node, so reasons
/// cost the same on 10 nodes as on 7,500. Each text is at most [`REASON_TEXT_MAX_BYTES`].
pub const SCORE_REASONS_MAX: usize = 16;

/// Why a score policy scored a node as it did (contract 0.2.0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScoreReason {
    /// The node, as an index into the nodes of the call.
    pub node: u32,
    /// Plain words, at most [`REASON_TEXT_MAX_BYTES`].
    pub text: String,
}

/// A score policy's answer: a score per node and reasons for a few nodes. A 0.1.0 policy
/// gives no reasons.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Scored {
    /// One score in 0..=[`crate::MAX_SCORE`] per node of the call.
    pub scores: Vec<u32>,
    /// At most [`SCORE_REASONS_MAX`], each for a different node, in the order given.
    pub reasons: Vec<ScoreReason>,
}

/// How to load a policy.
#[derive(Debug, Clone)]
pub struct PolicyOptions {
    /// JSON passed to `init`.
    pub config: String,
    /// What a fault does; [`FailurePolicy::Default`] is the role's (filter and quota closed,
    /// score open).
    pub failure: FailurePolicy,
    /// WASI capabilities granted (none by default).
    pub capabilities: Capabilities,
    /// This policy's own call deadline, in place of the engine's (`Limits::deadline`): an
    /// interpreted policy (Python, JavaScript) on a large cluster needs more than the default,
    /// and an admin grants it per set entry rather than slowing every policy. At most
    /// [`MAX_CALL_DEADLINE`].
    pub deadline: Option<Duration>,
    /// Loaded only to validate an upload: until it joins a set ([`Policy::join_set`]), its
    /// instances may not take the budget's set reserve (`Limits::set_reserve_bytes`).
    pub upload: bool,
}

/// The longest call deadline a policy may be given: a policy call holds up the scheduling
/// cycle, so a longer one would stall scheduling rather than bound it.
pub const MAX_CALL_DEADLINE: Duration = Duration::from_secs(10);

impl Default for PolicyOptions {
    fn default() -> Self {
        Self {
            config: "{}".into(),
            failure: FailurePolicy::Default,
            capabilities: Capabilities::default(),
            deadline: None,
            upload: false,
        }
    }
}

impl PolicyOptions {
    /// Default options with this JSON config.
    pub fn with_config(config: impl Into<String>) -> Self {
        Self {
            config: config.into(),
            ..Self::default()
        }
    }
}

/// What a policy said about itself at init.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyInfo {
    /// The policy's name (at most [`NAME_MAX_BYTES`]).
    pub name: String,
    /// Its version (at most [`VERSION_MAX_BYTES`]).
    pub version: String,
    /// Its role.
    pub role: PolicyRole,
    /// The sha256 of its component, hex.
    pub sha256: String,
    /// Declared reason codes and their texts, sorted by code.
    pub reasons: Vec<(u16, String)>,
}

/// Per-policy counters, for metrics and the bench.
#[derive(Debug, Default)]
pub struct PolicyStats {
    /// Calls made, quarantined ones included.
    pub calls: AtomicU64,
    /// Calls that returned a fault, quarantined ones included.
    pub faults: AtomicU64,
    /// Wall time spent in calls, in nanoseconds.
    pub busy_ns: AtomicU64,
    /// Instances created (instantiate + init), the one at load included.
    pub instances_created: AtomicU64,
    /// Calls refused at once because the policy was quarantined (no Wasm ran).
    pub quarantined_calls: AtomicU64,
    /// `log` lines written.
    pub log_lines: AtomicU64,
    /// `log` lines dropped by the rate limit.
    pub log_dropped: AtomicU64,
}

/// A policy's health, as the scheduler's metrics (`gantry_policy_quarantined`) and the UI show
/// it. A snapshot: [`Policy::health`] takes it under a short lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyHealth {
    /// Faults in a row since the last success (quarantined calls not counted).
    pub consecutive_faults: u32,
    /// Whether calls are refused at once without running Wasm.
    pub quarantined: bool,
    /// While quarantined: how long until the next probe call is let through (zero when one is
    /// due or running). `None` when not quarantined.
    pub probe_in: Option<Duration>,
    /// While quarantined: the wait between the last fault and the next probe, which doubles
    /// after each failed probe. `None` when not quarantined.
    pub backoff: Option<Duration>,
    /// Times this policy has been quarantined since it was loaded.
    pub quarantines: u64,
    /// The latest fault, if any call ever faulted.
    pub last_fault: Option<PolicyFault>,
}

/// A loaded, configured policy: call it from any thread. Calls run on pooled instances, at most
/// `Limits::concurrency` at once; each call is bounded by the deadline and the memory caps, and
/// an instance that faulted is dropped, never reused.
///
/// Instantiate + init never run on a caller's thread after load: each policy has one refill
/// thread (`gantry-policy-refill`) that creates instances when none is left (after a fault
/// dropped one) or when callers wait for one under the concurrency cap. One thread per policy,
/// not per engine, so one policy's slow init never delays another's refill. A call that finds
/// no idle instance waits at most the call deadline, then faults with
/// [`PolicyFault::NotReady`]. After `Limits::quarantine_after` consecutive faults the policy is
/// quarantined (see [`Policy::health`]).
///
/// Dropping a `Policy` stops its refill thread and waits for it, which is at most one init
/// deadline, so every instance (and its share of the process memory budget) is gone when
/// `drop` returns.
pub struct Policy {
    inner: Arc<Inner>,
    /// Counters, shared with the refill thread.
    pub stats: Arc<PolicyStats>,
    refill: Option<JoinHandle<()>>,
}

/// What the callers and the refill thread share.
struct Inner {
    shared: Arc<EngineShared>,
    compiled: Arc<CompiledPolicy>,
    options: PolicyOptions,
    info: PolicyInfo,
    /// Indexed by reason code: whether the policy declared it. Checked for every verdict.
    declared: Vec<bool>,
    /// The label keys a 0.2.0 filter or score asked for at load, interned, in its order: the
    /// label columns each of its calls gets. Empty for every other policy.
    label_keys: Vec<gantry_core::Sym>,
    host: InstanceHost,
    pool: Pool,
    health: Mutex<HealthState>,
    stats: Arc<PolicyStats>,
}

/// Idle instances plus a count of live ones. Locked briefly to take or return an instance.
struct Pool {
    state: Mutex<PoolState>,
    /// Wakes callers waiting for an instance: one was returned or created, or a refill failed.
    changed: Condvar,
    /// Wakes the refill thread.
    wake_refill: Condvar,
    /// True while the loop's calls wait for an instance: the refill under way is then for
    /// them, and does not pause while the loop cycles (see [`crate::CycleGate`]).
    urgent: Arc<AtomicBool>,
}

struct PoolState {
    idle: Vec<Instance>,
    /// Idle, busy, and being created.
    live: usize,
    /// Callers waiting for an instance.
    waiters: usize,
    /// Of those, the ones the loop waits on (not a shadow set's calls): while there are any,
    /// the refill does not pause for the loop's cycles.
    loop_waiters: usize,
    /// A refill failed and no caller has asked since: do not retry in a loop.
    paused: bool,
    /// Refills that failed, so a waiter sees one fail while it waits.
    refill_faults: u64,
    last_refill_fault: Option<PolicyFault>,
    /// The policy was dropped: the refill thread exits.
    closed: bool,
}

impl PoolState {
    fn refill_wanted(&self, concurrency: usize) -> bool {
        !self.closed
            && !self.paused
            && self.idle.is_empty()
            && self.live < concurrency
            && (self.live == 0 || self.waiters > 0)
    }
}

struct HealthState {
    consecutive: u32,
    quarantined: bool,
    quarantines: u64,
    backoff: Duration,
    next_probe: Instant,
    probing: bool,
    last_fault: Option<PolicyFault>,
}

/// A policy's answer after its failure policy was applied to any fault.
#[derive(Debug, Clone, PartialEq)]
pub enum Guarded<T> {
    /// The policy answered.
    Answer(T),
    /// The policy faulted and fails open: leave it out of this decision.
    Skipped(PolicyFault),
    /// The policy faulted and fails closed: reject, with the fault as the reason.
    Rejected(PolicyFault),
}

impl Policy {
    pub(crate) fn new(
        shared: Arc<EngineShared>,
        compiled: Arc<CompiledPolicy>,
        options: PolicyOptions,
    ) -> Result<Self> {
        let stats = Arc::new(PolicyStats::default());
        let log = Arc::new(LogBucket::new(
            shared.limits.log_lines_per_s,
            shared.limits.log_burst,
            stats.clone(),
        ));
        let mut inner = Inner {
            health: Mutex::new(HealthState {
                consecutive: 0,
                quarantined: false,
                quarantines: 0,
                backoff: shared.limits.quarantine_backoff,
                next_probe: Instant::now(),
                probing: false,
                last_fault: None,
            }),
            shared,
            host: InstanceHost {
                policy_name: Arc::from(compiled.sha256.get(..12).unwrap_or_default()),
                log,
                in_set: Arc::new(std::sync::atomic::AtomicBool::new(!options.upload)),
            },
            compiled,
            options,
            info: PolicyInfo {
                name: String::new(),
                version: String::new(),
                role: PolicyRole::Filter,
                sha256: String::new(),
                reasons: Vec::new(),
            },
            declared: Vec::new(),
            label_keys: Vec::new(),
            pool: Pool {
                state: Mutex::new(PoolState {
                    idle: Vec::new(),
                    live: 0,
                    waiters: 0,
                    loop_waiters: 0,
                    paused: false,
                    refill_faults: 0,
                    last_refill_fault: None,
                    closed: false,
                }),
                changed: Condvar::new(),
                wake_refill: Condvar::new(),
                urgent: Arc::default(),
            },
            stats: stats.clone(),
        };
        // The first instance is made here, on the loading thread: load reports its faults.
        let (mut instance, info) = inner.instantiate().map_err(|fault| match fault {
            PolicyFault::BadConfig { message } => PolicyError::BadConfig(message),
            other => PolicyError::InitFault(other),
        })?;
        inner.label_keys = inner
            .read_label_keys(&mut instance)
            .map_err(PolicyError::InitFault)?;
        let mut declared = vec![false; 1 + usize::from(u16::MAX)];
        for (code, _) in &info.reasons {
            declared[usize::from(*code)] = true;
        }
        inner.declared = declared;
        inner.host.policy_name = Arc::from(info.name.as_str());
        inner.info = info;
        {
            let mut state = inner.pool.lock();
            state.live = 1;
            state.idle.push(instance);
        }
        let inner = Arc::new(inner);
        let refill_inner = inner.clone();
        let refill = std::thread::Builder::new()
            .name("gantry-policy-refill".into())
            .spawn(move || {
                crate::yield_to_the_loop();
                refill_inner.refill_loop()
            })
            .map_err(|e| PolicyError::Engine(format!("cannot start a refill thread: {e}")))?;
        Ok(Self {
            inner,
            stats,
            refill: Some(refill),
        })
    }

    /// This policy's health: consecutive faults, quarantine, and when the next probe is due.
    /// What the engine exports as `gantry_policy_quarantined{policy=...}` and the UI shows.
    pub fn health(&self) -> PolicyHealth {
        let health = self.inner.health();
        let now = Instant::now();
        PolicyHealth {
            consecutive_faults: health.consecutive,
            quarantined: health.quarantined,
            probe_in: health.quarantined.then(|| {
                if health.probing {
                    Duration::ZERO
                } else {
                    health.next_probe.saturating_duration_since(now)
                }
            }),
            backoff: health.quarantined.then_some(health.backoff),
            quarantines: health.quarantines,
            last_fault: health.last_fault.clone(),
        }
    }

    /// Wait until a warm instance is idle, at most `timeout`; `false` if none came (or the
    /// refill faulted). For tests, and for callers that want a policy warm before its first
    /// call (activating a set, say); calls themselves wait at most the call deadline.
    pub fn wait_ready(&self, timeout: Duration) -> bool {
        let inner = &*self.inner;
        let deadline = Instant::now() + timeout;
        let mut state = inner.pool.lock();
        let faults_before = state.refill_faults;
        if state.idle.is_empty() && state.paused {
            state.paused = false;
            inner.pool.wake_refill.notify_one();
        }
        loop {
            if !state.idle.is_empty() {
                return true;
            }
            if state.refill_faults != faults_before {
                return false;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            state = inner
                .pool
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The policy joined a set (active or shadow): from now on its instances may take the
    /// budget's set reserve, as the policies the scheduler calls must always get instances.
    /// A policy loaded with [`PolicyOptions::upload`] stops short of the reserve until then.
    pub fn join_set(&self) {
        self.inner
            .host
            .in_set
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// What the policy said about itself at load.
    pub fn info(&self) -> &PolicyInfo {
        &self.inner.info
    }

    /// The policy's role (its WIT world).
    pub fn role(&self) -> PolicyRole {
        self.inner.compiled.role
    }

    /// The contract version the policy was built against.
    pub fn version(&self) -> Version {
        self.inner.compiled.version
    }

    /// The label keys whose columns the policy gets (0.2.0 filters and scores), interned, in
    /// the order it asked for them.
    pub fn label_keys(&self) -> &[gantry_core::Sym] {
        &self.inner.label_keys
    }

    /// The sha256 of the component's bytes, hex.
    pub fn sha256(&self) -> &str {
        &self.inner.compiled.sha256
    }

    /// The component's size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.inner.compiled.size_bytes
    }

    /// What a fault does: the options' override, or the role's default.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.inner
            .options
            .failure
            .for_role(self.inner.compiled.role)
    }

    /// The text of a reason code this policy declared.
    pub fn reason_text(&self, code: u16) -> Option<&str> {
        let reasons = &self.inner.info.reasons;
        reasons
            .binary_search_by_key(&code, |(c, _)| *c)
            .ok()
            .map(|i| reasons[i].1.as_str())
    }

    /// A filter's verdicts in words: "N fit; M `<reason>`, …", most-declared code first. What
    /// `gantry policy validate` and the API's upload self-test print.
    pub fn describe_verdicts(&self, codes: &[u16]) -> String {
        let mut code_to_count: std::collections::BTreeMap<u16, usize> =
            std::collections::BTreeMap::new();
        for &code in codes {
            *code_to_count.entry(code).or_default() += 1;
        }
        let fits = code_to_count.remove(&0).unwrap_or(0);
        let rejected: Vec<String> = code_to_count
            .iter()
            .map(|(code, count)| format!("{count} {}", self.reason_text(*code).unwrap_or("?")))
            .collect();
        if rejected.is_empty() {
            format!("{fits} fit")
        } else {
            format!("{fits} fit; {}", rejected.join(", "))
        }
    }

    /// Apply this policy's failure policy to a call's result.
    pub fn guard<T>(&self, result: std::result::Result<T, PolicyFault>) -> Guarded<T> {
        match result {
            Ok(answer) => Guarded::Answer(answer),
            // Skipped as if it were not configured, or rejecting (every node, or the job's
            // admission) with the fault as the reason.
            Err(fault) if self.failure_policy() == FailurePolicy::FailOpen => {
                Guarded::Skipped(fault)
            }
            Err(fault) => Guarded::Rejected(fault),
        }
    }

    /// One reason code per node of `nodes` (0 = fits).
    pub fn filter(
        &self,
        pod: &PodShape,
        nodes: &WasmNodes,
    ) -> std::result::Result<Vec<u16>, PolicyFault> {
        let inner = &*self.inner;
        inner.guarded(|| {
            let pod = convert::pod(pod);
            let codes = inner.call(|instance| match &instance.exports {
                Exports::Filter(filter) => Some(filter.gantry_policy_filter_policy().call_filter(
                    &mut instance.store,
                    &pod,
                    nodes.raw(),
                )),
                Exports::FilterV2(filter) => Some(v2_call(
                    &mut instance.store,
                    nodes,
                    &inner.label_keys,
                    |store, labels| {
                        filter.gantry_policy_filter_policy().call_filter(
                            store,
                            &pod,
                            nodes.raw(),
                            labels,
                        )
                    },
                )),
                _ => None,
            })?;
            if codes.len() != nodes.len() {
                return Err(PolicyFault::BadOutput {
                    detail: format!(
                        "filter returned {} verdicts for {} nodes",
                        codes.len(),
                        nodes.len()
                    ),
                });
            }
            if let Some(code) = codes
                .iter()
                .find(|&&c| c != 0 && !inner.declared[usize::from(c)])
            {
                return Err(PolicyFault::BadOutput {
                    detail: format!(
                        "filter returned reason code {code}, which it did not declare at init"
                    ),
                });
            }
            Ok(codes)
        })
    }

    /// One score in 0..=100 per node of `nodes`.
    pub fn score(
        &self,
        pod: &PodShape,
        nodes: &WasmNodes,
    ) -> std::result::Result<Vec<u32>, PolicyFault> {
        self.score_explained(pod, nodes).map(|scored| scored.scores)
    }

    /// One score in 0..=100 per node of `nodes`, and the reasons a 0.2.0 policy gave for a
    /// few of them (none from a 0.1.0 policy). Every reason is checked: at most
    /// [`SCORE_REASONS_MAX`], each for a node of the call, no node twice, each text at most
    /// [`REASON_TEXT_MAX_BYTES`]; anything else is a bad-output fault, as too many scores are.
    pub fn score_explained(
        &self,
        pod: &PodShape,
        nodes: &WasmNodes,
    ) -> std::result::Result<Scored, PolicyFault> {
        let inner = &*self.inner;
        inner.guarded(|| {
            let pod = convert::pod(pod);
            let scored = inner.call(|instance| match &instance.exports {
                Exports::Score(score) => Some(
                    score
                        .gantry_policy_score_policy()
                        .call_score(&mut instance.store, &pod, nodes.raw())
                        .map(|scores| Scored {
                            scores,
                            reasons: Vec::new(),
                        }),
                ),
                Exports::ScoreV2(score) => {
                    let scored = v2_call(
                        &mut instance.store,
                        nodes,
                        &inner.label_keys,
                        |store, labels| {
                            score.gantry_policy_score_policy().call_score(
                                store,
                                &pod,
                                nodes.raw(),
                                labels,
                            )
                        },
                    );
                    Some(scored.map(|scored| {
                        Scored {
                            scores: scored.scores,
                            reasons: scored
                                .reasons
                                .into_iter()
                                .map(|r| ScoreReason {
                                    node: r.node,
                                    text: r.text,
                                })
                                .collect(),
                        }
                    }))
                }
                _ => None,
            })?;
            let scores = &scored.scores;
            if scores.len() != nodes.len() {
                return Err(PolicyFault::BadOutput {
                    detail: format!(
                        "score returned {} scores for {} nodes",
                        scores.len(),
                        nodes.len()
                    ),
                });
            }
            if let Some(score) = scores.iter().find(|&&s| s > crate::MAX_SCORE) {
                return Err(PolicyFault::BadOutput {
                    detail: format!("score returned {score}, outside 0..={}", crate::MAX_SCORE),
                });
            }
            check_reasons(&scored.reasons, nodes.len())?;
            Ok(scored)
        })
    }

    /// Whether `job` may start now, given its queue's and cohort's usage.
    pub fn admit(
        &self,
        job: &JobRequest,
        queue: &QueueUsage,
        cohort: Option<&CohortUsage>,
    ) -> std::result::Result<QuotaVerdict, PolicyFault> {
        let inner = &*self.inner;
        inner.guarded(|| {
            let job = convert::job(job);
            let queue = convert::queue(queue);
            let cohort = cohort.map(convert::cohort);
            let verdict = inner.call(|instance| match &instance.exports {
                Exports::Quota(quota) => Some(quota.gantry_policy_quota_policy().call_admit(
                    &mut instance.store,
                    &job,
                    queue,
                    cohort.as_ref(),
                )),
                Exports::QuotaV2(quota) => Some(quota.gantry_policy_quota_policy().call_admit(
                    &mut instance.store,
                    &job,
                    queue,
                    cohort.as_ref(),
                )),
                _ => None,
            })?;
            Ok(match verdict {
                types::QuotaVerdict::Admit => QuotaVerdict::Admit,
                types::QuotaVerdict::AdmitBorrowing(borrowed) => QuotaVerdict::AdmitBorrowing {
                    borrowed: convert::resources_from(borrowed),
                },
                types::QuotaVerdict::Deny(reason) => {
                    if reason.len() > DENY_REASON_MAX_BYTES {
                        return Err(PolicyFault::BadOutput {
                            detail: format!(
                                "admit returned a deny reason of {} bytes; deny reasons are at \
                                 most {DENY_REASON_MAX_BYTES} bytes",
                                reason.len()
                            ),
                        });
                    }
                    QuotaVerdict::Deny { reason }
                }
            })
        })
    }
}

impl Drop for Policy {
    fn drop(&mut self) {
        {
            let mut state = self.inner.pool.lock();
            state.closed = true;
            state.idle.clear();
        }
        self.inner.pool.wake_refill.notify_all();
        if let Some(refill) = self.refill.take() {
            let _ = refill.join();
        }
    }
}

impl Inner {
    fn health(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.health.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run `body` (one call plus the checks of its output) unless the policy is quarantined,
    /// and account for its outcome: stats, consecutive faults, quarantine and probes.
    fn guarded<T>(
        &self,
        body: impl FnOnce() -> std::result::Result<T, PolicyFault>,
    ) -> std::result::Result<T, PolicyFault> {
        let started = Instant::now();
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        let probe = match self.gate() {
            Ok(probe) => probe,
            Err(fault) => {
                self.stats.faults.fetch_add(1, Ordering::Relaxed);
                self.stats.quarantined_calls.fetch_add(1, Ordering::Relaxed);
                return Err(fault);
            }
        };
        let result = body();
        self.record(result.as_ref().err(), probe);
        if result.is_err() {
            self.stats.faults.fetch_add(1, Ordering::Relaxed);
        }
        let elapsed = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.stats.busy_ns.fetch_add(elapsed, Ordering::Relaxed);
        self.host.log.report(&self.host.policy_name);
        result
    }

    /// `Ok(true)`: this call is the probe of a quarantined policy; `Ok(false)`: an ordinary
    /// call; `Err`: quarantined, refuse at once.
    fn gate(&self) -> std::result::Result<bool, PolicyFault> {
        let mut health = self.health();
        if !health.quarantined {
            return Ok(false);
        }
        let now = Instant::now();
        if !health.probing && now >= health.next_probe {
            health.probing = true;
            return Ok(true);
        }
        let probe_in = if health.probing {
            Duration::ZERO
        } else {
            health.next_probe - now
        };
        Err(PolicyFault::Quarantined {
            faults: health.consecutive,
            last: Box::new(health.last_fault.clone().unwrap_or(PolicyFault::Trap {
                message: "unknown".into(),
            })),
            probe_in_ms: u64::try_from(probe_in.as_millis())
                .unwrap_or(u64::MAX)
                .max(u64::from(!probe_in.is_zero())),
        })
    }

    fn record(&self, fault: Option<&PolicyFault>, probe: bool) {
        let limits = &self.shared.limits;
        let mut health = self.health();
        let policy = &*self.host.policy_name;
        let Some(fault) = fault else {
            if health.quarantined {
                tracing::info!(policy, "a probe call succeeded: quarantine lifted");
            }
            health.consecutive = 0;
            health.quarantined = false;
            health.probing = false;
            health.backoff = limits.quarantine_backoff;
            return;
        };
        health.consecutive = health.consecutive.saturating_add(1);
        health.last_fault = Some(fault.clone());
        let now = Instant::now();
        if probe {
            health.probing = false;
            health.backoff = (health.backoff * 2).min(limits.quarantine_backoff_max);
            health.next_probe = now + health.backoff;
            tracing::warn!(
                policy,
                "the probe call faulted ({fault}); still quarantined, next probe in {:?}",
                health.backoff
            );
        } else if !health.quarantined && health.consecutive >= limits.quarantine_after {
            health.quarantined = true;
            health.quarantines += 1;
            health.backoff = limits.quarantine_backoff;
            health.next_probe = now + health.backoff;
            tracing::warn!(
                policy,
                "quarantined after {} consecutive faults (last: {fault})",
                health.consecutive
            );
        }
    }

    /// Run `f` on a pooled instance under the call bounds. `f` returns `None` when the instance
    /// is of another role, which `Policy` never lets happen.
    fn call<T>(
        &self,
        f: impl FnOnce(&mut Instance) -> Option<wasmtime::Result<T>>,
    ) -> std::result::Result<T, PolicyFault> {
        let mut instance = self.acquire()?;
        instance.arm(crate::engine::ticks_for(self.call_deadline()));
        let outcome = f(&mut instance).unwrap_or_else(|| {
            Err(wasmtime::Error::msg(format!(
                "policy is not a {} policy",
                self.compiled.role
            )))
        });
        match outcome {
            Ok(answer) => {
                self.release(instance);
                Ok(answer)
            }
            Err(error) => {
                let fault =
                    self.classify(instance.refused(), instance.console_tail(), &error, false);
                self.discard(instance);
                Err(fault)
            }
        }
    }

    /// An idle instance, or wait at most the call deadline for one to be returned or made by
    /// the refill thread. Never instantiates on the caller's thread.
    fn acquire(&self) -> std::result::Result<Instance, PolicyFault> {
        let deadline_after = self.call_deadline();
        let deadline = Instant::now() + deadline_after;
        let mut state = self.pool.lock();
        if let Some(instance) = state.idle.pop() {
            return Ok(instance);
        }
        let faults_before = state.refill_faults;
        // Each caller that finds nothing may retry a refill that failed before it came.
        state.paused = false;
        state.waiters += 1;
        // A shadow set's call waiting for a spare does not hurry it: it pauses with the spare.
        let for_the_loop = crate::set::pausing_on().is_none();
        if for_the_loop {
            state.loop_waiters += 1;
            self.pool.urgent.store(true, Ordering::Release);
        }
        self.pool.wake_refill.notify_one();
        let result = loop {
            if let Some(instance) = state.idle.pop() {
                break Ok(instance);
            }
            let left = deadline.checked_duration_since(Instant::now());
            if state.refill_faults != faults_before || left.is_none() {
                break Err(PolicyFault::NotReady {
                    waited_ms: u64::try_from(deadline_after.as_millis()).unwrap_or(u64::MAX),
                    last_refill: state.last_refill_fault.clone().map(Box::new),
                });
            }
            state = self
                .pool
                .changed
                .wait_timeout(state, left.unwrap_or_default())
                .unwrap_or_else(|e| e.into_inner())
                .0;
        };
        state.waiters -= 1;
        if for_the_loop {
            state.loop_waiters -= 1;
            if state.loop_waiters == 0 {
                self.pool.urgent.store(false, Ordering::Release);
            }
        }
        result
    }

    fn release(&self, instance: Instance) {
        let mut state = self.pool.lock();
        if !state.closed {
            state.idle.push(instance);
        } else {
            state.live -= 1;
        }
        drop(state);
        self.pool.changed.notify_one();
    }

    fn discard(&self, instance: Instance) {
        drop(instance);
        let mut state = self.pool.lock();
        state.live -= 1;
        drop(state);
        self.pool.wake_refill.notify_one();
    }

    /// The refill thread: make an instance whenever the pool wants one (none left, or callers
    /// waiting under the cap), until the policy is dropped. A failed refill is not retried
    /// until a caller asks again, so a policy whose init always fails costs one init per call
    /// (and none once quarantined), not a busy loop.
    fn refill_loop(&self) {
        let concurrency = self.shared.limits.concurrency;
        let mut state = self.pool.lock();
        loop {
            if state.closed {
                break;
            }
            if !state.refill_wanted(concurrency) {
                state = self
                    .pool
                    .wake_refill
                    .wait(state)
                    .unwrap_or_else(|e| e.into_inner());
                continue;
            }
            state.live += 1;
            drop(state);
            // A spare nobody waits for yet pauses while the loop cycles; one a caller waits
            // for does not.
            let made = {
                let _pausing = crate::set::PausingOn::set(
                    self.shared.gate.clone(),
                    Some(self.pool.urgent.clone()),
                );
                self.instantiate()
            };
            state = self.pool.lock();
            match made {
                Ok((instance, _)) if !state.closed => {
                    state.idle.push(instance);
                    state.last_refill_fault = None;
                }
                Ok(_) => state.live -= 1,
                Err(fault) => {
                    tracing::warn!(
                        policy = &*self.host.policy_name,
                        "refilling a warm instance faulted: {fault}"
                    );
                    state.live -= 1;
                    state.paused = true;
                    state.refill_faults += 1;
                    state.last_refill_fault = Some(fault);
                }
            }
            self.pool.changed.notify_all();
        }
        state.live -= state.idle.len();
        state.idle.clear();
    }

    /// A fresh instance, initialised with the policy's config, its self-description checked.
    fn instantiate(&self) -> std::result::Result<(Instance, PolicyInfo), PolicyFault> {
        self.stats.instances_created.fetch_add(1, Ordering::Relaxed);
        let mut instance = Instance::new(
            &self.shared,
            &self.compiled,
            &self.options.capabilities,
            self.host.clone(),
        )
        .map_err(|(error, refused)| self.classify(refused, None, &error, true))?;
        let config = self.options.config.as_str();
        let init = match &instance.exports {
            Exports::Filter(f) => f
                .gantry_policy_filter_policy()
                .call_init(&mut instance.store, config),
            Exports::Score(s) => s
                .gantry_policy_score_policy()
                .call_init(&mut instance.store, config),
            Exports::Quota(q) => q
                .gantry_policy_quota_policy()
                .call_init(&mut instance.store, config),
            Exports::FilterV2(f) => f
                .gantry_policy_filter_policy()
                .call_init(&mut instance.store, config),
            Exports::ScoreV2(s) => s
                .gantry_policy_score_policy()
                .call_init(&mut instance.store, config),
            Exports::QuotaV2(q) => q
                .gantry_policy_quota_policy()
                .call_init(&mut instance.store, config),
        };
        let info = match init {
            Ok(Ok(info)) => info,
            Ok(Err(message)) => return Err(PolicyFault::BadConfig { message }),
            Err(error) => {
                return Err(self.classify(
                    instance.refused(),
                    instance.console_tail(),
                    &error,
                    true,
                ));
            }
        };
        let info = self.check_info(info)?;
        Ok((instance, info))
    }

    /// A 0.2.0 filter's or score's `label-keys`, called once on the first instance, right after
    /// its init and under what is left of the init deadline; checked and interned. Nothing for
    /// any other policy.
    fn read_label_keys(
        &self,
        instance: &mut Instance,
    ) -> std::result::Result<Vec<gantry_core::Sym>, PolicyFault> {
        let keys = match &instance.exports {
            Exports::FilterV2(f) => f
                .gantry_policy_filter_policy()
                .call_label_keys(&mut instance.store),
            Exports::ScoreV2(s) => s
                .gantry_policy_score_policy()
                .call_label_keys(&mut instance.store),
            _ => return Ok(Vec::new()),
        };
        let keys = keys.map_err(|error| {
            self.classify(instance.refused(), instance.console_tail(), &error, true)
        })?;
        let bad = |detail: String| PolicyFault::BadOutput { detail };
        if keys.len() > LABEL_KEYS_MAX {
            return Err(bad(format!(
                "label-keys asked for {} label keys; at most {LABEL_KEYS_MAX} may be asked for",
                keys.len()
            )));
        }
        if let Some(key) = keys.iter().find(|k| k.len() > LABEL_KEY_MAX_BYTES) {
            return Err(bad(format!(
                "label-keys asked for a key of {} bytes; label keys are at most \
                 {LABEL_KEY_MAX_BYTES} bytes",
                key.len()
            )));
        }
        if keys.iter().any(|k| k.is_empty()) {
            return Err(bad("label-keys asked for the empty label key".into()));
        }
        let symbols = &self.shared.symbols;
        Ok(keys.iter().map(|key| symbols.intern(key)).collect())
    }

    /// Bound and check what init returned: every string a policy hands the host is bounded.
    fn check_info(&self, info: types::PolicyInfo) -> std::result::Result<PolicyInfo, PolicyFault> {
        let bad = |detail: String| PolicyFault::BadOutput { detail };
        if info.name.len() > NAME_MAX_BYTES {
            return Err(bad(format!(
                "init returned a name of {} bytes; names are at most {NAME_MAX_BYTES} bytes",
                info.name.len()
            )));
        }
        if info.version.len() > VERSION_MAX_BYTES {
            return Err(bad(format!(
                "init returned a version of {} bytes; versions are at most {VERSION_MAX_BYTES} \
                 bytes",
                info.version.len()
            )));
        }
        if info.reasons.len() > REASONS_MAX {
            return Err(bad(format!(
                "init declared {} reasons; at most {REASONS_MAX} may be declared",
                info.reasons.len()
            )));
        }
        if let Some(reason) = info
            .reasons
            .iter()
            .find(|r| r.text.len() > REASON_TEXT_MAX_BYTES)
        {
            return Err(bad(format!(
                "init declared a text of {} bytes for reason code {}; reason texts are at most \
                 {REASON_TEXT_MAX_BYTES} bytes",
                reason.text.len(),
                reason.code
            )));
        }
        let mut reasons: Vec<(u16, String)> = info
            .reasons
            .into_iter()
            .map(|reason| (reason.code, reason.text))
            .collect();
        reasons.sort_by_key(|(code, _)| *code);
        if let Some((code, _)) = reasons.iter().find(|(code, _)| *code == 0) {
            return Err(bad(format!(
                "init declared reason code {code}, which is reserved for \"fits\""
            )));
        }
        if reasons.windows(2).any(|pair| pair[0].0 == pair[1].0) {
            return Err(bad("init declared the same reason code twice".into()));
        }
        Ok(PolicyInfo {
            name: info.name,
            version: info.version,
            role: self.compiled.role,
            sha256: self.compiled.sha256.clone(),
            reasons,
        })
    }

    /// `in_init`: the error came from instantiate + init, which run under the init deadline.
    fn classify(
        &self,
        refused: Option<Refusal>,
        console: Option<String>,
        error: &wasmtime::Error,
        in_init: bool,
    ) -> PolicyFault {
        classify(
            &self.shared.limits,
            self.call_deadline(),
            refused,
            console,
            error,
            in_init,
        )
    }

    /// The wall time one call may take: the policy's own deadline, or the engine's.
    fn call_deadline(&self) -> Duration {
        self.options.deadline.unwrap_or(self.shared.limits.deadline)
    }
}

/// The checks on a score call's reasons, for `nodes` nodes: see [`Policy::score_explained`].
fn check_reasons(reasons: &[ScoreReason], nodes: usize) -> std::result::Result<(), PolicyFault> {
    let bad = |detail: String| Err(PolicyFault::BadOutput { detail });
    if reasons.len() > SCORE_REASONS_MAX {
        return bad(format!(
            "score returned {} reasons; at most {SCORE_REASONS_MAX} may be given per call",
            reasons.len()
        ));
    }
    let mut seen: Vec<u32> = Vec::with_capacity(reasons.len());
    for reason in reasons {
        if reason.text.len() > REASON_TEXT_MAX_BYTES {
            return bad(format!(
                "score returned a reason of {} bytes for node {}; reason texts are at most \
                 {REASON_TEXT_MAX_BYTES} bytes",
                reason.text.len(),
                reason.node
            ));
        }
        if reason.node as usize >= nodes {
            return bad(format!(
                "score returned a reason for node {}, but the call had {nodes} nodes",
                reason.node
            ));
        }
        if seen.contains(&reason.node) {
            return bad(format!(
                "score returned two reasons for node {}; at most one per node",
                reason.node
            ));
        }
        seen.push(reason.node);
    }
    Ok(())
}

/// Turn a wasmtime error into the fault an admin reads. `refused`: which memory limit refused a
/// grow during the call; `console`: the guest's last console line (a Rust panic message).
pub(crate) fn classify(
    limits: &crate::engine::Limits,
    call_deadline: Duration,
    refused: Option<Refusal>,
    console: Option<String>,
    error: &wasmtime::Error,
    in_init: bool,
) -> PolicyFault {
    let trap = error.downcast_ref::<Trap>().copied();
    if trap == Some(Trap::Interrupt) {
        let deadline = if in_init {
            limits.init_deadline
        } else {
            call_deadline
        };
        return PolicyFault::Timeout {
            deadline_ms: u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
        };
    }
    match refused {
        Some(Refusal::Process) => {
            return PolicyFault::ProcessMemory {
                budget_mib: (limits.process_memory_bytes >> 20) as u64,
            };
        }
        Some(Refusal::Reserve) => {
            let reserve = limits.set_reserve_bytes.min(limits.process_memory_bytes);
            return PolicyFault::UploadBudget {
                left_mib: ((limits.process_memory_bytes - reserve) >> 20) as u64,
                reserve_mib: (reserve >> 20) as u64,
            };
        }
        Some(Refusal::Instance) => {
            return PolicyFault::OutOfMemory {
                limit_mib: (limits.memory_bytes >> 20) as u64,
            };
        }
        None => {}
    }
    let root = crate::engine::one_line(&error.root_cause().to_string());
    let message = match (trap, console) {
        (Some(Trap::StackOverflow), _) => "call stack exhausted (unbounded recursion?)".into(),
        // A trap displays as "wasm trap: …" already.
        (Some(trap), Some(console)) => format!("{console} ({trap})"),
        (Some(trap), None) => trap.to_string(),
        (None, _) => root,
    };
    PolicyFault::Trap { message }
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;

/// Runs a `gantry:policy@0.2.0` `filter` or `score` call with what only that version gets: the
/// label columns of the keys it asked for, and the domain names `host.domain-name` answers from
/// during the call, cleared after it so that no other call (nor `init`) sees them.
fn v2_call<T>(
    store: &mut wasmtime::Store<crate::instance::HostState>,
    nodes: &WasmNodes,
    label_keys: &[gantry_core::Sym],
    call: impl FnOnce(
        &mut wasmtime::Store<crate::instance::HostState>,
        &[crate::bindings::v2::labels::LabelColumn],
    ) -> T,
) -> T {
    let labels = nodes.label_columns(label_keys);
    store.data_mut().domains = Some(nodes.domain_names());
    let out = call(store, &labels);
    store.data_mut().domains = None;
    out
}
