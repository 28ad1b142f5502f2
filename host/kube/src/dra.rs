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
#![warn(missing_docs)]

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use cel::extractors::This;
use cel::objects::{Key, Map, Opaque};
use cel::{Context, Env, ExecutionError, Program, Value};
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult, DeviceAttribute,
    DeviceClass, DeviceRequestAllocationResult, DeviceSelector, OpaqueDeviceConfiguration,
    ResourceClaim, ResourceClaimSpec, ResourceClaimTemplate, ResourceSlice,
};

/// The driver whose devices [`gpus_on_node`] counts: NVIDIA's DRA driver (k8s-dra-driver-gpu).
pub const GPU_DRIVER: &str = "gpu.nvidia.com";

// ------------------------------------------------------------------------------------------
// Quantities and versions
// ------------------------------------------------------------------------------------------

/// A resource quantity ("80Gi", "500m") as an exact integer count of nano-units, so that
/// capacities compare exactly, as Kubernetes compares `resource.Quantity`, with no float
/// rounding between "80Gi" and "85899345920".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    nanos: i128,
}

const NANOS: i128 = 1_000_000_000;

impl Quantity {
    /// Parses Kubernetes' quantity syntax: an optionally signed decimal number, then a binary
    /// (`Ki`…`Ei`), decimal (`n`, `u`, `m`, `k`, `M`…`E`) or exponent (`e3`) suffix. Anything
    /// finer than a nano-unit is rounded up, as the API server rounds. `None` for other text.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let (negative, rest) = match text.as_bytes().first()? {
            b'-' => (true, &text[1..]),
            b'+' => (false, &text[1..]),
            _ => (false, text),
        };
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(split);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return None;
        }
        // value = digits / 10^fraction_len * base^exp, in nano-units.
        let digits: String = format!("{whole}{fraction}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > 30 {
            return None;
        }
        let mantissa: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().ok()?
        };
        let mut decimal_exp: i32 = -i32::try_from(fraction.len()).ok()?;
        let mut binary_exp: u32 = 0;
        match suffix {
            "" => {}
            "n" => decimal_exp -= 9,
            "u" => decimal_exp -= 6,
            "m" => decimal_exp -= 3,
            "k" => decimal_exp += 3,
            "M" => decimal_exp += 6,
            "G" => decimal_exp += 9,
            "T" => decimal_exp += 12,
            "P" => decimal_exp += 15,
            "E" => decimal_exp += 18,
            "Ki" => binary_exp = 10,
            "Mi" => binary_exp = 20,
            "Gi" => binary_exp = 30,
            "Ti" => binary_exp = 40,
            "Pi" => binary_exp = 50,
            "Ei" => binary_exp = 60,
            _ if suffix.starts_with(['e', 'E']) => {
                let exp: i32 = suffix[1..].parse().ok()?;
                if exp.abs() > 40 {
                    return None;
                }
                decimal_exp += exp;
            }
            _ => return None,
        }
        decimal_exp += 9; // to nano-units
        let mut numerator = mantissa.checked_mul(1i128.checked_shl(binary_exp)?)?;
        let mut denominator: i128 = 1;
        if decimal_exp >= 0 {
            numerator = numerator.checked_mul(10i128.checked_pow(decimal_exp.unsigned_abs())?)?;
        } else {
            denominator = 10i128.checked_pow(decimal_exp.unsigned_abs())?;
        }
        let nanos = numerator.div_ceil_positive(denominator);
        Some(Self {
            nanos: if negative { -nanos } else { nanos },
        })
    }

    /// The value in whole units, rounded up (what a count or a byte size means).
    pub fn value(&self) -> i128 {
        self.nanos.div_ceil_positive(NANOS)
    }

    /// The value in nano-units, exact.
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    fn is_integer(&self) -> bool {
        self.nanos % NANOS == 0
    }
}

/// Ceiling division for a positive denominator without the unstable `div_ceil` on signed ints.
trait DivCeil {
    fn div_ceil_positive(self, d: i128) -> i128;
}

impl DivCeil for i128 {
    fn div_ceil_positive(self, d: i128) -> i128 {
        let q = self / d;
        if self % d > 0 { q + 1 } else { q }
    }
}

impl Opaque for Quantity {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

/// A semantic version attribute (`cudaComputeCapability: 9.0.0`), parsed strictly as
/// Kubernetes parses `version` attributes, ordered by semver precedence (build metadata
/// ignored) so `isGreaterThan` means what a driver's user expects.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Semver {
    major: u64,
    minor: u64,
    patch: u64,
    /// Pre-releases sort before the release they lead to, as semver says.
    release: ReleaseOrder,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum ReleaseOrder {
    Pre(Vec<PreId>),
    Release,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum PreId {
    Numeric(u64),
    Alpha(String),
}

impl Semver {
    /// Parses `MAJOR.MINOR.PATCH[-pre][+build]` with no leading zeros and no `v` prefix.
    pub fn parse(text: &str) -> Option<Self> {
        let numeric = |s: &str| -> Option<u64> {
            if s.is_empty() || (s.len() > 1 && s.starts_with('0')) {
                return None;
            }
            if !s.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            s.parse().ok()
        };
        let ident_ok =
            |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        let (rest, build) = match text.split_once('+') {
            Some((rest, build)) => (rest, Some(build)),
            None => (text, None),
        };
        if let Some(build) = build
            && !build.split('.').all(ident_ok)
        {
            return None;
        }
        let (core, pre) = match rest.split_once('-') {
            Some((core, pre)) => (core, Some(pre)),
            None => (rest, None),
        };
        let mut parts = core.split('.');
        let major = numeric(parts.next()?)?;
        let minor = numeric(parts.next()?)?;
        let patch = numeric(parts.next()?)?;
        if parts.next().is_some() {
            return None;
        }
        let release = match pre {
            None => ReleaseOrder::Release,
            Some(pre) => {
                let mut ids = Vec::new();
                for id in pre.split('.') {
                    if !ident_ok(id) {
                        return None;
                    }
                    if id.bytes().all(|b| b.is_ascii_digit()) {
                        ids.push(PreId::Numeric(numeric(id)?));
                    } else {
                        ids.push(PreId::Alpha(id.to_string()));
                    }
                }
                ReleaseOrder::Pre(ids)
            }
        };
        Some(Self {
            major,
            minor,
            patch,
            release,
        })
    }
}

impl Opaque for Semver {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Semver"
    }
}

// ------------------------------------------------------------------------------------------
// Inventory
// ------------------------------------------------------------------------------------------

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

    fn to_cel(&self) -> Value {
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

// ------------------------------------------------------------------------------------------
// CEL selectors
// ------------------------------------------------------------------------------------------

struct Compiled {
    program: Program,
    /// The expression's string literals: any of them used as a domain the device lacks must
    /// index to an empty map, as Kubernetes' `device.attributes` and `device.capacity` do.
    literals: Vec<String>,
}

/// Device selectors, each distinct expression compiled once (a scheduler sees the same few
/// DeviceClass and claim selectors for every node and every cycle), then evaluated per device.
pub struct SelectorCache {
    env: Arc<Env>,
    compiled: HashMap<String, Result<Compiled, String>>,
    compilations: usize,
}

impl Default for SelectorCache {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for SelectorCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SelectorCache")
            .field("expressions", &self.compiled.len())
            .field("compilations", &self.compilations)
            .finish()
    }
}

impl SelectorCache {
    /// An empty cache over CEL's standard library.
    pub fn new() -> Self {
        Self {
            env: Arc::new(Env::stdlib()),
            compiled: HashMap::new(),
            compilations: 0,
        }
    }

    /// How many times an expression was compiled: once per distinct expression, ever.
    pub fn compilations(&self) -> usize {
        self.compilations
    }

    /// Compiles `expression` unless it already was; the compile error, if any, is kept too so
    /// a bad selector is not re-parsed for every device.
    pub fn compile(&mut self, expression: &str) -> Result<(), String> {
        self.entry(expression).map(|_| ())
    }

    fn entry(&mut self, expression: &str) -> Result<&Compiled, String> {
        if !self.compiled.contains_key(expression) {
            self.compilations += 1;
            let compiled = self
                .env
                .compile(expression)
                .map(|program| Compiled {
                    program,
                    literals: string_literals(expression),
                })
                .map_err(|e| {
                    format!(
                        "CEL selector {expression:?} does not compile: {}",
                        one_line(&e.to_string())
                    )
                });
            self.compiled.insert(expression.to_string(), compiled);
        }
        match self.compiled.get(expression) {
            Some(Ok(c)) => Ok(c),
            Some(Err(e)) => Err(e.clone()),
            None => Err(format!("CEL selector {expression:?} is not compiled")),
        }
    }

    /// Whether `device` satisfies `expression`. A compile error, a runtime error or a result
    /// that is not a bool is an `Err` naming the expression (kube-scheduler reports a CEL
    /// runtime error the same way and allocates nothing); never a panic, never a match.
    pub fn matches(&mut self, expression: &str, device: &Device) -> Result<bool, String> {
        let env = self.env.clone();
        let compiled = self.entry(expression)?;
        let mut context = Context::with_env(env);
        register_functions(&mut context)
            .map_err(|e| format!("CEL selector {expression:?}: cannot set up: {e}"))?;
        context.add_variable_from_value("device", device_value(device, &compiled.literals));
        match compiled.program.execute(&context) {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => Err(format!(
                "CEL selector {expression:?} evaluated to {}, not bool, for device {}",
                other.type_of(),
                device.id
            )),
            Err(e) => Err(format!(
                "CEL runtime error in selector {expression:?} for device {}: {e}",
                device.id
            )),
        }
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The contents of every quoted string literal in a CEL expression (a superset is harmless:
/// it only pads the domain maps with empty entries).
fn string_literals(expression: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = expression.chars();
    while let Some(c) = chars.next() {
        if c != '"' && c != '\'' {
            continue;
        }
        let mut literal = String::new();
        while let Some(d) = chars.next() {
            match d {
                '\\' => {
                    if let Some(e) = chars.next() {
                        literal.push(e);
                    }
                }
                _ if d == c => break,
                _ => literal.push(d),
            }
        }
        out.push(literal);
    }
    out
}

fn string_key(s: &str) -> Key {
    Key::String(Arc::new(s.to_string()))
}

fn map_value(map: HashMap<Key, Value>) -> Value {
    Value::Map(Map { map: Arc::new(map) })
}

/// `device.attributes` or `device.capacity`: domain → name → value, with an empty map for any
/// domain the expression names but the device lacks.
fn domain_maps<'a>(entries: impl Iterator<Item = (&'a String, Value)>, pad: &[String]) -> Value {
    let mut domains: BTreeMap<&str, HashMap<Key, Value>> = BTreeMap::new();
    for (qualified, value) in entries {
        let (domain, name) = qualified.split_once('/').unwrap_or(("", qualified));
        domains
            .entry(domain)
            .or_default()
            .insert(string_key(name), value);
    }
    let mut outer: HashMap<Key, Value> = domains
        .into_iter()
        .map(|(d, inner)| (string_key(d), map_value(inner)))
        .collect();
    for literal in pad {
        outer
            .entry(string_key(literal))
            .or_insert_with(|| map_value(HashMap::new()));
    }
    map_value(outer)
}

fn device_value(device: &Device, pad: &[String]) -> Value {
    let attributes = domain_maps(device.attributes.iter().map(|(k, v)| (k, v.to_cel())), pad);
    let capacity = domain_maps(
        device
            .capacity
            .iter()
            .map(|(k, q)| (k, Value::Opaque(Arc::new(*q)))),
        pad,
    );
    let mut fields = HashMap::new();
    fields.insert(
        string_key("driver"),
        Value::String(Arc::new(device.id.driver.clone())),
    );
    fields.insert(
        string_key("allowMultipleAllocations"),
        Value::Bool(device.allow_multiple_allocations),
    );
    fields.insert(string_key("attributes"), attributes);
    fields.insert(string_key("capacity"), capacity);
    map_value(fields)
}

enum Ordered<'a> {
    Quantity(&'a Quantity),
    Semver(&'a Semver),
}

fn ordered<'a>(function: &str, v: &'a Value) -> Result<Ordered<'a>, ExecutionError> {
    if let Value::Opaque(o) = v {
        if let Some(q) = o.downcast_ref::<Quantity>() {
            return Ok(Ordered::Quantity(q));
        }
        if let Some(s) = o.downcast_ref::<Semver>() {
            return Ok(Ordered::Semver(s));
        }
    }
    Err(ExecutionError::function_error(
        function,
        format!("wants a quantity or a semver, got {}", v.type_of()),
    ))
}

fn compare(function: &str, this: &Value, other: &Value) -> Result<Ordering, ExecutionError> {
    match (ordered(function, this)?, ordered(function, other)?) {
        (Ordered::Quantity(a), Ordered::Quantity(b)) => Ok(a.cmp(b)),
        (Ordered::Semver(a), Ordered::Semver(b)) => Ok(a.cmp(b)),
        _ => Err(ExecutionError::function_error(
            function,
            "cannot compare a quantity with a semver",
        )),
    }
}

fn quantity_of<'a>(function: &str, v: &'a Value) -> Result<&'a Quantity, ExecutionError> {
    match ordered(function, v)? {
        Ordered::Quantity(q) => Ok(q),
        Ordered::Semver(_) => Err(ExecutionError::function_error(
            function,
            "wants a quantity, got a semver",
        )),
    }
}

fn semver_of<'a>(function: &str, v: &'a Value) -> Result<&'a Semver, ExecutionError> {
    match ordered(function, v)? {
        Ordered::Semver(s) => Ok(s),
        Ordered::Quantity(_) => Err(ExecutionError::function_error(
            function,
            "wants a semver, got a quantity",
        )),
    }
}

fn cel_quantity(text: Arc<String>) -> Result<Value, ExecutionError> {
    Quantity::parse(&text)
        .map(|q| Value::Opaque(Arc::new(q)))
        .ok_or_else(|| {
            ExecutionError::function_error("quantity", format!("{text:?} is not a quantity"))
        })
}

fn cel_is_quantity(text: Arc<String>) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(Quantity::parse(&text).is_some()))
}

fn cel_semver(text: Arc<String>) -> Result<Value, ExecutionError> {
    Semver::parse(&text)
        .map(|s| Value::Opaque(Arc::new(s)))
        .ok_or_else(|| {
            ExecutionError::function_error("semver", format!("{text:?} is not a semantic version"))
        })
}

fn cel_is_semver(text: Arc<String>) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(Semver::parse(&text).is_some()))
}

fn cel_compare_to(This(this): This<Value>, other: Value) -> Result<Value, ExecutionError> {
    Ok(Value::Int(match compare("compareTo", &this, &other)? {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    }))
}

fn cel_is_greater_than(This(this): This<Value>, other: Value) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(
        compare("isGreaterThan", &this, &other)? == Ordering::Greater,
    ))
}

fn cel_is_less_than(This(this): This<Value>, other: Value) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(
        compare("isLessThan", &this, &other)? == Ordering::Less,
    ))
}

fn cel_is_integer(This(this): This<Value>) -> Result<Value, ExecutionError> {
    let q = quantity_of("isInteger", &this)?;
    Ok(Value::Bool(
        q.is_integer() && i64::try_from(q.nanos / NANOS).is_ok(),
    ))
}

fn cel_as_integer(This(this): This<Value>) -> Result<Value, ExecutionError> {
    let q = quantity_of("asInteger", &this)?;
    if !q.is_integer() {
        return Err(ExecutionError::function_error(
            "asInteger",
            "the quantity is not an integer",
        ));
    }
    i64::try_from(q.nanos / NANOS)
        .map(Value::Int)
        .map_err(|_| ExecutionError::function_error("asInteger", "the quantity overflows int"))
}

fn cel_sign(This(this): This<Value>) -> Result<Value, ExecutionError> {
    let q = quantity_of("sign", &this)?;
    Ok(Value::Int(match q.nanos.cmp(&0) {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    }))
}

fn semver_part(
    function: &str,
    this: &Value,
    part: fn(&Semver) -> u64,
) -> Result<Value, ExecutionError> {
    let s = semver_of(function, this)?;
    i64::try_from(part(s))
        .map(Value::Int)
        .map_err(|_| ExecutionError::function_error(function, "overflows int"))
}

fn cel_major(This(this): This<Value>) -> Result<Value, ExecutionError> {
    semver_part("major", &this, |s| s.major)
}

fn cel_minor(This(this): This<Value>) -> Result<Value, ExecutionError> {
    semver_part("minor", &this, |s| s.minor)
}

fn cel_patch(This(this): This<Value>) -> Result<Value, ExecutionError> {
    semver_part("patch", &this, |s| s.patch)
}

/// The subset of Kubernetes' `quantity` and `semver` CEL libraries Gantry supports.
fn register_functions(context: &mut Context) -> Result<(), cel::DeclarationError> {
    context.add_function("quantity", cel_quantity)?;
    context.add_function("isQuantity", cel_is_quantity)?;
    context.add_function("semver", cel_semver)?;
    context.add_function("isSemver", cel_is_semver)?;
    context.add_function("compareTo", cel_compare_to)?;
    context.add_function("isGreaterThan", cel_is_greater_than)?;
    context.add_function("isLessThan", cel_is_less_than)?;
    context.add_function("isInteger", cel_is_integer)?;
    context.add_function("asInteger", cel_as_integer)?;
    context.add_function("sign", cel_sign)?;
    context.add_function("major", cel_major)?;
    context.add_function("minor", cel_minor)?;
    context.add_function("patch", cel_patch)?;
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Claims
// ------------------------------------------------------------------------------------------

/// How many devices a request wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocationMode {
    /// Exactly this many (`allocationMode: ExactCount`, the default, `count` default 1).
    ExactCount(u32),
    /// Every matching device on the node (`allocationMode: All`); refused if any is in use.
    All,
}

/// One request of a claim (`spec.devices.requests[i].exactly`), its DeviceClass resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The request's name, which `status.allocation.devices.results[].request` repeats.
    pub name: String,
    /// The DeviceClass it names.
    pub class: String,
    /// The DeviceClass's selectors, evaluated first (a device the class rejects is never
    /// shown to the request's own selectors, as in kube-scheduler).
    pub class_selectors: Vec<String>,
    /// The request's own selectors.
    pub selectors: Vec<String>,
    /// How many devices.
    pub mode: AllocationMode,
    /// The DeviceClass's opaque configuration, handed to the driver through the allocation.
    pub class_config: Vec<OpaqueDeviceConfiguration>,
}

/// A claim's requests, ready to allocate.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The claim's name (for a template, the name the caller will create it under).
    pub name: String,
    /// In spec order.
    pub requests: Vec<Request>,
    /// `spec.devices.config`, copied to the allocation (`source: FromClaim`).
    pub config: Vec<DeviceAllocationConfiguration>,
}

fn selector_expressions(
    selectors: &Option<Vec<DeviceSelector>>,
    path: &str,
) -> Result<Vec<String>, String> {
    selectors
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, s)| {
            s.cel
                .as_ref()
                .map(|c| c.expression.clone())
                .ok_or_else(|| format!("{path}[{i}].cel is not set (the only kind of selector)"))
        })
        .collect()
}

fn unsupported(path: &str, what: &str) -> String {
    format!("{path} is not supported by Gantry; {what}")
}

impl Claim {
    /// Reads a ResourceClaim. Errors name the claim and the field path.
    pub fn from_resource_claim(
        claim: &ResourceClaim,
        classes: &[DeviceClass],
    ) -> Result<Self, String> {
        let name = claim.metadata.name.clone().unwrap_or_default();
        let ns = claim.metadata.namespace.as_deref().unwrap_or("");
        Self::from_spec(&name, &claim.spec, "spec", classes)
            .map_err(|e| format!("ResourceClaim {ns}/{name}: {e}"))
    }

    /// Reads a ResourceClaimTemplate's `spec.spec`, for the claim the caller will create from
    /// it under `claim_name`. Errors name the template and the field path.
    pub fn from_template(
        template: &ResourceClaimTemplate,
        claim_name: &str,
        classes: &[DeviceClass],
    ) -> Result<Self, String> {
        let ns = template.metadata.namespace.as_deref().unwrap_or("");
        let name = template.metadata.name.as_deref().unwrap_or("");
        Self::from_spec(claim_name, &template.spec.spec, "spec.spec", classes)
            .map_err(|e| format!("ResourceClaimTemplate {ns}/{name}: {e}"))
    }

    /// Reads a claim spec found at `path` (`spec` in a claim, `spec.spec` in a template).
    /// `firstAvailable`, `constraints`, admin access, capacity requests and tolerations are
    /// refused by path: honouring only part of a claim would hand a pod devices it did not ask
    /// for.
    pub fn from_spec(
        name: &str,
        spec: &ResourceClaimSpec,
        path: &str,
        classes: &[DeviceClass],
    ) -> Result<Self, String> {
        let mut claim = Claim {
            name: name.to_string(),
            requests: Vec::new(),
            config: Vec::new(),
        };
        let Some(devices) = &spec.devices else {
            return Ok(claim);
        };
        if devices.constraints.as_ref().is_some_and(|c| !c.is_empty()) {
            return Err(unsupported(
                &format!("{path}.devices.constraints"),
                "matchAttribute and distinctAttribute are not enforced, so the claim is refused",
            ));
        }
        for (i, request) in devices.requests.iter().flatten().enumerate() {
            let at = format!("{path}.devices.requests[{i}]");
            if request.first_available.is_some() {
                return Err(unsupported(
                    &format!("{at}.firstAvailable"),
                    "prioritized lists are not supported; use exactly",
                ));
            }
            let Some(exactly) = &request.exactly else {
                return Err(format!("{at}: neither exactly nor firstAvailable is set"));
            };
            let at = format!("{at}.exactly");
            if exactly.admin_access == Some(true) {
                return Err(unsupported(
                    &format!("{at}.adminAccess"),
                    "admin access to devices in use is not supported",
                ));
            }
            if exactly.capacity.is_some() {
                return Err(unsupported(
                    &format!("{at}.capacity"),
                    "consumable capacity is not supported; devices are allocated whole",
                ));
            }
            if exactly.tolerations.as_ref().is_some_and(|t| !t.is_empty()) {
                return Err(unsupported(
                    &format!("{at}.tolerations"),
                    "device taints are not supported, tainted devices are never allocated",
                ));
            }
            let mode = match exactly.allocation_mode.as_deref() {
                None | Some("") | Some("ExactCount") => {
                    let count = exactly.count.unwrap_or(1);
                    let count = u32::try_from(count)
                        .ok()
                        .filter(|&c| c >= 1)
                        .ok_or_else(|| format!("{at}.count: {count} is not a positive count"))?;
                    AllocationMode::ExactCount(count)
                }
                Some("All") => AllocationMode::All,
                Some(other) => {
                    return Err(format!(
                        "{at}.allocationMode: {other:?} is neither ExactCount nor All"
                    ));
                }
            };
            let class_name = &exactly.device_class_name;
            let class = classes
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(class_name.as_str()))
                .ok_or_else(|| {
                    format!("{at}.deviceClassName: DeviceClass {class_name:?} does not exist")
                })?;
            let class_selectors = selector_expressions(
                &class.spec.selectors,
                &format!("DeviceClass {class_name} spec.selectors"),
            )?;
            let selectors = selector_expressions(&exactly.selectors, &format!("{at}.selectors"))?;
            let class_config = class
                .spec
                .config
                .iter()
                .flatten()
                .filter_map(|c| c.opaque.clone())
                .collect();
            claim.requests.push(Request {
                name: request.name.clone(),
                class: class_name.clone(),
                class_selectors,
                selectors,
                mode,
                class_config,
            });
        }
        for c in devices.config.iter().flatten() {
            if let Some(opaque) = &c.opaque {
                claim.config.push(DeviceAllocationConfiguration {
                    source: "FromClaim".to_string(),
                    requests: c.requests.clone(),
                    opaque: Some(opaque.clone()),
                });
            }
        }
        Ok(claim)
    }
}

// ------------------------------------------------------------------------------------------
// Allocation
// ------------------------------------------------------------------------------------------

/// What one claim got.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimAllocation {
    /// The claim's name.
    pub claim: String,
    /// `(request, device)` in request order, then device order.
    pub devices: Vec<(String, DeviceId)>,
    /// The claim's `status.allocation`, as Kubernetes writes it (without the timestamp).
    pub result: AllocationResult,
}

/// What a pod's claims got on one node.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// One per claim, in the order given.
    pub claims: Vec<ClaimAllocation>,
}

impl Allocation {
    /// Every device allocated, for the caller's in-use set.
    pub fn devices(&self) -> impl Iterator<Item = &DeviceId> {
        self.claims
            .iter()
            .flat_map(|c| c.devices.iter().map(|(_, d)| d))
    }
}

/// Whether `device` satisfies a request: the class's selectors first, then the request's.
fn request_matches(
    request: &Request,
    device: &Device,
    cache: &mut SelectorCache,
) -> Result<bool, String> {
    for expression in request.class_selectors.iter().chain(&request.selectors) {
        if !cache.matches(expression, device)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// One device to find: slot `k` of request `r` of claim `c`.
struct Slot {
    claim: usize,
    request: usize,
    /// Indices into the node's devices, free and matching, in device order.
    candidates: Vec<usize>,
}

/// Kuhn's augmenting path: give `slot` a device, moving earlier slots to other candidates if
/// need be, so a request that could go elsewhere does not starve a pickier one.
fn augment(slot: usize, slots: &[Slot], owner: &mut [Option<usize>], visited: &mut [bool]) -> bool {
    // A free candidate first: without contention this is plain lowest-name-first, and nothing
    // already placed moves.
    if let Some(&d) = slots[slot]
        .candidates
        .iter()
        .find(|&&d| !visited[d] && owner[d].is_none())
    {
        visited[d] = true;
        owner[d] = Some(slot);
        return true;
    }
    for &d in &slots[slot].candidates {
        if visited[d] {
            continue;
        }
        visited[d] = true;
        let free = match owner[d] {
            None => true,
            Some(other) => augment(other, slots, owner, visited),
        };
        if free {
            owner[d] = Some(slot);
            return true;
        }
    }
    false
}

fn node_selector(node: &str) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".to_string(),
                operator: "In".to_string(),
                values: Some(vec![node.to_string()]),
            }]),
            match_expressions: None,
        }],
    }
}

/// Chooses free devices on `node` for every request of every claim, all or nothing.
/// Deterministic: among equally good choices the lowest device names win, so `count: 2` on an
/// idle 8-GPU node gets `gpu-0` and `gpu-1`. `in_use` holds the devices other claims hold.
/// The error says which claim and request cannot be satisfied and why, or which selector
/// failed to compile or evaluate.
pub fn allocate(
    node: &NodeDevices,
    claims: &[Claim],
    in_use: &BTreeSet<DeviceId>,
    cache: &mut SelectorCache,
) -> Result<Allocation, String> {
    let devices = &node.devices;
    let mut owner: Vec<Option<usize>> = vec![None; devices.len()];
    // Fixed picks: (claim, request) -> devices, for All requests.
    let mut fixed: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
    let mut taken: Vec<bool> = vec![false; devices.len()];
    let mut slots: Vec<Slot> = Vec::new();
    // Matching devices per request, computed once.
    let mut matching: Vec<Vec<Vec<usize>>> = Vec::with_capacity(claims.len());
    for claim in claims {
        let mut per_request = Vec::with_capacity(claim.requests.len());
        for request in &claim.requests {
            let mut m = Vec::new();
            for (i, d) in devices.iter().enumerate() {
                let ok = request_matches(request, d, cache)
                    .map_err(|e| format!("claim {}, request {}: {e}", claim.name, request.name))?;
                if ok {
                    m.push(i);
                }
            }
            per_request.push(m);
        }
        matching.push(per_request);
    }
    // All requests first: their devices are fixed.
    for (c, claim) in claims.iter().enumerate() {
        for (r, request) in claim.requests.iter().enumerate() {
            if request.mode != AllocationMode::All {
                continue;
            }
            let at = format!("claim {}, request {}", claim.name, request.name);
            let m = &matching[c][r];
            if m.is_empty() {
                return Err(format!(
                    "{at}: wants all devices of class {}, but node {} has none that match",
                    request.class, node.node
                ));
            }
            if let Some((driver, pool)) = m
                .iter()
                .map(|&i| (&devices[i].id.driver, &devices[i].id.pool))
                .find(|(d, p)| {
                    node.incomplete_pools
                        .contains(&((*d).clone(), (*p).clone()))
                })
            {
                return Err(format!(
                    "{at}: wants all devices of class {}, but pool {driver}/{pool} on node {} \
                     is being updated (not all its slices are published)",
                    request.class, node.node
                ));
            }
            let busy: Vec<&str> = m
                .iter()
                .filter(|&&i| in_use.contains(&devices[i].id) || taken[i])
                .map(|&i| devices[i].id.device.as_str())
                .collect();
            if !busy.is_empty() {
                return Err(format!(
                    "{at}: wants all {} matching devices of class {} on node {}, but {} are in \
                     use ({})",
                    m.len(),
                    request.class,
                    node.node,
                    busy.len(),
                    busy.join(", ")
                ));
            }
            for &i in m {
                taken[i] = true;
            }
            fixed.insert((c, r), m.clone());
        }
    }
    // ExactCount requests: one slot per device wanted.
    for (c, claim) in claims.iter().enumerate() {
        for (r, request) in claim.requests.iter().enumerate() {
            let AllocationMode::ExactCount(count) = request.mode else {
                continue;
            };
            let m = &matching[c][r];
            let free: Vec<usize> = m
                .iter()
                .copied()
                .filter(|&i| !taken[i] && !in_use.contains(&devices[i].id))
                .collect();
            if free.len() < count as usize {
                return Err(format!(
                    "claim {}, request {}: wants {count} device{} of class {}, but node {} has \
                     {} that match, {} of them free",
                    claim.name,
                    request.name,
                    if count == 1 { "" } else { "s" },
                    request.class,
                    node.node,
                    m.len(),
                    free.len()
                ));
            }
            for _ in 0..count {
                slots.push(Slot {
                    claim: c,
                    request: r,
                    candidates: free.clone(),
                });
            }
        }
    }
    for s in 0..slots.len() {
        let mut visited = vec![false; devices.len()];
        if !augment(s, &slots, &mut owner, &mut visited) {
            return Err(format!(
                "the pod's claims together want {} devices on node {} that no assignment of its \
                 free devices can satisfy at once",
                slots.len(),
                node.node
            ));
        }
    }
    // Per (claim, request), the devices it got, in device order.
    let mut got: BTreeMap<(usize, usize), Vec<usize>> = fixed;
    for (d, o) in owner.iter().enumerate() {
        if let Some(s) = o {
            got.entry((slots[*s].claim, slots[*s].request))
                .or_default()
                .push(d);
        }
    }
    let mut out = Vec::with_capacity(claims.len());
    for (c, claim) in claims.iter().enumerate() {
        let mut pairs = Vec::new();
        let mut results = Vec::new();
        let mut config = Vec::new();
        for (r, request) in claim.requests.iter().enumerate() {
            let mut picked = got.get(&(c, r)).cloned().unwrap_or_default();
            picked.sort_unstable();
            for i in picked {
                let id = devices[i].id.clone();
                results.push(DeviceRequestAllocationResult {
                    request: request.name.clone(),
                    driver: id.driver.clone(),
                    pool: id.pool.clone(),
                    device: id.device.clone(),
                    ..Default::default()
                });
                pairs.push((request.name.clone(), id));
            }
            for opaque in &request.class_config {
                config.push(DeviceAllocationConfiguration {
                    source: "FromClass".to_string(),
                    requests: Some(vec![request.name.clone()]),
                    opaque: Some(opaque.clone()),
                });
            }
        }
        config.extend(claim.config.iter().cloned());
        out.push(ClaimAllocation {
            claim: claim.name.clone(),
            devices: pairs,
            result: AllocationResult {
                allocation_timestamp: None,
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config: (!config.is_empty()).then_some(config),
                }),
                node_selector: Some(node_selector(&node.node)),
            },
        });
    }
    Ok(Allocation { claims: out })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        CELDeviceSelector, Device as ApiDevice, DeviceCapacity, DeviceClaim, DeviceClassSpec,
        DeviceConstraint, DeviceRequest, DeviceSubRequest, ExactDeviceRequest, ResourcePool,
        ResourceSliceSpec,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as KQuantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const NODE: &str = "gpu-node-0";
    const CLASS_SELECTOR: &str =
        r#"device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu""#;

    fn string(s: &str) -> DeviceAttribute {
        DeviceAttribute {
            string: Some(s.to_string()),
            ..Default::default()
        }
    }

    fn version(s: &str) -> DeviceAttribute {
        DeviceAttribute {
            version: Some(s.to_string()),
            ..Default::default()
        }
    }

    fn int(i: i64) -> DeviceAttribute {
        DeviceAttribute {
            int: Some(i),
            ..Default::default()
        }
    }

    /// One GPU as NVIDIA's DRA driver (k8s-dra-driver-gpu) publishes it: unqualified attribute
    /// names in the driver's domain, `cudaComputeCapability` and `driverVersion` as versions,
    /// memory as a capacity. Test data only: no driver runs.
    fn h100(index: usize) -> ApiDevice {
        let attributes = [
            ("type", string("gpu")),
            ("productName", string("NVIDIA H100 80GB HBM3")),
            (
                "uuid",
                string(&format!("GPU-4b2f7c1e-0000-4000-8000-00000000000{index}")),
            ),
            ("index", int(index as i64)),
            ("minor", int(index as i64)),
            ("architecture", string("Hopper")),
            ("brand", string("Nvidia")),
            ("cudaComputeCapability", version("9.0.0")),
            ("driverVersion", version("570.133.20")),
            ("cudaDriverVersion", version("12.8.0")),
            ("resource.kubernetes.io/pcieRoot", string("pci0000:00")),
        ];
        ApiDevice {
            name: format!("gpu-{index}"),
            attributes: Some(
                attributes
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
            ),
            capacity: Some(BTreeMap::from([(
                "memory".to_string(),
                DeviceCapacity {
                    value: KQuantity("80Gi".to_string()),
                    request_policy: None,
                },
            )])),
            ..Default::default()
        }
    }

    /// The ResourceSlice NVIDIA's DRA driver publishes for an 8-GPU H100 node: driver
    /// `gpu.nvidia.com`, one pool named after the node, one slice, devices `gpu-0`…`gpu-7`.
    /// It mirrors what the driver publishes; no driver runs in these tests.
    fn nvidia_slice(node: &str, generation: i64, devices: Vec<ApiDevice>) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some(format!("{node}-gpu.nvidia.com-g{generation}")),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: GPU_DRIVER.to_string(),
                node_name: Some(node.to_string()),
                pool: ResourcePool {
                    name: node.to_string(),
                    generation,
                    resource_slice_count: 1,
                },
                devices: Some(devices),
                ..Default::default()
            },
        }
    }

    fn eight_gpus() -> Vec<ApiDevice> {
        (0..8).map(h100).collect()
    }

    fn gpu_class() -> DeviceClass {
        DeviceClass {
            metadata: ObjectMeta {
                name: Some(GPU_DRIVER.to_string()),
                ..Default::default()
            },
            spec: DeviceClassSpec {
                selectors: Some(vec![cel_selector(CLASS_SELECTOR)]),
                ..Default::default()
            },
        }
    }

    fn cel_selector(expression: &str) -> DeviceSelector {
        DeviceSelector {
            cel: Some(CELDeviceSelector {
                expression: expression.to_string(),
            }),
        }
    }

    fn exact(count: Option<i64>, mode: Option<&str>, selectors: &[&str]) -> ExactDeviceRequest {
        ExactDeviceRequest {
            device_class_name: GPU_DRIVER.to_string(),
            count,
            allocation_mode: mode.map(str::to_string),
            selectors: (!selectors.is_empty())
                .then(|| selectors.iter().map(|s| cel_selector(s)).collect()),
            ..Default::default()
        }
    }

    fn resource_claim(name: &str, requests: Vec<DeviceRequest>) -> ResourceClaim {
        ResourceClaim {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some("team-a".to_string()),
                ..Default::default()
            },
            spec: ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(requests),
                    ..Default::default()
                }),
            },
            status: None,
        }
    }

    fn request(name: &str, exactly: ExactDeviceRequest) -> DeviceRequest {
        DeviceRequest {
            name: name.to_string(),
            exactly: Some(exactly),
            first_available: None,
        }
    }

    fn claim(name: &str, count: i64, selectors: &[&str]) -> Claim {
        let rc = resource_claim(
            name,
            vec![request("gpus", exact(Some(count), None, selectors))],
        );
        Claim::from_resource_claim(&rc, &[gpu_class()]).unwrap()
    }

    fn node() -> NodeDevices {
        Inventory::from_slices(&[nvidia_slice(NODE, 1, eight_gpus())])
            .node(NODE)
            .unwrap()
            .clone()
    }

    fn names(a: &ClaimAllocation) -> Vec<&str> {
        a.devices.iter().map(|(_, d)| d.device.as_str()).collect()
    }

    fn id(device: &str) -> DeviceId {
        DeviceId {
            driver: GPU_DRIVER.to_string(),
            pool: NODE.to_string(),
            device: device.to_string(),
        }
    }

    #[test]
    fn inventory_reads_the_nvidia_slice() {
        let inv = Inventory::from_slices(&[nvidia_slice(NODE, 1, eight_gpus())]);
        assert!(inv.ignored.is_empty(), "{:?}", inv.ignored);
        let node = inv.node(NODE).unwrap();
        assert_eq!(node.devices.len(), 8);
        let d = &node.devices[0];
        assert_eq!(d.id, id("gpu-0"));
        assert_eq!(
            d.attributes.get("gpu.nvidia.com/productName"),
            Some(&AttributeValue::String("NVIDIA H100 80GB HBM3".into()))
        );
        assert_eq!(
            d.attributes.get("resource.kubernetes.io/pcieRoot"),
            Some(&AttributeValue::String("pci0000:00".into()))
        );
        assert_eq!(
            d.attributes.get("gpu.nvidia.com/cudaComputeCapability"),
            Some(&AttributeValue::Version(Semver::parse("9.0.0").unwrap()))
        );
        assert_eq!(d.capacity["gpu.nvidia.com/memory"].value(), 80 << 30);
        assert_eq!(gpus_on_node(node), 8);
    }

    #[test]
    fn count_two_takes_gpu_0_and_gpu_1() {
        let mut cache = SelectorCache::new();
        let a = allocate(
            &node(),
            &[claim("train", 2, &[])],
            &BTreeSet::new(),
            &mut cache,
        )
        .unwrap();
        assert_eq!(names(&a.claims[0]), ["gpu-0", "gpu-1"]);
        assert_eq!(a.devices().count(), 2);
    }

    #[test]
    fn a_second_claim_skips_devices_in_use() {
        let mut cache = SelectorCache::new();
        let node = node();
        let first = allocate(&node, &[claim("a", 2, &[])], &BTreeSet::new(), &mut cache).unwrap();
        let in_use: BTreeSet<DeviceId> = first.devices().cloned().collect();
        let second = allocate(&node, &[claim("b", 3, &[])], &in_use, &mut cache).unwrap();
        assert_eq!(names(&second.claims[0]), ["gpu-2", "gpu-3", "gpu-4"]);
        // Two claims of one pod never share a device either.
        let both = allocate(
            &node,
            &[claim("x", 1, &[]), claim("y", 1, &[])],
            &in_use,
            &mut cache,
        )
        .unwrap();
        assert_eq!(names(&both.claims[0]), ["gpu-2"]);
        assert_eq!(names(&both.claims[1]), ["gpu-3"]);
    }

    #[test]
    fn count_nine_on_eight_gpus_is_refused_readably() {
        let mut cache = SelectorCache::new();
        let err = allocate(
            &node(),
            &[claim("big", 9, &[])],
            &BTreeSet::new(),
            &mut cache,
        )
        .unwrap_err();
        assert_eq!(
            err,
            "claim big, request gpus: wants 9 devices of class gpu.nvidia.com, but node \
             gpu-node-0 has 8 that match, 8 of them free"
        );
        let in_use = BTreeSet::from([id("gpu-5")]);
        let err = allocate(&node(), &[claim("c", 8, &[])], &in_use, &mut cache).unwrap_err();
        assert!(err.ends_with("has 8 that match, 7 of them free"), "{err}");
    }

    #[test]
    fn selectors_on_product_name_and_memory_filter() {
        // A node with two kinds of GPU: gpu-0..3 H100 80Gi, gpu-4..7 A100 40Gi.
        let mut devices = eight_gpus();
        for d in &mut devices[4..] {
            let attrs = d.attributes.as_mut().unwrap();
            attrs.insert("productName".into(), string("NVIDIA A100-SXM4-40GB"));
            attrs.insert("architecture".into(), string("Ampere"));
            attrs.insert("cudaComputeCapability".into(), version("8.0.0"));
            d.capacity
                .as_mut()
                .unwrap()
                .get_mut("memory")
                .unwrap()
                .value = KQuantity("40Gi".into());
        }
        let node = Inventory::from_slices(&[nvidia_slice(NODE, 1, devices)])
            .node(NODE)
            .unwrap()
            .clone();
        let mut cache = SelectorCache::new();
        let mut pick = |count: i64, selector: &str| {
            allocate(
                &node,
                &[claim("c", count, &[selector])],
                &BTreeSet::new(),
                &mut cache,
            )
            .map(|a| names(&a.claims[0]).join(","))
        };
        assert_eq!(
            pick(
                2,
                r#"device.attributes["gpu.nvidia.com"].productName == "NVIDIA A100-SXM4-40GB""#
            ),
            Ok("gpu-4,gpu-5".into())
        );
        assert_eq!(
            pick(
                1,
                r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("41Gi")) >= 0"#
            ),
            Ok("gpu-0".into())
        );
        assert_eq!(
            pick(
                1,
                r#"device.capacity["gpu.nvidia.com"].memory.isLessThan(quantity("80Gi"))"#
            ),
            Ok("gpu-4".into())
        );
        assert_eq!(
            pick(
                2,
                r#"device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("40Gi")) && device.attributes["gpu.nvidia.com"].index >= 2"#
            ),
            Ok("gpu-2,gpu-3".into())
        );
        assert_eq!(
            pick(
                1,
                r#"device.capacity["gpu.nvidia.com"].memory == quantity("40960Mi")"#
            ),
            Ok("gpu-4".into())
        );
        assert_eq!(
            pick(
                1,
                r#"device.attributes["gpu.nvidia.com"].cudaComputeCapability.isGreaterThan(semver("8.9.0"))"#
            ),
            Ok("gpu-0".into())
        );
        assert_eq!(
            pick(
                1,
                r#"device.attributes["gpu.nvidia.com"].architecture.startsWith("Amp")"#
            ),
            Ok("gpu-4".into())
        );
        // Only four devices have 80Gi: five is refused, naming the match count.
        let err = pick(
            5,
            r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) == 0"#,
        )
        .unwrap_err();
        assert!(err.contains("has 4 that match"), "{err}");
        // A domain the device lacks is an empty map, as in Kubernetes: `has` is false.
        assert_eq!(
            pick(1, r#"!has(device.attributes["example.com"].foo)"#),
            Ok("gpu-0".into())
        );
    }

    #[test]
    fn a_bad_selector_is_refused_naming_it() {
        let mut cache = SelectorCache::new();
        let node = node();
        let none = BTreeSet::new();
        for (expression, wants) in [
            ("device.driver ==", "does not compile"),
            (
                r#"device.attributes["gpu.nvidia.com"].noSuchAttribute == "x""#,
                "CEL runtime error",
            ),
            (
                r#"device.attributes["gpu.nvidia.com"].index"#,
                "evaluated to int, not bool",
            ),
            (
                r#"quantity("forty") == quantity("40")"#,
                "is not a quantity",
            ),
        ] {
            let err =
                allocate(&node, &[claim("c", 1, &[expression])], &none, &mut cache).unwrap_err();
            assert!(err.starts_with("claim c, request gpus: "), "{err}");
            assert!(err.contains(&format!("{expression:?}")), "{err}");
            assert!(err.contains(wants), "{wants}: {err}");
        }
    }

    #[test]
    fn all_mode_takes_every_matching_device() {
        let mut cache = SelectorCache::new();
        let node = node();
        let rc = resource_claim("all", vec![request("gpus", exact(None, Some("All"), &[]))]);
        let all = Claim::from_resource_claim(&rc, &[gpu_class()]).unwrap();
        assert_eq!(all.requests[0].mode, AllocationMode::All);
        let a = allocate(
            &node,
            std::slice::from_ref(&all),
            &BTreeSet::new(),
            &mut cache,
        )
        .unwrap();
        assert_eq!(names(&a.claims[0]).len(), 8);
        // One of them in use: All is refused, naming it.
        let err = allocate(&node, &[all], &BTreeSet::from([id("gpu-3")]), &mut cache).unwrap_err();
        assert!(err.contains("but 1 are in use (gpu-3)"), "{err}");
    }

    #[test]
    fn unsupported_fields_are_refused_by_path() {
        let classes = [gpu_class()];
        let sub = DeviceSubRequest {
            name: "h100".into(),
            device_class_name: GPU_DRIVER.into(),
            ..Default::default()
        };
        let prioritized = resource_claim(
            "p",
            vec![DeviceRequest {
                name: "gpus".into(),
                exactly: None,
                first_available: Some(vec![sub]),
            }],
        );
        let err = Claim::from_resource_claim(&prioritized, &classes).unwrap_err();
        assert!(
            err.starts_with(
                "ResourceClaim team-a/p: spec.devices.requests[0].firstAvailable is not \
                 supported by Gantry; "
            ),
            "{err}"
        );
        let mut admin = exact(Some(1), None, &[]);
        admin.admin_access = Some(true);
        let err =
            Claim::from_resource_claim(&resource_claim("a", vec![request("g", admin)]), &classes)
                .unwrap_err();
        assert!(
            err.contains("spec.devices.requests[0].exactly.adminAccess is not supported"),
            "{err}"
        );
        let mut constrained = resource_claim("m", vec![request("g", exact(Some(2), None, &[]))]);
        constrained.spec.devices.as_mut().unwrap().constraints = Some(vec![DeviceConstraint {
            match_attribute: Some("resource.kubernetes.io/pcieRoot".into()),
            ..Default::default()
        }]);
        let err = Claim::from_resource_claim(&constrained, &classes).unwrap_err();
        assert!(
            err.contains("spec.devices.constraints is not supported by Gantry"),
            "{err}"
        );
        // A template's paths start at spec.spec.
        let template = ResourceClaimTemplate {
            metadata: ObjectMeta {
                name: Some("t".into()),
                namespace: Some("team-a".into()),
                ..Default::default()
            },
            spec: k8s_openapi::api::resource::v1::ResourceClaimTemplateSpec {
                metadata: None,
                spec: prioritized.spec.clone(),
            },
        };
        let err = Claim::from_template(&template, "pod-gpus", &classes).unwrap_err();
        assert!(
            err.contains("spec.spec.devices.requests[0].firstAvailable"),
            "{err}"
        );
        // A class that does not exist, and a count that is not positive.
        let mut other = exact(Some(1), None, &[]);
        other.device_class_name = "missing".into();
        let err =
            Claim::from_resource_claim(&resource_claim("x", vec![request("g", other)]), &classes)
                .unwrap_err();
        assert!(
            err.contains("deviceClassName: DeviceClass \"missing\" does not exist"),
            "{err}"
        );
        let err = Claim::from_resource_claim(
            &resource_claim("z", vec![request("g", exact(Some(0), None, &[]))]),
            &classes,
        )
        .unwrap_err();
        assert!(
            err.contains("spec.devices.requests[0].exactly.count: 0"),
            "{err}"
        );
    }

    #[test]
    fn a_template_defaults_to_one_device() {
        let template = ResourceClaimTemplate {
            metadata: ObjectMeta::default(),
            spec: k8s_openapi::api::resource::v1::ResourceClaimTemplateSpec {
                metadata: None,
                spec: resource_claim("t", vec![request("gpu", exact(None, None, &[]))]).spec,
            },
        };
        let c = Claim::from_template(&template, "pod-gpu", &[gpu_class()]).unwrap();
        assert_eq!(c.name, "pod-gpu");
        assert_eq!(c.requests[0].mode, AllocationMode::ExactCount(1));
        assert_eq!(c.requests[0].class_selectors, [CLASS_SELECTOR]);
    }

    #[test]
    fn an_old_pool_generation_is_ignored() {
        // The driver republished the pool: generation 1 had 8 GPUs, generation 2 has 4.
        let inv = Inventory::from_slices(&[
            nvidia_slice(NODE, 1, eight_gpus()),
            nvidia_slice(NODE, 2, (0..4).map(h100).collect()),
        ]);
        let node = inv.node(NODE).unwrap();
        assert_eq!(node.devices.len(), 4);
        assert_eq!(gpus_on_node(node), 4);
        assert_eq!(inv.ignored.len(), 1);
        assert!(
            inv.ignored[0]
                .reason
                .contains("generation 1 is superseded by generation 2")
        );
    }

    #[test]
    fn slices_that_are_not_node_local_are_ignored_with_a_reason() {
        let mut shared = nvidia_slice("rack", 1, eight_gpus());
        shared.spec.node_name = None;
        shared.spec.all_nodes = Some(true);
        let mut selected = nvidia_slice("sel", 1, eight_gpus());
        selected.spec.node_name = None;
        selected.spec.node_selector = Some(node_selector("x"));
        let inv = Inventory::from_slices(&[shared, selected, nvidia_slice(NODE, 1, eight_gpus())]);
        assert_eq!(inv.nodes.len(), 1);
        let reasons: Vec<&str> = inv.ignored.iter().map(|i| i.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "uses spec.allNodes; Gantry only supports node-local slices (spec.nodeName)",
                "uses spec.nodeSelector; Gantry only supports node-local slices (spec.nodeName)",
            ]
        );
    }

    #[test]
    fn tainted_and_partitionable_devices_are_left_out() {
        let mut devices = eight_gpus();
        devices[0].taints = Some(vec![k8s_openapi::api::resource::v1::DeviceTaint {
            key: "gpu.nvidia.com/xid".into(),
            value: Some("79".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }]);
        // A MIG-style partition drawing on shared counters: left out, as Gantry does not track
        // the counters that keep partitions of one GPU from overlapping.
        let mut partition = h100(8);
        partition.name = "gpu-0-mig-1g.10gb-0".into();
        partition.consumes_counters = Some(vec![
            k8s_openapi::api::resource::v1::DeviceCounterConsumption {
                counter_set: "gpu-0-counter-set".into(),
                counters: BTreeMap::new(),
            },
        ]);
        devices.push(partition);
        let inv = Inventory::from_slices(&[nvidia_slice(NODE, 1, devices)]);
        assert_eq!(inv.node(NODE).unwrap().devices.len(), 7);
        let ignored: Vec<&str> = inv.ignored.iter().map(|i| i.what.as_str()).collect();
        assert_eq!(
            ignored,
            [
                "device gpu.nvidia.com/gpu-node-0/gpu-0",
                "device gpu.nvidia.com/gpu-node-0/gpu-0-mig-1g.10gb-0"
            ]
        );
        assert!(inv.ignored[1].reason.contains("partitionable"));
        let mut cache = SelectorCache::new();
        let a = allocate(
            inv.node(NODE).unwrap(),
            &[claim("c", 1, &[])],
            &BTreeSet::new(),
            &mut cache,
        )
        .unwrap();
        assert_eq!(names(&a.claims[0]), ["gpu-1"]);
    }

    #[test]
    fn each_expression_compiles_once() {
        let mut cache = SelectorCache::new();
        let node = node();
        let selector = r#"device.attributes["gpu.nvidia.com"].brand == "Nvidia""#;
        for _ in 0..5 {
            allocate(
                &node,
                &[claim("c", 1, &[selector])],
                &BTreeSet::new(),
                &mut cache,
            )
            .unwrap();
        }
        // The class selector and the request selector, over 5 allocations of 8 devices.
        assert_eq!(cache.compilations(), 2);
        // A bad expression is compiled once too: its error is cached.
        for _ in 0..3 {
            assert!(cache.matches("device.driver ==", &node.devices[0]).is_err());
        }
        assert_eq!(cache.compilations(), 3);
    }

    #[test]
    fn a_picky_request_is_not_starved_by_an_easy_one() {
        // "any" could take gpu-0, but "first" can only have gpu-0: both are satisfied.
        let rc = resource_claim(
            "two",
            vec![
                request("any", exact(Some(1), None, &[])),
                request(
                    "first",
                    exact(
                        Some(1),
                        None,
                        &[r#"device.attributes["gpu.nvidia.com"].index == 0"#],
                    ),
                ),
            ],
        );
        let c = Claim::from_resource_claim(&rc, &[gpu_class()]).unwrap();
        let mut cache = SelectorCache::new();
        let a = allocate(&node(), &[c], &BTreeSet::new(), &mut cache).unwrap();
        assert_eq!(
            a.claims[0].devices,
            [
                ("any".to_string(), id("gpu-1")),
                ("first".to_string(), id("gpu-0"))
            ]
        );
    }

    #[test]
    fn the_allocation_is_what_kubernetes_writes_to_status() {
        let mut cache = SelectorCache::new();
        let a = allocate(
            &node(),
            &[claim("train", 1, &[])],
            &BTreeSet::new(),
            &mut cache,
        )
        .unwrap();
        let json = serde_json::to_value(&a.claims[0].result).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "devices": {
                    "results": [
                        {"request": "gpus", "driver": "gpu.nvidia.com", "pool": "gpu-node-0", "device": "gpu-0"}
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-0"]}]}
                    ]
                }
            })
        );
    }

    #[test]
    fn quantities_parse_exactly() {
        let q = |s: &str| Quantity::parse(s).map(|q| q.nanos());
        assert_eq!(q("80Gi"), Some((80i128 << 30) * NANOS));
        assert_eq!(q("500m"), Some(500_000_000));
        assert_eq!(q("1.5k"), Some(1_500 * NANOS));
        assert_eq!(q("1e3"), Some(1_000 * NANOS));
        assert_eq!(q("1E"), Some(1_000_000_000_000_000_000 * NANOS));
        assert_eq!(q("-2"), Some(-2 * NANOS));
        assert_eq!(q("0.1n"), Some(1), "rounded up to a nano-unit");
        assert_eq!(q("forty"), None);
        assert_eq!(q("1Qi"), None);
        assert_eq!(q(""), None);
        assert_eq!(Quantity::parse("1.5").unwrap().value(), 2);
    }

    #[test]
    fn versions_order_by_semver_precedence() {
        let v = |s: &str| Semver::parse(s).unwrap();
        assert!(v("9.0.0") > v("8.9.0"));
        assert!(v("1.0.0") > v("1.0.0-rc.1"));
        assert!(v("1.0.0-rc.2") < v("1.0.0-rc.10"));
        assert_eq!(v("1.2.3+build"), v("1.2.3"));
        assert!(Semver::parse("550.54.05").is_none(), "leading zero");
        assert!(Semver::parse("v1.2.3").is_none());
    }

    proptest::proptest! {
        /// Whatever is in use, a count is granted exactly when enough GPUs are free, with free
        /// devices only, each once, lowest names first.
        #[test]
        fn allocation_takes_free_devices_only(busy in proptest::collection::btree_set(0usize..8, 0..8), count in 1i64..10) {
            let node = node();
            let in_use: BTreeSet<DeviceId> = busy.iter().map(|i| id(&format!("gpu-{i}"))).collect();
            let mut cache = SelectorCache::new();
            let result = allocate(&node, &[claim("c", count, &[])], &in_use, &mut cache);
            let free: Vec<String> = (0..8).filter(|i| !busy.contains(i)).map(|i| format!("gpu-{i}")).collect();
            match result {
                Ok(a) => {
                    let got: Vec<String> = names(&a.claims[0]).iter().map(|s| s.to_string()).collect();
                    proptest::prop_assert_eq!(got, free[..count as usize].to_vec());
                }
                Err(e) => {
                    proptest::prop_assert!((count as usize) > free.len(), "{}", e);
                }
            }
        }
    }
}
