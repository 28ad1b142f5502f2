//! The web UI's server side: the job list it searches, the queues' lending and history it
//! shows, and the page it is served from.

mod common;

use common::{ADMIN, Server, VIEWER};

#[test]
fn jobs_list_needs_a_token_filters_and_the_ui_is_served() {
    let server = Server::start(&["--jobs-per-s", "200"]);
    let get = |path: &str, token: Option<&str>| server.get_as(path, token).expect("GET");
    assert_eq!(get("/api/jobs", None).0, 401);
    assert_eq!(get("/api/jobs?state=done", Some(VIEWER)).0, 400);
    // The load fills the cluster within seconds; wait for a pending job.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let pending = loop {
        let (code, body) = get("/api/jobs?state=pending&limit=5", Some(VIEWER));
        assert_eq!(code, 200, "{body}");
        let rows: Vec<serde_json::Value> = serde_json::from_str(&body).expect("json");
        if let Some(first) = rows.first() {
            assert!(rows.iter().all(|r| r["state"] == "pending"), "{body}");
            break first.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no pending job in 60 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    let name = pending["name"].as_str().expect("name");
    let queue = pending["queue"].as_str().expect("queue");
    let (_, body) = get(
        &format!("/api/jobs?q={}&queue={queue}", &name[name.len() - 4..]),
        Some(ADMIN),
    );
    let rows: Vec<serde_json::Value> = serde_json::from_str(&body).expect("json");
    assert!(rows.iter().any(|r| r["name"] == name), "{body}");
    assert!(rows.iter().all(|r| r["queue"] == queue), "{body}");
    // Longest waiting first, on request; an unknown order is a 400 naming the choices.
    let (code, body) = get("/api/jobs?state=pending&sort=wait&limit=200", Some(VIEWER));
    assert_eq!(code, 200, "{body}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&body).expect("json");
    let submitted: Vec<u64> = rows
        .iter()
        .map(|r| r["submitted_ms"].as_u64().expect("submitted_ms"))
        .collect();
    assert!(!submitted.is_empty() && submitted.is_sorted(), "{body}");
    let (code, body) = get("/api/jobs?sort=age", Some(VIEWER));
    assert_eq!(
        (code, body.as_str()),
        (
            400,
            r#"{"error":"sort must be position or wait, not \"age\""}"#
        )
    );
    // The simulated jobs have no namespace: a namespace filter matches none of them.
    let (_, body) = get("/api/jobs?namespace=team-a", Some(VIEWER));
    assert_eq!(body, "[]");
    // Each node names the queues of its jobs, for the heatmap's queue filter.
    let (_, body) = get("/api/cluster/nodes", Some(VIEWER));
    let nodes: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(nodes["queues"].as_array().map(Vec::len), Some(7500));
    // Each queue says what of its quota others borrow; at the top level that adds up to what
    // the top-level queues borrow (at most what they may lend).
    let (_, body) = get("/api/queues", Some(VIEWER));
    let queues: Vec<serde_json::Value> = serde_json::from_str(&body).expect("json");
    let roots: Vec<&serde_json::Value> = queues.iter().filter(|q| q["parent"].is_null()).collect();
    let sum = |k: &str| roots.iter().map(|q| q[k].as_u64().expect(k)).sum::<u64>();
    assert_eq!(
        sum("lent_gpus"),
        sum("borrowed_gpus").min(sum("lendable_gpus")),
        "{body}"
    );
    // The history: one series per queue, columns of equal length, sampled since the start;
    // `since` returns only newer samples, and a bad `since` is a 400.
    let (code, body) = get("/api/queues/history", Some(VIEWER));
    assert_eq!(code, 200, "{body}");
    let history: serde_json::Value = serde_json::from_str(&body).expect("json");
    let series = history["queues"].as_array().expect("queues");
    assert_eq!(series.len(), queues.len(), "{body}");
    let mut last = 0;
    for s in series {
        let n = s["at_ms"].as_array().map(Vec::len).expect("at_ms");
        assert!(n >= 1, "{s}");
        for column in [
            "used_gpus",
            "nominal_gpus",
            "lent_gpus",
            "fair_share_key",
            "pending_jobs",
        ] {
            assert_eq!(s[column].as_array().map(Vec::len), Some(n), "{column}: {s}");
        }
        last = last.max(s["at_ms"][n - 1].as_u64().expect("time"));
    }
    let (_, body) = get(&format!("/api/queues/history?since={last}"), Some(VIEWER));
    let newer: serde_json::Value = serde_json::from_str(&body).expect("json");
    for s in newer["queues"].as_array().expect("queues") {
        for t in s["at_ms"].as_array().expect("at_ms") {
            assert!(t.as_u64().expect("time") > last, "{body}");
        }
    }
    assert_eq!(get("/api/queues/history?since=soon", Some(VIEWER)).0, 400);
    assert_eq!(get("/api/queues/history", None).0, 401);
    // The UI (or, on a build without web/dist, the page saying how to build it) at `/`, with no
    // token; an unknown API path stays a JSON 404.
    let (code, page) = get("/", None);
    assert_eq!(code, 200);
    assert!(page.contains("<title>Gantry</title>"), "{page}");
    let (code, _) = get("/api/no-such-route", Some(VIEWER));
    assert_eq!(code, 404);
}
