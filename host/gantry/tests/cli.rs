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
