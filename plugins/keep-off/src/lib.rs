//! `keep-off`: keeps pods off the nodes its config names, by exact name or by name prefix. An
//! admin drains a rack, or holds nodes for an investigation, by activating a policy set with
//! this filter in it, with no taint to add to (and later remove from) each node, and with every
//! rejection explained as coming from this policy's config.
//!
//! Config: `{"nodes": ["exact-node-name", ...], "prefixes": ["rack-07-", ...]}`; both optional,
//! unknown fields refused.

use std::collections::HashMap;
use std::sync::Mutex;

use gantry_policy_sdk::prelude::*;
use serde::Deserialize;

pub const KEPT_OFF: u16 = 1;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct Config {
    nodes: Vec<String>,
    prefixes: Vec<String>,
}

pub struct KeepOff {
    config: Config,
    /// Verdict per node name id, so a node's name is fetched from the host and matched once per
    /// instance rather than once per pod. Ids are stable for the host's life. A Mutex only
    /// because the SDK keeps the policy in a static: an instance is single-threaded, so it is
    /// never contended.
    name_to_kept_off: Mutex<HashMap<Sym, bool>>,
}

impl KeepOff {
    fn matches(&self, name: &str) -> bool {
        self.config.nodes.iter().any(|n| n == name)
            || self.config.prefixes.iter().any(|p| name.starts_with(p))
    }
}

impl FilterPolicy for KeepOff {
    const NAME: &'static str = "keep-off";
    const REASONS: &'static [(u16, &'static str)] =
        &[(KEPT_OFF, "node is kept off by policy config")];

    fn new(config: &str) -> Result<Self, String> {
        let config: Config = if config.trim().is_empty() {
            Config::default()
        } else {
            serde_json::from_str(config).map_err(|e| format!("keep-off config: {e}"))?
        };
        if let Some(empty) = config
            .nodes
            .iter()
            .chain(&config.prefixes)
            .find(|s| s.is_empty())
        {
            // An empty prefix would keep pods off every node: surely a mistake, so refuse it.
            return Err(format!(
                "keep-off config: empty name or prefix {empty:?} would match every node"
            ));
        }
        Ok(Self {
            config,
            name_to_kept_off: Mutex::new(HashMap::new()),
        })
    }

    fn filter(&self, _pod: &Pod, node: &Node) -> u16 {
        if self.config.nodes.is_empty() && self.config.prefixes.is_empty() {
            return FITS;
        }
        let mut name_to_kept_off = self
            .name_to_kept_off
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let kept_off = *name_to_kept_off
            .entry(node.name())
            .or_insert_with(|| self.matches(&resolve(node.name())));
        if kept_off { KEPT_OFF } else { FITS }
    }
}

gantry_policy_sdk::export_filter!(KeepOff);
