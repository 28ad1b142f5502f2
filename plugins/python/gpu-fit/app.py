"""gpu-fit, in Python: the node has enough free GPUs of the requested type, is healthy, has the
CPU and memory the pod asks for, and every taint that keeps pods off is tolerated. The same
answers as plugins/gpu-fit (Rust); plugins/cases/gpu-fit checks both."""

from wit_world import exports
from wit_world.imports import types

from gantry_policy import FITS, HEALTHY, tolerated_sets

NOT_HEALTHY = 1
WRONG_GPU_TYPE = 2
NOT_ENOUGH_GPUS = 3
TAINT_NOT_TOLERATED = 4
NOT_ENOUGH_CPU_OR_MEMORY = 5

REASONS = [
    types.Reason(NOT_HEALTHY, "node not ready or not healthy"),
    types.Reason(WRONG_GPU_TYPE, "GPU type does not match"),
    types.Reason(NOT_ENOUGH_GPUS, "Insufficient nvidia.com/gpu"),
    types.Reason(TAINT_NOT_TOLERATED, "node has a taint the pod does not tolerate"),
    types.Reason(NOT_ENOUGH_CPU_OR_MEMORY, "Insufficient cpu or memory"),
]


class FilterPolicy(exports.FilterPolicy):
    def init(self, config: str) -> types.PolicyInfo:
        return types.PolicyInfo("gpu-fit", "0.1.0", REASONS)

    def filter(self, pod: types.Pod, nodes: types.Nodes) -> list[int]:
        tolerated = tolerated_sets(pod, nodes)
        tolerated.append(True)  # a taint set index past the end reads as no taints
        last = len(tolerated) - 1
        want_type = pod.gpu_type
        milli, gpus = pod.gpu_milli, pod.gpus
        cpu, memory = pod.cpu_milli, pod.memory_mib
        verdicts = []
        push = verdicts.append
        for health, gpu_type, free, milli_free, cpu_free, memory_free, taint_set in zip(
            nodes.health,
            nodes.gpu_type,
            nodes.gpu_free,
            nodes.gpu_milli_free_max,
            nodes.cpu_free_milli,
            nodes.memory_free_mib,
            nodes.taint_set,
        ):
            if health != HEALTHY:
                push(NOT_HEALTHY)
            elif want_type and gpu_type != want_type:
                push(WRONG_GPU_TYPE)
            elif (milli_free < milli) if milli else (free < gpus):
                push(NOT_ENOUGH_GPUS)
            elif cpu_free < cpu or memory_free < memory:
                push(NOT_ENOUGH_CPU_OR_MEMORY)
            elif not tolerated[min(taint_set, last)]:
                push(TAINT_NOT_TOLERATED)
            else:
                push(FITS)
        return verdicts
