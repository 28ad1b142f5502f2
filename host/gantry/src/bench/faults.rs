//! `gantry bench faults`: what a failing policy and a burst of uploads cost the scheduling loop.
//! On the simulated cluster (the spec `gantry serve` uses, 7,500 nodes by default) with 100
//! pending jobs, it times scheduling cycles:
//! - with the healthy example set (gpu-fit, gpu-binpack, team-quota);
//! - with `hostile-misbehave` added as a filter: its init takes 900 ms and it traps on every
//!   call, so the cycles pay for its faults until it is quarantined, and then for its probes
//!   (and once more failing open, to tell the policy's cost from the scheduler's handling of
//!   jobs a fail-closed filter leaves unplaceable);
//! - with that policy only in a shadow set, run as `Live::decide` runs one (on its own thread
//!   at the lowest OS priority, handed a copy of each cycle's state once the active set has
//!   decided, skipping cycles while busy, its calls waiting while the active set decides);
//! - with the healthy set while `--uploads` components of `--upload-mib` MiB each compile at
//!   once through `PolicyEngine::compile` (at most two compile at a time);
//! - and, apart from the cycles, `--timeouts` calls of `hostile-loop` (a filter that never
//!   returns) under a 50 ms deadline: how long past the deadline the call is stopped, which
//!   `hostile.rs` no longer asserts (a loaded machine overran twice the deadline there).
//!
//! Each cycle starts from the same 100 pending jobs on a fresh copy of the cluster, so every
//! sample does the same work; the loop's pause (`--pause-ms`) separates cycles in every
//! scenario alike.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use gantry_core::{PodShape, Scheduler, Symbols};
use gantry_policy::{
    Capabilities, FailurePolicy, Limits, NodeCache, Policy, PolicyEngine, PolicyOptions, PolicySet,
    SetEntry,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

/// Arguments of `gantry bench faults`.
#[derive(Args, Debug)]
pub struct FaultsBenchArgs {
    /// Cluster spec to simulate.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/clusters/openai-like-7500.yaml"))]
    cluster: PathBuf,
    /// Pending jobs every cycle considers.
    #[arg(long, default_value_t = 100)]
    pending: usize,
    /// Cycles timed in each scenario.
    #[arg(long, default_value_t = 200)]
    cycles: usize,
    /// How long the faulty policy's init spins, in milliseconds.
    #[arg(long, default_value_t = 900)]
    init_ms: u64,
    /// Uploads compiling at once in the upload scenario.
    #[arg(long, default_value_t = 10)]
    uploads: usize,
    /// Size of each upload, in MiB (a real policy padded with a custom section).
    #[arg(long, default_value_t = 16)]
    upload_mib: usize,
    /// The loop's pause between cycles, in milliseconds, when a shadow set gets its turn
    /// (the engine waits up to 50 ms between passes). Applies to every scenario alike.
    #[arg(long, default_value_t = 50)]
    pause_ms: u64,
    /// Calls of the never-ending filter timed in the deadline scenario.
    #[arg(long, default_value_t = 20)]
    timeouts: usize,
    /// Print one JSON object instead of indented JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    plugins: crate::policy::PluginDir,
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{what:<28} {{bar:40}} {{pos}}/{{len}} {{elapsed}}"
        ))
        .expect("a valid template"),
    );
    bar
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e5).round() / 100.0
}

fn summary(mut samples: Vec<Duration>) -> serde_json::Value {
    samples.sort_unstable();
    json!({
        "p50_ms": ms(gantry_core::percentile(&samples, 50.0)),
        "p99_ms": ms(gantry_core::percentile(&samples, 99.0)),
        "max_ms": ms(samples.last().copied().unwrap_or_default()),
    })
}

/// The scheduler with `pending` single-pod jobs queued, to clone for each cycle.
fn template(args: &FaultsBenchArgs, symbols: &Arc<Symbols>) -> anyhow::Result<Scheduler> {
    let spec = gantry_sim::ClusterSpec::load(&args.cluster)?;
    let cluster = spec.build(symbols);
    let leaves = cluster.leaf_queues();
    let queues = cluster.queue_tree(600.0)?;
    let config = gantry_core::SchedulerConfig {
        max_attempts: args.pending,
        ..gantry_core::SchedulerConfig::default()
    };
    let mut scheduler = Scheduler::new(
        gantry_core::ClusterState::new(cluster.nodes),
        queues,
        symbols.clone(),
        config,
    );
    anyhow::ensure!(!leaves.is_empty(), "the cluster spec declares no queue");
    for i in 0..args.pending {
        let queue = &leaves[i % leaves.len()];
        let id = scheduler.queues.id(queue).unwrap_or(0);
        let gpus = [1, 2, 4, 8][i % 4];
        let name = format!("job-{i}");
        scheduler.submit(gantry_core::JobSpec {
            shape: PodShape {
                name: symbols.intern(&name),
                queue: symbols.intern(queue),
                gpus,
                gang_size: 1,
                ..PodShape::default()
            },
            name,
            queue: id,
            priority: 0,
            pods: 1,
            balloon: false,
            topology: gantry_core::TopologyPref::default(),
            submit_s: 0.0,
            expected_runtime_s: None,
        });
    }
    Ok(scheduler)
}

fn healthy(args: &FaultsBenchArgs, engine: &PolicyEngine) -> anyhow::Result<Vec<SetEntry>> {
    let mut entries = Vec::new();
    for file in ["gpu_fit.wasm", "gpu_binpack.wasm", "team_quota.wasm"] {
        let bytes = std::fs::read(args.plugins.resolve(file)?)?;
        entries.push(SetEntry {
            policy: Arc::new(engine.load(&bytes, PolicyOptions::default())?),
            weight: 1,
        });
    }
    Ok(entries)
}

fn faulty(
    args: &FaultsBenchArgs,
    engine: &PolicyEngine,
    failure: FailurePolicy,
) -> anyhow::Result<Arc<Policy>> {
    let bytes = std::fs::read(args.plugins.resolve("hostile_misbehave.wasm")?)?;
    let options = PolicyOptions {
        config: format!(r#"{{"init_ms": {}, "trap": true}}"#, args.init_ms),
        capabilities: Capabilities {
            clock: true,
            ..Capabilities::default()
        },
        failure,
        deadline: None,
        upload: false,
    };
    Ok(Arc::new(engine.load(&bytes, options)?))
}

/// Time `cycles` cycles of `active` under the loop's policy budget (and `shadow` beside it, as
/// `Live::decide` runs one: on its own thread, handed a copy of each cycle's state, and
/// skipping cycles while it is busy), calling `after` with the cycle's index after each.
/// Returns the active cycles' times and how many cycles the shadow ran.
/// What every scenario shares: how many cycles, the pause between them, the loop's gate, and
/// the scheduler each cycle starts from.
struct Run<'a> {
    count: usize,
    pause: Duration,
    gate: &'a Arc<gantry_policy::CycleGate>,
    template: &'a Scheduler,
}

fn cycles(
    run: &Run<'_>,
    active: &PolicySet,
    shadow: Option<&PolicySet>,
    what: &str,
    mut after: impl FnMut(usize),
) -> (Vec<Duration>, usize) {
    let (samples, _, ran) = cycles_alternating(run, active, shadow, None, what, &mut after);
    (samples, ran)
}

/// [`cycles`], with the shadow set (if any) on in even blocks of `blocks` cycles and off in
/// odd ones when `blocks` is given, so both conditions meet the same machine; an off block
/// starts (untimed) once the shadow thread has finished its last cycle. Also returns, per
/// sample, whether the shadow was on.
fn cycles_alternating(
    run: &Run<'_>,
    active: &PolicySet,
    shadow: Option<&PolicySet>,
    blocks: Option<usize>,
    what: &str,
    after: &mut dyn FnMut(usize),
) -> (Vec<Duration>, Vec<bool>, usize) {
    let Run {
        count,
        pause,
        gate,
        template,
    } = *run;
    let mut on = Vec::with_capacity(count);
    let bar = bar(count as u64, what);
    let mut samples = Vec::with_capacity(count);
    let budget = gantry_engine::LiveConfig::default().policy_budget;
    let idle = std::sync::atomic::AtomicBool::new(true);
    let idle = &idle;
    let shadow_ran = std::thread::scope(|scope| {
        let (to_shadow, jobs) = std::sync::mpsc::sync_channel::<Scheduler>(0);
        let worker = shadow.map(|shadow| {
            scope.spawn(move || {
                gantry_policy::yield_to_the_loop();
                let mut ran = 0;
                for mut copy in jobs {
                    idle.store(false, Ordering::Release);
                    let mut cache = NodeCache::default();
                    let mut bound = shadow
                        .bind(&mut cache)
                        .with_budget(budget)
                        .waiting_on(gate.clone());
                    copy.cycle(0.0, &mut bound);
                    ran += 1;
                    idle.store(true, Ordering::Release);
                }
                ran
            })
        });
        for i in 0..count {
            let shadow_on = blocks.is_none_or(|b| (i / b.max(1)) % 2 == 0);
            if !shadow_on {
                while worker.is_some() && !idle.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            on.push(worker.is_some() && shadow_on);
            let mut scheduler = template.clone();
            let mut cache = NodeCache::default();
            let started = Instant::now();
            // Copied before the cycle, only while the shadow thread waits, and handed over
            // after it, as Live does.
            let copy = (worker.is_some() && shadow_on && idle.load(Ordering::Acquire))
                .then(|| scheduler.clone());
            {
                let _in_cycle = gate.enter();
                scheduler.cycle(0.0, &mut active.bind(&mut cache).with_budget(budget));
            }
            samples.push(started.elapsed());
            if let Some(copy) = copy {
                let _ = to_shadow.try_send(copy);
            }
            // The loop's pause between passes, when the shadow thread gets its turn.
            std::thread::sleep(pause);
            after(i);
            bar.inc(1);
        }
        drop(to_shadow);
        worker.map_or(0, |w| w.join().unwrap_or(0))
    });
    bar.finish_and_clear();
    (samples, on, shadow_ran)
}

/// `bytes` with a custom section appended so the whole is `size` bytes and its sha256 is its
/// own (`tag`): a valid component the engine must compile afresh.
fn padded(bytes: &[u8], size: usize, tag: usize) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    fn leb_len(n: usize) -> usize {
        let mut len = 1;
        while n >> (7 * len) != 0 {
            len += 1;
        }
        len
    }
    let name = format!("gantry-bench-padding-{tag}");
    // Section id, body size, then the body: name length, name, payload up to `size` in all.
    let room = size.saturating_sub(bytes.len() + 1);
    let body_len = (1..=5)
        .map(|k| room.saturating_sub(k))
        .find(|&body| leb_len(body) + body == room)
        .unwrap_or(0);
    let mut body = Vec::with_capacity(body_len);
    leb(name.len(), &mut body);
    body.extend_from_slice(name.as_bytes());
    body.resize(body_len.max(body.len()), tag as u8);
    let mut out = bytes.to_vec();
    out.push(0);
    leb(body.len(), &mut out);
    out.extend_from_slice(&body);
    out
}

/// `gantry bench faults`.
pub fn run(args: FaultsBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.cycles > 0, "--cycles must be at least 1");
    let symbols = Symbols::new();
    let engine = PolicyEngine::new(
        Limits {
            // The faulty policy's init runs on its refill thread, under this deadline.
            init_deadline: Duration::from_millis(args.init_ms * 3 + 1000),
            ..Limits::default()
        },
        symbols.clone(),
    )?;
    let template = template(&args, &symbols)?;
    let nodes = template.state.len();
    let gate = engine.cycle_gate();
    let run = Run {
        count: args.cycles,
        pause: Duration::from_millis(args.pause_ms),
        gate: &gate,
        template: &template,
    };
    let healthy_entries = healthy(&args, &engine)?;
    let healthy_set = PolicySet::new(1, healthy_entries.clone());

    // 1. Healthy.
    let (healthy_cycles, _) = cycles(&run, &healthy_set, None, "healthy set", |_| {});

    // 2. The faulty policy active (a filter: fails closed, so its jobs stay pending).
    let policy = faulty(&args, &engine, FailurePolicy::Default)?;
    let mut entries = healthy_entries.clone();
    entries.push(SetEntry {
        policy: policy.clone(),
        weight: 1,
    });
    let faulty_set = PolicySet::new(2, entries);
    let mut quarantined_at: Option<(usize, u64)> = None;
    let (faulty_cycles, _) = cycles(&run, &faulty_set, None, "faulty policy active", |i| {
        if quarantined_at.is_none() && policy.health().quarantined {
            let faults = policy.stats.faults.load(Ordering::Relaxed)
                - policy.stats.quarantined_calls.load(Ordering::Relaxed);
            quarantined_at = Some((i, faults));
        }
    });
    let health = policy.health();
    let active_faulty = json!({
        "cycles": summary(faulty_cycles.clone()),
        "first_cycle_ms": ms(faulty_cycles[0]),
        "cycles_after_the_first": summary(faulty_cycles[1..].to_vec()),
        "faults_before_quarantine": quarantined_at.map(|(_, faults)| faults),
        "quarantined_in_cycle": quarantined_at.map(|(i, _)| i + 1),
        "calls": policy.stats.calls.load(Ordering::Relaxed),
        "quarantined_calls": policy.stats.quarantined_calls.load(Ordering::Relaxed),
        "instances_created": policy.stats.instances_created.load(Ordering::Relaxed),
        "still_quarantined": health.quarantined,
        "last_fault": health.last_fault.map(|f| f.to_string()),
    });
    drop(faulty_set);
    drop(policy);

    // 2b. The same, failing open: a fault skips the policy instead of rejecting every node, so
    // this separates what the faults and the quarantine cost from what the scheduler does with
    // jobs a fail-closed filter leaves unplaceable.
    let open_policy = faulty(&args, &engine, FailurePolicy::FailOpen)?;
    let mut entries = healthy_entries.clone();
    entries.push(SetEntry {
        policy: open_policy.clone(),
        weight: 1,
    });
    let open_set = PolicySet::new(4, entries);
    let (open_cycles, _) = cycles(&run, &open_set, None, "faulty policy, fail-open", |_| {});
    let active_fail_open = json!({
        "cycles": summary(open_cycles.clone()),
        "first_cycle_ms": ms(open_cycles[0]),
        "cycles_after_the_first": summary(open_cycles[1..].to_vec()),
        "quarantined_calls": open_policy.stats.quarantined_calls.load(Ordering::Relaxed),
    });
    drop(open_set);
    drop(open_policy);

    // 3. The faulty policy only in a shadow set.
    let shadow = shadow_scenario(&args, &engine, &run, &healthy_set, &healthy_entries)?;

    // 4. Uploads compiling while the healthy set schedules.
    let uploads = uploads_scenario(&args, &engine, &template, &healthy_set)?;

    // 5. A call that never returns, stopped at its deadline.
    let deadline = deadline_scenario(&args, &engine, &template)?;
    let report = json!({
        "nodes": nodes,
        "pending_jobs": args.pending,
        "cycles_per_scenario": args.cycles,
        "pause_between_cycles_ms": args.pause_ms,
        "healthy": summary(healthy_cycles),
        "faulty_active": active_faulty,
        "faulty_active_fail_open": active_fail_open,
        "faulty_in_shadow": shadow,
        "uploads": uploads,
        "deadline": deadline,
    });
    if args.json {
        outln!("{report}");
    } else {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

/// The faulty policy only in a shadow set, in blocks of cycles with the shadow on and off:
/// what the shadow costs the cycles beside it, against the noise between two off samples.
fn shadow_scenario(
    args: &FaultsBenchArgs,
    engine: &PolicyEngine,
    run: &Run<'_>,
    healthy_set: &PolicySet,
    healthy_entries: &[SetEntry],
) -> anyhow::Result<serde_json::Value> {
    let shadow_policy = faulty(args, engine, FailurePolicy::Default)?;
    let mut entries = healthy_entries.to_vec();
    entries.push(SetEntry {
        policy: shadow_policy.clone(),
        weight: 1,
    });
    let shadow_set = PolicySet::new(3, entries);
    // Blocks of 10 cycles with the shadow on, then off, and so on: both meet the same machine.
    // The off cycles, split into their even and odd blocks, show how far two samples of the
    // same condition differ: the noise the shadow's effect is held against.
    let (samples, on, shadow_ran) = cycles_alternating(
        run,
        healthy_set,
        Some(&shadow_set),
        Some(10),
        "faulty policy in shadow (alternating blocks)",
        &mut |_| {},
    );
    let pick = |keep: &dyn Fn(usize, bool) -> bool| -> Vec<Duration> {
        samples
            .iter()
            .zip(&on)
            .enumerate()
            .filter(|&(i, (_, &on))| keep(i, on))
            .map(|(_, (d, _))| *d)
            .collect()
    };
    let shadow_cycles = pick(&|_, on| on);
    let without = pick(&|_, on| !on);
    let without_a = pick(&|i, on| !on && (i / 20) % 2 == 0);
    let without_b = pick(&|i, on| !on && (i / 20) % 2 == 1);
    let p99 = |samples: &[Duration]| {
        let mut sorted = samples.to_vec();
        sorted.sort();
        ms(gantry_core::percentile(&sorted, 99.0))
    };
    let noise = (p99(&without_a) - p99(&without_b)).abs();
    let effect = p99(&shadow_cycles) - p99(&without);
    let shadow = json!({
        "cycles": summary(shadow_cycles.clone()),
        "cycles_without_it_same_run": summary(without),
        "p99_effect_ms": (effect * 100.0).round() / 100.0,
        "p99_noise_ms": (noise * 100.0).round() / 100.0,
        "p99_unchanged_within_noise": effect <= noise,
        "first_cycle_ms": ms(shadow_cycles[0]),
        "runs_on_its_own_thread": true,
        "shadow_cycles_run": shadow_ran,
        "shadow_cycles_skipped": on.iter().filter(|&&on| on).count() - shadow_ran,
        "quarantined": shadow_policy.health().quarantined,
    });
    Ok(shadow)
}

/// Uploads compiling on threads of their own while the healthy set schedules: the cycles
/// beside them, and what each compile took or why it was refused.
fn uploads_scenario(
    args: &FaultsBenchArgs,
    engine: &PolicyEngine,
    template: &Scheduler,
    healthy_set: &PolicySet,
) -> anyhow::Result<serde_json::Value> {
    let upload_base = std::fs::read(
        args.plugins
            .resolve("gpu_fit_js.wasm")
            .or_else(|_| args.plugins.resolve("gpu_fit.wasm"))?,
    )?;
    let size = args.upload_mib << 20;
    let finished = AtomicUsize::new(0);
    let (upload_cycles, outcomes) = std::thread::scope(|scope| {
        let uploads: Vec<_> = (0..args.uploads)
            .map(|i| {
                let bytes = padded(&upload_base, size, i + 1);
                let (engine, finished) = (engine, &finished);
                scope.spawn(move || {
                    let started = Instant::now();
                    let result = engine.compile(&bytes, &Capabilities::default());
                    finished.fetch_add(1, Ordering::Relaxed);
                    (
                        started.elapsed(),
                        result.map(|_| ()).map_err(|e| e.to_string()),
                    )
                })
            })
            .collect();
        // Cycles on this thread (a scheduler is not shared across threads): at least
        // `cycles`, and on until every upload has finished.
        let mut samples = Vec::new();
        let bar = bar(args.cycles as u64, "healthy set, uploads");
        while samples.len() < args.cycles || finished.load(Ordering::Relaxed) < args.uploads {
            let mut scheduler = template.clone();
            let mut cache = NodeCache::default();
            let started = Instant::now();
            scheduler.cycle(0.0, &mut healthy_set.bind(&mut cache));
            samples.push(started.elapsed());
            bar.inc(1);
        }
        bar.finish_and_clear();
        let outcomes: Vec<_> = uploads
            .into_iter()
            .map(|upload| upload.join().expect("an upload thread panicked"))
            .collect();
        (samples, outcomes)
    });
    let compiled = outcomes.iter().filter(|(_, r)| r.is_ok()).count();
    let mut errors: Vec<String> = outcomes
        .iter()
        .filter_map(|(_, r)| r.clone().err())
        .collect();
    errors.dedup();
    Ok(json!({
        "count": args.uploads,
        "mib_each": args.upload_mib,
        "compile_slots": gantry_policy::COMPILE_SLOTS,
        "compile_timeout_s": engine.limits().compile_timeout.as_secs(),
        "cycles_during_uploads": upload_cycles.len(),
        "cycles": summary(upload_cycles),
        "compiled": compiled,
        "refused": outcomes.len() - compiled,
        "refusals": errors,
        "compile_wall": summary(outcomes.iter().map(|(d, _)| *d).collect()),
    }))
}

/// `hostile-loop` under a 50 ms deadline, called `--timeouts` times on the cluster's nodes:
/// each call's time to its fault, and whether every fault was the timeout.
fn deadline_scenario(
    args: &FaultsBenchArgs,
    engine: &PolicyEngine,
    template: &Scheduler,
) -> anyhow::Result<serde_json::Value> {
    const DEADLINE: Duration = Duration::from_millis(50);
    let bytes = std::fs::read(args.plugins.resolve("hostile_loop.wasm")?)?;
    let policy = engine.load(
        &bytes,
        PolicyOptions {
            deadline: Some(DEADLINE),
            ..PolicyOptions::default()
        },
    )?;
    let nodes = gantry_policy::WasmNodes::new(&template.state.nodes);
    let pod = PodShape {
        gpus: 1,
        gang_size: 1,
        ..PodShape::default()
    };
    let mut took = Vec::with_capacity(args.timeouts);
    let mut other_faults = Vec::new();
    let bar = bar(args.timeouts as u64, "a never-ending filter");
    for _ in 0..args.timeouts {
        // A timed-out instance is replaced on the policy's own thread: time the call, not
        // the refill.
        policy.wait_ready(Duration::from_secs(60));
        let started = Instant::now();
        match policy.filter(&pod, &nodes) {
            Err(gantry_policy::PolicyFault::Timeout { .. }) => took.push(started.elapsed()),
            Err(fault) => other_faults.push(fault.to_string()),
            Ok(_) => other_faults.push("it answered".to_string()),
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    other_faults.dedup();
    let over_twice = took.iter().filter(|d| **d > DEADLINE * 2).count();
    Ok(json!({
        "deadline_ms": ms(DEADLINE),
        "calls": args.timeouts,
        "timed_out": took.len(),
        "other_faults": other_faults,
        "time_to_fault": summary(took),
        "over_twice_the_deadline": over_twice,
    }))
}

#[cfg(test)]
mod tests {
    use gantry_policy::{Capabilities, Limits, PolicyEngine, PolicyError};

    #[test]
    fn padding_makes_a_valid_component_of_the_size_asked() {
        // The smallest component: "\0asm", component version 0x0d, layer 1.
        let empty = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];
        let engine = PolicyEngine::new(Limits::default(), gantry_core::Symbols::new()).unwrap();
        for size in [1 << 10, 64 << 10, 16 << 20] {
            let padded = super::padded(&empty, size, 3);
            assert_eq!(padded.len(), size);
            // It parses and compiles; it is refused only for exporting no policy.
            let error = engine
                .compile(&padded, &Capabilities::default())
                .err()
                .unwrap();
            assert!(matches!(error, PolicyError::MissingWorld { .. }), "{error}");
        }
    }
}
