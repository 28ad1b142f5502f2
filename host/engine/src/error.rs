//! The engine's one error type: what changing the policy sets can fail with. The server maps
//! each variant to an HTTP status; the messages are the sentences users read.

use gantry_policy::PolicyError;
use gantry_store::StoreError;

/// Why a policy could not be validated or stored, or a set activated or shadowed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Something named does not exist (a policy's bytes, a shadow run).
    #[error("{0}")]
    NotFound(String),
    /// The upload is larger than the configured limit.
    #[error("the upload is {size} bytes, over the limit of {limit} bytes")]
    TooLarge {
        /// The upload's size.
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// The policy failed validation: compile, world, imports or its own config check.
    #[error("{0}")]
    Policy(#[from] PolicyError),
    /// The policy loaded but faulted when run once against the current cluster.
    #[error("the self-test against the current cluster snapshot faulted: {0}")]
    SelfTest(String),
    /// The store failed or refused.
    #[error("{0}")]
    Store(#[from] StoreError),
}

/// The engine's result type.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
