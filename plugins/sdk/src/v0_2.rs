//! Contract `gantry:policy@0.2.0`: what 0.1.0 has, plus node label columns, topology domain
//! names and score reasons. A policy opts in by implementing this module's traits and
//! exporting with [`export_filter_v0_2!`](crate::export_filter_v0_2) or
//! [`export_score_v0_2!`](crate::export_score_v0_2); 0.1.0 policies keep compiling and running
//! unchanged.
//!
//! ```ignore
//! use gantry_policy_sdk::prelude::*;
//! use gantry_policy_sdk::v0_2::{self, Labels, Scored};
//!
//! struct PreferTrain;
//! impl v0_2::ScorePolicy for PreferTrain {
//!     const NAME: &'static str = "prefer-train";
//!     fn new(_config: &str) -> Result<Self, String> { Ok(Self) }
//!     fn label_keys(&self) -> Vec<String> { vec!["gantry.dev/pool".into()] }
//!     fn score_all(&self, _pod: &Pod, nodes: &Nodes<'_>, labels: &Labels<'_>) -> Scored {
//!         let train = lookup("train");
//!         let mut scored = Scored::new(nodes.len());
//!         for node in nodes.iter() {
//!             if train.is_some() && labels.value(0, node.index()) == train {
//!                 scored.scores[node.index()] = MAX_SCORE;
//!             }
//!         }
//!         scored
//!     }
//! }
//! gantry_policy_sdk::export_score_v0_2!(PreferTrain);
//! ```

use crate::bindings::v2;
use crate::{Node, Nodes, Pod, Sym};

pub use crate::bindings::v2::labels::LabelColumn;

/// Most label keys a policy may ask for; more fails the load.
pub const LABEL_KEYS_MAX: usize = 16;
/// Most reasons one `score` call may give; more is a fault.
pub const SCORE_REASONS_MAX: usize = 16;
/// Longest reason text, in bytes; longer is a fault.
pub const REASON_TEXT_MAX_BYTES: usize = 200;

/// The label columns of one call: one per key the policy asked for, in that order.
#[derive(Clone, Copy)]
pub struct Labels<'a> {
    raw: &'a [LabelColumn],
}

impl<'a> Labels<'a> {
    /// A view over the columns the host passed.
    #[inline]
    pub fn new(raw: &'a [LabelColumn]) -> Self {
        Self { raw }
    }

    /// The columns as the host passed them.
    #[inline]
    pub fn raw(&self) -> &'a [LabelColumn] {
        self.raw
    }

    /// Node `node`'s value for the `key`-th key asked for, or `None` where it has no such
    /// label (or the empty value).
    #[inline]
    pub fn value(&self, key: usize, node: usize) -> Option<Sym> {
        let value = *self.raw.get(key)?.values.get(node)?;
        (value != 0).then_some(value)
    }

    /// As [`value`](Self::value), for a node view.
    #[inline]
    pub fn of(&self, key: usize, node: &Node<'_, '_>) -> Option<Sym> {
        self.value(key, node.index())
    }
}

/// What a 0.2.0 score returns: a score per node, and reasons for a few of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scored {
    /// One score per node, each in 0..=[`crate::MAX_SCORE`].
    pub scores: Vec<u32>,
    /// `(node index, text)`: at most [`SCORE_REASONS_MAX`], no node twice, each text at most
    /// [`REASON_TEXT_MAX_BYTES`]. Give them for the nodes you scored best: those are the ones a
    /// decision's explanation shows.
    pub reasons: Vec<(u32, String)>,
}

impl Scored {
    /// Every node at 0, no reasons.
    pub fn new(nodes: usize) -> Self {
        Self {
            scores: vec![0; nodes],
            reasons: Vec::new(),
        }
    }
}

/// A 0.2.0 filter policy: as [`crate::FilterPolicy`], with the label columns it asked for.
pub trait FilterPolicy: Sized + 'static {
    /// The policy's name, shown in every explanation.
    const NAME: &'static str;
    /// The policy's version.
    const VERSION: &'static str = "0.1.0";
    /// Every non-zero reason code and its text, declared once at init.
    const REASONS: &'static [(u16, &'static str)];
    /// Parse the JSON config; an `Err` message reaches the admin unchanged.
    fn new(config: &str) -> Result<Self, String>;
    /// The label keys whose columns `filter` gets, in this order. None by default.
    fn label_keys(&self) -> Vec<String> {
        Vec::new()
    }
    /// `FITS` or a declared reason code.
    fn filter(&self, pod: &Pod, node: &Node<'_, '_>, labels: &Labels<'_>) -> u16;
}

/// A 0.2.0 score policy: as [`crate::ScorePolicy`], with label columns and reasons.
pub trait ScorePolicy: Sized + 'static {
    /// The policy's name, shown in every explanation.
    const NAME: &'static str;
    /// The policy's version.
    const VERSION: &'static str = "0.1.0";
    /// Parse the JSON config; an `Err` message reaches the admin unchanged.
    fn new(config: &str) -> Result<Self, String>;
    /// The label keys whose columns `score_all` gets, in this order. None by default.
    fn label_keys(&self) -> Vec<String> {
        Vec::new()
    }
    /// Score every node, and give reasons for a few.
    fn score_all(&self, pod: &Pod, nodes: &Nodes<'_>, labels: &Labels<'_>) -> Scored;
}

/// Write to the policy's log on the host (shown beside its decisions).
pub fn log(level: v2::host::LogLevel, message: &str) {
    v2::host::log(level, message);
}

/// The string behind an interned id.
pub fn resolve(sym: Sym) -> String {
    v2::host::resolve(sym)
}

/// The id of a string, if the host has seen it.
pub fn lookup(text: &str) -> Option<Sym> {
    v2::host::lookup(text)
}

/// The name of domain `domain` at topology level `level` (an index into the node columns'
/// levels), during a `filter` or `score` call; `None` where the cluster names none.
pub fn domain_name(level: usize, domain: u32) -> Option<String> {
    v2::host::domain_name(u32::try_from(level).ok()?, domain)
}

#[doc(hidden)]
pub mod __private {
    pub use crate::bindings::v2::{filter, score};

    /// Turns the SDK's [`Scored`](super::Scored) into the WIT record.
    pub fn scored(scored: super::Scored) -> score::exports::gantry::policy::score_policy::Scored {
        use score::exports::gantry::policy::score_policy::{NodeReason, Scored};
        Scored {
            scores: scored.scores,
            reasons: scored
                .reasons
                .into_iter()
                .map(|(node, text)| NodeReason { node, text })
                .collect(),
        }
    }
}

/// Export a [`v0_2::FilterPolicy`](crate::v0_2::FilterPolicy) as the component's `filter` world
/// of contract 0.2.0.
#[macro_export]
macro_rules! export_filter_v0_2 {
    ($policy:ty) => {
        const _: () = {
            use $crate::v0_2::__private::filter::exports::gantry::policy::filter_policy as __wit;
            static SLOT: $crate::__private::Slot<$policy> = $crate::__private::Slot::new();
            struct Export;
            impl __wit::Guest for Export {
                fn init(config: String) -> Result<__wit::PolicyInfo, String> {
                    let policy = <$policy as $crate::v0_2::FilterPolicy>::new(&config)?;
                    SLOT.init(policy);
                    Ok($crate::__private::info(
                        <$policy as $crate::v0_2::FilterPolicy>::NAME,
                        <$policy as $crate::v0_2::FilterPolicy>::VERSION,
                        <$policy as $crate::v0_2::FilterPolicy>::REASONS,
                    ))
                }
                fn label_keys() -> Vec<String> {
                    $crate::v0_2::FilterPolicy::label_keys(SLOT.get())
                }
                fn filter(
                    pod: __wit::Pod,
                    nodes: __wit::Nodes,
                    labels: Vec<__wit::LabelColumn>,
                ) -> Vec<u16> {
                    let policy = SLOT.get();
                    let pod = $crate::Pod::new(&pod);
                    let labels = $crate::v0_2::Labels::new(&labels);
                    $crate::Nodes::new(&nodes)
                        .iter()
                        .map(|node| $crate::v0_2::FilterPolicy::filter(policy, &pod, &node, &labels))
                        .collect()
                }
            }
            $crate::v0_2::__private::filter::export!(Export with_types_in $crate::v0_2::__private::filter);
        };
    };
}

/// Export a [`v0_2::ScorePolicy`](crate::v0_2::ScorePolicy) as the component's `score` world
/// of contract 0.2.0.
#[macro_export]
macro_rules! export_score_v0_2 {
    ($policy:ty) => {
        const _: () = {
            use $crate::v0_2::__private::score::exports::gantry::policy::score_policy as __wit;
            static SLOT: $crate::__private::Slot<$policy> = $crate::__private::Slot::new();
            struct Export;
            impl __wit::Guest for Export {
                fn init(config: String) -> Result<__wit::PolicyInfo, String> {
                    let policy = <$policy as $crate::v0_2::ScorePolicy>::new(&config)?;
                    SLOT.init(policy);
                    Ok($crate::__private::info(
                        <$policy as $crate::v0_2::ScorePolicy>::NAME,
                        <$policy as $crate::v0_2::ScorePolicy>::VERSION,
                        &[],
                    ))
                }
                fn label_keys() -> Vec<String> {
                    $crate::v0_2::ScorePolicy::label_keys(SLOT.get())
                }
                fn score(
                    pod: __wit::Pod,
                    nodes: __wit::Nodes,
                    labels: Vec<__wit::LabelColumn>,
                ) -> __wit::Scored {
                    let policy = SLOT.get();
                    let pod = $crate::Pod::new(&pod);
                    let labels = $crate::v0_2::Labels::new(&labels);
                    $crate::v0_2::__private::scored($crate::v0_2::ScorePolicy::score_all(
                        policy,
                        &pod,
                        &$crate::Nodes::new(&nodes),
                        &labels,
                    ))
                }
            }
            $crate::v0_2::__private::score::export!(Export with_types_in $crate::v0_2::__private::score);
        };
    };
}
