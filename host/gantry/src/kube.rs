//! Gantry on a live cluster: `gantry serve --kubeconfig FILE` (the simulated serve's API and
//! store, with `gantry-kube` as the cluster source and binder) and `gantry kube create-nodes`
//! (fake GPU nodes from a cluster spec, for the test control plane in `tests/cluster/`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use gantry_core::{
    BindOutcome, ClusterState, NodeTable, Queues, Resources, Scheduler, SchedulerConfig, Symbols,
};
use gantry_engine::Shutdown;
use gantry_engine::{Engine, EngineConfig};
use gantry_kube::nodes::NodeDef;
use gantry_kube::{KubeCluster, KubeConfig, LeaderSettings, TopologyLabel};
use gantry_sim::ClusterSpec;

use crate::serve::{ServerArgs, start_api, start_live};

/// How long to wait for the watch caches' first full list.
const SYNC_TIMEOUT: Duration = Duration::from_secs(60);

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

/// What `gantry serve --kubeconfig` needs from the serve arguments.
pub struct KubeServe {
    pub kubeconfig: PathBuf,
    pub topology_labels: Vec<String>,
    /// PriorityClasses and namespaces whose pods may be balloons (empty names dropped).
    pub balloon_priority_classes: Vec<String>,
    pub balloon_namespaces: Vec<String>,
    pub leader: LeaderArgs,
    pub duration_s: Option<f64>,
    pub no_policies: bool,
    pub listen: SocketAddr,
    pub server: ServerArgs,
    pub plugins: crate::PluginDir,
}

fn kube_config(topology_labels: &[String]) -> anyhow::Result<KubeConfig> {
    let mut config = KubeConfig::default();
    if !topology_labels.is_empty() {
        config.topology = topology_labels
            .iter()
            .map(|t| TopologyLabel::parse(t).map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<_>>()?;
    }
    Ok(config)
}

/// Schedules the cluster of `opts.kubeconfig` until interrupted (or `duration_s`): the one
/// engine loop, with the live cluster as its source and binder.
pub fn serve(opts: KubeServe) -> anyhow::Result<()> {
    let symbols = Symbols::new();
    let mut config = kube_config(&opts.topology_labels)?;
    let named = |names: &[String]| {
        names
            .iter()
            .filter(|n| !n.is_empty())
            .cloned()
            .collect::<std::collections::BTreeSet<String>>()
    };
    config.balloon_priority_classes = named(&opts.balloon_priority_classes);
    config.balloon_namespaces = named(&opts.balloon_namespaces);
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
    let mut cluster = KubeCluster::connect(&opts.kubeconfig, config)?.with_symbols(symbols.clone());
    println!(
        "gantry serve: scheduling pods with schedulerName {scheduler_name} in the cluster of {}; Ctrl-C stops",
        opts.kubeconfig.display()
    );
    println!("{trusted}");
    let (live, tokens) = start_live(
        &opts.server,
        symbols.clone(),
        (!opts.no_policies).then_some(&opts.plugins),
        // A live cluster's scheduler runs in a pod: its output is a log.
        false,
    )?;
    let stop = Shutdown::new();
    let (bound, api) = start_api(live.clone(), tokens, opts.listen, stop.clone())?;
    println!(
        "  API on http://{bound}/api (OpenAPI at /api/openapi.json), data in {}",
        opts.server.data_dir.display()
    );
    // The API and /healthz are up while the caches sync; /readyz says ready once the loop
    // has published its first view, after the sync.
    cluster.wait_synced(SYNC_TIMEOUT)?;
    println!("  watch caches synced: {} nodes", cluster.node_count());
    let leadership = opts.leader.leader_elect.then(|| {
        let settings = LeaderSettings::new(
            &opts.leader.leader_elect_lease_name,
            &opts.leader.leader_elect_namespace,
        );
        println!(
            "  leader election: lease {}/{} as {}",
            settings.namespace, settings.name, settings.identity
        );
        cluster.leader_elect(settings)
    });
    // The first sync builds the node table and queue tree from the caches.
    let scheduler = Scheduler::new(
        ClusterState::new(NodeTable::default()),
        Queues::new(&[], Resources::default(), 600.0)?,
        symbols,
        SchedulerConfig {
            // A pass binds what its cycle placed before the next cycle runs, and waits for the
            // slowest binding of the round: a backlog goes through in few big rounds.
            max_attempts: 5000,
            // Victims are evicted through the Eviction API (see gantry_kube::evict).
            preemption: true,
            ..SchedulerConfig::default()
        },
    );
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
                    println!(
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
    Shutdown::join_by(api, crate::serve::API_PATIENCE);
    println!("gantry serve: stopped after {passes} passes; {bound_pods} pods bound");
    Ok(())
}

#[derive(Args, Debug)]
pub struct CreateNodesArgs {
    /// Cluster spec (the simulator's YAML) whose nodes to create.
    #[arg(long)]
    spec: PathBuf,
    /// The cluster to create them in.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    /// A taint on every node, as KEY=VALUE:EFFECT (repeatable).
    #[arg(long = "taint")]
    taints: Vec<String>,
    /// Node label for a topology level, as LEVEL=LABEL-KEY (repeatable; default
    /// topology.gantry.dev/LEVEL).
    #[arg(long = "topology-label")]
    topology_labels: Vec<String>,
}

fn parse_taint(text: &str) -> anyhow::Result<(String, String, String)> {
    let parsed = text.split_once(':').and_then(|(kv, effect)| {
        let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
        ["NoSchedule", "PreferNoSchedule", "NoExecute"]
            .contains(&effect)
            .then(|| (key.to_string(), value.to_string(), effect.to_string()))
    });
    parsed.ok_or_else(|| {
        anyhow::anyhow!(
            "taint {text:?}: expected KEY=VALUE:EFFECT with EFFECT NoSchedule, PreferNoSchedule or NoExecute"
        )
    })
}

/// The nodes of `spec`, named and labelled as the simulator names them (`h100-0`, rack `rack-0`).
pub fn spec_nodes(spec: &ClusterSpec, taints: &[(String, String, String)]) -> Vec<NodeDef> {
    let symbols = Symbols::new();
    let cluster = spec.build(&symbols);
    let t = &cluster.nodes;
    (0..t.len())
        .map(|i| NodeDef {
            name: symbols.resolve(t.name[i]).to_string(),
            gpus: t.gpu_total[i],
            gpu_type: Some(symbols.resolve(t.gpu_type[i]).to_string()).filter(|s| !s.is_empty()),
            cpu_milli: t.cpu_free_milli[i],
            memory_mib: t.memory_free_mib[i],
            topology: t
                .levels
                .iter()
                .filter(|level| level.node_domain[i] != u32::MAX)
                .map(|level| {
                    let name = symbols.resolve(level.name).to_string();
                    let domain = format!("{name}-{}", level.node_domain[i]);
                    (name, domain)
                })
                .collect(),
            taints: taints.to_vec(),
        })
        .collect()
}

pub fn create_nodes(args: CreateNodesArgs) -> anyhow::Result<()> {
    let spec = ClusterSpec::load(&args.spec)?;
    let taints = args
        .taints
        .iter()
        .map(|t| parse_taint(t))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let config = kube_config(&args.topology_labels)?;
    let nodes: Vec<_> = spec_nodes(&spec, &taints)
        .iter()
        .map(|def| gantry_kube::nodes::node_object(def, &config))
        .collect();
    let total = nodes.len();
    let created = gantry_kube::nodes::create_nodes(&args.kubeconfig, nodes)?;
    println!(
        "{}: {total} nodes ({created} created, {} existed already)",
        spec.name,
        total - created
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_nodes_carry_gpus_type_and_topology() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/clusters/small-64.yaml"
        );
        let spec = ClusterSpec::load(std::path::Path::new(path)).unwrap();
        let nodes = spec_nodes(&spec, &[]);
        assert_eq!(nodes.len(), 64);
        let first = &nodes[0];
        assert_eq!(first.name, "h100-0");
        assert_eq!(first.gpus, 8);
        assert_eq!(first.gpu_type.as_deref(), Some("H100-SXM5-80GB"));
        assert_eq!(
            first.topology,
            [
                ("rack".to_string(), "rack-0".to_string()),
                ("block".to_string(), "block-0".to_string())
            ]
        );
        let last = nodes.last().unwrap();
        assert_eq!((last.name.as_str(), last.gpus), ("l4-15", 4));
        assert_eq!(
            last.topology.len(),
            1,
            "the L4 pool has racks but no blocks"
        );
    }

    #[test]
    fn taints_parse_or_say_what_is_wrong() {
        assert_eq!(
            parse_taint("team=rl:NoSchedule").unwrap(),
            ("team".into(), "rl".into(), "NoSchedule".into())
        );
        assert_eq!(
            parse_taint("team=rl").unwrap_err().to_string(),
            "taint \"team=rl\": expected KEY=VALUE:EFFECT with EFFECT NoSchedule, PreferNoSchedule or NoExecute"
        );
    }
}
