//! `gpu-fit`: the node has enough free GPUs of the requested type, is healthy, and every taint
//! that keeps pods off is tolerated. CPU and memory are checked too when the pod asks for them.

use gantry_policy_sdk::prelude::*;

pub struct GpuFit;

pub const NOT_HEALTHY: u16 = 1;
pub const WRONG_GPU_TYPE: u16 = 2;
pub const NOT_ENOUGH_GPUS: u16 = 3;
pub const TAINT_NOT_TOLERATED: u16 = 4;
pub const NOT_ENOUGH_CPU_OR_MEMORY: u16 = 5;

impl FilterPolicy for GpuFit {
    const NAME: &'static str = "gpu-fit";
    const REASONS: &'static [(u16, &'static str)] = &[
        (NOT_HEALTHY, "node not ready or not healthy"),
        (WRONG_GPU_TYPE, "GPU type does not match"),
        (NOT_ENOUGH_GPUS, "Insufficient nvidia.com/gpu"),
        (
            TAINT_NOT_TOLERATED,
            "node has a taint the pod does not tolerate",
        ),
        (NOT_ENOUGH_CPU_OR_MEMORY, "Insufficient cpu or memory"),
    ];

    fn new(_config: &str) -> Result<Self, String> {
        Ok(Self)
    }

    fn filter(&self, pod: &Pod, node: &Node) -> u16 {
        if node.health() != Health::Healthy {
            NOT_HEALTHY
        } else if pod.gpu_type().is_some_and(|t| t != node.gpu_type()) {
            WRONG_GPU_TYPE
        } else if !node.has_gpus_for(pod) {
            NOT_ENOUGH_GPUS
        } else if node.cpu_free_milli() < pod.cpu_milli()
            || node.memory_free_mib() < pod.memory_mib()
        {
            NOT_ENOUGH_CPU_OR_MEMORY
        } else if !pod.tolerates_all(node.taints()) {
            TAINT_NOT_TOLERATED
        } else {
            FITS
        }
    }
}

gantry_policy_sdk::export_filter!(GpuFit);
