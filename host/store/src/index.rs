//! The in-memory index over the retained decision records: job → records and node → records in
//! (time, seq) order, and the table of chunks (which chunk holds a sequence number, which chunks
//! a time range touches, which are oldest).
//!
//! Why in memory: a sled index entry per record and per placed node was a random-key insert each
//! (~3 per record), and sled takes only ~100k of those a second on the dev box, which capped
//! appends near 20k records/s. Records now go in as a few chunk values per batch at
//! increasing keys. The index is derived data: [`Index::rebuild`] reads every chunk when the
//! store opens (0.3–0.5 s for 64 MiB of history on the dev box, so a few seconds per GiB), so it
//! can never disagree with what survived a crash. It costs roughly 30 bytes of memory per entry, one entry per record
//! plus one per placed node.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::Result;
use crate::codec::{self, Head};
use crate::decisions::{CHUNK, parse_chunk_key};

/// A record's identity and order: its time and sequence number.
pub(crate) type RecordId = (u64, u64);

/// What the index keeps about one chunk.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChunkMeta {
    /// How many records it holds: sequence numbers `first..first + count`.
    pub(crate) count: u64,
    /// The oldest and newest record times in it, for range reads and retention.
    pub(crate) min_time: u64,
    pub(crate) max_time: u64,
    /// Its key and value length: what it adds to [`crate::Store::decision_bytes`].
    pub(crate) bytes: u64,
}

#[derive(Default)]
pub(crate) struct Index {
    /// Job name → its retained records, so a job's history and latest record need no scan.
    pub(crate) by_job: HashMap<Box<str>, BTreeSet<RecordId>>,
    /// Node name → the retained records that placed pods on it.
    pub(crate) by_node: HashMap<Box<str>, BTreeSet<RecordId>>,
    /// First sequence number → chunk, so the chunk holding a record is a range lookup.
    pub(crate) chunks: BTreeMap<u64, ChunkMeta>,
    /// (newest time, first sequence number) of every chunk: retention's order, oldest first.
    pub(crate) by_age: BTreeSet<(u64, u64)>,
}

impl Index {
    /// Reads every chunk in `history`.
    pub(crate) fn rebuild(history: &sled::Tree) -> Result<Self> {
        let mut index = Index::default();
        for item in history.scan_prefix([CHUNK]) {
            let (k, v) = item?;
            let first = parse_chunk_key(&k)?;
            let records = codec::decode_chunk(&v)?;
            let mut heads = Vec::with_capacity(records.len());
            for ((time, record), seq) in records.into_iter().zip(first..) {
                heads.push(((time, seq), codec::decode_head(record)?));
            }
            index.add_chunk(first, (k.len() + v.len()) as u64, &heads);
        }
        Ok(index)
    }

    /// Adds a chunk whose records, in sequence order starting at `first`, are `records`.
    pub(crate) fn add_chunk(&mut self, first: u64, bytes: u64, records: &[(RecordId, Head<'_>)]) {
        let times = records.iter().map(|((time, _), _)| *time);
        let meta = ChunkMeta {
            count: records.len() as u64,
            min_time: times.clone().min().unwrap_or(0),
            max_time: times.max().unwrap_or(0),
            bytes,
        };
        self.chunks.insert(first, meta);
        self.by_age.insert((meta.max_time, first));
        for (id, head) in records {
            add_to(&mut self.by_job, head.job, *id);
            for node in &head.nodes {
                add_to(&mut self.by_node, node, *id);
            }
        }
    }

    /// Removes a chunk and its records' entries.
    pub(crate) fn remove_chunk(&mut self, first: u64, records: &[(RecordId, Head<'_>)]) {
        if let Some(meta) = self.chunks.remove(&first) {
            self.by_age.remove(&(meta.max_time, first));
        }
        for (id, head) in records {
            remove_from(&mut self.by_job, head.job, *id);
            for node in &head.nodes {
                remove_from(&mut self.by_node, node, *id);
            }
        }
    }

    /// The first sequence number of the chunk holding `seq`, if it is retained.
    pub(crate) fn chunk_of(&self, seq: u64) -> Option<u64> {
        let (&first, meta) = self.chunks.range(..=seq).next_back()?;
        (seq - first < meta.count).then_some(first)
    }

    /// The chunks holding records with `from_ms <= time < to_ms`, as (oldest time, first
    /// sequence number), in that order.
    pub(crate) fn chunks_between(&self, from_ms: u64, to_ms: u64) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = self
            .chunks
            .iter()
            .filter(|(_, m)| m.min_time < to_ms && m.max_time >= from_ms)
            .map(|(&first, m)| (m.min_time, first))
            .collect();
        out.sort_unstable();
        out
    }

    /// A job's record ids, oldest first.
    pub(crate) fn job(&self, job: &str) -> Vec<RecordId> {
        self.by_job
            .get(job)
            .map(|ids| ids.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Up to `limit` ids of records on `node` with `from_ms <= time < to_ms`, oldest first.
    pub(crate) fn node(&self, node: &str, from_ms: u64, to_ms: u64, limit: usize) -> Vec<RecordId> {
        match self.by_node.get(node) {
            Some(ids) if from_ms < to_ms => ids
                .range((from_ms, 0)..(to_ms, 0))
                .take(limit)
                .copied()
                .collect(),
            _ => Vec::new(),
        }
    }
}

fn add_to(map: &mut HashMap<Box<str>, BTreeSet<RecordId>>, name: &str, id: RecordId) {
    match map.get_mut(name) {
        Some(ids) => {
            ids.insert(id);
        }
        None => {
            map.insert(name.into(), BTreeSet::from([id]));
        }
    }
}

/// Removes `id`, and the name once it has no records left, so the maps stay bounded by the
/// retained history.
fn remove_from(map: &mut HashMap<Box<str>, BTreeSet<RecordId>>, name: &str, id: RecordId) {
    if let Some(ids) = map.get_mut(name) {
        ids.remove(&id);
        if ids.is_empty() {
            map.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(job: &str) -> Head<'_> {
        Head { job, nodes: vec![] }
    }

    #[test]
    fn chunks_are_found_by_seq_and_by_time() {
        let mut index = Index::default();
        index.add_chunk(10, 100, &[((50, 10), head("a")), ((40, 11), head("b"))]);
        index.add_chunk(12, 100, &[((60, 12), head("a"))]);
        index.add_chunk(13, 100, &[((5, 13), head("c"))]);
        assert_eq!(index.chunk_of(9), None);
        assert_eq!(index.chunk_of(10), Some(10));
        assert_eq!(index.chunk_of(11), Some(10));
        assert_eq!(index.chunk_of(12), Some(12));
        assert_eq!(index.chunk_of(14), None);
        assert_eq!(
            index.chunks_between(0, u64::MAX),
            vec![(5, 13), (40, 10), (60, 12)]
        );
        assert_eq!(index.chunks_between(50, 60), vec![(40, 10)]);
        assert_eq!(index.chunks_between(51, 60), vec![]);
        assert_eq!(index.chunks_between(60, 61), vec![(60, 12)]);
        // Oldest by newest time: the late chunk with time 5 first.
        let order: Vec<u64> = index.by_age.iter().map(|(_, first)| *first).collect();
        assert_eq!(order, vec![13, 10, 12]);
        index.remove_chunk(10, &[((50, 10), head("a")), ((40, 11), head("b"))]);
        assert_eq!(index.chunk_of(11), None);
        assert_eq!(index.job("a"), vec![(60, 12)]);
        assert!(!index.by_job.contains_key("b"));
        assert_eq!(index.by_age.len(), 2);
    }
}
