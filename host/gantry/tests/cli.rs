//! The `gantry` binary as a user runs it: exit codes and the lines they read.

use std::path::PathBuf;
use std::process::{Command, Output};

fn plugin_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target")))
        .join("wasm32-wasip2/plugin")
}

fn gantry(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gantry"))
        .args(args)
        .env("GANTRY_PLUGIN_DIR", plugin_dir())
        .output()
        .expect("run gantry")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn plugin(file: &str) -> String {
    plugin_dir().join(file).display().to_string()
}

#[test]
fn validate_prints_role_reasons_and_a_sample() {
    let out = gantry(&["policy", "validate", &plugin("gpu_fit.wasm")]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.starts_with("gpu-fit 0.1.0 — filter policy, "),
        "{stdout}"
    );
    assert!(
        stdout.contains("      3  Insufficient nvidia.com/gpu\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("sample: a pod asking 4 GPUs on 64 sample nodes: "),
        "{stdout}"
    );
    assert!(stdout.ends_with("ok\n"));

    let out = gantry(&["policy", "validate", &plugin("team_quota.wasm")]);
    assert!(out.status.success());
    assert!(text(&out.stdout).contains(
        "sample: a 128-GPU job from team-a (200 of 256 GPUs used): admit, borrowing 72 GPUs"
    ));
}

#[test]
fn a_bad_file_is_one_line_and_exit_code_2() {
    let not_wasm = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../plugins/hostile/wat/not-wasm.wasm"
    );
    let out = gantry(&["policy", "validate", not_wasm]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert_eq!(
        stderr,
        format!(
            "error: {not_wasm}: not a WebAssembly component: the file starts with bytes 54 68 69 73, not the \\0asm magic\n"
        )
    );
    assert!(out.stdout.is_empty());

    let out = gantry(&["policy", "validate", "/no/such/policy.wasm"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        "error: /no/such/policy.wasm: cannot read the file: No such file or directory (os error 2)\n"
    );
}

#[test]
fn bad_config_is_one_line_and_exit_code_2() {
    let out = gantry(&[
        "policy",
        "validate",
        &plugin("gpu_binpack.wasm"),
        "--config",
        r#"{"node_weight": -1}"#,
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(": the policy refused its config: gpu-binpack config: invalid value: integer `-1`, expected u32"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn a_policy_that_hangs_fails_validation() {
    let out = gantry(&[
        "policy",
        "validate",
        &plugin("hostile_loop.wasm"),
        "--deadline-ms",
        "20",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).ends_with(": the sample evaluation faulted: timed out after 20 ms\n")
    );
}

#[test]
fn bench_policy_prints_one_json_object() {
    let out = gantry(&[
        "bench",
        "policy",
        "--nodes",
        "300",
        "--millis-per-case",
        "20",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["nodes"], 300);
    for policy in ["gpu_fit", "gpu_binpack"] {
        for key in [
            "wasm_ns_per_node",
            "native_ns_per_node",
            "wasm_to_native",
            "call_overhead_ns",
        ] {
            assert!(
                report[policy][key].as_f64().is_some_and(|v| v > 0.0),
                "{policy}.{key}: {report}"
            );
        }
    }
    assert!(report["boundary_ns_per_node"].as_f64().is_some());
}

/// Two different filter policies side by side: both measured, and how often they agree; two
/// builds of one policy must agree and are not compared that way.
#[test]
fn bench_policy_compares_different_policies_of_one_role() {
    let (fit, keep_off, noop) = (
        plugin("gpu_fit.wasm"),
        plugin("keep_off.wasm"),
        plugin("noop.wasm"),
    );
    let out = gantry(&[
        "bench",
        "policy",
        "--nodes",
        "300",
        "--millis-per-case",
        "20",
        "--json",
        "--policy",
        &fit,
        "--policy",
        &keep_off,
        "--policy",
        &noop,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let policies = report["policies"].as_array().expect("policies");
    assert_eq!(policies.len(), 3, "{report}");
    assert!(policies[0]["same_answers_as"].is_null(), "{report}");
    // keep-off with no config keeps nothing off; gpu-fit turns away the nodes without room.
    let share = |i: usize| {
        assert_eq!(
            policies[i]["same_answers_as"]["file"], "gpu_fit.wasm",
            "{report}"
        );
        policies[i]["same_answers_as"]["share"]
            .as_f64()
            .expect("share")
    };
    assert!(share(1) > 0.0 && share(1) < 1.0, "{report}");
    assert_eq!(
        share(2),
        share(1),
        "noop and keep-off both let every node through"
    );
    for p in policies {
        assert!(p["ns_per_node"].as_f64().is_some_and(|v| v > 0.0), "{p}");
    }
}

fn shared(path: &str) -> String {
    format!("{}/../../../shared/{path}", env!("CARGO_MANIFEST_DIR"))
}

fn simulate(
    cluster: &str,
    trace: &str,
    extra: &[&str],
    report: &std::path::Path,
) -> serde_json::Value {
    let report_arg = report.display().to_string();
    let mut args = vec![
        "simulate",
        "--cluster",
        cluster,
        "--trace",
        trace,
        "--report",
        &report_arg,
    ];
    args.extend_from_slice(extra);
    let out = gantry(&args);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    serde_json::from_slice(&std::fs::read(report).unwrap()).unwrap()
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gantry-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn both_sample_traces_replay_with_the_wasm_policies_and_no_partial_gang() {
    let policies = ["gpu_fit.wasm", "gpu_binpack.wasm", "team_quota.wasm"].map(plugin);
    let mut extra = Vec::new();
    for policy in &policies {
        extra.extend(["--policy", policy.as_str()]);
    }
    for (cluster, trace, jobs) in [
        (
            "clusters/small-64.yaml",
            "traces/tiresias-60.gantry.csv",
            60,
        ),
        (
            "clusters/alibaba-openb-2023.yaml",
            "traces/alibaba-openb-default.gantry.csv",
            8151,
        ),
    ] {
        // The audit after every cycle is on by default: a double-allocated GPU fails the run.
        let report = simulate(
            &shared(cluster),
            &shared(trace),
            &extra,
            &temp("sample.json"),
        );
        assert_eq!(report["partial_gangs"], 0, "{trace}");
        assert_eq!(report["jobs_submitted"], jobs, "{trace}");
        assert_eq!(report["jobs_finished"], jobs, "{trace}");
    }
}

/// The saturated scenario in tests/scenarios/gang-burst: its cluster spec and trace.
fn gang_burst() -> (String, String) {
    let scenario = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/scenarios/gang-burst"
    );
    (
        format!("{scenario}/cluster.yaml"),
        format!("{scenario}/trace.csv"),
    )
}

#[test]
fn the_alibaba_sample_queues_on_its_divided_cluster_so_its_estimates_are_judged() {
    // tests/scenarios/alibaba-openb-128 exists so the planner's estimates can be judged on the
    // Alibaba sample (which never queues on the whole cluster): it must keep queueing jobs
    // that then get an estimate before they start. The accuracy itself is in the README.
    let cluster = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/scenarios/alibaba-openb-128/cluster.yaml"
    );
    let report = simulate(
        cluster,
        &shared("traces/alibaba-openb-default.gantry.csv"),
        // A forecast every 10 minutes keeps this run short; the README's figures use the
        // default.
        &["--no-wall-clock", "--forecast-every-s", "600"],
        &temp("alibaba-128.json"),
    );
    assert_eq!(report["jobs_submitted"], 8151, "{report}");
    // Hundreds of them: 810 with these flags in November 2026 (672 before jobs without GPUs
    // stopped evicting each other; 2,212 while reservations kept nodes idle behind jobs that
    // had run for days).
    let judged = report["estimates"]["jobs"].as_u64().expect("a count");
    assert!(judged >= 500, "only {judged} jobs were judged: {report}");
}

#[test]
fn a_negative_forecast_interval_is_refused_by_name() {
    let (cluster, trace) = gang_burst();
    let report = temp("negative-forecast.json");
    let out = gantry(&[
        "simulate",
        "--cluster",
        &cluster,
        "--trace",
        &trace,
        "--forecast-every-s=-5",
        "--report",
        report.to_str().expect("path"),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert_eq!(
        stderr,
        "error: --forecast-every-s must be a number of seconds, 0 or more\n"
    );
    assert!(!report.exists(), "no report is written");
}

/// The gang-burst report as the last blessed build made it (`--no-wall-clock --seed 3`), from
/// the workspace root: a change to what the simulator or the scheduler decides shows up as a
/// diff of it, reviewed with the change.
const GANG_BURST_GOLDEN: &str = "tests/scenarios/gang-burst/report.golden.json";

/// `actual` must be the checked-in golden file at `relative` (from the workspace root), or,
/// with `GANTRY_WRITE_GENERATED=1`, becomes it.
fn check_golden(relative: &str, actual: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative);
    if std::env::var("GANTRY_WRITE_GENERATED").is_ok_and(|v| v == "1") {
        std::fs::write(&path, actual).expect("write the golden file");
        return;
    }
    let golden = std::fs::read_to_string(&path).unwrap_or_default();
    let first_difference = golden
        .lines()
        .zip(actual.lines())
        .position(|(a, b)| a != b)
        .map_or_else(String::new, |line| {
            format!(
                " (first at line {}: {:?} is now {:?})",
                line + 1,
                golden.lines().nth(line).unwrap_or_default(),
                actual.lines().nth(line).unwrap_or_default()
            )
        });
    assert!(
        golden == actual,
        "{relative} is not the report this build makes{first_difference}.\n\
         If the change is meant, bless it and commit it with the change:\n  \
         GANTRY_WRITE_GENERATED=1 cargo test --release -p gantry --test cli byte_identical"
    );
}

#[test]
fn the_same_inputs_give_byte_identical_reports_and_estimates() {
    let (cluster, trace) = gang_burst();
    let (a, b) = (temp("a.json"), temp("b.json"));
    let (a_csv, b_csv) = (temp("a.csv"), temp("b.csv"));
    let run = |report: &PathBuf, csv: &PathBuf| {
        let csv = csv.display().to_string();
        let extra = ["--no-wall-clock", "--seed", "3", "--estimates", &csv];
        simulate(&cluster, &trace, &extra, report)
    };
    let report = run(&a, &a_csv);
    run(&b, &b_csv);
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    check_golden(GANG_BURST_GOLDEN, &std::fs::read_to_string(&a).unwrap());
    assert_eq!(
        std::fs::read(&a_csv).unwrap(),
        std::fs::read(&b_csv).unwrap()
    );
    // One row per job that waited and had an estimate; those told within a minute are the
    // judged ones, and the report's accuracy is theirs.
    let rows = std::fs::read_to_string(&a_csv).unwrap();
    let mut lines = rows.lines();
    assert_eq!(
        lines.next(),
        Some("job,queue,gpus,submitted_s,estimated_at_s,p10_s,p50_s,p90_s,started_s,baseline_s")
    );
    let field = |cells: &[&str], i: usize| cells[i].parse::<f64>().unwrap();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let estimates = &report["estimates"];
    let judged: Vec<&Vec<&str>> = rows
        .iter()
        .filter(|r| field(r, 4) - field(r, 3) <= 60.0)
        .collect();
    assert_eq!(judged.len() as u64, estimates["jobs"].as_u64().unwrap());
    assert_eq!(
        (rows.len() - judged.len()) as u64,
        estimates["estimated_after_a_minute"].as_u64().unwrap()
    );
    let within = judged
        .iter()
        .filter(|r| (field(r, 5) - 1.0..=field(r, 7) + 1.0).contains(&field(r, 8)))
        .count();
    let share = estimates["within_interval"].as_f64().unwrap();
    assert!((within as f64 / judged.len() as f64 - share).abs() < 1e-6);
    // The baseline was planned for the judged jobs, and its error is theirs.
    let baseline = &estimates["baseline"];
    let planned: Vec<f64> = judged
        .iter()
        .filter(|r| !r[9].is_empty())
        .map(|r| (field(r, 9) - field(r, 8)).abs())
        .collect();
    assert!(
        planned.len() * 10 >= judged.len() * 9,
        "the baseline reached {} of {} judged jobs",
        planned.len(),
        judged.len()
    );
    assert_eq!(baseline["jobs"].as_u64().unwrap(), planned.len() as u64);
    println!("estimates on gang-burst: {estimates}");
}

/// The diagnostic mode hands the forecast the trace's true future (its submissions to come and
/// every job's true runtime). A forecast that steps the engine's own loop, with the same queue,
/// quota, reservations and policies, must then start every job exactly when the replay does,
/// and the mode must change no placement.
#[test]
fn the_forecast_handed_the_true_future_starts_every_job_when_the_replay_does() {
    let (cluster, trace) = gang_burst();
    let csv = temp("known.csv");
    let scale = ["--time-scale", "0.2"];
    let plain = simulate(&cluster, &trace, &scale, &temp("plain-0.2.json"));
    let csv_arg = csv.display().to_string();
    let known = simulate(
        &cluster,
        &trace,
        &[
            "--time-scale",
            "0.2",
            "--known-future",
            "--estimates",
            &csv_arg,
        ],
        &temp("known-0.2.json"),
    );
    assert_eq!(
        known["wait"], plain["wait"],
        "the mode changed the schedule"
    );
    let estimates = &known["estimates"];
    println!("the known future at 0.2: {estimates}");
    assert_eq!(estimates["future"], "known");
    assert!(estimates["jobs"].as_u64().unwrap() >= 200, "{estimates}");
    let rows = std::fs::read_to_string(&csv).unwrap();
    let mut missed = Vec::new();
    for line in rows.lines().skip(1) {
        let cells: Vec<&str> = line.split(',').collect();
        let (p50, started) = (
            cells[6].parse::<f64>().unwrap(),
            cells[8].parse::<f64>().unwrap(),
        );
        if (p50 - started).abs() > 0.5 {
            missed.push(format!("{}: told {p50}, started {started}", cells[0]));
        }
    }
    assert!(
        missed.is_empty(),
        "the forecast missed {} starts: {missed:?}",
        missed.len()
    );
    assert_eq!(estimates["median_abs_error_s"], 0.0);
    assert_eq!(estimates["within_interval"], 1.0);
    // An anchor scheduler has no forecast to check: refused, with what to drop.
    let out = gantry(&[
        "simulate",
        "--cluster",
        &cluster,
        "--trace",
        &trace,
        "--report",
        &temp("refused.json").display().to_string(),
        "--known-future",
        "--baseline",
        "kueue",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--known-future checks Gantry's forecast"),
        "{}",
        text(&out.stderr)
    );
}

/// The p99 wait no schedule that never evicts can beat on gang-burst as given (`--time-scale
/// 1`), derived from the trace alone, and the README states it. Nearest rank: the p99 of 400
/// waits is the fifth longest, so five jobs must wait at least that long. When the fifth-last
/// job to start starts (at T), every job but it and the last four has started; those still
/// running hold at most the cluster's GPUs, and hold at most the most GPU-seconds any set of
/// jobs that fits on it needs (a knapsack over the trace); the last four need at most the four
/// largest jobs' GPU-seconds. The rest was done on 256 GPUs since the first submission, which
/// bounds T from below; every one of the five arrived by the last submission.
#[test]
fn the_readme_states_gang_bursts_p99_lower_bound_as_the_trace_gives_it() {
    let (_, trace) = gang_burst();
    let jobs = gantry_sim::Trace::load(&trace).unwrap();
    let gpus = 256usize;
    let work = |job: &gantry_sim::TraceJob| f64::from(job.pods * job.gpus_per_pod) * job.duration_s;
    let total: f64 = jobs.iter().map(work).sum();
    let mut best = vec![0.0f64; gpus + 1];
    for job in &jobs {
        let need = (job.pods * job.gpus_per_pod) as usize;
        for held in (need..=gpus).rev() {
            best[held] = best[held].max(best[held - need] + work(job));
        }
    }
    let mut works: Vec<f64> = jobs.iter().map(work).collect();
    works.sort_by(f64::total_cmp);
    let last_four: f64 = works.iter().rev().take(4).sum();
    let first = jobs
        .iter()
        .map(|j| j.submit_s)
        .fold(f64::INFINITY, f64::min);
    let last = jobs.iter().map(|j| j.submit_s).fold(0.0, f64::max);
    let fifth_last_start = first + (total - best[gpus] - last_four) / gpus as f64;
    let bound = (fifth_last_start - last).floor() as u64;
    let stated = format!("{},{:03} s", bound / 1000, bound % 1000);
    println!("gang-burst p99 lower bound: {stated}");
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    assert!(
        readme.contains(&format!("p99 lower bound of {stated}")),
        "the README does not state the p99 lower bound of {stated}"
    );
}

/// gang-burst below saturation (`--time-scale 0.2`, about 94% load), on its own spec and on
/// `tests/scenarios/gang-burst-flat`: the 128-GPU gangs, which starved for up to 17 hours when
/// only jobs blocked for room got reservations, start far sooner once aged jobs hold
/// reservations of nodes and quota, whatever blocks them. The same run with the backlog gate
/// shut (`--backlog-limit-s 0`: only queue heads waiting for room reserve, as before) is the
/// comparison. The figures are printed for the README; the checks are what must hold.
#[test]
fn below_saturation_aged_reservations_end_the_big_gangs_starvation() {
    let (cluster, trace) = gang_burst();
    let flat = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/scenarios/gang-burst-flat/cluster.yaml"
    );
    for (name, cluster) in [("gang-burst", cluster.as_str()), ("gang-burst-flat", flat)] {
        let scale = ["--time-scale", "0.2"];
        let aged = simulate(cluster, &trace, &scale, &temp(&format!("{name}-aged.json")));
        let shut = simulate(
            cluster,
            &trace,
            &["--time-scale", "0.2", "--backlog-limit-s", "0"],
            &temp(&format!("{name}-shut.json")),
        );
        let figures = |r: &serde_json::Value| {
            serde_json::json!({
                "mean_s": r["wait"]["mean_s"],
                "p99_s": r["wait"]["p99_s"],
                "worst_128_gpu_gang_s": r["wait_by_gpus"]["128"]["max_s"],
                "gpu_allocation_while_queued": r["gpu_allocation_while_queued"],
            })
        };
        println!(
            "{name} at 0.2: {}",
            serde_json::json!({"aged": figures(&aged), "gate_shut": figures(&shut)})
        );
        for report in [&aged, &shut] {
            assert_eq!(report["partial_gangs"], 0, "{name}: {report}");
            assert_eq!(report["jobs_finished"], 400, "{name}: {report}");
        }
        let worst = |r: &serde_json::Value| r["wait_by_gpus"]["128"]["max_s"].as_f64().unwrap();
        let p99 = |r: &serde_json::Value| r["wait"]["p99_s"].as_f64().unwrap();
        assert!(
            worst(&aged) < 0.75 * worst(&shut) && p99(&aged) < 0.9 * p99(&shut),
            "{name}: aged reservations left the worst 128-GPU gang at {} s (gate shut: {} s) \
             and the p99 at {} s ({} s)",
            worst(&aged),
            worst(&shut),
            p99(&aged),
            p99(&shut)
        );
        // The planner issue's lines: p99 ≤ 18,000 s on both specs; on the spec as given,
        // every 128-GPU gang ≤ 21,600 s and the mean ≤ 3,600 s; on the flat spec the mean
        // ≤ 3,100 s.
        assert!(p99(&aged) <= 18_000.0, "{name}: p99 {} s", p99(&aged));
        let mean = aged["wait"]["mean_s"].as_f64().unwrap();
        if name == "gang-burst" {
            assert!(
                worst(&aged) <= 21_600.0 && mean <= 3_600.0,
                "{name}: worst 128-GPU gang {} s, mean {mean} s",
                worst(&aged)
            );
        } else {
            assert!(mean <= 3_100.0, "{name}: mean {mean} s");
        }
    }
}

#[test]
fn on_a_saturated_mix_gantry_beats_the_anchors_and_never_runs_a_gang_partially() {
    let (cluster, trace) = gang_burst();
    let gantry = simulate(&cluster, &trace, &[], &temp("g.json"));
    let stock = simulate(
        &cluster,
        &trace,
        &["--baseline", "k8s-default"],
        &temp("k.json"),
    );
    let cosched = simulate(
        &cluster,
        &trace,
        &["--baseline", "coscheduling"],
        &temp("c.json"),
    );
    let kueue = simulate(&cluster, &trace, &["--baseline", "kueue"], &temp("q.json"));
    assert_eq!(gantry["partial_gangs"], 0);
    assert_eq!(cosched["partial_gangs"], 0);
    assert!(stock["partial_gangs"].as_u64().unwrap() > 0, "{stock}");
    // Kueue admits whole workloads, but kube-scheduler behind it still places pods one by one.
    assert!(kueue["partial_gangs"].as_u64().unwrap() > 0, "{kueue}");
    assert_eq!(kueue["jobs_finished"], 400, "{kueue}");
    assert_eq!(gantry["scheduler"], "gantry");
    assert_eq!(stock["scheduler"], "k8s-default");
    assert_eq!(kueue["scheduler"], "kueue");
    // On this saturated mix Gantry's default beats both anchors on mean wait and on the GPUs
    // doing work while jobs queue (the figures are in the README).
    let f = |report: &serde_json::Value, path: &[&str]| {
        path.iter()
            .fold(report, |v, k| &v[*k])
            .as_f64()
            .expect("number")
    };
    for anchor in [&stock, &cosched] {
        assert!(
            f(&gantry, &["wait", "mean_s"]) < f(anchor, &["wait", "mean_s"]),
            "{anchor}"
        );
        assert!(
            f(&gantry, &["gpu_allocation_while_queued"])
                > f(anchor, &["gpu_allocation_while_queued"]),
            "{anchor}"
        );
    }
    // The planner issue's lines above saturation: reservations do no harm here.
    assert!(
        f(&gantry, &["wait", "mean_s"]) <= 13_000.0
            && f(&gantry, &["wait", "p99_s"]) <= 76_000.0
            && f(&gantry, &["gpu_allocation_while_queued"]) >= 0.97,
        "{gantry}"
    );
    // Over the window every scheduler shares (first to last submission), Gantry keeps more
    // GPUs doing work than all three, Kueue included.
    for anchor in [&stock, &cosched, &kueue] {
        assert!(
            f(&gantry, &["gpu_allocation_common_window"])
                > f(anchor, &["gpu_allocation_common_window"]),
            "{anchor}"
        );
    }
}

/// A seeded trace for small-64 in which a third of the jobs have a higher priority and preempt
/// the others: `jobs` rows, every ~25 s, single pods of 1–8 GPUs and gangs of 2–8 × 8 GPUs,
/// 10 to 70 minutes each. Returns the CSV, each job's duration and the first submit time.
fn preempting_trace(jobs: usize) -> (String, std::collections::HashMap<String, f64>, f64) {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut csv = String::from("job_id,submit_s,duration_s,pods,gpus_per_pod,queue,priority\n");
    let mut durations = std::collections::HashMap::new();
    let mut t = 0u64;
    let mut first_submit = None;
    for i in 0..jobs {
        t += 5 + next() % 40;
        first_submit.get_or_insert(t as f64);
        let (pods, gpus) = if next() % 100 < 40 {
            ([2, 4, 8][(next() % 3) as usize], 8)
        } else {
            (1, [1, 2, 4, 8][(next() % 4) as usize])
        };
        let queue = ["team-a", "team-a", "team-b", "default"][(next() % 4) as usize];
        let priority = if next() % 3 == 0 { 10 } else { 0 };
        let duration = 600 + next() % 3600;
        let name = format!("p-{i:04}");
        csv += &format!("{name},{t},{duration},{pods},{gpus},{queue},{priority}\n");
        durations.insert(name, duration as f64);
    }
    (csv, durations, first_submit.unwrap_or(0.0))
}

/// The acceptance test for stale completions. A cycle no longer evicts what it placed itself,
/// so the old way in (place and evict in one cycle) is gone; a job preempted and placed again
/// later is the case left. Replay a trace with preemption, then replay its decision log alone:
/// placements from each placed decision (node names, pods, GPUs per pod), evictions from each
/// decision's `preempted` list, completions at each placement's time plus the trace's
/// duration, before any decision of the same instant (as the simulator orders them). No node
/// may ever hold more GPUs than it has; a job preempted must still run (it had not ended); a
/// job placed must not (the simulator did not end it early); and the finished jobs and the
/// makespan must be the simulator's. A replay that let a stale completion end a re-placed job
/// fails here: it frees GPUs the job still holds and fills a node beyond its capacity.
#[test]
fn the_decision_log_replayed_alone_never_overfills_a_node_nor_ends_a_job_early() {
    use std::collections::HashMap;
    let (csv, durations, first_submit) = preempting_trace(400);
    let trace = temp("preempting.csv");
    std::fs::write(&trace, csv).unwrap();
    let log = temp("preempting.jsonl");
    let log_arg = log.display().to_string();
    let report = simulate(
        &shared("clusters/small-64.yaml"),
        &trace.display().to_string(),
        &["--decisions", &log_arg],
        &temp("preempting.json"),
    );
    let capacity = |node: &str| -> u64 {
        match node.split_once('-').map(|(pool, _)| pool) {
            Some("h100") => 8,
            Some("l4") => 4,
            _ => panic!("small-64 has no node {node}"),
        }
    };
    // Running jobs: their (node, GPUs) and when they end.
    let mut running: HashMap<String, (Vec<(String, u64)>, f64)> = HashMap::new();
    let mut used: HashMap<String, u64> = HashMap::new();
    let free = |used: &mut HashMap<String, u64>, nodes: &[(String, u64)]| {
        for (node, gpus) in nodes {
            *used.get_mut(node).expect("a node in use") -= gpus;
        }
    };
    let (mut finished, mut last_end, mut now) = (0u64, 0.0f64, 0.0f64);
    let (mut evictions, mut placed_again) = (0u64, 0u64);
    let mut ever_evicted = std::collections::HashSet::new();
    let text = std::fs::read_to_string(&log).unwrap();
    for line in text.lines() {
        let d: serde_json::Value = serde_json::from_str(line).unwrap();
        let t = d["time_s"].as_f64().unwrap();
        assert!(t >= now, "the log goes back in time: {t} after {now}");
        now = t;
        // Completions due by now, before this instant's decisions.
        loop {
            let due = running
                .iter()
                .filter(|(_, (_, end))| *end <= now)
                .min_by(|a, b| a.1.1.total_cmp(&b.1.1).then(a.0.cmp(b.0)))
                .map(|(job, _)| job.clone());
            let Some(job) = due else { break };
            let (nodes, end) = running.remove(&job).unwrap();
            free(&mut used, &nodes);
            finished += 1;
            last_end = last_end.max(end);
        }
        let job = d["job"].as_str().unwrap().to_string();
        for victim in d["preempted"].as_array().unwrap() {
            let victim = victim.as_str().unwrap();
            let (nodes, _) = running.remove(victim).unwrap_or_else(|| {
                panic!("at {now} s {job} preempted {victim}, which had already ended")
            });
            free(&mut used, &nodes);
            evictions += 1;
            ever_evicted.insert(victim.to_string());
        }
        if d["outcome"]["kind"] != "placed" {
            continue;
        }
        assert!(
            !running.contains_key(&job),
            "at {now} s {job} was placed again while it still runs: it ended early"
        );
        let gpus_per_pod = d["gpus_per_pod"].as_u64().unwrap();
        let mut nodes = Vec::new();
        for pair in d["outcome"]["nodes"].as_array().unwrap() {
            let node = pair[0].as_str().unwrap().to_string();
            let gpus = pair[1].as_u64().unwrap() * gpus_per_pod;
            let on_node = used.entry(node.clone()).or_default();
            *on_node += gpus;
            assert!(
                *on_node <= capacity(&node),
                "at {now} s node {node} holds {on_node} GPUs of {} ({job} placed on it)",
                capacity(&node)
            );
            nodes.push((node, gpus));
        }
        placed_again += u64::from(ever_evicted.contains(&job));
        running.insert(job.clone(), (nodes, now + durations[&job]));
    }
    for (_, end) in running.into_values() {
        finished += 1;
        last_end = last_end.max(end);
    }
    assert_eq!(evictions, report["preemptions"].as_u64().unwrap());
    assert!(
        evictions > 0 && placed_again > 0,
        "no job was preempted and placed again"
    );
    assert_eq!(finished, report["jobs_finished"].as_u64().unwrap());
    assert!(
        (last_end - first_submit - report["makespan_s"].as_f64().unwrap()).abs() < 1e-6,
        "the log's last completion is at {last_end} s, the report's makespan {}",
        report["makespan_s"]
    );
}

#[test]
fn a_trace_naming_an_unknown_queue_is_refused_with_its_line() {
    let trace = temp("bad-queue.csv");
    std::fs::write(&trace, "job_id,submit_s,duration_s,pods,gpus_per_pod,queue\nj1,0,10,1,1,default\nj2,5,10,1,1,nosuch\n").unwrap();
    let out = gantry(&[
        "simulate",
        "--cluster",
        &shared("clusters/small-64.yaml"),
        "--trace",
        &trace.display().to_string(),
        "--report",
        &temp("unused.json").display().to_string(),
    ]);
    assert!(!out.status.success());
    assert_eq!(
        text(&out.stderr),
        "error: bad-queue.csv line 3: queue \"nosuch\" is not declared in cluster spec small-64\n"
    );
}

#[test]
fn serve_schedules_the_simulated_cluster_and_logs_progress() {
    let data = tempfile::tempdir().expect("tempdir");
    let out = gantry(&[
        "serve",
        "--duration-s",
        "3",
        "--log-every-s",
        "1",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.path().to_str().expect("path"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("gantry serve: simulating openai-like-7500 (7500 nodes, 60000 GPUs)"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("t=") && l.contains(" placed ")),
        "{stdout}"
    );
}

/// `gantry bench server`, small: every viewer upload is refused from its headers, the
/// slow viewer requests past the viewers' share are refused at once and the admin is still
/// answered, and the probes all answer. Its times are printed, not judged.
#[test]
fn bench_server_refuses_viewer_uploads_and_keeps_the_admins_share() {
    let cluster = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/clusters/small-64.yaml"
    );
    let out = gantry(&[
        "bench",
        "server",
        "--cluster",
        cluster,
        "--jobs-per-s",
        "2",
        "--probes",
        "20",
        "--uploads",
        "4",
        "--upload-mib",
        "8",
        "--slow",
        "200",
        "--readers",
        "4",
        "--read-s",
        "2",
        "--read-limit",
        "100",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    println!("{report}");
    let uploads = &report["viewer_uploads"];
    assert_eq!(
        uploads["statuses"],
        serde_json::json!({"HTTP/1.1 403 Forbidden": 4}),
        "{report}"
    );
    let slow = &report["slow_requests"];
    // 200 over 8 viewer tokens: 8 past the viewers' share of 192.
    assert_eq!(
        slow["answered_at_once"],
        serde_json::json!({"HTTP/1.1 429 Too Many Requests": 8}),
        "{report}"
    );
    assert_eq!(slow["admin_whoami_status"], 200, "{report}");
    for scenario in ["probes_idle", "slow_requests", "heavy_reads"] {
        let probes = if scenario == "probes_idle" {
            &report[scenario]
        } else {
            &report[scenario]["probes"]
        };
        assert!(
            probes["p99_ms"].as_f64().is_some(),
            "a probe failed in {scenario}: {report}"
        );
    }
    assert!(
        report["heavy_reads"]["reads_answered"].as_u64() > Some(0),
        "{report}"
    );
}

#[test]
fn bench_store_prints_one_json_object() {
    let out = gantry(&[
        "bench",
        "store",
        "--records",
        "2000",
        "--batch",
        "500",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["records"], 2000);
    assert!(
        report["records_per_s"].as_f64().is_some_and(|v| v > 0.0),
        "{report}"
    );
}

#[test]
fn serve_refuses_a_corrupt_data_dir_and_leaves_it_alone() {
    let data = tempfile::tempdir().expect("tempdir");
    let store = data.path().join("store");
    std::fs::create_dir_all(&store).expect("mkdir");
    std::fs::write(store.join("notes.txt"), "mine").expect("write");
    let out = gantry(&[
        "serve",
        "--duration-s",
        "1",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.path().to_str().expect("path"),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(&format!(
            "error: cannot open the Gantry store at {}: the directory holds other files (notes.txt)",
            store.display()
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(store.join("notes.txt")).expect("kept"),
        "mine"
    );
}

#[test]
fn serve_refuses_a_malformed_token_file() {
    let data = tempfile::tempdir().expect("tempdir");
    let tokens = data.path().join("tokens.yaml");
    std::fs::write(
        &tokens,
        "tokens:\n  - {name: a, role: root, token: 0123456789abcdef}\n",
    )
    .expect("write");
    let out = gantry(&[
        "serve",
        "--duration-s",
        "1",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.path().to_str().expect("path"),
        "--tokens",
        tokens.to_str().expect("path"),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(&format!(
            "error: the token file {} is malformed: ",
            tokens.display()
        )),
        "{stderr}"
    );
}

#[test]
fn the_cli_names_a_server_that_is_not_there() {
    let out = gantry(&[
        "policy",
        "list",
        "--server",
        "http://127.0.0.1:9",
        "--token",
        "0123456789abcdef0123",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("error: cannot reach the Gantry server at http://127.0.0.1:9: "),
        "{stderr}"
    );
}

#[test]
fn bench_activate_prints_one_json_object() {
    let out = gantry(&["bench", "activate", "--activations", "4", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["activations"], 4);
    assert_eq!(report["cycle_failures"], 0);
    assert!(
        report["takes_effect_after_return_ms"]["p99"].is_number(),
        "{report}"
    );
}
