//! Allocates 1 MiB at a time and keeps it all: the linear-memory cap must stop it.
use gantry_policy_sdk::prelude::*;

pub struct Bomb;

impl FilterPolicy for Bomb {
    const NAME: &'static str = "hostile-memory-bomb";
    const REASONS: &'static [(u16, &'static str)] = &[];
    fn new(_config: &str) -> Result<Self, String> {
        Ok(Self)
    }
    fn filter(&self, _pod: &Pod, _node: &Node) -> u16 {
        let mut hoard: Vec<Vec<u8>> = Vec::new();
        loop {
            hoard.push(vec![1u8; 1 << 20]);
            std::hint::black_box(&hoard);
        }
    }
}

gantry_policy_sdk::export_filter!(Bomb);
