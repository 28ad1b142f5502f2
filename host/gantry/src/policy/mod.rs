//! `gantry policy`: the commands on policy components. Those that work on a file, offline:
//! `new` (`scaffold`), `validate` and `test` (`cases`); those against a running server, whose
//! calls live in `crate::client`: `push`, `list`, `compose`,
//! `activate`, `rollback` and `shadow`. [`PluginDir`] is where the example policies are found.

mod cases;
mod scaffold;
mod validate;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::client;

/// The subcommands of `gantry policy`.
#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Write a new policy project (Rust, Python or JavaScript) that builds outside this
    /// repository, with a case folder it passes.
    New(scaffold::NewArgs),
    /// Compile a policy, check its world, run init with its config and one sample evaluation.
    Validate(validate::ValidateArgs),
    /// Run a folder of case files against a policy and show where its answers differ.
    Test(cases::TestArgs),
    /// Upload a policy to a running server and create a set version with it (not active).
    Push(client::PushArgs),
    /// List the server's policies and set versions (`*` marks the active one).
    List(client::ConnArgs),
    /// Create a set version from an earlier one: add, replace or remove policies, and set
    /// their weights, configs, failure policies and deadlines.
    Compose(client::ComposeArgs),
    /// Make a set version active: the next cycle runs on it.
    Activate(client::VersionArgs),
    /// Roll back to an earlier set version.
    Rollback(client::VersionArgs),
    /// Shadow mode: run a set version beside the active one, binding nothing.
    #[command(subcommand)]
    Shadow(client::ShadowCommand),
}

/// Runs one `gantry policy` command.
pub fn run(command: PolicyCommand) -> anyhow::Result<ExitCode> {
    match command {
        PolicyCommand::Validate(args) => validate::run(args),
        PolicyCommand::Test(args) => cases::run(args),
        PolicyCommand::Push(args) => client::push(args),
        PolicyCommand::List(args) => client::list(args),
        PolicyCommand::Compose(args) => client::compose(args),
        PolicyCommand::New(args) => scaffold::run(args),
        PolicyCommand::Activate(args) => client::switch(args, false),
        PolicyCommand::Rollback(args) => client::switch(args, true),
        PolicyCommand::Shadow(command) => client::shadow(command),
    }
}

/// Where the policies built from `plugins/` are found.
#[derive(Args, Clone, Debug)]
pub struct PluginDir {
    /// Folder holding the built example policies (`gpu_fit.wasm`, …). Defaults to
    /// $GANTRY_PLUGIN_DIR, then the `wasm32-wasip2/plugin` folder beside this binary's target.
    #[arg(long, env = "GANTRY_PLUGIN_DIR")]
    pub plugin_dir: Option<PathBuf>,
}

impl PluginDir {
    pub fn resolve(&self, file: &str) -> anyhow::Result<PathBuf> {
        let dir = match &self.plugin_dir {
            Some(dir) => dir.clone(),
            None => {
                let exe = std::env::current_exe()?;
                // target/<profile>/gantry → target/wasm32-wasip2/plugin
                let target = exe
                    .parent()
                    .and_then(|profile| profile.parent())
                    .ok_or_else(|| anyhow::anyhow!("cannot locate the target folder"))?;
                target.join("wasm32-wasip2/plugin")
            }
        };
        let path = dir.join(file);
        anyhow::ensure!(
            path.exists(),
            "{} not found: build the example policies with scripts/build-plugins.sh, or pass --plugin-dir",
            path.display()
        );
        Ok(path)
    }
}
