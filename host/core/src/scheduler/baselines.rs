//! The anchors Gantry is measured against, emulated on the same state:
//! - stock kube-scheduler (`k8s-default`): pod by pod, no gang awareness;
//! - kube-scheduler with the Coscheduling plugin: pods assumed one at a time, released at the
//!   permit timeout;
//! - Kueue in front of stock kube-scheduler (`kueue`): a whole workload admitted against its
//!   ClusterQueue's quota (BestEffortFIFO), then its pods placed one by one.
//!
//! Built-in filter only; no topology, no preemption; quota under `kueue` only.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use crate::builtin;
use crate::explain::{FilterExplain, Outcome};
use crate::queues::{Admission, QueueId, Queues};

use super::queue::{Blocked, JobKey, WakeCheck};
use super::{CycleOutput, Decision, JobId, JobState, Mode, Scheduler};

impl Scheduler {
    /// The pod-by-pod baselines' cycle: each pending pod in priority-then-FIFO order takes the
    /// emptiest node that fits it.
    pub(super) fn cycle_pod_by_pod(
        &mut self,
        now_s: f64,
        permit_timeout_s: Option<f64>,
    ) -> CycleOutput {
        let mut order = self.queue.all();
        self.sort_priority_fifo(&mut order);
        order.truncate(self.config.max_attempts);
        let mut out = CycleOutput::default();
        for (position, id) in order.into_iter().enumerate() {
            out.attempts += 1;
            if let Some(decision) =
                self.pods_one_by_one(id, now_s, position as u32, permit_timeout_s)
            {
                out.decisions.push(decision);
            }
        }
        out
    }

    /// Kueue's cycle, then kube-scheduler's.
    ///
    /// Admission, as Kueue's scheduler does it: the head of every ClusterQueue (each leaf
    /// queue) that is not yet admitted is a candidate; candidates that fit within their nominal
    /// quota go before those that would borrow, then by priority, then FIFO. The first is
    /// admitted if [`kueue_admission`] admits its whole workload (borrowing idle quota of its
    /// cohort as the tree allows), and its quota is charged at once; a head it refuses is
    /// inadmissible and steps aside until quota is released (BestEffortFIFO), so the ones
    /// behind it are tried. This repeats until no head is admissible, as Kueue's back-to-back
    /// cycles would at one instant.
    ///
    /// Placement, as stock kube-scheduler: the pods of admitted workloads, priority then
    /// FIFO, each on the emptiest node that fits it; pods that do not fit hold and wait, their
    /// placed siblings bound and running, the quota held. Unadmitted workloads' pods are
    /// gated and never reach kube-scheduler.
    pub(super) fn cycle_kueue(&mut self, now_s: f64) -> CycleOutput {
        let mut out = CycleOutput::default();
        // Inadmissible workloads come back when their queue gets quota back (or the tree
        // changes), as Kueue requeues them on a workload's release.
        let epochs = self.epochs();
        let mut queue = std::mem::take(&mut self.queue);
        out.woken = queue.wake(now_s, epochs, &QuotaOnly(&self.queues)) as u32;
        self.queue = queue;

        // Admitted workloads whose pods wait, taken out of their queues for this cycle.
        let mut admitted: Vec<JobId> = Vec::new();
        let mut verdicts: BTreeMap<JobId, Admission> = BTreeMap::new();
        let mut position = 0u32;
        loop {
            // (borrows, priority, submitted, id, verdict) of the best head so far.
            let mut best: Option<(bool, Reverse<i32>, f64, JobId, Admission)> = None;
            for q in self.queues.ids() {
                while let Some(id) = self.queue.head(q) {
                    if self.kueue_admitted(id) {
                        self.queue.remove(id);
                        admitted.push(id);
                        continue;
                    }
                    let spec = &self.job_to_entry[&id].spec;
                    let verdict = if spec.balloon {
                        Admission::Within
                    } else {
                        kueue_admission(&self.queues, q, spec.total().gpus)
                    };
                    if let Admission::Denied { reason } = &verdict {
                        let spec = spec.clone();
                        let mut explanation = self.blank_explanation(&spec, now_s, position);
                        position += 1;
                        explanation.outcome = Outcome::Pending {
                            waiting_for: format!("quota: {reason}"),
                        };
                        explanation.quota.builtin = verdict.clone();
                        self.park_inadmissible(id, now_s);
                        out.decisions.push(Decision {
                            job: id,
                            placed: false,
                            placement: Vec::new(),
                            victims: Vec::new(),
                            explanation,
                        });
                        continue;
                    }
                    let candidate = (
                        matches!(verdict, Admission::Borrowing { .. }),
                        Reverse(spec.priority),
                        spec.submit_s,
                        id,
                        verdict,
                    );
                    let better = best.as_ref().is_none_or(|b| {
                        (candidate.0, candidate.1)
                            .cmp(&(b.0, b.1))
                            .then(candidate.2.total_cmp(&b.2))
                            .then(candidate.3.cmp(&b.3))
                            .is_lt()
                    });
                    if better {
                        best = Some(candidate);
                    }
                    break;
                }
            }
            let Some((_, _, _, id, verdict)) = best else {
                break;
            };
            let entry = self.job_to_entry.get_mut(&id).expect("a pending job");
            if !entry.spec.balloon {
                self.queues
                    .charge(entry.spec.queue, entry.spec.total(), true);
            }
            entry.state = JobState::Holding {
                slots: Vec::new(),
                since_s: now_s,
            };
            self.queue.remove(id);
            admitted.push(id);
            verdicts.insert(id, verdict);
        }

        self.sort_priority_fifo(&mut admitted);
        for (index, &id) in admitted.iter().enumerate() {
            if index < self.config.max_attempts {
                out.attempts += 1;
                if let Some(mut decision) = self.pods_one_by_one(id, now_s, position, None) {
                    if let Some(verdict) = verdicts.remove(&id) {
                        decision.explanation.quota.builtin = verdict;
                    }
                    out.decisions.push(decision);
                }
                position += 1;
            }
            if !self.is_running(id) {
                // Its pods still wait, its quota held: back in its queue, still pending.
                let key = self.job_to_entry[&id].spec.queue_key();
                self.queue.push(id, key);
            }
        }
        out
    }

    /// Whether `id`'s queue is charged for it: a running job other than a balloon, or under
    /// `kueue` an admitted workload whose pods still wait for nodes (Kueue charges quota at
    /// admission).
    pub fn charged(&self, id: JobId) -> bool {
        self.job_to_entry.get(&id).is_some_and(|entry| {
            !entry.spec.balloon
                && match entry.state {
                    JobState::Running { .. } => true,
                    JobState::Holding { .. } => self.config.mode == Mode::Kueue,
                    JobState::Pending => false,
                }
        })
    }

    /// Under `kueue`: the workload is admitted but not all of its pods run yet.
    pub(super) fn kueue_admitted(&self, id: JobId) -> bool {
        self.config.mode == Mode::Kueue
            && matches!(
                self.job_to_entry.get(&id).map(|e| &e.state),
                Some(JobState::Holding { .. })
            )
    }

    /// Park an inadmissible workload until its queue gets quota back. Kueue requeues such a
    /// workload on the first release, with no backoff of its own, so earlier failures are
    /// forgotten: only the queue's initial backoff applies.
    fn park_inadmissible(&mut self, id: JobId, now_s: f64) {
        let key = self.job_to_entry[&id].spec.queue_key();
        self.queue.placed(id);
        self.queue.push(id, key);
        self.queue.park(id, Blocked::Quota, now_s, self.epochs());
    }

    /// kube-scheduler's active-queue order: higher priority first, then earlier submission.
    fn sort_priority_fifo(&self, order: &mut [JobId]) {
        let jobs = &self.job_to_entry;
        order.sort_by(|&a, &b| {
            let (a_spec, b_spec) = (&jobs[&a].spec, &jobs[&b].spec);
            b_spec
                .priority
                .cmp(&a_spec.priority)
                .then(a_spec.submit_s.total_cmp(&b_spec.submit_s))
                .then(a.cmp(&b))
        });
    }

    /// Place `id`'s waiting pods one at a time, each on the emptiest node that fits it. All
    /// placed: the job runs. Otherwise the placed pods hold their nodes (bound under
    /// `k8s-default` and `kueue`, assumed under Coscheduling until `permit_timeout_s`, when
    /// they are released). `None` for a job that already runs.
    fn pods_one_by_one(
        &mut self,
        id: JobId,
        now_s: f64,
        position: u32,
        permit_timeout_s: Option<f64>,
    ) -> Option<Decision> {
        let kueue = self.config.mode == Mode::Kueue;
        let spec = self.job_to_entry[&id].spec.clone();
        let entry = self.job_to_entry.get_mut(&id).expect("a pending job");
        let (mut slots, since_s) = match std::mem::replace(&mut entry.state, JobState::Pending) {
            JobState::Holding { slots, since_s } => (slots, since_s),
            JobState::Pending => (Vec::new(), now_s),
            other => {
                entry.state = other;
                return None;
            }
        };
        self.running.remove(&id);
        let mut explanation = self.blank_explanation(&spec, now_s, position);
        while (slots.len() as u32) < spec.pods {
            let codes = builtin::gpu_fit(&spec.shape, &self.state.nodes);
            let scores = builtin::least_allocated(&spec.shape, &self.state.nodes);
            let best = (0..self.state.len())
                .filter(|&i| codes[i] == 0 && self.state.capacity_for(i, &spec.shape) > 0)
                .max_by(|&a, &b| scores[a].cmp(&scores[b]).then(b.cmp(&a)));
            match best {
                Some(node) => slots.push(self.state.reserve(node, &spec.shape)),
                None => {
                    let mut code_counts: BTreeMap<u16, u32> = BTreeMap::new();
                    for &code in codes.iter().filter(|&&c| c != 0) {
                        *code_counts.entry(code).or_default() += 1;
                    }
                    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
                    for (code, count) in code_counts {
                        let text = builtin::reason_text(code, &self.state.nodes, |s| {
                            self.symbols.resolve(s).to_string()
                        });
                        *counts.entry(text).or_default() += count;
                    }
                    explanation.nodes_feasible = codes.iter().filter(|&&c| c == 0).count() as u32;
                    explanation.filters = vec![FilterExplain {
                        policy: "builtin".into(),
                        rejected: counts.into_iter().collect(),
                    }];
                    break;
                }
            }
        }
        if slots.len() as u32 == spec.pods {
            let mut node_pods: Vec<(usize, u32)> = Vec::new();
            for slot in &slots {
                match node_pods.iter_mut().find(|(n, _)| *n == slot.node as usize) {
                    Some((_, pods)) => *pods += 1,
                    None => node_pods.push((slot.node as usize, 1)),
                }
            }
            explanation.outcome = Outcome::Placed {
                nodes: node_pods
                    .iter()
                    .map(|&(n, p)| (self.node_name(n), p))
                    .collect(),
            };
            if kueue && !spec.balloon {
                // Charged at admission: `start` charges it again as running.
                self.queues.charge(spec.queue, spec.total(), false);
            }
            self.start(id, slots);
            return Some(Decision {
                job: id,
                placed: true,
                placement: node_pods,
                victims: Vec::new(),
                explanation,
            });
        }
        let timed_out = permit_timeout_s.is_some_and(|timeout| now_s - since_s >= timeout);
        let waiting_for = if timed_out {
            for &slot in &slots {
                self.state.release(slot, &spec.shape);
            }
            "the permit timeout released the assumed pods; retrying the whole gang".to_string()
        } else {
            let held = slots.len();
            if held > 0 || kueue {
                // Under `kueue` the state says the workload is admitted, even with no pod
                // placed yet.
                if held > 0 {
                    self.running.insert(id);
                }
                self.job_to_entry.get_mut(&id).expect("a pending job").state =
                    JobState::Holding { slots, since_s };
            }
            format!(
                "{} more pods to fit ({held} of {} hold nodes)",
                spec.pods as usize - held,
                spec.pods
            )
        };
        explanation.outcome = Outcome::Pending { waiting_for };
        Some(Decision {
            job: id,
            placed: false,
            placement: Vec::new(),
            victims: Vec::new(),
            explanation,
        })
    }
}

/// Kueue's admission of `gpus` more GPUs in queue `q`: [`Queues::admission`] (nominal quota,
/// borrowing and lending limits), checked again for every cohort above `q` and across the
/// top-level queues. Kueue guarantees a queue only the quota nobody borrows: a queue within
/// its nominal quota is still refused while others borrow what it needs, and only preemption
/// (off by default) would take it back. Gantry's own tree admits it and reclaims by preemption.
fn kueue_admission(queues: &Queues, q: QueueId, gpus: u64) -> Admission {
    let verdict = queues.admission(q, gpus);
    if matches!(verdict, Admission::Denied { .. }) {
        return verdict;
    }
    let mut at = queues.parent(q);
    while let Some(cohort) = at {
        if let denied @ Admission::Denied { .. } = queues.admission(cohort, gpus) {
            return denied;
        }
        at = queues.parent(cohort);
    }
    let (used, nominal) = queues
        .ids()
        .filter(|&r| queues.parent(r).is_none())
        .fold((0, 0), |(used, nominal), r| {
            (used + queues.used(r).gpus, nominal + queues.nominal(r))
        });
    if used + gpus > nominal {
        return Admission::Denied {
            reason: format!(
                "the queues together use {used} of their {nominal} GPUs of nominal quota; \
                 {gpus} more fit only once borrowed quota is given back"
            ),
        };
    }
    verdict
}

/// Kueue's requeueing: an inadmissible workload comes back when its queue admits it again;
/// room is kube-scheduler's business, not Kueue's.
struct QuotaOnly<'a>(&'a Queues);

impl WakeCheck for QuotaOnly<'_> {
    fn quota_admits(&self, queue: QueueId, gpus: u64) -> bool {
        !matches!(
            kueue_admission(self.0, queue, gpus),
            Admission::Denied { .. }
        )
    }

    fn room_possible(&self, _: &JobKey, _: u64) -> bool {
        true
    }
}
