//! The read-only cluster picture the loop publishes after each pass ([`ClusterView`], with
//! its queues and jobs), the decision events the live feed streams, and what each queue lends
//! ([`lent_gpus`]).

use super::*;

/// What the loop publishes about the cluster, a few times a second. Immutable once published,
/// so a handler reads a consistent picture without a lock.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    /// The cluster's name, as the cluster summary reports it.
    pub cluster: String,
    /// When this view was published (ms since the epoch), so a reader can tell how fresh it is.
    pub at_ms: u64,
    /// The node table as the core sees it; names resolve through the engine's symbols.
    pub nodes: Arc<NodeTable>,
    /// Every queue's quota, usage and fair share, in declaration order: what `/api/queues` serves.
    pub queues: Vec<QueueView>,
    /// Jobs pending or running now, by name.
    pub job_to_state: HashMap<String, JobView>,
    /// Running jobs per node index, for "what runs here".
    pub node_to_jobs: HashMap<u32, Vec<String>>,
    /// GPUs balloons hold per node index (nodes with none absent): the heatmap shades them
    /// apart from work.
    pub node_to_balloon_gpus: HashMap<u32, u32>,
    /// The first leaf queue's usage, for the quota self-test of an upload.
    pub sample_usage: Option<(QueueUsage, Option<CohortUsage>)>,
    /// Pods of all pending jobs (each pod of a gang counted), balloons aside, for the
    /// cluster summary.
    pub pending_pods: u64,
    /// Pods of all running jobs, balloons aside, for the cluster summary.
    pub running_pods: u64,
    /// Balloon pods pending and running: apart, so balloons never read as work.
    pub balloon_pods: BalloonPods,
    /// Each node's health-lifecycle state, by index in `nodes`: published with the table so
    /// the heatmap's colours and its nodes are one picture.
    pub node_states: Vec<gantry_core::NodeState>,
}

/// Balloon pods by state, counted apart from work everywhere a count is shown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BalloonPods {
    /// Waiting for room.
    pub pending: u64,
    /// Holding idle GPUs.
    pub running: u64,
}

/// Jobs and pods by state, work and balloons apart: one per queue, and the cluster's total.
#[derive(Debug, Clone, Copy, Default)]
struct QueueCounts {
    pending: u32,
    running: u32,
    balloon_pending: u32,
    balloon_running: u32,
    pending_pods: u64,
    running_pods: u64,
    balloon_pods: BalloonPods,
}

impl QueueCounts {
    /// Counts a job of `spec`, pending or `running`, as work or as a balloon.
    fn add(&mut self, spec: &gantry_core::JobSpec, running: bool) {
        let pods = u64::from(spec.pods);
        let (jobs, pods_sum) = match (spec.balloon, running) {
            (false, false) => (&mut self.pending, &mut self.pending_pods),
            (false, true) => (&mut self.running, &mut self.running_pods),
            (true, false) => (&mut self.balloon_pending, &mut self.balloon_pods.pending),
            (true, true) => (&mut self.balloon_running, &mut self.balloon_pods.running),
        };
        *jobs += 1;
        *pods_sum += pods;
    }
}

/// GPUs of each queue's nominal quota that other queues use now by borrowing them.
///
/// The core records what each queue borrows beyond its quota, not from whom: a borrower draws
/// on its siblings' idle quota as one pool (see `Queues::admission`). So, level by level from
/// the top, what a group of siblings borrows from each other (their borrowing less what their
/// parent borrows from its own siblings) is split over the group's lenders in proportion to
/// what each may lend. What a cohort lends to its siblings is, in turn, its children's idle
/// quota: it is split over them in proportion to what they may still lend.
pub fn lent_gpus(queues: &Queues) -> Vec<u64> {
    let mut lent = vec![0u64; queues.len()];
    let roots: Vec<QueueId> = queues
        .ids()
        .filter(|&id| queues.parent(id).is_none())
        .collect();
    lend_within(queues, &roots, None, &mut lent);
    lent
}

/// Splits the borrowing inside one group of siblings over its lenders, then recurses.
pub(super) fn lend_within(
    queues: &Queues,
    group: &[QueueId],
    parent: Option<QueueId>,
    lent: &mut [u64],
) {
    let from_above = parent.map_or(0, |p| queues.borrowed(p));
    let borrowed: u64 = group.iter().map(|&q| queues.borrowed(q)).sum();
    let lendable: Vec<u64> = group.iter().map(|&q| queues.lendable(q)).collect();
    let within = split(borrowed.saturating_sub(from_above), &lendable);
    // What the parent lends outwards comes from its children's idle quota that is left.
    let left: Vec<u64> = lendable
        .iter()
        .zip(&within)
        .map(|(l, w)| l.saturating_sub(*w))
        .collect();
    let outwards = split(parent.map_or(0, |p| lent[p]), &left);
    for (i, &q) in group.iter().enumerate() {
        lent[q] = within[i] + outwards[i];
    }
    for &q in group {
        let children = queues.children(q);
        if !children.is_empty() {
            lend_within(queues, children, Some(q), lent);
        }
    }
}

/// `total` (at most the weights' sum) split in proportion to `weights`, each share at most its
/// weight; the remainder of the rounding goes to the largest fractions.
pub(super) fn split(total: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let total = u128::from(total).min(sum);
    let mut shares: Vec<u64> = Vec::with_capacity(weights.len());
    let mut remainders: Vec<(u128, usize)> = Vec::with_capacity(weights.len());
    for (i, &w) in weights.iter().enumerate() {
        let exact = total * u128::from(w);
        shares.push((exact / sum) as u64);
        remainders.push((exact % sum, i));
    }
    let mut short = (total - shares.iter().map(|&s| u128::from(s)).sum::<u128>()) as usize;
    remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, i) in &remainders {
        if short == 0 {
            break;
        }
        if shares[i] < weights[i] {
            shares[i] += 1;
            short -= 1;
        }
    }
    shares
}

impl Live {
    /// The cluster picture the loop published last; a handler reads it without a lock.
    pub fn view(&self) -> Arc<ClusterView> {
        self.view.load_full()
    }

    /// Replaces the cluster picture the API serves.
    pub fn publish(&self, scheduler: &Scheduler, cluster: &str) {
        let _span = tracing::debug_span!("publish").entered();
        let queues = &scheduler.queues;
        // Each queue's jobs by state, work and balloons apart.
        let mut queue_to_counts: HashMap<usize, QueueCounts> = HashMap::new();
        let mut total = QueueCounts::default();
        let mut job_to_state: HashMap<String, JobView> = HashMap::new();
        let mut node_to_jobs: HashMap<u32, Vec<String>> = HashMap::new();
        let mut node_to_balloon_gpus: HashMap<u32, u32> = HashMap::new();
        let mut by_queue: HashMap<usize, Vec<(i32, f64, String)>> = HashMap::new();
        let published_ms = now_ms();
        let clock_s = scheduler.clock_s();
        // A time on the scheduler's clock, past or future, on the wall clock.
        let wall_ms = |at_s: f64| (published_ms as f64 + (at_s - clock_s) * 1000.0).max(0.0) as u64;
        let view_of = |id: JobId, spec: &gantry_core::JobSpec, state: &'static str| JobView {
            queue: queues.name(spec.queue).to_string(),
            pods: spec.pods,
            gpus_per_pod: spec.shape.gpus,
            priority: spec.priority,
            submitted_s: spec.submit_s,
            submitted_ms: published_ms
                .saturating_sub(((clock_s - spec.submit_s).max(0.0) * 1000.0) as u64),
            state,
            queue_position: None,
            balloon: spec.balloon,
            estimate: None,
            no_estimate: None,
            avoiding: scheduler
                .avoided(id)
                .iter()
                .map(|bad| gantry_contract::BadNodeView {
                    // A rebuild may have shrunk the table since the node failed.
                    node: if bad.node < scheduler.state.nodes.len() {
                        scheduler.node_name(bad.node)
                    } else {
                        format!("node #{}", bad.node)
                    },
                    cause: bad.cause.clone(),
                    at_s: bad.at_s,
                    at_ms: wall_ms(bad.at_s),
                    until_s: bad.until_s,
                    until_ms: wall_ms(bad.until_s),
                })
                .collect(),
        };
        let mut job_to_no_estimate = scheduler.no_estimate_texts();
        // What each pending job's last stored decision waits for, so its estimate says the same
        // as its explanation; the loop alone writes it, between publishes.
        let job_to_last_stored = self
            .job_to_last_stored
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for id in scheduler.pending() {
            let spec = scheduler.job(id);
            queue_to_counts
                .entry(spec.queue)
                .or_default()
                .add(spec, false);
            total.add(spec, false);
            by_queue.entry(spec.queue).or_default().push((
                spec.priority,
                spec.submit_s,
                spec.name.clone(),
            ));
            let mut view = view_of(id, spec, "pending");
            view.estimate = scheduler.start_estimate(id).map(|estimate| {
                let waiting_for = match job_to_last_stored.get(&spec.name) {
                    Some(last) => last.waiting_for.clone(),
                    None => gantry_contract::not_attempted_waiting_for(&view.queue),
                };
                gantry_contract::EstimateView::new(
                    estimate,
                    scheduler.clock_s(),
                    published_ms,
                    Some(&waiting_for)
                        .filter(|w| !w.is_empty())
                        .map(String::as_str),
                )
            });
            view.no_estimate = job_to_no_estimate.remove(&id);
            job_to_state.insert(spec.name.clone(), view);
        }
        drop(job_to_last_stored);
        for jobs in by_queue.values_mut() {
            jobs.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.total_cmp(&b.1)));
            for (i, (_, _, name)) in jobs.iter().enumerate() {
                if let Some(view) = job_to_state.get_mut(name) {
                    view.queue_position = Some(i as u32 + 1);
                }
            }
        }
        for id in scheduler.running() {
            let spec = scheduler.job(id);
            queue_to_counts
                .entry(spec.queue)
                .or_default()
                .add(spec, true);
            total.add(spec, true);
            for slot in scheduler.slots(id) {
                if spec.balloon && slot.shared_gpu.is_none() {
                    *node_to_balloon_gpus.entry(slot.node).or_default() += spec.shape.gpus;
                }
                let jobs = node_to_jobs.entry(slot.node).or_default();
                if jobs.last() != Some(&spec.name) {
                    jobs.push(spec.name.clone());
                }
            }
            job_to_state.insert(spec.name.clone(), view_of(id, spec, "running"));
        }
        let lent = lent_gpus(queues);
        let queue_views: Vec<QueueView> = queues
            .ids()
            .map(|id| {
                let def = queues.def(id);
                let counts = queue_to_counts.get(&id).copied().unwrap_or_default();
                QueueView {
                    name: def.name.clone(),
                    parent: def.parent.clone(),
                    nominal_gpus: queues.nominal(id),
                    used_gpus: queues.used(id).gpus,
                    borrowed_gpus: queues.borrowed(id),
                    lendable_gpus: queues.lendable(id),
                    lent_gpus: lent[id],
                    borrowing_limit_gpus: def.borrowing_limit_gpus,
                    lending_limit_gpus: def.lending_limit_gpus,
                    weight: def.weight,
                    fair_share: queues.fair_share(id),
                    fair_share_key: queues.fair_share_key(id),
                    pending_jobs: counts.pending,
                    running_jobs: counts.running,
                    balloon_pending_jobs: counts.balloon_pending,
                    balloon_running_jobs: counts.balloon_running,
                }
            })
            .collect();
        let sample_usage = queues
            .ids()
            .find(|&id| queues.children(id).is_empty())
            .map(|id| scheduler.usage(id));
        self.metrics.pending_pods.set(total.pending_pods as i64);
        let lifecycle = scheduler.lifecycle();
        let node_states = (0..scheduler.state.nodes.len())
            .map(|node| lifecycle.state(node))
            .collect();
        for (state, nodes) in gantry_core::NodeState::ALL.iter().zip(lifecycle.counts()) {
            self.metrics
                .nodes_by_state
                .with_label_values(&[state.name()])
                .set(i64::from(nodes));
        }
        self.metrics
            .breaker_tripped
            .set(i64::from(lifecycle.breaker.tripped.is_some()));
        self.refresh_health(scheduler);
        for (state, pods) in [
            ("pending", total.balloon_pods.pending),
            ("running", total.balloon_pods.running),
        ] {
            self.metrics
                .balloon_pods
                .with_label_values(&[state])
                .set(pods as i64);
        }
        let at_ms = now_ms();
        self.sample_history(&queue_views, at_ms);
        self.view.store(Arc::new(ClusterView {
            cluster: cluster.to_string(),
            at_ms,
            nodes: Arc::new(scheduler.state.nodes.clone()),
            queues: queue_views,
            job_to_state,
            node_to_jobs,
            node_to_balloon_gpus,
            sample_usage,
            pending_pods: total.pending_pods,
            running_pods: total.running_pods,
            balloon_pods: total.balloon_pods,
            node_states,
        }));
        self.ready.store(true, Ordering::Release);
    }
}
