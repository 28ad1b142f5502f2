//! Crash safety: a child process (this test binary, re-invoked) appends decisions and records
//! pods in a loop; the parent kills it with SIGKILL mid-stream, reopens the store and checks that
//! nothing is torn: every record decodes, every batch of records is all there or absent, the
//! counters committed with the records they count, the index rebuilt on open finds exactly the
//! records, and the pod map's two halves match.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{decision, open};
use gantry_core::Outcome;
use std::collections::HashMap;

const CHILD_ENV: &str = "GANTRY_STORE_CHILD";
/// Records per batch in the child: every batch takes consecutive sequence numbers.
const BATCH: u64 = 200;
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
        let batch: Vec<_> = (0..BATCH)
            .map(|i| {
                t += 1;
                let nodes = [format!("n{}", t % 300), format!("n{}", (t + 7) % 300)];
                let n: Vec<&str> = nodes.iter().map(String::as_str).collect();
                decision(&format!("job-{}", (t + i) % 700), t, &n[..(t % 3) as usize])
            })
            .collect();
        store.append_decisions(&batch).expect("append");
        let pods: Vec<(String, String)> = (0..20)
            .map(|k| {
                (
                    format!("pod-{}", (batch_no * 20 + k) % 3000),
                    batch[k as usize].explanation.job.clone(),
                )
            })
            .collect();
        store.record_pods(&pods).expect("record pods");
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
    // Every record decodes (this read decodes them all).
    let records = store.decisions_between(0, u64::MAX, usize::MAX).unwrap();
    assert!(!records.is_empty(), "nothing survived the kill");
    // Whole batches only: the child's batches took sequence numbers [k*BATCH, (k+1)*BATCH), and
    // nothing was ever deleted, so the sequence numbers are exactly 0..n with n a multiple of
    // BATCH.
    let mut seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
    seqs.sort_unstable();
    let n = seqs.len() as u64;
    assert_eq!(n % BATCH, 0, "a batch is torn: {n} records");
    assert!(
        seqs.iter().copied().eq(0..n),
        "sequence numbers are not 0..{n}"
    );
    // The index rebuilt on open finds each job's and each node's records exactly.
    let mut by_job: HashMap<&str, Vec<u64>> = HashMap::new();
    let mut by_node: HashMap<&str, Vec<u64>> = HashMap::new();
    for r in &records {
        by_job.entry(&r.explanation.job).or_default().push(r.seq);
        if let Outcome::Placed { nodes } = &r.explanation.outcome {
            for (node, _) in nodes {
                by_node.entry(node).or_default().push(r.seq);
            }
        }
    }
    let seqs_of = |rs: Vec<gantry_store::DecisionRecord>| {
        let mut s: Vec<u64> = rs.into_iter().map(|r| r.seq).collect();
        s.sort_unstable();
        s
    };
    for (job, mut expected) in by_job {
        expected.sort_unstable();
        assert_eq!(
            seqs_of(store.job_history(job).unwrap()),
            expected,
            "job {job}"
        );
    }
    for (node, mut expected) in by_node {
        expected.sort_unstable();
        let found = store
            .decisions_on_node(node, 0, u64::MAX, usize::MAX)
            .unwrap();
        assert_eq!(seqs_of(found), expected, "node {node}");
    }
    // Every final outcome is readable and is its job's newest record.
    for f in store.final_outcomes(usize::MAX).unwrap() {
        let hist = store.job_history(&f.explanation.job).unwrap();
        assert_eq!(hist.last().unwrap(), &f);
    }
    let bytes = store.decision_bytes().unwrap();
    drop(store);
    // The raw trees: the counters committed with the records they count, and the pod map's two
    // halves mirror each other.
    let history_db = sled::open(path.join("history")).unwrap();
    let history = history_db.open_tree("history").unwrap();
    let db = sled::open(path).unwrap();
    let jobs = db.open_tree("jobs").unwrap();
    let counter = |key: &[u8]| {
        let v = history.get(key).unwrap().expect("counter");
        u64::from_be_bytes(v.as_ref().try_into().unwrap())
    };
    let mut recount = 0u64;
    for item in history.scan_prefix(b"c") {
        let (k, v) = item.unwrap();
        recount += (k.len() + v.len()) as u64;
    }
    eprintln!("records {n} counter {bytes} recount {recount}");
    assert_eq!(bytes, recount);
    assert_eq!(counter(b"#decision_bytes"), recount);
    assert_eq!(counter(b"#next_seq"), n);
    let mut pods: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    for item in jobs.scan_prefix(b"p") {
        let (k, v) = item.unwrap();
        pods.insert(k[1..].to_vec(), v.to_vec());
    }
    assert!(!pods.is_empty(), "no pod survived the kill");
    let mut reverse = 0;
    for item in jobs.scan_prefix(b"q") {
        let (k, _) = item.unwrap();
        let len = u64::from_be_bytes(k[1..9].try_into().unwrap()) as usize;
        let (job, pod) = k[9..].split_at(len);
        assert_eq!(
            pods.get(pod).map(Vec::as_slice),
            Some(job),
            "stray pod entry"
        );
        reverse += 1;
    }
    assert_eq!(reverse, pods.len(), "pods without their reverse entry");
}
