// {{name}}: a filter policy. A node fits when it is healthy and, after the pod's GPUs, still
// has `reserve_gpus` GPUs free. Config (optional): {"reserve_gpus": 0}.

import { parseConfig } from "./config.js";

const NAME = "{{name}}";
// Reason codes: each verdict other than FITS names one, and init declares its text.
const FITS = 0;
const NOT_HEALTHY = 1;
const NOT_ENOUGH_GPUS = 2;
const HEALTHY = 0;

// Module state: init runs once per instance, before any filter call.
let reserveGpus = 0;

export const filterPolicy = {
  init(config) {
    reserveGpus = parseConfig(NAME, config, { reserve_gpus: 0 }).reserve_gpus;
    return {
      name: NAME,
      version: "0.1.0",
      reasons: [
        { code: NOT_HEALTHY, text: "node is not healthy" },
        { code: NOT_ENOUGH_GPUS, text: "not enough free GPUs" },
      ],
    };
  },

  filter(pod, nodes) {
    const need = pod.gpus + reserveGpus;
    return Uint16Array.from(nodes.health, (health, i) =>
      health !== HEALTHY ? NOT_HEALTHY : nodes.gpuFree[i] < need ? NOT_ENOUGH_GPUS : FITS,
    );
  },
};
