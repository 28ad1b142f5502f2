//! When a job would start, in the API's terms: a pending job's estimate ([`EstimateView`],
//! with the words it is shown in, [`estimate_text`]), and what-if questions and answers
//! ([`WhatIfJob`], [`WhatIfAnswer`]). The engine answers them from its plan.

use gantry_core::StartEstimate;
pub use gantry_core::explain::{count_text, duration_text};
use serde::{Deserialize, Serialize};

/// A job shape to ask about, as `POST /api/whatif` takes it. Either `like` (a pending job whose
/// shape to start from) or `queue`; the other fields change the shape.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[derive(utoipa::ToSchema)]
pub struct WhatIfJob {
    /// A pending job to start from: its queue, pods, GPUs per pod, GPU type and priority.
    #[serde(default)]
    pub like: Option<String>,
    /// The queue to submit to.
    #[serde(default)]
    pub queue: Option<String>,
    /// Pods in the gang (1 for a single pod).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 100000)]
    pub pods: Option<u32>,
    /// GPUs each pod asks for.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 64)]
    pub gpus_per_pod: Option<u32>,
    /// The GPU model each pod needs (as nodes label it); `""` = any.
    #[serde(default)]
    pub gpu_type: Option<String>,
    /// How long it would run, if known: otherwise learned from finished jobs like it.
    #[serde(default)]
    #[schema(exclusive_minimum = 0)]
    pub expected_runtime_s: Option<f64>,
    /// Also answer for the variations a researcher would try: half the GPUs per pod, three
    /// quarters of the pods, each other queue, each other GPU type.
    #[serde(default)]
    pub variations: bool,
}

/// When a job would start (or is expected to), in wall-clock milliseconds, with the words.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EstimateView {
    /// As early as this (10%).
    pub p10_ms: u64,
    /// Most likely about then (the median).
    pub p50_ms: u64,
    /// By then, 90% of the time.
    pub p90_ms: u64,
    /// The nodes held for it, when it holds a reservation.
    pub reservation: Option<String>,
    /// E.g. "expected to start in about 2 h 10 min, 90% within 5 h".
    pub text: String,
    /// The same as a list shows it: "in about 2 h 10 min (90% within 5 h)", a duration from
    /// now, never a clock time (those are the `_ms` fields, for a hover or `--json`).
    pub short: String,
    /// What the job waits for until then, word for word what its latest stored decision says
    /// (the explanation's `waiting_for`), so the estimate and the explanation never tell two
    /// stories; none for a what-if's job, which nothing has refused yet.
    pub waiting_for: Option<String>,
}

/// The wall-clock time (ms since the epoch) of `s` on the scheduler's clock, which read
/// `clock_s` at `now_ms`; a time already past reads as `now_ms`. Estimates and what-if bounds
/// are planned on the scheduler's clock and read on the wall clock.
pub fn wall_ms(s: f64, clock_s: f64, now_ms: u64) -> u64 {
    now_ms.saturating_add(((s - clock_s).max(0.0) * 1000.0) as u64)
}

impl EstimateView {
    /// `estimate`, made on the scheduler's clock at `clock_s`, as seen at `now_ms`, of a job
    /// whose latest decision waits for `waiting_for` (none for a job not refused yet).
    pub fn new(
        estimate: &StartEstimate,
        clock_s: f64,
        now_ms: u64,
        waiting_for: Option<&str>,
    ) -> Self {
        let at = |s: f64| wall_ms(s, clock_s, now_ms);
        let (p10_ms, p50_ms, p90_ms) = (at(estimate.p10_s), at(estimate.p50_s), at(estimate.p90_s));
        let (p50_in_s, p90_in_s) = (
            (p50_ms - now_ms) as f64 / 1000.0,
            (p90_ms - now_ms) as f64 / 1000.0,
        );
        // A start planned for later that has come and gone: say so, rather than clamping it
        // to "now", which read as "room for it is free" beside a refusal.
        let overdue_s = clock_s - estimate.p50_s;
        let (mut text, short) = if overdue_s >= 1.0 && estimate.p50_s >= estimate.planned_at_s + 1.0
        {
            let overdue = duration_text(overdue_s);
            (
                format!(
                    "its expected start passed {overdue} ago without it starting: it waits for \
                     the plan to be made again"
                ),
                format!("overdue by {overdue}, being re-planned"),
            )
        } else {
            let reservation = estimate.reservation.as_deref();
            let short = if p50_in_s < 1.0 {
                "at its next attempt".to_string()
            } else {
                format!(
                    "in about {} (90% within {})",
                    duration_text(p50_in_s),
                    duration_text(p90_in_s.max(p50_in_s))
                )
            };
            let mut text = estimate_text(p50_in_s, p90_in_s, reservation, p50_ms);
            if waiting_for.is_some() && p50_in_s < 1.0 {
                // Its latest attempt was refused: the plan expects what refused it to give way
                // by then, so the room is not "free now" (a reservation's words stay).
                text = text.replacen(FREE_NOW, "expected to start at one of its next attempts", 1);
            }
            (text, short)
        };
        if let Some(waiting_for) = waiting_for {
            text.push_str(&format!("; until then it waits for {waiting_for}"));
        }
        Self {
            p10_ms,
            p50_ms,
            p90_ms,
            reservation: estimate.reservation.clone(),
            text,
            short,
            waiting_for: waiting_for.map(str::to_string),
        }
    }
}

/// What [`estimate_text`] says of a start planned for now.
const FREE_NOW: &str = "room for it is free now: it is expected to start at its next attempt";

/// "expected to start in about 2 h 10 min, 90% within 5 h; it holds a reservation on 16 nodes
/// in rack 3 from 14:20 UTC".
pub fn estimate_text(
    p50_in_s: f64,
    p90_in_s: f64,
    reservation: Option<&str>,
    p50_at_ms: u64,
) -> String {
    let mut text = if p50_in_s < 1.0 {
        FREE_NOW.to_string()
    } else {
        format!(
            "expected to start in about {}, 90% within {}",
            duration_text(p50_in_s),
            duration_text(p90_in_s.max(p50_in_s))
        )
    };
    if let Some(nodes) = reservation {
        let minutes = (p50_at_ms / 60_000) % (24 * 60);
        text.push_str(&format!(
            "; it holds a reservation on {nodes} from {:02}:{:02} UTC",
            minutes / 60,
            minutes % 60
        ));
    }
    text
}

/// The shape a what-if was answered for, as the caller reads it back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WhatIfShape {
    /// Its queue.
    pub queue: String,
    /// Pods in the gang.
    pub pods: u32,
    /// GPUs per pod.
    pub gpus_per_pod: u32,
    /// The GPU model asked for; `""` = any.
    pub gpu_type: String,
}

/// One answer: for the shape asked about, or for one variation of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WhatIfOutcome {
    /// What changed from the shape asked about (`""` for the shape itself).
    pub change: String,
    /// The shape answered for.
    pub job: WhatIfShape,
    /// When it would start; `None` when it would not fit the cluster at all, or when the
    /// forecast did not reach it (the text says how far ahead it looked).
    pub estimate: Option<EstimateView>,
    /// With no `estimate` because the forecast did not reach it: the earliest it could start
    /// (ms since the epoch): past the forecast's reach, the work ahead of it on the most GPUs
    /// its queue may use, and the estimates of the jobs ahead. Shown on hover, and what a
    /// client compares with the estimates of the jobs ahead.
    #[serde(default)]
    pub not_before_ms: Option<u64>,
    /// Where, e.g. "16 nodes in rack 3".
    pub nodes: Option<String>,
    /// Its runtime as the planner expects it: p10, p50, p90 seconds, and where that came from.
    pub runtime: gantry_core::RuntimeEstimate,
    /// "would start in about 40 min, 90% within 2 h, behind the 12 pending jobs of queue rl
    /// ahead of it", or why no start is given.
    pub text: String,
}

/// The answer to `POST /api/whatif`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WhatIfAnswer {
    /// When the loop was asked (ms since the epoch).
    pub at_ms: u64,
    /// Pending jobs of its queue tried before it (without a forecast, the jobs the plan puts
    /// ahead of it).
    pub jobs_ahead: usize,
    /// For the shape asked about.
    pub answer: WhatIfOutcome,
    /// With `variations`: the variations, soonest start first.
    pub variations: Vec<WhatIfOutcome>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn estimate(planned_at_s: f64, p50_s: f64) -> StartEstimate {
        StartEstimate {
            planned_at_s,
            p10_s: p50_s,
            p50_s,
            p90_s: p50_s + 600.0,
            reservation: None,
        }
    }

    #[test]
    fn a_passed_estimate_says_it_passed_not_that_room_is_free() {
        // Planned at 0 s for 1,000 s; seen at 1,300 s with the job still pending.
        let view = EstimateView::new(&estimate(0.0, 1_000.0), 1_300.0, 5_000_000, None);
        assert_eq!(
            view.text,
            "its expected start passed 5 min ago without it starting: it waits for the plan to \
             be made again"
        );
        assert_eq!(view.short, "overdue by 5 min, being re-planned");
        // Planned to start at once: room for it is free, as the plan said.
        let now = EstimateView::new(&estimate(1_300.0, 1_300.0), 1_300.0, 5_000_000, None);
        assert!(
            now.text.starts_with("room for it is free now"),
            "{}",
            now.text
        );
        // Ahead: a duration from now.
        let later = EstimateView::new(&estimate(1_000.0, 3_700.0), 1_300.0, 5_000_000, None);
        assert_eq!(later.short, "in about 40 min (90% within 50 min)");
    }

    #[test]
    fn a_refused_job_s_estimate_says_what_it_waits_for_and_never_that_room_is_free() {
        let quota = "quota: queue rl is at its quota of 16 GPUs";
        // Planned to start at once, but its latest attempt was refused.
        let now = EstimateView::new(&estimate(1_300.0, 1_300.0), 1_300.0, 5_000_000, Some(quota));
        assert_eq!(
            now.text,
            "expected to start at one of its next attempts; until then it waits for quota: queue \
             rl is at its quota of 16 GPUs"
        );
        assert_eq!(now.waiting_for.as_deref(), Some(quota));
        // A reservation due now keeps its words.
        let reserved = StartEstimate {
            reservation: Some("16 nodes in rack 3".into()),
            ..estimate(1_300.0, 1_300.0)
        };
        let held = EstimateView::new(&reserved, 1_300.0, 5_000_000, Some(quota));
        assert!(
            held.text.starts_with(
                "expected to start at one of its next attempts; it holds a reservation on 16 \
                 nodes in rack 3 from "
            ),
            "{}",
            held.text
        );
        let later = EstimateView::new(&estimate(1_000.0, 3_700.0), 1_300.0, 5_000_000, Some(quota));
        assert_eq!(
            later.text,
            "expected to start in about 40 min, 90% within 50 min; until then it waits for quota: \
             queue rl is at its quota of 16 GPUs"
        );
        let overdue = EstimateView::new(&estimate(0.0, 1_000.0), 1_300.0, 5_000_000, Some(quota));
        assert!(
            overdue
                .text
                .ends_with(&format!("; until then it waits for {quota}"))
        );
        assert!(
            overdue
                .text
                .starts_with("its expected start passed 5 min ago")
        );
    }
}
