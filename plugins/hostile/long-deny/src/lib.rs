//! Denies every job with a reason of `len` bytes (config: the decimal number, default 2000), so
//! a test can show the host bounding the deny reason a quota policy hands it.
use gantry_policy_sdk::prelude::*;

pub struct LongDeny {
    len: usize,
}

impl QuotaPolicy for LongDeny {
    const NAME: &'static str = "hostile-long-deny";
    fn new(config: &str) -> Result<Self, String> {
        let len = match config.trim() {
            "{}" => 2000,
            text => text
                .parse()
                .map_err(|_| format!("config must be a number of bytes, not {text}"))?,
        };
        Ok(Self { len })
    }
    fn admit(
        &self,
        _job: &Job,
        _queue: &QueueUsage,
        _cohort: Option<&CohortUsage>,
    ) -> QuotaVerdict {
        QuotaVerdict::Deny("x".repeat(self.len))
    }
}

gantry_policy_sdk::export_quota!(LongDeny);
