//! DRA: the claims' GPUs in a pod's shape, and the gangs decided again when claims change.

use std::sync::Arc;

use gantry_core::{Field, LabelOp, PodShape, Requirement};
use k8s_openapi::api::core::v1::Pod;

use crate::claims::DraView;
use crate::mapping::pod_shape;

use super::Tracker;

impl Tracker {
    /// The pod's shape as the core sees it: [`pod_shape`], plus the GPUs its DRA claims ask,
    /// and, when its claims are allocated already, only their node.
    pub(super) fn shape_of(&self, pod: &Pod) -> PodShape {
        let mut shape = pod_shape(pod, &self.config, &self.symbols);
        let (gpus, node) = self.dra.gpus(pod);
        shape.gpus = shape.gpus.saturating_add(gpus);
        if let Some(node) = node {
            let mut affinity = shape.node_affinity.as_deref().cloned().unwrap_or_default();
            affinity.selector.push(Requirement {
                field: Field::NodeName,
                op: LabelOp::In(vec![self.symbols.intern(&node)]),
            });
            shape.node_affinity = Some(Arc::new(affinity));
        }
        shape
    }

    /// The DRA objects as last handed in.
    pub fn dra(&self) -> &DraView {
        &self.dra
    }

    /// The DRA objects, to update. After claims, templates or classes change, call
    /// [`Tracker::claims_changed`]; after slices, rebuild when [`DraView::set_slices`] says so.
    pub fn dra_mut(&mut self) -> &mut DraView {
        &mut self.dra
    }

    /// Claims, templates or DeviceClasses changed: the pending gangs whose pods name claims
    /// are decided again (a claim created or refused changes whether they wait, and how many
    /// GPUs they ask). Gangs without claims are untouched.
    pub fn claims_changed(&mut self) {
        for (gang, pending) in &self.gang_to_pending {
            let names_claims = pending.pods.values().any(|p| {
                p.pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.resource_claims.as_ref())
                    .is_some_and(|c| !c.is_empty())
            });
            if names_claims {
                self.dirty_pending.insert(gang.clone());
            }
        }
    }
}
