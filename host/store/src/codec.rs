//! The stored form of decision records: a compact binary encoding of [`Explanation`], written
//! by hand, and the chunk that packs up to [`CHUNK_RECORDS`] of them into one sled value.
//!
//! Why not JSON: a typical record is ~880 bytes as JSON and ~350 here, and encoding is several
//! times faster; both the append rate and the directory size follow the value size. Why not a
//! serde binary format (postcard, bincode): `Outcome` and `Admission` are internally tagged
//! (`#[serde(tag = ...)]`) for the API's JSON, and such enums only deserialize from
//! self-describing formats, so a serde binary format would need mirror types as long as this.
//!
//! Layout: a format byte, then the job name and the outcome first (so opening the store can
//! rebuild its in-memory index from the head of each value without decoding the rest), then the
//! remaining fields in declaration order. Integers are LEB128 varints (signed ones zigzag),
//! floats their 8 IEEE bits (exact round trip), strings and lists a varint length and their
//! items, options a 0/1 byte. Encoding and decoding destructure every struct without `..`, so a
//! field added in `gantry-core` fails to compile here until the codec (and, for a layout
//! change, [`crate::SCHEMA_VERSION`] or [`FORMAT`]) is updated.
//!
//! A chunk: a format byte, the record count, then each record's time and length (varints), then
//! the records' encodings back to back. Its records have consecutive sequence numbers starting
//! at the chunk's key, so the key and a record's position give its sequence number.

use gantry_core::StartEstimate;
use gantry_core::explain::{FilterExplain, NodeScore, QuotaExplain};
use gantry_core::{Admission, Explanation, Outcome, PolicyRef};

use crate::{Result, StoreError};

/// The first byte of every record encoding. A later encoding takes the next number and keeps
/// decoding the earlier ones: 4 added the top nodes' score reasons at the end; 3 added who
/// preempted the job at the end; 2 added the start estimate; 1 had none of them.
pub(crate) const FORMAT: u8 = 4;
/// Records written before score reasons were kept: decoded with no reasons.
const FORMAT_WITHOUT_REASONS: u8 = 3;
/// Records written before preemptors were kept: decoded with `preempted_by: None`.
const FORMAT_WITHOUT_PREEMPTOR: u8 = 2;
/// Records written before start estimates: decoded with `estimate: None` too.
const FORMAT_WITHOUT_ESTIMATE: u8 = 1;
/// The first byte of every chunk.
const CHUNK_FORMAT: u8 = 1;
/// At most this many records share a chunk. Why chunks: sled's cost is per key and per page
/// rewrite, so packing records cuts both the append cost and sled's dead space (in a soak with
/// 64 MiB retained, one key per record left the directory at ~5× the history and growing;
/// chunks of 64 ~2×). Why not bigger: a read of one record fetches its whole chunk (~22 KB
/// here), and sled writes leaves holding chunks much bigger than this out of line.
pub(crate) const CHUNK_RECORDS: usize = 64;

const MALFORMED: StoreError = StoreError::Malformed { tree: "history" };

/// The part of a record the in-memory index needs: its job and the nodes it placed pods on
/// (each once, sorted).
pub(crate) struct Head<'a> {
    pub(crate) job: &'a str,
    pub(crate) nodes: Vec<&'a str>,
}

/// The nodes a record is indexed under: each placed node once, sorted.
pub(crate) fn placed_nodes(outcome: &Outcome) -> Vec<&str> {
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

pub(crate) fn encode(e: &Explanation) -> Vec<u8> {
    let Explanation {
        job,
        queue,
        pods,
        gpus_per_pod,
        priority,
        time_s,
        outcome,
        quota,
        nodes_total,
        nodes_evaluated,
        nodes_feasible,
        filters,
        top_nodes,
        domain,
        policy_set,
        policies,
        preempted,
        faults,
        estimate,
        preempted_by,
    } = e;
    let mut w = Writer(Vec::with_capacity(512));
    w.byte(FORMAT);
    w.str(job);
    match outcome {
        Outcome::Placed { nodes } => {
            w.byte(0);
            w.list(nodes, |w, (node, pods)| {
                w.str(node);
                w.uint(u64::from(*pods));
            });
        }
        Outcome::Pending { waiting_for } => {
            w.byte(1);
            w.str(waiting_for);
        }
    }
    w.str(queue);
    w.uint(u64::from(*pods));
    w.uint(u64::from(*gpus_per_pod));
    w.int(i64::from(*priority));
    w.f64(*time_s);
    encode_quota(&mut w, quota);
    w.uint(u64::from(*nodes_total));
    w.uint(u64::from(*nodes_evaluated));
    w.uint(u64::from(*nodes_feasible));
    w.list(filters, |w, FilterExplain { policy, rejected }| {
        w.str(policy);
        w.list(rejected, |w, (reason, count)| {
            w.str(reason);
            w.uint(u64::from(*count));
        });
    });
    w.list(
        top_nodes,
        |w,
         NodeScore {
             node,
             total,
             parts,
             reasons: _,
         }| {
            w.str(node);
            w.uint(*total);
            w.list(parts, |w, (policy, score)| {
                w.str(policy);
                w.uint(*score);
            });
        },
    );
    w.opt_str(domain.as_deref());
    w.uint(*policy_set);
    w.list(policies, |w, p| {
        let PolicyRef {
            name,
            version,
            role,
            weight,
            sha256,
        } = p;
        w.str(name);
        w.str(version);
        w.str(role);
        w.uint(u64::from(*weight));
        w.str(sha256);
    });
    w.list(preempted, |w, s| w.str(s));
    w.list(faults, |w, s| w.str(s));
    match estimate {
        None => w.byte(0),
        Some(StartEstimate {
            planned_at_s,
            p10_s,
            p50_s,
            p90_s,
            reservation,
        }) => {
            w.byte(1);
            for v in [planned_at_s, p10_s, p50_s, p90_s] {
                w.f64(*v);
            }
            w.opt_str(reservation.as_deref());
        }
    }
    w.opt_str(preempted_by.as_deref());
    // Score reasons, at the end: `(top node index, policy, text)` for the few nodes that have
    // any, so a record without reasons (most of them) costs one byte.
    let reasons: Vec<(usize, &String, &String)> = top_nodes
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.reasons.iter().map(move |(p, t)| (i, p, t)))
        .collect();
    w.list(&reasons, |w, (i, policy, text)| {
        w.uint(*i as u64);
        w.str(policy);
        w.str(text);
    });
    w.0
}

/// The quota part of a record: the built-in admission, each quota policy's verdict, the fair
/// share key and the queue position.
fn encode_quota(w: &mut Writer, quota: &QuotaExplain) {
    let QuotaExplain {
        builtin,
        policies: quota_policies,
        fair_share_key,
        position,
    } = quota;
    match builtin {
        Admission::Within => w.byte(0),
        Admission::Borrowing { gpus } => {
            w.byte(1);
            w.uint(*gpus);
        }
        Admission::Denied { reason } => {
            w.byte(2);
            w.str(reason);
        }
    }
    w.list(quota_policies, |w, (policy, verdict)| {
        w.str(policy);
        w.str(verdict);
    });
    w.f64(*fair_share_key);
    w.uint(u64::from(*position));
}

pub(crate) fn decode(value: &[u8]) -> Result<Explanation> {
    let mut r = Reader(value);
    let format = r.format()?;
    let job = r.string()?;
    let outcome = match r.byte()? {
        0 => Outcome::Placed {
            nodes: r.list(|r| Ok((r.string()?, r.u32()?)))?,
        },
        1 => Outcome::Pending {
            waiting_for: r.string()?,
        },
        _ => return Err(MALFORMED),
    };
    let queue = r.string()?;
    let pods = r.u32()?;
    let gpus_per_pod = r.u32()?;
    let priority = i32::try_from(r.int()?).map_err(|_| MALFORMED)?;
    let time_s = r.f64()?;
    let builtin = match r.byte()? {
        0 => Admission::Within,
        1 => Admission::Borrowing { gpus: r.uint()? },
        2 => Admission::Denied {
            reason: r.string()?,
        },
        _ => return Err(MALFORMED),
    };
    let quota = QuotaExplain {
        builtin,
        policies: r.list(|r| Ok((r.string()?, r.string()?)))?,
        fair_share_key: r.f64()?,
        position: r.u32()?,
    };
    let nodes_total = r.u32()?;
    let nodes_evaluated = r.u32()?;
    let nodes_feasible = r.u32()?;
    let filters = r.list(|r| {
        Ok(FilterExplain {
            policy: r.string()?,
            rejected: r.list(|r| Ok((r.string()?, r.u32()?)))?,
        })
    })?;
    let mut top_nodes = r.list(|r| {
        Ok(NodeScore {
            node: r.string()?,
            total: r.uint()?,
            parts: r.list(|r| Ok((r.string()?, r.uint()?)))?,
            reasons: Vec::new(),
        })
    })?;
    let domain = match r.byte()? {
        0 => None,
        1 => Some(r.string()?),
        _ => return Err(MALFORMED),
    };
    let policy_set = r.uint()?;
    let policies = r.list(|r| {
        Ok(PolicyRef {
            name: r.string()?,
            version: r.string()?,
            role: r.string()?,
            weight: r.u32()?,
            sha256: r.string()?,
        })
    })?;
    let preempted = r.list(|r| r.string())?;
    let faults = r.list(|r| r.string())?;
    let estimate = match (format, r.byte_if(format != FORMAT_WITHOUT_ESTIMATE)?) {
        (FORMAT_WITHOUT_ESTIMATE, _) | (_, Some(0)) => None,
        (_, Some(1)) => Some(StartEstimate {
            planned_at_s: r.f64()?,
            p10_s: r.f64()?,
            p50_s: r.f64()?,
            p90_s: r.f64()?,
            reservation: match r.byte()? {
                0 => None,
                1 => Some(r.string()?),
                _ => return Err(MALFORMED),
            },
        }),
        _ => return Err(MALFORMED),
    };
    let preempted_by = match r.byte_if(format >= FORMAT_WITHOUT_REASONS)? {
        None | Some(0) => None,
        Some(1) => Some(r.string()?),
        _ => return Err(MALFORMED),
    };
    if format == FORMAT {
        for (i, policy, text) in r.list(|r| Ok((r.uint()?, r.string()?, r.string()?)))? {
            let node = usize::try_from(i)
                .ok()
                .and_then(|i| top_nodes.get_mut(i))
                .ok_or(MALFORMED)?;
            node.reasons.push((policy, text));
        }
    }
    if !r.0.is_empty() {
        return Err(MALFORMED);
    }
    Ok(Explanation {
        job,
        queue,
        pods,
        gpus_per_pod,
        priority,
        time_s,
        outcome,
        quota,
        nodes_total,
        nodes_evaluated,
        nodes_feasible,
        filters,
        top_nodes,
        domain,
        policy_set,
        policies,
        preempted,
        faults,
        estimate,
        preempted_by,
    })
}

/// Decodes only the job and the placed nodes, for rebuilding the index and for compaction.
pub(crate) fn decode_head(value: &[u8]) -> Result<Head<'_>> {
    let mut r = Reader(value);
    r.format()?;
    let job = r.str()?;
    let mut nodes = match r.byte()? {
        0 => r.list(|r| {
            let node = r.str()?;
            r.u32()?;
            Ok(node)
        })?,
        1 => Vec::new(),
        _ => return Err(MALFORMED),
    };
    nodes.sort_unstable();
    nodes.dedup();
    Ok(Head { job, nodes })
}

/// Packs encoded records (with their times) into a chunk value.
pub(crate) fn encode_chunk(records: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let body: usize = records.iter().map(|(_, r)| r.len()).sum();
    let mut w = Writer(Vec::with_capacity(body + 8 + 12 * records.len()));
    w.byte(CHUNK_FORMAT);
    w.uint(records.len() as u64);
    for (time, record) in records {
        w.uint(*time);
        w.uint(record.len() as u64);
    }
    for (_, record) in records {
        w.0.extend_from_slice(record);
    }
    w.0
}

/// A chunk's records, in sequence order: each one's time and encoding.
pub(crate) fn decode_chunk(value: &[u8]) -> Result<Vec<(u64, &[u8])>> {
    let mut r = Reader(value);
    if r.byte()? != CHUNK_FORMAT {
        return Err(MALFORMED);
    }
    let lens = r.list(|r| Ok((r.uint()?, r.uint()?)))?;
    let mut out = Vec::with_capacity(lens.len());
    for (time, len) in lens {
        let len = usize::try_from(len).map_err(|_| MALFORMED)?;
        out.push((time, r.take(len)?));
    }
    if !r.0.is_empty() {
        return Err(MALFORMED);
    }
    Ok(out)
}

struct Writer(Vec<u8>);

impl Writer {
    fn byte(&mut self, b: u8) {
        self.0.push(b);
    }

    fn uint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn int(&mut self, v: i64) {
        self.uint(((v << 1) ^ (v >> 63)) as u64);
    }

    fn f64(&mut self, v: f64) {
        self.0.extend_from_slice(&v.to_bits().to_le_bytes());
    }

    fn str(&mut self, s: &str) {
        self.uint(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
    }

    /// An optional string: a 0 byte for none, else a 1 byte and the string.
    fn opt_str(&mut self, s: Option<&str>) {
        match s {
            None => self.byte(0),
            Some(s) => {
                self.byte(1);
                self.str(s);
            }
        }
    }

    fn list<T>(&mut self, items: &[T], mut each: impl FnMut(&mut Self, &T)) {
        self.uint(items.len() as u64);
        for item in items {
            each(self, item);
        }
    }
}

/// Reads from the front of a value; every read fails (never panics) on a short or bad value.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    /// The record's format byte, if this code reads it.
    fn format(&mut self) -> Result<u8> {
        match self.byte()? {
            format @ (FORMAT
            | FORMAT_WITHOUT_REASONS
            | FORMAT_WITHOUT_PREEMPTOR
            | FORMAT_WITHOUT_ESTIMATE) => Ok(format),
            _ => Err(MALFORMED),
        }
    }

    /// The next byte when `present`, else nothing read.
    fn byte_if(&mut self, present: bool) -> Result<Option<u8>> {
        if present {
            self.byte().map(Some)
        } else {
            Ok(None)
        }
    }

    fn byte(&mut self) -> Result<u8> {
        let (&b, rest) = self.0.split_first().ok_or(MALFORMED)?;
        self.0 = rest;
        Ok(b)
    }

    fn uint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            let bits = u64::from(b & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(MALFORMED);
            }
            v |= bits << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(MALFORMED)
    }

    fn u32(&mut self) -> Result<u32> {
        u32::try_from(self.uint()?).map_err(|_| MALFORMED)
    }

    fn int(&mut self) -> Result<i64> {
        let v = self.uint()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }

    fn f64(&mut self) -> Result<f64> {
        let bytes: [u8; 8] = self.take(8)?.try_into().map_err(|_| MALFORMED)?;
        Ok(f64::from_bits(u64::from_le_bytes(bytes)))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.0.len() {
            return Err(MALFORMED);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn str(&mut self) -> Result<&'a str> {
        let len = usize::try_from(self.uint()?).map_err(|_| MALFORMED)?;
        std::str::from_utf8(self.take(len)?).map_err(|_| MALFORMED)
    }

    fn string(&mut self) -> Result<String> {
        self.str().map(str::to_owned)
    }

    fn list<T>(&mut self, mut each: impl FnMut(&mut Self) -> Result<T>) -> Result<Vec<T>> {
        let len = usize::try_from(self.uint()?).map_err(|_| MALFORMED)?;
        // Every item takes at least one byte, so a corrupt length cannot allocate much.
        if len > self.0.len() {
            return Err(MALFORMED);
        }
        let mut out = Vec::with_capacity(len);
        for _ in 0..len {
            out.push(each(self)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_variant() -> Vec<Explanation> {
        let mut a = crate::sample_explanation(1);
        a.priority = -7;
        a.time_s = 0.1 + 0.2;
        a.quota.builtin = Admission::Borrowing { gpus: u64::MAX };
        a.quota.policies = vec![("team-quota".into(), "over by 8 GPUs".into())];
        a.quota.fair_share_key = f64::MIN_POSITIVE;
        a.preempted = vec!["team-1/job-9".into(), "ünïcode/ジョブ".into()];
        a.faults = vec!["gpu-binpack: fuel exhausted".into()];
        a.top_nodes[0].reasons = vec![
            (
                "label-affinity".into(),
                "label gantry.dev/pool=train matches".into(),
            ),
            ("other".into(), "ünïcode".into()),
        ];
        let last = a.top_nodes.len() - 1;
        a.top_nodes[last].reasons = vec![("label-affinity".into(), String::new())];
        let mut b = crate::sample_explanation(4);
        assert!(matches!(b.outcome, Outcome::Pending { .. }));
        b.quota.builtin = Admission::Denied {
            reason: "queue over its limit".into(),
        };
        b.domain = None;
        b.priority = i32::MIN;
        b.time_s = -0.0;
        b.estimate = Some(StartEstimate {
            planned_at_s: 10.0,
            p10_s: 20.0,
            p50_s: 7800.5,
            p90_s: f64::INFINITY,
            reservation: Some("16 nodes in rack 3".into()),
        });
        b.preempted_by = Some("team-2/job-77".into());
        let mut c = crate::sample_explanation(3);
        c.quota.builtin = Admission::Within;
        c.priority = i32::MAX;
        c.pods = u32::MAX;
        c.policy_set = u64::MAX;
        c.time_s = f64::INFINITY;
        c.estimate = Some(StartEstimate {
            planned_at_s: 0.0,
            p10_s: 0.0,
            p50_s: 0.0,
            p90_s: 0.0,
            reservation: None,
        });
        let mut empty = crate::sample_explanation(5);
        empty.job = String::new();
        empty.outcome = Outcome::Placed { nodes: vec![] };
        empty.filters.clear();
        empty.top_nodes.clear();
        empty.policies.clear();
        vec![a, b, c, empty]
    }

    #[test]
    fn every_field_and_variant_round_trips_exactly() {
        for e in every_variant() {
            let value = encode(&e);
            let back = decode(&value).unwrap();
            assert_eq!(back, e);
            assert_eq!(back.time_s.to_bits(), e.time_s.to_bits());
            assert_eq!(
                back.quota.fair_share_key.to_bits(),
                e.quota.fair_share_key.to_bits()
            );
            let head = decode_head(&value).unwrap();
            assert_eq!(head.job, e.job);
            assert_eq!(head.nodes, placed_nodes(&e.outcome));
        }
    }

    #[test]
    fn the_head_lists_each_placed_node_once() {
        let mut e = crate::sample_explanation(1);
        e.outcome = Outcome::Placed {
            nodes: vec![("b".into(), 1), ("a".into(), 2), ("b".into(), 3)],
        };
        assert_eq!(decode_head(&encode(&e)).unwrap().nodes, vec!["a", "b"]);
    }

    #[test]
    fn a_sample_record_is_compact() {
        let e = crate::sample_explanation(7);
        let json = serde_json::to_vec(&e).unwrap().len();
        let binary = encode(&e).len();
        assert!(binary * 2 < json, "{binary} vs {json}");
    }

    #[test]
    fn chunks_round_trip_and_refuse_damage() {
        let records: Vec<(u64, Vec<u8>)> = every_variant()
            .iter()
            .enumerate()
            .map(|(i, e)| (u64::MAX - i as u64, encode(e)))
            .collect();
        let value = encode_chunk(&records);
        let back = decode_chunk(&value).unwrap();
        assert_eq!(back.len(), records.len());
        for ((time, record), (t, r)) in records.iter().zip(&back) {
            assert_eq!((time, record.as_slice()), (t, *r));
        }
        assert!(decode_chunk(&encode_chunk(&[])).unwrap().is_empty());
        for n in 0..value.len() {
            assert!(decode_chunk(&value[..n]).is_err(), "truncated to {n}");
        }
        let mut long = value.clone();
        long.push(0);
        assert!(decode_chunk(&long).is_err());
    }

    #[test]
    fn records_written_before_start_estimates_still_decode() {
        let e = crate::sample_explanation(2);
        assert_eq!(e.estimate, None);
        assert_eq!(e.preempted_by, None);
        let mut value = encode(&e);
        // Format 3 is format 4 without the trailing list of score reasons.
        assert_eq!(value.pop(), Some(0));
        value[0] = FORMAT_WITHOUT_REASONS;
        assert_eq!(decode(&value).unwrap(), e);
        // Format 2 is format 3 without the trailing preemptor byte.
        assert_eq!(value.pop(), Some(0));
        value[0] = FORMAT_WITHOUT_PREEMPTOR;
        assert_eq!(decode(&value).unwrap(), e);
        // Format 1 is format 2 without the trailing estimate byte.
        assert_eq!(value.pop(), Some(0));
        value[0] = FORMAT_WITHOUT_ESTIMATE;
        assert_eq!(decode(&value).unwrap(), e);
        assert_eq!(decode_head(&value).unwrap().job, e.job);
    }

    #[test]
    fn damaged_values_are_errors_not_panics() {
        let value = encode(&every_variant()[0]);
        // Every truncation, and trailing garbage, is refused.
        for n in 0..value.len() {
            assert!(decode(&value[..n]).is_err(), "truncated to {n}");
        }
        let mut long = value.clone();
        long.push(0);
        assert!(decode(&long).is_err());
        // An unknown format byte is refused, and so is a huge list length.
        let mut other = value.clone();
        other[0] = FORMAT + 1;
        assert!(decode(&other).is_err());
        assert!(decode_head(&other).is_err());
        let huge = [FORMAT, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f];
        assert!(decode(&huge).is_err());
        let overlong = [
            FORMAT, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
        ];
        assert!(decode(&overlong).is_err());
        let err = decode(&value[..3]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "store: a stored value under history is malformed"
        );
    }
}
