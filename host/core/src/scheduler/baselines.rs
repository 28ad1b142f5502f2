//! The anchors Gantry is measured against, emulated on the same state: stock kube-scheduler
//! (`k8s-default`: pod by pod, no gang awareness) and kube-scheduler with the Coscheduling
//! plugin (pods assumed one at a time, released at the permit timeout). Built-in filter only;
//! no quota, no topology, no preemption, no parking.

use std::collections::BTreeMap;

use crate::builtin;
use crate::explain::{FilterExplain, Outcome};

use super::{CycleOutput, Decision, JobState, Scheduler};

impl Scheduler {
    /// The baselines' cycle: each pending pod in priority-then-FIFO order takes the emptiest
    /// node that fits it.
    pub(super) fn cycle_pod_by_pod(
        &mut self,
        now_s: f64,
        permit_timeout_s: Option<f64>,
    ) -> CycleOutput {
        let mut order = self.queue.all();
        let jobs = &self.job_to_entry;
        order.sort_by(|&a, &b| {
            let (a_spec, b_spec) = (&jobs[&a].spec, &jobs[&b].spec);
            b_spec
                .priority
                .cmp(&a_spec.priority)
                .then(a_spec.submit_s.total_cmp(&b_spec.submit_s))
                .then(a.cmp(&b))
        });
        order.truncate(self.config.max_attempts);
        let mut out = CycleOutput::default();
        for (position, id) in order.into_iter().enumerate() {
            out.attempts += 1;
            let spec = self.job_to_entry[&id].spec.clone();
            let entry = self.job_to_entry.get_mut(&id).expect("a pending job");
            let (mut slots, since_s) = match std::mem::replace(&mut entry.state, JobState::Pending)
            {
                JobState::Holding { slots, since_s } => (slots, since_s),
                JobState::Pending => (Vec::new(), now_s),
                other => {
                    entry.state = other;
                    continue;
                }
            };
            self.running.remove(&id);
            let mut explanation = self.blank_explanation(&spec, now_s, position as u32);
            while (slots.len() as u32) < spec.pods {
                let codes = builtin::gpu_fit(&spec.shape, &self.state.nodes);
                let scores = builtin::least_allocated(&spec.shape, &self.state.nodes);
                let best = (0..self.state.len())
                    .filter(|&i| codes[i] == 0 && self.state.capacity_for(i, &spec.shape) > 0)
                    .max_by(|&a, &b| scores[a].cmp(&scores[b]).then(b.cmp(&a)));
                match best {
                    Some(node) => slots.push(self.state.reserve(node, &spec.shape)),
                    None => {
                        let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
                        for &code in codes.iter().filter(|&&c| c != 0) {
                            *counts
                                .entry(builtin::FILTER_REASONS[code as usize])
                                .or_default() += 1;
                        }
                        explanation.nodes_feasible =
                            codes.iter().filter(|&&c| c == 0).count() as u32;
                        explanation.filters = vec![FilterExplain {
                            policy: "builtin".into(),
                            rejected: counts
                                .into_iter()
                                .map(|(r, c)| (r.to_string(), c))
                                .collect(),
                        }];
                        break;
                    }
                }
            }
            if slots.len() as u32 == spec.pods {
                let mut node_pods: Vec<(usize, u32)> = Vec::new();
                for slot in &slots {
                    match node_pods.iter_mut().find(|(n, _)| *n == slot.node as usize) {
                        Some((_, pods)) => *pods += 1,
                        None => node_pods.push((slot.node as usize, 1)),
                    }
                }
                explanation.outcome = Outcome::Placed {
                    nodes: node_pods
                        .iter()
                        .map(|&(n, p)| (self.node_name(n), p))
                        .collect(),
                };
                self.start(id, slots);
                out.decisions.push(Decision {
                    job: id,
                    placed: true,
                    placement: node_pods,
                    victims: Vec::new(),
                    explanation,
                });
                continue;
            }
            let timed_out = permit_timeout_s.is_some_and(|timeout| now_s - since_s >= timeout);
            let waiting_for = if timed_out {
                for &slot in &slots {
                    self.state.release(slot, &spec.shape);
                }
                "the permit timeout released the assumed pods; retrying the whole gang".to_string()
            } else {
                let held = slots.len();
                if held > 0 {
                    self.job_to_entry.get_mut(&id).expect("a pending job").state =
                        JobState::Holding { slots, since_s };
                    self.running.insert(id);
                }
                format!(
                    "{} more pods to fit ({held} of {} hold nodes)",
                    spec.pods as usize - held,
                    spec.pods
                )
            };
            explanation.outcome = Outcome::Pending { waiting_for };
            out.decisions.push(Decision {
                job: id,
                placed: false,
                placement: Vec::new(),
                victims: Vec::new(),
                explanation,
            });
        }
        out
    }
}
