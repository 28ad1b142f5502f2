//! `deploy/` on a real control plane: `kubectl apply -k deploy/` and `deploy/examples` succeed
//! and create their objects; `gantry serve --leader-elect`, run outside the cluster with a
//! kubeconfig holding only a token of the `gantry` ServiceAccount (TokenRequest), takes the
//! Lease and binds the example gang: the RBAC is enough. And it is not too much: that account
//! may not delete a node, and `kubectl auth can-i` says it may not update pod statuses, patch
//! Events, or read or renew another Lease.

mod common;

use std::time::Instant;

use common::kube::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, PostParams};
use serde_json::json;

#[test]
#[ignore = "needs tests/cluster: scripts/test.sh runs it with --include-ignored"]
fn the_deploy_manifests_apply_and_their_rbac_is_enough_and_no_more() {
    let bin = cluster_bin("kube deploy e2e");
    if !std::path::Path::new(&bin).join("kubectl").exists() {
        panic!("no kubectl in {bin}: re-run tests/cluster/build.sh");
    }
    let started = Instant::now();
    let plane = ControlPlane::start(&bin);
    let admin = plane.kubeconfig();
    create_gpu_nodes(&admin, "gpu", 2, 8);
    let applied = apply_deploy(&bin, &admin);
    for object in [
        "namespace/gantry-system created",
        "customresourcedefinition.apiextensions.k8s.io/queues.gantry.dev created",
        "clusterrole.rbac.authorization.k8s.io/gantry created",
        "deployment.apps/gantry created",
        "persistentvolumeclaim/gantry-data created",
        "service/gantry created",
        "networkpolicy.networking.k8s.io/gantry created",
    ] {
        assert!(
            applied.contains(object),
            "kubectl apply -k deploy/ said:\n{applied}"
        );
    }
    let balloons = kubectl(&bin, &admin, &["apply", "-f", "deploy/balloons.yaml"]);
    for object in [
        "priorityclass.scheduling.k8s.io/gantry-balloon created",
        "validatingadmissionpolicy.admissionregistration.k8s.io/gantry-balloon-priority-class created",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/gantry-balloon-priority-class created",
    ] {
        assert!(
            balloons.contains(object),
            "kubectl apply -f deploy/balloons.yaml said:\n{balloons}"
        );
    }
    let token = kubectl(
        &bin,
        &admin,
        &[
            "-n",
            "gantry-system",
            "create",
            "token",
            "gantry",
            "--duration=1h",
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let as_gantry = dir.path().join("gantry.kubeconfig");
    kubeconfig_with_token(&admin, token.trim(), &as_gantry);

    let runtime = test_runtime();
    let (admin_client, gantry_client) =
        runtime.block_on(async { (client(&admin).await, client(&as_gantry).await) });
    runtime.block_on(async {
        // The objects exist.
        let system = |c| -> (Api<Deployment>, Api<ServiceAccount>) {
            (
                Api::namespaced(c, "gantry-system"),
                Api::namespaced(admin_client.clone(), "gantry-system"),
            )
        };
        let (deployments, accounts) = system(admin_client.clone());
        let deployment = deployments.get("gantry").await.unwrap();
        let args = deployment.spec.unwrap().template.spec.unwrap().containers[0]
            .args
            .clone()
            .unwrap();
        assert!(args.contains(&"--leader-elect".to_string()), "{args:?}");
        assert!(
            args.contains(&"--metrics-need-token".to_string()),
            "{args:?}"
        );
        accounts.get("gantry").await.unwrap();
        let queues: Api<DynamicObject> =
            Api::all_with(admin_client.clone(), &gantry_kube::queues::resource());
        assert_eq!(
            queues.get("team-a").await.unwrap().data["spec"]["nominalGpus"],
            48
        );
        Api::<Job>::namespaced(admin_client.clone(), "default")
            .get("train-example")
            .await
            .unwrap();
        balloon_class_only_where_allowed(&admin_client).await;
    });

    // Gantry with the ServiceAccount's token only, as the Deployment would run it.
    let replica = Replica::start(
        &as_gantry,
        &[
            "--leader-elect",
            "--leader-elect-namespace",
            "gantry-system",
        ],
    );
    runtime.block_on(async {
        let nodes = bind_example_gang(&admin_client).await;
        assert_ne!(nodes.0, nodes.1, "two 8-GPU pods on two 8-GPU nodes");
        let leases: Api<Lease> = Api::namespaced(admin_client.clone(), "gantry-system");
        let holder = until("gantry to hold the Lease", || async {
            leases.get_opt("gantry").await.ok()??.spec?.holder_identity
        })
        .await;
        let printed = replica
            .printed("leader election: lease gantry-system/gantry as")
            .unwrap();
        assert_eq!(holder, printed);

        // It may write Queue statuses: team-a holds the gang's 16 GPUs.
        let queues: Api<DynamicObject> =
            Api::all_with(admin_client.clone(), &gantry_kube::queues::resource());
        until("team-a's status to count the gang", || async {
            let status = queues.get("team-a").await.ok()?.data["status"].clone();
            (status["usedGpus"] == 16).then_some(())
        })
        .await;

        // Least privilege: the account may not delete a node.
        let nodes_as_gantry: Api<Node> = Api::all(gantry_client.clone());
        match nodes_as_gantry
            .delete("gpu-0", &DeleteParams::default())
            .await
        {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
            other => panic!("deleting a node as gantry should be forbidden: {other:?}"),
        }
    });
    // What the account may and may not do, as `kubectl auth can-i` answers for it.
    let can_i = |args: &[&str]| {
        let out = std::process::Command::new(std::path::Path::new(&bin).join("kubectl"))
            .arg("--kubeconfig")
            .arg(&admin)
            .args(["auth", "can-i"])
            .args(args)
            .arg("--as=system:serviceaccount:gantry-system:gantry")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    for (args, answer) in [
        (&["delete", "pods"][..], "no"),
        (&["update", "pods", "--subresource=status"][..], "no"),
        (&["patch", "pods", "--subresource=status"][..], "yes"),
        (&["patch", "events.events.k8s.io"][..], "no"),
        (&["create", "events.events.k8s.io"][..], "yes"),
        (&["create", "pods", "--subresource=eviction"][..], "yes"),
        (&["create", "pods", "--subresource=binding"][..], "yes"),
        (&["get", "nodes"][..], "no"),
        (&["update", "queues.gantry.dev"][..], "no"),
        (
            &["-n", "gantry-system", "update", "leases/gantry"][..],
            "yes",
        ),
        (&["-n", "gantry-system", "update", "leases/other"][..], "no"),
        (&["-n", "gantry-system", "get", "leases/other"][..], "no"),
        (&["-n", "gantry-system", "create", "leases"][..], "yes"),
        (&["-n", "default", "create", "leases"][..], "no"),
    ] {
        assert_eq!(can_i(args), answer, "kubectl auth can-i {}", args.join(" "));
    }
    drop(replica);
    eprintln!(
        "kube deploy e2e: passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// `balloons.yaml`'s admission policy: a tenant's pod naming the balloon PriorityClass is
/// refused with the policy's message; in a namespace labelled `gantry.dev/balloons=allowed`
/// it is created.
async fn balloon_class_only_where_allowed(admin: &kube::Client) {
    let pp = PostParams::default();
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    for (name, labels) in [
        ("tenant", json!({})),
        ("balloons", json!({"gantry.dev/balloons": "allowed"})),
    ] {
        let namespace: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
        namespaces.create(&pp, &namespace).await.unwrap();
    }
    let balloon = |name: &str| -> Pod {
        let mut pod = pod(name, 1, json!({"gantry.dev/balloon": "true"}));
        pod.spec.as_mut().unwrap().priority_class_name = Some("gantry-balloon".into());
        pod
    };
    let tenant: Api<Pod> = Api::namespaced(admin.clone(), "tenant");
    // A new policy takes a moment to be enforced: a pod admitted before then is deleted and
    // the create tried again.
    let refusal = until("the balloon policy to refuse a tenant's pod", || async {
        match tenant.create(&pp, &balloon("fake-balloon")).await {
            Err(kube::Error::Api(status)) if status.code != 409 => Some(status),
            Ok(_) => {
                let _ = tenant
                    .delete("fake-balloon", &DeleteParams::default())
                    .await;
                None
            }
            Err(_) => None,
        }
    })
    .await;
    // The policy's reason is Forbidden (403); the message is what a tenant reads.
    assert_eq!(refusal.code, 403, "{refusal:?}");
    assert!(
        refusal.message.contains(
            "PriorityClass gantry-balloon is for Gantry's balloons only: label the namespace \
             gantry.dev/balloons=allowed to run them here"
        ),
        "{}",
        refusal.message
    );
    let allowed: Api<Pod> = Api::namespaced(admin.clone(), "balloons");
    allowed.create(&pp, &balloon("balloon-0")).await.unwrap();
    // Gone before gantry starts: the example gang needs every GPU.
    allowed
        .delete("balloon-0", &DeleteParams::default())
        .await
        .unwrap();
}
