//! Recurses without bound: the Wasm stack limit must stop it.
use gantry_policy_sdk::prelude::*;

pub struct Deep;

#[inline(never)]
#[allow(unconditional_recursion)]
fn descend(depth: u64) -> u64 {
    std::hint::black_box(descend(std::hint::black_box(depth + 1))) + 1
}

impl FilterPolicy for Deep {
    const NAME: &'static str = "hostile-recursion";
    const REASONS: &'static [(u16, &'static str)] = &[];
    fn new(_config: &str) -> Result<Self, String> {
        Ok(Self)
    }
    fn filter(&self, _pod: &Pod, node: &Node) -> u16 {
        descend(node.gpu_free() as u64) as u16
    }
}

gantry_policy_sdk::export_filter!(Deep);
