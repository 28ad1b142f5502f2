//! The Rust guest SDK for Gantry policies. It wraps the `gantry:policy@0.1.0` bindings (and,
//! in [`v0_2`], those of 0.2.0: label columns, domain names, score reasons) so that a
//! policy is a small trait impl plus one `export_*!` line: authors get a readable per-node view
//! over the node columns, and the SDK keeps the one-call-per-pod, columns-of-integers shape that
//! makes a call cost nanoseconds per node.
//!
//! ```ignore
//! use gantry_policy_sdk::prelude::*;
//!
//! struct OnlyHealthy;
//! impl FilterPolicy for OnlyHealthy {
//!     const NAME: &'static str = "only-healthy";
//!     const REASONS: &'static [(u16, &'static str)] = &[(1, "node is not healthy")];
//!     fn new(_config: &str) -> Result<Self, String> { Ok(Self) }
//!     fn filter(&self, _pod: &Pod, node: &Node) -> u16 {
//!         if node.health() == Health::Healthy { FITS } else { 1 }
//!     }
//! }
//! gantry_policy_sdk::export_filter!(OnlyHealthy);
//! ```

pub mod bindings;
pub mod v0_2;
mod view;

pub use view::{Node, Nodes, Pod};

pub use bindings::types::{
    CohortUsage, Health, Job, QueueUsage, QuotaVerdict, Resources, Sym, Taint, TaintEffect,
    Toleration,
};

/// A filter's answer for a node that fits.
pub const FITS: u16 = 0;
/// The highest score a node may get (kube-scheduler's MaxNodeScore).
pub const MAX_SCORE: u32 = 100;
/// A node's domain id at a level it has no domain in.
pub const NO_DOMAIN: u32 = u32::MAX;

/// A filter policy: decides, node by node, whether a pod fits.
pub trait FilterPolicy: Sized + 'static {
    const NAME: &'static str;
    const VERSION: &'static str = "0.1.0";
    /// Every non-zero reason code and its text, declared once at init.
    const REASONS: &'static [(u16, &'static str)];
    /// Parse the JSON config; an `Err` message reaches the admin unchanged.
    fn new(config: &str) -> Result<Self, String>;
    /// `FITS` or a declared reason code.
    fn filter(&self, pod: &Pod, node: &Node<'_, '_>) -> u16;
}

/// A score policy: ranks the nodes that passed every filter, 0..=`MAX_SCORE`.
pub trait ScorePolicy: Sized + 'static {
    const NAME: &'static str;
    const VERSION: &'static str = "0.1.0";
    fn new(config: &str) -> Result<Self, String>;
    fn score(&self, pod: &Pod, node: &Node<'_, '_>) -> u32;
    /// Score every node. Override it to compute something once per call (a per-domain table,
    /// say) instead of once per node; the default calls [`score`](Self::score) per node and
    /// caps each score at `MAX_SCORE`. An override must keep scores in 0..=`MAX_SCORE`: the host
    /// treats anything above as bad output.
    fn score_all(&self, pod: &Pod, nodes: &Nodes<'_>) -> Vec<u32> {
        nodes
            .iter()
            .map(|node| self.score(pod, &node).min(MAX_SCORE))
            .collect()
    }
}

/// A quota policy: admits, denies, or admits a job as borrowing.
pub trait QuotaPolicy: Sized + 'static {
    const NAME: &'static str;
    const VERSION: &'static str = "0.1.0";
    fn new(config: &str) -> Result<Self, String>;
    fn admit(&self, job: &Job, queue: &QueueUsage, cohort: Option<&CohortUsage>) -> QuotaVerdict;
}

/// Write to the policy's log on the host (shown beside its decisions).
pub fn log(level: bindings::host::LogLevel, message: &str) {
    bindings::host::log(level, message);
}

/// The string behind an interned id (node, queue, GPU type, taint key or value).
pub fn resolve(sym: Sym) -> String {
    bindings::host::resolve(sym)
}

/// The id of a string, if the host has seen it.
pub fn lookup(text: &str) -> Option<Sym> {
    bindings::host::lookup(text)
}

pub mod prelude {
    pub use crate::bindings::host::LogLevel;
    pub use crate::{
        CohortUsage, FITS, FilterPolicy, Health, Job, MAX_SCORE, NO_DOMAIN, Node, Nodes, Pod,
        QueueUsage, QuotaPolicy, QuotaVerdict, Resources, ScorePolicy, Sym, Taint, TaintEffect,
        Toleration, log, lookup, resolve,
    };
}

#[doc(hidden)]
pub mod __private {
    use std::sync::OnceLock;

    use crate::bindings::types::{PolicyInfo, Reason};
    pub use crate::bindings::{filter, quota, score};

    /// Holds the policy built by `init`. A component instance is single-threaded, and the host
    /// calls `init` once before any other call.
    pub struct Slot<P>(OnceLock<P>);

    impl<P> Slot<P> {
        pub const fn new() -> Self {
            Self(OnceLock::new())
        }

        pub fn init(&self, policy: P) {
            // A second init on the same instance keeps the first policy; the host never does it.
            let _ = self.0.set(policy);
        }

        pub fn get(&self) -> &P {
            self.0
                .get()
                .expect("gantry host called the policy before init")
        }
    }

    impl<P> Default for Slot<P> {
        fn default() -> Self {
            Self::new()
        }
    }

    pub fn info(name: &str, version: &str, reasons: &[(u16, &str)]) -> PolicyInfo {
        PolicyInfo {
            name: name.to_string(),
            version: version.to_string(),
            reasons: reasons
                .iter()
                .map(|&(code, text)| Reason {
                    code,
                    text: text.to_string(),
                })
                .collect(),
        }
    }
}

/// Export a [`FilterPolicy`] as the component's `filter` world.
#[macro_export]
macro_rules! export_filter {
    ($policy:ty) => {
        const _: () = {
            use $crate::__private::filter::exports::gantry::policy::filter_policy as __wit;
            static SLOT: $crate::__private::Slot<$policy> = $crate::__private::Slot::new();
            struct Export;
            impl __wit::Guest for Export {
                fn init(config: String) -> Result<__wit::PolicyInfo, String> {
                    let policy = <$policy as $crate::FilterPolicy>::new(&config)?;
                    SLOT.init(policy);
                    Ok($crate::__private::info(
                        <$policy as $crate::FilterPolicy>::NAME,
                        <$policy as $crate::FilterPolicy>::VERSION,
                        <$policy as $crate::FilterPolicy>::REASONS,
                    ))
                }
                fn filter(pod: __wit::Pod, nodes: __wit::Nodes) -> Vec<u16> {
                    let policy = SLOT.get();
                    let pod = $crate::Pod::new(&pod);
                    $crate::Nodes::new(&nodes)
                        .iter()
                        .map(|node| $crate::FilterPolicy::filter(policy, &pod, &node))
                        .collect()
                }
            }
    $crate::__private::filter::export!(Export with_types_in $crate::__private::filter);
        };
    };
}

/// Export a [`ScorePolicy`] as the component's `score` world.
#[macro_export]
macro_rules! export_score {
    ($policy:ty) => {
        const _: () = {
            use $crate::__private::score::exports::gantry::policy::score_policy as __wit;
            static SLOT: $crate::__private::Slot<$policy> = $crate::__private::Slot::new();
            struct Export;
            impl __wit::Guest for Export {
                fn init(config: String) -> Result<__wit::PolicyInfo, String> {
                    let policy = <$policy as $crate::ScorePolicy>::new(&config)?;
                    SLOT.init(policy);
                    Ok($crate::__private::info(
                        <$policy as $crate::ScorePolicy>::NAME,
                        <$policy as $crate::ScorePolicy>::VERSION,
                        &[],
                    ))
                }
                fn score(pod: __wit::Pod, nodes: __wit::Nodes) -> Vec<u32> {
                    let policy = SLOT.get();
                    let pod = $crate::Pod::new(&pod);
                    $crate::ScorePolicy::score_all(policy, &pod, &$crate::Nodes::new(&nodes))
                }
            }
    $crate::__private::score::export!(Export with_types_in $crate::__private::score);
        };
    };
}

/// Export a [`QuotaPolicy`] as the component's `quota` world.
#[macro_export]
macro_rules! export_quota {
    ($policy:ty) => {
        const _: () = {
            use $crate::__private::quota::exports::gantry::policy::quota_policy as __wit;
            static SLOT: $crate::__private::Slot<$policy> = $crate::__private::Slot::new();
            struct Export;
            impl __wit::Guest for Export {
                fn init(config: String) -> Result<__wit::PolicyInfo, String> {
                    let policy = <$policy as $crate::QuotaPolicy>::new(&config)?;
                    SLOT.init(policy);
                    Ok($crate::__private::info(
                        <$policy as $crate::QuotaPolicy>::NAME,
                        <$policy as $crate::QuotaPolicy>::VERSION,
                        &[],
                    ))
                }
                fn admit(
                    job: __wit::Job,
                    queue: __wit::QueueUsage,
                    cohort: Option<__wit::CohortUsage>,
                ) -> __wit::QuotaVerdict {
                    $crate::QuotaPolicy::admit(SLOT.get(), &job, &queue, cohort.as_ref())
                }
            }
    $crate::__private::quota::export!(Export with_types_in $crate::__private::quota);
        };
    };
}
