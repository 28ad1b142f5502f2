//! Which published node signals mean a node is failing, and what Gantry does about each: the
//! `gantry serve --health-config` file. Gantry invents no check of its own; it reads what the
//! ecosystem already publishes:
//!
//! - node conditions (node-problem-detector's, NVSentinel's `GpuXidError` style), with the
//!   status that fires (`True` unless said);
//! - node taints by key (`nvidia.com/gpu-xid-error` style);
//! - DRA device taints by key, on the devices of the node's ResourceSlices;
//! - the `Ready` condition, read as always (a node not Ready is avoided, nothing stopped).
//!
//! A signal's verdict is `suspect` (the default: the node is cordoned by Gantry and every gang
//! with a pod on it is stopped whole, see `Scheduler::node_failed`) or `not_ready` (the node is
//! avoided, its pods left alone). Anything else in the file is refused at load, naming it.

use std::collections::BTreeSet;

use gantry_core::HealthConfig;
use k8s_openapi::api::core::v1::Node;
use serde::Deserialize;

/// What a firing signal does to its node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignalVerdict {
    /// Cordoned, its gangs stopped whole (subject to the breaker).
    #[default]
    Suspect,
    /// Avoided by new pods; its pods are left alone.
    NotReady,
}

/// Where a signal is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignalSource {
    /// A node condition of this type, firing at this status.
    Condition {
        /// The condition's `type`.
        kind: String,
        /// The status that fires (`True`, `False`, `Unknown`).
        status: String,
    },
    /// A node taint with this key, whatever its value and effect.
    Taint(String),
    /// A DRA device taint with this key on any device of the node's ResourceSlices.
    DeviceTaint(String),
}

/// One configured signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signal {
    /// Where it is read.
    pub source: SignalSource,
    /// What it does.
    pub verdict: SignalVerdict,
}

/// A DRA device taint on one of a node's devices: its key and how it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceTaint {
    /// The taint's key.
    pub key: String,
    /// `KEY=VALUE:EFFECT on DRIVER/POOL/DEVICE`, for the cause.
    pub text: String,
}

/// The signals one node shows now, by verdict: each a cause in words
/// (`taint nvidia.com/gpu-xid-error=79`), sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Firing {
    /// Causes whose verdict is [`SignalVerdict::Suspect`].
    pub suspect: BTreeSet<String>,
    /// Causes whose verdict is [`SignalVerdict::NotReady`].
    pub not_ready: BTreeSet<String>,
}

/// The `--health-config` file: the signals, and the lifecycle's knobs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HealthSignals {
    /// In the file's order.
    pub signals: Vec<Signal>,
    /// The breaker's and the bad-node list's knobs.
    pub lifecycle: HealthConfig,
    /// The test run on each node tainted `gantry.dev/preflight`; `None`: Gantry runs none,
    /// and such a node waits for whatever removes the taint.
    pub preflight: Option<crate::preflight::PreflightTemplate>,
}

/// One entry of `signals:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignalEntry {
    condition: Option<String>,
    status: Option<String>,
    taint: Option<String>,
    device_taint: Option<String>,
    #[serde(default)]
    verdict: SignalVerdict,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HealthFile {
    #[serde(default)]
    signals: Vec<SignalEntry>,
    #[serde(default)]
    lifecycle: HealthConfig,
    #[serde(default)]
    preflight: Option<crate::preflight::PreflightTemplate>,
}

impl HealthSignals {
    /// Parses the file's text (YAML), or says what is wrong, naming the entry and field.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: HealthFile = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        file.lifecycle
            .validate()
            .map_err(|e| format!("lifecycle: {e}"))?;
        if let Some(template) = &file.preflight {
            template.validate().map_err(|e| format!("preflight: {e}"))?;
        }
        let mut signals = Vec::new();
        for (i, entry) in file.signals.into_iter().enumerate() {
            let named = |field: &str| format!("signals[{i}]: {field}");
            let sources = [
                entry.condition.is_some(),
                entry.taint.is_some(),
                entry.device_taint.is_some(),
            ];
            if sources.iter().filter(|&&s| s).count() != 1 {
                return Err(named(
                    "give exactly one of condition, taint and device_taint (the signal's source)",
                ));
            }
            let empty = |v: &Option<String>| v.as_deref().is_some_and(str::is_empty);
            if empty(&entry.condition) || empty(&entry.taint) || empty(&entry.device_taint) {
                return Err(named("the source's name is empty"));
            }
            if entry.status.is_some() && entry.condition.is_none() {
                return Err(named("status applies only to a condition"));
            }
            let source = if let Some(kind) = entry.condition {
                let status = entry.status.unwrap_or_else(|| "True".into());
                if !matches!(status.as_str(), "True" | "False" | "Unknown") {
                    return Err(named(&format!(
                        "status {status:?}: a condition's status is True, False or Unknown"
                    )));
                }
                SignalSource::Condition { kind, status }
            } else if let Some(key) = entry.taint {
                SignalSource::Taint(key)
            } else {
                SignalSource::DeviceTaint(entry.device_taint.unwrap_or_default())
            };
            signals.push(Signal {
                source,
                verdict: entry.verdict,
            });
        }
        Ok(Self {
            signals,
            lifecycle: file.lifecycle,
            preflight: file.preflight,
        })
    }

    /// The configured signals `node` shows now; `device_taints` are its devices' DRA taints.
    pub fn firing(&self, node: &Node, device_taints: &[DeviceTaint]) -> Firing {
        let mut firing = Firing::default();
        for signal in &self.signals {
            let causes: Vec<String> = match &signal.source {
                SignalSource::Condition { kind, status } => node
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .into_iter()
                    .flatten()
                    .filter(|c| c.type_ == *kind && c.status == *status)
                    .map(|c| {
                        let detail = c.reason.as_deref().filter(|r| !r.is_empty());
                        match detail {
                            Some(reason) => format!("condition {kind}={status} ({reason})"),
                            None => format!("condition {kind}={status}"),
                        }
                    })
                    .collect(),
                SignalSource::Taint(key) => node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .into_iter()
                    .flatten()
                    .filter(|t| t.key == *key)
                    .map(|t| match t.value.as_deref().filter(|v| !v.is_empty()) {
                        Some(value) => format!("taint {key}={value}"),
                        None => format!("taint {key}"),
                    })
                    .collect(),
                SignalSource::DeviceTaint(key) => device_taints
                    .iter()
                    .filter(|t| t.key == *key)
                    .map(|t| format!("device taint {}", t.text))
                    .collect(),
            };
            match signal.verdict {
                SignalVerdict::Suspect => firing.suspect.extend(causes),
                SignalVerdict::NotReady => firing.not_ready.extend(causes),
            }
        }
        firing
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(conditions: serde_json::Value, taints: serde_json::Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n0"},
            "spec": {"taints": taints},
            "status": {"conditions": conditions},
        }))
        .unwrap()
    }

    #[test]
    fn conditions_taints_and_device_taints_fire_by_verdict() {
        let config = HealthSignals::parse(
            "signals:\n\
             - condition: GpuXidError\n\
             - taint: nvidia.com/gpu-xid-error\n\
             - condition: NetworkUnavailable\n  verdict: not_ready\n\
             - device_taint: gpu.nvidia.com/xid\n",
        )
        .unwrap();
        let n = node(
            json!([
                {"type": "GpuXidError", "status": "True", "reason": "Xid79"},
                {"type": "NetworkUnavailable", "status": "True"},
                {"type": "Ready", "status": "True"},
            ]),
            json!([{"key": "nvidia.com/gpu-xid-error", "value": "79", "effect": "NoSchedule"}]),
        );
        let device = DeviceTaint {
            key: "gpu.nvidia.com/xid".into(),
            text: "gpu.nvidia.com/xid=48:NoSchedule on gpu.nvidia.com/n0/gpu-3".into(),
        };
        let firing = config.firing(&n, &[device]);
        assert_eq!(
            firing.suspect.iter().cloned().collect::<Vec<_>>(),
            [
                "condition GpuXidError=True (Xid79)",
                "device taint gpu.nvidia.com/xid=48:NoSchedule on gpu.nvidia.com/n0/gpu-3",
                "taint nvidia.com/gpu-xid-error=79",
            ]
        );
        assert_eq!(
            firing.not_ready.iter().cloned().collect::<Vec<_>>(),
            ["condition NetworkUnavailable=True"]
        );
        // A condition at another status, or no taint, does not fire.
        let quiet = node(
            json!([{"type": "GpuXidError", "status": "False"}]),
            json!([]),
        );
        assert_eq!(config.firing(&quiet, &[]), Firing::default());
    }

    #[test]
    fn a_signal_gantry_cannot_read_is_refused_naming_it() {
        let err = HealthSignals::parse("signals:\n- nodeEvent: XidError\n").unwrap_err();
        assert!(err.contains("unknown field `nodeEvent`"), "{err}");
        assert!(err.contains("condition"), "{err}");
        let err = HealthSignals::parse("signals:\n- condition: A\n  taint: b\n").unwrap_err();
        assert_eq!(
            err,
            "signals[0]: give exactly one of condition, taint and device_taint (the signal's source)"
        );
        let err = HealthSignals::parse("signals:\n- condition: A\n  status: maybe\n").unwrap_err();
        assert!(err.contains("status \"maybe\""), "{err}");
        let err = HealthSignals::parse("signals:\n- taint: a\n  verdict: drain\n").unwrap_err();
        assert!(err.contains("unknown variant `drain`"), "{err}");
        let err = HealthSignals::parse("lifecycle: {max_out_share: 3}\n").unwrap_err();
        assert!(err.starts_with("lifecycle: field max_out_share"), "{err}");
        let err = HealthSignals::parse("preflight: {command: [dcgmi]}\n").unwrap_err();
        assert!(err.contains("preflight: missing field `image`"), "{err}");
        let err = HealthSignals::parse("preflight: {image: ''}\n").unwrap_err();
        assert!(err.starts_with("preflight: field image"), "{err}");
        let err = HealthSignals::parse("signal: []\n").unwrap_err();
        assert!(err.contains("unknown field `signal`"), "{err}");
    }
}
