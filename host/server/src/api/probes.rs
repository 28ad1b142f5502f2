//! The probes and the documents anyone may read: `/healthz`, `/readyz`, `/metrics`, the
//! OpenAPI document, and who the caller is.

use super::*;

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
        // Ready, but a damaged history moved aside at start is said here, where on-call looks.
        match state.live.store.history_damage() {
            Some(damage) => (StatusCode::OK, format!("ready; {damage}")).into_response(),
            None => (StatusCode::OK, "ready").into_response(),
        }
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
    let body = state.live.render_metrics();
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
