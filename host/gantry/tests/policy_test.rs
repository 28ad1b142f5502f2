//! `gantry policy test`: the shared case folders in `plugins/cases/` pass for every build of a
//! policy (Rust, Python, JavaScript), a wrong answer prints a readable diff and exits 1, and a
//! broken case or policy exits 2 with one line naming the problem.

use std::path::{Path, PathBuf};
use std::process::Command;

fn plugin_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target")));
    target.join("wasm32-wasip2/plugin")
}

/// A policy built by `scripts/build-plugins.sh`, by file name.
fn plugin(file: &str) -> PathBuf {
    let path = plugin_dir().join(file);
    assert!(
        path.exists(),
        "{} is missing: build the policies first with scripts/build-plugins.sh",
        path.display()
    );
    path
}

fn cases(policy: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../plugins/cases")
        .join(policy)
}

/// Exit code, stdout and stderr of `gantry policy test FILE --cases DIR`.
fn policy_test(file: &Path, dir: &Path) -> (i32, String, String) {
    policy_test_with(file, dir, &[])
}

fn policy_test_with(file: &Path, dir: &Path, extra: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gantry"))
        .args(["policy", "test"])
        .arg(file)
        .arg("--cases")
        .arg(dir)
        .args(extra)
        .output()
        .expect("run gantry");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every case in `folder` passes for `file`, and the closing line counts all of them.
fn assert_passes(file: &str, folder: &str) {
    assert_passes_with(file, folder, &[]);
}

fn assert_passes_with(file: &str, folder: &str, extra: &[&str]) {
    let dir = cases(folder);
    let count = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "yaml"))
        })
        .count();
    assert!(count >= 4, "{folder} has only {count} cases");
    let (code, stdout, stderr) = policy_test_with(&plugin(file), &dir, extra);
    assert_eq!(code, 0, "{file} against {folder}:\n{stdout}{stderr}");
    assert!(
        stdout
            .lines()
            .any(|line| line == format!("{count} passed, 0 failed")),
        "{stdout}"
    );
}

#[test]
fn rust_policies_pass_the_shared_cases() {
    assert_passes("gpu_fit.wasm", "gpu-fit");
    assert_passes("gpu_binpack.wasm", "gpu-binpack");
    assert_passes("team_quota.wasm", "team-quota");
    assert_passes("keep_off.wasm", "keep-off");
    // Contract 0.2.0: label columns, domain names and score reasons.
    assert_passes("label_affinity.wasm", "label-affinity");
}

/// The same case folders, the Python and JavaScript builds. Each case loads the policy afresh,
/// and instantiating a Python or JS component takes about 10 ms of the 50 ms default deadline:
/// a longer one keeps a loaded two-core test machine from failing a case on time rather than on
/// its answer (`tests/languages.rs` in gantry-policy checks the 50 ms deadline itself).
#[test]
fn python_and_js_policies_pass_the_same_cases() {
    let patient = ["--deadline-ms", "2000"];
    assert_passes_with("gpu_fit_py.wasm", "gpu-fit", &patient);
    assert_passes_with("gpu_fit_js.wasm", "gpu-fit", &patient);
    assert_passes_with("gpu_binpack_py.wasm", "gpu-binpack", &patient);
    assert_passes_with("team_quota_js.wasm", "team-quota", &patient);
}

fn write_case(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

#[test]
fn a_wrong_answer_prints_a_diff_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    write_case(
        dir.path(),
        "wrong.yaml",
        "description: claims a 3-free node fits a 4-GPU pod\n\
         cluster:\n  nodes:\n    - {name: roomy, free: 8}\n    - {name: tight, free: 3}\n\
         pod: {gpus: 4}\n\
         expect:\n  verdicts: {roomy: fits, tight: fits}\n",
    );
    write_case(
        dir.path(),
        "right.yaml",
        "cluster:\n  nodes: [{name: roomy}]\npod: {gpus: 4}\nexpect:\n  verdicts: {roomy: fits}\n",
    );
    let (code, stdout, _) = policy_test(&plugin("gpu_fit.wasm"), dir.path());
    assert_eq!(code, 1, "{stdout}");
    let expected = "\
  ok    right.yaml
  FAIL  wrong.yaml: claims a 3-free node fits a 4-GPU pod
        node   expected  got
        tight  fits      Insufficient nvidia.com/gpu (3)
1 passed, 1 failed
";
    assert!(stdout.ends_with(expected), "{stdout}");
}

#[test]
fn a_wrong_quota_answer_shows_both_verdicts() {
    let dir = tempfile::tempdir().unwrap();
    write_case(
        dir.path(),
        "quota.yaml",
        "job: {queue: team-a, gpus: 8, gang: 2}\n\
         queue: {name: team-a, nominal_gpus: 8}\n\
         expect:\n  quota: admit\n",
    );
    let (code, stdout, _) = policy_test(&plugin("team_quota.wasm"), dir.path());
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(
            "        quota: expected admit\n               got      deny: queue team-a is at its quota of 8 GPUs and has no cohort to borrow from\n"
        ),
        "{stdout}"
    );
}

#[test]
fn a_case_for_another_role_or_node_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    write_case(
        dir.path(),
        "a-scores.yaml",
        "cluster:\n  nodes: [{name: a}]\npod: {gpus: 1}\nexpect:\n  scores: {a: 50}\n",
    );
    write_case(
        dir.path(),
        "b-ghost.yaml",
        "cluster:\n  nodes: [{name: a}]\npod: {gpus: 1}\nexpect:\n  verdicts: {ghost: fits}\n",
    );
    write_case(dir.path(), "c-typo.yaml", "expect:\n  verdict: {a: fits}\n");
    let (code, stdout, _) = policy_test(&plugin("gpu_fit.wasm"), dir.path());
    assert_eq!(code, 2, "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[1],
        "  ERROR a-scores.yaml: the case expects a score policy's answer, but this is a filter policy"
    );
    assert_eq!(
        lines[2],
        "  ERROR b-ghost.yaml: `expect` names node \"ghost\", which the cluster does not have"
    );
    assert!(
        lines[3]
            .starts_with("  ERROR c-typo.yaml: not a valid case: expect: unknown field `verdict`"),
        "{stdout}"
    );
    assert_eq!(lines[4], "0 passed, 0 failed, 3 could not run");
}

#[test]
fn a_policy_that_does_not_load_exits_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let bogus = dir.path().join("bogus.wasm");
    std::fs::write(&bogus, b"This is not wasm").unwrap();
    let (code, stdout, stderr) = policy_test(&bogus, &cases("gpu-fit"));
    assert_eq!(code, 2, "{stdout}");
    assert_eq!(
        stderr,
        format!(
            "error: {}: not a WebAssembly component: the file starts with bytes 54 68 69 73, not the \\0asm magic\n",
            bogus.display()
        )
    );
    let (code, _, stderr) = policy_test(&plugin("gpu_fit.wasm"), dir.path());
    assert_eq!(code, 2);
    assert_eq!(
        stderr,
        format!(
            "error: {}: holds no case files (*.yaml, *.yml or *.json)\n",
            dir.path().display()
        )
    );
}
