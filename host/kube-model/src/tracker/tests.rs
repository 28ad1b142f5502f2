use super::*;
use crate::fixtures::{build, key, label_map, node, pod};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use gantry_core::{JobId, QueueDef, Scheduler};
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::config::KubeConfig;
use crate::mapping::{GroupPolicy, PendingPod, is_balloon};
use crate::queues::DeclaredQueue;
use crate::tenancy::Labels;
use gantry_core::{BuiltinOnly, Health};
use k8s_openapi::api::core::v1::Taint as KTaint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// `pod` with a PriorityClass.
fn with_class(pod: Arc<Pod>, class: &str) -> Arc<Pod> {
    let mut pod = (*pod).clone();
    pod.spec.as_mut().unwrap().priority_class_name = Some(class.into());
    Arc::new(pod)
}

/// `(name, pods)` of every job, by id.
fn jobs(s: &Scheduler) -> Vec<(String, u32)> {
    let mut ids: Vec<JobId> = s.pending().into_iter().chain(s.running()).collect();
    ids.sort_unstable();
    ids.into_iter()
        .map(|id| (s.job(id).name.clone(), s.job(id).pods))
        .collect()
}

/// What the binder reports after binding every pod of `job` to node 0.
fn bind_on_first_node(tracker: &mut Tracker, job: JobId) {
    let pods: Vec<(PendingPod, usize)> = tracker.pods_of(job).into_iter().map(|p| (p, 0)).collect();
    tracker.bound(job, &pods);
}

/// Each waiting pod's key and why it waits.
fn waiting_by_key(tracker: &Tracker) -> Vec<(String, String)> {
    tracker
        .waiting()
        .into_iter()
        .map(|(p, why)| (p.key(), why))
        .collect()
}

fn cycle(s: &mut Scheduler) -> gantry_core::CycleOutput {
    s.cycle(0.0, &mut BuiltinOnly)
}

#[test]
fn nodes_map_gpus_topology_health_and_taints() {
    let mut tainted = (*node("c", 4, &[], true)).clone();
    tainted.spec.as_mut().unwrap().taints = Some(vec![KTaint {
        key: "team".into(),
        value: Some("rl".into()),
        effect: "NoSchedule".into(),
        ..KTaint::default()
    }]);
    let nodes = [
        node(
            "b",
            8,
            &[
                ("topology.gantry.dev/rack", "r2"),
                ("nvidia.com/gpu.product", "H100"),
            ],
            true,
        ),
        node("a", 8, &[("topology.gantry.dev/rack", "r1")], false),
        Arc::new(tainted),
    ];
    let (tracker, s) = build(&nodes, &[], &[], &[], &[]);
    let t = &s.state.nodes;
    assert_eq!(tracker.node_names(), ["a", "b", "c"]);
    assert_eq!(t.gpu_total, [8, 8, 4]);
    assert_eq!(t.cpu_free_milli, [64_000; 3]);
    assert_eq!(t.memory_free_mib, [512 * 1024; 3]);
    assert_eq!(t.health(0), Health::NotReady);
    assert_eq!(t.health(1), Health::Healthy);
    assert_eq!(t.levels.len(), 1, "only the rack level is labelled");
    assert_eq!(t.levels[0].node_domain, [0, 1, u32::MAX]);
    assert_eq!(t.taints(2).len(), 1);
    assert!(t.taints(0).is_empty());
    assert_eq!(&*s.symbols().resolve(t.gpu_type[1]), "H100");
}

#[test]
fn a_pending_pod_is_decided_again_when_its_template_claim_reaches_its_status() {
    let nodes = [node("a", 8, &[], true)];
    let waiting = pod("p", 1, &[], None);
    let (mut tracker, mut s) = build(&nodes, &[], &[], &[], &[]);
    let key: PodKey = ("default".into(), "p".into());
    tracker.pod_changed(&mut s, key.clone(), Some(&waiting), None);
    tracker.dirty_pending.clear();
    // Our own PodScheduled condition changes nothing we decide on.
    let mut noted = (*waiting).clone();
    noted.status.get_or_insert_with(Default::default).conditions =
        Some(vec![k8s_openapi::api::core::v1::PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            ..Default::default()
        }]);
    let noted = Arc::new(noted);
    tracker.pod_changed(&mut s, key.clone(), Some(&noted), None);
    assert!(!tracker.pending_is_dirty(&key));
    let mut claimed = (*noted).clone();
    claimed
        .status
        .get_or_insert_with(Default::default)
        .resource_claim_statuses = Some(vec![k8s_openapi::api::core::v1::PodResourceClaimStatus {
        name: "gpus".into(),
        resource_claim_name: Some("p-gpus".into()),
    }]);
    tracker.pod_changed(&mut s, key.clone(), Some(&Arc::new(claimed)), None);
    assert!(
        tracker.pending_is_dirty(&key),
        "the claim's name must be read again"
    );
}

#[test]
fn a_health_change_updates_one_node_and_anything_else_asks_for_a_rebuild() {
    let nodes = [node("a", 8, &[], true), node("b", 8, &[], true)];
    let (mut tracker, mut s) = build(&nodes, &[], &[], &[], &[]);
    let sick = node("a", 8, &[], false);
    assert!(!tracker.node_changed(&mut s, "a", Some(&sick)));
    assert_eq!(s.state.nodes.health(0), Health::NotReady);
    assert!(!tracker.node_changed(&mut s, "a", Some(&sick)), "no change");
    let bigger = node("b", 16, &[], true);
    assert!(tracker.node_changed(&mut s, "b", Some(&bigger)));
    assert!(tracker.node_changed(&mut s, "c", Some(&node("c", 8, &[], true))));
    assert!(tracker.node_changed(&mut s, "b", None));
}

#[test]
fn bound_pods_use_capacity_and_queues() {
    let nodes = [node("a", 8, &[], true)];
    let mut foreign = (*pod("x", 6, &[("gantry.dev/queue", "team-a")], Some("a"))).clone();
    foreign.spec.as_mut().unwrap().scheduler_name = Some("default-scheduler".into());
    let (_, s) = build(&nodes, &[Arc::new(foreign)], &[], &[], &[]);
    assert_eq!(s.state.nodes.gpu_free, [2]);
    let ours = [pod("y", 6, &[("gantry.dev/queue", "team-a")], Some("a"))];
    let (_, s) = build(&nodes, &ours, &[], &[], &[]);
    assert_eq!(s.state.nodes.gpu_free, [2]);
    assert_eq!(s.queues.used(s.queues.id("team-a").unwrap()).gpus, 6);
}

#[test]
fn gangs_from_pod_groups_and_labels_become_one_job() {
    let nodes = [node("a", 8, &[], true)];
    let pg = [("scheduling.x-k8s.io/pod-group", "pg")];
    let own = [("gantry.dev/gang", "g"), ("gantry.dev/gang-size", "2")];
    let pending = [
        pod("p0", 1, &pg, None),
        pod("p1", 2, &pg, None),
        pod("g0", 1, &own, None),
        pod("g1", 1, &own, None),
        pod(
            "single",
            1,
            &[("kueue.x-k8s.io/queue-name", "team-b")],
            None,
        ),
    ];
    let (tracker, s) = build(&nodes, &[], &pending, &[("pg", 2)], &[]);
    let mut names = jobs(&s);
    names.sort();
    assert_eq!(
        names,
        [
            ("ns/g".into(), 2),
            ("ns/pg".into(), 2),
            ("ns/single".into(), 1)
        ]
    );
    let id = |name: &str| {
        s.pending()
            .into_iter()
            .find(|&id| s.job(id).name == name)
            .unwrap()
    };
    assert_eq!(
        s.job(id("ns/pg")).shape.gpus,
        2,
        "a gang's shape is its largest ask"
    );
    assert_eq!(s.queues.name(s.job(id("ns/single")).queue), "team-b");
    assert_eq!(s.queues.name(s.job(id("ns/g")).queue), "default");
    assert!(tracker.waiting().is_empty());
}

/// `pod` naming an upstream PodGroup in `spec.schedulingGroup`.
fn in_group(pod: Arc<Pod>, group: &str) -> Arc<Pod> {
    let mut pod = (*pod).clone();
    pod.spec.as_mut().unwrap().scheduling_group =
        Some(k8s_openapi::api::core::v1::PodSchedulingGroup {
            pod_group_name: Some(group.into()),
        });
    Arc::new(pod)
}

#[test]
fn upstream_pod_groups_make_gangs_by_min_count_and_basic_ones_single_jobs() {
    let nodes = [node("a", 8, &[], true), node("b", 8, &[], true)];
    let pending = [
        in_group(pod("w0", 1, &[], None), "train"),
        in_group(pod("w1", 1, &[], None), "train"),
        in_group(pod("w2", 1, &[], None), "big"),
        in_group(pod("s0", 1, &[], None), "serve"),
        in_group(pod("s1", 1, &[], None), "serve"),
        in_group(pod("t0", 1, &[], None), "topo"),
    ];
    // The pods come before their PodGroups: they wait, naming what they wait for.
    let (mut tracker, mut s) = build(&nodes, &[], &pending, &[], &[]);
    assert!(jobs(&s).is_empty());
    let mut reasons: Vec<String> = tracker.waiting().into_iter().map(|(_, r)| r).collect();
    reasons.sort();
    reasons.dedup();
    assert_eq!(
        reasons,
        [
            "pod group ns/big not found (scheduling.k8s.io PodGroup named by spec.schedulingGroup.podGroupName)",
            "pod group ns/serve not found (scheduling.k8s.io PodGroup named by spec.schedulingGroup.podGroupName)",
            "pod group ns/topo not found (scheduling.k8s.io PodGroup named by spec.schedulingGroup.podGroupName)",
            "pod group ns/train not found (scheduling.k8s.io PodGroup named by spec.schedulingGroup.podGroupName)",
        ]
    );
    let refused = "pod group ns/topo: spec.schedulingConstraints.topology is not supported";
    tracker.workload_groups_changed(
        [
            (key("train"), GroupPolicy::Gang(2)),
            (key("big"), GroupPolicy::Gang(4)),
            (key("serve"), GroupPolicy::Basic),
            (key("topo"), GroupPolicy::Refused(refused.into())),
        ]
        .into(),
    );
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    let mut names = jobs(&s);
    names.sort();
    assert_eq!(
        names,
        [
            ("ns/s0".into(), 1),
            ("ns/s1".into(), 1),
            ("ns/train".into(), 2)
        ],
        "a gang of minCount 2, and a basic group's pods each on their own"
    );
    let mut reasons: Vec<String> = tracker.waiting().into_iter().map(|(_, r)| r).collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            "gang ns/big has 1 of its 4 pods (0 bound, 1 pending)",
            refused
        ],
        "a group asking what Gantry does not honour waits, saying so"
    );
    assert_eq!(tracker.workload_group_of(&key("w0")), Some(key("train")));
    assert_eq!(
        tracker.workload_group_of(&key("s0")),
        None,
        "basic: no gang"
    );
}

#[test]
fn incomplete_gangs_wait_with_a_reason() {
    let nodes = [node("a", 8, &[], true)];
    let pending = [
        pod("p0", 1, &[("scheduling.x-k8s.io/pod-group", "pg")], None),
        pod(
            "q0",
            1,
            &[("scheduling.x-k8s.io/pod-group", "missing")],
            None,
        ),
        pod("g0", 1, &[("gantry.dev/gang", "g")], None),
    ];
    let (tracker, s) = build(&nodes, &[], &pending, &[("pg", 3)], &[]);
    assert!(jobs(&s).is_empty());
    let mut reasons: Vec<String> = tracker.waiting().into_iter().map(|(_, r)| r).collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            "gang ns/g: label gantry.dev/gang-size must be a positive number of pods, found none",
            "gang ns/pg has 1 of its 3 pods (0 bound, 1 pending)",
            "pod group ns/missing not found (scheduling.x-k8s.io PodGroup named by label scheduling.x-k8s.io/pod-group)",
        ]
    );
}

#[test]
fn bound_members_count_toward_min_member() {
    let nodes = [node("a", 8, &[], true)];
    let pg = [("scheduling.x-k8s.io/pod-group", "pg")];
    let bound = [pod("p0", 1, &pg, Some("a"))];
    let pending = [pod("p1", 1, &pg, None)];
    let (_, s) = build(&nodes, &bound, &pending, &[("pg", 2)], &[]);
    assert_eq!(s.running().count(), 1, "the bound member is a running job");
    assert_eq!(
        s.pending_count(),
        1,
        "and the pending one completes the gang"
    );
}

#[test]
fn bound_balloons_and_our_pods_are_preemptable_jobs() {
    let nodes = [node("a", 8, &[], true), node("b", 8, &[], true)];
    let mut balloon = (*with_class(
        pod("balloon", 8, &[("gantry.dev/balloon", "true")], Some("a")),
        "gantry-balloon",
    ))
    .clone();
    balloon.spec.as_mut().unwrap().scheduler_name = Some("default-scheduler".into());
    let mut foreign = (*pod("foreign", 4, &[], Some("b"))).clone();
    foreign.spec.as_mut().unwrap().scheduler_name = Some("default-scheduler".into());
    let mut leaving = (*pod("leaving", 4, &[], Some("b"))).clone();
    leaving.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    );
    let bound = [Arc::new(balloon), Arc::new(foreign), Arc::new(leaving)];
    let mut urgent = (*pod("urgent", 8, &[], None)).clone();
    urgent.spec.as_mut().unwrap().priority = Some(1000);
    let (_, mut s) = build(&nodes, &bound, &[Arc::new(urgent)], &[], &[]);
    let running: Vec<JobId> = s.running().collect();
    assert_eq!(
        running.len(),
        1,
        "only the balloon: the others are foreign or leaving"
    );
    assert!(s.job(running[0]).balloon);
    assert_eq!(s.state.nodes.gpu_free, [0, 0]);
    let output = cycle(&mut s);
    assert_eq!(output.evicted, running);
    assert!(output.decisions[0].placed);
    assert_eq!(output.decisions[0].explanation.preempted, ["ns/balloon"]);
}

#[test]
fn a_preemptor_keeps_its_room_while_victims_leave_then_is_placed_again() {
    let nodes = [node("a", 8, &[], true)];
    let bound = [with_class(
        pod("victim", 8, &[("gantry.dev/balloon", "true")], Some("a")),
        "gantry-balloon",
    )];
    let mut urgent = (*pod("urgent", 8, &[], None)).clone();
    urgent.spec.as_mut().unwrap().priority = Some(1000);
    let (mut tracker, mut s) = build(&nodes, &bound, &[Arc::new(urgent)], &[], &[]);
    let output = cycle(&mut s);
    let preemptor = output.decisions[0].job;
    assert_eq!(tracker.running_pods(output.evicted[0]).len(), 1);
    tracker.nominate(preemptor, [key("victim")].into());
    // The next sync: the victim leaves the scheduler, its pod holds only what is left
    // (nothing: the preemptor sits in its room), and nothing else fits.
    tracker.evicted(&mut s, &output.evicted);
    tracker.pod_changed(&mut s, key("q"), Some(&pod("q", 8, &[], None)), None);
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert!(s.is_running(preemptor), "nominated: placed on its nodes");
    assert_eq!(s.state.nodes.gpu_free, [0]);
    assert_eq!(s.running().count(), 1);
    assert!(cycle(&mut s).decisions.iter().all(|d| !d.placed));
    // The victim is gone: the preemptor goes back to be placed by the next cycle.
    tracker.pod_changed(&mut s, key("victim"), None, None);
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert!(!s.is_running(preemptor));
    assert!(tracker.nominated().is_empty());
    let output = cycle(&mut s);
    assert!(
        output
            .decisions
            .iter()
            .any(|d| d.job == preemptor && d.placed)
    );
}

#[test]
fn declared_queues_bound_what_their_pods_use() {
    let nodes = [node("a", 8, &[], true)];
    let bound = [pod("x", 2, &[("gantry.dev/queue", "small")], Some("a"))];
    let pending = [pod("y", 1, &[("gantry.dev/queue", "small")], None)];
    let small = QueueDef {
        name: "small".into(),
        parent: None,
        nominal_gpus: 2,
        weight: 1,
        borrowing_limit_gpus: Some(0),
        lending_limit_gpus: None,
        reclaim: gantry_core::Reclaim::Never,
    };
    let (_, mut s) = build(&nodes, &bound, &pending, &[], &[small]);
    let output = cycle(&mut s);
    let decision = output.decisions.last().unwrap();
    assert!(!decision.placed);
    assert_eq!(
        decision.explanation.summary(),
        "Waiting for quota: queue small would borrow 1 GPU, over its borrowing limit of 0."
    );
}

#[test]
fn a_pod_the_bound_cache_holds_is_not_pending_even_if_the_unbound_cache_still_lists_it() {
    let nodes = [node("n0", 8, &[], true), node("n1", 8, &[], true)];
    let unbound = pod("p", 2, &[], None);
    let bound = pod("p", 2, &[], Some("n0"));
    let (mut tracker, mut s) = build(&nodes, &[], std::slice::from_ref(&unbound), &[], &[]);
    assert_eq!(s.pending_count(), 1);
    tracker.pod_changed(&mut s, key("p"), Some(&unbound), Some(&bound));
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert_eq!(s.pending_count(), 0);
    assert_eq!(s.running().count(), 1);
    assert_eq!(s.state.nodes.gpu_free, [6, 8]);
}

#[test]
fn pods_coming_and_going_submit_withdraw_and_finish_jobs() {
    let nodes = [node("a", 8, &[], true)];
    let (mut tracker, mut s) = build(&nodes, &[], &[], &[], &[]);
    let p = pod("p", 8, &[], None);
    tracker.pod_changed(&mut s, key("p"), Some(&p), None);
    let changes = tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert_eq!((changes.submitted, s.pending_count()), (1, 1));
    // An update that changes nothing the scheduler reads leaves the job alone.
    let id = s.pending()[0];
    tracker.pod_changed(&mut s, key("p"), Some(&p), None);
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert_eq!(s.pending(), [id]);
    // Deleted before it was placed: withdrawn.
    tracker.pod_changed(&mut s, key("p"), None, None);
    let changes = tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert_eq!((changes.ended, s.pending_count()), (1, 0));
    // Placed, bound, confirmed, then finished.
    tracker.pod_changed(&mut s, key("p"), Some(&p), None);
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    let output = cycle(&mut s);
    let job = output.decisions[0].job;
    bind_on_first_node(&mut tracker, job);
    let on_a = pod("p", 8, &[], Some("a"));
    tracker.pod_changed(&mut s, key("p"), None, Some(&on_a));
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert_eq!(
        s.running().collect::<Vec<_>>(),
        [job],
        "the same job, confirmed"
    );
    assert_eq!(s.state.nodes.gpu_free, [0]);
    tracker.pod_changed(&mut s, key("p"), None, None);
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert_eq!(s.running().count(), 0);
    assert_eq!(s.state.nodes.gpu_free, [8]);
}

#[test]
fn a_gang_member_leaving_leaves_the_rest_running_as_one_job() {
    let nodes = [node("a", 8, &[], true)];
    let own = [("gantry.dev/gang", "g"), ("gantry.dev/gang-size", "2")];
    let bound = [pod("g0", 2, &own, Some("a")), pod("g1", 2, &own, Some("a"))];
    let (mut tracker, mut s) = build(&nodes, &bound, &[], &[], &[]);
    assert_eq!(jobs(&s), [("ns/g".into(), 2)]);
    tracker.pod_changed(&mut s, key("g1"), None, None);
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert_eq!(jobs(&s), [("ns/g".into(), 1)]);
    assert_eq!(s.state.nodes.gpu_free, [6]);
}

#[test]
fn a_new_queue_or_a_changed_quota_keeps_what_runs_charged() {
    let nodes = [node("a", 8, &[], true)];
    let bound = [pod("x", 2, &[("gantry.dev/queue", "small")], Some("a"))];
    let (mut tracker, mut s) = build(&nodes, &bound, &[], &[], &[]);
    tracker.pod_changed(
        &mut s,
        key("y"),
        Some(&pod("y", 1, &[("gantry.dev/queue", "new")], None)),
        None,
    );
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert!(s.queues.id("new").is_some());
    assert_eq!(s.queues.used(s.queues.id("small").unwrap()).gpus, 2);
    let small = QueueDef {
        name: "small".into(),
        parent: None,
        nominal_gpus: 4,
        weight: 1,
        borrowing_limit_gpus: None,
        lending_limit_gpus: None,
        reclaim: gantry_core::Reclaim::Never,
    };
    let small = DeclaredQueue {
        stop_policy: Default::default(),
        def: small,
        namespace_selector: Some(Default::default()),
    };
    tracker.queues_changed(&mut s, vec![small], &BTreeMap::new());
    assert_eq!(s.queues.nominal(s.queues.id("small").unwrap()), 4);
    assert_eq!(s.queues.used(s.queues.id("small").unwrap()).gpus, 2);
    let y = s.pending()[0];
    assert_eq!(s.queues.name(s.job(y).queue), "new");
    // Once checked (at the sync's end), "new" is no declared queue: y waits, refused.
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert_eq!(s.pending_count(), 0);
    assert_eq!(
        tracker.waiting()[0].1,
        "queue \"new\" is not declared: declared queues are small"
    );
    assert_eq!(s.queues.used(s.queues.id("small").unwrap()).gpus, 2);
}

#[test]
fn a_rebuild_keeps_pods_this_process_bound_before_the_cache_shows_them() {
    let nodes = [node("a", 8, &[], true)];
    let p = pod("p", 8, &[], None);
    let (mut tracker, mut s) = build(&nodes, &[], std::slice::from_ref(&p), &[], &[]);
    let job = cycle(&mut s).decisions[0].job;
    bind_on_first_node(&mut tracker, job);
    // A relist: the unbound cache still lists the pod, the bound cache does not have it.
    tracker.rebuild(
        &mut s,
        &World {
            nodes: &nodes,
            bound: &[],
            pending: &[p],
        },
    );
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert_eq!(s.pending_count(), 0, "bound, not pending again");
    assert_eq!(s.running().count(), 1);
    assert_eq!(s.state.nodes.gpu_free, [0]);
}

/// After an API server restart the bound cache relisted before the unbound one: a rebuild
/// saw pods this process had bound in both, applied the stale pending copy last, and placed
/// them again, so their bindings were refused, naming the node they were on.
#[test]
fn a_rebuild_trusts_the_bound_cache_over_a_stale_unbound_one() {
    let nodes = [node("a", 8, &[], true), node("b", 8, &[], true)];
    let pending = pod("p", 8, &[], None);
    let bound = pod("p", 8, &[], Some("a"));
    let (mut tracker, mut s) = build(&nodes, &[], &[], &[], &[]);
    tracker.rebuild(
        &mut s,
        &World {
            nodes: &nodes,
            bound: std::slice::from_ref(&bound),
            pending: std::slice::from_ref(&pending),
        },
    );
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert_eq!(s.pending_count(), 0, "bound on a, not pending again");
    assert_eq!(s.running().count(), 1);
    assert_eq!(s.state.nodes.gpu_free, [0, 8]);
    // Another pod of that name (a new uid) pending while the old one is bound is pending.
    let mut newer = (*pod("p", 8, &[], None)).clone();
    newer.metadata.uid = Some("uid-p-2".into());
    let newer = Arc::new(newer);
    tracker.rebuild(
        &mut s,
        &World {
            nodes: &nodes,
            bound: std::slice::from_ref(&bound),
            pending: std::slice::from_ref(&newer),
        },
    );
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert_eq!(s.pending_count(), 1, "the new pod of that name is pending");
}

#[test]
fn a_binding_read_back_unapplied_is_pending_again_at_once() {
    let nodes = [node("a", 8, &[], true)];
    let p = pod("p", 8, &[], None);
    let (mut tracker, mut s) = build(&nodes, &[], std::slice::from_ref(&p), &[], &[]);
    let job = cycle(&mut s).decisions[0].job;
    // The binder could not tell whether the binding landed: it assumes it did.
    bind_on_first_node(&mut tracker, job);
    assert!(tracker.expired_assumptions().is_empty(), "assumed for now");
    // Read back: the pod is still unbound, so its assumption ends at once.
    let key = ("ns".to_string(), "p".to_string());
    tracker.unassume(&key);
    assert_eq!(tracker.expired_assumptions(), std::slice::from_ref(&key));
    tracker.pod_changed(&mut s, key, Some(&p), None);
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert_eq!(
        s.running().count(),
        0,
        "not running on a binding that did not happen"
    );
    assert_eq!(s.pending_count(), 1, "pending again");
    assert_eq!(s.state.nodes.gpu_free, [8]);
}

fn queue_def(name: &str, nominal: u64, borrowing_limit: Option<u64>) -> QueueDef {
    QueueDef {
        name: name.into(),
        parent: None,
        nominal_gpus: nominal,
        weight: 1,
        borrowing_limit_gpus: borrowing_limit,
        lending_limit_gpus: None,
        reclaim: gantry_core::Reclaim::Never,
    }
}

#[test]
fn a_balloon_label_counts_only_from_a_trusted_priority_class_or_namespace() {
    let nodes = [node("a", 8, &[], true), node("b", 8, &[], true)];
    let labels = [("gantry.dev/balloon", "true"), ("gantry.dev/queue", "team")];
    let tenant = pod("tenant", 4, &labels, Some("a"));
    let trusted = with_class(pod("trusted", 4, &labels, Some("b")), "gantry-balloon");
    let other_class = with_class(pod("other", 4, &labels, None), "high");
    let config = KubeConfig::default();
    assert!(!is_balloon(&tenant, &config), "a label alone is a claim");
    assert!(is_balloon(&trusted, &config));
    assert!(!is_balloon(&other_class, &config));
    let mut by_namespace = config.clone();
    by_namespace.balloon_namespaces = ["ns".to_string()].into();
    assert!(is_balloon(&tenant, &by_namespace), "a trusted namespace");
    let mut unlabelled = (*trusted).clone();
    unlabelled.metadata.labels = None;
    assert!(
        !is_balloon(&unlabelled, &config),
        "the class alone is no balloon"
    );
    // Bound: the tenant's pod is charged to its queue and is not preempted first; the
    // trusted balloon is charged to none.
    let (_, s) = build(
        &nodes,
        &[tenant, trusted],
        &[],
        &[],
        &[queue_def("team", 8, Some(0))],
    );
    let team = s.queues.id("team").unwrap();
    assert_eq!(
        s.queues.used(team).gpus,
        4,
        "only the tenant's pod is charged"
    );
    let balloons: Vec<bool> = s.running().map(|id| s.job(id).balloon).collect();
    assert_eq!(balloons.iter().filter(|&&b| b).count(), 1);
    assert_eq!(balloons.len(), 2);
}

/// `pod` with a node selector, a required node-affinity term and extra container asks.
fn constrained(
    name: &str,
    selector: &[(&str, &str)],
    required: Option<(&str, &str, &[&str])>,
    asks: &[(&str, &str)],
) -> Arc<Pod> {
    use k8s_openapi::api::core::v1::{
        Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    };
    let mut pod = (*pod(name, 1, &[], None)).clone();
    let spec = pod.spec.as_mut().unwrap();
    spec.node_selector = (!selector.is_empty()).then(|| label_map(selector));
    spec.affinity = required.map(|(key, operator, values)| Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: key.into(),
                        operator: operator.into(),
                        values: Some(values.iter().map(|v| v.to_string()).collect()),
                    }]),
                    match_fields: None,
                }],
            }),
            ..NodeAffinity::default()
        }),
        ..Affinity::default()
    });
    let requests = &mut spec.containers[0].resources.as_mut().unwrap().limits;
    for (resource, amount) in asks {
        requests
            .as_mut()
            .unwrap()
            .insert(resource.to_string(), Quantity(amount.to_string()));
    }
    Arc::new(pod)
}

fn with_allocatable(node: Arc<Node>, extra: &[(&str, &str)]) -> Arc<Node> {
    let mut node = (*node).clone();
    let allocatable = node.status.as_mut().unwrap().allocatable.as_mut().unwrap();
    for (resource, amount) in extra {
        allocatable.insert(resource.to_string(), Quantity(amount.to_string()));
    }
    Arc::new(node)
}

/// One cycle: where each placed job went, and each unplaced one's rejection counts, by
/// job name.
#[allow(clippy::type_complexity)]
fn placements(
    s: &mut Scheduler,
) -> (
    BTreeMap<String, Vec<String>>,
    BTreeMap<String, BTreeMap<String, u32>>,
) {
    let output = cycle(s);
    let (mut placed, mut refused) = (BTreeMap::new(), BTreeMap::new());
    for d in &output.decisions {
        let name = s.job(d.job).name.clone();
        if d.placed {
            placed.insert(
                name,
                d.placement.iter().map(|&(n, _)| s.node_name(n)).collect(),
            );
        } else {
            let reasons = d
                .explanation
                .filters
                .iter()
                .flat_map(|f| f.rejected.iter().cloned())
                .collect();
            refused.insert(name, reasons);
        }
    }
    (placed, refused)
}

#[test]
fn node_selector_affinity_and_extended_resources_steer_pods_to_their_nodes() {
    let nodes = [
        node("a-train", 8, &[("pool", "train"), ("gen", "3")], true),
        node("b-eval", 8, &[("pool", "eval"), ("gen", "5")], true),
        with_allocatable(
            node("c-rdma", 8, &[("pool", "eval"), ("gen", "4")], true),
            &[("rdma/hca", "1")],
        ),
    ];
    let pending = [
        constrained("to-train", &[("pool", "train")], None, &[]),
        constrained("newer-than-4", &[], Some(("gen", "Gt", &["4"])), &[]),
        constrained(
            "not-train-no-rdma",
            &[],
            Some(("pool", "NotIn", &["train"])),
            &[],
        ),
        constrained("wants-rdma", &[], None, &[("rdma/hca", "1")]),
        constrained("nowhere", &[("pool", "inference")], None, &[]),
    ];
    let (_tracker, mut s) = build(&nodes, &[], &pending, &[], &[]);
    let (placed, refused) = placements(&mut s);
    assert_eq!(placed["ns/to-train"], ["a-train"]);
    assert_eq!(placed["ns/newer-than-4"], ["b-eval"]);
    assert_ne!(placed["ns/not-train-no-rdma"], ["a-train"]);
    assert_eq!(placed["ns/wants-rdma"], ["c-rdma"]);
    assert_eq!(
        refused["ns/nowhere"],
        [(
            "node(s) didn't match Pod's node affinity/selector".to_string(),
            3
        )]
        .into()
    );
    // A second rdma pod: the one device is held by a bound pod, and the reason names it.
    let mut holder = (*pending[3]).clone();
    holder.spec.as_mut().unwrap().node_name = Some("c-rdma".into());
    let more = [constrained(
        "wants-rdma-too",
        &[],
        None,
        &[("rdma/hca", "1")],
    )];
    let (_tracker, mut s) = build(&nodes, &[Arc::new(holder)], &more, &[], &[]);
    let (placed, refused) = placements(&mut s);
    assert!(placed.is_empty());
    assert_eq!(
        refused["ns/wants-rdma-too"],
        [("Insufficient rdma/hca".to_string(), 3)].into(),
        "c-rdma's device is taken; the others have none"
    );
}

#[test]
fn a_preferred_node_affinity_outweighs_bin_packing() {
    use k8s_openapi::api::core::v1::{
        Affinity, NodeAffinity, NodeSelectorRequirement, NodeSelectorTerm, PreferredSchedulingTerm,
    };
    // Bin packing alone prefers the fuller node "a" (4 of 8 GPUs held).
    let nodes = [
        node("a", 8, &[("pool", "train")], true),
        node("b", 8, &[("pool", "eval")], true),
    ];
    let bound = [pod("held", 4, &[], Some("a"))];
    let prefer = |pool: &str| {
        let mut p = (*pod(&format!("prefers-{pool}"), 1, &[], None)).clone();
        p.spec.as_mut().unwrap().affinity = Some(Affinity {
            node_affinity: Some(NodeAffinity {
                preferred_during_scheduling_ignored_during_execution: Some(vec![
                    PreferredSchedulingTerm {
                        weight: 10,
                        preference: NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: "pool".into(),
                                operator: "In".into(),
                                values: Some(vec![pool.into()]),
                            }]),
                            match_fields: None,
                        },
                    },
                ]),
                ..NodeAffinity::default()
            }),
            ..Affinity::default()
        });
        Arc::new(p)
    };
    let pending = [pod("plain", 1, &[], None), prefer("eval")];
    let (_tracker, mut s) = build(&nodes, &bound, &pending, &[], &[]);
    let (placed, _) = placements(&mut s);
    assert_eq!(placed["ns/plain"], ["a"], "bin packing alone");
    assert_eq!(placed["ns/prefers-eval"], ["b"], "the preference wins");
}

#[test]
fn a_pod_asking_what_gantry_does_not_honour_waits_naming_the_field() {
    let nodes = [node("a", 8, &[], true)];
    let mut spread = (*pod("spread", 1, &[], None)).clone();
    spread.spec.as_mut().unwrap().topology_spread_constraints = Some(vec![
        k8s_openapi::api::core::v1::TopologySpreadConstraint::default(),
    ]);
    let (tracker, s) = build(&nodes, &[], &[Arc::new(spread)], &[], &[]);
    assert_eq!(s.pending_count(), 0, "never a job");
    let waiting = waiting_by_key(&tracker);
    assert_eq!(
        waiting,
        [(
            "ns/spread".to_string(),
            "pod ns/spread: spec.topologySpreadConstraints is not supported by Gantry (topology spread); remove it or use another scheduler".to_string()
        )]
    );
}

#[test]
fn dra_gpus_fill_the_node_table_and_claims_join_the_pod_request() {
    use crate::claims::tests::{claim_pod, resource_claim, view};
    // Nodes with no nvidia.com/gpu: their GPUs are only in ResourceSlices.
    let nodes = [node("n0", 0, &[], true), node("n1", 0, &[], true)];
    let (mut tracker, mut s) = build(&nodes, &[], &[], &[], &[]);
    assert_eq!(s.state.nodes.gpu_total, [0, 0]);
    *tracker.dra_mut() = view();
    tracker.namespace_changed("default", Some(Labels::new()));
    tracker.dra_mut().set_claim(
        ("default".into(), "c".into()),
        Some(Arc::new(resource_claim("c", 4))),
    );
    let pending = [
        Arc::new(claim_pod("p", "u1", &[("gpus", Some("c"))])),
        Arc::new(claim_pod("q", "u2", &[("gpus", Some("absent"))])),
    ];
    tracker.rebuild(
        &mut s,
        &World {
            nodes: &nodes,
            bound: &[],
            pending: &pending,
        },
    );
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert_eq!(s.state.nodes.gpu_total, [8, 8]);
    let asked: Vec<(String, u32)> = s
        .pending()
        .into_iter()
        .map(|id| (s.job(id).name.clone(), s.job(id).shape.gpus))
        .collect();
    assert_eq!(asked, [("default/p".to_string(), 4)]);
    let waiting = waiting_by_key(&tracker);
    assert_eq!(
        waiting,
        [(
            "default/q".to_string(),
            "pod default/q: spec.resourceClaims[0] (gpus): ResourceClaim default/absent does \
             not exist (yet)"
                .to_string()
        )]
    );
    // The claim appears: the pod becomes a job.
    tracker.dra_mut().set_claim(
        ("default".into(), "absent".into()),
        Some(Arc::new(resource_claim("absent", 8))),
    );
    tracker.claims_changed();
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert!(tracker.waiting().is_empty());
    assert_eq!(s.pending_count(), 2);
}

#[test]
fn a_refused_pod_waits_with_why_until_its_namespace_is_admitted() {
    let nodes = [node("a", 8, &[], true)];
    let pending = [pod("p", 1, &[("gantry.dev/queue", "team-a")], None)];
    let (mut tracker, mut s) = build(&nodes, &[], &pending, &[], &[]);
    assert_eq!(s.pending_count(), 1, "no Queue declared: nothing enforced");
    let team_a = DeclaredQueue {
        stop_policy: Default::default(),
        def: queue_def("team-a", 8, None),
        namespace_selector: Some(
            crate::tenancy::NamespaceSelector::parse(
                &serde_json::json!({"matchLabels": {"team": "a"}}),
            )
            .unwrap(),
        ),
    };
    tracker.queues_changed(&mut s, vec![team_a], &BTreeMap::new());
    let changes = tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert_eq!((changes.ended, s.pending_count()), (1, 0), "withdrawn");
    let waiting = waiting_by_key(&tracker);
    assert_eq!(
        waiting,
        [(
            "ns/p".to_string(),
            "queue \"team-a\" does not admit pods from namespace \"ns\" (its namespaceSelector does not select it)".to_string()
        )]
    );
    // A label on another namespace changes nothing here; one on "ns" admits the pod.
    tracker.namespace_changed("other", Some([("team".into(), "a".into())].into()));
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert_eq!(s.pending_count(), 0);
    tracker.namespace_changed("ns", Some([("team".into(), "a".into())].into()));
    let changes = tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert_eq!((changes.submitted, s.pending_count()), (1, 1));
    assert!(tracker.waiting().is_empty());
    let job = s.pending()[0];
    assert_eq!(s.queues.name(s.job(job).queue), "team-a");
}

#[test]
fn a_local_queue_pointed_elsewhere_moves_its_pods_to_the_new_queue() {
    let nodes = [node("a", 8, &[], true)];
    let pending = [pod("p", 1, &[("kueue.x-k8s.io/queue-name", "main")], None)];
    let queues = [queue_def("one", 4, None), queue_def("two", 4, None)];
    let (mut tracker, mut s) = build(&nodes, &[], &pending, &[], &queues);
    let (_, why) = &tracker.waiting()[0];
    assert!(
        why.contains("Kueue's LocalQueue (kueue.x-k8s.io) is not installed"),
        "{why}"
    );
    let local = |queue: &str| -> HashMap<PodKey, String> { [(key("main"), queue.into())].into() };
    tracker.local_queues_changed(true, local("one"));
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    let job = s.pending()[0];
    assert_eq!(s.queues.name(s.job(job).queue), "one");
    tracker.local_queues_changed(true, local("two"));
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert_eq!(s.pending_count(), 1);
    let moved = s.pending()[0];
    assert_ne!(moved, job, "submitted again");
    assert_eq!(s.queues.name(s.job(moved).queue), "two");
}

#[test]
fn a_declared_runtime_reaches_the_planner_and_a_malformed_one_is_a_warning() {
    let nodes = [node("a", 8, &[], true)];
    let annotated = |name: &str, text: &str| {
        let mut pod = (*pod(name, 1, &[], None)).clone();
        pod.metadata.annotations = Some(
            [("gantry.dev/expected-runtime".to_string(), text.to_string())]
                .into_iter()
                .collect(),
        );
        Arc::new(pod)
    };
    let pending = [annotated("good", "2h30m"), annotated("bad", "soon")];
    let (tracker, s) = build(&nodes, &[], &pending, &[], &[]);
    let job = |name: &str| {
        s.pending()
            .into_iter()
            .find(|&id| s.job(id).name.ends_with(name))
            .expect("submitted")
    };
    let (good, bad) = (job("good"), job("bad"));
    assert_eq!(s.job(good).expected_runtime_s, Some(9000.0));
    assert_eq!(tracker.warning_of(good), None);
    // Still submitted; the planner learns its runtime instead.
    assert_eq!(s.job(bad).expected_runtime_s, None);
    assert_eq!(
        tracker.warning_of(bad),
        Some(
            "annotation gantry.dev/expected-runtime: \"soon\" is not a duration like 90m, \
             2h30m or 3600; the runtime is learned from finished jobs instead"
        )
    );
}

#[test]
fn a_bound_pod_naming_a_queue_it_may_not_use_is_charged_to_none_and_told_once() {
    let nodes = [node("a", 8, &[], true)];
    let bound = [
        pod("squatter", 2, &[("gantry.dev/queue", "made-up")], Some("a")),
        pod("member", 1, &[("gantry.dev/queue", "team-a")], Some("a")),
    ];
    let queues = [queue_def("team-a", 4, None)];
    let (mut tracker, mut s) = build(&nodes, &bound, &[], &[], &queues);
    assert_eq!(s.queues.id("made-up"), None, "a name nobody declared");
    assert_eq!(s.queues.used(s.queues.id("team-a").unwrap()).gpus, 1);
    assert_eq!(
        s.state.nodes.gpu_free[0], 5,
        "its GPUs are held all the same"
    );
    let notes: Vec<(String, String)> = tracker
        .take_charge_notes()
        .into_iter()
        .map(|(p, note)| (p.key(), note))
        .collect();
    assert_eq!(
        notes,
        [(
            "ns/squatter".to_string(),
            "Charged to no queue (its GPUs count against no quota, and it is never preempted \
             for one): queue \"made-up\" is not declared: declared queues are team-a."
                .to_string()
        )]
    );
    // A rebuild reads it again: it is not told twice.
    tracker.rebuild(
        &mut s,
        &World {
            nodes: &nodes,
            bound: &bound,
            pending: &[],
        },
    );
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert!(tracker.take_charge_notes().is_empty());
    assert_eq!(s.queues.id("made-up"), None);
}

#[test]
fn while_queues_are_unknown_a_pod_naming_one_waits_saying_why() {
    let nodes = [node("a", 8, &[], true)];
    let pending = [
        pod("named", 1, &[("gantry.dev/queue", "team-a")], None),
        pod("plain", 1, &[], None),
    ];
    let (mut tracker, mut s) = build(&nodes, &[], &pending, &[], &[]);
    assert_eq!(s.pending_count(), 2);
    tracker.queues_unknown(Some("discovery failed: connection refused".into()));
    let changes = tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert_eq!((changes.ended, s.pending_count()), (1, 1), "withdrawn");
    let waiting = waiting_by_key(&tracker);
    assert_eq!(
        waiting,
        [(
            "ns/named".to_string(),
            "waiting to learn whether Queues are declared, so that its queue's quota and \
             namespaceSelector can be checked: discovery failed: connection refused"
                .to_string()
        )]
    );
    tracker.queues_unknown(None);
    let changes = tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert_eq!((changes.submitted, s.pending_count()), (1, 2));
    assert!(tracker.waiting().is_empty());
}

/// `node` with a condition of `kind` at status True, for `reason`.
fn with_condition(node: &Arc<Node>, kind: &str, reason: &str) -> Arc<Node> {
    let mut node = (**node).clone();
    let status = node.status.get_or_insert_with(Default::default);
    status.conditions.get_or_insert_with(Vec::new).push(
        k8s_openapi::api::core::v1::NodeCondition {
            type_: kind.into(),
            status: "True".into(),
            reason: Some(reason.into()),
            ..Default::default()
        },
    );
    Arc::new(node)
}

#[test]
fn a_suspect_signal_stops_its_gang_and_the_recreated_pods_restart_first_elsewhere() {
    let nodes = [
        node("a", 8, &[], true),
        node("b", 8, &[], true),
        node("c", 8, &[], true),
    ];
    let pg = [("scheduling.x-k8s.io/pod-group", "pg")];
    let bound = [pod("p0", 8, &pg, Some("a")), pod("p1", 8, &pg, Some("b"))];
    let (mut tracker, mut s) = build(&nodes, &bound, &[], &[("pg", 2)], &[]);
    tracker.config.health =
        crate::health::HealthSignals::parse("signals:\n- condition: GpuXidError\n").unwrap();
    s.config.restart = gantry_core::RestartBy::Recreated;
    let running = s.running().next().unwrap();

    // Node a reports an Xid: reported once, and only once.
    let sick = with_condition(&nodes[0], "GpuXidError", "Xid79");
    assert!(
        !tracker.node_changed(&mut s, "a", Some(&sick)),
        "a health change"
    );
    let cause = "condition GpuXidError=True (Xid79)".to_string();
    assert_eq!(
        tracker.take_node_signals(),
        [NodeSignal::Failed {
            node: "a".into(),
            cause: cause.clone()
        }]
    );
    assert!(!tracker.node_changed(&mut s, "a", Some(&sick)));
    assert!(tracker.take_node_signals().is_empty());
    assert_eq!(
        tracker.suspect_nodes().get("a").map(String::as_str),
        Some(cause.as_str())
    );
    // The node's health is the lifecycle's to set: the breaker may hold it.
    assert_eq!(s.state.nodes.health(0), Health::Healthy);

    // What the cluster source does with it: the gang stops whole, and stays placed while its
    // pods are evicted.
    let failure = s.node_failed(0, &cause, 10.0);
    assert_eq!(failure.stopped, [running]);
    tracker.stopping(&s, running);
    assert!(s.is_running(running));
    let out = s.cycle(10.0, &mut BuiltinOnly);
    assert_eq!(out.stopped, [running]);

    // The node is repaired (the signal clears); the pods are gone and recreated, later.
    assert!(!tracker.node_changed(&mut s, "a", Some(&nodes[0])));
    assert_eq!(
        tracker.take_node_signals(),
        [NodeSignal::Cleared { node: "a".into() }]
    );
    s.lifecycle_mut().repaired(0, false, 20.0);
    for name in ["p0", "p1"] {
        tracker.pod_changed(&mut s, key(name), None, None);
    }
    let later = |name: &str| {
        let mut p = (*pod(name, 8, &pg, None)).clone();
        p.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(100).unwrap(),
        ));
        Arc::new(p)
    };
    for name in ["q0", "q1"] {
        tracker.pod_changed(&mut s, key(name), Some(&later(name)), None);
    }
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    assert!(
        s.get(running).is_none(),
        "the stopped job left with its pods"
    );
    let restarted = s.pending()[0];
    assert_eq!(
        s.job(restarted).submit_s,
        0.0,
        "the recreated pods keep the stopped gang's submission time, not their own (100 s)"
    );
    assert_eq!(s.avoided(restarted).len(), 1);
    let out = s.cycle(30.0, &mut BuiltinOnly);
    assert!(out.decisions.iter().any(|d| d.job == restarted && d.placed));
    let on: Vec<u32> = s.slots(restarted).iter().map(|slot| slot.node).collect();
    assert!(!on.contains(&0), "avoids node a, healthy again: {on:?}");
}

#[test]
fn a_restarted_gang_keeps_what_its_failed_node_reported_through_a_rebuild() {
    let nodes = [
        node("a", 8, &[], true),
        node("b", 8, &[], true),
        node("c", 8, &[], true),
    ];
    let pg = [("scheduling.x-k8s.io/pod-group", "pg")];
    let bound = [pod("p0", 8, &pg, Some("b")), pod("p1", 8, &pg, Some("c"))];
    let (mut tracker, mut s) = build(&nodes, &bound, &[], &[("pg", 2)], &[]);
    s.config.restart = gantry_core::RestartBy::Recreated;
    let running = s.running().next().unwrap();
    let b = tracker.node_index("b").unwrap();
    let cause = "condition GpuXidError=True (Xid79)";
    s.node_failed(b, cause, 10.0);
    tracker.stopping(&s, running);
    let until_s = s.avoided(running)[0].until_s;
    for name in ["p0", "p1"] {
        tracker.pod_changed(&mut s, key(name), None, None);
    }
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    // Node a leaves: the rebuilt table indexes b elsewhere, and a new node d joins.
    let world = [nodes[1].clone(), nodes[2].clone(), node("d", 8, &[], true)];
    tracker.rebuild(
        &mut s,
        &World {
            nodes: &world,
            bound: &[],
            pending: &[],
        },
    );
    let b_now = tracker.node_index("b").unwrap();
    assert_ne!(b_now, b, "the rebuild moved b");
    for name in ["q0", "q1"] {
        tracker.pod_changed(&mut s, key(name), Some(&pod(name, 8, &pg, None)), None);
    }
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    let again = s.pending()[0];
    assert_eq!(
        s.avoided(again),
        [gantry_core::scheduler::BadNode {
            node: b_now,
            until_s,
            cause: cause.into(),
            at_s: 10.0,
        }],
        "the recreated pods' job avoids b by its new index, and says what b reported and when"
    );
}

#[test]
fn a_taint_signal_arrives_through_a_rebuild_and_a_new_node_reports_nothing() {
    let nodes = [node("a", 8, &[], true), node("b", 8, &[], true)];
    let (mut tracker, mut s) = build(&nodes, &[], &[], &[], &[]);
    tracker.config.health =
        crate::health::HealthSignals::parse("signals:\n- taint: nvidia.com/gpu-xid-error\n")
            .unwrap();
    let tainted = |n: &Arc<Node>| {
        let mut n = (**n).clone();
        n.spec.as_mut().unwrap().taints = Some(vec![KTaint {
            key: "nvidia.com/gpu-xid-error".into(),
            value: Some("79".into()),
            effect: "NoSchedule".into(),
            ..KTaint::default()
        }]);
        Arc::new(n)
    };
    let sick = tainted(&nodes[1]);
    assert!(
        tracker.node_changed(&mut s, "b", Some(&sick)),
        "a taint rebuilds"
    );
    // A node new to the table that already shows the signal is no event, but it is suspect.
    let fresh = tainted(&node("c", 8, &[], true));
    let world = [nodes[0].clone(), sick, fresh];
    tracker.rebuild(
        &mut s,
        &World {
            nodes: &world,
            bound: &[],
            pending: &[],
        },
    );
    assert_eq!(
        tracker.take_node_signals(),
        [NodeSignal::Failed {
            node: "b".into(),
            cause: "taint nvidia.com/gpu-xid-error=79".into()
        }]
    );
    assert_eq!(
        tracker.suspect_nodes().keys().collect::<Vec<_>>(),
        ["b", "c"]
    );
    // The cluster source takes c's signal as news (its gangs stop, the breaker counts it); b's
    // lifecycle goes on from before the rebuild.
    assert_eq!(
        tracker.take_new_nodes().into_iter().collect::<Vec<_>>(),
        ["c"]
    );
    assert!(tracker.take_new_nodes().is_empty(), "taken once");
}

#[test]
fn a_preflight_taint_is_due_through_a_rebuild_and_a_cleared_failure_in_place() {
    use crate::preflight::{FAILED_ANNOTATION, NodeStatus, PREFLIGHT_TAINT};
    let nodes = [node("a", 8, &[], true), node("b", 8, &[], true)];
    let (mut tracker, mut s) = build(&nodes, &[], &[], &[], &[]);
    let tainted = |n: &Arc<Node>, failed: Option<&str>| {
        let mut n = (**n).clone();
        n.spec.as_mut().unwrap().taints = Some(vec![KTaint {
            key: PREFLIGHT_TAINT.into(),
            effect: "NoSchedule".into(),
            ..KTaint::default()
        }]);
        if let Some(reason) = failed {
            n.metadata.annotations =
                Some([(FAILED_ANNOTATION.to_string(), reason.to_string())].into());
        }
        Arc::new(n)
    };
    let retest = tainted(&nodes[1], None);
    assert!(tracker.node_changed(&mut s, "b", Some(&retest)));
    // A new node that joins tainted starts in Preflight: no event.
    let fresh = tainted(&node("c", 8, &[], true), None);
    let world = [nodes[0].clone(), retest.clone(), fresh];
    let world = World {
        nodes: &world,
        bound: &[],
        pending: &[],
    };
    tracker.rebuild(&mut s, &world);
    assert_eq!(
        tracker.take_node_signals(),
        [NodeSignal::PreflightDue {
            node: "b".into(),
            after_failure: false
        }]
    );
    let (b, c) = (
        tracker.node_index("b").unwrap(),
        tracker.node_index("c").unwrap(),
    );
    assert_eq!(s.state.nodes.health(b), Health::Preflight);
    assert_eq!(s.lifecycle().state(c), gantry_core::NodeState::Preflight);
    // Its test fails: the annotation is a health change in place (Unhealthy), no event.
    let failed = tainted(&nodes[1], Some("container preflight exited 1"));
    assert!(!tracker.node_changed(&mut s, "b", Some(&failed)));
    assert_eq!(s.state.nodes.health(b), Health::Unhealthy);
    assert_eq!(
        tracker.preflight_nodes()["b"],
        NodeStatus::Failed("container preflight exited 1".into())
    );
    assert!(tracker.take_node_signals().is_empty());
    // An admin removes the annotation: tested again.
    assert!(!tracker.node_changed(&mut s, "b", Some(&retest)));
    assert_eq!(
        tracker.take_node_signals(),
        [NodeSignal::PreflightDue {
            node: "b".into(),
            after_failure: true
        }]
    );
    assert_eq!(s.state.nodes.health(b), Health::Preflight);
}

#[test]
fn a_gangs_stop_policy_comes_from_its_pod_its_group_or_its_queue() {
    use gantry_core::StopPolicy;
    let nodes = [node("a", 8, &[], true)];
    let annotated = |name: &str, value: &str, on: Option<&str>| {
        let mut pod = (*pod(name, 1, &[], on)).clone();
        pod.metadata.annotations = Some(
            [("gantry.dev/stop-policy".to_string(), value.to_string())]
                .into_iter()
                .collect(),
        );
        Arc::new(pod)
    };
    let bound = [annotated("workers", "pod", Some("a"))];
    let pending = [
        annotated("elastic", "Pod", None),
        annotated("mpi", "whole", None),
        annotated("typo", "rank", None),
    ];
    let (tracker, s) = build(&nodes, &bound, &pending, &[], &[]);
    let job = |name: &str| {
        s.pending()
            .into_iter()
            .chain(s.running())
            .find(|&id| s.job(id).name.ends_with(name))
    };
    assert_eq!(s.stop_policy(job("workers").unwrap()), StopPolicy::Pod);
    assert_eq!(s.stop_policy(job("elastic").unwrap()), StopPolicy::Pod);
    assert_eq!(s.stop_policy(job("mpi").unwrap()), StopPolicy::Whole);
    // A value Gantry cannot read keeps the pod waiting, naming the annotation.
    assert_eq!(job("typo"), None);
    let reasons = waiting_by_key(&tracker);
    assert!(
        reasons.iter().any(|(key, why)| key.ends_with("typo")
            && why.contains("annotation gantry.dev/stop-policy: \"rank\" is neither whole")),
        "{reasons:?}"
    );
}

#[test]
fn a_gang_with_stop_policy_pod_loses_only_its_pod_on_the_failed_node() {
    let nodes = [
        node("a", 8, &[], true),
        node("b", 8, &[], true),
        node("c", 8, &[], true),
    ];
    let pg = [("scheduling.x-k8s.io/pod-group", "pg")];
    let member = |name: &str, on: Option<&str>| {
        let mut p = (*pod(name, 8, &pg, on)).clone();
        p.metadata.annotations = Some(
            [("gantry.dev/stop-policy".to_string(), "pod".to_string())]
                .into_iter()
                .collect(),
        );
        Arc::new(p)
    };
    let bound = [member("p0", Some("a")), member("p1", Some("b"))];
    let (mut tracker, mut s) = build(&nodes, &bound, &[], &[("pg", 2)], &[]);
    s.config.restart = gantry_core::RestartBy::Recreated;
    let running = s.running().next().unwrap();
    assert_eq!(s.stop_policy(running), gantry_core::StopPolicy::Pod);
    let failure = s.node_failed(0, "condition GpuXidError=True (Xid79)", 10.0);
    assert_eq!(failure.stopped, [running]);
    tracker.stopping(&s, running);
    let out = s.cycle(10.0, &mut BuiltinOnly);
    assert_eq!(out.stopped, [running]);
    let said = out
        .decisions
        .iter()
        .find(|d| d.job == running)
        .map(|d| d.explanation.summary())
        .unwrap();
    assert!(
        said.contains("stop policy is pod, so only those pods are evicted"),
        "{said}"
    );
    // The writer evicts p0 alone (its node is the one avoided); p1 runs on as its own job.
    assert_eq!(s.avoided(running)[0].node, 0);
    tracker.pod_changed(&mut s, key("p0"), None, None);
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    let rest: Vec<_> = s.running().collect();
    assert_eq!(rest.len(), 1);
    assert_eq!(s.job(rest[0]).pods, 1);
    assert_eq!(s.stop_policy(rest[0]), gantry_core::StopPolicy::Pod);
    // The recreated pod joins the gang (its running member counts) and avoids node a.
    tracker.pod_changed(&mut s, key("q0"), Some(&member("q0", None)), None);
    tracker.finish_sync(&mut s, Duration::from_secs(120));
    let again = s.pending()[0];
    assert_eq!(s.job(again).pods, 1);
    assert_eq!(s.avoided(again).len(), 1);
    let out = s.cycle(20.0, &mut BuiltinOnly);
    assert!(out.decisions.iter().any(|d| d.job == again && d.placed));
    let on: Vec<u32> = s.slots(again).iter().map(|slot| slot.node).collect();
    assert_eq!(on, [2], "not on a (failed) nor b (its member's)");
}
