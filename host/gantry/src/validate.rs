//! `gantry policy validate`: what an admin runs before shipping a policy.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use gantry_core::{QuotaVerdict, Symbols};
use gantry_policy::{Capabilities, Limits, PolicyEngine, PolicyOptions, Role, WasmNodes};

use crate::sample;

/// Exit code for a policy that cannot be loaded, as with a usage error: the input is wrong.
const BAD_POLICY: u8 = 2;

#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// The policy component (`.wasm`, or `.wat` text).
    file: PathBuf,
    /// JSON config passed to the policy's init.
    #[arg(long, default_value = "{}")]
    config: String,
    /// Grant the policy the WASI clocks.
    #[arg(long)]
    allow_clock: bool,
    /// Grant the policy read access to this directory, mounted at `/`.
    #[arg(long, value_name = "DIR")]
    allow_read: Option<PathBuf>,
    /// Grant the policy network sockets.
    #[arg(long)]
    allow_network: bool,
    /// Per-call deadline in milliseconds.
    #[arg(long, default_value_t = 50)]
    deadline_ms: u64,
}

pub fn run(args: ValidateArgs) -> anyhow::Result<ExitCode> {
    let symbols = Symbols::new();
    let limits = Limits {
        deadline: std::time::Duration::from_millis(args.deadline_ms),
        ..Limits::default()
    };
    let engine = PolicyEngine::new(limits, symbols.clone())?;
    let options = PolicyOptions {
        config: args.config.clone(),
        failure: None,
        capabilities: Capabilities {
            clock: args.allow_clock,
            read_dir: args.allow_read.clone(),
            network: args.allow_network,
        },
    };
    let policy = match engine.load_file(&args.file, options) {
        Ok(policy) => policy,
        Err(error) => {
            eprintln!("error: {}: {error}", args.file.display());
            return Ok(ExitCode::from(BAD_POLICY));
        }
    };
    let info = policy.info();
    println!(
        "{} {} — {} policy, {} bytes, sha256 {}",
        info.name,
        info.version,
        info.role,
        policy.size_bytes(),
        info.sha256
    );
    if info.reasons.is_empty() {
        println!("reasons: none declared");
    } else {
        println!("reasons:");
        for (code, text) in &info.reasons {
            println!("  {code:>5}  {text}");
        }
    }
    let outcome = match info.role {
        Role::Filter | Role::Score => {
            let table = sample::cluster(&symbols, 64);
            let nodes = WasmNodes::new(&table);
            let pod = sample::pod(&symbols, 4);
            if info.role == Role::Filter {
                policy.filter(&pod, &nodes).map(|codes| {
                    format!(
                        "a pod asking 4 GPUs on 64 sample nodes: {}",
                        policy.describe_verdicts(&codes)
                    )
                })
            } else {
                policy.score(&pod, &nodes).map(|scores| {
                    let best = (0..scores.len()).max_by_key(|&i| scores[i]).unwrap_or(0);
                    let mean = scores.iter().map(|&s| u64::from(s)).sum::<u64>()
                        / scores.len().max(1) as u64;
                    format!(
                        "a pod asking 4 GPUs on 64 sample nodes: best node-{best:05} scores {}, mean {mean}",
                        scores.get(best).copied().unwrap_or(0)
                    )
                })
            }
        }
        Role::Quota => {
            let (job, queue, cohort) = sample::quota_case(&symbols);
            policy.admit(&job, &queue, Some(&cohort)).map(|verdict| {
                let verdict = match verdict {
                    QuotaVerdict::Admit => "admit".to_string(),
                    QuotaVerdict::AdmitBorrowing { borrowed } => {
                        format!("admit, borrowing {} GPUs", borrowed.gpus)
                    }
                    QuotaVerdict::Deny { reason } => format!("deny: {reason}"),
                };
                format!("a 128-GPU job from team-a (200 of 256 GPUs used): {verdict}")
            })
        }
    };
    match outcome {
        Ok(text) => {
            println!("sample: {text}");
            println!("ok");
            Ok(ExitCode::SUCCESS)
        }
        Err(fault) => {
            eprintln!(
                "error: {}: the sample evaluation faulted: {fault}",
                args.file.display()
            );
            Ok(ExitCode::from(BAD_POLICY))
        }
    }
}
