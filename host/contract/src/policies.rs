//! Policies, policy-set versions and shadow runs: what `gantry policy …` and the UI's policies
//! page send and read.

use gantry_store::{PolicySet, SetEntry};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// The body of `POST /api/policies` and `POST /api/policies/validate`: a compiled WebAssembly
/// component, as raw bytes (not JSON). Only its schema is used: the server reads the bytes as
/// they come.
#[derive(Debug, ToSchema)]
#[schema(value_type = String, format = Binary)]
pub struct WasmModule(pub Vec<u8>);

/// The query string of a policy upload or validation.
#[derive(Debug, Default, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ConfigQuery {
    /// JSON config for the policy's init (default `{}`).
    pub config: Option<String>,
    /// The policy's own call deadline for the self-test, ms (the server's 50 ms when absent).
    #[param(minimum = 1, maximum = 10000)]
    pub deadline_ms: Option<u64>,
}

/// The answer of `GET /api/sets`: every stored version and how the active one is running.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SetList {
    /// The version new cycles run on.
    pub active: u64,
    /// Every stored version, oldest first.
    pub sets: Vec<PolicySet>,
    /// How each policy of the active set is doing: calls, faults, quarantine.
    pub running: Vec<RunningPolicy>,
}

/// One loaded policy of the active set, as its health says: what the UI's quarantine badge
/// and an admin's first look at a misbehaving policy read.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RunningPolicy {
    /// The policy's declared name.
    pub name: String,
    /// Its declared version.
    pub version: String,
    /// filter, score or quota.
    pub role: String,
    /// The sha256 of its bytes.
    pub sha256: String,
    /// Calls since it was loaded.
    pub calls: u64,
    /// Calls that faulted.
    pub faults: u64,
    /// Faults in a row since its last success.
    pub consecutive_faults: u32,
    /// Calls are answered by its failure policy without running it, until a probe succeeds.
    pub quarantined: bool,
    /// While quarantined: milliseconds until the next probe call.
    pub probe_in_ms: Option<u64>,
    /// Times it was quarantined since it was loaded.
    pub quarantines: u64,
    /// The newest fault, as an admin reads it.
    pub last_fault: Option<String>,
}

/// The body of `POST /api/sets`: a new set version (not activated). Every entry is loaded
/// before the version is stored, so a set that cannot run is refused.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSet {
    /// The policies, in the order the cycle runs them.
    #[schema(max_items = 64)]
    pub entries: Vec<SetEntry>,
    /// Why this version: shown beside it in listings and the audit log.
    #[serde(default)]
    pub note: String,
}

/// The body of `POST /api/shadow`: the set version to run beside the active one, binding
/// nothing.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShadowStart {
    /// A stored set version.
    #[schema(minimum = 1)]
    pub version: u64,
}
