//! The routes in process (`tower::ServiceExt::oneshot`), no listener.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use tower::ServiceExt;

use super::*;

const ADMIN: &str = "admin-token-0123456789";
const VIEWER: &str = "viewer-token-0123456789";

/// The router on an empty store, with one admin and one viewer token.
fn app(dir: &std::path::Path) -> Router {
    app_of(state(dir, DoorOptions::default()))
}

/// The router on `state`, every request from 127.0.0.1:9.
fn app_of(state: Arc<AppState>) -> Router {
    router(state).layer(MockConnectInfo(SocketAddr::from(([127, 0, 0, 1], 9))))
}

/// The shared state on an empty store, with one admin and one viewer token.
pub(crate) fn state(dir: &std::path::Path, options: DoorOptions) -> Arc<AppState> {
    let tokens_path = dir.join("tokens.yaml");
    std::fs::write(
        &tokens_path,
        format!(
            "tokens:\n  - {{name: root, role: admin, token: {ADMIN}}}\n  - {{name: eve, role: viewer, token: {VIEWER}}}\n"
        ),
    )
    .expect("tokens");
    let symbols = gantry_core::Symbols::new();
    let store = gantry_store::Store::open(gantry_store::StoreConfig::new(dir.join("store")))
        .expect("store");
    let policies = Arc::new(
        gantry_policy::PolicyEngine::new(gantry_policy::Limits::default(), symbols)
            .expect("engine"),
    );
    let live = Live::new(
        store,
        policies,
        gantry_policy::PolicySet::new(0, Vec::new()),
        gantry_engine::LiveConfig::default(),
    );
    let tokens = Tokens::load(&tokens_path).expect("load");
    AppState::new(live, tokens, options)
}

/// A body that never ends: whoever reads it reads for ever (or hits a limit).
fn endless() -> Body {
    let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
    Body::from_stream(tokio_stream::iter(
        std::iter::repeat(chunk).map(Ok::<_, std::io::Error>),
    ))
}

fn post(path: &str, token: Option<&str>, body: Body) -> Request {
    let mut request = Request::post(path).header(header::CONTENT_TYPE, "application/json");
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    request.body(body).expect("request")
}

#[tokio::test]
async fn anonymous_bodies_are_refused_before_they_are_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    for path in ["/api/policies", "/api/sets", "/api/shadow"] {
        let response = app(dir.path())
            .oneshot(post(path, None, endless()))
            .await
            .expect("response");
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{path}");
        let response = app(dir.path())
            .oneshot(post(path, Some("wrong-token-0123456789"), endless()))
            .await
            .expect("response");
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
}

#[tokio::test]
async fn bodies_outside_the_uploads_are_capped_small() {
    let dir = tempfile::tempdir().expect("tempdir");
    // An admin's endless body: cut off at the small cap on a JSON route.
    let response = app(dir.path())
        .oneshot(post("/api/sets", Some(ADMIN), endless()))
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // Just under the cap is read (and refused as JSON, not for its size).
    let small = Body::from(vec![b' '; SMALL_BODY_BYTES - 16]);
    let response = app(dir.path())
        .oneshot(post("/api/sets", Some(ADMIN), small))
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn the_audit_log_is_for_admins_and_responses_carry_security_headers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let get = |token: &str| {
        Request::get("/api/audit")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Body::empty())
            .expect("request")
    };
    let response = app(dir.path())
        .oneshot(get(VIEWER))
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let response = app(dir.path()).oneshot(get(ADMIN)).await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers();
    assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    assert_eq!(headers[header::X_FRAME_OPTIONS], "DENY");
    let csp = headers[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .expect("csp");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    // The UI's pages too, and a refusal.
    let response = app(dir.path())
        .oneshot(Request::get("/").body(Body::empty()).expect("request"))
        .await
        .expect("response");
    assert!(
        response
            .headers()
            .contains_key(header::CONTENT_SECURITY_POLICY)
    );
    let response = app(dir.path())
        .oneshot(post("/api/sets", None, Body::empty()))
        .await
        .expect("response");
    assert_eq!(response.headers()[header::X_FRAME_OPTIONS], "DENY");
}

fn get(path: &str, token: Option<&str>) -> Request {
    let mut request = Request::get(path);
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    request.body(Body::empty()).expect("request")
}

#[tokio::test]
async fn every_refusal_is_in_the_audit_log_with_the_token_and_the_client() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = state(dir.path(), DoorOptions::default());
    let statuses = [
        (get("/api/cluster", None), StatusCode::UNAUTHORIZED),
        (
            get("/api/cluster", Some("wrong-token-0123456789")),
            StatusCode::UNAUTHORIZED,
        ),
        (get("/api/audit", Some(VIEWER)), StatusCode::FORBIDDEN),
        (
            post("/api/sets/999/activate", Some(VIEWER), Body::empty()),
            StatusCode::FORBIDDEN,
        ),
    ];
    for (request, status) in statuses {
        let response = app_of(state.clone())
            .oneshot(request)
            .await
            .expect("response");
        assert_eq!(response.status(), status);
    }
    let mut entries = state.live.store.audit_recent(10).expect("audit");
    entries.reverse();
    let seen: Vec<(String, String, String, String)> = entries
        .into_iter()
        .map(|e| (e.who, e.from, e.action, e.detail))
        .collect();
    let wrong = Tokens::load(&dir.path().join("tokens.yaml"))
        .expect("tokens")
        .presented_digest(&{
            let mut headers = HeaderMap::new();
            headers.insert(
                header::AUTHORIZATION,
                HeaderValue::from_static("Bearer wrong-token-0123456789"),
            );
            headers
        })
        .expect("digest");
    let refused = |who: &str, detail: &str| {
        (
            who.to_string(),
            "127.0.0.1:9".to_string(),
            "request.refused".to_string(),
            detail.to_string(),
        )
    };
    assert_eq!(
        seen,
        vec![
            refused("anonymous", "401 GET /api/cluster"),
            refused(
                &format!("unknown token sha256:{wrong}"),
                "401 GET /api/cluster"
            ),
            refused("eve (viewer)", "403 GET /api/audit"),
            refused("eve (viewer)", "403 POST /api/sets/999/activate"),
        ]
    );
    assert_eq!(wrong.len(), 12);
    assert!(!seen.iter().any(|e| e.0.contains("wrong-token")));
}

#[test]
fn refusals_past_the_pace_are_counted_and_named_in_the_next_entry() {
    let mut pace = RefusalPace::default();
    let recorded = (0..REFUSAL_BURST as usize + 50)
        .filter(|_| pace.admit().is_some())
        .count();
    // The burst, plus what a few microseconds of refill allow.
    assert!(recorded >= REFUSAL_BURST as usize && recorded < REFUSAL_BURST as usize + 50);
    pace.at -= Duration::from_secs(1);
    assert_eq!(
        pace.admit(),
        Some((REFUSAL_BURST as usize + 50 - recorded) as u64)
    );
    assert_eq!(pace.admit(), Some(0));
}

#[test]
fn forwarded_for_is_believed_only_from_trusted_proxies() {
    let nets: Vec<IpNet> = ["10.0.0.0/8", "fd00::/8", "192.0.2.7"]
        .iter()
        .map(|n| n.parse().expect("net"))
        .collect();
    let mut headers = HeaderMap::new();
    headers.insert(
        "x-forwarded-for",
        HeaderValue::from_static("203.0.113.9, 198.51.100.4, 10.1.2.3"),
    );
    let from = |peer: &str| client_of(peer.parse().expect("peer"), &headers, &nets);
    // A trusted proxy: the nearest untrusted hop, right to left.
    assert_eq!(from("10.9.9.9:443"), "198.51.100.4");
    assert_eq!(from("192.0.2.7:443"), "198.51.100.4");
    assert_eq!(from("[fd00::1]:443"), "198.51.100.4");
    // Anyone else: the header is theirs to forge, and ignored.
    assert_eq!(from("198.51.100.200:5000"), "198.51.100.200:5000");
    assert_eq!(from("192.0.2.8:443"), "192.0.2.8:443");
    // Nothing forwarded: the proxy itself.
    assert_eq!(
        client_of(
            "10.0.0.1:1".parse().expect("peer"),
            &HeaderMap::new(),
            &nets
        ),
        "10.0.0.1"
    );
    assert_eq!(
        "10.0.0.0/33".parse::<IpNet>().unwrap_err(),
        "\"10.0.0.0/33\": the prefix is longer than 32 bits"
    );
    assert_eq!(
        "proxy.local".parse::<IpNet>().unwrap_err(),
        "\"proxy.local\" is not an IP address or network (e.g. 10.0.0.0/8, ::1)"
    );
}

#[tokio::test]
async fn metrics_ask_for_a_token_when_told_to() {
    let dir = tempfile::tempdir().expect("tempdir");
    let open = app(dir.path())
        .oneshot(get("/metrics", None))
        .await
        .expect("response");
    assert_eq!(open.status(), StatusCode::OK);
    let closed = state(
        dir.path(),
        DoorOptions {
            metrics_need_token: true,
            ..DoorOptions::default()
        },
    );
    let response = app_of(closed.clone())
        .oneshot(get("/metrics", None))
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let response = app_of(closed)
        .oneshot(get("/metrics", Some(VIEWER)))
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::OK);
}

#[test]
fn a_jobs_history_reads_placed_preempted_then_one_pending_step() {
    let record = |time_ms: u64, outcome: Outcome, by: Option<&str>| {
        let mut explanation = gantry_store::sample_explanation(1);
        explanation.outcome = outcome;
        explanation.preempted_by = by.map(str::to_string);
        DecisionRecord {
            time_ms,
            seq: time_ms,
            explanation,
        }
    };
    let pending = |why: &str| Outcome::Pending {
        waiting_for: why.into(),
    };
    let placed = Outcome::Placed {
        nodes: vec![("node-1".into(), 2)],
    };
    let events = job_events(&[
        record(1_000, pending("room"), None),
        record(2_000, placed, None),
        record(3_000, pending("room again"), Some("big")),
        record(4_000, pending("quota"), None),
        record(5_000, pending("quota, still"), None),
    ]);
    let steps: Vec<(u64, JobEventKind, &str, Option<&str>)> = events
        .iter()
        .map(|e| (e.time_ms, e.kind, e.text.as_str(), e.by.as_deref()))
        .collect();
    assert_eq!(
        steps,
        vec![
            (1_000, JobEventKind::Pending, "waiting for room", None),
            (
                2_000,
                JobEventKind::Placed,
                "placed on node-1 ×2 in rack 1",
                None
            ),
            (
                3_000,
                JobEventKind::Preempted,
                "preempted to make room for big",
                Some("big")
            ),
            (
                4_000,
                JobEventKind::Pending,
                "waiting for quota, still",
                None
            ),
        ]
    );
}

/// A response's body as text (the first 4 KiB).
async fn text_of(response: Response) -> String {
    let body = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .expect("body");
    String::from_utf8_lossy(&body).into_owned()
}

/// A body that notes whether anyone read it.
fn watched(read: &Arc<std::sync::atomic::AtomicBool>) -> Body {
    let read = read.clone();
    Body::from_stream(tokio_stream::iter(std::iter::once(()).map(move |()| {
        read.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok::<_, std::io::Error>(Bytes::from_static(b"{}"))
    })))
}

/// A body whose first byte never comes: its request holds whatever it holds until dropped.
fn stalled() -> Body {
    Body::from_stream(tokio_stream::pending::<std::io::Result<Bytes>>())
}

#[tokio::test]
async fn a_viewers_body_is_refused_from_the_headers_before_it_is_read() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().expect("tempdir");
    let app = app(dir.path());
    for (method, path, action) in [
        (Method::POST, "/api/policies", "upload a policy"),
        (Method::POST, "/api/policies/validate", "validate a policy"),
        (Method::POST, "/api/sets", "create a policy set"),
        (
            Method::POST,
            "/api/sets/999/activate",
            "activate a policy set",
        ),
        (
            Method::POST,
            "/api/sets/1/rollback",
            "roll back the policy set",
        ),
        (Method::POST, "/api/shadow", "start shadow mode"),
        (Method::DELETE, "/api/shadow", "stop shadow mode"),
        (Method::GET, "/api/audit", "read the audit log"),
    ] {
        let read = Arc::new(AtomicBool::new(false));
        let request = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(header::AUTHORIZATION, format!("Bearer {VIEWER}"))
            .body(watched(&read))
            .expect("request");
        let response = app.clone().oneshot(request).await.expect("response");
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{method} {path}");
        assert!(
            !read.load(Ordering::SeqCst),
            "{method} {path}: the body was read"
        );
        let text = text_of(response).await;
        assert!(
            text.contains(&format!(
                "the viewer token of eve may not {action}: an admin token is needed"
            )),
            "{method} {path}: {text}"
        );
    }
    // The same body from an admin is read: the check above can fail.
    let read = Arc::new(AtomicBool::new(false));
    let response = app
        .clone()
        .oneshot(post("/api/policies/validate", Some(ADMIN), watched(&read)))
        .await
        .expect("response");
    assert_ne!(response.status(), StatusCode::FORBIDDEN);
    assert!(
        read.load(Ordering::SeqCst),
        "an admin's upload was not read"
    );
}

#[tokio::test]
async fn one_token_cannot_hold_more_than_its_share_of_requests() {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = app(dir.path());
    let over = 6;
    let mut held: Vec<_> = (0..REQUESTS_IN_FLIGHT_PER_TOKEN + over)
        .map(|_| {
            tokio::spawn(
                app.clone()
                    .oneshot(post("/api/whatif", Some(VIEWER), stalled())),
            )
        })
        .collect();
    // The ones over the cap answer at once; the rest wait on their bodies for ever.
    for _ in 0..500 {
        if held.iter().filter(|h| h.is_finished()).count() >= over {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (done, waiting): (Vec<_>, Vec<_>) = held.into_iter().partition(|h| h.is_finished());
    held = waiting;
    let mut refused = Vec::new();
    for handle in done {
        refused.push(handle.await.expect("task").expect("response"));
    }
    assert_eq!(refused.len(), over, "requests answered while the rest wait");
    assert_eq!(held.len(), REQUESTS_IN_FLIGHT_PER_TOKEN);
    for response in refused {
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        let text = text_of(response).await;
        assert!(
            text.contains(&format!(
                "the token of eve has {REQUESTS_IN_FLIGHT_PER_TOKEN} requests in flight"
            )),
            "{text}"
        );
    }
    // Another token is not counted against this one's share.
    let response = app
        .clone()
        .oneshot(get("/api/whoami", Some(ADMIN)))
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    for handle in held {
        handle.abort();
    }
}

/// The state on an empty store with one admin token (`root`), `viewers` viewer tokens
/// (`viewer-N`, token `{VIEWER}-N`) and `admins` more admin tokens (`admin-N`, token
/// `{ADMIN}-N`).
fn state_with_tokens(
    dir: &std::path::Path,
    viewers: usize,
    admins: usize,
    options: DoorOptions,
) -> Arc<AppState> {
    let state = state(dir, options.clone());
    let tokens_path = dir.join("more-tokens.yaml");
    let mut file = format!("tokens:\n  - {{name: root, role: admin, token: {ADMIN}}}\n");
    for n in 0..viewers {
        file.push_str(&format!(
            "  - {{name: viewer-{n}, role: viewer, token: {VIEWER}-{n}}}\n"
        ));
    }
    for n in 0..admins {
        file.push_str(&format!(
            "  - {{name: admin-{n}, role: admin, token: {ADMIN}-{n}}}\n"
        ));
    }
    std::fs::write(&tokens_path, file).expect("tokens");
    AppState::new(
        state.live.clone(),
        Tokens::load(&tokens_path).expect("load"),
        options,
    )
}

/// `count` requests whose bodies never come, by the tokens `token(i)`.
fn stalled_requests(
    app: &Router,
    count: usize,
    token: impl Fn(usize) -> String,
) -> Vec<tokio::task::JoinHandle<std::result::Result<Response, Infallible>>> {
    (0..count)
        .map(|i| {
            tokio::spawn(
                app.clone()
                    .oneshot(post("/api/whatif", Some(&token(i)), stalled())),
            )
        })
        .collect()
}

#[tokio::test]
async fn viewers_cannot_take_the_admins_share_of_the_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    // No body deadline to speak of: an admin call starved by the viewers would wait an hour.
    let options = DoorOptions {
        body_read_timeout: Duration::from_secs(3600),
        ..DoorOptions::default()
    };
    let app = app_of(state_with_tokens(dir.path(), 5, 0, options));
    // 300 slow viewer requests, 60 per token (under each token's own cap).
    let mut slow = stalled_requests(&app, 300, |i| format!("{VIEWER}-{}", i % 5));
    let over = 300 - VIEWER_REQUESTS_IN_FLIGHT;
    for _ in 0..500 {
        if slow.iter().filter(|h| h.is_finished()).count() >= over {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (done, waiting): (Vec<_>, Vec<_>) = slow.into_iter().partition(|h| h.is_finished());
    slow = waiting;
    assert_eq!(done.len(), over, "viewer requests answered at once");
    assert_eq!(slow.len(), VIEWER_REQUESTS_IN_FLIGHT);
    for handle in done {
        let response = handle.await.expect("task").expect("response");
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            text_of(response).await,
            format!(
                "{{\"error\":\"viewers have {VIEWER_REQUESTS_IN_FLIGHT} requests in flight, their most at once (the rest are kept for admins): try again shortly\"}}"
            )
        );
    }
    // The admin is answered, not queued behind them.
    let started = std::time::Instant::now();
    let whoami = tokio::time::timeout(
        Duration::from_secs(600),
        app.clone().oneshot(get("/api/whoami", Some(ADMIN))),
    )
    .await
    .expect("the admin's call waited behind the viewers' slow requests")
    .expect("response");
    assert_eq!(whoami.status(), StatusCode::OK);
    println!(
        "an admin's whoami answered in {:?} with {VIEWER_REQUESTS_IN_FLIGHT} slow viewer requests open",
        started.elapsed()
    );
    // A viewer ending its request gives its place to the next viewer.
    slow.pop().expect("one").abort();
    for _ in 0..500 {
        let response = app
            .clone()
            .oneshot(get("/api/whoami", Some(&format!("{VIEWER}-0"))))
            .await
            .expect("response");
        if response.status() == StatusCode::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let response = app
        .clone()
        .oneshot(get("/api/whoami", Some(&format!("{VIEWER}-1"))))
        .await
        .expect("response");
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "the freed place was not given back"
    );
    for handle in slow {
        handle.abort();
    }
}

#[tokio::test]
async fn the_probes_answer_while_slow_requests_hold_every_permit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = app_of(state_with_tokens(dir.path(), 4, 1, DoorOptions::default()));
    // Every permit held: 192 slow viewer requests (the viewers' share, 48 per token) and 64
    // from an admin token (its own cap).
    let viewers = stalled_requests(&app, VIEWER_REQUESTS_IN_FLIGHT, |i| {
        format!("{VIEWER}-{}", i % 4)
    });
    let admins = stalled_requests(&app, REQUESTS_IN_FLIGHT_PER_TOKEN, |_| format!("{ADMIN}-0"));
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Another admin's request waits its turn behind them: the limit is spent.
    let whoami = tokio::time::timeout(
        Duration::from_millis(500),
        app.clone().oneshot(get("/api/whoami", Some(ADMIN))),
    )
    .await;
    assert!(whoami.is_err(), "the limit was not spent: {whoami:?}");
    for probe in ["/healthz", "/readyz"] {
        let started = std::time::Instant::now();
        let response = tokio::time::timeout(
            Duration::from_secs(30),
            app.clone()
                .oneshot(Request::get(probe).body(Body::empty()).expect("request")),
        )
        .await
        .unwrap_or_else(|_| panic!("{probe} waited behind the slow requests"))
        .expect("response");
        // Not ready (no loop runs here) is an answer too: what matters is that it came.
        assert!(
            [StatusCode::OK, StatusCode::SERVICE_UNAVAILABLE].contains(&response.status()),
            "{probe}: {}",
            response.status()
        );
        println!(
            "{probe} answered in {:?} with every permit held by slow requests",
            started.elapsed()
        );
    }
    for handle in viewers.into_iter().chain(admins) {
        handle.abort();
    }
}

#[tokio::test]
async fn the_decision_stream_takes_so_many_clients_and_then_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = app(dir.path());
    let token = |i: usize| if i.is_multiple_of(2) { ADMIN } else { VIEWER };
    let mut followers = Vec::new();
    for i in 0..DECISION_STREAM_CLIENTS {
        let response = app
            .clone()
            .oneshot(get("/api/decisions/stream", Some(token(i))))
            .await
            .expect("response");
        assert_eq!(response.status(), StatusCode::OK, "client {i}");
        followers.push(response);
    }
    let refused = app
        .clone()
        .oneshot(get("/api/decisions/stream", Some(VIEWER)))
        .await
        .expect("response");
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let text = text_of(refused).await;
    assert!(
        text.contains(&format!(
            "{DECISION_STREAM_CLIENTS} clients already follow the decision stream"
        )),
        "{text}"
    );
    // One leaves: the next is taken.
    followers.pop();
    let response = app
        .clone()
        .oneshot(get("/api/decisions/stream", Some(VIEWER)))
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_refused_naming_the_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = DoorOptions {
        body_read_timeout: Duration::from_millis(300),
        ..DoorOptions::default()
    };
    let app = app_of(state(dir.path(), options));
    let started = std::time::Instant::now();
    let response = app
        .clone()
        .oneshot(post("/api/whatif", Some(VIEWER), stalled()))
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let text = text_of(response).await;
    assert!(
        text.contains("the request body did not arrive whole within 0.3 s"),
        "{text}"
    );
    println!("a stalled body was refused after {:?}", started.elapsed());
    // A body that arrives in pieces within the deadline is read whole (and judged as JSON).
    let pieces = Body::from_stream(tokio_stream::StreamExt::throttle(
        tokio_stream::iter(["{\"pods\":", " 0}"].map(|s| Ok::<_, std::io::Error>(Bytes::from(s)))),
        Duration::from_millis(50),
    ));
    let response = app
        .clone()
        .oneshot(post("/api/whatif", Some(VIEWER), pieces))
        .await
        .expect("response");
    let status = response.status();
    let text = text_of(response).await;
    assert!(!text.contains("did not arrive"), "{status}: {text}");
}

#[tokio::test]
async fn a_follower_refuses_changes_naming_the_leader_and_still_serves_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = state(dir.path(), DoorOptions::default());
    state
        .live
        .set_leader_elsewhere(Some("gantry-0_1a2b3c4d".into()));
    let app = app_of(state.clone());
    let response = app
        .clone()
        .oneshot(post("/api/sets/999/activate", Some(ADMIN), Body::empty()))
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert!(
        text_of(response).await.contains(
            "this replica is a follower and takes no changes: send them to the leader (gantry-0_1a2b3c4d)"
        )
    );
    // A viewer is told it needs an admin first, and reads are served.
    let viewer = app
        .clone()
        .oneshot(post("/api/sets/999/activate", Some(VIEWER), Body::empty()))
        .await
        .expect("response");
    assert_eq!(viewer.status(), StatusCode::FORBIDDEN);
    let read = app
        .clone()
        .oneshot(get("/api/sets", Some(ADMIN)))
        .await
        .expect("response");
    assert_eq!(read.status(), StatusCode::OK);
    // Leading again, the same change reaches its handler (there is no set 999: 404).
    state.live.set_leader_elsewhere(None);
    let leading = app
        .oneshot(post("/api/sets/999/activate", Some(ADMIN), Body::empty()))
        .await
        .expect("response");
    assert_ne!(leading.status(), StatusCode::CONFLICT);
}
