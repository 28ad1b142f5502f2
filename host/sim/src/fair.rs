//! Max-min fair targets: what each queue could hold at one instant given what it asks for, so
//! that a queue's GPU share can be told apart from "it had nothing to run" and "it was starved".
//!
//! The rule, down the queue tree, among the siblings sharing `C` GPUs (the whole cluster for
//! the top-level queues, a cohort's own target for its children):
//! 1. each queue's *cap* is its demand (GPUs of its pending and running jobs, its children's
//!    summed for a cohort), and no more than its nominal quota plus its borrowing limit when it
//!    declares one;
//! 2. each queue is first given `min(cap, nominal)`: nominal quota is guaranteed, as in Kueue
//!    and in Gantry's own quota (a queue within its nominal quota reclaims what others borrowed).
//!    Should the guarantees exceed `C` (quotas oversubscribed), they are scaled down to fit;
//! 3. what is left of `C` is water-filled by weight among the queues whose cap is not yet met:
//!    each takes a share of the rest in proportion to its weight, a queue that needs less than
//!    its share keeps only what it needs, and the excess is shared again among the others.
//!
//! Lending limits are not modelled: a queue's idle nominal quota is all lendable here. Jobs
//! placed in a cohort itself (not in one of its children) are served before its children.

use gantry_core::{QueueId, Queues};

/// Each queue's max-min fair target in GPUs, given each queue's own demand in GPUs (jobs
/// submitted to that very queue, pending or running) and the cluster's GPUs.
pub fn max_min_targets(queues: &Queues, own_demand: &[u64], capacity: u64) -> Vec<f64> {
    let n = queues.len();
    // Demand down the tree: a queue's own plus its children's.
    let mut demand = vec![0u64; n];
    for q in queues.ids() {
        let mut at = Some(q);
        while let Some(a) = at {
            demand[a] += own_demand[q];
            at = queues.parent(a);
        }
    }
    let cap: Vec<f64> = queues
        .ids()
        .map(|q| {
            let limit = queues
                .def(q)
                .borrowing_limit_gpus
                .map_or(u64::MAX, |b| queues.nominal(q).saturating_add(b));
            demand[q].min(limit) as f64
        })
        .collect();
    let mut target = vec![0.0; n];
    let roots: Vec<QueueId> = queues
        .ids()
        .filter(|&q| queues.parent(q).is_none())
        .collect();
    share(
        queues,
        &roots,
        capacity as f64,
        &cap,
        own_demand,
        &mut target,
    );
    target
}

/// Share `total` among `siblings` (rules 2 and 3), then recurse into each one's children.
fn share(
    queues: &Queues,
    siblings: &[QueueId],
    total: f64,
    cap: &[f64],
    own_demand: &[u64],
    target: &mut [f64],
) {
    let guaranteed: Vec<f64> = siblings
        .iter()
        .map(|&q| cap[q].min(queues.nominal(q) as f64))
        .collect();
    let sum: f64 = guaranteed.iter().sum();
    let scale = if sum > total && sum > 0.0 {
        total / sum
    } else {
        1.0
    };
    for (&q, g) in siblings.iter().zip(&guaranteed) {
        target[q] = g * scale;
    }
    let mut rest = (total - sum * scale).max(0.0);
    let mut open: Vec<QueueId> = siblings
        .iter()
        .copied()
        .filter(|&q| cap[q] > target[q])
        .collect();
    // Water-filling: each round either hands out all that is left or fills at least one queue
    // to its cap, so it ends within `siblings.len()` rounds.
    while rest > 1e-9 && !open.is_empty() {
        let weights: f64 = open
            .iter()
            .map(|&q| f64::from(queues.def(q).weight.max(1)))
            .sum();
        let mut handed = 0.0;
        let mut still_open = Vec::with_capacity(open.len());
        for &q in &open {
            let offer = rest * f64::from(queues.def(q).weight.max(1)) / weights;
            let need = cap[q] - target[q];
            if need <= offer {
                target[q] = cap[q];
                handed += need;
            } else {
                target[q] += offer;
                handed += offer;
                still_open.push(q);
            }
        }
        rest -= handed;
        if still_open.len() == open.len() {
            break; // every queue took its full offer: nothing is left
        }
        open = still_open;
    }
    for &q in siblings {
        let children = queues.children(q);
        if !children.is_empty() {
            let own = (own_demand[q] as f64).min(target[q]);
            share(queues, children, target[q] - own, cap, own_demand, target);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_core::{QueueDef, Resources};

    fn def(name: &str, parent: Option<&str>, nominal: u64, weight: u32) -> QueueDef {
        QueueDef {
            name: name.into(),
            parent: parent.map(Into::into),
            nominal_gpus: nominal,
            weight,
            borrowing_limit_gpus: None,
            lending_limit_gpus: None,
            reclaim: gantry_core::Reclaim::Never,
        }
    }

    fn tree(defs: &[QueueDef], gpus: u64) -> Queues {
        Queues::new(defs, Resources::gpus(gpus), 3600.0).unwrap()
    }

    #[test]
    fn a_queue_below_its_quota_keeps_its_demand_and_the_rest_goes_by_weight() {
        let q = tree(
            &[
                def("a", None, 40, 1),
                def("b", None, 40, 3),
                def("c", None, 20, 1),
            ],
            100,
        );
        // c asks for 5 of its 20: it keeps 5, and a and b share the other 95 by weight
        // beyond their 40 each: 15 spare, 3.75 to a and 11.25 to b.
        let t = max_min_targets(&q, &[1000, 1000, 5], 100);
        assert_eq!(t, vec![43.75, 51.25, 5.0]);
        // Nobody asks for anything: no target.
        assert_eq!(max_min_targets(&q, &[0, 0, 0], 100), vec![0.0; 3]);
    }

    #[test]
    fn water_filling_redistributes_what_a_capped_queue_cannot_use() {
        let mut b = def("b", None, 0, 1);
        b.borrowing_limit_gpus = Some(10);
        let q = tree(&[def("a", None, 0, 1), b, def("c", None, 0, 1)], 90);
        // Equal weights would give 30 each; b may hold only 10, so a and c get 40.
        assert_eq!(
            max_min_targets(&q, &[100, 100, 100], 90),
            vec![40.0, 10.0, 40.0]
        );
    }

    #[test]
    fn a_cohort_shares_its_own_target_among_its_children() {
        let q = tree(
            &[
                def("research", None, 0, 1),
                def("pretraining", Some("research"), 128, 2),
                def("rl", Some("research"), 64, 1),
                def("applied", None, 64, 1),
            ],
            256,
        );
        // applied is idle: research may use all 256; rl asks for 16 only.
        let t = max_min_targets(&q, &[0, 1000, 16, 0], 256);
        assert_eq!(t, vec![256.0, 240.0, 16.0, 0.0]);
    }
}
