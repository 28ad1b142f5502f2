//! Round trips for every read path, policies and sets, audit, retention and bad directories.

mod common;

use std::time::Duration;

use common::{decision, open};
use gantry_core::Outcome;
use gantry_store::{
    Actor, FailurePolicy, NewPolicy, PolicyRole, SetEntry, Store, StoreConfig, StoreError,
};

#[test]
fn decisions_round_trip_by_job_node_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    // Appended out of time order on purpose: reads come back in time order.
    let batch = vec![
        decision("a", 30, &["n1", "n2"]),
        decision("b", 10, &["n2"]),
        decision("a", 10, &[]),
        decision("a", 20, &["n3"]),
        decision("c", 25, &["n1", "n1"]),
    ];
    let seqs = store.append_decisions(&batch).unwrap();
    assert_eq!(seqs.len(), 5);
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));

    let one = store.decision(30, seqs[0]).unwrap().unwrap();
    assert_eq!(one.explanation, batch[0].explanation);

    let hist = store.job_history("a").unwrap();
    let times: Vec<u64> = hist.iter().map(|r| r.time_ms).collect();
    assert_eq!(times, vec![10, 20, 30]);
    assert_eq!(hist[2].explanation, batch[0].explanation);
    assert_eq!(store.latest_for_job("a").unwrap().unwrap().time_ms, 30);
    assert!(store.latest_for_job("nope").unwrap().is_none());
    // A job name that is a prefix of another does not pick up the other's records.
    store.append_decisions(&[decision("ab", 40, &[])]).unwrap();
    assert_eq!(store.job_history("a").unwrap().len(), 3);

    let n1: Vec<(u64, String)> = store
        .decisions_on_node("n1", 0, u64::MAX, 100)
        .unwrap()
        .into_iter()
        .map(|r| (r.time_ms, r.explanation.job))
        .collect();
    assert_eq!(n1, vec![(25, "c".into()), (30, "a".into())]);
    assert_eq!(store.decisions_on_node("n2", 0, 20, 100).unwrap().len(), 1);
    assert_eq!(
        store.decisions_on_node("n2", 0, u64::MAX, 1).unwrap().len(),
        1
    );

    let range: Vec<u64> = store
        .decisions_between(10, 30, 100)
        .unwrap()
        .iter()
        .map(|r| r.time_ms)
        .collect();
    assert_eq!(range, vec![10, 10, 20, 25]);
    let all = store.decisions_between(0, u64::MAX, 100).unwrap();
    assert!(
        all.windows(2)
            .all(|w| (w[0].time_ms, w[0].seq) < (w[1].time_ms, w[1].seq))
    );
    assert_eq!(store.decisions_between(0, u64::MAX, 2).unwrap().len(), 2);

    // Final outcomes: the latest per job, even when a later append carries an older time.
    store.append_decisions(&[decision("a", 5, &[])]).unwrap();
    assert_eq!(store.latest_for_job("a").unwrap().unwrap().time_ms, 30);
    let finals = store.final_outcomes(100).unwrap();
    let jobs: Vec<&str> = finals.iter().map(|r| r.explanation.job.as_str()).collect();
    assert_eq!(jobs, vec!["a", "ab", "b", "c"]);

    // Everything survives a reopen, and sequence numbers keep increasing.
    drop(store);
    let store = open(dir.path());
    assert_eq!(store.job_history("a").unwrap().len(), 4);
    let next = store.append_decisions(&[decision("d", 50, &[])]).unwrap();
    assert!(next[0] > seqs[4]);
}

fn pods(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(pod, job)| (pod.to_string(), job.to_string()))
        .collect()
}

#[test]
fn pods_resolve_to_their_job_and_its_decisions() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store
        .record_pods(&pods(&[
            ("train-0", "team-a/train"),
            ("train-1", "team-a/train"),
            ("eval-0", "team-b/eval"),
            // Within one batch the last pair for a pod wins.
            ("eval-1", "team-a/train"),
            ("eval-1", "team-b/eval"),
        ]))
        .unwrap();
    store.record_pods(&[]).unwrap();
    store
        .append_decisions(&[
            decision("team-a/train", 10, &[]),
            decision("team-a/train", 20, &["n1", "n2"]),
            decision("team-b/eval", 15, &["n3"]),
        ])
        .unwrap();
    assert_eq!(
        store.job_for_pod("train-1").unwrap().as_deref(),
        Some("team-a/train")
    );
    assert_eq!(
        store.job_for_pod("eval-1").unwrap().as_deref(),
        Some("team-b/eval")
    );
    assert_eq!(store.job_for_pod("nope").unwrap(), None);
    let latest = store.latest_for_pod("train-0").unwrap().unwrap();
    assert_eq!(
        (latest.explanation.job.as_str(), latest.time_ms),
        ("team-a/train", 20)
    );
    let times: Vec<u64> = store
        .pod_history("train-0")
        .unwrap()
        .iter()
        .map(|r| r.time_ms)
        .collect();
    assert_eq!(times, vec![10, 20]);
    assert_eq!(store.pod_history("eval-0").unwrap().len(), 1);
    assert!(store.latest_for_pod("nope").unwrap().is_none());
    assert!(store.pod_history("nope").unwrap().is_empty());
    // A pod name reused by a later job moves to it; recording the same pair again is a no-op.
    store
        .record_pods(&pods(&[
            ("eval-0", "team-a/train"),
            ("train-0", "team-a/train"),
        ]))
        .unwrap();
    assert_eq!(
        store.job_for_pod("eval-0").unwrap().as_deref(),
        Some("team-a/train")
    );
    // The map survives a reopen.
    drop(store);
    let store = open(dir.path());
    assert_eq!(
        store.job_for_pod("eval-0").unwrap().as_deref(),
        Some("team-a/train")
    );
    assert_eq!(store.latest_for_pod("eval-1").unwrap().unwrap().time_ms, 15);
}

#[test]
fn compaction_drops_the_pods_of_jobs_left_without_history() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = StoreConfig::new(dir.path());
    config.max_age = Duration::from_millis(100);
    let store = Store::open(config).unwrap();
    store
        .record_pods(&pods(&[
            ("old-0", "old"),
            ("old-1", "old"),
            ("live-0", "live"),
            ("moved-0", "old"),
            ("unscheduled-0", "unscheduled"),
        ]))
        .unwrap();
    // `moved-0` belongs to `live` now, though `old` had it first.
    store.record_pods(&pods(&[("moved-0", "live")])).unwrap();
    // Three cycles (retention deletes whole appends' chunks, so one append per cycle).
    store
        .append_decisions(&[decision("old", 10, &["n1"]), decision("old", 20, &[])])
        .unwrap();
    store
        .append_decisions(&[decision("live", 30, &[])])
        .unwrap();
    store
        .append_decisions(&[decision("live", 500, &["n2"])])
        .unwrap();
    // Everything before 400 goes: all of `old`, one record of `live`.
    let report = store.compact(500).unwrap();
    assert_eq!(report.deleted, 3);
    assert_eq!(store.job_for_pod("old-0").unwrap(), None);
    assert_eq!(store.job_for_pod("old-1").unwrap(), None);
    assert_eq!(store.latest_for_pod("old-0").unwrap(), None);
    // The job's final outcome stays, found by job name.
    assert_eq!(store.latest_for_job("old").unwrap().unwrap().time_ms, 20);
    // Jobs with history left, and jobs never scheduled, keep their pods.
    assert_eq!(
        store.job_for_pod("live-0").unwrap().as_deref(),
        Some("live")
    );
    assert_eq!(
        store.job_for_pod("moved-0").unwrap().as_deref(),
        Some("live")
    );
    assert_eq!(
        store.job_for_pod("unscheduled-0").unwrap().as_deref(),
        Some("unscheduled")
    );
    assert_eq!(store.pod_history("live-0").unwrap().len(), 1);
    // Once `live` has no record left either, its pods go too.
    store.compact(1000).unwrap();
    assert_eq!(store.job_for_pod("live-0").unwrap(), None);
    assert_eq!(store.job_for_pod("moved-0").unwrap(), None);
    assert_eq!(store.latest_for_job("live").unwrap().unwrap().time_ms, 500);
}

fn wasm(n: u8) -> Vec<u8> {
    let mut v = b"\0asm\x0d\0\x01\0".to_vec();
    v.extend(std::iter::repeat_n(n, 100));
    v
}

fn new_policy(name: &str, role: PolicyRole) -> NewPolicy {
    NewPolicy {
        name: name.into(),
        role,
        version: "1.0.0".into(),
        config: "{}".into(),
    }
}

#[test]
fn policies_sets_activation_and_audit() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let alice = Actor::new("alice", "10.0.0.7:51234");
    let bob = Actor::new("bob", "cli");

    let a = store
        .put_policy(
            &alice,
            &wasm(1),
            new_policy("binpack", PolicyRole::Score),
            1000,
        )
        .unwrap();
    assert!(!a.already_stored);
    assert_eq!(a.manifest.sha256.len(), 64);
    assert_eq!(a.manifest.uploaded_by, "alice");
    // The same bytes again: one copy, the first manifest kept.
    let again = store
        .put_policy(
            &bob,
            &wasm(1),
            new_policy("other-name", PolicyRole::Filter),
            2000,
        )
        .unwrap();
    assert!(again.already_stored);
    assert_eq!(again.manifest, a.manifest);
    let b = store
        .put_policy(&bob, &wasm(2), new_policy("fit", PolicyRole::Filter), 3000)
        .unwrap();
    assert_eq!(store.list_policies().unwrap().len(), 2);
    assert_eq!(
        store.policy_bytes(&a.manifest.sha256).unwrap().unwrap(),
        wasm(1)
    );
    assert_eq!(
        store
            .policy_manifest(&b.manifest.sha256)
            .unwrap()
            .unwrap()
            .name,
        "fit"
    );

    assert!(store.active().unwrap().is_none());
    let entry = |sha: &str, weight| SetEntry {
        sha256: sha.into(),
        weight,
        failure: FailurePolicy::Default,
        config: "{}".into(),
        deadline_ms: None,
    };
    let v1 = store
        .put_set(&alice, vec![entry(&a.manifest.sha256, 1)], "first", 4000)
        .unwrap();
    let mut e2 = entry(&b.manifest.sha256, 2);
    e2.failure = FailurePolicy::FailOpen;
    let v2 = store
        .put_set(&alice, vec![entry(&a.manifest.sha256, 1), e2], "", 5000)
        .unwrap();
    assert_eq!((v1.version, v2.version), (1, 2));
    assert!(matches!(
        store.put_set(&alice, vec![entry("beef", 1)], "", 5500),
        Err(StoreError::UnknownPolicy(_))
    ));
    assert!(matches!(
        store.put_set(&alice, vec![], "", 5500),
        Err(StoreError::EmptySet)
    ));

    store.activate(&alice, 2, 6000).unwrap();
    assert_eq!(store.active().unwrap().unwrap(), v2);
    store.rollback_to(&bob, 1, 7000).unwrap();
    assert_eq!(store.active().unwrap().unwrap(), v1);
    // A rollback to the active version would change nothing, so it is refused and not audited.
    let audited = store.audit_recent(1000).unwrap().len();
    let err = store.rollback_to(&bob, 1, 7200).unwrap_err();
    assert_eq!(
        err.to_string(),
        "version 1 is already the active policy set: roll back to an earlier version, or activate a new one"
    );
    assert_eq!(store.audit_recent(1000).unwrap().len(), audited);

    // Any unique prefix of 8 or more hex characters names a policy.
    let sha = &a.manifest.sha256;
    assert_eq!(store.resolve_policy(&sha[..8]).unwrap(), *sha);
    assert_eq!(
        store.resolve_policy(&sha[..12].to_uppercase()).unwrap(),
        *sha
    );
    assert_eq!(store.resolve_policy(sha).unwrap(), *sha);
    assert_eq!(
        store.resolve_policy(&sha[..7]).unwrap_err().to_string(),
        format!(
            "`{}` does not name a policy: give its sha256, or at least its first 8 hex characters",
            &sha[..7]
        )
    );
    assert!(matches!(
        store.resolve_policy("00000000"),
        Err(StoreError::UnknownPolicy(_))
    ));
    let err = store.activate(&bob, 9, 7500).unwrap_err();
    assert_eq!(err.to_string(), "no policy set version 9 exists");
    assert_eq!(store.active().unwrap().unwrap().version, 1);
    let sets = store.list_sets().unwrap();
    assert_eq!(sets, vec![v1.clone(), v2.clone()]);
    // The failure policy is stored with its kebab-case name.
    let json = serde_json::to_string(&sets[1].entries[1]).unwrap();
    assert!(json.contains("\"fail-open\""), "{json}");

    drop(store);
    let store = open(dir.path());
    assert_eq!(store.active().unwrap().unwrap().version, 1);
    assert_eq!(store.list_sets().unwrap().len(), 2);

    let log = store.audit_between(0, u64::MAX, 100).unwrap();
    let summary: Vec<(&str, &str, &str, u64)> = log
        .iter()
        .map(|e| (e.who.as_str(), e.from.as_str(), e.action.as_str(), e.at_ms))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("alice", "10.0.0.7:51234", "policy.upload", 1000),
            ("bob", "cli", "policy.upload", 2000),
            ("bob", "cli", "policy.upload", 3000),
            ("alice", "10.0.0.7:51234", "set.create", 4000),
            ("alice", "10.0.0.7:51234", "set.create", 5000),
            ("alice", "10.0.0.7:51234", "set.activate", 6000),
            ("bob", "cli", "set.rollback", 7000),
        ]
    );
    assert_eq!(log[3].detail, "version 1, 1 entries: first");
    assert_eq!(log[6].detail, "version 2 -> 1");
    let recent = store.audit_recent(2).unwrap();
    assert_eq!(recent[0].action, "set.rollback");
    assert_eq!(recent.len(), 2);
}

#[test]
fn retention_keeps_bytes_bounded_and_final_outcomes() {
    let dir = tempfile::tempdir().unwrap();
    // Records here are ~60 accounted bytes: 200k of them are over ten times this bound.
    const MAX_BYTES: u64 = 1_000_000;
    let mut config = StoreConfig::new(dir.path());
    config.max_bytes = MAX_BYTES;
    config.max_age = Duration::from_secs(3600);
    let store = Store::open(config).unwrap();
    const N: u64 = 200_000;
    const JOBS: u64 = 3_000;
    let mut batch = Vec::with_capacity(1000);
    for i in 0..N {
        let job = format!("j{}", i % JOBS);
        let mut d = decision(&job, 1_000_000 + i, &[]);
        // Small records: keep only what identifies them.
        d.explanation.filters.clear();
        d.explanation.top_nodes.clear();
        d.explanation.policies.clear();
        d.explanation.outcome = if i.is_multiple_of(2) {
            Outcome::Placed {
                nodes: vec![(format!("n{}", i % 97), 8)],
            }
        } else {
            Outcome::Pending {
                waiting_for: "GPUs".into(),
            }
        };
        batch.push(d);
        if batch.len() == 1000 {
            store.append_decisions(&batch).unwrap();
            batch.clear();
        }
    }
    let before = store.decision_bytes().unwrap();
    assert!(before > MAX_BYTES * 10, "{before}");
    // Nothing is older than an hour yet: only the byte bound applies.
    let report = store.compact(1_000_000 + N).unwrap();
    assert_eq!(report.bytes_before, before);
    assert!(report.bytes_after <= MAX_BYTES, "{report:?}");
    assert_eq!(report.bytes_after, store.decision_bytes().unwrap());
    assert!(report.deleted > N / 2);
    let left = store.decisions_between(0, u64::MAX, usize::MAX).unwrap();
    assert_eq!(left.len() as u64, N - report.deleted);
    // The newest records are the ones kept.
    assert_eq!(left.last().unwrap().time_ms, 1_000_000 + N - 1);
    assert_eq!(left[0].time_ms, 1_000_000 + report.deleted);
    // Every job's final outcome survives, and history still ends with it.
    assert_eq!(store.final_outcomes(usize::MAX).unwrap().len() as u64, JOBS);
    for j in [0, 1, 1234, JOBS - 1] {
        let job = format!("j{j}");
        let latest = store.latest_for_job(&job).unwrap().unwrap();
        let expected_time = 1_000_000 + (N - 1 - j) / JOBS * JOBS + j;
        assert_eq!(latest.time_ms, expected_time);
        assert_eq!(
            store.job_history(&job).unwrap().last().unwrap().time_ms,
            expected_time
        );
    }
    // Index entries of deleted records are gone too.
    assert!(
        store
            .decisions_on_node("n0", 0, 1_000_000 + report.deleted, usize::MAX)
            .unwrap()
            .is_empty()
    );
    // Age: an hour and a bit later, everything but the final outcomes goes.
    let report = store.compact(1_000_000 + N + 3_600_001).unwrap();
    assert_eq!(report.bytes_after, 0);
    assert!(store.decisions_between(0, u64::MAX, 10).unwrap().is_empty());
    assert_eq!(store.final_outcomes(usize::MAX).unwrap().len() as u64, JOBS);
    assert_eq!(store.job_history("j7").unwrap().len(), 1);
    let log = store.audit_recent(10).unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(
        (log[0].who.as_str(), log[0].action.as_str()),
        ("gantry", "compact")
    );
}

#[test]
fn compact_within_bounds_deletes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store
        .append_decisions(&[decision("a", 1, &["n"]), decision("a", 2, &[])])
        .unwrap();
    let report = store.compact(3).unwrap();
    assert_eq!(report.deleted, 0);
    assert_eq!(report.bytes_before, report.bytes_after);
    assert!(store.audit_recent(10).unwrap().is_empty());
}

fn open_err(path: &std::path::Path) -> String {
    // sled releases its directory lock from its flusher thread, shortly after the last handle
    // drops: a refused open followed at once by another can meet the lock still held. Wait
    // that out (briefly), so the text compared is the refusal itself.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let err = Store::open(StoreConfig::new(path)).unwrap_err().to_string();
        if !err.contains("could not acquire lock") || std::time::Instant::now() > deadline {
            return err;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("store");
    std::fs::write(&file, b"hello").unwrap();
    assert_eq!(
        open_err(&file),
        format!(
            "cannot open the Gantry store at {}: it is a file, not a directory",
            file.display()
        )
    );
}

#[test]
fn a_directory_of_other_files_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"hello").unwrap();
    std::fs::write(dir.path().join("a.bin"), [0xffu8; 64]).unwrap();
    assert_eq!(
        open_err(dir.path()),
        format!(
            "cannot open the Gantry store at {}: the directory holds other files (a.bin, notes.txt) and no sled database",
            dir.path().display()
        )
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}

#[test]
fn garbage_sled_files_are_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("conf"), b"not a sled config at all\n").unwrap();
    std::fs::write(dir.path().join("db"), [0x5au8; 4096]).unwrap();
    let err = open_err(dir.path());
    let prefix = format!(
        "cannot open the Gantry store at {}: the database is corrupt (",
        dir.path().display()
    );
    assert!(err.starts_with(&prefix), "{err}");
    assert!(!err.contains('\n'), "{err}");
    eprintln!("{err}");
}

#[test]
fn a_foreign_sled_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = sled::open(dir.path()).unwrap();
        db.open_tree("users").unwrap().insert("x", "y").unwrap();
        db.flush().unwrap();
    }
    assert_eq!(
        open_err(dir.path()),
        format!(
            "cannot open the Gantry store at {}: it is a sled database without a Gantry schema version (trees: users)",
            dir.path().display()
        )
    );
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path()));
    {
        let db = sled::open(dir.path()).unwrap();
        db.open_tree("meta")
            .unwrap()
            .insert(
                "schema_version",
                &(gantry_store::SCHEMA_VERSION + 1).to_be_bytes(),
            )
            .unwrap();
        db.flush().unwrap();
    }
    assert_eq!(
        open_err(dir.path()),
        format!(
            "cannot open the Gantry store at {}: its schema version 3 is newer than the newest this build understands (2)",
            dir.path().display()
        )
    );
}

/// A version-1 directory (JSON records and sled index trees) is refused with a clear error
/// rather than misread; it is left as it was.
#[test]
fn an_older_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        // What a version-1 build left: its trees, a record, and version 1 in `meta`.
        let db = sled::open(dir.path()).unwrap();
        let meta = db.open_tree("meta").unwrap();
        meta.insert("schema_version", &1u32.to_be_bytes()).unwrap();
        meta.insert("decision_bytes", &300u64.to_be_bytes())
            .unwrap();
        let mut key = 5u64.to_be_bytes().to_vec();
        key.extend_from_slice(&0u64.to_be_bytes());
        db.open_tree("decisions")
            .unwrap()
            .insert(key, &b"{\"job\":\"a\"}"[..])
            .unwrap();
        db.open_tree("by_job").unwrap();
        db.flush().unwrap();
    }
    let expected = format!(
        "cannot open the Gantry store at {}: the data directory is from an older layout (schema version 1; this build reads only version 2); move it aside or delete it to start an empty store",
        dir.path().display()
    );
    assert_eq!(open_err(dir.path()), expected);
    // Nothing was written: a second try says the same, and the old trees are all there is.
    assert_eq!(open_err(dir.path()), expected);
    let db = sled::open(dir.path()).unwrap();
    let mut trees: Vec<String> = db
        .tree_names()
        .iter()
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect();
    trees.sort();
    assert_eq!(trees, ["__sled__default", "by_job", "decisions", "meta"]);
}

#[test]
fn a_missing_directory_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a/b");
    let store = open(&path);
    store.append_decisions(&[decision("x", 1, &[])]).unwrap();
    assert!(path.join("conf").exists());
}

/// Stores `bytes` as a filter policy named `name`.
fn put_filter(store: &gantry_store::Store, bytes: &[u8], name: &str) -> gantry_store::PutPolicy {
    let actor = gantry_store::Actor::new("root", "test");
    let policy = gantry_store::NewPolicy {
        name: name.into(),
        role: gantry_store::PolicyRole::Filter,
        version: "1".into(),
        config: "{}".into(),
    };
    store.put_policy(&actor, bytes, policy, 1).unwrap()
}

/// A damaged history database once stopped the scheduler at start ("exit 1", naming no path).
/// Now it is moved aside whole, named, and a new history starts; the main database's policies
/// and sets are untouched.
#[test]
fn a_damaged_history_is_moved_aside_and_a_new_one_starts() {
    let dir = tempfile::tempdir().unwrap();
    let set_version = {
        let store = common::open(dir.path());
        store
            .append_decisions(&[common::decision("job-a", 1_000, &["node-1"])])
            .unwrap();
        let actor = gantry_store::Actor::new("root", "test");
        let put = put_filter(&store, b"\0asm-not-really", "p");
        let entry = gantry_store::SetEntry {
            sha256: put.manifest.sha256.clone(),
            weight: 1,
            failure: gantry_store::FailurePolicy::Default,
            config: "{}".into(),
            deadline_ms: None,
        };
        let set = store.put_set(&actor, vec![entry], "kept", 2).unwrap();
        store.flush().unwrap();
        set.version
    };
    let history = dir.path().join("history");
    let garbage = [0x5au8; 3 * 4096];
    std::fs::write(history.join("conf"), b"not a sled config at all\n").unwrap();
    std::fs::write(history.join("db"), garbage).unwrap();

    let store = common::open(dir.path());
    let damage = store
        .history_damage()
        .expect("the damage is reported")
        .clone();
    assert_eq!(damage.path, history.display().to_string());
    let aside = std::path::PathBuf::from(&damage.moved_to);
    assert_eq!(aside.parent(), Some(dir.path()));
    assert!(
        aside
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("history.damaged-")),
        "{damage:?}"
    );
    // Its bytes are kept as they were.
    assert_eq!(std::fs::read(aside.join("db")).unwrap(), garbage);
    let text = damage.to_string();
    assert!(
        text.starts_with(&format!(
            "the decision history at {} was damaged (",
            history.display()
        )) && text.ends_with(&format!(
            "it was moved aside to {} and a new history started",
            aside.display()
        )),
        "{text}"
    );
    // The new history takes records; the main database's set is still there.
    assert!(store.job_history("job-a").unwrap().is_empty());
    store
        .append_decisions(&[common::decision("job-b", 2_000, &["node-2"])])
        .unwrap();
    assert_eq!(store.job_history("job-b").unwrap().len(), 1);
    assert_eq!(store.get_set(set_version).unwrap().unwrap().note, "kept");
    drop(store);
    // Opened again, it is healthy: nothing more is moved.
    let store = common::open(dir.path());
    assert_eq!(store.history_damage(), None);
    assert_eq!(store.job_history("job-b").unwrap().len(), 1);
}

/// A damaged record in the main database is named by its tree and key, and the records beside
/// it are still read one by one.
#[test]
fn a_damaged_record_is_named_by_its_tree_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let sha = {
        let store = common::open(dir.path());
        let put = put_filter(&store, b"\0asm-kept", "kept");
        store.flush().unwrap();
        put.manifest.sha256
    };
    let bad_key = "f".repeat(64);
    {
        // sled releases its lock from its flusher thread shortly after the handle drops.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let db = loop {
            match sled::open(dir.path()) {
                Ok(db) => break db,
                Err(e) if std::time::Instant::now() < deadline => {
                    eprintln!("retrying: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(e) => panic!("{e}"),
            }
        };
        let manifests = db.open_tree("manifests").unwrap();
        manifests
            .insert(bad_key.as_bytes(), &b"\x00garbage"[..])
            .unwrap();
        db.flush().unwrap();
    }
    let store = common::open(dir.path());
    let error = store.list_policies().unwrap_err().to_string();
    assert!(
        error.starts_with(&format!(
            "store: the record under key {bad_key} of tree manifests is damaged: "
        )),
        "{error}"
    );
    // The record beside it is intact and still served.
    assert_eq!(store.policy_manifest(&sha).unwrap().unwrap().name, "kept");
}
