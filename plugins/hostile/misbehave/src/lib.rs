//! A filter that misbehaves as its config says, for the sandbox tests and `gantry bench faults`:
//! - `init_ms`: spin this long in `init` (needs the clock capability), as a policy with a heavy
//!   start-up does;
//! - `trap`: panic in `filter` for every pod that asks for GPUs (a pod asking none fits), so a
//!   test can fault it on purpose and then let a probe succeed;
//! - `log_lines`: write this many `log` lines per `filter` call;
//! - `name_len`, `version_len`, `reasons`, `reason_len`: describe itself at init with strings of
//!   these lengths and this many reason codes, to test the host's bounds.
//!
//! It uses the raw bindings rather than the SDK traits because its name and reasons come from
//! its config.
use gantry_policy_sdk::__private::filter::exports::gantry::policy::filter_policy as wit;
use gantry_policy_sdk::bindings::host::{self, LogLevel};
use gantry_policy_sdk::bindings::types::{PolicyInfo, Reason};
use serde::Deserialize;
use std::sync::OnceLock;

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct Config {
    init_ms: u64,
    trap: bool,
    log_lines: u32,
    name_len: Option<usize>,
    version_len: Option<usize>,
    reasons: Option<u16>,
    reason_len: Option<usize>,
}

static CONFIG: OnceLock<Config> = OnceLock::new();

struct Misbehave;

impl wit::Guest for Misbehave {
    fn init(config: String) -> Result<PolicyInfo, String> {
        let config: Config =
            serde_json::from_str(&config).map_err(|e| format!("hostile-misbehave config: {e}"))?;
        if config.init_ms > 0 {
            let started = std::time::Instant::now();
            let mut n = 1u64;
            while started.elapsed().as_millis() < u128::from(config.init_ms) {
                n = std::hint::black_box(n.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        let name = match config.name_len {
            Some(len) => "n".repeat(len),
            None => "hostile-misbehave".into(),
        };
        let version = match config.version_len {
            Some(len) => "v".repeat(len),
            None => "0.1.0".into(),
        };
        let reason_len = config.reason_len.unwrap_or(10);
        let reasons = (1..=config.reasons.unwrap_or(1))
            .map(|code| Reason {
                code,
                text: "r".repeat(reason_len),
            })
            .collect();
        let _ = CONFIG.set(config);
        Ok(PolicyInfo {
            name,
            version,
            reasons,
        })
    }

    fn filter(pod: wit::Pod, nodes: wit::Nodes) -> Vec<u16> {
        let config = CONFIG.get().expect("init ran");
        for i in 0..config.log_lines {
            host::log(LogLevel::Info, &format!("hostile-misbehave: line {i}"));
        }
        if config.trap && pod.gpus > 0 {
            panic!(
                "hostile-misbehave: trapping on a pod that wants {} GPUs",
                pod.gpus
            );
        }
        vec![0; nodes.name.len()]
    }
}

gantry_policy_sdk::__private::filter::export!(Misbehave with_types_in gantry_policy_sdk::__private::filter);
