use std::time::Duration;

use serde::Serialize;

/// Why a policy could not be loaded. Each message is one line an admin reads as it is, so each
/// names the problem and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The bytes are not WebAssembly at all (an upload of the wrong file).
    #[error("not a WebAssembly component: the file starts with {found}, not the \\0asm magic")]
    NotWasm {
        /// What the file starts with instead.
        found: String,
    },
    /// A core module: built for the wrong target, or not wrapped as a component.
    #[error(
        "a core WebAssembly module, not a component: build the policy for wasm32-wasip2 \
         (or wrap it with `wasm-tools component new`)"
    )]
    CoreModule,
    /// The file ends before its WebAssembly does: an upload or a copy cut short. Said as
    /// such, since a cut header looks like a core module and a cut body like bad code.
    #[error("the file is truncated at byte {at}: it ends inside {inside}")]
    Truncated {
        /// Its length: where it stops.
        at: usize,
        /// What it stops inside of.
        inside: String,
    },
    /// The component does not parse or validate.
    #[error("invalid WebAssembly component: {0}")]
    Invalid(String),
    /// The component exports none of the three policy interfaces.
    #[error(
        "the component exports no Gantry policy world: expected one of {expected}; it exports {found}"
    )]
    MissingWorld {
        /// The interfaces a policy may export.
        expected: String,
        /// What the component exports.
        found: String,
    },
    /// The component exports several roles; a policy plays exactly one.
    #[error("the component exports more than one policy role ({found}); a policy has exactly one")]
    SeveralWorlds {
        /// The roles it exports.
        found: String,
    },
    /// The component exports a role's interface with the wrong types.
    #[error("the component does not match the `{world}` world: {detail}")]
    WrongWorld {
        /// The world its exports claim.
        world: String,
        /// wasmtime's account of the mismatch.
        detail: String,
    },
    /// The component imports WASI interfaces the operator did not grant.
    #[error(
        "the component imports {imports}: capabilities this policy was not granted (grant {grants} to allow them)"
    )]
    NotGranted {
        /// The imports refused.
        imports: String,
        /// The grants that would allow them.
        grants: String,
    },
    /// The component imports something no grant can provide.
    #[error("the component imports `{import}`, which Gantry does not provide to policies")]
    UnknownImport {
        /// The import's name.
        import: String,
    },
    /// The config given at load is not JSON; the policy never sees it.
    #[error("config is not valid JSON: {0}")]
    ConfigNotJson(String),
    /// The call deadline asked for the policy is zero or over [`crate::MAX_CALL_DEADLINE`].
    #[error("a policy's call deadline must be 1 to {max_ms} ms; {deadline_ms} ms was asked for")]
    BadDeadline {
        /// The deadline asked for.
        deadline_ms: u64,
        /// The longest allowed.
        max_ms: u64,
    },
    /// The policy's init refused its config, with its own message.
    #[error("the policy refused its config: {0}")]
    BadConfig(String),
    /// Instantiate or init faulted (timeout, memory, trap, over-long strings...).
    #[error("the policy faulted during init: {0}")]
    InitFault(PolicyFault),
    /// wasmtime itself could not be set up, or a host thread could not start.
    #[error("cannot set up the Wasm engine: {0}")]
    Engine(String),
    /// The component's initial memory could not be prepared: Linux would not seal the memory
    /// image wasmtime writes for it, even after retries. Says how often it was tried, since a
    /// busy kernel is the usual cause and a later load may well succeed.
    #[error(
        "cannot prepare the policy's initial memory (tried {attempts} times): {}",
        chain_text(source.as_ref())
    )]
    MemoryImage {
        /// How many times the image was built.
        attempts: u32,
        /// wasmtime's error, with the OS error at its root.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// The policy file could not be read.
    #[error("cannot read the file: {message}")]
    Read {
        /// The file.
        path: String,
        /// The OS error.
        message: String,
    },
    /// The compile ran past `Limits::compile_timeout`; it finishes in the background (and warms
    /// the cache), but the upload is answered now.
    #[error(
        "compiling the component took longer than {limit:?} (the compile time limit); \
         a component this slow to compile is too large for a policy"
    )]
    CompileTimeout {
        /// `Limits::compile_timeout`.
        limit: Duration,
    },
    /// Every compile slot stayed busy past `Limits::compile_timeout`.
    #[error(
        "no compile slot came free within {limit:?}: {slots} compiles are already running; \
         try again shortly"
    )]
    CompileBusy {
        /// `Limits::compile_timeout`.
        limit: Duration,
        /// Compiles that may run at once ([`crate::COMPILE_SLOTS`]).
        slots: usize,
    },
}

/// Results of loading and compiling, with [`PolicyError`].
pub type Result<T, E = PolicyError> = std::result::Result<T, E>;

/// What went wrong in one policy call. A fault is data: the scheduler records it as the reason
/// for its decision and the UI shows it; it never unwinds the host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum PolicyFault {
    /// The call (or init) ran past its deadline and was interrupted.
    #[error("timed out after {deadline_ms} ms")]
    Timeout {
        /// The deadline that was hit.
        deadline_ms: u64,
    },
    /// The instance's memories and tables together reached `Limits::memory_bytes`.
    #[error("ran out of memory (memories and tables are capped at {limit_mib} MiB per instance)")]
    OutOfMemory {
        /// `Limits::memory_bytes`, in MiB.
        limit_mib: u64,
    },
    /// Every instance of every policy together holds `Limits::process_memory_bytes`: this one
    /// could not get (or grow) its memory. A fault of the host's budget, not of the policy's
    /// code, but it is still refused rather than let the process run out.
    #[error(
        "the process's Wasm memory budget of {budget_mib} MiB is spent (all policies' instances \
         together); this instance could not get its memory"
    )]
    ProcessMemory {
        /// `Limits::process_memory_bytes`, in MiB.
        budget_mib: u64,
    },
    /// A policy outside every set (loaded to validate an upload) reached the part of the
    /// budget uploads may use: the rest is kept for the sets' policies, so uploads can never
    /// starve the active set of instances.
    #[error(
        "the Wasm memory uploads may use ({left_mib} MiB; {reserve_mib} MiB of the budget are \
         kept for the active and shadow sets) is spent; try again once other uploads are done"
    )]
    UploadBudget {
        /// `Limits::process_memory_bytes` less `Limits::set_reserve_bytes`, in MiB.
        left_mib: u64,
        /// `Limits::set_reserve_bytes`, in MiB.
        reserve_mib: u64,
    },
    /// No warm instance was ready within the call deadline: instantiate + init run on the
    /// policy's refill thread, never on the caller's, so a slow or failing init costs a caller
    /// at most the deadline.
    #[error(
        "no warm instance was ready within {waited_ms} ms{}",
        refill_note(last_refill)
    )]
    NotReady {
        /// How long the call waited: the call deadline.
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
        /// Consecutive faults so far.
        faults: u32,
        /// The latest of them.
        last: Box<PolicyFault>,
        /// Milliseconds until the next probe call is let through (0: one is due or running).
        probe_in_ms: u64,
    },
    /// The guest trapped: a panic, `unreachable`, a stack overflow, a host error.
    #[error("trapped: {message}")]
    Trap {
        /// The guest's last console line (a panic message) and the trap.
        message: String,
    },
    /// The guest answered, but the answer breaks the contract (length, codes, bounds).
    #[error("bad output: {detail}")]
    BadOutput {
        /// What is wrong with the answer, naming the field and the bound.
        detail: String,
    },
    /// A fresh instance's init refused the config it accepted at load.
    #[error("refused its config: {message}")]
    BadConfig {
        /// The policy's own message.
        message: String,
    },
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
            Self::ProcessMemory { .. } | Self::UploadBudget { .. } => FaultKind::ProcessMemory,
            Self::NotReady { .. } => FaultKind::NotReady,
            Self::Quarantined { .. } => FaultKind::Quarantined,
        }
    }
}

/// The fault kinds, without their details: for metrics labels, where a message would explode
/// the label set. One per [`PolicyFault`] variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
#[allow(missing_docs)]
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
    /// The kebab-case name, as metrics labels and the API show it.
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

/// An error and each of its sources, joined with ": ": the whole of a wasmtime error, whose
/// own text is only its outermost context.
fn chain_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        text.push_str(": ");
        text.push_str(&next.to_string());
        cause = next.source();
    }
    text
}
