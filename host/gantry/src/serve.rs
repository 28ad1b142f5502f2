//! `gantry serve`: with no cluster configured, a simulated copy of the 7,500-node cluster under a
//! steady synthetic load of single pods and gangs, scheduled continuously by the real core, with
//! the REST API in front. The example Wasm policies are the first active set (kept in the store,
//! so a restart resumes with whatever set was active), and balloon pods hold idle capacity until
//! real work preempts them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use gantry_core::{ClusterState, Scheduler, SchedulerConfig, Symbols};
use gantry_engine::Shutdown;
use gantry_sim::ClusterSpec;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Cluster spec to simulate.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/clusters/openai-like-7500.yaml"))]
    cluster: PathBuf,
    /// Stop after this many seconds (run until interrupted when absent).
    #[arg(long)]
    duration_s: Option<f64>,
    /// Share of the cluster's GPUs the synthetic load asks for on average (its arrival rate
    /// follows from the jobs' mean size and run length), so that pending work stays bounded.
    #[arg(long, default_value_t = 0.9)]
    load: f64,
    /// New jobs per second of the synthetic load, instead of `--load`.
    #[arg(long)]
    jobs_per_s: Option<f64>,
    /// Write the run's figures (GPU allocation, idle GPUs while work waited, pending over
    /// time, attempts per cycle, cycle times) to this JSON file when it stops.
    #[arg(long, value_name = "FILE.json")]
    report: Option<PathBuf>,
    /// Seconds between progress lines.
    #[arg(long, default_value_t = 5.0)]
    log_every_s: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Balloon pods (8 GPUs each, lowest priority) that hold idle capacity and give way when
    /// real work needs it, as OpenAI ran them. By default, enough to hold what the load leaves
    /// idle, plus 15% of the cluster for its swings (big gangs come and go).
    #[arg(long)]
    balloons: Option<u32>,
    /// Schedule with the built-ins only, without the example Wasm policies.
    #[arg(long)]
    no_policies: bool,
    /// Start with an empty cluster, rather than as if the load had been running for a while
    /// (a warm start applies to --load only, never to --jobs-per-s).
    #[arg(long)]
    cold_start: bool,
    /// Stop submitting new work after this many pods (the balloons not counted).
    #[arg(long)]
    max_pods: Option<u64>,
    /// Where the API listens.
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Schedule the live cluster of this kubeconfig (pods with schedulerName gantry) instead
    /// of simulating one; --cluster and the synthetic load are then unused. `in-cluster` uses
    /// the pod's service account (deploy/).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// With --kubeconfig: the node label of a topology level, as LEVEL=LABEL-KEY, innermost
    /// first (repeatable; default nvlink, rack and block under topology.gantry.dev/, then zone).
    #[arg(long = "topology-label", requires = "kubeconfig")]
    topology_labels: Vec<String>,
    /// With --kubeconfig: pods of this PriorityClass labelled gantry.dev/balloon=true are
    /// balloons (preempted first, charged to no queue); the label on any other pod is ignored
    /// (repeatable; an empty value trusts no PriorityClass).
    #[arg(long = "balloon-priority-class", default_value = gantry_kube::config::DEFAULT_BALLOON_PRIORITY_CLASS)]
    balloon_priority_classes: Vec<String>,
    /// With --kubeconfig: pods in this namespace labelled gantry.dev/balloon=true are balloons
    /// whatever their PriorityClass (repeatable; default none).
    #[arg(long = "balloon-namespace", requires = "kubeconfig")]
    balloon_namespaces: Vec<String>,
    #[command(flatten)]
    leader: crate::kube::LeaderArgs,
    #[command(flatten)]
    server: ServerArgs,
    #[command(flatten)]
    plugins: crate::PluginDir,
}

/// Where the server keeps its state and whom it lets in.
#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// The data directory: the sled store (decisions, policies, sets, audit log).
    #[arg(long, env = "GANTRY_DATA_DIR", default_value_os_t = default_data_dir())]
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

/// `$XDG_DATA_HOME/gantry`, else `~/.local/share/gantry`, else `./gantry-data`.
pub fn default_data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_DATA_HOME") {
        return PathBuf::from(dir).join("gantry");
    }
    match std::env::var_os("HOME") {
        Some(home) => PathBuf::from(home).join(".local/share/gantry"),
        None => PathBuf::from("gantry-data"),
    }
}

/// The example policies, the first active set of a new data directory.
const EXAMPLE_POLICIES: [&str; 3] = ["gpu_fit.wasm", "gpu_binpack.wasm", "team_quota.wasm"];

/// Opens the store and the tokens, builds the shared state, and makes the stored active set (or,
/// in a new data directory, the example policies) the one cycles run on.
pub fn start_live(
    server: &ServerArgs,
    symbols: Arc<Symbols>,
    plugins: Option<&crate::PluginDir>,
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
            println!(
                "  wrote {} with a new admin token ({admin}) and viewer token ({viewer})",
                tokens_path.display()
            );
        } else {
            println!(
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
        },
    };
    let mut config = gantry_store::StoreConfig::new(server.data_dir.join("store"));
    config.max_age = Duration::from_secs(server.retention_days * 24 * 3600);
    config.max_bytes = server.retention_mib << 20;
    let store = gantry_store::Store::open(config)?;
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

/// The simulated cluster, ready to schedule: the scheduler, the queues work is submitted to,
/// the cluster's name and its GPU count.
pub struct SimCluster {
    pub scheduler: Scheduler,
    pub leaves: Vec<String>,
    pub name: String,
    pub total_gpus: u64,
}

impl SimCluster {
    pub fn load(path: &std::path::Path, symbols: &Arc<Symbols>) -> anyhow::Result<Self> {
        let spec = ClusterSpec::load(path)?;
        let cluster = spec.build(symbols);
        let leaves = cluster.leaf_queues();
        anyhow::ensure!(
            !leaves.is_empty(),
            "{}: no queues to submit to",
            path.display()
        );
        let total_gpus: u64 = cluster.nodes.gpu_total.iter().map(|&g| u64::from(g)).sum();
        let queues = cluster.queue_tree(600.0)?;
        let config = SchedulerConfig {
            max_attempts: 200,
            ..SchedulerConfig::default()
        };
        let scheduler = Scheduler::new(
            ClusterState::new(cluster.nodes),
            queues,
            symbols.clone(),
            config,
        );
        Ok(Self {
            scheduler,
            leaves,
            name: cluster.name,
            total_gpus,
        })
    }
}

/// The synthetic load and how long to run it.
#[derive(Debug, Clone)]
pub struct Load {
    pub jobs_per_s: f64,
    pub seed: u64,
    pub balloons: u32,
    pub max_pods: Option<u64>,
    /// Start as if the load had been running (see `SyntheticConfig::warm_start`).
    pub warm_start: bool,
    pub duration_s: Option<f64>,
    /// Progress lines on stdout every so often; `None` is quiet.
    pub log_every_s: Option<f64>,
}

/// What a run did, for the last line.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoopSummary {
    pub submitted: u64,
    pub pods_submitted: u64,
    pub placed: u64,
    pub finished: u64,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    if let Some(kubeconfig) = args.kubeconfig {
        return crate::kube::serve(crate::kube::KubeServe {
            kubeconfig,
            topology_labels: args.topology_labels,
            balloon_priority_classes: args.balloon_priority_classes,
            balloon_namespaces: args.balloon_namespaces,
            leader: args.leader,
            duration_s: args.duration_s,
            no_policies: args.no_policies,
            listen: args.listen,
            server: args.server,
            plugins: args.plugins,
        });
    }
    let symbols = Symbols::new();
    let sim = SimCluster::load(&args.cluster, &symbols)?;
    println!(
        "gantry serve: simulating {} ({} nodes, {} GPUs) under synthetic load; Ctrl-C stops",
        sim.name,
        sim.scheduler.state.len(),
        sim.total_gpus
    );
    let (live, door) = start_live(
        &args.server,
        symbols.clone(),
        (!args.no_policies).then_some(&args.plugins),
        true,
    )?;
    let stop = Shutdown::new();
    let (bound, api) = start_api(live.clone(), door, args.listen, stop.clone())?;
    let jobs_per_s = args
        .jobs_per_s
        .unwrap_or_else(|| gantry_sim::SyntheticConfig::rate_for(args.load, sim.total_gpus));
    let share = jobs_per_s / gantry_sim::SyntheticConfig::rate_for(1.0, sim.total_gpus);
    let balloons = args.balloons.unwrap_or_else(|| {
        ((1.0 - share + 0.15).max(0.15) * sim.total_gpus as f64 / 8.0).ceil() as u32
    });
    let names: Vec<String> = live
        .active_set()
        .entries()
        .iter()
        .map(|e| e.policy.info().name.clone())
        .collect();
    println!(
        "  API on {}://{bound}/api (OpenAPI at /api/openapi.json), data in {}",
        args.server.scheme(),
        args.server.data_dir.display()
    );
    println!(
        "  policies: {} (set version {}); {} balloon pods hold idle capacity",
        if names.is_empty() {
            "built-ins only".to_string()
        } else {
            names.join(", ")
        },
        live.active_set().version(),
        balloons
    );
    println!(
        "  synthetic load: {jobs_per_s:.2} jobs/s (about {:.0}% of the GPUs on average)",
        100.0 * share
    );
    let load = Load {
        jobs_per_s,
        seed: args.seed,
        balloons,
        max_pods: args.max_pods,
        // A warm start brings in the last few minutes of arrivals at once: sized for the
        // steady load of --load, not for an overload asked with --jobs-per-s.
        warm_start: !args.cold_start && args.jobs_per_s.is_none(),
        duration_s: args.duration_s,
        log_every_s: Some(args.log_every_s),
    };
    let (summary, stats) = run_loop(sim, live.clone(), &stop, &load);
    stop.trigger();
    if let Some(path) = &args.report {
        std::fs::write(path, serde_json::to_string_pretty(&stats)? + "\n")
            .map_err(|e| anyhow::anyhow!("{}: cannot write the report: {e}", path.display()))?;
        println!(
            "  report in {}: GPU allocation {:.1}% ({:.1}% by work) after the first {:.0} s; idle while wanted {:.2}%; pending mean {:.0} (minutes 2-5) and {:.0} (last 5 minutes); cycle p50 {:.1} ms, p99 {:.1} ms",
            path.display(),
            stats.gpu_allocation * 100.0,
            stats.gpu_allocation_by_work * 100.0,
            stats.warmup_s,
            stats.idle_while_wanted * 100.0,
            stats.pending_mean_minutes_2_5,
            stats.pending_mean_last_5_minutes,
            stats.cycle_ms_p50,
            stats.cycle_ms_p99
        );
    }
    live.store.flush()?;
    Shutdown::join_by(api, API_PATIENCE);
    println!(
        "gantry serve: stopped after {} jobs ({} pods) submitted, {} placed, {} finished; {} cycle failures",
        summary.submitted,
        summary.pods_submitted,
        summary.placed,
        summary.finished,
        live.metrics.cycle_failures.get()
    );
    Ok(())
}

/// Schedules the simulated cluster under `load` through the engine until the duration ends or
/// `stop` is triggered; what it did, and the run's figures.
pub fn run_loop(
    sim: SimCluster,
    live: Arc<gantry_engine::Live>,
    stop: &Shutdown,
    load: &Load,
) -> (LoopSummary, gantry_engine::RunStats) {
    let SimCluster {
        scheduler,
        leaves,
        name,
        total_gpus,
    } = sim;
    let mut world = gantry_sim::SyntheticLoad::new(
        &scheduler,
        &leaves,
        gantry_sim::SyntheticConfig {
            jobs_per_s: load.jobs_per_s,
            seed: load.seed,
            balloons: load.balloons,
            max_pods: load.max_pods,
            warm_start: load.warm_start,
        },
    );
    let mut engine = gantry_engine::Engine::new(
        live,
        scheduler,
        gantry_engine::EngineConfig {
            cluster_name: name,
            ..gantry_engine::EngineConfig::default()
        },
    );
    let mut next_log = load.log_every_s.unwrap_or(f64::INFINITY);
    let (mut placed, mut preempted, mut decisions) = (0u64, 0u64, 0u64);
    let mut cycle_time = Duration::ZERO;
    let (mut submitted, mut pods_submitted, mut finished) = (0u64, 0u64, 0u64);
    engine.run(
        &mut world,
        stop,
        load.duration_s,
        &mut |engine, now, pass| {
            let scheduler = engine.scheduler();
            placed += pass
                .outcomes
                .iter()
                .filter(|o| matches!(o, gantry_core::BindOutcome::Bound { job } if scheduler.get(*job).is_some_and(|s| !s.balloon)))
                .count() as u64;
            preempted += pass.output.evicted.len() as u64;
            decisions += pass.output.decisions.len() as u64;
            cycle_time += pass.cycle_time;
            submitted += u64::from(pass.changes.submitted);
            pods_submitted += pass.changes.submitted_pods;
            finished += u64::from(pass.changes.ended);
            if now < next_log {
                return;
            }
            let free: u64 = scheduler.state.pods_fit(1);
            let allocated = total_gpus.saturating_sub(free);
            let balloons_running = scheduler
                .running()
                .filter(|&id| scheduler.job(id).balloon)
                .count();
            let pending = scheduler
                .pending()
                .into_iter()
                .filter(|&id| !scheduler.job(id).balloon)
                .count();
            println!(
                "t={now:>6.0}s  submitted {}  placed {placed}  finished {}  pending {pending}  balloons running {balloons_running}  preempted {preempted}  GPUs allocated {:.1}% ({:.1}% by work)  {:.0} decisions/s of cycle time  set v{}",
                submitted,
                finished,
                allocated as f64 * 100.0 / total_gpus.max(1) as f64,
                allocated.saturating_sub(8 * balloons_running as u64) as f64 * 100.0
                    / total_gpus.max(1) as f64,
                decisions as f64 / cycle_time.as_secs_f64().max(1e-9),
                engine.live().active_set().version(),
            );
            next_log += load.log_every_s.unwrap_or(f64::INFINITY);
        },
    );
    engine.publish();
    let stats = engine.stats();
    (
        LoopSummary {
            submitted,
            pods_submitted,
            placed,
            finished,
        },
        stats,
    )
}
