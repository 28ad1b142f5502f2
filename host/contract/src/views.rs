//! What the scheduling loop publishes, as the API serves it: queues and jobs
//! ([`QueueView`], [`JobView`]), the live feed's events ([`DecisionEvent`]), each queue's
//! history ([`QueueHistoryView`]), a shadow run's report ([`ShadowReport`]) and an upload's
//! validation ([`Upload`]). The engine fills them; the server and the CLI read them.

use std::collections::{BTreeMap, VecDeque};

use gantry_core::Explanation;
use gantry_store::PolicyManifest;
use serde::{Deserialize, Serialize};

use crate::{BadNodeView, EstimateView};

/// One queue's quota, usage, borrowing and fair share.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QueueView {
    /// The queue's name, as declared.
    pub name: String,
    /// The cohort it belongs to; `None` for a top-level queue.
    pub parent: Option<String>,
    /// GPUs guaranteed to the queue: declared, or its children's sum when it declares none.
    pub nominal_gpus: u64,
    /// GPUs its running jobs hold now (a cohort's include its children's).
    pub used_gpus: u64,
    /// GPUs used beyond the nominal quota, lent by siblings.
    pub borrowed_gpus: u64,
    /// Of the nominal quota, what is idle and may be lent to siblings.
    pub lendable_gpus: u64,
    /// Of the nominal quota, what other queues use now by borrowing it (see [`lent_gpus`]).
    pub lent_gpus: u64,
    /// Most GPUs it may borrow beyond its nominal quota; `None` = no limit.
    pub borrowing_limit_gpus: Option<u64>,
    /// Most of its idle nominal quota it may lend; `None` = all of it.
    pub lending_limit_gpus: Option<u64>,
    /// Its weight against its siblings' in fair share: a higher weight earns a larger share.
    pub weight: u32,
    /// Dominant share of the queue, decayed over time (0 = idle).
    pub fair_share: f64,
    /// Lower goes first among siblings.
    pub fair_share_key: f64,
    /// Jobs submitted to this queue itself (not its children) that wait to be placed,
    /// balloons aside.
    pub pending_jobs: u32,
    /// Jobs submitted to this queue itself (not its children) that run now, balloons aside.
    pub running_jobs: u32,
    /// Balloons of this queue waiting for room: counted apart, since they are not work.
    pub balloon_pending_jobs: u32,
    /// Balloons of this queue holding idle GPUs now.
    pub balloon_running_jobs: u32,
}

/// A job the loop knows about now.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct JobView {
    /// The queue it was submitted to.
    pub queue: String,
    /// Pods in its gang (1 for a single pod).
    pub pods: u32,
    /// GPUs each pod asks for.
    pub gpus_per_pod: u32,
    /// Its priority: higher goes first within its queue.
    pub priority: i32,
    /// When it was submitted, in seconds on the scheduler's clock: among equal priorities the
    /// oldest goes first.
    pub submitted_s: f64,
    /// When it was submitted, in ms since the epoch: the scheduler's clock mapped onto the
    /// wall clock when the view was published, so the UI can show and sort by how long it has
    /// waited.
    pub submitted_ms: u64,
    /// `pending` or `running`.
    pub state: &'static str,
    /// Place among its queue's pending jobs (1 = next), by priority then age.
    pub queue_position: Option<u32>,
    /// A placeholder that holds idle capacity and gives way to real work; `/api/jobs` leaves
    /// these out.
    pub balloon: bool,
    /// When a pending job is expected to start, from the planner's last replan.
    pub estimate: Option<EstimateView>,
    /// Why a pending job has no estimate, when it has none: e.g. "not expected to start
    /// within 2 h: the last forecast (40 s ago) looked 2 h ahead and did not reach it, …".
    /// Every pending job has one or the other.
    pub no_estimate: Option<String>,
    /// The nodes that failed under it, each with what it reported and until when the job
    /// avoids it, oldest first: a node failure restarted it when this is not empty. A live
    /// cluster's recreated pods inherit the stopped job's list, so theirs says so too.
    pub avoiding: Vec<BadNodeView>,
}

/// A decision as the SSE feed sends it: small, with the one-line summary.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct DecisionEvent {
    /// When the cycle that decided ran (ms since the epoch).
    pub time_ms: u64,
    /// The job decided about.
    pub job: String,
    /// The queue it was submitted to.
    pub queue: String,
    /// True when every pod has a node; false when the job stays pending.
    pub placed: bool,
    /// Pods in its gang (1 for a single pod).
    pub pods: u32,
    /// GPUs each pod asks for.
    pub gpus_per_pod: u32,
    /// Names of the nodes it was placed on; empty when pending.
    pub nodes: Vec<String>,
    /// The topology domain a gang was placed in, e.g. `rack 12`.
    pub domain: Option<String>,
    /// The policy-set version that decided.
    pub policy_set: u64,
    /// The decision's one-line summary, as the live feed shows it.
    pub summary: String,
    /// A balloon's decision (placed, or given way to work): churn the feed hides by default.
    pub balloon: bool,
}

/// One queue's history as columns of equal length, oldest first: what the queues page charts.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct QueueSeries {
    /// The queue's name.
    pub name: String,
    /// When each sample was taken (ms since the epoch): the chart's time axis.
    pub at_ms: Vec<u64>,
    /// GPUs in use at each sample.
    pub used_gpus: Vec<u64>,
    /// Nominal quota at each sample.
    pub nominal_gpus: Vec<u64>,
    /// GPUs used beyond the nominal quota at each sample.
    pub borrowed_gpus: Vec<u64>,
    /// GPUs of its nominal quota that other queues used at each sample.
    pub lent_gpus: Vec<u64>,
    /// Fair share at each sample, as [`QueueView::fair_share`].
    pub fair_share: Vec<f64>,
    /// Fair-share key at each sample (lower goes first among siblings).
    pub fair_share_key: Vec<f64>,
    /// Pending jobs at each sample.
    pub pending_jobs: Vec<u32>,
}

/// The queues' history, as the history route serves it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct QueueHistoryView {
    /// Time between samples.
    pub interval_ms: u64,
    /// How far back samples are kept.
    pub keep_ms: u64,
    /// One series per queue with samples, ordered by name.
    pub queues: Vec<QueueSeries>,
}

/// Where a candidate set disagrees with the active one, over the shadow run so far.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ShadowReport {
    /// The policy-set version under test.
    pub candidate_version: u64,
    /// When the shadow run started (ms since the epoch).
    pub started_ms: u64,
    /// Who started it, as the audit log names them.
    pub started_by: String,
    /// Cycles in which the candidate decided beside the active set.
    pub cycles: u64,
    /// Cycles the candidate sat out because the shadow thread was still busy with an earlier
    /// one: the active set never waits for the candidate.
    pub cycles_skipped: u64,
    /// Decisions of the active set compared with the candidate's: what the counts are out of.
    pub decisions_compared: u64,
    /// Disagreements by kind (`other-nodes`, `other-domain`, `rejected-by-candidate`,
    /// `admitted-by-candidate`).
    pub counts: BTreeMap<String, u64>,
    /// The most recent disagreements, newest last, with both explanations.
    #[schema(value_type = Vec<ShadowDisagreement>)]
    pub recent: VecDeque<ShadowDisagreement>,
}

/// One job decided differently by the candidate.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ShadowDisagreement {
    /// When the cycle that decided ran (ms since the epoch).
    pub time_ms: u64,
    /// The job decided differently.
    pub job: String,
    /// How the two differ: one of the kinds counted in [`ShadowReport::counts`].
    pub kind: String,
    /// The version of the active set that made the real decision.
    pub active_set: u64,
    /// The active set's explanation of what it decided.
    pub active: Explanation,
    /// The candidate's explanation of what it would have decided.
    pub candidate: Explanation,
}

/// What validating an upload found: the policy's own description and its self-test.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Validation {
    /// The name the policy declares.
    pub name: String,
    /// The version the policy declares.
    pub version: String,
    /// `filter`, `score` or `quota`: the interface it exports, so where in a cycle it runs.
    pub role: String,
    /// SHA-256 of the module's bytes: the key it is stored under and sets refer to it by.
    pub sha256: String,
    /// Size of the module, in bytes.
    pub size: u64,
    /// Declared reason codes and their texts, sorted by code: how its verdicts will read in
    /// explanations.
    pub reasons: Vec<(u16, String)>,
    /// One line on how it answered a sample request against the current cluster snapshot.
    pub self_test: String,
}

/// The answer to an upload.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Upload {
    /// The stored policy's manifest.
    pub manifest: PolicyManifest,
    /// True when the same bytes were stored before; the API then answers 200 rather than 201.
    pub already_stored: bool,
    /// What validating the upload found.
    pub validation: Validation,
}
