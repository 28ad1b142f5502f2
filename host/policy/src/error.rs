use std::time::Duration;

use serde::Serialize;

/// Why a policy could not be loaded. Each message is one line an admin reads as it is, so each
/// names the problem and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("not a WebAssembly component: the file starts with {found}, not the \\0asm magic")]
    NotWasm { found: String },
    #[error(
        "a core WebAssembly module, not a component: build the policy for wasm32-wasip2 \
         (or wrap it with `wasm-tools component new`)"
    )]
    CoreModule,
    #[error("invalid WebAssembly component: {0}")]
    Invalid(String),
    #[error(
        "the component exports no Gantry policy world: expected one of {expected}; it exports {found}"
    )]
    MissingWorld { expected: String, found: String },
    #[error("the component exports more than one policy role ({found}); a policy has exactly one")]
    SeveralWorlds { found: String },
    #[error("the component does not match the `{world}` world: {detail}")]
    WrongWorld { world: String, detail: String },
    #[error(
        "the component imports {imports}: capabilities this policy was not granted (grant {grants} to allow them)"
    )]
    NotGranted { imports: String, grants: String },
    #[error("the component imports `{import}`, which Gantry does not provide to policies")]
    UnknownImport { import: String },
    #[error("config is not valid JSON: {0}")]
    ConfigNotJson(String),
    #[error("the policy refused its config: {0}")]
    BadConfig(String),
    #[error("the policy faulted during init: {0}")]
    InitFault(PolicyFault),
    #[error("cannot set up the Wasm engine: {0}")]
    Engine(String),
    #[error("cannot read the file: {message}")]
    Read { path: String, message: String },
    /// The compile ran past `Limits::compile_timeout`; it finishes in the background (and warms
    /// the cache), but the upload is answered now.
    #[error(
        "compiling the component took longer than {limit:?} (the compile time limit); \
         a component this slow to compile is too large for a policy"
    )]
    CompileTimeout { limit: Duration },
    /// Every compile slot stayed busy past `Limits::compile_timeout`.
    #[error(
        "no compile slot came free within {limit:?}: {slots} compiles are already running; \
         try again shortly"
    )]
    CompileBusy { limit: Duration, slots: usize },
}

pub type Result<T, E = PolicyError> = std::result::Result<T, E>;

/// What went wrong in one policy call. A fault is data: the scheduler records it as the reason
/// for its decision and the UI shows it; it never unwinds the host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum PolicyFault {
    #[error("timed out after {deadline_ms} ms")]
    Timeout { deadline_ms: u64 },
    /// The instance's memories and tables together reached `Limits::memory_bytes`.
    #[error("ran out of memory (memories and tables are capped at {limit_mib} MiB per instance)")]
    OutOfMemory { limit_mib: u64 },
    /// Every instance of every policy together holds `Limits::process_memory_bytes`: this one
    /// could not get (or grow) its memory. A fault of the host's budget, not of the policy's
    /// code, but it is still refused rather than let the process run out.
    #[error(
        "the process's Wasm memory budget of {budget_mib} MiB is spent (all policies' instances \
         together); this instance could not get its memory"
    )]
    ProcessMemory { budget_mib: u64 },
    /// No warm instance was ready within the call deadline: instantiate + init run on the
    /// policy's refill thread, never on the caller's, so a slow or failing init costs a caller
    /// at most the deadline.
    #[error(
        "no warm instance was ready within {waited_ms} ms{}",
        refill_note(last_refill)
    )]
    NotReady {
        waited_ms: u64,
        /// The fault of the last refill, if it failed.
        last_refill: Option<Box<PolicyFault>>,
    },
    /// The policy faulted `faults` times in a row and is quarantined: calls fail at once
    /// without running Wasm (its role's failure policy applies) until a probe call succeeds.
    #[error(
        "quarantined after {faults} consecutive faults (last: {last}); {}",
        probe_note(*probe_in_ms)
    )]
    Quarantined {
        faults: u32,
        last: Box<PolicyFault>,
        /// Milliseconds until the next probe call is let through (0: one is due or running).
        probe_in_ms: u64,
    },
    #[error("trapped: {message}")]
    Trap { message: String },
    #[error("bad output: {detail}")]
    BadOutput { detail: String },
    #[error("refused its config: {message}")]
    BadConfig { message: String },
}

impl PolicyFault {
    /// A short stable name, for metrics labels and tests.
    pub fn kind(&self) -> FaultKind {
        match self {
            Self::Timeout { .. } => FaultKind::Timeout,
            Self::OutOfMemory { .. } => FaultKind::OutOfMemory,
            Self::Trap { .. } => FaultKind::Trap,
            Self::BadOutput { .. } => FaultKind::BadOutput,
            Self::BadConfig { .. } => FaultKind::BadConfig,
            Self::ProcessMemory { .. } => FaultKind::ProcessMemory,
            Self::NotReady { .. } => FaultKind::NotReady,
            Self::Quarantined { .. } => FaultKind::Quarantined,
        }
    }
}

/// The fault kinds, without their details.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    Timeout,
    OutOfMemory,
    Trap,
    BadOutput,
    BadConfig,
    ProcessMemory,
    NotReady,
    Quarantined,
}

impl FaultKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::OutOfMemory => "out-of-memory",
            Self::Trap => "trap",
            Self::BadOutput => "bad-output",
            Self::BadConfig => "bad-config",
            Self::ProcessMemory => "process-memory",
            Self::NotReady => "not-ready",
            Self::Quarantined => "quarantined",
        }
    }
}

fn refill_note(last_refill: &Option<Box<PolicyFault>>) -> String {
    match last_refill {
        Some(fault) => format!(" (the last refill faulted: {fault})"),
        None => String::new(),
    }
}

/// "next probe in 4 s", rounded up; milliseconds under a second.
fn probe_note(probe_in_ms: u64) -> String {
    match probe_in_ms {
        0 => "a probe call is due".into(),
        ms if ms < 1000 => format!("next probe in {ms} ms"),
        ms => format!("next probe in {} s", ms.div_ceil(1000)),
    }
}
