//! Rejects nodes with a reason code it never declared at init.
use gantry_policy_sdk::prelude::*;

pub struct Vague;

impl FilterPolicy for Vague {
    const NAME: &'static str = "hostile-undeclared-reason";
    const REASONS: &'static [(u16, &'static str)] = &[(1, "declared")];
    fn new(_config: &str) -> Result<Self, String> {
        Ok(Self)
    }
    fn filter(&self, _pod: &Pod, _node: &Node) -> u16 {
        77
    }
}

gantry_policy_sdk::export_filter!(Vague);
