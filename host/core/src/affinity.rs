//! Node selection beyond GPUs: node labels as the table holds them, and a pod's `nodeSelector`
//! and node affinity compiled to interned requirements.
//!
//! - [`NodeLabel`]: one label of a node, interned, with its value as an integer for `Gt`/`Lt`.
//! - [`Requirement`], [`LabelOp`], [`Term`]: Kubernetes' node selector requirement, operator and
//!   term, matched against a node's sorted labels by binary search, so a cycle never compares
//!   strings.
//! - [`NodeAffinity`]: what a pod's spec says about nodes: `nodeSelector` and required terms as
//!   a filter, preferred terms as a score.
//! - [`AffinityIndex`]: per distinct affinity, the nodes it allows and prefers, a chunk at a
//!   time, so pods that share a constraint (a gang, a Job's pods, a team's pool) pay for the
//!   label checks once and not on every decision.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::NodeTable;
use crate::symbols::Sym;

/// One node label. A node's labels are sorted by key, so a requirement finds its key by binary
/// search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeLabel {
    pub key: Sym,
    pub value: Sym,
    /// The value read as an integer, when it is one: what `Gt` and `Lt` compare, as
    /// Kubernetes parses it.
    pub number: Option<i64>,
}

impl NodeLabel {
    /// A label from interned key and value and the value's text (for its number).
    pub fn new(key: Sym, value: Sym, value_text: &str) -> Self {
        Self {
            key,
            value,
            number: value_text.parse().ok(),
        }
    }
}

/// A node selector operator, as `NodeSelectorRequirement` defines them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LabelOp {
    In(Vec<Sym>),
    NotIn(Vec<Sym>),
    Exists,
    DoesNotExist,
    Gt(i64),
    Lt(i64),
}

/// What a requirement reads: a label, or (`matchFields`) the node's name, the one field
/// Kubernetes allows there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Field {
    Label(Sym),
    NodeName,
}

/// One requirement: a field and an operator.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Requirement {
    pub field: Field,
    pub op: LabelOp,
}

impl Requirement {
    /// Whether a node with `labels` (sorted by key) and name `name` meets it. A missing label
    /// meets only `NotIn` and `DoesNotExist`, as in Kubernetes.
    pub fn matches(&self, labels: &[NodeLabel], name: Sym) -> bool {
        let (value, number) = match self.field {
            Field::NodeName => (Some(name), None),
            Field::Label(key) => match labels.binary_search_by_key(&key, |l| l.key) {
                Ok(i) => (Some(labels[i].value), labels[i].number),
                Err(_) => (None, None),
            },
        };
        match &self.op {
            LabelOp::In(values) => value.is_some_and(|v| values.contains(&v)),
            LabelOp::NotIn(values) => value.is_none_or(|v| !values.contains(&v)),
            LabelOp::Exists => value.is_some(),
            LabelOp::DoesNotExist => value.is_none(),
            LabelOp::Gt(bound) => number.is_some_and(|n| n > *bound),
            LabelOp::Lt(bound) => number.is_some_and(|n| n < *bound),
        }
    }
}

/// A node selector term: every requirement holds. An empty term matches no node, as in
/// Kubernetes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Term {
    pub requirements: Vec<Requirement>,
}

impl Term {
    pub fn matches(&self, labels: &[NodeLabel], name: Sym) -> bool {
        !self.requirements.is_empty() && self.requirements.iter().all(|r| r.matches(labels, name))
    }
}

/// What a pod's spec says about nodes, beyond GPUs and taints. Shared (`Arc`) by a gang's pods.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeAffinity {
    /// `nodeSelector` (each key `In` its one value): all hold.
    pub selector: Vec<Requirement>,
    /// `requiredDuringSchedulingIgnoredDuringExecution`: some term holds. Empty means no such
    /// constraint.
    pub required: Vec<Term>,
    /// `preferredDuringSchedulingIgnoredDuringExecution`: weight (1..=100) and term.
    pub preferred: Vec<(u32, Term)>,
}

impl NodeAffinity {
    /// Whether the filter lets the pod onto the node.
    pub fn allows(&self, labels: &[NodeLabel], name: Sym) -> bool {
        self.selector.iter().all(|r| r.matches(labels, name))
            && (self.required.is_empty() || self.required.iter().any(|t| t.matches(labels, name)))
    }

    /// The sum of the weights of the preferred terms the node meets.
    pub fn preference(&self, labels: &[NodeLabel], name: Sym) -> u32 {
        self.preferred
            .iter()
            .filter(|(_, term)| term.matches(labels, name))
            .map(|(weight, _)| weight)
            .sum()
    }

    /// Most [`preference`](Self::preference) can be.
    pub fn preference_max(&self) -> u32 {
        self.preferred.iter().map(|(weight, _)| weight).sum()
    }
}

/// What one affinity says about one chunk of nodes.
#[derive(Debug)]
pub struct ChunkAffinity {
    /// Bit `j` of word `j / 64` set: node `start + j` is allowed.
    allowed: Box<[u64]>,
    /// Per node, [`NodeAffinity::preference`] scaled to 0..=100; `None` when the affinity
    /// prefers nothing.
    preference: Option<Box<[u8]>>,
}

impl ChunkAffinity {
    fn of(affinity: &NodeAffinity, t: &NodeTable, nodes: Range<usize>) -> Self {
        let mut allowed = vec![0u64; nodes.len().div_ceil(64)].into_boxed_slice();
        for (j, node) in nodes.clone().enumerate() {
            if affinity.allows(t.labels(node), t.name[node]) {
                allowed[j / 64] |= 1 << (j % 64);
            }
        }
        let max = affinity.preference_max();
        let preference = (max > 0).then(|| {
            nodes
                .map(|node| {
                    let weight = affinity.preference(t.labels(node), t.name[node]);
                    // At most 100: the weights met are at most their sum.
                    (u64::from(weight) * 100 / u64::from(max)) as u8
                })
                .collect()
        });
        Self {
            allowed,
            preference,
        }
    }

    /// Whether the chunk's `j`-th node is allowed.
    #[inline]
    pub fn allows(&self, j: usize) -> bool {
        self.allowed[j / 64] & (1 << (j % 64)) != 0
    }

    /// Whether the affinity prefers anything (has preferred terms).
    pub fn prefers(&self) -> bool {
        self.preference.is_some()
    }

    /// The chunk's `j`-th node's preference in 0..=100; `None` when nothing is preferred.
    #[inline]
    pub fn preference(&self, j: usize) -> Option<u8> {
        self.preference.as_ref().map(|p| p[j])
    }
}

/// Per distinct [`NodeAffinity`] (by value, so pods that spell the same constraint share an
/// entry), what it says about each chunk of nodes, computed when first asked for. A pod with
/// a one-off constraint pays what the label checks cost anyway; every later pod with the same
/// constraint pays a bit test per node.
///
/// Entries hold for one label column: a table whose labels were replaced (the scheduler is
/// reset when a live node's labels change) drops them, as does growing past
/// [`AffinityIndex::MAX_ENTRIES`], so per-pod constraints cannot grow it without bound.
#[derive(Debug, Clone, Default)]
pub struct AffinityIndex {
    /// The label column the entries were computed from (its address and length).
    labels_seen: (usize, usize),
    /// Per affinity, its slot in `slot_chunks`.
    affinity_to_slot: HashMap<Arc<NodeAffinity>, usize>,
    /// Per slot, per chunk (its first node and one past its last), what the slot's affinity
    /// says about that chunk.
    slot_chunks: Vec<HashMap<(usize, usize), Arc<ChunkAffinity>>>,
    /// The affinity asked about last, by address, and its slot: a decision asks once per
    /// chunk, and hashing the whole constraint each time would cost more than the answer.
    last: Option<(Arc<NodeAffinity>, usize)>,
}

impl AffinityIndex {
    /// Distinct affinities kept before the index starts over.
    pub const MAX_ENTRIES: usize = 4096;

    /// What `affinity` says about the chunk `nodes` of `t`.
    pub fn chunk(
        &mut self,
        affinity: &Arc<NodeAffinity>,
        t: &NodeTable,
        nodes: Range<usize>,
    ) -> Arc<ChunkAffinity> {
        let seen = (t.labels.as_ptr() as usize, t.labels.len());
        if seen != self.labels_seen {
            self.clear();
            self.labels_seen = seen;
        }
        let slot = match &self.last {
            Some((last, slot)) if Arc::ptr_eq(last, affinity) => *slot,
            _ => {
                if self.affinity_to_slot.len() >= Self::MAX_ENTRIES
                    && !self.affinity_to_slot.contains_key(affinity)
                {
                    self.clear();
                }
                let next = self.slot_chunks.len();
                let slot = *self
                    .affinity_to_slot
                    .entry(affinity.clone())
                    .or_insert(next);
                if slot == next {
                    self.slot_chunks.push(HashMap::new());
                }
                self.last = Some((affinity.clone(), slot));
                slot
            }
        };
        self.slot_chunks[slot]
            .entry((nodes.start, nodes.end))
            .or_insert_with(|| Arc::new(ChunkAffinity::of(affinity, t, nodes)))
            .clone()
    }

    fn clear(&mut self) {
        self.affinity_to_slot.clear();
        self.slot_chunks.clear();
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn labels(pairs: &[(Sym, Sym, &str)]) -> Vec<NodeLabel> {
        let mut labels: Vec<NodeLabel> = pairs
            .iter()
            .map(|&(k, v, text)| NodeLabel::new(k, v, text))
            .collect();
        labels.sort_by_key(|l| l.key);
        labels
    }

    fn req(key: Sym, op: LabelOp) -> Requirement {
        Requirement {
            field: Field::Label(key),
            op,
        }
    }

    #[test]
    fn operators_follow_kubernetes() {
        // key 1 = pool, value 10 = "train"; key 2 = gpu-count "8".
        let node = labels(&[(1, 10, "train"), (2, 20, "8")]);
        let name = 99;
        assert!(req(1, LabelOp::In(vec![10, 11])).matches(&node, name));
        assert!(!req(1, LabelOp::In(vec![11])).matches(&node, name));
        assert!(!req(3, LabelOp::In(vec![10])).matches(&node, name));
        assert!(req(1, LabelOp::NotIn(vec![11])).matches(&node, name));
        assert!(!req(1, LabelOp::NotIn(vec![10])).matches(&node, name));
        assert!(
            req(3, LabelOp::NotIn(vec![10])).matches(&node, name),
            "NotIn holds for a missing label"
        );
        assert!(req(2, LabelOp::Exists).matches(&node, name));
        assert!(!req(3, LabelOp::Exists).matches(&node, name));
        assert!(req(3, LabelOp::DoesNotExist).matches(&node, name));
        assert!(req(2, LabelOp::Gt(7)).matches(&node, name));
        assert!(!req(2, LabelOp::Gt(8)).matches(&node, name));
        assert!(req(2, LabelOp::Lt(9)).matches(&node, name));
        assert!(
            !req(1, LabelOp::Gt(0)).matches(&node, name),
            "Gt never holds for a value that is not an integer"
        );
        assert!(!req(3, LabelOp::Lt(100)).matches(&node, name));
        let by_name = Requirement {
            field: Field::NodeName,
            op: LabelOp::In(vec![99]),
        };
        assert!(by_name.matches(&node, name));
        assert!(!by_name.matches(&node, 98));
    }

    #[test]
    fn terms_are_ored_and_an_empty_term_matches_nothing() {
        let node = labels(&[(1, 10, "train")]);
        let wrong = Term {
            requirements: vec![req(1, LabelOp::In(vec![11]))],
        };
        let right = Term {
            requirements: vec![req(1, LabelOp::In(vec![10]))],
        };
        let affinity = NodeAffinity {
            required: vec![wrong.clone(), right.clone()],
            ..NodeAffinity::default()
        };
        assert!(affinity.allows(&node, 0));
        let only_wrong = NodeAffinity {
            required: vec![wrong.clone()],
            ..NodeAffinity::default()
        };
        assert!(!only_wrong.allows(&node, 0));
        let empty_term = NodeAffinity {
            required: vec![Term::default()],
            ..NodeAffinity::default()
        };
        assert!(!empty_term.allows(&node, 0));
        let selector_and_terms = NodeAffinity {
            selector: vec![req(2, LabelOp::In(vec![20]))],
            required: vec![right.clone()],
            ..NodeAffinity::default()
        };
        assert!(
            !selector_and_terms.allows(&node, 0),
            "nodeSelector and affinity must both hold"
        );
        let preferring = NodeAffinity {
            preferred: vec![(30, right), (70, wrong)],
            ..NodeAffinity::default()
        };
        assert_eq!(preferring.preference(&node, 0), 30);
        assert_eq!(preferring.preference_max(), 100);
        assert!(preferring.allows(&node, 0), "preferences never filter");
    }

    proptest! {
        /// What the index says about a chunk is what the affinity says about each node in it,
        /// asked once or again, and for chunks of any start and length.
        #[test]
        fn the_index_agrees_with_the_affinity_node_by_node(
            node_values in proptest::collection::vec(proptest::option::of(1u32..5), 1..200),
            values in proptest::collection::vec(1u32..5, 1..3),
            weight in 1u32..100,
            split in 0usize..200,
        ) {
            let t = NodeTable {
                name: (0..node_values.len() as u32).collect(),
                labels: node_values
                    .iter()
                    .map(|v| match v {
                        Some(v) => vec![NodeLabel { key: 1, value: *v, number: None }].into(),
                        None => Vec::new().into(),
                    })
                    .collect(),
                ..NodeTable::default()
            };
            let term = Term { requirements: vec![req(1, LabelOp::In(values))] };
            let affinity = Arc::new(NodeAffinity {
                required: vec![term.clone()],
                preferred: vec![(weight, term)],
                ..NodeAffinity::default()
            });
            let split = split.min(t.len());
            let mut index = AffinityIndex::default();
            // The same constraint in another allocation (another pod's) shares the entries.
            let same = Arc::new((*affinity).clone());
            for asking in [&affinity, &affinity, &same] {
                for range in [0..split, split..t.len(), 0..t.len()] {
                    let chunk = index.chunk(asking, &t, range.clone());
                    for (j, node) in range.enumerate() {
                        let allowed = affinity.allows(t.labels(node), t.name[node]);
                        prop_assert_eq!(chunk.allows(j), allowed);
                        prop_assert_eq!(chunk.preference(j), Some(if allowed { 100 } else { 0 }));
                    }
                }
            }
        }

        /// `In` and `NotIn` over the same values are complements, and so are `Exists` and
        /// `DoesNotExist`, on any node.
        #[test]
        fn complementary_operators_disagree_on_every_node(
            pairs in proptest::collection::btree_map(1u32..8, 1u32..8, 0..6),
            key in 1u32..8,
            values in proptest::collection::vec(1u32..8, 1..4),
        ) {
            let node: Vec<NodeLabel> = pairs
                .iter()
                .map(|(&k, &v)| NodeLabel { key: k, value: v, number: Some(i64::from(v)) })
                .collect();
            prop_assert_ne!(
                req(key, LabelOp::In(values.clone())).matches(&node, 0),
                req(key, LabelOp::NotIn(values)).matches(&node, 0)
            );
            prop_assert_ne!(
                req(key, LabelOp::Exists).matches(&node, 0),
                req(key, LabelOp::DoesNotExist).matches(&node, 0)
            );
        }
    }
}
