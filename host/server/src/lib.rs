//! Gantry's HTTP face: the axum REST API (policies, sets, shadow mode, decisions, explanations,
//! cluster and queues), the SSE decision feed, Prometheus metrics and health probes, behind
//! bearer tokens with roles. It runs no cycles: the engine (`gantry-engine`) does, and publishes
//! in [`gantry_engine::Live`] the read-only view these handlers serve.
//!
//! Data flows in one direction: the engine hands cycles and snapshots to
//! [`gantry_engine::Live`]; handlers read them and the store, and the only thing they change is
//! which policy set the next cycle runs.
//!
//! The routes take and answer the types of `gantry-contract`, the crate the CLI reads them with;
//! the OpenAPI document (`/api/openapi.json`) is derived from those types and the handlers'
//! `#[utoipa::path]` attributes, and a copy is checked in for the web UI's generated types.

mod api;
mod auth;
mod error;
mod listen;
mod openapi;
mod tls;
mod ui;

use std::sync::Arc;

pub use api::{AppState, DoorOptions, IpNet, Peer, router};
pub use auth::{Caller, RequireAdmin, Role, TokenFileError, Tokens};
pub use error::{ApiError, Result};
pub use tls::{TlsConfig, TlsError, TlsListener};

/// Serves the API on `listener` (over TLS when `tls` is given) until `shutdown` resolves,
/// within the connection cap and header-read deadline of the state's [`DoorOptions`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    tls: Option<TlsConfig>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let options = state.options.clone();
    let app = router(state);
    match tls {
        None => listen::serve_connections(listener, app, &options, shutdown).await,
        Some(tls) => {
            let listener = TlsListener::new(listener, &tls)?;
            listen::serve_connections(listener, app, &options, shutdown).await
        }
    }
}
