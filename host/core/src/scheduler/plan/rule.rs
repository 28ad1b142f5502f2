//! When aged jobs get reservations ([`ReservationRule`], from [`AGE_RUNTIMES`] and
//! [`BACKLOG_RUNTIMES`]), when a job's quota admits it as running jobs end, and the quota an
//! aged reservation holds ([`QuotaHold`]): which later jobs it keeps from taking what its
//! owner needs.

use super::*;

/// The adaptive rule's age threshold, in learned p90 runtimes: a job that has waited as long
/// as three of the cluster's long jobs take, while the cluster turned its queue over, is being
/// passed over, not merely queued.
pub const AGE_RUNTIMES: f64 = 3.0;

/// The adaptive rule's backlog gate, in learned p90 runtimes: while the pending work would
/// keep the whole cluster busy for less than this many of its long jobs, the cluster is
/// turning its queue over, so a job that still waits past the age threshold is being passed
/// over, and a reservation is what starts it. Past it the cluster is far over capacity, every
/// job waits about as long as the backlog, and reservations only hold capacity idle.
pub const BACKLOG_RUNTIMES: f64 = 6.0;

/// When aged jobs get reservations, as the last replan judged it: its age threshold, and the
/// backlog gate's reading and limit. Shown in reports and explanations, so an admin sees why a
/// job has, or has no, reservation.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ReservationRule {
    /// A job that has waited this long gets a reservation, whatever blocks it.
    pub age_threshold_s: f64,
    /// The pending work, in seconds of the whole cluster (GPU-seconds by learned median
    /// runtimes, over the cluster's GPUs).
    pub backlog_s: f64,
    /// The gate: aged jobs get reservations only while `backlog_s` is under it.
    pub backlog_limit_s: f64,
    /// Whether the gate is open (a job's own work is left out when it is judged, see
    /// [`ReservationRule::open_for`]).
    pub open: bool,
}

impl ReservationRule {
    /// Whether `spec` has waited past the threshold at `now_s`.
    pub fn waited(&self, spec: &super::JobSpec, now_s: f64) -> bool {
        now_s - spec.submit_s >= self.age_threshold_s
    }

    /// Whether the gate is open for a job whose own work is `own_s` (seconds of the whole
    /// cluster): the backlog is judged without it. Counted, a lone long gang among short jobs
    /// closes the gate on itself, and waits for ever behind them.
    pub fn open_for(&self, own_s: f64) -> bool {
        self.backlog_s - own_s < self.backlog_limit_s
    }
}

/// The quota a reservation holds: jobs behind its owner may not start borrowing, nor take
/// from the owner's own queue, what the owner needs, unless they are expected to end before
/// the owner's planned start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(in crate::scheduler) struct QuotaHold {
    pub(super) rank: Rank,
    pub(super) queue: QueueId,
    pub(super) gpus: u64,
    pub(super) start_s: f64,
}

impl Scheduler {
    /// The cluster's GPUs: what the backlog and the reservations' cap are measured against.
    pub(in crate::scheduler) fn total_gpus(&self) -> u64 {
        self.state
            .nodes
            .gpu_total
            .iter()
            .map(|&g| u64::from(g))
            .sum()
    }

    /// When aged jobs get reservations now (see [`ReservationRule`]): a job is aged once it
    /// waited [`AGE_RUNTIMES`] learned p90 runtimes, and the gate is open while the pending
    /// work, by learned median runtimes, would keep the cluster busy for less than
    /// [`BACKLOG_RUNTIMES`] of them. Both follow what this cluster's finished jobs took, not a
    /// constant; a setting pins either.
    pub(in crate::scheduler) fn reservation_rule(&self) -> ReservationRule {
        let long_s = self.plan.runtimes.typical().p90_s;
        let age_threshold_s = self
            .plan_config
            .reserve_after_s
            .unwrap_or(AGE_RUNTIMES * long_s);
        let backlog_limit_s = self
            .plan_config
            .backlog_limit_s
            .unwrap_or(BACKLOG_RUNTIMES * long_s);
        let backlog_s = self
            .queue
            .all()
            .into_iter()
            .map(|id| self.backlog_of(&self.job_to_entry[&id].spec))
            .sum();
        ReservationRule {
            age_threshold_s,
            backlog_s,
            backlog_limit_s,
            open: backlog_s < backlog_limit_s,
        }
    }

    /// The work `spec` adds to the backlog, in seconds of the whole cluster: its GPUs for its
    /// learned median runtime, over the cluster's GPUs. None for a balloon.
    fn backlog_of(&self, spec: &JobSpec) -> f64 {
        if spec.balloon {
            return 0.0;
        }
        let total = self.total_gpus().max(1) as f64;
        spec.total().gpus as f64 * self.plan.runtimes.estimate(spec).p50_s / total
    }

    /// Whether `spec` gets a reservation under `rule` at `now_s`, whatever blocks it: it has
    /// waited past the threshold and the gate is open for it (its own work left out; the
    /// cheap test first, as most jobs have not waited that long).
    pub(super) fn aged(&self, rule: &ReservationRule, spec: &JobSpec, now_s: f64) -> bool {
        rule.waited(spec, now_s) && rule.open_for(self.backlog_of(spec))
    }

    /// When `spec`'s queue admits it (p10, p50, p90), as running jobs end by their estimates
    /// and give their quota back: `now_s` when it admits it now, `None` when it would not even
    /// once every running job ended.
    pub(super) fn quota_start(
        &self,
        spec: &JobSpec,
        timeline: &Timeline,
        now_s: f64,
    ) -> Option<(f64, f64, f64)> {
        let gpus = spec.total().gpus;
        if spec.balloon || self.queues.admits(spec.queue, gpus) {
            return Some((now_s, now_s, now_s));
        }
        let mut queues = self.queues.clone();
        let mut start = (now_s, now_s, now_s);
        for step in &timeline.steps {
            queues.charge(step.queue, crate::Resources::gpus(step.gpus), false);
            start = (start.0.max(step.p10_s), step.p50_s, start.2.max(step.p90_s));
            if queues.admits(spec.queue, gpus) {
                return Some((start.0.min(start.1), start.1, start.2.max(start.1)));
            }
        }
        None
    }

    /// "128 GPUs of queue rl's quota, 64 of them borrowed from cohort research": the quota a
    /// reservation holds.
    pub(super) fn quota_text(&self, queue: QueueId, gpus: u64) -> String {
        let name = self.queues.name(queue);
        let borrowed = gpus.saturating_sub(self.queues.nominal(queue));
        if borrowed == 0 {
            return format!("{gpus} GPUs of queue {name}'s quota");
        }
        let lenders = match self.queues.parent(queue) {
            Some(parent) => format!("cohort {}", self.queues.name(parent)),
            None => "the other top-level queues".to_string(),
        };
        format!("{gpus} GPUs of queue {name}'s quota, {borrowed} of them borrowed from {lenders}")
    }

    /// The quota hold: the reservation `spec`'s admission would delay, if any. A job behind a
    /// reservation's owner that would borrow, or that is of the owner's own queue, may not
    /// take what the owner needs of its queue's headroom, unless it is expected to end (by its
    /// p90) before the owner's planned start. A job within its own queue's nominal quota in
    /// another queue is never held: nominal quota is guaranteed.
    pub(in crate::scheduler) fn quota_hold_against(
        &self,
        id: JobId,
        spec: &JobSpec,
        admission: &crate::Admission,
        now_s: f64,
    ) -> Option<JobId> {
        let gpus = spec.total().gpus;
        if spec.balloon || gpus == 0 || self.plan.quota_holds.is_empty() {
            return None;
        }
        let rank = Rank::of(id, spec);
        // Its p90, not its p50 as on nodes: a job that overruns on a reserved node is evicted
        // when the reservation comes due, while quota it took is given back only as it ends.
        let ends = now_s + self.plan.runtimes.estimate(spec).p90_s;
        let borrowing = matches!(admission, crate::Admission::Borrowing { .. });
        let mut after: Option<crate::Queues> = None;
        for hold in &self.plan.quota_holds {
            if hold.rank.id == id
                || !hold.rank.ahead_of(&rank)
                || ends <= hold.start_s
                || !(borrowing || hold.queue == spec.queue)
            {
                continue;
            }
            let before = self.queues.headroom(hold.queue);
            let after = after.get_or_insert_with(|| {
                let mut queues = self.queues.clone();
                queues.charge(spec.queue, crate::Resources::gpus(gpus), true);
                queues
            });
            let left = after.headroom(hold.queue);
            if left < hold.gpus && left < before {
                return Some(hold.rank.id);
            }
        }
        None
    }

    /// The job whose reservation's quota hold would keep pending job `id` back at `now_s`, if
    /// any: what a cycle would refuse it for after the built-in quota admitted it.
    pub fn quota_hold_of(&self, id: JobId, now_s: f64) -> Option<JobId> {
        let spec = &self.job_to_entry.get(&id)?.spec;
        let admission = self.queues.admission(spec.queue, spec.total().gpus);
        if matches!(admission, crate::Admission::Denied { .. }) {
            return None;
        }
        self.quota_hold_against(id, spec, &admission, now_s)
    }

    /// The jobs holding a reservation's quota (see [`Scheduler::quota_hold_against`]).
    pub(in crate::scheduler) fn quota_holders(&self) -> Vec<JobId> {
        self.plan
            .quota_holds
            .iter()
            .map(|hold| hold.rank.id)
            .collect()
    }

    /// The rule the last replan gave reservations by.
    pub fn reservation_rule_in_force(&self) -> ReservationRule {
        self.plan.rule
    }
}
