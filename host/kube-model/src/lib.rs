//! What Kubernetes objects mean to Gantry's core: the pure rules behind `gantry-kube`. No API
//! client, no async, no I/O (its `Cargo.toml` has no kube client, tokio or futures), so every
//! rule is unit-tested without a cluster; `gantry-kube` watches and writes, and hands the
//! objects it holds to this crate.
//!
//! - **Tracker** ([`tracker`]): [`tracker::Tracker`] keeps one long-lived scheduler up to date
//!   from the keys each watch event changed: the node table, pending gangs as jobs, bound pods
//!   as running jobs or held room, and what the binder did.
//! - **Mapping** ([`mapping`]): a node table (topology from labels, GPUs from
//!   `nvidia.com/gpu`, health from conditions and taints) and one job per single pod or
//!   complete gang, from nodes and pods.
//! - **Pod spec** ([`podspec`]): requests (init containers, sidecars, overhead, pod slots,
//!   extended resources), `nodeSelector` and node affinity compiled for the core, and the fields
//!   Gantry does not honour, refused by name.
//! - **Queues** ([`queues`]): `Queue` objects (`gantry.dev/v1alpha1`) as the quota tree.
//! - **Selectors** ([`selector`]): a `Queue`'s `namespaceSelector` over a namespace's labels.
//! - **Tenancy** ([`tenancy`]): which queue a pod may use, from each Queue's
//!   `namespaceSelector`, the namespace's labels and Kueue's `LocalQueue`s, never from the pod's
//!   labels alone. Balloons count only from trusted PriorityClasses or namespaces.
//! - **Devices** ([`dra`]): DRA (`resource.k8s.io/v1`) ResourceSlices as per-node devices,
//!   claims with their DeviceClasses and CEL selectors, and all-or-nothing allocation of
//!   devices on one node; [`claims`] resolves a pod's claims and keeps the DRA objects the
//!   tracker reads.
//! - **Health signals** ([`health`]): which node conditions, taints and DRA device taints
//!   mean a node is failing (`--health-config`); the tracker reports each change of them.
//! - **Preflight** ([`preflight`]): nodes tainted `gantry.dev/preflight`, the test pod Gantry
//!   runs on each, and what its status says.
//! - **Settings** ([`config`]) and **quantities** ([`quantity`]): the labels and names Gantry
//!   reads, and Kubernetes quantities as counts.

#![warn(missing_docs)]

pub mod claims;
pub mod config;
pub mod dra;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod health;
pub mod mapping;
pub mod podspec;
pub mod preflight;
pub mod quantity;
pub mod queues;
pub mod selector;
pub mod tenancy;
pub mod tracker;

pub use config::{KubeConfig, TopologyLabel};
pub use mapping::{GroupPolicy, PendingPod};
pub use tracker::{Tracker, World};

/// A pod's `(namespace, name)`: how the watch caches key it. At the root, as every rule names
/// pods by it: the claims and the mapping need it without needing the tracker.
pub type PodKey = (String, String);
