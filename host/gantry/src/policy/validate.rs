//! `gantry policy validate`: what an admin runs before shipping a policy.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use gantry_core::{QuotaVerdict, Symbols};
use gantry_policy::{
    Capabilities, Limits, NetworkRule, PolicyEngine, PolicyOptions, PolicyRole, WasmNodes,
};

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
    /// Let the policy connect (TCP) and send (UDP) to these addresses only: a comma-separated
    /// list of IP addresses and CIDR blocks, each with an optional port, e.g.
    /// `10.0.0.0/8,127.0.0.1:8080,[fd00::/8]:443`. Host names are refused (no DNS lookup is
    /// granted), and a policy may never listen. Without it, the policy gets no network.
    #[arg(
        long,
        value_name = "ADDR[/PREFIX][:PORT],...",
        value_delimiter = ',',
        value_parser = parse_network_rule
    )]
    allow_network: Vec<NetworkRule>,
    /// Per-call deadline in milliseconds.
    #[arg(long, default_value_t = 50)]
    deadline_ms: u64,
}

/// One `--allow-network` entry; the error names the entry and the forms accepted.
fn parse_network_rule(entry: &str) -> Result<NetworkRule, String> {
    entry.trim().parse().map_err(|e| format!("{e}"))
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
        failure: gantry_policy::FailurePolicy::Default,
        capabilities: Capabilities {
            clock: args.allow_clock,
            read_dir: args.allow_read.clone(),
            network: args.allow_network.clone(),
        },
        deadline: None,
        upload: false,
    };
    let policy = match engine.load_file(&args.file, options) {
        Ok(policy) => policy,
        Err(error) => {
            eprintln!("error: {}: {error}", args.file.display());
            return Ok(ExitCode::from(BAD_POLICY));
        }
    };
    let info = policy.info();
    outln!(
        "{} {} — {} policy, {} bytes, sha256 {}",
        info.name,
        info.version,
        info.role,
        policy.size_bytes(),
        info.sha256
    );
    if info.reasons.is_empty() {
        outln!("reasons: none declared");
    } else {
        outln!("reasons:");
        for (code, text) in &info.reasons {
            outln!("  {code:>5}  {text}");
        }
    }
    let outcome = match info.role {
        PolicyRole::Filter | PolicyRole::Score => {
            let table = sample::cluster(&symbols, 64);
            let nodes = WasmNodes::new(&table);
            let pod = sample::pod(&symbols, 4);
            if info.role == PolicyRole::Filter {
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
        PolicyRole::Quota => {
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
            outln!("sample: {text}");
            outln!("ok");
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ValidateArgs,
    }

    fn parse(args: &[&str]) -> Result<ValidateArgs, String> {
        let argv = ["validate", "policy.wasm"].iter().chain(args);
        Cli::try_parse_from(argv)
            .map(|cli| cli.args)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn allow_network_takes_a_list_of_addresses_and_blocks() {
        assert!(parse(&[]).unwrap().allow_network.is_empty());
        let args = parse(&["--allow-network", "10.0.0.0/8,127.0.0.1:8080"]).unwrap();
        let shown: Vec<String> = args.allow_network.iter().map(|r| r.to_string()).collect();
        assert_eq!(shown, ["10.0.0.0/8", "127.0.0.1:8080"]);
        let args = parse(&[
            "--allow-network",
            "[fd00::/8]:443",
            "--allow-network",
            "192.168.1.7",
        ])
        .unwrap();
        assert_eq!(args.allow_network.len(), 2);
    }

    #[test]
    fn a_bad_allow_network_entry_is_a_clear_error() {
        let error = parse(&["--allow-network", "10.0.0.0/8,example.com:80"]).unwrap_err();
        assert!(
            error.contains(
                "bad network entry `example.com:80`: `example.com` is not an IP address (host \
                 names are not allowed)"
            ),
            "{error}"
        );
        let error = parse(&["--allow-network", "10.0.0.1/8"]).unwrap_err();
        assert!(
            error.contains("host bits are set past /8; did you mean 10.0.0.0/8?"),
            "{error}"
        );
        // The old boolean form is refused rather than read as "everything".
        assert!(parse(&["--allow-network"]).is_err());
    }
}
