//! Who is calling: what `GET /api/whoami` answers, and the roles a token file grants.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What a token may do: viewers read; admins also upload, create sets, activate, roll back,
/// shadow and read the audit log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads everything but the audit log.
    Viewer,
    /// Reads everything and changes what the scheduler runs.
    Admin,
}

impl Role {
    /// The role as the token file and the API spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Admin => "admin",
        }
    }
}

/// The caller of a request, once its token checked out: the UI shows it and hides an admin's
/// controls from a viewer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Caller {
    /// The token's name in the token file: who the audit log says acted.
    pub name: String,
    /// What the token may do.
    pub role: Role,
}
