//! The web UI's server side: the job list it searches and the page it is served from.

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
    // Each node names the queues of its jobs, for the heatmap's queue filter.
    let (_, body) = get("/api/cluster/nodes", Some(VIEWER));
    let nodes: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(nodes["queues"].as_array().map(Vec::len), Some(7500));
    // The UI (or, on a build without web/dist, the page saying how to build it) at `/`, with no
    // token; an unknown API path stays a JSON 404.
    let (code, page) = get("/", None);
    assert_eq!(code, 200);
    assert!(page.contains("<title>Gantry</title>"), "{page}");
    let (code, _) = get("/api/no-such-route", Some(VIEWER));
    assert_eq!(code, 404);
}
