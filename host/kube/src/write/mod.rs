//! What goes out: bindings ([`bind`]), evictions ([`evict`]), gangs stopped by a failing node
//! ([`stop`]), preflight pods and their results ([`preflight`]), DRA claim writes ([`claims`]),
//! Events and the PodScheduled condition ([`report`]), and PodGroup and Queue statuses
//! ([`status`]). [`Writer`] holds the write clients and what it remembers between passes;
//! it reads the tracker and the watch caches, and checks the Lease before each write.

mod bind;
mod claims;
pub mod evict;
pub(crate) mod preflight;
mod report;
mod status;
mod stop;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gantry_core::{BindOutcome, CycleOutput, JobId, Scheduler};
use kube::Client;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::Store;

use claims::ClaimWrite;
use evict::Preemption;

pub(crate) use crate::connect::CONCURRENCY;
use crate::leader::Leadership;
use crate::mapping::PendingPod;
use crate::tracker::Tracker;

/// The name Gantry reports Events and bindings under.
pub(crate) const COMPONENT: &str = "gantry";
/// Queue statuses are written at most this often.
pub(crate) const QUEUE_STATUS_EVERY: Duration = Duration::from_secs(5);
/// Scheduled Events in flight at once, in the background (see
/// [`Writer::post_scheduled_events`]).
pub(crate) const EVENT_CONCURRENCY: usize = 4;

/// How often the FailedScheduling memory is trimmed to the pods still pending.
pub(crate) const TRIM_EVERY: Duration = Duration::from_secs(60);

/// Why a write was refused: this replica does not hold the Lease (any more).
pub(crate) const NOT_LEADER: &str = "this replica is not the leader (its Lease ran out)";

/// The upstream PodGroups' cache and the version read, whose conditions are written.
type Groups<'a> = Option<&'a (Store<DynamicObject>, ApiResource)>;

/// Why a write attempt under the Lease ([`fenced`]) did not run to its answer. Its text is
/// what the pod's Events and the explanations say, so it reads as a sentence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Fenced {
    /// This replica does not hold the Lease: nothing was sent.
    #[error("{NOT_LEADER}: nothing was sent")]
    NotLeader,
    /// The Lease (or the call timeout) would have run out before the answer: the request was
    /// dropped, and may or may not have been applied.
    #[error(
        "no answer before the Lease or the call timeout ran out: the request was dropped, and \
         may or may not have been applied"
    )]
    CutOff,
}

/// An Event on a node the sync found due.
#[derive(Debug, Clone)]
pub(crate) struct NodeEvent {
    pub(crate) node: String,
    pub(crate) type_: &'static str,
    pub(crate) reason: &'static str,
    pub(crate) note: String,
}

/// One write attempt under the Lease: refused when this replica does not hold it, and cut off
/// when what is left of the Lease ([`Leadership::time_left`]) or
/// [`crate::connect::CALL_TIMEOUT`] runs out
/// first, whichever is sooner. The write clients never retry by themselves (see
/// [`crate::connect::client_with`]), so no attempt outlives the Lease it was sent under.
pub(crate) async fn fenced<T>(
    leadership: Option<&Leadership>,
    write: impl std::future::Future<Output = T>,
) -> std::result::Result<T, Fenced> {
    let left = match leadership {
        None => crate::connect::CALL_TIMEOUT,
        Some(leadership) => leadership
            .time_left()
            .ok_or(Fenced::NotLeader)?
            .min(crate::connect::CALL_TIMEOUT),
    };
    tokio::time::timeout(left, write)
        .await
        .map_err(|_| Fenced::CutOff)
}

/// What the writer reads of the watch caches: the upstream PodGroups, whose conditions it
/// writes, and the Queues, whose status it writes (or the problem that left one out).
#[derive(Default, Clone, Copy)]
pub(crate) struct Watched<'a> {
    pub(crate) groups: Groups<'a>,
    pub(crate) queues: Option<&'a Store<DynamicObject>>,
    pub(crate) queue_problems: &'a [String],
}

/// What one bind pass came to so far: an outcome per placed job, and the pods that wait
/// because their job failed to bind, each with its message.
#[derive(Default)]
struct Pass {
    outcomes: Vec<BindOutcome>,
    failed: Vec<(PendingPod, String)>,
}

/// The write side of the live cluster: its clients, and what it remembers between passes.
pub(crate) struct Writer {
    /// The runtime each pass blocks on (the loop is synchronous).
    handle: tokio::runtime::Handle,
    /// The client for bindings, Events and statuses: each call bounded by
    /// [`crate::connect::CALL_TIMEOUT`].
    client: Client,
    /// A client without kube-rs's automatic retries, for evictions (see
    /// [`crate::connect::client_with`]), each call bounded the same.
    evict_client: Client,
    /// Set when leader election runs: every write checks it first.
    pub(crate) leadership: Option<Arc<Leadership>>,
    /// The last FailedScheduling message posted per pod uid: the same reason is not posted
    /// again every cycle.
    last_failed: HashMap<String, String>,
    /// Waiting jobs whose last FailedScheduling message had no start estimate, with that
    /// message's reason: a job parked since is tried again only when woken, so its message
    /// gets the estimate (once) when the plan or the forecast first gives it one.
    job_to_unestimated_reason: BTreeMap<JobId, String>,
    /// When the FailedScheduling memory was last trimmed.
    last_trim: Instant,
    /// The status last written to each Queue, by name, and when statuses were last written:
    /// a status is written when it changed, at most every [`QUEUE_STATUS_EVERY`].
    queue_status: HashMap<String, serde_json::Value>,
    queue_status_at: Option<Instant>,
    /// Preemptions under way, by preemptor job: the preemptor waits, nominated, until its
    /// victims are gone (see [`evict`]).
    job_to_preemption: BTreeMap<JobId, Preemption>,
    /// Pods whose binding went unanswered ([`bind::Bound::Unanswered`]) and the node it
    /// named: read back at each sync until the API server answers, so one that was not bound
    /// waits for the next cycle, not for its assumption to run out.
    unanswered: Vec<(PendingPod, String)>,
    /// Our pods gone (deleted, or finished) since the last bind pass, as `(namespace, uid)`:
    /// the claims reserved for them are released there.
    pub(crate) gone: Vec<(String, String)>,
    /// Jobs the last cycle evicted: they leave the scheduler on the next sync.
    evicted: Vec<JobId>,
    /// Pods of stopped gangs whose eviction a budget blocked: tried again (see [`stop`]).
    blocked_stops: Vec<stop::BlockedStop>,
    /// Preflight: the tests due and the results to write (see [`preflight`]).
    pub(crate) preflights: preflight::Preflights,
    /// Events on nodes the sync found due (the health breaker tripping), posted by the next
    /// pass on the leader.
    pub(crate) node_events: Vec<NodeEvent>,
    /// Bindings answered as applied after this replica had lost the Lease, since it started
    /// (`gantry_bind_after_lease_loss_total`): the fence keeps it 0.
    pub(crate) binds_after_lease_loss: u64,
}

impl Writer {
    /// A writer blocking on `handle`'s runtime, writing through `client` and evicting
    /// through `evict_client`.
    pub(crate) fn new(
        handle: tokio::runtime::Handle,
        client: Client,
        evict_client: Client,
        preflights: preflight::Preflights,
    ) -> Self {
        Self {
            handle,
            client,
            evict_client,
            leadership: None,
            last_failed: HashMap::new(),
            job_to_unestimated_reason: BTreeMap::new(),
            last_trim: Instant::now(),
            queue_status: HashMap::new(),
            queue_status_at: None,
            job_to_preemption: BTreeMap::new(),
            unanswered: Vec::new(),
            gone: Vec::new(),
            evicted: Vec::new(),
            blocked_stops: Vec::new(),
            preflights,
            node_events: Vec::new(),
            binds_after_lease_loss: 0,
        }
    }

    /// Whether this replica may write now: no election, or it holds the Lease.
    pub(crate) fn may_write(&self) -> bool {
        self.leadership.as_ref().is_none_or(|l| l.is_leader())
    }

    /// The client writes go through (leader election renews the Lease with it).
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// The jobs the last cycle evicted, to take out of the scheduler.
    pub(crate) fn take_evicted(&mut self) -> Vec<JobId> {
        std::mem::take(&mut self.evicted)
    }

    /// Forgets what it keeps by job: a rebuilt scheduler numbers its jobs afresh.
    pub(crate) fn forget_jobs(&mut self) {
        self.job_to_preemption.clear();
        self.job_to_unestimated_reason.clear();
    }

    /// One bind pass after a cycle on `scheduler`: releases the claims of pods gone,
    /// preempts, binds, and reports why the rest wait; one outcome per placed job.
    pub(crate) fn pass(
        &mut self,
        tracker: &mut Tracker,
        watched: Watched<'_>,
        scheduler: &Scheduler,
        output: &CycleOutput,
    ) -> Vec<BindOutcome> {
        let groups = watched.groups;
        let mut pass = Pass::default();
        self.release_claims(tracker);
        self.stop_gangs(tracker, scheduler, output);
        if self.may_write() {
            let leadership = self.leadership.as_deref();
            let io = preflight::Io {
                handle: &self.handle,
                client: &self.client,
                leadership,
            };
            self.preflights.write(io, tracker, scheduler);
            for e in std::mem::take(&mut self.node_events) {
                let (reason, action) = (e.reason, "Health");
                let post = report::post_node_event(
                    &self.client,
                    leadership,
                    &e.node,
                    e.type_,
                    (reason, action),
                    &e.note,
                );
                self.handle.block_on(post);
            }
        }
        let victim_nodes = self.preempt(tracker, scheduler, output, &mut pass);
        self.bind_placed(tracker, groups, scheduler, output, &victim_nodes, &mut pass);
        self.report_waiting(tracker, groups, scheduler, output, pass.failed);
        self.post_charge_events(tracker);
        if self.may_write() {
            self.report_queues(watched.queues, watched.queue_problems, scheduler);
        }
        pass.outcomes
    }
}
