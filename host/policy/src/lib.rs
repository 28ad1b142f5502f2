//! Gantry's policy engine: runs filter, score and quota policies as sandboxed WebAssembly
//! components. This crate is the only place that runs `bindgen!`. It compiles each component
//! once (keyed by sha256), keeps pre-instantiated `*Pre`s, bounds every call by an epoch
//! deadline, a per-instance memory cap (every memory and table summed), a process-wide Wasm
//! memory budget and a concurrency cap, and turns every guest failure into a typed
//! [`PolicyFault`] instead of a host panic. Instances are made off the caller's thread (a warm
//! spare per policy), and a policy that keeps faulting is quarantined.

#![warn(missing_docs)]

// The generated bindings use `unsafe` internally (typed function handles); this is the one
// module allowed to.
#[allow(unsafe_code, unused_variables, missing_docs, clippy::all)]
mod bindings;
// The unit tests share the integration tests' fixtures, which name this crate by its name.
#[cfg(test)]
extern crate self as gantry_policy;
mod convert;
mod engine;
mod error;
mod instance;
mod network;
mod policy;
mod set;

pub use convert::WasmNodes;
// A policy's role and failure policy are the core's words, shared with the store and the API.
pub use engine::{COMPILE_SLOTS, Capabilities, CompiledPolicy, Limits, PolicyEngine, Version};
pub use error::{FaultKind, PolicyError, PolicyFault, Result};
pub use gantry_core::{FailurePolicy, PolicyRole};
pub use network::{NetworkRule, NetworkRuleError};
pub use policy::{
    DENY_REASON_MAX_BYTES, Guarded, LABEL_KEY_MAX_BYTES, LABEL_KEYS_MAX, MAX_CALL_DEADLINE,
    NAME_MAX_BYTES, Policy, PolicyHealth, PolicyInfo, PolicyOptions, PolicyStats,
    REASON_TEXT_MAX_BYTES, REASONS_MAX, SCORE_REASONS_MAX, ScoreReason, Scored, VERSION_MAX_BYTES,
};
pub use set::{ActiveSet, BoundSet, CycleGate, InCycle, NodeCache, PolicySet, SetEntry};

/// Lowers the calling thread to the least CPU share the OS gives (nice 19 on Linux). Called
/// by the threads whose work nobody waits on in a cycle: warm-spare refills and the shadow
/// set. On a busy machine they then take only the CPU the scheduling loop leaves over, so a
/// policy that spins in its init, or a candidate set being compared, cannot slow the cycles
/// that bind pods. Where the OS refuses, the thread keeps its priority and says so.
pub fn yield_to_the_loop() {
    if let Err(error) =
        thread_priority::set_current_thread_priority(thread_priority::ThreadPriority::Min)
    {
        tracing::warn!(
            ?error,
            "cannot lower a background thread's priority; it competes with the loop for CPU"
        );
    }
}

/// The highest score a policy may give a node (kube-scheduler's MaxNodeScore).
pub const MAX_SCORE: u32 = 100;
