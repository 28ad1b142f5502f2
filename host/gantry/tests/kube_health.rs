//! The health lifecycle against a real control plane (tests/cluster/: kube-apiserver, etcd,
//! kwok): `gantry serve --kubeconfig --health-config`, a node that starts failing under a
//! running gang, and the gang's pods recreated as their controller would. A binary of its own,
//! so that its control plane does not share the machine with kube_e2e's five.
//!
//! Runs when `GANTRY_CLUSTER_BIN` names the binaries `tests/cluster/build.sh` printed;
//! `scripts/test.sh` sets it. Once set, a control plane that does not start fails the test with
//! the reason; it is never skipped.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::kube::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

/// The health lifecycle on a live cluster: a node that starts showing a configured suspect
/// signal (here an `Xid 79` condition, `GpuXidError` as NVSentinel-style tools set it) has its
/// running 4-pod PodGroup stopped whole through the Eviction API, in one decision: a Stopped
/// Event naming the node and the signal on every pod, and the job's explanation says so; the
/// node is in repair (`gantry_nodes`), and the pods recreated as their controller would bind
/// on other nodes. A second failing node trips the breaker, which says so in an Event and
/// stops nothing, and a rebuild of Gantry's view (a new node) changes none of that.
#[test]
#[ignore = "needs tests/cluster: scripts/test.sh runs it with --include-ignored"]
fn a_failing_node_stops_its_gang_whole_and_the_recreated_pods_bind_elsewhere() {
    let bin = cluster_bin("kube health e2e");
    let plane = ControlPlane::start(&bin);
    let kubeconfig = plane.kubeconfig();
    create_gpu_nodes(&kubeconfig, "hx", 6, 8);
    let runtime = test_runtime();
    runtime.block_on(async {
        let client = client(&kubeconfig).await;
        create_first_pod_group(&client, "train", 4).await;
        let dir = tempfile::tempdir().unwrap();
        let health = health_file(dir.path(), "signals:\n- condition: GpuXidError\n- taint: nvidia.com/gpu-xid-error\n");
        let replica = Replica::start(&kubeconfig, &["--health-config", &health]);
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let members = |tag: &str| -> Vec<Pod> {
            (0..4)
                .map(|i| {
                    let labels = json!({"scheduling.x-k8s.io/pod-group": "train", "try": tag});
                    // Grace 0: no kubelet runs here to finish a graceful termination.
                    with_priority(pod(&format!("train-{i}"), 8, labels), None, 0)
                })
                .collect()
        };
        for member in members("first") {
            pods.create(&PostParams::default(), &member).await.unwrap();
        }
        let first = until("the gang to bind", || async {
            let nodes = nodes_by_pod(&pods).await;
            let on: BTreeMap<String, String> = nodes
                .into_iter()
                .filter_map(|(name, node)| Some((name, node?)))
                .collect();
            (on.len() == 4).then_some(on)
        })
        .await;
        let failing = first["train-0"].clone();

        let nodes: Api<Node> = Api::all(client.clone());
        report_xid(&nodes, &failing).await;
        // Every pod goes, those on healthy nodes too: an MPI gang stops whole.
        until("the gang's pods to be evicted", || async {
            let list = pods.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .all(|p| p.metadata.deletion_timestamp.is_some())
                .then_some(())
        })
        .await;
        let events: Api<Event> = Api::namespaced(client.clone(), "default");
        for name in ["train-0", "train-1", "train-2", "train-3"] {
            let note = event_note(&events, name, "Stopped").await;
            assert!(
                note.contains(&format!(
                    "node {failing} reported condition GpuXidError=True (Xid79)"
                )) && note.contains("stopped whole"),
                "{note}"
            );
        }
        let metrics = until("gantry_nodes to show the node in repair", || async {
            let (_, body) = replica.get("/metrics")?;
            shows(&body, "gantry_nodes{state=\"repair\"} 1")
                .then_some(body)
        })
        .await;
        assert!(
            metrics.contains("gantry_nodes{state=\"ready\"} 5"),
            "{metrics}"
        );
        // One decision, with the reason, in the job's history.
        let (_, history) = replica
            .get("/api/decisions/job/default%2Ftrain")
            .expect("the decisions API answers");
        let records: serde_json::Value = serde_json::from_str(&history).unwrap();
        let phrase = format!("a restart: node {failing} reported condition GpuXidError");
        let stops = records
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d.to_string().contains(&phrase))
            .count();
        assert_eq!(stops, 1, "{history}");

        // The controller recreates the pods: they bind on the healthy nodes.
        until("the evicted pods to be gone", || async {
            let list = pods.list(&ListParams::default()).await.ok()?;
            list.items.is_empty().then_some(())
        })
        .await;
        for member in members("second") {
            create_retrying(&pods, &member).await;
        }
        let second = until("the recreated gang to bind", || async {
            let nodes = nodes_by_pod(&pods).await;
            let on: BTreeSet<String> = nodes.into_values().flatten().collect();
            (on.len() == 4).then_some(on)
        })
        .await;
        assert!(!second.contains(&failing), "{second:?} avoids {failing}");

        // A second failure would put 2 of 6 nodes out, over the 10% share (one node may always
        // be out): the breaker trips, says so on the node, and leaves its gang running.
        let next = second.iter().next().unwrap().clone();
        report_xid(&nodes, &next).await;
        let tripped = event_note(&events, &next, "HealthBreakerTripped").await;
        assert!(
            tripped.contains("one more cordon would put 2 of 6 nodes out")
                && tripped.contains("gantry health reset"),
            "{tripped}"
        );
        until("gantry_health_breaker_tripped to be 1", || async {
            let (_, body) = replica.get("/metrics")?;
            shows(&body, "gantry_health_breaker_tripped 1").then_some(())
        })
        .await;
        assert_none_stopping(&pods, "a held signal stops nothing").await;
        // A new node changes the node set, and Gantry rebuilds its view: the failed node stays
        // out, the held one in service, and the breaker tripped.
        let joined = gantry_kube::nodes::node_object(
            &gantry_kube::nodes::NodeDef {
                name: "hy-0".into(),
                gpus: 8,
                gpu_type: Some("H100".into()),
                cpu_milli: 64_000,
                memory_mib: 512 * 1024,
                topology: vec![("rack".into(), "rack-0".into())],
                taints: vec![],
            },
            &gantry_kube::KubeConfig::default(),
        );
        nodes.create(&PostParams::default(), &joined).await.unwrap();
        until("the rebuilt view to count the new node", || async {
            let (_, body) = replica.get("/metrics")?;
            (shows(&body, "gantry_nodes{state=\"ready\"} 6")
                && shows(&body, "gantry_nodes{state=\"repair\"} 1")
                && shows(&body, "gantry_health_breaker_tripped 1"))
            .then_some(())
        })
        .await;
        assert_none_stopping(&pods, "the rebuild stops nothing either").await;
        eprintln!(
            "health e2e: gang on {first:?}; {failing} failed; recreated on {second:?}; {next} held by the breaker, and still after a rebuild"
        );
    });
}

/// Preflight on a live cluster: three new nodes carry the `gantry.dev/preflight` taint, and
/// each gets a preflight pod from the health config's template. kwok (`kwok-stages.yaml`)
/// completes pf-good's: its taint goes, and an 8-GPU pod waiting since the start binds there.
/// It fails pf-bad's: the node stays tainted, annotated with the container's exit reason, in
/// repair. pf-stuck's never ends: out of time, the same with the timeout as the reason. Once
/// its work is gone, idle pf-good is re-tested, and passes again.
#[test]
#[ignore = "needs tests/cluster: scripts/test.sh runs it with --include-ignored"]
fn new_nodes_pass_or_fail_their_preflight_before_they_take_work() {
    use gantry_kube::preflight::{FAILED_ANNOTATION, PREFLIGHT_TAINT};
    let bin = cluster_bin("kube preflight e2e");
    let plane = ControlPlane::start(&bin);
    let kubeconfig = plane.kubeconfig();
    let config = gantry_kube::KubeConfig::default();
    let names = ["pf-good", "pf-bad", "pf-stuck"];
    let nodes = names
        .iter()
        .map(|name| {
            gantry_kube::nodes::node_object(
                &gantry_kube::nodes::NodeDef {
                    name: name.to_string(),
                    gpus: 8,
                    gpu_type: Some("H100".into()),
                    cpu_milli: 64_000,
                    memory_mib: 512 * 1024,
                    topology: vec![("rack".into(), "rack-0".into())],
                    taints: vec![(PREFLIGHT_TAINT.into(), String::new(), "NoSchedule".into())],
                },
                &config,
            )
        })
        .collect();
    gantry_kube::nodes::create_nodes(&kubeconfig, nodes).expect("create the new nodes");
    let runtime = test_runtime();
    runtime.block_on(async {
        let client = client(&kubeconfig).await;
        let dir = tempfile::tempdir().unwrap();
        let health = health_file(dir.path(), "preflight:\n  image: registry.example/dcgm:4\n  command: [dcgmi, diag, -r, '2']\n  timeout_s: 20\n  retest_every_s: 5\n");
        let replica = Replica::start(&kubeconfig, &["--health-config", &health]);
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        // Work that fits only a whole node: it waits until one passes.
        let work = with_priority(pod("work", 8, json!({})), None, 0);
        pods.create(&PostParams::default(), &work).await.unwrap();

        let events: Api<Event> = Api::namespaced(client.clone(), "default");
        for name in names {
            let note = event_note(&events, name, "PreflightStarted").await;
            assert!(note.contains(&format!("gantry-preflight-{name}")), "{note}");
        }
        let nodes: Api<Node> = Api::all(client.clone());
        let tainted = |node: &Node| {
            node.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| t.iter().any(|t| t.key == PREFLIGHT_TAINT))
        };
        until("pf-good's taint to go", || async {
            let node = nodes.get("pf-good").await.ok()?;
            (!tainted(&node)).then_some(())
        })
        .await;
        let bound = until("the waiting pod to bind", || async {
            node_of(&pods.get("work").await.ok()?)
        })
        .await;
        assert_eq!(bound, "pf-good");
        let annotation = |name: &'static str| {
            let nodes = nodes.clone();
            async move {
                let node = nodes.get(name).await.ok()?;
                let reason = node.metadata.annotations.as_ref()?.get(FAILED_ANNOTATION)?;
                Some((reason.clone(), tainted(&node)))
            }
        };
        let (bad, bad_tainted) = until("pf-bad's failure annotation", || annotation("pf-bad")).await;
        assert_eq!(
            bad,
            "container preflight exited 1 (Error): dcgmi diag -r 2: GPU 3 failed the memory test"
        );
        assert!(bad_tainted, "a failed node keeps its taint");
        let (stuck, stuck_tainted) =
            until("pf-stuck's timeout annotation", || annotation("pf-stuck")).await;
        assert!(
            stuck.starts_with("the preflight pod did not finish within 20 s"),
            "{stuck}"
        );
        assert!(stuck_tainted, "a timed-out node keeps its taint");
        let failed = event_note(&events, "pf-bad", "PreflightFailed").await;
        assert!(failed.contains("GPU 3 failed the memory test"), "{failed}");
        // The preflight pods are gone once their results are written.
        until("the preflight pods to be deleted", || async {
            let list = pods.list(&ListParams::default()).await.ok()?;
            let left: Vec<String> = list
                .items
                .iter()
                .filter_map(|p| p.metadata.name.clone())
                .filter(|n| n.starts_with("gantry-preflight-"))
                .collect();
            left.is_empty().then_some(())
        })
        .await;
        // The lifecycle says the same, with the reasons.
        let (_, bad_health) = replica
            .get("/api/nodes/pf-bad/health")
            .expect("the node health API answers");
        assert!(
            bad_health.contains("\"repair\"")
                && bad_health.contains("preflight failed: container preflight exited 1"),
            "{bad_health}"
        );
        let (_, good_health) = replica.get("/api/nodes/pf-good/health").unwrap();
        assert!(good_health.contains("preflight passed"), "{good_health}");
        let metrics = until("gantry_nodes to count the two in repair", || async {
            let (_, body) = replica.get("/metrics")?;
            (shows(&body, "gantry_nodes{state=\"repair\"} 2")
                && shows(&body, "gantry_nodes{state=\"ready\"} 1"))
            .then_some(body)
        })
        .await;
        drop(metrics);

        // Idle again, pf-good is re-tested (every 5 s here), and passes again.
        pods.delete("work", &Default::default()).await.unwrap();
        let retest = event_note(&events, "pf-good", "PreflightRetest").await;
        assert!(retest.starts_with("Re-testing an idle node"), "{retest}");
        until("pf-good's second preflight to pass", || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            let node = nodes.get("pf-good").await.ok()?;
            (notes(&list.items, "pf-good", "PreflightPassed").len() >= 2 && !tainted(&node))
                .then_some(())
        })
        .await;
        eprintln!(
            "preflight e2e: pf-good passed, took work, and passed a re-test; pf-bad: {bad}; pf-stuck: {stuck}"
        );
    });
}

/// A gang whose PodGroup says `gantry.dev/stop-policy: pod` loses only its pod on the failing
/// node: that pod alone is evicted, with a Stopped Event saying why, the other runs on, and the
/// recreated pod binds on the node left, not the failed one.
#[test]
#[ignore = "needs tests/cluster: scripts/test.sh runs it with --include-ignored"]
fn a_gang_with_stop_policy_pod_loses_only_its_pod_on_the_failing_node() {
    let bin = cluster_bin("kube stop policy e2e");
    let plane = ControlPlane::start(&bin);
    let kubeconfig = plane.kubeconfig();
    create_gpu_nodes(&kubeconfig, "sp", 3, 8);
    let runtime = test_runtime();
    runtime.block_on(async {
        let client = client(&kubeconfig).await;
        create_first_pod_group(&client, "workers", 2).await;
        let groups: Api<kube::api::DynamicObject> =
            Api::namespaced_with(client.clone(), "default", &pod_group_resource());
        let annotate = json!({"metadata": {"annotations": {"gantry.dev/stop-policy": "pod"}}});
        groups
            .patch(
                "workers",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&annotate),
            )
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let health = health_file(dir.path(), "signals:\n- condition: GpuXidError\n");
        let replica = Replica::start(&kubeconfig, &["--health-config", &health]);
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let member = |name: &str| {
            let labels = json!({"scheduling.x-k8s.io/pod-group": "workers"});
            with_priority(pod(name, 8, labels), None, 0)
        };
        for name in ["w-0", "w-1"] {
            pods.create(&PostParams::default(), &member(name))
                .await
                .unwrap();
        }
        let first = until("the gang to bind", || async {
            let on: BTreeMap<String, String> = nodes_by_pod(&pods)
                .await
                .into_iter()
                .filter_map(|(name, node)| Some((name, node?)))
                .collect();
            (on.len() == 2).then_some(on)
        })
        .await;
        let failing = first["w-0"].clone();
        let nodes: Api<Node> = Api::all(client.clone());
        report_xid(&nodes, &failing).await;
        until("w-0 to be evicted", || async {
            let pod = pods.get_opt("w-0").await.ok()?;
            pod.is_none_or(|p| p.metadata.deletion_timestamp.is_some())
                .then_some(())
        })
        .await;
        let events: Api<Event> = Api::namespaced(client.clone(), "default");
        let note = event_note(&events, "w-0", "Stopped").await;
        assert!(note.contains("stop policy is pod"), "{note}");
        // The replica's decision is made and applied: w-1 was never evicted.
        let w1 = pods.get("w-1").await.unwrap();
        assert!(w1.metadata.deletion_timestamp.is_none(), "w-1 runs on");
        let list = events.list(&ListParams::default()).await.unwrap();
        assert!(notes(&list.items, "w-1", "Stopped").is_empty());
        until("w-0 to be gone", || async {
            pods.get_opt("w-0").await.ok()?.is_none().then_some(())
        })
        .await;
        create_retrying(&pods, &member("w-0")).await;
        let again = until("the recreated pod to bind", || async {
            node_of(&pods.get("w-0").await.ok()?)
        })
        .await;
        assert_ne!(again, failing);
        assert_ne!(again, first["w-1"]);
        drop(replica);
        eprintln!("stop policy e2e: w-0 on {failing} stopped alone, recreated on {again}");
    });
}

/// A node that already shows a suspect signal when Gantry starts is failing under whatever
/// runs there: its gangs are stopped at the first sync, as if the signal had come later, and
/// the Stopped Event says it came before Gantry started.
#[test]
#[ignore = "needs tests/cluster: scripts/test.sh runs it with --include-ignored"]
fn a_signal_from_before_gantry_started_stops_the_gangs_on_its_node() {
    let bin = cluster_bin("kube signal at start e2e");
    let plane = ControlPlane::start(&bin);
    let kubeconfig = plane.kubeconfig();
    create_gpu_nodes(&kubeconfig, "st", 2, 8);
    let runtime = test_runtime();
    runtime.block_on(async {
        let client = client(&kubeconfig).await;
        let nodes: Api<Node> = Api::all(client.clone());
        report_xid(&nodes, "st-0").await;
        // Bound before Gantry runs (by an earlier Gantry, say).
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let mut early = with_priority(pod("early", 8, json!({})), None, 0);
        early.spec.as_mut().unwrap().node_name = Some("st-0".into());
        pods.create(&PostParams::default(), &early).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let health = health_file(dir.path(), "signals:\n- condition: GpuXidError\n");
        let replica = Replica::start(&kubeconfig, &["--health-config", &health]);
        let events: Api<Event> = Api::namespaced(client.clone(), "default");
        let note = event_note(&events, "early", "Stopped").await;
        assert!(
            note.contains(
                "node st-0 reported condition GpuXidError=True (Xid79), before Gantry started"
            ),
            "{note}"
        );
        until("early to be evicted", || async {
            pods.get_opt("early").await.ok()?.is_none().then_some(())
        })
        .await;
        until("gantry_nodes to show st-0 in repair", || async {
            let (_, body) = replica.get("/metrics")?;
            shows(&body, "gantry_nodes{state=\"repair\"} 1").then_some(())
        })
        .await;
    });
}

/// Sets an `Xid 79`-style condition on `node`, as node-problem-detector would: a condition in
/// the node's status.
async fn report_xid(nodes: &Api<Node>, node: &str) {
    let xid = json!({"status": {"conditions": [{
        "type": "GpuXidError", "status": "True", "reason": "Xid79",
        "message": "GPU 3 has fallen off the bus",
    }]}});
    nodes
        .patch_status(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(&xid),
        )
        .await
        .unwrap();
}

/// The note of the first Event about `name` with `reason`, once there is one.
async fn event_note(events: &Api<Event>, name: &str, reason: &str) -> String {
    until(&format!("{name}'s {reason} Event"), || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        notes(&list.items, name, reason).into_iter().next()
    })
    .await
}

/// Asserts that no pod of `pods` is being deleted: `why` says what stopped nothing.
async fn assert_none_stopping(pods: &Api<Pod>, why: &str) {
    let list = pods.list(&ListParams::default()).await.unwrap();
    assert!(
        list.items
            .iter()
            .all(|p| p.metadata.deletion_timestamp.is_none()),
        "{why}"
    );
}
/// Whether the `/metrics` `body` has exactly `line`: a sample's whole line, so that neither a
/// metric's HELP text ("gantry_health_breaker_tripped 1 while …") nor a longer value ("} 10")
/// passes for it.
fn shows(body: &str, line: &str) -> bool {
    body.lines().any(|l| l == line)
}

/// A `--health-config` file of `text` in `dir`: its path.
fn health_file(dir: &std::path::Path, text: &str) -> String {
    let path = dir.join("health.yaml");
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}
