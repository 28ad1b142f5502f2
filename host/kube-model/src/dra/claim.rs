//! A `ResourceClaim` (or a template's `spec.spec`) with its DeviceClasses resolved; what
//! Gantry cannot honour is refused by field path.

use k8s_openapi::api::resource::v1::{
    DeviceAllocationConfiguration, DeviceClass, DeviceSelector, OpaqueDeviceConfiguration,
    ResourceClaim, ResourceClaimSpec, ResourceClaimTemplate,
};

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
