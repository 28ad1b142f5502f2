//! The tenant trust boundary: which queue a pod's work is charged to is decided by what the
//! cluster admin declared (each `Queue`'s `namespaceSelector`, which queues are cohorts) and by
//! what the pod's namespace holds (its labels, its Kueue `LocalQueue`s), never by the pod's
//! labels alone. Pure (no I/O): [`crate::tracker::Tracker`] feeds [`Tenancy`] the Queue,
//! Namespace and LocalQueue caches as they change, and asks it, for each pending gang before
//! the gang becomes a job, which queue the gang may use or why it is refused
//! ([`Tenancy::admit`]). A refused gang waits, and the binder's report of waiting pods posts
//! the reason as its FailedScheduling Event and PodScheduled condition.
//!
//! While `Queue` objects are declared (the CRD is served and at least one exists):
//! - `gantry.dev/queue: Q` names Queue `Q`; Kueue's `kueue.x-k8s.io/queue-name: L` names the
//!   LocalQueue `L` in the pod's namespace, and the queue is its `spec.clusterQueue`, as Kueue
//!   resolves it; a pod with neither is in the default queue (`default`), which must then be
//!   declared like any other.
//! - The queue must be declared and usable (not left out for a problem), must not be a cohort
//!   (another queue's parent), and its `namespaceSelector` must select the pod's namespace
//!   (Kueue ClusterQueue semantics: absent or null selects no namespace, `{}` selects all).
//! - A trusted balloon ([`crate::mapping::is_balloon`]) is charged to no queue and is not
//!   checked.
//!
//! Without Queue objects nothing is enforced: every queue may use the whole cluster, as before,
//! and a pod's queue is the one it names (through its LocalQueue when that exists).
//!
//! A pod already bound (by Gantry earlier, or by its creator setting `spec.nodeName`) holds
//! its GPUs either way, so it is charged, but only to a queue its namespace may use
//! ([`Tenancy::charge`]): the one it names if the check admits it, else its namespace's default
//! queue, else no queue at all. Either way its Event says so, and a name nobody declared never
//! enters the queue tree.
//!
//! Until discovery has answered whether the API server serves the `Queue` kind
//! ([`Tenancy::set_queues_unknown`]), a pending pod that names a queue waits, saying why: it is
//! not admitted unchecked.
//!
//! Selectors are evaluated when a namespace's labels or the Queues change, into the set of
//! queues each namespace may use; checking a pod is then a few map lookups.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::config::KubeConfig;
use crate::mapping::QueueClaim;
use crate::queues::DeclaredQueue;
pub use crate::selector::{Labels, NamespaceSelector};

/// At most this many queue names are listed in a refusal (an Event's note is capped at 1 kB).
const LISTED_QUEUES: usize = 20;

/// Which pending gangs must be looked at again after a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Affected {
    /// Nothing a decision reads changed.
    Nothing,
    /// Those in these namespaces (their labels or LocalQueues changed).
    Namespaces(BTreeSet<String>),
    /// Every one (the Queues changed, or the LocalQueue kind appeared).
    All,
}

/// What decides which queue a pod may use: the declared queues, the namespaces' labels and the
/// LocalQueues. See the module documentation for the rules.
#[derive(Debug, Default)]
pub struct Tenancy {
    /// Whether any Queue object exists: only then is a pod's queue checked.
    enforced: bool,
    /// The usable declared queues and their selectors (`None`: no selector, so no namespace).
    queue_to_selector: BTreeMap<String, Option<NamespaceSelector>>,
    /// Each cohort (a usable queue that is a usable queue's parent) and its children, sorted:
    /// a pod may not name a cohort, and its refusal lists the queues it may name instead.
    cohort_to_children: BTreeMap<String, Vec<String>>,
    /// Queue objects left out of the tree, with why (the line the Queue's status shows).
    queue_to_problem: BTreeMap<String, String>,
    /// Every namespace's labels, as the Namespace cache holds them.
    namespace_to_labels: HashMap<String, Labels>,
    /// The queues whose selector selects each namespace: recomputed for one namespace when its
    /// labels change and for all when the Queues do, so a pod's check never runs a selector.
    namespace_to_queues: HashMap<String, BTreeSet<String>>,
    /// Whether the API serves Kueue's LocalQueue and its cache holds a full list.
    local_queues_served: bool,
    /// Each LocalQueue by `(namespace, name)`, and its `spec.clusterQueue` (empty when unset).
    local_to_cluster_queue: HashMap<(String, String), String>,
    /// Why it is not known yet whether Queues are declared (discovery of the kind failed):
    /// while set, pending pods that name a queue wait.
    queues_unknown: Option<String>,
}

/// Where a bound pod's GPUs are charged ([`Tenancy::charge`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// The queue charged; `None`: no queue its namespace may use, so its pods hold their room
    /// outside every queue, as pods bound by another scheduler do.
    pub queue: Option<String>,
    /// Why it is not charged to the queue it names, for the pod's Event; `None` when it is.
    pub redirected: Option<String>,
}

impl Tenancy {
    /// The Queue objects changed: `declared` are the usable ones, `left_out` those left out
    /// (by name, with why). Every pending gang is looked at again when anything changed.
    pub fn set_queues(
        &mut self,
        declared: &[DeclaredQueue],
        left_out: &BTreeMap<String, String>,
    ) -> Affected {
        let queue_to_selector: BTreeMap<String, Option<NamespaceSelector>> = declared
            .iter()
            .map(|q| (q.def.name.clone(), q.namespace_selector.clone()))
            .collect();
        let enforced = !declared.is_empty() || !left_out.is_empty();
        if enforced == self.enforced
            && queue_to_selector == self.queue_to_selector
            && *left_out == self.queue_to_problem
        {
            return Affected::Nothing;
        }
        let mut cohort_to_children: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for queue in declared {
            if let Some(parent) = &queue.def.parent {
                cohort_to_children
                    .entry(parent.clone())
                    .or_default()
                    .push(queue.def.name.clone());
            }
        }
        for children in cohort_to_children.values_mut() {
            children.sort();
        }
        self.enforced = enforced;
        self.queue_to_selector = queue_to_selector;
        self.cohort_to_children = cohort_to_children;
        self.queue_to_problem = left_out.clone();
        self.namespace_to_queues = self
            .namespace_to_labels
            .iter()
            .map(|(ns, labels)| (ns.clone(), self.admitted(labels)))
            .collect();
        Affected::All
    }

    /// The queues whose selector selects a namespace with `labels`.
    fn admitted(&self, labels: &Labels) -> BTreeSet<String> {
        self.queue_to_selector
            .iter()
            .filter(|(_, selector)| selector.as_ref().is_some_and(|s| s.matches(labels)))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Namespace `name` changed (`None`: deleted). Whether its labels did.
    pub fn set_namespace(&mut self, name: &str, labels: Option<Labels>) -> bool {
        if self.namespace_to_labels.get(name) == labels.as_ref() {
            return false;
        }
        match labels {
            Some(labels) => {
                let admitted = self.admitted(&labels);
                self.namespace_to_queues.insert(name.to_string(), admitted);
                self.namespace_to_labels.insert(name.to_string(), labels);
            }
            None => {
                self.namespace_to_queues.remove(name);
                self.namespace_to_labels.remove(name);
            }
        }
        true
    }

    /// Every namespace, after the Namespace cache listed again.
    pub fn set_namespaces(&mut self, all: HashMap<String, Labels>) -> Affected {
        let gone: Vec<String> = self
            .namespace_to_labels
            .keys()
            .filter(|name| !all.contains_key(*name))
            .cloned()
            .collect();
        let mut changed: BTreeSet<String> = BTreeSet::new();
        for name in gone {
            if self.set_namespace(&name, None) {
                changed.insert(name);
            }
        }
        for (name, labels) in all {
            if self.set_namespace(&name, Some(labels)) {
                changed.insert(name);
            }
        }
        if changed.is_empty() {
            Affected::Nothing
        } else {
            Affected::Namespaces(changed)
        }
    }

    /// Kueue's LocalQueues: whether the kind is served (and listed), and every one of them.
    pub fn set_local_queues(
        &mut self,
        served: bool,
        all: HashMap<(String, String), String>,
    ) -> Affected {
        if served != self.local_queues_served {
            self.local_queues_served = served;
            self.local_to_cluster_queue = all;
            return Affected::All;
        }
        let mut changed: BTreeSet<String> = BTreeSet::new();
        for (key, queue) in &all {
            if self.local_to_cluster_queue.get(key) != Some(queue) {
                changed.insert(key.0.clone());
            }
        }
        for key in self.local_to_cluster_queue.keys() {
            if !all.contains_key(key) {
                changed.insert(key.0.clone());
            }
        }
        self.local_to_cluster_queue = all;
        if changed.is_empty() {
            Affected::Nothing
        } else {
            Affected::Namespaces(changed)
        }
    }

    /// Whether the API server serves the Queue kind is unknown (`Some`: why, such as the
    /// discovery error) or known (`None`). Every pending gang is looked at again when that
    /// changes.
    pub fn set_queues_unknown(&mut self, why: Option<String>) -> Affected {
        if self.queues_unknown == why {
            return Affected::Nothing;
        }
        self.queues_unknown = why;
        Affected::All
    }

    /// The queue a pending pod in `namespace` that claims `claim` may use, or why it may not:
    /// one line a user reads in the pod's FailedScheduling Event. While it is not known
    /// whether Queues are declared, a pod that names a queue waits: fail closed.
    pub fn admit(
        &self,
        namespace: &str,
        claim: &QueueClaim,
        config: &KubeConfig,
    ) -> Result<String, String> {
        if let Some(why) = &self.queues_unknown
            && *claim != QueueClaim::Default
        {
            return Err(format!(
                "waiting to learn whether Queues are declared, so that its queue's quota and \
                 namespaceSelector can be checked: {why}"
            ));
        }
        self.check(namespace, claim, config)
    }

    /// Where a bound pod in `namespace` that claims `claim` is charged: the queue it names if
    /// [`Tenancy::admit`]'s check admits it; else its namespace's default queue if that one
    /// admits it; else none. A queue nobody declared is never charged while Queues are, so it
    /// never enters the queue tree.
    pub fn charge(&self, namespace: &str, claim: &QueueClaim, config: &KubeConfig) -> Charge {
        let why = match self.check(namespace, claim, config) {
            Ok(queue) => {
                return Charge {
                    queue: Some(queue),
                    redirected: None,
                };
            }
            Err(why) => why,
        };
        let default = &config.default_queue;
        if *claim != QueueClaim::Default
            && self.check(namespace, &QueueClaim::Default, config).is_ok()
        {
            return Charge {
                queue: Some(default.clone()),
                redirected: Some(format!(
                    "Charged to its namespace's default queue {default:?}, not the one it \
                     names: {why}."
                )),
            };
        }
        Charge {
            queue: None,
            redirected: Some(format!(
                "Charged to no queue (its GPUs count against no quota, and it is never \
                 preempted for one): {why}."
            )),
        }
    }

    /// [`Tenancy::admit`]'s check, whether or not the Queues are known.
    fn check(
        &self,
        namespace: &str,
        claim: &QueueClaim,
        config: &KubeConfig,
    ) -> Result<String, String> {
        let (queue, local) = match claim {
            QueueClaim::Queue(queue) => (queue.clone(), None),
            QueueClaim::Default => (config.default_queue.clone(), None),
            QueueClaim::LocalQueue(local) => {
                let found = self
                    .local_to_cluster_queue
                    .get(&(namespace.to_string(), local.clone()))
                    .filter(|q| !q.is_empty());
                match found {
                    Some(queue) => (queue.clone(), Some(local)),
                    // Nothing enforced: the label's value is the queue, as before.
                    None if !self.enforced => return Ok(local.clone()),
                    None if !self.local_queues_served => {
                        return Err(format!(
                            "LocalQueue {local:?} (label {}) cannot be resolved: Kueue's LocalQueue \
                             (kueue.x-k8s.io) is not installed in this cluster; name a Queue with \
                             label {} instead",
                            config.local_queue_label, config.queue_label
                        ));
                    }
                    None if self
                        .local_to_cluster_queue
                        .contains_key(&(namespace.to_string(), local.clone())) =>
                    {
                        return Err(format!(
                            "LocalQueue {local:?} in namespace {namespace:?} has no spec.clusterQueue"
                        ));
                    }
                    None => {
                        return Err(format!(
                            "LocalQueue {local:?} (label {}) does not exist in namespace {namespace:?}",
                            config.local_queue_label
                        ));
                    }
                }
            }
        };
        if !self.enforced {
            return Ok(queue);
        }
        let refuse = |why: String| {
            Err(match local {
                Some(local) => format!("{why} (named by LocalQueue {namespace}/{local})"),
                None => why,
            })
        };
        if let Some(children) = self.cohort_to_children.get(&queue) {
            return refuse(format!(
                "{queue:?} is a cohort, not a queue: name one of its queues ({})",
                children.join(", ")
            ));
        }
        if let Some(problem) = self.queue_to_problem.get(&queue) {
            return refuse(format!("queue {queue:?} cannot be used: {problem}"));
        }
        let Some(selector) = self.queue_to_selector.get(&queue) else {
            let unlabelled = if *claim == QueueClaim::Default {
                format!(
                    " (the pod has no {} label, so it is in the default queue)",
                    config.queue_label
                )
            } else {
                String::new()
            };
            return refuse(format!(
                "queue {queue:?} is not declared{unlabelled}: {}",
                self.declared_list()
            ));
        };
        let Some(admitted) = self.namespace_to_queues.get(namespace) else {
            return refuse(format!(
                "namespace {namespace:?} is not in the watch cache yet"
            ));
        };
        if !admitted.contains(&queue) {
            let why = if selector.is_some() {
                "its namespaceSelector does not select it"
            } else {
                "it has no namespaceSelector, so it admits no namespace"
            };
            return refuse(format!(
                "queue {queue:?} does not admit pods from namespace {namespace:?} ({why})"
            ));
        }
        Ok(queue)
    }

    /// The queue a trusted balloon names, through its LocalQueue when that exists, unchecked:
    /// a balloon is charged to no queue, so nothing it names is enforced.
    pub fn balloon_queue(
        &self,
        namespace: &str,
        claim: &QueueClaim,
        config: &KubeConfig,
    ) -> String {
        match claim {
            QueueClaim::Queue(queue) => queue.clone(),
            QueueClaim::Default => config.default_queue.clone(),
            QueueClaim::LocalQueue(local) => self
                .local_to_cluster_queue
                .get(&(namespace.to_string(), local.clone()))
                .filter(|q| !q.is_empty())
                .unwrap_or(local)
                .clone(),
        }
    }

    /// "declared queues are a, b" (those a pod may name: usable, not cohorts).
    fn declared_list(&self) -> String {
        let names: Vec<&str> = self
            .queue_to_selector
            .keys()
            .filter(|q| !self.cohort_to_children.contains_key(*q))
            .map(String::as_str)
            .collect();
        match names.len() {
            0 => "no declared queue is usable (see the Queues' status)".into(),
            n if n > LISTED_QUEUES => format!(
                "declared queues are {} (and {} more)",
                names[..LISTED_QUEUES].join(", "),
                n - LISTED_QUEUES
            ),
            _ => format!("declared queues are {}", names.join(", ")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_core::QueueDef;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn selector(value: serde_json::Value) -> NamespaceSelector {
        NamespaceSelector::parse(&value).unwrap()
    }

    #[test]
    fn selectors_match_labels_and_each_operator() {
        let team_a = labels(&[("team", "a"), ("tier", "gold")]);
        let team_b = labels(&[("team", "b")]);
        let bare = labels(&[]);
        let all = selector(json!({}));
        assert!(all.matches(&team_a) && all.matches(&bare));
        let match_labels = selector(json!({"matchLabels": {"team": "a", "tier": "gold"}}));
        assert!(match_labels.matches(&team_a));
        assert!(!match_labels.matches(&team_b) && !match_labels.matches(&bare));
        let is_in = selector(json!({"matchExpressions": [
            {"key": "team", "operator": "In", "values": ["a", "c"]}
        ]}));
        assert!(is_in.matches(&team_a));
        assert!(!is_in.matches(&team_b) && !is_in.matches(&bare));
        let not_in = selector(json!({"matchExpressions": [
            {"key": "team", "operator": "NotIn", "values": ["a"]}
        ]}));
        assert!(!not_in.matches(&team_a));
        assert!(not_in.matches(&team_b));
        assert!(
            not_in.matches(&bare),
            "NotIn selects a namespace without the key"
        );
        let exists = selector(json!({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}));
        assert!(exists.matches(&team_a) && !exists.matches(&team_b));
        let absent = selector(json!({"matchExpressions": [
            {"key": "tier", "operator": "DoesNotExist"}
        ]}));
        assert!(!absent.matches(&team_a) && absent.matches(&team_b));
        let both = selector(json!({
            "matchLabels": {"team": "a"},
            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold"]}]
        }));
        assert!(!both.matches(&team_a), "every term must hold");
    }

    #[test]
    fn bad_selectors_say_what_is_wrong() {
        let error = |value| NamespaceSelector::parse(&value).unwrap_err();
        assert_eq!(
            error(json!({"matchExpressions": [{"key": "team", "operator": "In", "values": []}]})),
            "matchExpressions[0]: operator In needs at least one value"
        );
        assert_eq!(
            error(
                json!({"matchExpressions": [{"key": "t", "operator": "Exists", "values": ["x"]}]})
            ),
            "matchExpressions[0]: operator Exists takes no values"
        );
        assert_eq!(
            error(json!({"matchExpressions": [{"key": "t", "operator": "Gt", "values": ["1"]}]})),
            "matchExpressions[0]: unknown operator \"Gt\" (In, NotIn, Exists or DoesNotExist)"
        );
    }

    fn declared(
        name: &str,
        parent: Option<&str>,
        selector: Option<serde_json::Value>,
    ) -> DeclaredQueue {
        DeclaredQueue {
            stop_policy: Default::default(),
            def: QueueDef {
                name: name.into(),
                parent: parent.map(str::to_string),
                nominal_gpus: 4,
                weight: 1,
                borrowing_limit_gpus: None,
                lending_limit_gpus: None,
                reclaim: gantry_core::Reclaim::Never,
            },
            namespace_selector: selector.map(|s| NamespaceSelector::parse(&s).unwrap()),
        }
    }

    /// research (a cohort) with team-a (namespaces labelled team=a) and team-b (namespaces
    /// with a gantry.dev/team-b label), a queue with no selector, one left out; namespaces
    /// team-a and team-b.
    fn tenancy() -> Tenancy {
        let mut tenancy = Tenancy::default();
        tenancy.set_namespace("team-a", Some(labels(&[("team", "a")])));
        tenancy.set_namespace("team-b", Some(labels(&[("gantry.dev/team-b", "")])));
        let queues = [
            declared("research", None, Some(json!({}))),
            declared(
                "team-a",
                Some("research"),
                Some(json!({"matchLabels": {"team": "a"}})),
            ),
            declared(
                "team-b",
                Some("research"),
                Some(
                    json!({"matchExpressions": [{"key": "gantry.dev/team-b", "operator": "Exists"}]}),
                ),
            ),
            declared("closed", None, None),
        ];
        let left_out = [(
            "orphan".to_string(),
            "queue orphan: spec.parent nowhere is not a usable Queue".to_string(),
        )]
        .into();
        assert_eq!(tenancy.set_queues(&queues, &left_out), Affected::All);
        tenancy
    }

    fn queue(name: &str) -> QueueClaim {
        QueueClaim::Queue(name.into())
    }

    #[test]
    fn a_pod_may_use_only_a_declared_queue_that_selects_its_namespace() {
        let t = tenancy();
        let config = KubeConfig::default();
        assert_eq!(
            t.admit("team-a", &queue("team-a"), &config),
            Ok("team-a".into())
        );
        assert_eq!(
            t.admit("team-b", &queue("team-b"), &config),
            Ok("team-b".into())
        );
        let refused = |ns: &str, claim: &QueueClaim| t.admit(ns, claim, &config).unwrap_err();
        assert_eq!(
            refused("team-a", &queue("team-b")),
            "queue \"team-b\" does not admit pods from namespace \"team-a\" (its namespaceSelector does not select it)"
        );
        assert_eq!(
            refused("team-a", &queue("closed")),
            "queue \"closed\" does not admit pods from namespace \"team-a\" (it has no namespaceSelector, so it admits no namespace)"
        );
        assert_eq!(
            refused("team-a", &queue("research")),
            "\"research\" is a cohort, not a queue: name one of its queues (team-a, team-b)"
        );
        assert_eq!(
            refused("team-a", &queue("nope")),
            "queue \"nope\" is not declared: declared queues are closed, team-a, team-b"
        );
        assert_eq!(
            refused("team-a", &QueueClaim::Default),
            "queue \"default\" is not declared (the pod has no gantry.dev/queue label, so it is in the default queue): declared queues are closed, team-a, team-b"
        );
        assert_eq!(
            refused("team-a", &queue("orphan")),
            "queue \"orphan\" cannot be used: queue orphan: spec.parent nowhere is not a usable Queue"
        );
        assert_eq!(
            refused("new-ns", &queue("team-a")),
            "namespace \"new-ns\" is not in the watch cache yet"
        );
    }

    #[test]
    fn a_bound_pod_is_charged_only_to_a_queue_its_namespace_may_use() {
        let mut t = tenancy();
        let config = KubeConfig::default();
        assert_eq!(
            t.charge("team-a", &queue("team-a"), &config),
            Charge {
                queue: Some("team-a".into()),
                redirected: None
            }
        );
        // No default queue declared: another team's queue, or one nobody declared, is charged
        // to no queue.
        let refused = t.charge("team-a", &queue("team-b"), &config);
        assert_eq!(refused.queue, None);
        assert_eq!(
            refused.redirected.as_deref(),
            Some(
                "Charged to no queue (its GPUs count against no quota, and it is never preempted \
                 for one): queue \"team-b\" does not admit pods from namespace \"team-a\" (its \
                 namespaceSelector does not select it)."
            )
        );
        assert_eq!(t.charge("team-a", &queue("made-up"), &config).queue, None);
        // With a default queue every namespace may use, that is where it goes.
        let mut queues: Vec<DeclaredQueue> = ["team-a", "team-b"]
            .iter()
            .map(|name| {
                let team = name.trim_start_matches("team-");
                declared(name, None, Some(json!({"matchLabels": {"team": team}})))
            })
            .collect();
        queues.push(declared("default", None, Some(json!({}))));
        t.set_namespace("team-b", Some(labels(&[("team", "b")])));
        t.set_queues(&queues, &BTreeMap::new());
        let redirected = t.charge("team-a", &queue("team-b"), &config);
        assert_eq!(redirected.queue.as_deref(), Some("default"));
        assert_eq!(
            redirected.redirected.as_deref(),
            Some(
                "Charged to its namespace's default queue \"default\", not the one it names: \
                 queue \"team-b\" does not admit pods from namespace \"team-a\" (its \
                 namespaceSelector does not select it)."
            )
        );
    }

    #[test]
    fn while_queues_are_unknown_a_pod_naming_one_waits() {
        let mut t = Tenancy::default();
        let config = KubeConfig::default();
        let why = "discovery of gantry.dev/v1alpha1 failed: connection refused".to_string();
        assert_eq!(t.set_queues_unknown(Some(why.clone())), Affected::All);
        assert_eq!(t.set_queues_unknown(Some(why)), Affected::Nothing);
        assert_eq!(
            t.admit("team-a", &queue("team-a"), &config).unwrap_err(),
            "waiting to learn whether Queues are declared, so that its queue's quota and \
             namespaceSelector can be checked: discovery of gantry.dev/v1alpha1 failed: \
             connection refused"
        );
        assert!(
            t.admit("team-a", &QueueClaim::LocalQueue("lq".into()), &config)
                .is_err()
        );
        // A pod naming no queue is not held back, and a bound pod is charged as before.
        assert_eq!(
            t.admit("team-a", &QueueClaim::Default, &config),
            Ok("default".into())
        );
        assert_eq!(
            t.charge("team-a", &queue("team-a"), &config)
                .queue
                .as_deref(),
            Some("team-a")
        );
        assert_eq!(t.set_queues_unknown(None), Affected::All);
        assert_eq!(
            t.admit("team-a", &queue("team-a"), &config),
            Ok("team-a".into())
        );
    }

    #[test]
    fn namespace_labels_and_queue_changes_decide_again() {
        let mut t = tenancy();
        let config = KubeConfig::default();
        assert!(t.admit("team-a", &queue("team-b"), &config).is_err());
        // team-a's namespace gets team-b's label: team-b now admits it too.
        assert!(t.set_namespace(
            "team-a",
            Some(labels(&[("team", "a"), ("gantry.dev/team-b", "guest")]))
        ));
        assert!(!t.set_namespace(
            "team-a",
            Some(labels(&[("team", "a"), ("gantry.dev/team-b", "guest")]))
        ));
        assert_eq!(
            t.admit("team-a", &queue("team-b"), &config),
            Ok("team-b".into())
        );
        // No Queue left: nothing is enforced, a pod's queue is what it names.
        assert_eq!(t.set_queues(&[], &BTreeMap::new()), Affected::All);
        assert_eq!(
            t.admit("team-a", &queue("nope"), &config),
            Ok("nope".into())
        );
        assert_eq!(
            t.admit("team-a", &QueueClaim::LocalQueue("lq".into()), &config),
            Ok("lq".into())
        );
        assert_eq!(t.set_queues(&[], &BTreeMap::new()), Affected::Nothing);
    }

    #[test]
    fn kueue_labels_resolve_through_the_namespace_local_queue() {
        let mut t = tenancy();
        let config = KubeConfig::default();
        let local = |name: &str| QueueClaim::LocalQueue(name.into());
        assert_eq!(
            t.admit("team-a", &local("main"), &config).unwrap_err(),
            "LocalQueue \"main\" (label kueue.x-k8s.io/queue-name) cannot be resolved: Kueue's \
             LocalQueue (kueue.x-k8s.io) is not installed in this cluster; name a Queue with label \
             gantry.dev/queue instead"
        );
        let local_queues: HashMap<(String, String), String> = [
            (("team-a".into(), "main".into()), "team-a".into()),
            (("team-a".into(), "sneaky".into()), "team-b".into()),
            (("team-a".into(), "unset".into()), String::new()),
        ]
        .into();
        assert_eq!(
            t.set_local_queues(true, local_queues.clone()),
            Affected::All
        );
        assert_eq!(
            t.admit("team-a", &local("main"), &config),
            Ok("team-a".into())
        );
        assert_eq!(
            t.admit("team-a", &local("sneaky"), &config).unwrap_err(),
            "queue \"team-b\" does not admit pods from namespace \"team-a\" (its namespaceSelector \
             does not select it) (named by LocalQueue team-a/sneaky)"
        );
        assert_eq!(
            t.admit("team-b", &local("main"), &config).unwrap_err(),
            "LocalQueue \"main\" (label kueue.x-k8s.io/queue-name) does not exist in namespace \"team-b\""
        );
        assert_eq!(
            t.admit("team-a", &local("unset"), &config).unwrap_err(),
            "LocalQueue \"unset\" in namespace \"team-a\" has no spec.clusterQueue"
        );
        // A balloon's queue is what it names, through its LocalQueue when that exists.
        assert_eq!(t.balloon_queue("team-a", &local("main"), &config), "team-a");
        assert_eq!(t.balloon_queue("team-b", &local("main"), &config), "main");
        // One LocalQueue moves: only its namespace is looked at again.
        let mut moved = local_queues;
        moved.insert(("team-a".into(), "main".into()), "closed".into());
        assert_eq!(
            t.set_local_queues(true, moved),
            Affected::Namespaces(["team-a".to_string()].into())
        );
    }

    #[test]
    fn queue_claims_read_gantry_label_first() {
        use k8s_openapi::api::core::v1::Pod;
        let config = KubeConfig::default();
        let pod = |labels: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p", "labels": labels}})).unwrap()
        };
        let claim = |labels| crate::mapping::queue_claim(&pod(labels), &config);
        assert_eq!(
            claim(json!({"gantry.dev/queue": "a", "kueue.x-k8s.io/queue-name": "lq"})),
            queue("a")
        );
        assert_eq!(
            claim(json!({"kueue.x-k8s.io/queue-name": "lq"})),
            QueueClaim::LocalQueue("lq".into())
        );
        assert_eq!(claim(json!({})), QueueClaim::Default);
    }
}
