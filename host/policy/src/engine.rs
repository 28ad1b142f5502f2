use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gantry_core::Symbols;
use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};

use crate::bindings::{filter::FilterPre, quota::QuotaPre, score::ScorePre, v2};
use crate::error::{PolicyError, Result};
use crate::instance::{HostState, ProcessBudget};
use crate::network::NetworkRule;
use crate::policy::{Policy, PolicyOptions};
use gantry_core::PolicyRole;

/// The version of the `gantry:policy` contract a component was built against, read from the
/// interface it exports. The host serves every version beside the others, so one set may mix
/// them; each keeps its own behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Version {
    /// `gantry:policy@0.1.0`, the first release.
    #[serde(rename = "0.1.0")]
    V0_1,
    /// `gantry:policy@0.2.0`: node label columns, `host.domain-name`, score reasons.
    #[serde(rename = "0.2.0")]
    V0_2,
}

impl Version {
    /// The interface a component of `role` exports in this contract version.
    pub fn export_name(self, role: PolicyRole) -> &'static str {
        match (role, self) {
            (PolicyRole::Filter, Version::V0_1) => "gantry:policy/filter-policy@0.1.0",
            (PolicyRole::Score, Version::V0_1) => "gantry:policy/score-policy@0.1.0",
            (PolicyRole::Quota, Version::V0_1) => "gantry:policy/quota-policy@0.1.0",
            (PolicyRole::Filter, Version::V0_2) => "gantry:policy/filter-policy@0.2.0",
            (PolicyRole::Score, Version::V0_2) => "gantry:policy/score-policy@0.2.0",
            (PolicyRole::Quota, Version::V0_2) => "gantry:policy/quota-policy@0.2.0",
        }
    }

    /// Every version served, oldest first.
    pub const ALL: [Version; 2] = [Version::V0_1, Version::V0_2];

    /// The package version, as WIT spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V0_1 => "0.1.0",
            Version::V0_2 => "0.2.0",
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Bounds on every policy call. Defaults follow DESIGN.md: 50 ms, 64 MiB.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Wall time for one call, enforced by epoch interruption. Also the longest a call waits
    /// for a warm instance before it faults.
    pub deadline: Duration,
    /// Wall time for instantiate + init. Apart from the call deadline because interpreted guests
    /// (Python, JavaScript) copy in a runtime heap of megabytes before init runs: ~12 ms alone
    /// for componentize-py's, which a busy host stretches past 50 ms. Init runs once per
    /// instance, off the hot path (on the policy's refill thread); a policy that loops in init
    /// is still stopped.
    pub init_deadline: Duration,
    /// Bytes one instance may hold in all its memories and tables together (tables are charged
    /// a pointer per element). A sum, not a per-memory cap: a component may create several
    /// memories and core instances, and each would otherwise get the whole cap.
    pub memory_bytes: usize,
    /// Bytes every instance of every policy of this engine may hold together: each store
    /// reserves what it grows and gives it back when dropped. Past it, instantiation and growth
    /// are refused (a [`PolicyFault::ProcessMemory`](crate::PolicyFault::ProcessMemory)), so
    /// many policies times their instances cannot exhaust the host.
    pub process_memory_bytes: usize,
    /// Bytes of `process_memory_bytes` only policies in a set may take: a policy loaded to
    /// validate an upload ([`crate::PolicyOptions::upload`]) stops short of them until it joins
    /// a set ([`crate::Policy::join_set`]), so uploads can never leave the active set's
    /// refills without memory. A quarter of the budget by default.
    pub set_reserve_bytes: usize,
    /// Elements of one table.
    pub table_elements: usize,
    /// Core instances a component may create in its store. Measured by the unit test
    /// `limits_fit_the_real_policies`: a Rust or ComponentizeJS policy needs 3, a
    /// componentize-py one 38 (libpython, libc and each native extension are core modules of
    /// their own, dynamically linked). 48 leaves a margin for a few more Python extensions, not
    /// room for a hostile component to multiply its memories (and the per-instance byte cap
    /// holds whatever the count).
    pub instances: usize,
    /// Tables a component may create in its store: every real policy creates 2 (measured as
    /// above); 4 leaves a margin of 2.
    pub tables: usize,
    /// Memories a component may create in its store: every real policy creates 1 (measured as
    /// above; componentize-py's modules share one); 2 leaves a margin of 1.
    pub memories: usize,
    /// Calls that may run at once on one policy; also the most instances it keeps alive.
    pub concurrency: usize,
    /// Wasm stack, so unbounded recursion traps early instead of exhausting the host's.
    pub max_wasm_stack: usize,
    /// Consecutive faults after which a policy is quarantined: its calls fault at once, without
    /// running Wasm, until a probe call succeeds.
    pub quarantine_after: u32,
    /// Wait before the first probe of a quarantined policy; doubled after each failed probe, up
    /// to `quarantine_backoff_max`.
    pub quarantine_backoff: Duration,
    /// The longest wait between probes.
    pub quarantine_backoff_max: Duration,
    /// Wall time for compiling one upload (waiting for a compile slot included). 60 s by
    /// default: a ComponentizeJS policy (~10 MB, a whole JS engine) took over 20 s to compile
    /// on a two-core test machine busy with other builds, and refusing a real policy is worse
    /// than a slow upload; the cap is there for hostile uploads that would compile for minutes.
    /// Past it,
    /// `compile` returns [`PolicyError::CompileTimeout`] at once; the compile itself finishes on
    /// its own thread, holding its slot (wasmtime cannot cancel a compile).
    pub compile_timeout: Duration,
    /// `log` lines a policy may write per second, on average.
    pub log_lines_per_s: u32,
    /// `log` lines a policy may write in a burst before the rate applies.
    pub log_burst: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            deadline: Duration::from_millis(50),
            init_deadline: Duration::from_millis(1000),
            memory_bytes: 64 << 20,
            process_memory_bytes: 1 << 30,
            set_reserve_bytes: 1 << 28,
            table_elements: 100_000,
            instances: 48,
            tables: 4,
            memories: 2,
            concurrency: 4,
            max_wasm_stack: 1 << 20,
            quarantine_after: 5,
            quarantine_backoff: Duration::from_secs(1),
            quarantine_backoff_max: Duration::from_secs(300),
            compile_timeout: Duration::from_secs(60),
            log_lines_per_s: 20,
            log_burst: 100,
        }
    }
}

/// WASI capabilities an operator grants a policy. None by default: a policy gets the host
/// `log`/`resolve`/`lookup` calls, an empty environment, captured stdio and random numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Capabilities {
    /// The WASI clocks (wall and monotonic).
    pub clock: bool,
    /// A directory the policy may read, mounted at `/`.
    pub read_dir: Option<PathBuf>,
    /// Addresses the policy may connect and send to. Empty: no network (and a component that
    /// imports `wasi:sockets` is refused). Name lookup is never granted.
    pub network: Vec<NetworkRule>,
}

/// Compiles that may run at once in the process: each compile already uses every core
/// (wasmtime compiles functions in parallel), so more at once only queue for the same cores and
/// hold more memory; two keep one upload from waiting on another's whole compile.
pub const COMPILE_SLOTS: usize = 2;

/// The process-wide compile slots (a counting semaphore). Process-wide, not per engine, because
/// the cores and memory compiles compete for are the process's.
static COMPILE_PERMITS: Semaphore = Semaphore::new(COMPILE_SLOTS);

struct Semaphore {
    free: Mutex<usize>,
    freed: Condvar,
}

impl Semaphore {
    const fn new(permits: usize) -> Self {
        Self {
            free: Mutex::new(permits),
            freed: Condvar::new(),
        }
    }

    /// A permit, waiting until `deadline`; `None` if none came free in time.
    fn acquire(&'static self, deadline: Instant) -> Option<Permit> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if *free > 0 {
                *free -= 1;
                return Some(Permit(self));
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            free = self
                .freed
                .wait_timeout(free, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Held while a compile runs; gives the slot back when dropped, wherever the compile ends.
struct Permit(&'static Semaphore);

impl Drop for Permit {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.0.freed.notify_one();
    }
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
    /// The process-wide Wasm memory budget every store of this engine reserves from.
    pub(crate) budget: Arc<ProcessBudget>,
    /// Compiled components keyed by the sha256 of their bytes, so uploading the same policy
    /// twice (or under another name) compiles once. Locked only to look up or insert.
    digest_to_compiled: Mutex<HashMap<[u8; 32], Arc<CompiledPolicy>>>,
    /// Tells the ticker thread to stop when the engine is dropped.
    stop: AtomicBool,
    /// Held by the scheduling loop while it decides; warm-spare inits that no caller waits
    /// for pause on it (see [`PolicyEngine::cycle_gate`]).
    pub(crate) gate: Arc<crate::CycleGate>,
}

/// A compiled, pre-linked component: instantiating from here costs microseconds.
pub struct CompiledPolicy {
    /// The sha256 of the component's bytes, hex: its identity in the cache and the store.
    pub sha256: String,
    /// The role its exports play.
    pub role: PolicyRole,
    /// The contract version its exports follow.
    pub version: Version,
    /// The component's size in bytes.
    pub size_bytes: usize,
    pub(crate) pre: RolePre,
}

pub(crate) enum RolePre {
    Filter(FilterPre<HostState>),
    Score(ScorePre<HostState>),
    Quota(QuotaPre<HostState>),
    FilterV2(v2::filter::FilterPre<HostState>),
    ScoreV2(v2::score::ScorePre<HostState>),
    QuotaV2(v2::quota::QuotaPre<HostState>),
}

impl RolePre {
    /// The pre-instantiated component, whatever its role and version.
    fn instance_pre(&self) -> &wasmtime::component::InstancePre<HostState> {
        match self {
            RolePre::Filter(pre) => pre.instance_pre(),
            RolePre::Score(pre) => pre.instance_pre(),
            RolePre::Quota(pre) => pre.instance_pre(),
            RolePre::FilterV2(pre) => pre.instance_pre(),
            RolePre::ScoreV2(pre) => pre.instance_pre(),
            RolePre::QuotaV2(pre) => pre.instance_pre(),
        }
    }
}

impl PolicyEngine {
    /// An engine whose policies run under `limits` and resolve ids through `symbols`; starts
    /// the epoch ticker thread.
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
            budget: Arc::new(ProcessBudget::new(
                limits.process_memory_bytes,
                limits.set_reserve_bytes,
            )),
            limits,
            symbols,
            digest_to_compiled: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            gate: Arc::default(),
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

    /// The gate the scheduling loop holds while it decides ([`crate::CycleGate::enter`]).
    /// Background Wasm of this engine pauses on it at each epoch tick: warm spares that no
    /// caller waits for, and shadow sets bound with [`crate::BoundSet::waiting_on`] it. So on a
    /// machine with few cores, a policy spinning in its init or a candidate set being compared
    /// takes only the time between cycles.
    pub fn cycle_gate(&self) -> Arc<crate::CycleGate> {
        self.shared.gate.clone()
    }

    /// The bounds every policy of this engine runs under.
    pub fn limits(&self) -> &Limits {
        &self.shared.limits
    }

    /// Bytes of Wasm memories and tables every live instance of this engine holds now, out of
    /// `Limits::process_memory_bytes`: for metrics, and for tests that check the budget is
    /// given back.
    pub fn process_memory_used(&self) -> usize {
        self.shared.budget.used()
    }

    /// The interned strings policies resolve ids through.
    pub fn symbols(&self) -> &Arc<Symbols> {
        &self.shared.symbols
    }

    /// Compile (or find compiled) and check the component's world and imports. At most
    /// [`COMPILE_SLOTS`] compiles run at once in the process, and one takes at most
    /// `Limits::compile_timeout` (waiting for a slot included): past it this returns
    /// [`PolicyError::CompileTimeout`] at once, while the compile finishes on its own thread,
    /// holding its slot, and lands in the cache (so a retry of the same bytes is instant).
    pub fn compile(&self, bytes: &[u8], caps: &Capabilities) -> Result<Arc<CompiledPolicy>> {
        let digest: [u8; 32] = Sha256::digest(bytes).into();
        let cached = self.shared.cached(&digest);
        let compiled = match cached {
            Some(compiled) => compiled,
            None => self.compile_bounded(bytes, digest)?,
        };
        check_imports(&self.shared.engine, &compiled, caps)?;
        Ok(compiled)
    }

    /// Compile on a thread of its own under a compile slot, waiting at most the compile timeout.
    fn compile_bounded(&self, bytes: &[u8], digest: [u8; 32]) -> Result<Arc<CompiledPolicy>> {
        let limit = self.shared.limits.compile_timeout;
        let deadline = Instant::now() + limit;
        let permit = COMPILE_PERMITS
            .acquire(deadline)
            .ok_or(PolicyError::CompileBusy {
                limit,
                slots: COMPILE_SLOTS,
            })?;
        let (send, receive) = std::sync::mpsc::sync_channel(1);
        let shared = self.shared.clone();
        let bytes = bytes.to_vec();
        std::thread::Builder::new()
            .name("gantry-policy-compile".into())
            .spawn(move || {
                let result = compile_new(&shared, &bytes, digest).map(|compiled| {
                    shared
                        .digest_to_compiled
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(digest)
                        .or_insert_with(|| Arc::new(compiled))
                        .clone()
                });
                drop(permit);
                // The caller may have given up; then the result only warms the cache.
                let _ = send.send(result);
            })
            .map_err(|e| PolicyError::Engine(format!("cannot start a compile thread: {e}")))?;
        let left = deadline.saturating_duration_since(Instant::now());
        match receive.recv_timeout(left) {
            Ok(result) => result,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                Err(PolicyError::CompileTimeout { limit })
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(PolicyError::Engine(
                "the compile thread ended without an answer".into(),
            )),
        }
    }

    /// Compile, check, instantiate and `init` with `config`: a policy ready to call.
    pub fn load(&self, bytes: &[u8], options: PolicyOptions) -> Result<Policy> {
        if let Err(e) = serde_json::from_str::<serde_json::Value>(&options.config) {
            return Err(PolicyError::ConfigNotJson(e.to_string()));
        }
        if let Some(deadline) = options.deadline
            && (deadline.is_zero() || deadline > crate::MAX_CALL_DEADLINE)
        {
            return Err(PolicyError::BadDeadline {
                deadline_ms: u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
                max_ms: crate::MAX_CALL_DEADLINE.as_millis() as u64,
            });
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
}

fn compile_new(shared: &EngineShared, bytes: &[u8], digest: [u8; 32]) -> Result<CompiledPolicy> {
    check_magic(bytes)?;
    let engine = &shared.engine;
    let component = Component::new(engine, bytes).map_err(|e| {
        let detail = one_line(&format!("{e:#}"));
        // wasmparser's two words for a file that stops early: a read past its end, or a
        // section that reaches past it.
        let past_the_end = format!("out of bounds (bound = {})", bytes.len());
        if detail.contains("unexpected end") || detail.contains(&past_the_end) {
            PolicyError::Truncated {
                at: bytes.len(),
                inside: format!("the component ({detail})"),
            }
        } else {
            PolicyError::Invalid(detail)
        }
    })?;
    let (role, version) = detect_role(engine, &component)?;
    prepare_memory_images(&component)?;
    let linker = &shared.linker;
    let wrong_world = |e: wasmtime::Error| PolicyError::WrongWorld {
        world: format!("gantry:policy/{role}@{version}"),
        detail: one_line(&format!("{e:#}")),
    };
    let instance_pre = linker.instantiate_pre(&component).map_err(|e| {
        // An import we do not provide is reported by `check_imports` with a better message.
        match first_unknown_import(engine, &component) {
            Some(import) => PolicyError::UnknownImport { import },
            None => wrong_world(e),
        }
    })?;
    let pre = match (role, version) {
        (PolicyRole::Filter, Version::V0_1) => {
            RolePre::Filter(FilterPre::new(instance_pre).map_err(wrong_world)?)
        }
        (PolicyRole::Score, Version::V0_1) => {
            RolePre::Score(ScorePre::new(instance_pre).map_err(wrong_world)?)
        }
        (PolicyRole::Quota, Version::V0_1) => {
            RolePre::Quota(QuotaPre::new(instance_pre).map_err(wrong_world)?)
        }
        (PolicyRole::Filter, Version::V0_2) => {
            RolePre::FilterV2(v2::filter::FilterPre::new(instance_pre).map_err(wrong_world)?)
        }
        (PolicyRole::Score, Version::V0_2) => {
            RolePre::ScoreV2(v2::score::ScorePre::new(instance_pre).map_err(wrong_world)?)
        }
        (PolicyRole::Quota, Version::V0_2) => {
            RolePre::QuotaV2(v2::quota::QuotaPre::new(instance_pre).map_err(wrong_world)?)
        }
    };
    Ok(CompiledPolicy {
        sha256: hex(&digest),
        role,
        version,
        size_bytes: bytes.len(),
        pre,
    })
}

/// How many times [`prepare_memory_images`] builds an image the kernel refused as busy.
const MEMORY_IMAGE_ATTEMPTS: u32 = 6;

/// Build the component's copy-on-write memory images now, on the compile thread, instead of
/// at its first instantiation. Linux can refuse to seal the memfd wasmtime has just written
/// (`EBUSY`) while another CPU still briefly holds references to its pages; at instantiation
/// that refusal read as the policy faulting in its init. The refusal is transient, and an image
/// that failed is not kept, so a busy refusal is retried after a short, doubling pause.
fn prepare_memory_images(component: &Component) -> Result<()> {
    retry_when_busy(MEMORY_IMAGE_ATTEMPTS, Duration::from_millis(2), || {
        component.initialize_copy_on_write_image()
    })
    .map_err(|(attempts, error)| PolicyError::MemoryImage {
        attempts,
        source: error.into(),
    })
}

/// Run `op` until it succeeds, fails with anything but a busy OS error, or has run `attempts`
/// times, sleeping `pause` (doubled each time) between runs. On failure, also says how many
/// runs were made.
fn retry_when_busy<T>(
    attempts: u32,
    mut pause: Duration,
    mut op: impl FnMut() -> wasmtime::Result<T>,
) -> std::result::Result<T, (u32, wasmtime::Error)> {
    let mut attempt = 1;
    loop {
        match op() {
            Ok(value) => return Ok(value),
            Err(error) if attempt < attempts && is_busy(&error) => {
                std::thread::sleep(pause);
                pause *= 2;
                attempt += 1;
            }
            Err(error) => return Err((attempt, error)),
        }
    }
}

/// Whether an OS "device or resource busy" error is anywhere in `error`'s chain.
fn is_busy(error: &wasmtime::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ResourceBusy)
    })
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
    fn cached(&self, digest: &[u8; 32]) -> Option<Arc<CompiledPolicy>> {
        self.digest_to_compiled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(digest)
            .cloned()
    }

    /// Epoch ticks that cover the init deadline.
    pub(crate) fn init_deadline_ticks(&self) -> u64 {
        ticks_for(self.limits.init_deadline)
    }
}

/// Epoch ticks that cover `deadline`, plus one for the tick already under way.
pub(crate) fn ticks_for(deadline: Duration) -> u64 {
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
    if bytes.len() < COMPONENT.len() && bytes.starts_with(b"\0asm") {
        return Err(PolicyError::Truncated {
            at: bytes.len(),
            inside: "the 8-byte WebAssembly header".to_string(),
        });
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

/// The role and contract version of the one policy interface the component exports.
fn detect_role(engine: &wasmtime::Engine, component: &Component) -> Result<(PolicyRole, Version)> {
    let ty = component.component_type();
    let exports: Vec<String> = ty
        .exports(engine)
        .map(|(name, _)| name.to_string())
        .collect();
    let roles: Vec<(PolicyRole, Version)> = Version::ALL
        .into_iter()
        .flat_map(|version| PolicyRole::ALL.map(|role| (role, version)))
        .filter(|(role, version)| exports.iter().any(|e| e == version.export_name(*role)))
        .collect();
    match roles.as_slice() {
        [found] => Ok(*found),
        [] => Err(PolicyError::MissingWorld {
            expected: Version::ALL
                .into_iter()
                .flat_map(|version| PolicyRole::ALL.map(|role| version.export_name(role)))
                .collect::<Vec<_>>()
                .join(", "),
            found: if exports.is_empty() {
                "nothing".into()
            } else {
                exports.join(", ")
            },
        }),
        several => Err(PolicyError::SeveralWorlds {
            found: several
                .iter()
                .map(|(role, version)| format!("{role}@{version}"))
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
            (!caps.network.is_empty(), "network addresses")
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
        import_names(self.pre.instance_pre().engine(), self.component())
    }

    pub(crate) fn component(&self) -> &Component {
        self.pre.instance_pre().component()
    }
}

pub(crate) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// What wasmtime returns when the kernel will not seal a memory image: memfd's error
    /// around the OS error.
    fn busy() -> wasmtime::Error {
        wasmtime::Error::new(std::io::Error::from_raw_os_error(16))
            .context("cannot add seals to the memfd")
    }

    #[test]
    fn a_busy_kernel_is_asked_again_and_other_errors_are_not() {
        let runs = Cell::new(0);
        let twice_busy = retry_when_busy(6, Duration::ZERO, || {
            runs.set(runs.get() + 1);
            if runs.get() <= 2 {
                Err(busy())
            } else {
                Ok(runs.get())
            }
        });
        assert_eq!(twice_busy.ok(), Some(3));

        runs.set(0);
        let always_busy = retry_when_busy(6, Duration::ZERO, || {
            runs.set(runs.get() + 1);
            Err::<(), _>(busy())
        });
        let (attempts, error) = always_busy.expect_err("always busy");
        assert_eq!((attempts, runs.get()), (6, 6));
        assert!(is_busy(&error));

        runs.set(0);
        let other = retry_when_busy(6, Duration::ZERO, || {
            runs.set(runs.get() + 1);
            Err::<(), _>(wasmtime::Error::new(std::io::Error::from_raw_os_error(12)))
        });
        assert_eq!(other.expect_err("out of memory").0, 1);
        assert_eq!(runs.get(), 1);
    }

    #[test]
    fn a_memory_image_the_kernel_kept_refusing_names_the_os_error() {
        let error = PolicyError::MemoryImage {
            attempts: 6,
            source: busy().into(),
        };
        assert_eq!(
            error.to_string(),
            "cannot prepare the policy's initial memory (tried 6 times): cannot add seals to the \
             memfd: Device or resource busy (os error 16)"
        );
        let source = std::error::Error::source(&error).expect("source kept");
        assert_eq!(source.to_string(), "cannot add seals to the memfd");
    }
}
