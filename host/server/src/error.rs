//! The API's one error type and the one function that maps it to HTTP.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use gantry_policy::PolicyError;
use gantry_store::StoreError;

/// Everything a request can fail with. Each message is the sentence the user reads (in the CLI,
/// the UI or curl), so it names the problem and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("missing bearer token: send `Authorization: Bearer <token>`")]
    MissingToken,
    #[error("unknown or revoked token")]
    BadToken,
    #[error("the {role} token of {who} may not {action}: an admin token is needed")]
    Forbidden {
        who: String,
        role: &'static str,
        action: String,
    },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("the upload is {size} bytes, over the limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    #[error("the upload is over the limit of {limit} bytes")]
    TooLargeStream { limit: usize },
    /// A request body (not an upload) over the small cap every other route has.
    #[error("the request body is over the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    /// The policy failed validation: it is the admin's input that is wrong, so 422.
    #[error("{0}")]
    Policy(#[from] PolicyError),
    #[error("the self-test against the current cluster snapshot faulted: {0}")]
    SelfTest(String),
    #[error("{0}")]
    Conflict(String),
    /// One token already has its share of the server's requests in flight.
    #[error(
        "the token of {who} has {cap} requests in flight, its most at once: wait for one to end"
    )]
    TooManyInFlight { who: String, cap: usize },
    /// The viewers together have their share of the server's requests in flight; the rest
    /// are kept for admins.
    #[error(
        "viewers have {cap} requests in flight, their most at once (the rest are kept for admins): try again shortly"
    )]
    ViewersBusy { cap: usize },
    /// A change sent to a replica that does not hold the Lease: the leader takes changes.
    #[error("this replica is a follower and takes no changes: send them to the leader ({leader})")]
    Follower { leader: String },
    #[error("not ready: {0}")]
    Unavailable(String),
    #[error("{0}")]
    Store(#[from] StoreError),
}

impl From<gantry_engine::EngineError> for ApiError {
    fn from(error: gantry_engine::EngineError) -> Self {
        use gantry_engine::EngineError as E;
        match error {
            E::NotFound(text) => Self::NotFound(text),
            E::TooLarge { size, limit } => Self::TooLarge { size, limit },
            E::Policy(e) => Self::Policy(e),
            E::SelfTest(text) => Self::SelfTest(text),
            E::Store(e) => Self::Store(e),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = ApiError> = std::result::Result<T, E>;

impl ApiError {
    /// The one place domain errors become status codes.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::MissingToken | Self::BadToken => StatusCode::UNAUTHORIZED,
            Self::Forbidden { .. } => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::TooLarge { .. } | Self::TooLargeStream { .. } | Self::BodyTooLarge { .. } => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            Self::Policy(_) | Self::SelfTest(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Conflict(_) | Self::Follower { .. } => StatusCode::CONFLICT,
            Self::TooManyInFlight { .. } | Self::ViewersBusy { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Store(e) => match e {
                StoreError::UnknownPolicy(_) | StoreError::UnknownSetVersion(_) => {
                    StatusCode::NOT_FOUND
                }
                StoreError::EmptySet
                | StoreError::BadPolicyRef(_)
                | StoreError::AmbiguousPolicy { .. } => StatusCode::BAD_REQUEST,
                StoreError::AlreadyActive(_) => StatusCode::CONFLICT,
                // Damaged bytes, or a store that cannot be read now: the server is not at
                // fault and the reason is in the body; the active set keeps scheduling.
                StoreError::Sled(_)
                | StoreError::Codec(_)
                | StoreError::Malformed { .. }
                | StoreError::BadRecord { .. }
                | StoreError::Corrupt { .. }
                | StoreError::Io { .. } => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = %self, "request failed");
        }
        let mut response = (
            status,
            Json(gantry_contract::ErrorBody {
                error: self.to_string(),
            }),
        )
            .into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer realm=\"gantry\""),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_texts() {
        let forbidden = ApiError::Forbidden {
            who: "carol".into(),
            role: "viewer",
            action: "activate a policy set".into(),
        };
        assert_eq!(forbidden.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            forbidden.to_string(),
            "the viewer token of carol may not activate a policy set: an admin token is needed"
        );
        assert_eq!(ApiError::MissingToken.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            ApiError::Store(StoreError::UnknownSetVersion(9)).status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            ApiError::TooLarge {
                size: 20,
                limit: 10
            }
            .to_string(),
            "the upload is 20 bytes, over the limit of 10 bytes"
        );
        let damaged = ApiError::Store(StoreError::BadRecord {
            tree: "manifests",
            key: "ab12".into(),
            source: serde_json::from_slice::<u32>(b"x").unwrap_err(),
        });
        assert_eq!(damaged.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            damaged
                .to_string()
                .starts_with("store: the record under key ab12 of tree manifests is damaged: "),
            "{damaged}"
        );
        let response = damaged.into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
