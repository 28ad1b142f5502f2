//! The preempt stage: the running jobs to evict so that a job fits, always whole gangs.

use std::collections::HashMap;

use crate::queues::QueueId;

use super::{JobId, JobSpec, JobState, Scheduler};

impl Scheduler {
    /// Running jobs to evict so that `spec` fits, in the order they may be taken: balloons,
    /// then borrowers beyond their quota (when `spec`'s queue reclaims and is within its
    /// own), then jobs of lower priority. Never a job of higher priority, never one this
    /// cycle placed (binding a pod and evicting it at once is churn), and always whole gangs. `None` when even all of
    /// them would not make room. Room counts only outside the reservations of jobs ahead of
    /// it (see [`Scheduler::mask_reserved`]): a reclaim or a balloon's eviction never hands a
    /// reserved node to a job the reservation's owner goes before.
    pub(super) fn find_victims(&self, id: JobId, spec: &JobSpec, now_s: f64) -> Option<Vec<JobId>> {
        if spec.balloon {
            return None;
        }
        // Quota counts GPUs only: a job asking none reclaims nothing, and a job holding none
        // borrows nothing, so it is never a borrower to reclaim from. Only a queue declared
        // to reclaim does (see [`crate::Reclaim`]).
        let reclaiming = self.queues.def(spec.queue).reclaim == crate::Reclaim::Any
            && spec.total().gpus > 0
            && self.queues.within(spec.queue, spec.total().gpus);
        // No running job could be a victim (no balloon, none of lower priority, no borrower
        // to reclaim from): skip the search over every running job.
        let lower = self
            .priority_to_held
            .range(..spec.priority)
            .next()
            .is_some();
        if self.balloons_held.jobs == 0 && !lower && !(reclaiming && self.reclaimable_gpus() > 0) {
            return None;
        }
        let mut candidates: Vec<(u8, i32, f64, JobId)> = Vec::new();
        for &running in &self.running {
            let entry = &self.job_to_entry[&running];
            let JobState::Running { since_cycle, .. } = entry.state else {
                continue;
            };
            let victim = &entry.spec;
            if victim.priority > spec.priority || since_cycle == self.cycle_no {
                continue;
            }
            let class = if victim.balloon {
                0
            } else if reclaiming
                && victim.queue != spec.queue
                && victim.total().gpus > 0
                && self.queues.borrowed(victim.queue) >= victim.total().gpus
            {
                1
            } else if victim.priority < spec.priority {
                2
            } else {
                continue;
            };
            candidates.push((class, victim.priority, -victim.submit_s, running));
        }
        candidates.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.total_cmp(&b.2)));
        if candidates.is_empty() {
            return None;
        }
        let mut scratch = self.state.clone();
        let mut victims = Vec::new();
        // A borrower gives back only what its queue borrowed: reclaiming never pushes a queue
        // below its own quota.
        let mut queue_to_borrowed: HashMap<QueueId, u64> = HashMap::new();
        for (class, _, _, candidate) in candidates {
            let victim = &self.job_to_entry[&candidate].spec;
            if class == 1 {
                let borrowed = queue_to_borrowed
                    .entry(victim.queue)
                    .or_insert_with(|| self.queues.borrowed(victim.queue));
                if *borrowed < victim.total().gpus {
                    continue;
                }
                *borrowed -= victim.total().gpus;
            }
            for &slot in self.slots(candidate) {
                scratch.release(slot, &victim.shape);
            }
            victims.push(candidate);
            if self.fits_in(id, spec, &scratch, now_s) {
                // Keep only the victims the job needs: spare, latest taken first, any whose
                // room it can do without.
                for index in (0..victims.len() - 1).rev() {
                    let mut trial = self.state.clone();
                    for (i, &victim) in victims.iter().enumerate() {
                        if i != index {
                            let shape = &self.job_to_entry[&victim].spec.shape;
                            for &slot in self.slots(victim) {
                                trial.release(slot, shape);
                            }
                        }
                    }
                    if self.fits_in(id, spec, &trial, now_s) {
                        victims.remove(index);
                    }
                }
                return Some(victims);
            }
        }
        None
    }
}
