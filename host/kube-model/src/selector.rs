//! Kubernetes label selectors over a namespace's labels: what a `Queue`'s `namespaceSelector`
//! is parsed into ([`crate::queues`]) and evaluated with ([`crate::tenancy`]). Apart from both,
//! so the Queue reader and the trust boundary depend on it and not on each other.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Labels by key, as a namespace carries them.
pub type Labels = BTreeMap<String, String>;

/// A Kubernetes label selector (`matchLabels` and `matchExpressions`, all of which must hold),
/// over a namespace's labels.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NamespaceSelector {
    /// `matchLabels`: each key must carry exactly this value.
    match_labels: Labels,
    /// `matchExpressions`.
    expressions: Vec<Requirement>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    /// The key is present with one of the values.
    In(String, BTreeSet<String>),
    /// The key is absent, or present with none of the values.
    NotIn(String, BTreeSet<String>),
    /// The key is present, with any value.
    Exists(String),
    /// The key is absent.
    DoesNotExist(String),
}

impl NamespaceSelector {
    /// Parses a `LabelSelector` as the API writes it (`{}` selects everything), or says what is
    /// wrong with it.
    pub fn parse(value: &serde_json::Value) -> Result<Self, String> {
        let selector: LabelSelector = serde_json::from_value(value.clone())
            .map_err(|e| format!("not a label selector ({e}), found {value}"))?;
        let mut expressions = Vec::new();
        for (i, e) in selector
            .match_expressions
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            let values: BTreeSet<String> = e.values.unwrap_or_default().into_iter().collect();
            let at = format!("matchExpressions[{i}]");
            let requirement = match e.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(format!(
                        "{at}: operator {} needs at least one value",
                        e.operator
                    ));
                }
                "In" => Requirement::In(e.key, values),
                "NotIn" => Requirement::NotIn(e.key, values),
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(format!("{at}: operator {} takes no values", e.operator));
                }
                "Exists" => Requirement::Exists(e.key),
                "DoesNotExist" => Requirement::DoesNotExist(e.key),
                other => {
                    return Err(format!(
                        "{at}: unknown operator {other:?} (In, NotIn, Exists or DoesNotExist)"
                    ));
                }
            };
            expressions.push(requirement);
        }
        Ok(Self {
            match_labels: selector.match_labels.unwrap_or_default(),
            expressions,
        })
    }

    /// Whether a namespace with `labels` is selected.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.expressions.iter().all(|r| match r {
                Requirement::In(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
                Requirement::NotIn(key, values) => {
                    labels.get(key).is_none_or(|v| !values.contains(v))
                }
                Requirement::Exists(key) => labels.contains_key(key),
                Requirement::DoesNotExist(key) => !labels.contains_key(key),
            })
    }
}
