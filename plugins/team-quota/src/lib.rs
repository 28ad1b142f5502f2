//! `team-quota`: a queue runs within its nominal GPU quota; past it, it may borrow GPUs that
//! other queues of its cohort leave idle, up to its borrowing limit; past that, it is refused.
//! Config (optional): `{"borrowing": true, "max_borrow_gpus": {"queue-name": 64}}` turns
//! borrowing off, or caps a queue's borrowing below its declared limit.

use std::collections::HashMap;

use gantry_policy_sdk::prelude::*;
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TeamQuota {
    borrowing: bool,
    max_borrow_gpus: HashMap<String, u64>,
}

impl Default for TeamQuota {
    fn default() -> Self {
        Self {
            borrowing: true,
            max_borrow_gpus: HashMap::new(),
        }
    }
}

impl QuotaPolicy for TeamQuota {
    const NAME: &'static str = "team-quota";

    fn new(config: &str) -> Result<Self, String> {
        serde_json::from_str(config).map_err(|e| format!("team-quota config: {e}"))
    }

    fn admit(&self, job: &Job, queue: &QueueUsage, cohort: Option<&CohortUsage>) -> QuotaVerdict {
        let name = resolve(queue.name);
        let wanted = queue.used.gpus + job.total.gpus;
        if wanted <= queue.nominal.gpus {
            return QuotaVerdict::Admit;
        }
        let borrow = wanted - queue.nominal.gpus;
        if !self.borrowing {
            return QuotaVerdict::Deny(format!(
                "queue {name} would use {wanted} GPUs, over its quota of {}, and borrowing is off",
                queue.nominal.gpus
            ));
        }
        let declared = queue.borrowing_limit.map_or(u64::MAX, |limit| limit.gpus);
        let limit = self
            .max_borrow_gpus
            .get(&*name)
            .map_or(declared, |&cap| cap.min(declared));
        if borrow > limit {
            return QuotaVerdict::Deny(format!(
                "queue {name} would borrow {borrow} GPUs, over its borrowing limit of {limit}"
            ));
        }
        let Some(cohort) = cohort else {
            return QuotaVerdict::Deny(format!(
                "queue {name} is at its quota of {} GPUs and has no cohort to borrow from",
                queue.nominal.gpus
            ));
        };
        let idle: u64 = cohort
            .queues
            .iter()
            .filter(|other| other.name != queue.name)
            .map(|other| {
                let unused = other.nominal.gpus.saturating_sub(other.used.gpus);
                other
                    .lending_limit
                    .map_or(unused, |lend| unused.min(lend.gpus))
            })
            .sum();
        if borrow > idle {
            return QuotaVerdict::Deny(format!(
                "queue {name} would borrow {borrow} GPUs, but its cohort has only {idle} idle"
            ));
        }
        QuotaVerdict::AdmitBorrowing(Resources {
            gpus: borrow,
            cpu_milli: 0,
            memory_mib: 0,
        })
    }
}

gantry_policy_sdk::export_quota!(TeamQuota);
