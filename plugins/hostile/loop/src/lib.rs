//! Loops forever in `filter`: the epoch deadline must stop it.
use gantry_policy_sdk::prelude::*;

pub struct Spin;

impl FilterPolicy for Spin {
    const NAME: &'static str = "hostile-loop";
    const REASONS: &'static [(u16, &'static str)] = &[];
    fn new(_config: &str) -> Result<Self, String> {
        Ok(Self)
    }
    fn filter(&self, _pod: &Pod, node: &Node) -> u16 {
        let mut n = node.gpu_free() as u64;
        loop {
            n = std::hint::black_box(n.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

gantry_policy_sdk::export_filter!(Spin);
