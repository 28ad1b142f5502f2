//! The pod map: which job a pod belongs to, so the API can answer "why is my pod pending?" by
//! pod name. Written once per job submission ([`Store::record_pods`]); the scheduler's decisions
//! are per job, so a pod's decisions are its job's.
//!
//! Two entries per pod in the `jobs` tree: `p` ‖ pod → job, and `q` ‖ len(job) ‖ job ‖ pod
//! (empty value) so that compaction can find a job's pods. Compaction removes both when it
//! deletes a job's last retained record: the map is bounded by the jobs with history, not by
//! every job ever submitted. A compacted job keeps its final outcome ([`Store::latest_for_job`])
//! but is no longer found by pod name.

use std::collections::HashMap;

use crate::{DecisionRecord, Result, Store, StoreError};

/// Key tag of a pod's job: `p` ‖ pod.
pub(crate) const POD: u8 = b'p';
/// Key tag of a job's pods: `q` ‖ len(job) (big-endian `u64`) ‖ job ‖ pod. The length makes
/// one job's prefix never match another's, whatever bytes the names hold.
pub(crate) const JOB_POD: u8 = b'q';

fn pod_key(pod: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + pod.len());
    k.push(POD);
    k.extend_from_slice(pod.as_bytes());
    k
}

fn job_pods_prefix(job: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + job.len());
    k.push(JOB_POD);
    k.extend_from_slice(&(job.len() as u64).to_be_bytes());
    k.extend_from_slice(job.as_bytes());
    k
}

impl Store {
    /// Records which job each pod belongs to, in one atomic batch; call it once when jobs are
    /// submitted. A pod already mapped to another job (pod names can be reused) moves to the
    /// new one; within the batch the last pair for a pod wins.
    pub fn record_pods(&self, pod_to_job: &[(String, String)]) -> Result<()> {
        let wanted: HashMap<&str, &str> = pod_to_job
            .iter()
            .map(|(pod, job)| (pod.as_str(), job.as_str()))
            .collect();
        let mut writes = sled::Batch::default();
        // Serialised with compaction, which removes pod entries.
        let _writer = self.writer();
        for (pod, job) in wanted {
            let key = pod_key(pod);
            match self.jobs.get(&key)? {
                Some(old) if old.as_ref() == job.as_bytes() => continue,
                Some(old) => {
                    let old = std::str::from_utf8(&old)
                        .map_err(|_| StoreError::Malformed { tree: "jobs" })?;
                    let mut stale = job_pods_prefix(old);
                    stale.extend_from_slice(pod.as_bytes());
                    writes.remove(stale);
                }
                None => {}
            }
            let mut reverse = job_pods_prefix(job);
            reverse.extend_from_slice(pod.as_bytes());
            writes.insert(reverse, &[][..]);
            writes.insert(key, job.as_bytes());
        }
        self.jobs.apply_batch(writes)?;
        Ok(())
    }

    /// The job a pod belongs to, if [`Store::record_pods`] recorded it and compaction has not
    /// dropped the job's history since.
    pub fn job_for_pod(&self, pod: &str) -> Result<Option<String>> {
        self.jobs
            .get(pod_key(pod))?
            .map(|v| {
                String::from_utf8(v.to_vec()).map_err(|_| StoreError::Malformed { tree: "jobs" })
            })
            .transpose()
    }

    /// The latest decision about a pod's job; `None` for an unknown pod.
    pub fn latest_for_pod(&self, pod: &str) -> Result<Option<DecisionRecord>> {
        match self.job_for_pod(pod)? {
            Some(job) => self.latest_for_job(&job),
            None => Ok(None),
        }
    }

    /// The retained decisions about a pod's job, oldest first (see [`Store::job_history`]);
    /// empty for an unknown pod.
    pub fn pod_history(&self, pod: &str) -> Result<Vec<DecisionRecord>> {
        match self.job_for_pod(pod)? {
            Some(job) => self.job_history(&job),
            None => Ok(Vec::new()),
        }
    }

    /// Stages the removal of `job`'s pod entries, for compaction when the job has no record
    /// left. A pod since moved to another job keeps its entry. Returns whether it staged
    /// anything.
    pub(crate) fn forget_pods(&self, writes: &mut sled::Batch, job: &str) -> Result<bool> {
        let mut staged = false;
        let prefix = job_pods_prefix(job);
        for item in self.jobs.scan_prefix(&prefix).keys() {
            let reverse = item?;
            let pod = &reverse[prefix.len()..];
            let mut key = Vec::with_capacity(1 + pod.len());
            key.push(POD);
            key.extend_from_slice(pod);
            if self.jobs.get(&key)?.as_deref() == Some(job.as_bytes()) {
                writes.remove(key);
            }
            writes.remove(reverse);
            staged = true;
        }
        Ok(staged)
    }
}
