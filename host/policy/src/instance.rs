use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant as Clock};

use gantry_core::Symbols;
use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{ResourceLimiter, Store};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::sockets::SocketAddrUse;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::bindings::{filter::Filter, host, quota::Quota, score::Score, types, v2};
use crate::engine::{Capabilities, CompiledPolicy, EngineShared, RolePre};

/// Bytes of a policy's stdout/stderr kept, for the panic message of a trap.
const CONSOLE_CAPACITY: usize = 64 << 10;
/// Longest `log` message kept; a policy cannot flood the host's logs.
const LOG_MESSAGE_MAX: usize = 4 << 10;

/// Everything one policy instance's store holds.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: Limiter,
    symbols: Arc<Symbols>,
    policy_name: Arc<str>,
    /// The policy's `log` rate limit, shared by all its instances.
    log: Arc<LogBucket>,
    /// stdout and stderr of the guest, bounded; a Rust panic message lands here.
    console: MemoryOutputPipe,
    /// How the running call's deadline is kept: see [`arm_deadline`].
    deadline: Deadline,
    /// The domain names of the nodes of the running 0.2.0 `filter` or `score` call, per level
    /// then per domain id: what `host.domain-name` reads. `None` outside such a call.
    pub(crate) domains: Option<crate::convert::DomainNames>,
}

/// A call's deadline. A plain one traps when its ticks are reached. A pausing one (a shadow
/// set's call) is checked at every tick: while the loop is in a cycle the guest waits there,
/// and the ticks it waited do not count.
#[derive(Default)]
enum Deadline {
    #[default]
    Plain,
    Pausing {
        ticks_left: u64,
        gate: Arc<crate::CycleGate>,
        /// Do not pause while this is set (callers wait for the spare being made).
        unless: Option<Arc<std::sync::atomic::AtomicBool>>,
    },
}

/// Arms `store`'s deadline for a call (or an init) of `ticks` epoch ticks, pausing on the
/// calling thread's gate if it has one.
fn arm_deadline(store: &mut Store<HostState>, ticks: u64) {
    match crate::set::pausing_on() {
        Some((gate, unless)) => {
            store.data_mut().deadline = Deadline::Pausing {
                ticks_left: ticks,
                gate,
                unless,
            };
            store.set_epoch_deadline(1);
        }
        None => {
            store.data_mut().deadline = Deadline::Plain;
            store.set_epoch_deadline(ticks);
        }
    }
}

/// Called when a store's epoch deadline is reached: a plain deadline traps (as a timeout); a
/// pausing one waits out the loop's cycle, counts one tick, and continues until none are left.
fn on_deadline(
    mut store: wasmtime::StoreContextMut<'_, HostState>,
) -> wasmtime::Result<wasmtime::UpdateDeadline> {
    if let Deadline::Pausing {
        ticks_left,
        gate,
        unless,
    } = &mut store.data_mut().deadline
        && *ticks_left > 1
    {
        *ticks_left -= 1;
        gate.wait_idle_unless(unless.as_deref());
        return Ok(wasmtime::UpdateDeadline::Continue(1));
    }
    Err(wasmtime::Trap::Interrupt.into())
}

/// What an instance's store shares with its policy: its name for log lines, and the policy's log
/// rate limit.
#[derive(Clone)]
pub(crate) struct InstanceHost {
    pub(crate) policy_name: Arc<str>,
    pub(crate) log: Arc<LogBucket>,
    /// Whether the policy is in a set, so its stores may take the budget's set reserve (see
    /// `Limits::set_reserve_bytes`); flipped once, when an upload joins a set.
    pub(crate) in_set: Arc<std::sync::atomic::AtomicBool>,
}

/// A token bucket for one policy's `log` calls: `rate` lines a second, bursts up to `burst`.
/// Lines over it are dropped and counted; [`LogBucket::summary`] turns the count into one line
/// (the first at once, then at most one a second), so a policy that logs in a loop costs the
/// host a bounded number of lines, and the admin still learns that lines were lost.
pub(crate) struct LogBucket {
    rate: f64,
    burst: f64,
    state: Mutex<BucketState>,
    /// Where lines written and dropped are counted.
    stats: Arc<crate::policy::PolicyStats>,
}

struct BucketState {
    tokens: f64,
    refilled_at: Option<Clock>,
    /// Dropped since the last summary line.
    unreported: u64,
    summary_at: Option<Clock>,
}

/// How often a "dropped N lines" summary may be written.
const LOG_SUMMARY_EVERY: Duration = Duration::from_secs(1);

impl LogBucket {
    pub(crate) fn new(rate_per_s: u32, burst: u32, stats: Arc<crate::policy::PolicyStats>) -> Self {
        Self {
            rate: f64::from(rate_per_s),
            burst: f64::from(burst),
            state: Mutex::new(BucketState {
                tokens: f64::from(burst),
                refilled_at: None,
                unreported: 0,
                summary_at: None,
            }),
            stats,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BucketState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a line may go out at `now`; counts it as dropped if not.
    pub(crate) fn take(&self, now: Clock) -> bool {
        let mut state = self.lock();
        if let Some(then) = state.refilled_at {
            let earned = now.saturating_duration_since(then).as_secs_f64() * self.rate;
            state.tokens = (state.tokens + earned).min(self.burst);
        }
        state.refilled_at = Some(now);
        if state.tokens >= 1.0 {
            state.tokens -= 1.0;
            self.stats.log_lines.fetch_add(1, Ordering::Relaxed);
            true
        } else {
            state.unreported += 1;
            self.stats.log_dropped.fetch_add(1, Ordering::Relaxed);
            false
        }
    }

    /// Lines dropped since the last summary, when a summary is due at `now`.
    pub(crate) fn summary(&self, now: Clock) -> Option<u64> {
        let mut state = self.lock();
        if state.unreported == 0 {
            return None;
        }
        if state
            .summary_at
            .is_some_and(|then| now.saturating_duration_since(then) < LOG_SUMMARY_EVERY)
        {
            return None;
        }
        state.summary_at = Some(now);
        Some(std::mem::take(&mut state.unreported))
    }

    /// Write the "dropped N lines" line for `policy` if one is due.
    pub(crate) fn report(&self, policy: &str) {
        if let Some(dropped) = self.summary(Clock::now()) {
            tracing::warn!(
                policy,
                "dropped {dropped} log lines over the rate limit ({}/s, bursts of {})",
                self.rate,
                self.burst
            );
        }
    }
}

/// Why the limiter refused a grow, so the fault names the limit that was hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The instance's own total (every memory and table of its store) would pass
    /// `Limits::memory_bytes`.
    Instance,
    /// The process-wide Wasm budget (`Limits::process_memory_bytes`) is spent.
    Process,
    /// A policy outside every set reached the budget less the sets' reserve.
    Reserve,
}

/// Bytes a table element is charged: a funcref or externref slot is one pointer in wasmtime.
const TABLE_ELEMENT_BYTES: usize = std::mem::size_of::<usize>();

/// Sums every memory and every table of one store against one cap, and reserves the same bytes
/// from the process-wide [`ProcessBudget`]. A per-memory cap (wasmtime's `StoreLimits`) lets a
/// component with N memories (or N core instances, one memory each) take N times the cap; a
/// sum does not. wasmtime calls `memory_growing`/`table_growing` with `current = 0` for the
/// initial size of each memory and table at instantiation, so the sum covers those too. What
/// the store reserved is given back when the store (and with it this limiter) drops.
pub(crate) struct Limiter {
    cap: usize,
    table_elements: usize,
    instances: usize,
    tables: usize,
    memories: usize,
    /// Bytes of memories and tables this store holds (and has reserved from `budget`).
    used: usize,
    /// The last approved growth, undone if wasmtime then fails to grow.
    last_grow: usize,
    budget: Arc<ProcessBudget>,
    /// Whether its policy is in a set (see [`InstanceHost::in_set`]).
    in_set: Arc<std::sync::atomic::AtomicBool>,
    /// The first limit that refused a grow since the last `arm`.
    pub(crate) refused: Option<Refusal>,
    /// Memories and tables created (initial grows), for measuring what policies need.
    pub(crate) memories_seen: usize,
    pub(crate) tables_seen: usize,
}

impl Limiter {
    pub(crate) fn new(
        limits: &crate::engine::Limits,
        budget: Arc<ProcessBudget>,
        in_set: Arc<std::sync::atomic::AtomicBool>,
    ) -> Self {
        Self {
            cap: limits.memory_bytes,
            table_elements: limits.table_elements,
            instances: limits.instances,
            tables: limits.tables,
            memories: limits.memories,
            used: 0,
            last_grow: 0,
            budget,
            in_set,
            refused: None,
            memories_seen: 0,
            tables_seen: 0,
        }
    }

    /// Bytes this store holds, memories and tables together.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    fn grow(&mut self, delta: usize) -> bool {
        if self.used.saturating_add(delta) > self.cap {
            self.refused.get_or_insert(Refusal::Instance);
            return false;
        }
        let in_set = self.in_set.load(std::sync::atomic::Ordering::Acquire);
        if let Err(refusal) = self.budget.reserve(delta, in_set) {
            self.refused.get_or_insert(refusal);
            return false;
        }
        self.used += delta;
        self.last_grow = delta;
        true
    }

    fn undo_last_grow(&mut self) {
        self.budget.release(self.last_grow);
        self.used -= self.last_grow;
        self.last_grow = 0;
    }
}

impl Drop for Limiter {
    fn drop(&mut self) {
        self.budget.release(self.used);
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if current == 0 {
            self.memories_seen += 1;
        }
        Ok(self.grow(desired.saturating_sub(current)))
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.undo_last_grow();
        Ok(())
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if current == 0 {
            self.tables_seen += 1;
        }
        if desired > self.table_elements {
            self.refused.get_or_insert(Refusal::Instance);
            return Ok(false);
        }
        let delta = desired
            .saturating_sub(current)
            .saturating_mul(TABLE_ELEMENT_BYTES);
        Ok(self.grow(delta))
    }

    fn table_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.undo_last_grow();
        Ok(())
    }

    fn instances(&self) -> usize {
        self.instances
    }

    fn tables(&self) -> usize {
        self.tables
    }

    fn memories(&self) -> usize {
        self.memories
    }
}

/// The Wasm memory every store of one engine may hold together (`Limits::process_memory_bytes`).
/// Reserved by each store's [`Limiter`] as it grows, given back when the store drops, so N
/// policies times `concurrency` instances times the per-instance cap cannot add up past it.
#[derive(Debug)]
pub(crate) struct ProcessBudget {
    cap: usize,
    /// What only stores of policies in a set may take (`Limits::set_reserve_bytes`).
    set_reserve: usize,
    used: std::sync::atomic::AtomicUsize,
}

impl ProcessBudget {
    pub(crate) fn new(cap: usize, set_reserve: usize) -> Self {
        Self {
            cap,
            set_reserve: set_reserve.min(cap),
            used: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    pub(crate) fn used(&self) -> usize {
        self.used.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Take `bytes` if they fit, all or nothing: within the whole budget for a policy
    /// `in_set`, else within the budget less the sets' reserve. Says which limit refused.
    fn reserve(&self, bytes: usize, in_set: bool) -> Result<(), Refusal> {
        use std::sync::atomic::Ordering;
        let (limit, refusal) = if in_set {
            (self.cap, Refusal::Process)
        } else {
            (self.cap - self.set_reserve, Refusal::Reserve)
        };
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= limit)
            })
            .map(|_| ())
            .map_err(|_| refusal)
    }

    fn release(&self, bytes: usize) {
        self.used
            .fetch_sub(bytes, std::sync::atomic::Ordering::AcqRel);
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl types::Host for HostState {}

impl HostState {
    /// `host.log`, for both contract versions: the policy's rate limit, then one bounded line.
    fn write_log(&mut self, level: host::LogLevel, mut message: String) {
        if !self.log.take(Clock::now()) {
            return;
        }
        if message.len() > LOG_MESSAGE_MAX {
            let mut cut = LOG_MESSAGE_MAX;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push_str("… (truncated)");
        }
        let policy = &*self.policy_name;
        match level {
            host::LogLevel::Debug => tracing::debug!(policy, "{message}"),
            host::LogLevel::Info => tracing::info!(policy, "{message}"),
            host::LogLevel::Warn => tracing::warn!(policy, "{message}"),
            host::LogLevel::Error => tracing::error!(policy, "{message}"),
        }
    }
}

impl host::Host for HostState {
    fn log(&mut self, level: host::LogLevel, message: String) {
        self.write_log(level, message);
    }

    fn resolve(&mut self, id: types::Sym) -> String {
        self.symbols.resolve(id).to_string()
    }

    fn lookup(&mut self, text: String) -> Option<types::Sym> {
        self.symbols.lookup(&text)
    }
}

impl v2::labels::Host for HostState {}

impl v2::host::Host for HostState {
    fn log(&mut self, level: v2::host::LogLevel, message: String) {
        let level = match level {
            v2::host::LogLevel::Debug => host::LogLevel::Debug,
            v2::host::LogLevel::Info => host::LogLevel::Info,
            v2::host::LogLevel::Warn => host::LogLevel::Warn,
            v2::host::LogLevel::Error => host::LogLevel::Error,
        };
        self.write_log(level, message);
    }

    fn resolve(&mut self, id: types::Sym) -> String {
        self.symbols.resolve(id).to_string()
    }

    fn lookup(&mut self, text: String) -> Option<types::Sym> {
        self.symbols.lookup(&text)
    }

    fn domain_name(&mut self, level: u32, domain: u32) -> Option<String> {
        let names = self.domains.as_ref()?;
        let name = *names.get(level as usize)?.get(domain as usize)?;
        (name != 0).then(|| self.symbols.resolve(name).to_string())
    }
}

/// The host imports: Gantry's `host` interface and the WASI interfaces. Every WASI interface is
/// linked, but `check_imports` refuses a component that imports one it was not granted, and the
/// `WasiCtx` of an ungranted policy has no preopened directory and no network.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_sync(linker)?;
    host::add_to_linker::<HostState, HasSelf<HostState>>(linker, |state| state)?;
    types::add_to_linker::<HostState, HasSelf<HostState>>(linker, |state| state)?;
    // 0.2.0: its own `host` and `labels`; its `types` are 0.1.0's (see `bindings::v2`), with
    // nothing to link but the instance name.
    v2::host::add_to_linker::<HostState, HasSelf<HostState>>(linker, |state| state)?;
    v2::labels::add_to_linker::<HostState, HasSelf<HostState>>(linker, |state| state)?;
    linker.instance("gantry:policy/types@0.2.0")?;
    Ok(())
}

/// One live instance of a policy, with its own store. Reused while healthy, dropped after any
/// fault.
pub(crate) struct Instance {
    pub(crate) store: Store<HostState>,
    pub(crate) exports: Exports,
}

pub(crate) enum Exports {
    Filter(Filter),
    Score(Score),
    Quota(Quota),
    FilterV2(v2::filter::Filter),
    ScoreV2(v2::score::Score),
    QuotaV2(v2::quota::Quota),
}

impl RolePre {
    /// Instantiate in `store`: the exports of this role and version.
    pub(crate) fn instantiate(&self, store: &mut Store<HostState>) -> wasmtime::Result<Exports> {
        match self {
            RolePre::Filter(pre) => pre.instantiate(store).map(Exports::Filter),
            RolePre::Score(pre) => pre.instantiate(store).map(Exports::Score),
            RolePre::Quota(pre) => pre.instantiate(store).map(Exports::Quota),
            RolePre::FilterV2(pre) => pre.instantiate(store).map(Exports::FilterV2),
            RolePre::ScoreV2(pre) => pre.instantiate(store).map(Exports::ScoreV2),
            RolePre::QuotaV2(pre) => pre.instantiate(store).map(Exports::QuotaV2),
        }
    }
}

impl Instance {
    /// A new store and instance. On failure, also says which memory limit refused, if one did,
    /// since the error wasmtime returns for a refused initial memory does not.
    pub(crate) fn new(
        shared: &EngineShared,
        compiled: &CompiledPolicy,
        caps: &Capabilities,
        host: InstanceHost,
    ) -> Result<Self, (wasmtime::Error, Option<Refusal>)> {
        let mut store = new_store(shared, caps, host).map_err(|e| (e, None))?;
        let exports = compiled.pre.instantiate(&mut store);
        match exports {
            Ok(exports) => Ok(Self { store, exports }),
            Err(e) => Err((e, store.data().limiter.refused)),
        }
    }

    /// Arm the deadline and clear the notes of the previous call.
    pub(crate) fn arm(&mut self, ticks: u64) {
        arm_deadline(&mut self.store, ticks);
        self.store.data_mut().limiter.refused = None;
    }

    /// Which memory limit refused a grow since the last `arm`, if one did.
    pub(crate) fn refused(&self) -> Option<Refusal> {
        self.store.data().limiter.refused
    }

    /// The store's limiter, for what it measured.
    #[cfg(test)]
    pub(crate) fn limiter(&self) -> &Limiter {
        &self.store.data().limiter
    }

    /// The guest's last console line (a Rust panic prints its message there).
    pub(crate) fn console_tail(&self) -> Option<String> {
        let bytes = self.store.data().console.contents();
        let text = String::from_utf8_lossy(&bytes);
        text.lines()
            .rev()
            .find(|line| !line.trim().is_empty() && !line.contains("note: run with"))
            .map(|line| line.trim().to_string())
    }
}

/// A store with the policy's WASI context, limiter and init deadline: what every instance of
/// the policy runs in. Separate from [`Instance::new`] so tests can instantiate components of no
/// policy world (the hostile WATs) under exactly the same bounds.
pub(crate) fn new_store(
    shared: &EngineShared,
    caps: &Capabilities,
    host: InstanceHost,
) -> wasmtime::Result<Store<HostState>> {
    let console = MemoryOutputPipe::new(CONSOLE_CAPACITY);
    let mut wasi = WasiCtxBuilder::new();
    wasi.stdout(console.clone()).stderr(console.clone());
    if let Some(dir) = &caps.read_dir {
        wasi.preopened_dir(dir, "/", wasmtime_wasi::FsPerms::ReadOnly)?;
    }
    // Sockets only to the allow-list; no name lookup, since a name resolves to addresses this
    // check would have to trust, and a policy that needs a host can be granted its address.
    let allowed = caps.network.clone();
    wasi.allow_ip_name_lookup(false)
        .allow_tcp(!allowed.is_empty())
        .allow_udp(!allowed.is_empty())
        .socket_addr_check(move |addr, used| {
            let ok = socket_allowed(&allowed, addr, used);
            Box::pin(async move { ok })
        });
    let state = HostState {
        wasi: wasi.build(),
        table: ResourceTable::new(),
        limiter: Limiter::new(&shared.limits, shared.budget.clone(), host.in_set.clone()),
        symbols: shared.symbols.clone(),
        policy_name: host.policy_name,
        log: host.log,
        console,
        deadline: Deadline::Plain,
        domains: None,
    };
    let mut store = Store::new(&shared.engine, state);
    store.limiter(|state| &mut state.limiter);
    store.epoch_deadline_callback(on_deadline);
    arm_deadline(&mut store, shared.init_deadline_ticks());
    Ok(store)
}

/// Whether a policy may use `addr` this way: connect and send to (and receive from) listed
/// addresses; bind only implicitly (the wildcard address, any port, as `connect` does); never
/// listen or accept, since a policy serves nobody.
fn socket_allowed(
    allowed: &[crate::network::NetworkRule],
    addr: std::net::SocketAddr,
    used: SocketAddrUse,
) -> bool {
    match used {
        SocketAddrUse::TcpBind | SocketAddrUse::UdpBind => addr.ip().is_unspecified(),
        SocketAddrUse::TcpListen | SocketAddrUse::TcpAccept => false,
        SocketAddrUse::TcpConnect | SocketAddrUse::UdpSend | SocketAddrUse::UdpReceive => {
            allowed.iter().any(|rule| rule.matches(addr))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::engine::{Limits, PolicyEngine};
    use crate::error::PolicyFault;
    use wasmtime::component::Component;

    fn host() -> InstanceHost {
        InstanceHost {
            policy_name: Arc::from("test"),
            log: Arc::new(LogBucket::new(20, 100, Default::default())),
            in_set: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        }
    }

    /// Instantiate a component of no policy world (a hostile WAT) in a store built exactly as
    /// a policy's, and classify the failure as a policy call would.
    fn instantiate_wat(engine: &PolicyEngine, file: &str) -> (PolicyFault, usize) {
        let path = format!(
            "{}/../../plugins/hostile/wat/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        let shared = &engine.shared;
        let component = Component::from_file(&shared.engine, &path).expect(&path);
        let mut store = new_store(shared, &Capabilities::default(), host()).unwrap();
        let error = match shared.linker.instantiate(&mut store, &component) {
            Ok(_) => panic!("{file} instantiated within the cap"),
            Err(error) => error,
        };
        let refused = store.data().limiter.refused;
        let fault = crate::policy::classify(
            &shared.limits,
            shared.limits.deadline,
            refused,
            None,
            &error,
            true,
        );
        (fault, store.data().limiter.used())
    }

    /// Counts loose enough that only the sum of bytes can stop the hostile WATs.
    fn loose_counts() -> Limits {
        Limits {
            instances: 16,
            memories: 16,
            ..Limits::default()
        }
    }

    #[test]
    fn many_memories_are_stopped_at_the_per_instance_total() {
        let engine = PolicyEngine::new(loose_counts(), gantry_core::Symbols::new()).unwrap();
        let (fault, used) = instantiate_wat(&engine, "many-memories.wat");
        assert_eq!(fault, PolicyFault::OutOfMemory { limit_mib: 64 });
        assert_eq!(
            fault.to_string(),
            "ran out of memory (memories and tables are capped at 64 MiB per instance)"
        );
        // Eight 1-page memories, three of them grown by 16 MiB: the fourth grow was refused.
        assert_eq!(used, 8 * (64 << 10) + 3 * (16 << 20));
    }

    #[test]
    fn many_core_instances_are_stopped_at_the_per_instance_total() {
        let engine = PolicyEngine::new(loose_counts(), gantry_core::Symbols::new()).unwrap();
        let (fault, used) = instantiate_wat(&engine, "many-instances.wat");
        assert_eq!(fault, PolicyFault::OutOfMemory { limit_mib: 64 });
        // Four instances made their 1-page memory; three grew it before the fourth was refused.
        assert_eq!(used, 4 * (64 << 10) + 3 * (16 << 20));
    }

    #[test]
    fn the_count_limits_refuse_the_hostile_wats_by_default() {
        let engine = PolicyEngine::new(Limits::default(), gantry_core::Symbols::new()).unwrap();
        let (fault, _) = instantiate_wat(&engine, "many-memories.wat");
        assert_eq!(
            fault,
            PolicyFault::Trap {
                message: "resource limit exceeded: memory count too high at 8".into()
            }
        );
    }

    #[test]
    fn the_process_budget_is_shared_and_given_back() {
        let limits = Limits {
            process_memory_bytes: 40 << 20,
            ..loose_counts()
        };
        let engine = PolicyEngine::new(limits, gantry_core::Symbols::new()).unwrap();
        // The budget refuses before the per-instance cap: 40 MiB fit two 16 MiB grows.
        let (fault, used) = instantiate_wat(&engine, "many-instances.wat");
        assert_eq!(fault, PolicyFault::ProcessMemory { budget_mib: 40 });
        assert_eq!(
            fault.to_string(),
            "the process's Wasm memory budget of 40 MiB is spent (all policies' instances \
             together); this instance could not get its memory"
        );
        assert_eq!(used, 3 * (64 << 10) + 2 * (16 << 20));
        // Both stores were dropped: all given back.
        assert_eq!(engine.process_memory_used(), 0);
    }

    #[test]
    fn the_log_bucket_lets_a_burst_through_then_the_rate() {
        let stats: Arc<crate::policy::PolicyStats> = Default::default();
        let bucket = LogBucket::new(20, 100, stats.clone());
        let t0 = Instant::now();
        assert_eq!((0..150).filter(|_| bucket.take(t0)).count(), 100);
        assert_eq!(bucket.summary(t0), Some(50));
        // A second later: 20 more tokens, and a summary is due again.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!((0..30).filter(|_| bucket.take(t1)).count(), 20);
        assert_eq!(bucket.summary(t1 - Duration::from_millis(1)), None);
        assert_eq!(bucket.summary(t1), Some(10));
        assert_eq!(bucket.summary(t1), None);
        let count = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        assert_eq!(
            (count(&stats.log_lines), count(&stats.log_dropped)),
            (120, 60)
        );
    }

    #[test]
    fn sockets_reach_only_the_allow_list() {
        let allowed = crate::NetworkRule::parse_list("10.0.0.0/8,127.0.0.1:8080").unwrap();
        let check = |addr: &str, used| socket_allowed(&allowed, addr.parse().unwrap(), used);
        assert!(check("10.1.2.3:443", SocketAddrUse::TcpConnect));
        assert!(check("127.0.0.1:8080", SocketAddrUse::TcpConnect));
        assert!(check("127.0.0.1:8080", SocketAddrUse::UdpSend));
        assert!(!check("127.0.0.1:8081", SocketAddrUse::TcpConnect));
        assert!(!check("169.254.169.254:80", SocketAddrUse::TcpConnect));
        assert!(!check("192.168.0.1:53", SocketAddrUse::UdpSend));
        // The implicit bind of a connect is to the wildcard address; nothing else binds.
        assert!(check("0.0.0.0:0", SocketAddrUse::TcpBind));
        assert!(!check("10.1.2.3:0", SocketAddrUse::TcpBind));
        // A policy never serves.
        assert!(!check("0.0.0.0:8080", SocketAddrUse::TcpListen));
        assert!(!check("10.1.2.3:8080", SocketAddrUse::TcpAccept));
        // No allow-list, no network.
        assert!(!socket_allowed(
            &[],
            "10.1.2.3:443".parse().unwrap(),
            SocketAddrUse::TcpConnect
        ));
    }

    /// What the real policies (Rust, componentize-py, ComponentizeJS) need, measured: the
    /// fewest core instances each instantiates with, and the memories and tables it creates.
    /// The defaults must fit every one of them; the numbers are printed for the `Limits` docs.
    #[test]
    fn limits_fit_the_real_policies() {
        let dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| format!("{}/../../target", env!("CARGO_MANIFEST_DIR")).into())
            .join("wasm32-wasip2/plugin");
        let defaults = Limits::default();
        let engine = PolicyEngine::new(
            Limits {
                // Compiling the JS runtime on a loaded two-core machine takes a while.
                compile_timeout: Duration::from_secs(600),
                ..Limits::default()
            },
            gantry_core::Symbols::new(),
        )
        .unwrap();
        let shared = &engine.shared;
        let mut misfits = Vec::new();
        for file in [
            "gpu_fit",
            "gpu_binpack",
            "team_quota",
            "noop",
            "keep_off",
            "label_affinity",
            "gpu_fit_py",
            "gpu_binpack_py",
            "gpu_fit_js",
            "team_quota_js",
        ] {
            let path = dir.join(format!("{file}.wasm"));
            let bytes = std::fs::read(&path).unwrap_or_else(|e| {
                panic!("{}: {e}; run scripts/build-plugins.sh", path.display())
            });
            let compiled = engine.compile(&bytes, &Capabilities::default()).unwrap();
            // The fewest core instances it instantiates with (the store reads the counts when
            // the limiter is set, so set it again after lowering the count).
            let needed_instances = (1..=64).find(|&n| {
                let mut store = new_store(shared, &Capabilities::default(), host()).unwrap();
                store.data_mut().limiter.instances = n;
                store.limiter(|state| &mut state.limiter);
                compiled.pre.instantiate(&mut store).is_ok()
            });
            // And it instantiates under the default limits, which wasmtime checks itself.
            let instance = match Instance::new(shared, &compiled, &Capabilities::default(), host())
            {
                Ok(instance) => instance,
                Err((e, _)) => {
                    println!("{file} does not instantiate under the default limits: {e}");
                    misfits.push(file);
                    continue;
                }
            };
            let needed_instances = needed_instances.unwrap_or(usize::MAX);
            let limiter = instance.limiter();
            println!(
                "{file}: {needed_instances} core instances, {} memories, {} tables, {} KiB",
                limiter.memories_seen,
                limiter.tables_seen,
                limiter.used() >> 10
            );
            let fits = needed_instances <= defaults.instances
                && limiter.memories_seen <= defaults.memories
                && limiter.tables_seen <= defaults.tables
                && limiter.used() <= defaults.memory_bytes;
            if !fits {
                misfits.push(file);
            }
        }
        assert!(misfits.is_empty(), "the defaults do not fit {misfits:?}");
    }
}
