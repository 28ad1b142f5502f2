//! The node health lifecycle as the API serves it: nodes per state and the circuit breaker
//! ([`HealthView`]), one node's state and steps ([`NodeHealthView`]), each step with its cause
//! ([`TransitionView`]), what an admin's breaker reset cleared ([`BreakerReset`]), and a node
//! a job avoids because it failed under it ([`BadNodeView`]). The engine fills them from the
//! core's lifecycle and bad-node lists; the server, the CLI and the UI read them.

use std::collections::BTreeMap;

use gantry_core::NodeState;
use serde::{Deserialize, Serialize};

/// One step of a node's lifecycle, as the loop took it from the scheduler.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TransitionView {
    /// The node's name, resolved when the loop took the step: a later rebuild of the node
    /// table cannot make an old step name another node.
    pub node: String,
    /// The state it left.
    pub from: NodeState,
    /// The state it entered.
    pub to: NodeState,
    /// Why, in words: "reported GpuXidError (Xid 79)", "repaired", "preflight passed".
    pub cause: String,
    /// When, on the scheduler's clock (seconds).
    pub at_s: f64,
    /// When, in ms since the epoch: the scheduler's clock mapped onto the wall clock when the
    /// loop took the step, so a reader can say "12 min ago".
    pub at_ms: u64,
}

/// The circuit breaker over automated cordons.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BreakerView {
    /// Whether it is tripped: automated cordons are held until an admin resets it.
    pub tripped: bool,
    /// When it tripped, in ms since the epoch; `None` while it is not tripped.
    pub tripped_at_ms: Option<u64>,
    /// The cap it hit, in words; `None` while it is not tripped.
    pub reason: Option<String>,
    /// Failure signals it held back since it last tripped (nodes left in service that a
    /// signal would have cordoned).
    pub held: u64,
}

/// The fleet's health: nodes per state, the breaker, and the latest steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HealthView {
    /// When this answer was made, in ms since the epoch: what "ago" counts from.
    pub at_ms: u64,
    /// Nodes in each state, by the state's name (`ready`, `suspect`, …); every state is
    /// present, zeros included.
    pub nodes: BTreeMap<String, u32>,
    /// The circuit breaker.
    pub breaker: BreakerView,
    /// The latest steps of every node, newest first, at most `limit`.
    pub transitions: Vec<TransitionView>,
    /// Steps the server keeps in all (the oldest go first): how far back `transitions` can
    /// reach.
    pub transitions_kept: usize,
}

/// One node's health: its state now and its steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NodeHealthView {
    /// The node's name.
    pub node: String,
    /// Its state now.
    pub state: NodeState,
    /// When this answer was made, in ms since the epoch.
    pub at_ms: u64,
    /// Its steps the server still keeps, newest first, at most `limit`.
    pub transitions: Vec<TransitionView>,
}

/// What an admin's breaker reset cleared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BreakerReset {
    /// When the breaker had tripped, in ms since the epoch.
    pub tripped_at_ms: u64,
    /// The cap it had hit, in words.
    pub reason: String,
    /// Failure signals it held back while tripped: those nodes stayed in service, and the
    /// next signal from one of them cordons it.
    pub held: u64,
    /// When it was reset, in ms since the epoch.
    pub reset_at_ms: u64,
    /// Who reset it (the token's name).
    pub by: String,
}

/// A node a job avoids because it failed under it: why the job restarted, and for how long it
/// stays off the node. The core's `BadNode`, with the node named and its times on the wall
/// clock too, so the job's page can say "restarted after h100-0421 reported Xid 79 12 min
/// ago; avoiding h100-0421 for 5 h 48 min more" without asking the scheduler's clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BadNodeView {
    /// The node's name.
    pub node: String,
    /// What it reported ("Xid 79 (GPU fell off the bus)", "condition GpuXidError=True").
    pub cause: String,
    /// When it failed under the job, on the scheduler's clock (seconds).
    pub at_s: f64,
    /// The same, in ms since the epoch.
    pub at_ms: u64,
    /// Until when the job avoids it, on the scheduler's clock (seconds).
    pub until_s: f64,
    /// The same, in ms since the epoch: a past time means the job may use the node again.
    pub until_ms: u64,
}
