//! `gantry policy new`: a policy project that builds outside this repository, in Rust, Python
//! or JavaScript, for a filter, score or quota role, with a case folder it passes as written.
//!
//! Everything the project needs is written into it, from copies embedded in this binary: the
//! WIT contract, the Rust SDK (as a path dependency, unless `--sdk` names a checkout's), the
//! Python helper module, and the pinned componentize-py and ComponentizeJS versions. So a new
//! project builds offline apart from its package registries, and matches the host it came with.
//!
//! - [`Lang`], [`PolicyRole`]: the choices;
//! - [`files`]: the project's files, as (path, contents), pure and unit-tested;
//! - [`run`]: the command, which writes them and says how to build and test.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, ValueEnum};

/// The language a project is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
}

/// Which hook of the cycle the policy serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyRole {
    Filter,
    Score,
    Quota,
}

impl PolicyRole {
    fn as_str(self) -> &'static str {
        match self {
            PolicyRole::Filter => "filter",
            PolicyRole::Score => "score",
            PolicyRole::Quota => "quota",
        }
    }

    /// A misspelling of the template's one config field, for the refused case.
    fn typo(self) -> &'static str {
        match self {
            PolicyRole::Filter => "reserve_gpu",
            PolicyRole::Score => "sprad",
            PolicyRole::Quota => "headroom",
        }
    }
}

#[derive(Args, Debug)]
pub struct NewArgs {
    /// The policy's name: lowercase letters, digits and dashes (`only-healthy`).
    name: String,
    #[arg(long, value_enum)]
    lang: Lang,
    #[arg(long, value_enum)]
    role: PolicyRole,
    /// Where to write the project (a new or empty folder); `./NAME` by default.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Rust only: use the SDK at this path (a checkout's `plugins/sdk`) instead of writing a
    /// copy into the project.
    #[arg(long)]
    sdk: Option<PathBuf>,
}

const WIT: &str = include_str!("../../../../wit/policy-0.1.0/policy.wit");
/// The SDK's `v0_2` module binds contract 0.2.0 too, so a copy of the SDK needs its WIT.
const WIT_0_2: &str = include_str!("../../../../wit/policy-0.2.0/policy.wit");
const SDK_LIB: &str = include_str!("../../../../plugins/sdk/src/lib.rs");
const SDK_VIEW: &str = include_str!("../../../../plugins/sdk/src/view.rs");
const SDK_V0_2: &str = include_str!("../../../../plugins/sdk/src/v0_2.rs");
const SDK_BINDINGS: &str = include_str!("../../../../plugins/sdk/src/bindings.rs");
const TOOLCHAIN: &str = include_str!("../../../../rust-toolchain.toml");
const PY_HELPER: &str = include_str!("../../../../plugins/python/sdk/gantry_policy.py");
const PY_REQUIREMENTS: &str = include_str!("../../../../plugins/python/requirements.txt");
const JS_PACKAGE: &str = include_str!("../../../../plugins/js/package.json");
const JS_LOCK: &str = include_str!("../../../../plugins/js/package-lock.json");
/// The WIT bindings version the SDK is built with; kept equal to the workspace's pin by the
/// unit test `the_sdk_copy_pins_the_workspaces_wit_bindgen`.
const WIT_BINDGEN: &str = "=0.63.0";

/// The workspace's `[profile.plugin]` section, as written in its `Cargo.toml`: the one
/// size-optimised profile, copied into Rust projects rather than restated here.
fn plugin_profile() -> &'static str {
    const WORKSPACE: &str = include_str!("../../../../Cargo.toml");
    let start = WORKSPACE
        .find("[profile.plugin]")
        .expect("the workspace declares [profile.plugin]");
    let rest = &WORKSPACE[start..];
    let end = rest[1..].find("\n[").map_or(rest.len(), |i| i + 2);
    &rest[..end]
}

/// Why a project cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum NewError {
    #[error(
        "`{0}` is not a policy name: use lowercase letters, digits and dashes, starting with a letter"
    )]
    BadName(String),
    #[error("{0} already exists and is not empty: choose a new folder with --dir")]
    NotEmpty(String),
    #[error("--sdk is for Rust projects only")]
    SdkNotRust,
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

fn valid_name(name: &str) -> bool {
    name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-')
}

/// `template` with `{{name}}`, `{{role}}` and `{{typo}}` filled in.
fn fill(template: &str, name: &str, role: PolicyRole) -> String {
    template
        .replace("{{name}}", name)
        .replace("{{role}}", role.as_str())
        .replace("{{typo}}", role.typo())
}

/// The project's files, relative to its folder. `sdk`: a Rust SDK path to depend on instead
/// of the copy written into the project.
pub fn files(
    name: &str,
    lang: Lang,
    role: PolicyRole,
    sdk: Option<&Path>,
) -> Vec<(String, String)> {
    let crate_name = name.replace('-', "_");
    let (source, case) = match role {
        PolicyRole::Filter => (
            [
                include_str!("scaffold/filter.rs"),
                include_str!("scaffold/filter.py"),
                include_str!("scaffold/filter.js"),
            ],
            include_str!("scaffold/filter.yaml"),
        ),
        PolicyRole::Score => (
            [
                include_str!("scaffold/score.rs"),
                include_str!("scaffold/score.py"),
                include_str!("scaffold/score.js"),
            ],
            include_str!("scaffold/score.yaml"),
        ),
        PolicyRole::Quota => (
            [
                include_str!("scaffold/quota.rs"),
                include_str!("scaffold/quota.py"),
                include_str!("scaffold/quota.js"),
            ],
            include_str!("scaffold/quota.yaml"),
        ),
    };
    let mut out = vec![
        ("wit/policy-0.1.0/policy.wit".to_string(), WIT.to_string()),
        (
            format!("cases/{}.yaml", role.as_str()),
            fill(case, name, role),
        ),
        (
            "cases/refuses-a-misspelt-field.yaml".into(),
            fill(include_str!("scaffold/refused.yaml"), name, role),
        ),
    ];
    let (build, ignore) = match lang {
        Lang::Rust => {
            let sdk_path = match sdk {
                Some(path) => path.display().to_string(),
                None => {
                    // The SDK reads the WIT from its own folder's parent: here, the project's.
                    let bindings = SDK_BINDINGS.replace("\"../../wit/", "\"../wit/");
                    out.extend([
                        (
                            "wit/policy-0.2.0/policy.wit".to_string(),
                            WIT_0_2.to_string(),
                        ),
                        (
                            "gantry-policy-sdk/Cargo.toml".to_string(),
                            format!(
                                "# A copy of Gantry's Rust policy SDK, written by `gantry policy new`.\n[package]\nname = \"gantry-policy-sdk\"\nversion = \"0.1.0\"\nedition = \"2024\"\npublish = false\n\n[dependencies]\nwit-bindgen = {{ version = \"{WIT_BINDGEN}\", default-features = false, features = [\"macros\", \"realloc\"] }}\n"
                            ),
                        ),
                        ("gantry-policy-sdk/src/lib.rs".into(), SDK_LIB.into()),
                        ("gantry-policy-sdk/src/view.rs".into(), SDK_VIEW.into()),
                        ("gantry-policy-sdk/src/v0_2.rs".into(), SDK_V0_2.into()),
                        ("gantry-policy-sdk/src/bindings.rs".into(), bindings),
                    ]);
                    "gantry-policy-sdk".to_string()
                }
            };
            out.extend([
                (
                    "Cargo.toml".to_string(),
                    format!(
                        "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2024\"\npublish = false\n\n[lib]\ncrate-type = [\"cdylib\"]\n\n[dependencies]\ngantry-policy-sdk = {{ path = \"{sdk_path}\" }}\nserde = {{ version = \"1\", features = [\"derive\"] }}\nserde_json = \"1\"\n\n# A workspace of its own, so it builds wherever it is put.\n[workspace]\n\n# What Gantry's own policies build with: small, fast components.\n{}",
                        plugin_profile()
                    ),
                ),
                ("rust-toolchain.toml".into(), TOOLCHAIN.into()),
                ("src/lib.rs".into(), fill(source[0], name, role)),
            ]);
            (
                format!(
                    "cargo build --profile plugin --target wasm32-wasip2\ncp \"${{CARGO_TARGET_DIR:-target}}/wasm32-wasip2/plugin/{crate_name}.wasm\" {name}.wasm\n"
                ),
                "target/\n",
            )
        }
        Lang::Python => {
            out.extend([
                ("app.py".to_string(), fill(source[1], name, role)),
                ("gantry_policy.py".into(), PY_HELPER.into()),
                ("requirements.txt".into(), PY_REQUIREMENTS.into()),
            ]);
            (
                format!(
                    "# componentize-py from $COMPONENTIZE_PY, or installed into .venv from requirements.txt.\ntool=\"${{COMPONENTIZE_PY:-}}\"\nif [ -z \"$tool\" ]; then\n    if [ ! -x .venv/bin/componentize-py ]; then\n        python3 -m venv .venv\n        .venv/bin/pip install --quiet --disable-pip-version-check -r requirements.txt\n    fi\n    tool=.venv/bin/componentize-py\nfi\n# --stub-wasi: the component imports no WASI, which Gantry would refuse.\n\"$tool\" -d wit/policy-0.1.0 -w gantry:policy/{}@0.1.0 componentize --stub-wasi -p . app -o {name}.wasm\n",
                    role.as_str()
                ),
                ".venv/\n__pycache__/\nwit_world/\ncomponentize_py_*\n",
            )
        }
        Lang::Js => {
            out.extend([
                ("policy.js".to_string(), fill(source[2], name, role)),
                (
                    "config.js".into(),
                    include_str!("scaffold/config.js").into(),
                ),
                ("package.json".into(), JS_PACKAGE.into()),
                ("package-lock.json".into(), JS_LOCK.into()),
            ]);
            (
                format!(
                    "# ComponentizeJS from $COMPONENTIZE_JS, or installed into node_modules from package-lock.json.\ntool=\"${{COMPONENTIZE_JS:-}}\"\nif [ -z \"$tool\" ]; then\n    [ -x node_modules/.bin/componentize-js ] || npm install --no-audit --no-fund --loglevel=error\n    tool=node_modules/.bin/componentize-js\nfi\n# Every optional WASI feature off: the component imports no WASI, which Gantry would refuse.\n\"$tool\" policy.js --wit wit/policy-0.1.0 --world-name gantry:policy/{}@0.1.0 \\\n    --disable stdio random clocks http fetch-event -o {name}.wasm\n",
                    role.as_str()
                ),
                "node_modules/\n",
            )
        }
    };
    out.push((
        "build.sh".into(),
        format!(
            "#!/usr/bin/env bash\n# Builds {name}.wasm, a WebAssembly component of the gantry:policy@0.1.0 {} world.\nset -euo pipefail\ncd \"$(dirname \"$0\")\"\n{build}echo \"built {name}.wasm\"\n",
            role.as_str()
        ),
    ));
    out.push((".gitignore".into(), format!("{ignore}*.wasm\n")));
    out.push(("README.md".into(), readme(name, lang, role)));
    out
}

fn readme(name: &str, lang: Lang, role: PolicyRole) -> String {
    let (source, lang_name) = match lang {
        Lang::Rust => ("src/lib.rs", "Rust"),
        Lang::Python => ("app.py", "Python"),
        Lang::Js => ("policy.js", "JavaScript"),
    };
    let deadline = if lang == Lang::Rust {
        ""
    } else {
        " --deadline-ms 500"
    };
    format!(
        "# {name}\n\nA Gantry {} policy in {lang_name}, made by `gantry policy new`. The policy is in\n`{source}`; `cases/` holds the cases it must pass.\n\n```sh\n./build.sh                                      # -> {name}.wasm\ngantry policy test {name}.wasm --cases cases{deadline}\ngantry policy validate {name}.wasm{deadline}\ngantry policy push {name}.wasm{deadline}         # to a running `gantry serve`\n```\n\nA case gives a cluster (or a queue), a pod (or a job) and what the policy must answer; a\n`refused:` case gives a config init must refuse, with the exact message or a `pattern`.\n{}",
        role.as_str(),
        if lang == Lang::Rust {
            String::new()
        } else {
            "\nInterpreted policies are slower than Rust ones: `--deadline-ms` gives the calls more\nthan the default 50 ms, and a set entry can keep that deadline (`gantry policy push\n--deadline-ms`).\n".to_string()
        }
    )
}

/// Writes the project and prints how to build and test it.
pub fn run(args: NewArgs) -> anyhow::Result<ExitCode> {
    match write(&args) {
        Ok(dir) => {
            outln!(
                "wrote a {} {} policy into {}:",
                match args.lang {
                    Lang::Rust => "Rust",
                    Lang::Python => "Python",
                    Lang::Js => "JavaScript",
                },
                args.role.as_str(),
                dir.display()
            );
            outln!(
                "  cd {}\n  ./build.sh\n  gantry policy test {}.wasm --cases cases{}",
                dir.display(),
                args.name,
                if args.lang == Lang::Rust {
                    ""
                } else {
                    " --deadline-ms 500"
                }
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            eprintln!("error: {error}");
            Ok(ExitCode::from(2))
        }
    }
}

fn write(args: &NewArgs) -> Result<PathBuf, NewError> {
    if !valid_name(&args.name) {
        return Err(NewError::BadName(args.name.clone()));
    }
    if args.sdk.is_some() && args.lang != Lang::Rust {
        return Err(NewError::SdkNotRust);
    }
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&args.name));
    if std::fs::read_dir(&dir).is_ok_and(|mut entries| entries.next().is_some()) {
        return Err(NewError::NotEmpty(dir.display().to_string()));
    }
    let sdk = args
        .sdk
        .as_ref()
        .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone()));
    for (path, contents) in files(&args.name, args.lang, args.role, sdk.as_deref()) {
        let target = dir.join(&path);
        let failed = |source| NewError::Write {
            path: target.display().to_string(),
            source,
        };
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(failed)?;
        }
        std::fs::write(&target, contents).map_err(failed)?;
        #[cfg(unix)]
        if path == "build.sh" {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))
                .map_err(failed)?;
        }
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for good in ["only-healthy", "a", "gpu2-fit"] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", "Only", "2fit", "a_b", "a-", "a b", "ä"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn every_template_is_filled_in() {
        for lang in [Lang::Rust, Lang::Python, Lang::Js] {
            for role in [PolicyRole::Filter, PolicyRole::Score, PolicyRole::Quota] {
                let files = files("my-policy", lang, role, None);
                for (path, text) in &files {
                    assert!(
                        !text.contains("{{"),
                        "{lang:?} {role:?} {path} left a placeholder"
                    );
                }
                let case = files
                    .iter()
                    .find(|(p, _)| p == "cases/refuses-a-misspelt-field.yaml")
                    .expect("refused case");
                assert!(
                    case.1.contains(&format!("config: {{{}: 1}}", role.typo())),
                    "{}",
                    case.1
                );
                assert!(files.iter().any(|(p, _)| p == "build.sh"));
            }
        }
    }

    #[test]
    fn the_sdk_copy_reads_the_projects_wit_and_pins_the_workspaces_wit_bindgen() {
        let files = files("x", Lang::Rust, PolicyRole::Score, None);
        let bindings = &files
            .iter()
            .find(|(p, _)| p == "gantry-policy-sdk/src/bindings.rs")
            .expect("bindings")
            .1;
        assert!(bindings.contains("\"../wit/policy-0.1.0\""), "{bindings}");
        assert!(bindings.contains("\"../wit/policy-0.2.0\""), "{bindings}");
        assert!(!bindings.contains("../../wit"), "{bindings}");
        // Every WIT folder the copy reads is written beside it, and every module it declares.
        for path in [
            "wit/policy-0.1.0/policy.wit",
            "wit/policy-0.2.0/policy.wit",
            "gantry-policy-sdk/src/v0_2.rs",
        ] {
            assert!(files.iter().any(|(p, _)| p == path), "{path} is missing");
        }
        let workspace = include_str!("../../../../Cargo.toml");
        assert!(
            workspace.contains(&format!("wit-bindgen = {{ version = \"{WIT_BINDGEN}\"")),
            "the workspace's wit-bindgen pin changed: update WIT_BINDGEN"
        );
        // With --sdk, no copy is written and the manifest points there.
        let files = super::files(
            "x",
            Lang::Rust,
            PolicyRole::Score,
            Some(Path::new("/src/sdk")),
        );
        assert!(
            !files
                .iter()
                .any(|(p, _)| p.starts_with("gantry-policy-sdk/"))
        );
        let manifest = &files
            .iter()
            .find(|(p, _)| p == "Cargo.toml")
            .expect("manifest")
            .1;
        assert!(
            manifest.contains("gantry-policy-sdk = { path = \"/src/sdk\" }"),
            "{manifest}"
        );
    }
}
