//! Panics in `filter` when a pod asks for GPUs, and answers normally otherwise, so a test can
//! show the same policy trapping and then serving a good call on a fresh instance.
use gantry_policy_sdk::prelude::*;

pub struct Boom;

impl FilterPolicy for Boom {
    const NAME: &'static str = "hostile-panic";
    const REASONS: &'static [(u16, &'static str)] = &[];
    fn new(_config: &str) -> Result<Self, String> {
        Ok(Self)
    }
    fn filter(&self, pod: &Pod, _node: &Node) -> u16 {
        if pod.gpus() > 0 {
            panic!("hostile-panic: refusing pods that want {} GPUs", pod.gpus());
        }
        FITS
    }
}

gantry_policy_sdk::export_filter!(Boom);
