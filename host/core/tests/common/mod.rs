//! Fixtures shared by the core's integration tests: a node table with `rack` and `block` levels
//! built the way the cluster specs in `shared/clusters/` lay nodes out (nodes numbered in pool
//! order, each pool filling its own domains in order, the last domain of a level possibly
//! partial), a queue tree, and a scheduler over both.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gantry_core::{
    Admission, BuiltinOnly, ClusterState, CycleOutput, Decision, Health, JobId, JobSpec,
    LevelColumn, Mode, NodeRow, NodeTable, Outcome, PodShape, QueueDef, Queues, Resources,
    Scheduler, SchedulerConfig, Symbols, TopologyPref,
};

/// Level 0 of every fixture table.
pub const RACK: usize = 0;
/// Level 1 of every fixture table.
pub const BLOCK: usize = 1;

/// One node pool, as a cluster spec declares it.
#[derive(Debug, Clone)]
pub struct Pool {
    pub name: &'static str,
    pub count: u32,
    pub gpus_per_node: u32,
    pub gpu_type: &'static str,
    pub cpu_milli: u32,
    pub memory_mib: u32,
    /// Nodes per rack.
    pub rack_size: u32,
    /// Racks per block; `None` when the pool has no block level.
    pub block_size: Option<u32>,
}

impl Pool {
    /// An H100 pool like `small-64.yaml`'s: 8 GPUs, 192 cores, ~2 TB per node.
    pub fn h100(count: u32, rack_size: u32, block_size: Option<u32>) -> Self {
        Self {
            name: "h100",
            count,
            gpus_per_node: 8,
            gpu_type: "H100-SXM5-80GB",
            cpu_milli: 192_000,
            memory_mib: 2_000_000,
            rack_size,
            block_size,
        }
    }

    /// An L4 pool like `small-64.yaml`'s: 4 GPUs, 48 cores, 192 GiB per node, racks only.
    pub fn l4(count: u32, rack_size: u32) -> Self {
        Self {
            name: "l4",
            count,
            gpus_per_node: 4,
            gpu_type: "L4",
            cpu_milli: 48_000,
            memory_mib: 196_608,
            rack_size,
            block_size: None,
        }
    }
}

/// Build the columnar table for `pools`, with levels `rack` (innermost) and `block`. Node names
/// are `{pool}-{index}`; every node starts healthy, untainted and wholly free.
pub fn node_table(symbols: &Symbols, pools: &[Pool]) -> NodeTable {
    let mut nodes = NodeTable {
        taint_sets: vec![Vec::new()],
        levels: ["rack", "block"]
            .iter()
            .map(|name| LevelColumn {
                name: symbols.intern(name),
                ..LevelColumn::default()
            })
            .collect(),
        ..NodeTable::default()
    };
    for pool in pools {
        let gpu_type = symbols.intern(pool.gpu_type);
        let count = u64::from(pool.count);
        // Per level: nodes per domain and the id of the pool's first domain.
        let rack_span = u64::from(pool.rack_size.max(1));
        let mut spans = vec![Some((rack_span, 0u32)), None];
        if let Some(block) = pool.block_size {
            spans[BLOCK] = Some((rack_span * u64::from(block.max(1)), 0));
        }
        for (level, span) in spans.iter_mut().enumerate() {
            let Some((span, first)) = span else { continue };
            let column = &mut nodes.levels[level];
            *first = column.domain_gpu_total.len() as u32;
            for domain in 0..count.div_ceil(*span) {
                let members = (*span).min(count - domain * *span);
                let gpus = (members * u64::from(pool.gpus_per_node)) as u32;
                column.domain_gpu_total.push(gpus);
                column.domain_gpu_free.push(gpus);
            }
        }
        for index in 0..count {
            nodes.push(NodeRow::new(
                symbols.intern(&format!("{}-{index}", pool.name)),
                pool.gpus_per_node,
                gpu_type,
                pool.cpu_milli,
                pool.memory_mib,
            ));
            for (column, span) in nodes.levels.iter_mut().zip(&spans) {
                column.node_domain.push(match span {
                    Some((span, first)) => first + (index / span) as u32,
                    None => u32::MAX,
                });
            }
        }
    }
    nodes
}

/// A queue declaration.
pub fn queue(name: &str, parent: Option<&str>, nominal_gpus: u64) -> QueueDef {
    QueueDef {
        name: name.into(),
        parent: parent.map(Into::into),
        nominal_gpus,
        weight: 1,
        borrowing_limit_gpus: None,
        lending_limit_gpus: None,
        reclaim: gantry_core::Reclaim::Never,
    }
}

/// The property tests' queue tree: research (a cohort of pretraining and rl, rl borrowing at
/// most 32), applied (lending at most 16) and safety (never borrowing): 256 GPUs of nominal
/// quota, for a cluster of 288 GPUs.
pub fn property_queue_tree() -> Vec<QueueDef> {
    let mut pretraining = queue("pretraining", Some("research"), 96);
    pretraining.weight = 2;
    let mut rl = queue("rl", Some("research"), 64);
    rl.borrowing_limit_gpus = Some(32);
    let mut applied = queue("applied", None, 64);
    applied.lending_limit_gpus = Some(16);
    let mut safety = queue("safety", None, 32);
    safety.borrowing_limit_gpus = Some(0);
    vec![queue("research", None, 0), pretraining, rl, applied, safety]
}

/// Whole-cluster totals of `nodes`, the denominator of fair shares.
pub fn capacity(nodes: &NodeTable) -> Resources {
    Resources {
        gpus: nodes.gpu_total.iter().map(|&g| u64::from(g)).sum(),
        cpu_milli: nodes.cpu_free_milli.iter().map(|&c| u64::from(c)).sum(),
        memory_mib: nodes.memory_free_mib.iter().map(|&m| u64::from(m)).sum(),
    }
}

/// A scheduler over `pools` and `queues`, plus what the tests need to check it independently.
pub struct Fixture {
    pub sched: Scheduler,
    pub symbols: Arc<Symbols>,
    /// The table as built, before any reservation: per-node totals.
    pub initial: NodeTable,
    pub queue_defs: Vec<QueueDef>,
    /// Virtual time of the next cycle.
    pub now_s: f64,
    /// Jobs finished through [`Fixture::finish`].
    pub finished: BTreeSet<JobId>,
    /// Jobs submitted through [`Fixture::submit`] (ids are dense from 0).
    pub submitted: JobId,
    /// The queue tree as it was before the last cycle, to replay its admissions.
    pub queues_before: Option<Queues>,
}

impl Fixture {
    pub fn new(pools: &[Pool], queue_defs: &[QueueDef]) -> Self {
        Self::with_config(pools, queue_defs, SchedulerConfig::default())
    }

    pub fn with_config(pools: &[Pool], queue_defs: &[QueueDef], config: SchedulerConfig) -> Self {
        let symbols = Symbols::new();
        let nodes = node_table(&symbols, pools);
        let queues = Queues::new(queue_defs, capacity(&nodes), 3600.0).expect("valid queue tree");
        let initial = nodes.clone();
        let mut sched = Scheduler::new(ClusterState::new(nodes), queues, symbols.clone(), config);
        // The invariants hold with reservations holding nodes, too.
        sched.set_plan_config(gantry_core::scheduler::plan::PlanConfig {
            enabled: true,
            reservations: true,
            ..Default::default()
        });
        Self {
            sched,
            symbols,
            initial,
            queue_defs: queue_defs.to_vec(),
            now_s: 0.0,
            finished: BTreeSet::new(),
            submitted: 0,
            queues_before: None,
        }
    }

    /// One queue, `default`, with `nominal_gpus`.
    pub fn single_queue(pools: &[Pool], nominal_gpus: u64) -> Self {
        Self::new(pools, &[queue("default", None, nominal_gpus)])
    }

    pub fn queue_id(&self, name: &str) -> usize {
        self.sched.queues.id(name).expect("declared queue")
    }

    pub fn node(&self, name: &str) -> usize {
        let sym = self.symbols.lookup(name).expect("known node name");
        self.sched
            .state
            .nodes
            .name
            .iter()
            .position(|&n| n == sym)
            .expect("node in table")
    }

    /// A job of `pods` pods with `gpus` whole GPUs each, and one core and 8 GiB per GPU (far
    /// below a node's share per GPU, so GPUs are what runs out).
    pub fn job(&self, name: &str, queue: &str, priority: i32, pods: u32, gpus: u32) -> JobSpec {
        JobSpec {
            name: name.into(),
            queue: self.queue_id(queue),
            priority,
            pods,
            shape: PodShape {
                name: self.symbols.intern(name),
                queue: self.symbols.intern(queue),
                priority,
                gpus,
                gpu_milli: 0,
                gpu_type: 0,
                cpu_milli: 1000 * gpus,
                memory_mib: 8192 * gpus,
                tolerations: Vec::new(),
                gang_size: pods,
                ..PodShape::default()
            },
            balloon: false,
            topology: TopologyPref::default(),
            submit_s: self.now_s,
            expected_runtime_s: None,
        }
    }

    /// A job of `pods` pods sharing GPUs, `milli` thousandths of a GPU each.
    pub fn fractional(
        &self,
        name: &str,
        queue: &str,
        priority: i32,
        pods: u32,
        milli: u32,
    ) -> JobSpec {
        let mut spec = self.job(name, queue, priority, pods, 0);
        spec.shape.gpu_milli = milli;
        spec.shape.cpu_milli = 500;
        spec.shape.memory_mib = 1024;
        spec
    }

    /// A balloon: a placeholder of `pods` × `gpus` that gives way to real work.
    pub fn balloon(&self, name: &str, queue: &str, priority: i32, pods: u32, gpus: u32) -> JobSpec {
        JobSpec {
            balloon: true,
            ..self.job(name, queue, priority, pods, gpus)
        }
    }

    pub fn submit(&mut self, spec: JobSpec) -> JobId {
        let id = self.sched.submit(spec);
        self.submitted = self.submitted.max(id + 1);
        id
    }

    /// Run one cycle with the built-ins only and advance the clock a minute.
    pub fn cycle(&mut self) -> CycleOutput {
        self.queues_before = Some(self.sched.queues.clone());
        let out = self.sched.cycle(self.now_s, &mut BuiltinOnly);
        self.now_s += 60.0;
        out
    }

    /// Run one cycle and panic if it breaks an invariant (see [`check_state`], [`check_cycle`]).
    pub fn checked_cycle(&mut self) -> CycleOutput {
        let out = self.cycle();
        if let Err(e) = check_cycle(self, &out).and_then(|()| check_state(self)) {
            panic!(
                "invariant broken after the cycle at {} s: {e}",
                self.now_s - 60.0
            );
        }
        out
    }

    /// A running job ends.
    pub fn finish(&mut self, id: JobId) {
        self.sched.finish(id);
        self.finished.insert(id);
    }

    /// The decision about `id` in `out`.
    pub fn decision<'a>(&self, out: &'a CycleOutput, id: JobId) -> &'a Decision {
        out.decisions
            .iter()
            .find(|d| d.job == id)
            .unwrap_or_else(|| panic!("no decision about job {id} in this cycle"))
    }

    /// `(node, pods)` of a running job, nodes ascending.
    pub fn placement(&self, id: JobId) -> BTreeMap<usize, u32> {
        let mut out = BTreeMap::new();
        for slot in self.sched.slots(id) {
            *out.entry(slot.node as usize).or_insert(0) += 1;
        }
        out
    }

    /// The domains at `level` that a running job's pods occupy.
    pub fn domains(&self, id: JobId, level: usize) -> BTreeSet<u32> {
        self.sched
            .slots(id)
            .iter()
            .map(|slot| self.sched.state.nodes.levels[level].node_domain[slot.node as usize])
            .collect()
    }
}

/// Whether a reservation's quota hold kept the job back, before any node was evaluated.
fn held_by_quota(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Pending { waiting_for }
        if waiting_for.starts_with("quota: held for the reservation of "))
}

/// What the running jobs hold on one node, recomputed from the scheduler's jobs and slots alone.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NodeUse {
    pub whole_gpus: u64,
    /// Milli-GPUs per shared GPU index.
    pub shared: BTreeMap<u16, u64>,
    pub cpu_milli: u64,
    pub memory_mib: u64,
}

/// Per node, what the jobs hold, from `Scheduler::running()`, `pending()`, `slots()` and
/// `job()`: running jobs, and pending jobs that hold nodes (a gang gathering its nodes).
pub fn node_use(sched: &Scheduler) -> Vec<NodeUse> {
    let mut out = vec![NodeUse::default(); sched.state.len()];
    let holding = sched.pending().into_iter();
    for id in sched.running().chain(holding) {
        let shape = &sched.job(id).shape;
        for slot in sched.slots(id) {
            let node = &mut out[slot.node as usize];
            match slot.shared_gpu {
                Some(gpu) => *node.shared.entry(gpu).or_insert(0) += u64::from(shape.gpu_milli),
                None => node.whole_gpus += u64::from(shape.gpus),
            }
            node.cpu_milli += u64::from(shape.cpu_milli);
            node.memory_mib += u64::from(shape.memory_mib);
        }
    }
    out
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// Invariants of the scheduler between cycles, each recomputed independently of the core's own
/// bookkeeping (jobs, slots and the fixture's initial table only):
/// - the cluster state passes its own audit;
/// - no node is over-committed: per shared GPU at most 1000 milli; whole GPUs plus shared GPUs
///   within the node's total; CPU and memory within its totals; and the free columns agree;
/// - no pod sits on a node that is not Healthy, or on a GPU type it did not ask for;
/// - gangs are all or nothing: a running job has exactly `pods` slots, a pending one none (the
///   baseline modes' partly placed gangs excepted), and every job is running, pending or
///   finished;
/// - a required topology level holds all of a gang's pods in one domain;
/// - `running_gpus()` is what the running jobs hold;
/// - queue usage equals what the jobs charged to it hold (running jobs other than balloons;
///   under `kueue` also admitted workloads whose pods still wait), and a queue never uses more
///   than its nominal quota plus its declared borrowing limit.
pub fn check_state(fx: &Fixture) -> Result<(), String> {
    let sched = &fx.sched;
    let state = &sched.state;
    let total = &fx.initial;
    state.audit().map_err(|e| format!("audit: {e}"))?;

    // Resources, node by node.
    for (node, used) in node_use(sched).iter().enumerate() {
        let name = sched.node_name(node);
        for (&gpu, &milli) in &used.shared {
            ensure!(
                u32::from(gpu) < total.gpu_total[node],
                "node {name}: a pod shares GPU {gpu}, which the node does not have"
            );
            ensure!(
                milli <= 1000,
                "node {name}: the pods sharing GPU {gpu} hold {milli}/1000 of it"
            );
        }
        let gpus_held = used.whole_gpus + used.shared.len() as u64;
        let gpu_total = u64::from(total.gpu_total[node]);
        ensure!(
            gpus_held <= gpu_total,
            "node {name}: {} whole GPUs and {} shared GPUs held, of {gpu_total}",
            used.whole_gpus,
            used.shared.len()
        );
        ensure!(
            u64::from(state.nodes.gpu_free[node]) == gpu_total - gpus_held,
            "node {name}: gpu_free says {} but the running jobs leave {}",
            state.nodes.gpu_free[node],
            gpu_total - gpus_held
        );
        let cpu_total = u64::from(total.cpu_free_milli[node]);
        ensure!(
            used.cpu_milli <= cpu_total,
            "node {name}: {} of {cpu_total} milli-CPU held",
            used.cpu_milli
        );
        ensure!(
            u64::from(state.nodes.cpu_free_milli[node]) == cpu_total - used.cpu_milli,
            "node {name}: cpu_free_milli disagrees with the running jobs"
        );
        let memory_total = u64::from(total.memory_free_mib[node]);
        ensure!(
            used.memory_mib <= memory_total,
            "node {name}: {} of {memory_total} MiB held",
            used.memory_mib
        );
        ensure!(
            u64::from(state.nodes.memory_free_mib[node]) == memory_total - used.memory_mib,
            "node {name}: memory_free_mib disagrees with the running jobs"
        );
    }

    // Jobs: all or nothing, where they may run.
    let running: BTreeSet<JobId> = sched.running().collect();
    let pending: Vec<JobId> = sched.pending().to_vec();
    let pending_set: BTreeSet<JobId> = pending.iter().copied().collect();
    ensure!(
        pending_set.len() == pending.len(),
        "a job is pending twice: {pending:?}"
    );
    for &id in &pending {
        let spec = sched.job(id);
        ensure!(
            !running.contains(&id),
            "job {id} is both pending and running"
        );
        if sched.config.mode == Mode::Gantry {
            ensure!(
                sched.slots(id).is_empty(),
                "pending job {} holds {} slots",
                spec.name,
                sched.slots(id).len()
            );
        } else {
            // The baselines' gangs hold some pods' nodes while they wait, never all of them.
            ensure!(
                sched.slots(id).len() < spec.pods as usize,
                "pending job {} holds all of its {} pods",
                spec.name,
                spec.pods
            );
        }
    }
    for &id in &running {
        let spec = sched.job(id);
        let slots = sched.slots(id);
        ensure!(
            slots.len() == spec.pods as usize,
            "job {} runs {} of its {} pods",
            spec.name,
            slots.len(),
            spec.pods
        );
        ensure!(
            !fx.finished.contains(&id),
            "finished job {} is running",
            spec.name
        );
        for slot in slots {
            let node = slot.node as usize;
            ensure!(
                total.health[node] == Health::Healthy as u8,
                "job {} has a pod on node {}, which was never healthy",
                spec.name,
                sched.node_name(node)
            );
            ensure!(
                spec.shape.gpu_type == 0 || spec.shape.gpu_type == total.gpu_type[node],
                "job {} has a pod on node {} of the wrong GPU type",
                spec.name,
                sched.node_name(node)
            );
            ensure!(
                (spec.shape.gpu_milli > 0) == slot.shared_gpu.is_some(),
                "job {}: slot {slot:?} does not match its shape",
                spec.name
            );
        }
        if let (Some(level), true) = (spec.topology.level, spec.topology.required)
            && spec.pods > 1
        {
            let domains = fx.domains(id, level);
            ensure!(
                domains.len() == 1 && !domains.contains(&u32::MAX),
                "job {} requires one domain of level {level} but spans {domains:?}",
                spec.name
            );
        }
    }
    for id in 0..fx.submitted {
        if !running.contains(&id) && !fx.finished.contains(&id) {
            ensure!(
                pending_set.contains(&id),
                "job {} is neither running, pending nor finished",
                sched.job(id).name
            );
        }
    }

    // What runs.
    let running_gpus: u64 = running.iter().map(|&id| sched.job(id).total().gpus).sum();
    ensure!(
        sched.running_gpus() == running_gpus,
        "running_gpus() says {} but the running jobs hold {running_gpus}",
        sched.running_gpus()
    );

    // Quota.
    let queues = &sched.queues;
    let mut used = vec![0u64; queues.len()];
    for &id in running.iter().chain(&pending) {
        let spec = sched.job(id);
        let charged = sched.charged(id);
        if running.contains(&id) {
            ensure!(
                charged != spec.balloon,
                "running job {} (balloon: {}) is charged: {charged}",
                spec.name,
                spec.balloon
            );
        } else if sched.config.mode == Mode::Kueue {
            // Kueue gates an unadmitted workload's pods: one holding a node was admitted.
            ensure!(
                charged || spec.balloon || sched.slots(id).is_empty(),
                "pending job {} holds {} nodes but was never admitted",
                spec.name,
                sched.slots(id).len()
            );
        } else {
            ensure!(!charged, "pending job {} is charged", spec.name);
        }
        if sched.charged(id) {
            let mut at = Some(spec.queue);
            while let Some(q) = at {
                used[q] += spec.total().gpus;
                at = queues.parent(q);
            }
        }
    }
    for q in queues.ids() {
        let name = queues.name(q);
        ensure!(
            queues.used(q).gpus == used[q],
            "queue {name}: the tree counts {} GPUs used, the jobs charged to it hold {}",
            queues.used(q).gpus,
            used[q]
        );
        if let Some(limit) = queues.def(q).borrowing_limit_gpus {
            let nominal = queues.nominal(q);
            ensure!(
                used[q] <= nominal + limit,
                "queue {name} uses {} GPUs, over its nominal {nominal} plus borrowing limit {limit}",
                used[q]
            );
        }
    }
    Ok(())
}

/// Invariants of one cycle's output:
/// - borrowing between top-level queues stays within what they lend ([`check_root_borrowing`]);
/// - every evicted job was listed in `preempted` by exactly one decision of the cycle, that
///   decision placed its job, and the victim's priority is at most the preemptor's;
/// - every job listed in `preempted` was evicted, and is no longer running;
/// - balloons never preempt;
/// - an explanation accounts for every node it evaluated, and a job waiting for room was
///   evaluated against every node;
/// - a placed decision's nodes are where its job now runs (unless it was evicted later in the
///   same cycle), and an unplaced job does not run.
pub fn check_cycle(fx: &Fixture, out: &CycleOutput) -> Result<(), String> {
    check_root_borrowing(fx, out)?;
    let sched = &fx.sched;
    let evicted: BTreeSet<JobId> = out.evicted.iter().copied().collect();
    ensure!(
        evicted.len() == out.evicted.len(),
        "a job was evicted twice in one cycle: {:?}",
        out.evicted
    );
    for &victim in &out.evicted {
        ensure!(
            !out.decisions.iter().any(|d| d.job == victim && d.placed),
            "job {} was placed and evicted in the same cycle",
            sched.job(victim).name
        );
        let v = sched.job(victim);
        let preemptors: Vec<&Decision> = out
            .decisions
            .iter()
            .filter(|d| d.explanation.preempted.contains(&v.name))
            .collect();
        ensure!(
            preemptors.len() == 1,
            "evicted job {} is listed by {} decisions",
            v.name,
            preemptors.len()
        );
        let by = preemptors[0];
        let p = sched.job(by.job);
        ensure!(
            v.priority <= p.priority,
            "job {} (priority {}) was evicted for job {} of lower priority {}",
            v.name,
            v.priority,
            p.name,
            p.priority
        );
        ensure!(
            by.placed,
            "job {} was evicted for job {}, which was not placed",
            v.name,
            p.name
        );
        ensure!(
            !sched.is_running(victim),
            "evicted job {} is still running",
            v.name
        );
    }
    // Should a job ever be decided twice in one cycle, its last decision says where it stands.
    let mut last: BTreeMap<JobId, usize> = BTreeMap::new();
    for (index, d) in out.decisions.iter().enumerate() {
        last.insert(d.job, index);
    }
    for (index, d) in out.decisions.iter().enumerate() {
        let spec = sched.job(d.job);
        let is_last = last[&d.job] == index;
        if spec.balloon {
            ensure!(
                d.explanation.preempted.is_empty(),
                "balloon {} preempted {:?}",
                spec.name,
                d.explanation.preempted
            );
        }
        for name in &d.explanation.preempted {
            ensure!(
                out.evicted.iter().any(|&v| &sched.job(v).name == name),
                "{} lists {name} as preempted, but it was not evicted",
                spec.name
            );
        }
        ensure!(
            d.placed == matches!(d.explanation.outcome, Outcome::Placed { .. }),
            "decision about {}: placed = {} but outcome {:?}",
            spec.name,
            d.placed,
            d.explanation.outcome
        );
        // The explanation accounts for every node it looked at: each evaluated node either
        // fits or is counted under one rejection reason; a job left pending for want of room
        // was evaluated against the whole cluster.
        let e = &d.explanation;
        ensure!(
            e.nodes_feasible <= e.nodes_evaluated && e.nodes_evaluated <= e.nodes_total,
            "job {}: {} feasible of {} evaluated of {} nodes",
            spec.name,
            e.nodes_feasible,
            e.nodes_evaluated,
            e.nodes_total
        );
        if e.nodes_evaluated > 0 {
            let rejected: u32 = e
                .filters
                .iter()
                .flat_map(|f| f.rejected.iter().map(|(_, n)| n))
                .sum();
            ensure!(
                rejected + e.nodes_feasible == e.nodes_evaluated,
                "job {}: {rejected} nodes rejected and {} feasible, but {} evaluated",
                spec.name,
                e.nodes_feasible,
                e.nodes_evaluated
            );
        }
        // A job that counting free GPUs shows cannot fit is not evaluated; its text says how
        // many of its pods fit, which must be fewer than it has.
        let counted_out = match &e.outcome {
            Outcome::Pending { waiting_for } if e.nodes_evaluated == 0 => waiting_for
                .split_once(" GPU(s) to free up (")
                .and_then(|(_, rest)| rest.split_once(" such pods fit"))
                .map(|(fit, _)| fit.parse::<u64>().map_err(|e| e.to_string())),
            _ => None,
        };
        if let Some(fit) = counted_out {
            let fit = fit?;
            ensure!(
                fit < u64::from(spec.pods),
                "job {} was not evaluated, though {fit} of its {} pods fit in the free GPUs",
                spec.name,
                spec.pods
            );
        } else if !d.placed
            && !matches!(e.quota.builtin, Admission::Denied { .. })
            && !held_by_quota(&e.outcome)
        {
            ensure!(
                e.nodes_evaluated == e.nodes_total,
                "job {} waits for room, but only {} of {} nodes were evaluated",
                spec.name,
                e.nodes_evaluated,
                e.nodes_total
            );
        }
        if !is_last {
            continue;
        }
        if !d.placed {
            ensure!(
                !sched.is_running(d.job),
                "job {} was not placed but runs",
                spec.name
            );
        } else if !evicted.contains(&d.job) {
            let Outcome::Placed { nodes } = &d.explanation.outcome else {
                unreachable!()
            };
            let mut said: BTreeMap<String, u32> = BTreeMap::new();
            for (node, pods) in nodes {
                *said.entry(node.clone()).or_default() += pods;
            }
            let actual: BTreeMap<String, u32> = fx
                .placement(d.job)
                .into_iter()
                .map(|(node, pods)| (sched.node_name(node), pods))
                .collect();
            ensure!(
                said == actual,
                "job {}: the explanation says {said:?} but it runs on {actual:?}",
                spec.name
            );
        }
    }
    Ok(())
}

/// Replays the cycle's admissions in decision order, from the queue usage before the cycle: when
/// a top-level queue is admitted borrowing (the decision records its whole borrowing after the
/// job), that borrowing must fit in what the other top-level queues lend (their idle nominal
/// quota, within their lending limits) less what they borrow themselves. A queue may not borrow
/// the same idle GPUs twice.
pub fn check_root_borrowing(fx: &Fixture, out: &CycleOutput) -> Result<(), String> {
    let sched = &fx.sched;
    let Some(mut queues) = fx.queues_before.clone() else {
        return Ok(());
    };
    let roots: Vec<usize> = queues
        .ids()
        .filter(|&q| queues.parent(q).is_none())
        .collect();
    let evicted: BTreeMap<&str, JobId> = out
        .evicted
        .iter()
        .map(|&id| (sched.job(id).name.as_str(), id))
        .collect();
    for d in &out.decisions {
        let spec = sched.job(d.job);
        if let Admission::Borrowing { gpus } = d.explanation.quota.builtin
            && queues.parent(spec.queue).is_none()
        {
            let others = roots.iter().filter(|&&r| r != spec.queue);
            let idle: u64 = others.clone().map(|&r| queues.lendable(r)).sum();
            let taken: u64 = others.map(|&r| queues.borrowed(r)).sum();
            let lent = idle.saturating_sub(taken);
            ensure!(
                gpus <= lent,
                "job {} was admitted with queue {} borrowing {gpus} GPUs in all, but the other \
                 queues lend only {lent} ({idle} idle less {taken} they borrow themselves)",
                spec.name,
                queues.name(spec.queue)
            );
        }
        for victim in &d.explanation.preempted {
            if let Some(&id) = evicted.get(victim.as_str()) {
                let v = sched.job(id);
                if !v.balloon {
                    queues.charge(v.queue, v.total(), false);
                }
            }
        }
        if d.placed && !spec.balloon {
            queues.charge(spec.queue, spec.total(), true);
        }
    }
    Ok(())
}
