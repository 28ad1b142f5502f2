//! `gantry health`: nodes per lifecycle state, the breaker and the latest transitions;
//! `gantry health node NAME`: one node's; `gantry health reset`: an admin clears a tripped
//! breaker. The words are made apart from the calls, so the tests read what a user reads.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use gantry_contract::{
    BreakerReset, HealthView, NodeHealthView, NodeState, TransitionView, count_text, duration_text,
};

use super::{ConnArgs, ServerConn, encode, run};

#[derive(Args, Debug)]
pub struct HealthArgs {
    #[command(subcommand)]
    command: Option<HealthCommand>,
    /// Transitions to print, newest first.
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Print the server's JSON instead of the text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: ServerConn,
}

#[derive(Subcommand, Debug)]
pub enum HealthCommand {
    /// Reset the tripped circuit breaker (admin token): automated cordons resume. Audited.
    Reset(ConnArgs),
    /// One node's lifecycle state and its transitions.
    Node(NodeArgs),
}

#[derive(Args, Debug)]
pub struct NodeArgs {
    /// The node's name.
    name: String,
    /// Transitions to print, newest first.
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Print the server's JSON instead of the text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: ServerConn,
}

/// `gantry health` and its subcommands.
pub fn health(args: HealthArgs) -> anyhow::Result<ExitCode> {
    run(|| {
        let (path, limit, json, conn) = match &args.command {
            Some(HealthCommand::Reset(reset)) => {
                let client = reset.conn.client()?;
                let cleared: BreakerReset = match client.typed("POST", "/api/health/reset", None)? {
                    Ok(v) => v,
                    Err(code) => return Ok(Err(code)),
                };
                outln!("{}", reset_text(&cleared));
                return Ok(Ok(()));
            }
            Some(HealthCommand::Node(node)) => (
                format!("/api/nodes/{}/health", encode(&node.name)),
                node.limit,
                node.json,
                &node.conn,
            ),
            None => ("/api/health".to_string(), args.limit, args.json, &args.conn),
        };
        let client = conn.client()?;
        let limit = limit.to_string();
        let answer = client.call("GET", &path, &[("limit", limit.as_str())], None)?;
        let body = match client.expect_ok(answer) {
            Ok(v) => v,
            Err(code) => return Ok(Err(code)),
        };
        if json {
            outln!("{}", serde_json::to_string_pretty(&body)?);
            return Ok(Ok(()));
        }
        let read = |e: serde_json::Error| {
            anyhow::anyhow!("the server's answer to GET {path} is not what this CLI reads: {e}")
        };
        let lines = if args.command.is_some() {
            node_text(&serde_json::from_value(body).map_err(read)?)
        } else {
            health_text(&serde_json::from_value(body).map_err(read)?)
        };
        for line in lines {
            outln!("{line}");
        }
        Ok(Ok(()))
    })
}

/// Prints a node's health (the server's answer `body` to GET `path`) as `gantry health node`
/// does: `gantry explain NODE` shows it.
pub(super) fn print_node(body: serde_json::Value, path: &str, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(());
    }
    let view: NodeHealthView = serde_json::from_value(body).map_err(|e| {
        anyhow::anyhow!("the server's answer to GET {path} is not what this CLI reads: {e}")
    })?;
    for line in node_text(&view) {
        outln!("{line}");
    }
    Ok(())
}

/// How long before `now_ms` `at_ms` was: "12 min ago", "just now".
fn ago(at_ms: u64, now_ms: u64) -> String {
    let s = now_ms.saturating_sub(at_ms) as f64 / 1000.0;
    if s < 1.0 {
        "just now".into()
    } else {
        format!("{} ago", duration_text(s))
    }
}

/// The fleet's health as `gantry health` prints it.
fn health_text(h: &HealthView) -> Vec<String> {
    let counts: Vec<String> = NodeState::ALL
        .iter()
        .filter_map(|s| {
            let n = h.nodes.get(s.name()).copied().unwrap_or(0);
            (n > 0).then(|| format!("{n} {}", s.name()))
        })
        .collect();
    let mut lines = vec![format!(
        "nodes: {}",
        if counts.is_empty() {
            "none".to_string()
        } else {
            counts.join(", ")
        }
    )];
    let b = &h.breaker;
    lines.push(if b.tripped {
        format!(
            "breaker: TRIPPED {}: {}; it holds every automated cordon ({} held so far) until \
             an admin runs `gantry health reset`",
            b.tripped_at_ms
                .map_or_else(String::new, |at| ago(at, h.at_ms)),
            b.reason.as_deref().unwrap_or("no reason given"),
            count_text(b.held, "failure signal"),
        )
    } else {
        "breaker: not tripped; automated cordons go ahead".to_string()
    });
    if h.transitions.is_empty() {
        lines.push("no transitions yet".into());
    } else {
        lines.push(format!(
            "transitions, newest first ({} of {} kept):",
            h.transitions.len(),
            h.transitions_kept
        ));
        lines.extend(transition_lines(&h.transitions, h.at_ms, true));
    }
    lines
}

/// One node's health as `gantry health node` prints it.
fn node_text(n: &NodeHealthView) -> Vec<String> {
    let mut lines = vec![format!("{}: {}", n.node, n.state.name())];
    if n.transitions.is_empty() {
        lines.push("  no transitions on record".into());
    }
    lines.extend(transition_lines(&n.transitions, n.at_ms, false));
    lines
}

/// One line per step, the times and node names in aligned columns.
fn transition_lines(steps: &[TransitionView], now_ms: u64, with_node: bool) -> Vec<String> {
    let agos: Vec<String> = steps.iter().map(|t| ago(t.at_ms, now_ms)).collect();
    let ago_width = agos.iter().map(|a| a.chars().count()).max().unwrap_or(0);
    let node_width = steps
        .iter()
        .map(|t| t.node.chars().count())
        .max()
        .unwrap_or(0);
    steps
        .iter()
        .zip(agos)
        .map(|(t, ago)| {
            let node = if with_node {
                format!("{:<node_width$}  ", t.node)
            } else {
                String::new()
            };
            format!(
                "  {ago:<ago_width$}  {node}{} → {}: {}",
                t.from.name(),
                t.to.name(),
                t.cause
            )
        })
        .collect()
}

/// What `gantry health reset` prints once the breaker is reset.
fn reset_text(r: &BreakerReset) -> String {
    format!(
        "breaker reset by {}: it had tripped {} ({}) and held {}; automated cordons resume",
        r.by,
        ago(r.tripped_at_ms, r.reset_at_ms),
        r.reason,
        count_text(r.held, "failure signal"),
    )
}

#[cfg(test)]
mod tests {
    use gantry_contract::BreakerView;

    use super::*;

    const NOW: u64 = 1_700_000_000_000;

    fn step(node: &str, from: NodeState, to: NodeState, cause: &str, s_ago: u64) -> TransitionView {
        TransitionView {
            node: node.into(),
            from,
            to,
            cause: cause.into(),
            at_s: 0.0,
            at_ms: NOW - s_ago * 1000,
        }
    }

    fn view(breaker: BreakerView, transitions: Vec<TransitionView>) -> HealthView {
        let nodes = [("ready", 30), ("repair", 1), ("retired", 1), ("suspect", 0)]
            .into_iter()
            .map(|(s, n)| (s.to_string(), n))
            .collect();
        HealthView {
            at_ms: NOW,
            nodes,
            breaker,
            transitions_kept: transitions.len() + 40,
            transitions,
        }
    }

    #[test]
    fn health_reads_counts_the_breaker_and_the_steps_with_their_age() {
        use NodeState::*;
        let tripped = BreakerView {
            tripped: true,
            tripped_at_ms: Some(NOW - 720_000),
            reason: Some("one more cordon would put 4 of 32 nodes out, over the 10% cap".into()),
            held: 3,
        };
        let steps = vec![
            step("gpu-node-7", Draining, Repair, "its gangs are stopped", 0),
            step(
                "gpu-node-7",
                Ready,
                Suspect,
                "reported GpuXidError (Xid 79)",
                720,
            ),
            step("n-2", Retest, Ready, "preflight passed", 7_800),
        ];
        assert_eq!(
            health_text(&view(tripped, steps)),
            [
                "nodes: 30 ready, 1 repair, 1 retired",
                "breaker: TRIPPED 12 min ago: one more cordon would put 4 of 32 nodes out, over \
                 the 10% cap; it holds every automated cordon (3 failure signals held so far) \
                 until an admin runs `gantry health reset`",
                "transitions, newest first (3 of 43 kept):",
                "  just now        gpu-node-7  draining → repair: its gangs are stopped",
                "  12 min ago      gpu-node-7  ready → suspect: reported GpuXidError (Xid 79)",
                "  2 h 10 min ago  n-2         retest → ready: preflight passed",
            ]
        );
        let calm = BreakerView {
            tripped: false,
            tripped_at_ms: None,
            reason: None,
            held: 0,
        };
        let mut quiet = view(calm, Vec::new());
        quiet.transitions_kept = 0;
        assert_eq!(
            health_text(&quiet)[1..],
            [
                "breaker: not tripped; automated cordons go ahead",
                "no transitions yet"
            ]
        );
    }

    #[test]
    fn a_node_and_a_reset_read_as_sentences() {
        use NodeState::*;
        let node = NodeHealthView {
            node: "gpu-node-7".into(),
            state: Repair,
            at_ms: NOW,
            transitions: vec![
                step("gpu-node-7", Draining, Repair, "its gangs are stopped", 65),
                step(
                    "gpu-node-7",
                    Ready,
                    Suspect,
                    "reported GpuXidError (Xid 79)",
                    65,
                ),
            ],
        };
        assert_eq!(
            node_text(&node),
            [
                "gpu-node-7: repair",
                "  1 min ago  draining → repair: its gangs are stopped",
                "  1 min ago  ready → suspect: reported GpuXidError (Xid 79)",
            ]
        );
        let reset = BreakerReset {
            tripped_at_ms: NOW - 3 * 3600 * 1000,
            reason: "101 automated cordons in the last hour, the cap".into(),
            held: 1,
            reset_at_ms: NOW,
            by: "root".into(),
        };
        assert_eq!(
            reset_text(&reset),
            "breaker reset by root: it had tripped 3 h ago (101 automated cordons in the last \
             hour, the cap) and held 1 failure signal; automated cordons resume"
        );
    }
}
