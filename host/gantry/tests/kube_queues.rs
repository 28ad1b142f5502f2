//! Queues and quotas as `Queue` objects (`gantry.dev/v1alpha1`, deploy/crds/) on a real control
//! plane, the CRD installed after gantry started (it finds the kind without a restart): the
//! CRD's schema refuses a negative quota; a queue at its quota of 2 GPUs with no
//! borrowing holds its third pod pending with the quota reason in FailedScheduling; a queue
//! whose cohort sibling is idle borrows beyond its quota; a Queue the scheduler cannot use (its
//! parent does not exist) is left out without stopping anything, and says why in its status;
//! the others' status shows the GPUs they use and their pending jobs.

mod common;

use std::time::Instant;

use common::kube::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DynamicObject, ListParams, PostParams};
use serde_json::json;

fn queue(name: &str, spec: serde_json::Value) -> DynamicObject {
    let mut object = DynamicObject::new(name, &gantry_kube::queues::resource());
    object.data = json!({ "spec": spec });
    object
}

#[test]
fn queue_objects_bound_and_lend_gpus() {
    let bin = cluster_bin("kube queues e2e");
    let started = Instant::now();
    let plane = ControlPlane::start(&bin);
    let kubeconfig = plane.kubeconfig();
    create_gpu_nodes(&kubeconfig, "gpu", 2, 8);
    let runtime = test_runtime();
    let client = runtime.block_on(client(&kubeconfig));
    let queues: Api<DynamicObject> =
        Api::all_with(client.clone(), &gantry_kube::queues::resource());
    // Gantry first: the Queue kind it finds only later, and enforces from then on.
    let data = tempfile::tempdir().unwrap();
    let _serve = serve_kube(&kubeconfig, data.path());
    runtime.block_on(async {
        // The CRD from deploy/, installed after gantry started: it looks for the kind again
        // every 30 s and watches it once it is served.
        let text =
            std::fs::read_to_string(repo().join("deploy/crds/queues.gantry.dev.yaml")).unwrap();
        let crd: CustomResourceDefinition = serde_yaml::from_str(&text).unwrap();
        Api::<CustomResourceDefinition>::all(client.clone())
            .create(&PostParams::default(), &crd)
            .await
            .unwrap();
        let pp = PostParams::default();
        until("the Queue API to serve", || async {
            queues
                .create(
                    &pp,
                    &queue("capped", json!({"nominalGpus": 2, "borrowingLimitGpus": 0})),
                )
                .await
                .ok()
        })
        .await;
        match queues
            .create(&pp, &queue("negative", json!({"nominalGpus": -1})))
            .await
        {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422);
                assert!(
                    status.message.contains("spec.nominalGpus"),
                    "{}",
                    status.message
                );
            }
            other => panic!("a negative quota was accepted: {other:?}"),
        }
        // Two roots that lend to each other: lender's 8 GPUs are idle.
        queues
            .create(&pp, &queue("lender", json!({"nominalGpus": 8})))
            .await
            .unwrap();
        queues
            .create(&pp, &queue("borrower", json!({"nominalGpus": 2})))
            .await
            .unwrap();
        queues
            .create(
                &pp,
                &queue("orphan", json!({"parent": "nowhere", "nominalGpus": 4})),
            )
            .await
            .unwrap();
        // Gantry writes the status of the Queues it enforces.
        until("gantry to find the Queue kind and enforce it", || async {
            let capped = queues.get("capped").await.ok()?;
            capped.data.get("status")?.get("usedGpus")?.as_u64()
        })
        .await;
    });
    runtime.block_on(async {
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let pp = PostParams::default();
        for i in 0..3 {
            let p = pod(
                &format!("capped-{i}"),
                1,
                json!({"gantry.dev/queue": "capped"}),
            );
            pods.create(&pp, &p).await.unwrap();
        }
        // Four GPUs in a queue of two: it borrows two of lender's idle eight.
        for i in 0..4 {
            let p = pod(
                &format!("borrow-{i}"),
                1,
                json!({"kueue.x-k8s.io/queue-name": "borrower"}),
            );
            pods.create(&pp, &p).await.unwrap();
        }
        let expected =
            "Waiting for quota: queue capped would borrow 1 GPUs, over its borrowing limit of 0.";
        let events: Api<Event> = Api::namespaced(client.clone(), "default");
        let (bound, held) = until(
            "two capped pods to bind and the third to report its quota",
            || async {
                let all = nodes_by_pod(&pods).await;
                let capped: Vec<&String> = all
                    .iter()
                    .filter(|(name, node)| name.starts_with("capped") && node.is_some())
                    .map(|(name, _)| name)
                    .collect();
                let borrowers =
                    (0..4).all(|i| all.get(&format!("borrow-{i}")).is_some_and(Option::is_some));
                if capped.len() != 2 || !borrowers {
                    return None;
                }
                let held = all
                    .iter()
                    .find(|(n, node)| n.starts_with("capped") && node.is_none())?
                    .0
                    .clone();
                let list = events.list(&ListParams::default()).await.ok()?.items;
                notes(&list, &held, "FailedScheduling")
                    .iter()
                    .any(|n| n == expected)
                    .then_some((capped.len(), held))
            },
        )
        .await;
        assert_eq!(bound, 2);
        let (_, reason, message) = scheduled_condition(&pods.get(&held).await.unwrap()).unwrap();
        assert_eq!(
            (reason.as_str(), message.as_str()),
            ("Unschedulable", expected)
        );
        // Still pending a moment later: the quota holds, it is not a race.
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        assert_eq!(node_of(&pods.get(&held).await.unwrap()), None);
        // The leader writes each Queue's status: its use, its queue, or why it is left out.
        until("the capped Queue's status", || async {
            let status = queues.get("capped").await.ok()?.data["status"].clone();
            (status["usedGpus"] == 2 && status["pendingJobs"] == 1).then_some(())
        })
        .await;
        let problem = until("the orphan Queue's problem in its status", || async {
            let status = queues.get("orphan").await.ok()?.data["status"].clone();
            status["problem"].as_str().map(str::to_string)
        })
        .await;
        assert_eq!(
            problem,
            "queue orphan: spec.parent nowhere is not a usable Queue"
        );
        // Raising the quota (a Queue edit) lets it bind.
        queues
            .patch(
                "capped",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"nominalGpus": 3}})),
            )
            .await
            .unwrap();
        until("the held pod to bind under the raised quota", || async {
            node_of(&pods.get(&held).await.ok()?)
        })
        .await;
    });
    eprintln!(
        "kube queues e2e: passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
