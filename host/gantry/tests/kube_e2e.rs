//! End to end against a real control plane (tests/cluster/: kube-apiserver, etcd, kwok): the
//! nodes of small-64.yaml, `gantry serve --kubeconfig`, and pods submitted as a user would.
//!
//! Runs when `GANTRY_CLUSTER_BIN` names the binaries `tests/cluster/build.sh` printed;
//! `scripts/test.sh` sets it. Once set, a control plane that does not start fails the test with
//! the reason; it is never skipped.

mod common;

use std::process::Stdio;
use std::time::Instant;

use common::kube::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DynamicObject, ListParams, PostParams};
use serde_json::json;

#[test]
fn pods_and_gangs_bind_on_a_real_control_plane() {
    let Some(bin) = cluster_bin("kube e2e") else {
        return;
    };
    let started = Instant::now();
    let plane = ControlPlane::start(&bin);
    let kubeconfig = plane.kubeconfig();
    let spec = repo().join("../shared/clusters/small-64.yaml");
    let created = gantry(&["kube", "create-nodes", "--spec"])
        .arg(&spec)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .output()
        .unwrap();
    assert!(
        created.status.success(),
        "gantry kube create-nodes failed: {}",
        String::from_utf8_lossy(&created.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&created.stdout).trim(),
        "small-64: 64 nodes (64 created, 0 existed already)"
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = client(&kubeconfig).await;
        // The PodGroup CRD first: gantry discovers it once, at start.
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        crds.create(&PostParams::default(), &pod_group_crd())
            .await
            .unwrap();
        let groups: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), "default", &pod_group_resource());
        let group = |name: &str, min: u32| {
            let mut object = DynamicObject::new(name, &pod_group_resource());
            object.data = json!({"spec": {"minMember": min}});
            object
        };
        until("the PodGroup API to serve", || async {
            groups
                .create(&PostParams::default(), &group("train", 4))
                .await
                .ok()
        })
        .await;

        let data = tempfile::tempdir().unwrap();
        let _serve = Running(
            gantry(&[
                "serve",
                "--no-policies",
                "--listen",
                "127.0.0.1:0",
                "--kubeconfig",
            ])
            .arg(&kubeconfig)
            .arg("--data-dir")
            .arg(data.path())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
        );

        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let pp = PostParams::default();
        // Three single pods (one in a Kueue queue), a PodGroup gang of four, a gang by Gantry's
        // labels, and a pod no node can hold.
        let mut fits = vec![];
        for i in 0..3 {
            let labels = if i == 0 {
                json!({"kueue.x-k8s.io/queue-name": "team-a"})
            } else {
                json!({})
            };
            pods.create(&pp, &pod(&format!("single-{i}"), 8, labels))
                .await
                .unwrap();
            fits.push(format!("single-{i}"));
        }
        for i in 0..4 {
            let labels = json!({"scheduling.x-k8s.io/pod-group": "train"});
            pods.create(&pp, &pod(&format!("train-{i}"), 8, labels))
                .await
                .unwrap();
            fits.push(format!("train-{i}"));
        }
        for i in 0..2 {
            let labels = json!({"gantry.dev/gang": "eval", "gantry.dev/gang-size": "2"});
            pods.create(&pp, &pod(&format!("eval-{i}"), 4, labels))
                .await
                .unwrap();
            fits.push(format!("eval-{i}"));
        }
        pods.create(&pp, &pod("too-big", 16, json!({})))
            .await
            .unwrap();

        // Everything that fits binds, and kwok runs it.
        let bound: Vec<Pod> = until("the fitting pods to run", || async {
            let list = pods.list(&ListParams::default()).await.ok()?;
            let mine: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| fits.contains(p.metadata.name.as_ref().unwrap()))
                .collect();
            let running = mine.iter().all(|p| {
                node_of(p).is_some()
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            });
            (mine.len() == fits.len() && running).then_some(mine)
        })
        .await;
        // No node holds more GPUs than it has: 8-GPU pods on distinct H100 nodes, 4-GPU pods
        // on nodes with room.
        let mut per_node: std::collections::HashMap<String, u32> = Default::default();
        for p in &bound {
            let gpus = if p.metadata.name.as_ref().unwrap().starts_with("eval") {
                4
            } else {
                8
            };
            *per_node.entry(node_of(p).unwrap()).or_default() += gpus;
        }
        for (node, gpus) in &per_node {
            let room = if node.starts_with("h100") { 8 } else { 4 };
            assert!(*gpus <= room, "{node} holds {gpus} GPUs");
        }
        for p in &bound {
            let (status, _, _) = scheduled_condition(p).expect("PodScheduled is set");
            assert_eq!(status, "True", "{:?}", p.metadata.name);
        }

        // Events: Scheduled for each bound pod, FailedScheduling with the aggregated message.
        let events_api: Api<Event> = Api::namespaced(client.clone(), "default");
        let expected_failure = "0/64 nodes are available: 64 Insufficient nvidia.com/gpu.";
        let events = until("the Scheduled and FailedScheduling events", || async {
            let events = events_api.list(&ListParams::default()).await.ok()?.items;
            let all_scheduled = bound.iter().all(|p| {
                !notes(&events, p.metadata.name.as_ref().unwrap(), "Scheduled").is_empty()
            });
            let failed = !notes(&events, "too-big", "FailedScheduling").is_empty();
            (all_scheduled && failed).then_some(events)
        })
        .await;
        for p in &bound {
            let name = p.metadata.name.as_ref().unwrap();
            assert_eq!(
                notes(&events, name, "Scheduled"),
                [format!(
                    "Successfully assigned default/{name} to {}",
                    node_of(p).unwrap()
                )]
            );
        }
        let failure = &notes(&events, "too-big", "FailedScheduling")[0];
        assert!(
            failure.starts_with(expected_failure),
            "FailedScheduling note: {failure}"
        );
        let too_big = pods.get("too-big").await.unwrap();
        assert_eq!(node_of(&too_big), None);
        let (status, reason, message) = scheduled_condition(&too_big).unwrap();
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "Unschedulable")
        );
        assert_eq!(&message, failure);

        // A gang larger than the free H100 nodes (though not than all of them) binds none of
        // its pods, and says why on each.
        let free_h100 = 48 - per_node.keys().filter(|n| n.starts_with("h100")).count();
        let size = free_h100 as u32 + 1;
        groups.create(&pp, &group("wide", size)).await.unwrap();
        for i in 0..size {
            let labels = json!({"scheduling.x-k8s.io/pod-group": "wide"});
            pods.create(&pp, &pod(&format!("wide-{i}"), 8, labels))
                .await
                .unwrap();
        }
        let wide: Vec<Pod> = until("the wide gang's FailedScheduling conditions", || async {
            let list = pods.list(&ListParams::default()).await.ok()?;
            let wide: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| p.metadata.name.as_ref().unwrap().starts_with("wide-"))
                .collect();
            let reported = wide.iter().all(|p| {
                scheduled_condition(p).is_some_and(|(s, r, _)| s == "False" && r == "Unschedulable")
            });
            (wide.len() == size as usize && reported).then_some(wide)
        })
        .await;
        let partly: Vec<_> = wide.iter().filter_map(node_of).collect();
        assert!(
            partly.is_empty(),
            "the wide gang bound partially: {partly:?}"
        );
        let (_, _, message) = scheduled_condition(&wide[0]).unwrap();
        assert!(
            message.contains(&format!(
                "Waiting for room for all {size} pods at once ({} fit now)",
                size - 1
            )),
            "wide gang message: {message}"
        );
        // The earlier pods stay where they were.
        for p in &bound {
            let now = pods.get(p.metadata.name.as_ref().unwrap()).await.unwrap();
            assert_eq!(node_of(&now), node_of(p));
        }
    });
    eprintln!(
        "kube e2e: passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
