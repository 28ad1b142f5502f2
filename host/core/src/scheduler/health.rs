//! What a failing node does to the jobs on it. Gantry stops a gang hit by a node failure whole,
//! sends it back to its place at the head of its queue (it keeps its submission time), and
//! remembers the node so the gang avoids it for a while (`HealthConfig::avoid_s`). The
//! anchors behave as their real counterparts do: the gang halts, its pods are recreated and go
//! to the tail of the queue, and nothing remembers the node.

use crate::explain::Outcome;
use crate::health::{Lifecycle, NodeState, Verdict};
use crate::words::duration_text;

use super::{Decision, JobId, Mode, RestartBy, Scheduler};

/// Under the anchors nothing stops the gang: its other ranks block in their collective until
/// it times out (PyTorch's default NCCL timeout, 10 min), holding their GPUs and doing no work.
pub const HALT_S: f64 = 600.0;
/// Then the Job controller recreates the failed pods after its first pod-failure backoff.
pub const CONTROLLER_BACKOFF_S: f64 = 10.0;
/// Kueue evicts the workload whose pods are no longer ready (waitForPodsReady) and requeues
/// it after its requeuing backoff base.
pub const KUEUE_REQUEUE_S: f64 = 60.0;

/// How long after its halt ends a stopped gang's recreated pods reach the queue, by mode.
fn recreate_after_s(mode: Mode) -> f64 {
    match mode {
        Mode::Gantry => 0.0,
        Mode::Kueue => KUEUE_REQUEUE_S,
        Mode::K8sDefault | Mode::Coscheduling { .. } => CONTROLLER_BACKOFF_S,
    }
}

/// What a node failure stops of a gang with a pod on the node: a per-gang policy (a live
/// cluster reads it from a PodGroup's or pod's `gantry.dev/stop-policy` annotation, or its
/// Queue's default). Why a choice: an MPI gang halts whole when one rank dies, but a gang of
/// independent workers (data loaders, a parameter-server job, an elastic trainer) loses only
/// the pods on the node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StopPolicy {
    /// Stop every pod of the gang: the default, as an MPI job needs.
    #[default]
    Whole,
    /// Stop only its pods on the failed node; the rest run on, and the recreated pods are
    /// placed again first. Honoured on a live cluster (`RestartBy::Recreated`); a replay
    /// stops the gang whole.
    Pod,
}

impl StopPolicy {
    /// The policy's name, as annotations and Queues spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Whole => "whole",
            Self::Pod => "pod",
        }
    }
}

/// A node a gang avoids because it failed under it, with what it reported and when: the
/// job's page and its explanation say why it restarted ("after h100-0421 reported Xid 79"),
/// and a live cluster hands all of it on to the recreated pods' job.
#[derive(Debug, Clone, PartialEq)]
pub struct BadNode {
    /// The node's index.
    pub node: usize,
    /// Until when the gang avoids it, on the scheduler's clock.
    pub until_s: f64,
    /// What the node reported: the failure signal's cause, as the lifecycle recorded it.
    pub cause: String,
    /// When it failed under the gang, on the scheduler's clock.
    pub at_s: f64,
}

/// What a failure signal did.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeFailure {
    /// What the lifecycle made of the signal.
    pub verdict: Verdict,
    /// Jobs stopped whole because a pod of theirs ran on the node (balloons among them).
    pub stopped: Vec<JobId>,
}

impl Scheduler {
    /// The node lifecycle: states, transitions not yet taken, the breaker.
    pub fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    /// The lifecycle, to drive it (repairs, tests, a breaker reset): every change of state
    /// goes through [`Scheduler::set_node_state`] or the methods here, so the node table's
    /// health follows.
    pub fn lifecycle_mut(&mut self) -> &mut Lifecycle {
        &mut self.lifecycle
    }

    /// Moves `node` to `state` for `cause` (a repair, a test's result) and the node table's
    /// health with it.
    pub fn set_node_state(&mut self, node: usize, state: NodeState, cause: &str, now_s: f64) {
        if self.lifecycle.set(node, state, cause, now_s) {
            self.state.set_health(node, state.health());
        }
    }

    /// Brings the node table's health in line with the lifecycle after it was driven
    /// through [`Scheduler::lifecycle_mut`].
    pub fn sync_health(&mut self, node: usize) {
        let health = self.lifecycle.state(node).health();
        if self.state.nodes.health(node) != health {
            self.state.set_health(node, health);
        }
    }

    /// A passive failure signal on `node` (an Xid, an ECC error, a simulated failure). Unless
    /// the breaker holds it, the node is cordoned, every job with a pod on it is stopped whole
    /// (one decision each, with the reason, in the next cycle's output), and the node goes to
    /// repair (or retires).
    pub fn node_failed(&mut self, node: usize, cause: &str, now_s: f64) -> NodeFailure {
        let verdict = self.lifecycle.failure(node, cause, now_s);
        if verdict != Verdict::Cordoned {
            return NodeFailure {
                verdict,
                stopped: Vec::new(),
            };
        }
        self.sync_health(node);
        let hit: Vec<JobId> = self
            .running
            .iter()
            .copied()
            .filter(|&id| !self.halted.iter().any(|&(_, h)| h == id))
            .filter(|&id| self.slots(id).iter().any(|s| s.node as usize == node))
            .collect();
        for &id in &hit {
            self.stop_for_node(id, node, cause, now_s);
        }
        self.lifecycle.drained(node, now_s);
        self.sync_health(node);
        NodeFailure {
            verdict,
            stopped: hit,
        }
    }

    /// Stops `id` because `node` failed under it, as its mode would: Gantry at once and whole;
    /// an anchor's gang halts, holding its GPUs, until [`HALT_S`] has passed.
    fn stop_for_node(&mut self, id: JobId, node: usize, cause: &str, now_s: f64) {
        let name = self.node_name(node);
        let gantry = self.config.mode == Mode::Gantry;
        let recreated = self.config.restart == RestartBy::Recreated;
        let pods_only = gantry && recreated && self.stop_policy(id) == StopPolicy::Pod;
        if gantry && recreated {
            // Its pods are evicted by the binder; the job leaves once they are gone, and
            // the recreated pods come back through `restarted`.
        } else if gantry {
            // Evicted through the Eviction API, the gang is placed again first thing in the
            // next cycle, before the nodes it freed go to anyone else; its recreated pods bind
            // there as they appear (about a second later).
            self.release(id);
            let key = self.job_to_entry[&id].spec.queue_key();
            self.queue.push(id, key);
            self.restart_first.push(id);
        } else {
            if self.is_running(id) {
                // Its GPUs stay held but do no work.
                self.running_gpus -= self.job_to_entry[&id].spec.total().gpus;
            }
            self.halted.push((now_s + HALT_S, id));
        }
        let entry = self.job_to_entry.get_mut(&id).expect("a running job");
        let waiting_for = if pods_only {
            format!(
                "a restart of its pods on {name}: the node reported {cause}; the gang's stop \
                 policy is pod, so only those pods are evicted and its others run on; when their \
                 controller recreates them they go to the head of its queue, avoiding {name} for {}",
                duration_text(self.lifecycle.config.avoid_s)
            )
        } else if gantry && recreated {
            format!(
                "a restart: node {name} reported {cause}; the gang was stopped whole, its pods \
                 are evicted, and when its controller recreates them they go to the head of its \
                 queue, avoiding {name} for {}",
                duration_text(self.lifecycle.config.avoid_s)
            )
        } else if gantry {
            let avoid_s = self.lifecycle.config.avoid_s;
            format!(
                "a restart: node {name} reported {cause}; the gang was stopped whole and goes \
                 back to its place at the head of its queue, avoiding {name} for {}",
                duration_text(avoid_s)
            )
        } else {
            format!(
                "a restart: node {name} reported {cause}; the gang halted, its other pods \
                 holding their GPUs until their collective times out, and its recreated pods \
                 will queue at the tail"
            )
        };
        if gantry && !entry.spec.balloon {
            let until_s = now_s + self.lifecycle.config.avoid_s;
            let bad = self.job_to_bad_nodes.entry(id).or_default();
            bad.retain(|b| b.node != node && b.until_s > now_s);
            bad.push(BadNode {
                node,
                until_s,
                cause: cause.to_string(),
                at_s: now_s,
            });
        }
        let spec = self.job_to_entry[&id].spec.clone();
        let mut explanation = self.blank_explanation(&spec, now_s, 0);
        explanation.outcome = Outcome::Pending { waiting_for };
        self.stops.push(Decision {
            job: id,
            placed: false,
            placement: Vec::new(),
            victims: Vec::new(),
            explanation,
        });
        self.stopped_jobs.push(id);
    }

    /// Moves on the stopped jobs whose time came by `now_s`: an anchor's halted gang lets go of
    /// its GPUs (and, under Kueue, its quota) and is recreated later as new pods at the tail;
    /// recreated pods join the queue.
    pub(super) fn stopped_jobs_due(&mut self, now_s: f64) {
        let mode = self.config.mode;
        let (due, halted): (Vec<_>, Vec<_>) = self.halted.drain(..).partition(|&(t, _)| t <= now_s);
        self.halted = halted;
        for (released_s, id) in due {
            let Some(entry) = self.job_to_entry.get(&id) else {
                continue;
            };
            let gpus = entry.spec.total().gpus;
            let kueue_holding = self.kueue_admitted(id);
            if self.is_running(id) {
                self.running_gpus += gpus;
            }
            self.release(id);
            let entry = self.job_to_entry.get_mut(&id).expect("a live job");
            if kueue_holding {
                // Kueue charged the workload at admission; its eviction gives the quota back.
                let (queue, total) = (entry.spec.queue, entry.spec.total());
                self.queues.charge(queue, total, false);
            }
            // Recreated pods are new pods: they queue behind the rest.
            entry.spec.submit_s = released_s;
            self.recreating
                .push((released_s + recreate_after_s(mode), id));
        }
        let (due, later): (Vec<_>, Vec<_>) =
            self.recreating.drain(..).partition(|&(t, _)| t <= now_s);
        self.recreating = later;
        for (_, id) in due {
            if let Some(entry) = self.job_to_entry.get(&id) {
                let key = entry.spec.queue_key();
                self.queue.push(id, key);
            }
        }
    }

    /// Sets what a node failure stops of job `id` (see [`StopPolicy`]).
    pub fn set_stop_policy(&mut self, id: JobId, policy: StopPolicy) {
        match policy {
            StopPolicy::Whole => self.job_to_stop_policy.remove(&id),
            StopPolicy::Pod => self.job_to_stop_policy.insert(id, policy),
        };
    }

    /// What a node failure stops of job `id`.
    pub fn stop_policy(&self, id: JobId) -> StopPolicy {
        self.job_to_stop_policy
            .get(&id)
            .copied()
            .unwrap_or_default()
    }

    /// When the next stopped job moves on (see [`Scheduler::stopped_jobs_due`]): a virtual
    /// clock steps then.
    pub fn next_restart_s(&self) -> Option<f64> {
        self.halted
            .iter()
            .chain(&self.recreating)
            .map(|&(t, _)| t)
            .min_by(f64::total_cmp)
    }

    /// The nodes `id` avoids now because they failed under it.
    pub fn bad_nodes(&self, id: JobId, now_s: f64) -> Vec<usize> {
        self.job_to_bad_nodes.get(&id).map_or_else(Vec::new, |bad| {
            bad.iter()
                .filter(|b| b.until_s > now_s)
                .map(|b| b.node)
                .collect()
        })
    }

    /// The nodes `id` avoids because they failed under it, each with until when: what a
    /// live cluster hands on to the job of the stopped gang's recreated pods.
    pub fn avoided(&self, id: JobId) -> &[BadNode] {
        self.job_to_bad_nodes.get(&id).map_or(&[], Vec::as_slice)
    }

    /// `id` is the recreated pods of a gang a node failure stopped (see
    /// [`RestartBy::Recreated`]): it is tried before any other job in the next cycle and
    /// avoids `bad` (the stopped job's [`Scheduler::avoided`]) while each lasts.
    pub fn restarted(&mut self, id: JobId, bad: Vec<BadNode>) {
        if !self.job_to_entry.contains_key(&id) {
            return;
        }
        if !bad.is_empty() {
            self.job_to_bad_nodes.insert(id, bad);
        }
        if !self.restart_first.contains(&id) {
            self.restart_first.push(id);
        }
    }

    /// The stops decided since the last cycle, for that cycle's output.
    pub(super) fn take_stops(&mut self) -> (Vec<Decision>, Vec<JobId>) {
        (
            std::mem::take(&mut self.stops),
            std::mem::take(&mut self.stopped_jobs),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::{JobSpec, SchedulerConfig};
    use super::*;
    use crate::hooks::BuiltinOnly;
    use crate::symbols::Symbols;

    /// Two 8-GPU nodes, `node-0` and `node-1`, in one rack, and one queue.
    fn scheduler(config: SchedulerConfig) -> Scheduler {
        crate::fixtures::one_rack(&Symbols::new(), 2, 16, None, config)
    }

    fn job(s: &Scheduler, name: &str) -> JobSpec {
        crate::fixtures::job(s, name)
    }

    #[test]
    fn a_stopped_job_remembers_what_the_node_reported_and_when_and_runs_elsewhere() {
        let mut s = scheduler(SchedulerConfig::default());
        let id = s.submit(job(&s, "train"));
        s.cycle(0.0, &mut BuiltinOnly);
        let node = s.slots(id)[0].node as usize;
        let failure = s.node_failed(node, "Xid 79 (GPU fell off the bus)", 30.0);
        assert_eq!(failure.stopped, [id]);
        let avoid_s = s.lifecycle().config.avoid_s;
        assert_eq!(
            s.avoided(id),
            [BadNode {
                node,
                until_s: 30.0 + avoid_s,
                cause: "Xid 79 (GPU fell off the bus)".into(),
                at_s: 30.0,
            }]
        );
        // Restarted, it runs on the other node and still says why it restarted.
        let out = s.cycle(31.0, &mut BuiltinOnly);
        assert!(out.decisions.iter().any(|d| d.job == id && d.placed));
        assert_ne!(s.slots(id)[0].node as usize, node);
        assert_eq!(s.avoided(id)[0].cause, "Xid 79 (GPU fell off the bus)");
    }

    #[test]
    fn recreated_pods_inherit_the_bad_nodes_with_their_cause() {
        let mut s = scheduler(SchedulerConfig {
            restart: RestartBy::Recreated,
            ..SchedulerConfig::default()
        });
        let stopped = s.submit(job(&s, "train"));
        s.cycle(0.0, &mut BuiltinOnly);
        let node = s.slots(stopped)[0].node as usize;
        s.node_failed(node, "condition GpuXidError=True (Xid79)", 30.0);
        let bad = s.avoided(stopped).to_vec();
        // What a live cluster does once the evicted pods are gone and recreated: a new job.
        s.finish(stopped);
        let again = s.submit(job(&s, "train"));
        s.restarted(again, bad);
        assert_eq!(s.avoided(again).len(), 1);
        let inherited = &s.avoided(again)[0];
        assert_eq!(
            (inherited.node, inherited.cause.as_str(), inherited.at_s),
            (node, "condition GpuXidError=True (Xid79)", 30.0)
        );
        s.cycle(40.0, &mut BuiltinOnly);
        assert_ne!(
            s.slots(again)[0].node as usize,
            node,
            "avoids the failed node"
        );
    }
}
