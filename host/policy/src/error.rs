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
}

pub type Result<T, E = PolicyError> = std::result::Result<T, E>;

/// What went wrong in one policy call. A fault is data: the scheduler records it as the reason
/// for its decision and the UI shows it; it never unwinds the host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum PolicyFault {
    #[error("timed out after {deadline_ms} ms")]
    Timeout { deadline_ms: u64 },
    #[error("ran out of memory (linear memory is capped at {limit_mib} MiB)")]
    OutOfMemory { limit_mib: u64 },
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
}

impl FaultKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::OutOfMemory => "out-of-memory",
            Self::Trap => "trap",
            Self::BadOutput => "bad-output",
            Self::BadConfig => "bad-config",
        }
    }
}
