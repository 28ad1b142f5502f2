//! `gantry kube`: commands on a live cluster's objects. `create-nodes` makes fake GPU nodes
//! from a cluster spec, for the test control plane in `tests/cluster/` (`gantry serve
//! --kubeconfig` lives in `serve/kube.rs`).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use gantry_core::Symbols;
use gantry_kube::nodes::NodeDef;
use gantry_kube::{KubeConfig, TopologyLabel};
use gantry_sim::ClusterSpec;

/// The subcommands of `gantry kube`.
#[derive(Subcommand)]
pub enum KubeCommand {
    /// Create fake GPU nodes (for kwok) from a cluster spec, with topology labels.
    CreateNodes(CreateNodesArgs),
    /// Benchmark: create the workload of tests/cluster/bench.sh (single pods and PodGroup gangs).
    BenchPods(crate::bench::cluster::BenchPodsArgs),
    /// Benchmark: start a scheduler once the workload exists and time its bindings (JSON).
    BenchWatch(crate::bench::cluster::BenchWatchArgs),
    /// Benchmark: bind the workload to nodes decided up front, with no scheduling (the ceiling).
    BenchBind(crate::bench::cluster::BenchBindArgs),
}

/// Runs one `gantry kube` command.
pub fn run(command: KubeCommand) -> anyhow::Result<()> {
    match command {
        KubeCommand::CreateNodes(args) => create_nodes(args),
        KubeCommand::BenchPods(args) => crate::bench::cluster::pods(args),
        KubeCommand::BenchWatch(args) => crate::bench::cluster::watch(args),
        KubeCommand::BenchBind(args) => crate::bench::cluster::bind(args),
    }
}

/// The cluster configuration with the topology labels given as LEVEL=LABEL-KEY (the defaults
/// when none are).
pub(crate) fn kube_config(topology_labels: &[String]) -> anyhow::Result<KubeConfig> {
    let mut config = KubeConfig::default();
    if !topology_labels.is_empty() {
        config.topology = topology_labels
            .iter()
            .map(|t| TopologyLabel::parse(t).map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<_>>()?;
    }
    Ok(config)
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
    outln!(
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
