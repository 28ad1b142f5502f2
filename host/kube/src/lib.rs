//! Gantry's cluster source and binder for live Kubernetes clusters: the only part, with
//! `gantry-sim`, that differs between a real cluster and the simulator.
//!
//! - **[`KubeCluster`]** is a thin [`gantry_core::ClusterSource`] and [`gantry_core::Binder`]
//!   over three parts: what comes in, the tracker, and what goes out.
//! - **In** (`watch/`): reflectors (watch caches), one generic setup for every kind, over
//!   nodes, over our unbound pods (`spec.schedulerName: gantry`), over every bound pod (for
//!   accounting), over namespaces (their labels, for the Queues' `namespaceSelector`), over
//!   the upstream gang API's `scheduling.k8s.io` PodGroups and scheduler-plugins'
//!   `PodGroup`s, over Kueue's `LocalQueue`s and DRA's objects; the optional kinds are found
//!   by discovery. Nothing is listed per cycle or per node; nothing is scheduled until every
//!   cache has synced. Each sync hands [`tracker::Tracker`] the keys each watch event
//!   changed, and it keeps one long-lived scheduler up to date using [`mapping`]'s rules: a
//!   node table (topology from labels, GPUs from `nvidia.com/gpu`, health from conditions and
//!   taints) with bound pods reserved, and one job per single pod or complete gang.
//! - **Out** (`write/`): binds through the `pods/binding` subresource, idempotently (409
//!   means bound already, and `spec.nodeName` is read back; a binding sent but never answered
//!   is read back too, else counted as bound until the caches say), and posts `Scheduled` /
//!   `FailedScheduling` Events, the `PodScheduled` condition, an upstream PodGroup's
//!   `PodGroupScheduled` condition the way kube-scheduler does, DRA claim allocations and
//!   Queue statuses. Its tests run it against a mock API server.
//! - **Preemption** ([`evict`]): bound pods of ours and balloons (`gantry.dev/balloon`) are
//!   running jobs the core may preempt; victims go through the Eviction API (PodDisruptionBudgets
//!   apply) and the preemptor is nominated, not bound, until they are gone.
//! - **Clients** ([`connect`]): the runtime the loop blocks on, and clients whose writes are
//!   each bounded by a timeout.
//! - **Queues** ([`queues`]): `Queue` objects (`gantry.dev/v1alpha1`) are the quota tree.
//! - **Tenancy** ([`tenancy`]): which queue a pod may use, from each Queue's
//!   `namespaceSelector`, the namespace's labels and Kueue's `LocalQueue`s, never from the pod's
//!   labels alone; a refused pod waits with the reason. Balloons count only from trusted
//!   PriorityClasses or namespaces.
//! - **Pod spec** ([`podspec`]): requests (init containers, sidecars, overhead, pod slots,
//!   extended resources), `nodeSelector` and node affinity compiled for the core, and the fields
//!   Gantry does not honour, refused by name.
//! - **Devices** ([`dra`]): DRA (`resource.k8s.io/v1`) ResourceSlices as per-node devices,
//!   claims with their DeviceClasses and CEL selectors, and all-or-nothing allocation of
//!   devices on one node: the tracker reads them, and the writer allocates them at bind.
//! - **Leader election** ([`leader`]): a `coordination.k8s.io/v1` Lease; only its holder binds.
//!
//! The rules ([`tracker`], [`mapping`], [`podspec`], [`queues`], [`tenancy`], [`dra`],
//! [`claims`], [`config`], [`quantity`]) are pure and live in `gantry-kube-model`; this crate is
//! the I/O around them. The core stays pure: kube types stop at this crate's boundary.

pub mod cluster;
pub mod connect;
pub mod leader;
pub mod nodes;
mod watch;
mod write;

pub use write::evict;

// The rules, pure, live in `gantry-kube-model`; re-exported so that `gantry_kube::tracker` and
// the rest keep their paths for this crate and its users.
pub use gantry_kube_model::{
    claims, config, dra, health, mapping, podspec, preflight, quantity, queues, tenancy, tracker,
};

pub use cluster::KubeCluster;
pub use config::{KubeConfig, TopologyLabel};
pub use leader::{LeaderSettings, Leadership};
pub use mapping::{GroupPolicy, PendingPod};

/// Why talking to the cluster failed. One line each, naming the object and the problem.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read kubeconfig {path}: {message}")]
    Kubeconfig { path: String, message: String },
    #[error("cannot connect to the API server: {0}")]
    Connect(String),
    #[error("the watch caches did not sync within {0} s (is the API server reachable?)")]
    SyncTimeout(u64),
    #[error("this replica is not the leader (its Lease ran out); nothing was written")]
    NotLeader,
    #[error("cannot bind pod {pod} to node {node}: {message}")]
    Bind {
        pod: String,
        node: String,
        message: String,
    },
    #[error("pod {pod} is already bound to {actual}, not {wanted}")]
    BoundElsewhere {
        pod: String,
        wanted: String,
        actual: String,
    },
    #[error("cannot create node {node}: {message}")]
    CreateNode { node: String, message: String },
    #[error("cannot start the kube runtime: {0}")]
    Runtime(String),
}

/// This crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
