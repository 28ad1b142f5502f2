//! Dynamic Resource Allocation (`resource.k8s.io/v1`, structured parameters) as plain data:
//! which devices each node has, what a pod's claims ask for, and which devices would satisfy
//! them on one node. Pure (no API calls, no async), so every rule is unit-tested without a
//! cluster or a driver; the tracker and binder wire it in.
//!
//! - [`Inventory::from_slices`]: the devices of each node, from the `ResourceSlice`s drivers
//!   publish. Only node-local slices (`spec.nodeName`) count; a pool's older generations are
//!   dropped. Whatever is skipped is kept with its reason in [`Inventory::ignored`].
//! - [`SelectorCache`]: device selectors are CEL, compiled once per distinct expression and
//!   evaluated with the variables Kubernetes gives them (`device.driver`,
//!   `device.attributes[domain].name`, `device.capacity[domain].name`,
//!   `device.allowMultipleAllocations`) and a subset of its `quantity` and `semver` libraries.
//! - [`Claim`]: a `ResourceClaim` (or a template's `spec.spec`) with its DeviceClasses resolved.
//!   What Gantry cannot honour is refused by field path, never ignored.
//! - [`allocate`]: specific free devices on one node for every request of every claim of a pod,
//!   all or nothing, and the `status.allocation` Kubernetes expects for each claim.
//!
//! The CEL subset: the standard library and macros of the `cel` crate, plus
//! `quantity(string)`, `isQuantity(string)`, `semver(string)`, `isSemver(string)` and, on
//! quantities and versions, `compareTo`, `isGreaterThan`, `isLessThan` (and `==`); on
//! quantities `isInteger`, `asInteger` and `sign`; on versions `major`, `minor`, `patch`.
//! Quantity arithmetic (`add`, `sub`), `cel.bind` and list attributes' `includes` are not
//! there: an expression using them fails to evaluate, which refuses the claim.
//!
//! Its parts: `inventory`, `selectors` (with `values`, the quantities and versions CEL compares),
//! `claim` and `allocate`.

mod allocate;
mod claim;
mod inventory;
mod selectors;
mod values;

#[cfg(test)]
mod tests;

pub use allocate::{Allocation, ClaimAllocation, allocate};
pub use claim::{AllocationMode, Claim, Request};
pub use inventory::{
    AttributeValue, Device, DeviceId, Ignored, Inventory, NodeDevices, gpus_on_node,
};
pub use selectors::SelectorCache;
pub use values::{Quantity, Semver};

/// The driver whose devices [`gpus_on_node`] counts: NVIDIA's DRA driver (k8s-dra-driver-gpu).
pub const GPU_DRIVER: &str = "gpu.nvidia.com";
