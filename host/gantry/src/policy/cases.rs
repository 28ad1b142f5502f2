//! `gantry policy test FILE.wasm --cases DIR`: run a folder of small case files against a policy
//! and print a readable diff for every case it gets wrong. Cases are data, not code, so policies
//! written in Rust, Python or JavaScript run the same folder and must give the same answers.
//!
//! A case file (YAML or JSON) holds a cluster (inline nodes, or a spec from `shared/clusters/`
//! with some nodes overridden), a pod or gang (or, for a quota policy, a job with its queue's and
//! cohort's usage), and what the policy must answer. `plugins/README.md` documents the format.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use gantry_core::{
    CohortUsage, Health, JobRequest, LevelColumn, NodeLabel, NodeRow, NodeTable, PodShape,
    QueueUsage, QuotaVerdict, Resources, Symbols, Taint, TaintEffect, Toleration,
};
use gantry_policy::{Limits, Policy, PolicyEngine, PolicyOptions, PolicyRole, WasmNodes};
use serde::Deserialize;

/// Exit code for every case answered as expected.
const PASSED: u8 = 0;
/// Exit code for at least one case answered differently: the policy (or the case) is wrong.
const FAILED: u8 = 1;
/// Exit code for a policy that cannot be loaded or a case that cannot be read, as with a usage
/// error (and as `policy validate` does).
const BAD_INPUT: u8 = 2;

#[derive(Args, Debug)]
pub struct TestArgs {
    /// The policy component (`.wasm`, or `.wat` text).
    file: PathBuf,
    /// Folder of case files (`*.yaml`, `*.yml`, `*.json`), run in name order.
    #[arg(long, value_name = "DIR")]
    cases: PathBuf,
    /// Per-call deadline in milliseconds.
    #[arg(long, default_value_t = 50)]
    deadline_ms: u64,
    /// Linear-memory cap per instance, in MiB.
    #[arg(long, default_value_t = 64)]
    memory_mib: usize,
}

/// Why a case could not be run: a mistake in the case, not in the policy.
#[derive(Debug)]
pub enum CaseError {
    Read(String),
    Parse(String),
    Spec { path: String, message: String },
    Invalid(String),
}

impl std::fmt::Display for CaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Read(message) => write!(f, "cannot read: {message}"),
            Self::Parse(message) => write!(f, "not a valid case: {message}"),
            Self::Spec { path, message } => write!(f, "cluster spec {path}: {message}"),
            Self::Invalid(message) => f.write_str(message),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    /// One line saying what the case checks; printed beside a failure.
    #[serde(default)]
    description: Option<String>,
    /// The policy's config, passed to init as JSON. `{}` when absent.
    #[serde(default)]
    config: Option<serde_json::Value>,
    #[serde(default)]
    cluster: Option<ClusterCase>,
    #[serde(default)]
    pod: Option<PodCase>,
    #[serde(default)]
    job: Option<JobCase>,
    #[serde(default)]
    queue: Option<QueueCase>,
    #[serde(default)]
    cohort: Option<CohortCase>,
    expect: Expect,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterCase {
    /// A cluster spec, relative to the case file. Its nodes come first, each fully free.
    #[serde(default)]
    spec: Option<PathBuf>,
    /// Topology levels, innermost first, for inline nodes' `domains`.
    #[serde(default)]
    levels: Vec<String>,
    /// Inline nodes. With `spec`, an entry naming a spec node changes only the fields it gives.
    #[serde(default)]
    nodes: Vec<NodeCase>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeCase {
    name: String,
    #[serde(default)]
    gpus: Option<u32>,
    /// Whole GPUs free; all of them when absent.
    #[serde(default)]
    free: Option<u32>,
    /// Most milli-GPUs free on one GPU; 1000 when a GPU is free, else 0, when absent.
    #[serde(default)]
    milli_free_max: Option<u32>,
    #[serde(default, rename = "type")]
    gpu_type: Option<String>,
    #[serde(default)]
    cpu_free_milli: Option<u32>,
    #[serde(default)]
    memory_free_mib: Option<u32>,
    #[serde(default)]
    health: Option<HealthCase>,
    #[serde(default)]
    taints: Option<Vec<TaintCase>>,
    /// Level name → domain name, for inline nodes.
    #[serde(default)]
    domains: BTreeMap<String, String>,
    /// Label key → value: what a 0.2.0 policy's label columns read.
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum HealthCase {
    Healthy,
    NotReady,
    Unhealthy,
    Preflight,
    Cordoned,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum EffectCase {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaintCase {
    key: String,
    #[serde(default)]
    value: String,
    effect: EffectCase,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TolerationCase {
    /// Empty with `exists: true` tolerates every taint.
    #[serde(default)]
    key: String,
    #[serde(default)]
    exists: bool,
    #[serde(default)]
    value: String,
    /// Absent: every effect.
    #[serde(default)]
    effect: Option<EffectCase>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PodCase {
    #[serde(default = "default_pod_name")]
    name: String,
    #[serde(default = "default_queue")]
    queue: String,
    #[serde(default)]
    priority: i32,
    #[serde(default)]
    gpus: u32,
    #[serde(default)]
    gpu_milli: u32,
    #[serde(default, rename = "type")]
    gpu_type: String,
    #[serde(default)]
    cpu_milli: u32,
    #[serde(default)]
    memory_mib: u32,
    #[serde(default)]
    tolerations: Vec<TolerationCase>,
    /// Pods in the gang; 1 for a single pod.
    #[serde(default = "one")]
    gang: u32,
}

fn default_pod_name() -> String {
    "case-pod".into()
}

fn default_queue() -> String {
    "default".into()
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobCase {
    #[serde(flatten)]
    pod: PodCase,
    /// Pods in the job; the gang size when absent.
    #[serde(default)]
    pods: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QueueCase {
    name: String,
    #[serde(default)]
    nominal_gpus: u64,
    #[serde(default)]
    used_gpus: u64,
    /// Absent: may borrow without limit.
    #[serde(default)]
    borrowing_limit_gpus: Option<u64>,
    /// Absent: lends all its idle quota.
    #[serde(default)]
    lending_limit_gpus: Option<u64>,
    #[serde(default = "one")]
    weight: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CohortCase {
    name: String,
    /// The other queues of the cohort; the job's queue is added when missing.
    #[serde(default)]
    queues: Vec<QueueCase>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    /// Filter: node name → `fits`, a declared reason text, or a reason code.
    #[serde(default)]
    verdicts: BTreeMap<String, VerdictCase>,
    /// Filter: how many nodes get each verdict (`fits` or a reason text), for spec clusters.
    #[serde(default)]
    counts: BTreeMap<String, usize>,
    /// Score: node name → score.
    #[serde(default)]
    scores: BTreeMap<String, u32>,
    /// Score: these nodes, best first, each scoring strictly higher than the next.
    #[serde(default)]
    order: Vec<String>,
    /// Score (contract 0.2.0): node name → the reason the policy gives for it, exactly; an
    /// empty text for a node that must get none.
    #[serde(default)]
    reasons: BTreeMap<String, String>,
    /// Quota: `admit`, `{admit-borrowing: GPUS}` or `{deny: TEXT}`.
    #[serde(default)]
    quota: Option<QuotaCase>,
    /// Init must refuse the config: with exactly this message, or, as `{pattern: REGEX}`, with
    /// a message the regular expression finds (so one case folder serves languages whose JSON
    /// parsers word their errors differently).
    #[serde(default)]
    refused: Option<RefusedCase>,
}

/// What a refusal's message must be.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RefusedCase {
    Exact(String),
    Pattern { pattern: String },
}

impl RefusedCase {
    /// Whether `message` is the expected one; a pattern that is not a regular expression is a
    /// malformed case.
    fn accepts(&self, message: &str) -> Result<bool, CaseError> {
        match self {
            Self::Exact(text) => Ok(text == message),
            Self::Pattern { pattern } => regex::Regex::new(pattern)
                .map(|re| re.is_match(message))
                .map_err(|e| {
                    CaseError::Invalid(format!(
                        "`refused.pattern` is not a regular expression: {e}"
                    ))
                }),
        }
    }
}

impl std::fmt::Display for RefusedCase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exact(text) => write!(f, "{text:?}"),
            Self::Pattern { pattern } => write!(f, "a message matching /{pattern}/"),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum VerdictCase {
    Code(u16),
    Text(String),
}

/// `admit`, `{admit-borrowing: GPUS}` or `{deny: TEXT}`, in plain YAML (no `!tags`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum QuotaCase {
    Word(QuotaWord),
    AdmitBorrowing {
        #[serde(rename = "admit-borrowing")]
        gpus: u64,
    },
    Deny {
        deny: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum QuotaWord {
    Admit,
}

/// A case turned into the host model, ready to run.
struct Built {
    table: NodeTable,
    names: Vec<String>,
    pod: PodShape,
    quota: Option<(JobRequest, QueueUsage, Option<CohortUsage>)>,
}

pub fn run(args: TestArgs) -> anyhow::Result<ExitCode> {
    let files = match case_files(&args.cases) {
        Ok(files) => files,
        Err(error) => {
            eprintln!("error: {}: {error}", args.cases.display());
            return Ok(ExitCode::from(BAD_INPUT));
        }
    };
    let bytes = match std::fs::read(&args.file) {
        Ok(bytes) => bytes,
        Err(error) => {
            eprintln!(
                "error: {}: cannot read the file: {error}",
                args.file.display()
            );
            return Ok(ExitCode::from(BAD_INPUT));
        }
    };
    let symbols = Symbols::new();
    let limits = Limits {
        deadline: std::time::Duration::from_millis(args.deadline_ms),
        memory_bytes: args.memory_mib << 20,
        ..Limits::default()
    };
    let engine = PolicyEngine::new(limits, symbols.clone())?;
    // Compile once, up front, so a broken component is one error rather than one per case.
    if let Err(error) = engine.compile(&bytes, &Default::default()) {
        eprintln!("error: {}: {error}", args.file.display());
        return Ok(ExitCode::from(BAD_INPUT));
    }
    let label = args.file.file_name().map_or_else(
        || args.file.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    outln!(
        "{label}: {} cases from {}",
        files.len(),
        args.cases.display()
    );
    let (mut passed, mut failed, mut broken) = (0usize, 0usize, 0usize);
    for file in &files {
        let name = file
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into());
        match run_case(&engine, &symbols, &bytes, file) {
            Ok(CaseOutcome { description, diff }) if diff.is_empty() => {
                passed += 1;
                outln!("  ok    {name}{}", described(&description));
            }
            Ok(CaseOutcome { description, diff }) => {
                failed += 1;
                outln!("  FAIL  {name}{}", described(&description));
                for line in diff {
                    outln!("        {line}");
                }
            }
            Err(error) => {
                broken += 1;
                outln!("  ERROR {name}: {error}");
            }
        }
    }
    if broken > 0 {
        outln!("{passed} passed, {failed} failed, {broken} could not run");
    } else {
        outln!("{passed} passed, {failed} failed");
    }
    Ok(ExitCode::from(if broken > 0 {
        BAD_INPUT
    } else if failed > 0 {
        FAILED
    } else {
        PASSED
    }))
}

fn described(description: &Option<String>) -> String {
    description
        .as_deref()
        .map(|d| format!(": {d}"))
        .unwrap_or_default()
}

fn case_files(dir: &Path) -> Result<Vec<PathBuf>, CaseError> {
    let entries = std::fs::read_dir(dir).map_err(|e| CaseError::Read(e.to_string()))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.extension()
                .is_some_and(|ext| ext == "yaml" || ext == "yml" || ext == "json")
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(CaseError::Invalid(
            "holds no case files (*.yaml, *.yml or *.json)".into(),
        ));
    }
    Ok(files)
}

struct CaseOutcome {
    description: Option<String>,
    /// One line per difference; empty when the policy answered as expected.
    diff: Vec<String>,
}

fn run_case(
    engine: &PolicyEngine,
    symbols: &Symbols,
    bytes: &[u8],
    file: &Path,
) -> Result<CaseOutcome, CaseError> {
    let text = std::fs::read_to_string(file).map_err(|e| CaseError::Read(e.to_string()))?;
    let case: Case = serde_yaml::from_str(&text).map_err(|e| CaseError::Parse(e.to_string()))?;
    let config = case
        .config
        .as_ref()
        .map_or_else(|| "{}".to_string(), serde_json::Value::to_string);
    let built = build(&case, symbols, file.parent().unwrap_or(Path::new(".")))?;
    let mut diff = Vec::new();
    let policy = match engine.load(bytes, PolicyOptions::with_config(config)) {
        Ok(policy) => policy,
        Err(gantry_policy::PolicyError::BadConfig(message)) => {
            match &case.expect.refused {
                Some(expected) if expected.accepts(&message)? => {}
                Some(expected) => diff.push(format!(
                    "config refused with {message:?}, expected {expected}"
                )),
                None => diff.push(format!("the policy refused its config: {message}")),
            }
            return Ok(CaseOutcome {
                description: case.description,
                diff,
            });
        }
        Err(error) => {
            diff.push(format!("the policy did not load: {error}"));
            return Ok(CaseOutcome {
                description: case.description,
                diff,
            });
        }
    };
    if let Some(expected) = &case.expect.refused {
        diff.push(format!(
            "config accepted, expected it refused with {expected}"
        ));
        return Ok(CaseOutcome {
            description: case.description,
            diff,
        });
    }
    let expects = expected_role(&case.expect)?;
    if expects != policy.role() {
        return Err(CaseError::Invalid(format!(
            "the case expects a {expects} policy's answer, but this is a {} policy",
            policy.role()
        )));
    }
    match policy.role() {
        PolicyRole::Filter => diff_filter(&policy, &case.expect, &built, &mut diff)?,
        PolicyRole::Score => diff_score(&policy, &case.expect, &built, &mut diff)?,
        PolicyRole::Quota => diff_quota(&policy, &case.expect, &built, &mut diff),
    }
    Ok(CaseOutcome {
        description: case.description,
        diff,
    })
}

fn expected_role(expect: &Expect) -> Result<PolicyRole, CaseError> {
    let mut roles = Vec::new();
    if !expect.verdicts.is_empty() || !expect.counts.is_empty() {
        roles.push(PolicyRole::Filter);
    }
    if !expect.scores.is_empty() || !expect.order.is_empty() {
        roles.push(PolicyRole::Score);
    }
    if expect.quota.is_some() {
        roles.push(PolicyRole::Quota);
    }
    match roles.as_slice() {
        [role] => Ok(*role),
        [] => Err(CaseError::Invalid(
            "`expect` holds nothing to check: give verdicts or counts, scores or order, quota, or refused".into(),
        )),
        _ => Err(CaseError::Invalid(
            "`expect` mixes the answers of several roles; a case checks one policy".into(),
        )),
    }
}

/// Index of each named node.
fn node_index(built: &Built) -> HashMap<&str, usize> {
    built
        .names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect()
}

fn find(index: &HashMap<&str, usize>, node: &str) -> Result<usize, CaseError> {
    index.get(node).copied().ok_or_else(|| {
        CaseError::Invalid(format!(
            "`expect` names node {node:?}, which the cluster does not have"
        ))
    })
}

fn verdict_text(policy: &Policy, code: u16) -> String {
    if code == 0 {
        "fits".into()
    } else {
        format!(
            "{} ({code})",
            policy.reason_text(code).unwrap_or("undeclared")
        )
    }
}

fn diff_filter(
    policy: &Policy,
    expect: &Expect,
    built: &Built,
    diff: &mut Vec<String>,
) -> Result<(), CaseError> {
    let codes = match policy.filter(&built.pod, &WasmNodes::new(&built.table)) {
        Ok(codes) => codes,
        Err(fault) => {
            diff.push(format!("the filter faulted: {fault}"));
            return Ok(());
        }
    };
    let index = node_index(built);
    let mut rows = Vec::new();
    for (node, expected) in &expect.verdicts {
        let got = codes[find(&index, node)?];
        let (matches, wanted) = match expected {
            VerdictCase::Code(code) => (got == *code, verdict_text(policy, *code)),
            VerdictCase::Text(text) if text == "fits" => (got == 0, "fits".into()),
            VerdictCase::Text(text) => (
                got != 0 && policy.reason_text(got) == Some(text.as_str()),
                text.clone(),
            ),
        };
        if !matches {
            rows.push((node.clone(), wanted, verdict_text(policy, got)));
        }
    }
    push_table(diff, "node", rows);
    if !expect.counts.is_empty() {
        let mut got_counts: BTreeMap<String, usize> = BTreeMap::new();
        for &code in &codes {
            let key = if code == 0 {
                "fits".to_string()
            } else {
                policy.reason_text(code).unwrap_or("undeclared").to_string()
            };
            *got_counts.entry(key).or_default() += 1;
        }
        let mut keys: Vec<&String> = expect.counts.keys().chain(got_counts.keys()).collect();
        keys.sort();
        keys.dedup();
        let rows = keys
            .into_iter()
            .filter_map(|key| {
                let want = expect.counts.get(key).copied().unwrap_or(0);
                let got = got_counts.get(key).copied().unwrap_or(0);
                (want != got)
                    .then(|| (key.clone(), format!("{want} nodes"), format!("{got} nodes")))
            })
            .collect();
        push_table(diff, "verdict", rows);
    }
    Ok(())
}

fn diff_score(
    policy: &Policy,
    expect: &Expect,
    built: &Built,
    diff: &mut Vec<String>,
) -> Result<(), CaseError> {
    let scored = match policy.score_explained(&built.pod, &WasmNodes::new(&built.table)) {
        Ok(scored) => scored,
        Err(fault) => {
            diff.push(format!("the score faulted: {fault}"));
            return Ok(());
        }
    };
    let scores = &scored.scores;
    let index = node_index(built);

    let mut rows = Vec::new();
    for (node, &expected) in &expect.scores {
        let got = scores[find(&index, node)?];
        if got != expected {
            rows.push((node.clone(), expected.to_string(), got.to_string()));
        }
    }
    push_table(diff, "node", rows);
    let mut order = Vec::new();
    for node in &expect.order {
        order.push((node, scores[find(&index, node)?]));
    }
    if order.windows(2).any(|pair| pair[0].1 <= pair[1].1) {
        let got: Vec<String> = order.iter().map(|(n, s)| format!("{n}={s}")).collect();
        diff.push(format!(
            "order: expected {} best first, each above the next; got {}",
            expect
                .order
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(" > "),
            got.join(", ")
        ));
    }
    let mut rows = Vec::new();
    for (node, expected) in &expect.reasons {
        let at = find(&index, node)?;
        let got = scored
            .reasons
            .iter()
            .find(|r| r.node as usize == at)
            .map_or("", |r| r.text.as_str());
        if got != expected {
            rows.push((node.clone(), format!("{expected:?}"), format!("{got:?}")));
        }
    }
    push_table(diff, "reason for", rows);
    Ok(())
}

fn diff_quota(policy: &Policy, expect: &Expect, built: &Built, diff: &mut Vec<String>) {
    let (Some(expected), Some((job, queue, cohort))) = (&expect.quota, &built.quota) else {
        diff.push("a quota case needs `job` and `queue`".into());
        return;
    };
    let got = match policy.admit(job, queue, cohort.as_ref()) {
        Ok(verdict) => verdict,
        Err(fault) => {
            diff.push(format!("the quota policy faulted: {fault}"));
            return;
        }
    };
    let matches = match (expected, &got) {
        (QuotaCase::Word(QuotaWord::Admit), QuotaVerdict::Admit) => true,
        (QuotaCase::AdmitBorrowing { gpus }, QuotaVerdict::AdmitBorrowing { borrowed }) => {
            borrowed.gpus == *gpus
        }
        (QuotaCase::Deny { deny }, QuotaVerdict::Deny { reason }) => deny == reason,
        _ => false,
    };
    if !matches {
        let show = |verdict: &QuotaVerdict| match verdict {
            QuotaVerdict::Admit => "admit".to_string(),
            QuotaVerdict::AdmitBorrowing { borrowed } => {
                format!("admit, borrowing {} GPUs", borrowed.gpus)
            }
            QuotaVerdict::Deny { reason } => format!("deny: {reason}"),
        };
        let wanted = match expected {
            QuotaCase::Word(QuotaWord::Admit) => "admit".to_string(),
            QuotaCase::AdmitBorrowing { gpus } => format!("admit, borrowing {gpus} GPUs"),
            QuotaCase::Deny { deny } => format!("deny: {deny}"),
        };
        diff.push(format!("quota: expected {wanted}"));
        diff.push(format!("       got      {}", show(&got)));
    }
}

/// Append an aligned `what | expected | got` table, or nothing when `rows` is empty.
fn push_table(diff: &mut Vec<String>, what: &str, rows: Vec<(String, String, String)>) {
    if rows.is_empty() {
        return;
    }
    let w0 = rows
        .iter()
        .map(|r| r.0.len())
        .max()
        .unwrap_or(0)
        .max(what.len());
    let w1 = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max(8);
    diff.push(format!("{what:<w0$}  {:<w1$}  got", "expected"));
    for (a, b, c) in rows {
        diff.push(format!("{a:<w0$}  {b:<w1$}  {c}"));
    }
}

fn effect(effect: EffectCase) -> TaintEffect {
    match effect {
        EffectCase::NoSchedule => TaintEffect::NoSchedule,
        EffectCase::PreferNoSchedule => TaintEffect::PreferNoSchedule,
        EffectCase::NoExecute => TaintEffect::NoExecute,
    }
}

fn health(health: HealthCase) -> Health {
    match health {
        HealthCase::Healthy => Health::Healthy,
        HealthCase::NotReady => Health::NotReady,
        HealthCase::Unhealthy => Health::Unhealthy,
        HealthCase::Preflight => Health::Preflight,
        HealthCase::Cordoned => Health::Cordoned,
    }
}

fn pod_shape(pod: &PodCase, symbols: &Symbols) -> PodShape {
    let sym = |text: &str| {
        if text.is_empty() {
            0
        } else {
            symbols.intern(text)
        }
    };
    PodShape {
        name: symbols.intern(&pod.name),
        queue: symbols.intern(&pod.queue),
        priority: pod.priority,
        gpus: pod.gpus,
        gpu_milli: pod.gpu_milli,
        gpu_type: sym(&pod.gpu_type),
        cpu_milli: pod.cpu_milli,
        memory_mib: pod.memory_mib,
        tolerations: pod
            .tolerations
            .iter()
            .map(|t| Toleration {
                key: sym(&t.key),
                exists: t.exists,
                value: sym(&t.value),
                effect: t.effect.map(effect),
            })
            .collect(),
        gang_size: pod.gang,
        // The policy contract's pod carries no node affinity or other resources.
        node_affinity: None,
        resources: Vec::new(),
    }
}

fn queue_usage(queue: &QueueCase, symbols: &Symbols) -> QueueUsage {
    QueueUsage {
        name: symbols.intern(&queue.name),
        nominal: Resources::gpus(queue.nominal_gpus),
        borrowing_limit: queue.borrowing_limit_gpus.map(Resources::gpus),
        lending_limit: queue.lending_limit_gpus.map(Resources::gpus),
        used: Resources::gpus(queue.used_gpus),
        weight: queue.weight,
    }
}

fn build(case: &Case, symbols: &Symbols, dir: &Path) -> Result<Built, CaseError> {
    let (table, names) = match &case.cluster {
        Some(cluster) => build_cluster(cluster, symbols, dir)?,
        None => (NodeTable::default(), Vec::new()),
    };
    let pod = match (&case.pod, &case.job) {
        (Some(pod), _) => pod_shape(pod, symbols),
        (None, Some(job)) => pod_shape(&job.pod, symbols),
        (None, None) => PodShape::default(),
    };
    let quota = match (&case.job, &case.queue) {
        (Some(job), Some(queue)) => {
            let shape = pod_shape(&job.pod, symbols);
            let count = job.pods.unwrap_or(job.pod.gang);
            let total = Resources {
                gpus: u64::from(shape.gpus) * u64::from(count),
                cpu_milli: u64::from(shape.cpu_milli) * u64::from(count),
                memory_mib: u64::from(shape.memory_mib) * u64::from(count),
            };
            let usage = queue_usage(queue, symbols);
            let cohort = case.cohort.as_ref().map(|cohort| {
                let mut queues: Vec<QueueUsage> = cohort
                    .queues
                    .iter()
                    .map(|q| queue_usage(q, symbols))
                    .collect();
                if !queues.iter().any(|q| q.name == usage.name) {
                    queues.insert(0, usage.clone());
                }
                let sum = |f: fn(&QueueUsage) -> u64| queues.iter().map(f).sum::<u64>();
                CohortUsage {
                    name: symbols.intern(&cohort.name),
                    nominal: Resources::gpus(sum(|q| q.nominal.gpus)),
                    used: Resources::gpus(sum(|q| q.used.gpus)),
                    queues,
                }
            });
            Some((
                JobRequest {
                    pod: shape,
                    count,
                    total,
                },
                usage,
                cohort,
            ))
        }
        (None, None) => None,
        _ => {
            return Err(CaseError::Invalid(
                "a quota case needs both `job` and `queue`".into(),
            ));
        }
    };
    Ok(Built {
        table,
        names,
        pod,
        quota,
    })
}

fn build_cluster(
    cluster: &ClusterCase,
    symbols: &Symbols,
    dir: &Path,
) -> Result<(NodeTable, Vec<String>), CaseError> {
    let (mut table, mut names) = match &cluster.spec {
        Some(spec) => {
            let path = dir.join(spec);
            let spec = gantry_sim::ClusterSpec::load(&path).map_err(|e| CaseError::Spec {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
            let table = spec.build(symbols).nodes;
            let names = table
                .name
                .iter()
                .map(|&s| symbols.resolve(s).to_string())
                .collect();
            (table, names)
        }
        None => (
            NodeTable {
                taint_sets: vec![vec![]],
                ..NodeTable::default()
            },
            Vec::new(),
        ),
    };
    let from_spec = cluster.spec.is_some();
    if from_spec && !cluster.levels.is_empty() {
        return Err(CaseError::Invalid(
            "`levels` is for inline nodes; a spec brings its own topology".into(),
        ));
    }
    let index: HashMap<String, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), i))
        .collect();
    // Per level: domain name → id, in order of first appearance.
    let mut domain_ids: Vec<HashMap<String, u32>> = vec![HashMap::new(); cluster.levels.len()];
    let mut node_domains: Vec<Vec<u32>> = vec![Vec::new(); cluster.levels.len()];
    for node in &cluster.nodes {
        let i = match index.get(&node.name) {
            Some(&i) => i,
            None if from_spec => {
                return Err(CaseError::Invalid(format!(
                    "node {:?} is not in the spec; with a spec, `nodes` only changes spec nodes",
                    node.name
                )));
            }
            None => {
                if names.contains(&node.name) {
                    return Err(CaseError::Invalid(format!(
                        "node {:?} is listed twice",
                        node.name
                    )));
                }
                let gpus = node.gpus.unwrap_or(8);
                names.push(node.name.clone());
                table.push(NodeRow::new(
                    symbols.intern(&node.name),
                    gpus,
                    0,
                    96_000,
                    1_000_000,
                ));
                for (level, name) in cluster.levels.iter().enumerate() {
                    let domain = match node.domains.get(name) {
                        Some(domain) => {
                            let next = domain_ids[level].len() as u32;
                            *domain_ids[level].entry(domain.clone()).or_insert(next)
                        }
                        None => u32::MAX,
                    };
                    node_domains[level].push(domain);
                }
                if let Some(level) = node.domains.keys().find(|l| !cluster.levels.contains(l)) {
                    return Err(CaseError::Invalid(format!(
                        "node {:?} has a domain at level {level:?}, which `levels` does not list",
                        node.name
                    )));
                }
                names.len() - 1
            }
        };
        apply_node_case(&mut table, i, names.len(), node, symbols)?;
        if from_spec && !node.domains.is_empty() {
            return Err(CaseError::Invalid(format!(
                "node {:?}: a spec node keeps its spec topology; drop `domains`",
                node.name
            )));
        }
    }
    if from_spec {
        // Free GPUs changed: recount each domain's.
        let levels = std::mem::take(&mut table.levels);
        for level in levels {
            let mut rebuilt = LevelColumn::from_node_domains(level.name, level.node_domain, &table);
            rebuilt.domain_name = level.domain_name;
            table.levels.push(rebuilt);
        }
    } else {
        for (level, name) in cluster.levels.iter().enumerate() {
            let mut column = LevelColumn::from_node_domains(
                symbols.intern(name),
                std::mem::take(&mut node_domains[level]),
                &table,
            );
            // Each domain is named as the case names it (what `host.domain-name` answers).
            column.domain_name = vec![0; domain_ids[level].len()];
            for (domain, &id) in &domain_ids[level] {
                column.domain_name[id as usize] = symbols.intern(domain);
            }
            table.levels.push(column);
        }
    }
    Ok((table, names))
}

/// What a case says of node `i` beyond its name: GPUs (total and free), fractional and CPU
/// and memory room, GPU type, health, taints and labels, written into `table` (of `rows`
/// nodes so far).
fn apply_node_case(
    table: &mut NodeTable,
    i: usize,
    rows: usize,
    node: &NodeCase,
    symbols: &Symbols,
) -> Result<(), CaseError> {
    let sym = |text: &str| {
        if text.is_empty() {
            0
        } else {
            symbols.intern(text)
        }
    };
    if let Some(gpus) = node.gpus {
        table.gpu_total[i] = gpus;
        table.gpu_free[i] = gpus;
    }
    if let Some(free) = node.free {
        if free > table.gpu_total[i] {
            return Err(CaseError::Invalid(format!(
                "node {:?} has {free} GPUs free of {}",
                node.name, table.gpu_total[i]
            )));
        }
        table.gpu_free[i] = free;
    }
    table.gpu_milli_free_max[i] =
        node.milli_free_max
            .unwrap_or(if table.gpu_free[i] > 0 { 1000 } else { 0 });
    if let Some(gpu_type) = &node.gpu_type {
        table.gpu_type[i] = sym(gpu_type);
    }
    if let Some(cpu) = node.cpu_free_milli {
        table.cpu_free_milli[i] = cpu;
    }
    if let Some(memory) = node.memory_free_mib {
        table.memory_free_mib[i] = memory;
    }
    if let Some(h) = node.health {
        table.health[i] = health(h) as u8;
    }
    if let Some(taints) = &node.taints {
        let set: Vec<Taint> = taints
            .iter()
            .map(|t| Taint {
                key: symbols.intern(&t.key),
                value: sym(&t.value),
                effect: effect(t.effect),
            })
            .collect();
        table.taint_set[i] = if set.is_empty() {
            0
        } else {
            match table.taint_sets.iter().position(|s| *s == set) {
                Some(at) => at as u32,
                None => {
                    table.taint_sets.push(set);
                    (table.taint_sets.len() - 1) as u32
                }
            }
        };
    }
    if !node.labels.is_empty() {
        table.labels.resize(rows, Vec::new().into());
        let mut labels: Vec<NodeLabel> = node
            .labels
            .iter()
            .map(|(key, value)| NodeLabel::new(symbols.intern(key), sym(value), value))
            .collect();
        labels.sort_by_key(|l| l.key);
        table.labels[i] = labels.into();
    }
    Ok(())
}
