//! `gantry bench policy`: what a Wasm policy costs per node against the same logic in native
//! Rust, measured in one run on one core. Figures, not thresholds: the README quotes them.
//!
//! Every benchmark lives in this folder, none in a library crate: `activate` (activation
//! latency through the API), `failures` (what node failures cost each scheduler), `cluster` and `kube` (`gantry bench pods|watch|bind`, racing
//! schedulers on a real API server), `faults` (hostile policies under load), `server` (what
//! viewers' uploads, slow requests and heavy reads cost the API), `store` (the decision
//! store's append rate); here, the policy, schedule and store commands.

pub mod activate;
pub mod cluster;
pub mod failures;
pub mod faults;
pub mod kube;
pub mod server;
pub mod store;

use std::hint::black_box;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use gantry_core::{PodShape, Symbols};
use gantry_policy::{Limits, Policy, PolicyEngine, PolicyOptions, PolicyRole, WasmNodes};
use serde_json::json;

use crate::policy::PluginDir;
use crate::sample;

/// The subcommands of `gantry bench`.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// Cost per node of the Wasm example policies against their native Rust twins.
    Policy(PolicyBenchArgs),
    /// Scheduling decisions per second and latency, with the example policies active.
    Schedule(ScheduleBenchArgs),
    /// Batched decision-record writes per second into the sled store.
    Store(StoreBenchArgs),
    /// How soon an activated policy set takes effect, over the API, under load.
    Activate(activate::ActivateBenchArgs),
    /// Cycle latency with a faulting policy (active, then in shadow) and during uploads.
    Faults(faults::FaultsBenchArgs),
    /// What node failures cost Gantry and every anchor on one trace: goodput, GPU-hours lost,
    /// the wait from failure to restart.
    Failures(failures::FailuresBenchArgs),
    /// The API under viewers' large uploads, slow requests and heavy reads: RSS and probes.
    Server(server::ServerBenchArgs),
}

/// Runs one `gantry bench` command.
pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Policy(args) => run_policy(args),
        BenchCommand::Activate(args) => activate::run(args),
        BenchCommand::Faults(args) => faults::run(args),
        BenchCommand::Failures(args) => failures::run(args),
        BenchCommand::Server(args) => server::run(args),
        BenchCommand::Store(args) => run_store(args),
        BenchCommand::Schedule(args) => run_schedule(args),
    }
}

#[derive(Args, Debug)]
pub struct PolicyBenchArgs {
    /// Nodes in the synthetic cluster.
    #[arg(long, default_value_t = 7500)]
    nodes: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Wall time spent measuring each variant.
    #[arg(long, default_value_t = 700)]
    millis_per_case: u64,
    /// Measure these components instead of the built-in pair, on the same cluster: the cost per
    /// node (per call for quota), instantiation and size of each, with ratios to the first one.
    /// Give the Rust, Python and JS builds of one policy to see what each language costs.
    #[arg(long = "policy", value_name = "FILE.wasm")]
    policies: Vec<std::path::PathBuf>,
    /// Per-call deadline in milliseconds for the measured policies.
    #[arg(long, default_value_t = 50)]
    deadline_ms: u64,
    #[command(flatten)]
    plugins: PluginDir,
}

/// The median duration of `f` over repeated runs filling about `budget`.
fn median_time(budget: Duration, mut f: impl FnMut()) -> Duration {
    for _ in 0..3 {
        f();
    }
    let mut samples = Vec::new();
    let started = Instant::now();
    while started.elapsed() < budget || samples.len() < 11 {
        let t = Instant::now();
        f();
        samples.push(t.elapsed());
    }
    samples.sort_unstable();
    samples[samples.len() / 2]
}

fn ns(d: Duration) -> f64 {
    d.as_secs_f64() * 1e9
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

struct Measured {
    wasm_ns_per_node: f64,
    native_ns_per_node: f64,
    call_overhead_ns: f64,
    instantiate_us: f64,
    compile_ms: f64,
    component_bytes: usize,
}

pub fn run_policy(args: PolicyBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.nodes > 0, "--nodes must be at least 1");
    if !args.policies.is_empty() {
        return run_files(&args);
    }
    let symbols = Symbols::new();
    let engine = PolicyEngine::new(Limits::default(), symbols.clone())?;
    let budget = Duration::from_millis(args.millis_per_case);
    let table = sample::cluster(&symbols, args.nodes);
    let nodes = WasmNodes::new(&table);
    let one_table = sample::cluster(&symbols, 1);
    let one_node = WasmNodes::new(&one_table);
    let pods: Vec<PodShape> = [1, 4, 8].map(|gpus| sample::pod(&symbols, gpus)).to_vec();

    let load = |file: &str| -> anyhow::Result<(Policy, f64, f64)> {
        let bytes = std::fs::read(args.plugins.resolve(file)?)?;
        let t = Instant::now();
        let policy = engine.load(&bytes, PolicyOptions::default())?;
        let compile_ms = t.elapsed().as_secs_f64() * 1e3;
        // Compiled now: each further load is instantiate + init.
        let instantiate = median_time(budget / 4, || {
            black_box(
                engine
                    .load(&bytes, PolicyOptions::default())
                    .expect("reload"),
            );
        });
        Ok((policy, compile_ms, ns(instantiate) / 1e3))
    };

    let (fit, fit_compile, fit_inst) = load("gpu_fit.wasm")?;
    for pod in &pods {
        anyhow::ensure!(
            fit.filter(pod, &nodes)? == gantry_core::builtin::gpu_fit(pod, &table),
            "gpu-fit: the Wasm policy and its native twin disagree"
        );
    }
    let (binpack, bp_compile, bp_inst) = load("gpu_binpack.wasm")?;
    for pod in &pods {
        anyhow::ensure!(
            binpack.score(pod, &nodes)? == gantry_core::builtin::gpu_binpack(pod, &table),
            "gpu-binpack: the Wasm policy and its native twin disagree"
        );
    }

    let noop = engine.load(
        &std::fs::read(args.plugins.resolve("noop.wasm")?)?,
        PolicyOptions::default(),
    )?;
    let n = args.nodes as f64;
    let boundary_ns_per_node = ns(median_time(budget, || {
        black_box(noop.filter(&pods[0], &nodes).expect("noop"));
    })) / n;
    let mut i = 0usize;
    let mut next_pod = || {
        i += 1;
        &pods[i % pods.len()]
    };
    let fit_result = Measured {
        wasm_ns_per_node: ns(median_time(budget, || {
            black_box(fit.filter(next_pod(), &nodes).expect("gpu-fit"));
        })) / n,
        native_ns_per_node: ns(median_time(budget, || {
            black_box(gantry_core::builtin::gpu_fit(
                black_box(next_pod()),
                black_box(&table),
            ));
        })) / n,
        call_overhead_ns: ns(median_time(budget / 2, || {
            black_box(fit.filter(next_pod(), &one_node).expect("gpu-fit"));
        })),
        instantiate_us: fit_inst,
        compile_ms: fit_compile,
        component_bytes: fit.size_bytes(),
    };
    let binpack_result = Measured {
        wasm_ns_per_node: ns(median_time(budget, || {
            black_box(binpack.score(next_pod(), &nodes).expect("gpu-binpack"));
        })) / n,
        native_ns_per_node: ns(median_time(budget, || {
            black_box(gantry_core::builtin::gpu_binpack(
                black_box(next_pod()),
                black_box(&table),
            ));
        })) / n,
        call_overhead_ns: ns(median_time(budget / 2, || {
            black_box(binpack.score(next_pod(), &one_node).expect("gpu-binpack"));
        })),
        instantiate_us: bp_inst,
        compile_ms: bp_compile,
        component_bytes: binpack.size_bytes(),
    };

    let entry = |m: &Measured| {
        json!({
            "wasm_ns_per_node": round2(m.wasm_ns_per_node),
            "native_ns_per_node": round2(m.native_ns_per_node),
            "wasm_to_native": round2(m.wasm_ns_per_node / m.native_ns_per_node),
            "call_overhead_ns": m.call_overhead_ns.round(),
            "instantiate_us": m.instantiate_us.round(),
            "compile_ms": round2(m.compile_ms),
            "component_bytes": m.component_bytes,
        })
    };
    let report = json!({
        "nodes": args.nodes,
        "boundary_ns_per_node": round2(boundary_ns_per_node),
        "gpu_fit": entry(&fit_result),
        "gpu_binpack": entry(&binpack_result),
    });
    if args.json {
        outln!("{report}");
    } else {
        outln!("{} nodes, one core, median of repeated calls", args.nodes);
        outln!(
            "{:<12} {:>10} {:>10} {:>8} {:>12} {:>14} {:>11}",
            "policy",
            "wasm ns/n",
            "native",
            "ratio",
            "overhead ns",
            "instantiate µs",
            "compile ms"
        );
        for (name, m) in [("gpu-fit", &fit_result), ("gpu-binpack", &binpack_result)] {
            outln!(
                "{:<12} {:>10.2} {:>10.2} {:>7.2}x {:>12.0} {:>14.0} {:>11.1}",
                name,
                m.wasm_ns_per_node,
                m.native_ns_per_node,
                m.wasm_ns_per_node / m.native_ns_per_node,
                m.call_overhead_ns,
                m.instantiate_us,
                m.compile_ms
            );
        }
    }
    Ok(())
}

/// One `--policy` component, measured.
struct FileMeasured {
    file: String,
    name: String,
    role: PolicyRole,
    /// ns per node for filter and score; ns per call for quota.
    ns_per_unit: f64,
    call_overhead_ns: f64,
    instantiate_us: f64,
    compile_ms: f64,
    component_bytes: usize,
    /// Against the first policy of its role, when it is another policy (another declared
    /// name): the share of its answers that are the same.
    same_answers: Option<(String, f64)>,
}

/// What a policy answered for the sample pods: builds of one policy must agree, and different
/// policies of one role are compared on how often they do.
#[derive(PartialEq)]
enum Answers {
    Codes(Vec<Vec<u16>>),
    Scores(Vec<Vec<u32>>),
    Quota(gantry_core::QuotaVerdict),
}

impl Answers {
    /// The share of answers (one per pod and node, or the one quota verdict) that `self` and
    /// `other` give alike; 0 when they are of different roles.
    fn share_equal(&self, other: &Answers) -> f64 {
        fn share<T: PartialEq>(a: &[Vec<T>], b: &[Vec<T>]) -> f64 {
            let (mut equal, mut total) = (0usize, 0usize);
            for (x, y) in a.iter().zip(b) {
                total += x.len().max(y.len());
                equal += x.iter().zip(y).filter(|(p, q)| p == q).count();
            }
            if total == 0 {
                1.0
            } else {
                equal as f64 / total as f64
            }
        }
        match (self, other) {
            (Answers::Codes(a), Answers::Codes(b)) => share(a, b),
            (Answers::Scores(a), Answers::Scores(b)) => share(a, b),
            (Answers::Quota(a), Answers::Quota(b)) => f64::from(u8::from(a == b)),
            _ => 0.0,
        }
    }
}

/// `gantry bench policy --policy A.wasm --policy B.wasm …`: each component on the same synthetic
/// cluster, with ratios to the first. Builds of one policy (one declared name and role, in
/// different languages) must give the same answers; different policies of one role are compared
/// on cost, and on how often they answer alike.
fn run_files(args: &PolicyBenchArgs) -> anyhow::Result<()> {
    let symbols = Symbols::new();
    let limits = Limits {
        deadline: Duration::from_millis(args.deadline_ms),
        ..Limits::default()
    };
    let engine = PolicyEngine::new(limits, symbols.clone())?;
    let budget = Duration::from_millis(args.millis_per_case);
    let table = sample::cluster(&symbols, args.nodes);
    let nodes = WasmNodes::new(&table);
    let one_table = sample::cluster(&symbols, 1);
    let one_node = WasmNodes::new(&one_table);
    let pods: Vec<PodShape> = [1, 4, 8].map(|gpus| sample::pod(&symbols, gpus)).to_vec();
    let (job, queue, cohort) = sample::quota_case(&symbols);
    let n = args.nodes as f64;

    let mut measured: Vec<FileMeasured> = Vec::new();
    // (role, declared name, file, answers) of each policy measured so far.
    let mut role_to_answers: Vec<(PolicyRole, String, String, Answers)> = Vec::new();
    for path in &args.policies {
        let file = path.file_name().map_or_else(
            || path.display().to_string(),
            |f| f.to_string_lossy().into(),
        );
        let bytes = std::fs::read(path)
            .map_err(|e| anyhow::anyhow!("{}: cannot read the file: {e}", path.display()))?;
        let t = Instant::now();
        let policy = engine
            .load(&bytes, PolicyOptions::default())
            .map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
        let compile_ms = t.elapsed().as_secs_f64() * 1e3;
        let instantiate_us = ns(median_time(budget / 4, || {
            black_box(
                engine
                    .load(&bytes, PolicyOptions::default())
                    .expect("reload"),
            );
        })) / 1e3;
        let fault = |e: gantry_policy::PolicyFault| anyhow::anyhow!("{file}: {e}");
        let role = policy.role();
        let answers = match role {
            PolicyRole::Filter => Answers::Codes(
                pods.iter()
                    .map(|pod| policy.filter(pod, &nodes))
                    .collect::<Result<_, _>>()
                    .map_err(fault)?,
            ),
            PolicyRole::Score => Answers::Scores(
                pods.iter()
                    .map(|pod| policy.score(pod, &nodes))
                    .collect::<Result<_, _>>()
                    .map_err(fault)?,
            ),
            PolicyRole::Quota => {
                Answers::Quota(policy.admit(&job, &queue, Some(&cohort)).map_err(fault)?)
            }
        };
        let name = policy.info().name.clone();
        if let Some((_, _, first, _)) = role_to_answers
            .iter()
            .find(|(r, n, _, a)| *r == role && *n == name && *a != answers)
        {
            anyhow::bail!(
                "{file} and {first} are both builds of the {role} policy {name} but answer differently"
            );
        }
        let same_answers = role_to_answers
            .iter()
            .find(|(r, n, _, _)| *r == role && *n != name)
            .map(|(_, _, first, a)| (first.clone(), answers.share_equal(a)));
        role_to_answers.push((role, name, file.clone(), answers));
        let mut i = 0usize;
        let mut next_pod = || {
            i += 1;
            &pods[i % pods.len()]
        };
        let (ns_per_unit, call_overhead_ns) = match role {
            PolicyRole::Filter => (
                ns(median_time(budget, || {
                    black_box(policy.filter(next_pod(), &nodes).expect("filter"));
                })) / n,
                ns(median_time(budget / 2, || {
                    black_box(policy.filter(next_pod(), &one_node).expect("filter"));
                })),
            ),
            PolicyRole::Score => (
                ns(median_time(budget, || {
                    black_box(policy.score(next_pod(), &nodes).expect("score"));
                })) / n,
                ns(median_time(budget / 2, || {
                    black_box(policy.score(next_pod(), &one_node).expect("score"));
                })),
            ),
            PolicyRole::Quota => {
                let call = ns(median_time(budget, || {
                    black_box(policy.admit(&job, &queue, Some(&cohort)).expect("admit"));
                }));
                (call, call)
            }
        };
        measured.push(FileMeasured {
            file,
            name: policy.info().name.clone(),
            role,
            ns_per_unit,
            call_overhead_ns,
            instantiate_us,
            compile_ms,
            component_bytes: policy.size_bytes(),
            same_answers,
        });
    }
    print_files(args, &measured);

    Ok(())
}

/// What [`run_files`] measured, as JSON or as a table, with ratios to the first file.
fn print_files(args: &PolicyBenchArgs, measured: &[FileMeasured]) {
    let base = &measured[0];
    let entries: Vec<serde_json::Value> = measured
        .iter()
        .map(|m| {
            let per = if m.role == PolicyRole::Quota {
                "ns_per_call"
            } else {
                "ns_per_node"
            };
            json!({
                "file": m.file,
                "name": m.name,
                "role": m.role,
                per: round2(m.ns_per_unit),
                "call_overhead_ns": m.call_overhead_ns.round(),
                "instantiate_us": m.instantiate_us.round(),
                "compile_ms": round2(m.compile_ms),
                "component_bytes": m.component_bytes,
                "time_vs_first": round2(m.ns_per_unit / base.ns_per_unit),
                "instantiate_vs_first": round2(m.instantiate_us / base.instantiate_us),
                "bytes_vs_first": round2(m.component_bytes as f64 / base.component_bytes as f64),
                "same_answers_as": m.same_answers.as_ref().map(|(file, share)| json!({
                    "file": file,
                    "share": round4(*share),
                })),
            })
        })
        .collect();
    if args.json {
        outln!(
            "{}",
            json!({"nodes": args.nodes, "first": base.file, "policies": entries})
        );
    } else {
        outln!(
            "{} nodes, one core, median of repeated calls; ratios against {}",
            args.nodes,
            base.file
        );
        outln!(
            "{:<24} {:>12} {:>8} {:>12} {:>15} {:>8} {:>11} {:>12} {:>8}",
            "policy",
            "ns/node",
            "ratio",
            "overhead ns",
            "instantiate µs",
            "ratio",
            "compile ms",
            "bytes",
            "ratio"
        );
        for m in measured {
            outln!(
                "{:<24} {:>12.2} {:>7.2}x {:>12.0} {:>15.0} {:>7.1}x {:>11.1} {:>12} {:>7.1}x",
                m.file,
                m.ns_per_unit,
                m.ns_per_unit / base.ns_per_unit,
                m.call_overhead_ns,
                m.instantiate_us,
                m.instantiate_us / base.instantiate_us,
                m.compile_ms,
                m.component_bytes,
                m.component_bytes as f64 / base.component_bytes as f64
            );
        }
        if measured.iter().any(|m| m.role == PolicyRole::Quota) {
            outln!("(quota policies: ns per admit call, not per node)");
        }
        for m in measured {
            if let Some((first, share)) = &m.same_answers {
                outln!(
                    "{} answers as {first} does for {:.1}% of the sample pods' nodes",
                    m.file,
                    share * 100.0
                );
            }
        }
    }
}

#[derive(Args, Debug)]
pub struct ScheduleBenchArgs {
    /// Cluster spec to schedule on.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/clusters/openai-like-7500.yaml"))]
    cluster: std::path::PathBuf,
    /// Single pods to place, one decision each.
    #[arg(long, default_value_t = 2000)]
    pods: usize,
    /// 128-pod × 8-GPU gangs to place.
    #[arg(long, default_value_t = 20)]
    gangs: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    plugins: PluginDir,
}

/// A scheduler on `cluster` with the three example policies active.
fn bench_scheduler(
    args: &ScheduleBenchArgs,
    engine: &PolicyEngine,
    symbols: &std::sync::Arc<Symbols>,
) -> anyhow::Result<(
    gantry_core::Scheduler,
    gantry_policy::PolicySet,
    Vec<String>,
)> {
    let spec = gantry_sim::ClusterSpec::load(&args.cluster)?;
    let cluster = spec.build(symbols);
    let leaves = cluster.leaf_queues();
    let queues = cluster.queue_tree(600.0)?;
    let config = gantry_core::SchedulerConfig {
        max_attempts: 1,
        ..gantry_core::SchedulerConfig::default()
    };
    let scheduler = gantry_core::Scheduler::new(
        gantry_core::ClusterState::new(cluster.nodes),
        queues,
        symbols.clone(),
        config,
    );
    let mut entries = Vec::new();
    for file in ["gpu_fit.wasm", "gpu_binpack.wasm", "team_quota.wasm"] {
        let bytes = std::fs::read(args.plugins.resolve(file)?)?;
        entries.push(gantry_policy::SetEntry {
            policy: std::sync::Arc::new(engine.load(&bytes, PolicyOptions::default())?),
            weight: 1,
        });
    }
    Ok((scheduler, gantry_policy::PolicySet::new(1, entries), leaves))
}

fn job(
    symbols: &Symbols,
    name: String,
    queue: (usize, &str),
    pods: u32,
    gpus: u32,
) -> gantry_core::JobSpec {
    gantry_core::JobSpec {
        shape: PodShape {
            name: symbols.intern(&name),
            queue: symbols.intern(queue.1),
            gpus,
            gang_size: pods,
            ..PodShape::default()
        },
        name,
        queue: queue.0,
        priority: 0,
        pods,
        balloon: false,
        topology: gantry_core::TopologyPref::default(),
        submit_s: 0.0,
        expected_runtime_s: None,
    }
}

/// `gantry bench schedule`: decisions per second and latency with the example policies active.
pub fn run_schedule(args: ScheduleBenchArgs) -> anyhow::Result<()> {
    let symbols = Symbols::new();
    let engine = PolicyEngine::new(Limits::default(), symbols.clone())?;
    let (mut scheduler, set, leaves) = bench_scheduler(&args, &engine, &symbols)?;
    let mut cache = gantry_policy::NodeCache::default();
    let queue_ids: Vec<(usize, String)> = leaves
        .iter()
        .map(|name| (scheduler.queues.id(name).unwrap_or(0), name.clone()))
        .collect();
    anyhow::ensure!(!queue_ids.is_empty(), "the cluster spec declares no queue");

    let mut single = Vec::with_capacity(args.pods);
    let started = Instant::now();
    for i in 0..args.pods {
        let (id, name) = &queue_ids[i % queue_ids.len()];
        let gpus = [1, 2, 4, 8][i % 4];
        scheduler.submit(job(&symbols, format!("pod-{i}"), (*id, name), 1, gpus));
        let t = Instant::now();
        let out = scheduler.cycle(0.0, &mut set.bind(&mut cache));
        single.push(t.elapsed());
        anyhow::ensure!(
            out.decisions.iter().all(|d| d.placed),
            "pod-{i} was not placed: the cluster is full; ask fewer --pods"
        );
    }
    let single_wall = started.elapsed();

    let (mut scheduler, set, _) = bench_scheduler(&args, &engine, &symbols)?;
    let mut cache = gantry_policy::NodeCache::default();
    let mut gang = Vec::with_capacity(args.gangs);
    for i in 0..args.gangs {
        let (id, name) = &queue_ids[i % queue_ids.len()];
        scheduler.submit(job(&symbols, format!("gang-{i}"), (*id, name), 128, 8));
        let t = Instant::now();
        let out = scheduler.cycle(0.0, &mut set.bind(&mut cache));
        gang.push(t.elapsed());
        anyhow::ensure!(
            out.decisions.iter().all(|d| d.placed),
            "gang-{i} was not placed; ask fewer --gangs"
        );
    }
    single.sort_unstable();
    gang.sort_unstable();
    let (incremental, rebuild) = incremental_against_rebuild(&args, &engine, &symbols, &queue_ids)?;
    let planner = planner_growth(&args, &engine, &symbols, &queue_ids)?;
    let pod_spec = pod_spec_figures(&args, &engine, &symbols, &queue_ids)?;
    let report = json!({
        "cluster": scheduler.state.len(),
        "policies": ["gpu-fit", "gpu-binpack", "team-quota"],
        "single_pods": args.pods,
        "single_pod_decisions_per_s": round2(args.pods as f64 / single_wall.as_secs_f64()),
        "decision_p50_us": round2(ns(gantry_core::percentile(&single, 50.0)) / 1e3),
        "decision_p99_us": round2(ns(gantry_core::percentile(&single, 99.0)) / 1e3),
        "gangs": args.gangs,
        "gang_128x8_p50_ms": round2(ns(gantry_core::percentile(&gang, 50.0)) / 1e6),
        "gang_128x8_p99_ms": round2(ns(gantry_core::percentile(&gang, 99.0)) / 1e6),
        "steady_cycle": {
            "running_jobs": RUNNING,
            "pending_jobs": PENDING,
            "changes_per_cycle": CHANGES,
            "incremental_ms_p50": round2(ns(gantry_core::percentile(&incremental, 50.0)) / 1e6),
            "incremental_ms_p99": round2(ns(gantry_core::percentile(&incremental, 99.0)) / 1e6),
            "rebuild_ms_p50": round2(ns(gantry_core::percentile(&rebuild, 50.0)) / 1e6),
            "rebuild_ms_p99": round2(ns(gantry_core::percentile(&rebuild, 99.0)) / 1e6),
            "rebuild_over_incremental": round2(
                ns(gantry_core::percentile(&rebuild, 50.0)) / ns(gantry_core::percentile(&incremental, 50.0)).max(1.0)
            ),
        },
        "planner": planner,
        "pod_spec": pod_spec,
    });
    if args.json {
        outln!("{report}");
    } else {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

/// Running 8-GPU single-node jobs in the steady-state comparison (80% of 7,500 nodes).
const RUNNING: usize = 6000;
/// Pending gangs (64 pods × 8 GPUs) in it, more than the free nodes hold.
const PENDING: usize = 50;
/// Changes between two cycles: half the jobs that end, half new arrivals.
const CHANGES: usize = 10;
/// Cycles measured each way.
const ROUNDS: usize = 20;

/// A cycle of the long-lived scheduler after `CHANGES` changes, against what the live path did
/// before the engine: a scheduler rebuilt from the whole cluster (every running job adopted,
/// every pending job submitted) and its cycle. Both on the same state, with the example
/// policies; each sample is one cycle, the rebuild's including its build.
fn incremental_against_rebuild(
    args: &ScheduleBenchArgs,
    engine: &PolicyEngine,
    symbols: &std::sync::Arc<Symbols>,
    queue_ids: &[(usize, String)],
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut scheduler, set, _) = bench_scheduler(args, engine, symbols)?;
    scheduler.config.max_attempts = 1000;
    let template = scheduler.clone();
    let mut cache = gantry_policy::NodeCache::default();
    let nodes = scheduler.state.len();
    anyhow::ensure!(
        nodes > RUNNING,
        "the steady-state comparison needs more than {RUNNING} nodes"
    );
    let queue = |i: usize| {
        let (id, name) = &queue_ids[i % queue_ids.len()];
        (*id, name.as_str())
    };
    // Every running job with its spec and its pods' nodes, to rebuild from.
    type Running = (gantry_core::JobId, gantry_core::JobSpec, Vec<usize>);
    let mut running: Vec<Running> = Vec::new();
    for node in 0..RUNNING {
        let spec = job(symbols, format!("run-{node}"), queue(node), 1, 8);
        let id = scheduler.adopt(spec.clone(), &[node]);
        running.push((id, spec, vec![node]));
    }
    let mut pending: Vec<gantry_core::JobSpec> = (0..PENDING)
        .map(|i| job(symbols, format!("wide-{i}"), queue(i), 64, 8))
        .collect();
    for spec in &pending {
        scheduler.submit(spec.clone());
    }
    let placed = |scheduler: &gantry_core::Scheduler, d: &gantry_core::Decision| -> Running {
        let nodes = d
            .placement
            .iter()
            .flat_map(|&(node, pods)| std::iter::repeat_n(node, pods as usize))
            .collect();
        (d.job, scheduler.job(d.job).clone(), nodes)
    };
    // Until nothing more fits: what fits is placed, the rest parked.
    for _ in 0..3 {
        let out = scheduler.cycle(0.0, &mut set.bind(&mut cache));
        for d in out.decisions.iter().filter(|d| d.placed) {
            running.push(placed(&scheduler, d));
        }
        // Preemption may have evicted some: they run no more.
        running.retain(|(id, _, _)| scheduler.is_running(*id));
    }
    let mut incremental = Vec::with_capacity(ROUNDS);
    let mut rebuild = Vec::with_capacity(ROUNDS);
    let mut next = 0usize;
    for round in 0..ROUNDS {
        let now = 20.0 * (round + 1) as f64;
        // CHANGES changes: half end (the oldest running), half arrive.
        for _ in 0..CHANGES / 2 {
            let (id, _, _) = running.remove(0);
            scheduler.finish(id);
            let spec = job(symbols, format!("new-{next}"), queue(next), 1, 8);
            next += 1;
            scheduler.submit(spec.clone());
            pending.push(spec);
        }
        // The rebuild, on the same state: every running job adopted, every pending submitted.
        let t = Instant::now();
        let mut rebuilt = template.clone();
        for (_, spec, nodes) in &running {
            rebuilt.adopt(spec.clone(), nodes);
        }
        for id in scheduler.pending() {
            rebuilt.submit(scheduler.job(id).clone());
        }
        let mut rebuilt_cache = gantry_policy::NodeCache::default();
        rebuilt.cycle(now, &mut set.bind(&mut rebuilt_cache));
        rebuild.push(t.elapsed());

        let t = Instant::now();
        let out = scheduler.cycle(now, &mut set.bind(&mut cache));
        incremental.push(t.elapsed());
        for d in out.decisions.iter().filter(|d| d.placed) {
            running.push(placed(&scheduler, d));
        }
        // Preemption may have evicted some: they run no more.
        running.retain(|(id, _, _)| scheduler.is_running(*id));
    }
    incremental.sort_unstable();
    rebuild.sort_unstable();
    Ok((incremental, rebuild))
}

/// Pending jobs in the planner figures: each backlog is timed on its own, so how the cost
/// grows with the backlog shows.
const PLANNED_PENDING: [usize; 3] = [1000, 5000, 20_000];
/// Nodes left free in them: every other node runs a job.
const PLANNED_FREE: usize = 20;
/// Forecasts timed in them: each is seven forward runs of the cycle, so a few.
const FORECAST_ROUNDS: usize = 3;

/// The planner's figures at each backlog of [`PLANNED_PENDING`], and how the replan's cost
/// grew from the smallest to the largest against the backlog itself: a replan should cost
/// the jobs it could move, not the backlog, so its growth should be well under the backlog's.
fn planner_growth(
    args: &ScheduleBenchArgs,
    engine: &PolicyEngine,
    symbols: &std::sync::Arc<Symbols>,
    queue_ids: &[(usize, String)],
) -> anyhow::Result<serde_json::Value> {
    let mut by_backlog = serde_json::Map::new();
    let mut replan_ms = Vec::new();
    for pending in PLANNED_PENDING {
        let figures = planner_figures(args, engine, symbols, queue_ids, pending)?;
        replan_ms.push(
            figures["replan_after_one_job_ends_ms_p50"]
                .as_f64()
                .unwrap_or(0.0),
        );
        by_backlog.insert(format!("pending_{pending}"), figures);
    }
    let (first, last) = (
        PLANNED_PENDING[0],
        PLANNED_PENDING[PLANNED_PENDING.len() - 1],
    );
    let cost_growth = replan_ms[replan_ms.len() - 1] / replan_ms[0].max(1e-9);
    let backlog_growth = last as f64 / first as f64;
    by_backlog.insert(
        format!("replan_cost_growth_{first}_to_{last}"),
        json!(round2(cost_growth)),
    );
    by_backlog.insert("backlog_growth".into(), json!(round2(backlog_growth)));
    by_backlog.insert(
        "replan_sublinear".into(),
        json!(cost_growth < backlog_growth),
    );
    Ok(serde_json::Value::Object(by_backlog))
}

/// The planner's cost on a full cluster: a replan after one job ends, and a what-if's answer,
/// with every node but `PLANNED_FREE` running an 8-GPU job (declared runtimes of 10 min to
/// 10 h) and `pending` jobs (1 to 64 pods of 8 GPUs) parked for room.
fn planner_figures(
    args: &ScheduleBenchArgs,
    engine: &PolicyEngine,
    symbols: &std::sync::Arc<Symbols>,
    queue_ids: &[(usize, String)],
    pending: usize,
) -> anyhow::Result<serde_json::Value> {
    let (mut scheduler, set, _) = bench_scheduler(args, engine, symbols)?;
    scheduler.config.max_attempts = 1000;
    // The forecast is timed on its own, below.
    scheduler.set_plan_config(gantry_core::PlanConfig {
        enabled: true,
        forecast_every_s: f64::INFINITY,
        ..gantry_core::PlanConfig::default()
    });
    let queue = |i: usize| {
        let (id, name) = &queue_ids[i % queue_ids.len()];
        (*id, name.as_str())
    };
    let nodes = scheduler.state.len();
    anyhow::ensure!(
        nodes > PLANNED_FREE,
        "the planner figures need more than {PLANNED_FREE} nodes"
    );
    let mut running = std::collections::VecDeque::new();
    for node in 0..nodes - PLANNED_FREE {
        let spec = gantry_core::JobSpec {
            expected_runtime_s: Some(600.0 + (node * 7919 % 36_000) as f64),
            ..job(symbols, format!("run-{node}"), queue(node), 1, 8)
        };
        running.push_back(scheduler.adopt(spec, &[node]));
    }
    for i in 0..pending {
        let pods = [1, 8, 16, 64][i % 4];
        scheduler.submit(job(symbols, format!("wait-{i}"), queue(i), pods, 8));
    }
    let bar = bar(0, &format!("planner: parking {pending} pending jobs"));
    let mut cache = gantry_policy::NodeCache::default();
    for round in 0..pending / 1000 + 2 {
        scheduler.advance_clock(round as f64);
        scheduler.cycle(round as f64, &mut set.bind(&mut cache));
        bar.tick();
    }
    bar.finish_and_clear();
    let mut now = 100.0;
    let mut replans = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        // One job ends; the planner's answer to it.
        if let Some(id) = running.pop_front() {
            scheduler.finish(id);
        }
        now += 1.0;
        scheduler.advance_clock(now);
        let t = Instant::now();
        scheduler.replan_now();
        replans.push(t.elapsed());
    }
    let planned = scheduler
        .pending()
        .into_iter()
        .filter(|&id| scheduler.start_estimate(id).is_some())
        .count();
    let (id, name) = queue(0);
    let (other_id, other_name) = queue(1);
    let variants = [
        job(symbols, "whatif-16x8".into(), (id, name), 16, 8),
        job(symbols, "whatif-16x4".into(), (id, name), 16, 4),
        job(symbols, "whatif-12x8".into(), (id, name), 12, 8),
        job(
            symbols,
            "whatif-other-queue".into(),
            (other_id, other_name),
            16,
            8,
        ),
    ];
    let mut what_ifs = Vec::with_capacity(ROUNDS * variants.len());
    let mut answered = 0;
    for _ in 0..ROUNDS {
        for spec in &variants {
            let t = Instant::now();
            let answer = scheduler.what_if(spec);
            what_ifs.push(t.elapsed());
            answered += usize::from(answer.start.is_some());
        }
    }
    // The whole forecast, and the part of it the live loop waits for: the copy it hands to
    // the forecast's thread and taking the result (the runs happen beside it).
    let mut forecasts = Vec::with_capacity(FORECAST_ROUNDS);
    let mut loop_pauses = Vec::with_capacity(FORECAST_ROUNDS);
    let mut forecast_reached = 0;
    let forecast_bar = self::bar(FORECAST_ROUNDS as u64, "planner: forecasts");
    for _ in 0..FORECAST_ROUNDS {
        let t = Instant::now();
        let run = scheduler.forecast_run_now();
        let handed_out = t.elapsed();
        let forecast = run.run();
        forecast_reached = forecast.len();
        let taking = Instant::now();
        scheduler.install_forecast(forecast);
        loop_pauses.push(handed_out + taking.elapsed());
        forecasts.push(t.elapsed());
        forecast_bar.inc(1);
    }
    forecast_bar.finish_and_clear();
    replans.sort_unstable();
    what_ifs.sort_unstable();
    forecasts.sort_unstable();
    loop_pauses.sort_unstable();
    Ok(json!({
        "nodes": nodes,
        "running_jobs": nodes - PLANNED_FREE - ROUNDS,
        "pending_jobs": scheduler.pending().len(),
        "jobs_estimated_per_replan": planned,
        "replan_after_one_job_ends_ms_p50": round2(ns(gantry_core::percentile(&replans, 50.0)) / 1e6),
        "replan_after_one_job_ends_ms_p99": round2(ns(gantry_core::percentile(&replans, 99.0)) / 1e6),
        "what_if_ms_p50": round2(ns(gantry_core::percentile(&what_ifs, 50.0)) / 1e6),
        "what_if_ms_p99": round2(ns(gantry_core::percentile(&what_ifs, 99.0)) / 1e6),
        "what_ifs_answered": format!("{answered} of {}", what_ifs.len()),
        "forecast_ms_p50": round2(ns(gantry_core::percentile(&forecasts, 50.0)) / 1e6),
        "forecast_ms_max": round2(ns(gantry_core::percentile(&forecasts, 100.0)) / 1e6),
        "forecast_loop_pause_ms_p50": round2(ns(gantry_core::percentile(&loop_pauses, 50.0)) / 1e6),
        "forecast_loop_pause_ms_max": round2(ns(gantry_core::percentile(&loop_pauses, 100.0)) / 1e6),
        "jobs_forecast": forecast_reached,
    }))
}

/// Single pods per variant in the pod-spec figures.
const SPEC_PODS: usize = 2000;

/// Labels every node as a real cluster's nodes are labelled (hostname, pool, zone, instance
/// type, a numeric generation, eight more), and gives it pod slots, ephemeral storage and one
/// RDMA device column, so the constrained variant exercises every part of the filter.
fn label_like_a_real_cluster(scheduler: &mut gantry_core::Scheduler, symbols: &Symbols) {
    let t = &mut scheduler.state.nodes;
    let n = t.len();
    t.labels = (0..n)
        .map(|i| {
            let name = symbols.resolve(t.name[i]).to_string();
            let mut pairs: Vec<(String, String)> = vec![
                ("kubernetes.io/hostname".into(), name),
                (
                    "gantry.dev/pool".into(),
                    ["train", "train", "research", "eval"][i % 4].into(),
                ),
                (
                    "topology.kubernetes.io/zone".into(),
                    format!("zone-{}", ["a", "b", "c"][i % 3]),
                ),
                (
                    "node.kubernetes.io/instance-type".into(),
                    "p5.48xlarge".into(),
                ),
                ("gantry.dev/generation".into(), (1 + i % 5).to_string()),
            ];
            pairs.extend((0..8).map(|k| (format!("example.com/label-{k}"), format!("v{}", i % 7))));
            let mut labels: Vec<gantry_core::NodeLabel> = pairs
                .iter()
                .map(|(k, v)| gantry_core::NodeLabel::new(symbols.intern(k), symbols.intern(v), v))
                .collect();
            labels.sort_unstable_by_key(|l| l.key);
            labels.into()
        })
        .collect();
    t.resources = [
        ("ephemeral-storage", 3_500_000),
        ("pods", 110),
        ("rdma/hca", 8),
    ]
    .into_iter()
    .map(|(name, free)| gantry_core::ResourceColumn {
        name: symbols.intern(name),
        free: vec![free; n],
    })
    .collect();
}

/// What honouring the pod spec costs: single pods placed one per cycle with the example
/// policies, on nodes labelled like a real cluster's, with no constraint against a
/// nodeSelector, a three-part required node affinity (In, NotIn, Gt), a preferred term and
/// three resources beyond GPUs, CPU and memory. The two variants alternate, pod by pod, so
/// the machine's noise falls on both. Also counts constrained pods placed where their
/// constraints say they may not go: the answer must be 0.
fn pod_spec_figures(
    args: &ScheduleBenchArgs,
    engine: &PolicyEngine,
    symbols: &std::sync::Arc<Symbols>,
    queue_ids: &[(usize, String)],
) -> anyhow::Result<serde_json::Value> {
    use gantry_core::{Field, LabelOp, NodeAffinity, Requirement, Term};
    let label = |key: &str, op: LabelOp| Requirement {
        field: Field::Label(symbols.intern(key)),
        op,
    };
    let affinity = std::sync::Arc::new(NodeAffinity {
        selector: vec![label(
            "node.kubernetes.io/instance-type",
            LabelOp::In(vec![symbols.intern("p5.48xlarge")]),
        )],
        required: vec![Term {
            requirements: vec![
                label(
                    "gantry.dev/pool",
                    LabelOp::In(vec![symbols.intern("train"), symbols.intern("research")]),
                ),
                label(
                    "topology.kubernetes.io/zone",
                    LabelOp::NotIn(vec![symbols.intern("zone-c")]),
                ),
                label("gantry.dev/generation", LabelOp::Gt(2)),
            ],
        }],
        preferred: vec![(
            50,
            Term {
                requirements: vec![label(
                    "topology.kubernetes.io/zone",
                    LabelOp::In(vec![symbols.intern("zone-a")]),
                )],
            },
        )],
    });
    let mut resources: Vec<(gantry_core::Sym, u32)> =
        [("ephemeral-storage", 10_240), ("pods", 1), ("rdma/hca", 1)]
            .into_iter()
            .map(|(name, v)| (symbols.intern(name), v))
            .collect();
    resources.sort_unstable();
    // Plain pods, pods that all carry the constraints, and a mix where one pod in four does
    // (rotating across GPU sizes): what a cluster with a few pinned workloads sees.
    let constrained = |variant: usize, i: usize| match variant {
        0 => false,
        1 => true,
        _ => i % 4 == (i / 4) % 4,
    };
    let mut variants = Vec::new();
    for _ in 0..3 {
        let (mut scheduler, set, _) = bench_scheduler(args, engine, symbols)?;
        label_like_a_real_cluster(&mut scheduler, symbols);
        variants.push((
            scheduler,
            set,
            gantry_policy::NodeCache::default(),
            Vec::new(),
        ));
    }
    let mut evaluated = [0u64; 3];
    let mut wall = [Duration::ZERO; 3];
    let bar = bar(
        3 * SPEC_PODS as u64,
        "pod spec: plain, constrained and mixed pods",
    );
    let mut outside = 0;
    for i in 0..SPEC_PODS {
        let (id, name) = &queue_ids[i % queue_ids.len()];
        let gpus = [1, 2, 4, 8][i % 4];
        for (variant, (scheduler, set, cache, times)) in variants.iter_mut().enumerate() {
            // Timed like `single_pod_decisions_per_s`: the pod's making and its cycle.
            let made = Instant::now();
            let mut spec = job(symbols, format!("pod-{i}"), (*id, name), 1, gpus);
            if constrained(variant, i) {
                spec.shape.node_affinity = Some(affinity.clone());
                spec.shape.resources = resources.clone();
            }
            scheduler.submit(spec);
            let t = Instant::now();
            let out = scheduler.cycle(0.0, &mut set.bind(cache));
            times.push(t.elapsed());
            wall[variant] += made.elapsed();
            bar.inc(1);
            let Some(decision) = out.decisions.iter().find(|d| d.placed) else {
                anyhow::bail!("pod-{i} was not placed: the cluster is full; ask fewer --pods");
            };
            evaluated[variant] += u64::from(decision.explanation.nodes_evaluated);
            if constrained(variant, i) {
                let nodes = &scheduler.state.nodes;
                outside += decision
                    .placement
                    .iter()
                    .filter(|&&(node, _)| !affinity.allows(nodes.labels(node), nodes.name[node]))
                    .count();
            }
        }
    }
    bar.finish_and_clear();
    let times: Vec<Vec<Duration>> = variants
        .into_iter()
        .map(|(_, _, _, mut times)| {
            times.sort_unstable();
            times
        })
        .collect();
    let p50 = |v: usize| ns(gantry_core::percentile(&times[v], 50.0)) / 1e3;
    let p99 = |v: usize| round2(ns(gantry_core::percentile(&times[v], 99.0)) / 1e3);
    let per_s = |v: usize| round2(SPEC_PODS as f64 / wall[v].as_secs_f64().max(1e-9));
    let nodes_mean = |v: usize| round2(evaluated[v] as f64 / SPEC_PODS as f64);
    Ok(json!({
        "pods_per_variant": SPEC_PODS,
        "labels_per_node": 13,
        "plain_decision_p50_us": round2(p50(0)),
        "plain_decision_p99_us": p99(0),
        "plain_decisions_per_s": per_s(0),
        "constrained_decision_p50_us": round2(p50(1)),
        "constrained_decision_p99_us": p99(1),
        "constrained_decisions_per_s": per_s(1),
        "constrained_over_plain_p50": round2(p50(1) / p50(0).max(1e-3)),
        "mixed_constrained_share": 0.25,
        "mixed_decision_p50_us": round2(p50(2)),
        "mixed_decision_p99_us": p99(2),
        "mixed_decisions_per_s": per_s(2),
        // A third of the nodes meet the constraints, so a constrained pod reads more nodes
        // before it has enough feasible ones: most of its extra cost is that, as in
        // kube-scheduler, not the label checks (those are looked up once per constraint).
        "plain_nodes_evaluated_mean": nodes_mean(0),
        "constrained_nodes_evaluated_mean": nodes_mean(1),
        "mixed_nodes_evaluated_mean": nodes_mean(2),
        "constrained_pods_placed_outside_their_affinity": outside,
    }))
}

/// A spinner for a long step of a bench.
fn bar(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    bar.set_message(what.to_string());
    bar
}

#[derive(Args, Debug)]
pub struct StoreBenchArgs {
    /// Decision records to append.
    #[arg(long, default_value_t = 200_000)]
    records: u64,
    /// Records per batch (one sled transaction each).
    #[arg(long, default_value_t = 1000)]
    batch: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `measure` on a path of its own in the temporary directory (named for the `bench` and
/// this process) and removes it afterwards, whatever `measure` returned: the benches that
/// write a store start from nothing and leave nothing.
fn in_temp_dir<T>(bench: &str, measure: impl FnOnce(&std::path::Path) -> T) -> T {
    let dir = std::env::temp_dir().join(format!("gantry-bench-{bench}-{}", std::process::id()));
    let result = measure(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// `gantry bench store`: batched decision-record appends into a fresh store in a temporary
/// directory, removed afterwards.
pub fn run_store(args: StoreBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.records > 0 && args.batch > 0,
        "--records and --batch must be at least 1"
    );
    let result = in_temp_dir("store", |dir| {
        store::bench_append(dir, args.records, args.batch)
    })?;
    if args.json {
        outln!("{}", serde_json::to_string(&result)?);
    } else {
        outln!(
            "{} decision records in batches of {}: {:.0} records/s ({:.2} s), {} bytes of history, {} bytes on disk",
            result.records,
            result.batch,
            result.records_per_s,
            result.seconds,
            result.decision_bytes,
            result.size_on_disk
        );
    }
    Ok(())
}
