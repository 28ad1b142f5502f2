//! Shadow mode: a candidate set decides on the same state as the active one, binds nothing,
//! and the comparison names each job the two decide differently. Also what a cycle asks of
//! its hooks: only the nodes still in play, and nothing when there are none.

mod common;

use std::ops::Range;

use common::{Fixture, Pool};
use gantry_core::{
    BuiltinOnly, ClusterState, CohortUsage, DisagreementKind, JobRequest, PodShape, PolicyHooks,
    PolicyRef, QueueUsage, QuotaVerdict, Verdict, compare,
};

/// A candidate filter that keeps every pod out of the first `avoid` nodes.
struct AvoidFirst {
    avoid: usize,
}

impl PolicyHooks for AvoidFirst {
    fn policies(&self) -> Vec<PolicyRef> {
        Vec::new()
    }
    fn set_version(&self) -> u64 {
        2
    }
    fn filter(
        &mut self,
        _: &ClusterState,
        _: &PodShape,
        nodes: Range<usize>,
        _: &[bool],
    ) -> Vec<(String, Verdict<Vec<u16>>)> {
        let codes = nodes.map(|i| u16::from(i < self.avoid)).collect();
        vec![("avoid-first-rack".into(), Verdict::Answer(codes))]
    }
    fn reason_text(&self, _: usize, _: u16) -> String {
        "first rack is reserved".into()
    }
    fn score(
        &mut self,
        _: &ClusterState,
        _: &PodShape,
        _: Range<usize>,
        _: &[bool],
    ) -> Vec<(String, u32, Verdict<Vec<u32>>)> {
        Vec::new()
    }
    fn admit(
        &mut self,
        _: &JobRequest,
        _: &QueueUsage,
        _: Option<&CohortUsage>,
    ) -> Vec<(String, Verdict<QuotaVerdict>)> {
        Vec::new()
    }
}

#[test]
fn a_shadow_cycle_binds_nothing_and_reports_each_disagreement() {
    // 32 nodes of 8 H100s, racks of 16, one block.
    let mut fx = Fixture::single_queue(&[Pool::h100(32, 16, Some(2))], 1024);
    let single = fx.submit(fx.job("single", "default", 0, 1, 8));
    let gang = fx.submit(fx.job("gang-17x8", "default", 0, 17, 8));
    let before = fx.sched.state.nodes.gpu_free.clone();

    let shadow = fx
        .sched
        .shadow_cycle(fx.now_s, &mut AvoidFirst { avoid: 16 });
    // Nothing moved: the shadow ran on a copy.
    assert_eq!(fx.sched.state.nodes.gpu_free, before);
    assert_eq!(fx.sched.running().count(), 0);
    assert_eq!(fx.sched.pending().len(), 2);

    let active = fx.sched.cycle(fx.now_s, &mut BuiltinOnly);
    let disagreements = compare(&active, &shadow);
    let kinds: Vec<_> = disagreements.iter().map(|d| (d.job, d.kind)).collect();
    assert_eq!(
        kinds,
        vec![
            (single, DisagreementKind::OtherNodes),
            (gang, DisagreementKind::RejectedByCandidate)
        ]
    );
    let gang_view = &disagreements[1];
    assert_eq!(gang_view.active.domain.as_deref(), Some("block 0"));
    assert_eq!(gang_view.candidate.policy_set, 2);
    assert_eq!(
        gang_view.candidate.filters[1].rejected,
        vec![("first rack is reserved".to_string(), 16)]
    );
    // The same set in shadow agrees with itself.
    let mut again = Fixture::single_queue(&[Pool::h100(32, 16, Some(2))], 1024);
    again.submit(again.job("single", "default", 0, 1, 8));
    let shadow = again.sched.shadow_cycle(0.0, &mut BuiltinOnly);
    let active = again.sched.cycle(0.0, &mut BuiltinOnly);
    assert!(compare(&active, &shadow).is_empty());
}

/// Built-ins plus a budget that is spent after `calls` filter calls.
struct Budgeted {
    calls: usize,
    made: usize,
}

impl PolicyHooks for Budgeted {
    fn policies(&self) -> Vec<PolicyRef> {
        Vec::new()
    }
    fn set_version(&self) -> u64 {
        1
    }
    fn filter(
        &mut self,
        _: &ClusterState,
        _: &PodShape,
        nodes: Range<usize>,
        _: &[bool],
    ) -> Vec<(String, Verdict<Vec<u16>>)> {
        self.made += 1;
        vec![("slow".into(), Verdict::Answer(vec![0; nodes.len()]))]
    }
    fn reason_text(&self, _: usize, _: u16) -> String {
        String::new()
    }
    fn score(
        &mut self,
        _: &ClusterState,
        _: &PodShape,
        _: Range<usize>,
        _: &[bool],
    ) -> Vec<(String, u32, Verdict<Vec<u32>>)> {
        Vec::new()
    }
    fn admit(
        &mut self,
        _: &JobRequest,
        _: &QueueUsage,
        _: Option<&CohortUsage>,
    ) -> Vec<(String, Verdict<QuotaVerdict>)> {
        Vec::new()
    }
    fn budget_spent(&self) -> bool {
        self.made >= self.calls
    }
}

#[test]
fn a_spent_policy_budget_defers_the_rest_of_the_cycle_in_order() {
    let mut fx = Fixture::single_queue(&[Pool::h100(32, 16, Some(2))], 1024);
    let jobs: Vec<_> = (0..5)
        .map(|i| fx.submit(fx.job(&format!("job-{i}"), "default", 0, 1, 8)))
        .collect();
    let out = fx.sched.cycle(0.0, &mut Budgeted { calls: 2, made: 0 });
    assert!(out.budget_spent);
    let decided: Vec<_> = out.decisions.iter().map(|d| (d.job, d.placed)).collect();
    assert_eq!(decided, vec![(jobs[0], true), (jobs[1], true)]);
    // The three it did not reach are neither dropped nor parked: next cycle takes them, in
    // order, before anything else.
    assert_eq!(fx.sched.pending().len(), 3);
    let out = fx.sched.cycle(1.0, &mut Budgeted { calls: 10, made: 0 });
    assert!(!out.budget_spent);
    let decided: Vec<_> = out.decisions.iter().map(|d| (d.job, d.placed)).collect();
    assert_eq!(
        decided,
        vec![(jobs[2], true), (jobs[3], true), (jobs[4], true)]
    );
    // At least one job is tried even when the budget is spent from the start.
    let late = fx.submit(fx.job("late", "default", 0, 1, 8));
    let out = fx.sched.cycle(2.0, &mut Budgeted { calls: 0, made: 0 });
    assert_eq!(out.decisions.len(), 1);
    assert_eq!(out.decisions[0].job, late);
}

/// A filter and a score policy that let everything through and record which nodes each call
/// had in play.
#[derive(Default)]
struct Recording {
    filter_calls: Vec<Vec<usize>>,
    score_calls: Vec<Vec<usize>>,
}

fn playing(nodes: &std::ops::Range<usize>, in_play: &[bool]) -> Vec<usize> {
    nodes
        .clone()
        .filter(|&n| in_play[n - nodes.start])
        .collect()
}

impl PolicyHooks for Recording {
    fn policies(&self) -> Vec<PolicyRef> {
        ["filter", "score"]
            .into_iter()
            .map(|role| PolicyRef {
                name: format!("recording-{role}"),
                version: "1".into(),
                role: role.into(),
                weight: 1,
                sha256: String::new(),
            })
            .collect()
    }
    fn set_version(&self) -> u64 {
        3
    }
    fn filter(
        &mut self,
        _: &ClusterState,
        _: &PodShape,
        nodes: std::ops::Range<usize>,
        in_play: &[bool],
    ) -> Vec<(String, Verdict<Vec<u16>>)> {
        self.filter_calls.push(playing(&nodes, in_play));
        vec![(
            "recording-filter".into(),
            Verdict::Answer(vec![0; nodes.len()]),
        )]
    }
    fn reason_text(&self, _: usize, _: u16) -> String {
        String::new()
    }
    fn score(
        &mut self,
        _: &ClusterState,
        _: &PodShape,
        nodes: std::ops::Range<usize>,
        in_play: &[bool],
    ) -> Vec<(String, u32, Verdict<Vec<u32>>)> {
        self.score_calls.push(playing(&nodes, in_play));
        vec![(
            "recording-score".into(),
            1,
            Verdict::Answer(vec![50; nodes.len()]),
        )]
    }
    fn admit(
        &mut self,
        _: &JobRequest,
        _: &QueueUsage,
        _: Option<&CohortUsage>,
    ) -> Vec<(String, Verdict<QuotaVerdict>)> {
        Vec::new()
    }
}

#[test]
fn policies_are_asked_only_about_nodes_in_play_and_not_at_all_without_any() {
    // 32 nodes of 8 H100s; a gang fills the first 16.
    let mut fx = Fixture::single_queue(&[Pool::h100(32, 16, Some(2))], 1024);
    fx.submit(fx.job("fill", "default", 0, 16, 8));
    assert!(fx.sched.cycle(0.0, &mut BuiltinOnly).decisions[0].placed);
    let mut hooks = Recording::default();
    fx.submit(fx.job("single", "default", 0, 1, 8));
    assert!(fx.sched.cycle(1.0, &mut hooks).decisions[0].placed);
    let free: Vec<usize> = (16..32).collect();
    assert_eq!(hooks.filter_calls, vec![free.clone()]);
    assert_eq!(hooks.score_calls, vec![free]);
    // Now every node is full: the policies are not called, and the answer names the
    // built-in's reason alone, as when a policy rejects nothing.
    fx.submit(fx.job("rest", "default", 0, 15, 8));
    assert!(fx.sched.cycle(2.0, &mut BuiltinOnly).decisions[0].placed);
    let mut hooks = Recording::default();
    fx.submit(fx.job("late", "default", 0, 1, 8));
    let out = fx.sched.cycle(3.0, &mut hooks);
    assert!(!out.decisions[0].placed);
    assert!(hooks.filter_calls.is_empty() && hooks.score_calls.is_empty());
    let filters: Vec<&str> = out.decisions[0]
        .explanation
        .filters
        .iter()
        .map(|f| f.policy.as_str())
        .collect();
    assert_eq!(filters, ["builtin"]);
}
