//! The REST API and the CLI against a real `gantry serve` (simulated 7,500-node cluster, the
//! example Wasm policies, a sled store in a temporary directory).

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::{ADMIN, Body, Server, VIEWER, plugin, sha_of};
use serde_json::{Value, json};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Polls `f` until it returns `Some`, for at most `secs`.
fn eventually<T>(secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "condition not met in {secs} s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn tokens_roles_and_upload_limits() {
    let server = Server::start(&["--jobs-per-s", "20", "--max-upload-mib", "1"]);
    let (status, body) = server.get_as("/healthz", None).expect("healthz");
    assert_eq!((status, body.as_str()), (200, "ok"));
    let (status, body) = server.get_as("/api/policies", None).expect("no token");
    assert_eq!(status, 401);
    assert!(body.contains("missing bearer token"), "{body}");
    let (status, body) = server
        .get_as("/api/policies", Some("not-a-real-token-at-all"))
        .expect("bad token");
    assert_eq!(status, 401);
    assert!(body.contains("unknown or revoked token"), "{body}");
    let (status, who) = server.get("/api/whoami");
    assert_eq!((status, who["role"].as_str()), (200, Some("viewer")));

    // Every mutating endpoint refuses a viewer (403) and a missing token (401).
    let mutations: [(&str, &str); 6] = [
        ("POST", "/api/policies"),
        ("POST", "/api/policies/validate"),
        ("POST", "/api/sets"),
        ("POST", "/api/sets/1/activate"),
        ("POST", "/api/sets/1/rollback"),
        ("POST", "/api/shadow"),
    ];
    for (_, path) in mutations {
        let (status, body) = server.post(path, Some(VIEWER), Body::Json(json!({"version": 1})));
        assert_eq!(status, 403, "{path}: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("the viewer token of bob may not")),
            "{path}: {body}"
        );
        let (status, _) = server.post(path, None, Body::None);
        assert_eq!(status, 401, "{path}");
    }
    let (status, _) = server.delete("/api/shadow", Some(VIEWER));
    assert_eq!(status, 403);

    // Uploads: too large, not Wasm, a policy that hangs, a refused config.
    let (status, body) = server.post(
        "/api/policies",
        Some(ADMIN),
        Body::Bytes(vec![0u8; 2 << 20]),
    );
    assert_eq!(status, 413, "{body}");
    assert_eq!(
        body["error"],
        "the upload is 2097152 bytes, over the limit of 1048576 bytes"
    );
    let (status, body) = server.post(
        "/api/policies",
        Some(ADMIN),
        Body::Bytes(b"hello, not wasm".to_vec()),
    );
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("not a WebAssembly component"))
    );
    let (status, body) = server.post(
        "/api/policies",
        Some(ADMIN),
        Body::Bytes(std::fs::read(plugin("hostile_loop.wasm")).expect("read")),
    );
    assert_eq!(status, 422, "{body}");
    assert_eq!(
        body["error"],
        "the self-test against the current cluster snapshot faulted: timed out after 50 ms",
        "the loop runs in its filter, after init"
    );
    let (status, body) = server.post(
        "/api/policies?config=%7B%22nope%22%3A1%7D",
        Some(ADMIN),
        Body::Bytes(std::fs::read(plugin("team_quota.wasm")).expect("read")),
    );
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e
            .starts_with("the policy refused its config: team-quota config: unknown field `nope`")),
        "{body}"
    );
    // Nothing of that was stored; only the three example policies are.
    let (_, policies) = server.get("/api/policies");
    assert_eq!(policies.as_array().map(Vec::len), Some(3), "{policies}");
    let (status, refused) = server.get("/api/audit?limit=1000");
    assert_eq!(status, 403, "a viewer reads the audit log: {refused}");
    let (_, audit) = server.get_admin("/api/audit?limit=1000");
    assert!(
        audit
            .as_array()
            .expect("audit")
            .iter()
            .all(|e| e["who"] != "bob"),
        "a refused request left an audit entry: {audit}"
    );
}

#[test]
fn shadow_activate_rollback_explain_and_lookups() {
    let mut server = Server::start(&["--jobs-per-s", "40"]);
    let fit = sha_of(&server, "gpu-fit");
    let binpack = sha_of(&server, "gpu-binpack");
    let quota = sha_of(&server, "team-quota");

    // A candidate that packs by domain only and never lends quota: it must disagree.
    let entries = json!([
        {"sha256": fit, "weight": 1, "config": "{}"},
        {"sha256": binpack, "weight": 1, "config": "{\"node_weight\":0,\"domain_weight\":100}"},
        {"sha256": quota, "weight": 1, "config": "{\"borrowing\":false}"},
    ]);
    let (status, set) = server.post(
        "/api/sets",
        Some(ADMIN),
        Body::Json(json!({"entries": entries, "note": "domain packing, no borrowing"})),
    );
    assert_eq!(status, 201, "{set}");
    assert_eq!(set["version"], 2);
    let (status, body) = server.post(
        "/api/sets",
        Some(ADMIN),
        Body::Json(json!({"entries": [{"sha256": quota, "weight": 1, "config": "{\"nope\":1}"}]})),
    );
    assert_eq!(status, 422, "{body}");
    let (status, body) = server.post("/api/sets/99/activate", Some(ADMIN), Body::None);
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"], "no policy set version 99 exists");

    let (status, report) = server.post(
        "/api/shadow",
        Some(ADMIN),
        Body::Json(json!({"version": 2})),
    );
    assert_eq!(status, 201, "{report}");
    let report = eventually(60, || {
        let (_, r) = server.get("/api/shadow");
        let total: u64 = r["counts"]
            .as_object()?
            .values()
            .filter_map(Value::as_u64)
            .sum();
        (total > 0).then_some(r)
    });
    assert!(report["cycles"].as_u64().unwrap_or(0) > 0);
    let d = &report["recent"][0];
    assert!(
        d["active"]["policy_set"] == 1 && d["candidate"]["policy_set"] == 2,
        "{d}"
    );
    // The shadow binds nothing: the active set is still 1.
    let (_, sets) = server.get("/api/sets");
    assert_eq!(sets["active"], 1);
    let (status, stopped) = server.delete("/api/shadow", Some(ADMIN));
    assert_eq!(status, 200, "{stopped}");
    assert_eq!(server.get("/api/shadow").0, 404);

    // Activate, see the next decisions made by version 2, roll back.
    let (status, body) = server.post("/api/sets/2/activate", Some(ADMIN), Body::None);
    assert_eq!(status, 200, "{body}");
    wait_for_decisions_of(&server, 2, 30);
    let (status, body) = server.post("/api/sets/1/rollback", Some(ADMIN), Body::None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(server.get("/api/sets").1["active"], 1);
    let (_, audit) = server.get_admin("/api/audit?limit=50");
    let actions: Vec<(String, String)> = audit
        .as_array()
        .expect("audit")
        .iter()
        .map(|e| {
            (
                e["who"].as_str().unwrap_or("").to_string(),
                e["action"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    for action in [
        "set.create",
        "shadow.start",
        "shadow.stop",
        "set.activate",
        "set.rollback",
    ] {
        assert!(
            actions.contains(&("alice".to_string(), action.to_string())),
            "{action} by alice missing: {actions:?}"
        );
    }

    // Lookups: a gang, one of its pods, a node it ran on, a time range.
    let records = eventually(60, || {
        let (_, all) = server.get("/api/decisions?limit=10000");
        let gang = all.as_array()?.iter().find(|r| {
            r["explanation"]["pods"].as_u64().unwrap_or(0) > 1
                && r["explanation"]["outcome"]["kind"] == "placed"
        })?;
        Some((all.clone(), gang.clone()))
    });
    let (all, gang) = records;
    assert!(all.as_array().is_some_and(|a| a.windows(2).all(|w| {
        (w[0]["time_ms"].as_u64(), w[0]["seq"].as_u64())
            <= (w[1]["time_ms"].as_u64(), w[1]["seq"].as_u64())
    })));
    let job = gang["explanation"]["job"]
        .as_str()
        .expect("job")
        .to_string();
    let node = gang["explanation"]["outcome"]["nodes"][0][0]
        .as_str()
        .expect("node")
        .to_string();
    let (status, history) = server.get(&format!("/api/decisions/job/{job}"));
    assert_eq!(status, 200);
    assert!(
        history
            .as_array()
            .is_some_and(|h| h.iter().all(|r| r["explanation"]["job"] == job.as_str()))
    );
    let (status, by_pod) = server.get(&format!("/api/decisions/pod/{job}-1"));
    assert_eq!(status, 200, "{by_pod}");
    assert_eq!(by_pod, history);
    let (status, on_node) = server.get(&format!("/api/decisions/node/{node}?limit=10000"));
    assert_eq!(status, 200);
    assert!(
        on_node
            .as_array()
            .is_some_and(|h| h.iter().any(|r| r["explanation"]["job"] == job.as_str()))
    );
    let (status, explain) = server.get(&format!("/api/explain/{job}-1"));
    assert_eq!(status, 200, "{explain}");
    assert_eq!(
        (explain["kind"].as_str(), explain["job"].as_str()),
        (Some("pod"), Some(job.as_str()))
    );
    assert!(explain["why"].as_str().is_some_and(|w| !w.is_empty()));
    let (status, missing) = server.get("/api/explain/no-such-job");
    assert_eq!(status, 404);
    assert_eq!(missing["error"], "no job or pod named no-such-job is known");

    // A pending job's "why": quota, fair share, per-reason node counts, what it waits for.
    let pending = eventually(60, || {
        let (_, all) = server.get("/api/decisions?limit=10000");
        let view = server.get("/api/queues").1;
        let _ = view;
        all.as_array()?.iter().rev().find_map(|r| {
            let name = r["explanation"]["job"].as_str()?;
            let (_, e) = server.get(&format!("/api/explain/{name}"));
            (e["state"] == "pending").then_some(e)
        })
    });
    assert!(
        pending["waiting_for"]
            .as_str()
            .is_some_and(|w| !w.is_empty()),
        "{pending}"
    );
    assert!(pending["queue_position"].as_u64().is_some(), "{pending}");
    // The latest decision's quota, in the one verdict the UI and the CLI both show.
    if !pending["latest"].is_null() {
        assert!(
            pending["quota_verdict"]
                .as_str()
                .is_some_and(|v| v.starts_with("admitted") || v.starts_with("denied")),
            "{pending}"
        );
    }
    assert!(pending["queue"]["fair_share"].is_number(), "{pending}");
    // Every pending job has a start estimate or a sentence saying why none can be given.
    assert!(
        pending["estimate"]["text"].is_string() != pending["no_estimate"].is_string(),
        "{pending}"
    );
    let out = server.cli(&["explain", pending["job"].as_str().expect("job")]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains(": pending — "), "{stdout}");
    assert!(stdout.contains("position in its queue: "), "{stdout}");
    assert!(stdout.contains("\n  start: "), "{stdout}");
    assert!(stdout.contains("decided by policy set v"), "{stdout}");
    // `gantry explain X | head -1`: the reader closes the pipe before the output is written,
    // and the command ends quietly, exit 0, no panic.
    let mut piped = std::process::Command::new(env!("CARGO_BIN_EXE_gantry"))
        .args(["explain", pending["job"].as_str().expect("job")])
        .env("GANTRY_SERVER", &server.base)
        .env("GANTRY_TOKEN", ADMIN)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run gantry explain");
    drop(piped.stdout.take());
    let closed = piped.wait_with_output().expect("gantry explain ends");
    assert!(
        closed.status.success() && closed.stderr.is_empty(),
        "{:?}: {}",
        closed.status,
        text(&closed.stderr)
    );

    // What if: the pending job's shape, and its variations, each answered by a forecast (those
    // past the time a what-if has say so).
    let job = pending["job"].as_str().expect("job");
    let (status, answer) = server.post(
        "/api/whatif",
        Some(VIEWER),
        Body::Json(json!({"like": job, "variations": true})),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["answer"]["job"]["queue"], pending["queue_name"],
        "{answer}"
    );
    assert_eq!(answer["answer"]["job"]["pods"], pending["pods"], "{answer}");
    let variations = answer["variations"].as_array().expect("variations");
    assert!(
        variations.iter().any(|v| v["change"]
            .as_str()
            .is_some_and(|c| c.starts_with("queue "))),
        "{answer}"
    );
    assert!(
        variations.iter().all(|v| v["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("would ") || t.starts_with("not answered: "))),
        "{answer}"
    );
    for (body, error) in [
        (
            json!({"queue": "nowhere"}),
            "queue: no queue is named \"nowhere\"",
        ),
        (
            json!({"like": job, "pods": 0}),
            "pods: 0 is not between 1 and 100000",
        ),
        (
            json!({"like": job, "gpu_type": "Z9"}),
            "gpu_type: no node has GPUs of type \"Z9\"",
        ),
        (
            json!({"pods": 4}),
            "queue: give the queue to submit to, or `like`, a pending job to start from",
        ),
    ] {
        let (status, answer) = server.post("/api/whatif", Some(VIEWER), Body::Json(body.clone()));
        assert_eq!(
            (status, answer["error"].as_str()),
            (400, Some(error)),
            "{body}"
        );
    }
    let (status, answer) = server.post("/api/whatif", Some(VIEWER), Body::Json(json!({"gpus": 8})));
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|e| e.contains("unknown field `gpus`")),
        "{answer}"
    );
    let out = server.cli(&["whatif", "--like", job]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        (stdout.contains(" pods × ") || stdout.starts_with("1 pod × "))
            && !stdout.contains("1 pods")
            && stdout.contains(": would "),
        "{stdout}"
    );

    // Cluster, nodes, queues, metrics, SSE.
    let (_, cluster) = server.get("/api/cluster");
    assert_eq!(cluster["nodes"], 7500);
    assert!(cluster["levels"].as_array().is_some_and(|l| !l.is_empty()));
    let (_, nodes) = server.get("/api/cluster/nodes");
    assert_eq!(nodes["name"].as_array().map(Vec::len), Some(7500));
    assert_eq!(nodes["gpu_free"].as_array().map(Vec::len), Some(7500));
    let (status, detail) = server.get(&format!("/api/cluster/nodes/{node}"));
    assert_eq!(status, 200, "{detail}");
    // `gantry explain` of a node's name is its health: its state and transitions.
    let out = server.cli(&["explain", &node]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.starts_with(&format!("{node}: ")), "{stdout}");
    let out = server.cli(&["explain", "no-such-job-or-node"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no-such-job-or-node"),
        "{}",
        text(&out.stderr)
    );
    let (_, queues) = server.get("/api/queues");
    assert!(
        queues
            .as_array()
            .is_some_and(|q| q.iter().any(|q| q["nominal_gpus"].as_u64() > Some(0)))
    );
    let (_, metrics) = server.get_as("/metrics", None).expect("metrics");
    for needle in [
        "scheduler_schedule_attempts_total{profile=\"gantry\",result=\"scheduled\"}",
        "scheduler_scheduling_attempt_duration_seconds_bucket",
        "gantry_scheduling_cycle_duration_seconds_count",
        "gantry_forecast_duration_seconds_count",
        "scheduler_pending_pods{queue=\"active\"}",
        "gantry_policy_calls_total{policy=\"gpu-fit\"",
        "gantry_policy_faults_total{policy=\"team-quota\"",
        "gantry_policy_quarantined{policy=\"team-quota\"",
        "gantry_shadow_disagreements_total{kind=",
        "gantry_policy_set_active_version 1",
    ] {
        assert!(metrics.contains(needle), "{needle} missing from /metrics");
    }
    let event = first_sse_event(&server.base);
    assert!(
        event.contains("event: decision") && event.contains("\"policy_set\":"),
        "{event}"
    );

    // The CLI.
    let out = server.cli(&["policy", "list"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains("* v1 ") && stdout.contains("  v2 "),
        "{stdout}"
    );
    let out = server.cli(&["policy", "activate", "99"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        "error: no policy set version 99 exists (404)\n"
    );
    let out = server.cli(&[
        "policy",
        "push",
        plugin("noop.wasm").to_str().expect("path"),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.starts_with("noop 0.1.0 (filter policy) stored as sha256 "),
        "{stdout}"
    );
    assert!(
        stdout.contains("created set version 3 (version 1 with this policy)"),
        "{stdout}"
    );
    let out = server.cli(&["policy", "shadow", "start", "3"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = server.cli(&["policy", "shadow", "stop"]);
    assert!(text(&out.stdout).starts_with("shadow: candidate set version 3, "));
    let out = server.cli(&["policy", "activate", "3"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = server.cli(&["policy", "rollback", "1"]);
    assert_eq!(
        text(&out.stdout),
        "set version 1 is active: the next cycle runs on it\n"
    );

    assert!(server.stop(), "gantry serve did not exit cleanly");
    let stdout = server.stdout.lock().expect("stdout").clone();
    assert!(stdout.contains("; 0 cycle failures"), "{stdout}");
}

/// The server's clock and ours are the same machine's.
/// Waits until the server records a decision made by policy set `version`.
fn wait_for_decisions_of(server: &Server, version: u64, secs: u64) {
    let since = server_now_ms();
    eventually(secs, || {
        let (_, recent) = server.get(&format!("/api/decisions?from_ms={since}&limit=50"));
        recent
            .as_array()?
            .iter()
            .any(|r| r["explanation"]["policy_set"] == version)
            .then_some(())
    });
}

fn server_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

/// Opens the SSE stream and returns what arrived up to the first decision event.
fn first_sse_event(base: &str) -> String {
    let addr = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        stream,
        "GET /api/decisions/stream HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {VIEWER}\r\nAccept: text/event-stream\r\n\r\n"
    )
    .expect("write");
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while !(seen.contains("event: decision") && seen.contains("\n\n")) {
        let n = stream.read(&mut buf).expect("read the stream");
        assert!(n > 0, "the stream closed: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    seen
}

/// 64 anonymous clients each announce a 30 MiB upload (1.9 GiB in all): each gets 401 from its
/// headers alone, before any of its body is sent, and the server's resident memory grows by
/// less than 32 MiB while they then send what they announced.
#[test]
fn anonymous_uploads_are_refused_before_their_bodies_and_cost_no_memory() {
    use std::io::{Read, Write};
    const CLIENTS: usize = 64;
    const BODY: usize = 30 << 20;
    let cluster = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/clusters/small-64.yaml"
    );
    let server = Server::start(&["--cluster", cluster, "--jobs-per-s", "1"]);
    let addr = server.base.trim_start_matches("http://").to_string();
    let before = server.rss_bytes();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || -> (String, usize) {
                let mut stream = std::net::TcpStream::connect(&addr).expect("connect");
                stream
                    .set_read_timeout(Some(std::time::Duration::from_secs(30)))
                    .expect("timeout");
                write!(
                    stream,
                    "POST /api/policies HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/wasm\r\nContent-Length: {BODY}\r\n\r\n"
                )
                .expect("headers");
                let chunk = vec![0u8; 1 << 20];
                let mut answer = [0u8; 64];
                let n = stream.read(&mut answer).expect("an answer");
                let status = String::from_utf8_lossy(&answer[..n])
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string();
                // Then send what was announced, for as long as the server takes it.
                let mut sent = 0;
                while sent < BODY && stream.write_all(&chunk).is_ok() {
                    sent += chunk.len();
                }
                (status, sent)
            })
        })
        .collect();
    let mut peak = before;
    let results: Vec<(String, usize)> = clients
        .into_iter()
        .map(|c| {
            peak = peak.max(server.rss_bytes());
            c.join().expect("client")
        })
        .collect();
    peak = peak.max(server.rss_bytes());
    for (status, _) in &results {
        assert!(status.starts_with("HTTP/1.1 401"), "answered {status:?}");
    }
    let grew = peak.saturating_sub(before);
    eprintln!(
        "{CLIENTS} anonymous {BODY}-byte uploads: all 401; RSS {} MiB before, peak {} MiB (grew {} MiB)",
        before >> 20,
        peak >> 20,
        grew >> 20
    );
    assert!(
        grew < 32 << 20,
        "the server's RSS grew by {} MiB",
        grew >> 20
    );
    // Each refusal left a log line and an audit entry naming the anonymous caller.
    let logged = server
        .stderr
        .lock()
        .unwrap()
        .matches("request refused: 401")
        .count();
    assert_eq!(logged, CLIENTS);
    let (status, audit) = server.get_admin("/api/audit?limit=1000");
    assert_eq!(status, 200);
    let refused = audit
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| {
            e["action"] == "request.refused"
                && e["who"] == "anonymous"
                && e["detail"] == "401 POST /api/policies"
        })
        .count();
    assert_eq!(refused, CLIENTS);
}

/// The admin's path, all from the CLI: a Python score policy uploads to the 7,500-node demo
/// under a deadline of its own; a set replaces gpu-binpack with it, its config from a file and
/// a 500 ms deadline; the set is activated and its decisions appear; it is rolled back; a
/// rollback to the active version is refused.
#[test]
fn an_admin_composes_activates_and_rolls_back_a_set_from_the_cli() {
    let server = Server::start(&["--jobs-per-s", "20"]);
    let python = plugin("gpu_binpack_py.wasm");
    let python = python.to_str().expect("utf-8 path");

    // The deadline given governs the self-test: 1 ms is too short on 7,500 nodes.
    let out = server.cli(&["policy", "push", python, "--no-set", "--deadline-ms", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert_eq!(
        text(&out.stderr).trim(),
        "error: the self-test against the current cluster snapshot faulted: timed out after 1 ms (422)"
    );
    let out = server.cli(&["policy", "push", python, "--no-set", "--deadline-ms", "500"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("self-test: an 8-GPU pod on the 7500 current nodes: best score"),
        "{stdout}"
    );
    let sha = stdout
        .split("as sha256 ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the pushed sha256")
        .to_string();

    // `policy list` tells the two gpu-binpacks apart: hash, size, when and by whom.
    let out = server.cli(&["policy", "list"]);
    let listing = text(&out.stdout);
    let line = listing
        .lines()
        .find(|l| l.contains(&sha[..12]))
        .unwrap_or_else(|| panic!("{listing}"));
    assert!(line.contains("gpu-binpack 0.1.0"), "{line}");
    assert!(line.contains(" bytes  uploaded 20"), "{line}");
    assert!(line.ends_with("by alice"), "{line}");
    // The 12 characters it prints (and any unique 8) name the policy.
    for prefix in [&sha[..12], &sha[..8]] {
        let (status, manifest) = server.get(&format!("/api/policies/{prefix}"));
        assert_eq!(
            (status, manifest["sha256"].as_str()),
            (200, Some(sha.as_str()))
        );
    }
    let (status, body) = server.get("/api/policies/abc");
    assert_eq!(status, 400, "{body}");

    let v1 = server.get("/api/sets/1").1;
    let config = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(
        config.path(),
        "{\"node_weight\": 1, \"domain_weight\": 60}\n",
    )
    .expect("write");
    let out = server.cli(&[
        "policy",
        "compose",
        "--replace",
        &format!("gpu-binpack={}", &sha[..8]),
        "--config",
        &format!("gpu-binpack=@{}", config.path().display()),
        "--deadline-ms",
        "gpu-binpack=500",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.starts_with("created set version 2 from version 1:"),
        "{stdout}"
    );
    let v2 = server.get("/api/sets/2").1;
    let entries = v2["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), 3, "{v2}");
    assert_eq!(entries[0], v1["entries"][0]);
    assert_eq!(entries[2], v1["entries"][2]);
    assert_eq!(entries[1]["sha256"], sha.as_str());
    assert_eq!(
        entries[1]["config"],
        "{\"node_weight\": 1, \"domain_weight\": 60}"
    );
    assert_eq!(entries[1]["deadline_ms"], 500);
    assert_eq!(entries[1]["weight"], v1["entries"][1]["weight"]);

    let out = server.cli(&["policy", "activate", "2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_for_decisions_of(&server, 2, 60);
    // The Python policy is the one scoring, under its own deadline.
    let (_, sets) = server.get("/api/sets");
    let running = sets["running"]
        .as_array()
        .and_then(|r| r.iter().find(|p| p["sha256"] == sha.as_str()))
        .unwrap_or_else(|| panic!("{sets}"))
        .clone();
    assert!(running["calls"].as_u64() > Some(0), "{running}");
    assert_eq!(running["quarantined"], false, "{running}");

    let out = server.cli(&["policy", "rollback", "1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.get("/api/sets").1["active"], 1);
    let out = server.cli(&["policy", "rollback", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).trim(),
        "error: version 1 is already the active policy set: roll back to an earlier version, or activate a new one (409)"
    );
    assert_eq!(server.get("/api/sets").1["active"], 1);
}

/// Waits until `server` has stored a decision.
fn a_decision_stored(server: &Server) {
    eventually(60, || {
        let (_, decisions) = server.get("/api/decisions?limit=1");
        decisions
            .as_array()
            .is_some_and(|d| !d.is_empty())
            .then_some(())
    });
}

/// A damaged store once stopped the scheduler (a garbled history: exit 1, naming no path) or
/// made routes answer 500 (a garbled main database). Now the history is moved aside and
/// named, a damaged record is named by its key with 503, and scheduling goes on.
#[test]
fn a_damaged_store_is_named_and_scheduling_goes_on() {
    let first = Server::start(&["--jobs-per-s", "20"]);
    a_decision_stored(&first);
    let data = first.into_data();
    let store = data.path().join("data/store");
    let history = store.join("history");
    std::fs::write(history.join("conf"), b"not a sled config at all\n").expect("garble");
    std::fs::write(history.join("db"), [0x5au8; 3 * 4096]).expect("garble");
    let bad_key = "e".repeat(64);
    {
        let db = sled::open(&store).expect("the main database");
        db.open_tree("manifests")
            .expect("manifests")
            .insert(bad_key.as_bytes(), &b"\x00garbage"[..])
            .expect("insert");
        db.flush().expect("flush");
    }

    let server = Server::start_on(data, &["--jobs-per-s", "20"], &[]);
    let (status, ready) = server.get_as("/readyz", None).expect("readyz");
    assert_eq!(status, 200, "{ready}");
    assert!(
        ready.contains(&format!(
            "the decision history at {} was damaged",
            history.display()
        )),
        "{ready}"
    );
    let (_, metrics) = server.get_as("/metrics", None).expect("metrics");
    let line = metrics
        .lines()
        .find(|l| l.starts_with("gantry_store_history_damaged{"))
        .unwrap_or_else(|| panic!("no damage metric in {metrics}"));
    assert!(
        line.contains(&format!("path=\"{}\"", history.display())) && line.ends_with(" 1"),
        "{line}"
    );
    // Scheduling runs, into a new history.
    a_decision_stored(&server);
    // The damaged record is named; no route answers 500.
    let (status, body) = server.get("/api/policies");
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains(&format!(
            "the record under key {bad_key} of tree manifests is damaged"
        ))),
        "{body}"
    );
    for path in [
        "/api/sets",
        "/api/cluster",
        "/api/queues",
        "/api/jobs",
        "/api/decisions?limit=10",
        "/api/audit",
    ] {
        // Nothing these read was damaged.
        let (status, body) = server.get_admin(path);
        assert_eq!(status, 200, "{path}: {body}");
    }
}
