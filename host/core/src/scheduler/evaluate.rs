//! The evaluate stage: every filter and score over the nodes, a chunk of [`CHUNK`] at a time.
//! A gang sees every chunk (topology placement needs the whole picture). A single pod stops
//! once enough feasible nodes are found, starting each decision where the last one stopped,
//! as kube-scheduler does with `percentageOfNodesToScore`: a pod that fits is placed without
//! paying for every node.

use std::collections::BTreeMap;
use std::ops::Range;

use crate::ChunkAffinity;
use crate::builtin;
use crate::explain::{Explanation, FilterExplain, NodeScore};
use crate::hooks::{PolicyHooks, Verdict};

use super::{CHUNK, JobSpec, Scheduler};

/// One evaluated chunk: its nodes, and each score policy's weighted scores for them.
type ChunkScores = (Range<usize>, Vec<(String, Vec<u64>)>);

/// What the evaluation of one job gathers as it goes through the chunks.
struct Tally {
    /// Pods of the job's shape each node takes (0 where filtered out or not evaluated).
    capacity: Vec<u32>,
    /// Each node's total weighted score.
    totals: Vec<u64>,
    /// Filter names by index: the built-in first, then each filter policy.
    filter_names: Vec<String>,
    /// Rejections by (filter, code); texts are looked up once per distinct code. A short
    /// list, not a map: a decision meets a handful of distinct codes and counts a rejection
    /// per node, so a linear scan beats hashing each one.
    code_counts: Vec<((usize, u16), u32)>,
    /// Nodes a failing-closed filter rejected, by (filter, fault text).
    fault_counts: BTreeMap<(usize, String), u32>,
    feasible: usize,
    evaluated: usize,
    chunk_parts: Vec<ChunkScores>,
    /// Reasons score policies gave (contract 0.2.0): `(node, policy, text)`. Empty unless a
    /// policy gave some, and bounded per call by the policy host.
    reasons: Vec<(usize, String, String)>,
}

/// One chunk as the filters see it: its nodes, what the job's node affinity says about them
/// (when known), and the nodes the job avoids because they failed under it.
struct Chunk<'a> {
    range: Range<usize>,
    known: Option<&'a ChunkAffinity>,
    avoid: &'a [usize],
}

/// Adds `fault` to the explanation once.
fn note_fault(explanation: &mut Explanation, fault: String) {
    if !explanation.faults.contains(&fault) {
        explanation.faults.push(fault);
    }
}

impl Scheduler {
    /// Run every filter and score; the pods of `spec`'s shape each node takes (0 where
    /// filtered out or not evaluated), each node's total score, and the node ranges evaluated
    /// (so placing a single pod reads those, not the whole table). `avoid` are the nodes that
    /// failed under the job, which the built-in filter rejects for it.
    pub(super) fn evaluate(
        &self,
        spec: &JobSpec,
        avoid: &[usize],
        hooks: &mut dyn PolicyHooks,
        explanation: &mut Explanation,
    ) -> (Vec<u32>, Vec<u64>, Vec<Range<usize>>) {
        let n = self.state.len();
        let chunks = n.div_ceil(CHUNK).max(1);
        let single = spec.pods == 1;
        let enough = if single {
            (n / 20).max(self.config.min_feasible_nodes)
        } else {
            usize::MAX
        };
        let first = if single {
            self.next_chunk.get() % chunks
        } else {
            0
        };
        let mut tally = Tally {
            capacity: vec![0; n],
            totals: vec![0; n],
            filter_names: vec!["builtin".to_string()],
            code_counts: Vec::new(),
            fault_counts: BTreeMap::new(),
            feasible: 0,
            evaluated: 0,
            chunk_parts: Vec::new(),
            reasons: Vec::new(),
        };
        let mut searched = Vec::new();
        for step in 0..chunks {
            let chunk = (first + step) % chunks;
            let range = chunk * CHUNK..((chunk + 1) * CHUNK).min(n);
            tally.evaluated += range.len();
            let known = self.chunk_affinity(spec, range.clone());
            let known = known.as_deref();
            let part = Chunk {
                range: range.clone(),
                known,
                avoid,
            };
            self.filter_chunk(spec, hooks, part, &mut tally, explanation);
            self.score_chunk(spec, hooks, range.clone(), known, &mut tally, explanation);
            searched.push(range);
            if tally.feasible >= enough {
                self.next_chunk.set(chunk + 1);
                break;
            }
        }
        self.explain_filters(hooks, &mut tally, explanation);
        explanation.top_nodes = self.top_nodes(&tally);
        (tally.capacity, tally.totals, searched)
    }

    /// The built-in filter and every filter policy on one chunk: each rejected node is
    /// counted once, for the first filter that rejected it; the rest get their capacity.
    fn filter_chunk(
        &self,
        spec: &JobSpec,
        hooks: &mut dyn PolicyHooks,
        Chunk {
            range,
            known,
            avoid,
        }: Chunk<'_>,
        tally: &mut Tally,
        explanation: &mut Explanation,
    ) {
        let mut builtin_codes =
            builtin::gpu_fit_chunk(&spec.shape, &self.state.nodes, range.clone(), known);
        for &node in avoid {
            if range.contains(&node) && builtin_codes[node - range.start] == 0 {
                builtin_codes[node - range.start] = builtin::FAILED_UNDER_JOB;
            }
        }
        let mut rejected_by: Vec<Option<(usize, u16)>> = builtin_codes
            .iter()
            .map(|&code| (code != 0).then_some((0, code)))
            .collect();
        let mut closed: Option<(usize, String)> = None;
        // The policies are asked only when the built-in let some node through.
        let in_play: Vec<bool> = builtin_codes.iter().map(|&code| code == 0).collect();
        let verdicts = if in_play.contains(&true) {
            hooks.filter(&self.state, &spec.shape, range.clone(), &in_play)
        } else {
            Vec::new()
        };
        for (index, (policy, verdict)) in verdicts.into_iter().enumerate() {
            if tally.filter_names.len() <= index + 1 {
                tally.filter_names.push(policy.clone());
            }
            match verdict {
                Verdict::Answer(codes) => {
                    for (slot, &code) in rejected_by.iter_mut().zip(&codes) {
                        if code != 0 && slot.is_none() {
                            *slot = Some((index + 1, code));
                        }
                    }
                }
                Verdict::Skipped(fault) => note_fault(explanation, format!("{policy}: {fault}")),
                Verdict::Rejected(fault) => {
                    note_fault(explanation, format!("{policy}: {fault}"));
                    closed.get_or_insert((index + 1, fault));
                }
            }
        }
        for (offset, rejected) in rejected_by.into_iter().enumerate() {
            let node = range.start + offset;
            match (rejected, &closed) {
                (Some(key), _) => match tally.code_counts.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, count)) => *count += 1,
                    None => tally.code_counts.push((key, 1)),
                },
                (None, Some((filter, fault))) => {
                    *tally
                        .fault_counts
                        .entry((*filter, format!("policy faulted: {fault}")))
                        .or_default() += 1;
                }
                (None, None) => {
                    tally.capacity[node] = self.state.capacity_for(node, &spec.shape);
                    tally.feasible += usize::from(tally.capacity[node] > 0);
                }
            }
        }
    }

    /// Every score policy's answer on one chunk times its weight; the built-in binpack when
    /// none answered. Nothing is scored in a chunk without a feasible node.
    fn score_chunk(
        &self,
        spec: &JobSpec,
        hooks: &mut dyn PolicyHooks,
        range: Range<usize>,
        known: Option<&ChunkAffinity>,
        tally: &mut Tally,
        explanation: &mut Explanation,
    ) {
        let mut parts: Vec<(String, Vec<u64>)> = Vec::new();
        let in_play: Vec<bool> = tally.capacity[range.clone()]
            .iter()
            .map(|&pods| pods > 0)
            .collect();
        if !in_play.contains(&true) {
            // No node here to rank.
            tally.chunk_parts.push((range, parts));
            return;
        }
        for (policy, weight, verdict, reasons) in
            hooks.score_explained(&self.state, &spec.shape, range.clone(), &in_play)
        {
            match verdict {
                Verdict::Answer(scores) => {
                    tally
                        .reasons
                        .extend(reasons.into_iter().map(|(offset, text)| {
                            (range.start + offset as usize, policy.clone(), text)
                        }));
                    let weighted: Vec<u64> = scores
                        .iter()
                        .map(|&s| u64::from(s) * u64::from(weight))
                        .collect();
                    for (total, w) in tally.totals[range.clone()].iter_mut().zip(&weighted) {
                        *total += w;
                    }
                    parts.push((policy, weighted));
                }
                Verdict::Skipped(fault) | Verdict::Rejected(fault) => {
                    note_fault(explanation, format!("{policy}: {fault}"));
                }
            }
        }
        if parts.is_empty() {
            let scores: Vec<u64> =
                builtin::gpu_binpack_range(&spec.shape, &self.state.nodes, range.clone())
                    .into_iter()
                    .map(u64::from)
                    .collect();
            tally.totals[range.clone()].copy_from_slice(&scores);
            parts.push(("builtin:binpack".into(), scores));
        }
        if let Some(preference) =
            builtin::node_preference_chunk(&spec.shape, &self.state.nodes, range.clone(), known)
        {
            for (total, p) in tally.totals[range.clone()].iter_mut().zip(&preference) {
                *total += p;
            }
            parts.push(("builtin:node-affinity".into(), preference));
        }
        tally.chunk_parts.push((range, parts));
    }

    /// What the job's node affinity says about one chunk, from the index; `None` for a job
    /// without one.
    fn chunk_affinity(
        &self,
        spec: &JobSpec,
        range: Range<usize>,
    ) -> Option<std::sync::Arc<ChunkAffinity>> {
        let affinity = spec.shape.node_affinity.as_ref()?;
        Some(
            self.affinity_index
                .borrow_mut()
                .chunk(affinity, &self.state.nodes, range),
        )
    }

    /// The rejection counts per filter and reason, most first, and the node counts.
    fn explain_filters(
        &self,
        hooks: &mut dyn PolicyHooks,
        tally: &mut Tally,
        explanation: &mut Explanation,
    ) {
        let mut counts: Vec<BTreeMap<String, u32>> =
            vec![BTreeMap::new(); tally.filter_names.len()];
        for &((filter, code), count) in &tally.code_counts {
            let text = if filter == 0 {
                builtin::reason_text(code, &self.state.nodes, |s| {
                    self.symbols.resolve(s).to_string()
                })
            } else {
                hooks.reason_text(filter - 1, code)
            };
            *counts[filter].entry(text).or_default() += count;
        }
        for ((filter, text), count) in std::mem::take(&mut tally.fault_counts) {
            *counts[filter].entry(text).or_default() += count;
        }
        explanation.nodes_evaluated = tally.evaluated as u32;
        explanation.nodes_feasible = tally.feasible as u32;
        explanation.filters = std::mem::take(&mut tally.filter_names)
            .into_iter()
            .zip(counts)
            .filter(|(_, counts)| !counts.is_empty())
            .map(|(policy, counts)| {
                let mut rejected: Vec<(String, u32)> = counts.into_iter().collect();
                rejected.sort_by_key(|r| std::cmp::Reverse(r.1));
                FilterExplain { policy, rejected }
            })
            .collect();
    }

    /// The best-scored feasible nodes, with each score policy's part.
    fn top_nodes(&self, tally: &Tally) -> Vec<NodeScore> {
        let (capacity, totals) = (&tally.capacity, &tally.totals);
        // Better first: higher total, then lower index. One pass keeping the best few, as
        // most nodes lose to the worst kept one at the first comparison.
        let better = |a: usize, b: usize| totals[b].cmp(&totals[a]).then(a.cmp(&b));
        let top = self.config.top_nodes;
        let mut best: Vec<usize> = Vec::with_capacity(top + 1);
        for node in tally
            .chunk_parts
            .iter()
            .flat_map(|(range, _)| range.clone())
        {
            if capacity[node] == 0 || top == 0 {
                continue;
            }
            if best.len() == top && better(node, best[top - 1]).is_ge() {
                continue;
            }
            let at = best.partition_point(|&kept| better(kept, node).is_lt());
            best.insert(at, node);
            best.truncate(top);
        }
        best.iter()
            .map(|&node| {
                let (range, parts) = tally
                    .chunk_parts
                    .iter()
                    .find(|(range, _)| range.contains(&node))
                    .expect("a top node was evaluated");
                NodeScore {
                    node: self.node_name(node),
                    total: totals[node],
                    parts: parts
                        .iter()
                        .map(|(policy, scores)| (policy.clone(), scores[node - range.start]))
                        .collect(),
                    reasons: tally
                        .reasons
                        .iter()
                        .filter(|(of, _, _)| *of == node)
                        .map(|(_, policy, text)| (policy.clone(), text.clone()))
                        .collect(),
                }
            })
            .collect()
    }
}
