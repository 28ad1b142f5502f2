//! Queues and quotas as `Queue` objects (`gantry.dev/v1alpha1`, deploy/crds/) on a real control
//! plane, the CRD installed after gantry started (it finds the kind without a restart): the
//! CRD's schema refuses a negative quota and a selector term without values; a queue at its
//! quota of 2 GPUs with no borrowing holds its third pod pending with the quota reason in
//! FailedScheduling, and the start estimate there once the forecast gives one; a queue
//! whose cohort sibling is idle borrows beyond its quota; a Queue the scheduler cannot use (its
//! parent does not exist) is left out without stopping anything, and says why in its status;
//! the others' status shows the GPUs they use and their pending jobs. Kueue's
//! `kueue.x-k8s.io/queue-name` names a LocalQueue (its CRD also installed after start), whose
//! `spec.clusterQueue` is the queue charged.
//!
//! The tenant trust boundary, on the same control plane: queues admit only the namespaces their
//! `namespaceSelector` selects; a pod in team-a naming team-b's queue, a cohort, or an
//! undeclared queue stays pending with the reason in its FailedScheduling Event (posted once);
//! a tenant's pod labelled `gantry.dev/balloon` without a trusted PriorityClass is charged to
//! its queue like any other (its Queue's usedGpus, and a second pod held by the quota); and
//! labelling team-a's namespace so team-b's selector selects it lets the refused pod bind.

mod common;

use std::time::Instant;

use common::kube::*;
use k8s_openapi::api::core::v1::{Namespace, Pod};
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

fn local_queue_resource() -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta1", "LocalQueue"),
        "localqueues",
    )
}

/// Kueue's LocalQueue CRD, reduced to what Gantry reads (`spec.clusterQueue`).
fn local_queue_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "metadata": {"name": "localqueues.kueue.x-k8s.io"},
        "spec": {
            "group": "kueue.x-k8s.io",
            "names": {"kind": "LocalQueue", "plural": "localqueues", "singular": "localqueue"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1beta1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"clusterQueue": {"type": "string"}}},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                }}},
                "subresources": {"status": {}}
            }]
        }
    }))
    .unwrap()
}

fn namespace(name: &str, labels: serde_json::Value) -> Namespace {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
}

#[test]
#[ignore = "needs tests/cluster: scripts/test.sh runs it with --include-ignored"]
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
        // The tenants' namespaces: team-a's and team-b's queues select them by label.
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let pp = PostParams::default();
        namespaces
            .create(&pp, &namespace("team-a", json!({"gantry.dev/team": "a"})))
            .await
            .unwrap();
        namespaces
            .create(
                &pp,
                &namespace("team-b", json!({"gantry.dev/team-b": "member"})),
            )
            .await
            .unwrap();
        // The CRDs, installed after gantry started: it looks for the kinds again every 30 s
        // and watches each once it is served. Queue's from deploy/, Kueue's LocalQueue
        // reduced to what gantry reads.
        let text =
            std::fs::read_to_string(repo().join("deploy/crds/queues.gantry.dev.yaml")).unwrap();
        let crd: CustomResourceDefinition = serde_yaml::from_str(&text).unwrap();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        crds.create(&pp, &local_queue_crd()).await.unwrap();
        crds.create(&pp, &crd).await.unwrap();
        let local_queues: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), "default", &local_queue_resource());
        until("the LocalQueue API to serve", || async {
            let mut object = DynamicObject::new("team-queue", &local_queue_resource());
            object.data = json!({"spec": {"clusterQueue": "borrower"}});
            local_queues.create(&pp, &object).await.ok()
        })
        .await;
        until("the Queue API to serve", || async {
            queues
                .create(
                    &pp,
                    &queue(
                        "capped",
                        json!({
                            "nominalGpus": 2,
                            "borrowingLimitGpus": 0,
                            // Every namespace carries its name as this label.
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": "default"}
                            }
                        }),
                    ),
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
        // A selector whose In has no values is refused too, with the CRD's message.
        let bad = queue(
            "bad-selector",
            json!({"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In"}]}}),
        );
        match queues.create(&pp, &bad).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422);
                assert!(
                    status
                        .message
                        .contains("In and NotIn need values; Exists and DoesNotExist take none"),
                    "{}",
                    status.message
                );
            }
            other => panic!("a selector without values was accepted: {other:?}"),
        }
        // Two roots that lend to each other: lender's 8 GPUs are idle. `{}` selects every
        // namespace.
        queues
            .create(
                &pp,
                &queue("lender", json!({"nominalGpus": 8, "namespaceSelector": {}})),
            )
            .await
            .unwrap();
        queues
            .create(
                &pp,
                &queue(
                    "borrower",
                    json!({"nominalGpus": 2, "namespaceSelector": {}}),
                ),
            )
            .await
            .unwrap();
        // The tenants: a cohort of two teams, each admitting its own namespaces.
        queues
            .create(&pp, &queue("research", json!({"nominalGpus": 3})))
            .await
            .unwrap();
        queues
            .create(
                &pp,
                &queue(
                    "team-a",
                    json!({
                        "parent": "research",
                        "nominalGpus": 2,
                        "borrowingLimitGpus": 0,
                        "namespaceSelector": {"matchLabels": {"gantry.dev/team": "a"}}
                    }),
                ),
            )
            .await
            .unwrap();
        queues
            .create(
                &pp,
                &queue(
                    "team-b",
                    json!({
                        "parent": "research",
                        "nominalGpus": 1,
                        "namespaceSelector": {"matchExpressions": [
                            {"key": "gantry.dev/team-b", "operator": "Exists"}
                        ]}
                    }),
                ),
            )
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
        // Four GPUs in a queue of two: it borrows two of lender's idle eight. Kueue's label
        // names the namespace's LocalQueue, which points to borrower.
        for i in 0..4 {
            let p = pod(
                &format!("borrow-{i}"),
                1,
                json!({"kueue.x-k8s.io/queue-name": "team-queue"}),
            );
            pods.create(&pp, &p).await.unwrap();
        }
        let expected =
            "Waiting for quota: queue capped would borrow 1 GPU, over its borrowing limit of 0.";
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
        assert_eq!(reason, "Unschedulable");
        assert!(message.starts_with(expected), "{message}");
        // Still pending a moment later: the quota holds, it is not a race.
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        assert_eq!(node_of(&pods.get(&held).await.unwrap()), None);
        // Parked for quota since its first attempt, it is not tried again until quota frees.
        // The plan covers only jobs waiting for room; the forecast, run off the loop at most
        // once a minute, gives it a start, and its message says so then.
        let told = until(
            "the held pod's FailedScheduling to carry its estimate",
            || async {
                let list = events.list(&ListParams::default()).await.ok()?.items;
                notes(&list, &held, "FailedScheduling")
                    .into_iter()
                    .find(|n| n.starts_with(expected) && n.contains(" Expected to start in about "))
            },
        )
        .await;
        // The condition is written beside the Event, not with it: read until it agrees.
        until(
            "the held pod's PodScheduled condition to carry it too",
            || async {
                let pod = pods.get(&held).await.ok()?;
                let (_, _, message) = scheduled_condition(&pod)?;
                message
                    .contains(" Expected to start in about ")
                    .then_some(())
            },
        )
        .await;
        eprintln!("queues e2e: the held pod was told: {told}");
        // The leader writes each Queue's status: its use, its queue, or why it is left out.
        until("the capped Queue's status", || async {
            let status = queues.get("capped").await.ok()?.data["status"].clone();
            (status["usedGpus"] == 2 && status["pendingJobs"] == 1).then_some(())
        })
        .await;
        until(
            "the borrower Queue's status to count the LocalQueue's pods",
            || async {
                let status = queues.get("borrower").await.ok()?.data["status"].clone();
                (status["usedGpus"] == 4).then_some(())
            },
        )
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
    runtime.block_on(async {
        let pods: Api<Pod> = Api::namespaced(client.clone(), "team-a");
        let events: Api<Event> = Api::namespaced(client.clone(), "team-a");
        let pp = PostParams::default();
        // (1) team-b's queue from team-a, (2) a cohort, (3) an undeclared queue: refused.
        let refused = [
            (
                "intruder",
                "team-b",
                "queue \"team-b\" does not admit pods from namespace \"team-a\" (its namespaceSelector does not select it)",
            ),
            (
                "cohort",
                "research",
                "\"research\" is a cohort, not a queue: name one of its queues (team-a, team-b)",
            ),
            (
                "undeclared",
                "nope",
                "queue \"nope\" is not declared: declared queues are borrower, capped, lender, team-a, team-b",
            ),
        ];
        for (name, queue, _) in refused {
            pods.create(&pp, &pod(name, 1, json!({"gantry.dev/queue": queue})))
                .await
                .unwrap();
        }
        // A tenant's pod that calls itself a balloon, with no trusted PriorityClass: it is
        // charged to team-a (2 GPUs, the whole quota), and not given away as a balloon.
        pods.create(
            &pp,
            &pod(
                "fake-balloon",
                2,
                json!({"gantry.dev/queue": "team-a", "gantry.dev/balloon": "true"}),
            ),
        )
        .await
        .unwrap();
        until("the tenant's balloon-labelled pod to bind", || async {
            node_of(&pods.get("fake-balloon").await.ok()?)
        })
        .await;
        for (name, _, expected) in refused {
            let (_, reason, message) = until(&format!("{name}'s refusal"), || async {
                let condition = scheduled_condition(&pods.get(name).await.ok()?)?;
                (condition.2 == expected).then_some(condition)
            })
            .await;
            assert_eq!((reason.as_str(), message.as_str()), ("Unschedulable", expected));
        }
        let team_a_used = until("team-a's status to charge the balloon-labelled pod", || async {
            let status = queues.get("team-a").await.ok()?.data["status"].clone();
            status["usedGpus"].as_u64().filter(|&used| used > 0)
        })
        .await;
        assert_eq!(team_a_used, 2);
        // A second team-a pod is held by the quota: the first was charged, not a balloon
        // (a real balloon would give way to it).
        pods.create(&pp, &pod("second", 1, json!({"gantry.dev/queue": "team-a"})))
            .await
            .unwrap();
        let quota =
            "Waiting for quota: queue team-a would borrow 1 GPU, over its borrowing limit of 0.";
        until("the second team-a pod to report its quota", || async {
            let condition = scheduled_condition(&pods.get("second").await.ok()?)?;
            (condition.2 == quota).then_some(())
        })
        .await;
        // Each refusal is posted once, not every pass, and nothing refused was bound.
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        let list = events.list(&ListParams::default()).await.unwrap().items;
        for (name, _, expected) in refused {
            let posted = notes(&list, name, "FailedScheduling");
            assert_eq!(
                posted.iter().filter(|n| *n == expected).count(),
                1,
                "{name}: {posted:?}"
            );
            assert_eq!(node_of(&pods.get(name).await.unwrap()), None, "{name}");
        }
        assert_eq!(node_of(&pods.get("second").await.unwrap()), None);
        assert!(node_of(&pods.get("fake-balloon").await.unwrap()).is_some());
        // A tenant's pod placed by hand (a preset nodeName) naming a queue its namespace may
        // not use: it holds its GPU, but capped (3 GPUs used) is not charged, and its Event
        // says so. No default queue is declared, so it is charged to none.
        let capped_used = || async {
            queues.get("capped").await.ok()?.data["status"]["usedGpus"].as_u64()
        };
        until("capped's status to count its 3 pods", || async {
            (capped_used().await? == 3).then_some(())
        })
        .await;
        let mut squatter = pod("squatter", 1, json!({"gantry.dev/queue": "capped"}));
        squatter.spec.as_mut().unwrap().node_name = Some("gpu-1".into());
        pods.create(&pp, &squatter).await.unwrap();
        let charged = "Charged to no queue (its GPUs count against no quota, and it is never \
                       preempted for one): queue \"capped\" does not admit pods from namespace \
                       \"team-a\" (its namespaceSelector does not select it).";
        until("the squatter's Event to say where it is charged", || async {
            let list = events.list(&ListParams::default()).await.ok()?.items;
            notes(&list, "squatter", "QueueNotAdmitted")
                .iter()
                .any(|n| n == charged)
                .then_some(())
        })
        .await;
        // Longer than the leader's Queue status interval (5 s): a charge would show by then.
        tokio::time::sleep(std::time::Duration::from_secs(6)).await;
        assert_eq!(capped_used().await, Some(3), "the squatter was charged to capped");
        // team-a's namespace gets the label team-b's selector asks for: the intruder is
        // admitted now, and binds in team-b.
        Api::<Namespace>::all(client.clone())
            .patch(
                "team-a",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(
                    json!({"metadata": {"labels": {"gantry.dev/team-b": "guest"}}}),
                ),
            )
            .await
            .unwrap();
        until("the intruder to bind once its namespace is admitted", || async {
            node_of(&pods.get("intruder").await.ok()?)
        })
        .await;
        until("team-b's status to count it", || async {
            let status = queues.get("team-b").await.ok()?.data["status"].clone();
            (status["usedGpus"] == 1).then_some(())
        })
        .await;
    });
    eprintln!(
        "kube queues e2e: passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
