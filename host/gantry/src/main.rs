//! The `gantry` binary: wires the crates together behind one clap CLI. `anyhow` lives here and
//! only here; every library crate reports its own typed errors.
//!
//! This file is the command line and its dispatch only; each command lives in its own place:
//! `serve/` (the scheduler, simulated or on a live cluster, with its API), `simulate` (trace
//! replays), `policy/` (policy components: new, validate, test, and the set commands),
//! `client/` (calls to a running server: the policy set commands, `explain`, `whatif`,
//! `health`), `bench/` (every benchmark), `kube` (a live cluster's objects) and `sample` (the
//! sample cluster, pods and quota case that `validate` and the benches use).

/// `println!` for everything the CLI prints on stdout: a reader that closes the pipe early
/// (`gantry explain X | head -1`) ends the command quietly and successfully, as `cat` or `git`
/// do, where `println!` panics with a backtrace. Defined before the modules so they all see it.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::print_line(format_args!($($arg)*))
    };
}

mod bench;
mod client;
mod data_dir;
mod kube;
mod policy;
mod rule_args;
mod sample;
mod serve;
mod simulate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    Policy(policy::PolicyCommand),
    /// Measure Gantry and print the figures.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Run Gantry. With no cluster configured: a simulated 7,500-node cluster under load.
    Serve(Box<serve::ServeArgs>),
    /// Replay a job trace on a simulated cluster and report waits, allocation and gangs.
    Simulate(simulate::SimulateArgs),
    /// Ask a running server why a pod or job is pending, or where it went.
    Explain(client::ExplainArgs),
    /// When a job of this shape would start, without submitting it, and what would start
    /// sooner (fewer GPUs per pod, fewer pods, another queue or GPU type).
    Whatif(client::WhatIfArgs),
    /// Nodes per health state, the circuit breaker and the latest transitions; `reset`
    /// clears a tripped breaker (admin), `node NAME` shows one node.
    Health(client::HealthArgs),
    /// Work with a live cluster's objects.
    #[command(subcommand)]
    Kube(kube::KubeCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_json);
    let result = match cli.command {
        Command::Policy(command) => policy::run(command),
        Command::Explain(args) => client::explain(args),
        Command::Whatif(args) => client::what_if(args),
        Command::Health(args) => client::health(args),
        Command::Bench(command) => bench::run(command).map(|()| ExitCode::SUCCESS),
        Command::Kube(command) => kube::run(command).map(|()| ExitCode::SUCCESS),
        Command::Simulate(args) => simulate::run(args).map(|()| ExitCode::SUCCESS),
        Command::Serve(args) => serve::run(*args).map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Writes one line to stdout ([`outln!`]): a closed pipe exits 0 at once, as the reader has
/// all it wanted; any other write error is said on stderr and exits 1.
fn print_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(error) = writeln!(out, "{line}").and_then(|()| out.flush()) {
        if error.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: writing to stdout: {error}");
        std::process::exit(1);
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
