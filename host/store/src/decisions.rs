//! Decision records: writing them in batches, reading them back by job, node and time, and
//! compacting old history away while each job's final outcome stays.
//!
//! The `decisions` tree is authoritative. The index trees (`by_job`, `by_node`) are written in
//! the same transaction as the record, and index entries are deleted in the same transaction as
//! the record they point at, so an index entry pointing nowhere cannot happen; readers skip one
//! anyway rather than fail. A job's final outcome is its newest `by_job` entry; compaction keeps
//! a copy in `final_outcomes` in the same transaction as it deletes that record.

use std::collections::{BTreeSet, HashMap};

use gantry_core::{Explanation, Outcome};
use serde::{Deserialize, Serialize};
use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionError};

use crate::{Actor, KEY_DECISION_BYTES, Result, Store, StoreError, be_u64};

/// A decision to append: the store assigns its sequence number.
#[derive(Debug, Clone, PartialEq)]
pub struct NewDecision {
    /// Wall or virtual time of the decision, in ms since the epoch (or since the simulation
    /// started). Keys sort by it, so range scans run in this order.
    pub time_ms: u64,
    pub explanation: Explanation,
}

/// A stored decision, as read back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRecord {
    pub time_ms: u64,
    /// Unique and increasing in append order, across restarts; breaks ties between records with
    /// the same time.
    pub seq: u64,
    pub explanation: Explanation,
}

/// What one [`Store::compact`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactReport {
    pub deleted: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// Only the fields compaction needs to find a record's index entries; serde skips the rest.
#[derive(Deserialize)]
struct IndexView {
    job: String,
    outcome: Outcome,
}

fn record_key(time_ms: u64, seq: u64) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&time_ms.to_be_bytes());
    key[8..].copy_from_slice(&seq.to_be_bytes());
    key
}

fn index_key(name: &str, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(name.len() + 1 + key.len());
    k.extend_from_slice(name.as_bytes());
    k.push(0);
    k.extend_from_slice(key);
    k
}

fn index_prefix(name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(name.len() + 1);
    k.extend_from_slice(name.as_bytes());
    k.push(0);
    k
}

/// The nodes a record is indexed under: each placed node once.
fn placed_nodes(outcome: &Outcome) -> Vec<&str> {
    match outcome {
        Outcome::Placed { nodes } => {
            let mut names: Vec<&str> = nodes.iter().map(|(n, _)| n.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            names
        }
        Outcome::Pending { .. } => Vec::new(),
    }
}

/// The store's byte accounting for one record: its key and value plus its index keys. This is
/// what [`Store::decision_bytes`] sums and what `max_bytes` bounds.
fn accounted_bytes(value_len: usize, job: &str, nodes: &[&str]) -> u64 {
    let index: usize = (job.len() + 17) + nodes.iter().map(|n| n.len() + 17).sum::<usize>();
    (16 + value_len + index) as u64
}

fn decode_record(key: &[u8], value: &[u8]) -> Result<DecisionRecord> {
    if key.len() != 16 {
        return Err(StoreError::Malformed { tree: "decisions" });
    }
    Ok(DecisionRecord {
        time_ms: be_u64(&key[..8], "decisions")?,
        seq: be_u64(&key[8..], "decisions")?,
        explanation: serde_json::from_slice(value)?,
    })
}

pub(crate) fn tx_err(e: TransactionError<StoreError>) -> StoreError {
    match e {
        TransactionError::Abort(e) => e,
        TransactionError::Storage(e) => StoreError::Sled(e),
    }
}

struct Prepared {
    key: [u8; 16],
    value: Vec<u8>,
    job_key: Vec<u8>,
    node_keys: Vec<Vec<u8>>,
}

impl Store {
    /// Appends a batch of decisions in one transaction: each record, its `by_job` and `by_node`
    /// entries, its job's final outcome and the byte counter commit together or not at all.
    /// Returns the sequence numbers given, in input order. Batch for throughput: one call per
    /// scheduling cycle, not one per decision.
    pub fn append_decisions(&self, batch: &[NewDecision]) -> Result<Vec<u64>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let mut prepared = Vec::with_capacity(batch.len());
        let mut seqs = Vec::with_capacity(batch.len());
        let mut added: u64 = 0;
        for d in batch {
            let seq = self.db.generate_id()?;
            seqs.push(seq);
            let key = record_key(d.time_ms, seq);
            let value = serde_json::to_vec(&d.explanation)?;
            let job = d.explanation.job.as_str();
            let nodes = placed_nodes(&d.explanation.outcome);
            added += accounted_bytes(value.len(), job, &nodes);
            prepared.push(Prepared {
                key,
                job_key: index_key(job, &key),
                node_keys: nodes.iter().map(|n| index_key(n, &key)).collect(),
                value,
            });
        }
        // A job's final outcome is its newest `by_job` entry while that record exists, so
        // appends write nothing to `final_outcomes`: compaction stores a copy there when it
        // deletes a job's newest record. (Maintaining a pointer per job per batch cost about a
        // fifth of the append rate.)
        (&self.decisions, &self.by_job, &self.by_node, &self.meta)
            .transaction(|(decisions, by_job, by_node, meta)| {
                for p in &prepared {
                    decisions.insert(&p.key[..], &p.value[..])?;
                    by_job.insert(&p.job_key[..], &[][..])?;
                    for k in &p.node_keys {
                        by_node.insert(&k[..], &[][..])?;
                    }
                }
                let bytes = match meta.get(KEY_DECISION_BYTES)? {
                    Some(v) => be_u64(&v, "meta").map_err(ConflictableTransactionError::Abort)?,
                    None => 0,
                };
                meta.insert(KEY_DECISION_BYTES, &(bytes + added).to_be_bytes())?;
                Ok(())
            })
            .map_err(tx_err)?;
        Ok(seqs)
    }

    /// The store's accounting of the decision history's size: record keys and values plus their
    /// index keys. Exact and updated atomically with every append and deletion, unlike sled's
    /// `size_on_disk`, which lags. The `final_outcomes` copies (one per job) are not counted.
    pub fn decision_bytes(&self) -> Result<u64> {
        Ok(self.meta_u64(KEY_DECISION_BYTES)?.unwrap_or(0))
    }

    /// One record by its time and sequence number.
    pub fn decision(&self, time_ms: u64, seq: u64) -> Result<Option<DecisionRecord>> {
        let key = record_key(time_ms, seq);
        self.decisions
            .get(key)?
            .map(|v| decode_record(&key, &v))
            .transpose()
    }

    /// A job's latest decision: the newest of its retained records (its last `by_job` entry)
    /// and the copy compaction kept in `final_outcomes`, so it survives compaction.
    pub fn latest_for_job(&self, job: &str) -> Result<Option<DecisionRecord>> {
        // The index first, `final_outcomes` second: compaction writes the copy in the same
        // transaction as it deletes the record, so a record that vanishes between the two reads
        // is found as a copy.
        let mut indexed = None;
        for item in self.by_job.scan_prefix(index_prefix(job)).rev() {
            let (k, _) = item?;
            let key = &k[k.len().saturating_sub(16)..];
            // An entry pointing nowhere counts as absent (the record is authoritative).
            if let Some(v) = self.decisions.get(key)? {
                indexed = Some(decode_record(key, &v)?);
                break;
            }
        }
        let kept = match self.final_outcomes.get(job.as_bytes())? {
            None => None,
            Some(v) if v.len() < 16 => {
                return Err(StoreError::Malformed {
                    tree: "final_outcomes",
                });
            }
            Some(v) => self.resolve_final(&v)?,
        };
        Ok(match (indexed, kept) {
            (Some(a), Some(b)) => Some(if (a.time_ms, a.seq) >= (b.time_ms, b.seq) {
                a
            } else {
                b
            }),
            (a, b) => a.or(b),
        })
    }

    /// A `final_outcomes` value: key ‖ copied record, or (written by earlier builds) a 16-byte
    /// pointer into `decisions`.
    fn resolve_final(&self, v: &[u8]) -> Result<Option<DecisionRecord>> {
        if v.len() > 16 {
            return decode_record(&v[..16], &v[16..]).map(Some);
        }
        match self.decisions.get(v)? {
            Some(record) => decode_record(v, &record).map(Some),
            None => Ok(None),
        }
    }

    /// A job's decisions still retained, oldest first. The latest is always last, even once
    /// compaction has dropped it from the history.
    pub fn job_history(&self, job: &str) -> Result<Vec<DecisionRecord>> {
        let mut out = self.index_scan(&self.by_job, job, 0, u64::MAX, usize::MAX)?;
        if let Some(latest) = self.latest_for_job(job)? {
            let newer = out
                .last()
                .is_none_or(|r| (r.time_ms, r.seq) < (latest.time_ms, latest.seq));
            if newer {
                out.push(latest);
            }
        }
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
        self.index_scan(&self.by_node, node, from_ms, to_ms, limit)
    }

    /// Decisions with `from_ms <= time_ms < to_ms`, oldest first, at most `limit`.
    pub fn decisions_between(
        &self,
        from_ms: u64,
        to_ms: u64,
        limit: usize,
    ) -> Result<Vec<DecisionRecord>> {
        let mut out = Vec::new();
        for item in self
            .decisions
            .range(from_ms.to_be_bytes()..to_ms.to_be_bytes())
            .take(limit)
        {
            let (k, v) = item?;
            out.push(decode_record(&k, &v)?);
        }
        Ok(out)
    }

    /// Every job's final outcome (its latest decision), in job-name order, at most `limit`.
    pub fn final_outcomes(&self, limit: usize) -> Result<Vec<DecisionRecord>> {
        // Every job with a retained record or a kept copy: the copies' keys, plus the distinct
        // job names in `by_job`, found by seeking past each name's entries.
        let mut jobs: BTreeSet<Vec<u8>> = BTreeSet::new();
        for item in self.final_outcomes.iter().keys() {
            jobs.insert(item?.to_vec());
        }
        let mut from: Vec<u8> = Vec::new();
        while let Some(item) = self.by_job.range(from.as_slice()..).next() {
            let (k, _) = item?;
            if k.len() < 17 || k[k.len() - 17] != 0 {
                return Err(StoreError::Malformed { tree: "by_job" });
            }
            let name = &k[..k.len() - 17];
            jobs.insert(name.to_vec());
            // `name ‖ 0x01` sorts after every `name ‖ 0x00 ‖ key` and before the next name.
            from = name.to_vec();
            from.push(1);
        }
        let mut out = Vec::new();
        for name in jobs.iter().take(limit) {
            let job = std::str::from_utf8(name).map_err(|_| StoreError::Malformed {
                tree: "final_outcomes",
            })?;
            if let Some(r) = self.latest_for_job(job)? {
                out.push(r);
            }
        }
        Ok(out)
    }

    fn index_scan(
        &self,
        index: &sled::Tree,
        name: &str,
        from_ms: u64,
        to_ms: u64,
        limit: usize,
    ) -> Result<Vec<DecisionRecord>> {
        let mut start = index_prefix(name);
        start.extend_from_slice(&from_ms.to_be_bytes());
        let mut end = index_prefix(name);
        end.extend_from_slice(&to_ms.to_be_bytes());
        let mut out = Vec::new();
        for item in index.range(start..end) {
            if out.len() >= limit {
                break;
            }
            let (k, _) = item?;
            let key = &k[k.len().saturating_sub(16)..];
            // An entry pointing nowhere counts as absent (the record is authoritative).
            if let Some(v) = self.decisions.get(key)? {
                out.push(decode_record(key, &v)?);
            }
        }
        Ok(out)
    }

    /// Applies retention: deletes decision records, oldest first, while they are older than
    /// `max_age` before `now_ms` or the history exceeds `max_bytes`. Each record goes with its
    /// index entries in one transaction. Final outcomes stay. Audited as `compact` by
    /// `gantry`/`retention` when anything was deleted.
    pub fn compact(&self, now_ms: u64) -> Result<CompactReport> {
        const CHUNK: usize = 2048;
        let cutoff = now_ms.saturating_sub(self.config.max_age.as_millis() as u64);
        let max_bytes = self.config.max_bytes;
        let bytes_before = self.decision_bytes()?;
        let mut bytes = bytes_before;
        let mut deleted = 0u64;
        loop {
            // (record key, record value, job, index keys)
            let mut chunk: Vec<(sled::IVec, sled::IVec, String, Vec<Vec<u8>>)> = Vec::new();
            let mut freed = 0u64;
            for item in self.decisions.iter() {
                let (k, v) = item?;
                if k.len() != 16 {
                    return Err(StoreError::Malformed { tree: "decisions" });
                }
                let time = be_u64(&k[..8], "decisions")?;
                if time >= cutoff && bytes - freed <= max_bytes {
                    break;
                }
                let view: IndexView = serde_json::from_slice(&v)?;
                let nodes = placed_nodes(&view.outcome);
                freed += accounted_bytes(v.len(), &view.job, &nodes);
                let mut index = vec![index_key(&view.job, &k)];
                index.extend(nodes.iter().map(|n| index_key(n, &k)));
                chunk.push((k, v, view.job, index));
                if chunk.len() >= CHUNK {
                    break;
                }
            }
            if chunk.is_empty() {
                break;
            }
            // Each job whose newest record goes in this chunk keeps a copy of it in
            // `final_outcomes`. An append racing with this only adds newer records, which
            // `latest_for_job` prefers to the copy.
            let mut newest_in_chunk: HashMap<&str, usize> = HashMap::new();
            for (i, (_, _, job, _)) in chunk.iter().enumerate() {
                // The chunk is in key order, so the last one wins.
                newest_in_chunk.insert(job.as_str(), i);
            }
            let mut copies: Vec<usize> = Vec::new();
            for (job, i) in newest_in_chunk {
                let newest = match self.by_job.scan_prefix(index_prefix(job)).next_back() {
                    Some(item) => item?.0,
                    None => continue,
                };
                if newest.as_ref() == chunk[i].3[0].as_slice() {
                    copies.push(i);
                }
            }
            (
                &self.decisions,
                &self.by_job,
                &self.by_node,
                &self.final_outcomes,
                &self.meta,
            )
                .transaction(|(decisions, by_job, by_node, final_outcomes, meta)| {
                    for &i in &copies {
                        let (k, v, job, _) = &chunk[i];
                        // Keep a newer copy; replace an older one, or a pointer (written by
                        // earlier builds) to this or an older record.
                        let keep = match final_outcomes.get(job.as_bytes())? {
                            Some(cur) => cur.len() >= 16 && cur[..16] > k[..],
                            None => false,
                        };
                        if !keep {
                            let mut copy = Vec::with_capacity(16 + v.len());
                            copy.extend_from_slice(k);
                            copy.extend_from_slice(v);
                            final_outcomes.insert(job.as_bytes(), copy)?;
                        }
                    }
                    for (k, _, _, index) in &chunk {
                        decisions.remove(k)?;
                        by_job.remove(&index[0][..])?;
                        for n in &index[1..] {
                            by_node.remove(&n[..])?;
                        }
                    }
                    let cur = match meta.get(KEY_DECISION_BYTES)? {
                        Some(v) => {
                            be_u64(&v, "meta").map_err(ConflictableTransactionError::Abort)?
                        }
                        None => 0,
                    };
                    meta.insert(KEY_DECISION_BYTES, &cur.saturating_sub(freed).to_be_bytes())?;
                    Ok(())
                })
                .map_err(tx_err)?;
            deleted += chunk.len() as u64;
            bytes = self.decision_bytes()?;
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latest_prefers_the_newest_of_index_copy_and_old_pointer() {
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
        let seqs = store
            .append_decisions(&[d("a", 10), d("a", 30), d("b", 20)])
            .unwrap();
        assert!(store.final_outcomes.is_empty());
        // A stale pointer from an earlier build, to an older record, loses to the index.
        store
            .final_outcomes
            .insert("a", &record_key(10, seqs[0])[..])
            .unwrap();
        assert_eq!(store.latest_for_job("a").unwrap().unwrap().time_ms, 30);
        // Compaction drops everything older than 100 ms before 135: the newest records of
        // both jobs go and leave copies, replacing the stale pointer.
        let report = store.compact(135).unwrap();
        assert_eq!(report.deleted, 3);
        assert_eq!(store.final_outcomes.len(), 2);
        assert_eq!(store.latest_for_job("a").unwrap().unwrap().time_ms, 30);
        let finals: Vec<(String, u64)> = store
            .final_outcomes(10)
            .unwrap()
            .into_iter()
            .map(|r| (r.explanation.job, r.time_ms))
            .collect();
        assert_eq!(finals, vec![("a".into(), 30), ("b".into(), 20)]);
        // A newer append wins over the copy, and a job with only indexed records is listed.
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
    }

    impl NewDecision {
        fn with_job(mut self, job: &str) -> Self {
            self.explanation.job = job.into();
            self
        }
    }

    #[test]
    fn record_keys_sort_by_time_then_seq() {
        let mut keys = vec![
            record_key(2, 1),
            record_key(1, 9),
            record_key(256, 0),
            record_key(1, 10),
        ];
        keys.sort();
        assert_eq!(
            keys,
            vec![
                record_key(1, 9),
                record_key(1, 10),
                record_key(2, 1),
                record_key(256, 0)
            ]
        );
    }

    #[test]
    fn index_keys_of_a_prefix_name_do_not_overlap() {
        let k = record_key(5, 5);
        assert!(!index_key("ab", &k).starts_with(&index_prefix("a")));
        assert!(index_key("a", &k).starts_with(&index_prefix("a")));
    }

    #[test]
    fn placed_nodes_are_deduplicated_and_pending_has_none() {
        let placed = Outcome::Placed {
            nodes: vec![("b".into(), 1), ("a".into(), 2), ("b".into(), 3)],
        };
        assert_eq!(placed_nodes(&placed), vec!["a", "b"]);
        let pending = Outcome::Pending {
            waiting_for: "x".into(),
        };
        assert!(placed_nodes(&pending).is_empty());
        assert_eq!(
            accounted_bytes(100, "job", &["a", "bb"]),
            16 + 100 + 20 + 18 + 19
        );
    }
}
