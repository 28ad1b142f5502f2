"""gpu-binpack, in Python: prefer fuller nodes and fuller topology domains, so that whole nodes
and racks stay free for large gangs. Config (all optional): {"node_weight": 70,
"domain_weight": 30}. The integer arithmetic is the Rust policy's (plugins/gpu-binpack), step
for step, so both give the same scores; plugins/cases/gpu-binpack checks it."""

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import types

from gantry_policy import NO_DOMAIN, domain_used_pct, parse_config

DEFAULTS = {"node_weight": 70, "domain_weight": 30}


def recip(d):
    """2^32 / d rounded up: (x * recip(d)) >> 32 is x // d for the small x used here."""
    return -(-(1 << 32) // d)


# Module state: init runs once per instance, before any score call.
weights = (70, 30, recip(100))


class ScorePolicy(exports.ScorePolicy):
    def init(self, config: str) -> types.PolicyInfo:
        global weights
        try:
            values = parse_config("gpu-binpack", config, DEFAULTS)
        except ValueError as e:
            raise Err(str(e))
        node_weight, domain_weight = values["node_weight"], values["domain_weight"]
        total = node_weight + domain_weight
        if total == 0:
            raise Err("gpu-binpack config: node_weight and domain_weight are both 0")
        if total > 10_000:
            raise Err("gpu-binpack config: node_weight + domain_weight must be at most 10000")
        weights = (node_weight, domain_weight, recip(total))
        return types.PolicyInfo("gpu-binpack", "0.1.0", [])

    def score(self, pod: types.Pod, nodes: types.Nodes) -> list[int]:
        node_weight, domain_weight, weights_recip = weights
        asked = pod.gpu_milli if pod.gpu_milli > 0 else pod.gpus * 1000
        levels = nodes.levels
        used_pct = [domain_used_pct(level) for level in levels]
        columns = [level.node_domain for level in levels]
        # A node's domain fullness depends only on its innermost domain (topology is a tree),
        # so it is computed once per innermost domain.
        inner_to_full = {}
        recip_10_total = {}
        scores = []
        push = scores.append
        for i, (total, free) in enumerate(zip(nodes.gpu_total, nodes.gpu_free)):
            if total == 0:
                push(0)
                continue
            r = recip_10_total.get(total)
            if r is None:
                r = recip_10_total[total] = recip(10 * total)
            node_full = min((((total - min(free, total)) * 1000 + asked) * r) >> 32, 100)
            full = None
            if columns and columns[0][i] != NO_DOMAIN:
                inner = columns[0][i]
                full = inner_to_full.get(inner)
                if full is None:
                    full = inner_to_full[inner] = domain_full(i, columns, used_pct)
            if full is None:
                full = node_full
            push(((node_weight * node_full + domain_weight * full) * weights_recip) >> 32)
        return scores


def domain_full(i, columns, used_pct):
    """Fullness of node i's domains, innermost weighted most (each outer level half as much)."""
    total, parts, part = 0, 0, 256
    for column, pct in zip(columns, used_pct):
        domain = column[i]
        if domain == NO_DOMAIN:
            break
        total += part * (pct[domain] if domain < len(pct) else 0)
        parts += part
        part //= 2
    return total // parts if parts else None
