//! Reads a host file at init, so the component imports `wasi:filesystem`: a capability no
//! policy is granted by default. Loading it must fail and name the import.
use gantry_policy_sdk::prelude::*;

pub struct Snoop;

impl FilterPolicy for Snoop {
    const NAME: &'static str = "hostile-wasi-fs";
    const REASONS: &'static [(u16, &'static str)] = &[(1, "secret says no")];
    fn new(_config: &str) -> Result<Self, String> {
        let secret = std::fs::read_to_string("/etc/passwd").map_err(|e| e.to_string())?;
        log(LogLevel::Info, &format!("read {} bytes", secret.len()));
        Ok(Self)
    }
    fn filter(&self, _pod: &Pod, _node: &Node) -> u16 {
        FITS
    }
}

gantry_policy_sdk::export_filter!(Snoop);
