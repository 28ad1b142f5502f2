use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use gantry_core::Symbols;
use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};

use crate::bindings::{filter::FilterPre, quota::QuotaPre, score::ScorePre};
use crate::error::{PolicyError, Result};
use crate::instance::HostState;
use crate::policy::{FailurePolicy, Policy, PolicyOptions};

/// The role a policy plays in a scheduling cycle; one WIT world each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    Filter,
    Score,
    Quota,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Filter, Role::Score, Role::Quota];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Filter => "filter",
            Role::Score => "score",
            Role::Quota => "quota",
        }
    }

    /// The interface a component of this role exports.
    pub fn export_name(self) -> &'static str {
        match self {
            Role::Filter => "gantry:policy/filter-policy@0.1.0",
            Role::Score => "gantry:policy/score-policy@0.1.0",
            Role::Quota => "gantry:policy/quota-policy@0.1.0",
        }
    }

    /// Filter and quota fail closed (a fault rejects, with the fault as the reason); score fails
    /// open (the policy is skipped for that call), so a broken ranking never blocks placement.
    pub fn default_failure(self) -> FailurePolicy {
        match self {
            Role::Filter | Role::Quota => FailurePolicy::FailClosed,
            Role::Score => FailurePolicy::FailOpen,
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Bounds on every policy call. Defaults follow DESIGN.md: 50 ms, 64 MiB.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Wall time for one call, enforced by epoch interruption.
    pub deadline: Duration,
    /// Wall time for instantiate + init. Apart from the call deadline because interpreted guests
    /// (Python, JavaScript) copy in a runtime heap of megabytes before init runs: ~12 ms alone
    /// for componentize-py's, which a busy host stretches past 50 ms. Init runs once per
    /// instance, off the hot path; a policy that loops in init is still stopped.
    pub init_deadline: Duration,
    pub memory_bytes: usize,
    pub table_elements: usize,
    /// Core instances, tables and memories a component may create in its store.
    pub instances: usize,
    pub tables: usize,
    pub memories: usize,
    /// Calls that may run at once on one policy; also the most instances it keeps alive.
    pub concurrency: usize,
    /// Wasm stack, so unbounded recursion traps early instead of exhausting the host's.
    pub max_wasm_stack: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            deadline: Duration::from_millis(50),
            init_deadline: Duration::from_millis(1000),
            memory_bytes: 64 << 20,
            table_elements: 100_000,
            instances: 64,
            tables: 64,
            memories: 16,
            concurrency: 4,
            max_wasm_stack: 1 << 20,
        }
    }
}

/// WASI capabilities an operator grants a policy. None by default: a policy gets the host
/// `log`/`resolve`/`lookup` calls, an empty environment, captured stdio and random numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Capabilities {
    pub clock: bool,
    /// A directory the policy may read, mounted at `/`.
    pub read_dir: Option<PathBuf>,
    pub network: bool,
}

/// How often the epoch ticks; deadlines are whole ticks, so a timeout lands within one tick.
const EPOCH_TICK: Duration = Duration::from_millis(1);

/// Compiles components once and hands out configured [`Policy`]s. One per process: it owns the
/// wasmtime engine, the linker with the host imports, and the epoch ticker thread.
pub struct PolicyEngine {
    pub(crate) shared: Arc<EngineShared>,
    ticker: Option<JoinHandle<()>>,
}

pub(crate) struct EngineShared {
    pub(crate) engine: wasmtime::Engine,
    pub(crate) linker: Linker<HostState>,
    pub(crate) limits: Limits,
    pub(crate) symbols: Arc<Symbols>,
    /// Compiled components keyed by the sha256 of their bytes, so uploading the same policy
    /// twice (or under another name) compiles once. Locked only to look up or insert.
    digest_to_compiled: Mutex<HashMap<[u8; 32], Arc<CompiledPolicy>>>,
    /// Tells the ticker thread to stop when the engine is dropped.
    stop: AtomicBool,
}

/// A compiled, pre-linked component: instantiating from here costs microseconds.
pub struct CompiledPolicy {
    pub sha256: String,
    pub role: Role,
    pub size_bytes: usize,
    pub(crate) pre: RolePre,
}

pub(crate) enum RolePre {
    Filter(FilterPre<HostState>),
    Score(ScorePre<HostState>),
    Quota(QuotaPre<HostState>),
}

impl PolicyEngine {
    pub fn new(limits: Limits, symbols: Arc<Symbols>) -> Result<Self> {
        let mut config = wasmtime::Config::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            .max_wasm_stack(limits.max_wasm_stack)
            .cranelift_opt_level(wasmtime::OptLevel::Speed);
        // `GANTRY_WASM_PROFILE=perfmap` names JIT code for `perf report`.
        if std::env::var("GANTRY_WASM_PROFILE").is_ok_and(|v| v == "perfmap") {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let engine = wasmtime::Engine::new(&config).map_err(engine_error)?;
        let mut linker = Linker::new(&engine);
        crate::instance::add_to_linker(&mut linker).map_err(engine_error)?;
        let shared = Arc::new(EngineShared {
            engine,
            linker,
            limits,
            symbols,
            digest_to_compiled: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
        });
        let ticker_shared = Arc::downgrade(&shared);
        let ticker = std::thread::Builder::new()
            .name("gantry-policy-epoch".into())
            .spawn(move || {
                while let Some(shared) = ticker_shared.upgrade() {
                    if shared.stop.load(Ordering::Relaxed) {
                        break;
                    }
                    shared.engine.increment_epoch();
                    drop(shared);
                    std::thread::sleep(EPOCH_TICK);
                }
            })
            .map_err(|e| PolicyError::Engine(format!("cannot start the epoch thread: {e}")))?;
        Ok(Self {
            shared,
            ticker: Some(ticker),
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.shared.limits
    }

    pub fn symbols(&self) -> &Arc<Symbols> {
        &self.shared.symbols
    }

    /// Compile (or find compiled) and check the component's world and imports.
    pub fn compile(&self, bytes: &[u8], caps: &Capabilities) -> Result<Arc<CompiledPolicy>> {
        let digest: [u8; 32] = Sha256::digest(bytes).into();
        let cached = self
            .shared
            .digest_to_compiled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&digest)
            .cloned();
        let compiled = match cached {
            Some(compiled) => compiled,
            None => {
                let compiled = Arc::new(self.compile_new(bytes, digest)?);
                self.shared
                    .digest_to_compiled
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(digest)
                    .or_insert(compiled)
                    .clone()
            }
        };
        check_imports(&self.shared.engine, &compiled, caps)?;
        Ok(compiled)
    }

    /// Compile, check, instantiate and `init` with `config`: a policy ready to call.
    pub fn load(&self, bytes: &[u8], options: PolicyOptions) -> Result<Policy> {
        if let Err(e) = serde_json::from_str::<serde_json::Value>(&options.config) {
            return Err(PolicyError::ConfigNotJson(e.to_string()));
        }
        let compiled = self.compile(bytes, &options.capabilities)?;
        Policy::new(self.shared.clone(), compiled, options)
    }

    /// Read a `.wasm` (or `.wat`) file and [`load`](Self::load) it.
    pub fn load_file(&self, path: &std::path::Path, options: PolicyOptions) -> Result<Policy> {
        let bytes = std::fs::read(path).map_err(|e| PolicyError::Read {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        self.load(&bytes, options)
    }

    fn compile_new(&self, bytes: &[u8], digest: [u8; 32]) -> Result<CompiledPolicy> {
        check_magic(bytes)?;
        let engine = &self.shared.engine;
        let component = Component::new(engine, bytes)
            .map_err(|e| PolicyError::Invalid(one_line(&format!("{e:#}"))))?;
        let role = detect_role(engine, &component)?;
        let linker = &self.shared.linker;
        let wrong_world = |e: wasmtime::Error| PolicyError::WrongWorld {
            world: format!("gantry:policy/{role}@0.1.0"),
            detail: one_line(&format!("{e:#}")),
        };
        let instance_pre = linker.instantiate_pre(&component).map_err(|e| {
            // An import we do not provide is reported by `check_imports` with a better message.
            match first_unknown_import(engine, &component) {
                Some(import) => PolicyError::UnknownImport { import },
                None => wrong_world(e),
            }
        })?;
        let pre = match role {
            Role::Filter => RolePre::Filter(FilterPre::new(instance_pre).map_err(wrong_world)?),
            Role::Score => RolePre::Score(ScorePre::new(instance_pre).map_err(wrong_world)?),
            Role::Quota => RolePre::Quota(QuotaPre::new(instance_pre).map_err(wrong_world)?),
        };
        Ok(CompiledPolicy {
            sha256: hex(&digest),
            role,
            size_bytes: bytes.len(),
            pre,
        })
    }
}

impl Drop for PolicyEngine {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(ticker) = self.ticker.take() {
            let _ = ticker.join();
        }
    }
}

impl EngineShared {
    /// Epoch ticks that cover the call deadline, plus one for the tick already under way.
    pub(crate) fn deadline_ticks(&self) -> u64 {
        ticks_for(self.limits.deadline)
    }

    /// Epoch ticks that cover the init deadline.
    pub(crate) fn init_deadline_ticks(&self) -> u64 {
        ticks_for(self.limits.init_deadline)
    }
}

fn ticks_for(deadline: Duration) -> u64 {
    let ticks = deadline.as_nanos().div_ceil(EPOCH_TICK.as_nanos());
    u64::try_from(ticks).unwrap_or(u64::MAX / 2) + 1
}

fn engine_error(e: wasmtime::Error) -> PolicyError {
    PolicyError::Engine(one_line(&format!("{e:#}")))
}

fn check_magic(bytes: &[u8]) -> Result<()> {
    const COMPONENT: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];
    if bytes.starts_with(&COMPONENT) {
        return Ok(());
    }
    if bytes.starts_with(b"\0asm") {
        return Err(PolicyError::CoreModule);
    }
    // WebAssembly text, which the engine also accepts: look past `;;` comments.
    let text = std::str::from_utf8(bytes).unwrap_or("");
    let code = text
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with(";;"))
        .unwrap_or("");
    if code.starts_with("(component") {
        return Ok(());
    }
    if code.starts_with("(module") {
        return Err(PolicyError::CoreModule);
    }
    let found = if bytes.is_empty() {
        "nothing (the file is empty)".to_string()
    } else {
        let head: Vec<String> = bytes.iter().take(4).map(|b| format!("{b:02x}")).collect();
        format!("bytes {}", head.join(" "))
    };
    Err(PolicyError::NotWasm { found })
}

fn detect_role(engine: &wasmtime::Engine, component: &Component) -> Result<Role> {
    let ty = component.component_type();
    let exports: Vec<String> = ty
        .exports(engine)
        .map(|(name, _)| name.to_string())
        .collect();
    let roles: Vec<Role> = Role::ALL
        .into_iter()
        .filter(|role| exports.iter().any(|e| e == role.export_name()))
        .collect();
    match roles.as_slice() {
        [role] => Ok(*role),
        [] => Err(PolicyError::MissingWorld {
            expected: Role::ALL.map(Role::export_name).join(", "),
            found: if exports.is_empty() {
                "nothing".into()
            } else {
                exports.join(", ")
            },
        }),
        several => Err(PolicyError::SeveralWorlds {
            found: several
                .iter()
                .map(|r| r.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// Imports every policy gets, capability-free.
const ALWAYS: [&str; 4] = ["gantry:policy/", "wasi:io/", "wasi:cli/", "wasi:random/"];

fn import_names(engine: &wasmtime::Engine, component: &Component) -> Vec<String> {
    component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .collect()
}

fn first_unknown_import(engine: &wasmtime::Engine, component: &Component) -> Option<String> {
    import_names(engine, component).into_iter().find(|name| {
        !ALWAYS.iter().any(|p| name.starts_with(p))
            && !["wasi:clocks/", "wasi:filesystem/", "wasi:sockets/"]
                .iter()
                .any(|p| name.starts_with(p))
    })
}

fn check_imports(
    engine: &wasmtime::Engine,
    compiled: &CompiledPolicy,
    caps: &Capabilities,
) -> Result<()> {
    let mut refused: Vec<String> = Vec::new();
    let mut grants: Vec<&str> = Vec::new();
    for name in import_names(engine, compiled.component()) {
        if ALWAYS.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        let (granted, grant) = if name.starts_with("wasi:clocks/") {
            (caps.clock, "the clock")
        } else if name.starts_with("wasi:filesystem/") {
            (caps.read_dir.is_some(), "a read directory")
        } else if name.starts_with("wasi:sockets/") {
            (caps.network, "the network")
        } else {
            return Err(PolicyError::UnknownImport { import: name });
        };
        if !granted {
            refused.push(format!("`{name}`"));
            if !grants.contains(&grant) {
                grants.push(grant);
            }
        }
    }
    if refused.is_empty() {
        return Ok(());
    }
    Err(PolicyError::NotGranted {
        imports: refused.join(", "),
        grants: grants.join(" and "),
    })
}

impl CompiledPolicy {
    /// The names of every interface the component imports, as `check_imports` sees them.
    pub fn imports(&self) -> Vec<String> {
        let pre = match &self.pre {
            RolePre::Filter(pre) => pre.instance_pre(),
            RolePre::Score(pre) => pre.instance_pre(),
            RolePre::Quota(pre) => pre.instance_pre(),
        };
        import_names(pre.engine(), self.component())
    }

    pub(crate) fn component(&self) -> &Component {
        match &self.pre {
            RolePre::Filter(pre) => pre.instance_pre().component(),
            RolePre::Score(pre) => pre.instance_pre().component(),
            RolePre::Quota(pre) => pre.instance_pre().component(),
        }
    }
}

pub(crate) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
