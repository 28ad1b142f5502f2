//! The quota stage: the quota policies after the built-in check (which the cycle runs itself,
//! because it is free), and the usage they are shown.

use crate::explain::Explanation;
use crate::hooks::{PolicyHooks, Verdict};
use crate::model::{CohortUsage, JobRequest, QueueUsage, QuotaVerdict, Resources};
use crate::queues::QueueId;

use super::{JobSpec, Scheduler};

impl Scheduler {
    /// Every quota policy's verdict on `spec`, recorded in `explanation`. `Err` says what the
    /// job waits for when a policy denied it or failed closed. Balloons are not charged
    /// against quota, so no policy is asked about them.
    pub(super) fn quota_policies(
        &self,
        spec: &JobSpec,
        hooks: &mut dyn PolicyHooks,
        explanation: &mut Explanation,
    ) -> Result<(), String> {
        if spec.balloon {
            return Ok(());
        }
        let request = JobRequest {
            pod: spec.shape.clone(),
            count: spec.pods,
            total: spec.total(),
        };
        let (queue, cohort) = usage(self, spec.queue);
        for (policy, verdict) in hooks.admit(&request, &queue, cohort.as_ref()) {
            let text = match verdict {
                Verdict::Answer(QuotaVerdict::Admit) => "admit".to_string(),
                Verdict::Answer(QuotaVerdict::AdmitBorrowing { borrowed }) => {
                    format!("admit, borrowing {} GPUs", borrowed.gpus)
                }
                Verdict::Answer(QuotaVerdict::Deny { reason }) => {
                    explanation
                        .quota
                        .policies
                        .push((policy.clone(), format!("deny: {reason}")));
                    return Err(format!("quota policy {policy}: {reason}"));
                }
                Verdict::Skipped(fault) => {
                    explanation.faults.push(format!("{policy}: {fault}"));
                    format!("skipped: {fault}")
                }
                Verdict::Rejected(fault) => {
                    explanation.faults.push(format!("{policy}: {fault}"));
                    explanation
                        .quota
                        .policies
                        .push((policy.clone(), format!("faulted: {fault}")));
                    return Err(format!("quota policy {policy} faulted: {fault}"));
                }
            };
            explanation.quota.policies.push((policy, text));
        }
        Ok(())
    }
}

/// The queue's usage as a quota policy sees it, and its cohort's.
pub(super) fn usage(scheduler: &Scheduler, queue: QueueId) -> (QueueUsage, Option<CohortUsage>) {
    let queues = &scheduler.queues;
    let symbols = &scheduler.symbols;
    let usage = |id: QueueId| {
        let def = queues.def(id);
        QueueUsage {
            name: symbols.intern(&def.name),
            nominal: Resources::gpus(queues.nominal(id)),
            borrowing_limit: def.borrowing_limit_gpus.map(Resources::gpus),
            lending_limit: def.lending_limit_gpus.map(Resources::gpus),
            used: queues.used(id),
            weight: def.weight,
        }
    };
    let cohort = queues.parent(queue).map(|parent| CohortUsage {
        name: symbols.intern(queues.name(parent)),
        nominal: Resources::gpus(queues.nominal(parent)),
        used: queues.used(parent),
        queues: queues.children(parent).iter().map(|&c| usage(c)).collect(),
    });
    (usage(queue), cohort)
}
