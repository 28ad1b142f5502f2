//! The routes and their handlers. Every `/api` route but the OpenAPI document needs a token;
//! every mutating one needs an admin token, and its change is written to the audit log.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use gantry_core::Outcome;
use gantry_store::{DecisionRecord, SetEntry};
use serde::{Deserialize, Serialize};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;

use crate::auth::{Caller, Tokens};
use crate::error::{ApiError, Result};
use gantry_engine::{Live, QueueView};
use gantry_store::Actor;

/// What every handler gets: the shared state and the accepted tokens.
pub struct AppState {
    pub live: Arc<Live>,
    pub tokens: Tokens,
}

type St = State<Arc<AppState>>;

/// The whole HTTP surface.
pub fn router(state: Arc<AppState>) -> Router {
    // Bodies up to twice the configured limit are read whole and refused with our own message
    // (413, naming both sizes): cutting a client off mid-upload makes it see a reset connection
    // instead of the reason. Anything larger is cut off.
    let upload_limit = state.live.config.max_upload_bytes * 2 + 64 * 1024;
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/api/openapi.json", get(openapi))
        .route("/api/whoami", get(whoami))
        .route("/api/policies", get(list_policies).post(upload_policy))
        .route("/api/policies/validate", post(validate_policy))
        .route("/api/policies/{sha256}", get(get_policy))
        .route("/api/sets", get(list_sets).post(create_set))
        .route("/api/sets/{version}", get(get_set))
        .route("/api/sets/{version}/activate", post(activate_set))
        .route("/api/sets/{version}/rollback", post(rollback_set))
        .route(
            "/api/shadow",
            get(shadow_report).post(shadow_start).delete(shadow_stop),
        )
        .route("/api/audit", get(audit))
        .route("/api/decisions", get(decisions_between))
        .route("/api/decisions/stream", get(decision_stream))
        .route("/api/decisions/job/{job}", get(decisions_by_job))
        .route("/api/decisions/pod/{pod}", get(decisions_by_pod))
        .route("/api/decisions/node/{node}", get(decisions_by_node))
        .route("/api/explain/{name}", get(explain))
        .route("/api/cluster", get(cluster))
        .route("/api/cluster/nodes", get(nodes))
        .route("/api/cluster/nodes/{node}", get(node))
        .route("/api/queues", get(queues))
        .route("/api/queues/history", get(queue_history))
        .route("/api/jobs", get(jobs))
        .fallback(crate::ui::serve)
        .layer(DefaultBodyLimit::max(upload_limit))
        .with_state(state)
}

/// The caller's address for the audit log.
fn from(addr: &SocketAddr) -> String {
    addr.to_string()
}

fn caller(state: &AppState, headers: &HeaderMap) -> Result<Caller> {
    state.tokens.caller(headers)
}

/// Alive while the scheduling loop goes round: a loop wedged for longer than
/// `LiveConfig::stale_after` fails the probe, so the kubelet restarts the process. Before the
/// loop's first pass (caches still syncing) it is alive; `/readyz` says when it is ready.
async fn healthz(State(state): St) -> Response {
    match state.live.heartbeat_age() {
        Some(age) if age > state.live.config.stale_after => ApiError::Unavailable(format!(
            "the scheduling loop has not gone round for {:.1} s",
            age.as_secs_f64()
        ))
        .into_response(),
        _ => (StatusCode::OK, "ok").into_response(),
    }
}

async fn readyz(State(state): St) -> Response {
    if state.live.is_ready() {
        (StatusCode::OK, "ready").into_response()
    } else {
        ApiError::Unavailable("the scheduling loop has not published its first snapshot".into())
            .into_response()
    }
}

async fn metrics(State(state): St) -> Response {
    let body = state.live.metrics.render(&state.live.loaded_policies());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::openapi::DOCUMENT.as_str(),
    )
        .into_response()
}

async fn whoami(State(state): St, headers: HeaderMap) -> Result<Json<Caller>> {
    Ok(Json(caller(&state, &headers)?))
}

async fn list_policies(
    State(state): St,
    headers: HeaderMap,
) -> Result<Json<Vec<gantry_store::PolicyManifest>>> {
    caller(&state, &headers)?;
    Ok(Json(state.live.store.list_policies()?))
}

async fn get_policy(
    State(state): St,
    headers: HeaderMap,
    Path(sha256): Path<String>,
) -> Result<Json<gantry_store::PolicyManifest>> {
    caller(&state, &headers)?;
    state
        .live
        .store
        .policy_manifest(&sha256)?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no policy with sha256 {sha256} is stored")))
}

#[derive(Debug, Deserialize)]
struct ConfigQuery {
    /// JSON config for the policy's init; `{}` when absent.
    config: Option<String>,
}

/// The body of an upload, with an oversized one refused in our own words.
fn upload_body(
    state: &AppState,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Bytes> {
    let limit = state.live.config.max_upload_bytes;
    match body {
        Ok(bytes) if bytes.len() > limit => Err(ApiError::TooLarge {
            size: bytes.len(),
            limit,
        }),
        Ok(bytes) if bytes.is_empty() => Err(ApiError::BadRequest(
            "the request body is empty: send the policy's .wasm bytes".into(),
        )),
        Ok(bytes) => Ok(bytes),
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            Err(ApiError::TooLargeStream { limit })
        }
        Err(rejection) => Err(ApiError::BadRequest(rejection.body_text())),
    }
}

async fn upload_policy(
    State(state): St,
    ConnectInfo(addr): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Query(query): Query<ConfigQuery>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let who = caller(&state, &headers)?;
    who.require_admin("upload a policy")?;
    let bytes = upload_body(&state, body)?;
    let config = query.config.unwrap_or_else(|| "{}".into());
    let live = state.live.clone();
    let from = from(&addr);
    let actor = Actor::new(&who.name, from);
    let upload = tokio::task::spawn_blocking(move || live.upload(&actor, &bytes, &config))
        .await
        .map_err(|e| ApiError::Unavailable(format!("the upload task failed: {e}")))??;
    let status = if upload.already_stored {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(upload)).into_response())
}

async fn validate_policy(
    State(state): St,
    headers: HeaderMap,
    Query(query): Query<ConfigQuery>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Json<gantry_engine::Validation>> {
    let who = caller(&state, &headers)?;
    who.require_admin("validate a policy")?;
    let bytes = upload_body(&state, body)?;
    let config = query.config.unwrap_or_else(|| "{}".into());
    let live = state.live.clone();
    let (_, validation) = tokio::task::spawn_blocking(move || live.validate(&bytes, &config))
        .await
        .map_err(|e| ApiError::Unavailable(format!("the validation task failed: {e}")))??;
    Ok(Json(validation))
}

#[derive(Debug, Serialize)]
struct SetList {
    /// The version new cycles run on.
    active: u64,
    sets: Vec<gantry_store::PolicySet>,
}

async fn list_sets(State(state): St, headers: HeaderMap) -> Result<Json<SetList>> {
    caller(&state, &headers)?;
    Ok(Json(SetList {
        active: state.live.active_set().version(),
        sets: state.live.store.list_sets()?,
    }))
}

async fn get_set(
    State(state): St,
    headers: HeaderMap,
    Path(version): Path<u64>,
) -> Result<Json<gantry_store::PolicySet>> {
    caller(&state, &headers)?;
    state
        .live
        .store
        .get_set(version)?
        .map(Json)
        .ok_or(ApiError::Store(
            gantry_store::StoreError::UnknownSetVersion(version),
        ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSet {
    entries: Vec<SetEntry>,
    #[serde(default)]
    note: String,
}

async fn create_set(
    State(state): St,
    ConnectInfo(addr): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: std::result::Result<Json<NewSet>, axum::extract::rejection::JsonRejection>,
) -> Result<Response> {
    let who = caller(&state, &headers)?;
    who.require_admin("create a policy set")?;
    let Json(new) = body.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    if new.entries.len() > 64 {
        return Err(ApiError::BadRequest(format!(
            "a policy set holds at most 64 entries; this one has {}",
            new.entries.len()
        )));
    }
    let live = state.live.clone();
    let from = from(&addr);
    let set = tokio::task::spawn_blocking(move || -> Result<gantry_store::PolicySet> {
        // Load every entry first: a set that cannot run is refused before it is stored.
        for entry in &new.entries {
            if serde_json::from_str::<serde_json::Value>(&entry.config).is_err() {
                return Err(ApiError::BadRequest(format!(
                    "the config of entry {} is not valid JSON",
                    entry.sha256
                )));
            }
        }
        let probe = gantry_store::PolicySet {
            version: 0,
            entries: new.entries.clone(),
            created_by: String::new(),
            created_at_ms: 0,
            note: String::new(),
        };
        for entry in &probe.entries {
            if live.store.policy_manifest(&entry.sha256)?.is_none() {
                return Err(ApiError::NotFound(format!(
                    "no policy with sha256 {} is stored",
                    entry.sha256
                )));
            }
        }
        live.build_set(&probe)?;
        Ok(live.store.put_set(
            &gantry_store::Actor::new(&who.name, &from),
            new.entries,
            &new.note,
            gantry_engine::now_ms(),
        )?)
    })
    .await
    .map_err(|e| ApiError::Unavailable(format!("the task failed: {e}")))??;
    Ok((StatusCode::CREATED, Json(set)).into_response())
}

async fn switch_set(
    state: Arc<AppState>,
    addr: SocketAddr,
    headers: HeaderMap,
    version: u64,
    rollback: bool,
) -> Result<Json<gantry_store::PolicySet>> {
    let who = caller(&state, &headers)?;
    who.require_admin(if rollback {
        "roll back the policy set"
    } else {
        "activate a policy set"
    })?;
    let live = state.live.clone();
    let actor = Actor::new(&who.name, from(&addr));
    let set = tokio::task::spawn_blocking(move || live.activate(&actor, version, rollback))
        .await
        .map_err(|e| ApiError::Unavailable(format!("the task failed: {e}")))??;
    Ok(Json(set))
}

async fn activate_set(
    State(state): St,
    ConnectInfo(addr): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path(version): Path<u64>,
) -> Result<Json<gantry_store::PolicySet>> {
    switch_set(state, addr, headers, version, false).await
}

async fn rollback_set(
    State(state): St,
    ConnectInfo(addr): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path(version): Path<u64>,
) -> Result<Json<gantry_store::PolicySet>> {
    switch_set(state, addr, headers, version, true).await
}

async fn shadow_report(
    State(state): St,
    headers: HeaderMap,
) -> Result<Json<gantry_engine::ShadowReport>> {
    caller(&state, &headers)?;
    state
        .live
        .shadow_report()
        .map(Json)
        .ok_or_else(|| ApiError::NotFound("no shadow run is active".into()))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShadowStart {
    version: u64,
}

async fn shadow_start(
    State(state): St,
    ConnectInfo(addr): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: std::result::Result<Json<ShadowStart>, axum::extract::rejection::JsonRejection>,
) -> Result<Response> {
    let who = caller(&state, &headers)?;
    who.require_admin("start shadow mode")?;
    let Json(start) = body.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let live = state.live.clone();
    let actor = Actor::new(&who.name, from(&addr));
    let report = tokio::task::spawn_blocking(move || live.shadow_start(&actor, start.version))
        .await
        .map_err(|e| ApiError::Unavailable(format!("the task failed: {e}")))??;
    Ok((StatusCode::CREATED, Json(report)).into_response())
}

async fn shadow_stop(
    State(state): St,
    ConnectInfo(addr): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Result<Json<gantry_engine::ShadowReport>> {
    let who = caller(&state, &headers)?;
    who.require_admin("stop shadow mode")?;
    Ok(Json(
        state
            .live
            .shadow_stop(&Actor::new(&who.name, from(&addr)))?,
    ))
}

#[derive(Debug, Deserialize)]
struct Limit {
    limit: Option<usize>,
}

/// Bounds a requested list length: 100 by default, 10,000 at most.
fn limit_of(limit: Option<usize>) -> usize {
    limit.unwrap_or(100).clamp(1, 10_000)
}

async fn audit(
    State(state): St,
    headers: HeaderMap,
    Query(q): Query<Limit>,
) -> Result<Json<Vec<gantry_store::AuditEntry>>> {
    caller(&state, &headers)?;
    Ok(Json(state.live.store.audit_recent(limit_of(q.limit))?))
}

#[derive(Debug, Deserialize)]
struct TimeRange {
    from_ms: Option<u64>,
    to_ms: Option<u64>,
    limit: Option<usize>,
}

async fn decisions_between(
    State(state): St,
    headers: HeaderMap,
    Query(q): Query<TimeRange>,
) -> Result<Json<Vec<DecisionRecord>>> {
    caller(&state, &headers)?;
    let (from_ms, to_ms) = (q.from_ms.unwrap_or(0), q.to_ms.unwrap_or(u64::MAX));
    if from_ms > to_ms {
        return Err(ApiError::BadRequest(format!(
            "from_ms ({from_ms}) is after to_ms ({to_ms})"
        )));
    }
    Ok(Json(state.live.store.decisions_between(
        from_ms,
        to_ms,
        limit_of(q.limit),
    )?))
}

/// The newest `limit` of a history, oldest first.
fn newest(mut records: Vec<DecisionRecord>, limit: usize) -> Vec<DecisionRecord> {
    let skip = records.len().saturating_sub(limit);
    records.drain(..skip);
    records
}

async fn decisions_by_job(
    State(state): St,
    headers: HeaderMap,
    Path(job): Path<String>,
    Query(q): Query<Limit>,
) -> Result<Json<Vec<DecisionRecord>>> {
    caller(&state, &headers)?;
    let history = state.live.store.job_history(&job)?;
    if history.is_empty() {
        return Err(ApiError::NotFound(format!("no decisions about job {job}")));
    }
    Ok(Json(newest(history, limit_of(q.limit))))
}

async fn decisions_by_pod(
    State(state): St,
    headers: HeaderMap,
    Path(pod): Path<String>,
    Query(q): Query<Limit>,
) -> Result<Json<Vec<DecisionRecord>>> {
    caller(&state, &headers)?;
    // A single-pod job's pod carries the job's name; a gang's pods are recorded at submission.
    let job = state
        .live
        .store
        .job_for_pod(&pod)?
        .unwrap_or_else(|| pod.clone());
    let history = state.live.store.job_history(&job)?;
    if history.is_empty() {
        return Err(ApiError::NotFound(format!(
            "no decisions about a pod named {pod}"
        )));
    }
    Ok(Json(newest(history, limit_of(q.limit))))
}

async fn decisions_by_node(
    State(state): St,
    headers: HeaderMap,
    Path(node): Path<String>,
    Query(q): Query<TimeRange>,
) -> Result<Json<Vec<DecisionRecord>>> {
    caller(&state, &headers)?;
    Ok(Json(state.live.store.decisions_on_node(
        &node,
        q.from_ms.unwrap_or(0),
        q.to_ms.unwrap_or(u64::MAX),
        limit_of(q.limit),
    )?))
}

async fn decision_stream(
    State(state): St,
    headers: HeaderMap,
) -> Result<Sse<impl tokio_stream::Stream<Item = std::result::Result<Event, Infallible>>>> {
    caller(&state, &headers)?;
    let stream = BroadcastStream::new(state.live.subscribe()).filter_map(|event| {
        // A lagging subscriber skips what it missed rather than closing.
        let event = event.ok()?;
        let data = serde_json::to_string(&*event).ok()?;
        Some(Ok(Event::default().event("decision").data(data)))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// "Why is it pending now?" (or where it went), for a pod or a job.
#[derive(Debug, Serialize)]
struct Explain {
    name: String,
    /// `job` or `pod`: what `name` turned out to be.
    kind: &'static str,
    job: String,
    /// `pending`, `running`, or `done` (neither pending nor running now, with a history).
    state: &'static str,
    queue_name: String,
    pods: u32,
    gpus_per_pod: u32,
    priority: i32,
    /// Its place among its queue's pending jobs (1 = next).
    queue_position: Option<u32>,
    queue: Option<QueueView>,
    /// One paragraph in plain words, from the latest decision (or on why there is none yet).
    why: String,
    /// What would change the outcome, when pending.
    waiting_for: Option<String>,
    /// The latest decision; none for a job that waits for its first attempt.
    latest: Option<DecisionRecord>,
    attempts: usize,
}

async fn explain(
    State(state): St,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<Explain>> {
    caller(&state, &headers)?;
    let store = &state.live.store;
    let view = state.live.view();
    let (kind, job) =
        if view.job_to_state.contains_key(&name) || store.latest_for_job(&name)?.is_some() {
            ("job", name.clone())
        } else {
            match store.job_for_pod(&name)? {
                Some(job) => ("pod", job),
                None => {
                    return Err(ApiError::NotFound(format!(
                        "no job or pod named {name} is known"
                    )));
                }
            }
        };
    let history = store.job_history(&job)?;
    let latest = store.latest_for_job(&job)?;
    let now = view.job_to_state.get(&job);
    let state_name = now.map(|j| j.state).unwrap_or("done");
    let (queue_name, pods, gpus_per_pod, priority) = match (&latest, now) {
        (_, Some(j)) => (j.queue.clone(), j.pods, j.gpus_per_pod, j.priority),
        (Some(r), None) => {
            let e = &r.explanation;
            (e.queue.clone(), e.pods, e.gpus_per_pod, e.priority)
        }
        (None, None) => {
            return Err(ApiError::NotFound(format!(
                "job {job} of pod {name} has no decision yet"
            )));
        }
    };
    let queue = view.queues.iter().find(|q| q.name == queue_name).cloned();
    let queue_position = now.and_then(|j| j.queue_position);
    let (why, waiting_for) = match &latest {
        Some(r) => (
            r.explanation.summary(),
            match &r.explanation.outcome {
                Outcome::Pending { waiting_for } if state_name == "pending" => {
                    Some(waiting_for.clone())
                }
                _ => None,
            },
        ),
        None => {
            // Each cycle attempts a bounded number of pending jobs, in fair-share order: a job
            // far back in a long queue can wait for its first attempt.
            let position = queue_position.map_or_else(String::new, |p| format!(" number {p} of"));
            (
                format!(
                    "Not attempted yet: it is{position} the pending jobs of queue {queue_name}, and each cycle tries a bounded number of pending jobs in fair-share order."
                ),
                Some(format!("its turn in queue {queue_name}")),
            )
        }
    };
    Ok(Json(Explain {
        name,
        kind,
        job,
        state: state_name,
        queue_name,
        pods,
        gpus_per_pod,
        priority,
        queue_position,
        queue,
        why,
        waiting_for,
        attempts: history.len(),
        latest,
    }))
}

#[derive(Debug, Serialize)]
struct DomainUse {
    name: String,
    nodes: u32,
    gpu_total: u32,
    gpu_free: u32,
}

#[derive(Debug, Serialize)]
struct LevelUse {
    level: String,
    domains: Vec<DomainUse>,
}

#[derive(Debug, Serialize)]
struct ClusterSummary {
    cluster: String,
    at_ms: u64,
    nodes: usize,
    gpu_total: u64,
    gpu_free: u64,
    pending_pods: u64,
    running_pods: u64,
    active_set: u64,
    /// GPU use per topology domain, coarsest level first.
    levels: Vec<LevelUse>,
}

async fn cluster(State(state): St, headers: HeaderMap) -> Result<Json<ClusterSummary>> {
    caller(&state, &headers)?;
    let view = state.live.view();
    let symbols = state.live.symbols();
    let nodes = &view.nodes;
    let mut levels: Vec<LevelUse> = nodes
        .levels
        .iter()
        .map(|level| {
            let name = symbols.resolve(level.name).to_string();
            let mut counts = vec![0u32; level.domain_gpu_total.len()];
            for &d in &level.node_domain {
                if let Some(c) = counts.get_mut(d as usize) {
                    *c += 1;
                }
            }
            LevelUse {
                domains: (0..level.domain_gpu_total.len())
                    .map(|d| DomainUse {
                        name: format!("{name} {d}"),
                        nodes: counts[d],
                        gpu_total: level.domain_gpu_total[d],
                        gpu_free: level.domain_gpu_free[d],
                    })
                    .collect(),
                level: name,
            }
        })
        .collect();
    levels.sort_by_key(|l| l.domains.len());
    Ok(Json(ClusterSummary {
        cluster: view.cluster.clone(),
        at_ms: view.at_ms,
        nodes: nodes.len(),
        gpu_total: nodes.gpu_total.iter().map(|&g| u64::from(g)).sum(),
        gpu_free: nodes.gpu_free.iter().map(|&g| u64::from(g)).sum(),
        pending_pods: view.pending_pods,
        running_pods: view.running_pods,
        active_set: state.live.active_set().version(),
        levels,
    }))
}

/// The nodes as columns (one array per field, same order), which keeps 7,500 nodes small on
/// the wire and cheap for the UI to draw.
#[derive(Debug, Serialize)]
struct NodeColumns {
    at_ms: u64,
    name: Vec<String>,
    gpu_type: Vec<String>,
    gpu_total: Vec<u32>,
    gpu_free: Vec<u32>,
    /// `healthy`, `unhealthy`, `preflight`, `not-ready` or `cordoned`.
    health: Vec<String>,
    /// Per topology level, each node's domain index.
    levels: Vec<(String, Vec<u32>)>,
    /// Running jobs on each node.
    jobs: Vec<u32>,
    /// The queues of those jobs, comma-separated (empty when idle), for the UI's queue filter.
    queues: Vec<String>,
}

fn health_name(health: u8) -> String {
    gantry_core::Health::from_u8(health)
        .map(|h| format!("{h:?}"))
        .unwrap_or_else(|| format!("unknown-{health}"))
        .chars()
        .fold(String::new(), |mut s, c| {
            if c.is_uppercase() && !s.is_empty() {
                s.push('-');
            }
            s.push(c.to_ascii_lowercase());
            s
        })
}

async fn nodes(State(state): St, headers: HeaderMap) -> Result<Json<NodeColumns>> {
    caller(&state, &headers)?;
    let view = state.live.view();
    let symbols = state.live.symbols();
    let n = &view.nodes;
    Ok(Json(NodeColumns {
        at_ms: view.at_ms,
        name: n
            .name
            .iter()
            .map(|&s| symbols.resolve(s).to_string())
            .collect(),
        gpu_type: n
            .gpu_type
            .iter()
            .map(|&s| symbols.resolve(s).to_string())
            .collect(),
        gpu_total: n.gpu_total.clone(),
        gpu_free: n.gpu_free.clone(),
        health: n.health.iter().map(|&h| health_name(h)).collect(),
        levels: n
            .levels
            .iter()
            .map(|l| (symbols.resolve(l.name).to_string(), l.node_domain.clone()))
            .collect(),
        jobs: (0..n.len() as u32)
            .map(|i| view.node_to_jobs.get(&i).map_or(0, |j| j.len() as u32))
            .collect(),
        queues: (0..n.len() as u32)
            .map(|i| {
                let mut names: Vec<&str> = view
                    .node_to_jobs
                    .get(&i)
                    .into_iter()
                    .flatten()
                    .filter_map(|job| view.job_to_state.get(job).map(|j| j.queue.as_str()))
                    .collect();
                names.sort_unstable();
                names.dedup();
                names.join(",")
            })
            .collect(),
    }))
}

#[derive(Debug, Serialize)]
struct NodeDetail {
    name: String,
    gpu_type: String,
    gpu_total: u32,
    gpu_free: u32,
    health: String,
    domains: Vec<String>,
    jobs: Vec<String>,
    recent_decisions: Vec<DecisionRecord>,
}

async fn node(
    State(state): St,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<Limit>,
) -> Result<Json<NodeDetail>> {
    caller(&state, &headers)?;
    let view = state.live.view();
    let symbols = state.live.symbols();
    let n = &view.nodes;
    let index = n
        .name
        .iter()
        .position(|&s| &*symbols.resolve(s) == name.as_str())
        .ok_or_else(|| ApiError::NotFound(format!("no node named {name}")))?;
    let recent = state
        .live
        .store
        .decisions_on_node(&name, 0, u64::MAX, usize::MAX)?;
    Ok(Json(NodeDetail {
        gpu_type: symbols.resolve(n.gpu_type[index]).to_string(),
        gpu_total: n.gpu_total[index],
        gpu_free: n.gpu_free[index],
        health: health_name(n.health[index]),
        domains: n
            .levels
            .iter()
            .map(|l| format!("{} {}", symbols.resolve(l.name), l.node_domain[index]))
            .collect(),
        jobs: view
            .node_to_jobs
            .get(&(index as u32))
            .cloned()
            .unwrap_or_default(),
        recent_decisions: newest(recent, limit_of(q.limit)),
        name,
    }))
}

async fn queues(State(state): St, headers: HeaderMap) -> Result<Json<Vec<QueueView>>> {
    caller(&state, &headers)?;
    Ok(Json(state.live.view().queues.clone()))
}

#[derive(Debug, Deserialize)]
struct HistoryQuery {
    /// Only samples taken after this time, ms since the epoch (all kept ones when absent).
    since: Option<u64>,
}

/// Each queue's usage, quota, lending, fair share and pending jobs over the last hour, sampled
/// by the scheduling loop every few seconds; `since` fetches only what is new.
async fn queue_history(
    State(state): St,
    headers: HeaderMap,
    Query(q): Query<HistoryQuery>,
) -> Result<Json<gantry_engine::QueueHistoryView>> {
    caller(&state, &headers)?;
    Ok(Json(state.live.queue_history(q.since.unwrap_or(0))))
}

#[derive(Debug, Deserialize)]
struct JobQuery {
    /// Part of the job's name, case-insensitive.
    q: Option<String>,
    queue: Option<String>,
    /// `pending` or `running`.
    state: Option<String>,
    limit: Option<usize>,
}

/// A job pending or running now, as the job list shows it.
#[derive(Debug, Serialize)]
struct JobRow {
    name: String,
    #[serde(flatten)]
    job: gantry_engine::JobView,
}

/// Jobs pending or running now, for search and for each queue's pending list: pending first,
/// by queue and place in it, then running ones by name. Balloon pods are left out: they hold
/// idle capacity and are nobody's work.
async fn jobs(
    State(state): St,
    headers: HeaderMap,
    Query(q): Query<JobQuery>,
) -> Result<Json<Vec<JobRow>>> {
    caller(&state, &headers)?;
    if let Some(s) = q.state.as_deref()
        && s != "pending"
        && s != "running"
    {
        return Err(ApiError::BadRequest(format!(
            "state must be pending or running, not {s:?}"
        )));
    }
    let needle = q.q.as_deref().unwrap_or("").to_lowercase();
    let view = state.live.view();
    let mut rows: Vec<JobRow> = view
        .job_to_state
        .iter()
        .filter(|(name, job)| {
            !job.balloon
                && q.queue.as_deref().is_none_or(|want| job.queue == want)
                && q.state.as_deref().is_none_or(|want| job.state == want)
                && (needle.is_empty() || name.to_lowercase().contains(&needle))
        })
        .map(|(name, job)| JobRow {
            name: name.clone(),
            job: job.clone(),
        })
        .collect();
    rows.sort_by(|a, b| {
        (
            a.job.state != "pending",
            &a.job.queue,
            a.job.queue_position,
            &a.name,
        )
            .cmp(&(
                b.job.state != "pending",
                &b.job.queue,
                b.job.queue_position,
                &b.name,
            ))
    });
    rows.truncate(limit_of(q.limit));
    Ok(Json(rows))
}
