use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use gantry_core::{CohortUsage, JobRequest, PodShape, QueueUsage, QuotaVerdict};
use serde::{Deserialize, Serialize};
use wasmtime::Trap;

use crate::bindings::types;
use crate::convert::{self, WasmNodes};
use crate::engine::{Capabilities, CompiledPolicy, EngineShared, Role};
use crate::error::{PolicyError, PolicyFault, Result};
use crate::instance::{Exports, Instance};

/// What a fault does to the decision it happened in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailurePolicy {
    /// Reject (every node, or the job's admission), with the fault as the reason.
    FailClosed,
    /// Skip the policy for this call, as if it were not configured.
    FailOpen,
}

/// How to load a policy.
#[derive(Debug, Clone)]
pub struct PolicyOptions {
    /// JSON passed to `init`.
    pub config: String,
    /// `None` uses the role's default (filter and quota closed, score open).
    pub failure: Option<FailurePolicy>,
    pub capabilities: Capabilities,
}

impl Default for PolicyOptions {
    fn default() -> Self {
        Self {
            config: "{}".into(),
            failure: None,
            capabilities: Capabilities::default(),
        }
    }
}

impl PolicyOptions {
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
    pub name: String,
    pub version: String,
    pub role: Role,
    pub sha256: String,
    /// Declared reason codes and their texts, sorted by code.
    pub reasons: Vec<(u16, String)>,
}

/// Per-policy counters, for metrics and the bench.
#[derive(Debug, Default)]
pub struct PolicyStats {
    pub calls: AtomicU64,
    pub faults: AtomicU64,
    pub busy_ns: AtomicU64,
    pub instances_created: AtomicU64,
}

/// A loaded, configured policy: call it from any thread. Calls run on pooled instances, at most
/// `Limits::concurrency` at once; each call is bounded by the deadline and the memory cap, and
/// an instance that faulted is dropped, never reused.
pub struct Policy {
    shared: Arc<EngineShared>,
    compiled: Arc<CompiledPolicy>,
    options: PolicyOptions,
    info: PolicyInfo,
    /// Indexed by reason code: whether the policy declared it. Checked for every verdict.
    declared: Vec<bool>,
    pool: Pool,
    pub stats: PolicyStats,
}

/// Idle instances plus a count of live ones. Locked briefly to take or return an instance;
/// `returned` wakes a caller waiting for the concurrency cap.
struct Pool {
    state: Mutex<PoolState>,
    returned: Condvar,
}

struct PoolState {
    idle: Vec<Instance>,
    live: usize,
}

/// A policy's answer after its failure policy was applied to any fault.
#[derive(Debug, Clone, PartialEq)]
pub enum Guarded<T> {
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
        let mut policy = Self {
            shared,
            compiled,
            options,
            info: PolicyInfo {
                name: String::new(),
                version: String::new(),
                role: Role::Filter,
                sha256: String::new(),
                reasons: Vec::new(),
            },
            declared: Vec::new(),
            pool: Pool {
                state: Mutex::new(PoolState {
                    idle: Vec::new(),
                    live: 0,
                }),
                returned: Condvar::new(),
            },
            stats: PolicyStats::default(),
        };
        let (instance, info) = policy.instantiate().map_err(|fault| match fault {
            PolicyFault::BadConfig { message } => PolicyError::BadConfig(message),
            other => PolicyError::InitFault(other),
        })?;
        let mut declared = vec![false; 1 + usize::from(u16::MAX)];
        for (code, _) in &info.reasons {
            declared[usize::from(*code)] = true;
        }
        policy.declared = declared;
        policy.info = info;
        let mut state = policy.pool.lock();
        state.live = 1;
        state.idle.push(instance);
        drop(state);
        Ok(policy)
    }

    pub fn info(&self) -> &PolicyInfo {
        &self.info
    }

    pub fn role(&self) -> Role {
        self.compiled.role
    }

    pub fn sha256(&self) -> &str {
        &self.compiled.sha256
    }

    pub fn size_bytes(&self) -> usize {
        self.compiled.size_bytes
    }

    pub fn failure_policy(&self) -> FailurePolicy {
        self.options
            .failure
            .unwrap_or_else(|| self.compiled.role.default_failure())
    }

    /// The text of a reason code this policy declared.
    pub fn reason_text(&self, code: u16) -> Option<&str> {
        self.info
            .reasons
            .binary_search_by_key(&code, |(c, _)| *c)
            .ok()
            .map(|i| self.info.reasons[i].1.as_str())
    }

    /// A filter's verdicts in words: "N fit; M <reason>, …", most-declared code first. What
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
            Err(fault) => match self.failure_policy() {
                FailurePolicy::FailOpen => Guarded::Skipped(fault),
                FailurePolicy::FailClosed => Guarded::Rejected(fault),
            },
        }
    }

    /// One reason code per node of `nodes` (0 = fits).
    pub fn filter(
        &self,
        pod: &PodShape,
        nodes: &WasmNodes,
    ) -> std::result::Result<Vec<u16>, PolicyFault> {
        let pod = convert::pod(pod);
        let codes = self.call(|instance| match &instance.exports {
            Exports::Filter(filter) => Some(filter.gantry_policy_filter_policy().call_filter(
                &mut instance.store,
                &pod,
                nodes.raw(),
            )),
            _ => None,
        })?;
        if codes.len() != nodes.len() {
            return Err(self.bad_output(format!(
                "filter returned {} verdicts for {} nodes",
                codes.len(),
                nodes.len()
            )));
        }
        if let Some(code) = codes
            .iter()
            .find(|&&c| c != 0 && !self.declared[usize::from(c)])
        {
            return Err(self.bad_output(format!(
                "filter returned reason code {code}, which it did not declare at init"
            )));
        }
        Ok(codes)
    }

    /// One score in 0..=100 per node of `nodes`.
    pub fn score(
        &self,
        pod: &PodShape,
        nodes: &WasmNodes,
    ) -> std::result::Result<Vec<u32>, PolicyFault> {
        let pod = convert::pod(pod);
        let scores = self.call(|instance| match &instance.exports {
            Exports::Score(score) => Some(score.gantry_policy_score_policy().call_score(
                &mut instance.store,
                &pod,
                nodes.raw(),
            )),
            _ => None,
        })?;
        if scores.len() != nodes.len() {
            return Err(self.bad_output(format!(
                "score returned {} scores for {} nodes",
                scores.len(),
                nodes.len()
            )));
        }
        if let Some(score) = scores.iter().find(|&&s| s > crate::MAX_SCORE) {
            return Err(self.bad_output(format!(
                "score returned {score}, outside 0..={}",
                crate::MAX_SCORE
            )));
        }
        Ok(scores)
    }

    /// Whether `job` may start now, given its queue's and cohort's usage.
    pub fn admit(
        &self,
        job: &JobRequest,
        queue: &QueueUsage,
        cohort: Option<&CohortUsage>,
    ) -> std::result::Result<QuotaVerdict, PolicyFault> {
        let job = convert::job(job);
        let queue = convert::queue(queue);
        let cohort = cohort.map(convert::cohort);
        let verdict = self.call(|instance| match &instance.exports {
            Exports::Quota(quota) => Some(quota.gantry_policy_quota_policy().call_admit(
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
            types::QuotaVerdict::Deny(reason) => QuotaVerdict::Deny { reason },
        })
    }

    fn bad_output(&self, detail: String) -> PolicyFault {
        self.stats.faults.fetch_add(1, Ordering::Relaxed);
        PolicyFault::BadOutput { detail }
    }

    /// Run `f` on a pooled instance under the call bounds. `f` returns `None` when the instance
    /// is of another role, which `Policy` never lets happen.
    fn call<T>(
        &self,
        f: impl FnOnce(&mut Instance) -> Option<wasmtime::Result<T>>,
    ) -> std::result::Result<T, PolicyFault> {
        let started = Instant::now();
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        let result = self.acquire().and_then(|mut instance| {
            instance.arm(self.shared.deadline_ticks());
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
                    let fault = self.classify(&instance, &error);
                    self.discard(instance);
                    Err(fault)
                }
            }
        });
        if result.is_err() {
            self.stats.faults.fetch_add(1, Ordering::Relaxed);
        }
        let elapsed = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.stats.busy_ns.fetch_add(elapsed, Ordering::Relaxed);
        result
    }

    /// An idle instance, a new one if under the cap, or wait for one to come back.
    fn acquire(&self) -> std::result::Result<Instance, PolicyFault> {
        let mut state = self.pool.lock();
        loop {
            if let Some(instance) = state.idle.pop() {
                return Ok(instance);
            }
            if state.live < self.shared.limits.concurrency {
                state.live += 1;
                drop(state);
                return match self.instantiate() {
                    Ok((instance, _)) => Ok(instance),
                    Err(fault) => {
                        self.pool.lock().live -= 1;
                        self.pool.returned.notify_one();
                        Err(fault)
                    }
                };
            }
            state = self
                .pool
                .returned
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    fn release(&self, instance: Instance) {
        self.pool.lock().idle.push(instance);
        self.pool.returned.notify_one();
    }

    fn discard(&self, instance: Instance) {
        drop(instance);
        self.pool.lock().live -= 1;
        self.pool.returned.notify_one();
    }

    /// A fresh instance, initialised with the policy's config.
    fn instantiate(&self) -> std::result::Result<(Instance, PolicyInfo), PolicyFault> {
        self.stats.instances_created.fetch_add(1, Ordering::Relaxed);
        let name: Arc<str> = if self.info.name.is_empty() {
            Arc::from(self.compiled.sha256.get(..12).unwrap_or_default())
        } else {
            Arc::from(self.info.name.as_str())
        };
        let mut instance = Instance::new(
            &self.shared,
            &self.compiled,
            &self.options.capabilities,
            name,
        )
        .map_err(|e| self.classify_error(None, &e, true))?;
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
        };
        let info = match init {
            Ok(Ok(info)) => info,
            Ok(Err(message)) => return Err(PolicyFault::BadConfig { message }),
            Err(error) => return Err(self.classify_error(Some(&instance), &error, true)),
        };
        let mut reasons: Vec<(u16, String)> = info
            .reasons
            .into_iter()
            .map(|reason| (reason.code, reason.text))
            .collect();
        reasons.sort_by_key(|(code, _)| *code);
        if let Some((code, _)) = reasons.iter().find(|(code, _)| *code == 0) {
            return Err(PolicyFault::BadOutput {
                detail: format!("init declared reason code {code}, which is reserved for \"fits\""),
            });
        }
        if reasons.windows(2).any(|pair| pair[0].0 == pair[1].0) {
            return Err(PolicyFault::BadOutput {
                detail: "init declared the same reason code twice".into(),
            });
        }
        let info = PolicyInfo {
            name: info.name,
            version: info.version,
            role: self.compiled.role,
            sha256: self.compiled.sha256.clone(),
            reasons,
        };
        Ok((instance, info))
    }

    fn classify(&self, instance: &Instance, error: &wasmtime::Error) -> PolicyFault {
        self.classify_error(Some(instance), error, false)
    }

    /// `in_init`: the error came from instantiate + init, which run under the init deadline.
    fn classify_error(
        &self,
        instance: Option<&Instance>,
        error: &wasmtime::Error,
        in_init: bool,
    ) -> PolicyFault {
        let limits = &self.shared.limits;
        let trap = error.downcast_ref::<Trap>().copied();
        if trap == Some(Trap::Interrupt) {
            let deadline = if in_init {
                limits.init_deadline
            } else {
                limits.deadline
            };
            return PolicyFault::Timeout {
                deadline_ms: u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
            };
        }
        let out_of_memory = PolicyFault::OutOfMemory {
            limit_mib: (limits.memory_bytes >> 20) as u64,
        };
        if instance.is_some_and(Instance::memory_refused) {
            return out_of_memory;
        }
        let root = crate::engine::one_line(&error.root_cause().to_string());
        if instance.is_none() && root.contains("memory") && root.contains("limit") {
            return out_of_memory;
        }
        let message = match (trap, instance.and_then(Instance::console_tail)) {
            (Some(Trap::StackOverflow), _) => "call stack exhausted (unbounded recursion?)".into(),
            (Some(trap), Some(console)) => format!("{console} (wasm trap: {trap})"),
            (Some(trap), None) => format!("wasm trap: {trap}"),
            (None, _) => root,
        };
        PolicyFault::Trap { message }
    }
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}
