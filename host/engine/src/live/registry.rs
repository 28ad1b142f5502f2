//! The policy-set registry: validating and self-testing an upload, storing it, building a
//! stored set into loaded policies (shared by every version that has the same entry), and
//! activating a version.

use super::*;

/// A loaded policy is keyed by its bytes, its config, its failure policy and its call deadline
/// (ms): the same entry in two set versions is one instance pool, so rolling back
/// re-initialises nothing.
pub(super) type EntryKey = (String, String, FailurePolicy, Option<u64>);

impl Live {
    /// The policy set new cycles run on.
    pub fn active_set(&self) -> Arc<PolicySet> {
        self.active.load()
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

    pub(super) fn self_test(&self, policy: &Policy) -> Result<String> {
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
            PolicyRole::Filter => {
                let nodes = WasmNodes::new(&view.nodes);
                let codes = policy
                    .filter(&pod, &nodes)
                    .map_err(|f| EngineError::SelfTest(f.to_string()))?;
                Ok(format!(
                    "an 8-GPU pod on the {n} current nodes: {}",
                    policy.describe_verdicts(&codes)
                ))
            }
            PolicyRole::Score => {
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
            PolicyRole::Quota => {
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
        let role = policy.role();
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
                    let options = PolicyOptions {
                        failure: entry.failure,
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
