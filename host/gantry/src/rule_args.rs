//! The flags that pin the reservation rule and the placement's use of balloons for a
//! cluster, shared by `gantry simulate` and `gantry serve`: one set of names and checks, so a
//! setting tried in a replay carries over to the live scheduler as it is.

use clap::Args;
use gantry_core::PlanConfig;

/// The reservation rule's settings (see [`gantry_core::scheduler::plan::ReservationRule`]);
/// absent, the adaptive rule derives each from the learned runtimes.
#[derive(Args, Debug, Clone, Default)]
pub struct RuleArgs {
    /// Pin the age threshold: a job waiting longer than this (seconds) gets a reservation of
    /// nodes and quota whatever blocks it, while the backlog gate is open (0 reserves for a
    /// job as soon as it is blocked, as Slurm's EASY backfill does for the head of the queue).
    /// By default it is three learned p90 runtimes (the README's planner section).
    #[arg(long, value_name = "S")]
    pub reserve_after_s: Option<f64>,
    /// Pin the backlog gate: aged jobs get reservations only while the pending work is under
    /// this many seconds of the whole cluster (0 shuts it: no reservations). By default it is
    /// six learned p90 runtimes.
    #[arg(long, value_name = "S")]
    pub backlog_limit_s: Option<f64>,
    /// Place a gang on whatever free nodes hold it, never evicting balloons to keep it in one
    /// rack or block. By default balloons in one domain give way when its free nodes and
    /// theirs could hold a gang the free nodes alone would spread over several.
    #[arg(long)]
    pub no_balloons_for_topology: bool,
}

impl RuleArgs {
    /// Sets the pinned settings on `plan`, or names the flag that is not a number of seconds.
    pub fn apply(&self, plan: &mut PlanConfig) -> anyhow::Result<()> {
        for (flag, value) in [
            ("--reserve-after-s", self.reserve_after_s),
            ("--backlog-limit-s", self.backlog_limit_s),
        ] {
            anyhow::ensure!(
                value.is_none_or(|s| s.is_finite() && s >= 0.0),
                "{flag} must be a number of seconds, 0 or more"
            );
        }
        plan.reserve_after_s = self.reserve_after_s;
        plan.backlog_limit_s = self.backlog_limit_s;
        Ok(())
    }

    /// Sets the placement's use of balloons on the cycle's knobs.
    pub fn apply_to_cycle(&self, config: &mut gantry_core::SchedulerConfig) {
        config.balloons_for_topology = !self.no_balloons_for_topology;
    }

    /// [`RuleArgs::apply`] and [`RuleArgs::apply_to_cycle`] to `scheduler`, as `gantry
    /// serve` starts it.
    pub fn set_on(&self, scheduler: &mut gantry_core::Scheduler) -> anyhow::Result<()> {
        let mut plan = scheduler.plan_config().clone();
        self.apply(&mut plan)?;
        scheduler.set_plan_config(plan);
        self.apply_to_cycle(&mut scheduler.config);
        Ok(())
    }
}
