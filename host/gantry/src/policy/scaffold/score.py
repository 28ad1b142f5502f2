"""{{name}}: a score policy. Scores each node 0 to 100 by how full its GPUs would be with the
pod on it: fuller first packs pods together and keeps whole nodes free for big jobs;
{"spread": true} prefers emptier nodes instead. For a gang, Gantry adds the scores of a
topology domain's best nodes, so packing also steers gangs into fuller racks."""

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import types

from gantry_policy import parse_config

NAME = "{{name}}"
MAX_SCORE = 100

# Module state: init runs once per instance, before any score call.
spread = False


class ScorePolicy(exports.ScorePolicy):
    def init(self, config: str) -> types.PolicyInfo:
        global spread
        try:
            spread = parse_config(NAME, config, {"spread": False})["spread"]
        except ValueError as e:
            raise Err(str(e))
        return types.PolicyInfo(NAME, "0.1.0", [])

    def score(self, pod: types.Pod, nodes: types.Nodes) -> list[int]:
        scores = []
        for total, free in zip(nodes.gpu_total, nodes.gpu_free):
            if total == 0:
                scores.append(0)
                continue
            free = min(free, total)
            full = MAX_SCORE * (total - free + min(pod.gpus, free)) // total
            scores.append(MAX_SCORE - full if spread else full)
        return scores
