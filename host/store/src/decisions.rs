//! Decision records: writing them in batches, reading them back by job, node and time, and
//! compacting old history away while each job's final outcome stays.
//!
//! Records are packed into chunks of up to [`CHUNK_RECORDS`], one sled value each, keyed by the
//! first one's sequence number, in the `history` tree of the history database; a batch of them
//! and the counters it moves commit with one [`sled::Tree::apply_batch`], which sled recovers
//! whole or not at all. Lookups by job, node and time go through the in-memory
//! [`Index`](crate::index::Index), derived from the chunks. A job's final outcome is its newest
//! retained record; when compaction deletes that record it first keeps a copy under `f` in the
//! `jobs` tree of the main database.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};

use gantry_core::Explanation;
use serde::{Deserialize, Serialize};

use crate::codec::{self, CHUNK_RECORDS, Head, placed_nodes};
use crate::index::RecordId;
use crate::{Actor, Result, Store, StoreError, be_u64};

/// Key tag of a chunk of records: `c` ‖ the first record's seq (big-endian `u64`).
pub(crate) const CHUNK: u8 = b'c';
/// Key tag of a kept final outcome in the `jobs` tree: `f` ‖ job.
pub(crate) const FINAL: u8 = b'f';
/// The decision byte counter ([`Store::decision_bytes`]), a big-endian `u64`. The counters'
/// keys start with `#`, which sorts before the chunks' `c`: with them after the chunks, in the
/// leaf every append writes to, sled never reclaimed the space of deleted chunks (the history
/// database grew by ~70% of everything appended; measured with `examples`-style runs of 2M
/// records at 64 MiB retained). Before the chunks it holds steady near 2× the history.
pub(crate) const COUNTER_BYTES: &[u8] = b"#decision_bytes";
/// The next record sequence number, a big-endian `u64`; it commits with the records that used
/// the numbers before it, so a number is never given twice, even across a crash.
pub(crate) const COUNTER_NEXT_SEQ: &[u8] = b"#next_seq";

const MALFORMED: StoreError = StoreError::Malformed { tree: "history" };

/// A decision to append: the store assigns its sequence number.
#[derive(Debug, Clone, PartialEq)]
pub struct NewDecision {
    /// Wall or virtual time of the decision, in ms since the epoch (or since the simulation
    /// started). Reads by time and retention go by it.
    pub time_ms: u64,
    pub explanation: Explanation,
}

/// A stored decision, as read back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct DecisionRecord {
    /// When the cycle that decided ran (ms since the epoch).
    pub time_ms: u64,
    /// Unique and increasing in append order, across restarts; breaks ties between records with
    /// the same time.
    pub seq: u64,
    /// What was decided, and why.
    pub explanation: Explanation,
}

/// What one [`Store::compact`] call did, so the caller can log or export it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactReport {
    pub deleted: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

pub(crate) fn chunk_key(first_seq: u64) -> [u8; 9] {
    let mut key = [0u8; 9];
    key[0] = CHUNK;
    key[1..].copy_from_slice(&first_seq.to_be_bytes());
    key
}

pub(crate) fn parse_chunk_key(key: &[u8]) -> Result<u64> {
    match key {
        [CHUNK, rest @ ..] => be_u64(rest, "history"),
        _ => Err(MALFORMED),
    }
}

fn final_key(job: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + job.len());
    k.push(FINAL);
    k.extend_from_slice(job.as_bytes());
    k
}

/// The store's byte accounting for one chunk: its key and value in the `history` tree. This is
/// what [`Store::decision_bytes`] sums and what `max_bytes` bounds.
pub(crate) fn accounted_bytes(value_len: usize) -> u64 {
    (9 + value_len) as u64
}

fn decode_record(id: RecordId, record: &[u8]) -> Result<DecisionRecord> {
    Ok(DecisionRecord {
        time_ms: id.0,
        seq: id.1,
        explanation: codec::decode(record)?,
    })
}

/// A kept final outcome: time ‖ seq ‖ the record's encoding.
fn decode_final(value: &[u8]) -> Result<DecisionRecord> {
    if value.len() < 16 {
        return Err(StoreError::Malformed { tree: "jobs" });
    }
    let id = (be_u64(&value[..8], "jobs")?, be_u64(&value[8..16], "jobs")?);
    decode_record(id, &value[16..])
}

/// One chunk read back: its first sequence number and its records' ids and encodings.
fn chunk_records(first: u64, value: &[u8]) -> Result<Vec<(RecordId, &[u8])>> {
    Ok(codec::decode_chunk(value)?
        .into_iter()
        .zip(first..)
        .map(|((time, record), seq)| ((time, seq), record))
        .collect())
}

/// A chunk a compaction step deletes, decoded: its records' ids and index heads, and their
/// encodings for the final-outcome copies.
struct Victim<'a> {
    first: u64,
    heads: Vec<(RecordId, Head<'a>)>,
    encodings: Vec<&'a [u8]>,
}

impl Store {
    /// Appends a batch of decisions atomically: the records and the byte and sequence counters
    /// commit together or not at all. Returns the sequence numbers given, in input order. Batch
    /// for throughput: one call per scheduling cycle, not one per decision.
    pub fn append_decisions(&self, batch: &[NewDecision]) -> Result<Vec<u64>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        // Encoding needs no lock.
        let chunks: Vec<(&[NewDecision], Vec<u8>)> = batch
            .chunks(CHUNK_RECORDS)
            .map(|part| {
                let records: Vec<(u64, Vec<u8>)> = part
                    .iter()
                    .map(|d| (d.time_ms, codec::encode(&d.explanation)))
                    .collect();
                (part, codec::encode_chunk(&records))
            })
            .collect();
        let _writer = self.writer();
        let first = self.counter(COUNTER_NEXT_SEQ)?;
        let bytes = self.counter(COUNTER_BYTES)?;
        let mut writes = sled::Batch::default();
        let mut added = 0u64;
        let mut metas = Vec::with_capacity(chunks.len());
        let mut next = first;
        for (part, value) in chunks {
            let chunk_bytes = accounted_bytes(value.len());
            added += chunk_bytes;
            writes.insert(&chunk_key(next)[..], value);
            metas.push((next, chunk_bytes, part));
            next += part.len() as u64;
        }
        writes.insert(COUNTER_NEXT_SEQ, &next.to_be_bytes()[..]);
        writes.insert(COUNTER_BYTES, &(bytes + added).to_be_bytes()[..]);
        self.history.apply_batch(writes)?;
        // Indexed only once committed, so a reader never finds an id before its record.
        let mut index = self.index_write();
        for (chunk_first, chunk_bytes, part) in metas {
            let records: Vec<(RecordId, Head<'_>)> = part
                .iter()
                .zip(chunk_first..)
                .map(|(d, seq)| {
                    let head = Head {
                        job: &d.explanation.job,
                        nodes: placed_nodes(&d.explanation.outcome),
                    };
                    ((d.time_ms, seq), head)
                })
                .collect();
            index.add_chunk(chunk_first, chunk_bytes, &records);
        }
        Ok((first..next).collect())
    }

    /// The store's accounting of the decision history's size: the keys and values of the
    /// retained chunks of records. Exact and updated atomically with every append and deletion,
    /// unlike sled's `size_on_disk`, which lags. Not counted: the kept final outcomes (one per
    /// job), the pod map and the in-memory index.
    pub fn decision_bytes(&self) -> Result<u64> {
        self.counter(COUNTER_BYTES)
    }

    /// One record by its time and sequence number.
    pub fn decision(&self, time_ms: u64, seq: u64) -> Result<Option<DecisionRecord>> {
        self.record((time_ms, seq))
    }

    fn record(&self, id: RecordId) -> Result<Option<DecisionRecord>> {
        let Some(first) = self.index_read().chunk_of(id.1) else {
            return Ok(None);
        };
        // Gone if compaction deleted the chunk since the index was read.
        let Some(value) = self.history.get(chunk_key(first))? else {
            return Ok(None);
        };
        let records = codec::decode_chunk(&value)?;
        let slot = usize::try_from(id.1 - first).map_err(|_| MALFORMED)?;
        match records.get(slot) {
            Some(&(time, record)) if time == id.0 => decode_record(id, record).map(Some),
            Some(_) => Ok(None),
            None => Err(MALFORMED),
        }
    }

    /// Fetches the records of `ids`, skipping any that compaction deleted since the index was
    /// read.
    fn records(&self, ids: &[RecordId]) -> Result<Vec<DecisionRecord>> {
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            if let Some(r) = self.record(id)? {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// A job's latest decision: the newer of its newest retained record and the copy
    /// compaction kept, so it survives compaction.
    pub fn latest_for_job(&self, job: &str) -> Result<Option<DecisionRecord>> {
        let newest = self
            .index_read()
            .by_job
            .get(job)
            .and_then(|ids| ids.last().copied());
        // The index first, the copy second: compaction writes the copy in the same batch as it
        // deletes the record, so a record that vanishes between the two reads is found as a
        // copy.
        let indexed = match newest {
            Some(id) => self.record(id)?,
            None => None,
        };
        let kept = self
            .jobs
            .get(final_key(job))?
            .map(|v| decode_final(&v))
            .transpose()?;
        Ok(match (indexed, kept) {
            (Some(a), Some(b)) => Some(if (a.time_ms, a.seq) >= (b.time_ms, b.seq) {
                a
            } else {
                b
            }),
            (a, b) => a.or(b),
        })
    }

    /// A job's decisions still retained, oldest first. The latest is always last, even once
    /// compaction has dropped it from the history.
    pub fn job_history(&self, job: &str) -> Result<Vec<DecisionRecord>> {
        self.job_history_newest(job, usize::MAX)
    }

    /// The newest `limit` of [`Store::job_history`], oldest first: only those are read, so a
    /// long-pending job's thousands of records cost a short read.
    pub fn job_history_newest(&self, job: &str, limit: usize) -> Result<Vec<DecisionRecord>> {
        let mut ids = self.index_read().job(job);
        ids.drain(..ids.len().saturating_sub(limit));
        let mut out = self.records(&ids)?;
        if let Some(latest) = self.latest_for_job(job)? {
            let newer = out
                .last()
                .is_none_or(|r| (r.time_ms, r.seq) < (latest.time_ms, latest.seq));
            if newer {
                out.push(latest);
            }
        }
        out.drain(..out.len().saturating_sub(limit));
        Ok(out)
    }

    /// Decisions that placed pods on `node`, with `from_ms <= time_ms < to_ms`, oldest first,
    /// at most `limit`.
    pub fn decisions_on_node(
        &self,
        node: &str,
        from_ms: u64,
        to_ms: u64,
        limit: usize,
    ) -> Result<Vec<DecisionRecord>> {
        let ids = self.index_read().node(node, from_ms, to_ms, limit);
        self.records(&ids)
    }

    /// Decisions with `from_ms <= time_ms < to_ms`, oldest first (ties by sequence number), at
    /// most `limit`.
    pub fn decisions_between(
        &self,
        from_ms: u64,
        to_ms: u64,
        limit: usize,
    ) -> Result<Vec<DecisionRecord>> {
        let chunks = self.index_read().chunks_between(from_ms, to_ms);
        // Chunks are in time order inside and between each other when records are appended in
        // time order; in general they overlap, so merge them: a chunk is opened once the merge
        // reaches its oldest time, and the heap yields the oldest record of the open ones.
        // Each open chunk's records in the range, newest first, so the oldest pops off the end.
        let mut open: Vec<Vec<DecisionRecord>> = Vec::new();
        let mut heap: BinaryHeap<Reverse<(RecordId, usize)>> = BinaryHeap::new();
        let mut next = 0;
        let mut out = Vec::new();
        while out.len() < limit {
            while let Some(&(min_time, first)) = chunks.get(next) {
                if heap
                    .peek()
                    .is_some_and(|Reverse(((t, _), _))| *t < min_time)
                {
                    break;
                }
                next += 1;
                // Gone if compaction deleted it since the index was read.
                let Some(value) = self.history.get(chunk_key(first))? else {
                    continue;
                };
                let mut records = Vec::new();
                for (id, record) in chunk_records(first, &value)? {
                    if (from_ms..to_ms).contains(&id.0) {
                        records.push(decode_record(id, record)?);
                    }
                }
                records.sort_unstable_by_key(|r| Reverse((r.time_ms, r.seq)));
                if let Some(r) = records.last() {
                    heap.push(Reverse(((r.time_ms, r.seq), open.len())));
                    open.push(records);
                }
            }
            let Some(Reverse((_, chunk))) = heap.pop() else {
                break;
            };
            let records = &mut open[chunk];
            out.extend(records.pop());
            if let Some(r) = records.last() {
                heap.push(Reverse(((r.time_ms, r.seq), chunk)));
            }
        }
        Ok(out)
    }

    /// Every job's final outcome (its latest decision), in job-name order, at most `limit`.
    pub fn final_outcomes(&self, limit: usize) -> Result<Vec<DecisionRecord>> {
        // Every job with a retained record or a kept copy.
        let mut jobs: BTreeSet<String> = self
            .index_read()
            .by_job
            .keys()
            .map(|j| j.to_string())
            .collect();
        for item in self.jobs.scan_prefix([FINAL]).keys() {
            let k = item?;
            let job =
                std::str::from_utf8(&k[1..]).map_err(|_| StoreError::Malformed { tree: "jobs" })?;
            jobs.insert(job.to_string());
        }
        let mut out = Vec::new();
        for job in jobs.iter().take(limit) {
            if let Some(r) = self.latest_for_job(job)? {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// Applies retention, a chunk at a time, oldest first (by the newest record in each chunk):
    /// deletes the chunks whose records are all older than `max_age` before `now_ms`, then more
    /// while the history exceeds `max_bytes`. A chunk holds up to 64 records of one append, so a
    /// record can outlive `max_age` by as long as its chunk's other records are younger. Works in
    /// steps of a few thousand records. Each step first keeps (durably) a copy of every job's
    /// final outcome whose record it deletes and drops the pod-map entries of jobs left with no
    /// record (see [`Store::record_pods`]), then deletes its chunks and moves the byte counter in
    /// one atomic batch; appends can run between steps. Audited as `compact` by
    /// `gantry`/`retention` when anything was deleted.
    pub fn compact(&self, now_ms: u64) -> Result<CompactReport> {
        const STEP_CHUNKS: usize = 64;
        let cutoff = now_ms.saturating_sub(self.config.max_age.as_millis() as u64);
        let max_bytes = self.config.max_bytes;
        let bytes_before = self.decision_bytes()?;
        // The counter after the last step; appends may have moved it between steps.
        let mut bytes;
        let mut deleted = 0u64;
        loop {
            let _writer = self.writer();
            bytes = self.counter(COUNTER_BYTES)?;
            let mut freed = 0u64;
            let mut victims: Vec<u64> = Vec::new();
            {
                let index = self.index_read();
                for &(max_time, first) in &index.by_age {
                    if max_time >= cutoff && bytes.saturating_sub(freed) <= max_bytes {
                        break;
                    }
                    freed += index.chunks[&first].bytes;
                    victims.push(first);
                    if victims.len() >= STEP_CHUNKS {
                        break;
                    }
                }
            }
            if victims.is_empty() {
                break;
            }
            let values: Vec<(u64, sled::IVec)> = victims
                .iter()
                .map(|&first| Ok((first, self.history.get(chunk_key(first))?.ok_or(MALFORMED)?)))
                .collect::<Result<_>>()?;
            let mut chunks: Vec<Victim<'_>> = Vec::new();
            for (first, value) in &values {
                let mut victim = Victim {
                    first: *first,
                    heads: Vec::new(),
                    encodings: Vec::new(),
                };
                for (id, record) in chunk_records(*first, value)? {
                    victim.heads.push((id, codec::decode_head(record)?));
                    victim.encodings.push(record);
                }
                chunks.push(victim);
            }
            // Per job: how many of its records this step deletes, and the newest of them.
            let mut jobs: HashMap<&str, (usize, RecordId, &[u8])> = HashMap::new();
            for Victim {
                heads, encodings, ..
            } in &chunks
            {
                for ((id, head), record) in heads.iter().zip(encodings) {
                    let entry = jobs.entry(head.job).or_insert((0, *id, record));
                    entry.0 += 1;
                    if *id > entry.1 {
                        (entry.1, entry.2) = (*id, record);
                    }
                }
            }
            let mut job_writes = sled::Batch::default();
            let mut staged = false;
            {
                let index = self.index_read();
                for (&job, &(count, newest, record)) in &jobs {
                    let Some(ids) = index.by_job.get(job) else {
                        continue;
                    };
                    if ids.last() == Some(&newest) {
                        staged |= self.keep_final(&mut job_writes, job, newest, record)?;
                    }
                    if ids.len() == count {
                        staged |= self.forget_pods(&mut job_writes, job)?;
                    }
                }
            }
            // The copies are on disk before the records go: a crash in between leaves a copy of
            // a record that is still there (which reads ignore) and drops the pods of jobs this
            // step would have emptied, never a job without its final outcome.
            if staged {
                self.jobs.apply_batch(job_writes)?;
                self.db.flush()?;
            }
            let mut chunk_writes = sled::Batch::default();
            for victim in &chunks {
                chunk_writes.remove(&chunk_key(victim.first)[..]);
                deleted += victim.heads.len() as u64;
            }
            let left = bytes.saturating_sub(freed);
            chunk_writes.insert(COUNTER_BYTES, &left.to_be_bytes()[..]);
            self.history.apply_batch(chunk_writes)?;
            let mut index = self.index_write();
            for victim in &chunks {
                index.remove_chunk(victim.first, &victim.heads);
            }
        }
        if deleted > 0 {
            let actor = Actor::new("gantry", "retention");
            let entry = self.pending_audit(
                &actor,
                now_ms,
                "compact",
                format!("deleted {deleted} decisions, {bytes_before} -> {bytes} bytes"),
            )?;
            self.audit.insert(entry.key, entry.value)?;
        }
        Ok(CompactReport {
            deleted,
            bytes_before,
            bytes_after: bytes,
        })
    }

    /// Stages a copy of the record `id` of `job` as its kept final outcome, unless a newer copy
    /// is kept already (a record appended late with an older time can be deleted after a newer
    /// one). Returns whether it staged anything.
    fn keep_final(
        &self,
        writes: &mut sled::Batch,
        job: &str,
        id: RecordId,
        record: &[u8],
    ) -> Result<bool> {
        let key = final_key(job);
        let mut copy = Vec::with_capacity(16 + record.len());
        copy.extend_from_slice(&id.0.to_be_bytes());
        copy.extend_from_slice(&id.1.to_be_bytes());
        if let Some(cur) = self.jobs.get(&key)?
            && cur.len() >= 16
            && cur[..16] > copy[..]
        {
            return Ok(false);
        }
        copy.extend_from_slice(record);
        writes.insert(key, copy);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl NewDecision {
        fn with_job(mut self, job: &str) -> Self {
            self.explanation.job = job.into();
            self
        }
    }

    #[test]
    fn latest_prefers_the_newest_of_record_and_kept_copy() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = crate::StoreConfig::new(dir.path());
        config.max_age = std::time::Duration::from_millis(100);
        let store = Store::open(config).unwrap();
        let d = |job: &str, time_ms| {
            NewDecision {
                time_ms,
                explanation: crate::sample_explanation(time_ms),
            }
            .with_job(job)
        };
        store
            .append_decisions(&[d("a", 10), d("a", 30), d("b", 20)])
            .unwrap();
        let copies = || store.jobs.scan_prefix([FINAL]).count();
        assert_eq!(copies(), 0);
        assert_eq!(store.latest_for_job("a").unwrap().unwrap().time_ms, 30);
        // Compaction drops everything older than 100 ms before 135: the newest records of
        // both jobs go and leave copies.
        let report = store.compact(135).unwrap();
        assert_eq!(report.deleted, 3);
        assert_eq!(copies(), 2);
        assert_eq!(store.latest_for_job("a").unwrap().unwrap().time_ms, 30);
        let finals: Vec<(String, u64)> = store
            .final_outcomes(10)
            .unwrap()
            .into_iter()
            .map(|r| (r.explanation.job, r.time_ms))
            .collect();
        assert_eq!(finals, vec![("a".into(), 30), ("b".into(), 20)]);
        // A newer append wins over the copy, and a job with only retained records is listed.
        store.append_decisions(&[d("a", 200), d("c", 150)]).unwrap();
        assert_eq!(store.latest_for_job("a").unwrap().unwrap().time_ms, 200);
        let jobs: Vec<String> = store
            .final_outcomes(10)
            .unwrap()
            .into_iter()
            .map(|r| r.explanation.job)
            .collect();
        assert_eq!(jobs, vec!["a", "b", "c"]);
        assert_eq!(store.final_outcomes(2).unwrap().len(), 2);
        // A late record with an old time is deleted after the copy of a newer one and does not
        // replace it.
        store.append_decisions(&[d("b", 5)]).unwrap();
        assert_eq!(store.compact(400).unwrap().deleted, 3);
        assert_eq!(store.latest_for_job("b").unwrap().unwrap().time_ms, 20);
        assert_eq!(store.latest_for_job("a").unwrap().unwrap().time_ms, 200);
    }

    #[test]
    fn chunk_keys_sort_by_seq_and_parse_back() {
        let mut keys = vec![chunk_key(256), chunk_key(1), chunk_key(255)];
        keys.sort();
        assert_eq!(keys, vec![chunk_key(1), chunk_key(255), chunk_key(256)]);
        assert_eq!(parse_chunk_key(&chunk_key(7)).unwrap(), 7);
        assert!(parse_chunk_key(&chunk_key(7)[..8]).is_err());
        assert!(parse_chunk_key(b"f01234567").is_err());
        assert_eq!(accounted_bytes(100), 109);
    }

    #[test]
    fn overlapping_chunks_read_back_in_time_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(crate::StoreConfig::new(dir.path())).unwrap();
        let d = |time_ms| NewDecision {
            time_ms,
            explanation: crate::sample_explanation(time_ms),
        };
        // Two batches whose times interleave, one of them bigger than a chunk and out of order.
        let first: Vec<NewDecision> = (0..150).rev().map(|i| d(i * 2)).collect();
        let second: Vec<NewDecision> = (0..100).map(|i| d(i * 3 + 1)).collect();
        store.append_decisions(&first).unwrap();
        store.append_decisions(&second).unwrap();
        let all = store.decisions_between(0, u64::MAX, usize::MAX).unwrap();
        assert_eq!(all.len(), 250);
        assert!(
            all.windows(2)
                .all(|w| (w[0].time_ms, w[0].seq) < (w[1].time_ms, w[1].seq))
        );
        let window = store.decisions_between(100, 130, 7).unwrap();
        let times: Vec<u64> = window.iter().map(|r| r.time_ms).collect();
        assert_eq!(times, vec![100, 100, 102, 103, 104, 106, 106]);
        // Equal times come back in sequence order.
        assert!(window[0].seq < window[1].seq);
        assert!(store.decisions_between(5, 5, 10).unwrap().is_empty());
        assert!(store.decisions_between(1000, 2000, 10).unwrap().is_empty());
        // Each record is also found by its id.
        let r = &window[3];
        assert_eq!(store.decision(r.time_ms, r.seq).unwrap().as_ref(), Some(r));
        assert_eq!(store.decision(r.time_ms + 1, r.seq).unwrap(), None);
        assert_eq!(store.decision(0, 10_000).unwrap(), None);
    }
}
