//! Node signals in, gang restarts out: a configured signal that starts firing on a node is
//! reported once ([`Tracker::take_node_signals`]), for the cluster source to hand to
//! `Scheduler::node_failed`; the gangs that stopped are remembered by name
//! ([`Tracker::stopping`]) so that their recreated pods, a new job, keep the stopped job's
//! submission time, go first and avoid the failed nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use gantry_core::JobId;
use gantry_core::Scheduler;
use gantry_core::scheduler::BadNode;

use crate::mapping::Gang;
use crate::preflight::NodeStatus as PreflightStatus;

use super::Tracker;

/// A stopped gang whose pods are not recreated within this long is forgotten: its controller
/// gave up, or it was deleted.
const RESTART_MEMORY: Duration = Duration::from_secs(3600);

/// A change of a node's configured suspect signals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeSignal {
    /// A suspect signal started firing: the cause, in words.
    Failed {
        /// The node's name.
        node: String,
        /// What fired (`taint nvidia.com/gpu-xid-error=79`).
        cause: String,
    },
    /// Every suspect signal of the node stopped firing: repaired.
    Cleared {
        /// The node's name.
        node: String,
    },
    /// A node known before was tainted `gantry.dev/preflight`, or its failed preflight's
    /// annotation was removed: it is tested (again) before it takes work. A node new to the
    /// table reports nothing: it starts in Preflight.
    PreflightDue {
        /// The node's name.
        node: String,
        /// Whether its last preflight had failed (an admin cleared the failure).
        after_failure: bool,
    },
}

/// What a stopped gang's recreated pods inherit.
#[derive(Debug, Clone)]
pub(super) struct Restart {
    /// The stopped job's submission time: ordering and fair share go on from it.
    pub(super) submit_s: f64,
    /// The nodes it avoids, by name (indexes change with a rebuild), each with the rest of
    /// its entry (until when, what the node reported and when), so that the recreated pods'
    /// job says why it restarted; the entry's index is the one of the table it was taken
    /// from, and [`Tracker::bad_nodes`] sets it from the name.
    pub(super) avoid: Vec<(String, BadNode)>,
    /// When it stopped, to forget it after [`RESTART_MEMORY`].
    pub(super) at: Instant,
}

impl Tracker {
    /// Records what changed between a node's suspect causes `before` and `now`.
    pub(super) fn note_signals(
        &mut self,
        name: &str,
        before: &BTreeSet<String>,
        now: &BTreeSet<String>,
    ) {
        match now.iter().next() {
            Some(cause) => self
                .suspect_to_cause
                .insert(name.to_string(), cause.clone()),
            None => self.suspect_to_cause.remove(name),
        };
        if let Some(cause) = now.difference(before).next() {
            self.node_signals.push(NodeSignal::Failed {
                node: name.to_string(),
                cause: cause.clone(),
            });
        } else if now.is_empty() && !before.is_empty() {
            self.node_signals.push(NodeSignal::Cleared {
                node: name.to_string(),
            });
        }
    }

    /// Records what changed between a node's preflight status `before` and `now`.
    pub(super) fn note_preflight(
        &mut self,
        name: &str,
        before: Option<&PreflightStatus>,
        now: Option<&PreflightStatus>,
    ) {
        match now {
            Some(status) => self
                .preflight_nodes
                .insert(name.to_string(), status.clone()),
            None => self.preflight_nodes.remove(name),
        };
        if now == Some(&PreflightStatus::Testing) && before != now {
            self.node_signals.push(NodeSignal::PreflightDue {
                node: name.to_string(),
                after_failure: matches!(before, Some(PreflightStatus::Failed(_))),
            });
        }
    }

    /// The nodes tainted for preflight now, by name, with their status.
    pub fn preflight_nodes(&self) -> &BTreeMap<String, PreflightStatus> {
        &self.preflight_nodes
    }

    /// The signal changes since the last call, oldest first.
    pub fn take_node_signals(&mut self) -> Vec<NodeSignal> {
        std::mem::take(&mut self.node_signals)
    }

    /// The nodes showing a suspect signal now, each with one cause, by name: the lifecycle
    /// keeps them out whatever a rebuild or an in-place health change made of them.
    pub fn suspect_nodes(&self) -> &BTreeMap<String, String> {
        &self.suspect_to_cause
    }

    /// The nodes the last rebuild added to the table (every node, at the first), since the
    /// last call.
    pub fn take_new_nodes(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.new_nodes)
    }

    /// The node table's index of node `name`.
    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.name_to_node.get(name).copied()
    }

    /// `job` was stopped by a node failure (`Scheduler::node_failed` with
    /// `RestartBy::Recreated`): remembers its gang's submission time and bad nodes for the
    /// pods its controller recreates.
    pub fn stopping(&mut self, scheduler: &Scheduler, job: JobId) {
        let (Some((gang, _)), Some(spec)) = (self.job_to_gang.get(&job), scheduler.get(job)) else {
            return;
        };
        let avoid = scheduler
            .avoided(job)
            .iter()
            .filter_map(|b| Some((self.node_names.get(b.node)?.clone(), b.clone())))
            .collect();
        self.gang_to_restart.insert(
            gang.clone(),
            Restart {
                submit_s: spec.submit_s,
                avoid,
                at: Instant::now(),
            },
        );
    }

    /// The restart `gang` inherits, if it is a stopped gang's recreated pods; forgets the ones
    /// too old to be.
    pub(super) fn take_restart(&mut self, gang: &Gang) -> Option<Restart> {
        self.gang_to_restart
            .retain(|_, r| r.at.elapsed() < RESTART_MEMORY);
        self.gang_to_restart.remove(gang)
    }

    /// The bad nodes of `restart` as the node table indexes them now.
    pub(super) fn bad_nodes(&self, restart: &Restart) -> Vec<BadNode> {
        restart
            .avoid
            .iter()
            .filter_map(|(name, bad)| {
                Some(BadNode {
                    node: self.node_index(name)?,
                    ..bad.clone()
                })
            })
            .collect()
    }
}
