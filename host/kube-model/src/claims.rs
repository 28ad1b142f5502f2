//! What a pod's DRA claims mean against the watch caches: which ResourceClaim each
//! `spec.resourceClaims[]` entry names, whether Gantry can honour it, how many GPUs it adds to
//! the pod's request, and which devices are in use. Pure (the caller hands it the objects the
//! caches hold), so the rules are unit-tested without a cluster; [`crate::dra`] does the
//! device model and the allocation, `gantry_kube::KubeCluster` the writes.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};

use crate::PodKey;
use crate::dra::{self, AllocationMode, Claim, DeviceId, Inventory, NodeDevices, SelectorCache};

/// One claim of a pod, resolved: the object the cache holds and its requests.
#[derive(Debug, Clone)]
pub struct PodClaim {
    /// The claim's `(namespace, name)`.
    pub key: PodKey,
    /// The ResourceClaim as the cache (or this process's last write) has it.
    pub object: Arc<ResourceClaim>,
    /// Its requests with their DeviceClasses resolved.
    pub claim: Claim,
}

impl PodClaim {
    /// Whether the claim already has devices (`status.allocation`).
    pub fn allocated(&self) -> bool {
        self.object
            .status
            .as_ref()
            .is_some_and(|s| s.allocation.is_some())
    }

    /// The pods' uids it is reserved for (`status.reservedFor`).
    pub fn reserved_for(&self) -> Vec<&str> {
        reserved_uids(&self.object)
    }
}

fn reserved_uids(claim: &ResourceClaim) -> Vec<&str> {
    claim
        .status
        .iter()
        .flat_map(|s| s.reserved_for.iter().flatten())
        .map(|r| r.uid.as_str())
        .collect()
}

/// The devices a claim's `status.allocation` names.
pub fn allocated_devices(claim: &ResourceClaim) -> Vec<DeviceId> {
    claim
        .status
        .iter()
        .filter_map(|s| s.allocation.as_ref())
        .filter_map(|a| a.devices.as_ref())
        .flat_map(|d| d.results.iter().flatten())
        .map(|r| DeviceId {
            driver: r.driver.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
        })
        .collect()
}

/// The cluster's DRA objects as the scheduler needs them, kept up to date by the caller.
#[derive(Debug, Default)]
pub struct DraView {
    /// Whether the cluster serves `resource.k8s.io/v1` and its caches hold a full list: until
    /// then a pod with claims waits, saying so.
    pub served: bool,
    /// Every node's devices, from the ResourceSlices.
    inventory: Inventory,
    /// GPUs each node's slices publish ([`dra::gpus_on_node`]): added to its GPU column.
    node_to_gpus: HashMap<String, u32>,
    /// The DRA taints on each node's devices, by node name: health signals.
    node_to_device_taints: HashMap<String, Vec<crate::health::DeviceTaint>>,
    /// Each device's node and whether it is a whole GPU: how an allocation is charged.
    device_to_node: HashMap<DeviceId, (String, bool)>,
    /// Every DeviceClass: a claim's requests name one.
    classes: Vec<DeviceClass>,
    /// ResourceClaimTemplates by `(namespace, name)`: a pod naming one is checked against it
    /// before kube-controller-manager has created its claim, so a refused field shows at once.
    key_to_template: HashMap<PodKey, Arc<ResourceClaimTemplate>>,
    /// ResourceClaims by `(namespace, name)`.
    key_to_claim: HashMap<PodKey, Arc<ResourceClaim>>,
    /// Whether a DeviceClass selects whole GPUs, by class name: decided once per inventory and
    /// class set (CEL over the GPU devices), since every pod of a class asks the same.
    class_is_gpu: Mutex<HashMap<String, bool>>,
    /// Compiled selectors, shared by every allocation.
    cache: Mutex<SelectorCache>,
}

impl DraView {
    /// New slices: rebuilds the inventory. `true` when a node's GPU count or device taints
    /// changed (the node table must be rebuilt).
    pub fn set_slices(&mut self, slices: &[ResourceSlice]) -> bool {
        let inventory = Inventory::from_slices(slices);
        for ignored in &inventory.ignored {
            if !self.inventory.ignored.contains(ignored) {
                tracing::info!(what = %ignored.what, reason = %ignored.reason, "DRA: left out");
            }
        }
        let node_to_gpus: HashMap<String, u32> = inventory
            .nodes
            .values()
            .map(|n| (n.node.clone(), dra::gpus_on_node(n)))
            .filter(|&(_, g)| g > 0)
            .collect();
        let gpu_type = format!("{}/type", dra::GPU_DRIVER);
        self.device_to_node = inventory
            .nodes
            .values()
            .flat_map(|n| n.devices.iter().map(move |d| (n, d)))
            .map(|(n, d)| {
                let gpu = d.id.driver == dra::GPU_DRIVER
                    && matches!(d.attributes.get(&gpu_type), Some(dra::AttributeValue::String(t)) if t == "gpu");
                (d.id.clone(), (n.node.clone(), gpu))
            })
            .collect();
        let node_to_device_taints: HashMap<String, Vec<crate::health::DeviceTaint>> = inventory
            .nodes
            .values()
            .filter(|n| !n.device_taints.is_empty())
            .map(|n| (n.node.clone(), n.device_taints.clone()))
            .collect();
        self.inventory = inventory;
        self.lock_classes().clear();
        let changed = node_to_gpus != self.node_to_gpus
            || node_to_device_taints != self.node_to_device_taints;
        self.node_to_gpus = node_to_gpus;
        self.node_to_device_taints = node_to_device_taints;
        changed
    }

    /// The DeviceClasses, all of them.
    pub fn set_classes(&mut self, classes: Vec<DeviceClass>) {
        self.classes = classes;
        self.lock_classes().clear();
    }

    /// A ResourceClaim changed (`None`: deleted).
    pub fn set_claim(&mut self, key: PodKey, claim: Option<Arc<ResourceClaim>>) {
        match claim {
            Some(c) => self.key_to_claim.insert(key, c),
            None => self.key_to_claim.remove(&key),
        };
    }

    /// Every ResourceClaim, after a list.
    pub fn set_claims(&mut self, claims: HashMap<PodKey, Arc<ResourceClaim>>) {
        self.key_to_claim = claims;
    }

    /// A ResourceClaimTemplate changed (`None`: deleted).
    pub fn set_template(&mut self, key: PodKey, template: Option<Arc<ResourceClaimTemplate>>) {
        match template {
            Some(t) => self.key_to_template.insert(key, t),
            None => self.key_to_template.remove(&key),
        };
    }

    /// Every ResourceClaimTemplate, after a list.
    pub fn set_templates(&mut self, templates: HashMap<PodKey, Arc<ResourceClaimTemplate>>) {
        self.key_to_template = templates;
    }

    fn lock_classes(&self) -> std::sync::MutexGuard<'_, HashMap<String, bool>> {
        self.class_is_gpu.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The GPUs `node`'s ResourceSlices publish.
    pub fn node_gpus(&self, node: &str) -> u32 {
        self.node_to_gpus.get(node).copied().unwrap_or(0)
    }

    /// What the node table reads of `node`'s devices: their GPUs and their taints.
    pub fn node_devices(&self, node: &str) -> crate::mapping::NodeDra<'_> {
        crate::mapping::NodeDra {
            gpus: self.node_gpus(node),
            device_taints: self
                .node_to_device_taints
                .get(node)
                .map_or(&[], Vec::as_slice),
        }
    }

    /// The claims `pod` names, resolved, or why the pod cannot be scheduled yet: the claim
    /// does not exist (yet), is refused by [`Claim::from_resource_claim`], or is reserved for
    /// another pod (Gantry does not share a claim between pods).
    pub fn resolve(&self, pod: &Pod) -> Result<Vec<PodClaim>, String> {
        let Some(entries) = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref()) else {
            return Ok(Vec::new());
        };
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let mut out = Vec::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            let at = format!("spec.resourceClaims[{i}] ({})", entry.name);
            if !self.served {
                return Err(format!(
                    "{at}: this cluster does not serve resource.k8s.io/v1 ResourceClaims (yet), \
                     so Gantry cannot allocate the claim"
                ));
            }
            let name = match (
                &entry.resource_claim_name,
                &entry.resource_claim_template_name,
            ) {
                (Some(name), _) => name.clone(),
                (None, Some(template)) => {
                    let key = (namespace.clone(), template.clone());
                    let Some(t) = self.key_to_template.get(&key) else {
                        return Err(format!(
                            "{at}: ResourceClaimTemplate {namespace}/{template} does not exist"
                        ));
                    };
                    Claim::from_template(t, &entry.name, &self.classes)
                        .map_err(|e| format!("{at}: {e}"))?;
                    let created = pod
                        .status
                        .as_ref()
                        .and_then(|s| s.resource_claim_statuses.as_ref())
                        .and_then(|s| s.iter().find(|s| s.name == entry.name))
                        .and_then(|s| s.resource_claim_name.clone());
                    match created {
                        Some(name) => name,
                        None => {
                            return Err(format!(
                                "{at}: waits for its ResourceClaim to be created from \
                                 ResourceClaimTemplate {namespace}/{template} (by \
                                 kube-controller-manager)"
                            ));
                        }
                    }
                }
                (None, None) => {
                    return Err(format!(
                        "{at}: names neither resourceClaimName nor resourceClaimTemplateName"
                    ));
                }
            };
            let key = (namespace.clone(), name.clone());
            let Some(object) = self.key_to_claim.get(&key) else {
                return Err(format!(
                    "{at}: ResourceClaim {namespace}/{name} does not exist (yet)"
                ));
            };
            if object.metadata.deletion_timestamp.is_some() {
                return Err(format!(
                    "{at}: ResourceClaim {namespace}/{name} is being deleted"
                ));
            }
            let claim = Claim::from_resource_claim(object, &self.classes)
                .map_err(|e| format!("{at}: {e}"))?;
            if let Some(other) = object
                .status
                .iter()
                .flat_map(|s| s.reserved_for.iter().flatten())
                .find(|r| r.uid != uid)
            {
                return Err(format!(
                    "{at}: ResourceClaim {namespace}/{name} is reserved for {} {}; Gantry does \
                     not share a claim between pods",
                    other.resource, other.name
                ));
            }
            out.push(PodClaim {
                key,
                object: object.clone(),
                claim,
            });
        }
        Ok(out)
    }

    /// Whether requests of `class` get whole GPUs: some GPU device the inventory holds passes
    /// the class's selectors (a class that selects nothing here adds no GPUs; its pods then
    /// fail to allocate at bind, saying why).
    fn is_gpu_class(&self, request: &dra::Request) -> bool {
        if let Some(&known) = self.lock_classes().get(&request.class) {
            return known;
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let gpu = self
            .inventory
            .nodes
            .values()
            .flat_map(|n| n.devices.iter())
            .filter(|d| self.device_to_node.get(&d.id).is_some_and(|(_, g)| *g))
            .any(|d| {
                request
                    .class_selectors
                    .iter()
                    .all(|e| cache.matches(e, d).unwrap_or(false))
            });
        drop(cache);
        self.lock_classes().insert(request.class.clone(), gpu);
        gpu
    }

    /// The GPUs `pod`'s claims add to its request, and the node its claims are already
    /// allocated on, if any (the pod must go there). An allocated claim counts the GPUs its
    /// allocation names (what a bound pod holds); one not allocated, the GPUs its `ExactCount`
    /// requests of a GPU class ask. A pod whose claims do not resolve counts none: it never
    /// becomes a job ([`Self::resolve`] makes it wait), and a bound one holds what it can.
    pub fn gpus(&self, pod: &Pod) -> (u32, Option<String>) {
        let Ok(claims) = self.resolve(pod) else {
            return (0, None);
        };
        let mut gpus = 0u32;
        let mut node = None;
        for c in &claims {
            if c.allocated() {
                for id in allocated_devices(&c.object) {
                    if let Some((n, gpu)) = self.device_to_node.get(&id) {
                        gpus += u32::from(*gpu);
                        node.get_or_insert_with(|| n.clone());
                    }
                }
                continue;
            }
            for request in &c.claim.requests {
                if let AllocationMode::ExactCount(n) = request.mode
                    && self.is_gpu_class(request)
                {
                    gpus = gpus.saturating_add(n);
                }
            }
        }
        (gpus, node)
    }

    /// Every device some claim's allocation holds.
    pub fn in_use(&self) -> BTreeSet<DeviceId> {
        self.key_to_claim
            .values()
            .flat_map(|c| allocated_devices(c))
            .collect()
    }

    /// Devices on `node` for `claims`, none of them in `in_use` (see [`dra::allocate`]).
    pub fn allocate(
        &self,
        node: &str,
        claims: &[Claim],
        in_use: &BTreeSet<DeviceId>,
    ) -> Result<dra::Allocation, String> {
        let empty = NodeDevices {
            node: node.to_string(),
            ..Default::default()
        };
        let devices = self.inventory.node(node).unwrap_or(&empty);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        dra::allocate(devices, claims, in_use, &mut cache)
    }

    /// The node an allocated claim's devices are on.
    pub fn allocated_node(&self, claim: &ResourceClaim) -> Option<String> {
        allocated_devices(claim)
            .iter()
            .find_map(|id| self.device_to_node.get(id).map(|(n, _)| n.clone()))
    }

    /// The claims in `namespace` reserved for the pod with `uid`: what to release when it is
    /// gone.
    pub fn reserved_for(&self, namespace: &str, uid: &str) -> Vec<(PodKey, Arc<ResourceClaim>)> {
        self.key_to_claim
            .iter()
            .filter(|((ns, _), c)| ns == namespace && reserved_uids(c).contains(&uid))
            .map(|(k, c)| (k.clone(), c.clone()))
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        PodResourceClaim, PodResourceClaimStatus, PodSpec, PodStatus,
    };
    use k8s_openapi::api::resource::v1::{
        CELDeviceSelector, Device, DeviceAttribute, DeviceClaim, DeviceClassSpec, DeviceRequest,
        DeviceSelector, ExactDeviceRequest, ResourceClaimConsumerReference, ResourceClaimSpec,
        ResourceClaimStatus, ResourceClaimTemplateSpec, ResourcePool, ResourceSliceSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn selector(expression: &str) -> DeviceSelector {
        DeviceSelector {
            cel: Some(CELDeviceSelector {
                expression: expression.to_string(),
            }),
        }
    }

    /// An 8-GPU node's slice, as NVIDIA's DRA driver publishes it (no driver runs here).
    pub(crate) fn slice(node: &str) -> ResourceSlice {
        let device = |i: usize| Device {
            name: format!("gpu-{i}"),
            attributes: Some(
                [("type", "gpu"), ("productName", "NVIDIA H100 80GB HBM3")]
                    .into_iter()
                    .map(|(k, v)| {
                        (
                            k.to_string(),
                            DeviceAttribute {
                                string: Some(v.to_string()),
                                ..Default::default()
                            },
                        )
                    })
                    .collect(),
            ),
            ..Default::default()
        };
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some(format!("{node}-gpu.nvidia.com")),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: dra::GPU_DRIVER.into(),
                node_name: Some(node.into()),
                pool: ResourcePool {
                    name: node.into(),
                    generation: 1,
                    resource_slice_count: 1,
                },
                devices: Some((0..8).map(device).collect()),
                ..Default::default()
            },
        }
    }

    pub(crate) fn gpu_class() -> DeviceClass {
        DeviceClass {
            metadata: ObjectMeta {
                name: Some(dra::GPU_DRIVER.into()),
                ..Default::default()
            },
            spec: DeviceClassSpec {
                selectors: Some(vec![selector(
                    r#"device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu""#,
                )]),
                ..Default::default()
            },
        }
    }

    fn spec(count: i64) -> ResourceClaimSpec {
        ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: "gpus".into(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: dra::GPU_DRIVER.into(),
                        count: Some(count),
                        ..Default::default()
                    }),
                    first_available: None,
                }]),
                ..Default::default()
            }),
        }
    }

    pub(crate) fn resource_claim(name: &str, count: i64) -> ResourceClaim {
        ResourceClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            spec: spec(count),
            status: None,
        }
    }

    pub(crate) fn view() -> DraView {
        let mut view = DraView {
            served: true,
            ..Default::default()
        };
        assert!(view.set_slices(&[slice("n0"), slice("n1")]));
        view.set_classes(vec![gpu_class()]);
        view
    }

    pub(crate) fn claim_pod(name: &str, uid: &str, claims: &[(&str, Option<&str>)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                resource_claims: Some(
                    claims
                        .iter()
                        .map(|(entry, claim)| PodResourceClaim {
                            name: entry.to_string(),
                            resource_claim_name: claim.map(str::to_string),
                            resource_claim_template_name: claim
                                .is_none()
                                .then(|| "gpus-template".to_string()),
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn key(name: &str) -> PodKey {
        ("default".into(), name.into())
    }

    #[test]
    fn a_tainted_device_is_left_out_and_its_taint_is_a_health_signal() {
        let mut view = DraView::default();
        assert!(view.set_slices(&[slice("n0")]));
        assert!(view.node_devices("n0").device_taints.is_empty());
        let mut tainted = slice("n0");
        tainted.spec.devices.as_mut().unwrap()[3].taints =
            Some(vec![k8s_openapi::api::resource::v1::DeviceTaint {
                key: "gpu.nvidia.com/xid".into(),
                value: Some("48".into()),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]);
        assert!(view.set_slices(&[tainted.clone()]), "a new taint rebuilds");
        let devices = view.node_devices("n0");
        assert_eq!(devices.gpus, 7, "the tainted GPU is left out");
        assert_eq!(devices.device_taints.len(), 1);
        assert_eq!(devices.device_taints[0].key, "gpu.nvidia.com/xid");
        assert_eq!(
            devices.device_taints[0].text,
            "gpu.nvidia.com/xid=48:NoSchedule on gpu.nvidia.com/n0/gpu-3"
        );
        assert!(
            !view.set_slices(&[tainted]),
            "the same slices change nothing"
        );
    }

    #[test]
    fn a_claim_adds_its_gpus_and_an_allocated_one_pins_the_pod() {
        let mut view = view();
        assert_eq!(view.node_gpus("n0"), 8);
        view.set_claim(key("c"), Some(Arc::new(resource_claim("c", 4))));
        let pod = claim_pod("p", "u1", &[("gpus", Some("c"))]);
        assert_eq!(view.gpus(&pod), (4, None));
        let a = view
            .allocate(
                "n1",
                &[view.resolve(&pod).unwrap()[0].claim.clone()],
                &BTreeSet::new(),
            )
            .unwrap();
        let mut allocated = resource_claim("c", 4);
        allocated.status = Some(ResourceClaimStatus {
            allocation: Some(a.claims[0].result.clone()),
            reserved_for: Some(vec![ResourceClaimConsumerReference {
                api_group: None,
                name: "p".into(),
                resource: "pods".into(),
                uid: "u1".into(),
            }]),
            devices: None,
        });
        view.set_claim(key("c"), Some(Arc::new(allocated)));
        assert_eq!(view.gpus(&pod), (4, Some("n1".into())));
        assert_eq!(view.in_use().len(), 4);
        assert_eq!(view.reserved_for("default", "u1").len(), 1);
        // Another pod naming it waits: Gantry does not share a claim.
        let other = claim_pod("q", "u2", &[("gpus", Some("c"))]);
        let err = view.resolve(&other).unwrap_err();
        assert!(
            err.contains("ResourceClaim default/c is reserved for pods p; Gantry does not share"),
            "{err}"
        );
        assert_eq!(view.gpus(&other), (0, None));
    }

    #[test]
    fn missing_refused_and_template_claims_wait_with_why() {
        let mut view = view();
        let pod = claim_pod("p", "u1", &[("gpus", Some("absent"))]);
        assert_eq!(
            view.resolve(&pod).unwrap_err(),
            "spec.resourceClaims[0] (gpus): ResourceClaim default/absent does not exist (yet)"
        );
        // A template: waits for the claim kube-controller-manager creates, then reads it.
        let mut pod = claim_pod("t", "u3", &[("gpus", None)]);
        let err = view.resolve(&pod).unwrap_err();
        assert!(err.contains("ResourceClaimTemplate default/gpus-template does not exist"));
        view.set_template(
            key("gpus-template"),
            Some(Arc::new(ResourceClaimTemplate {
                metadata: ObjectMeta {
                    name: Some("gpus-template".into()),
                    namespace: Some("default".into()),
                    ..Default::default()
                },
                spec: ResourceClaimTemplateSpec {
                    metadata: None,
                    spec: spec(2),
                },
            })),
        );
        let err = view.resolve(&pod).unwrap_err();
        assert!(
            err.contains("waits for its ResourceClaim to be created from ResourceClaimTemplate default/gpus-template"),
            "{err}"
        );
        pod.status = Some(PodStatus {
            resource_claim_statuses: Some(vec![PodResourceClaimStatus {
                name: "gpus".into(),
                resource_claim_name: Some("t-gpus-x7".into()),
            }]),
            ..Default::default()
        });
        view.set_claim(
            key("t-gpus-x7"),
            Some(Arc::new(resource_claim("t-gpus-x7", 2))),
        );
        assert_eq!(view.gpus(&pod), (2, None));
        // A refused field is named; a missing class too.
        let mut refused = resource_claim("r", 1);
        let request = &mut refused
            .spec
            .devices
            .as_mut()
            .unwrap()
            .requests
            .as_mut()
            .unwrap()[0];
        request.exactly.as_mut().unwrap().admin_access = Some(true);
        view.set_claim(key("r"), Some(Arc::new(refused)));
        let err = view
            .resolve(&claim_pod("p", "u", &[("gpus", Some("r"))]))
            .unwrap_err();
        assert!(
            err.contains("exactly.adminAccess is not supported by Gantry"),
            "{err}"
        );
        view.set_classes(Vec::new());
        let err = view.resolve(&pod).unwrap_err();
        assert!(
            err.contains("DeviceClass \"gpu.nvidia.com\" does not exist"),
            "{err}"
        );
        // Without the API, a pod with claims waits saying so.
        view.served = false;
        assert!(
            view.resolve(&pod)
                .unwrap_err()
                .contains("does not serve resource.k8s.io/v1")
        );
    }
}
