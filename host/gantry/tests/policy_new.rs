//! The policy author's path: `gantry policy new` in a temporary folder outside the repository,
//! for every language and role, builds with the project's own `build.sh` and passes the
//! project's own cases, with no edits. The build tools are the ones `scripts/build-plugins.sh`
//! installed into the cache (the same pins the projects carry), so no test downloads them.

use std::path::{Path, PathBuf};
use std::process::Command;

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// `${XDG_CACHE_HOME:-$HOME/.cache}/gantry/NAME-HASH`, where HASH is the first 16 hex digits
/// of the sha256 of the tool's pin file, as `scripts/build-plugins.sh` names its tool folders.
fn cached_tool(name: &str, pin_file: &str, binary: &str) -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache"));
    let pins = std::fs::read(Path::new(REPO).join(pin_file)).expect("pin file");
    let hash = gantry_store::sha256_hex(&pins);
    let tool = cache
        .join("gantry")
        .join(format!("{name}-{}", &hash[..16]))
        .join(binary);
    assert!(
        tool.exists(),
        "{} is missing: scripts/build-plugins.sh installs it",
        tool.display()
    );
    tool
}

/// Where the Rust projects build: one folder for all of them, so their dependencies compile
/// once, and kept between runs like the rest of the target directory.
fn rust_target() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(REPO).join("target"))
        .join("policy-new")
}

fn run(command: &mut Command) -> String {
    let out = command.output().expect("run");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{command:?} failed:\n{text}");
    text
}

#[test]
fn new_projects_build_outside_the_repository_and_pass_their_own_cases() {
    let python = cached_tool(
        "componentize-py",
        "plugins/python/requirements.txt",
        "bin/componentize-py",
    );
    let js = cached_tool(
        "componentize-js",
        "plugins/js/package-lock.json",
        "node_modules/.bin/componentize-js",
    );
    let outside = tempfile::tempdir().expect("tempdir");
    let repo = std::fs::canonicalize(REPO).expect("repo");
    assert!(!outside.path().starts_with(&repo));
    for lang in ["rust", "python", "js"] {
        for role in ["filter", "score", "quota"] {
            let name = format!("my-{lang}-{role}");
            let dir = outside.path().join(&name);
            let said = run(Command::new(env!("CARGO_BIN_EXE_gantry"))
                .args([
                    "policy", "new", &name, "--lang", lang, "--role", role, "--dir",
                ])
                .arg(&dir));
            assert!(said.contains("./build.sh"), "{said}");
            let mut build = Command::new(dir.join("build.sh"));
            // The project's own environment: nothing of this workspace's cargo run leaks in.
            for (key, _) in std::env::vars_os() {
                let key = key.to_string_lossy().into_owned();
                if key.starts_with("CARGO_") && key != "CARGO_HOME"
                    || key.starts_with("RUSTUP_TOOLCHAIN")
                {
                    build.env_remove(&key);
                }
            }
            build
                .env("CARGO_TARGET_DIR", rust_target())
                .env("COMPONENTIZE_PY", &python)
                .env("COMPONENTIZE_JS", &js);
            run(&mut build);
            let wasm = dir.join(format!("{name}.wasm"));
            let tested = run(Command::new(env!("CARGO_BIN_EXE_gantry"))
                .args(["policy", "test"])
                .arg(&wasm)
                .arg("--cases")
                .arg(dir.join("cases"))
                .args(["--deadline-ms", "500"]));
            assert!(
                tested.trim_end().ends_with("2 passed, 0 failed"),
                "{lang} {role}:\n{tested}"
            );
        }
    }
    // A second project in the same folder is refused, and nothing of the first is lost.
    let dir = outside.path().join("my-rust-filter");
    let out = Command::new(env!("CARGO_BIN_EXE_gantry"))
        .args([
            "policy", "new", "other", "--lang", "rust", "--role", "score", "--dir",
        ])
        .arg(&dir)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        format!(
            "error: {} already exists and is not empty: choose a new folder with --dir",
            dir.display()
        )
    );
    assert!(dir.join("my-rust-filter.wasm").exists());
}
