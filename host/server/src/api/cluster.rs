//! The cluster as the loop sees it: the summary, nodes, queues and their history, and jobs.

use super::*;

#[utoipa::path(
    get, path = "/api/cluster", summary = "cluster totals and GPU use per topology domain",
    responses((status = 200, description = "summary", body = ClusterSummary))
)]
pub(crate) async fn cluster(
    State(state): St,
    Extension(_who): Extension<Caller>,
) -> Result<Json<ClusterSummary>> {
    let view = state.live.view();
    let symbols = state.live.symbols();
    let nodes = &view.nodes;
    let mut levels: Vec<LevelUse> = nodes
        .levels
        .iter()
        .map(|level| {
            let name = symbols.resolve(level.name).to_string();
            let mut counts = vec![0u32; level.domain_gpu_total.len()];
            for &d in &level.node_domain {
                if let Some(c) = counts.get_mut(d as usize) {
                    *c += 1;
                }
            }
            LevelUse {
                domains: (0..level.domain_gpu_total.len())
                    .map(|d| DomainUse {
                        name: format!("{name} {d}"),
                        nodes: counts[d],
                        gpu_total: level.domain_gpu_total[d],
                        gpu_free: level.domain_gpu_free[d],
                    })
                    .collect(),
                level: name,
            }
        })
        .collect();
    levels.sort_by_key(|l| l.domains.len());
    Ok(Json(ClusterSummary {
        cluster: view.cluster.clone(),
        at_ms: view.at_ms,
        nodes: nodes.len(),
        gpu_total: nodes.gpu_total.iter().map(|&g| u64::from(g)).sum(),
        gpu_free: nodes.gpu_free.iter().map(|&g| u64::from(g)).sum(),
        pending_pods: view.pending_pods,
        balloon_pending_pods: view.balloon_pods.pending,
        balloon_running_pods: view.balloon_pods.running,
        running_pods: view.running_pods,
        active_set: state.live.active_set().version(),
        levels,
    }))
}

pub(super) fn health_name(health: u8) -> String {
    gantry_core::Health::from_u8(health)
        .map(|h| format!("{h:?}"))
        .unwrap_or_else(|| format!("unknown-{health}"))
        .chars()
        .fold(String::new(), |mut s, c| {
            if c.is_uppercase() && !s.is_empty() {
                s.push('-');
            }
            s.push(c.to_ascii_lowercase());
            s
        })
}

/// Node `index`'s lifecycle state in `view`; a node the lifecycle has not heard of is Ready,
/// as the core's `Lifecycle::state` says.
fn node_state(view: &gantry_engine::ClusterView, index: usize) -> gantry_core::NodeState {
    view.node_states
        .get(index)
        .copied()
        .unwrap_or(gantry_core::NodeState::Ready)
}

#[utoipa::path(
    get, path = "/api/cluster/nodes", summary = "every node, as columns",
    responses((status = 200, description = "nodes", body = NodeColumns))
)]
pub(crate) async fn nodes(
    State(state): St,
    Extension(_who): Extension<Caller>,
) -> Result<Json<NodeColumns>> {
    let view = state.live.view();
    let symbols = state.live.symbols();
    let n = &view.nodes;
    Ok(Json(NodeColumns {
        at_ms: view.at_ms,
        name: n
            .name
            .iter()
            .map(|&s| symbols.resolve(s).to_string())
            .collect(),
        gpu_type: n
            .gpu_type
            .iter()
            .map(|&s| symbols.resolve(s).to_string())
            .collect(),
        gpu_total: n.gpu_total.clone(),
        gpu_free: n.gpu_free.clone(),
        balloon_gpus: (0..n.len() as u32)
            .map(|i| view.node_to_balloon_gpus.get(&i).copied().unwrap_or(0))
            .collect(),
        health: n.health.iter().map(|&h| health_name(h)).collect(),
        state: (0..n.len()).map(|i| node_state(&view, i)).collect(),
        levels: n
            .levels
            .iter()
            .map(|l| (symbols.resolve(l.name).to_string(), l.node_domain.clone()))
            .collect(),
        jobs: (0..n.len() as u32)
            .map(|i| view.node_to_jobs.get(&i).map_or(0, |j| j.len() as u32))
            .collect(),
        queues: (0..n.len() as u32)
            .map(|i| {
                let mut names: Vec<&str> = view
                    .node_to_jobs
                    .get(&i)
                    .into_iter()
                    .flatten()
                    .filter_map(|job| view.job_to_state.get(job).map(|j| j.queue.as_str()))
                    .collect();
                names.sort_unstable();
                names.dedup();
                names.join(",")
            })
            .collect(),
    }))
}

#[utoipa::path(
    get, path = "/api/cluster/nodes/{node}", summary = "one node, its jobs and its recent placements",
    params(("node" = String, Path, description = "node name"), Limit),
    responses(
        (status = 200, description = "node", body = NodeDetail),
        (status = 400, description = "bad query", body = ErrorBody),
        (status = 404, description = "no such node", body = ErrorBody),
    )
)]
pub(crate) async fn node(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Path(name): Path<String>,
    Query(q): Query<Limit>,
) -> Result<Json<NodeDetail>> {
    let view = state.live.view();
    let symbols = state.live.symbols();
    let n = &view.nodes;
    let index = n
        .name
        .iter()
        .position(|&s| &*symbols.resolve(s) == name.as_str())
        .ok_or_else(|| ApiError::NotFound(format!("no node named {name}")))?;
    let recent = state
        .live
        .store
        .decisions_on_node(&name, 0, u64::MAX, usize::MAX)?;
    Ok(Json(NodeDetail {
        gpu_type: symbols.resolve(n.gpu_type[index]).to_string(),
        gpu_total: n.gpu_total[index],
        gpu_free: n.gpu_free[index],
        health: health_name(n.health[index]),
        state: node_state(&view, index),
        domains: n
            .levels
            .iter()
            .map(|l| format!("{} {}", symbols.resolve(l.name), l.node_domain[index]))
            .collect(),
        jobs: view
            .node_to_jobs
            .get(&(index as u32))
            .cloned()
            .unwrap_or_default(),
        recent_decisions: newest(recent, limit_of(q.limit)),
        name,
    }))
}

#[utoipa::path(
    get, path = "/api/queues", summary = "quota, usage, borrowing and fair share per queue",
    responses((status = 200, description = "queues", body = Vec<QueueView>))
)]
pub(crate) async fn queues(
    State(state): St,
    Extension(_who): Extension<Caller>,
) -> Result<Json<Vec<QueueView>>> {
    Ok(Json(state.live.view().queues.clone()))
}

/// Each queue's usage, quota, lending, fair share and pending jobs over the last hour, sampled
/// by the scheduling loop every few seconds; `since` fetches only what is new.
#[utoipa::path(
    get, path = "/api/queues/history",
    summary = "each queue's usage, quota, lending, fair share and pending jobs over the last hour, sampled every 5 s",
    params(HistoryQuery),
    responses(
        (status = 200, description = "history", body = QueueHistoryView),
        (status = 400, description = "bad query", body = ErrorBody),
    )
)]
pub(crate) async fn queue_history(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Query(q): Query<HistoryQuery>,
) -> Result<Json<gantry_engine::QueueHistoryView>> {
    Ok(Json(state.live.queue_history(q.since.unwrap_or(0))))
}

/// Jobs pending or running now, for search and for each queue's pending list: pending first,
/// by queue and place in it, then running ones by name. Balloon pods are left out: they hold
/// idle capacity and are nobody's work.
#[utoipa::path(
    get, path = "/api/jobs",
    summary = "jobs pending or running now (balloons left out): pending first, by queue and place in it",
    params(JobQuery),
    responses(
        (status = 200, description = "jobs", body = Vec<JobRow>),
        (status = 400, description = "bad state or sort", body = ErrorBody),
    )
)]
pub(crate) async fn jobs(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Query(q): Query<JobQuery>,
) -> Result<Json<Vec<JobRow>>> {
    if let Some(s) = q.state.as_deref()
        && s != "pending"
        && s != "running"
    {
        return Err(ApiError::BadRequest(format!(
            "state must be pending or running, not {s:?}"
        )));
    }
    let by_wait = match q.sort.as_deref() {
        None | Some("position") => false,
        Some("wait") => true,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "sort must be position or wait, not {other:?}"
            )));
        }
    };
    let namespace_of = |name: &str| name.split_once('/').map_or("", |(ns, _)| ns).to_string();
    let needle = q.q.as_deref().unwrap_or("").to_lowercase();
    let view = state.live.view();
    let mut rows: Vec<JobRow> = view
        .job_to_state
        .iter()
        .filter(|(name, job)| {
            // A node failure restarted it when a node that failed under it is avoided.
            let restarted = !job.avoiding.is_empty();
            !job.balloon
                && q.queue.as_deref().is_none_or(|want| job.queue == want)
                && q.state.as_deref().is_none_or(|want| job.state == want)
                && q.namespace
                    .as_deref()
                    .is_none_or(|want| namespace_of(name) == want)
                && (needle.is_empty() || name.to_lowercase().contains(&needle))
                && q.restarted.is_none_or(|want| want == restarted)
        })
        .map(|(name, job)| JobRow {
            name: name.clone(),
            job: job.clone(),
        })
        .collect();
    rows.sort_by(|a, b| {
        let wait = |r: &JobRow| if by_wait { r.job.submitted_ms } else { 0 };
        (
            a.job.state != "pending",
            wait(a),
            &a.job.queue,
            a.job.queue_position,
            &a.name,
        )
            .cmp(&(
                b.job.state != "pending",
                wait(b),
                &b.job.queue,
                b.job.queue_position,
                &b.name,
            ))
    });
    rows.truncate(limit_of(q.limit));
    Ok(Json(rows))
}
