//! What the plan learns from its own estimates: how first estimated waits compared with the
//! waits that followed ([`Calibration`]), and which jobs got their first estimate
//! ([`FirstEstimates`]).

use super::*;

/// Samples of actual wait over first estimated wait needed before estimates are calibrated.
pub(super) const CALIBRATE_AFTER: usize = 20;

/// How the plan's first estimates of waits compared with the waits that followed, over the
/// last jobs that started: the plan cannot see arrivals of higher priority, preemptions or
/// jobs ending early, so its raw waits are biased and its interval too narrow. Reported
/// estimates scale the planned wait by the ratio's p10, p50 and p90 (split conformal
/// prediction), learned only from jobs that already started.
#[derive(Debug, Clone, Default)]
pub(in crate::scheduler) struct Calibration {
    pub(super) ratios: Runtimes,
}

impl Calibration {
    /// A job planned to wait `estimated` seconds waited `actual`.
    pub(super) fn observe(&mut self, actual: f64, estimated: f64) {
        // A wait planned as none has no ratio; the floor keeps tiny plans from dominating.
        if estimated >= 1.0 && actual.is_finite() && actual >= 0.0 {
            self.ratios.add(actual / estimated);
        }
    }

    /// The reported (p10, p50, p90) start for a raw plan `start` made at `now_s`.
    pub(super) fn apply(&self, now_s: f64, start: (f64, f64, f64)) -> (f64, f64, f64) {
        let wait = start.1 - now_s;
        match self.ratios.quantiles() {
            Some((q10, q50, q90))
                if self.ratios.samples.len() >= CALIBRATE_AFTER && wait >= 1.0 =>
            {
                (now_s + q10 * wait, now_s + q50 * wait, now_s + q90 * wait)
            }
            _ => start,
        }
    }
}

/// Which pending jobs have had a start estimate, and which got their first since the last
/// cycle's output listed them (see [`crate::CycleOutput::newly_estimated`]).
#[derive(Debug, Clone, Default)]
pub(in crate::scheduler) struct FirstEstimates {
    /// Pending jobs that have had an estimate: each is listed once.
    pub(super) estimated: BTreeSet<JobId>,
    /// Jobs whose first estimate came since the last [`FirstEstimates::take`].
    pub(super) newly: Vec<JobId>,
}

impl FirstEstimates {
    /// `id` has an estimate now: listed as newly estimated if it is its first.
    pub(super) fn note(&mut self, id: JobId) {
        if self.estimated.insert(id) {
            self.newly.push(id);
        }
    }

    /// `id` started or went: it is no longer pending.
    pub(super) fn forget(&mut self, id: JobId) {
        self.estimated.remove(&id);
    }

    /// The jobs newly estimated since the last call that `still_estimated` says still have
    /// an estimate; one that lost it before being listed is listed when it has one again.
    pub(super) fn take(&mut self, still_estimated: impl Fn(JobId) -> bool) -> Vec<JobId> {
        let mut newly = std::mem::take(&mut self.newly);
        newly.retain(|&id| {
            let estimated = still_estimated(id);
            if !estimated {
                self.estimated.remove(&id);
            }
            estimated
        });
        newly
    }
}
