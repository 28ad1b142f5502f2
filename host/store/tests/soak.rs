//! Soak: a million decisions appended the way a server writes them (batches of 1,000, one per
//! scheduling cycle, `compact` every 50 batches) under a 64 MiB retention bound. After every
//! compaction and at the end: the byte counter is within the bound, the directory on disk is
//! within the bounds stated below, the newest records read back, and jobs whose history was
//! compacted away still have their final outcome (and no longer their pods).
//!
//! Debug builds run a tenth of the records, so that a plain `cargo test` stays quick; the
//! figures quoted in comments are from the release run (`cargo test --release`).

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use gantry_core::Outcome;
use gantry_store::{NewDecision, Store, StoreConfig, sample_explanation};

const RECORDS: u64 = if cfg!(debug_assertions) {
    100_000
} else {
    1_000_000
};
const BATCH: u64 = 1000;
const COMPACT_EVERY: u64 = 50;
const MAX_BYTES: u64 = 64 << 20;
/// Each cycle starts this many jobs, and a job takes part in this many cycles, so a job has
/// ~25 records spread over 10 batches and ~400 jobs are live at a time.
const NEW_JOBS_PER_BATCH: u64 = 40;
const JOB_LIFETIME: u64 = 10;
const PODS_PER_JOB: u64 = 4;

/// Bounds on the directory's real size (allocated blocks), stated in two parts because it has
/// two parts (see the crate docs):
///
/// - The history database (`history/`) holds only the retained records: at most `MAX_BYTES`,
///   plus the dead space sled has not reclaimed yet (it is log-structured and cleans lazily).
///   Measured: 1.6–2.2× `MAX_BYTES` from the first compaction on, flat over 2M records. Bound:
///   3×. A history database that grew with what was written (5.5× `MAX_BYTES` over this run)
///   would fail it.
/// - The main database holds what is not history: each job's kept final outcome (kept forever
///   by design, so it grows with the number of jobs and is not bounded by `MAX_BYTES`; ~360
///   bytes each), the pod map and the policies. sled amplifies these small random writes
///   several times: measured ~1.7 KB on disk per job after 40k and after 80k jobs. Bound: 8 MiB
///   plus 4 KiB per job.
const HISTORY_FACTOR: u64 = 3;
const MAIN_BASE: u64 = 8 << 20;
const MAIN_PER_JOB: u64 = 4 << 10;

/// A cheap deterministic hash, so the mix is the same every run.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

fn job_name(id: u64) -> String {
    format!("team-{}/job-{id}", id % 17)
}

/// Record `i` (in batch `i / BATCH`): for one of the jobs live in that batch; ~70% pending with
/// no node, ~30% placed on 1–16 nodes.
fn record(i: u64) -> (u64, NewDecision) {
    let batch = i / BATCH;
    let h = mix(i);
    let live_from = (batch + 1).saturating_sub(JOB_LIFETIME) * NEW_JOBS_PER_BATCH;
    let live_to = (batch + 1) * NEW_JOBS_PER_BATCH;
    let job = live_from + h % (live_to - live_from);
    let mut e = sample_explanation(i);
    e.job = job_name(job);
    if (h >> 20) % 10 < 3 {
        let n = 1 + (h >> 30) % 16;
        e.outcome = Outcome::Placed {
            nodes: (0..n)
                .map(|k| (format!("node-{:05}", (mix(i + k) % 7500)), 8))
                .collect(),
        };
        e.pods = n as u32;
    } else {
        e.outcome = Outcome::Pending {
            waiting_for: "64 GPUs in one rack".into(),
        };
        e.top_nodes.clear();
        e.domain = None;
        e.nodes_feasible = 0;
    }
    (
        job,
        NewDecision {
            time_ms: 1_700_000_000_000 + i,
            explanation: e,
        },
    )
}

/// The real size on disk of the store's history database and of the rest (the main database).
fn disk_usage(dir: &Path) -> (u64, u64) {
    let history = allocated(&dir.join("history"));
    (history, allocated(dir) - history)
}

/// Allocated blocks under `path`, not apparent lengths (sled's files can be sparse). sled
/// removes blob files in the background, so a file can vanish while it is listed; it then
/// counts as nothing.
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for entry in std::fs::read_dir(path).unwrap() {
        let entry = entry.unwrap();
        let meta = match entry.metadata() {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => panic!("{e}"),
        };
        total += if meta.is_dir() {
            allocated(&entry.path())
        } else {
            meta.blocks() * 512
        };
    }
    total
}

#[test]
fn a_million_decisions_stay_within_retention() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = StoreConfig::new(dir.path());
    config.max_bytes = MAX_BYTES;
    // Age does not bind here: only the byte bound does.
    config.max_age = Duration::from_secs(365 * 24 * 3600);
    let store = Store::open(config).unwrap();
    let history_bound = HISTORY_FACTOR * MAX_BYTES;
    let main_bound = |jobs: usize| MAIN_BASE + MAIN_PER_JOB * jobs as u64;

    // Each job's newest (time, seq), to check final outcomes against.
    let mut last_of_job: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut pods_recorded = 0u64;
    let (mut compactions, mut deleted) = (0u64, 0u64);
    let (mut max_history, mut checked_finals) = (0u64, 0usize);
    let start = Instant::now();
    let mut append_time = Duration::ZERO;
    let mut compact_time = Duration::ZERO;
    for b in 0..RECORDS / BATCH {
        // New jobs are submitted: their pods are recorded once.
        let pods: Vec<(String, String)> = (b * NEW_JOBS_PER_BATCH..(b + 1) * NEW_JOBS_PER_BATCH)
            .flat_map(|job| {
                (0..PODS_PER_JOB).map(move |p| (format!("{}-{p}", job_name(job)), job_name(job)))
            })
            .collect();
        pods_recorded += pods.len() as u64;
        store.record_pods(&pods).unwrap();
        let (jobs, batch): (Vec<u64>, Vec<NewDecision>) =
            (b * BATCH..(b + 1) * BATCH).map(record).unzip();
        let t = Instant::now();
        let seqs = store.append_decisions(&batch).unwrap();
        append_time += t.elapsed();
        for ((job, d), seq) in jobs.iter().zip(&batch).zip(seqs) {
            last_of_job.insert(*job, (d.time_ms, seq));
        }
        if (b + 1) % COMPACT_EVERY != 0 {
            continue;
        }
        let t = Instant::now();
        let now = batch.last().unwrap().time_ms;
        let report = store.compact(now).unwrap();
        compact_time += t.elapsed();
        compactions += 1;
        deleted += report.deleted;
        let bytes = store.decision_bytes().unwrap();
        assert!(report.bytes_after <= MAX_BYTES, "{report:?}");
        assert!(bytes <= MAX_BYTES, "{bytes} > {MAX_BYTES}");
        store.flush().unwrap();
        let (history_disk, main_disk) = disk_usage(dir.path());
        max_history = max_history.max(history_disk);
        eprintln!(
            "after {} records: {} deleted, {bytes} bytes of history; on disk: history database {history_disk}, main {main_disk} ({} jobs)",
            (b + 1) * BATCH,
            report.deleted,
            last_of_job.len(),
        );
        assert!(
            history_disk <= history_bound,
            "history database {history_disk} bytes > {HISTORY_FACTOR} × {MAX_BYTES}"
        );
        assert!(
            main_disk <= main_bound(last_of_job.len()),
            "main database {main_disk} bytes for {} jobs",
            last_of_job.len()
        );
        // The newest batch reads back whole, by time and by job.
        let newest = store
            .decisions_between(batch[0].time_ms, u64::MAX, usize::MAX)
            .unwrap();
        assert_eq!(newest.len() as u64, BATCH);
        assert_eq!(
            newest.last().unwrap().explanation,
            batch.last().unwrap().explanation
        );
        let job = jobs.last().unwrap();
        let latest = store.latest_for_job(&job_name(*job)).unwrap().unwrap();
        assert_eq!((latest.time_ms, latest.seq), last_of_job[job]);
        // Jobs whose history was compacted away keep their final outcome, and lose their pods.
        let oldest = store.decisions_between(0, u64::MAX, 1).unwrap()[0].time_ms;
        for (&job, &(time, seq)) in last_of_job
            .iter()
            .filter(|(_, (t, _))| *t < oldest)
            .take(200)
        {
            let name = job_name(job);
            let latest = store.latest_for_job(&name).unwrap().unwrap();
            assert_eq!((latest.time_ms, latest.seq), (time, seq), "{name}");
            assert_eq!(store.job_history(&name).unwrap().len(), 1, "{name}");
            assert_eq!(store.job_for_pod(&format!("{name}-0")).unwrap(), None);
            checked_finals += 1;
        }
    }
    let elapsed = start.elapsed();

    // At the end: every job's final outcome, compacted or not, is its newest record.
    let finals = store.final_outcomes(usize::MAX).unwrap();
    assert_eq!(finals.len(), last_of_job.len());
    for f in &finals {
        let id: u64 = f
            .explanation
            .job
            .rsplit('-')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!((f.time_ms, f.seq), last_of_job[&id]);
    }
    // Pods resolve for the jobs with history left, and for few others: the map is bounded by
    // the live jobs, not by every job submitted.
    let oldest = store.decisions_between(0, u64::MAX, 1).unwrap()[0].time_ms;
    let live = last_of_job
        .iter()
        .filter(|(_, (t, _))| *t >= oldest)
        .count();
    let resolved = (0..RECORDS / BATCH * NEW_JOBS_PER_BATCH)
        .filter(|&job| {
            store
                .job_for_pod(&format!("{}-3", job_name(job)))
                .unwrap()
                .is_some()
        })
        .count();
    assert!(
        resolved >= live,
        "{resolved} pods resolve, {live} jobs live"
    );
    assert!(resolved <= live + 2 * (JOB_LIFETIME * NEW_JOBS_PER_BATCH) as usize);
    let bytes = store.decision_bytes().unwrap();
    assert!(bytes <= MAX_BYTES);
    store.flush().unwrap();
    let (history_disk, main_disk) = disk_usage(dir.path());
    assert!(history_disk <= history_bound);
    assert!(main_disk <= main_bound(last_of_job.len()));
    // Reopening rebuilds the index from the retained history.
    drop(store);
    let t = Instant::now();
    let store = common::open(dir.path());
    let reopen = t.elapsed();
    assert_eq!(store.final_outcomes(usize::MAX).unwrap(), finals);
    println!(
        "soak: {RECORDS} decisions in batches of {BATCH}, {compactions} compactions deleting {deleted}: \
         {:.1} s in all, {:.0} records/s overall; appends {:.0} records/s, compaction {:.0} deletions/s; \
         {pods_recorded} pods recorded, {resolved} still mapped; {checked_finals} compacted-away final outcomes checked; \
         history {bytes} bytes (bound {MAX_BYTES}); on disk: history database {history_disk} bytes now, {max_history} at most \
         ({:.2}× the bound; allowed {HISTORY_FACTOR}×), main database {main_disk} bytes for {} jobs \
         ({} per job; allowed {MAIN_BASE} + {MAIN_PER_JOB} per job); reopen {:.2} s",
        elapsed.as_secs_f64(),
        RECORDS as f64 / elapsed.as_secs_f64(),
        RECORDS as f64 / append_time.as_secs_f64(),
        deleted as f64 / compact_time.as_secs_f64(),
        max_history as f64 / MAX_BYTES as f64,
        last_of_job.len(),
        main_disk / last_of_job.len() as u64,
        reopen.as_secs_f64(),
    );
}
