//! The seam between the pure cycle and the policies it consults beyond the built-ins. The Wasm
//! runtime (`gantry-policy`) implements [`PolicyHooks`]; the core knows nothing of wasmtime.

use std::ops::Range;

use crate::cluster::ClusterState;
use crate::explain::PolicyRef;
use crate::model::{CohortUsage, JobRequest, PodShape, QueueUsage, QuotaVerdict};

/// A policy's answer once its failure policy has been applied to any fault.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict<T> {
    Answer(T),
    /// Faulted and fails open: leave it out of this decision. The text names the fault.
    Skipped(String),
    /// Faulted and fails closed: reject, with the fault as the reason.
    Rejected(String),
}

/// The active policy set, as the cycle sees it.
pub trait PolicyHooks {
    /// The policies taking part, for explanation records.
    fn policies(&self) -> Vec<PolicyRef>;
    /// The policy-set version every decision of this cycle records.
    fn set_version(&self) -> u64;
    /// Per filter policy, in order: its name and a reason code per node of `nodes` (0 fits).
    /// `nodes` is a chunk of the table: a multiple of `CHUNK` to the next one, or the end.
    /// `in_play` says, per node of `nodes`, whether the built-in filter let it through (some
    /// node did): the answers for the others are ignored, so an implementation may skip
    /// asking about them, and a pinned pod or a busy cluster costs the policies only the
    /// nodes still in play.
    fn filter(
        &mut self,
        state: &ClusterState,
        pod: &PodShape,
        nodes: Range<usize>,
        in_play: &[bool],
    ) -> Vec<(String, Verdict<Vec<u16>>)>;
    /// The text of filter policy `index`'s reason `code`.
    fn reason_text(&self, index: usize, code: u16) -> String;
    /// Per score policy, in order: its name, weight and a score per node of `nodes`
    /// (0..=100). `in_play` says which nodes every filter let through (some node did); the
    /// scores of the others are ignored, as for [`PolicyHooks::filter`].
    fn score(
        &mut self,
        state: &ClusterState,
        pod: &PodShape,
        nodes: Range<usize>,
        in_play: &[bool],
    ) -> Vec<(String, u32, Verdict<Vec<u32>>)>;
    /// As [`PolicyHooks::score`], with the reasons each policy gave for a few nodes (contract
    /// 0.2.0): `(offset into nodes, text)`, for the explanation's top nodes. The default gives
    /// none, so hooks without reasons need not implement it.
    #[allow(clippy::type_complexity)]
    fn score_explained(
        &mut self,
        state: &ClusterState,
        pod: &PodShape,
        nodes: Range<usize>,
        in_play: &[bool],
    ) -> Vec<(String, u32, Verdict<Vec<u32>>, Vec<(u32, String)>)> {
        self.score(state, pod, nodes, in_play)
            .into_iter()
            .map(|(policy, weight, verdict)| (policy, weight, verdict, Vec::new()))
            .collect()
    }
    /// Per quota policy, in order: its name and verdict.
    fn admit(
        &mut self,
        job: &JobRequest,
        queue: &QueueUsage,
        cohort: Option<&CohortUsage>,
    ) -> Vec<(String, Verdict<QuotaVerdict>)>;
    /// Whether this cycle's wall-time budget for policy calls is spent. The cycle then stops
    /// taking jobs: the ones it did not reach keep their places and go first next cycle, so
    /// slow or failing policies delay work but never stall the loop or drop a job.
    fn budget_spent(&self) -> bool {
        false
    }
}

/// Built-ins only: no Wasm policy is active.
#[derive(Debug, Default, Clone, Copy)]
pub struct BuiltinOnly;

impl PolicyHooks for BuiltinOnly {
    fn policies(&self) -> Vec<PolicyRef> {
        Vec::new()
    }
    fn set_version(&self) -> u64 {
        0
    }
    fn filter(
        &mut self,
        _: &ClusterState,
        _: &PodShape,
        _: Range<usize>,
        _: &[bool],
    ) -> Vec<(String, Verdict<Vec<u16>>)> {
        Vec::new()
    }
    fn reason_text(&self, _: usize, code: u16) -> String {
        format!("reason {code}")
    }
    fn score(
        &mut self,
        _: &ClusterState,
        _: &PodShape,
        _: Range<usize>,
        _: &[bool],
    ) -> Vec<(String, u32, Verdict<Vec<u32>>)> {
        Vec::new()
    }
    fn admit(
        &mut self,
        _: &JobRequest,
        _: &QueueUsage,
        _: Option<&CohortUsage>,
    ) -> Vec<(String, Verdict<QuotaVerdict>)> {
        Vec::new()
    }
}

/// Built-ins only, under the version of the policy set a scheduler last ran: what the forecast
/// steps its copies with. A cycle under another version would wake every parked job, as a
/// policy change does, which the scheduler it copies would not do.
#[derive(Debug, Default, Clone, Copy)]
pub struct BuiltinsAt(pub u64);

impl PolicyHooks for BuiltinsAt {
    fn policies(&self) -> Vec<PolicyRef> {
        Vec::new()
    }
    fn set_version(&self) -> u64 {
        self.0
    }
    fn filter(
        &mut self,
        state: &ClusterState,
        pod: &PodShape,
        nodes: Range<usize>,
        in_play: &[bool],
    ) -> Vec<(String, Verdict<Vec<u16>>)> {
        BuiltinOnly.filter(state, pod, nodes, in_play)
    }
    fn reason_text(&self, index: usize, code: u16) -> String {
        BuiltinOnly.reason_text(index, code)
    }
    fn score(
        &mut self,
        state: &ClusterState,
        pod: &PodShape,
        nodes: Range<usize>,
        in_play: &[bool],
    ) -> Vec<(String, u32, Verdict<Vec<u32>>)> {
        BuiltinOnly.score(state, pod, nodes, in_play)
    }
    fn admit(
        &mut self,
        job: &JobRequest,
        queue: &QueueUsage,
        cohort: Option<&CohortUsage>,
    ) -> Vec<(String, Verdict<QuotaVerdict>)> {
        BuiltinOnly.admit(job, queue, cohort)
    }
}
