//! The scheduling queue: which pending job a cycle tries next, and which it leaves alone.
//!
//! Learnt from kube-scheduler's active, backoff and unschedulable queues and from Kueue's
//! per-ClusterQueue heads:
//! - each queue keeps its active jobs in order (priority, then submission), and a cycle takes
//!   the head of the queue that goes first by priority and fair share, re-reading the queue's
//!   fair-share key after every admission;
//! - a job that could not be placed is *parked* with what blocked it ([`Blocked`]). It comes
//!   back only when something that could unblock it happened (quota given back, resources
//!   freed, nodes changed or a reservation withdrawn, a new policy set) and its backoff (1 s
//!   doubling to 10 s) has passed, or when it has been parked for [`FLUSH_S`],
//!   kube-scheduler's safety net;
//! - a woken job must still pass a cheap check (its queue admits it, enough GPUs are free or
//!   preemptable) before it costs an attempt, so no attempt is spent twice on a job whose
//!   situation did not change;
//! - jobs parked for room wait in classes of one [`RoomAsk`] and priority, which that check
//!   cannot tell apart: a wake-up checks each class until it finds no room, so it costs about
//!   what it wakes, not every parked job (an overloaded replay's forecast runs thousands of
//!   cycles over thousands of parked jobs).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::ops::Bound;

use serde::{Deserialize, Serialize};

use crate::model::Seconds;
use crate::queues::QueueId;

use super::JobId;

/// First backoff after a failed attempt, doubled per failure up to [`MAX_BACKOFF_S`]
/// (kube-scheduler's podInitialBackoffSeconds).
pub const INITIAL_BACKOFF_S: f64 = 1.0;
/// kube-scheduler's podMaxBackoffSeconds.
pub const MAX_BACKOFF_S: f64 = 10.0;
/// A parked job is reconsidered after this long even when nothing it waits for happened,
/// as kube-scheduler flushes its unschedulable pods (it uses 5 minutes).
pub const FLUSH_S: f64 = 300.0;

/// Why a pending job is parked: what has to happen before it is worth another attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Blocked {
    /// Its queue (or a quota policy) refused it: quota must be given back, or the queues or
    /// the policy set change.
    Quota,
    /// No room: resources must be freed, nodes change, a reservation be withdrawn, or the
    /// policy set change.
    Room,
    /// Its binding failed: only its backoff brings it back.
    Binding,
}

/// A queue's order: higher priority first, then earlier submission, then lower id.
type ActiveKey = (Reverse<i32>, Seconds, JobId);

/// What the queue needs to know of a job to order and wake it.
#[derive(Debug, Clone, Copy)]
pub struct JobKey {
    pub queue: QueueId,
    pub priority: i32,
    pub submit_s: f64,
    /// GPUs its queue is charged for it: the quota wake-up order.
    pub gpus: u64,
    /// What it asks of the GPUs: the room wake-up's check reads this and the priority only.
    pub ask: RoomAsk,
}

/// What a job asks of the cluster's GPUs, as far as the room wake-up counts them. Its check
/// ([`WakeCheck::room_possible`]) reads only this and the job's priority, and fails for more
/// GPUs already claimed whenever it failed for fewer; so once a wake-up found no room for one
/// ask and priority, it checks no other job of the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RoomAsk {
    /// Pods, all alike.
    pub pods: u32,
    /// Whole GPUs per pod (0 for a fractional or CPU-only pod).
    pub gpus_per_pod: u32,
    /// Milli-GPUs per pod on one shared GPU (0 for whole GPUs).
    pub gpu_milli: u32,
    /// A balloon takes only free room: it preempts nothing.
    pub balloon: bool,
}

impl RoomAsk {
    /// The GPUs the job takes whole or in part: what its queue is charged and what it claims
    /// of the room once woken (a fractional pod is charged a whole GPU per 1,000 milli,
    /// rounded up).
    pub fn gpus(&self) -> u64 {
        let pods = u64::from(self.pods);
        if self.gpu_milli > 0 {
            (u64::from(self.gpu_milli) * pods).div_ceil(1000)
        } else {
            u64::from(self.gpus_per_pod) * pods
        }
    }
}

/// Parked jobs the room check cannot tell apart: one ask and one priority.
type RoomClass = (RoomAsk, i32);

impl JobKey {
    fn room_class(&self) -> RoomClass {
        (self.ask, self.priority)
    }

    fn active(&self, id: JobId) -> ActiveKey {
        (Reverse(self.priority), Seconds(self.submit_s), id)
    }
}

/// A parked job.
#[derive(Debug, Clone, Copy)]
struct Parked {
    key: JobKey,
    blocked: Blocked,
    /// Failed attempts in a row: the backoff's exponent.
    failures: u32,
    parked_s: f64,
    /// Not before this time, even when woken by an event.
    backoff_until_s: f64,
    /// The counters it waits on, as they were when it was parked.
    quota_releases: u64,
    room_releases: u64,
    policy_set: u64,
}

/// The events a parked job may wait for, counted by the scheduler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Epochs {
    /// Quota given back (`Queues::releases`) plus queue changes.
    pub quota: u64,
    /// Resources freed and node changes (`ClusterState::releases`), and reservations
    /// withdrawn with their owner (a job may have been held off their nodes).
    pub room: u64,
    /// The active policy-set version.
    pub policy_set: u64,
}

/// Pending jobs: active ones in per-queue order, parked ones by what blocks them.
#[derive(Debug, Clone, Default)]
pub struct SchedulingQueue {
    /// Per queue (by id): its active jobs in the order they are tried. A `BTreeSet` so the
    /// head is the first element and a job leaves in O(log n).
    queue_to_active: Vec<BTreeSet<ActiveKey>>,
    /// Every active job's key, to find it in its queue's set.
    job_to_active: BTreeMap<JobId, JobKey>,
    /// Every parked job.
    job_to_parked: BTreeMap<JobId, Parked>,
    /// Per queue: its quota-parked jobs by GPUs needed, smallest first. The queue admits a
    /// smaller ask whenever it admits a larger one, so waking stops at the first refusal.
    queue_to_quota_parked: Vec<BTreeSet<(u64, JobId)>>,
    /// The jobs parked for room, by ask and priority, each class in the order it is tried.
    /// A class that found no room in a wake-up is left there, so a wake-up costs about the
    /// jobs it wakes and the classes, not every parked job. A class leaves when it empties.
    ask_to_room_parked: BTreeMap<RoomClass, BTreeSet<ActiveKey>>,
    /// The jobs parked after a failed binding: only their backoff brings them back.
    binding_parked: BTreeSet<JobId>,
    /// Failures carried over by jobs that were woken, until they are placed or parked again.
    job_to_failures: BTreeMap<JobId, u32>,
}

/// What a wake-up asks of the scheduler about one parked job.
pub trait WakeCheck {
    /// Whether its queue would admit `gpus` more GPUs now (the asks of several jobs, summed).
    fn quota_admits(&self, queue: QueueId, gpus: u64) -> bool;
    /// Whether a job of `key` could possibly find room now (free or preemptable GPUs) after
    /// other woken jobs claimed `claimed` GPUs. It reads only the key's ask and priority, and
    /// must not hold for more claimed GPUs where it failed for fewer.
    fn room_possible(&self, key: &JobKey, claimed: u64) -> bool;
    /// The jobs whose reservation holds quota (a handful): each is woken before the smaller
    /// asks of its queue, which its hold keeps back, so they cannot use up the admission it
    /// waits for.
    fn quota_holders(&self) -> Vec<JobId> {
        Vec::new()
    }
}

impl SchedulingQueue {
    fn ensure_queue(&mut self, queue: QueueId) {
        if self.queue_to_active.len() <= queue {
            self.queue_to_active.resize_with(queue + 1, BTreeSet::new);
            self.queue_to_quota_parked
                .resize_with(queue + 1, BTreeSet::new);
        }
    }

    /// A new or returning job, ready to be tried.
    pub fn push(&mut self, id: JobId, key: JobKey) {
        self.remove(id);
        self.ensure_queue(key.queue);
        self.queue_to_active[key.queue].insert(key.active(id));
        self.job_to_active.insert(id, key);
    }

    /// The job leaves the queue (placed, finished or withdrawn).
    pub fn remove(&mut self, id: JobId) {
        if let Some(key) = self.job_to_active.remove(&id) {
            self.queue_to_active[key.queue].remove(&key.active(id));
        }
        let Some(parked) = self.job_to_parked.remove(&id) else {
            return;
        };
        match parked.blocked {
            Blocked::Quota => {
                self.queue_to_quota_parked[parked.key.queue].remove(&(parked.key.gpus, id));
            }
            Blocked::Room => {
                let class = parked.key.room_class();
                if let Some(jobs) = self.ask_to_room_parked.get_mut(&class) {
                    jobs.remove(&parked.key.active(id));
                    if jobs.is_empty() {
                        self.ask_to_room_parked.remove(&class);
                    }
                }
            }
            Blocked::Binding => {
                self.binding_parked.remove(&id);
            }
        }
    }

    /// The job was placed: it leaves, and its failures are forgotten.
    pub fn placed(&mut self, id: JobId) {
        self.remove(id);
        self.job_to_failures.remove(&id);
    }

    /// Park an active job (or re-park a parked one) because `blocked`, at `now_s`.
    pub fn park(&mut self, id: JobId, blocked: Blocked, now_s: f64, epochs: Epochs) {
        let key = match (self.job_to_active.get(&id), self.job_to_parked.get(&id)) {
            (Some(key), _) => *key,
            (None, Some(parked)) => parked.key,
            (None, None) => return,
        };
        self.remove(id);
        let failures = self.job_to_failures.remove(&id).unwrap_or(0) + 1;
        let backoff = (INITIAL_BACKOFF_S * 2f64.powi(failures as i32 - 1)).min(MAX_BACKOFF_S);
        match blocked {
            Blocked::Quota => {
                self.queue_to_quota_parked[key.queue].insert((key.gpus, id));
            }
            Blocked::Room => {
                self.ask_to_room_parked
                    .entry(key.room_class())
                    .or_default()
                    .insert(key.active(id));
            }
            Blocked::Binding => {
                self.binding_parked.insert(id);
            }
        }
        self.job_to_parked.insert(
            id,
            Parked {
                key,
                blocked,
                failures,
                parked_s: now_s,
                backoff_until_s: now_s + backoff,
                quota_releases: epochs.quota,
                room_releases: epochs.room,
                policy_set: epochs.policy_set,
            },
        );
    }

    /// Make active the parked jobs whose wait is over: an event they wait for happened (or
    /// they waited [`FLUSH_S`]), their backoff passed, and `check` says they could now get
    /// further. Returns how many woke.
    pub fn wake(&mut self, now_s: f64, epochs: Epochs, check: &dyn WakeCheck) -> usize {
        let mut woken: Vec<JobId> = Vec::new();
        // Quota: per queue, smallest ask first, as many as its queue admits together (they
        // would be admitted one after another), up to the first it refuses.
        let due = |parked: &Parked| {
            let flushed = now_s >= parked.parked_s + FLUSH_S;
            let event =
                parked.quota_releases != epochs.quota || parked.policy_set != epochs.policy_set;
            now_s >= parked.backoff_until_s && (event || flushed)
        };
        // The holders parked for quota, smallest ask first, as each queue's list orders them.
        let mut holders: Vec<(u64, JobId)> = check
            .quota_holders()
            .into_iter()
            .filter_map(|id| {
                let parked = self.job_to_parked.get(&id)?;
                (parked.blocked == Blocked::Quota).then_some((parked.key.gpus, id))
            })
            .collect();
        holders.sort_unstable();
        for queue in 0..self.queue_to_quota_parked.len() {
            let mut together = 0u64;
            // A reservation's holder first: the smaller asks behind it are held for it.
            for &(gpus, id) in &holders {
                let parked = &self.job_to_parked[&id];
                if parked.key.queue == queue
                    && due(parked)
                    && check.quota_admits(queue, together + gpus)
                {
                    together += gpus;
                    woken.push(id);
                }
            }
            for &(gpus, id) in &self.queue_to_quota_parked[queue] {
                if !due(&self.job_to_parked[&id]) || woken.contains(&id) {
                    continue;
                }
                if !check.quota_admits(queue, together + gpus) {
                    // Every larger ask of this queue is refused too.
                    break;
                }
                together += gpus;
                woken.push(id);
            }
        }
        // Room: in the order they would be tried, as many as could find room together (each
        // woken job claims its GPUs), so a crowd of parked jobs is not woken for one free node.
        // Each class is a run of jobs in try order; merging their first waiting jobs gives
        // the parked jobs in try order, and a class that found no room drops out of the
        // merge: the claims only grow, so none of its later jobs could be woken.
        let due = |order: &&ActiveKey| {
            let parked = &self.job_to_parked[&order.2];
            now_s >= parked.backoff_until_s
                && (now_s >= parked.parked_s + FLUSH_S
                    || parked.room_releases != epochs.room
                    || parked.policy_set != epochs.policy_set)
        };
        let classes: Vec<&BTreeSet<ActiveKey>> = self.ask_to_room_parked.values().collect();
        let next_due = |class: usize, after: Bound<ActiveKey>| {
            classes[class]
                .range((after, Bound::Unbounded))
                .find(due)
                .copied()
        };
        let mut heads: BinaryHeap<Reverse<(ActiveKey, usize)>> = (0..classes.len())
            .filter_map(|class| Some(Reverse((next_due(class, Bound::Unbounded)?, class))))
            .collect();
        let mut claimed = 0u64;
        while let Some(Reverse((order, class))) = heads.pop() {
            let key = self.job_to_parked[&order.2].key;
            if !check.room_possible(&key, claimed) {
                continue;
            }
            claimed += key.ask.gpus();
            woken.push(order.2);
            if let Some(next) = next_due(class, Bound::Excluded(order)) {
                heads.push(Reverse((next, class)));
            }
        }
        woken.extend(
            self.binding_parked
                .iter()
                .filter(|id| now_s >= self.job_to_parked[id].backoff_until_s),
        );
        for &id in &woken {
            if let Some(parked) = self.job_to_parked.get(&id).copied() {
                self.remove(id);
                self.job_to_failures.insert(id, parked.failures);
                self.push(id, parked.key);
            }
        }
        woken.len()
    }

    /// The queue whose head goes next: highest head priority, then lowest `key(queue)`, then
    /// earliest head. `None` when no job is active.
    pub fn next_queue(&self, key: &dyn Fn(QueueId) -> f64) -> Option<QueueId> {
        let mut best: Option<(QueueId, ActiveKey, f64)> = None;
        for (queue, active) in self.queue_to_active.iter().enumerate() {
            let Some(&head) = active.first() else {
                continue;
            };
            let fair = key(queue);
            let better = match &best {
                None => true,
                Some((_, best_head, best_fair)) => head
                    .0
                    .cmp(&best_head.0)
                    .then(fair.total_cmp(best_fair))
                    .then(head.1.cmp(&best_head.1))
                    .then(head.2.cmp(&best_head.2))
                    .is_lt(),
            };
            if better {
                best = Some((queue, head, fair));
            }
        }
        best.map(|(queue, _, _)| queue)
    }

    /// The head of `queue`, if it has an active job.
    pub fn head(&self, queue: QueueId) -> Option<JobId> {
        self.queue_to_active.get(queue)?.first().map(|k| k.2)
    }

    /// Every pending job, active or parked, by id.
    pub fn all(&self) -> Vec<JobId> {
        let mut all: Vec<JobId> = self
            .job_to_active
            .keys()
            .chain(self.job_to_parked.keys())
            .copied()
            .collect();
        all.sort_unstable();
        all
    }

    pub fn len(&self) -> usize {
        self.job_to_active.len() + self.job_to_parked.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `id` is pending (active or parked).
    pub fn contains(&self, id: JobId) -> bool {
        self.job_to_active.contains_key(&id) || self.job_to_parked.contains_key(&id)
    }

    /// Active jobs, across queues.
    pub fn active_len(&self) -> usize {
        self.job_to_active.len()
    }

    /// The jobs parked for `blocked`, in id order: what the planner plans for, without
    /// collecting and looking up every queued job.
    pub fn parked_for(&self, blocked: Blocked) -> impl Iterator<Item = JobId> + '_ {
        self.job_to_parked
            .iter()
            .filter(move |(_, parked)| parked.blocked == blocked)
            .map(|(&id, _)| id)
    }

    /// Why `id` is parked, and until when its backoff runs, if it is parked.
    pub fn parked(&self, id: JobId) -> Option<(Blocked, f64)> {
        self.job_to_parked
            .get(&id)
            .map(|p| (p.blocked, p.backoff_until_s))
    }

    /// Failed attempts in a row of an active job that was woken (0 for a new job).
    pub fn failures(&self, id: JobId) -> u32 {
        self.job_to_failures.get(&id).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Always(bool, bool);
    impl WakeCheck for Always {
        fn quota_admits(&self, _: QueueId, _: u64) -> bool {
            self.0
        }
        fn room_possible(&self, _: &JobKey, _: u64) -> bool {
            self.1
        }
    }

    fn key(queue: QueueId, priority: i32, submit_s: f64, gpus: u64) -> JobKey {
        JobKey {
            queue,
            priority,
            submit_s,
            gpus,
            ask: RoomAsk {
                pods: 1,
                gpus_per_pod: gpus as u32,
                gpu_milli: 0,
                balloon: false,
            },
        }
    }

    #[test]
    fn the_head_goes_by_priority_then_fair_share_then_age() {
        let mut q = SchedulingQueue::default();
        q.push(1, key(0, 0, 5.0, 1));
        q.push(2, key(1, 0, 1.0, 1));
        q.push(3, key(1, 0, 0.5, 1));
        // Queue 0 has the lower fair-share key: it goes first at equal priority.
        let fair = |queue: QueueId| if queue == 0 { 0.1 } else { 0.2 };
        assert_eq!(q.next_queue(&fair), Some(0));
        assert_eq!(
            q.head(1),
            Some(3),
            "earlier submission first within a queue"
        );
        q.push(4, key(1, 10, 9.0, 1));
        assert_eq!(
            q.next_queue(&fair),
            Some(1),
            "a higher-priority head beats fair share"
        );
        assert_eq!(q.head(1), Some(4));
    }

    #[test]
    fn a_parked_job_waits_for_its_event_and_its_backoff() {
        let mut q = SchedulingQueue::default();
        q.push(1, key(0, 0, 0.0, 8));
        let epochs = Epochs::default();
        q.park(1, Blocked::Room, 0.0, epochs);
        assert_eq!(q.active_len(), 0);
        // Nothing happened: not woken, however long the backoff has run.
        assert_eq!(q.wake(50.0, epochs, &Always(true, true)), 0);
        let freed = Epochs { room: 1, ..epochs };
        // Something was freed, but the job cannot fit: still parked.
        assert_eq!(q.wake(50.0, freed, &Always(true, false)), 0);
        assert_eq!(q.wake(50.0, freed, &Always(true, true)), 1);
        assert_eq!(q.head(0), Some(1));
        // Parked again: the backoff doubled, so an event 1.5 s later does not wake it yet.
        q.park(1, Blocked::Room, 60.0, freed);
        let again = Epochs { room: 2, ..freed };
        assert_eq!(q.wake(61.5, again, &Always(true, true)), 0);
        assert_eq!(q.wake(62.0, again, &Always(true, true)), 1);
        // Flushed after FLUSH_S even with no event.
        q.park(1, Blocked::Room, 100.0, again);
        assert_eq!(q.wake(100.0 + FLUSH_S, again, &Always(true, true)), 1);
    }

    #[test]
    fn room_wakes_only_as_many_as_the_free_room_holds_highest_priority_first() {
        /// 16 GPUs free; each job asks for 8.
        struct Free16;
        impl WakeCheck for Free16 {
            fn quota_admits(&self, _: QueueId, _: u64) -> bool {
                true
            }
            fn room_possible(&self, key: &JobKey, claimed: u64) -> bool {
                claimed + key.ask.gpus() <= 16
            }
        }
        let mut q = SchedulingQueue::default();
        for (id, priority) in [(1, 0), (2, 5), (3, 0), (4, 9)] {
            q.push(id, key(0, priority, f64::from(id), 8));
            q.park(id, Blocked::Room, 0.0, Epochs::default());
        }
        let freed = Epochs {
            room: 1,
            ..Epochs::default()
        };
        assert_eq!(q.wake(5.0, freed, &Free16), 2);
        // The two of highest priority woke; the others stay parked.
        assert_eq!(q.head(0), Some(4));
        assert!(q.parked(1).is_some() && q.parked(3).is_some());
        assert!(q.parked(2).is_none() && q.parked(4).is_none());
    }

    #[test]
    fn a_wake_up_checks_an_ask_no_more_once_it_found_no_room() {
        /// 16 GPUs free, counting its checks.
        struct Counted(std::cell::Cell<u32>);
        impl WakeCheck for Counted {
            fn quota_admits(&self, _: QueueId, _: u64) -> bool {
                true
            }
            fn room_possible(&self, key: &JobKey, claimed: u64) -> bool {
                self.0.set(self.0.get() + 1);
                claimed + key.ask.gpus() <= 16
            }
        }
        let mut q = SchedulingQueue::default();
        // A hundred 8-GPU jobs, then one 1-GPU job of lower priority.
        for id in 1..=100 {
            q.push(id, key(0, 1, f64::from(id), 8));
            q.park(id, Blocked::Room, 0.0, Epochs::default());
        }
        q.push(101, key(0, 0, 0.0, 1));
        q.park(101, Blocked::Room, 0.0, Epochs::default());
        let freed = Epochs {
            room: 1,
            ..Epochs::default()
        };
        let check = Counted(std::cell::Cell::new(0));
        assert_eq!(q.wake(5.0, freed, &check), 2, "two 8-GPU jobs fill 16 GPUs");
        // Two that fit, the third that did not, and the 1-GPU job (another ask): not 101.
        assert_eq!(check.0.get(), 4);
        assert!(q.parked(101).is_some(), "16 GPUs were claimed already");
    }

    #[test]
    fn quota_wakes_the_smallest_asks_its_queue_admits() {
        struct Upto(u64);
        impl WakeCheck for Upto {
            fn quota_admits(&self, _: QueueId, gpus: u64) -> bool {
                gpus <= self.0
            }
            fn room_possible(&self, _: &JobKey, _: u64) -> bool {
                true
            }
        }
        let mut q = SchedulingQueue::default();
        for (id, gpus) in [(1, 64), (2, 8), (3, 16), (4, 8)] {
            q.push(id, key(0, 0, f64::from(id), gpus));
            q.park(id, Blocked::Quota, 0.0, Epochs::default());
        }
        let released = Epochs {
            quota: 1,
            ..Epochs::default()
        };
        // 8 and 8 would be admitted together only within 16.
        assert_eq!(q.wake(10.0, released, &Upto(10)), 1);
        q.park(2, Blocked::Quota, 10.0, Epochs::default());
        assert_eq!(q.wake(20.0, released, &Upto(16)), 2);
        assert_eq!(q.head(0), Some(2));
        assert_eq!(q.parked(3).map(|p| p.0), Some(Blocked::Quota));
        assert_eq!(q.len(), 4);
    }
}
