//! The end of a sync: the changed gangs submitted, withdrawn or adopted as jobs, and
//! preemptors moved on once their victims are gone.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use gantry_core::{Changes, JobId, JobSpec, Scheduler, TopologyPref};

use crate::mapping::{Gang, GroupPolicy, PendingPod, is_balloon, is_ours, queue_claim, widen};

use super::{PodKey, Tracker};

impl Tracker {
    /// After the changed keys: submits, withdraws and adopts what the changed gangs now are,
    /// and moves on preemptors whose victims are gone. Returns what changed.
    pub fn finish_sync(&mut self, scheduler: &mut Scheduler, give_up: Duration) -> Changes {
        let mut changes = Changes::default();
        for gang in std::mem::take(&mut self.dirty_running) {
            self.settle_running(scheduler, &gang, &mut changes);
        }
        for gang in std::mem::take(&mut self.dirty_pending) {
            self.settle_pending(scheduler, &gang, &mut changes);
        }
        // Preemptors whose victims have left, or whose wait ran out, go back to the front of
        // their queue: the cycle about to run places them on the room now free.
        let ready: Vec<JobId> = self
            .job_to_nominated
            .iter()
            .filter(|(_, n)| n.victims.is_empty() || n.since.elapsed() >= give_up)
            .map(|(&id, _)| id)
            .collect();
        for id in ready {
            if let Some(n) = self.job_to_nominated.remove(&id)
                && !n.victims.is_empty()
            {
                tracing::info!(job = %scheduler.job(id).name, "preemption dropped (timed out); choosing again");
            }
            scheduler.unplace(id);
        }
        changes.pod_to_job = std::mem::take(&mut self.pod_to_job);
        changes
    }

    fn settle_running(&mut self, scheduler: &mut Scheduler, gang: &Gang, changes: &mut Changes) {
        let Some(group) = self.gang_to_running.get_mut(gang) else {
            return;
        };
        let now: BTreeSet<PodKey> = group.pods.keys().cloned().collect();
        if let Some((job, pods)) = &group.job {
            if *pods == now && scheduler.is_running(*job) {
                return;
            }
            let job = *job;
            group.job = None;
            self.job_to_gang.remove(&job);
            self.job_to_warning.remove(&job);
            tracing::debug!(job, gang = ?gang, "running pods changed");
            if scheduler.get(job).is_some() {
                scheduler.finish(job);
                changes.ended += 1;
            }
        }
        if group.pods.is_empty() {
            self.gang_to_running.remove(gang);
            return;
        }
        let members: Vec<(PendingPod, usize)> = group.pods.values().cloned().collect();
        let first = members[0].0.pod.clone();
        let mut shape = self.shape_of(&first);
        let mut per_node: HashMap<usize, u32> = HashMap::new();
        for (pod, node) in &members {
            widen(&mut shape, &self.shape_of(&pod.pod));
            *per_node.entry(*node).or_default() += 1;
        }
        let queue = self.charge(&first);
        if let Some(queue) = &queue {
            self.ensure_queue(scheduler, queue);
        }
        let fits = per_node
            .iter()
            .all(|(&node, &n)| scheduler.state.capacity_for(node, &shape) >= n);
        let Some(queue) = queue.filter(|_| fits) else {
            // Someone overcommitted a node, or no queue its namespace may use is there to
            // charge: the pods only hold what room is left, and are never preempted.
            let ours = is_ours(&first, &self.config);
            if let Some(group) = self.gang_to_running.remove(gang) {
                for (key, (pod, node)) in group.pods {
                    let role = self.hold(scheduler, &pod.pod, node, ours);
                    if let Some(b) = self.key_to_bound.get_mut(&key) {
                        b.role = role;
                    }
                }
            }
            return;
        };
        let name = gang.job_name();
        shape.name = self.symbols.intern(&name);
        shape.queue = self.symbols.intern(&queue);
        shape.gang_size = members.len() as u32;
        let nodes: Vec<usize> = members.iter().map(|(_, node)| *node).collect();
        let spec = JobSpec {
            name,
            queue: scheduler.queues.id(&queue).unwrap_or(0),
            priority: shape.priority,
            pods: members.len() as u32,
            shape,
            balloon: is_balloon(&first, &self.config),
            topology: TopologyPref::default(),
            submit_s: self.run_s(&first),
            expected_runtime_s: crate::mapping::expected_runtime(&first).ok().flatten(),
        };
        let id = scheduler.adopt(spec, &nodes);
        let known = (&self.group_to_stop_policy, &self.queue_to_stop_policy);
        match stop_policy(known, gang, &first, &queue) {
            Ok(policy) => scheduler.set_stop_policy(id, policy),
            // Running already: it keeps the default, and the log says why.
            Err(why) => tracing::warn!(job = id, %why, "stop policy not read; stopping it whole"),
        }
        tracing::debug!(job = id, gang = ?gang, pods = nodes.len(), "adopted running pods");
        self.job_to_gang.insert(id, (gang.clone(), true));
        if let Some(group) = self.gang_to_running.get_mut(gang) {
            group.job = Some((id, now));
        }
    }

    /// How many pods `gang` needs before it is a job: one for a single pod, its PodGroup's
    /// `minMember` or `minCount`, or its size label; or why that cannot be known (its group
    /// not found, refused, or a malformed size).
    fn gang_min(&self, gang: &Gang) -> Result<u32, String> {
        match gang {
            Gang::Single(..) => Ok(1),
            Gang::PodGroup(ns, group) => {
                match self.group_to_min.get(&(ns.clone(), group.clone())) {
                    Some(&min) => Ok(min),
                    None => Err(format!(
                        "pod group {ns}/{group} not found (scheduling.x-k8s.io PodGroup named by label {})",
                        self.config.pod_group_label
                    )),
                }
            }
            Gang::Workload(ns, group) => match self
                .workload_group_to_policy
                .get(&(ns.clone(), group.clone()))
            {
                Some(GroupPolicy::Gang(min)) => Ok(*min),
                Some(GroupPolicy::Refused(why)) => Err(why.clone()),
                // A basic group's pods are single jobs: never keyed here.
                Some(GroupPolicy::Basic) => Ok(1),
                None => Err(format!(
                    "pod group {ns}/{group} not found (scheduling.k8s.io PodGroup named by spec.schedulingGroup.podGroupName)"
                )),
            },
            Gang::Labels(ns, group, size) => match size.as_deref().map(str::parse::<u32>) {
                Some(Ok(size)) if size > 0 => Ok(size),
                _ => Err(format!(
                    "gang {ns}/{group}: label {} must be a positive number of pods, found {}",
                    self.config.gang_size_label,
                    size.as_deref()
                        .map_or("none".to_string(), |s| format!("{s:?}"))
                )),
            },
        }
    }

    fn settle_pending(&mut self, scheduler: &mut Scheduler, gang: &Gang, changes: &mut Changes) {
        let bound_members = self
            .gang_to_running
            .get(gang)
            .map_or(0, |g| g.pods.len() as u32);
        // How many pods the gang needs, or why that cannot be known.
        let min = self.gang_min(gang);
        let Some(entry) = self.gang_to_pending.get_mut(gang) else {
            return;
        };
        let now: BTreeSet<PodKey> = entry.pods.keys().cloned().collect();
        let first = entry.pods.values().next().map(|p| p.pod.clone());
        let balloon = first.as_ref().is_some_and(|p| is_balloon(p, &self.config));
        // The queue the gang may use, or why it may not: the tenant trust boundary. A trusted
        // balloon is charged to no queue, so the one it names is not checked.
        let admitted = first.as_ref().map(|pod| {
            let claim = queue_claim(pod, &self.config);
            if balloon {
                Ok(self
                    .tenancy
                    .balloon_queue(gang.namespace(), &claim, &self.config))
            } else {
                self.tenancy.admit(gang.namespace(), &claim, &self.config)
            }
        });
        let (queue, refused) = match admitted {
            Some(Ok(queue)) => (Some(queue), None),
            Some(Err(why)) => (None, Some(why)),
            None => (None, None),
        };
        // What a node failure stops of it, or why its annotation cannot be read.
        let stop = match (&first, &queue) {
            (Some(pod), Some(queue)) => Some(stop_policy(
                (&self.group_to_stop_policy, &self.queue_to_stop_policy),
                gang,
                pod,
                queue,
            )),
            _ => None,
        };
        let refused = refused.or_else(|| stop.clone()?.err());
        // A field Gantry does not honour refuses the gang, naming the field and the pod; so
        // do pods of one gang that ask for different nodes (a gang is placed as one shape).
        let refused = refused.or_else(|| {
            let mut affinities = entry.pods.values().map(|p| {
                crate::podspec::node_affinity(&p.pod, &self.symbols).unwrap_or_default()
            });
            let first_affinity = affinities.next();
            entry
                .pods
                .values()
                .find_map(|p| {
                    crate::podspec::unsupported(&p.pod, &self.symbols)
                        .or_else(|| self.dra.resolve(&p.pod).err())
                        .map(|why| format!("pod {}: {why}", p.key()))
                })
                .or_else(|| {
                    affinities.any(|a| Some(&a) != first_affinity.as_ref()).then(|| {
                        format!(
                            "gang {} has pods with different node selectors or node affinity; Gantry places a gang's pods by one",
                            gang.job_name()
                        )
                    })
                })
        });
        // Why the gang cannot be a job yet, if it cannot.
        let waiting = refused.or_else(|| first.as_ref().and_then(|_| {
            let name = gang.job_name();
            let min = match &min {
                Ok(min) => *min,
                Err(why) => return Some(why.clone()),
            };
            let pending = entry.pods.len() as u32;
            (pending < min.saturating_sub(bound_members)).then(|| {
                format!(
                    "gang {name} has {} of its {min} pods ({bound_members} bound, {pending} pending)",
                    bound_members + pending
                )
            })
        }));
        if let Some((job, pods)) = &entry.job {
            // The same pods in the same queue: nothing to do. A queue that changed (its
            // LocalQueue was pointed elsewhere) submits the gang again.
            let same_queue = scheduler
                .get(*job)
                .is_some_and(|spec| Some(scheduler.queues.name(spec.queue)) == queue.as_deref());
            if *pods == now && waiting.is_none() && same_queue {
                return;
            }
            let job = *job;
            entry.job = None;
            self.job_to_gang.remove(&job);
            self.job_to_warning.remove(&job);
            self.job_to_nominated.remove(&job);
            tracing::debug!(job, gang = ?gang, "withdrawn: its pods changed");
            if scheduler.get(job).is_some() {
                scheduler.finish(job);
                changes.ended += 1;
            }
        }
        entry.waiting = waiting;
        let Some(first) = first else {
            self.gang_to_pending.remove(gang);
            return;
        };
        let (None, Some(queue)) = (&entry.waiting, queue) else {
            return;
        };
        let members: Vec<PendingPod> = entry.pods.values().cloned().collect();
        let mut shape = self.shape_of(&first);
        for pod in &members[1..] {
            widen(&mut shape, &self.shape_of(&pod.pod));
        }
        let name = gang.job_name();
        shape.name = self.symbols.intern(&name);
        shape.queue = self.symbols.intern(&queue);
        shape.gang_size = members.len() as u32;
        // The recreated pods of a gang a node failure stopped keep its place.
        let restart = self.take_restart(gang);
        let submit_s = restart
            .as_ref()
            .map_or(self.run_s(&first), |r| r.submit_s.min(self.run_s(&first)));
        self.ensure_queue(scheduler, &queue);
        let spec = JobSpec {
            name: name.clone(),
            queue: scheduler.queues.id(&queue).unwrap_or(0),
            priority: shape.priority,
            pods: members.len() as u32,
            shape,
            // A balloon is charged to no queue and gives way to any work, pending or bound.
            balloon,
            topology: TopologyPref::default(),
            submit_s,
            expected_runtime_s: None,
        };
        let (spec, warning) = declared_runtime(spec, &members);
        let id = scheduler.submit(spec);
        if let Some(Ok(policy)) = stop {
            scheduler.set_stop_policy(id, policy);
        }
        if let Some(restart) = restart {
            let bad = self.bad_nodes(&restart);
            let avoiding: Vec<&str> = restart.avoid.iter().map(|(n, _)| n.as_str()).collect();
            tracing::info!(job = id, gang = ?gang, ?avoiding, "recreated pods of a stopped gang: restarted first");
            scheduler.restarted(id, bad);
        }
        if let Some(warning) = warning {
            self.job_to_warning.insert(id, warning);
        }
        tracing::debug!(job = id, gang = ?gang, pods = members.len(), "submitted");
        changes.submitted += 1;
        changes.submitted_pods += members.len() as u64;
        if members.len() > 1 {
            self.pod_to_job
                .extend(members.iter().map(|p| (p.key(), name.clone())));
        }
        self.job_to_gang.insert(id, (gang.clone(), false));
        if let Some(entry) = self.gang_to_pending.get_mut(gang) {
            entry.job = Some((id, now));
        }
    }
}

/// `spec` with the runtime its pods declare (the longest of them), and the warning to show
/// when one declares it malformed (the planner then learns the runtime instead).
fn declared_runtime(mut spec: JobSpec, members: &[PendingPod]) -> (JobSpec, Option<String>) {
    let mut warning = None;
    for member in members {
        match crate::mapping::expected_runtime(&member.pod) {
            Ok(Some(s)) => {
                spec.expected_runtime_s = Some(spec.expected_runtime_s.map_or(s, |d| d.max(s)));
            }
            Ok(None) => {}
            Err(text) => warning = Some(text),
        }
    }
    if warning.is_some() {
        spec.expected_runtime_s = None;
    }
    (spec, warning)
}

/// What the tracker knows of stop policies: the PodGroups' annotations and the Queues'
/// defaults.
type StopPolicies<'a> = (
    &'a HashMap<PodKey, Result<gantry_core::StopPolicy, String>>,
    &'a HashMap<String, gantry_core::StopPolicy>,
);

/// What a node failure stops of `gang` (its pod `first`, charged to `queue`): a pod's
/// `gantry.dev/stop-policy` annotation, else its PodGroup's, else its Queue's
/// `spec.stopPolicy`, else whole; or why an annotation cannot be read.
fn stop_policy(
    (group_to_policy, queue_to_policy): StopPolicies<'_>,
    gang: &Gang,
    first: &k8s_openapi::api::core::v1::Pod,
    queue: &str,
) -> Result<gantry_core::StopPolicy, String> {
    let what = format!(
        "pod {}/{}",
        first.metadata.namespace.as_deref().unwrap_or_default(),
        first.metadata.name.as_deref().unwrap_or_default()
    );
    if let Some(policy) = crate::mapping::stop_policy(first.metadata.annotations.as_ref(), &what)? {
        return Ok(policy);
    }
    let group = match gang {
        Gang::PodGroup(ns, name) | Gang::Workload(ns, name) => {
            group_to_policy.get(&(ns.clone(), name.clone()))
        }
        Gang::Single(..) | Gang::Labels(..) => None,
    };
    if let Some(policy) = group {
        return policy.clone();
    }
    Ok(queue_to_policy.get(queue).copied().unwrap_or_default())
}
