//! `gantry serve`: with no cluster configured, a simulated copy of the 7,500-node cluster under a
//! steady synthetic load of single pods and gangs, scheduled continuously by the real core.
//! The example Wasm policies are active, and balloon pods hold idle capacity until real work
//! preempts them. (The API and web UI come with their own issues; for now it logs progress.)

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use gantry_core::{
    ClusterState, JobId, JobSpec, PodShape, Scheduler, SchedulerConfig, Symbols, TopologyPref,
};
use gantry_sim::ClusterSpec;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Cluster spec to simulate.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/clusters/openai-like-7500.yaml"))]
    cluster: PathBuf,
    /// Stop after this many seconds (run until interrupted when absent).
    #[arg(long)]
    duration_s: Option<f64>,
    /// New jobs per second of the synthetic load.
    #[arg(long, default_value_t = 20.0)]
    jobs_per_s: f64,
    /// Seconds between progress lines.
    #[arg(long, default_value_t = 5.0)]
    log_every_s: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Balloon pods (8 GPUs each, lowest priority) that hold idle capacity and give way when
    /// real work needs it, as OpenAI ran them.
    #[arg(long, default_value_t = 500)]
    balloons: u32,
    /// Schedule with the built-ins only, without the example Wasm policies.
    #[arg(long)]
    no_policies: bool,
    #[command(flatten)]
    plugins: crate::PluginDir,
}

/// A small deterministic generator for the synthetic load.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next() % items.len() as u64) as usize]
    }
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let symbols = Symbols::new();
    let spec = ClusterSpec::load(&args.cluster)?;
    let cluster = spec.build(&symbols);
    let leaves = cluster.leaf_queues();
    anyhow::ensure!(
        !leaves.is_empty(),
        "{}: no queues to submit to",
        args.cluster.display()
    );
    let total_gpus: u64 = cluster.nodes.gpu_total.iter().map(|&g| u64::from(g)).sum();
    let queues = cluster.queue_tree(600.0)?;
    let config = SchedulerConfig {
        max_attempts: 200,
        ..SchedulerConfig::default()
    };
    let mut scheduler = Scheduler::new(
        ClusterState::new(cluster.nodes),
        queues,
        symbols.clone(),
        config,
    );
    let engine =
        gantry_policy::PolicyEngine::new(gantry_policy::Limits::default(), symbols.clone())?;
    let mut entries = Vec::new();
    if !args.no_policies {
        for file in ["gpu_fit.wasm", "gpu_binpack.wasm", "team_quota.wasm"] {
            let path = args.plugins.resolve(file)?;
            let policy = engine.load_file(&path, gantry_policy::PolicyOptions::default())?;
            entries.push(gantry_policy::SetEntry {
                policy: std::sync::Arc::new(policy),
                weight: 1,
            });
        }
    }
    let names: Vec<String> = entries
        .iter()
        .map(|e| e.policy.info().name.clone())
        .collect();
    // The active set is loaded once per cycle, so an activation lands between cycles.
    let active = gantry_policy::ActiveSet::new(gantry_policy::PolicySet::new(1, entries));
    let mut cache = gantry_policy::NodeCache::default();
    for i in 0..args.balloons {
        let name = format!("balloon-{i:04}");
        let queue = &leaves[i as usize % leaves.len()];
        scheduler.submit(JobSpec {
            name: name.clone(),
            queue: scheduler.queues.id(queue).unwrap_or(0),
            priority: i32::MIN,
            pods: 1,
            shape: PodShape {
                name: symbols.intern(&name),
                queue: symbols.intern(queue),
                priority: i32::MIN,
                gpus: 8,
                gang_size: 1,
                ..PodShape::default()
            },
            balloon: true,
            topology: TopologyPref::default(),
            submit_s: 0.0,
        });
    }
    tracing::info!(cluster = %cluster.name, nodes = scheduler.state.len(), gpus = total_gpus, "simulated cluster up");
    println!(
        "gantry serve: simulating {} ({} nodes, {} GPUs) under synthetic load; Ctrl-C stops",
        cluster.name,
        scheduler.state.len(),
        total_gpus
    );
    println!(
        "  policies: {}; {} balloon pods hold idle capacity",
        if names.is_empty() {
            "built-ins only".to_string()
        } else {
            names.join(", ")
        },
        args.balloons
    );

    let mut rng = Rng(args.seed.max(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let started = Instant::now();
    let mut ends: Vec<(f64, JobId)> = Vec::new();
    let (mut submitted, mut placed, mut finished, mut decisions) = (0u64, 0u64, 0u64, 0u64);
    let mut preempted = 0u64;
    let mut next_arrival = 0.0;
    let mut next_log = args.log_every_s;
    let mut cycle_time = Duration::ZERO;
    loop {
        let now = started.elapsed().as_secs_f64();
        if args.duration_s.is_some_and(|d| now >= d) {
            break;
        }
        while next_arrival <= now {
            let gang = rng.unit() < 0.3;
            let (pods, gpus) = if gang {
                (*rng.pick(&[2u32, 4, 8, 16, 32, 64, 128]), 8)
            } else {
                (1, *rng.pick(&[1u32, 2, 4, 8]))
            };
            let queue = rng.pick(&leaves).clone();
            let name = format!("job-{submitted:06}");
            scheduler.submit(JobSpec {
                name: name.clone(),
                queue: scheduler.queues.id(&queue).unwrap_or(0),
                priority: 0,
                pods,
                shape: PodShape {
                    name: symbols.intern(&name),
                    queue: symbols.intern(&queue),
                    gpus,
                    gang_size: pods,
                    ..PodShape::default()
                },
                balloon: false,
                topology: TopologyPref::default(),
                submit_s: next_arrival,
            });
            submitted += 1;
            next_arrival += -rng.unit().max(1e-9).ln() / args.jobs_per_s;
        }
        ends.retain(|&(end, id)| {
            if end <= now && scheduler.is_running(id) {
                scheduler.finish(id);
                finished += 1;
                false
            } else {
                end > now
            }
        });
        let t = Instant::now();
        let set = active.load();
        let output = scheduler.cycle(now, &mut set.bind(&mut cache));
        preempted += output.evicted.len() as u64;
        cycle_time += t.elapsed();
        decisions += output.decisions.len() as u64;
        for decision in output.decisions.iter().filter(|d| d.placed) {
            if scheduler.job(decision.job).balloon {
                continue;
            }
            placed += 1;
            ends.push((now + 30.0 + rng.unit() * 270.0, decision.job));
        }
        if now >= next_log {
            let allocated = total_gpus
                - scheduler
                    .state
                    .nodes
                    .gpu_free
                    .iter()
                    .map(|&g| u64::from(g))
                    .sum::<u64>();
            println!(
                "t={now:>6.0}s  submitted {submitted}  placed {placed}  finished {finished}  pending {}  balloons running {}  preempted {preempted}  GPUs allocated {:.1}% ({:.1}% by work)  {:.0} decisions/s of cycle time",
                scheduler
                    .pending()
                    .iter()
                    .filter(|&&id| !scheduler.job(id).balloon)
                    .count(),
                scheduler
                    .running()
                    .filter(|&id| scheduler.job(id).balloon)
                    .count(),
                allocated as f64 * 100.0 / total_gpus.max(1) as f64,
                (allocated
                    - 8 * scheduler
                        .running()
                        .filter(|&id| scheduler.job(id).balloon)
                        .count() as u64) as f64
                    * 100.0
                    / total_gpus.max(1) as f64,
                decisions as f64 / cycle_time.as_secs_f64().max(1e-9),
            );
            next_log += args.log_every_s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "gantry serve: stopped after {submitted} jobs submitted, {placed} placed, {finished} finished"
    );
    Ok(())
}
