//! The body of every refusal.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Every 4xx and 5xx answer of the API: one sentence that names the problem and, where there is
/// one, the fix. The CLI and the UI show it as it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody {
    /// The reason, for a person to read.
    pub error: String,
}
