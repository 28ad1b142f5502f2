//! Embeds the web UI that Vite built into `web/dist/` (see web/README.md), so the binary serves
//! it offline. A fresh clone has no `dist/`: the build still works, and the server answers `/`
//! with a short page on how to build the UI.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let web = manifest.join("../../web");
    let dist = std::env::var_os("GANTRY_UI_DIST")
        .map(PathBuf::from)
        .unwrap_or_else(|| web.join("dist"));
    println!("cargo:rerun-if-env-changed=GANTRY_UI_DIST");
    let mut found = Vec::new();
    if dist.join("index.html").is_file() {
        // Cargo rescans the folder and rebuilds when any file in it changes.
        println!("cargo:rerun-if-changed={}", dist.display());
        files(&dist, &mut found);
    } else {
        // Watch the folder that will hold dist/, so building the UI later re-embeds it (a
        // missing path would make cargo rerun this script on every build).
        println!("cargo:rerun-if-changed={}", web.display());
    }
    found.sort();
    let mut code = String::from(
        "/// The built UI: (path under `/`, bytes).\npub static ASSETS: &[(&str, &[u8])] = &[\n",
    );
    for path in &found {
        let rel = path
            .strip_prefix(&dist)
            .expect("under dist")
            .to_string_lossy()
            .replace('\\', "/");
        let abs = path.canonicalize().expect("canonical path");
        writeln!(
            code,
            "    ({rel:?}, include_bytes!({:?})),",
            abs.display().to_string()
        )
        .expect("write");
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("out dir")).join("ui_assets.rs");
    std::fs::write(out, code).expect("write ui_assets.rs");
}
