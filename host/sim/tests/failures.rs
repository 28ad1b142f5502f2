//! Node failures in the replay, on `tests/scenarios/gang-burst` (32 nodes): a failure model
//! fast enough that failures hit running gangs, under Gantry and every anchor, and a
//! correlated burst that the breaker must stop. Correctness only; the figures come from
//! `gantry bench failures`.

use gantry_core::{BuiltinOnly, Mode, Symbols};
use gantry_sim::{ClusterSpec, FailureModel, Replay, ReplayOptions, Report, Trace};

const SCENARIO: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/scenarios/gang-burst"
);

fn run(mode: Mode, model: &str, time_scale: f64) -> Report {
    let spec = ClusterSpec::load(format!("{SCENARIO}/cluster.yaml")).expect("cluster");
    let symbols = Symbols::new();
    let cluster = spec.build(&symbols);
    let mut jobs = Trace::load(format!("{SCENARIO}/trace.csv")).expect("trace");
    for job in &mut jobs {
        job.submit_s /= time_scale;
    }
    let model: FailureModel = serde_yaml::from_str(model).expect("model");
    model.validate().expect("a valid model");
    let mut options = ReplayOptions {
        // Every cycle is audited: no GPU counted twice, every gang whole.
        audit: true,
        failures: Some(model),
        default_checkpoint_s: Some(1800.0),
        ..ReplayOptions::default()
    };
    options.scheduler.mode = mode;
    options.plan.forecast_every_s = f64::INFINITY;
    let replay = Replay::new(cluster, "gang-burst", jobs, symbols, options).expect("replay");
    replay
        .run(&mut BuiltinOnly, &mut |_| {}, &mut |_| {})
        .expect("no audit failure")
}

#[test]
fn failures_hit_gangs_and_every_stopped_job_restarts_and_finishes() {
    // A node fails every few hours on 32 nodes: several hit running gangs.
    let model = "{mtbf_node_days: 4, repair_s: 3600, preflight_s: 300}";
    for mode in [
        Mode::Gantry,
        Mode::Kueue,
        Mode::Coscheduling {
            permit_timeout_s: 60.0,
        },
        Mode::K8sDefault,
    ] {
        let report = run(mode, model, 0.2);
        let f = report.failures.as_ref().expect("a failure report");
        println!(
            "{}: {} jobs stopped, restart p50 {} s p99 {} s, goodput {}, lost {} GPU-h",
            report.scheduler,
            f.jobs_stopped,
            f.failure_to_restart_wait.p50_s,
            f.failure_to_restart_wait.p99_s,
            f.goodput,
            f.gpu_hours_lost_to_failures
        );
        assert!(
            f.jobs_stopped > 0,
            "{}: no failure hit a job",
            report.scheduler
        );
        if mode == Mode::Gantry {
            // Every job ran to its end, restarted ones included, and never in part.
            assert_eq!(report.jobs_finished, report.jobs_submitted);
            assert_eq!(report.partial_gangs, 0);
            assert_eq!(f.gpu_hours_idle_while_halted, 0.0);
            assert!(f.failure_to_restart_wait.p50_s < 600.0);
        } else {
            // An anchor's gang holds its GPUs until its collective times out.
            assert!(f.gpu_hours_idle_while_halted > 0.0, "{}", report.scheduler);
            assert!(
                f.failure_to_restart_wait.p50_s >= 600.0,
                "{}",
                report.scheduler
            );
        }
        assert!(f.goodput > 0.0 && f.goodput < 1.0, "{}", f.goodput);
    }
}

#[test]
fn a_correlated_burst_trips_the_breaker_and_cordons_at_most_the_cap() {
    // 40% of the nodes report within one minute, an hour in.
    let model = "{burst: {at_s: 3600, share: 0.4, within_s: 60}, health: {max_out_share: 0.1}}";
    let report = run(Mode::Gantry, model, 1.0);
    let f = report.failures.as_ref().expect("a failure report");
    let trip = f.breaker_tripped.as_ref().expect("the breaker tripped");
    assert!(trip.reason.contains("over the 10% cap"), "{}", trip.reason);
    // 10% of 32 nodes: 3.
    assert!(f.peak_nodes_out <= 3, "{} nodes out", f.peak_nodes_out);
    assert_eq!(f.signals.get("cordoned"), Some(&3));
    assert_eq!(f.signals.get("held_by_breaker"), Some(&10));
    assert_eq!(report.jobs_finished, report.jobs_submitted);
}

#[test]
fn an_event_on_an_unknown_node_is_refused_naming_it() {
    let spec = ClusterSpec::load(format!("{SCENARIO}/cluster.yaml")).expect("cluster");
    let symbols = Symbols::new();
    let cluster = spec.build(&symbols);
    let model: FailureModel =
        serde_yaml::from_str("{events: [{at_s: 5, node: nope-7}]}").expect("model");
    let options = ReplayOptions {
        failures: Some(model),
        ..ReplayOptions::default()
    };
    let error = Replay::new(cluster, "t", Vec::new(), symbols, options)
        .err()
        .expect("refused");
    assert!(
        error
            .to_string()
            .contains("field events[0].node: the cluster has no node \"nope-7\""),
        "{error}"
    );
}
