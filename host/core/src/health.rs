//! The node health lifecycle, in the core's own types: one state per node, the transitions
//! between them with their causes, and the circuit breaker that caps automated cordons.
//! - [`NodeState`]: Preflight → Ready → Suspect → Draining → Repair → Re-test → Ready, or
//!   Retired; each maps to the [`Health`] code the filters (and the policy contract) read.
//! - [`Transition`]: one recorded step, with its cause and time, for the API, the UI and
//!   `gantry explain`.
//! - [`Breaker`]: automated cordons stop once too many nodes are out, or too many went out in
//!   the last hour, so that a correlated failure (a bad driver rollout) never drains the fleet.
//! - [`Lifecycle`]: the states of every node, driven by signals from the cluster source; the
//!   scheduler (`Scheduler::node_failed`) stops the gangs of a node that turns Suspect.
//!
//! What reads the signals (node conditions, taints, a simulated failure model) lives with the
//! cluster source; this module only decides what a signal does.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::model::Health;

/// Where a node stands in its health lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub enum NodeState {
    /// New: tainted for preflight while its test runs; takes no work.
    Preflight,
    /// Verified and taking work.
    Ready,
    /// A passive signal (an Xid, ECC, disk or network error) reported it: cordoned.
    Suspect,
    /// Its gangs are being stopped.
    Draining,
    /// Out of the scheduler's hands until repaired.
    Repair,
    /// Back from repair, tested again before it takes work.
    Retest,
    /// Failed too often: out for good, until an admin brings it back.
    Retired,
}

impl NodeState {
    /// What the filters see of the state: only a Ready node takes pods.
    pub fn health(self) -> Health {
        match self {
            Self::Ready => Health::Healthy,
            Self::Preflight | Self::Retest => Health::Preflight,
            Self::Suspect | Self::Draining => Health::Cordoned,
            Self::Repair | Self::Retired => Health::Unhealthy,
        }
    }

    /// The state's name, as the API and the UI show it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Preflight => "preflight",
            Self::Ready => "ready",
            Self::Suspect => "suspect",
            Self::Draining => "draining",
            Self::Repair => "repair",
            Self::Retest => "retest",
            Self::Retired => "retired",
        }
    }

    /// Every state, in lifecycle order: the report's and the heatmap's columns.
    pub const ALL: [NodeState; 7] = [
        Self::Preflight,
        Self::Ready,
        Self::Suspect,
        Self::Draining,
        Self::Repair,
        Self::Retest,
        Self::Retired,
    ];

    /// Whether the node is out of service for a health reason (the breaker counts these).
    pub fn out(self) -> bool {
        matches!(
            self,
            Self::Suspect | Self::Draining | Self::Repair | Self::Retired
        )
    }
}

/// One step of a node's lifecycle, kept as it happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Transition {
    /// The node's index in the node table.
    pub node: usize,
    /// The state it left.
    pub from: NodeState,
    /// The state it entered.
    pub to: NodeState,
    /// Why, in words: "reported GpuXidError (Xid 79)", "repaired", "preflight passed".
    pub cause: String,
    /// When, on the scheduler's clock.
    pub at_s: f64,
}

/// The knobs of the lifecycle and its breaker. Why configurable: the right cap depends on the
/// fleet (10% of 7,500 nodes is a lot of hardware; of 32 it is three nodes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Automated cordons stop while more than this share of the nodes is out (0–1; one node
    /// may always be out, so that a small cluster can cordon at all).
    pub max_out_share: f64,
    /// Automated cordons stop once more than this many happened in the last hour.
    pub max_cordons_per_hour: u32,
    /// How long a gang avoids a node that failed under it, in seconds.
    pub avoid_s: f64,
    /// Failures after which a node is retired rather than repaired again.
    pub retire_after: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            max_out_share: 0.10,
            max_cordons_per_hour: 100,
            avoid_s: 6.0 * 3600.0,
            retire_after: 3,
        }
    }
}

impl HealthConfig {
    /// Every rule the knobs must meet, naming the field that breaks one.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.max_out_share > 0.0 && self.max_out_share <= 1.0) {
            return Err(format!(
                "field max_out_share: {} must be above 0 and at most 1",
                self.max_out_share
            ));
        }
        if !(self.avoid_s.is_finite() && self.avoid_s >= 0.0) {
            return Err(format!(
                "field avoid_s: {} must be a number of seconds, 0 or more",
                self.avoid_s
            ));
        }
        if self.retire_after == 0 {
            return Err("field retire_after: must be at least 1".into());
        }
        Ok(())
    }
}

/// Why the breaker tripped, and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Trip {
    /// When, on the scheduler's clock.
    pub at_s: f64,
    /// The cap it hit, in words.
    pub reason: String,
}

/// The circuit breaker over automated cordons. Once tripped it stays tripped until an admin
/// resets it: a correlated failure is a reason to look, not to keep draining.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Breaker {
    /// Set while tripped.
    pub tripped: Option<Trip>,
    /// Times of the automated cordons of the last hour: the per-hour cap's window.
    recent_s: VecDeque<f64>,
    /// Signals it held back since it tripped.
    pub held: u64,
}

/// What became of a failure signal.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The node turned Suspect.
    Cordoned,
    /// The breaker is tripped: the node stays as it was, and the signal is counted.
    HeldByBreaker,
    /// The node was not Ready (already out, or in a test): nothing changes.
    NotReady,
}

/// Every node's lifecycle state and failure count, the transitions not yet taken by the
/// caller, and the breaker.
#[derive(Debug, Clone, Default)]
pub struct Lifecycle {
    /// Per node (by index), its state.
    node_to_state: Vec<NodeState>,
    /// Per node, the failures it had (what retires it).
    node_to_failures: Vec<u32>,
    /// Nodes out, kept as states change, for the breaker's share.
    out: usize,
    /// Transitions since the caller last took them (see [`Lifecycle::take_transitions`]).
    transitions: Vec<Transition>,
    /// Automated cordons it let through, ever.
    cordons: u64,
    pub breaker: Breaker,
    pub config: HealthConfig,
}

impl Lifecycle {
    /// `nodes` nodes, each in the state its health code says.
    pub fn new(health: &[u8], config: HealthConfig) -> Self {
        let node_to_state: Vec<NodeState> = health
            .iter()
            .map(|&h| match Health::from_u8(h) {
                Some(Health::Healthy) => NodeState::Ready,
                Some(Health::Preflight) => NodeState::Preflight,
                Some(Health::Cordoned) => NodeState::Suspect,
                _ => NodeState::Repair,
            })
            .collect();
        let out = node_to_state.iter().filter(|s| s.out()).count();
        Self {
            node_to_failures: vec![0; node_to_state.len()],
            node_to_state,
            out,
            config,
            ..Self::default()
        }
    }

    /// The node's state; a node the lifecycle has not heard of is Ready.
    pub fn state(&self, node: usize) -> NodeState {
        self.node_to_state
            .get(node)
            .copied()
            .unwrap_or(NodeState::Ready)
    }

    /// Nodes in each state, in [`NodeState::ALL`]'s order.
    pub fn counts(&self) -> [u32; 7] {
        let mut counts = [0u32; 7];
        for state in &self.node_to_state {
            let i = NodeState::ALL.iter().position(|s| s == state).unwrap_or(1);
            counts[i] += 1;
        }
        counts
    }

    /// Automated cordons let through, ever.
    pub fn cordons(&self) -> u64 {
        self.cordons
    }

    /// The transitions since the last call, oldest first.
    pub fn take_transitions(&mut self) -> Vec<Transition> {
        std::mem::take(&mut self.transitions)
    }

    fn ensure(&mut self, node: usize) {
        if node >= self.node_to_state.len() {
            self.node_to_state.resize(node + 1, NodeState::Ready);
            self.node_to_failures.resize(node + 1, 0);
        }
    }

    /// Takes over `old`, the lifecycle of a node table rebuilt since, for this one's: its
    /// config, breaker and cordon count, and each node's failures and state, where
    /// `node_to_old` gives a node's index in the old table. Nothing is recorded: nothing
    /// happened to the nodes. The states only Gantry knows (a node it took out, or is
    /// re-testing) win over the table's Ready, which is all the node object shows; anything
    /// else the table shows is newer. Without this a rebuild forgot which nodes were out, and a
    /// node the breaker had held, still signalling, went out past the breaker's cap.
    ///
    /// Returns the nodes whose state it carried, for the caller to bring the table's health in
    /// line.
    pub fn carry_from(
        &mut self,
        old: Lifecycle,
        node_to_old: impl Fn(usize) -> Option<usize>,
    ) -> Vec<usize> {
        let mut carried = Vec::new();
        for node in 0..self.node_to_state.len() {
            let Some(was) = node_to_old(node) else {
                continue;
            };
            let state = old.state(was);
            self.node_to_failures[node] = old.node_to_failures.get(was).copied().unwrap_or(0);
            let gantry_only = state.out() || state == NodeState::Retest;
            if gantry_only && self.node_to_state[node] == NodeState::Ready {
                self.out += usize::from(state.out());
                self.node_to_state[node] = state;
                carried.push(node);
            }
        }
        self.cordons = old.cordons;
        self.breaker = old.breaker;
        self.config = old.config;
        carried
    }

    /// Moves `node` to `to` for `cause`, recording the step; nothing when it is there already.
    pub fn set(&mut self, node: usize, to: NodeState, cause: &str, now_s: f64) -> bool {
        self.ensure(node);
        let from = self.node_to_state[node];
        if from == to {
            return false;
        }
        self.out = self.out + usize::from(to.out()) - usize::from(from.out());
        self.node_to_state[node] = to;
        self.push(node, from, to, cause, now_s);
        true
    }

    /// Records the step `from` → `to` of `node`.
    fn push(&mut self, node: usize, from: NodeState, to: NodeState, cause: &str, now_s: f64) {
        self.transitions.push(Transition {
            node,
            from,
            to,
            cause: cause.to_string(),
            at_s: now_s,
        });
    }

    /// Records a step the cluster source took outside the lifecycle, so that the node's history
    /// shows it: a live cluster's node table is rebuilt when a taint changes, and the rebuilt
    /// lifecycle starts each node in the state its health shows (a node tainted for preflight
    /// starts in Preflight), with no step recorded. Nothing when `from` is where it is.
    pub fn record(&mut self, node: usize, from: NodeState, cause: &str, now_s: f64) {
        let to = self.state(node);
        if from != to {
            self.push(node, from, to, cause, now_s);
        }
    }

    /// A passive failure signal on `node`: a Ready node turns Suspect, unless the breaker is
    /// tripped or this cordon would trip it.
    pub fn failure(&mut self, node: usize, cause: &str, now_s: f64) -> Verdict {
        self.ensure(node);
        if self.node_to_state[node] != NodeState::Ready {
            return Verdict::NotReady;
        }
        if self.breaker.tripped.is_none() {
            while self
                .breaker
                .recent_s
                .front()
                .is_some_and(|&t| t <= now_s - 3600.0)
            {
                self.breaker.recent_s.pop_front();
            }
            let nodes = self.node_to_state.len().max(1);
            // At least one node may be out, so that a small cluster can cordon at all.
            let cap = ((self.config.max_out_share * nodes as f64).floor() as usize).max(1);
            let reason = if self.out + 1 > cap {
                Some(format!(
                    "one more cordon would put {} of {} nodes out, over the {}% cap",
                    self.out + 1,
                    nodes,
                    self.config.max_out_share * 100.0
                ))
            } else if self.breaker.recent_s.len() >= self.config.max_cordons_per_hour as usize {
                Some(format!(
                    "{} automated cordons in the last hour, the cap",
                    self.breaker.recent_s.len()
                ))
            } else {
                None
            };
            if let Some(reason) = reason {
                self.breaker.tripped = Some(Trip {
                    at_s: now_s,
                    reason,
                });
            }
        }
        if self.breaker.tripped.is_some() {
            self.breaker.held += 1;
            return Verdict::HeldByBreaker;
        }
        self.breaker.recent_s.push_back(now_s);
        self.cordons += 1;
        self.node_to_failures[node] += 1;
        self.set(node, NodeState::Suspect, cause, now_s);
        Verdict::Cordoned
    }

    /// The node's gangs are stopped: Suspect → Draining → Repair, or Retired once it failed
    /// [`HealthConfig::retire_after`] times.
    pub fn drained(&mut self, node: usize, now_s: f64) {
        if !matches!(self.state(node), NodeState::Suspect | NodeState::Draining) {
            return;
        }
        self.set(node, NodeState::Draining, "stopping its gangs", now_s);
        if self.node_to_failures[node] >= self.config.retire_after {
            let cause = format!("failed {} times", self.node_to_failures[node]);
            self.set(node, NodeState::Retired, &cause, now_s);
        } else {
            self.set(node, NodeState::Repair, "its gangs are stopped", now_s);
        }
    }

    /// A repaired node goes to Re-test; with `retest` off (a cluster without preflight) it is
    /// Ready at once.
    pub fn repaired(&mut self, node: usize, retest: bool, now_s: f64) {
        if self.state(node) != NodeState::Repair {
            return;
        }
        let to = if retest {
            NodeState::Retest
        } else {
            NodeState::Ready
        };
        self.set(node, to, "repaired", now_s);
    }

    /// A preflight or re-test passed: the node takes work.
    pub fn passed(&mut self, node: usize, now_s: f64) {
        if matches!(self.state(node), NodeState::Preflight | NodeState::Retest) {
            self.set(node, NodeState::Ready, "preflight passed", now_s);
        }
    }

    /// A preflight or re-test failed with `reason`: the node goes to repair.
    pub fn test_failed(&mut self, node: usize, reason: &str, now_s: f64) {
        if matches!(self.state(node), NodeState::Preflight | NodeState::Retest) {
            self.ensure(node);
            self.node_to_failures[node] += 1;
            self.set(
                node,
                NodeState::Repair,
                &format!("preflight failed: {reason}"),
                now_s,
            );
        }
    }

    /// An admin resets the breaker: automated cordons resume. `None` when it was not tripped.
    pub fn reset_breaker(&mut self) -> Option<Trip> {
        let trip = self.breaker.tripped.take()?;
        self.breaker.recent_s.clear();
        // `held` counts the signals held since this trip: the next trip counts afresh.
        self.breaker.held = 0;
        Some(trip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lifecycle(nodes: usize) -> Lifecycle {
        Lifecycle::new(&vec![Health::Healthy as u8; nodes], HealthConfig::default())
    }

    #[test]
    fn a_failure_goes_through_repair_and_retest_back_to_ready() {
        let mut l = lifecycle(20);
        assert_eq!(l.failure(3, "Xid 79", 10.0), Verdict::Cordoned);
        assert_eq!(l.state(3).health(), Health::Cordoned);
        l.drained(3, 11.0);
        assert_eq!(l.state(3), NodeState::Repair);
        l.repaired(3, true, 100.0);
        assert_eq!(l.state(3), NodeState::Retest);
        l.passed(3, 200.0);
        assert_eq!(l.state(3), NodeState::Ready);
        let steps: Vec<_> = l.take_transitions().iter().map(|t| t.to).collect();
        assert_eq!(
            steps,
            [
                NodeState::Suspect,
                NodeState::Draining,
                NodeState::Repair,
                NodeState::Retest,
                NodeState::Ready
            ]
        );
    }

    #[test]
    fn a_node_that_keeps_failing_is_retired() {
        let mut l = lifecycle(100);
        for round in 0..3 {
            let t = f64::from(round) * 10_000.0;
            assert_eq!(l.failure(7, "ECC", t), Verdict::Cordoned);
            l.drained(7, t + 1.0);
            l.repaired(7, false, t + 2.0);
        }
        assert_eq!(l.state(7), NodeState::Retired);
        assert_eq!(l.failure(7, "ECC", 99_999.0), Verdict::NotReady);
    }

    #[test]
    fn the_breaker_trips_at_the_share_and_holds_until_reset() {
        let mut l = lifecycle(100);
        let cordoned = (0..40)
            .filter(|&n| l.failure(n, "driver", 60.0) == Verdict::Cordoned)
            .count();
        assert_eq!(cordoned, 10, "10% of 100 nodes");
        let trip = l.breaker.tripped.clone().expect("tripped");
        assert!(trip.reason.contains("over the 10% cap"), "{}", trip.reason);
        assert_eq!(l.breaker.held, 30);
        assert!(l.reset_breaker().is_some());
        assert_eq!(
            l.failure(50, "Xid", 120.0),
            Verdict::HeldByBreaker,
            "still 10 out"
        );
    }

    #[test]
    fn the_breaker_caps_cordons_per_hour() {
        let mut l = Lifecycle::new(
            &[Health::Healthy as u8; 1000],
            HealthConfig {
                max_cordons_per_hour: 3,
                ..HealthConfig::default()
            },
        );
        for n in 0..3 {
            assert_eq!(l.failure(n, "Xid", f64::from(n as u32)), Verdict::Cordoned);
        }
        assert_eq!(l.failure(9, "Xid", 10.0), Verdict::HeldByBreaker);
        let reason = l.breaker.tripped.as_ref().unwrap().reason.clone();
        assert!(
            reason.contains("3 automated cordons in the last hour"),
            "{reason}"
        );
    }

    #[test]
    fn bad_config_names_the_field() {
        let bad = HealthConfig {
            max_out_share: 0.0,
            ..HealthConfig::default()
        };
        assert!(bad.validate().unwrap_err().contains("max_out_share"));
        let bad = HealthConfig {
            avoid_s: -1.0,
            ..HealthConfig::default()
        };
        assert!(bad.validate().unwrap_err().contains("avoid_s"));
    }
}
