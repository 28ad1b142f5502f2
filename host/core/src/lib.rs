//! The scheduling core's model: the columnar node table, pod shapes, queues and the string
//! interner they share. Pure on purpose: no kube, axum, sled or wasmtime types live here, so the
//! same core drives the simulator and a live cluster, and every policy engine reads one model.

pub mod model;
pub mod symbols;

pub use model::{
    CohortUsage, Health, JobRequest, LevelColumn, NodeTable, PodShape, QueueUsage, QuotaVerdict,
    Resources, Taint, TaintEffect, Toleration,
};
pub use symbols::{Sym, Symbols};
