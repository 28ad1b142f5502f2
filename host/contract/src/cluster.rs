//! The cluster as the UI's heatmap and a node's page read it.

use gantry_core::NodeState;
use gantry_store::DecisionRecord;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One topology domain's GPUs.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DomainUse {
    /// The level and the domain's index, e.g. `rack 12`.
    pub name: String,
    /// Nodes in it.
    pub nodes: u32,
    /// GPUs in it.
    pub gpu_total: u32,
    /// Of those, GPUs free now.
    pub gpu_free: u32,
}

/// One topology level (e.g. `block`, `rack`) and the GPU use of its domains.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LevelUse {
    /// The level's name.
    pub level: String,
    /// Its domains, by index.
    pub domains: Vec<DomainUse>,
}

/// The answer of `GET /api/cluster`: totals and GPU use per topology domain.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ClusterSummary {
    /// The cluster's name.
    pub cluster: String,
    /// When the view was published (ms since the epoch).
    pub at_ms: u64,
    /// Nodes in the cluster.
    pub nodes: usize,
    /// GPUs in the cluster.
    pub gpu_total: u64,
    /// Of those, GPUs free now.
    pub gpu_free: u64,
    /// Pods of pending jobs, balloons aside.
    pub pending_pods: u64,
    /// Pods of running jobs, balloons aside.
    pub running_pods: u64,
    /// Balloon pods waiting for room: counted apart, since they are not work.
    pub balloon_pending_pods: u64,
    /// Balloon pods holding idle GPUs now.
    pub balloon_running_pods: u64,
    /// The policy-set version cycles run on.
    pub active_set: u64,
    /// GPU use per topology domain, coarsest level first.
    pub levels: Vec<LevelUse>,
}

/// The answer of `GET /api/cluster/nodes`: the nodes as columns (one array per field, same
/// order), which keeps 7,500 nodes small on the wire and cheap for the UI to draw.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeColumns {
    /// When the view was published (ms since the epoch).
    pub at_ms: u64,
    /// Each node's name.
    pub name: Vec<String>,
    /// Each node's GPU model.
    pub gpu_type: Vec<String>,
    /// Each node's GPUs.
    pub gpu_total: Vec<u32>,
    /// Each node's free GPUs.
    pub gpu_free: Vec<u32>,
    /// Of each node's GPUs in use, those balloons hold: idle capacity kept warm, not work,
    /// which the heatmap shades apart.
    pub balloon_gpus: Vec<u32>,
    /// `healthy`, `unhealthy`, `preflight`, `not-ready` or `cordoned`: what the filters see.
    pub health: Vec<String>,
    /// Each node's health-lifecycle state (`ready`, `suspect`, `repair`, …): what the heatmap
    /// colours by, since `health` folds Suspect and Draining into `cordoned`, and Repair and
    /// Retired into `unhealthy`.
    pub state: Vec<NodeState>,
    /// Per topology level, its name and each node's domain index.
    pub levels: Vec<(String, Vec<u32>)>,
    /// Running jobs on each node.
    pub jobs: Vec<u32>,
    /// The queues of those jobs, comma-separated (empty when idle), for the UI's queue filter.
    pub queues: Vec<String>,
}

/// The answer of `GET /api/cluster/nodes/{node}`: one node, its jobs and recent placements.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeDetail {
    /// The node's name.
    pub name: String,
    /// Its GPU model.
    pub gpu_type: String,
    /// Its GPUs.
    pub gpu_total: u32,
    /// Of those, free now.
    pub gpu_free: u32,
    /// As in [`NodeColumns::health`].
    pub health: String,
    /// Its health-lifecycle state, as in [`NodeColumns::state`].
    pub state: NodeState,
    /// Its domain at each topology level, e.g. `rack 12`.
    pub domains: Vec<String>,
    /// Jobs running on it.
    pub jobs: Vec<String>,
    /// The newest placements on it, oldest first.
    pub recent_decisions: Vec<DecisionRecord>,
}
