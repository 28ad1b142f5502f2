//! Gantry's policy engine: runs filter, score and quota policies as sandboxed WebAssembly
//! components. This crate is the only place that runs `bindgen!`. It compiles each component
//! once (keyed by sha256), keeps pre-instantiated `*Pre`s, bounds every call by an epoch
//! deadline, a memory cap and a concurrency cap, and turns every guest failure into a typed
//! [`PolicyFault`] instead of a host panic.

// The generated bindings use `unsafe` internally (typed function handles); this is the one
// module allowed to.
#[allow(unsafe_code, unused_variables, clippy::all)]
mod bindings;
mod convert;
mod engine;
mod error;
mod instance;
mod policy;
mod set;

pub use convert::WasmNodes;
pub use engine::{Capabilities, CompiledPolicy, Limits, PolicyEngine, Role};
pub use error::{FaultKind, PolicyError, PolicyFault, Result};
pub use policy::{FailurePolicy, Guarded, Policy, PolicyInfo, PolicyOptions, PolicyStats};
pub use set::{ActiveSet, BoundSet, NodeCache, PolicySet, SetEntry};

/// The highest score a policy may give a node (kube-scheduler's MaxNodeScore).
pub const MAX_SCORE: u32 = 100;
