//! Helpers shared by the integration tests.
#![allow(dead_code)]

use gantry_core::{Explanation, Outcome};
use gantry_store::{NewDecision, Store, StoreConfig, sample_explanation};

pub fn open(dir: &std::path::Path) -> Store {
    Store::open(StoreConfig::new(dir)).expect("open store")
}

pub fn decision(job: &str, time_ms: u64, nodes: &[&str]) -> NewDecision {
    let mut e: Explanation = sample_explanation(time_ms);
    e.job = job.to_string();
    e.outcome = if nodes.is_empty() {
        Outcome::Pending {
            waiting_for: "GPUs".into(),
        }
    } else {
        Outcome::Placed {
            nodes: nodes.iter().map(|n| (n.to_string(), 8)).collect(),
        }
    };
    NewDecision {
        time_ms,
        explanation: e,
    }
}
