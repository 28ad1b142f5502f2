//! Shadow mode: a candidate set decides each cycle on a copy of the scheduler, on a thread of
//! its own and only in the loop's spare time, and its disagreements with the active set make
//! the [`ShadowReport`].

use super::*;

/// The candidate of a shadow run and what it has found so far.
pub(super) struct Shadow {
    pub(super) set: Arc<PolicySet>,
    /// Accumulated by the loop, read by the report handler; held briefly by each.
    pub(super) report: Mutex<ShadowReport>,
}

/// One cycle for the shadow thread: a copy of the scheduler as the active set saw it, and the
/// channel the active cycle's output arrives on.
pub(super) struct ShadowJob {
    pub(super) shadow: Arc<Shadow>,
    pub(super) scheduler: Scheduler,
    pub(super) now_s: f64,
    pub(super) time_ms: u64,
    pub(super) active_set: u64,
    /// What the active set decided in the same cycle.
    pub(super) active: Arc<CycleOutput>,
}

/// The shadow thread's end of things: where cycles go, and whether it waits for one.
pub(super) struct ShadowThread {
    /// A rendezvous channel: a send succeeds only while the thread waits.
    pub(super) jobs: SyncSender<ShadowJob>,
    /// True while the thread waits for a cycle, so the loop copies its state only then.
    pub(super) idle: Arc<AtomicBool>,
}

/// The shadow thread: decides each cycle it is handed with the candidate set (under its own
/// policy budget, on a node cache of its own, at the OS's lowest priority, and each call only
/// while the loop is between cycles) and records where it disagrees with the active
/// set. It ends when [`Live`] drops its sender.
pub(super) fn spawn_shadow_thread(
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
pub(super) fn record_shadow(
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

impl Live {
    /// The shadow thread, started on first use.
    pub(super) fn shadow_thread(&self) -> &ShadowThread {
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
    pub(super) fn skip_shadow(&self, shadow: &Shadow) {
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
    pub(super) fn shadow_copy(
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
    pub(super) fn send_shadow(&self, job: ShadowJob) {
        match self.shadow_thread().jobs.try_send(job) {
            Ok(()) => self.metrics.shadow_cycles.with_label_values(&["run"]).inc(),
            Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => {
                self.skip_shadow(&job.shadow);
            }
        }
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
}
