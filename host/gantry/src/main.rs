//! The `gantry` binary: wires the crates together behind one clap CLI. `anyhow` lives here and
//! only here; every library crate reports its own typed errors.

mod bench;
mod client;
mod compose;
mod kube;
mod policy_test;
mod sample;
mod scaffold;
mod serve;
mod simulate;
mod validate;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "gantry",
    version,
    about = "A GPU scheduler for Kubernetes with sandboxed WebAssembly policies"
)]
struct Cli {
    /// Log as JSON lines instead of text.
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Work with policy components.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Measure Gantry and print the figures.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Run Gantry. With no cluster configured: a simulated 7,500-node cluster under load.
    Serve(Box<serve::ServeArgs>),
    /// Replay a job trace on a simulated cluster and report waits, allocation and gangs.
    Simulate(simulate::SimulateArgs),
    /// Ask a running server why a pod or job is pending, or where it went.
    Explain(client::ExplainArgs),
    /// When a job of this shape would start, without submitting it, and what would start
    /// sooner (fewer GPUs per pod, fewer pods, another queue or GPU type).
    Whatif(client::WhatIfArgs),
    /// Work with a live cluster's objects.
    #[command(subcommand)]
    Kube(KubeCommand),
}

#[derive(Subcommand)]
enum KubeCommand {
    /// Create fake GPU nodes (for kwok) from a cluster spec, with topology labels.
    CreateNodes(kube::CreateNodesArgs),
    /// Benchmark: create the workload of tests/cluster/bench.sh (single pods and PodGroup gangs).
    BenchPods(bench::cluster::BenchPodsArgs),
    /// Benchmark: start a scheduler once the workload exists and time its bindings (JSON).
    BenchWatch(bench::cluster::BenchWatchArgs),
    /// Benchmark: bind the workload to nodes decided up front, with no scheduling (the ceiling).
    BenchBind(bench::cluster::BenchBindArgs),
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Write a new policy project (Rust, Python or JavaScript) that builds outside this
    /// repository, with a case folder it passes.
    New(scaffold::NewArgs),
    /// Compile a policy, check its world, run init with its config and one sample evaluation.
    Validate(validate::ValidateArgs),
    /// Run a folder of case files against a policy and show where its answers differ.
    Test(policy_test::TestArgs),
    /// Upload a policy to a running server and create a set version with it (not active).
    Push(client::PushArgs),
    /// List the server's policies and set versions (`*` marks the active one).
    List(client::ConnArgs),
    /// Create a set version from an earlier one: add, replace or remove policies, and set
    /// their weights, configs, failure policies and deadlines.
    Compose(client::ComposeArgs),
    /// Make a set version active: the next cycle runs on it.
    Activate(client::VersionArgs),
    /// Roll back to an earlier set version.
    Rollback(client::VersionArgs),
    /// Shadow mode: run a set version beside the active one, binding nothing.
    #[command(subcommand)]
    Shadow(client::ShadowCommand),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Cost per node of the Wasm example policies against their native Rust twins.
    Policy(bench::PolicyBenchArgs),
    /// Scheduling decisions per second and latency, with the example policies active.
    Schedule(bench::ScheduleBenchArgs),
    /// Batched decision-record writes per second into the sled store.
    Store(bench::StoreBenchArgs),
    /// How soon an activated policy set takes effect, over the API, under load.
    Activate(bench::activate::ActivateBenchArgs),
    /// Cycle latency with a faulting policy (active, then in shadow) and during uploads.
    Faults(bench::faults::FaultsBenchArgs),
}

/// Where the policies built from `plugins/` are found.
#[derive(Args, Clone, Debug)]
pub struct PluginDir {
    /// Folder holding the built example policies (`gpu_fit.wasm`, …). Defaults to
    /// $GANTRY_PLUGIN_DIR, then the `wasm32-wasip2/plugin` folder beside this binary's target.
    #[arg(long, env = "GANTRY_PLUGIN_DIR")]
    pub plugin_dir: Option<PathBuf>,
}

impl PluginDir {
    pub fn resolve(&self, file: &str) -> anyhow::Result<PathBuf> {
        let dir = match &self.plugin_dir {
            Some(dir) => dir.clone(),
            None => {
                let exe = std::env::current_exe()?;
                // target/<profile>/gantry → target/wasm32-wasip2/plugin
                let target = exe
                    .parent()
                    .and_then(|profile| profile.parent())
                    .ok_or_else(|| anyhow::anyhow!("cannot locate the target folder"))?;
                target.join("wasm32-wasip2/plugin")
            }
        };
        let path = dir.join(file);
        anyhow::ensure!(
            path.exists(),
            "{} not found: build the example policies with scripts/build-plugins.sh, or pass --plugin-dir",
            path.display()
        );
        Ok(path)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_json);
    let result = match cli.command {
        Command::Policy(PolicyCommand::Validate(args)) => validate::run(args),
        Command::Policy(PolicyCommand::Test(args)) => policy_test::run(args),
        Command::Policy(PolicyCommand::Push(args)) => client::push(args),
        Command::Policy(PolicyCommand::List(args)) => client::list(args),
        Command::Policy(PolicyCommand::Compose(args)) => client::compose(args),
        Command::Policy(PolicyCommand::New(args)) => scaffold::run(args),
        Command::Policy(PolicyCommand::Activate(args)) => client::switch(args, false),
        Command::Policy(PolicyCommand::Rollback(args)) => client::switch(args, true),
        Command::Policy(PolicyCommand::Shadow(command)) => client::shadow(command),
        Command::Explain(args) => client::explain(args),
        Command::Whatif(args) => client::what_if(args),
        Command::Bench(BenchCommand::Policy(args)) => {
            bench::run_policy(args).map(|()| ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Activate(args)) => {
            bench::activate::run(args).map(|()| ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Faults(args)) => {
            bench::faults::run(args).map(|()| ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Store(args)) => {
            bench::run_store(args).map(|()| ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Schedule(args)) => {
            bench::run_schedule(args).map(|()| ExitCode::SUCCESS)
        }
        Command::Simulate(args) => simulate::run(args).map(|()| ExitCode::SUCCESS),
        Command::Serve(args) => serve::run(*args).map(|()| ExitCode::SUCCESS),
        Command::Kube(KubeCommand::BenchPods(args)) => {
            bench::cluster::pods(args).map(|()| ExitCode::SUCCESS)
        }
        Command::Kube(KubeCommand::BenchWatch(args)) => {
            bench::cluster::watch(args).map(|()| ExitCode::SUCCESS)
        }
        Command::Kube(KubeCommand::BenchBind(args)) => {
            bench::cluster::bind(args).map(|()| ExitCode::SUCCESS)
        }
        Command::Kube(KubeCommand::CreateNodes(args)) => {
            kube::create_nodes(args).map(|()| ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GANTRY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
