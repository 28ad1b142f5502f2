//! {{name}}: a quota policy. A job is admitted while its queue stays within its nominal GPU
//! quota plus `headroom_gpus`; past that it is refused, in words saying by how much.
//! Config (optional): `{"headroom_gpus": 0}`.

use gantry_policy_sdk::prelude::*;
use serde::Deserialize;

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ThisPolicy {
    headroom_gpus: u64,
}

impl QuotaPolicy for ThisPolicy {
    const NAME: &'static str = "{{name}}";

    fn new(config: &str) -> Result<Self, String> {
        serde_json::from_str(config).map_err(|e| format!("{{name}} config: {e}"))
    }

    fn admit(&self, job: &Job, queue: &QueueUsage, _cohort: Option<&CohortUsage>) -> QuotaVerdict {
        let wanted = queue.used.gpus + job.total.gpus;
        let allowed = queue.nominal.gpus + self.headroom_gpus;
        if wanted <= allowed {
            QuotaVerdict::Admit
        } else {
            QuotaVerdict::Deny(format!(
                "queue {} would use {wanted} GPUs, over the {allowed} it may use",
                resolve(queue.name)
            ))
        }
    }
}

gantry_policy_sdk::export_quota!(ThisPolicy);
