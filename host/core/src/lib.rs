//! Gantry's scheduling core: the model (a columnar node table, pod shapes, queues, interned
//! strings), the queue tree with quota and fair share, the live cluster state, the built-in
//! filter and score, the node health lifecycle ([`health`]), and the cycle that places jobs and explains every decision. Pure on
//! purpose: no kube, axum, sled or wasmtime types live here, so the same core drives the
//! simulator and a live cluster, and policies plug in through [`PolicyHooks`]. The loop that
//! drives it talks to the world through [`ClusterSource`] and [`Binder`].

pub mod affinity;
pub mod builtin;
pub mod cluster;
pub mod explain;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod health;
pub mod hooks;
pub mod model;
pub mod queues;
pub mod roles;
pub mod scheduler;
pub mod shadow;
pub mod source;
pub mod symbols;
pub mod words;

pub use affinity::{
    AffinityIndex, ChunkAffinity, Field, LabelOp, NodeAffinity, NodeLabel, Requirement, Term,
};
pub use cluster::{ClusterState, Slot};
pub use explain::{Explanation, Outcome, PolicyRef, StartEstimate};
pub use health::{HealthConfig, Lifecycle, NodeState, Transition};
pub use hooks::{BuiltinOnly, PolicyHooks, Verdict};
pub use model::{
    CohortUsage, Health, JobRequest, LevelColumn, NodeRow, NodeTable, PodShape, QueueUsage,
    QuotaVerdict, ResourceColumn, Resources, Seconds, Taint, TaintEffect, Toleration, percentile,
};
pub use queues::{Admission, QueueDef, QueueError, QueueId, Queues, Reclaim};
pub use roles::{FailurePolicy, PolicyRole};
pub use scheduler::plan::{EstimateSource, PlanConfig, PlanStats, RuntimeEstimate, WhatIf};
pub use scheduler::{
    Blocked, CycleOutput, Decision, ForecastRun, Forecasts, JobId, JobSpec, Mode, RestartBy,
    Scheduler, SchedulerConfig, StopPolicy, TopologyPref, TopologyStats, WhatIfRun,
};
pub use shadow::{Disagreement, DisagreementKind, compare};
pub use source::{BindOutcome, Binder, Changes, Cluster, ClusterSource, Step, VirtualClock, step};
pub use symbols::{Sym, Symbols};
