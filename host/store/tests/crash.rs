//! Crash safety: a child process (this test binary, re-invoked) appends decisions in a loop; the
//! parent kills it with SIGKILL mid-stream, reopens the store and checks that no record is torn:
//! every record deserializes and has all its index entries, and every index entry and final
//! outcome points at a record or holds its own copy.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{decision, open};

const CHILD_ENV: &str = "GANTRY_STORE_CHILD";
const DIR_ENV: &str = "GANTRY_STORE_CHILD_DIR";

/// The writer. Does nothing unless started by `kill_9_mid_stream_leaves_no_torn_record`.
#[test]
fn crash_child_writer() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let dir = std::env::var_os(DIR_ENV).expect("dir");
    let store = open(std::path::Path::new(&dir));
    let mut t = 0u64;
    for batch_no in 0u64.. {
        let batch: Vec<_> = (0..200)
            .map(|i| {
                t += 1;
                let nodes = [format!("n{}", t % 300), format!("n{}", (t + 7) % 300)];
                let n: Vec<&str> = nodes.iter().map(String::as_str).collect();
                decision(&format!("job-{}", (t + i) % 700), t, &n[..(t % 3) as usize])
            })
            .collect();
        store.append_decisions(&batch).expect("append");
        println!("batch {batch_no}");
    }
}

#[test]
fn kill_9_mid_stream_leaves_no_torn_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    for round in 0..3u64 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["crash_child_writer", "--exact", "--nocapture"])
            .env(CHILD_ENV, "1")
            .env(DIR_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // Wait for writing to be under way, then let it run across sled's 500 ms flushes and
        // kill it at a different point each round.
        // (The harness prints its own lines first.)
        loop {
            let line = lines.next().expect("child wrote nothing").unwrap();
            if line.starts_with("batch") {
                break;
            }
        }
        let start = Instant::now();
        let run_for = Duration::from_millis(700 + 350 * round);
        for line in lines.by_ref() {
            line.unwrap();
            if start.elapsed() >= run_for {
                break;
            }
        }
        child.kill().unwrap(); // SIGKILL on Unix
        child.wait().unwrap();
        drop(lines);
        check_no_torn_record(&path);
    }
}

fn check_no_torn_record(path: &std::path::Path) {
    let store = open(path);
    let records = store.decisions_between(0, u64::MAX, usize::MAX).unwrap();
    assert!(!records.is_empty(), "nothing survived the kill");
    let db_path = path.to_path_buf();
    drop(store);
    // Inspect the raw trees: the index entries must match the records exactly.
    let db = sled::open(&db_path).unwrap();
    let by_job = db.open_tree("by_job").unwrap();
    let by_node = db.open_tree("by_node").unwrap();
    let decisions = db.open_tree("decisions").unwrap();
    let mut expected_job = 0usize;
    let mut expected_node = 0usize;
    for r in &records {
        let mut key = r.time_ms.to_be_bytes().to_vec();
        key.extend_from_slice(&r.seq.to_be_bytes());
        let mut jk = r.explanation.job.as_bytes().to_vec();
        jk.push(0);
        jk.extend_from_slice(&key);
        assert!(
            by_job.contains_key(&jk).unwrap(),
            "record {key:?} lacks its job index"
        );
        expected_job += 1;
        if let gantry_core::Outcome::Placed { nodes } = &r.explanation.outcome {
            for (n, _) in nodes {
                let mut nk = n.as_bytes().to_vec();
                nk.push(0);
                nk.extend_from_slice(&key);
                assert!(by_node.contains_key(&nk).unwrap(), "record lacks node {n}");
                expected_node += 1;
            }
        }
    }
    assert_eq!(by_job.len(), expected_job, "dangling job index entries");
    assert_eq!(by_node.len(), expected_node, "dangling node index entries");
    for item in by_job.iter() {
        let (k, _) = item.unwrap();
        assert!(decisions.contains_key(&k[k.len() - 16..]).unwrap());
    }
    drop((by_job, by_node, decisions));
    drop(db);
    // Every final outcome is readable and is its job's newest record.
    let store = open(path);
    for f in store.final_outcomes(usize::MAX).unwrap() {
        let hist = store.job_history(&f.explanation.job).unwrap();
        assert_eq!(hist.last().unwrap(), &f);
    }
    // The byte counter committed with the records it counts.
    let bytes = store.decision_bytes().unwrap();
    let mut fresh = tempfile::tempdir().unwrap().keep();
    fresh.push("copy");
    let copy = open(&fresh);
    let again: Vec<_> = records
        .iter()
        .map(|r| gantry_store::NewDecision {
            time_ms: r.time_ms,
            explanation: r.explanation.clone(),
        })
        .collect();
    copy.append_decisions(&again).unwrap();
    eprintln!(
        "records {} counter {} recount {}",
        records.len(),
        bytes,
        copy.decision_bytes().unwrap()
    );
    assert_eq!(copy.decision_bytes().unwrap(), bytes);
    drop(copy);
    let _ = std::fs::remove_dir_all(fresh.parent().unwrap());
}
