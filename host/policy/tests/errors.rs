//! The one-line errors an admin reads when a policy cannot be loaded.
mod common;

use common::*;
use gantry_policy::{Capabilities, PolicyOptions};

fn load_error(bytes: &[u8], options: PolicyOptions) -> String {
    match engine().load(bytes, options) {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_file_that_is_not_wasm() {
    assert_eq!(
        load_error(&wat("not-wasm.wasm"), PolicyOptions::default()),
        "not a WebAssembly component: the file starts with bytes 54 68 69 73, not the \\0asm magic"
    );
    assert_eq!(
        load_error(b"", PolicyOptions::default()),
        "not a WebAssembly component: the file starts with nothing (the file is empty), not the \\0asm magic"
    );
}

#[test]
fn a_core_module() {
    assert_eq!(
        load_error(&wat("core-module.wat"), PolicyOptions::default()),
        "a core WebAssembly module, not a component: build the policy for wasm32-wasip2 (or wrap it with `wasm-tools component new`)"
    );
}

#[test]
fn a_component_with_no_policy_world() {
    assert_eq!(
        load_error(&wat("no-world.wat"), PolicyOptions::default()),
        "the component exports no Gantry policy world: expected one of \
         gantry:policy/filter-policy@0.1.0, gantry:policy/score-policy@0.1.0, \
         gantry:policy/quota-policy@0.1.0, gantry:policy/filter-policy@0.2.0, \
         gantry:policy/score-policy@0.2.0, gantry:policy/quota-policy@0.2.0; it exports hello"
    );
}

#[test]
fn a_truncated_component() {
    let bytes = plugin("gpu-fit");
    let half = bytes.len() / 2;
    let text = load_error(&bytes[..half], PolicyOptions::default());
    assert!(
        text.starts_with(&format!(
            "the file is truncated at byte {half}: it ends inside the component ("
        )),
        "{text}"
    );
    assert!(!text.contains('\n'));
    // Cut inside the header, it still looks like WebAssembly: not a "core module".
    assert_eq!(
        load_error(&bytes[..7], PolicyOptions::default()),
        "the file is truncated at byte 7: it ends inside the 8-byte WebAssembly header"
    );
}

#[test]
fn config_that_is_not_json() {
    assert_eq!(
        load_error(&plugin("gpu-fit"), PolicyOptions::with_config("{weight: 3")),
        "config is not valid JSON: key must be a string at line 1 column 2"
    );
}

#[test]
fn a_policy_that_refuses_its_config() {
    assert_eq!(
        load_error(
            &plugin("hostile-bad-config"),
            PolicyOptions::with_config(r#"{"x": 1}"#)
        ),
        r#"the policy refused its config: field `max_gpus` is required (got {"x": 1})"#
    );
}

#[test]
fn a_wasi_capability_that_was_not_granted() {
    let text = load_error(&plugin("hostile-wasi-fs"), PolicyOptions::default());
    assert!(text.starts_with("the component imports `wasi:"), "{text}");
    assert!(text.contains("`wasi:filesystem/preopens@0.2."), "{text}");
    assert!(
        text.ends_with(
            ": capabilities this policy was not granted (grant the clock and a read directory to allow them)"
        ) || text.ends_with(
            ": capabilities this policy was not granted (grant a read directory and the clock to allow them)"
        ),
        "{text}"
    );
}

#[test]
fn a_granted_directory_is_the_only_one_visible() {
    let dir = std::env::temp_dir().join(format!("gantry-grant-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let options = PolicyOptions {
        capabilities: Capabilities {
            read_dir: Some(dir.clone()),
            clock: true,
            ..Capabilities::default()
        },
        ..PolicyOptions::default()
    };
    // Granted a directory, the policy loads, but /etc/passwd is outside it: init fails and the
    // policy's own error reaches the admin.
    let text = load_error(&plugin("hostile-wasi-fs"), options);
    assert!(
        text.starts_with("the policy refused its config: "),
        "{text}"
    );
    std::fs::remove_dir_all(dir).ok();
}
