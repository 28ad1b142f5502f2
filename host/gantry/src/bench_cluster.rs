//! `gantry kube bench-pods | bench-watch | bench-bind`: the commands `tests/cluster/bench.sh`
//! runs to race Gantry, kube-scheduler with Coscheduling, and a raw binder on one workload
//! (see `gantry_kube::bench`). JSON goes to stdout, progress to stderr.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Args, Debug)]
pub struct BenchPodsArgs {
    #[command(flatten)]
    target: Target,
    /// How many pods (half in gangs, half single).
    #[arg(long)]
    pods: usize,
    /// The `spec.schedulerName` of every pod: who is to schedule them.
    #[arg(long)]
    scheduler_name: String,
}

#[derive(Args, Debug)]
pub struct BenchWatchArgs {
    #[command(flatten)]
    target: Target,
    /// How many benchmark pods to wait for.
    #[arg(long)]
    pods: usize,
    /// Give up after this long, and report what was bound by then.
    #[arg(long, default_value_t = 600.0)]
    timeout_s: f64,
    /// The contender's name in the JSON.
    #[arg(long)]
    name: String,
    /// The contender: started once every pod exists, stopped when all are bound.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct BenchBindArgs {
    #[command(flatten)]
    target: Target,
}

/// The cluster and namespace every bench command works in.
#[derive(Args, Debug)]
pub struct Target {
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    #[arg(long, default_value = "default")]
    namespace: String,
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(&format!("{what} {{bar:40}} {{pos}}/{{len}} {{elapsed}}"))
            .expect("a valid template"),
    );
    bar
}

pub fn pods(args: BenchPodsArgs) -> anyhow::Result<()> {
    let bar = bar(args.pods as u64, "creating pods");
    let created = gantry_kube::bench::create_pods(
        &args.target.kubeconfig,
        &args.target.namespace,
        args.pods,
        &args.scheduler_name,
        &|| bar.inc(1),
    )?;
    bar.finish_and_clear();
    eprintln!(
        "bench-pods: {created} pods for scheduler {}",
        args.scheduler_name
    );
    Ok(())
}

/// Stops the contender when dropped: SIGTERM, then kill.
struct Contender(Option<Child>);

impl Drop for Contender {
    fn drop(&mut self) {
        let Some(child) = &mut self.0 else { return };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        for _ in 0..50 {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

pub fn watch(args: BenchWatchArgs) -> anyhow::Result<()> {
    let mut contender = Contender(None);
    let bar = bar(args.pods as u64, &format!("{}: pods bound", args.name));
    let bound_so_far = AtomicUsize::new(0);
    let outcome = gantry_kube::bench::watch(
        &args.target.kubeconfig,
        &args.target.namespace,
        args.pods,
        Duration::from_secs_f64(args.timeout_s),
        || {
            let (program, rest) = args.command.split_first().ok_or("no contender command")?;
            // The contender's output goes to stderr: stdout carries only the JSON.
            let child = Command::new(program)
                .args(rest)
                .stdout(std::io::stderr())
                .spawn()
                .map_err(|e| format!("cannot start {program}: {e}"))?;
            contender.0 = Some(child);
            Ok(())
        },
        &|n| {
            bound_so_far.store(n, Ordering::Relaxed);
            bar.set_position(n as u64);
        },
    )?;
    bar.finish_and_clear();
    drop(contender);
    let mut json = serde_json::to_value(&outcome)?;
    json["name"] = serde_json::Value::String(args.name);
    println!("{json}");
    Ok(())
}

pub fn bind(args: BenchBindArgs) -> anyhow::Result<()> {
    let bound = gantry_kube::bench::raw_bind(&args.target.kubeconfig, &args.target.namespace)?;
    eprintln!("bench-bind: {bound} pods bound");
    Ok(())
}
