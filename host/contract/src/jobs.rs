//! The job list: `GET /api/jobs`.

use crate::JobView;
use serde::Serialize;
use utoipa::ToSchema;

/// A job pending or running now, as the job list shows it: its name and what the loop knows
/// about it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobRow {
    /// The job's name (`namespace/name` from a live cluster).
    pub name: String,
    /// Queue, shape, state, place and estimate.
    #[serde(flatten)]
    pub job: JobView,
}
