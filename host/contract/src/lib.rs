//! Gantry's REST contract: every type a request or a response of the API carries, with its
//! OpenAPI schema. The server (`gantry-server`) writes these types and derives its OpenAPI
//! document from them; the CLI (`gantry`) reads its answers as these same types; the web UI's
//! TypeScript types are generated from that document. So a field removed or renamed here breaks
//! the server's document, the CLI's build and the UI's type check at once, instead of drifting.
//!
//! The parts:
//! - [`auth`]: who is calling ([`Caller`], [`Role`]);
//! - [`error`]: the body of every refusal ([`ErrorBody`]);
//! - [`policies`]: policy uploads ([`WasmModule`], [`ConfigQuery`]), set versions ([`SetList`],
//!   [`RunningPolicy`], [`NewSet`]) and shadow runs ([`ShadowStart`]);
//! - [`explain`]: "why is it pending?" ([`Explain`], [`JobEvent`]);
//! - [`cluster`]: the cluster summary, its nodes as columns and one node ([`ClusterSummary`],
//!   [`NodeColumns`], [`NodeDetail`]);
//! - [`jobs`]: the job list ([`JobRow`]);
//! - [`query`]: the query strings of the list routes ([`Limit`], [`TimeRange`],
//!   [`HistoryQuery`], [`JobQuery`]);
//! - [`views`]: what the scheduling loop publishes (queues, jobs, feed events, queue history,
//!   shadow reports, upload validations), which the engine fills;
//! - [`estimates`]: start estimates and what-if questions and answers, with their words;
//! - [`health`]: the node health lifecycle: nodes per state, the breaker, each node's steps
//!   ([`HealthView`], [`NodeHealthView`], [`TransitionView`], [`BreakerReset`]), and the
//!   nodes a restarted job avoids ([`BadNodeView`]).
//!
//! The store's records and the core's explanations derive their schema beside the code that
//! makes them, behind their crates' `schema` feature, and are re-exported here, so a client
//! names every type of the API from this one crate. The contract depends on no engine: the
//! engine depends on it.

#![warn(missing_docs)]

pub mod auth;
pub mod cluster;
pub mod error;
pub mod estimates;
pub mod explain;
pub mod health;
pub mod jobs;
pub mod policies;
pub mod query;
pub mod views;

pub use auth::{Caller, Role};
pub use cluster::{ClusterSummary, DomainUse, LevelUse, NodeColumns, NodeDetail};
pub use error::ErrorBody;
pub use explain::{
    Explain, ExplainKind, ExplainState, JobEvent, JobEventKind, not_attempted_waiting_for,
};
pub use health::{
    BadNodeView, BreakerReset, BreakerView, HealthView, NodeHealthView, TransitionView,
};
pub use jobs::JobRow;
pub use policies::{ConfigQuery, NewSet, RunningPolicy, SetList, ShadowStart, WasmModule};
pub use query::{HistoryQuery, JobQuery, JobSort, JobState, Limit, TimeRange};

pub use estimates::{
    EstimateView, WhatIfAnswer, WhatIfJob, WhatIfOutcome, WhatIfShape, count_text, duration_text,
    estimate_text, wall_ms,
};
pub use gantry_core::{Admission, Explanation, NodeState, Outcome, PolicyRef};
pub use gantry_store::{
    AuditEntry, DecisionRecord, FailurePolicy, PolicyManifest, PolicyRole, PolicySet, SetEntry,
};
pub use views::{
    DecisionEvent, JobView, QueueHistoryView, QueueSeries, QueueView, ShadowDisagreement,
    ShadowReport, Upload, Validation,
};

/// Most entries any list route returns, whatever `limit` asks.
pub const LIMIT_MAX: usize = 10_000;
/// How many entries a list route returns when `limit` is absent.
pub const LIMIT_DEFAULT: usize = 100;
/// Most entries a policy set may hold.
pub const SET_ENTRIES_MAX: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    /// The words on the wire that the CLI compares and the UI's generated unions spell: a
    /// renamed variant would change them silently, as serde and the schema both follow it.
    #[test]
    fn enums_keep_their_wire_names() {
        let json = |v: serde_json::Value| v.to_string();
        assert_eq!(json(serde_json::json!(Role::Admin)), "\"admin\"");
        assert_eq!(json(serde_json::json!(ExplainKind::Pod)), "\"pod\"");
        assert_eq!(json(serde_json::json!(ExplainState::Done)), "\"done\"");
        assert_eq!(ExplainState::Pending.as_str(), "pending");
        assert_eq!(
            json(serde_json::json!(JobEventKind::Preempted)),
            "\"preempted\""
        );
        assert_eq!(json(serde_json::json!(JobSort::Wait)), "\"wait\"");
        assert_eq!(Limit::get(None), LIMIT_DEFAULT);
        assert_eq!(Limit::get(Some(0)), 1);
        assert_eq!(Limit::get(Some(usize::MAX)), LIMIT_MAX);
    }
}
