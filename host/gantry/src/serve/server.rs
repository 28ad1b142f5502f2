//! What both modes of `gantry serve` share: the data directory and the tokens ([`ServerArgs`]),
//! the shared state with its first active set ([`start_live`]) and the API ([`start_api`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use gantry_core::Symbols;
use gantry_engine::Shutdown;

/// Where the server keeps its state and whom it lets in.
#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// The data directory: the sled store (decisions, policies, sets, audit log).
    #[arg(long, env = "GANTRY_DATA_DIR", default_value_os_t = crate::data_dir::default_data_dir())]
    pub data_dir: PathBuf,
    /// Bearer tokens with roles (YAML). Defaults to `tokens.yaml` in the data directory, written
    /// with a fresh admin and viewer token on first start.
    #[arg(long, env = "GANTRY_TOKENS")]
    pub tokens: Option<PathBuf>,
    /// Largest accepted policy upload, in MiB: room for a componentize-py policy (18 MB).
    #[arg(long, default_value_t = 32)]
    pub max_upload_mib: usize,
    /// Decision history kept: at most this many days…
    #[arg(long, default_value_t = 30)]
    pub retention_days: u64,
    /// …and at most this many MiB.
    #[arg(long, default_value_t = 1024)]
    pub retention_mib: u64,
    /// Serve the API over TLS with this PEM certificate chain (leaf first); needs --tls-key.
    #[arg(long, requires = "tls_key", value_name = "CERT.pem")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert", value_name = "KEY.pem")]
    pub tls_key: Option<PathBuf>,
    /// Ask for a bearer token (any role) on /metrics too; give Prometheus a viewer token.
    #[arg(long)]
    pub metrics_need_token: bool,
    /// A proxy (address or CIDR) whose X-Forwarded-For names the client in the audit log;
    /// repeatable. From any other peer the header is ignored.
    #[arg(long = "trusted-proxy", value_name = "CIDR")]
    pub trusted_proxies: Vec<gantry_server::IpNet>,
    /// Wall time one scheduling cycle's policy calls may take; jobs the cycle has not reached
    /// when it is spent go first next cycle.
    #[arg(long, default_value_t = 250)]
    pub policy_budget_ms: u64,
}

impl ServerArgs {
    /// `https` with --tls-cert, else `http`: how to reach the API.
    pub fn scheme(&self) -> &'static str {
        if self.tls_cert.is_some() {
            "https"
        } else {
            "http"
        }
    }
}

/// The API's front door as the flags set it up: the tokens, TLS, proxies and /metrics.
pub struct FrontDoor {
    tokens: gantry_server::Tokens,
    tls: Option<gantry_server::TlsConfig>,
    options: gantry_server::DoorOptions,
}

/// The example policies, the first active set of a new data directory.
const EXAMPLE_POLICIES: [&str; 3] = ["gpu_fit.wasm", "gpu_binpack.wasm", "team_quota.wasm"];

/// Opens the store and the tokens, builds the shared state, and makes the stored active set (or,
/// in a new data directory, the example policies) the one cycles run on.
pub fn start_live(
    server: &ServerArgs,
    symbols: Arc<Symbols>,
    plugins: Option<&crate::policy::PluginDir>,
    print_tokens: bool,
) -> anyhow::Result<(Arc<gantry_engine::Live>, FrontDoor)> {
    let tokens_path = server
        .tokens
        .clone()
        .unwrap_or_else(|| server.data_dir.join("tokens.yaml"));
    if server.tokens.is_none() && !tokens_path.exists() {
        let (admin, viewer) = gantry_server::Tokens::generate(&tokens_path)?;
        // The tokens themselves go only to a person at a terminal running the local demo:
        // never into a log a container runtime or CI keeps.
        use std::io::IsTerminal;
        if print_tokens && std::io::stdout().is_terminal() {
            outln!(
                "  wrote {} with a new admin token ({admin}) and viewer token ({viewer})",
                tokens_path.display()
            );
        } else {
            outln!(
                "  wrote {} with a new admin token and viewer token (read them there)",
                tokens_path.display()
            );
        }
    }
    let tokens = gantry_server::Tokens::load(&tokens_path)?;
    let tls = match (&server.tls_cert, &server.tls_key) {
        (Some(cert), Some(key)) => Some(gantry_server::TlsConfig::load(cert, key)?),
        _ => None,
    };
    let door = FrontDoor {
        tokens,
        tls,
        options: gantry_server::DoorOptions {
            trusted_proxies: server.trusted_proxies.clone(),
            metrics_need_token: server.metrics_need_token,
            ..gantry_server::DoorOptions::default()
        },
    };
    let mut config = gantry_store::StoreConfig::new(server.data_dir.join("store"));
    config.max_age = Duration::from_secs(server.retention_days * 24 * 3600);
    config.max_bytes = server.retention_mib << 20;
    let store = gantry_store::Store::open(config)?;
    if let Some(damage) = store.history_damage() {
        // Scheduling goes on with a new history; /readyz and /metrics say so too.
        tracing::error!(path = %damage.path, moved_to = %damage.moved_to, error = %damage.error, "{damage}");
    }
    let engine = Arc::new(gantry_policy::PolicyEngine::new(
        gantry_policy::Limits::default(),
        symbols,
    )?);
    let live = gantry_engine::Live::new(
        store.clone(),
        engine,
        gantry_policy::PolicySet::new(0, Vec::new()),
        gantry_engine::LiveConfig {
            max_upload_bytes: server.max_upload_mib << 20,
            policy_budget: Duration::from_millis(server.policy_budget_ms),
            ..gantry_engine::LiveConfig::default()
        },
    );
    let system = gantry_store::Actor::new("gantry", "startup");
    let version = match (store.active()?, plugins) {
        (Some(set), _) => Some(set.version),
        (None, Some(plugins)) => {
            let mut entries = Vec::new();
            for file in EXAMPLE_POLICIES {
                let bytes = std::fs::read(plugins.resolve(file)?)?;
                let upload = live.upload(&system, &bytes, "{}", None)?;
                entries.push(gantry_store::SetEntry {
                    sha256: upload.manifest.sha256,
                    weight: 1,
                    failure: gantry_store::FailurePolicy::Default,
                    config: "{}".into(),
                    deadline_ms: None,
                });
            }
            let set = store.put_set(
                &gantry_store::Actor::new("gantry", "startup"),
                entries,
                "the example policies",
                gantry_engine::now_ms(),
            )?;
            Some(set.version)
        }
        (None, None) => None,
    };
    if let Some(version) = version {
        live.activate(&system, version, false)?;
    }
    Ok((live, door))
}

/// How long a stopping process waits for the API server: its graceful shutdown waits for open
/// connections, and a live-feed subscriber never closes its own.
pub const API_PATIENCE: Duration = Duration::from_secs(3);

/// Runs the API on `listen` in a background runtime until `stop` is triggered; Ctrl-C and
/// SIGTERM trigger it.
pub fn start_api(
    live: Arc<gantry_engine::Live>,
    door: FrontDoor,
    listen: SocketAddr,
    stop: Shutdown,
) -> anyhow::Result<(SocketAddr, std::thread::JoinHandle<()>)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("gantry-api")
        .enable_all()
        .build()?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(listen))
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot listen on {listen}: {e} (pass --listen to choose another address)"
            )
        })?;
    let bound = listener.local_addr()?;
    let state = gantry_server::AppState::new(live, door.tokens, door.options);
    let tls = door.tls;
    let handle = std::thread::Builder::new()
        .name("gantry-api".into())
        .spawn(move || {
            runtime.block_on(async move {
                let shutdown = async move {
                    let mut term =
                        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                            .ok();
                    let terminated = async {
                        match term.as_mut() {
                            Some(term) => {
                                term.recv().await;
                            }
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => {}
                        _ = terminated => {}
                        _ = stop.triggered() => {}
                    }
                    stop.trigger();
                };
                if let Err(error) = gantry_server::serve(listener, state, tls, shutdown).await {
                    tracing::error!(%error, "the API server stopped");
                }
            });
        })?;
    Ok((bound, handle))
}
