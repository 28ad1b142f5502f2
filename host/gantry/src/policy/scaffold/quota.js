// {{name}}: a quota policy. A job is admitted while its queue stays within its nominal GPU
// quota plus `headroom_gpus`; past that it is refused, in words saying by how much.
// Config (optional): {"headroom_gpus": 0}. WIT u64 values (every `resources` field) arrive
// as BigInt, so the arithmetic is BigInt too.

import { resolve } from "gantry:policy/host@0.1.0";
import { parseConfig } from "./config.js";

const NAME = "{{name}}";

// Module state: init runs once per instance, before any admit call.
let headroomGpus = 0n;

export const quotaPolicy = {
  init(config) {
    headroomGpus = BigInt(parseConfig(NAME, config, { headroom_gpus: 0 }).headroom_gpus);
    return { name: NAME, version: "0.1.0", reasons: [] };
  },

  admit(job, queue, _cohort) {
    const wanted = queue.used.gpus + job.total.gpus;
    const allowed = queue.nominal.gpus + headroomGpus;
    if (wanted <= allowed) return { tag: "admit" };
    return {
      tag: "deny",
      val: `queue ${resolve(queue.name)} would use ${wanted} GPUs, over the ${allowed} it may use`,
    };
  },
};
