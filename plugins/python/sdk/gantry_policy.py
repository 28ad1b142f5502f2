"""Helpers for Gantry policies written in Python (gantry:policy@0.1.0).

componentize-py generates the `wit_world` bindings from the WIT when it builds the component;
this module only adds what every policy would otherwise write again: the health codes, the
Kubernetes toleration rule, per-domain fullness and strict config parsing. It imports no WASI:
policies are built with `componentize-py --stub-wasi`, so nothing here may touch files, the
clock or the environment.
"""

import json

# Reason code 0 means "the node fits".
FITS = 0
# `nodes.health` entries (see `health` in the WIT).
HEALTHY = 0
NOT_READY = 1
UNHEALTHY = 2
PREFLIGHT = 3
CORDONED = 4
# `level.node_domain` entry of a node that has no domain at that level.
NO_DOMAIN = 0xFFFFFFFF
# `taint-effect` values.
NO_SCHEDULE = 0
PREFER_NO_SCHEDULE = 1
NO_EXECUTE = 2


def _effect(value):
    """A taint effect as its number, whether the bindings gave an enum or an int."""
    return getattr(value, "value", value)


def tolerates(pod, taint):
    """Whether one of the pod's tolerations matches `taint` (Kubernetes' rule)."""
    for t in pod.tolerations:
        key_ok = t.exists if t.key == 0 else t.key == taint.key
        if (
            key_ok
            and (t.exists or t.value == taint.value)
            and (t.effect is None or _effect(t.effect) == _effect(taint.effect))
        ):
            return True
    return False


def tolerates_all(pod, taints):
    """Whether every taint that keeps pods off (NoSchedule, NoExecute) is tolerated."""
    return all(
        _effect(taint.effect) == PREFER_NO_SCHEDULE or tolerates(pod, taint) for taint in taints
    )


def tolerated_sets(pod, nodes):
    """Per taint set of `nodes`: whether the pod tolerates it. Sets are few and shared, so a
    filter checks each once per call instead of once per node."""
    return [tolerates_all(pod, taints) for taints in nodes.taint_sets]


def domain_used_pct(level):
    """Per domain of a topology level: percent of its GPUs in use (0..=100)."""
    return [
        (total - min(free, total)) * 100 // total if total else 0
        for total, free in zip(level.domain_gpu_total, level.domain_gpu_free)
    ]


def parse_config(policy, config, defaults):
    """`config` (JSON) as a dict over `defaults`, refusing unknown fields and wrong types with
    a one-line message that names the policy. Raises ValueError with that message."""
    try:
        given = json.loads(config)
    except ValueError as e:
        raise ValueError(f"{policy} config: not JSON: {e}")
    if not isinstance(given, dict):
        raise ValueError(f"{policy} config: expected an object, got {type(given).__name__}")
    values = dict(defaults)
    for key, value in given.items():
        if key not in defaults:
            known = " or ".join(f"`{k}`" for k in defaults)
            raise ValueError(f"{policy} config: unknown field `{key}`, expected {known}")
        want = type(defaults[key])
        if want is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{policy} config: `{key}` must be a whole number")
        if want is int and not 0 <= value <= 0xFFFFFFFF:
            raise ValueError(f"{policy} config: `{key}` must be between 0 and 4294967295")
        if want is bool and not isinstance(value, bool):
            raise ValueError(f"{policy} config: `{key}` must be true or false")
        values[key] = value
    return values
