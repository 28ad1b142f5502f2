//! Node selection beyond GPUs: node labels as the table holds them, and a pod's `nodeSelector`
//! and node affinity compiled to interned requirements.
//!
//! - [`NodeLabel`]: one label of a node, interned, with its value as an integer for `Gt`/`Lt`.
//! - [`Requirement`], [`LabelOp`], [`Term`]: Kubernetes' node selector requirement, operator and
//!   term, matched against a node's sorted labels by binary search, so a cycle never compares
//!   strings.
//! - [`NodeAffinity`]: what a pod's spec says about nodes: `nodeSelector` and required terms as
//!   a filter, preferred terms as a score.

use serde::{Deserialize, Serialize};

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
