//! The queue tree: quota, borrowing and fair share. Quota counts GPUs (what the cluster specs
//! declare); fair share uses dominant-resource shares over GPUs, CPU and memory.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::model::Resources;

/// One queue as declared (cluster spec, CRD). A queue with children is a cohort.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueDef {
    pub name: String,
    pub parent: Option<String>,
    pub nominal_gpus: u64,
    pub weight: u32,
    /// `None` = may borrow without limit.
    pub borrowing_limit_gpus: Option<u64>,
    /// `None` = lends all idle nominal quota.
    pub lending_limit_gpus: Option<u64>,
    /// Whether its jobs take back its nominal quota by evicting borrowers (Kueue's
    /// `reclaimWithinCohort`). Never by default, as in Kueue: an eviction throws away the
    /// victim's work, and an aged job gets its quota back through its reservation's quota
    /// hold instead (the README's planner section has what reclaiming cost).
    #[serde(default, skip_serializing_if = "Reclaim::is_never")]
    pub reclaim: Reclaim,
}

/// Whether a queue within its nominal quota evicts the jobs of other queues that borrow
/// beyond theirs to make room (Kueue's `reclaimWithinCohort`; its `LowerPriority` is what
/// Gantry always does: a job may evict jobs of lower priority from any queue).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reclaim {
    /// Wait for borrowers to end (the default).
    #[default]
    #[serde(alias = "Never")]
    Never,
    /// Evict borrowers beyond their quota, whole gangs, newest first.
    #[serde(alias = "Any")]
    Any,
}

impl Reclaim {
    /// Whether it is the default, left out when a definition is written back.
    pub fn is_never(&self) -> bool {
        *self == Reclaim::Never
    }

    /// Reads `never` or `any` (any case, as Kueue's `Never` and `Any`); `None` for anything
    /// else, for the caller to refuse with its own context.
    pub fn parse(text: &str) -> Option<Reclaim> {
        match text.to_ascii_lowercase().as_str() {
            "never" => Some(Reclaim::Never),
            "any" => Some(Reclaim::Any),
            _ => None,
        }
    }
}

/// Index of a queue in [`Queues`].
pub type QueueId = usize;

/// Why the queue tree could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// Walking up from `queue`, its parent chain names `parent`, which is not declared.
    #[error("queue {queue}: parent {parent} is not a declared queue")]
    UnknownParent { queue: String, parent: String },
    /// A second queue of this name.
    #[error("queue {0} is declared twice")]
    Duplicate(String),
    /// Walking up from `queue` meets a queue twice: `chain` runs from `queue` to the repeat.
    #[error("queue {queue}: the parent chain loops: {}", chain.join(" -> "))]
    Cycle { queue: String, chain: Vec<String> },
}

impl QueueDef {
    /// What is wrong with the tree `defs` declares, per queue (its index in `defs`), in
    /// declaration order: a name declared again, or a parent chain that names an undeclared
    /// queue or loops. The one check the core, the cluster-spec loader and the Queue objects'
    /// reader share; each words and places the problems its own way.
    pub fn check_tree(defs: &[QueueDef]) -> Vec<(usize, QueueError)> {
        let mut name_to_index: HashMap<&str, usize> = HashMap::new();
        let mut problems = Vec::new();
        for (index, def) in defs.iter().enumerate() {
            if name_to_index.contains_key(def.name.as_str()) {
                problems.push((index, QueueError::Duplicate(def.name.clone())));
            } else {
                name_to_index.insert(&def.name, index);
            }
        }
        for (index, def) in defs.iter().enumerate() {
            if problems.iter().any(|(at, _)| *at == index) {
                continue;
            }
            // Walk up to a root; meeting a queue twice means the chain loops.
            let mut chain = vec![def.name.as_str()];
            let mut current = def;
            while let Some(parent) = &current.parent {
                let Some(&next) = name_to_index.get(parent.as_str()) else {
                    problems.push((
                        index,
                        QueueError::UnknownParent {
                            queue: def.name.clone(),
                            parent: parent.clone(),
                        },
                    ));
                    break;
                };
                let looped = chain.contains(&parent.as_str());
                chain.push(parent);
                if looped {
                    problems.push((
                        index,
                        QueueError::Cycle {
                            queue: def.name.clone(),
                            chain: chain.iter().map(|name| name.to_string()).collect(),
                        },
                    ));
                    break;
                }
                current = &defs[next];
            }
        }
        problems.sort_by_key(|(index, _)| *index);
        problems
    }
}

/// The built-in quota answer, before any Wasm quota policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "kebab-case")]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub enum Admission {
    /// Within the queue's nominal quota.
    Within,
    /// Borrowing this many GPUs of idle capacity beyond the queue's nominal quota.
    Borrowing {
        /// GPUs borrowed from idle quota of other queues.
        gpus: u64,
    },
    /// Refused: the queue is at its quota and cannot borrow.
    Denied {
        /// Why, in plain words.
        reason: String,
    },
}

/// Why the built-in quota check refused, with the figures its words name: what
/// [`Queues::admission`] puts into words and [`Queues::admits`] does not, so the checks made
/// for every parked job format nothing.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// The queue's own borrowing limit.
    OverBorrowingLimit { borrow: u64, limit: u64 },
    /// What the queues beside it (and above) could lend.
    NoLender { extra: u64, available: u64 },
}

#[derive(Debug, Clone)]
struct Queue {
    def: QueueDef,
    parent: Option<QueueId>,
    children: Vec<QueueId>,
    /// GPUs (and CPU, memory) admitted and not yet finished, in this queue and below.
    used: Resources,
    /// Dominant share integrated over time, decayed with the half-life (share·seconds).
    decayed_usage: f64,
}

/// The queue hierarchy with live usage. Owned by the scheduler; updated on every admission and
/// completion so quota checks are O(depth).
#[derive(Debug, Clone)]
pub struct Queues {
    queues: Vec<Queue>,
    /// Looked up once per job, by the name in its queue label or trace row.
    name_to_id: HashMap<String, QueueId>,
    /// Top-level queues: they lend to and borrow from each other, as if under one root.
    roots: Vec<QueueId>,
    capacity: Resources,
    half_life_s: f64,
    last_decay_s: f64,
    /// Quota given back so far (completions, evictions): a job parked for quota is
    /// reconsidered only once this moved.
    releases: u64,
}

impl Queues {
    /// `capacity` is the cluster's total, the denominator of dominant shares.
    pub fn new(
        defs: &[QueueDef],
        capacity: Resources,
        half_life_s: f64,
    ) -> Result<Self, QueueError> {
        // A name declared twice first, then the first broken chain.
        let problems = QueueDef::check_tree(defs);
        if let Some((_, problem)) = problems
            .into_iter()
            .min_by_key(|(index, problem)| (!matches!(problem, QueueError::Duplicate(_)), *index))
        {
            return Err(problem);
        }
        let name_to_id: HashMap<String, QueueId> = defs
            .iter()
            .enumerate()
            .map(|(id, def)| (def.name.clone(), id))
            .collect();
        let mut queues: Vec<Queue> = defs
            .iter()
            .map(|def| Queue {
                def: def.clone(),
                parent: None,
                children: Vec::new(),
                used: Resources::default(),
                decayed_usage: 0.0,
            })
            .collect();
        let mut roots = Vec::new();
        for id in 0..queues.len() {
            match queues[id].def.parent.clone() {
                Some(parent) => {
                    let parent_id =
                        *name_to_id
                            .get(&parent)
                            .ok_or_else(|| QueueError::UnknownParent {
                                queue: queues[id].def.name.clone(),
                                parent: parent.clone(),
                            })?;
                    queues[id].parent = Some(parent_id);
                    queues[parent_id].children.push(id);
                }
                None => roots.push(id),
            }
        }
        Ok(Self {
            queues,
            name_to_id,
            roots,
            capacity,
            half_life_s,
            last_decay_s: 0.0,
            releases: 0,
        })
    }

    pub fn len(&self) -> usize {
        self.queues.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    pub fn id(&self, name: &str) -> Option<QueueId> {
        self.name_to_id.get(name).copied()
    }

    pub fn name(&self, id: QueueId) -> &str {
        &self.queues[id].def.name
    }

    pub fn def(&self, id: QueueId) -> &QueueDef {
        &self.queues[id].def
    }

    pub fn parent(&self, id: QueueId) -> Option<QueueId> {
        self.queues[id].parent
    }

    pub fn children(&self, id: QueueId) -> &[QueueId] {
        &self.queues[id].children
    }

    pub fn used(&self, id: QueueId) -> Resources {
        self.queues[id].used
    }

    /// A queue's nominal GPUs: declared, or its children's sum when it declares none.
    pub fn nominal(&self, id: QueueId) -> u64 {
        let queue = &self.queues[id];
        if queue.def.nominal_gpus > 0 || queue.children.is_empty() {
            queue.def.nominal_gpus
        } else {
            queue.children.iter().map(|&c| self.nominal(c)).sum()
        }
    }

    fn siblings(&self, id: QueueId) -> &[QueueId] {
        match self.queues[id].parent {
            Some(parent) => &self.queues[parent].children,
            None => &self.roots,
        }
    }

    /// GPUs a queue uses beyond its nominal quota.
    pub fn borrowed(&self, id: QueueId) -> u64 {
        self.queues[id].used.gpus.saturating_sub(self.nominal(id))
    }

    /// Idle nominal GPUs the queue lends to its siblings, within its lending limit.
    pub fn lendable(&self, id: QueueId) -> u64 {
        let idle = self.nominal(id).saturating_sub(self.queues[id].used.gpus);
        self.queues[id]
            .def
            .lending_limit_gpus
            .map_or(idle, |limit| idle.min(limit))
    }

    /// GPUs `id` could still borrow: its siblings' lendable GPUs, less what the siblings
    /// (itself included) already borrow from each other, plus what its parent could borrow in
    /// turn within its limit. What the parent borrows from above is not counted twice: it
    /// comes off here, where the children borrow it, only once, at the parent's level.
    fn spare_for(&self, id: QueueId) -> i128 {
        let siblings = self.siblings(id);
        let lendable: u64 = siblings
            .iter()
            .filter(|&&s| s != id)
            .map(|&s| self.lendable(s))
            .sum();
        let borrowed: u64 = siblings.iter().map(|&s| self.borrowed(s)).sum();
        let from_above = self.queues[id].parent.map_or(0, |p| self.borrowed(p));
        let here = i128::from(lendable) - i128::from(borrowed.saturating_sub(from_above));
        let above = match self.queues[id].parent {
            Some(parent) => {
                let limit = self.queues[parent]
                    .def
                    .borrowing_limit_gpus
                    .unwrap_or(u64::MAX);
                let room = i128::from(limit.saturating_sub(self.borrowed(parent)));
                self.spare_for(parent).min(room).max(0)
            }
            None => 0,
        };
        here + above
    }

    /// GPUs `id` could borrow now, beyond what it already borrows.
    fn available_to(&self, id: QueueId) -> u64 {
        u64::try_from(self.spare_for(id).max(0)).unwrap_or(u64::MAX)
    }

    /// The built-in quota check for `gpus` more GPUs in leaf queue `id`.
    pub fn admission(&self, id: QueueId, gpus: u64) -> Admission {
        self.limit(id, gpus)
            .unwrap_or_else(|refusal| Admission::Denied {
                reason: self.refusal_text(id, gpus, refusal),
            })
    }

    /// Whether [`Queues::admission`] would admit `gpus` more GPUs in leaf queue `id`, without
    /// putting a refusal into words: the wake-up and the preemption search ask this for every
    /// job they look at, and read no reason.
    pub fn admits(&self, id: QueueId, gpus: u64) -> bool {
        self.limit(id, gpus).is_ok()
    }

    /// Whether `gpus` more GPUs in leaf queue `id` stay within its quota: the verdict alone,
    /// which [`Queues::admission`] puts into words.
    pub fn within(&self, id: QueueId, gpus: u64) -> bool {
        matches!(self.limit(id, gpus), Ok(Admission::Within))
    }

    /// The most GPUs leaf queue `id` could be admitted now: its idle nominal quota, plus what
    /// it may still borrow (within its borrowing limit and what others lend). [`Queues::admits`]
    /// holds for every count up to it and none above. A reservation's quota hold compares it
    /// before and after another job's admission, to tell whether that admission delays it.
    pub fn headroom(&self, id: QueueId) -> u64 {
        let queue = &self.queues[id];
        let nominal = self.nominal(id);
        let idle = nominal.saturating_sub(queue.used.gpus);
        let borrowed = self.borrowed(id);
        let may_borrow = queue
            .def
            .borrowing_limit_gpus
            .map_or(u64::MAX, |limit| limit.saturating_sub(borrowed));
        idle.saturating_add(may_borrow.min(self.available_to(id)))
    }

    /// The most GPUs leaf queue `id` may ever hold at once, of a cluster of `total`: its
    /// nominal quota plus the most it could borrow, within its borrowing limit, with every
    /// other queue idle ([`Queues::most_borrowable`]). How long a queue's backlog takes to run
    /// is its work over this, at best. (It was the nominal plus the borrowing limit, or the
    /// whole cluster with no limit, which a queue with nothing to borrow from never reaches:
    /// the bound it gave a job the forecast did not reach was that much too early.)
    pub fn most_gpus(&self, id: QueueId, total: u64) -> u64 {
        let borrowable = self.most_borrowable(id);
        let borrow = self.queues[id]
            .def
            .borrowing_limit_gpus
            .map_or(borrowable, |limit| limit.min(borrowable));
        self.nominal(id)
            .saturating_add(borrow)
            .clamp(1, total.max(1))
    }

    /// The most queue `id` could ever borrow: its siblings' nominal quotas (within their
    /// lending limits), and what its parent could borrow in turn within the parent's limit,
    /// with all of them idle. [`Queues::spare_for`] is the same sum over what is idle now.
    fn most_borrowable(&self, id: QueueId) -> u64 {
        let here: u64 = self
            .siblings(id)
            .iter()
            .filter(|&&s| s != id)
            .map(|&s| {
                let nominal = self.nominal(s);
                self.queues[s]
                    .def
                    .lending_limit_gpus
                    .map_or(nominal, |limit| nominal.min(limit))
            })
            .fold(0, u64::saturating_add);
        let above = self.queues[id].parent.map_or(0, |parent| {
            let borrowable = self.most_borrowable(parent);
            self.queues[parent]
                .def
                .borrowing_limit_gpus
                .map_or(borrowable, |limit| limit.min(borrowable))
        });
        here.saturating_add(above)
    }

    /// The quota check, a refusal not yet in words: the one rule [`Queues::admission`],
    /// [`Queues::admits`] and [`Queues::within`] share.
    fn limit(&self, id: QueueId, gpus: u64) -> Result<Admission, Refusal> {
        let queue = &self.queues[id];
        let nominal = self.nominal(id);
        let after = queue.used.gpus + gpus;
        if after <= nominal {
            return Ok(Admission::Within);
        }
        let borrow = after - nominal;
        if let Some(limit) = queue.def.borrowing_limit_gpus
            && borrow > limit
        {
            return Err(Refusal::OverBorrowingLimit { borrow, limit });
        }
        let extra = borrow - self.borrowed(id);
        let available = self.available_to(id);
        if extra > available {
            return Err(Refusal::NoLender { extra, available });
        }
        Ok(Admission::Borrowing { gpus: borrow })
    }

    /// Why `gpus` more GPUs in leaf queue `id` were refused, in plain words.
    fn refusal_text(&self, id: QueueId, gpus: u64, refusal: Refusal) -> String {
        let queue = &self.queues[id];
        let name = &queue.def.name;
        let nominal = self.nominal(id);
        let (extra, available) = match refusal {
            Refusal::OverBorrowingLimit { borrow, limit } => {
                return format!(
                    "queue {name} would borrow {}, over its borrowing limit of {limit}",
                    crate::words::count_text(borrow, "GPU")
                );
            }
            Refusal::NoLender { extra, available } => (extra, available),
        };
        let free = nominal.saturating_sub(queue.used.gpus);
        let own = if free == 0 {
            format!(
                "queue {name} is at its quota of {nominal} GPUs, so the {gpus} it needs must be borrowed"
            )
        } else {
            format!(
                "queue {name} has {free} of its {nominal} GPUs free and needs {gpus}, so {extra} must be borrowed"
            )
        };
        // Name the level whose limit binds: the cohort's borrowing limit, or what the
        // queues beside it lend.
        let lenders = match queue.parent {
            Some(parent) => {
                let cohort = &self.queues[parent].def;
                if let Some(limit) = cohort.borrowing_limit_gpus
                    && self.borrowed(parent) >= limit
                {
                    format!(
                        "cohort {} is at its borrowing limit of {limit} GPUs, and its queues have only {available} idle GPUs to lend",
                        cohort.name
                    )
                } else {
                    format!(
                        "the other queues of cohort {} have only {available} idle GPUs to lend",
                        cohort.name
                    )
                }
            }
            None => {
                format!("the other top-level queues have only {available} idle GPUs to lend")
            }
        };
        format!("{own}; {lenders}")
    }

    /// Quota given back so far; see [`Queues::charge`].
    pub fn releases(&self) -> u64 {
        self.releases
    }

    /// Record `amount` admitted (or, with `admit` false, finished) in `id` and its ancestors.
    pub fn charge(&mut self, id: QueueId, amount: Resources, admit: bool) {
        if !admit {
            self.releases += 1;
        }
        let mut at = Some(id);
        while let Some(q) = at {
            let used = &mut self.queues[q].used;
            if admit {
                used.gpus += amount.gpus;
                used.cpu_milli += amount.cpu_milli;
                used.memory_mib += amount.memory_mib;
            } else {
                used.gpus = used.gpus.saturating_sub(amount.gpus);
                used.cpu_milli = used.cpu_milli.saturating_sub(amount.cpu_milli);
                used.memory_mib = used.memory_mib.saturating_sub(amount.memory_mib);
            }
            at = self.queues[q].parent;
        }
    }

    /// The share of the cluster's scarcest resource the queue holds now.
    pub fn dominant_share(&self, id: QueueId) -> f64 {
        let used = self.queues[id].used;
        let frac = |used: u64, total: u64| {
            if total == 0 {
                0.0
            } else {
                used as f64 / total as f64
            }
        };
        frac(used.gpus, self.capacity.gpus)
            .max(frac(used.cpu_milli, self.capacity.cpu_milli))
            .max(frac(used.memory_mib, self.capacity.memory_mib))
    }

    /// Fold usage up to `now_s` into each queue's history, halving it every half-life.
    pub fn decay_to(&mut self, now_s: f64) {
        let dt = now_s - self.last_decay_s;
        if dt <= 0.0 {
            return;
        }
        let keep = 0.5f64.powf(dt / self.half_life_s.max(1e-9));
        for id in 0..self.queues.len() {
            let share = self.dominant_share(id);
            let queue = &mut self.queues[id];
            queue.decayed_usage = queue.decayed_usage * keep + share * dt;
        }
        self.last_decay_s = now_s;
    }

    /// The decay clock and each queue's decayed usage by name: what a caller that rebuilds the
    /// tree every cycle (the live cluster does, from its watch caches) carries to the next one.
    pub fn decay_state(&self) -> (f64, Vec<(String, f64)>) {
        let usage = self
            .queues
            .iter()
            .map(|q| (q.def.name.clone(), q.decayed_usage))
            .collect();
        (self.last_decay_s, usage)
    }

    /// Restores what [`Queues::decay_state`] returned from an earlier tree: the decay clock,
    /// and the decayed usage of every queue that still exists (new queues start with none).
    pub fn restore_decay(&mut self, last_decay_s: f64, name_to_usage: &HashMap<String, f64>) {
        self.last_decay_s = last_decay_s;
        for queue in &mut self.queues {
            queue.decayed_usage = name_to_usage.get(&queue.def.name).copied().unwrap_or(0.0);
        }
    }

    /// The fair-share key: lower goes first. The current dominant share plus decayed past
    /// usage (in half-lives), divided by the queue's weight.
    pub fn fair_share_key(&self, id: QueueId) -> f64 {
        let queue = &self.queues[id];
        let history = queue.decayed_usage / self.half_life_s.max(1e-9);
        (self.dominant_share(id) + history) / f64::from(queue.def.weight.max(1))
    }

    /// A queue's fair share of the cluster's GPUs: its weight against its siblings', down the
    /// tree from the roots.
    pub fn fair_share(&self, id: QueueId) -> f64 {
        let siblings = self.siblings(id);
        let total: f64 = siblings
            .iter()
            .map(|&s| f64::from(self.queues[s].def.weight.max(1)))
            .sum();
        let mine = f64::from(self.queues[id].def.weight.max(1)) / total.max(1.0);
        match self.queues[id].parent {
            Some(parent) => mine * self.fair_share(parent),
            None => mine,
        }
    }

    pub fn ids(&self) -> std::ops::Range<QueueId> {
        0..self.queues.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_tree_names_each_broken_queue_once_in_declaration_order() {
        let defs = [
            def("child", Some("orphan"), 0),
            def("orphan", Some("nowhere"), 0),
            def("x", Some("y"), 0),
            def("y", Some("x"), 0),
            def("fine", None, 8),
            def("fine", None, 8),
        ];
        let texts: Vec<(usize, String)> = QueueDef::check_tree(&defs)
            .into_iter()
            .map(|(index, problem)| (index, problem.to_string()))
            .collect();
        assert_eq!(
            texts,
            [
                (
                    0,
                    "queue child: parent nowhere is not a declared queue".into()
                ),
                (
                    1,
                    "queue orphan: parent nowhere is not a declared queue".into()
                ),
                (2, "queue x: the parent chain loops: x -> y -> x".into()),
                (3, "queue y: the parent chain loops: y -> x -> y".into()),
                (5, "queue fine is declared twice".into()),
            ]
        );
        // The core refuses the tree, a repeated name first.
        let refused = Queues::new(&defs, Resources::gpus(8), 3600.0).unwrap_err();
        assert_eq!(refused, QueueError::Duplicate("fine".into()));
        assert!(QueueDef::check_tree(&defs[4..5]).is_empty());
    }

    fn def(name: &str, parent: Option<&str>, nominal: u64) -> QueueDef {
        QueueDef {
            reclaim: Reclaim::Never,
            name: name.into(),
            parent: parent.map(Into::into),
            nominal_gpus: nominal,
            weight: 1,
            borrowing_limit_gpus: None,
            lending_limit_gpus: None,
        }
    }

    fn tree() -> Queues {
        let mut rl = def("rl", Some("research"), 16);
        rl.borrowing_limit_gpus = Some(8);
        let mut applied = def("applied", None, 16);
        applied.lending_limit_gpus = Some(4);
        Queues::new(
            &[
                def("research", None, 0),
                def("pretraining", Some("research"), 20),
                rl,
                applied,
            ],
            Resources::gpus(52),
            3600.0,
        )
        .unwrap()
    }

    /// `most_gpus` is what the quota check admits with every other queue idle, and no more:
    /// the bound a job beyond the forecast is given rests on it.
    #[test]
    fn the_most_a_queue_may_hold_is_what_the_quota_admits_with_the_others_idle() {
        let q = tree();
        let most = |name: &str| q.most_gpus(q.id(name).unwrap(), 52);
        // rl: 16 and its borrowing limit of 8; pretraining: 20 and rl's 16 and the 4 applied
        // lends; applied: 16 and the research cohort's 36.
        assert_eq!(
            [most("rl"), most("pretraining"), most("applied")],
            [24, 40, 52]
        );
        for name in ["rl", "pretraining", "applied"] {
            let id = q.id(name).unwrap();
            assert!(q.admits(id, most(name)), "{name} admits {}", most(name));
            assert!(!q.admits(id, most(name) + 1), "{name} refuses one more");
        }
        // A queue alone has nothing to borrow: its nominal, not the cluster.
        let alone = Queues::new(&[def("default", None, 16)], Resources::gpus(32), 3600.0).unwrap();
        assert_eq!(alone.most_gpus(0, 32), 16);
        assert!(alone.admits(0, 16) && !alone.admits(0, 17));
    }

    #[test]
    fn a_cohort_at_its_borrowing_limit_is_named_as_the_limit() {
        let mut cohort = def("cohort", None, 0);
        cohort.borrowing_limit_gpus = Some(0);
        let mut q = Queues::new(
            &[
                cohort,
                def("x", Some("cohort"), 8),
                def("y", Some("cohort"), 8),
                def("z", None, 16),
            ],
            Resources::gpus(32),
            3600.0,
        )
        .unwrap();
        let (x, y) = (q.id("x").unwrap(), q.id("y").unwrap());
        q.charge(x, Resources::gpus(8), true);
        q.charge(y, Resources::gpus(8), true);
        // z's 16 idle GPUs are there, but the cohort may not borrow them.
        assert_eq!(
            q.admission(x, 8),
            Admission::Denied {
                reason: "queue x is at its quota of 8 GPUs, so the 8 it needs must be borrowed; cohort cohort is at its borrowing limit of 0 GPUs, and its queues have only 0 idle GPUs to lend".into()
            }
        );
    }

    #[test]
    fn within_nominal_then_borrowing_then_refused() {
        let mut q = tree();
        let rl = q.id("rl").unwrap();
        assert_eq!(q.nominal(q.id("research").unwrap()), 36);
        assert_eq!(q.admission(rl, 16), Admission::Within);
        q.charge(rl, Resources::gpus(16), true);
        assert_eq!(q.admission(rl, 8), Admission::Borrowing { gpus: 8 });
        assert_eq!(
            q.admission(rl, 9),
            Admission::Denied {
                reason: "queue rl would borrow 9 GPUs, over its borrowing limit of 8".into()
            }
        );
        // Pretraining takes all but 2 of its quota: rl can borrow only 2 from it, plus what
        // research can borrow from applied (its lending limit of 4).
        let pretraining = q.id("pretraining").unwrap();
        q.charge(pretraining, Resources::gpus(18), true);
        q.charge(rl, Resources::gpus(8), false);
        // With quota free, the text says how much of it, and that the cohort limits the rest.
        assert_eq!(
            q.admission(rl, 15),
            Admission::Denied {
                reason: "queue rl has 8 of its 16 GPUs free and needs 15, so 7 must be borrowed; the other queues of cohort research have only 6 idle GPUs to lend".into()
            }
        );
        q.charge(rl, Resources::gpus(8), true);
        assert_eq!(q.admission(rl, 6), Admission::Borrowing { gpus: 6 });
        assert_eq!(
            q.admission(rl, 7),
            Admission::Denied {
                reason: "queue rl is at its quota of 16 GPUs, so the 7 it needs must be borrowed; the other queues of cohort research have only 6 idle GPUs to lend".into()
            }
        );
        q.charge(pretraining, Resources::gpus(18), false);
        assert_eq!(q.used(q.id("research").unwrap()).gpus, 16);
    }

    #[test]
    fn the_wordless_checks_agree_with_the_worded_one() {
        let mut q = tree();
        let (rl, pretraining) = (q.id("rl").unwrap(), q.id("pretraining").unwrap());
        let mut seen = [false; 3];
        // Every verdict, as the queues fill: within, borrowing, and each kind of refusal.
        for (queue, used) in [
            (rl, 0),
            (rl, 16),
            (pretraining, 18),
            (rl, 8),
            (pretraining, 2),
        ] {
            q.charge(queue, Resources::gpus(used), true);
            for leaf in q.ids().filter(|&id| q.children(id).is_empty()) {
                for gpus in 0..=40 {
                    let verdict = q.admission(leaf, gpus);
                    seen[match verdict {
                        Admission::Within => 0,
                        Admission::Borrowing { .. } => 1,
                        Admission::Denied { .. } => 2,
                    }] = true;
                    assert_eq!(
                        q.admits(leaf, gpus),
                        !matches!(verdict, Admission::Denied { .. }),
                        "{} {gpus}",
                        q.name(leaf)
                    );
                    assert_eq!(q.within(leaf, gpus), verdict == Admission::Within);
                    assert_eq!(
                        q.admits(leaf, gpus),
                        gpus <= q.headroom(leaf),
                        "headroom of {}",
                        q.name(leaf)
                    );
                }
            }
        }
        assert_eq!(seen, [true; 3]);
    }

    #[test]
    fn fair_share_follows_weights_down_the_tree() {
        let q = tree();
        let research = q.id("research").unwrap();
        assert!((q.fair_share(research) - 0.5).abs() < 1e-9);
        assert!((q.fair_share(q.id("rl").unwrap()) - 0.25).abs() < 1e-9);
    }

    #[test]
    fn decay_state_carries_history_into_a_rebuilt_tree() {
        let defs = [def("a", None, 50), def("b", None, 50)];
        let capacity = Resources::gpus(100);
        let mut first = Queues::new(&defs, capacity, 3600.0).unwrap();
        let a = first.id("a").unwrap();
        first.restore_decay(1.0e9, &HashMap::new());
        first.charge(a, Resources::gpus(50), true);
        first.decay_to(1.0e9 + 3600.0);
        let (clock, usage) = first.decay_state();
        assert_eq!(clock, 1.0e9 + 3600.0);
        // Half the cluster for one half-life: 0.5 * 3600 share-seconds.
        let usage: HashMap<String, f64> = usage.into_iter().collect();
        assert!((usage["a"] - 1800.0).abs() < 1e-6, "{usage:?}");
        assert_eq!(usage["b"], 0.0);
        // A rebuilt tree with nothing running: a's history still puts it behind b.
        let mut second = Queues::new(&defs, capacity, 3600.0).unwrap();
        second.restore_decay(clock, &usage);
        second.decay_to(clock + 1.0);
        let (a2, b2) = (second.id("a").unwrap(), second.id("b").unwrap());
        assert!(second.fair_share_key(a2) > second.fair_share_key(b2));
        assert!(
            second.fair_share_key(a2) < 1.0,
            "a sane key, not wall-clock-sized"
        );
    }

    #[test]
    fn past_usage_decays_over_the_half_life() {
        let mut q = tree();
        let rl = q.id("rl").unwrap();
        q.charge(rl, Resources::gpus(26), true);
        q.decay_to(3600.0);
        let busy = q.fair_share_key(rl);
        q.charge(rl, Resources::gpus(26), false);
        q.decay_to(7200.0);
        let after_one = q.fair_share_key(rl);
        q.decay_to(10800.0);
        let after_two = q.fair_share_key(rl);
        assert!(busy > after_one && after_one > after_two && after_two > 0.0);
        assert!((after_one / after_two - 2.0).abs() < 1e-6);
    }
}
