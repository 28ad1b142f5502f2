//! Helpers shared by the integration tests.
#![allow(dead_code)]

use gantry_core::{Explanation, Outcome};
use gantry_store::{NewDecision, Store, StoreConfig, sample_explanation};

/// Opens the store, retrying for a few seconds: sled's flusher thread can hold the directory's
/// lock briefly after the previous handle is dropped, under load.
pub fn open(dir: &std::path::Path) -> Store {
    let start = std::time::Instant::now();
    loop {
        match Store::open(StoreConfig::new(dir)) {
            Ok(store) => return store,
            Err(e) if start.elapsed() < std::time::Duration::from_secs(5) => {
                eprintln!("retrying open: {e}");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => panic!("open store: {e}"),
        }
    }
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
