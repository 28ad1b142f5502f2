//! `gantry serve --kubeconfig FILE`: the simulated serve's API and store, with `gantry-kube` as
//! the cluster source and binder.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use gantry_core::{
    BindOutcome, ClusterState, NodeTable, Queues, Resources, RestartBy, Scheduler, SchedulerConfig,
    Symbols,
};
use gantry_engine::{Engine, EngineConfig, Shutdown};
use gantry_kube::{KubeCluster, LeaderSettings};

use crate::kube::kube_config;

use super::{API_PATIENCE, ServeArgs, start_api, start_live};

/// How long to wait for the watch caches' first full list.
const SYNC_TIMEOUT: Duration = Duration::from_secs(60);

/// The flags of `gantry serve` for a live cluster.
#[derive(Args, Debug)]
pub struct KubeArgs {
    /// Schedule the live cluster of this kubeconfig (pods with schedulerName gantry) instead
    /// of simulating one; --cluster and the synthetic load are then unused. `in-cluster` uses
    /// the pod's service account (deploy/).
    #[arg(long)]
    pub(super) kubeconfig: Option<PathBuf>,
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
    /// With --kubeconfig: which node conditions, taints and DRA device taints mean a node is
    /// failing (YAML: `signals:` and the lifecycle's knobs; see README "Node health"). A
    /// suspect signal cordons the node and stops its gangs whole, through the Eviction API;
    /// their recreated pods go first, avoiding the node. Default: none beyond Ready and
    /// cordons.
    #[arg(long, requires = "kubeconfig")]
    health_config: Option<PathBuf>,
    #[command(flatten)]
    leader: LeaderArgs,
}

/// Leader election flags of `gantry serve --kubeconfig` (kube-scheduler's names).
#[derive(Args, Debug, Clone)]
pub struct LeaderArgs {
    /// With --kubeconfig: hold a coordination.k8s.io Lease to schedule; replicas without it
    /// keep their caches warm and serve the API read-only until it is free.
    #[arg(long, requires = "kubeconfig")]
    pub leader_elect: bool,
    /// The Lease's name.
    #[arg(long, default_value = "gantry")]
    pub leader_elect_lease_name: String,
    /// The Lease's namespace (in a pod, set POD_NAMESPACE from the downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub leader_elect_namespace: String,
}

/// Schedules the cluster of `kubeconfig` until interrupted (or `duration_s`): the one engine
/// loop, with the live cluster as its source and binder.
pub(super) fn serve(kubeconfig: PathBuf, opts: ServeArgs) -> anyhow::Result<()> {
    let kube = &opts.kube;
    let symbols = Symbols::new();
    let mut config = kube_config(&kube.topology_labels)?;
    let named = |names: &[String]| {
        names
            .iter()
            .filter(|n| !n.is_empty())
            .cloned()
            .collect::<std::collections::BTreeSet<String>>()
    };
    config.balloon_priority_classes = named(&kube.balloon_priority_classes);
    config.balloon_namespaces = named(&kube.balloon_namespaces);
    if let Some(path) = &kube.health_config {
        let text = std::fs::read_to_string(path).map_err(|e| {
            anyhow::anyhow!("cannot read the health config {}: {e}", path.display())
        })?;
        config.health = gantry_kube::health::HealthSignals::parse(&text)
            .map_err(|e| anyhow::anyhow!("health config {}: {e}", path.display()))?;
    }
    let lifecycle = config.health.lifecycle.clone();
    let signals = config.health.signals.len();
    let preflight = config.health.preflight.clone();
    let scheduler_name = config.scheduler_name.clone();
    let list = |names: &std::collections::BTreeSet<String>| {
        if names.is_empty() {
            "none".to_string()
        } else {
            names.iter().cloned().collect::<Vec<_>>().join(", ")
        }
    };
    let trusted = format!(
        "  balloons (label gantry.dev/balloon) trusted from PriorityClass {} and namespace {}",
        list(&config.balloon_priority_classes),
        list(&config.balloon_namespaces)
    );
    let mut cluster = KubeCluster::connect(&kubeconfig, config)?.with_symbols(symbols.clone());
    outln!(
        "gantry serve: scheduling pods with schedulerName {scheduler_name} in the cluster of {}; Ctrl-C stops",
        kubeconfig.display()
    );
    outln!("{trusted}");
    if signals > 0 {
        outln!(
            "  health: {signals} node signal(s) read; suspect nodes are cordoned and their gangs stopped whole (breaker at {}% of nodes out or {} cordons an hour)",
            lifecycle.max_out_share * 100.0,
            lifecycle.max_cordons_per_hour
        );
    }
    match &preflight {
        Some(t) => outln!(
            "  preflight: nodes tainted {} run {} in namespace {} (at most {} s) before they take work",
            gantry_kube::preflight::PREFLIGHT_TAINT,
            t.image,
            t.namespace,
            t.timeout_s
        ),
        None => outln!(
            "  preflight: none configured; nodes tainted {} wait until something removes the taint",
            gantry_kube::preflight::PREFLIGHT_TAINT
        ),
    }
    let (live, tokens) = start_live(
        &opts.server,
        symbols.clone(),
        (!opts.no_policies).then_some(&opts.plugins),
        // A live cluster's scheduler runs in a pod: its output is a log.
        false,
    )?;
    let stop = Shutdown::new();
    let (bound, api) = start_api(live.clone(), tokens, opts.listen, stop.clone())?;
    outln!(
        "  API on http://{bound}/api (OpenAPI at /api/openapi.json), data in {}",
        opts.server.data_dir.display()
    );
    // The API and /healthz are up while the caches sync; /readyz says ready once the loop
    // has published its first view, after the sync.
    cluster.wait_synced(SYNC_TIMEOUT)?;
    outln!("  watch caches synced: {} nodes", cluster.node_count());
    let leadership = kube.leader.leader_elect.then(|| {
        let settings = LeaderSettings::new(
            &kube.leader.leader_elect_lease_name,
            &kube.leader.leader_elect_namespace,
        );
        outln!(
            "  leader election: lease {}/{} as {}",
            settings.namespace,
            settings.name,
            settings.identity
        );
        cluster.leader_elect(settings)
    });
    // The first sync builds the node table and queue tree from the caches.
    let mut scheduler = Scheduler::new(
        ClusterState::new(NodeTable::default()),
        Queues::new(&[], Resources::default(), 600.0)?,
        symbols,
        SchedulerConfig {
            // A pass binds what its cycle placed before the next cycle runs, and waits for the
            // slowest binding of the round: a backlog goes through in few big rounds.
            max_attempts: 5000,
            // Victims are evicted through the Eviction API (see gantry_kube::evict).
            preemption: true,
            // A stopped gang's pods are evicted; their controller recreates them.
            restart: RestartBy::Recreated,
            ..SchedulerConfig::default()
        },
    );
    scheduler.lifecycle_mut().config = lifecycle;
    opts.rule.set_on(&mut scheduler)?;
    let mut engine = Engine::new(
        live.clone(),
        scheduler,
        EngineConfig {
            cluster_name: "kube".into(),
            ..EngineConfig::default()
        },
    );
    let (mut passes, mut bound_pods) = (0u64, 0u64);
    let mut leading = None;
    engine.run(
        &mut cluster,
        &stop,
        opts.duration_s,
        &mut |engine, _now, pass| {
            passes += 1;
            let scheduler = engine.scheduler();
            bound_pods += pass
                .outcomes
                .iter()
                .filter_map(|o| match o {
                    BindOutcome::Bound { job } => scheduler.get(*job).map(|s| u64::from(s.pods)),
                    _ => None,
                })
                .sum::<u64>();
            if let Some(leadership) = &leadership {
                let now_leading = leadership.is_leader();
                if leading != Some(now_leading) {
                    leading = Some(now_leading);
                    outln!(
                        "  {} ({})",
                        if now_leading { "leading" } else { "following" },
                        leadership.holder().unwrap_or_default()
                    );
                }
            }
        },
    );
    stop.trigger();
    cluster.resign();
    live.store.flush()?;
    Shutdown::join_by(api, API_PATIENCE);
    outln!("gantry serve: stopped after {passes} passes; {bound_pods} pods bound");
    Ok(())
}
