//! The policy-set registry: validating and self-testing an upload, storing it, building a
//! stored set into loaded policies (shared by every version that has the same entry), and
//! activating a version.

use super::*;

/// A loaded policy is keyed by its bytes, its config, its failure policy and its call deadline
/// (ms): the same entry in two set versions is one instance pool, so rolling back
/// re-initialises nothing.
pub(super) type EntryKey = (String, String, FailurePolicy, Option<u64>);

/// Loaded policies no set holds that are kept loaded, the most recently used first: an upload
/// is usually put in a set next, and a rolled-back version's entries come back. The rest are
/// dropped, and with them their instances, refill threads and Wasm budget.
pub const IDLE_POLICIES_KEPT: usize = 16;

/// The loaded policies by entry, so set versions sharing an entry share its instances, with
/// when each was last used. A policy only this map holds is idle; beyond the
/// [`IDLE_POLICIES_KEPT`] most recent, idle ones are dropped, so distinct uploads cannot pile
/// up loaded policies until the budget is spent.
#[derive(Default)]
pub(super) struct LoadedPolicies {
    entry_to_policy: HashMap<EntryKey, (Arc<Policy>, u64)>,
    /// Counts lookups and inserts: the last use of each entry.
    uses: u64,
}

impl LoadedPolicies {
    /// The policy loaded for `key`, marked used.
    fn get(&mut self, key: &EntryKey) -> Option<Arc<Policy>> {
        self.uses += 1;
        let uses = self.uses;
        self.entry_to_policy.get_mut(key).map(|(policy, used)| {
            *used = uses;
            policy.clone()
        })
    }

    /// Keeps `policy` for `key` (or the one already there, which is returned), then drops the
    /// idle ones beyond the most recent. Returns the policy and those dropped, which the
    /// caller lets go of outside the lock: dropping a policy joins its refill thread.
    fn insert(&mut self, key: EntryKey, policy: Arc<Policy>) -> (Arc<Policy>, Vec<Arc<Policy>>) {
        self.uses += 1;
        let uses = self.uses;
        let (kept, used) = self.entry_to_policy.entry(key).or_insert((policy, uses));
        *used = uses;
        let kept = kept.clone();
        (kept, self.prune())
    }

    /// Removes the idle policies beyond the [`IDLE_POLICIES_KEPT`] most recently used.
    fn prune(&mut self) -> Vec<Arc<Policy>> {
        let mut idle: Vec<(u64, EntryKey)> = self
            .entry_to_policy
            .iter()
            // The map's is the only count: no set, and no caller, holds it.
            .filter(|(_, (policy, _))| Arc::strong_count(policy) == 1)
            .map(|(key, (_, used))| (*used, key.clone()))
            .collect();
        if idle.len() <= IDLE_POLICIES_KEPT {
            return Vec::new();
        }
        idle.sort_unstable_by_key(|(used, _)| std::cmp::Reverse(*used));
        idle.drain(IDLE_POLICIES_KEPT..)
            .filter_map(|(_, key)| self.entry_to_policy.remove(&key))
            .map(|(policy, _)| policy)
            .collect()
    }

    /// How many policies are loaded, in sets or idle.
    pub(super) fn len(&self) -> usize {
        self.entry_to_policy.len()
    }
}

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
        // An upload's instances stop short of the budget's set reserve until it joins a set:
        // uploads never leave the active set's policies without instances.
        let options = PolicyOptions {
            deadline: deadline_ms.map(Duration::from_millis),
            upload: true,
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
        let key = (
            validation.sha256.clone(),
            config.to_string(),
            FailurePolicy::Default,
            deadline_ms,
        );
        let (_, dropped) = self.loaded().insert(key, policy);
        drop(dropped);
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
            let cached = self.loaded().get(&key);
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
                    let (policy, dropped) = self.loaded().insert(key, policy);
                    drop(dropped);
                    policy
                }
            };
            // In a set now (even an upload loaded first to validate it): its instances may
            // take the set reserve.
            policy.join_set();
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

    /// The loaded policies, locked (briefly: never across a load or a drop).
    fn loaded(&self) -> std::sync::MutexGuard<'_, LoadedPolicies> {
        self.loaded_policies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// How many policies are loaded: in the active or shadow set, or idle and kept (see
    /// [`IDLE_POLICIES_KEPT`]).
    pub fn loaded_policy_count(&self) -> usize {
        self.loaded().len()
    }

    /// The `/metrics` text: the registry, the Wasm footprint, the store's damage and each
    /// loaded policy's figures.
    pub fn render_metrics(&self) -> String {
        self.metrics.render(
            &self.loaded_policies(),
            self.wasm_footprint(),
            self.store.history_damage(),
        )
    }

    /// What the loaded policies hold of the Wasm budget, for `/metrics`.
    pub fn wasm_footprint(&self) -> crate::metrics::WasmFootprint {
        crate::metrics::WasmFootprint {
            budget_used_bytes: self.engine.process_memory_used(),
            budget_limit_bytes: self.engine.limits().process_memory_bytes,
            loaded_policies: self.loaded_policy_count(),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin(file: &str) -> Vec<u8> {
        let dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| format!("{}/../../target", env!("CARGO_MANIFEST_DIR")).into())
            .join("wasm32-wasip2/plugin");
        std::fs::read(dir.join(file)).unwrap_or_else(|e| {
            panic!("{file}: {e}. Build the policies first: scripts/build-plugins.sh")
        })
    }

    fn threads() -> usize {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Threads:"))
                    .and_then(|n| n.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// 960 uploads differing only in their config's whitespace once spent the budget: every
    /// upload was kept loaded, with its instances and refill thread, for ever.
    #[test]
    fn distinct_uploads_leave_the_loaded_policies_and_the_budget_bounded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(gantry_store::StoreConfig::new(dir.path())).expect("store");
        let engine = Arc::new(
            PolicyEngine::new(gantry_policy::Limits::default(), Symbols::new()).expect("engine"),
        );
        let live = Live::new(
            store,
            engine,
            PolicySet::new(0, Vec::new()),
            LiveConfig::default(),
        );
        let actor = Actor::new("root", "test");
        // The active set: gpu-fit, loaded through the registry as an activation does.
        let fit = plugin("gpu_fit.wasm");
        let upload = live
            .upload(&actor, &fit, "{}", None)
            .expect("upload gpu-fit");
        let entry = gantry_store::SetEntry {
            sha256: upload.manifest.sha256.clone(),
            weight: 1,
            failure: FailurePolicy::Default,
            config: "{}".into(),
            deadline_ms: None,
        };
        let stored = live
            .store
            .put_set(&actor, vec![entry], "active", now_ms())
            .expect("set");
        live.activate(&actor, stored.version, false)
            .expect("activate");
        let active = live.active_set().entries()[0].policy.clone();
        let (threads_before, budget_before) = (threads(), live.engine.process_memory_used());
        let noop = plugin("noop.wasm");
        let uploads = 2000;
        let mut most_loaded = 0;
        let symbols = live.symbols().clone();
        let nodes = gantry_policy::WasmNodes::new(&gantry_core::NodeTable::default());
        let pod = PodShape {
            name: symbols.intern("pod"),
            gpus: 1,
            gang_size: 1,
            ..PodShape::default()
        };
        for i in 0..uploads {
            let config = format!("{{{}}}", " ".repeat(i));
            live.upload(&actor, &noop, &config, None)
                .unwrap_or_else(|e| panic!("upload {i}: {e}"));
            most_loaded = most_loaded.max(live.loaded_policy_count());
            if i % 100 == 0 {
                // The active policy keeps getting instances.
                active
                    .filter(&pod, &nodes)
                    .unwrap_or_else(|f| panic!("the active policy after {i} uploads: {f}"));
            }
        }
        let (threads_after, budget_after) = (threads(), live.engine.process_memory_used());
        println!(
            "{uploads} uploads: at most {most_loaded} policies loaded; threads {threads_before} → \
             {threads_after}; Wasm budget {budget_before} → {budget_after} bytes"
        );
        // The active one, the idle ones kept, and the last upload (idle from the next one on).
        assert_eq!(most_loaded, IDLE_POLICIES_KEPT + 2);
        assert_eq!(live.loaded_policy_count(), IDLE_POLICIES_KEPT + 2);
        // Each kept idle policy holds at most a few instances' worth: far under the budget.
        let limit = live.engine.limits().process_memory_bytes;
        assert!(
            budget_after < limit / 4,
            "{budget_after} of {limit} bytes held"
        );
        assert!(Arc::ptr_eq(&live.active_set().entries()[0].policy, &active));
        active
            .filter(&pod, &nodes)
            .expect("the active policy at the end");
        live.validate(&noop, "{\"last\": true}", None)
            .expect("a new upload validates");
    }
}
