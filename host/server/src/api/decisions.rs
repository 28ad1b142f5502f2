//! The record: the audit log, decisions by time, job, pod and node, the live stream, a job's
//! explanation and the what-if.

use super::*;

/// Bounds a requested list length: 100 by default, 10,000 at most.
pub(super) fn limit_of(limit: Option<usize>) -> usize {
    Limit::get(limit)
}

#[utoipa::path(
    get, path = "/api/audit", summary = "the newest audit entries, newest first (admin only)",
    params(Limit),
    responses(
        (status = 200, description = "entries", body = Vec<AuditEntry>),
        (status = 400, description = "bad query", body = ErrorBody),
        (status = 403, description = "a viewer token", body = ErrorBody),
    )
)]
pub(crate) async fn audit(State(state): St, Query(q): Query<Limit>) -> Result<Response> {
    let limit = limit_of(q.limit);
    read_off_loop(&state, move |live| Ok(live.store.audit_recent(limit)?)).await
}

#[utoipa::path(
    get, path = "/api/decisions", summary = "decisions in a time range, in time order",
    params(TimeRange),
    responses(
        (status = 200, description = "decisions", body = Vec<DecisionRecord>),
        (status = 400, description = "bad range", body = ErrorBody),
    )
)]
pub(crate) async fn decisions_between(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Query(q): Query<TimeRange>,
) -> Result<Response> {
    let (from_ms, to_ms) = (q.from_ms.unwrap_or(0), q.to_ms.unwrap_or(u64::MAX));
    if from_ms > to_ms {
        return Err(ApiError::BadRequest(format!(
            "from_ms ({from_ms}) is after to_ms ({to_ms})"
        )));
    }
    let limit = limit_of(q.limit);
    read_off_loop(&state, move |live| {
        Ok(live.store.decisions_between(from_ms, to_ms, limit)?)
    })
    .await
}

/// The newest `limit` of a history, oldest first.
pub(super) fn newest(mut records: Vec<DecisionRecord>, limit: usize) -> Vec<DecisionRecord> {
    let skip = records.len().saturating_sub(limit);
    records.drain(..skip);
    records
}

#[utoipa::path(
    get, path = "/api/decisions/job/{job}", summary = "a job's decisions, oldest first (the newest `limit`)",
    params(("job" = String, Path, description = "job name"), Limit),
    responses(
        (status = 200, description = "decisions", body = Vec<DecisionRecord>),
        (status = 400, description = "bad query", body = ErrorBody),
        (status = 404, description = "no decisions about this job", body = ErrorBody),
    )
)]
pub(crate) async fn decisions_by_job(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Path(job): Path<String>,
    Query(q): Query<Limit>,
) -> Result<Response> {
    let limit = limit_of(q.limit);
    read_off_loop(&state, move |live| {
        let history = live.store.job_history_newest(&job, limit)?;
        // A job pending now that no cycle has attempted yet has an empty history, not none.
        if history.is_empty() && !live.view().job_to_state.contains_key(&job) {
            return Err(ApiError::NotFound(format!("no decisions about job {job}")));
        }
        Ok(history)
    })
    .await
}

#[utoipa::path(
    get, path = "/api/decisions/pod/{pod}",
    summary = "the decisions about a pod's job (a single-pod job's pod has the job's name)",
    params(("pod" = String, Path, description = "pod name"), Limit),
    responses(
        (status = 200, description = "decisions", body = Vec<DecisionRecord>),
        (status = 400, description = "bad query", body = ErrorBody),
        (status = 404, description = "unknown pod", body = ErrorBody),
    )
)]
pub(crate) async fn decisions_by_pod(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Path(pod): Path<String>,
    Query(q): Query<Limit>,
) -> Result<Response> {
    let limit = limit_of(q.limit);
    read_off_loop(&state, move |live| {
        // A single-pod job's pod carries the job's name; a gang's pods are recorded at
        // submission.
        let job = live.store.job_for_pod(&pod)?.unwrap_or_else(|| pod.clone());
        let history = live.store.job_history_newest(&job, limit)?;
        if history.is_empty() {
            return Err(ApiError::NotFound(format!(
                "no decisions about a pod named {pod}"
            )));
        }
        Ok(history)
    })
    .await
}

#[utoipa::path(
    get, path = "/api/decisions/node/{node}", summary = "placements on a node, in time order",
    params(("node" = String, Path, description = "node name"), TimeRange),
    responses(
        (status = 200, description = "decisions", body = Vec<DecisionRecord>),
        (status = 400, description = "bad query", body = ErrorBody),
    )
)]
pub(crate) async fn decisions_by_node(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Path(node): Path<String>,
    Query(q): Query<TimeRange>,
) -> Result<Response> {
    let (from_ms, to_ms) = (q.from_ms.unwrap_or(0), q.to_ms.unwrap_or(u64::MAX));
    let limit = limit_of(q.limit);
    read_off_loop(&state, move |live| {
        Ok(live.store.decisions_on_node(&node, from_ms, to_ms, limit)?)
    })
    .await
}

#[utoipa::path(
    get, path = "/api/decisions/stream",
    summary = "server-sent events: one `decision` event per decision, its data a `DecisionEvent`",
    responses(
        (status = 200, description = "event stream", body = String, content_type = "text/event-stream"),
        (status = 503, description = "as many clients as the server takes already follow it", body = ErrorBody),
    )
)]
pub(crate) async fn decision_stream(
    State(state): St,
    Extension(_who): Extension<Caller>,
) -> Result<Sse<impl tokio_stream::Stream<Item = std::result::Result<Event, Infallible>>>> {
    // Counted for as long as the stream lives: the guard moves into it.
    let follower = StreamFollower::join(&state)?;
    let stream = BroadcastStream::new(state.live.subscribe()).filter_map(move |event| {
        let _follower = &follower;
        // A lagging subscriber skips what it missed rather than closing.
        let event = event.ok()?;
        let data = serde_json::to_string(&*event).ok()?;
        Some(Ok(Event::default().event("decision").data(data)))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// Clients following the decision stream at once; more get 503. Each holds a connection and
/// a broadcast receiver for as long as it stays.
pub const DECISION_STREAM_CLIENTS: usize = 128;

/// One client of the decision stream, counted in [`AppState`] until it goes.
struct StreamFollower(Arc<std::sync::atomic::AtomicUsize>);

impl StreamFollower {
    /// Counts a new follower, or refuses it when [`DECISION_STREAM_CLIENTS`] already follow.
    fn join(state: &AppState) -> Result<Self> {
        use std::sync::atomic::Ordering;
        let count = state.stream_followers.clone();
        let joined = count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < DECISION_STREAM_CLIENTS).then_some(n + 1)
        });
        match joined {
            Ok(_) => Ok(Self(count)),
            Err(n) => Err(ApiError::Unavailable(format!(
                "{n} clients already follow the decision stream, the most it takes: try again later"
            ))),
        }
    }
}

impl Drop for StreamFollower {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// `placed on node-1 ×2, node-7 in rack 3`, naming at most four nodes.
pub(super) fn placed_text(nodes: &[(String, u32)], e: &gantry_core::Explanation) -> String {
    let mut names: Vec<String> = nodes
        .iter()
        .take(4)
        .map(|(node, pods)| match pods {
            1 => node.clone(),
            n => format!("{node} ×{n}"),
        })
        .collect();
    if nodes.len() > 4 {
        names.push(format!("{} more nodes", nodes.len() - 4));
    }
    let domain = e
        .domain
        .as_ref()
        .map(|d| format!(" in {d}"))
        .unwrap_or_default();
    format!("placed on {}{domain}", names.join(", "))
}

/// A job's decision records, oldest first, as the steps a researcher reads.
pub(super) fn job_events(records: &[DecisionRecord]) -> Vec<JobEvent> {
    let mut events: Vec<JobEvent> = Vec::new();
    for record in records {
        let e = &record.explanation;
        let (kind, text, by) = match (&e.outcome, &e.preempted_by) {
            (Outcome::Placed { nodes }, _) => (JobEventKind::Placed, placed_text(nodes, e), None),
            (Outcome::Pending { .. }, Some(by)) => (
                JobEventKind::Preempted,
                format!("preempted to make room for {by}"),
                Some(by.clone()),
            ),
            (Outcome::Pending { waiting_for }, None) => (
                JobEventKind::Pending,
                format!("waiting for {waiting_for}"),
                None,
            ),
        };
        match events.last_mut() {
            Some(last) if kind == JobEventKind::Pending && last.kind == JobEventKind::Pending => {
                last.text = text;
            }
            _ => events.push(JobEvent {
                time_ms: record.time_ms,
                kind,
                text,
                by,
            }),
        }
    }
    events
}

/// When a job of this shape would start, without submitting it: the loop answers from its plan.
#[utoipa::path(
    post, path = "/api/whatif",
    summary = "when a job of this shape would start, from the same forecast as the pending jobs' estimates, without submitting it; with `variations`, also for half the GPUs per pod, 3/4 of the pods, each other queue and GPU type",
    request_body = WhatIfJob,
    responses(
        (status = 200, description = "answer", body = WhatIfAnswer),
        (status = 400, description = "a field is wrong: the message names it", body = ErrorBody),
        (status = 413, description = "a body over 64 KiB", body = ErrorBody),
        (status = 503, description = "the loop did not answer in time, or two what-ifs are being answered already", body = ErrorBody),
    )
)]
pub(crate) async fn what_if(
    State(state): St,
    Extension(_who): Extension<Caller>,
    body: std::result::Result<
        Json<gantry_engine::WhatIfJob>,
        axum::extract::rejection::JsonRejection,
    >,
) -> Result<Json<gantry_engine::WhatIfAnswer>> {
    let Json(job) = body.map_err(json_error)?;
    match state.live.what_if(job).await {
        Ok(answer) => Ok(Json(answer)),
        Err(gantry_engine::WhatIfError::BadField(text)) => Err(ApiError::BadRequest(text)),
        Err(error @ (gantry_engine::WhatIfError::NoAnswer | gantry_engine::WhatIfError::Busy)) => {
            Err(ApiError::Unavailable(error.to_string()))
        }
    }
}

#[utoipa::path(
    get, path = "/api/explain/{name}", summary = "why a pod or job is pending now, or where it went",
    params(("name" = String, Path, description = "pod or job name")),
    responses(
        (status = 200, description = "explanation", body = Explain),
        (status = 404, description = "no such job or pod", body = ErrorBody),
    )
)]
pub(crate) async fn explain(
    State(state): St,
    Extension(_who): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<Explain>> {
    let store = &state.live.store;
    let view = state.live.view();
    let (kind, job) =
        if view.job_to_state.contains_key(&name) || store.latest_for_job(&name)?.is_some() {
            (ExplainKind::Job, name.clone())
        } else {
            match store.job_for_pod(&name)? {
                Some(job) => (ExplainKind::Pod, job),
                None => {
                    return Err(ApiError::NotFound(format!(
                        "no job or pod named {name} is known"
                    )));
                }
            }
        };
    let history = store.job_history(&job)?;
    let latest = store.latest_for_job(&job)?;
    let now = view.job_to_state.get(&job);
    let state_name = match now.map(|j| j.state) {
        Some("pending") => ExplainState::Pending,
        Some(_) => ExplainState::Running,
        None => ExplainState::Done,
    };
    let (queue_name, pods, gpus_per_pod, priority) = match (&latest, now) {
        (_, Some(j)) => (j.queue.clone(), j.pods, j.gpus_per_pod, j.priority),
        (Some(r), None) => {
            let e = &r.explanation;
            (e.queue.clone(), e.pods, e.gpus_per_pod, e.priority)
        }
        (None, None) => {
            return Err(ApiError::NotFound(format!(
                "job {job} of pod {name} has no decision yet"
            )));
        }
    };
    let queue = view.queues.iter().find(|q| q.name == queue_name).cloned();
    let queue_position = now.and_then(|j| j.queue_position);
    let events = job_events(&history);
    // A job preempted earlier reads so, even when its latest record waits for something else.
    let earlier_preemption = events
        .iter()
        .rev()
        .skip(1)
        .find(|e| e.kind == JobEventKind::Preempted)
        .filter(|_| state_name == ExplainState::Pending)
        .and_then(|e| e.by.as_ref())
        .map(|by| format!(" It ran earlier and was preempted to make room for {by}."))
        .unwrap_or_default();
    let (why, waiting_for) = match &latest {
        Some(r) => (
            format!("{}{earlier_preemption}", r.explanation.summary()),
            match &r.explanation.outcome {
                Outcome::Pending { waiting_for } if state_name == ExplainState::Pending => {
                    Some(waiting_for.clone())
                }
                _ => None,
            },
        ),
        None => {
            // Each cycle attempts a bounded number of pending jobs, in fair-share order: a job
            // far back in a long queue can wait for its first attempt.
            let position = queue_position.map_or_else(String::new, |p| format!(" number {p} of"));
            (
                format!(
                    "Not attempted yet: it is{position} the pending jobs of queue {queue_name}, and each cycle tries a bounded number of pending jobs in fair-share order."
                ),
                Some(gantry_contract::not_attempted_waiting_for(&queue_name)),
            )
        }
    };
    Ok(Json(Explain {
        name,
        kind,
        job,
        state: state_name,
        queue_name,
        pods,
        gpus_per_pod,
        priority,
        queue_position,
        queue,
        why,
        waiting_for,
        estimate: now.and_then(|j| j.estimate.clone()),
        no_estimate: now.and_then(|j| j.no_estimate.clone()),
        avoiding: now.map(|j| j.avoiding.clone()).unwrap_or_default(),
        attempts: history.len(),
        quota_verdict: latest
            .as_ref()
            .map(|record| record.explanation.quota.verdict_text()),
        latest,
        history: events,
    }))
}
