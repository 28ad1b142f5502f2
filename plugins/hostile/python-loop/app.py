"""A hostile filter in Python: init is fine, every filter call loops forever. The host must
stop it at the same epoch deadline as the Rust hostile loop (plugins/hostile/loop)."""

from wit_world import exports
from wit_world.imports import types


class FilterPolicy(exports.FilterPolicy):
    def init(self, config: str) -> types.PolicyInfo:
        return types.PolicyInfo("hostile-python-loop", "0.1.0", [types.Reason(1, "never")])

    def filter(self, pod: types.Pod, nodes: types.Nodes) -> list[int]:
        spins = 0
        while True:
            spins += 1
