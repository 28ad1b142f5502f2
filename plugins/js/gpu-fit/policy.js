// gpu-fit, in JavaScript: the node has enough free GPUs of the requested type, is healthy, has
// the CPU and memory the pod asks for, and every taint that keeps pods off is tolerated. The
// same answers as plugins/gpu-fit (Rust); plugins/cases/gpu-fit checks both.

const FITS = 0;
const NOT_HEALTHY = 1;
const WRONG_GPU_TYPE = 2;
const NOT_ENOUGH_GPUS = 3;
const TAINT_NOT_TOLERATED = 4;
const NOT_ENOUGH_CPU_OR_MEMORY = 5;

const REASONS = [
  { code: NOT_HEALTHY, text: "node not ready or not healthy" },
  { code: WRONG_GPU_TYPE, text: "GPU type does not match" },
  { code: NOT_ENOUGH_GPUS, text: "Insufficient nvidia.com/gpu" },
  { code: TAINT_NOT_TOLERATED, text: "node has a taint the pod does not tolerate" },
  { code: NOT_ENOUGH_CPU_OR_MEMORY, text: "Insufficient cpu or memory" },
];

const HEALTHY = 0;

// Kubernetes' rule: same key (or an empty key with Exists), same value unless Exists, and the
// same effect unless the toleration names none.
function tolerates(pod, taint) {
  return pod.tolerations.some((t) => {
    const keyOk = t.key === 0 ? t.exists : t.key === taint.key;
    return (
      keyOk &&
      (t.exists || t.value === taint.value) &&
      (t.effect === undefined || t.effect === null || t.effect === taint.effect)
    );
  });
}

// Every taint that keeps pods off (NoSchedule, NoExecute) is tolerated.
function toleratesAll(pod, taints) {
  return taints.every((taint) => taint.effect === "prefer-no-schedule" || tolerates(pod, taint));
}

export const filterPolicy = {
  init(_config) {
    return { name: "gpu-fit", version: "0.1.0", reasons: REASONS };
  },

  filter(pod, nodes) {
    // Taint sets are few and shared: check each once per call, not once per node.
    const tolerated = nodes.taintSets.map((taints) => toleratesAll(pod, taints));
    const { gpuType: wantType, gpuMilli: milli, gpus, cpuMilli: cpu, memoryMib: memory } = pod;
    const { health, gpuType, gpuFree, gpuMilliFreeMax, cpuFreeMilli, memoryFreeMib, taintSet } =
      nodes;
    const n = nodes.name.length;
    const verdicts = new Uint16Array(n);
    for (let i = 0; i < n; i++) {
      if (health[i] !== HEALTHY) {
        verdicts[i] = NOT_HEALTHY;
      } else if (wantType !== 0 && gpuType[i] !== wantType) {
        verdicts[i] = WRONG_GPU_TYPE;
      } else if (milli > 0 ? gpuMilliFreeMax[i] < milli : gpuFree[i] < gpus) {
        verdicts[i] = NOT_ENOUGH_GPUS;
      } else if (cpuFreeMilli[i] < cpu || memoryFreeMib[i] < memory) {
        verdicts[i] = NOT_ENOUGH_CPU_OR_MEMORY;
      } else if (tolerated[taintSet[i]] === false) {
        verdicts[i] = TAINT_NOT_TOLERATED;
      } else {
        verdicts[i] = FITS;
      }
    }
    return verdicts;
  },
};
