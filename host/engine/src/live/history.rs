//! Each queue's recent samples, for the fair-share-over-time chart: taken by the loop every
//! [`HISTORY_EVERY`] as it publishes, kept for [`HISTORY_KEEP`], served by
//! [`Live::queue_history`].

use super::*;

/// How often the queues are sampled for their history.
pub const HISTORY_EVERY: Duration = Duration::from_secs(5);

/// How long a queue's samples are kept: an hour, 720 samples per queue.
pub const HISTORY_KEEP: Duration = Duration::from_secs(3600);

/// Queues with a history, at most: each ring is bounded, and so is their number, should a live
/// cluster's queue labels keep inventing names.
pub(super) const HISTORY_MAX_QUEUES: usize = 256;

/// One queue at one instant.
#[derive(Debug, Clone, Copy)]
pub(super) struct QueueSample {
    pub(super) at_ms: u64,
    pub(super) used_gpus: u64,
    pub(super) nominal_gpus: u64,
    pub(super) borrowed_gpus: u64,
    pub(super) lent_gpus: u64,
    pub(super) fair_share: f64,
    pub(super) fair_share_key: f64,
    pub(super) pending_jobs: u32,
}

/// The queues' recent past, sampled by the loop.
#[derive(Debug, Default)]
pub(super) struct QueueHistory {
    /// When the last sample was taken (ms since the epoch; 0 = never).
    pub(super) last_ms: u64,
    /// Per queue name, its samples oldest first: a ring of at most an hour's worth. Ordered so
    /// the route lists the queues in a stable order.
    pub(super) queue_to_samples: BTreeMap<String, VecDeque<QueueSample>>,
}

impl Live {
    /// Adds a sample of every queue to the history when [`HISTORY_EVERY`] has passed since the
    /// last one, and drops samples older than [`HISTORY_KEEP`].
    pub(super) fn sample_history(&self, queues: &[QueueView], at_ms: u64) {
        let every = HISTORY_EVERY.as_millis() as u64;
        let keep = HISTORY_KEEP.as_millis() as u64;
        let mut history = self.history.lock().unwrap_or_else(|e| e.into_inner());
        // A clock that stepped back restarts the pacing rather than pausing it.
        if history.last_ms != 0 && at_ms < history.last_ms + every && at_ms >= history.last_ms {
            return;
        }
        history.last_ms = at_ms;
        let per_queue = (keep / every) as usize + 1;
        for q in queues {
            if history.queue_to_samples.len() >= HISTORY_MAX_QUEUES
                && !history.queue_to_samples.contains_key(&q.name)
            {
                continue;
            }
            let ring = history.queue_to_samples.entry(q.name.clone()).or_default();
            ring.push_back(QueueSample {
                at_ms,
                used_gpus: q.used_gpus,
                nominal_gpus: q.nominal_gpus,
                borrowed_gpus: q.borrowed_gpus,
                lent_gpus: q.lent_gpus,
                fair_share: q.fair_share,
                fair_share_key: q.fair_share_key,
                pending_jobs: q.pending_jobs,
            });
            while ring.len() > per_queue {
                ring.pop_front();
            }
        }
        // Old samples leave every ring, including those of queues that no longer exist.
        let oldest = at_ms.saturating_sub(keep);
        history.queue_to_samples.retain(|_, ring| {
            while ring.front().is_some_and(|s| s.at_ms < oldest) {
                ring.pop_front();
            }
            !ring.is_empty()
        });
    }

    /// Each queue's samples taken after `since_ms`, oldest first.
    pub fn queue_history(&self, since_ms: u64) -> QueueHistoryView {
        let history = self.history.lock().unwrap_or_else(|e| e.into_inner());
        let queues = history
            .queue_to_samples
            .iter()
            .map(|(name, ring)| {
                let mut series = QueueSeries {
                    name: name.clone(),
                    ..QueueSeries::default()
                };
                for s in ring.iter().filter(|s| s.at_ms > since_ms) {
                    series.at_ms.push(s.at_ms);
                    series.used_gpus.push(s.used_gpus);
                    series.nominal_gpus.push(s.nominal_gpus);
                    series.borrowed_gpus.push(s.borrowed_gpus);
                    series.lent_gpus.push(s.lent_gpus);
                    series.fair_share.push(s.fair_share);
                    series.fair_share_key.push(s.fair_share_key);
                    series.pending_jobs.push(s.pending_jobs);
                }
                series
            })
            .collect();
        QueueHistoryView {
            interval_ms: HISTORY_EVERY.as_millis() as u64,
            keep_ms: HISTORY_KEEP.as_millis() as u64,
            queues,
        }
    }
}
