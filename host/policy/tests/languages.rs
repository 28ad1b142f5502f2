//! Policies written in Python (componentize-py) and JavaScript (ComponentizeJS) run in the same
//! sandbox as Rust ones, with nothing loosened: they import no WASI at all, load with no
//! capability granted, fit the default 64 MiB memory cap on a full-size cluster, answer as their
//! Rust twins do, and an infinite loop in Python is stopped by the same epoch deadline, with the
//! same fault, as the Rust hostile loop.
mod common;

use common::*;
use std::time::Duration;

use gantry_policy::{Limits, PolicyFault, PolicyOptions, PolicyRole, WasmNodes};

/// The Python and JS builds, each beside the Rust policy it must agree with.
const TWINS: [(&str, &str); 4] = [
    ("gpu_fit_py", "gpu-fit"),
    ("gpu_fit_js", "gpu-fit"),
    ("gpu_binpack_py", "gpu-binpack"),
    ("team_quota_js", "team-quota"),
];

/// Load `file`, retrying when instantiate + init ran out of time: a Python or JS component takes
/// about 10 ms of its 50 ms deadline to instantiate, and a test machine running the whole suite
/// on two cores is sometimes slower than that. The call under test is never retried.
fn load(engine: &gantry_policy::PolicyEngine, file: &str) -> gantry_policy::Policy {
    let bytes = plugin(file);
    let mut tries = 0;
    loop {
        match engine.load(&bytes, PolicyOptions::default()) {
            Ok(policy) => return policy,
            Err(gantry_policy::PolicyError::InitFault(PolicyFault::Timeout { .. }))
                if tries < 5 =>
            {
                tries += 1;
            }
            Err(e) => panic!("{file}: {e}"),
        }
    }
}

#[test]
fn python_and_js_import_only_the_contract_and_answer_as_their_rust_twins_in_64_mib() {
    // The deadline is long because this test checks answers and the memory cap, not speed (a
    // Python filter takes tens of milliseconds on 7,500 nodes: `gantry bench policy` measures
    // it). The memory cap is the default one.
    let engine = engine_with(Limits {
        deadline: Duration::from_secs(10),
        ..Limits::default()
    });
    assert_eq!(engine.limits().memory_bytes, 64 << 20);
    let symbols = symbols_of(&engine);
    let table = nodes(&symbols, 7500);
    let wasm_nodes = WasmNodes::new(&table);
    for (file, twin) in TWINS {
        let compiled = engine
            .compile(&plugin(file), &Default::default())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let imports = compiled.imports();
        assert!(
            imports.iter().all(|i| i.starts_with("gantry:policy/")),
            "{file} imports {imports:?}"
        );
        let policy = load(&engine, file);
        let rust = load(&engine, twin);
        assert_eq!(policy.info().name, rust.info().name, "{file}");
        assert_eq!(policy.info().reasons, rust.info().reasons, "{file}");
        for gpus in [1, 4, 8] {
            let pod = pod(&symbols, gpus);
            match policy.role() {
                PolicyRole::Filter => assert_eq!(
                    policy.filter(&pod, &wasm_nodes),
                    rust.filter(&pod, &wasm_nodes),
                    "{file}, {gpus} GPUs"
                ),
                PolicyRole::Score => assert_eq!(
                    policy.score(&pod, &wasm_nodes),
                    rust.score(&pod, &wasm_nodes),
                    "{file}, {gpus} GPUs"
                ),
                PolicyRole::Quota => {}
            }
        }
    }
}

#[test]
fn a_python_infinite_loop_times_out_exactly_as_the_rust_one() {
    let engine = engine();
    let symbols = symbols_of(&engine);
    let table = WasmNodes::new(&nodes(&symbols, 16));
    let pod = pod(&symbols, 1);
    let python = load(&engine, "hostile_python_loop");
    let rust = load(&engine, "hostile-loop");
    let imports = engine
        .compile(&plugin("hostile_python_loop"), &Default::default())
        .unwrap()
        .imports();
    assert!(
        imports.iter().all(|i| i.starts_with("gantry:policy/")),
        "{imports:?}"
    );
    let expected = PolicyFault::Timeout { deadline_ms: 50 };
    // Instances are refilled on each policy's own thread: wait for one before each call, so the
    // call meets the loop rather than an empty pool on a slow machine.
    let ready = |p: &gantry_policy::Policy| assert!(p.wait_ready(Duration::from_secs(60)));
    for _ in 0..3 {
        ready(&rust);
        assert_eq!(rust.filter(&pod, &table), Err(expected.clone()));
        ready(&python);
        assert_eq!(python.filter(&pod, &table), Err(expected.clone()));
    }
    assert_eq!(expected.to_string(), "timed out after 50 ms");
    ready(&rust);
    ready(&python);
    // Every timed-out instance was dropped: after the one made at load, each fault needed a
    // fresh one.
    let created = |p: &gantry_policy::Policy| {
        p.stats
            .instances_created
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    assert_eq!(created(&python), created(&rust));
    assert_eq!(created(&python), 4);
    // And the engine keeps serving well-behaved policies beside them.
    let fit = load(&engine, "gpu-fit");
    assert_eq!(fit.filter(&pod, &table).unwrap().len(), 16);
}
