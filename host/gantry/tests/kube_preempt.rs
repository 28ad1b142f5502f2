//! Preemption on a real control plane (tests/cluster/): balloons and lower-priority pods are
//! evicted through the Eviction API for a higher-priority gang, which binds whole once they are
//! gone; a PodDisruptionBudget that blocks an eviction keeps its pod in place, and the
//! preemptor says why; a victim that terminates gracefully keeps its GPUs, and the preemptor
//! waits, nominated, until it is gone.

mod common;

use std::time::Instant;

use common::kube::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;

/// A balloon from a trusted source: the label counts only with gantry's balloon PriorityClass
/// (`--balloon-priority-class`, default gantry-balloon), which each test creates.
fn balloon(name: &str, grace_s: i64) -> Pod {
    with_priority(
        pod(name, 8, json!({"gantry.dev/balloon": "true"})),
        Some("gantry-balloon"),
        grace_s,
    )
}

/// Four balloons fill four 8-GPU nodes; a gang of two 8-GPU pods of priority 1000 evicts two
/// of them (Preempted events, "Preempted by pod ... on node ...") and binds whole; the other
/// two balloons stay.
#[test]
#[ignore = "needs tests/cluster: scripts/test.sh runs it with --include-ignored"]
fn balloons_give_way_to_a_high_priority_gang() {
    let bin = cluster_bin("kube preemption e2e");
    let started = Instant::now();
    let plane = ControlPlane::start(&bin);
    let kubeconfig = plane.kubeconfig();
    create_gpu_nodes(&kubeconfig, "gpu", 4, 8);
    let data = tempfile::tempdir().unwrap();
    let _serve = serve_kube(&kubeconfig, data.path());
    test_runtime().block_on(async {
        let client = client(&kubeconfig).await;
        create_priority_class(&client, "high", 1000).await;
        create_priority_class(&client, "gantry-balloon", 0).await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let pp = PostParams::default();
        for i in 0..4 {
            pods.create(&pp, &balloon(&format!("balloon-{i}"), 0))
                .await
                .unwrap();
        }
        until("the balloons to bind", || async {
            let bound = nodes_by_pod(&pods).await;
            (bound.len() == 4 && bound.values().all(Option::is_some)).then_some(())
        })
        .await;
        for i in 0..2 {
            let labels = json!({"gantry.dev/gang": "train", "gantry.dev/gang-size": "2"});
            let gang_pod = with_priority(pod(&format!("train-{i}"), 8, labels), Some("high"), 0);
            pods.create(&pp, &gang_pod).await.unwrap();
        }
        let bound = until("the gang to bind in the balloons' place", || async {
            let bound = nodes_by_pod(&pods).await;
            let gang = ["train-0", "train-1"]
                .iter()
                .all(|p| bound.get(*p).is_some_and(Option::is_some));
            (gang && bound.len() == 4).then_some(bound)
        })
        .await;
        let balloons: Vec<&String> = bound.keys().filter(|p| p.starts_with("balloon")).collect();
        assert_eq!(balloons.len(), 2, "two balloons stay: {bound:?}");
        let nodes: std::collections::BTreeSet<_> = bound.values().flatten().collect();
        assert_eq!(nodes.len(), 4, "one 8-GPU pod per node: {bound:?}");
        let events: Api<Event> = Api::namespaced(client.clone(), "default");
        let preempted = until("Preempted events on the two victims", || async {
            let events = events.list(&ListParams::default()).await.ok()?.items;
            let notes: Vec<String> = (0..4)
                .filter(|i| !bound.contains_key(&format!("balloon-{i}")))
                .flat_map(|i| notes(&events, &format!("balloon-{i}"), "Preempted"))
                .collect();
            (notes.len() == 2).then_some(notes)
        })
        .await;
        for note in &preempted {
            assert!(
                note.starts_with("Preempted by pod default/train-")
                    && note.contains(" on node gpu-"),
                "Preempted note: {note}"
            );
        }
    });
    eprintln!(
        "kube preemption e2e: passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// One 8-GPU node holds a balloon under a PodDisruptionBudget (minAvailable 1): the eviction
/// is refused (429), the balloon stays, and the preemptor's PodScheduled condition names the
/// budget; once the budget is deleted the retried eviction goes through and the preemptor
/// binds. Then a victim with a 30 s grace period: it is evicted but terminates (no kubelet
/// finishes it), so the preemptor is nominated, not bound, until the pod is gone.
#[test]
#[ignore = "needs tests/cluster: scripts/test.sh runs it with --include-ignored"]
fn budgets_and_graceful_termination_hold_the_preemptor_back() {
    let bin = cluster_bin("kube preemption (PDB) e2e");
    let started = Instant::now();
    let plane = ControlPlane::start(&bin);
    let kubeconfig = plane.kubeconfig();
    create_gpu_nodes(&kubeconfig, "gpu", 1, 8);
    let data = tempfile::tempdir().unwrap();
    let _serve = serve_kube(&kubeconfig, data.path());
    test_runtime().block_on(async {
        let client = client(&kubeconfig).await;
        create_priority_class(&client, "high", 1000).await;
        create_priority_class(&client, "gantry-balloon", 0).await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let pp = PostParams::default();
        let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
        let budget: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": "keep-one"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "kept"}}}
        }))
        .unwrap();
        budgets.create(&pp, &budget).await.unwrap();
        let mut kept = balloon("kept", 0);
        kept.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("app".into(), "kept".into());
        pods.create(&pp, &kept).await.unwrap();
        // Running, as kwok makes it: the Eviction API ignores budgets for pending pods.
        until("the kept balloon to run", || async {
            let kept = pods.get("kept").await.ok()?;
            (kept.status?.phase.as_deref() == Some("Running")).then_some(())
        })
        .await;
        pods.create(
            &pp,
            &with_priority(pod("urgent", 8, json!({})), Some("high"), 0),
        )
        .await
        .unwrap();
        let message = until("the urgent pod to say the budget blocks it", || async {
            let (_, _, message) = scheduled_condition(&pods.get("urgent").await.ok()?)?;
            message
                .contains("cannot evict default/kept")
                .then_some(message)
        })
        .await;
        assert!(
            message.contains("disruption budget"),
            "the reason names the budget: {message}"
        );
        let still = pods.get("kept").await.unwrap();
        assert_eq!(node_of(&still).as_deref(), Some("gpu-0"));
        assert!(
            still.metadata.deletion_timestamp.is_none(),
            "kept was not evicted"
        );
        assert_eq!(node_of(&pods.get("urgent").await.unwrap()), None);

        budgets
            .delete("keep-one", &DeleteParams::default())
            .await
            .unwrap();
        until(
            "the urgent pod to bind after the budget is gone",
            || async { node_of(&pods.get("urgent").await.ok()?) },
        )
        .await;
        assert!(
            pods.get_opt("kept").await.unwrap().is_none(),
            "kept was evicted"
        );

        // Running first, so gantry's bound-pod cache has seen it: a pod deleted before that
        // would stay assumed on its node for the assume cache's 60 s TTL.
        until("the urgent pod to run", || async {
            let urgent = pods.get("urgent").await.ok()?;
            (urgent.status?.phase.as_deref() == Some("Running")).then_some(())
        })
        .await;
        // A graceful victim: evicted, it terminates for 30 s, holding its GPUs meanwhile.
        pods.delete(
            "urgent",
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        pods.create(&pp, &balloon("slow", 30)).await.unwrap();
        until("the slow balloon to bind", || async {
            node_of(&pods.get("slow").await.ok()?)
        })
        .await;
        pods.create(
            &pp,
            &with_priority(pod("second", 8, json!({})), Some("high"), 0),
        )
        .await
        .unwrap();
        let nominated = until(
            "the second pod to be nominated while slow terminates",
            || async {
                let second = pods.get("second").await.ok()?;
                second.status.as_ref()?.nominated_node_name.clone()
            },
        )
        .await;
        assert_eq!(nominated, "gpu-0");
        let slow = pods.get("slow").await.unwrap();
        assert!(
            slow.metadata.deletion_timestamp.is_some(),
            "slow is terminating"
        );
        // Give the scheduler a few cycles: it must not bind onto GPUs slow still holds.
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        let second = pods.get("second").await.unwrap();
        assert_eq!(node_of(&second), None, "bound while the victim still ran");
        let (_, _, message) = scheduled_condition(&second).unwrap_or_default();
        assert!(
            message.contains("waiting for preempted pod(s) default/slow to terminate"),
            "second's condition: {message}"
        );
        // What a kubelet would do when the container exits.
        pods.delete(
            "slow",
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        until("the second pod to bind once slow is gone", || async {
            node_of(&pods.get("second").await.ok()?)
        })
        .await;
    });
    eprintln!(
        "kube preemption (PDB, graceful) e2e: passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// A ValidatingAdmissionPolicy that denies the binding of any pod whose name starts with
/// `denied-`: what an admission webhook or a policy engine does to a scheduler's bindings.
fn deny_bindings_policy() -> (serde_json::Value, serde_json::Value) {
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "deny-bindings"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["pods/binding"]
            }]},
            "validations": [{
                "expression": "!object.metadata.name.startsWith('denied-')",
                "message": "bindings of denied-* pods are refused by policy deny-bindings"
            }]
        }
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "deny-bindings"},
        "spec": {"policyName": "deny-bindings", "validationActions": ["Deny"]}
    });
    (policy, binding)
}

/// The count of failed bindings gantry's /metrics reports.
fn binding_errors(replica: &Replica) -> Option<u64> {
    let (_, text) = replica.get("/metrics")?;
    text.lines()
        .filter(|l| {
            l.starts_with("scheduler_schedule_attempts_total") && l.contains("result=\"error\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .next()
        .or(Some(0))
}

/// An admission policy denies the binding of one member of a gang: no member stays bound, the
/// stored decision says the binding failed with the API server's message, FailedScheduling
/// names it, and a binding that keeps failing is retried with a growing backoff, not every
/// cycle.
#[test]
#[ignore = "needs tests/cluster: scripts/test.sh runs it with --include-ignored"]
fn a_denied_binding_rolls_the_gang_back_and_backs_off() {
    let bin = cluster_bin("kube bind faults e2e");
    let plane = ControlPlane::start(&bin);
    let kubeconfig = plane.kubeconfig();
    create_gpu_nodes(&kubeconfig, "gpu", 2, 8);
    test_runtime().block_on(async {
        let client = client(&kubeconfig).await;
        let (policy, binding) = deny_bindings_policy();
        let dynamic = |kind: &str, plural: &str| {
            let gvk = kube::api::GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
            Api::<kube::api::DynamicObject>::all_with(
                client.clone(),
                &kube::api::ApiResource::from_gvk_with_plural(&gvk, plural),
            )
        };
        let pp = PostParams::default();
        dynamic("ValidatingAdmissionPolicy", "validatingadmissionpolicies")
            .create(&pp, &serde_json::from_value(policy).unwrap())
            .await
            .unwrap();
        dynamic(
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
        )
        .create(&pp, &serde_json::from_value(binding).unwrap())
        .await
        .unwrap();
        // The API server loads policies asynchronously: wait until a probe's binding is denied.
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let mut probe = pod("denied-probe", 0, json!({}));
        probe.spec.as_mut().unwrap().scheduler_name = Some("nobody".into());
        pods.create(&pp, &probe).await.unwrap();
        until("the policy to deny bindings", || async {
            let binding: k8s_openapi::api::core::v1::Binding = serde_json::from_value(json!({
                "metadata": {"name": "denied-probe"},
                "target": {"kind": "Node", "name": "gpu-0"}
            }))
            .unwrap();
            match pods
                .create_subresource::<_, serde_json::Value>(
                    "binding",
                    "denied-probe",
                    &pp,
                    &binding,
                )
                .await
            {
                Err(kube::Error::Api(s)) if s.message.contains("deny-bindings") => Some(()),
                _ => None,
            }
        })
        .await;

        let replica = Replica::start(&kubeconfig, &[]);
        let gang = json!({"gantry.dev/gang": "train", "gantry.dev/gang-size": "2"});
        pods.create(&pp, &pod("train-0", 8, gang.clone()))
            .await
            .unwrap();
        pods.create(&pp, &pod("denied-train-1", 8, gang))
            .await
            .unwrap();
        // FailedScheduling says why, quoting the API server (the condition moves on to the
        // gang's wait once its deleted member is missed).
        let events: Api<Event> = Api::namespaced(client.clone(), "default");
        let failed = until("FailedScheduling on the denied member", || async {
            let listed = events.list(&ListParams::default()).await.ok()?.items;
            let failed = notes(&listed, "denied-train-1", "FailedScheduling");
            failed
                .iter()
                .any(|n| n.starts_with("Binding failed"))
                .then_some(failed)
        })
        .await;
        assert!(
            failed.iter().any(
                |n| n.contains("bindings of denied-* pods are refused by policy deny-bindings")
            ),
            "FailedScheduling quotes the API server: {failed:?}"
        );
        // No member stays bound: the one whose binding went through is deleted (it terminates
        // gracefully; kwok, like a kubelet, waits out its grace period).
        until("no gang member to stay bound", || async {
            let list = pods.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .filter(|p| {
                    p.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.contains("train"))
                })
                .all(|p| node_of(p).is_none() || p.metadata.deletion_timestamp.is_some())
                .then_some(())
        })
        .await;
        let train_0 = pods.get("train-0").await.unwrap();
        assert!(
            train_0.metadata.deletion_timestamp.is_some(),
            "the member bound before its peer's binding failed is being deleted"
        );
        // The stored record says what happened: not placed, the binding failed, and why. It is
        // written after the binding pass, so it may land a moment after the rollback shows.
        let body = until("the gang's decisions to be stored", || async {
            let (status, body) = replica.get("/api/decisions/job/default%2Ftrain")?;
            (status == 200).then_some(body)
        })
        .await;
        assert!(
            body.contains("its binding to be retried (it failed: ")
                && body.contains("refused by policy deny-bindings"),
            "stored: {body}"
        );
        assert!(
            !body.contains("\"kind\":\"placed\""),
            "never stored as placed: {body}"
        );

        // A lone pod whose binding always fails: retried, with a backoff (1 s, 2 s, 4 s...).
        let before = until("metrics", || async { binding_errors(&replica) }).await;
        let started = Instant::now();
        pods.create(&pp, &pod("denied-solo", 8, json!({})))
            .await
            .unwrap();
        until("three more failed bindings", || async {
            (binding_errors(&replica)? >= before + 3).then_some(())
        })
        .await;
        // Backoffs of 1 s then 2 s put the third failure about 3 s after the first; retried
        // every 50 ms cycle, all three would fail within a fraction of a second.
        let took = started.elapsed().as_secs_f64();
        assert!(
            took >= 2.0,
            "three bindings failed within {took:.1} s: retried every cycle, not after backoffs"
        );
    });
}
