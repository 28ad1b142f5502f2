//! The routes and their handlers. Every `/api` route but the OpenAPI document needs a token,
//! checked by [`authenticate`] before any body is read; every mutating one needs an admin
//! token, checked from the headers by the route's own layer ([`admin_only`]) before its
//! handler's extractors run, and its change is written to the audit log. The audit log itself
//! is admin-only. One token holds at most [`REQUESTS_IN_FLIGHT_PER_TOKEN`] requests at once,
//! viewers together at most [`VIEWER_REQUESTS_IN_FLIGHT`] (the rest are the admins'), and the
//! probes sit ahead of the server's concurrency limit.
//!
//! Here: the shared state, the front door (client addresses, refusal pacing), the router and
//! its layers, and authentication. The handlers, by what they serve:
//! - [`probes`]: health, readiness, metrics, the OpenAPI document, who am I;
//! - [`policies`]: policies, sets, activation and shadow mode;
//! - [`decisions`]: the audit log, decisions, explanations and the what-if;
//! - [`cluster`]: the cluster summary, nodes, queues and jobs;
//! - [`health`]: the node health lifecycle, and the breaker's reset.

mod cluster;
mod decisions;
mod health;
#[cfg(test)]
mod health_tests;
mod policies;
mod probes;
#[cfg(test)]
pub(crate) mod tests;

// The handlers (and the `#[utoipa::path]` items beside them) where the router and the
// OpenAPI document name them.
pub(crate) use cluster::*;
pub(crate) use decisions::*;
pub(crate) use health::*;
pub(crate) use policies::*;
pub(crate) use probes::*;

use std::collections::HashMap;
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
use axum::routing::{delete, get, post};
use axum::{Json, Router};
// Every type a route takes or answers comes from the contract; the ones only named in the
// `#[utoipa::path]` attributes are imported for those.
use gantry_contract::{
    AuditEntry, BreakerReset, Caller, ClusterSummary, ConfigQuery, DomainUse, ErrorBody, Explain,
    ExplainKind, ExplainState, HealthView, HistoryQuery, JobEvent, JobEventKind, JobQuery, JobRow,
    LevelUse, Limit, NewSet, NodeColumns, NodeDetail, NodeHealthView, PolicyManifest, PolicySet,
    QueueHistoryView, QueueView, RunningPolicy, SetList, ShadowReport, ShadowStart, TimeRange,
    Upload, Validation, WasmModule, WhatIfAnswer, WhatIfJob,
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
    /// Requests in flight per token (by its name), so one token (the viewer token every
    /// researcher and scraper shares) cannot hold all [`CONCURRENT_REQUESTS`]. Locked briefly
    /// as a request starts and ends.
    token_to_in_flight: Mutex<InFlightCounts>,
    /// Store reads running on the blocking pool now, at most [`READS_AT_ONCE`] (see
    /// [`read_off_loop`]).
    reads: tokio::sync::Semaphore,
    /// Clients following the decision stream now (see `decisions::DECISION_STREAM_CLIENTS`).
    stream_followers: Arc<std::sync::atomic::AtomicUsize>,
}

impl AppState {
    /// The state the router serves.
    pub fn new(live: Arc<Live>, tokens: Tokens, options: DoorOptions) -> Arc<Self> {
        Arc::new(Self {
            live,
            tokens,
            options,
            refusals: Mutex::new(RefusalPace::default()),
            token_to_in_flight: Mutex::new(InFlightCounts::default()),
            stream_followers: Arc::default(),
            reads: tokio::sync::Semaphore::new(READS_AT_ONCE),
        })
    }

    /// Counts a request of `who` (a `viewer` or not) in flight until the returned guard
    /// drops, or refuses it when that token already has [`REQUESTS_IN_FLIGHT_PER_TOKEN`], or
    /// a viewer's when viewers have [`VIEWER_REQUESTS_IN_FLIGHT`].
    fn start_request(self: &Arc<Self>, who: &str, viewer: bool) -> Result<InFlight> {
        let mut counts = self
            .token_to_in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if counts.token_to_count.get(who).copied().unwrap_or(0) >= REQUESTS_IN_FLIGHT_PER_TOKEN {
            return Err(ApiError::TooManyInFlight {
                who: who.to_string(),
                cap: REQUESTS_IN_FLIGHT_PER_TOKEN,
            });
        }
        if viewer && counts.viewers >= VIEWER_REQUESTS_IN_FLIGHT {
            return Err(ApiError::ViewersBusy {
                cap: VIEWER_REQUESTS_IN_FLIGHT,
            });
        }
        *counts.token_to_count.entry(who.to_string()).or_default() += 1;
        counts.viewers += usize::from(viewer);
        Ok(InFlight {
            state: self.clone(),
            who: who.to_string(),
            viewer,
        })
    }
}

/// Requests in flight: per token (by its name), and all viewers' together.
#[derive(Debug, Default)]
struct InFlightCounts {
    token_to_count: HashMap<String, usize>,
    viewers: usize,
}

/// One request counted against its token's share; dropping it ends the count.
struct InFlight {
    state: Arc<AppState>,
    who: String,
    viewer: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut counts = self
            .state
            .token_to_in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.token_to_count.get_mut(&self.who) {
            *count -= 1;
            if *count == 0 {
                counts.token_to_count.remove(&self.who);
            }
        }
        counts.viewers -= usize::from(self.viewer);
    }
}

/// Front-door settings beyond the tokens.
#[derive(Debug, Clone)]
pub struct DoorOptions {
    /// Proxies whose `X-Forwarded-For` is believed; from any other peer it is ignored, so a
    /// client cannot put another address into the audit log.
    pub trusted_proxies: Vec<IpNet>,
    /// `/metrics` needs a bearer token (any role), as it reveals queue names and load.
    pub metrics_need_token: bool,
    /// How long a request's whole body may take to arrive ([`BODY_READ_TIMEOUT`] by
    /// default): a body trickled a byte at a time holds a request slot until then, not for
    /// the whole request timeout.
    pub body_read_timeout: Duration,
    /// How long a client may take to send a request's headers ([`HEADER_READ_TIMEOUT`] by
    /// default): a half-sent request is closed then, not kept open for good.
    pub header_read_timeout: Duration,
    /// Most connections open at once ([`MAX_CONNECTIONS`] by default): past it, a new one
    /// waits in the kernel's backlog until one closes, so idle sockets cannot exhaust the
    /// process's file descriptors.
    pub max_connections: usize,
}

impl Default for DoorOptions {
    fn default() -> Self {
        Self {
            trusted_proxies: Vec::new(),
            metrics_need_token: false,
            body_read_timeout: BODY_READ_TIMEOUT,
            header_read_timeout: HEADER_READ_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

/// How long a request body may take to arrive whole, by default: a 64 MiB upload at 5 MB/s
/// fits; a body trickled to hold a slot does not hold it for the 60 s request timeout.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a client may take to send a request's headers, by default.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Most connections open at once, by default: above the API's concurrency limit and the
/// decision stream's cap together, and within the 1,024 file descriptors a process is
/// usually allowed.
pub const MAX_CONNECTIONS: usize = 512;

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
/// Requests one token may have in flight at once; more get 429. A quarter of
/// [`CONCURRENT_REQUESTS`], so a shared viewer token leaves room for the admins.
pub const REQUESTS_IN_FLIGHT_PER_TOKEN: usize = CONCURRENT_REQUESTS / 4;
/// Requests all viewer tokens together may have in flight; more get 429 at once (they never
/// wait, as a waiting request holds one of [`CONCURRENT_REQUESTS`]). Three quarters, so a
/// few viewer tokens holding slow requests leave the admins a quarter of the server: without
/// it, 300 trickled viewer bodies kept an admin's call waiting 18 s (`gantry bench server`).
pub const VIEWER_REQUESTS_IN_FLIGHT: usize = CONCURRENT_REQUESTS - REQUESTS_IN_FLIGHT_PER_TOKEN;
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
    // The role a route needs is checked here, from the headers, before its handler's
    // extractors run: a viewer's upload is refused before one byte of its body is read.
    // A write is refused on a follower too: its changes belong with the leader, which
    // schedules.
    let admin = |action: &'static str| {
        let route = AdminRoute {
            action,
            follower_refuses: None,
        };
        axum::middleware::from_fn_with_state(route, admin_only)
    };
    let admin_write = |action: &'static str| {
        let route = AdminRoute {
            action,
            follower_refuses: Some(state.live.clone()),
        };
        axum::middleware::from_fn_with_state(route, admin_only)
    };
    let authed = Router::new()
        .route("/api/whoami", get(whoami))
        .route(
            "/api/policies",
            get(list_policies)
                .merge(post(upload_policy).route_layer(admin_write("upload a policy")))
                .layer(DefaultBodyLimit::max(upload_limit)),
        )
        .route(
            "/api/policies/validate",
            post(validate_policy)
                .route_layer(admin("validate a policy"))
                .layer(DefaultBodyLimit::max(upload_limit)),
        )
        .route("/api/policies/{sha256}", get(get_policy))
        .route(
            "/api/sets",
            get(list_sets).merge(post(create_set).route_layer(admin_write("create a policy set"))),
        )
        .route("/api/sets/{version}", get(get_set))
        .route(
            "/api/sets/{version}/activate",
            post(activate_set).route_layer(admin_write("activate a policy set")),
        )
        .route(
            "/api/sets/{version}/rollback",
            post(rollback_set).route_layer(admin_write("roll back the policy set")),
        )
        .route(
            "/api/shadow",
            get(shadow_report)
                .merge(post(shadow_start).route_layer(admin_write("start shadow mode")))
                .merge(delete(shadow_stop).route_layer(admin_write("stop shadow mode"))),
        )
        // Who did what from where is the admins' business.
        .route(
            "/api/audit",
            get(audit).route_layer(admin("read the audit log")),
        )
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
        .route("/api/health", get(health))
        .route(
            "/api/health/reset",
            post(reset_breaker).route_layer(admin_write("reset the node health breaker")),
        )
        .route("/api/nodes/{name}/health", get(node_health))
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
    let limited = Router::new()
        .route("/metrics", get(metrics))
        .route("/api/openapi.json", get(openapi))
        .merge(authed)
        .fallback(crate::ui::serve)
        .layer(axum::middleware::from_fn_with_state(
            state.options.body_read_timeout,
            body_deadline,
        ))
        .layer(DefaultBodyLimit::max(SMALL_BODY_BYTES))
        .layer(GlobalConcurrencyLimitLayer::new(CONCURRENT_REQUESTS));
    // The probes sit ahead of the concurrency limit: requests that hold every permit (slow
    // bodies, heavy reads) must not make the kubelet restart a healthy scheduler.
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .merge(limited)
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

/// Gives the request's body a deadline: whoever reads it gets an error, naming the
/// deadline, once it has not arrived whole within `timeout` of the request's start.
async fn body_deadline(State(timeout): State<Duration>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::Body::from_stream(BodyDeadline {
        inner: body.into_data_stream(),
        deadline: Box::pin(tokio::time::sleep(timeout)),
        timeout,
        ended: false,
    });
    next.run(Request::from_parts(parts, body)).await
}

/// A body's data that errors once its deadline passes (see [`body_deadline`]).
struct BodyDeadline {
    inner: axum::body::BodyDataStream,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
    ended: bool,
}

impl tokio_stream::Stream for BodyDeadline {
    type Item = std::io::Result<Bytes>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::future::Future as _;
        use std::task::Poll;
        if self.ended {
            return Poll::Ready(None);
        }
        match std::pin::Pin::new(&mut self.inner).poll_next(cx) {
            Poll::Ready(Some(Ok(bytes))) => return Poll::Ready(Some(Ok(bytes))),
            Poll::Ready(Some(Err(error))) => {
                return Poll::Ready(Some(Err(std::io::Error::other(error))));
            }
            Poll::Ready(None) => {
                self.ended = true;
                return Poll::Ready(None);
            }
            Poll::Pending => {}
        }
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.ended = true;
            let secs = self.timeout.as_secs_f64();
            return Poll::Ready(Some(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the request body did not arrive whole within {secs} s"),
            ))));
        }
        Poll::Pending
    }
}

/// The role check of an admin-only route, layered on the route itself (see [`router`]): it
/// runs after [`authenticate`] put the caller in the request's extensions and before the
/// handler's extractors, so a viewer's body is never read. `action` names what was refused.
async fn admin_only(
    State(route): State<AdminRoute>,
    Extension(who): Extension<Caller>,
    request: Request,
    next: Next,
) -> Response {
    if let Err(error) = who.require_admin(route.action) {
        return error.into_response();
    }
    if let Some(leader) = route
        .follower_refuses
        .as_ref()
        .and_then(|live| live.leader_elsewhere())
    {
        return ApiError::Follower { leader }.into_response();
    }
    next.run(request).await
}

/// What an admin-only route's layer checks: the admin role for `action`, and, for a route
/// that changes something, that this replica leads (`follower_refuses` reads who does).
#[derive(Clone)]
struct AdminRoute {
    action: &'static str,
    follower_refuses: Option<Arc<Live>>,
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
            let viewer = caller.role == gantry_contract::Role::Viewer;
            let _in_flight = match state.start_request(&caller.name, viewer) {
                Ok(guard) => guard,
                Err(error) => {
                    tracing::warn!(%client, %method, %path, who = %caller.name, %error, "request refused: 429");
                    return error.into_response();
                }
            };
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

/// Store reads (and their answers' JSON) running at once; more wait their turn. A history
/// read of 10,000 records takes a core for a while: on the async workers, 32 viewers looping
/// them made probes and every other request wait.
pub const READS_AT_ONCE: usize = 4;

/// Runs a store read and the encoding of its answer as JSON on the blocking pool, at most
/// [`READS_AT_ONCE`] at a time, so heavy reads never hold the async workers that answer the
/// probes and the rest of the API.
pub(super) async fn read_off_loop<T, F>(state: &Arc<AppState>, read: F) -> Result<Response>
where
    T: serde::Serialize,
    F: FnOnce(&Live) -> Result<T> + Send + 'static,
{
    let _permit = state
        .reads
        .acquire()
        .await
        .map_err(|_| ApiError::Unavailable("the server is shutting down".into()))?;
    let live = state.live.clone();
    let body = tokio::task::spawn_blocking(move || {
        let answer = read(&live)?;
        serde_json::to_vec(&answer)
            .map_err(|e| ApiError::Unavailable(format!("cannot encode the answer: {e}")))
    })
    .await
    .map_err(|e| ApiError::Unavailable(format!("the read task failed: {e}")))??;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
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
