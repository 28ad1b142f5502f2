// {{name}}: a score policy. Scores each node 0 to 100 by how full its GPUs would be with the
// pod on it: fuller first packs pods together and keeps whole nodes free for big jobs;
// {"spread": true} prefers emptier nodes instead. For a gang, Gantry adds the scores of a
// topology domain's best nodes, so packing also steers gangs into fuller racks.

import { parseConfig } from "./config.js";

const NAME = "{{name}}";
const MAX_SCORE = 100;

// Module state: init runs once per instance, before any score call.
let spread = false;

export const scorePolicy = {
  init(config) {
    spread = parseConfig(NAME, config, { spread: false }).spread;
    return { name: NAME, version: "0.1.0", reasons: [] };
  },

  score(pod, nodes) {
    return Uint32Array.from(nodes.gpuTotal, (total, i) => {
      if (total === 0) return 0;
      const free = Math.min(nodes.gpuFree[i], total);
      const full = Math.floor((MAX_SCORE * (total - free + Math.min(pod.gpus, free))) / total);
      return spread ? MAX_SCORE - full : full;
    });
  },
};
