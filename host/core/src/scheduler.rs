//! The scheduling cycle: order the pending jobs, then for each one quota, filter, score, place
//! (topology-aware for gangs), preempt if that is what it takes, and reserve. Every attempt
//! yields an [`Explanation`].

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::builtin;
use crate::cluster::{ClusterState, Slot};
use crate::explain::{Explanation, FilterExplain, NodeScore, Outcome, QuotaExplain};
use crate::hooks::{PolicyHooks, Verdict};
use crate::model::{CohortUsage, JobRequest, PodShape, QueueUsage, QuotaVerdict, Resources};
use crate::queues::{Admission, QueueId, Queues};
use crate::symbols::Symbols;

/// Index of a job in the scheduler.
pub type JobId = u32;

/// One evaluated chunk: its nodes, and each score policy's weighted scores for them.
type ChunkScores = (std::ops::Range<usize>, Vec<(String, Vec<u64>)>);

/// Nodes evaluated per policy call. Policies see the cluster a chunk at a time, so a single
/// pod can stop early; a gang always sees every chunk.
pub const CHUNK: usize = 1024;

/// Where a gang wants to run: within one domain of `level` (an index into the node table's
/// levels, innermost first), as a hard requirement or a preference.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologyPref {
    pub level: Option<usize>,
    pub required: bool,
}

/// A job as submitted: a gang of `pods` identical pods (1 for a single pod).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    pub name: String,
    pub queue: QueueId,
    pub priority: i32,
    pub pods: u32,
    pub shape: PodShape,
    /// A placeholder that holds capacity and gives way at once to real work.
    pub balloon: bool,
    pub topology: TopologyPref,
    pub submit_s: f64,
}

impl JobSpec {
    pub fn total(&self) -> Resources {
        let pods = u64::from(self.pods);
        let gpus = if self.shape.gpu_milli > 0 {
            // A fractional pod is charged a whole GPU's quota per 1000 milli, rounded up.
            (u64::from(self.shape.gpu_milli) * pods).div_ceil(1000)
        } else {
            u64::from(self.shape.gpus) * pods
        };
        Resources {
            gpus,
            cpu_milli: u64::from(self.shape.cpu_milli) * pods,
            memory_mib: u64::from(self.shape.memory_mib) * pods,
        }
    }
}

#[derive(Debug, Clone)]
enum JobState {
    Pending,
    Running {
        slots: Vec<Slot>,
    },
    /// The baselines only: some pods hold nodes while their siblings wait (bound and running
    /// under `K8sDefault`, assumed at the permit stage under `Coscheduling`).
    Holding {
        slots: Vec<Slot>,
        since_s: f64,
    },
    Finished,
}

/// How the cycle places jobs: Gantry's way, or as one of the anchors it is measured against.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Whole gangs at once, topology-aware, with quota, fair share and preemption.
    Gantry,
    /// Stock kube-scheduler: one pod at a time, priority then FIFO, least-allocated spreading,
    /// no gang awareness: a gang's placed pods run and hold their GPUs while siblings wait.
    K8sDefault,
    /// kube-scheduler with the scheduler-plugins Coscheduling plugin: pods are assumed one at
    /// a time and wait at the permit stage until the whole gang is assumed; after
    /// `permit_timeout_s` the assumed pods are released and the gang waits again.
    Coscheduling { permit_timeout_s: f64 },
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Gantry => "gantry",
            Mode::K8sDefault => "k8s-default",
            Mode::Coscheduling { .. } => "coscheduling",
        }
    }
}

#[derive(Debug, Clone)]
struct JobEntry {
    spec: JobSpec,
    state: JobState,
}

/// What a cycle did.
#[derive(Debug, Default, Clone)]
pub struct CycleOutput {
    /// One per job attempted, placed or not.
    pub decisions: Vec<Decision>,
    /// Jobs evicted (whole gangs) to make room; they are pending again.
    pub evicted: Vec<JobId>,
}

#[derive(Debug, Clone)]
pub struct Decision {
    pub job: JobId,
    pub placed: bool,
    pub explanation: Explanation,
}

/// Knobs of the cycle.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Most jobs attempted per cycle; the rest wait for the next cycle.
    pub max_attempts: usize,
    /// Top nodes kept in an explanation.
    pub top_nodes: usize,
    pub preemption: bool,
    pub mode: Mode,
    /// A single pod is placed once this many feasible nodes are found (or 5% of the cluster,
    /// if more), like kube-scheduler's minFeasibleNodesToFind.
    pub min_feasible_nodes: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_attempts: 1000,
            top_nodes: 5,
            preemption: true,
            mode: Mode::Gantry,
            min_feasible_nodes: 100,
        }
    }
}

/// The pure scheduler: cluster, queues and jobs, driven by [`Scheduler::cycle`].
#[derive(Clone)]
pub struct Scheduler {
    pub state: ClusterState,
    pub queues: Queues,
    pub config: SchedulerConfig,
    symbols: Arc<Symbols>,
    jobs: Vec<JobEntry>,
    /// Pending job ids; reordered at the start of every cycle.
    pending: Vec<JobId>,
    /// GPUs held by jobs whose every pod runs: the allocation that does work.
    running_gpus: u64,
    /// The chunk the next single pod starts evaluating at, so decisions spread their reads
    /// over the cluster. A `Cell` because evaluation borrows the scheduler immutably.
    next_chunk: std::cell::Cell<usize>,
}

/// A placement found for a job: the pods per node, and the domain it fits in.
struct Placement {
    node_pods: Vec<(usize, u32)>,
    domain: Option<String>,
}

impl Scheduler {
    pub fn new(
        state: ClusterState,
        queues: Queues,
        symbols: Arc<Symbols>,
        config: SchedulerConfig,
    ) -> Self {
        Self {
            state,
            queues,
            config,
            symbols,
            jobs: Vec::new(),
            pending: Vec::new(),
            running_gpus: 0,
            next_chunk: std::cell::Cell::new(0),
        }
    }

    /// GPUs held by jobs whose every pod is running (not by the baselines' partial gangs).
    pub fn running_gpus(&self) -> u64 {
        self.running_gpus
    }

    /// Jobs with some but not all pods running: only `K8sDefault` ever has any.
    pub fn partially_running(&self) -> impl Iterator<Item = JobId> + '_ {
        let bound = self.config.mode == Mode::K8sDefault;
        (0..self.jobs.len() as JobId).filter(move |&id| {
            bound && matches!(self.jobs[id as usize].state, JobState::Holding { .. })
        })
    }

    pub fn symbols(&self) -> &Arc<Symbols> {
        &self.symbols
    }

    pub fn submit(&mut self, spec: JobSpec) -> JobId {
        let id = self.jobs.len() as JobId;
        self.jobs.push(JobEntry {
            spec,
            state: JobState::Pending,
        });
        self.pending.push(id);
        id
    }

    /// A job that already runs on `nodes` (one entry per pod), as a live cluster's bound pods
    /// are found: reserved, charged to its queue, and preemptable like a job the cycle placed.
    /// The caller checked each node's room with [`ClusterState::capacity_for`].
    pub fn adopt(&mut self, spec: JobSpec, nodes: &[usize]) -> JobId {
        let slots = nodes
            .iter()
            .map(|&node| self.state.reserve(node, &spec.shape))
            .collect();
        if !spec.balloon {
            self.queues.charge(spec.queue, spec.total(), true);
        }
        self.running_gpus += spec.total().gpus;
        let id = self.jobs.len() as JobId;
        self.jobs.push(JobEntry {
            spec,
            state: JobState::Running { slots },
        });
        id
    }

    pub fn job(&self, id: JobId) -> &JobSpec {
        &self.jobs[id as usize].spec
    }

    pub fn pending(&self) -> &[JobId] {
        &self.pending
    }

    pub fn is_running(&self, id: JobId) -> bool {
        matches!(self.jobs[id as usize].state, JobState::Running { .. })
    }

    /// The slots of a running job, or of a baseline's partly placed one.
    pub fn slots(&self, id: JobId) -> &[Slot] {
        match &self.jobs[id as usize].state {
            JobState::Running { slots } | JobState::Holding { slots, .. } => slots,
            _ => &[],
        }
    }

    pub fn running(&self) -> impl Iterator<Item = JobId> + '_ {
        (0..self.jobs.len() as JobId).filter(|&id| self.is_running(id))
    }

    /// A job ends (or is withdrawn): free its nodes and its quota.
    pub fn finish(&mut self, id: JobId) {
        self.release(id);
        self.jobs[id as usize].state = JobState::Finished;
        self.pending.retain(|&p| p != id);
    }

    fn release(&mut self, id: JobId) {
        let entry = &mut self.jobs[id as usize];
        match std::mem::replace(&mut entry.state, JobState::Pending) {
            JobState::Running { slots } => {
                for slot in slots {
                    self.state.release(slot, &entry.spec.shape);
                }
                self.running_gpus -= entry.spec.total().gpus;
                if !entry.spec.balloon {
                    self.queues
                        .charge(entry.spec.queue, entry.spec.total(), false);
                }
            }
            JobState::Holding { slots, .. } => {
                for slot in slots {
                    self.state.release(slot, &entry.spec.shape);
                }
            }
            other => entry.state = other,
        }
    }

    /// Evict a running job (all of its pods) back to pending.
    fn evict(&mut self, id: JobId) {
        self.release(id);
        self.pending.push(id);
    }

    /// The cycle `hooks` would run now, on a copy: nothing is placed, evicted or charged.
    /// Run it before the real cycle to shadow a candidate policy set on the same state.
    pub fn shadow_cycle(&self, now_s: f64, hooks: &mut dyn PolicyHooks) -> CycleOutput {
        self.clone().cycle(now_s, hooks)
    }

    /// One scheduling cycle at time `now_s`.
    pub fn cycle(&mut self, now_s: f64, hooks: &mut dyn PolicyHooks) -> CycleOutput {
        match self.config.mode {
            Mode::Gantry => self.cycle_gantry(now_s, hooks),
            Mode::K8sDefault => self.cycle_pod_by_pod(now_s, None),
            Mode::Coscheduling { permit_timeout_s } => {
                self.cycle_pod_by_pod(now_s, Some(permit_timeout_s))
            }
        }
    }

    /// The baselines' cycle: each pending pod in priority-then-FIFO order takes the emptiest
    /// node that fits it. Built-in filter only; no quota, no topology, no preemption.
    fn cycle_pod_by_pod(&mut self, now_s: f64, permit_timeout_s: Option<f64>) -> CycleOutput {
        let jobs = &self.jobs;
        self.pending.sort_by(|&a, &b| {
            let (a, b) = (&jobs[a as usize].spec, &jobs[b as usize].spec);
            b.priority
                .cmp(&a.priority)
                .then(a.submit_s.total_cmp(&b.submit_s))
        });
        let mut out = CycleOutput::default();
        let attempts = self.attempts();
        for (position, id) in attempts.into_iter().enumerate() {
            let spec = self.jobs[id as usize].spec.clone();
            let (mut slots, since_s) =
                match std::mem::replace(&mut self.jobs[id as usize].state, JobState::Pending) {
                    JobState::Holding { slots, since_s } => (slots, since_s),
                    JobState::Pending => (Vec::new(), now_s),
                    other => {
                        self.jobs[id as usize].state = other;
                        continue;
                    }
                };
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
                        let mut counts: std::collections::BTreeMap<&str, u32> = Default::default();
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
                        .into_iter()
                        .map(|(n, p)| (self.node_name(n), p))
                        .collect(),
                };
                self.running_gpus += spec.total().gpus;
                self.queues.charge(spec.queue, spec.total(), true);
                self.jobs[id as usize].state = JobState::Running { slots };
                self.pending.retain(|&p| p != id);
                out.decisions.push(Decision {
                    job: id,
                    placed: true,
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
                    self.jobs[id as usize].state = JobState::Holding { slots, since_s };
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
                explanation,
            });
        }
        out
    }

    /// The pending jobs this cycle tries, in order.
    fn attempts(&self) -> Vec<JobId> {
        self.pending
            .iter()
            .take(self.config.max_attempts)
            .copied()
            .collect()
    }

    fn blank_explanation(&self, spec: &JobSpec, now_s: f64, position: u32) -> Explanation {
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
        }
    }

    fn cycle_gantry(&mut self, now_s: f64, hooks: &mut dyn PolicyHooks) -> CycleOutput {
        self.queues.decay_to(now_s);
        let queues = &self.queues;
        let jobs = &self.jobs;
        self.pending.sort_by(|&a, &b| {
            let (a, b) = (&jobs[a as usize].spec, &jobs[b as usize].spec);
            b.priority
                .cmp(&a.priority)
                .then(
                    queues
                        .fair_share_key(a.queue)
                        .total_cmp(&queues.fair_share_key(b.queue)),
                )
                .then(a.submit_s.total_cmp(&b.submit_s))
        });
        let policies = hooks.policies();
        let set_version = hooks.set_version();
        let mut out = CycleOutput::default();
        let attempts = self.attempts();
        for (position, id) in attempts.into_iter().enumerate() {
            if !matches!(self.jobs[id as usize].state, JobState::Pending) {
                continue;
            }
            let (placed, mut explanation, evicted) =
                self.attempt(id, now_s, position as u32, hooks);
            explanation.policy_set = set_version;
            explanation.policies.clone_from(&policies);
            out.evicted.extend(evicted);
            out.decisions.push(Decision {
                job: id,
                placed,
                explanation,
            });
        }
        out
    }

    fn attempt(
        &mut self,
        id: JobId,
        now_s: f64,
        position: u32,
        hooks: &mut dyn PolicyHooks,
    ) -> (bool, Explanation, Vec<JobId>) {
        let spec = self.jobs[id as usize].spec.clone();
        let total = spec.total();
        let mut explanation = self.blank_explanation(&spec, now_s, position);
        let pending = |explanation: &mut Explanation, waiting_for: String| {
            explanation.outcome = Outcome::Pending { waiting_for };
        };

        // Quota: the built-in hierarchy, then every quota policy. Balloons hold idle capacity
        // and are not charged against quota.
        let admission = if spec.balloon {
            Admission::Within
        } else {
            self.queues.admission(spec.queue, total.gpus)
        };
        explanation.quota.builtin = admission.clone();
        if let Admission::Denied { reason } = &admission {
            let reason = reason.clone();
            pending(&mut explanation, format!("quota: {reason}"));
            return (false, explanation, Vec::new());
        }
        if !spec.balloon {
            let request = JobRequest {
                pod: spec.shape.clone(),
                count: spec.pods,
                total,
            };
            let (queue, cohort) = self.usage(spec.queue);
            for (policy, verdict) in hooks.admit(&request, &queue, cohort.as_ref()) {
                let text = match verdict {
                    Verdict::Answer(QuotaVerdict::Admit) => "admit".to_string(),
                    Verdict::Answer(QuotaVerdict::AdmitBorrowing { borrowed }) => {
                        format!("admit, borrowing {} GPUs", borrowed.gpus)
                    }
                    Verdict::Answer(QuotaVerdict::Deny { reason }) => {
                        explanation
                            .quota
                            .policies
                            .push((policy.clone(), format!("deny: {reason}")));
                        pending(&mut explanation, format!("quota policy {policy}: {reason}"));
                        return (false, explanation, Vec::new());
                    }
                    Verdict::Skipped(fault) => {
                        explanation.faults.push(format!("{policy}: {fault}"));
                        format!("skipped: {fault}")
                    }
                    Verdict::Rejected(fault) => {
                        explanation.faults.push(format!("{policy}: {fault}"));
                        explanation
                            .quota
                            .policies
                            .push((policy.clone(), format!("faulted: {fault}")));
                        pending(
                            &mut explanation,
                            format!("quota policy {policy} faulted: {fault}"),
                        );
                        return (false, explanation, Vec::new());
                    }
                };
                explanation.quota.policies.push((policy, text));
            }
        }

        // Filter and score, then place.
        let (capacity, scores) = self.evaluate(&spec, hooks, &mut explanation);
        if let Some(placement) = self.place(&spec, &capacity, &scores) {
            self.commit(id, &spec, placement, &mut explanation);
            return (true, explanation, Vec::new());
        }

        // Preemption: make room by evicting whole gangs that may give way to this job.
        if self.config.preemption
            && let Some(victims) = self.find_victims(&spec)
        {
            for &victim in &victims {
                explanation
                    .preempted
                    .push(self.jobs[victim as usize].spec.name.clone());
                self.evict(victim);
            }
            let (capacity, scores) = self.evaluate(&spec, hooks, &mut explanation);
            if let Some(placement) = self.place(&spec, &capacity, &scores) {
                self.commit(id, &spec, placement, &mut explanation);
                return (true, explanation, victims);
            }
            pending(
                &mut explanation,
                "the nodes freed by preemption (a policy rejected them)".into(),
            );
            return (false, explanation, victims);
        }
        let feasible = explanation.nodes_feasible;
        let pods_fit: u64 = capacity.iter().map(|&c| u64::from(c)).sum();
        let waiting_for = if feasible == 0 {
            format!("{} {} GPU(s) to free up", spec.pods, gpu_text(&spec.shape))
        } else if spec.topology.required && spec.topology.level.is_some() {
            format!(
                "room for all {} pods in one {} ({pods_fit} fit across the cluster)",
                spec.pods,
                self.level_name(spec.topology.level.unwrap_or(0))
            )
        } else {
            format!(
                "room for all {} pods at once ({pods_fit} fit now)",
                spec.pods
            )
        };
        pending(&mut explanation, waiting_for);
        (false, explanation, Vec::new())
    }

    /// Run every filter and score; the pods of `spec`'s shape each node takes (0 where
    /// filtered out or not evaluated) and each node's total score.
    ///
    /// Nodes are evaluated a chunk of [`CHUNK`] at a time. A gang sees every chunk (topology
    /// placement needs the whole picture). A single pod stops once enough feasible nodes are
    /// found, starting each decision where the last one stopped, as kube-scheduler does with
    /// `percentageOfNodesToScore`: a pod that fits is placed without paying for every node.
    fn evaluate(
        &self,
        spec: &JobSpec,
        hooks: &mut dyn PolicyHooks,
        explanation: &mut Explanation,
    ) -> (Vec<u32>, Vec<u64>) {
        let n = self.state.len();
        let chunks = n.div_ceil(CHUNK).max(1);
        let enough = if spec.pods == 1 {
            (n / 20).max(self.config.min_feasible_nodes)
        } else {
            usize::MAX
        };
        let first = if spec.pods == 1 {
            self.next_chunk.get() % chunks
        } else {
            0
        };
        let mut capacity = vec![0u32; n];
        let mut totals = vec![0u64; n];
        let mut filter_names = vec!["builtin".to_string()];
        // Rejections counted by (filter, code); texts are looked up once per distinct code.
        let mut code_counts: std::collections::HashMap<(usize, u16), u32> = Default::default();
        let mut fault_counts: std::collections::BTreeMap<(usize, String), u32> = Default::default();
        let mut feasible = 0usize;
        let mut evaluated = 0usize;
        // Per evaluated chunk: each score policy's weighted scores, for the top nodes' parts.
        let mut chunk_parts: Vec<ChunkScores> = Vec::new();
        for step in 0..chunks {
            let chunk = (first + step) % chunks;
            let range = chunk * CHUNK..((chunk + 1) * CHUNK).min(n);
            evaluated += range.len();
            let builtin_codes =
                builtin::gpu_fit_range(&spec.shape, &self.state.nodes, range.clone());
            // Each rejected node is counted once, for the first filter that rejected it.
            let mut rejected_by: Vec<Option<(usize, u16)>> = builtin_codes
                .iter()
                .map(|&code| (code != 0).then_some((0, code)))
                .collect();
            let mut closed: Option<(usize, String)> = None;
            for (index, (policy, verdict)) in hooks
                .filter(&self.state, &spec.shape, range.clone())
                .into_iter()
                .enumerate()
            {
                if filter_names.len() <= index + 1 {
                    filter_names.push(policy.clone());
                }
                match verdict {
                    Verdict::Answer(codes) => {
                        for (slot, &code) in rejected_by.iter_mut().zip(&codes) {
                            if code != 0 && slot.is_none() {
                                *slot = Some((index + 1, code));
                            }
                        }
                    }
                    Verdict::Skipped(fault) => {
                        let fault = format!("{policy}: {fault}");
                        if !explanation.faults.contains(&fault) {
                            explanation.faults.push(fault);
                        }
                    }
                    Verdict::Rejected(fault) => {
                        let text = format!("{policy}: {fault}");
                        if !explanation.faults.contains(&text) {
                            explanation.faults.push(text);
                        }
                        closed.get_or_insert((index + 1, fault));
                    }
                }
            }
            for (offset, rejected) in rejected_by.into_iter().enumerate() {
                let node = range.start + offset;
                match (rejected, &closed) {
                    (Some(key), _) => *code_counts.entry(key).or_default() += 1,
                    (None, Some((filter, fault))) => {
                        *fault_counts
                            .entry((*filter, format!("policy faulted: {fault}")))
                            .or_default() += 1;
                    }
                    (None, None) => {
                        capacity[node] = self.state.capacity_for(node, &spec.shape);
                        feasible += usize::from(capacity[node] > 0);
                    }
                }
            }
            // Scores: every score policy's answer times its weight; the built-in binpack
            // when none answered.
            let mut parts: Vec<(String, Vec<u64>)> = Vec::new();
            for (policy, weight, verdict) in hooks.score(&self.state, &spec.shape, range.clone()) {
                match verdict {
                    Verdict::Answer(scores) => {
                        let weighted: Vec<u64> = scores
                            .iter()
                            .map(|&s| u64::from(s) * u64::from(weight))
                            .collect();
                        for (total, w) in totals[range.clone()].iter_mut().zip(&weighted) {
                            *total += w;
                        }
                        parts.push((policy, weighted));
                    }
                    Verdict::Skipped(fault) | Verdict::Rejected(fault) => {
                        let fault = format!("{policy}: {fault}");
                        if !explanation.faults.contains(&fault) {
                            explanation.faults.push(fault);
                        }
                    }
                }
            }
            if parts.is_empty() {
                let scores: Vec<u64> =
                    builtin::gpu_binpack_range(&spec.shape, &self.state.nodes, range.clone())
                        .into_iter()
                        .map(u64::from)
                        .collect();
                totals[range.clone()].copy_from_slice(&scores);
                parts.push(("builtin:binpack".into(), scores));
            }
            chunk_parts.push((range, parts));
            if feasible >= enough {
                self.next_chunk.set(chunk + 1);
                break;
            }
        }
        let mut counts: Vec<std::collections::BTreeMap<String, u32>> =
            vec![Default::default(); filter_names.len()];
        for ((filter, code), count) in code_counts {
            let text = if filter == 0 {
                builtin::FILTER_REASONS
                    .get(code as usize)
                    .copied()
                    .unwrap_or("rejected")
                    .to_string()
            } else {
                hooks.reason_text(filter - 1, code)
            };
            *counts[filter].entry(text).or_default() += count;
        }
        for ((filter, text), count) in fault_counts {
            *counts[filter].entry(text).or_default() += count;
        }
        explanation.nodes_evaluated = evaluated as u32;
        explanation.nodes_feasible = feasible as u32;
        explanation.filters = filter_names
            .into_iter()
            .zip(counts)
            .filter(|(_, counts)| !counts.is_empty())
            .map(|(policy, counts)| {
                let mut rejected: Vec<(String, u32)> = counts.into_iter().collect();
                rejected.sort_by_key(|r| std::cmp::Reverse(r.1));
                FilterExplain { policy, rejected }
            })
            .collect();

        let mut best: Vec<usize> = chunk_parts
            .iter()
            .flat_map(|(range, _)| range.clone())
            .filter(|&i| capacity[i] > 0)
            .collect();
        let better = |a: &usize, b: &usize| totals[*b].cmp(&totals[*a]).then(a.cmp(b));
        let top = self.config.top_nodes.min(best.len());
        if top > 0 && top < best.len() {
            best.select_nth_unstable_by(top - 1, better);
            best.truncate(top);
        }
        best.sort_by(better);
        explanation.top_nodes = best
            .iter()
            .map(|&node| {
                let (range, parts) = chunk_parts
                    .iter()
                    .find(|(range, _)| range.contains(&node))
                    .expect("a top node was evaluated");
                NodeScore {
                    node: self.node_name(node),
                    total: totals[node],
                    parts: parts
                        .iter()
                        .map(|(policy, scores)| (policy.clone(), scores[node - range.start]))
                        .collect(),
                }
            })
            .collect();
        (capacity, totals)
    }

    /// Choose nodes for every pod, or `None`. A single pod takes the best-scored node. A gang
    /// takes the smallest domain that holds all of it, innermost level first (rack, then
    /// block, then the whole cluster), honouring the job's required or preferred level.
    fn place(&self, spec: &JobSpec, capacity: &[u32], scores: &[u64]) -> Option<Placement> {
        let n = capacity.len();
        if spec.pods == 1 {
            let best = (0..n)
                .filter(|&i| capacity[i] > 0)
                .max_by(|&a, &b| scores[a].cmp(&scores[b]).then(b.cmp(&a)))?;
            return Some(Placement {
                node_pods: vec![(best, 1)],
                domain: None,
            });
        }
        let need = u64::from(spec.pods);
        let levels = &self.state.nodes.levels;
        let first_level = match spec.topology.level {
            Some(level) if spec.topology.required => level,
            _ => 0,
        };
        for (level_index, level) in levels.iter().enumerate().skip(first_level) {
            let domains = level.domain_gpu_total.len();
            let mut fit = vec![0u64; domains];
            let mut best_score = vec![0u64; domains];
            for node in 0..n {
                let domain = level.node_domain[node];
                if domain != u32::MAX && capacity[node] > 0 {
                    fit[domain as usize] += u64::from(capacity[node]);
                    best_score[domain as usize] = best_score[domain as usize].max(scores[node]);
                }
            }
            // The tightest domain that holds the gang keeps bigger ones whole.
            let chosen = (0..domains)
                .filter(|&d| fit[d] >= need)
                .min_by(|&a, &b| fit[a].cmp(&fit[b]).then(best_score[b].cmp(&best_score[a])));
            if let Some(domain) = chosen {
                let nodes: Vec<usize> = (0..n)
                    .filter(|&i| level.node_domain[i] == domain as u32 && capacity[i] > 0)
                    .collect();
                return Some(Placement {
                    node_pods: fill(&nodes, capacity, scores, spec.pods),
                    domain: Some(format!("{} {domain}", self.level_name(level_index))),
                });
            }
            if spec.topology.required {
                return None;
            }
        }
        let all: Vec<usize> = (0..n).filter(|&i| capacity[i] > 0).collect();
        let room: u64 = all.iter().map(|&i| u64::from(capacity[i])).sum();
        (room >= need).then(|| Placement {
            node_pods: fill(&all, capacity, scores, spec.pods),
            domain: Some("the whole cluster".into()),
        })
    }

    fn commit(
        &mut self,
        id: JobId,
        spec: &JobSpec,
        placement: Placement,
        explanation: &mut Explanation,
    ) {
        let mut slots = Vec::with_capacity(spec.pods as usize);
        let mut nodes = Vec::new();
        for (node, pods) in placement.node_pods {
            for _ in 0..pods {
                slots.push(self.state.reserve(node, &spec.shape));
            }
            nodes.push((self.node_name(node), pods));
        }
        if !spec.balloon {
            self.queues.charge(spec.queue, spec.total(), true);
        }
        self.running_gpus += spec.total().gpus;
        self.jobs[id as usize].state = JobState::Running { slots };
        self.pending.retain(|&p| p != id);
        explanation.domain = placement.domain;
        explanation.outcome = Outcome::Placed { nodes };
    }

    /// Running jobs to evict so that `spec` fits, in the order they may be taken: balloons,
    /// then borrowers beyond their quota (when `spec`'s queue is within its own), then jobs of
    /// lower priority. Never a job of higher priority, and always whole gangs. `None` when even
    /// all of them would not make room.
    fn find_victims(&self, spec: &JobSpec) -> Option<Vec<JobId>> {
        if spec.balloon {
            return None;
        }
        let reclaiming = matches!(
            self.queues.admission(spec.queue, spec.total().gpus),
            Admission::Within
        );
        let mut candidates: Vec<(u8, i32, f64, JobId)> = Vec::new();
        for id in self.running() {
            let victim = &self.jobs[id as usize].spec;
            if victim.priority > spec.priority {
                continue;
            }
            let class = if victim.balloon {
                0
            } else if reclaiming
                && victim.queue != spec.queue
                && self.queues.borrowed(victim.queue) >= victim.total().gpus
            {
                1
            } else if victim.priority < spec.priority {
                2
            } else {
                continue;
            };
            candidates.push((class, victim.priority, -victim.submit_s, id));
        }
        candidates.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.total_cmp(&b.2)));
        if candidates.is_empty() {
            return None;
        }
        let mut scratch = self.state.clone();
        let mut victims = Vec::new();
        // A borrower gives back only what its queue borrowed: reclaiming never pushes a queue
        // below its own quota.
        let mut queue_to_borrowed: std::collections::HashMap<QueueId, u64> = Default::default();
        for (class, _, _, id) in candidates {
            let victim = &self.jobs[id as usize];
            if class == 1 {
                let borrowed = queue_to_borrowed
                    .entry(victim.spec.queue)
                    .or_insert_with(|| self.queues.borrowed(victim.spec.queue));
                if *borrowed < victim.spec.total().gpus {
                    continue;
                }
                *borrowed -= victim.spec.total().gpus;
            }
            for &slot in self.slots(id) {
                scratch.release(slot, &victim.spec.shape);
            }
            victims.push(id);
            if self.fits_in(spec, &scratch) {
                // Keep only the victims the job needs: spare, latest taken first, any whose
                // room it can do without.
                for index in (0..victims.len() - 1).rev() {
                    let mut trial = self.state.clone();
                    for (i, &victim) in victims.iter().enumerate() {
                        if i != index {
                            let shape = &self.jobs[victim as usize].spec.shape;
                            for &slot in self.slots(victim) {
                                trial.release(slot, shape);
                            }
                        }
                    }
                    if self.fits_in(spec, &trial) {
                        victims.remove(index);
                    }
                }
                return Some(victims);
            }
        }
        None
    }

    /// Whether `spec` could be placed on `state` by the built-in filter and score.
    fn fits_in(&self, spec: &JobSpec, state: &ClusterState) -> bool {
        let codes = builtin::gpu_fit(&spec.shape, &state.nodes);
        let capacity: Vec<u32> = (0..state.len())
            .map(|i| {
                if codes[i] == 0 {
                    state.capacity_for(i, &spec.shape)
                } else {
                    0
                }
            })
            .collect();
        let scores: Vec<u64> = builtin::gpu_binpack(&spec.shape, &state.nodes)
            .into_iter()
            .map(u64::from)
            .collect();
        self.place(spec, &capacity, &scores).is_some()
    }

    /// The queue's usage as a quota policy sees it, and its cohort's: what a cycle passes to quota
    /// policies, and what the API's policy self-test passes too.
    pub fn usage(&self, queue: QueueId) -> (QueueUsage, Option<CohortUsage>) {
        let usage = |id: QueueId| {
            let def = self.queues.def(id);
            QueueUsage {
                name: self.symbols.intern(&def.name),
                nominal: Resources::gpus(self.queues.nominal(id)),
                borrowing_limit: def.borrowing_limit_gpus.map(Resources::gpus),
                lending_limit: def.lending_limit_gpus.map(Resources::gpus),
                used: self.queues.used(id),
                weight: def.weight,
            }
        };
        let cohort = self.queues.parent(queue).map(|parent| CohortUsage {
            name: self.symbols.intern(self.queues.name(parent)),
            nominal: Resources::gpus(self.queues.nominal(parent)),
            used: self.queues.used(parent),
            queues: self
                .queues
                .children(parent)
                .iter()
                .map(|&c| usage(c))
                .collect(),
        });
        (usage(queue), cohort)
    }

    pub fn node_name(&self, node: usize) -> String {
        self.symbols
            .resolve(self.state.nodes.name[node])
            .to_string()
    }

    fn level_name(&self, level: usize) -> String {
        self.state.nodes.levels.get(level).map_or_else(
            || "domain".into(),
            |l| self.symbols.resolve(l.name).to_string(),
        )
    }
}

/// Fill the best-scored nodes first, each up to its capacity, until `pods` are placed.
fn fill(nodes: &[usize], capacity: &[u32], scores: &[u64], pods: u32) -> Vec<(usize, u32)> {
    let mut order = nodes.to_vec();
    order.sort_by(|&a, &b| {
        scores[b]
            .cmp(&scores[a])
            .then(capacity[b].cmp(&capacity[a]))
            .then(a.cmp(&b))
    });
    let mut left = pods;
    let mut out = Vec::new();
    for node in order {
        if left == 0 {
            break;
        }
        let take = capacity[node].min(left);
        out.push((node, take));
        left -= take;
    }
    out
}

fn gpu_text(shape: &PodShape) -> String {
    if shape.gpu_milli > 0 {
        format!("pod(s) of {}/1000", shape.gpu_milli)
    } else {
        format!("pod(s) of {}", shape.gpus)
    }
}
