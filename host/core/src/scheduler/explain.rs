//! The explanation stage: a decision's blank record, and the plain words for what a job that
//! was not placed waits for.

use crate::explain::{Explanation, Outcome, QuotaExplain};
use crate::model::PodShape;
use crate::queues::Admission;

use super::{JobSpec, Scheduler};

impl Scheduler {
    /// The record of a decision about `spec`, before any stage filled it in.
    pub(super) fn blank_explanation(
        &self,
        spec: &JobSpec,
        now_s: f64,
        position: u32,
    ) -> Explanation {
        Explanation {
            job: spec.name.clone(),
            queue: self.queues.name(spec.queue).to_string(),
            pods: spec.pods,
            gpus_per_pod: spec.shape.gpus,
            priority: spec.priority,
            time_s: now_s,
            outcome: Outcome::Pending {
                waiting_for: String::new(),
            },
            quota: QuotaExplain {
                builtin: Admission::Within,
                policies: Vec::new(),
                fair_share_key: self.queues.fair_share_key(spec.queue),
                position,
            },
            nodes_total: self.state.len() as u32,
            nodes_evaluated: 0,
            nodes_feasible: 0,
            filters: Vec::new(),
            top_nodes: Vec::new(),
            domain: None,
            policy_set: 0,
            policies: Vec::new(),
            preempted: Vec::new(),
            faults: Vec::new(),
            estimate: None,
            preempted_by: None,
        }
    }

    /// The record of a job the cycle evicted for `preemptor`: pending again, waiting for room.
    /// `None` once the job is gone.
    pub fn preempted_explanation(
        &self,
        victim: super::JobId,
        preemptor: &str,
        now_s: f64,
    ) -> Option<Explanation> {
        let spec = self.get(victim)?;
        let mut explanation = self.blank_explanation(spec, now_s, 0);
        explanation.outcome = Outcome::Pending {
            waiting_for: format!("room again: it was preempted to make room for {preemptor}"),
        };
        explanation.preempted_by = Some(preemptor.to_string());
        Some(explanation)
    }

    /// What a job held back by a reservation's quota hold waits for: whose reservation, what
    /// it holds, and why this job may not take it.
    pub(super) fn quota_held_text(&self, owner: super::JobId) -> String {
        let name = self
            .get(owner)
            .map_or("a job ahead", |spec| spec.name.as_str());
        let holds = self
            .start_estimate(owner)
            .and_then(|estimate| estimate.reservation.as_deref())
            .unwrap_or("its quota");
        format!(
            "quota: held for the reservation of {name}, which waited past the age threshold and \
             holds {holds}; this job is expected to run past that reservation's start"
        )
    }

    /// What a job waits for when counting GPUs alone shows it cannot fit, before any node was
    /// evaluated.
    pub(super) fn no_room_text(&self, spec: &JobSpec) -> String {
        format!(
            "{} {} GPU(s) to free up ({} such pods fit in the free GPUs now)",
            spec.pods,
            gpu_text(&spec.shape),
            self.state.pods_fit(spec.shape.gpus)
        )
    }

    /// What a job that was evaluated and not placed waits for.
    pub(super) fn waiting_for_room(
        &self,
        spec: &JobSpec,
        capacity: &[u32],
        explanation: &Explanation,
    ) -> String {
        let pods_fit: u64 = capacity.iter().map(|&c| u64::from(c)).sum();
        if explanation.nodes_feasible == 0 {
            format!("{} {} GPU(s) to free up", spec.pods, gpu_text(&spec.shape))
        } else if spec.topology.required && spec.topology.level.is_some() {
            format!(
                "room for all {} in one {} ({pods_fit} fit across the cluster)",
                crate::explain::count_text(spec.pods, "pod"),
                self.level_name(spec.topology.level.unwrap_or(0))
            )
        } else {
            format!(
                "room for all {} at once ({pods_fit} fit now)",
                crate::explain::count_text(spec.pods, "pod")
            )
        }
    }
}

pub(super) fn gpu_text(shape: &PodShape) -> String {
    if shape.gpu_milli > 0 {
        format!("pod(s) of {}/1000", shape.gpu_milli)
    } else {
        format!("pod(s) of {}", shape.gpus)
    }
}
