//! All-or-nothing allocation on one node: specific free devices for every request of every
//! claim of a pod, and the `status.allocation` Kubernetes expects for each claim.

use std::collections::{BTreeMap, BTreeSet};

use super::{AllocationMode, Claim, Device, DeviceId, NodeDevices, Request, SelectorCache};
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult,
};

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

pub(super) fn node_selector(node: &str) -> NodeSelector {
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
    let matching = matching_devices(devices, claims, cache)?;
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
    Ok(Allocation {
        claims: claim_allocations(node, claims, &got),
    })
}

/// Per claim, per request, the indices of `devices` its selectors and class match; the error
/// names the claim and request whose selector failed to compile or evaluate.
fn matching_devices(
    devices: &[Device],
    claims: &[Claim],
    cache: &mut SelectorCache,
) -> Result<Vec<Vec<Vec<usize>>>, String> {
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
    Ok(matching)
}

/// Each claim's allocation on `node`: the devices `got` gives each of its requests (by
/// `(claim, request)` index), in device order, with the class's and the claim's config.
fn claim_allocations(
    node: &NodeDevices,
    claims: &[Claim],
    got: &BTreeMap<(usize, usize), Vec<usize>>,
) -> Vec<ClaimAllocation> {
    let devices = &node.devices;
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
    out
}
