//! `gantry bench activate`: how soon a policy set takes effect after the activation call
//! returns. The simulated 7,500-node cluster runs under load in this process, with the API on a
//! loopback port; the benchmark alternates two set versions over HTTP and times, for each call,
//! the call itself and the gap between its response and the start of the first cycle that runs
//! the new set (0 when such a cycle started before the response arrived).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use gantry_core::Symbols;
use gantry_engine::Shutdown;
use serde_json::json;

use crate::serve::{Load, ServerArgs, SimCluster, run_loop, start_api, start_live};

#[derive(Args, Debug)]
pub struct ActivateBenchArgs {
    /// Activations to time (alternating between two set versions).
    #[arg(long, default_value_t = 100)]
    activations: usize,
    /// Cluster spec to simulate.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/clusters/openai-like-7500.yaml"))]
    cluster: PathBuf,
    /// New jobs per second of the synthetic load while measuring.
    #[arg(long, default_value_t = 40.0)]
    jobs_per_s: f64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    plugins: crate::policy::PluginDir,
}

fn summary(mut ms: Vec<f64>) -> serde_json::Value {
    ms.sort_by(f64::total_cmp);
    let r = |x: f64| (x * 1000.0).round() / 1000.0;
    json!({
        "p50": r(gantry_core::percentile(&ms, 50.0)),
        "p99": r(gantry_core::percentile(&ms, 99.0)),
        "max": r(ms.last().copied().unwrap_or(0.0)),
    })
}

pub fn run(args: ActivateBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.activations > 0, "--activations must be at least 1");
    let result = super::in_temp_dir("activate", |dir| measure(&args, dir))?;
    if args.json {
        outln!("{}", serde_json::to_string(&result)?);
    } else {
        outln!(
            "{} activations on {} nodes: the call took p50 {} ms, p99 {} ms; the new set ran from p50 {} ms, p99 {} ms (max {} ms) after the call returned",
            result["activations"],
            result["nodes"],
            result["api_call_ms"]["p50"],
            result["api_call_ms"]["p99"],
            result["takes_effect_after_return_ms"]["p50"],
            result["takes_effect_after_return_ms"]["p99"],
            result["takes_effect_after_return_ms"]["max"],
        );
    }
    Ok(())
}

fn measure(args: &ActivateBenchArgs, dir: &std::path::Path) -> anyhow::Result<serde_json::Value> {
    let symbols = Symbols::new();
    let sim = SimCluster::load(&args.cluster, &symbols)?;
    let nodes = sim.scheduler.state.len();
    let tokens = dir.join("tokens.yaml");
    let (admin, _) = gantry_server::Tokens::generate(&tokens)?;
    let server = ServerArgs {
        data_dir: dir.join("data"),
        tokens: Some(tokens),
        max_upload_mib: 16,
        retention_days: 1,
        retention_mib: 256,
        tls_cert: None,
        tls_key: None,
        metrics_need_token: false,
        trusted_proxies: Vec::new(),
        policy_budget_ms: 250,
    };
    let (live, door) = start_live(&server, symbols, Some(&args.plugins), false)?;
    // The second version: the example set without the score policy.
    let first = live
        .store
        .active()?
        .ok_or_else(|| anyhow::anyhow!("no active set after start"))?;
    let mut entries = first.entries.clone();
    entries.remove(1);
    let second = live.store.put_set(
        &gantry_store::Actor::new("bench", "bench"),
        entries,
        "bench: without gpu-binpack",
        gantry_engine::now_ms(),
    )?;
    let stop = Shutdown::new();
    let (addr, api) = start_api(live.clone(), door, "127.0.0.1:0".parse()?, stop.clone())?;
    let load = Load {
        jobs_per_s: args.jobs_per_s,
        seed: 7,
        balloons: 500,
        max_pods: None,
        warm_start: false,
        duration_s: None,
        log_every_s: None,
        // Activation latency, not the health lifecycle, is measured here.
        failures: None,
    };
    let scheduler = {
        let live = live.clone();
        let stop = stop.clone();
        std::thread::spawn(move || run_loop(sim, live, &stop, &load))
    };
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut versions = live.cycle_versions();
    // Let the cluster fill up first, so cycles carry real work.
    std::thread::sleep(Duration::from_secs(3));
    let mut call_ms = Vec::with_capacity(args.activations);
    let mut effect_ms = Vec::with_capacity(args.activations);
    let mut jitter = 0x2545_F491_4F6C_DD1D_u64;
    let outcome = (|| -> anyhow::Result<()> {
        for i in 0..args.activations {
            let (version, verb) = if i % 2 == 0 {
                (second.version, "activate")
            } else {
                (first.version, "rollback")
            };
            let url = format!("http://{addr}/api/sets/{version}/{verb}");
            let sent = Instant::now();
            let mut response = agent
                .post(&url)
                .header("Authorization", format!("Bearer {admin}"))
                .send_empty()?;
            let returned = Instant::now();
            let status = response.status().as_u16();
            anyhow::ensure!(
                status == 200,
                "{verb} {version}: {status} {}",
                response.body_mut().read_to_string().unwrap_or_default()
            );
            call_ms.push((returned - sent).as_secs_f64() * 1e3);
            let deadline = returned + Duration::from_secs(10);
            let started = loop {
                let (v, at) = *versions.borrow_and_update();
                if v == version && at >= sent {
                    break at;
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "set version {version} did not take effect within 10 s"
                );
                std::thread::sleep(Duration::from_micros(100));
            };
            effect_ms.push(started.saturating_duration_since(returned).as_secs_f64() * 1e3);
            // 100–200 ms apart, so calls land at every phase of the loop's cycle.
            jitter ^= jitter << 13;
            jitter ^= jitter >> 7;
            jitter ^= jitter << 17;
            std::thread::sleep(Duration::from_millis(100 + jitter % 100));
        }
        Ok(())
    })();
    stop.trigger();
    let _ = scheduler.join();
    Shutdown::join_by(api, crate::serve::API_PATIENCE);
    outcome?;
    Ok(json!({
        "activations": args.activations,
        "nodes": nodes,
        "loop_pause_ms": 50,
        "api_call_ms": summary(call_ms),
        "takes_effect_after_return_ms": summary(effect_ms),
        "cycle_failures": live.metrics.cycle_failures.get(),
    }))
}
