//! Refuses every config with a message the admin must see unchanged.
use gantry_policy_sdk::prelude::*;

pub struct Picky;

impl QuotaPolicy for Picky {
    const NAME: &'static str = "hostile-bad-config";
    fn new(config: &str) -> Result<Self, String> {
        Err(format!("field `max_gpus` is required (got {config})"))
    }
    fn admit(
        &self,
        _job: &Job,
        _queue: &QueueUsage,
        _cohort: Option<&CohortUsage>,
    ) -> QuotaVerdict {
        QuotaVerdict::Admit
    }
}

gantry_policy_sdk::export_quota!(Picky);
