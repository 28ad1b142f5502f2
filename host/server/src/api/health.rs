//! The node health lifecycle: nodes per state, the breaker and the latest transitions; one
//! node's; and the admin's breaker reset, which the loop makes between cycles.

use super::*;

#[utoipa::path(
    get, path = "/api/health",
    summary = "nodes per lifecycle state, the circuit breaker, and the latest transitions, newest first",
    params(Limit),
    responses(
        (status = 200, description = "health", body = HealthView),
        (status = 400, description = "bad query", body = ErrorBody),
    )
)]
pub(crate) async fn health(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Query(q): Query<Limit>,
) -> Result<Json<HealthView>> {
    Ok(Json(state.live.health(limit_of(q.limit))))
}

#[utoipa::path(
    get, path = "/api/nodes/{name}/health",
    summary = "one node's lifecycle state and its transitions, newest first",
    params(("name" = String, Path, description = "node name"), Limit),
    responses(
        (status = 200, description = "the node's health", body = NodeHealthView),
        (status = 400, description = "bad query", body = ErrorBody),
        (status = 404, description = "no such node", body = ErrorBody),
    )
)]
pub(crate) async fn node_health(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Path(name): Path<String>,
    Query(q): Query<Limit>,
) -> Result<Json<NodeHealthView>> {
    state
        .live
        .node_health(&name, limit_of(q.limit))
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no node named {name}")))
}

#[utoipa::path(
    post, path = "/api/health/reset",
    summary = "reset the tripped circuit breaker: automated cordons resume (admin only, audited)",
    responses(
        (status = 200, description = "what the reset cleared", body = BreakerReset),
        (status = 403, description = "a viewer token", body = ErrorBody),
        (status = 409, description = "the breaker is not tripped, or this replica follows", body = ErrorBody),
        (status = 503, description = "the scheduling loop did not answer in time, or the audit entry could not be written", body = ErrorBody),
    )
)]
pub(crate) async fn reset_breaker(
    State(state): St,
    Extension(Peer(from)): Extension<Peer>,
    Extension(who): Extension<Caller>,
) -> Result<Json<BreakerReset>> {
    match state.live.reset_breaker(Actor::new(&who.name, from)).await {
        Ok(reset) => Ok(Json(reset)),
        Err(error @ gantry_engine::ResetError::NotTripped) => {
            Err(ApiError::Conflict(error.to_string()))
        }
        Err(
            error @ (gantry_engine::ResetError::NoAnswer | gantry_engine::ResetError::Audit(_)),
        ) => Err(ApiError::Unavailable(error.to_string())),
    }
}
