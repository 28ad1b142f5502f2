use std::sync::Arc;

use gantry_core::Symbols;
use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{ResourceLimiter, Store, StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::bindings::{filter::Filter, host, quota::Quota, score::Score, types};
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
    /// stdout and stderr of the guest, bounded; a Rust panic message lands here.
    console: MemoryOutputPipe,
}

/// `StoreLimits` plus a note of which limit refused, so a trap after a refused `memory.grow`
/// reads as "out of memory" rather than as the guest's own abort.
struct Limiter {
    limits: StoreLimits,
    memory_refused: bool,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = self.limits.memory_growing(current, desired, maximum)?;
        self.memory_refused |= !allowed;
        Ok(allowed)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.limits.table_growing(current, desired, maximum)
    }

    fn instances(&self) -> usize {
        self.limits.instances()
    }

    fn tables(&self) -> usize {
        self.limits.tables()
    }

    fn memories(&self) -> usize {
        self.limits.memories()
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

impl host::Host for HostState {
    fn log(&mut self, level: host::LogLevel, mut message: String) {
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

    fn resolve(&mut self, id: types::Sym) -> String {
        self.symbols.resolve(id).to_string()
    }

    fn lookup(&mut self, text: String) -> Option<types::Sym> {
        self.symbols.lookup(&text)
    }
}

/// The host imports: Gantry's `host` interface and the WASI interfaces. Every WASI interface is
/// linked, but `check_imports` refuses a component that imports one it was not granted, and the
/// `WasiCtx` of an ungranted policy has no preopened directory and no network.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_sync(linker)?;
    host::add_to_linker::<HostState, HasSelf<HostState>>(linker, |state| state)?;
    types::add_to_linker::<HostState, HasSelf<HostState>>(linker, |state| state)?;
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
}

impl Instance {
    pub(crate) fn new(
        shared: &EngineShared,
        compiled: &CompiledPolicy,
        caps: &Capabilities,
        policy_name: Arc<str>,
    ) -> wasmtime::Result<Self> {
        let limits = &shared.limits;
        let console = MemoryOutputPipe::new(CONSOLE_CAPACITY);
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdout(console.clone()).stderr(console.clone());
        if let Some(dir) = &caps.read_dir {
            wasi.preopened_dir(dir, "/", wasmtime_wasi::FsPerms::ReadOnly)?;
        }
        if caps.network {
            wasi.inherit_network();
        }
        let state = HostState {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limiter: Limiter {
                limits: StoreLimitsBuilder::new()
                    .memory_size(limits.memory_bytes)
                    .table_elements(limits.table_elements)
                    .instances(limits.instances)
                    .tables(limits.tables)
                    .memories(limits.memories)
                    .build(),
                memory_refused: false,
            },
            symbols: shared.symbols.clone(),
            policy_name,
            console,
        };
        let mut store = Store::new(&shared.engine, state);
        store.limiter(|state| &mut state.limiter);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(shared.init_deadline_ticks());
        let exports = match &compiled.pre {
            RolePre::Filter(pre) => Exports::Filter(pre.instantiate(&mut store)?),
            RolePre::Score(pre) => Exports::Score(pre.instantiate(&mut store)?),
            RolePre::Quota(pre) => Exports::Quota(pre.instantiate(&mut store)?),
        };
        Ok(Self { store, exports })
    }

    /// Arm the deadline and clear the notes of the previous call.
    pub(crate) fn arm(&mut self, ticks: u64) {
        self.store.set_epoch_deadline(ticks);
        self.store.data_mut().limiter.memory_refused = false;
    }

    pub(crate) fn memory_refused(&self) -> bool {
        self.store.data().limiter.memory_refused
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
