//! The node health lifecycle as the API sees it. The core keeps each node's state and hands
//! its transitions to whoever takes them; the loop takes them after every pass
//! ([`Live::take_health`]) and keeps the latest [`TRANSITIONS_KEPT`] here, each with its node's
//! name and a wall-clock time, beside the counts and the breaker as the loop last saw them. The
//! handlers copy out of this record and never touch the scheduler.
//!
//! An admin's breaker reset is a change to the scheduler, so the loop makes it, between
//! cycles, as it answers what-ifs: the API asks ([`Live::reset_breaker`]), wakes the loop and
//! waits at most [`RESET_WITHIN`]; the loop writes the audit entry, then resets
//! ([`Live::answer_breaker_resets`]).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use gantry_contract::{
    BreakerReset, BreakerView, HealthView, NodeHealthView, TransitionView, count_text,
    duration_text,
};
use gantry_core::{NodeState, Scheduler};
use gantry_store::Actor;

use super::Live;
use crate::now_ms;

/// Transitions kept for the API, over every node: the oldest go first. A flapping fleet makes
/// thousands an hour, and nobody took them before, so they piled up for good; 10,000 reach
/// back hours on a quiet fleet and cost a few MB at most.
pub const TRANSITIONS_KEPT: usize = 10_000;

/// How long the API waits for the loop to reset the breaker: a pass (its cycle and its
/// binding) on a busy machine, with room to spare; the reset itself costs nothing.
pub const RESET_WITHIN: Duration = Duration::from_secs(10);

/// The lifecycle as the loop last saw it, for the handlers.
#[derive(Debug, Default)]
pub(super) struct HealthRecord {
    /// The latest transitions, oldest first, at most [`TRANSITIONS_KEPT`].
    transitions: VecDeque<TransitionView>,
    /// Per node (by index in the node table), its state: refreshed whole at each publish,
    /// and for the nodes that moved at each take, so it never lags the transitions served
    /// beside it.
    node_to_state: Vec<NodeState>,
    /// Nodes per state, in [`NodeState::ALL`]'s order.
    counts: [u32; 7],
    /// The breaker, with its trip's time already on the wall clock.
    breaker: Option<BreakerView>,
    /// The scheduler's clock and the wall clock (ms) at the last take: what maps the
    /// lifecycle's times (seconds on the scheduler's clock) onto the wall clock.
    clock: (f64, u64),
}

impl HealthRecord {
    /// `at_s` on the scheduler's clock, in ms since the epoch.
    fn wall_ms(&self, at_s: f64) -> u64 {
        let (clock_s, clock_ms) = self.clock;
        clock_ms.saturating_sub(((clock_s - at_s).max(0.0) * 1000.0) as u64)
    }

    /// Counts, node states and the breaker from `scheduler`.
    fn refresh(&mut self, scheduler: &Scheduler) {
        let lifecycle = scheduler.lifecycle();
        self.counts = lifecycle.counts();
        let nodes = scheduler.state.nodes.len();
        self.node_to_state.clear();
        self.node_to_state
            .extend((0..nodes).map(|node| lifecycle.state(node)));
        self.refresh_breaker(scheduler);
    }

    fn refresh_breaker(&mut self, scheduler: &Scheduler) {
        let breaker = &scheduler.lifecycle().breaker;
        self.breaker = Some(BreakerView {
            tripped: breaker.tripped.is_some(),
            tripped_at_ms: breaker.tripped.as_ref().map(|t| self.wall_ms(t.at_s)),
            reason: breaker.tripped.as_ref().map(|t| t.reason.clone()),
            held: breaker.held,
        });
    }

    fn breaker(&self) -> BreakerView {
        self.breaker.clone().unwrap_or(BreakerView {
            tripped: false,
            tripped_at_ms: None,
            reason: None,
            held: 0,
        })
    }
}

/// Why a breaker reset was not made.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum ResetError {
    /// Nothing to reset.
    #[error(
        "the breaker is not tripped: automated cordons go ahead, and there is nothing to reset"
    )]
    NotTripped,
    /// The loop did not take the request in time (it is stopped, or stuck in a long cycle).
    #[error("the scheduling loop did not reset the breaker within {} s", RESET_WITHIN.as_secs())]
    NoAnswer,
    /// The audit entry could not be written, so the breaker was left tripped: a reset is
    /// never without its entry.
    #[error("the breaker was left tripped: its audit entry could not be written ({0})")]
    Audit(String),
}

/// A reset an admin asked for, waiting for the loop, and where its answer goes.
pub(super) struct ResetAsk {
    actor: Actor,
    reply: tokio::sync::oneshot::Sender<Result<BreakerReset, ResetError>>,
}

impl Live {
    /// Takes the lifecycle's transitions from `scheduler` (the loop calls this after each
    /// pass: the source's sync reports failures and repairs, the cycle acts on them), names
    /// their nodes and times them on the wall clock, `time_ms` being the wall clock at the
    /// scheduler's clock now.
    pub fn take_health(&self, scheduler: &mut Scheduler, time_ms: u64) {
        let taken = scheduler.lifecycle_mut().take_transitions();
        let mut record = self.health.lock().unwrap_or_else(|e| e.into_inner());
        record.clock = (scheduler.clock_s(), time_ms);
        let nodes = scheduler.state.nodes.len();
        for t in taken {
            // The lifecycle may know a node the table no longer has (a rebuild shrank it).
            let node = if t.node < nodes {
                scheduler.node_name(t.node)
            } else {
                format!("node #{}", t.node)
            };
            if let Some(state) = record.node_to_state.get_mut(t.node) {
                *state = t.to;
            }
            tracing::info!(%node, from = t.from.name(), to = t.to.name(), cause = %t.cause, "node health");
            let at_ms = record.wall_ms(t.at_s);
            record.transitions.push_back(TransitionView {
                node,
                from: t.from,
                to: t.to,
                cause: t.cause,
                at_s: t.at_s,
                at_ms,
            });
        }
        let over = record.transitions.len().saturating_sub(TRANSITIONS_KEPT);
        record.transitions.drain(..over);
        record.counts = scheduler.lifecycle().counts();
        record.refresh_breaker(scheduler);
    }

    /// Refreshes the whole record but the transitions (each publish calls this, so a rebuilt
    /// node table is seen even when no node moved).
    pub(super) fn refresh_health(&self, scheduler: &Scheduler) {
        self.health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .refresh(scheduler);
    }

    /// Nodes per state, the breaker and the latest `limit` transitions, newest first.
    pub fn health(&self, limit: usize) -> HealthView {
        let record = self.health.lock().unwrap_or_else(|e| e.into_inner());
        let nodes: BTreeMap<String, u32> = NodeState::ALL
            .iter()
            .zip(record.counts)
            .map(|(state, n)| (state.name().to_string(), n))
            .collect();
        HealthView {
            at_ms: now_ms(),
            nodes,
            breaker: record.breaker(),
            transitions: record
                .transitions
                .iter()
                .rev()
                .take(limit)
                .cloned()
                .collect(),
            transitions_kept: record.transitions.len(),
        }
    }

    /// The node called `name`: its state and its latest `limit` transitions, newest first;
    /// `None` when the published node table has no such node.
    pub fn node_health(&self, name: &str, limit: usize) -> Option<NodeHealthView> {
        let view = self.view();
        let symbols = self.symbols();
        let index = view
            .nodes
            .name
            .iter()
            .position(|&s| &*symbols.resolve(s) == name)?;
        let record = self.health.lock().unwrap_or_else(|e| e.into_inner());
        let state = record
            .node_to_state
            .get(index)
            .copied()
            .unwrap_or(NodeState::Ready);
        let transitions = record
            .transitions
            .iter()
            .rev()
            .filter(|t| t.node == name)
            .take(limit)
            .cloned()
            .collect();
        Some(NodeHealthView {
            node: name.to_string(),
            state,
            at_ms: now_ms(),
            transitions,
        })
    }

    /// Asks the loop to reset the breaker for `actor`, and waits at most [`RESET_WITHIN`]:
    /// what it cleared, or why nothing was reset.
    pub async fn reset_breaker(&self, actor: Actor) -> Result<BreakerReset, ResetError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.breaker_resets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ResetAsk { actor, reply });
        self.wake_loop();
        match tokio::time::timeout(RESET_WITHIN, answer).await {
            Ok(Ok(answer)) => answer,
            _ => Err(ResetError::NoAnswer),
        }
    }

    /// Makes the breaker resets asked for since the last pass (the loop calls this between
    /// cycles): the first clears the trip, with its audit entry written first; any other
    /// finds nothing to reset. Returns how many it answered.
    pub fn answer_breaker_resets(&self, scheduler: &mut Scheduler) -> usize {
        let asks = std::mem::take(
            &mut *self
                .breaker_resets
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        let answered = asks.len();
        for ask in asks {
            let answer = self.reset_for(scheduler, &ask.actor);
            // The caller may have gone: the reset stands, and its audit entry says who.
            let _ = ask.reply.send(answer);
        }
        answered
    }

    fn reset_for(
        &self,
        scheduler: &mut Scheduler,
        actor: &Actor,
    ) -> Result<BreakerReset, ResetError> {
        let lifecycle = scheduler.lifecycle();
        let Some(trip) = lifecycle.breaker.tripped.clone() else {
            return Err(ResetError::NotTripped);
        };
        let held = lifecycle.breaker.held;
        let reset_at_ms = now_ms();
        let tripped_at_ms = self
            .health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .wall_ms(trip.at_s);
        let detail = format!(
            "reset the node health breaker, tripped {} before ({}); it had held {}",
            duration_text(reset_at_ms.saturating_sub(tripped_at_ms) as f64 / 1000.0),
            trip.reason,
            count_text(held, "failure signal")
        );
        self.store
            .audit(actor, "health.reset", &detail, reset_at_ms)
            .map_err(|e| ResetError::Audit(e.to_string()))?;
        let lifecycle = scheduler.lifecycle_mut();
        lifecycle.reset_breaker();
        self.health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .refresh_breaker(scheduler);
        tracing::info!(who = %actor.who, reason = %trip.reason, held, "breaker reset");
        Ok(BreakerReset {
            tripped_at_ms,
            reason: trip.reason,
            held,
            reset_at_ms,
            by: actor.who.clone(),
        })
    }
}
