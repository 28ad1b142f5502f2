//! When and where a job would start: the cluster's free resources as running jobs end
//! ([`Timeline`]), what planned jobs claim of each node ([`Claim`]), and the walk that finds a
//! job's earliest start around those claims (`Scheduler::earliest_start`).

use super::*;

/// What a planned job takes of one node, and when: from its planned start to its expected end
/// (start plus its p50 runtime). Later jobs plan around it, and may run there before it
/// starts or beside it, never in its way once a reservation holds it: conservative backfill,
/// per node and per resource rather than whole nodes held forever.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(in crate::scheduler) struct Claim {
    pub(super) node: u32,
    /// Its owner (`rank.id`) and the owner's place in the order cycles try jobs in: only jobs
    /// behind it plan around it, and only they are held off its nodes.
    pub(super) rank: Rank,
    pub(super) start_s: f64,
    pub(super) end_s: f64,
    /// `[gpus, cpu, memory]` its pods take there.
    pub(super) takes: [u32; 3],
    /// What the node has left beyond this claim (and the claims planned before it) at its
    /// start, by the plan: the most a job running across the start may hold there.
    pub(super) spare: [u32; 3],
    /// Whether a reservation holds it. Only then is a job behind kept from running across
    /// its start (the backfill rule); without one, a job behind that fits first is placed
    /// first, as a cycle would, and the owner waits.
    pub(super) held: bool,
}

/// Where and when a job would start: its pods per node, its start (p10, p50, p90) and, per
/// chosen node, what is left there beyond it at that start; and what each pod takes and for
/// how long (p50), which its claims last.
pub(super) struct Planned {
    pub(super) node_pods: Vec<(usize, u32)>,
    pub(super) start: (f64, f64, f64),
    pub(super) spare: Vec<[u32; 3]>,
    pub(super) needs: [u32; 3],
    pub(super) runtime_s: f64,
}

impl Planned {
    /// `node_pods` from `start`, each pod taking `needs` for `runtime_s`; what each chosen
    /// node keeps beside it is what `free` has there beyond what is `claimed`.
    fn new(
        node_pods: Vec<(usize, u32)>,
        start: (f64, f64, f64),
        (free, claimed): (&[[u32; 3]], &[[u32; 3]]),
        needs: [u32; 3],
        runtime_s: f64,
    ) -> Self {
        let spare = node_pods
            .iter()
            .map(|&(node, pods)| {
                minus(
                    minus(free[node], claimed[node]),
                    needs.map(|need| need.saturating_mul(pods)),
                )
            })
            .collect();
        Self {
            node_pods,
            start,
            spare,
            needs,
            runtime_s,
        }
    }

    pub(super) fn nodes(&self) -> Vec<usize> {
        self.node_pods.iter().map(|&(node, _)| node).collect()
    }

    /// Its claims, as the job of `rank`, `held` by a reservation or not.
    pub(super) fn claims(&self, rank: Rank, held: bool) -> Vec<Claim> {
        self.node_pods
            .iter()
            .zip(&self.spare)
            .map(|(&(node, pods), &spare)| Claim {
                node: node as u32,
                rank,
                start_s: self.start.1,
                end_s: self.start.1 + self.runtime_s,
                takes: self.needs.map(|need| need.saturating_mul(pods)),
                spare,
                held,
            })
            .collect()
    }
}

/// `a − b`, per resource, floored at zero.
pub(super) fn minus(a: [u32; 3], b: [u32; 3]) -> [u32; 3] {
    [0, 1, 2].map(|k| a[k].saturating_sub(b[k]))
}

/// The cluster's free resources now and as running jobs end (by estimated end): what every
/// start estimate of one replan walks, built once per replan instead of a cluster copy per job.
#[derive(Debug, Clone, Default)]
pub(in crate::scheduler) struct Timeline {
    /// Per node: free whole GPUs, CPU (milli) and memory (MiB) now, balloons' counted free.
    pub(super) free_now: Vec<[u32; 3]>,
    /// Running jobs by estimated end (p50).
    pub(super) steps: Vec<Step>,
    /// What the steps give back, per node: one list for all of them (a list per running job
    /// was thousands of allocations per replan), each step its own range of it.
    pub(super) node_frees: Vec<(u32, [u32; 3])>,
}

impl Timeline {
    /// What `step` gives back, per node.
    pub(super) fn frees(&self, step: &Step) -> &[(u32, [u32; 3])] {
        &self.node_frees[step.frees.clone()]
    }
}

/// One running job's end: when (p10, p50, p90) and what it gives back (a range of
/// [`Timeline::node_frees`]).
#[derive(Debug, Clone)]
pub(super) struct Step {
    pub(super) p10_s: f64,
    pub(super) p50_s: f64,
    pub(super) p90_s: f64,
    pub(super) frees: std::ops::Range<usize>,
    /// The ending job's queue and the GPUs its quota gives back: when a job blocked by quota
    /// is expected to be admitted.
    pub(super) queue: QueueId,
    pub(super) gpus: u64,
}

/// What a replan knows of one pod shape, shared by the waiting jobs of that shape: the nodes
/// it may ever run on, and (once a job of it first fits) the built-in scores of the nodes.
pub(super) struct ShapeView {
    pub(super) key: ShapeKey,
    pub(super) eligible: Vec<bool>,
    pub(super) scores: std::cell::OnceCell<Vec<u64>>,
    /// Pods of the shape each node holds now, and their sum, before any claim: the same for
    /// every job of the shape, so counted once per replan, not once per job.
    pub(super) capacity_now: std::cell::OnceCell<(Vec<u32>, u64)>,
}

/// What one pod of `shape` takes of a node's `[gpus, cpu, memory]` (a fractional pod is
/// planned as a whole GPU: the plan errs late, never early).
pub(super) fn pod_needs(shape: &crate::PodShape) -> [u32; 3] {
    let gpus = if shape.gpu_milli > 0 { 1 } else { shape.gpus };
    [gpus, shape.cpu_milli, shape.memory_mib]
}

impl ShapeView {
    /// The same shape on `nodes` alone (those of them it may run on): where a reservation
    /// already is, to keep it there when no other nodes start it sooner.
    pub(super) fn only(&self, nodes: &[usize]) -> ShapeView {
        let mut eligible = vec![false; self.eligible.len()];
        for &node in nodes {
            if let Some(e) = eligible.get_mut(node) {
                *e = self.eligible[node];
            }
        }
        ShapeView {
            key: self.key.clone(),
            eligible,
            // The scores are the shape's, wherever it may run; the capacities are counted
            // over the eligible nodes, so again.
            scores: self.scores.clone(),
            capacity_now: std::cell::OnceCell::new(),
        }
    }
}

/// What a shape's eligibility, scores and capacities depend on: GPU type, tolerations, GPUs,
/// milli-GPUs, CPU and memory, node affinity and other resources.
pub(super) type ShapeKey = (
    crate::Sym,
    Vec<crate::Toleration>,
    [u32; 4],
    Option<std::sync::Arc<crate::NodeAffinity>>,
    Vec<(crate::Sym, u32)>,
);

/// What a shape's eligibility and scores depend on.
pub(super) fn shape_key(shape: &crate::PodShape) -> ShapeKey {
    (
        shape.gpu_type,
        shape.tolerations.clone(),
        [
            shape.gpus,
            shape.gpu_milli,
            shape.cpu_milli,
            shape.memory_mib,
        ],
        shape.node_affinity.clone(),
        shape.resources.clone(),
    )
}

/// Pods of `needs` that `free` holds.
pub(super) fn pods_in(free: [u32; 3], needs: [u32; 3]) -> u32 {
    (0..3)
        .map(|k| free[k].checked_div(needs[k]).unwrap_or(u32::MAX))
        .min()
        .unwrap_or(0)
}

impl Scheduler {
    /// Free resources from now on, as the running jobs end by their estimates (a job past its
    /// estimate is expected to end soon, not in the past). Balloons give way, so what they
    /// hold counts as free now.
    pub(in crate::scheduler) fn timeline(&self, now_s: f64) -> Timeline {
        let t = &self.state.nodes;
        let mut free_now: Vec<[u32; 3]> = (0..self.state.len())
            .map(|i| [t.gpu_free[i], t.cpu_free_milli[i], t.memory_free_mib[i]])
            .collect();
        let mut steps = Vec::new();
        let mut node_frees: Vec<(u32, [u32; 3])> = Vec::new();
        // Every entry, not a lookup per running job: the running are about half of them, and
        // a walk of the map costs less than that many lookups.
        for entry in self.job_to_entry.values() {
            let JobState::Running {
                started_s, slots, ..
            } = &entry.state
            else {
                continue;
            };
            let shape = &entry.spec.shape;
            // A fractional pod frees a whole GPU only when its GPU empties: planned as none.
            let gives = [
                if shape.gpu_milli > 0 { 0 } else { shape.gpus },
                shape.cpu_milli,
                shape.memory_mib,
            ];
            if entry.spec.balloon {
                for slot in slots {
                    let free = &mut free_now[slot.node as usize];
                    (0..3).for_each(|k| free[k] += gives[k]);
                }
                continue;
            }
            let from = node_frees.len();
            for slot in slots {
                match node_frees[from..]
                    .iter_mut()
                    .find(|(node, _)| *node == slot.node)
                {
                    Some((_, sum)) => (0..3).for_each(|k| sum[k] += gives[k]),
                    None => node_frees.push((slot.node, gives)),
                }
            }
            let (p10_s, p50_s, p90_s) = self.expected_end(&entry.spec, *started_s, now_s);
            steps.push(Step {
                p10_s,
                p50_s,
                p90_s,
                frees: from..node_frees.len(),
                queue: entry.spec.queue,
                gpus: entry.spec.total().gpus,
            });
        }
        // Stable: equal ends keep job order.
        steps.sort_by(|a, b| a.p50_s.total_cmp(&b.p50_s));
        Timeline {
            free_now,
            steps,
            node_frees,
        }
    }

    /// Per node, whether a pod of `shape` may ever run there (healthy, its GPU type, its
    /// taints tolerated): what no job ending can change. Scores come when first asked for.
    pub(super) fn shape_view(&self, shape: &crate::PodShape) -> ShapeView {
        let t = &self.state.nodes;
        ShapeView {
            key: shape_key(shape),
            eligible: (0..self.state.len())
                .map(|i| {
                    t.health[i] == crate::Health::Healthy as u8
                        && (shape.gpu_type == 0 || shape.gpu_type == t.gpu_type[i])
                        && shape.tolerates_all(t.taints(i))
                        && shape.node_allowed(t, i)
                        && shape.lacking_resource(t, i) != Some(usize::MAX)
                })
                .collect(),
            scores: std::cell::OnceCell::new(),
            capacity_now: std::cell::OnceCell::new(),
        }
    }

    /// Where `spec` would start and when (p10, p50, p90), as running jobs end in estimated
    /// order, planning around `claims` (a node's claimed resources are kept from `spec` until
    /// the claim ends, from `spec`'s expected runtime before the claim starts when a
    /// reservation holds it, else from its start). Walks
    /// `timeline` and the claims' edges, updating only the nodes each changes; places (the
    /// same smallest-domain rule as a cycle) only once enough pods fit in total. `None` when
    /// it would not fit even once every job ended.
    pub(super) fn earliest_start(
        &self,
        spec: &JobSpec,
        timeline: &Timeline,
        view: &ShapeView,
        claims: &[Claim],
        now_s: f64,
    ) -> Option<Planned> {
        let eligible = &view.eligible;
        let n = timeline.free_now.len();
        let needs = pod_needs(&spec.shape);
        let need = u64::from(spec.pods);
        let runtime_s = self.plan.runtimes.estimate(spec).p50_s;
        let mut free = timeline.free_now.clone();
        // Per node: what claims keep from `spec` if it started now, and the nodes they are on.
        let mut claimed = vec![[0u32; 3]; n];
        let mut claimed_now: Vec<usize> = Vec::new();
        // Claims' edges after now: (when, claim, whether it starts keeping resources).
        let mut edges: Vec<(f64, usize, bool)> = Vec::new();
        for (index, claim) in claims.iter().enumerate() {
            // A held claim keeps `spec` off from its expected runtime before the start; one not
            // held, only from the start (before it, the owner does not fit, and `spec` may).
            let from = if claim.held {
                claim.start_s - runtime_s
            } else {
                claim.start_s
            };
            let until = claim.end_s;
            if until <= now_s || claim.node as usize >= n {
                continue;
            }
            if from <= now_s {
                let c = &mut claimed[claim.node as usize];
                (0..3).for_each(|k| c[k] = c[k].saturating_add(claim.takes[k]));
                claimed_now.push(claim.node as usize);
            } else {
                edges.push((from, index, true));
            }
            edges.push((until, index, false));
        }
        edges.sort_by(|a, b| a.0.total_cmp(&b.0));
        let pods_at = |free: &[[u32; 3]], claimed: &[[u32; 3]], i: usize| {
            if eligible[i] {
                pods_in(minus(free[i], claimed[i]), needs)
            } else {
                0
            }
        };
        let (capacity_now, total_now) = view.capacity_now.get_or_init(|| {
            let unclaimed = vec![[0u32; 3]; n];
            let capacity: Vec<u32> = (0..n).map(|i| pods_at(&free, &unclaimed, i)).collect();
            let total = capacity.iter().map(|&c| u64::from(c)).sum();
            (capacity, total)
        });
        let (mut capacity, mut total) = (capacity_now.clone(), *total_now);
        for node in claimed_now {
            let pods = pods_at(&free, &claimed, node);
            total = total - u64::from(capacity[node]) + u64::from(pods);
            capacity[node] = pods;
        }
        let try_place = |capacity: &[u32], total: u64| -> Option<Vec<(usize, u32)>> {
            if total < need {
                return None;
            }
            let scores = view
                .scores
                .get_or_init(|| crate::scheduler::place::builtin_view(spec, &self.state).1);
            self.place(spec, capacity, scores).map(|p| p.node_pods)
        };
        let planned = |node_pods, start, free: &[[u32; 3]], claimed: &[[u32; 3]]| {
            Planned::new(node_pods, start, (free, claimed), needs, runtime_s)
        };
        if let Some(node_pods) = try_place(&capacity, total) {
            return Some(planned(node_pods, (now_s, now_s, now_s), &free, &claimed));
        }
        let steps = &timeline.steps;
        let (mut i, mut e) = (0, 0);
        let mut touched: Vec<usize> = Vec::new();
        while i < steps.len() || e < edges.len() {
            // Every job ending (and every claim edge) at the same time changes nodes together.
            let at = steps
                .get(i)
                .map_or(f64::INFINITY, |s| s.p50_s)
                .min(edges.get(e).map_or(f64::INFINITY, |edge| edge.0));
            touched.clear();
            while i < steps.len() && steps[i].p50_s <= at {
                for &(node, gives) in timeline.frees(&steps[i]) {
                    let node = node as usize;
                    (0..3).for_each(|k| free[node][k] += gives[k]);
                    touched.push(node);
                }
                i += 1;
            }
            while e < edges.len() && edges[e].0 <= at {
                let (_, index, keeps) = edges[e];
                let claim = &claims[index];
                let c = &mut claimed[claim.node as usize];
                (0..3).for_each(|k| {
                    c[k] = if keeps {
                        c[k].saturating_add(claim.takes[k])
                    } else {
                        c[k].saturating_sub(claim.takes[k])
                    }
                });
                touched.push(claim.node as usize);
                e += 1;
            }
            for &node in &touched {
                let pods = pods_at(&free, &claimed, node);
                total = total - u64::from(capacity[node]) + u64::from(pods);
                capacity[node] = pods;
            }
            if let Some(node_pods) = try_place(&capacity, total) {
                // The interval: the jobs that had to end are those that held a chosen node.
                let mut chosen = vec![false; n];
                node_pods.iter().for_each(|&(node, _)| chosen[node] = true);
                let mut start = (now_s, at, at);
                for step in &steps[..i] {
                    if timeline
                        .frees(step)
                        .iter()
                        .any(|&(node, _)| chosen[node as usize])
                    {
                        start.0 = start.0.max(step.p10_s);
                        start.2 = start.2.max(step.p90_s);
                    }
                }
                start.0 = start.0.min(start.1);
                start.2 = start.2.max(start.1);
                return Some(planned(node_pods, start, &free, &claimed));
            }
        }
        None
    }
}
