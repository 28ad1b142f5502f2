"""{{name}}: a filter policy. A node fits when it is healthy and, after the pod's GPUs, still
has `reserve_gpus` GPUs free. Config (optional): {"reserve_gpus": 0}."""

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import types

from gantry_policy import FITS, HEALTHY, parse_config

NAME = "{{name}}"
# Reason codes: each verdict other than FITS names one, and init declares its text.
NOT_HEALTHY = 1
NOT_ENOUGH_GPUS = 2
REASONS = [
    types.Reason(NOT_HEALTHY, "node is not healthy"),
    types.Reason(NOT_ENOUGH_GPUS, "not enough free GPUs"),
]

# Module state: init runs once per instance, before any filter call.
reserve_gpus = 0


class FilterPolicy(exports.FilterPolicy):
    def init(self, config: str) -> types.PolicyInfo:
        global reserve_gpus
        try:
            reserve_gpus = parse_config(NAME, config, {"reserve_gpus": 0})["reserve_gpus"]
        except ValueError as e:
            raise Err(str(e))
        return types.PolicyInfo(NAME, "0.1.0", REASONS)

    def filter(self, pod: types.Pod, nodes: types.Nodes) -> list[int]:
        need = pod.gpus + reserve_gpus
        return [
            NOT_HEALTHY if health != HEALTHY else NOT_ENOUGH_GPUS if free < need else FITS
            for health, free in zip(nodes.health, nodes.gpu_free)
        ]
