//! "Why is it pending now?" (or where it went): the answer of `GET /api/explain/{name}`, which
//! `gantry explain` prints and the UI's job page shows.

use crate::{BadNodeView, EstimateView, QueueView};
use gantry_store::DecisionRecord;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What a pending job with no decision yet waits for: the explanation's `waiting_for` and its
/// estimate's say it in the same words.
pub fn not_attempted_waiting_for(queue: &str) -> String {
    format!("its turn in queue {queue}")
}

/// What the name asked about turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExplainKind {
    /// A job (a single pod's job has the pod's name).
    Job,
    /// A pod of a gang: the answer is about its job.
    Pod,
}

/// Where a job is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExplainState {
    /// Waiting to be placed.
    Pending,
    /// Placed and running.
    Running,
    /// Neither pending nor running now, with a history.
    Done,
}

impl ExplainState {
    /// The state as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Done => "done",
        }
    }
}

/// The answer of `GET /api/explain/{name}`, for a pod or a job.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Explain {
    /// The name asked about.
    pub name: String,
    /// What `name` turned out to be.
    pub kind: ExplainKind,
    /// The job it is, or belongs to.
    pub job: String,
    /// Where the job is now.
    pub state: ExplainState,
    /// The queue it was submitted to.
    pub queue_name: String,
    /// Pods in its gang (1 for a single pod).
    pub pods: u32,
    /// GPUs each pod asks for.
    pub gpus_per_pod: u32,
    /// Higher goes first within its queue.
    pub priority: i32,
    /// Its place among its queue's pending jobs (1 = next).
    pub queue_position: Option<u32>,
    /// Its queue now: quota, use, borrowing, fair share.
    pub queue: Option<QueueView>,
    /// One paragraph in plain words, from the latest decision (or on why there is none yet).
    pub why: String,
    /// What would change the outcome, when pending.
    pub waiting_for: Option<String>,
    /// When it is expected to start, when pending and the planner has placed it in its plan.
    pub estimate: Option<EstimateView>,
    /// Why a pending job has no estimate, when it has none (see `JobView::no_estimate`).
    pub no_estimate: Option<String>,
    /// The nodes that failed under it and that it avoids (see `JobView::avoiding`): not
    /// empty when a node failure restarted it. Empty once it is done.
    pub avoiding: Vec<BadNodeView>,
    /// The latest decision; none for a job that waits for its first attempt.
    pub latest: Option<DecisionRecord>,
    /// The latest decision's quota, as one verdict in words (`QuotaExplain::verdict_text`),
    /// so the UI and the CLI never word it apart.
    pub quota_verdict: Option<String>,
    /// Decisions on record about it.
    pub attempts: usize,
    /// What happened to it, oldest first: placed, preempted (by whom), pending.
    pub history: Vec<JobEvent>,
}

/// What happened to a job at one point of its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum JobEventKind {
    /// It got nodes.
    Placed,
    /// It was evicted to make room for another job.
    Preempted,
    /// It waited: attempted and not placed.
    Pending,
}

/// One step of a job's history, from its decision records: a run of pending attempts is one
/// step, from its first attempt, with what the latest of them waited for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JobEvent {
    /// When it happened (ms since the epoch).
    pub time_ms: u64,
    /// What happened.
    pub kind: JobEventKind,
    /// In words: the nodes it got, who preempted it, or what it waited for.
    pub text: String,
    /// For a preemption: the job it made room for.
    pub by: Option<String>,
}
