//! The writer against a mock API server (a `tower_test` service behind a real kube `Client`,
//! as kube-rs' own tests do): the shape of every request a bind pass, a gang's rollback, an
//! eviction, a claim write and a lost Lease send or do not send. No control plane.

use std::sync::{Arc, Mutex};

use gantry_core::{BindOutcome, BuiltinOnly, Scheduler};
use gantry_kube_model::fixtures::{build, node, pod};
use http::{Request, Response};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

use super::{NOT_LEADER, Watched, Writer};
use crate::leader::Leadership;
use crate::mapping::PendingPod;
use crate::tracker::Tracker;

/// One request the mock API server received.
#[derive(Debug, Clone)]
struct Call {
    method: String,
    /// The path and query.
    path: String,
    content_type: String,
    body: Value,
}

/// Every request so far, in the order they came.
type Calls = Arc<Mutex<Vec<Call>>>;

/// A mock API server on `runtime`: records each request and answers it with `answer`'s
/// status and JSON body. Returns a client that talks to it, and what it received.
fn mock_api(
    runtime: &tokio::runtime::Runtime,
    answer: impl Fn(&Call) -> (u16, Value) + Send + 'static,
) -> (Client, Calls) {
    mock_api_slow(runtime, |_| std::time::Duration::ZERO, answer)
}

/// [`mock_api`], answering each request `delay` of it late (each on a task of its own, so a
/// slow answer holds up no other).
fn mock_api_slow(
    runtime: &tokio::runtime::Runtime,
    delay: impl Fn(&Call) -> std::time::Duration + Send + 'static,
    answer: impl Fn(&Call) -> (u16, Value) + Send + 'static,
) -> (Client, Calls) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let calls = Calls::default();
    let seen = calls.clone();
    runtime.spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await.expect("a request body");
            let call = Call {
                method: parts.method.to_string(),
                path: parts
                    .uri
                    .path_and_query()
                    .map_or_else(String::new, |p| p.to_string()),
                content_type: parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string(),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            };
            let (status, body) = answer(&call);
            let late = delay(&call);
            seen.lock().unwrap().push(call);
            let response = Response::builder()
                .status(status)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Body::from(serde_json::to_vec(&body).unwrap()))
                .unwrap();
            tokio::spawn(async move {
                tokio::time::sleep(late).await;
                send.send_response(response);
            });
        }
    });
    // The client's buffer task starts on the runtime it is made in.
    let _inside = runtime.enter();
    (Client::new(service, "default"), calls)
}

/// The API server's refusal: a `Status` with `code`, `reason` and `message`.
fn refusal(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

/// What a write that went through answers: the object written back.
fn accepted(call: &Call) -> (u16, Value) {
    let code = if call.method == "POST" { 201 } else { 200 };
    (code, call.body.clone())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// A tracker and its scheduler built from `nodes` and the pending `pods`, after one cycle:
/// its output is what a bind pass gets.
fn cycled(
    nodes: &[Arc<Node>],
    pods: &[Arc<Pod>],
) -> (Tracker, Scheduler, gantry_core::CycleOutput) {
    let (tracker, mut scheduler) = build(nodes, &[], pods, &[], &[]);
    let output = scheduler.cycle(0.0, &mut BuiltinOnly);
    assert!(
        output.decisions.iter().all(|d| d.placed),
        "every job fits: {:?}",
        output.decisions
    );
    (tracker, scheduler, output)
}

/// The requests to `suffix` (a path ending, e.g. `/binding`), in order.
fn to(calls: &Calls, method: &str, suffix: &str) -> Vec<Call> {
    calls
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.method == method && c.path.split('?').next().unwrap().ends_with(suffix))
        .cloned()
        .collect()
}

#[test]
fn a_placed_pod_binds_through_the_binding_subresource_with_its_uid() {
    let runtime = runtime();
    let (client, calls) = mock_api(&runtime, accepted);
    let mut writer = Writer::new(
        runtime.handle().clone(),
        client.clone(),
        client,
        Default::default(),
    );
    let (mut tracker, scheduler, output) =
        cycled(&[node("n0", 8, &[], true)], &[pod("p", 8, &[], None)]);

    let outcomes = writer.pass(&mut tracker, Watched::default(), &scheduler, &output);

    assert!(
        matches!(outcomes[..], [BindOutcome::Bound { .. }]),
        "{outcomes:?}"
    );
    let bindings = to(&calls, "POST", "/binding");
    assert_eq!(bindings.len(), 1, "{bindings:?}");
    assert_eq!(bindings[0].path, "/api/v1/namespaces/ns/pods/p/binding?");
    assert_eq!(
        bindings[0].body,
        json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "n0"},
        })
    );
    // Nothing was evicted, and no pod was told it waits.
    assert!(to(&calls, "POST", "/eviction").is_empty());
    assert!(to(&calls, "PATCH", "/status").is_empty());
}

#[test]
fn a_gang_whose_member_is_refused_evicts_the_members_bound_and_says_why() {
    let runtime = runtime();
    let (client, calls) = mock_api(&runtime, |call| {
        if call.path.contains("/pods/g-1/binding") {
            refusal(
                403,
                "Forbidden",
                "pods \"g-1\" is forbidden: node n1 is cordoned",
            )
        } else {
            accepted(call)
        }
    });
    let mut writer = Writer::new(
        runtime.handle().clone(),
        client.clone(),
        client,
        Default::default(),
    );
    let gang = [("gantry.dev/gang", "g"), ("gantry.dev/gang-size", "2")];
    let (mut tracker, scheduler, output) = cycled(
        &[node("n0", 8, &[], true), node("n1", 8, &[], true)],
        &[pod("g-0", 8, &gang, None), pod("g-1", 8, &gang, None)],
    );

    let outcomes = writer.pass(&mut tracker, Watched::default(), &scheduler, &output);

    let [BindOutcome::Failed { reason, .. }] = &outcomes[..] else {
        panic!("one failed gang: {outcomes:?}");
    };
    assert!(reason.contains("node n1 is cordoned"), "{reason}");
    assert_eq!(to(&calls, "POST", "/binding").len(), 2);
    // The member bound is evicted again, with its uid as a precondition; the refused one is
    // left alone.
    let evictions = to(&calls, "POST", "/eviction");
    assert_eq!(evictions.len(), 1, "{evictions:?}");
    assert_eq!(
        evictions[0].path,
        "/api/v1/namespaces/ns/pods/g-0/eviction?"
    );
    assert_eq!(
        evictions[0].body["deleteOptions"]["preconditions"]["uid"],
        "uid-g-0"
    );
    // Both members wait, and say so: a FailedScheduling Event and PodScheduled=False each.
    let events = to(&calls, "POST", "/events");
    let failed: Vec<&Call> = events
        .iter()
        .filter(|e| e.body["reason"] == "FailedScheduling")
        .collect();
    assert_eq!(failed.len(), 2, "{events:?}");
    for event in failed {
        let note = event.body["note"].as_str().unwrap();
        assert!(
            note.starts_with("Binding failed: ")
                && note
                    .contains("the 1 members bound already were deleted so the gang starts whole"),
            "{note}"
        );
    }
    let conditions = to(&calls, "PATCH", "/status");
    assert_eq!(conditions.len(), 2, "{conditions:?}");
    assert_eq!(
        conditions[0].content_type,
        "application/strategic-merge-patch+json"
    );
    assert_eq!(
        conditions[0].body["status"]["conditions"][0]["reason"],
        "Unschedulable"
    );
}

#[test]
fn an_eviction_a_disruption_budget_refuses_keeps_the_victim_and_nominates_the_preemptor() {
    let runtime = runtime();
    let budget = "Cannot evict pod as it would violate the pod's disruption budget.";
    let (client, calls) = mock_api(&runtime, move |call| {
        if call.path.ends_with("/eviction?") {
            refusal(429, "TooManyRequests", budget)
        } else {
            accepted(call)
        }
    });
    let victim = PendingPod::of(&pod("v", 8, &[], None));
    let preemptor = PendingPod::of(&pod("p", 8, &[], None));

    let preemption = runtime.block_on(super::evict::start(
        &client,
        None,
        vec![victim],
        vec![(preemptor, "n0".into())],
    ));

    let evictions = to(&calls, "POST", "/eviction");
    assert_eq!(evictions.len(), 1);
    assert_eq!(evictions[0].path, "/api/v1/namespaces/ns/pods/v/eviction?");
    assert_eq!(
        evictions[0].body,
        json!({
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": "v", "namespace": "ns"},
            "deleteOptions": {"preconditions": {"uid": "uid-v"}},
        })
    );
    // Refused: no Preempted Event, and the preemptor waits nominated, saying why.
    assert!(to(&calls, "POST", "/events").is_empty());
    let nominations = to(&calls, "PATCH", "/status");
    assert_eq!(nominations.len(), 1);
    assert_eq!(nominations[0].path, "/api/v1/namespaces/ns/pods/p/status?");
    assert_eq!(nominations[0].content_type, "application/merge-patch+json");
    assert_eq!(
        nominations[0].body,
        json!({"status": {"nominatedNodeName": "n0"}})
    );
    assert_eq!(
        preemption.reason(),
        "preemption blocked: cannot evict ns/v (Cannot evict pod as it would violate the \
         pod's disruption budget); retrying (nominated node(s) n0)."
    );
}

#[test]
fn a_claim_write_merge_patches_the_status_it_read_and_a_conflict_names_the_claim() {
    let runtime = runtime();
    let (client, calls) = mock_api(&runtime, |call| {
        if call.body["metadata"]["resourceVersion"] == "7" {
            accepted(call)
        } else {
            refusal(
                409,
                "Conflict",
                "the object has been modified; please apply your changes to the latest version",
            )
        }
    });
    let key = ("ns".to_string(), "gpus".to_string());
    let patch = |version: &str| {
        json!({
            "metadata": {"resourceVersion": version},
            "status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "uid-p"}]},
        })
    };

    let written = runtime.block_on(super::claims::patch_claim(&client, None, &key, &patch("7")));
    let conflict = runtime.block_on(super::claims::patch_claim(&client, None, &key, &patch("6")));

    assert!(written.is_ok(), "{written:?}");
    let error = conflict.expect_err("a stale version is refused");
    assert!(
        error.starts_with("cannot write the status of ResourceClaim ns/gpus: ")
            && error.contains("the object has been modified"),
        "{error}"
    );
    let writes = to(&calls, "PATCH", "/status");
    assert_eq!(writes.len(), 2);
    assert_eq!(
        writes[0].path,
        "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/gpus/status?"
    );
    assert_eq!(writes[0].content_type, "application/merge-patch+json");
    assert_eq!(writes[0].body, patch("7"));
}

#[test]
fn a_replica_that_lost_its_lease_writes_nothing() {
    let runtime = runtime();
    let (client, calls) = mock_api(&runtime, accepted);
    let mut writer = Writer::new(
        runtime.handle().clone(),
        client.clone(),
        client.clone(),
        Default::default(),
    );
    let leadership = Leadership::held(true);
    writer.leadership = Some(leadership.clone());
    let (mut tracker, scheduler, output) =
        cycled(&[node("n0", 8, &[], true)], &[pod("p", 8, &[], None)]);
    leadership.lose();

    let outcomes = writer.pass(&mut tracker, Watched::default(), &scheduler, &output);
    let claim = runtime.block_on(super::claims::patch_claim(
        &client,
        Some(&leadership),
        &("ns".to_string(), "gpus".to_string()),
        &json!({"status": {}}),
    ));

    let [BindOutcome::Failed { reason, .. }] = &outcomes[..] else {
        panic!("the job fails to bind: {outcomes:?}");
    };
    assert_eq!(reason, NOT_LEADER);
    assert_eq!(claim.expect_err("no claim write"), NOT_LEADER);
    assert!(!writer.may_write());
    let sent = calls.lock().unwrap().clone();
    assert!(sent.is_empty(), "a follower sent {sent:?}");
}

#[test]
fn a_binding_not_answered_before_the_lease_runs_out_is_cut_off_not_counted_as_landed() {
    let runtime = runtime();
    // Bindings are answered 5 s late; the Lease has 300 ms left.
    let (client, calls) = mock_api_slow(
        &runtime,
        |call| {
            if call.path.ends_with("/binding?") {
                std::time::Duration::from_secs(5)
            } else {
                std::time::Duration::ZERO
            }
        },
        accepted,
    );
    let mut writer = Writer::new(
        runtime.handle().clone(),
        client.clone(),
        client,
        Default::default(),
    );
    let leadership = Leadership::held_for(true, std::time::Duration::from_millis(300));
    writer.leadership = Some(leadership.clone());
    let (mut tracker, scheduler, output) =
        cycled(&[node("n0", 8, &[], true)], &[pod("p", 8, &[], None)]);

    let started = std::time::Instant::now();
    let outcomes = writer.pass(&mut tracker, Watched::default(), &scheduler, &output);
    eprintln!("the pass returned after {:?}", started.elapsed());

    // Sent once, never retried, and cut off: it may have been applied, so it is read back
    // (counted as bound until then), and nothing landed after the Lease ran out.
    assert_eq!(to(&calls, "POST", "/binding").len(), 1);
    assert!(
        matches!(&outcomes[..], [BindOutcome::Bound { .. }]),
        "{outcomes:?}"
    );
    assert_eq!(writer.unanswered.len(), 1, "read back at the next sync");
    assert_eq!(writer.binds_after_lease_loss, 0);
    assert!(
        leadership.time_left().is_none(),
        "the Lease ran out meanwhile"
    );
    // The next pass, without the Lease, sends no write at all.
    next_pass_without_the_lease_sends_nothing(&mut writer, || calls.lock().unwrap().len());
}

/// A writer whose Lease ran out refuses the next pass's binding as not the leader, and sends
/// nothing: `sent` counts the requests its API server has seen.
fn next_pass_without_the_lease_sends_nothing(writer: &mut Writer, sent: impl Fn() -> usize) {
    let before = sent();
    let (mut tracker, scheduler, output) =
        cycled(&[node("n0", 8, &[], true)], &[pod("q", 8, &[], None)]);
    let outcomes = writer.pass(&mut tracker, Watched::default(), &scheduler, &output);
    let [BindOutcome::Failed { reason, .. }] = &outcomes[..] else {
        panic!("the job fails to bind: {outcomes:?}");
    };
    assert_eq!(reason, NOT_LEADER);
    assert_eq!(sent(), before, "a write went out without the Lease");
}

#[test]
fn a_fenced_write_says_why_in_words_not_as_a_variant_name() {
    assert_eq!(
        super::Fenced::NotLeader.to_string(),
        format!("{NOT_LEADER}: nothing was sent")
    );
    let cut_off = super::Fenced::CutOff.to_string();
    assert!(
        cut_off.starts_with("no answer before the Lease or the call timeout ran out")
            && !cut_off.contains("CutOff"),
        "{cut_off}"
    );
}

/// An API server on loopback that answers every request 429 with `Retry-After: 1`, as API
/// Priority and Fairness does under load, and counts what it was sent by path. Returns its
/// port and the paths received.
fn throttling_api(runtime: &tokio::runtime::Runtime) -> (u16, Arc<Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("a loopback port");
    let port = listener.local_addr().expect("its address").port();
    let paths = Arc::new(Mutex::new(Vec::new()));
    let seen = paths.clone();
    runtime.spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                // The headers; the body (a binding is small) comes with them or is dropped.
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&request);
                let path = line.split_whitespace().nth(1).unwrap_or_default().to_string();
                seen.lock().unwrap().push(path);
                let body = serde_json::to_vec(&refusal(429, "TooManyRequests", "too many requests, please try again later").1).unwrap();
                let head = format!(
                    "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: 1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(&body).await;
            });
        }
    });
    (port, paths)
}

/// A kubeconfig for a plain-HTTP API server on loopback `port`, in a file of its own.
fn loopback_kubeconfig(port: u16) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "gantry-kube-throttled-{}-{port}.yaml",
        std::process::id()
    ));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: stub\n  cluster: {{server: \"http://127.0.0.1:{port}\"}}\ncontexts:\n- name: stub\n  context: {{cluster: stub, user: stub}}\ncurrent-context: stub\nusers:\n- name: stub\n  user: {{token: stub}}\n"
        ),
    )
    .expect("write the kubeconfig");
    path
}

#[test]
fn a_throttled_binding_is_sent_once_and_nothing_lands_after_the_lease_is_lost() {
    let runtime = runtime();
    let (port, paths) = throttling_api(&runtime);
    let kubeconfig = loopback_kubeconfig(port);
    // The clients the writer is given in production: writes without kube-rs's retries.
    let writes = crate::connect::client_with(
        &runtime,
        &kubeconfig,
        false,
        Some(crate::connect::CALL_TIMEOUT),
    )
    .expect("a client for the stub");
    let mut writer = Writer::new(
        runtime.handle().clone(),
        writes.clone(),
        writes,
        Default::default(),
    );
    let leadership = Leadership::held_for(true, std::time::Duration::from_millis(300));
    writer.leadership = Some(leadership.clone());
    let (mut tracker, scheduler, output) =
        cycled(&[node("n0", 8, &[], true)], &[pod("p", 8, &[], None)]);

    let outcomes = writer.pass(&mut tracker, Watched::default(), &scheduler, &output);
    assert!(
        matches!(&outcomes[..], [BindOutcome::Failed { .. }]),
        "a throttled binding did not bind: {outcomes:?}"
    );
    // Past the Lease and two Retry-After seconds: a client with hidden retries would have
    // sent the binding again by now, after the Lease ran out.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert!(leadership.time_left().is_none(), "the Lease ran out");
    let bindings: Vec<String> = paths
        .lock()
        .unwrap()
        .iter()
        .filter(|p| p.contains("/binding"))
        .cloned()
        .collect();
    assert_eq!(bindings.len(), 1, "bindings sent: {bindings:?}");
    assert_eq!(writer.binds_after_lease_loss, 0);
    // Without the Lease the next pass sends nothing.
    next_pass_without_the_lease_sends_nothing(&mut writer, || paths.lock().unwrap().len());

    // The check can fail: the same stub with kube-rs's retries on gets the request again.
    let retrying =
        crate::connect::client_with(&runtime, &kubeconfig, true, None).expect("a retrying client");
    let before = paths.lock().unwrap().len();
    runtime.block_on(async {
        let request = http::Request::post("/api/v1/namespaces/ns/pods/r/binding")
            .body(b"{}".to_vec())
            .unwrap();
        let _ = tokio::time::timeout(
            std::time::Duration::from_millis(2500),
            retrying.request_text(request),
        )
        .await;
    });
    assert!(
        paths.lock().unwrap().len() >= before + 2,
        "a retrying client sent the request once: {:?}",
        paths.lock().unwrap()
    );
    let _ = std::fs::remove_file(&kubeconfig);
}
