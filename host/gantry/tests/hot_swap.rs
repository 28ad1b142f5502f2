//! Hot swap under load: a 10,000-pod simulated stream runs while the API activates and rolls
//! back 20 times. No cycle may fail, and every stored decision must name exactly one set
//! version: its policy list is that version's, never a mix.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{ADMIN, Body, Server, sha_of};
use serde_json::json;

#[test]
fn twenty_swaps_under_a_ten_thousand_pod_stream() {
    let mut server = Server::start(&[
        "--jobs-per-s",
        "100",
        "--max-pods",
        "10000",
        "--balloons",
        "200",
    ]);
    let fit = sha_of(&server, "gpu-fit");
    let quota = sha_of(&server, "team-quota");
    let (status, set) = server.post(
        "/api/sets",
        Some(ADMIN),
        Body::Json(json!({"entries": [
            {"sha256": fit, "weight": 1, "config": "{}"},
            {"sha256": quota, "weight": 1, "config": "{\"borrowing\":false}"},
        ], "note": "no score policy, no borrowing"})),
    );
    assert_eq!(status, 201, "{set}");
    for i in 0..20 {
        let path = if i % 2 == 0 {
            "/api/sets/2/activate"
        } else {
            "/api/sets/1/rollback"
        };
        let (status, body) = server.post(path, Some(ADMIN), Body::None);
        assert_eq!(status, 200, "{path}: {body}");
        std::thread::sleep(Duration::from_millis(400));
    }
    assert_eq!(server.get("/api/sets").1["active"], 1);
    // Let the stream reach its 10,000 pods before stopping.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while submitted_pods(&server) < 10_000 {
        assert!(std::time::Instant::now() < deadline, "the stream stalled");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (_, metrics) = server.get_as("/metrics", None).expect("metrics");
    assert!(
        metrics.contains("gantry_policy_set_activations_total 21"),
        "{metrics}"
    );
    assert!(server.stop(), "gantry serve did not exit cleanly");
    let stdout = server.stdout.lock().expect("stdout").clone();
    let last = stdout.lines().last().unwrap_or("");
    let pods: u64 = last
        .split_once(" jobs (")
        .and_then(|(_, rest)| rest.split_once(" pods)"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no pod count in {last:?}"));
    assert!(pods >= 10_000, "only {pods} pods submitted: {last}");
    assert!(last.ends_with("; 0 cycle failures"), "{last}");

    let store = gantry_store::Store::open(gantry_store::StoreConfig::new(server.store_dir()))
        .expect("open");
    let version_to_names: BTreeMap<u64, Vec<String>> = store
        .list_sets()
        .expect("sets")
        .into_iter()
        .map(|set| {
            let names = set
                .entries
                .iter()
                .map(|e| {
                    store
                        .policy_manifest(&e.sha256)
                        .expect("read")
                        .expect("stored")
                        .name
                })
                .collect();
            (set.version, names)
        })
        .collect();
    let records = store
        .decisions_between(0, u64::MAX, usize::MAX)
        .expect("read decisions");
    assert!(records.len() > 1000, "only {} records", records.len());
    let mut seen = BTreeSet::new();
    for r in &records {
        let e = &r.explanation;
        let names: Vec<String> = e.policies.iter().map(|p| p.name.clone()).collect();
        assert_eq!(
            Some(&names),
            version_to_names.get(&e.policy_set),
            "{} names set {} but ran {names:?}",
            e.job,
            e.policy_set
        );
        assert!(e.faults.is_empty(), "{}: {:?}", e.job, e.faults);
        seen.insert(e.policy_set);
    }
    assert_eq!(seen, BTreeSet::from([1, 2]), "both versions made decisions");
    let audit = store.audit_recent(100).expect("audit");
    let swaps = audit
        .iter()
        .filter(|a| a.who == "alice" && (a.action == "set.activate" || a.action == "set.rollback"))
        .count();
    assert_eq!(swaps, 20);
}

fn submitted_pods(server: &Server) -> u64 {
    let (_, metrics) = server.get_as("/metrics", None).expect("metrics");
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "scheduler_queue_incoming_pods_total{event=\"PodAdd\",queue=\"active\"} ",
            )
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}
