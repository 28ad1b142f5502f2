//! Which devices each node has: the `ResourceSlice`s drivers publish, read into per-node
//! devices, with whatever is skipped kept with its reason.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use super::{GPU_DRIVER, Quantity, Semver};
use cel::Value;
use k8s_openapi::api::resource::v1::{DeviceAttribute, ResourceSlice};

/// Which device: the triple a claim's `status.allocation` names and the in-use set is keyed by.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceId {
    /// The driver (`gpu.nvidia.com`).
    pub driver: String,
    /// The pool within the driver (NVIDIA's driver names it after the node).
    pub pool: String,
    /// The device's name, unique within its pool (`gpu-0`).
    pub device: String,
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// One attribute value of a device, typed as the DRA CEL environment types it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttributeValue {
    /// `string`.
    String(String),
    /// `int`.
    Int(i64),
    /// `bool`.
    Bool(bool),
    /// `version`, parsed as a semantic version.
    Version(Semver),
    /// The list forms (`strings`, `ints`, `bools`, `versions`).
    List(Vec<AttributeValue>),
}

impl AttributeValue {
    fn from_api(attr: &DeviceAttribute) -> Result<Self, String> {
        let version = |v: &String| {
            Semver::parse(v).ok_or_else(|| format!("version {v:?} is not a semantic version"))
        };
        if let Some(s) = &attr.string {
            return Ok(Self::String(s.clone()));
        }
        if let Some(i) = attr.int {
            return Ok(Self::Int(i));
        }
        if let Some(b) = attr.bool {
            return Ok(Self::Bool(b));
        }
        if let Some(v) = &attr.version {
            return version(v).map(Self::Version);
        }
        if let Some(list) = &attr.strings {
            return Ok(Self::List(list.iter().cloned().map(Self::String).collect()));
        }
        if let Some(list) = &attr.ints {
            return Ok(Self::List(list.iter().copied().map(Self::Int).collect()));
        }
        if let Some(list) = &attr.bools {
            return Ok(Self::List(list.iter().copied().map(Self::Bool).collect()));
        }
        if let Some(list) = &attr.versions {
            let parsed: Result<Vec<_>, _> = list.iter().map(version).collect();
            return parsed.map(|l| Self::List(l.into_iter().map(Self::Version).collect()));
        }
        Err("no value is set".to_string())
    }

    pub(super) fn to_cel(&self) -> Value {
        match self {
            Self::String(s) => Value::String(Arc::new(s.clone())),
            Self::Int(i) => Value::Int(*i),
            Self::Bool(b) => Value::Bool(*b),
            Self::Version(v) => Value::Opaque(Arc::new(v.clone())),
            Self::List(l) => Value::List(Arc::new(l.iter().map(Self::to_cel).collect())),
        }
    }
}

/// One allocatable device on a node.
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    /// Driver, pool and name.
    pub id: DeviceId,
    /// Attributes by fully qualified name (`gpu.nvidia.com/productName`): an unqualified name
    /// in the slice belongs to the driver's domain, as the CEL environment resolves it.
    pub attributes: BTreeMap<String, AttributeValue>,
    /// Capacities by fully qualified name (`gpu.nvidia.com/memory`).
    pub capacity: BTreeMap<String, Quantity>,
    /// `allowMultipleAllocations` as published. Gantry still gives a device to one claim
    /// only; the flag is exposed to selectors because Kubernetes exposes it.
    pub allow_multiple_allocations: bool,
}

/// The devices Gantry may allocate on one node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeDevices {
    /// The node's name.
    pub node: String,
    /// Sorted by device name (then driver and pool), so allocation is deterministic.
    pub devices: Vec<Device>,
    /// Pools `(driver, pool)` of which not every slice of the newest generation is published
    /// yet: `All` requests are refused on this node until they are, as kube-scheduler does.
    pub incomplete_pools: BTreeSet<(String, String)>,
    /// The DRA taints on the node's devices (tainted devices are left out, but their taints
    /// are health signals a `--health-config` may name).
    pub device_taints: Vec<crate::health::DeviceTaint>,
}

/// Something [`Inventory::from_slices`] left out, and why, for logs and refusals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ignored {
    /// `ResourceSlice NAME` or `device DRIVER/POOL/NAME`.
    pub what: String,
    /// Why it does not count.
    pub reason: String,
}

/// Every node's allocatable devices, from the cluster's ResourceSlices.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inventory {
    /// By node name.
    pub nodes: BTreeMap<String, NodeDevices>,
    /// Slices, pools and devices that do not count, with the reason.
    pub ignored: Vec<Ignored>,
}

fn qualify(name: &str, driver: &str) -> String {
    if name.contains('/') {
        name.to_string()
    } else {
        format!("{driver}/{name}")
    }
}

impl Inventory {
    /// Reads ResourceSlices into per-node devices. Only node-local slices (`spec.nodeName`)
    /// count; within a pool only the highest `pool.generation` counts (older slices are
    /// leftovers the driver is replacing). Devices Gantry cannot honour (tainted, partitioned
    /// through shared counters, needing binding conditions) are left out, with the reason.
    pub fn from_slices(slices: &[ResourceSlice]) -> Self {
        let mut inventory = Inventory::default();
        let slice_name = |s: &ResourceSlice| {
            format!(
                "ResourceSlice {}",
                s.metadata.name.as_deref().unwrap_or("<unnamed>")
            )
        };
        // The newest generation of each pool, over every slice of it, node-local or not.
        let mut newest: HashMap<(&str, &str), i64> = HashMap::new();
        for s in slices {
            let key = (s.spec.driver.as_str(), s.spec.pool.name.as_str());
            let g = newest.entry(key).or_insert(s.spec.pool.generation);
            *g = (*g).max(s.spec.pool.generation);
        }
        // (driver, pool) -> slices of the newest generation that are node-local.
        let mut pools: BTreeMap<(String, String), Vec<&ResourceSlice>> = BTreeMap::new();
        for s in slices {
            let spec = &s.spec;
            let not_local = if spec.node_selector.is_some() {
                Some("spec.nodeSelector")
            } else if spec.all_nodes == Some(true) {
                Some("spec.allNodes")
            } else if spec.per_device_node_selection == Some(true) {
                Some("spec.perDeviceNodeSelection")
            } else {
                None
            };
            if let Some(field) = not_local {
                inventory.ignored.push(Ignored {
                    what: slice_name(s),
                    reason: format!(
                        "uses {field}; Gantry only supports node-local slices (spec.nodeName)"
                    ),
                });
                continue;
            }
            if spec.node_name.as_deref().unwrap_or("").is_empty() {
                inventory.ignored.push(Ignored {
                    what: slice_name(s),
                    reason: "has no spec.nodeName; Gantry only supports node-local slices"
                        .to_string(),
                });
                continue;
            }
            let key = (spec.driver.as_str(), spec.pool.name.as_str());
            let top = newest.get(&key).copied().unwrap_or(spec.pool.generation);
            if spec.pool.generation < top {
                inventory.ignored.push(Ignored {
                    what: slice_name(s),
                    reason: format!(
                        "pool {}/{} generation {} is superseded by generation {top}",
                        spec.driver, spec.pool.name, spec.pool.generation
                    ),
                });
                continue;
            }
            pools
                .entry((spec.driver.clone(), spec.pool.name.clone()))
                .or_default()
                .push(s);
        }
        for ((driver, pool), members) in pools {
            let expected = members
                .iter()
                .map(|s| s.spec.pool.resource_slice_count)
                .max()
                .unwrap_or(0);
            let mut seen: BTreeSet<&str> = BTreeSet::new();
            let duplicate = members
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .find(|d| !seen.insert(d.name.as_str()));
            if let Some(d) = duplicate {
                inventory.ignored.push(Ignored {
                    what: format!("pool {driver}/{pool}"),
                    reason: format!(
                        "device name {:?} appears more than once; the pool is invalid",
                        d.name
                    ),
                });
                continue;
            }
            for s in &members {
                let node = s.spec.node_name.clone().unwrap_or_default();
                let entry = inventory
                    .nodes
                    .entry(node.clone())
                    .or_insert_with(|| NodeDevices {
                        node,
                        ..Default::default()
                    });
                if i64::try_from(members.len()).unwrap_or(i64::MAX) < expected {
                    entry
                        .incomplete_pools
                        .insert((driver.clone(), pool.clone()));
                }
                for d in s.spec.devices.iter().flatten() {
                    let id = DeviceId {
                        driver: driver.clone(),
                        pool: pool.clone(),
                        device: d.name.clone(),
                    };
                    for t in d.taints.iter().flatten() {
                        entry.device_taints.push(crate::health::DeviceTaint {
                            key: t.key.clone(),
                            text: format!(
                                "{}={}:{} on {id}",
                                t.key,
                                t.value.as_deref().unwrap_or(""),
                                t.effect
                            ),
                        });
                    }
                    match device_from_api(&id, d) {
                        Ok(device) => entry.devices.push(device),
                        Err(reason) => inventory.ignored.push(Ignored {
                            what: format!("device {id}"),
                            reason,
                        }),
                    }
                }
            }
        }
        for node in inventory.nodes.values_mut() {
            node.devices.sort_by(|a, b| {
                (&a.id.device, &a.id.driver, &a.id.pool).cmp(&(
                    &b.id.device,
                    &b.id.driver,
                    &b.id.pool,
                ))
            });
        }
        inventory
    }

    /// The devices of one node; `None` for a node no slice names.
    pub fn node(&self, name: &str) -> Option<&NodeDevices> {
        self.nodes.get(name)
    }
}

fn device_from_api(
    id: &DeviceId,
    d: &k8s_openapi::api::resource::v1::Device,
) -> Result<Device, String> {
    if let Some(t) = d
        .taints
        .iter()
        .flatten()
        .find(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
    {
        return Err(format!(
            "is tainted {}={}:{}; Gantry does not support device taints and tolerations",
            t.key,
            t.value.as_deref().unwrap_or(""),
            t.effect
        ));
    }
    if d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty()) {
        return Err(
            "consumes shared counters (a partitionable device); Gantry does not \
                    support partitionable devices"
                .to_string(),
        );
    }
    if d.binds_to_node == Some(true) || d.binding_conditions.as_ref().is_some_and(|c| !c.is_empty())
    {
        return Err("needs binding conditions; Gantry does not support them".to_string());
    }
    let mut attributes = BTreeMap::new();
    for (name, attr) in d.attributes.iter().flatten() {
        let value = AttributeValue::from_api(attr).map_err(|e| format!("attribute {name}: {e}"))?;
        attributes.insert(qualify(name, &id.driver), value);
    }
    let mut capacity = BTreeMap::new();
    for (name, cap) in d.capacity.iter().flatten() {
        let q = Quantity::parse(&cap.value.0)
            .ok_or_else(|| format!("capacity {name}: {:?} is not a quantity", cap.value.0))?;
        capacity.insert(qualify(name, &id.driver), q);
    }
    Ok(Device {
        id: id.clone(),
        attributes,
        capacity,
        allow_multiple_allocations: d.allow_multiple_allocations.unwrap_or(false),
    })
}

/// How many of a node's devices are GPUs: devices of [`GPU_DRIVER`] whose `type` attribute is
/// `"gpu"`, the devices the `gpu.nvidia.com` DeviceClass selects (MIG slices, `type: "mig"`,
/// are not whole GPUs). For the node table's GPU column.
pub fn gpus_on_node(node: &NodeDevices) -> u32 {
    let key = format!("{GPU_DRIVER}/type");
    let count = node
        .devices
        .iter()
        .filter(|d| d.id.driver == GPU_DRIVER)
        .filter(|d| matches!(d.attributes.get(&key), Some(AttributeValue::String(t)) if t == "gpu"))
        .count();
    u32::try_from(count).unwrap_or(u32::MAX)
}
