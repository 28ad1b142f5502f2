//! `gantry serve`: with no cluster configured, a simulated copy of the 7,500-node cluster under a
//! steady synthetic load of single pods and gangs, scheduled continuously by the real core, with
//! the REST API in front. The example Wasm policies are the first active set (kept in the store,
//! so a restart resumes with whatever set was active), and balloon pods hold idle capacity until
//! real work preempts them.
//!
//! Its parts: `server` (the store, the tokens and the API, shared by both modes), `sim` (the
//! simulated cluster and its synthetic load) and `kube` (a live cluster, `--kubeconfig`).
//! [`run`] is the one front door: the same flags, the cluster source and binder chosen by
//! `--kubeconfig`.

mod kube;
mod server;
mod sim;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

pub use server::{API_PATIENCE, ServerArgs, start_api, start_live};
pub use sim::{Load, SimCluster, run_loop};

/// The flags of `gantry serve`, both modes: those of the simulated cluster, of a live one
/// (`kube`), of the server and of the policies.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Cluster spec to simulate. By default the 7,500-node spec, `shared/clusters/openai-like-7500.yaml`,
    /// looked for at run time beside or above the working directory (see [`DEFAULT_CLUSTER`]).
    #[arg(long)]
    cluster: Option<PathBuf>,
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
    /// Node failures in the simulated cluster: `on` (the default: a node fails every few
    /// minutes, far faster than real fleets, so the lifecycle shows), `off`, or a failure
    /// model file (YAML, as a cluster spec's `failures:` section). Refused with
    /// --kubeconfig: a live cluster's nodes fail by themselves, and a flag silently ignored
    /// would let someone believe they are testing failures.
    #[arg(long, value_name = "on|off|FILE.yaml", conflicts_with = "kubeconfig")]
    failures: Option<String>,
    /// Stop submitting new work after this many pods (the balloons not counted).
    #[arg(long)]
    max_pods: Option<u64>,
    /// Where the API listens.
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    #[command(flatten)]
    rule: crate::rule_args::RuleArgs,
    #[command(flatten)]
    kube: kube::KubeArgs,
    #[command(flatten)]
    server: ServerArgs,
    #[command(flatten)]
    plugins: crate::policy::PluginDir,
}

/// The spec `gantry serve` simulates when no `--cluster` is given: the shared 7,500-node one,
/// which lives outside the repository (in the `shared/` beside a checkout), so it is found at
/// run time, never baked in as the build machine's path.
pub const DEFAULT_CLUSTER: &str = "shared/clusters/openai-like-7500.yaml";

/// Where the default cluster spec is: `DEFAULT_CLUSTER` under `start` or the nearest directory
/// above it that has one (so `../shared/…` from a checkout), or the error naming every
/// directory looked in.
pub fn find_default_cluster(start: &std::path::Path) -> anyhow::Result<PathBuf> {
    let mut looked = Vec::new();
    for dir in start.ancestors() {
        let candidate = dir.join(DEFAULT_CLUSTER);
        if candidate.is_file() {
            return Ok(candidate);
        }
        looked.push(dir.display().to_string());
    }
    anyhow::bail!(
        "no --cluster given, and no {DEFAULT_CLUSTER} under {}: pass --cluster FILE.yaml",
        looked.join(", ")
    )
}

/// `gantry serve`: a live cluster with `--kubeconfig`, else the simulated one.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    match args.kube.kubeconfig.clone() {
        Some(kubeconfig) => kube::serve(kubeconfig, args),
        None => sim::serve(args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cluster_is_found_above_the_working_directory_or_refused_naming_where() {
        let root = tempfile::tempdir().unwrap();
        let checkout = root.path().join("main/host");
        std::fs::create_dir_all(&checkout).unwrap();
        let error = find_default_cluster(&checkout).unwrap_err().to_string();
        assert!(
            error.contains(&checkout.display().to_string())
                && error.contains(&root.path().display().to_string())
                && error.contains("pass --cluster"),
            "{error}"
        );
        let spec = root.path().join(DEFAULT_CLUSTER);
        std::fs::create_dir_all(spec.parent().unwrap()).unwrap();
        std::fs::write(&spec, "name: x\n").unwrap();
        assert_eq!(find_default_cluster(&checkout).unwrap(), spec);
    }

    /// `gantry serve`'s flags alone, as the binary parses them.
    #[derive(clap::Parser, Debug)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    #[test]
    fn failures_with_a_kubeconfig_are_refused_naming_both_flags() {
        use clap::Parser;
        // Refused in either order, as a usage error (exit 2), naming both flags.
        for argv in [
            ["serve", "--kubeconfig", "k.yaml", "--failures", "on"],
            ["serve", "--failures", "on", "--kubeconfig", "k.yaml"],
        ] {
            let error = Serve::try_parse_from(argv).unwrap_err();
            assert_eq!(error.kind(), clap::error::ErrorKind::ArgumentConflict);
            assert_eq!(error.exit_code(), 2);
            let text = error.to_string();
            assert!(
                text.starts_with("error: the argument '--")
                    && text.contains(" cannot be used with '--")
                    && text.contains("'--failures <on|off|FILE.yaml>'")
                    && text.contains("'--kubeconfig <KUBECONFIG>'"),
                "{text}"
            );
        }
        // Either alone is fine, and the demo's failures stay on unless asked otherwise.
        let sim = Serve::try_parse_from(["serve"]).unwrap();
        assert_eq!(sim.args.failures, None);
        assert!(Serve::try_parse_from(["serve", "--kubeconfig", "k.yaml"]).is_ok());
        assert!(Serve::try_parse_from(["serve", "--failures", "off"]).is_ok());
    }
}
