//! The health routes in process: the lifecycle driven through a real scheduler, the loop's
//! part (taking transitions, making resets) played by the test.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use gantry_core::{HealthConfig, Scheduler, SchedulerConfig, Symbols};
use serde_json::Value;
use tower::ServiceExt;

use super::tests::state;
use super::*;

const ADMIN: &str = "admin-token-0123456789";
const VIEWER: &str = "viewer-token-0123456789";

fn app(state: &Arc<AppState>) -> Router {
    router(state.clone()).layer(MockConnectInfo(SocketAddr::from(([127, 0, 0, 1], 9))))
}

fn request(method: Method, path: &str, token: &str) -> Request {
    Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Body::empty())
        .expect("request")
}

async fn call(
    state: &Arc<AppState>,
    method: Method,
    path: &str,
    token: &str,
) -> (StatusCode, Value) {
    let response = app(state)
        .oneshot(request(method, path, token))
        .await
        .expect("response");
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body");
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// Four nodes of 8 GPUs, node-0 to node-3, whose breaker trips once more than 30% (two
/// nodes) would be out.
fn scheduler(symbols: &Arc<Symbols>) -> Scheduler {
    let mut scheduler =
        gantry_core::fixtures::one_rack(symbols, 4, 32, None, SchedulerConfig::default());
    scheduler.lifecycle_mut().config = HealthConfig {
        max_out_share: 0.3,
        ..HealthConfig::default()
    };
    scheduler
}

/// What the loop does after a pass: takes the transitions, then publishes.
fn pass(state: &Arc<AppState>, scheduler: &mut Scheduler) {
    state.live.take_health(scheduler, gantry_engine::now_ms());
    state.live.publish(scheduler, "test");
}

/// Plays the loop for one reset: answers the first one asked for within a few seconds, and
/// gives the scheduler back.
fn answer_one_reset(
    state: &Arc<AppState>,
    mut scheduler: Scheduler,
) -> std::thread::JoinHandle<Scheduler> {
    let live = state.live.clone();
    std::thread::spawn(move || {
        for _ in 0..2_000 {
            if live.answer_breaker_resets(&mut scheduler) > 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        scheduler
    })
}

#[tokio::test]
async fn a_tripped_breaker_is_shown_and_an_admin_resets_it_on_the_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = state(dir.path(), DoorOptions::default());
    let mut scheduler = scheduler(state.live.symbols());
    scheduler.advance_clock(20.0);
    // The first failure is cordoned and goes to repair; the second would put half the nodes
    // out, over the 30% cap: the breaker trips and holds it.
    let first = scheduler.node_failed(0, "GpuXidError (Xid 79)", 10.0);
    assert_eq!(first.verdict, gantry_core::health::Verdict::Cordoned);
    let second = scheduler.node_failed(1, "GpuXidError (Xid 48)", 20.0);
    assert_eq!(second.verdict, gantry_core::health::Verdict::HeldByBreaker);
    pass(&state, &mut scheduler);

    let (status, health) = call(&state, Method::GET, "/api/health", VIEWER).await;
    assert_eq!(status, StatusCode::OK, "{health}");
    assert_eq!(health["nodes"]["ready"], 3);
    assert_eq!(health["nodes"]["repair"], 1);
    assert_eq!(health["nodes"]["retired"], 0);
    let breaker = &health["breaker"];
    assert_eq!(breaker["tripped"], true);
    assert_eq!(breaker["held"], 1);
    assert_eq!(
        breaker["reason"],
        "one more cordon would put 2 of 4 nodes out, over the 30% cap"
    );
    let steps: Vec<(String, String, String, String)> = health["transitions"]
        .as_array()
        .expect("transitions")
        .iter()
        .map(|t| {
            let s = |k: &str| t[k].as_str().unwrap_or_default().to_string();
            (s("node"), s("from"), s("to"), s("cause"))
        })
        .collect();
    let step = |node: &str, from: &str, to: &str, cause: &str| {
        (node.into(), from.into(), to.into(), cause.into())
    };
    assert_eq!(
        steps,
        vec![
            step("node-0", "draining", "repair", "its gangs are stopped"),
            step("node-0", "suspect", "draining", "stopping its gangs"),
            step("node-0", "ready", "suspect", "GpuXidError (Xid 79)"),
        ]
    );
    // The trip and the first step are 10 s apart on the wall clock too.
    let tripped_ms = breaker["tripped_at_ms"].as_u64().expect("tripped_at_ms");
    let cordoned_ms = health["transitions"][2]["at_ms"].as_u64().expect("at_ms");
    assert_eq!(tripped_ms - cordoned_ms, 10_000);

    // One node's record.
    let (status, node) = call(&state, Method::GET, "/api/nodes/node-0/health", VIEWER).await;
    assert_eq!(status, StatusCode::OK, "{node}");
    assert_eq!(node["state"], "repair");
    assert_eq!(node["transitions"].as_array().map(Vec::len), Some(3));
    assert_eq!(node["transitions"][0]["to"], "repair");
    let (status, node) = call(&state, Method::GET, "/api/nodes/node-1/health", VIEWER).await;
    assert_eq!(status, StatusCode::OK, "{node}");
    assert_eq!(
        (node["state"].clone(), node["transitions"].clone()),
        ("ready".into(), serde_json::json!([]))
    );

    // A viewer may not reset it; an admin does, on the loop, and the audit log says so.
    let (status, refused) = call(&state, Method::POST, "/api/health/reset", VIEWER).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        refused["error"],
        "the viewer token of eve may not reset the node health breaker: an admin token is needed"
    );
    let loop_ = answer_one_reset(&state, scheduler);
    let (status, reset) = call(&state, Method::POST, "/api/health/reset", ADMIN).await;
    let mut scheduler = loop_.join().expect("the loop's thread");
    assert_eq!(status, StatusCode::OK, "{reset}");
    assert_eq!(
        reset["reason"],
        "one more cordon would put 2 of 4 nodes out, over the 30% cap"
    );
    assert_eq!(
        (reset["held"].clone(), reset["by"].clone()),
        (1.into(), "root".into())
    );
    assert_eq!(reset["tripped_at_ms"].as_u64(), Some(tripped_ms));
    assert!(scheduler.lifecycle().breaker.tripped.is_none());
    assert_eq!(scheduler.lifecycle().breaker.held, 0);
    let entry = state
        .live
        .store
        .audit_recent(10)
        .expect("audit")
        .into_iter()
        .find(|e| e.action == "health.reset")
        .expect("the reset's audit entry");
    assert_eq!(
        (entry.who.as_str(), entry.from.as_str()),
        ("root", "127.0.0.1:9")
    );
    assert!(
        entry
            .detail
            .starts_with("reset the node health breaker, tripped ")
            && entry.detail.ends_with(
                " before (one more cordon would put 2 of 4 nodes out, over the 30% cap); \
                 it had held 1 failure signal"
            ),
        "{}",
        entry.detail
    );
    // The API sees it at once, and once node-0 is back, automated cordons go ahead again.
    let (_, health) = call(&state, Method::GET, "/api/health", VIEWER).await;
    assert_eq!(health["breaker"]["tripped"], false);
    assert_eq!(health["breaker"]["reason"], Value::Null);
    scheduler.lifecycle_mut().repaired(0, false, 25.0);
    scheduler.sync_health(0);
    let again = scheduler.node_failed(1, "GpuXidError (Xid 48)", 30.0);
    assert_eq!(again.verdict, gantry_core::health::Verdict::Cordoned);
}

#[tokio::test]
async fn a_reset_with_nothing_tripped_is_refused_in_words() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = state(dir.path(), DoorOptions::default());
    let mut scheduler = scheduler(state.live.symbols());
    pass(&state, &mut scheduler);
    let loop_ = answer_one_reset(&state, scheduler);
    let (status, refused) = call(&state, Method::POST, "/api/health/reset", ADMIN).await;
    loop_.join().expect("the loop's thread");
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        refused["error"],
        "the breaker is not tripped: automated cordons go ahead, and there is nothing to reset"
    );
    assert!(
        state
            .live
            .store
            .audit_recent(10)
            .expect("audit")
            .iter()
            .all(|e| e.action != "health.reset")
    );
}

#[tokio::test]
async fn an_unknown_node_is_named_in_the_404() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = state(dir.path(), DoorOptions::default());
    let mut scheduler = scheduler(state.live.symbols());
    pass(&state, &mut scheduler);
    let (status, body) = call(&state, Method::GET, "/api/nodes/gpu-node-99/health", VIEWER).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], "no node named gpu-node-99");
    // A fresh fleet: all ready, nothing tripped, nothing happened yet.
    let (status, health) = call(&state, Method::GET, "/api/health", VIEWER).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(health["nodes"]["ready"], 4);
    assert_eq!(health["nodes"].as_object().map(|m| m.len()), Some(7));
    assert_eq!(health["breaker"]["tripped"], false);
    assert_eq!(health["transitions"], serde_json::json!([]));
}

#[tokio::test]
async fn a_follower_refuses_the_reset_naming_the_leader() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = state(dir.path(), DoorOptions::default());
    state
        .live
        .set_leader_elsewhere(Some("gantry-0_1a2b3c4d".into()));
    let (status, body) = call(&state, Method::POST, "/api/health/reset", ADMIN).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        body["error"],
        "this replica is a follower and takes no changes: send them to the leader (gantry-0_1a2b3c4d)"
    );
}

/// An 8-GPU single pod `name` in queue `default`.
fn job(scheduler: &Scheduler, name: &str) -> gantry_core::JobSpec {
    gantry_core::fixtures::job(scheduler, name)
}

#[tokio::test]
async fn the_heatmap_reads_lifecycle_states_and_a_restarted_job_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = state(dir.path(), DoorOptions::default());
    let mut scheduler = scheduler(state.live.symbols());
    let hit = scheduler.submit(job(&scheduler, "train"));
    scheduler.submit(job(&scheduler, "other"));
    scheduler.cycle(0.0, &mut gantry_core::BuiltinOnly);
    let node = scheduler.slots(hit)[0].node as usize;
    let name = format!("node-{node}");
    scheduler.advance_clock(30.0);
    let failure = scheduler.node_failed(node, "Xid 79 (GPU fell off the bus)", 30.0);
    assert_eq!(failure.stopped, [hit]);
    pass(&state, &mut scheduler);

    // The columns carry each node's lifecycle state beside the health the filters read.
    let (status, cols) = call(&state, Method::GET, "/api/cluster/nodes", VIEWER).await;
    assert_eq!(status, StatusCode::OK, "{cols}");
    let states: Vec<&str> = cols["state"]
        .as_array()
        .expect("state")
        .iter()
        .map(|s| s.as_str().unwrap_or_default())
        .collect();
    let mut expected = vec!["ready"; 4];
    expected[node] = "repair";
    assert_eq!(states, expected);
    assert_eq!(cols["health"][node], "unhealthy");
    let (status, detail) = call(
        &state,
        Method::GET,
        &format!("/api/cluster/nodes/{name}"),
        VIEWER,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    assert_eq!(detail["state"], "repair");

    // The stopped job lists the node with its cause and times; the filter finds it alone.
    let (status, rows) = call(&state, Method::GET, "/api/jobs?restarted=true", VIEWER).await;
    assert_eq!(status, StatusCode::OK, "{rows}");
    let names: Vec<&str> = rows
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(names, ["train"]);
    let bad = &rows[0]["avoiding"][0];
    assert_eq!(
        (
            bad["node"].as_str(),
            bad["cause"].as_str(),
            bad["at_s"].as_f64()
        ),
        (
            Some(name.as_str()),
            Some("Xid 79 (GPU fell off the bus)"),
            Some(30.0)
        )
    );
    let avoid_s = scheduler.lifecycle().config.avoid_s;
    assert_eq!(bad["until_s"].as_f64(), Some(30.0 + avoid_s));
    let (at_ms, until_ms) = (bad["at_ms"].as_u64(), bad["until_ms"].as_u64());
    assert_eq!(
        until_ms.zip(at_ms).map(|(u, a)| u - a),
        Some((avoid_s * 1000.0) as u64),
        "on the wall clock, as far apart as on the scheduler's"
    );
    let (_, rows) = call(&state, Method::GET, "/api/jobs?restarted=false", VIEWER).await;
    assert_eq!(rows[0]["name"], "other");
    assert_eq!(rows[0]["avoiding"], serde_json::json!([]));

    // The job's explanation carries the same list, for its page.
    let (status, explain) = call(&state, Method::GET, "/api/explain/train", VIEWER).await;
    assert_eq!(status, StatusCode::OK, "{explain}");
    assert_eq!(explain["avoiding"], rows_avoiding(&state).await);
}

/// The `avoiding` list of job `train` in the job list.
async fn rows_avoiding(state: &Arc<AppState>) -> Value {
    let (_, rows) = call(state, Method::GET, "/api/jobs?q=train", VIEWER).await;
    rows[0]["avoiding"].clone()
}
