"""{{name}}: a quota policy. A job is admitted while its queue stays within its nominal GPU
quota plus `headroom_gpus`; past that it is refused, in words saying by how much.
Config (optional): {"headroom_gpus": 0}."""

from typing import Optional

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host, types

from gantry_policy import parse_config

NAME = "{{name}}"

# Module state: init runs once per instance, before any admit call.
headroom_gpus = 0


class QuotaPolicy(exports.QuotaPolicy):
    def init(self, config: str) -> types.PolicyInfo:
        global headroom_gpus
        try:
            headroom_gpus = parse_config(NAME, config, {"headroom_gpus": 0})["headroom_gpus"]
        except ValueError as e:
            raise Err(str(e))
        return types.PolicyInfo(NAME, "0.1.0", [])

    def admit(
        self, job: types.Job, queue: types.QueueUsage, cohort: Optional[types.CohortUsage]
    ) -> types.QuotaVerdict:
        wanted = queue.used.gpus + job.total.gpus
        allowed = queue.nominal.gpus + headroom_gpus
        if wanted <= allowed:
            return types.QuotaVerdict_Admit()
        name = host.resolve(queue.name)
        return types.QuotaVerdict_Deny(
            f"queue {name} would use {wanted} GPUs, over the {allowed} it may use"
        )
