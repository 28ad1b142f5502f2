//! Gantry's engine: the one scheduling loop, and the state it shares with the API.
//! - `engine`: the loop itself ([`Engine`]): clock, wake-ups, the long-lived scheduler fed by
//!   a [`gantry_core::ClusterSource`], cycles on the active policy set (and a shadow one),
//!   binding through a [`gantry_core::Binder`], recording what the binder says happened,
//!   retention, the heartbeat, and the run's figures ([`RunStats`]);
//! - `live`: [`Live`], the policy-set registry (upload, validate, activate, shadow), the
//!   decision recorder (store and SSE feed), the read-only cluster view the API serves, and
//!   the node health record (transitions, breaker) with the breaker resets the loop makes;
//! - `metrics`: the Prometheus registry, named like kube-scheduler's;
//! - `whatif`: "when would a job of this shape start", answered by the loop from its plan, and
//!   the words estimates are shown in;
//! - `shutdown`: [`Shutdown`], the one signal that the process is stopping;
//! - `error`: [`EngineError`].

#![warn(missing_docs)]

pub mod engine;
pub mod error;
pub mod live;
pub mod metrics;
pub mod shutdown;
pub mod whatif;

pub use engine::{Engine, EngineConfig, Pass, RunStats};
pub use error::{EngineError, Result};
pub use live::{
    BalloonPods, ClusterView, DecisionEvent, HISTORY_EVERY, HISTORY_KEEP, JobView, Live,
    LiveConfig, QueueHistoryView, QueueSeries, QueueView, RESET_WITHIN, ResetError,
    ShadowDisagreement, ShadowReport, TRANSITIONS_KEPT, Upload, Validation, lent_gpus,
};
pub use metrics::Metrics;
pub use shutdown::Shutdown;
pub use whatif::{
    EstimateView, WhatIfAnswer, WhatIfError, WhatIfJob, WhatIfOutcome, WhatIfShape, duration_text,
    estimate_text,
};

/// Milliseconds since the Unix epoch: the time stamp of records, audit entries and answers.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
