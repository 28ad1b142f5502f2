//! The CLI against a running server: `gantry policy push|list|activate|rollback|shadow`,
//! `gantry explain` and `gantry health` (in `health`). Each prints what an admin or researcher reads, and the server's own error
//! sentence when a request is refused. Requests and answers are the server's own types, from
//! `gantry-contract`: a field the server drops or renames breaks this build, not a user's run.
//! `compose` holds the edits `gantry policy compose` applies, apart from the HTTP calls.

mod compose;
mod health;

pub use health::{HealthArgs, health};

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use gantry_contract::{
    ErrorBody, Explain, ExplainKind, Explanation, NewSet, Outcome, PolicyManifest, PolicySet,
    SetList, ShadowReport, ShadowStart, Upload, WhatIfAnswer, WhatIfJob, WhatIfOutcome, count_text,
    duration_text,
};
use serde_json::Value;

/// Where the server is and who is asking.
#[derive(Args, Debug, Clone)]
pub struct ServerConn {
    /// The server's base URL.
    #[arg(long, env = "GANTRY_SERVER", default_value = "http://127.0.0.1:7070")]
    server: String,
    /// Bearer token. Defaults to $GANTRY_TOKEN, then the admin token in the local data
    /// directory's `tokens.yaml` (what `gantry serve` wrote on first start).
    #[arg(long, env = "GANTRY_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The data directory whose `tokens.yaml` supplies a token when none is given.
    #[arg(long, env = "GANTRY_DATA_DIR")]
    data_dir: Option<PathBuf>,
}

/// Whether `url` names a server on this machine: a loopback address or `localhost`.
fn is_loopback(url: &str) -> bool {
    let rest = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split(['/', '?', '#'])
        .next()
        .unwrap_or_default();
    // Drop any user info, then the port (an IPv6 host is bracketed).
    let host_port = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map_or(v6, |(host, _)| host),
        None => host_port.split(':').next().unwrap_or_default(),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Exit code for a request the server refused (4xx): the input was wrong.
const REFUSED: u8 = 2;

struct Client {
    agent: ureq::Agent,
    base: String,
    token: String,
}

/// A server answer: status and body (JSON when it parses).
struct Answer {
    status: u16,
    body: Value,
}

impl Answer {
    fn error_text(&self) -> String {
        match serde_json::from_value::<ErrorBody>(self.body.clone()) {
            Ok(refusal) => refusal.error,
            Err(_) => self.body.to_string(),
        }
    }
}

impl ServerConn {
    fn client(&self) -> anyhow::Result<Client> {
        let token = match &self.token {
            Some(token) => token.clone(),
            // The local admin token goes only to a server on this machine: a mistyped
            // --server must not hand it to another host.
            None if is_loopback(&self.server) => self.local_admin_token()?,
            None => anyhow::bail!(
                "no token for {}: the local admin token is sent only to a server on this \
                 machine (127.0.0.1, ::1 or localhost); pass --token or set GANTRY_TOKEN",
                self.server
            ),
        };
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(std::time::Duration::from_secs(120)))
            .build()
            .into();
        Ok(Client {
            agent,
            base: self.server.trim_end_matches('/').to_string(),
            token,
        })
    }

    fn local_admin_token(&self) -> anyhow::Result<String> {
        let dir = self
            .data_dir
            .clone()
            .unwrap_or_else(crate::data_dir::default_data_dir);
        let path = dir.join("tokens.yaml");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            anyhow::anyhow!(
                "no token: pass --token or set GANTRY_TOKEN (and {} is unreadable: {e})",
                path.display()
            )
        })?;
        let file: Value = serde_yaml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{} is malformed: {e}", path.display()))?;
        file["tokens"]
            .as_array()
            .and_then(|tokens| {
                tokens
                    .iter()
                    .find(|t| t["role"] == "admin")
                    .and_then(|t| t["token"].as_str())
            })
            .map(str::to_string)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "no admin token in {}: pass --token or set GANTRY_TOKEN",
                    path.display()
                )
            })
    }
}

impl Client {
    fn call(
        &self,
        method: &str,
        path: &str,
        query: &[(&str, &str)],
        body: Option<Body>,
    ) -> anyhow::Result<Answer> {
        let url = format!("{}{path}", self.base);
        let auth = format!("Bearer {}", self.token);
        let result = match method {
            "GET" | "DELETE" => {
                let mut request = if method == "GET" {
                    self.agent.get(&url)
                } else {
                    self.agent.delete(&url)
                };
                request = request.header("Authorization", &auth);
                for (k, v) in query {
                    request = request.query(*k, *v);
                }
                request.call()
            }
            _ => {
                let mut request = self.agent.post(&url).header("Authorization", &auth);
                for (k, v) in query {
                    request = request.query(*k, *v);
                }
                match body {
                    Some(Body::Wasm(bytes)) => request
                        .header("Content-Type", "application/wasm")
                        .send(&bytes[..]),
                    Some(Body::Json(value)) => request.send_json(value),
                    None => request.send_empty(),
                }
            }
        };
        let mut response = result
            .map_err(|e| anyhow::anyhow!("cannot reach the Gantry server at {}: {e}", self.base))?;
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok(Answer { status, body })
    }

    /// The answer, or the server's refusal printed and turned into the exit code.
    fn expect_ok(&self, answer: Answer) -> Result<Value, ExitCode> {
        if (200..300).contains(&answer.status) {
            Ok(answer.body)
        } else {
            eprintln!("error: {} ({})", answer.error_text(), answer.status);
            Err(if answer.status >= 500 {
                ExitCode::FAILURE
            } else {
                ExitCode::from(REFUSED)
            })
        }
    }
}

impl Client {
    /// A call whose answer is read as the server's own type `T`: a refusal is printed and
    /// becomes the exit code, an answer of another shape is an error naming the route.
    fn typed<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<Body>,
    ) -> anyhow::Result<Result<T, ExitCode>> {
        let answer = self.call(method, path, &[], body)?;
        Ok(match self.expect_ok(answer) {
            Ok(value) => Ok(serde_json::from_value(value).map_err(|e| {
                anyhow::anyhow!(
                    "the server's answer to {method} {path} is not what this CLI reads: {e}"
                )
            })?),
            Err(code) => Err(code),
        })
    }

    /// Every set version and every stored policy: what composing a set starts from.
    fn sets_and_policies(&self) -> anyhow::Result<Result<SetsAndPolicies, ExitCode>> {
        let sets = match self.typed("GET", "/api/sets", None)? {
            Ok(v) => v,
            Err(code) => return Ok(Err(code)),
        };
        Ok(self.typed("GET", "/api/policies", None)?.map(|m| (sets, m)))
    }

    /// Stores a new set version of `entries` (not active).
    fn create_set(
        &self,
        entries: &[gantry_store::SetEntry],
        note: &str,
    ) -> anyhow::Result<Result<PolicySet, ExitCode>> {
        let body = serde_json::to_value(NewSet {
            entries: entries.to_vec(),
            note: note.to_string(),
        })?;
        self.typed("POST", "/api/sets", Some(Body::Json(body)))
    }
}

/// The server's set versions and stored policies, read together.
type SetsAndPolicies = (SetList, Vec<PolicyManifest>);

enum Body {
    Wasm(Vec<u8>),
    Json(Value),
}

/// A config argument: JSON as given, or `@PATH` for a file's contents.
fn config_arg(given: &str) -> anyhow::Result<String> {
    match given.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map(|text| text.trim().to_string())
            .map_err(|e| anyhow::anyhow!("cannot read the config file {path}: {e}")),
        None => Ok(given.to_string()),
    }
}

/// `ms` since the epoch as `YYYY-MM-DD HH:MM:SS UTC`, for events seconds apart.
fn utc_s(ms: u64) -> String {
    let minute = utc(ms);
    let seconds = ms / 1000 % 60;
    minute.replace(" UTC", &format!(":{seconds:02} UTC"))
}

/// `ms` since the epoch as `YYYY-MM-DD HH:MM UTC`.
fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60
    )
}

#[derive(Args, Debug)]
pub struct PushArgs {
    /// The policy component (`.wasm`).
    file: PathBuf,
    /// JSON config for the policy's init, or `@FILE` to read it from a file.
    #[arg(long, default_value = "{}")]
    config: String,
    /// Weight of the policy in the new set (scores add up weighted).
    #[arg(long, default_value_t = 1)]
    weight: u32,
    /// What its faults mean in the new set: the role's default, fail-open or fail-closed.
    #[arg(long, default_value = "default", value_parser = ["default", "fail-open", "fail-closed"])]
    failure: String,
    /// Its own call deadline in ms (1 to 10000), for the upload's self-test and in the new
    /// set; the server's default (50 ms) when absent.
    #[arg(long)]
    deadline_ms: Option<u64>,
    /// Only upload; create no set version.
    #[arg(long)]
    no_set: bool,
    #[command(flatten)]
    conn: ServerConn,
}

#[derive(Args, Debug)]
pub struct ComposeArgs {
    /// The version to start from; the active one when absent.
    #[arg(long)]
    from: Option<u64>,
    /// Drop an entry, named by its policy's name or a sha256 prefix.
    #[arg(long, value_name = "ENTRY")]
    remove: Vec<String>,
    /// Swap an entry's policy for another: POLICY is a sha256 prefix (8 or more characters),
    /// a name (its newest upload) or name@version. Weight, failure policy and deadline are
    /// kept; the config becomes `{}` unless --config sets it.
    #[arg(long, value_name = "ENTRY=POLICY")]
    replace: Vec<String>,
    /// Add a policy at the end, with weight 1 and config `{}`.
    #[arg(long, value_name = "POLICY")]
    add: Vec<String>,
    /// Set an entry's weight.
    #[arg(long, value_name = "ENTRY=WEIGHT")]
    weight: Vec<String>,
    /// Set an entry's config: JSON, or @FILE to read it from a file.
    #[arg(long, value_name = "ENTRY=JSON|@FILE")]
    config: Vec<String>,
    /// Set what an entry's faults mean: default, fail-open or fail-closed.
    #[arg(long, value_name = "ENTRY=KIND")]
    failure: Vec<String>,
    /// Give an entry its own call deadline in ms (1 to 10000), or `default`.
    #[arg(long, value_name = "ENTRY=MS")]
    deadline_ms: Vec<String>,
    /// Why this version exists, kept with it; a summary of the edits when absent.
    #[arg(long)]
    note: Option<String>,
    /// Activate the new version at once.
    #[arg(long)]
    activate: bool,
    #[command(flatten)]
    conn: ServerConn,
}

#[derive(Args, Debug)]
pub struct VersionArgs {
    /// The policy-set version.
    version: u64,
    #[command(flatten)]
    conn: ServerConn,
}

#[derive(Args, Debug)]
pub struct ConnArgs {
    #[command(flatten)]
    conn: ServerConn,
}

#[derive(Subcommand, Debug)]
pub enum ShadowCommand {
    /// Run a set version beside the active one; it binds nothing.
    Start(VersionArgs),
    /// Where the candidate disagrees so far.
    Report(ConnArgs),
    /// Stop the shadow run and print its final report.
    Stop(ConnArgs),
}

#[derive(Args, Debug)]
pub struct ExplainArgs {
    /// A pod or job name, or a node's (its health history).
    name: String,
    /// Print the server's JSON instead of the text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: ServerConn,
}

#[derive(Args, Debug)]
pub struct WhatIfArgs {
    /// Start from this pending job's shape.
    #[arg(long)]
    like: Option<String>,
    /// The queue to submit to.
    #[arg(long)]
    queue: Option<String>,
    /// Pods in the gang.
    #[arg(long)]
    pods: Option<u32>,
    /// GPUs per pod.
    #[arg(long)]
    gpus_per_pod: Option<u32>,
    /// The GPU model each pod needs ("" = any).
    #[arg(long)]
    gpu_type: Option<String>,
    /// How long it would run, in seconds, if you know.
    #[arg(long)]
    expected_runtime_s: Option<f64>,
    /// Only the shape asked about, not the variations (fewer GPUs, fewer pods, other queues
    /// and GPU types).
    #[arg(long)]
    no_variations: bool,
    /// Print the server's JSON instead of the text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: ServerConn,
}

/// When a job of a shape would start, without submitting it, and what would start sooner.
pub fn what_if(args: WhatIfArgs) -> anyhow::Result<ExitCode> {
    run(|| {
        let client = args.conn.client()?;
        let body = serde_json::to_value(WhatIfJob {
            like: args.like.clone(),
            queue: args.queue.clone(),
            pods: args.pods,
            gpus_per_pod: args.gpus_per_pod,
            gpu_type: args.gpu_type.clone(),
            expected_runtime_s: args.expected_runtime_s,
            variations: !args.no_variations,
        })?;
        if args.json {
            let answer = match client.expect_ok(client.call(
                "POST",
                "/api/whatif",
                &[],
                Some(Body::Json(body)),
            )?) {
                Ok(v) => v,
                Err(code) => return Ok(Err(code)),
            };
            outln!("{}", serde_json::to_string_pretty(&answer)?);
            return Ok(Ok(()));
        }
        let answer: WhatIfAnswer =
            match client.typed("POST", "/api/whatif", Some(Body::Json(body)))? {
                Ok(v) => v,
                Err(code) => return Ok(Err(code)),
            };
        let shape = |o: &WhatIfOutcome| {
            let job = &o.job;
            let model = Some(job.gpu_type.as_str()).filter(|m| !m.is_empty());
            format!(
                "{} × {}{}, queue {}",
                count_text(job.pods, "pod"),
                count_text(job.gpus_per_pod, "GPU"),
                model.map(|m| format!(" ({m})")).unwrap_or_default(),
                job.queue
            )
        };
        let a = &answer.answer;
        outln!("{}: {}", shape(a), a.text);
        outln!(
            "  behind the {} the plan covers; runtime p50 {}",
            count_text(answer.jobs_ahead as u64, "pending job"),
            duration_text(a.runtime.p50_s)
        );
        let p50 = |o: &WhatIfOutcome| o.estimate.as_ref().map_or(u64::MAX, |e| e.p50_ms);
        let sooner: Vec<&WhatIfOutcome> = answer
            .variations
            .iter()
            .filter(|v| p50(v) < p50(a))
            .collect();
        if !sooner.is_empty() {
            outln!("start sooner with:");
            for v in sooner {
                outln!("  {}: {}", v.change, v.text);
            }
        }
        Ok(Ok(()))
    })
}

fn run(f: impl FnOnce() -> anyhow::Result<Result<(), ExitCode>>) -> anyhow::Result<ExitCode> {
    Ok(match f()? {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    })
}

/// Uploads a policy and, unless `--no-set`, creates a set version: the active set with this
/// policy added (replacing an entry of the same name and role). The new version is not active.
pub fn push(args: PushArgs) -> anyhow::Result<ExitCode> {
    run(|| {
        let client = args.conn.client()?;
        let bytes = std::fs::read(&args.file)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", args.file.display()))?;
        let config = config_arg(&args.config)?;
        let deadline = args.deadline_ms.map(|ms| ms.to_string());
        let mut query = vec![("config", config.as_str())];
        if let Some(ms) = &deadline {
            query.push(("deadline_ms", ms));
        }
        let answer = client.call("POST", "/api/policies", &query, Some(Body::Wasm(bytes)))?;
        let upload: Upload = match client.expect_ok(answer) {
            Ok(v) => serde_json::from_value(v)?,
            Err(code) => return Ok(Err(code)),
        };
        let manifest = &upload.manifest;
        outln!(
            "{} {} ({} policy) {} as sha256 {}",
            manifest.name,
            manifest.version,
            manifest.role,
            if upload.already_stored {
                "already stored"
            } else {
                "stored"
            },
            manifest.sha256,
        );
        outln!("self-test: {}", upload.validation.self_test);
        if args.no_set {
            return Ok(Ok(()));
        }
        let (sets, manifests) = match client.sets_and_policies()? {
            Ok(v) => v,
            Err(code) => return Ok(Err(code)),
        };
        let active = sets.active;
        let entries = sets
            .sets
            .iter()
            .find(|s| s.version == active)
            .map(|s| s.entries.clone())
            .unwrap_or_default();
        let same_kind = entries.iter().find(|e| {
            manifests
                .iter()
                .any(|m| m.sha256 == e.sha256 && m.name == manifest.name && m.role == manifest.role)
        });
        let me = manifest.sha256.clone();
        let mut edits = compose::Edits {
            weight: vec![format!("{me}={}", args.weight)],
            config: vec![(me.clone(), config.clone())],
            failure: vec![format!("{me}={}", args.failure)],
            deadline_ms: vec![format!("{me}={}", deadline.as_deref().unwrap_or("default"))],
            ..Default::default()
        };
        match same_kind {
            Some(old) => edits.replace.push(format!("{}={me}", old.sha256)),
            None => edits.add.push(me.clone()),
        }
        if same_kind.is_some_and(|old| old.sha256 == me) {
            edits.replace.clear();
        }
        let composed = match edits.apply(entries.clone(), &manifests) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("error: {e}");
                return Ok(Err(ExitCode::from(REFUSED)));
            }
        };
        if composed == entries {
            outln!(
                "the active set (version {active}) already runs it as given: no new set version"
            );
            return Ok(Ok(()));
        }
        let note = format!("push {} {}", manifest.name, manifest.version);
        let set = match client.create_set(&composed, &note)? {
            Ok(v) => v,
            Err(code) => return Ok(Err(code)),
        };
        let version = set.version;
        outln!(
            "created set version {version} (version {active} with this policy); it is not active yet:\n  gantry policy shadow start {version}   # compare it with the active set\n  gantry policy activate {version}"
        );
        Ok(Ok(()))
    })
}

/// Creates a set version from an earlier one (the active one by default) with entries
/// removed, replaced, added or re-set, and activates it if asked.
pub fn compose(args: ComposeArgs) -> anyhow::Result<ExitCode> {
    run(|| {
        let client = args.conn.client()?;
        let mut config = Vec::new();
        for given in &args.config {
            let Some((entry, value)) = given.split_once('=').filter(|(e, _)| !e.is_empty()) else {
                eprintln!("error: --config {given}: expected ENTRY=JSON or ENTRY=@FILE");
                return Ok(Err(ExitCode::from(REFUSED)));
            };
            config.push((entry.to_string(), config_arg(value)?));
        }
        let edits = compose::Edits {
            remove: args.remove.clone(),
            replace: args.replace.clone(),
            add: args.add.clone(),
            weight: args.weight.clone(),
            config,
            failure: args.failure.clone(),
            deadline_ms: args.deadline_ms.clone(),
        };
        if edits.is_empty() {
            eprintln!(
                "error: nothing to change: give --add, --replace, --remove, --weight, --config, --failure or --deadline-ms"
            );
            return Ok(Err(ExitCode::from(REFUSED)));
        }
        let (sets, manifests) = match client.sets_and_policies()? {
            Ok(v) => v,
            Err(code) => return Ok(Err(code)),
        };
        let from = args.from.unwrap_or(sets.active);
        let entries = match sets.sets.iter().find(|s| s.version == from) {
            Some(set) => set.entries.clone(),
            None if from == 0 => Vec::new(),
            None => {
                eprintln!("error: no policy set version {from} exists");
                return Ok(Err(ExitCode::from(REFUSED)));
            }
        };
        let composed = match edits.apply(entries, &manifests) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("error: {e}");
                return Ok(Err(ExitCode::from(REFUSED)));
            }
        };
        let note = args.note.clone().unwrap_or_else(|| {
            let mut parts = vec![format!("from v{from}")];
            for (verb, list) in [
                ("remove", &args.remove),
                ("replace", &args.replace),
                ("add", &args.add),
            ] {
                parts.extend(list.iter().map(|x| format!("{verb} {x}")));
            }
            parts.join(", ")
        });
        let set = match client.create_set(&composed, &note)? {
            Ok(v) => v,
            Err(code) => return Ok(Err(code)),
        };
        outln!("created set version {} from version {from}:", set.version);
        print_set(&set, &manifests);
        if !args.activate {
            outln!(
                "it is not active yet:\n  gantry policy shadow start {0}   # compare it with the active set\n  gantry policy activate {0}",
                set.version
            );
            return Ok(Ok(()));
        }
        let path = format!("/api/sets/{}/activate", set.version);
        match client.typed::<PolicySet>("POST", &path, None)? {
            Ok(set) => {
                outln!(
                    "set version {} is active: the next cycle runs on it",
                    set.version
                );
                Ok(Ok(()))
            }
            Err(code) => Ok(Err(code)),
        }
    })
}

/// A set's entries, one line each, as an admin checks them before activating.
fn print_set(set: &PolicySet, manifests: &[PolicyManifest]) {
    for e in &set.entries {
        let (name, role) = manifests
            .iter()
            .find(|m| m.sha256 == e.sha256)
            .map(|m| (format!("{} {}", m.name, m.version), m.role.to_string()))
            .unwrap_or_else(|| ("?".into(), "?".into()));
        let failure = e.failure.as_str();
        let deadline = e
            .deadline_ms
            .map(|ms| format!("{ms} ms"))
            .unwrap_or_else(|| "default".into());
        outln!(
            "  {:<24} {:<6} {}  weight {}  failure {failure}  deadline {deadline}  config {}",
            name,
            role,
            &e.sha256[..12.min(e.sha256.len())],
            e.weight,
            e.config
        );
    }
}

/// Lists stored policies and set versions, marking the active one.
pub fn list(args: ConnArgs) -> anyhow::Result<ExitCode> {
    run(|| {
        let client = args.conn.client()?;
        let mut manifests: Vec<PolicyManifest> = match client.typed("GET", "/api/policies", None)? {
            Ok(v) => v,
            Err(code) => return Ok(Err(code)),
        };
        let sets: SetList = match client.typed("GET", "/api/sets", None)? {
            Ok(v) => v,
            Err(code) => return Ok(Err(code)),
        };
        manifests.sort_by_key(|m| m.uploaded_at_ms);
        outln!("policies (oldest upload first):");
        for m in &manifests {
            outln!(
                "  {}  {:<24} {:<6} {:>8} bytes  uploaded {} by {}",
                &m.sha256[..12.min(m.sha256.len())],
                format!("{} {}", m.name, m.version),
                m.role.to_string(),
                m.size,
                utc(m.uploaded_at_ms),
                m.uploaded_by
            );
        }
        outln!("sets:");
        for s in &sets.sets {
            let entries: Vec<String> = s
                .entries
                .iter()
                .map(|e| {
                    let name = manifests
                        .iter()
                        .find(|m| m.sha256 == e.sha256)
                        .map(|m| format!("{} {}", m.name, m.version))
                        .unwrap_or_else(|| e.sha256.clone());
                    let deadline = e
                        .deadline_ms
                        .map(|ms| format!(" ({ms} ms)"))
                        .unwrap_or_default();
                    format!("{name}×{}{deadline}", e.weight)
                })
                .collect();
            outln!(
                "{} v{:<4} {}  ({}, {}{})",
                if s.version == sets.active { "*" } else { " " },
                s.version,
                entries.join(", "),
                s.created_by,
                utc(s.created_at_ms),
                Some(&s.note)
                    .filter(|n| !n.is_empty())
                    .map(|n| format!(": {n}"))
                    .unwrap_or_default()
            );
        }
        Ok(Ok(()))
    })
}

/// Activates (or rolls back to) a set version.
pub fn switch(args: VersionArgs, rollback: bool) -> anyhow::Result<ExitCode> {
    run(|| {
        let client = args.conn.client()?;
        let verb = if rollback { "rollback" } else { "activate" };
        let path = format!("/api/sets/{}/{verb}", args.version);
        let set: PolicySet = match client.typed("POST", &path, None)? {
            Ok(set) => set,
            Err(code) => return Ok(Err(code)),
        };
        outln!(
            "set version {} is active: the next cycle runs on it",
            set.version
        );
        Ok(Ok(()))
    })
}

fn print_report(report: &ShadowReport) {
    outln!(
        "shadow: candidate set version {}, {} cycles, {} decisions compared",
        report.candidate_version,
        report.cycles,
        report.decisions_compared
    );
    if report.counts.is_empty() {
        outln!("  no disagreements");
    }
    for (kind, count) in &report.counts {
        outln!("  {kind}: {count}");
    }
    for d in report.recent.iter().rev().take(10) {
        outln!(
            "  {} {}: active placed it {} / candidate {}",
            d.job,
            d.kind,
            outcome(&d.active),
            outcome(&d.candidate),
        );
    }
}

fn outcome(explanation: &Explanation) -> String {
    match &explanation.outcome {
        Outcome::Placed { nodes } => {
            let nodes: Vec<&str> = nodes
                .iter()
                .map(|(node, _)| node.as_str())
                .take(3)
                .collect();
            format!(
                "on {}{}",
                nodes.join(","),
                explanation
                    .domain
                    .as_ref()
                    .map(|d| format!(" ({d})"))
                    .unwrap_or_default()
            )
        }
        Outcome::Pending { .. } => "pending".into(),
    }
}

pub fn shadow(command: ShadowCommand) -> anyhow::Result<ExitCode> {
    run(|| {
        let answer: Result<ShadowReport, ExitCode> = match &command {
            ShadowCommand::Start(args) => {
                let body = serde_json::to_value(ShadowStart {
                    version: args.version,
                })?;
                args.conn
                    .client()?
                    .typed("POST", "/api/shadow", Some(Body::Json(body)))?
            }
            ShadowCommand::Report(args) => args.conn.client()?.typed("GET", "/api/shadow", None)?,
            ShadowCommand::Stop(args) => {
                args.conn.client()?.typed("DELETE", "/api/shadow", None)?
            }
        };
        match answer {
            Ok(report) => {
                print_report(&report);
                Ok(Ok(()))
            }
            Err(code) => Ok(Err(code)),
        }
    })
}

/// Why a pod or job is pending now, or where it went.
pub fn explain(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    run(|| {
        let client = args.conn.client()?;
        let path = format!("/api/explain/{}", encode(&args.name));
        let answer = client.call("GET", &path, &[], None)?;
        if answer.status == 404 {
            // Not a job or a pod: a node explains itself by its health history.
            let node = format!("/api/nodes/{}/health", encode(&args.name));
            let health = client.call("GET", &node, &[], None)?;
            if (200..300).contains(&health.status) {
                return health::print_node(health.body, &node, args.json).map(Ok);
            }
        }
        let e: Explain = match client.expect_ok(answer) {
            Ok(v) => serde_json::from_value(v).map_err(|e| {
                anyhow::anyhow!("the server's answer to GET {path} is not what this CLI reads: {e}")
            })?,
            Err(code) => return Ok(Err(code)),
        };
        if args.json {
            outln!("{}", serde_json::to_string_pretty(&e)?);
            return Ok(Ok(()));
        }
        let of_job = if e.kind == ExplainKind::Pod {
            format!(" (pod of job {})", e.job)
        } else {
            String::new()
        };
        outln!(
            "{}{of_job}: {} — {} × {}, queue {}, priority {}",
            e.name,
            e.state.as_str(),
            count_text(e.pods, "pod"),
            count_text(e.gpus_per_pod, "GPU"),
            e.queue_name,
            e.priority
        );
        outln!("  {}", e.why);
        if let Some(waiting) = &e.waiting_for
            && !e.why.contains(waiting.as_str())
        {
            outln!("  waiting for: {waiting}");
        }
        if let Some(position) = e.queue_position {
            outln!("  position in its queue: {position}");
        }
        if let Some(estimate) = &e.estimate {
            outln!("  start: {}", estimate.text);
        } else if let Some(why) = &e.no_estimate {
            outln!("  start: {why}");
        }
        if let Some(q) = &e.queue {
            outln!(
                "  queue {}: {} of {} used ({} borrowed), fair share {:.3}",
                q.name,
                q.used_gpus,
                count_text(q.nominal_gpus, "GPU"),
                q.borrowed_gpus,
                q.fair_share
            );
        }
        if !e.history.is_empty() {
            outln!("  history:");
            for event in &e.history {
                outln!("    {}  {}", utc_s(event.time_ms), event.text);
            }
        }
        let Some(latest) = &e.latest else {
            return Ok(Ok(()));
        };
        let x = &latest.explanation;
        outln!("  quota: {}", x.quota.verdict_text());
        for f in &x.filters {
            for (reason, count) in &f.rejected {
                outln!(
                    "  {} rejected by {}: {reason}",
                    count_text(*count, "node"),
                    f.policy
                );
            }
        }
        if !x.top_nodes.is_empty() {
            outln!("  top nodes by score (each policy's weighted part):");
            for n in x.top_nodes.iter().take(5) {
                let parts: Vec<String> = n
                    .parts
                    .iter()
                    .map(|(policy, score)| format!("{policy} {score}"))
                    .collect();
                outln!("    {}  {}  ({})", n.node, n.total, parts.join(", "));
                for (policy, reason) in &n.reasons {
                    outln!("      {policy}: {reason}");
                }
            }
        }
        let policies: Vec<String> = x
            .policies
            .iter()
            .map(|p| format!("{} {}", p.name, p.version))
            .collect();
        outln!(
            "  decided by policy set v{} ({}); {} on record",
            x.policy_set,
            policies.join(", "),
            count_text(e.attempts as u64, "decision")
        );
        Ok(Ok(()))
    })
}

/// Percent-encodes a path segment.
fn encode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::is_loopback;

    #[test]
    fn only_a_server_on_this_machine_gets_the_local_admin_token() {
        for url in [
            "http://127.0.0.1:7070",
            "http://localhost:7070/",
            "https://[::1]:7443",
            "http://127.8.9.1",
            "LOCALHOST:7070",
        ] {
            assert!(is_loopback(url), "{url}");
        }
        for url in [
            "http://10.0.0.1:7070",
            "https://gantry.example.com",
            "http://127.0.0.1.evil.example:7070",
            "http://localhost@evil.example:7070",
            "https://[2001:db8::1]:7443",
        ] {
            assert!(!is_loopback(url), "{url}");
        }
    }
}
