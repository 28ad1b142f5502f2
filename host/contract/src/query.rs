//! The query strings of the list routes. Bounds the server clamps to (rather than refuses) are
//! still declared, so a generated client never asks for more than it gets.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// How many entries a list route returns.
#[derive(Debug, Default, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct Limit {
    /// At most this many (default 100).
    #[param(minimum = 1, maximum = 10000)]
    pub limit: Option<usize>,
}

impl Limit {
    /// The requested length bounded: [`crate::LIMIT_DEFAULT`] when absent, at most
    /// [`crate::LIMIT_MAX`].
    pub fn get(limit: Option<usize>) -> usize {
        limit
            .unwrap_or(crate::LIMIT_DEFAULT)
            .clamp(1, crate::LIMIT_MAX)
    }
}

/// A time range of decisions, and how many.
#[derive(Debug, Default, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TimeRange {
    /// From this time, ms since the epoch.
    #[param(minimum = 0)]
    pub from_ms: Option<u64>,
    /// Until this time (exclusive).
    #[param(minimum = 0)]
    pub to_ms: Option<u64>,
    /// At most this many (default 100).
    #[param(minimum = 1, maximum = 10000)]
    pub limit: Option<usize>,
}

/// The query of `GET /api/queues/history`.
#[derive(Debug, Default, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HistoryQuery {
    /// Only samples taken after this time, ms since the epoch (all kept ones when absent).
    #[param(minimum = 0)]
    pub since: Option<u64>,
}

/// The states `GET /api/jobs?state=` filters on. The route reads the text itself, to answer
/// a wrong one in its own words; this names the values it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Waiting to be placed.
    Pending,
    /// Placed and running.
    Running,
}

/// The orders of `GET /api/jobs?sort=`, read by the route as [`JobState`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum JobSort {
    /// Pending first, by queue and place in it (the default).
    Position,
    /// Longest waiting first.
    Wait,
}

/// The query of `GET /api/jobs`.
#[derive(Debug, Default, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct JobQuery {
    /// Part of the job's name, case-insensitive.
    pub q: Option<String>,
    /// Only this queue's jobs.
    pub queue: Option<String>,
    /// Only jobs of this namespace (the part of the name before `/`).
    pub namespace: Option<String>,
    /// Only jobs in this state: `pending` or `running`.
    #[param(value_type = Option<JobState>)]
    pub state: Option<String>,
    /// By queue and position (`position`, the default), or longest waiting first (`wait`).
    #[param(value_type = Option<JobSort>)]
    pub sort: Option<String>,
    /// Only jobs a node failure restarted (`true`): those that avoid a node that failed
    /// under them.
    pub restarted: Option<bool>,
    /// At most this many (default 100).
    #[param(minimum = 1, maximum = 10000)]
    pub limit: Option<usize>,
}
