use super::allocate::node_selector;
use super::*;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, Device as ApiDevice, DeviceCapacity, DeviceClaim, DeviceClassSpec,
    DeviceConstraint, DeviceRequest, DeviceSubRequest, ExactDeviceRequest, ResourcePool,
    ResourceSliceSpec,
};
use k8s_openapi::api::resource::v1::{
    DeviceAttribute, DeviceClass, DeviceSelector, ResourceClaim, ResourceClaimSpec,
    ResourceClaimTemplate, ResourceSlice,
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
        let err = allocate(&node, &[claim("c", 1, &[expression])], &none, &mut cache).unwrap_err();
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
    let err = Claim::from_resource_claim(&resource_claim("a", vec![request("g", admin)]), &classes)
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
    let err = Claim::from_resource_claim(&resource_claim("x", vec![request("g", other)]), &classes)
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
