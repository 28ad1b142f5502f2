//! `gantry kube bench-pods | bench-watch | bench-bind`: the commands `tests/cluster/bench.sh`
//! runs to race Gantry, kube-scheduler (native gangs, or Coscheduling) and a raw binder on one
//! workload (see [`super::kube`]). JSON goes to stdout, progress to stderr.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

#[derive(Args, Debug)]
pub struct BenchPodsArgs {
    #[command(flatten)]
    target: Target,
    /// Which pods: `mixed` (half one-GPU gang pods, half small single pods; needs --pods) or
    /// `openai` (8-GPU pods in gangs of 16 to 256 and single, 90% of --nodes' GPUs).
    #[arg(long, default_value = "mixed")]
    workload: super::kube::Workload,
    /// How many pods, for the mixed workload.
    #[arg(long, default_value_t = 0)]
    pods: usize,
    /// The cluster's eight-GPU nodes, for the openai workload.
    #[arg(long, default_value_t = 0)]
    nodes: usize,
    /// How gangs are declared: `plugins` (scheduler-plugins PodGroup, what Coscheduling reads)
    /// or `upstream` (scheduling.k8s.io Workload and PodGroup, what kube-scheduler's native
    /// gang scheduling reads). Gantry reads both.
    #[arg(long, default_value = "plugins")]
    gang_api: super::kube::GangApi,
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
    /// The contender's Prometheus endpoint, read once every pod is bound and before the
    /// contender stops, for its cycle figures (Gantry's: `gantry_scheduling_cycle_duration_seconds`
    /// and `scheduler_scheduling_attempt_duration_seconds`).
    #[arg(long)]
    metrics_url: Option<String>,
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

/// Creates the workload's pods; prints how many on stdout (the openai workload sets its own
/// count, which `bench.sh` then waits for).
pub fn pods(args: BenchPodsArgs) -> anyhow::Result<()> {
    let workload = super::kube::workload(args.workload, args.pods, args.nodes)?;
    let bar = bar(workload.len() as u64, "creating pods");
    let created = super::kube::create_pods(
        &args.target.kubeconfig,
        &args.target.namespace,
        &workload,
        &args.scheduler_name,
        args.gang_api,
        &|| bar.inc(1),
    )?;
    bar.finish_and_clear();
    eprintln!(
        "bench-pods: {created} pods for scheduler {}",
        args.scheduler_name
    );
    outln!("{created}");
    Ok(())
}

/// Stops the contender when dropped: SIGTERM, then kill.
struct Contender(Option<Child>);

/// What the contender's process used, sampled from `/proc` while it runs: the last sample
/// before it stopped or was stopped.
#[derive(Debug, Default, Clone, Copy)]
struct Usage {
    /// `VmHWM`: the peak resident set.
    peak_rss_mib: f64,
    /// User and system CPU of all its threads.
    cpu_s: f64,
}

impl Usage {
    /// The process's usage now; `None` once it is gone (or a zombie, which has no memory).
    fn of(pid: u32) -> Option<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let hwm_kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command name (which may hold spaces) start at field 3; utime and
        // stime are fields 14 and 15, in USER_HZ (100 per second on Linux's user ABI).
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks: f64 =
            fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
        Some(Self {
            peak_rss_mib: hwm_kib / 1024.0,
            cpu_s: ticks / 100.0,
        })
    }
}

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
    // The contender's pid, once started (0 before), and its last usage sample.
    let pid = Arc::new(AtomicU32::new(0));
    let usage = Arc::new(Mutex::new(None::<Usage>));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (pid, usage, done) = (pid.clone(), usage.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let p = pid.load(Ordering::Relaxed);
                if p != 0
                    && let Some(now) = Usage::of(p)
                {
                    *usage.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let outcome = super::kube::watch(
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
            pid.store(child.id(), Ordering::Relaxed);
            contender.0 = Some(child);
            Ok(())
        },
        &|n| {
            bound_so_far.store(n, Ordering::Relaxed);
            bar.set_position(n as u64);
        },
    );
    // One last sample while the contender still runs (a contender that ended by itself keeps
    // its last one).
    if let Some(now) = Usage::of(pid.load(Ordering::Relaxed)) {
        *usage.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
    }
    done.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let outcome = outcome?;
    bar.finish_and_clear();
    let cycles = args.metrics_url.as_deref().map(|url| {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        agent
            .get(url)
            .call()
            .and_then(|mut answer| answer.body_mut().read_to_string())
            .map_err(|e| format!("cannot read {url}: {e}"))
            .map(|text| CycleFigures::of(&text))
    });
    drop(contender);
    let usage = *usage.lock().unwrap_or_else(|e| e.into_inner());
    let mut json = serde_json::to_value(&outcome)?;
    json["name"] = serde_json::Value::String(args.name);
    json["peak_rss_mib"] = json!(usage.map(|u| (u.peak_rss_mib * 10.0).round() / 10.0));
    json["cpu_s"] = json!(usage.map(|u| (u.cpu_s * 100.0).round() / 100.0));
    match cycles {
        Some(Ok(cycles)) => json["cycles"] = serde_json::to_value(cycles)?,
        Some(Err(e)) => json["cycles"] = json!({ "error": e }),
        None => {}
    }
    outln!("{json}");
    Ok(())
}

/// A scheduler's cycle figures from its Prometheus text: how many cycles decided something,
/// their mean time, and the mean time per scheduling attempt.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
struct CycleFigures {
    cycles: u64,
    cycle_ms_mean: Option<f64>,
    attempts: u64,
    attempt_us_mean: Option<f64>,
}

impl CycleFigures {
    fn of(text: &str) -> Self {
        let (cycle_s, cycles) = sum_and_count(text, "gantry_scheduling_cycle_duration_seconds");
        let (attempt_s, attempts) =
            sum_and_count(text, "scheduler_scheduling_attempt_duration_seconds");
        let mean = |sum: f64, count: f64, unit: f64| {
            (count > 0.0).then(|| (sum / count * unit * 1000.0).round() / 1000.0)
        };
        Self {
            cycles: cycles as u64,
            cycle_ms_mean: mean(cycle_s, cycles, 1e3),
            attempts: attempts as u64,
            attempt_us_mean: mean(attempt_s, attempts, 1e6),
        }
    }
}

/// The `_sum` and `_count` of histogram `name` in Prometheus text, over all its label sets.
fn sum_and_count(text: &str, name: &str) -> (f64, f64) {
    let value = |suffix: &str| -> f64 {
        let series = format!("{name}{suffix}");
        text.lines()
            .filter_map(|line| {
                let rest = line.strip_prefix(&series)?;
                let rest = match rest.strip_prefix('{') {
                    Some(labelled) => &labelled[labelled.find('}')? + 1..],
                    None => rest,
                };
                rest.split_whitespace().next()?.parse::<f64>().ok()
            })
            .sum()
    };
    (value("_sum"), value("_count"))
}

pub fn bind(args: BenchBindArgs) -> anyhow::Result<()> {
    let bound = super::kube::raw_bind(&args.target.kubeconfig, &args.target.namespace)?;
    eprintln!("bench-bind: {bound} pods bound");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycle_figures_sum_every_label_set_and_skip_other_series() {
        let text = "\
# TYPE gantry_scheduling_cycle_duration_seconds histogram
gantry_scheduling_cycle_duration_seconds_bucket{le=\"0.001\"} 3
gantry_scheduling_cycle_duration_seconds_sum 0.012
gantry_scheduling_cycle_duration_seconds_count 4
scheduler_scheduling_attempt_duration_seconds_sum{profile=\"gantry\",result=\"scheduled\"} 0.009
scheduler_scheduling_attempt_duration_seconds_count{profile=\"gantry\",result=\"scheduled\"} 90
scheduler_scheduling_attempt_duration_seconds_sum{profile=\"gantry\",result=\"unschedulable\"} 0.001
scheduler_scheduling_attempt_duration_seconds_count{profile=\"gantry\",result=\"unschedulable\"} 10
gantry_scheduling_cycle_duration_seconds_sum_other 99
";
        assert_eq!(
            CycleFigures::of(text),
            CycleFigures {
                cycles: 4,
                cycle_ms_mean: Some(3.0),
                attempts: 100,
                attempt_us_mean: Some(100.0),
            }
        );
        let none = CycleFigures::of("");
        assert_eq!((none.cycles, none.cycle_ms_mean), (0, None));
    }
}
