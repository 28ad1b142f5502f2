//! The routes and their handlers. Every `/api` route but the OpenAPI document needs a token,
//! checked by [`authenticate`] before any body is read; every mutating one needs an admin
//! token, and its change is written to the audit log. The audit log itself is admin-only.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Extension, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
// Every type a route takes or answers comes from the contract; the ones only named in the
// `#[utoipa::path]` attributes are imported for those.
use gantry_contract::{
    AuditEntry, Caller, ClusterSummary, ConfigQuery, DomainUse, ErrorBody, Explain, ExplainKind,
    ExplainState, HistoryQuery, JobEvent, JobEventKind, JobQuery, JobRow, LevelUse, Limit, NewSet,
    NodeColumns, NodeDetail, PolicyManifest, PolicySet, QueueHistoryView, QueueView, RunningPolicy,
    SetList, ShadowReport, ShadowStart, TimeRange, Upload, Validation, WasmModule, WhatIfAnswer,
    WhatIfJob,
};
use gantry_core::Outcome;
use gantry_store::DecisionRecord;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;
use tower::limit::GlobalConcurrencyLimitLayer;
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::timeout::TimeoutLayer;

use crate::auth::{RequireAdmin, Tokens};
use crate::error::{ApiError, Result};
use gantry_engine::Live;
use gantry_store::Actor;

/// What every handler gets: the shared state, the accepted tokens and the front door's
/// settings.
pub struct AppState {
    /// The engine's shared state: store, view, policy sets.
    pub live: Arc<Live>,
    /// The bearer tokens, followed on disk.
    pub tokens: Tokens,
    /// Proxies, `/metrics`.
    pub options: DoorOptions,
    /// Paces the audit entries of refused requests, so a flood of bad tokens cannot fill the
    /// disk or turn each refusal into a disk flush. Locked briefly per refusal.
    refusals: Mutex<RefusalPace>,
}

impl AppState {
    /// The state the router serves.
    pub fn new(live: Arc<Live>, tokens: Tokens, options: DoorOptions) -> Arc<Self> {
        Arc::new(Self {
            live,
            tokens,
            options,
            refusals: Mutex::new(RefusalPace::default()),
        })
    }
}

/// Front-door settings beyond the tokens.
#[derive(Debug, Clone, Default)]
pub struct DoorOptions {
    /// Proxies whose `X-Forwarded-For` is believed; from any other peer it is ignored, so a
    /// client cannot put another address into the audit log.
    pub trusted_proxies: Vec<IpNet>,
    /// `/metrics` needs a bearer token (any role), as it reveals queue names and load.
    pub metrics_need_token: bool,
}

/// An IP network (`10.0.0.0/8`, `fd00::/8`, or one address), for the trusted proxies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl std::str::FromStr for IpNet {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let bad = || format!("{text:?} is not an IP address or network (e.g. 10.0.0.0/8, ::1)");
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(prefix) => prefix.trim().parse::<u8>().map_err(|_| bad())?,
            None => max,
        };
        if prefix > max {
            return Err(format!("{text:?}: the prefix is longer than {max} bits"));
        }
        Ok(Self { addr, prefix })
    }
}

impl IpNet {
    /// Whether `ip` is in this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// The client's address as the audit log names it: the connection's peer, or, when that peer
/// is a trusted proxy, the nearest `X-Forwarded-For` hop that is not itself a trusted proxy
/// (read right to left, as each proxy appends the address it saw).
fn client_of(peer: SocketAddr, headers: &HeaderMap, trusted: &[IpNet]) -> String {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(peer.ip()) {
        return peer.to_string();
    }
    let mut client = peer.ip();
    let hops = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect::<Vec<_>>();
    for hop in hops.into_iter().rev() {
        let Ok(ip) = hop.parse::<IpAddr>() else {
            break;
        };
        client = ip;
        if !is_trusted(ip) {
            break;
        }
    }
    client.to_string()
}

/// The client's address, set by [`authenticate`] for the handlers' audit entries.
#[derive(Debug, Clone)]
pub struct Peer(pub String);

/// Refused requests recorded individually: about [`REFUSALS_PER_S`] a second, in bursts of up
/// to [`REFUSAL_BURST`]; the rest are counted, and the next recorded entry says how many.
#[derive(Debug)]
struct RefusalPace {
    allowance: f64,
    at: Instant,
    unrecorded: u64,
}

/// Refused requests recorded per second, sustained.
const REFUSALS_PER_S: f64 = 20.0;
/// Refused requests recorded at once after a quiet spell.
const REFUSAL_BURST: f64 = 200.0;

impl Default for RefusalPace {
    fn default() -> Self {
        Self {
            allowance: REFUSAL_BURST,
            at: Instant::now(),
            unrecorded: 0,
        }
    }
}

impl RefusalPace {
    /// `Some(unrecorded before this one)` when this refusal may be recorded.
    fn admit(&mut self) -> Option<u64> {
        let now = Instant::now();
        let refill = now.duration_since(self.at).as_secs_f64() * REFUSALS_PER_S;
        self.allowance = (self.allowance + refill).min(REFUSAL_BURST);
        self.at = now;
        if self.allowance < 1.0 {
            self.unrecorded += 1;
            return None;
        }
        self.allowance -= 1.0;
        Some(std::mem::take(&mut self.unrecorded))
    }
}

type St = State<Arc<AppState>>;

/// Most bytes a request body may have on any route but the policy uploads.
pub const SMALL_BODY_BYTES: usize = 64 * 1024;
/// Requests in flight at once; more wait their turn.
pub const CONCURRENT_REQUESTS: usize = 256;
/// How long a request may take (the decision stream aside, which is long-lived by design).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// What a browser may do with the UI's pages: load its own scripts, styles (inline styles
/// included, as the UI's charts set them) and images, talk to this server only, and never be
/// framed by another site.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; \
object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The whole HTTP surface. Every `/api` route but the OpenAPI document goes through
/// [`authenticate`] first, before any handler reads a body; bodies are capped at
/// [`SMALL_BODY_BYTES`] except on the two upload routes; every response carries the security
/// headers a browser app needs.
pub fn router(state: Arc<AppState>) -> Router {
    // Upload bodies up to twice the configured limit are read whole and refused with our own
    // message (413, naming both sizes): cutting a client off mid-upload makes it see a reset
    // connection instead of the reason. Anything larger is cut off. Only an authenticated
    // admin's body is ever read.
    let upload_limit = state.live.config.max_upload_bytes * 2 + 64 * 1024;
    let authed = Router::new()
        .route("/api/whoami", get(whoami))
        .route(
            "/api/policies",
            get(list_policies)
                .post(upload_policy)
                .layer(DefaultBodyLimit::max(upload_limit)),
        )
        .route(
            "/api/policies/validate",
            post(validate_policy).layer(DefaultBodyLimit::max(upload_limit)),
        )
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
        .route("/api/whatif", post(what_if))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            REQUEST_TIMEOUT,
        ))
        // The decision stream stays open for as long as the client reads it.
        .route("/api/decisions/stream", get(decision_stream))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/api/openapi.json", get(openapi))
        .merge(authed)
        .fallback(crate::ui::serve)
        .layer(DefaultBodyLimit::max(SMALL_BODY_BYTES))
        .layer(GlobalConcurrencyLimitLayer::new(CONCURRENT_REQUESTS))
        .layer(SetResponseHeaderLayer::if_not_present(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ))
        .layer(SetResponseHeaderLayer::if_not_present(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
        .layer(SetResponseHeaderLayer::if_not_present(
            header::X_FRAME_OPTIONS,
            HeaderValue::from_static("DENY"),
        ))
        .layer(SetResponseHeaderLayer::if_not_present(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ))
        .with_state(state)
}

/// The front door of the authenticated routes: the bearer token is checked from the headers
/// alone, before the handler (and so before any body is read): an anonymous client never
/// makes the server hold a request body. The caller and the client's address ride on to the
/// handler in the request's extensions.
///
/// Every refusal (401 here, 403 from a handler) leaves a log line and, paced, an audit entry
/// naming the token (its name, or the first 12 hex digits of its SHA-256 when unknown) and the
/// client. A change an admin made is flushed to disk, with its audit entry, before the
/// response goes out.
async fn authenticate(
    State(state): St,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut request: Request,
    next: Next,
) -> Response {
    let client = client_of(peer, request.headers(), &state.options.trusted_proxies);
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    match state.tokens.caller(request.headers()) {
        Ok(caller) => {
            request.extensions_mut().insert(caller.clone());
            request.extensions_mut().insert(Peer(client.clone()));
            let response = next.run(request).await;
            let status = response.status();
            if status == StatusCode::FORBIDDEN {
                let who = format!("{} ({})", caller.name, caller.role.as_str());
                tracing::warn!(%client, %method, %path, %who, "request refused: 403");
                record_refusal(&state, &who, &client, &method, &path, status).await;
            } else if status.is_success() && method != Method::GET {
                flush(&state).await;
            }
            response
        }
        Err(error) => {
            let who = match state.tokens.presented_digest(request.headers()) {
                Some(prefix) => format!("unknown token sha256:{prefix}"),
                None => "anonymous".to_string(),
            };
            tracing::warn!(%client, %method, %path, %who, %error, "request refused: 401");
            let response = error.into_response();
            record_refusal(&state, &who, &client, &method, &path, response.status()).await;
            response
        }
    }
}

/// Writes a refused request to the audit log, paced by [`RefusalPace`], and flushes it.
async fn record_refusal(
    state: &Arc<AppState>,
    who: &str,
    client: &str,
    method: &Method,
    path: &str,
    status: StatusCode,
) {
    let unrecorded = state
        .refusals
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .admit();
    let Some(unrecorded) = unrecorded else {
        return;
    };
    let mut detail = format!("{} {method} {path}", status.as_u16());
    if unrecorded > 0 {
        detail.push_str(&format!(
            " ({unrecorded} refused requests before this one were not recorded one by one: \
             over {REFUSALS_PER_S} a second)"
        ));
    }
    let actor = Actor::new(who, client);
    if let Err(error) =
        state
            .live
            .store
            .audit(&actor, "request.refused", &detail, gantry_engine::now_ms())
    {
        tracing::error!(%error, "cannot write the audit entry of a refused request");
    }
    flush(state).await;
}

/// Forces the store to disk (audit entries included) before a response goes out.
async fn flush(state: &Arc<AppState>) {
    let live = state.live.clone();
    match tokio::task::spawn_blocking(move || live.store.flush()).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::error!(%error, "cannot flush the store"),
        Err(error) => tracing::error!(%error, "the flush task failed"),
    }
}

/// A JSON body that could not be read: over the small cap (413), or not the JSON wanted (400).
fn json_error(rejection: axum::extract::rejection::JsonRejection) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::BodyTooLarge {
            limit: SMALL_BODY_BYTES,
        }
    } else {
        ApiError::BadRequest(rejection.body_text())
    }
}

/// Alive while the scheduling loop goes round: a loop wedged for longer than
/// `LiveConfig::stale_after` fails the probe, so the kubelet restarts the process. Before the
/// loop's first pass (caches still syncing) it is alive; `/readyz` says when it is ready.
#[utoipa::path(
    get, path = "/healthz", summary = "liveness: fails when the scheduling loop is wedged",
    responses(
        (status = 200, description = "alive", body = String, content_type = "text/plain"),
        (status = 503, description = "the loop has not gone round for too long", body = ErrorBody),
    )
)]
pub(crate) async fn healthz(State(state): St) -> Response {
    match state.live.heartbeat_age() {
        Some(age) if age > state.live.config.stale_after => ApiError::Unavailable(format!(
            "the scheduling loop has not gone round for {:.1} s",
            age.as_secs_f64()
        ))
        .into_response(),
        _ => (StatusCode::OK, "ok").into_response(),
    }
}

#[utoipa::path(
    get, path = "/readyz", summary = "readiness: the loop has published a snapshot",
    responses(
        (status = 200, description = "ready", body = String, content_type = "text/plain"),
        (status = 503, description = "not ready", body = ErrorBody),
    )
)]
pub(crate) async fn readyz(State(state): St) -> Response {
    if state.live.is_ready() {
        (StatusCode::OK, "ready").into_response()
    } else {
        ApiError::Unavailable("the scheduling loop has not published its first snapshot".into())
            .into_response()
    }
}

#[utoipa::path(
    get, path = "/metrics", summary = "Prometheus metrics",
    responses(
        (status = 200, description = "text exposition format", body = String, content_type = "text/plain"),
        (status = 401, description = "a token is needed (`--metrics-need-token`) and none or an unknown one came", body = ErrorBody),
    )
)]
pub(crate) async fn metrics(State(state): St, headers: HeaderMap) -> Response {
    if state.options.metrics_need_token
        && let Err(error) = state.tokens.caller(&headers)
    {
        return error.into_response();
    }
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

#[utoipa::path(
    get, path = "/api/openapi.json", summary = "this document",
    responses((status = 200, description = "OpenAPI 3.1", body = Object))
)]
pub(crate) async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::openapi::DOCUMENT.as_str(),
    )
        .into_response()
}

#[utoipa::path(
    get, path = "/api/whoami", summary = "the caller's name and role",
    responses((status = 200, description = "caller", body = Caller))
)]
pub(crate) async fn whoami(Extension(who): Extension<Caller>) -> Result<Json<Caller>> {
    Ok(Json(who))
}

#[utoipa::path(
    get, path = "/api/policies", summary = "stored policies",
    responses((status = 200, description = "manifests", body = Vec<PolicyManifest>))
)]
pub(crate) async fn list_policies(
    State(state): St,
    Extension(_who): Extension<Caller>,
) -> Result<Json<Vec<gantry_store::PolicyManifest>>> {
    Ok(Json(state.live.store.list_policies()?))
}

#[utoipa::path(
    get, path = "/api/policies/{sha256}", summary = "one policy's manifest",
    params(("sha256" = String, Path, description = "the .wasm bytes' sha256, or any unique prefix of 8 or more hex characters")),
    responses(
        (status = 200, description = "manifest", body = PolicyManifest),
        (status = 400, description = "not a sha256 or a prefix of 8 or more hex characters, or a prefix several policies share", body = ErrorBody),
        (status = 404, description = "no such policy", body = ErrorBody),
    )
)]
pub(crate) async fn get_policy(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Path(sha256): Path<String>,
) -> Result<Json<gantry_store::PolicyManifest>> {
    let store = &state.live.store;
    let sha256 = store.resolve_policy(&sha256)?;
    store
        .policy_manifest(&sha256)?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no policy with sha256 {sha256} is stored")))
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

#[utoipa::path(
    post, path = "/api/policies",
    summary = "upload a policy: compile, check its world, init with config, self-test on the current snapshot, store",
    params(ConfigQuery),
    request_body(content = WasmModule, content_type = "application/octet-stream", description = "the policy's `.wasm` bytes"),
    responses(
        (status = 201, description = "stored", body = Upload),
        (status = 200, description = "these bytes were already stored", body = Upload),
        (status = 400, description = "empty or unreadable body", body = ErrorBody),
        (status = 403, description = "a viewer token", body = ErrorBody),
        (status = 413, description = "over the upload limit", body = ErrorBody),
        (status = 422, description = "the policy failed validation", body = ErrorBody),
    )
)]
pub(crate) async fn upload_policy(
    State(state): St,
    Extension(Peer(from)): Extension<Peer>,
    Extension(who): Extension<Caller>,
    Query(query): Query<ConfigQuery>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    who.require_admin("upload a policy")?;
    let bytes = upload_body(&state, body)?;
    let config = query.config.unwrap_or_else(|| "{}".into());
    let live = state.live.clone();
    let actor = Actor::new(&who.name, from);
    let deadline_ms = query.deadline_ms;
    let upload =
        tokio::task::spawn_blocking(move || live.upload(&actor, &bytes, &config, deadline_ms))
            .await
            .map_err(|e| ApiError::Unavailable(format!("the upload task failed: {e}")))??;
    let status = if upload.already_stored {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(upload)).into_response())
}

#[utoipa::path(
    post, path = "/api/policies/validate", summary = "validate a policy without storing it",
    params(ConfigQuery),
    request_body(content = WasmModule, content_type = "application/octet-stream", description = "the policy's `.wasm` bytes"),
    responses(
        (status = 200, description = "valid", body = Validation),
        (status = 400, description = "empty or unreadable body", body = ErrorBody),
        (status = 403, description = "a viewer token", body = ErrorBody),
        (status = 413, description = "over the upload limit", body = ErrorBody),
        (status = 422, description = "the policy failed validation", body = ErrorBody),
    )
)]
pub(crate) async fn validate_policy(
    State(state): St,
    Extension(Peer(from)): Extension<Peer>,
    Extension(who): Extension<Caller>,
    Query(query): Query<ConfigQuery>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Json<gantry_engine::Validation>> {
    who.require_admin("validate a policy")?;
    let bytes = upload_body(&state, body)?;
    let config = query.config.unwrap_or_else(|| "{}".into());
    let live = state.live.clone();
    let size = bytes.len();
    let deadline_ms = query.deadline_ms;
    let validated =
        tokio::task::spawn_blocking(move || live.validate(&bytes, &config, deadline_ms))
            .await
            .map_err(|e| ApiError::Unavailable(format!("the validation task failed: {e}")))?
            .map_err(ApiError::from);
    // Validations run admins' code in the sandbox, so they are in the audit log too.
    let detail = match &validated {
        Ok((_, v)) => format!(
            "{} {} ({}, sha256 {}, {size} bytes): passed",
            v.name, v.version, v.role, v.sha256
        ),
        Err(error) => format!("{size} bytes: refused: {error}"),
    };
    state.live.store.audit(
        &Actor::new(&who.name, from),
        "policy.validate",
        &detail,
        gantry_engine::now_ms(),
    )?;
    let (_, validation) = validated?;
    Ok(Json(validation))
}

#[utoipa::path(
    get, path = "/api/sets", summary = "every policy-set version, and the active one",
    responses((status = 200, description = "sets", body = SetList))
)]
pub(crate) async fn list_sets(
    State(state): St,
    Extension(_who): Extension<Caller>,
) -> Result<Json<SetList>> {
    let set = state.live.active_set();
    let running = set
        .entries()
        .iter()
        .map(|e| {
            let (policy, info) = (&e.policy, e.policy.info());
            let health = policy.health();
            RunningPolicy {
                name: info.name.clone(),
                version: info.version.clone(),
                role: info.role.to_string(),
                sha256: info.sha256.clone(),
                calls: policy
                    .stats
                    .calls
                    .load(std::sync::atomic::Ordering::Relaxed),
                faults: policy
                    .stats
                    .faults
                    .load(std::sync::atomic::Ordering::Relaxed),
                consecutive_faults: health.consecutive_faults,
                quarantined: health.quarantined,
                probe_in_ms: health.probe_in.map(|d| d.as_millis() as u64),
                quarantines: health.quarantines,
                last_fault: health.last_fault.map(|f| f.to_string()),
            }
        })
        .collect();
    Ok(Json(SetList {
        active: set.version(),
        sets: state.live.store.list_sets()?,
        running,
    }))
}

#[utoipa::path(
    get, path = "/api/sets/{version}", summary = "one set version",
    params(("version" = u64, Path, minimum = 1, description = "a policy-set version")),
    responses(
        (status = 200, description = "set", body = PolicySet),
        (status = 400, description = "not a version number", body = ErrorBody),
        (status = 404, description = "no such version", body = ErrorBody),
    )
)]
pub(crate) async fn get_set(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Path(version): Path<u64>,
) -> Result<Json<gantry_store::PolicySet>> {
    state
        .live
        .store
        .get_set(version)?
        .map(Json)
        .ok_or(ApiError::Store(
            gantry_store::StoreError::UnknownSetVersion(version),
        ))
}

#[utoipa::path(
    post, path = "/api/sets", summary = "create a set version (not activated); every entry is loaded first",
    request_body = NewSet,
    responses(
        (status = 201, description = "created", body = PolicySet),
        (status = 400, description = "malformed set, or an entry's sha256 prefix is too short or shared", body = ErrorBody),
        (status = 403, description = "a viewer token", body = ErrorBody),
        (status = 404, description = "an entry names no stored policy", body = ErrorBody),
        (status = 413, description = "a body over 64 KiB", body = ErrorBody),
        (status = 422, description = "an entry cannot load", body = ErrorBody),
    )
)]
pub(crate) async fn create_set(
    State(state): St,
    Extension(Peer(from)): Extension<Peer>,
    Extension(who): Extension<Caller>,
    body: std::result::Result<Json<NewSet>, axum::extract::rejection::JsonRejection>,
) -> Result<Response> {
    who.require_admin("create a policy set")?;
    let Json(mut new) = body.map_err(json_error)?;
    if new.entries.len() > 64 {
        return Err(ApiError::BadRequest(format!(
            "a policy set holds at most 64 entries; this one has {}",
            new.entries.len()
        )));
    }
    let live = state.live.clone();
    let set = tokio::task::spawn_blocking(move || -> Result<gantry_store::PolicySet> {
        // Entries may name policies by a unique sha256 prefix; the set stores the full hash.
        for entry in &mut new.entries {
            entry.sha256 = live.store.resolve_policy(&entry.sha256)?;
        }
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
    from: String,
    who: Caller,
    version: u64,
    rollback: bool,
) -> Result<Json<gantry_store::PolicySet>> {
    who.require_admin(if rollback {
        "roll back the policy set"
    } else {
        "activate a policy set"
    })?;
    let live = state.live.clone();
    let actor = Actor::new(&who.name, from);
    let set = tokio::task::spawn_blocking(move || live.activate(&actor, version, rollback))
        .await
        .map_err(|e| ApiError::Unavailable(format!("the task failed: {e}")))??;
    Ok(Json(set))
}

#[utoipa::path(
    post, path = "/api/sets/{version}/activate", summary = "make a set version active: the next cycle runs on it",
    params(("version" = u64, Path, minimum = 1, description = "a policy-set version")),
    responses(
        (status = 200, description = "now active", body = PolicySet),
        (status = 400, description = "not a version number", body = ErrorBody),
        (status = 403, description = "a viewer token", body = ErrorBody),
        (status = 404, description = "no such version", body = ErrorBody),
        (status = 422, description = "an entry cannot load", body = ErrorBody),
    )
)]
pub(crate) async fn activate_set(
    State(state): St,
    Extension(Peer(from)): Extension<Peer>,
    Extension(who): Extension<Caller>,
    Path(version): Path<u64>,
) -> Result<Json<gantry_store::PolicySet>> {
    switch_set(state, from, who, version, false).await
}

#[utoipa::path(
    post, path = "/api/sets/{version}/rollback", summary = "roll back to an earlier set version (audited as a rollback)",
    params(("version" = u64, Path, minimum = 1, description = "a policy-set version")),
    responses(
        (status = 200, description = "now active", body = PolicySet),
        (status = 400, description = "not a version number", body = ErrorBody),
        (status = 403, description = "a viewer token", body = ErrorBody),
        (status = 404, description = "no such version", body = ErrorBody),
        (status = 409, description = "the version is already active", body = ErrorBody),
        (status = 422, description = "an entry cannot load", body = ErrorBody),
    )
)]
pub(crate) async fn rollback_set(
    State(state): St,
    Extension(Peer(from)): Extension<Peer>,
    Extension(who): Extension<Caller>,
    Path(version): Path<u64>,
) -> Result<Json<gantry_store::PolicySet>> {
    switch_set(state, from, who, version, true).await
}

#[utoipa::path(
    get, path = "/api/shadow", summary = "the running shadow report",
    responses(
        (status = 200, description = "report", body = ShadowReport),
        (status = 404, description = "no shadow run", body = ErrorBody),
    )
)]
pub(crate) async fn shadow_report(
    State(state): St,
    Extension(_who): Extension<Caller>,
) -> Result<Json<gantry_engine::ShadowReport>> {
    state
        .live
        .shadow_report()
        .map(Json)
        .ok_or_else(|| ApiError::NotFound("no shadow run is active".into()))
}

#[utoipa::path(
    post, path = "/api/shadow", summary = "run a set version in shadow beside the active set; binds nothing",
    request_body = ShadowStart,
    responses(
        (status = 201, description = "started", body = ShadowReport),
        (status = 400, description = "malformed request", body = ErrorBody),
        (status = 403, description = "a viewer token", body = ErrorBody),
        (status = 404, description = "no such version", body = ErrorBody),
        (status = 413, description = "a body over 64 KiB", body = ErrorBody),
        (status = 422, description = "an entry cannot load", body = ErrorBody),
    )
)]
pub(crate) async fn shadow_start(
    State(state): St,
    Extension(Peer(from)): Extension<Peer>,
    Extension(who): Extension<Caller>,
    body: std::result::Result<Json<ShadowStart>, axum::extract::rejection::JsonRejection>,
) -> Result<Response> {
    who.require_admin("start shadow mode")?;
    let Json(start) = body.map_err(json_error)?;
    let live = state.live.clone();
    let actor = Actor::new(&who.name, from);
    let report = tokio::task::spawn_blocking(move || live.shadow_start(&actor, start.version))
        .await
        .map_err(|e| ApiError::Unavailable(format!("the task failed: {e}")))??;
    Ok((StatusCode::CREATED, Json(report)).into_response())
}

#[utoipa::path(
    delete, path = "/api/shadow", summary = "stop the shadow run and return its report",
    responses(
        (status = 200, description = "final report", body = ShadowReport),
        (status = 403, description = "a viewer token", body = ErrorBody),
        (status = 404, description = "no shadow run", body = ErrorBody),
    )
)]
pub(crate) async fn shadow_stop(
    State(state): St,
    Extension(Peer(from)): Extension<Peer>,
    Extension(who): Extension<Caller>,
) -> Result<Json<gantry_engine::ShadowReport>> {
    who.require_admin("stop shadow mode")?;
    Ok(Json(state.live.shadow_stop(&Actor::new(&who.name, from))?))
}

/// Bounds a requested list length: 100 by default, 10,000 at most.
fn limit_of(limit: Option<usize>) -> usize {
    Limit::get(limit)
}

#[utoipa::path(
    get, path = "/api/audit", summary = "the newest audit entries, newest first (admin only)",
    params(Limit),
    responses(
        (status = 200, description = "entries", body = Vec<AuditEntry>),
        (status = 400, description = "bad query", body = ErrorBody),
        (status = 403, description = "a viewer token", body = ErrorBody),
    )
)]
pub(crate) async fn audit(
    State(state): St,
    Extension(who): Extension<Caller>,
    Query(q): Query<Limit>,
) -> Result<Json<Vec<gantry_store::AuditEntry>>> {
    // Who did what from where is the admins' business.
    who.require_admin("read the audit log")?;
    Ok(Json(state.live.store.audit_recent(limit_of(q.limit))?))
}

#[utoipa::path(
    get, path = "/api/decisions", summary = "decisions in a time range, in time order",
    params(TimeRange),
    responses(
        (status = 200, description = "decisions", body = Vec<DecisionRecord>),
        (status = 400, description = "bad range", body = ErrorBody),
    )
)]
pub(crate) async fn decisions_between(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Query(q): Query<TimeRange>,
) -> Result<Json<Vec<DecisionRecord>>> {
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

#[utoipa::path(
    get, path = "/api/decisions/job/{job}", summary = "a job's decisions, oldest first (the newest `limit`)",
    params(("job" = String, Path, description = "job name"), Limit),
    responses(
        (status = 200, description = "decisions", body = Vec<DecisionRecord>),
        (status = 400, description = "bad query", body = ErrorBody),
        (status = 404, description = "no decisions about this job", body = ErrorBody),
    )
)]
pub(crate) async fn decisions_by_job(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Path(job): Path<String>,
    Query(q): Query<Limit>,
) -> Result<Json<Vec<DecisionRecord>>> {
    let history = state.live.store.job_history(&job)?;
    // A job pending now that no cycle has attempted yet has an empty history, not none.
    if history.is_empty() && !state.live.view().job_to_state.contains_key(&job) {
        return Err(ApiError::NotFound(format!("no decisions about job {job}")));
    }
    Ok(Json(newest(history, limit_of(q.limit))))
}

#[utoipa::path(
    get, path = "/api/decisions/pod/{pod}",
    summary = "the decisions about a pod's job (a single-pod job's pod has the job's name)",
    params(("pod" = String, Path, description = "pod name"), Limit),
    responses(
        (status = 200, description = "decisions", body = Vec<DecisionRecord>),
        (status = 400, description = "bad query", body = ErrorBody),
        (status = 404, description = "unknown pod", body = ErrorBody),
    )
)]
pub(crate) async fn decisions_by_pod(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Path(pod): Path<String>,
    Query(q): Query<Limit>,
) -> Result<Json<Vec<DecisionRecord>>> {
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

#[utoipa::path(
    get, path = "/api/decisions/node/{node}", summary = "placements on a node, in time order",
    params(("node" = String, Path, description = "node name"), TimeRange),
    responses(
        (status = 200, description = "decisions", body = Vec<DecisionRecord>),
        (status = 400, description = "bad query", body = ErrorBody),
    )
)]
pub(crate) async fn decisions_by_node(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Path(node): Path<String>,
    Query(q): Query<TimeRange>,
) -> Result<Json<Vec<DecisionRecord>>> {
    Ok(Json(state.live.store.decisions_on_node(
        &node,
        q.from_ms.unwrap_or(0),
        q.to_ms.unwrap_or(u64::MAX),
        limit_of(q.limit),
    )?))
}

#[utoipa::path(
    get, path = "/api/decisions/stream",
    summary = "server-sent events: one `decision` event per decision, its data a `DecisionEvent`",
    responses((status = 200, description = "event stream", body = String, content_type = "text/event-stream"))
)]
pub(crate) async fn decision_stream(
    State(state): St,
    Extension(_who): Extension<Caller>,
) -> Result<Sse<impl tokio_stream::Stream<Item = std::result::Result<Event, Infallible>>>> {
    let stream = BroadcastStream::new(state.live.subscribe()).filter_map(|event| {
        // A lagging subscriber skips what it missed rather than closing.
        let event = event.ok()?;
        let data = serde_json::to_string(&*event).ok()?;
        Some(Ok(Event::default().event("decision").data(data)))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// `placed on node-1 ×2, node-7 in rack 3`, naming at most four nodes.
fn placed_text(nodes: &[(String, u32)], e: &gantry_core::Explanation) -> String {
    let mut names: Vec<String> = nodes
        .iter()
        .take(4)
        .map(|(node, pods)| match pods {
            1 => node.clone(),
            n => format!("{node} ×{n}"),
        })
        .collect();
    if nodes.len() > 4 {
        names.push(format!("{} more nodes", nodes.len() - 4));
    }
    let domain = e
        .domain
        .as_ref()
        .map(|d| format!(" in {d}"))
        .unwrap_or_default();
    format!("placed on {}{domain}", names.join(", "))
}

/// A job's decision records, oldest first, as the steps a researcher reads.
fn job_events(records: &[DecisionRecord]) -> Vec<JobEvent> {
    let mut events: Vec<JobEvent> = Vec::new();
    for record in records {
        let e = &record.explanation;
        let (kind, text, by) = match (&e.outcome, &e.preempted_by) {
            (Outcome::Placed { nodes }, _) => (JobEventKind::Placed, placed_text(nodes, e), None),
            (Outcome::Pending { .. }, Some(by)) => (
                JobEventKind::Preempted,
                format!("preempted to make room for {by}"),
                Some(by.clone()),
            ),
            (Outcome::Pending { waiting_for }, None) => (
                JobEventKind::Pending,
                format!("waiting for {waiting_for}"),
                None,
            ),
        };
        match events.last_mut() {
            Some(last) if kind == JobEventKind::Pending && last.kind == JobEventKind::Pending => {
                last.text = text;
            }
            _ => events.push(JobEvent {
                time_ms: record.time_ms,
                kind,
                text,
                by,
            }),
        }
    }
    events
}

/// When a job of this shape would start, without submitting it: the loop answers from its plan.
#[utoipa::path(
    post, path = "/api/whatif",
    summary = "when a job of this shape would start, from the plan, without submitting it; with `variations`, also for half the GPUs per pod, 3/4 of the pods, each other queue and GPU type",
    request_body = WhatIfJob,
    responses(
        (status = 200, description = "answer", body = WhatIfAnswer),
        (status = 400, description = "a field is wrong: the message names it", body = ErrorBody),
        (status = 413, description = "a body over 64 KiB", body = ErrorBody),
        (status = 503, description = "the loop did not answer in time", body = ErrorBody),
    )
)]
pub(crate) async fn what_if(
    State(state): St,
    Extension(_who): Extension<Caller>,
    body: std::result::Result<
        Json<gantry_engine::WhatIfJob>,
        axum::extract::rejection::JsonRejection,
    >,
) -> Result<Json<gantry_engine::WhatIfAnswer>> {
    let Json(job) = body.map_err(json_error)?;
    match state.live.what_if(job).await {
        Ok(answer) => Ok(Json(answer)),
        Err(gantry_engine::WhatIfError::BadField(text)) => Err(ApiError::BadRequest(text)),
        Err(error @ gantry_engine::WhatIfError::NoAnswer) => {
            Err(ApiError::Unavailable(error.to_string()))
        }
    }
}

#[utoipa::path(
    get, path = "/api/explain/{name}", summary = "why a pod or job is pending now, or where it went",
    params(("name" = String, Path, description = "pod or job name")),
    responses(
        (status = 200, description = "explanation", body = Explain),
        (status = 404, description = "no such job or pod", body = ErrorBody),
    )
)]
pub(crate) async fn explain(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<Explain>> {
    let store = &state.live.store;
    let view = state.live.view();
    let (kind, job) =
        if view.job_to_state.contains_key(&name) || store.latest_for_job(&name)?.is_some() {
            (ExplainKind::Job, name.clone())
        } else {
            match store.job_for_pod(&name)? {
                Some(job) => (ExplainKind::Pod, job),
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
    let state_name = match now.map(|j| j.state) {
        Some("pending") => ExplainState::Pending,
        Some(_) => ExplainState::Running,
        None => ExplainState::Done,
    };
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
    let events = job_events(&history);
    // A job preempted earlier reads so, even when its latest record waits for something else.
    let earlier_preemption = events
        .iter()
        .rev()
        .skip(1)
        .find(|e| e.kind == JobEventKind::Preempted)
        .filter(|_| state_name == ExplainState::Pending)
        .and_then(|e| e.by.as_ref())
        .map(|by| format!(" It ran earlier and was preempted to make room for {by}."))
        .unwrap_or_default();
    let (why, waiting_for) = match &latest {
        Some(r) => (
            format!("{}{earlier_preemption}", r.explanation.summary()),
            match &r.explanation.outcome {
                Outcome::Pending { waiting_for } if state_name == ExplainState::Pending => {
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
        estimate: now.and_then(|j| j.estimate.clone()),
        attempts: history.len(),
        latest,
        history: events,
    }))
}

#[utoipa::path(
    get, path = "/api/cluster", summary = "cluster totals and GPU use per topology domain",
    responses((status = 200, description = "summary", body = ClusterSummary))
)]
pub(crate) async fn cluster(
    State(state): St,
    Extension(_who): Extension<Caller>,
) -> Result<Json<ClusterSummary>> {
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

#[utoipa::path(
    get, path = "/api/cluster/nodes", summary = "every node, as columns",
    responses((status = 200, description = "nodes", body = NodeColumns))
)]
pub(crate) async fn nodes(
    State(state): St,
    Extension(_who): Extension<Caller>,
) -> Result<Json<NodeColumns>> {
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

#[utoipa::path(
    get, path = "/api/cluster/nodes/{node}", summary = "one node, its jobs and its recent placements",
    params(("node" = String, Path, description = "node name"), Limit),
    responses(
        (status = 200, description = "node", body = NodeDetail),
        (status = 400, description = "bad query", body = ErrorBody),
        (status = 404, description = "no such node", body = ErrorBody),
    )
)]
pub(crate) async fn node(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Path(name): Path<String>,
    Query(q): Query<Limit>,
) -> Result<Json<NodeDetail>> {
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

#[utoipa::path(
    get, path = "/api/queues", summary = "quota, usage, borrowing and fair share per queue",
    responses((status = 200, description = "queues", body = Vec<QueueView>))
)]
pub(crate) async fn queues(
    State(state): St,
    Extension(_who): Extension<Caller>,
) -> Result<Json<Vec<QueueView>>> {
    Ok(Json(state.live.view().queues.clone()))
}

/// Each queue's usage, quota, lending, fair share and pending jobs over the last hour, sampled
/// by the scheduling loop every few seconds; `since` fetches only what is new.
#[utoipa::path(
    get, path = "/api/queues/history",
    summary = "each queue's usage, quota, lending, fair share and pending jobs over the last hour, sampled every 5 s",
    params(HistoryQuery),
    responses(
        (status = 200, description = "history", body = QueueHistoryView),
        (status = 400, description = "bad query", body = ErrorBody),
    )
)]
pub(crate) async fn queue_history(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Query(q): Query<HistoryQuery>,
) -> Result<Json<gantry_engine::QueueHistoryView>> {
    Ok(Json(state.live.queue_history(q.since.unwrap_or(0))))
}

/// Jobs pending or running now, for search and for each queue's pending list: pending first,
/// by queue and place in it, then running ones by name. Balloon pods are left out: they hold
/// idle capacity and are nobody's work.
#[utoipa::path(
    get, path = "/api/jobs",
    summary = "jobs pending or running now (balloons left out): pending first, by queue and place in it",
    params(JobQuery),
    responses(
        (status = 200, description = "jobs", body = Vec<JobRow>),
        (status = 400, description = "bad state or sort", body = ErrorBody),
    )
)]
pub(crate) async fn jobs(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Query(q): Query<JobQuery>,
) -> Result<Json<Vec<JobRow>>> {
    if let Some(s) = q.state.as_deref()
        && s != "pending"
        && s != "running"
    {
        return Err(ApiError::BadRequest(format!(
            "state must be pending or running, not {s:?}"
        )));
    }
    let by_wait = match q.sort.as_deref() {
        None | Some("position") => false,
        Some("wait") => true,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "sort must be position or wait, not {other:?}"
            )));
        }
    };
    let namespace_of = |name: &str| name.split_once('/').map_or("", |(ns, _)| ns).to_string();
    let needle = q.q.as_deref().unwrap_or("").to_lowercase();
    let view = state.live.view();
    let mut rows: Vec<JobRow> = view
        .job_to_state
        .iter()
        .filter(|(name, job)| {
            !job.balloon
                && q.queue.as_deref().is_none_or(|want| job.queue == want)
                && q.state.as_deref().is_none_or(|want| job.state == want)
                && q.namespace
                    .as_deref()
                    .is_none_or(|want| namespace_of(name) == want)
                && (needle.is_empty() || name.to_lowercase().contains(&needle))
        })
        .map(|(name, job)| JobRow {
            name: name.clone(),
            job: job.clone(),
        })
        .collect();
    rows.sort_by(|a, b| {
        let wait = |r: &JobRow| if by_wait { r.job.submitted_ms } else { 0 };
        (
            a.job.state != "pending",
            wait(a),
            &a.job.queue,
            a.job.queue_position,
            &a.name,
        )
            .cmp(&(
                b.job.state != "pending",
                wait(b),
                &b.job.queue,
                b.job.queue_position,
                &b.name,
            ))
    });
    rows.truncate(limit_of(q.limit));
    Ok(Json(rows))
}

#[cfg(test)]
mod tests {
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
    fn state(dir: &std::path::Path, options: DoorOptions) -> Arc<AppState> {
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
                post("/api/sets/1/activate", Some(VIEWER), Body::empty()),
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
                refused("eve (viewer)", "403 POST /api/sets/1/activate"),
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
}
