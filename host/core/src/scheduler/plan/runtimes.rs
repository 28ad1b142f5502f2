//! Runtime estimates: a job's runtime as it declares it, else as finished jobs of its class
//! (queue, gang size, GPUs per pod), its queue or the whole cluster took, else a wide prior
//! ([`RuntimeModel`]); and what is left of a running job's runtime given its age.

use super::*;

/// Finished runtimes kept per class (and per queue, and overall): enough for stable p90s,
/// small enough that a change of behaviour shows within a few hundred jobs.
pub(super) const SAMPLES: usize = 256;
/// Samples a class needs before its own distribution is used rather than its queue's.
pub(super) const MIN_SAMPLES: usize = 5;
/// With no history at all: about an hour, anywhere from minutes to a working day.
pub(super) const PRIOR: RuntimeEstimate = RuntimeEstimate {
    p10_s: 300.0,
    p50_s: 3600.0,
    p90_s: 28_800.0,
    source: EstimateSource::Prior,
};

/// Where a runtime estimate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub enum EstimateSource {
    /// The job said how long it runs (`gantry.dev/expected-runtime`, `expected_runtime_s`).
    Declared,
    /// Finished jobs of the same queue (and shape, when there were enough of them).
    Learned {
        /// How many finished jobs it rests on.
        samples: u32,
    },
    /// Nothing known yet: a wide prior.
    Prior,
}

/// A job's runtime as the planner believes it, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct RuntimeEstimate {
    /// As short as this (10%).
    pub p10_s: f64,
    /// Most likely about this long (the median).
    pub p50_s: f64,
    /// At most this long, 90% of the time.
    pub p90_s: f64,
    /// Where the figures came from.
    pub source: EstimateSource,
}

impl RuntimeEstimate {
    /// Its quantile `u` (in (0, 1)): log-linear through its p10, p50 and p90, and beyond them
    /// along the nearest segment.
    pub(super) fn quantile(&self, u: f64) -> f64 {
        let (l10, l50, l90) = (self.p10_s.ln(), self.p50_s.ln(), self.p90_s.ln());
        let slope = if u < 0.5 { l50 - l10 } else { l90 - l50 };
        (l50 + slope * (u - 0.5) / 0.4).exp()
    }

    /// One draw at quantile `u` (in (0, 1)) of what is left of a run that has lasted `age_s`:
    /// of the runtimes above the age, less the age.
    pub(super) fn remaining_at(&self, age_s: f64, u: f64) -> f64 {
        // The quantile the age is at, by bisection (the quantile function rises).
        let (mut below, mut above) = (0.0f64, 1.0f64);
        for _ in 0..48 {
            let mid = (below + above) / 2.0;
            if self.quantile(mid) <= age_s {
                below = mid;
            } else {
                above = mid;
            }
        }
        (self.quantile(below + u * (1.0 - below)) - age_s).max(0.0)
    }
}

/// A runtime class: queue, gang size (powers of two) and GPUs per pod.
pub(super) type Class = (QueueId, u8, u32);

/// Finished runtimes, newest last, and the same in ascending order (kept sorted as samples
/// come and go): quantiles of all of them, and of those longer than a running job's age.
#[derive(Debug, Clone, Default)]
pub(super) struct Runtimes {
    pub(super) samples: VecDeque<f32>,
    pub(super) sorted: Vec<f32>,
}

/// The p10, p50 and p90 of `sorted` (ascending, not empty), each less `minus`.
pub(super) fn quantiles_of(sorted: &[f32], minus: f64) -> (f64, f64, f64) {
    let at = |q: f64| f64::from(sorted[((sorted.len() - 1) as f64 * q).round() as usize]) - minus;
    (at(0.1), at(0.5), at(0.9))
}

impl Runtimes {
    pub(super) fn add(&mut self, runtime_s: f64) {
        if self.samples.len() == SAMPLES
            && let Some(oldest) = self.samples.pop_front()
        {
            let at = self.sorted.partition_point(|&x| x < oldest);
            self.sorted.remove(at);
        }
        let runtime = runtime_s as f32;
        self.samples.push_back(runtime);
        let at = self.sorted.partition_point(|&x| x < runtime);
        self.sorted.insert(at, runtime);
    }

    /// The p10, p50 and p90 of every sample, once there are [`MIN_SAMPLES`].
    pub(super) fn quantiles(&self) -> Option<(f64, f64, f64)> {
        (self.sorted.len() >= MIN_SAMPLES).then(|| quantiles_of(&self.sorted, 0.0))
    }

    pub(super) fn estimate(&self) -> Option<RuntimeEstimate> {
        let (p10_s, p50_s, p90_s) = self.quantiles()?;
        Some(RuntimeEstimate {
            p10_s,
            p50_s,
            p90_s,
            source: EstimateSource::Learned {
                samples: self.samples.len() as u32,
            },
        })
    }

    /// The finished runs longer than `age_s`.
    pub(super) fn longer_than(&self, age_s: f64) -> &[f32] {
        &self.sorted[self.sorted.partition_point(|&x| f64::from(x) <= age_s)..]
    }

    /// What is left of a run that has lasted `age_s` (p10, p50, p90): what the finished runs
    /// longer than that took beyond it. A run longer than all but a few finished ones is out
    /// on the tail, where runtimes are heavy-tailed and what is left is about as long as what
    /// has run (a Pareto tail of index 1: p10 age / 9, p50 age, p90 9 × age). Without this, a
    /// job past its median was expected to end at once, and a reservation behind a job that
    /// had run for days kept its nodes idle for it.
    pub(super) fn remaining(&self, age_s: f64) -> Option<(f64, f64, f64)> {
        if self.sorted.len() < MIN_SAMPLES {
            return None;
        }
        let longer = self.longer_than(age_s);
        Some(if longer.len() >= MIN_SAMPLES {
            quantiles_of(longer, age_s)
        } else {
            (age_s / 9.0, age_s, 9.0 * age_s)
        })
    }

    /// One draw of what is left of a run that has lasted `age_s`, at quantile `u` (in (0, 1))
    /// of the distribution [`Runtimes::remaining`] summarises.
    pub(super) fn remaining_at(&self, age_s: f64, u: f64) -> Option<f64> {
        if self.sorted.len() < MIN_SAMPLES {
            return None;
        }
        let longer = self.longer_than(age_s);
        Some(if longer.len() >= MIN_SAMPLES {
            let at = ((u * longer.len() as f64) as usize).min(longer.len() - 1);
            f64::from(longer[at]) - age_s
        } else {
            age_s * u / (1.0 - u)
        })
    }
}

/// What finished jobs took, by class, by queue and overall: the learned half of the estimates.
#[derive(Debug, Clone, Default)]
pub struct RuntimeModel {
    pub(super) class_to_runtimes: HashMap<Class, Runtimes>,
    pub(super) queue_to_runtimes: HashMap<QueueId, Runtimes>,
    pub(super) all: Runtimes,
}

pub(super) fn class_of(spec: &JobSpec) -> Class {
    let pods_class = 32 - spec.pods.max(1).leading_zeros();
    (spec.queue, pods_class as u8, spec.shape.gpus)
}

impl RuntimeModel {
    /// A job of `spec` ran for `runtime_s` and finished.
    pub fn observe(&mut self, spec: &JobSpec, runtime_s: f64) {
        if !runtime_s.is_finite() || runtime_s <= 0.0 || spec.balloon {
            return;
        }
        self.class_to_runtimes
            .entry(class_of(spec))
            .or_default()
            .add(runtime_s);
        self.queue_to_runtimes
            .entry(spec.queue)
            .or_default()
            .add(runtime_s);
        self.all.add(runtime_s);
    }

    /// The runtime of a job of `spec`: declared, else learned (its class, its queue, all
    /// jobs), else the prior.
    pub fn estimate(&self, spec: &JobSpec) -> RuntimeEstimate {
        if let Some(declared) = declared(spec) {
            return RuntimeEstimate {
                p10_s: declared,
                p50_s: declared,
                p90_s: declared,
                source: EstimateSource::Declared,
            };
        }
        self.learned(spec)
            .and_then(Runtimes::estimate)
            .unwrap_or(PRIOR)
    }

    /// The mean runtime of a job of `spec`: declared, else learned as [`RuntimeModel::estimate`]
    /// learns it, else the prior's median. What a Slurm-style start estimate plans by (the
    /// replay's estimate baseline), not what the planner does.
    pub fn mean_s(&self, spec: &JobSpec) -> f64 {
        if let Some(declared) = declared(spec) {
            return declared;
        }
        match self.learned(spec) {
            Some(runtimes) => {
                runtimes.sorted.iter().map(|&x| f64::from(x)).sum::<f64>()
                    / runtimes.sorted.len() as f64
            }
            None => PRIOR.p50_s,
        }
    }

    /// What is left (p10, p50, p90) of a job of `spec` that has run `age_s`, when its runtime
    /// is learned (see `Runtimes::remaining`); `None` when it is declared or only the prior.
    pub(super) fn remaining(&self, spec: &JobSpec, age_s: f64) -> Option<(f64, f64, f64)> {
        if declared(spec).is_some() {
            return None;
        }
        self.learned(spec)?.remaining(age_s)
    }

    /// One draw (at quantile `u`, in (0, 1)) of what is left of a job of `spec` that has run
    /// `age_s`: from the finished runs, else from the prior; `None` when its runtime is
    /// declared (a point, not a distribution).
    pub(in crate::scheduler) fn remaining_at(
        &self,
        spec: &JobSpec,
        age_s: f64,
        u: f64,
    ) -> Option<f64> {
        if declared(spec).is_some() {
            return None;
        }
        Some(match self.learned(spec) {
            Some(runtimes) => runtimes.remaining_at(age_s, u)?,
            None => PRIOR.remaining_at(age_s, u),
        })
    }

    /// What all finished jobs took: the cluster's typical runtime, which the adaptive
    /// reservation rule is measured in; the prior until there is history.
    pub fn typical(&self) -> RuntimeEstimate {
        self.all.estimate().unwrap_or(PRIOR)
    }

    /// The finished runs a job of `spec` is judged by: its class's, else its queue's, else
    /// all jobs', the first with enough samples.
    pub(super) fn learned(&self, spec: &JobSpec) -> Option<&Runtimes> {
        let enough = |runtimes: &&Runtimes| runtimes.sorted.len() >= MIN_SAMPLES;
        self.class_to_runtimes
            .get(&class_of(spec))
            .filter(enough)
            .or_else(|| self.queue_to_runtimes.get(&spec.queue).filter(enough))
            .or_else(|| Some(&self.all).filter(enough))
    }
}

/// The runtime a job of `spec` declares, if a usable one.
pub(super) fn declared(spec: &JobSpec) -> Option<f64> {
    spec.expected_runtime_s
        .filter(|d| d.is_finite() && *d > 0.0)
}
