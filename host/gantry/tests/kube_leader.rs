//! Leader election on a real control plane: two `gantry serve --leader-elect` replicas share
//! one `coordination.k8s.io/v1` Lease. Only the holder schedules (the other stores no decision
//! and says in /api/cluster that it follows, and whom); freeze the holder past its Lease and
//! the other takes over, while the thawed one writes nothing; SIGKILL the holder and the other
//! takes the Lease once it expires and binds a new pod.
//!
//! The failover bound is functional, not a performance threshold: the holder renews every 2 s,
//! so its last renewal is at most 2 s before the kill, and the follower takes the Lease when
//! `renewTime + 15 s` has passed (it wakes at that moment). So a pod created at the kill binds
//! at most ~15 s later, plus the new leader's first cycle and bind and the test's 200 ms
//! polling: the test allows 15 s + 3 s.

mod common;

use std::time::{Duration, Instant};

use common::kube::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

#[test]
#[ignore = "needs tests/cluster: scripts/test.sh runs it with --include-ignored"]
fn one_replica_leads_and_the_other_takes_over_when_it_dies() {
    let bin = cluster_bin("kube leader election e2e");
    let started = Instant::now();
    let plane = ControlPlane::start(&bin);
    let kubeconfig = plane.kubeconfig();
    create_gpu_nodes(&kubeconfig, "gpu", 4, 8);
    let mut replicas = vec![
        Replica::start(&kubeconfig, &["--leader-elect"]),
        Replica::start(&kubeconfig, &["--leader-elect"]),
    ];
    let runtime = test_runtime();
    let client = runtime.block_on(client(&kubeconfig));
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // Creates a 1-GPU pod and waits until some replica binds it.
    let create_and_bind = |name: &str, what: &str| {
        runtime.block_on(async {
            pods.create(&PostParams::default(), &pod(name, 1, json!({})))
                .await
                .unwrap();
            until(what, || async { node_of(&pods.get(name).await.ok()?) }).await;
        });
    };
    let identities: Vec<String> = replicas
        .iter()
        .map(|r| {
            let deadline = Instant::now() + PATIENCE;
            loop {
                if let Some(line) = r.printed("leader election: lease default/gantry as") {
                    break line;
                }
                assert!(
                    Instant::now() < deadline,
                    "a replica never started electing"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        })
        .collect();
    let holder = |leases: Api<Lease>| async move {
        until("the Lease to have a holder", || async {
            leases.get_opt("gantry").await.ok()??.spec?.holder_identity
        })
        .await
    };
    let leader_id = runtime.block_on(holder(leases.clone()));
    let leader = identities
        .iter()
        .position(|id| *id == leader_id)
        .expect("the holder is one of the replicas");
    let follower = 1 - leader;
    eprintln!("leader {leader_id}, follower {}", identities[follower]);

    create_and_bind("first", "the first pod to bind");
    // Only the leader decided: the follower has no decision about the pod, and says it follows.
    let wait_for = |replica: &Replica, path: &str, want: &dyn Fn(&(u16, String)) -> bool| {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(answer) = replica.get(path)
                && want(&answer)
            {
                return answer;
            }
            assert!(Instant::now() < deadline, "{path} never answered as wanted");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    wait_for(
        &replicas[leader],
        "/api/decisions/job/default%2Ffirst",
        &|a| a.0 == 200,
    );
    let (status, body) = replicas[follower]
        .get("/api/decisions/job/default%2Ffirst")
        .unwrap();
    assert!(
        stored_nothing(status, &body),
        "the follower stored a decision: {status} {body}"
    );
    let (_, body) = wait_for(&replicas[follower], "/api/cluster", &|a| {
        a.1.contains("follower") && a.1.contains(&leader_id)
    });
    let summary: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        summary["cluster"],
        format!("kube (follower; leader {leader_id})")
    );
    assert_eq!(
        replicas[follower].get("/readyz").map(|a| a.0),
        Some(200),
        "a follower serves the API read-only"
    );

    // The holder renews: renewTime moves past acquireTime.
    runtime.block_on(until("the leader to renew the Lease", || async {
        let spec = leases.get("gantry").await.ok()?.spec?;
        (spec.renew_time? != spec.acquire_time?).then_some(())
    }));

    // Freeze the leader (SIGSTOP) past its Lease: its renewals stop, as if slowed without
    // end. The follower takes the Lease and binds a pod created meanwhile; thawed, the old
    // leader finds its last renewal older than the renew deadline and writes nothing: it
    // stores no decision about either pod, and follows.
    let signal = |replica: &Replica, sig: &str| {
        let pid = replica.process.0.id().to_string();
        let status = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill {sig} {pid}");
    };
    signal(&replicas[leader], "-STOP");
    create_and_bind("frozen", "the pod created during the freeze to bind");
    let lease = runtime
        .block_on(leases.get("gantry"))
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(
        lease.holder_identity.as_deref(),
        Some(identities[follower].as_str()),
        "the follower took the Lease while the leader was frozen"
    );
    signal(&replicas[leader], "-CONT");
    create_and_bind("thawed", "the pod created after the thaw to bind");
    wait_for(
        &replicas[follower],
        "/api/decisions/job/default%2Fthawed",
        &|a| a.0 == 200,
    );
    wait_for(&replicas[leader], "/api/cluster", &|a| {
        a.1.contains("follower")
    });
    for job in ["frozen", "thawed"] {
        let (status, body) = replicas[leader]
            .get(&format!("/api/decisions/job/default%2F{job}"))
            .unwrap();
        assert!(
            stored_nothing(status, &body),
            "the thawed ex-leader decided about {job}: {status} {body}"
        );
    }
    // The roles swapped.
    let (leader, follower) = (follower, leader);
    let leader_id = identities[leader].clone();
    eprintln!("after the freeze: leader {leader_id}");

    // SIGKILL the leader: no release, the Lease must expire.
    let mut dead = replicas.remove(leader);
    dead.process.0.kill().unwrap();
    let killed = Instant::now();
    dead.process.0.wait().unwrap();
    let survivor = &replicas[0];
    create_and_bind("second", "the second pod to bind after the failover");
    let failover = killed.elapsed();
    let lease = runtime
        .block_on(leases.get("gantry"))
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(
        lease.holder_identity.as_deref(),
        Some(identities[follower].as_str())
    );
    assert!(lease.lease_transitions.unwrap_or(0) >= 1);
    wait_for(survivor, "/api/decisions/job/default%2Fsecond", &|a| {
        a.0 == 200
    });
    eprintln!(
        "kube leader election e2e: failover (kill to the next pod bound) took {:.1} s; passed in {:.1} s",
        failover.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failover <= Duration::from_secs(18),
        "failover took {failover:?}: over the 15 s lease plus 3 s for a cycle and polling"
    );
}

/// A job's decision history as a replica answered it holds nothing: not found, or (once its
/// watch has delivered the pod) known with an empty history.
fn stored_nothing(status: u16, body: &str) -> bool {
    status == 404 || (status == 200 && body.trim() == "[]")
}
