"""Re-make trace.csv: python3 generate.py (seeded, so the output is always the same).

One day of MPI gang arrivals on the OpenAI-like 7,500-node cluster
(../shared/clusters/openai-like-7500.yaml: 7,500 nodes x 8 A100 = 60,000 GPUs).
"""
import math
import os
import random
from collections import Counter

SEED = 39
DAY_S = 86_400
CLUSTER_GPUS = 7_500 * 8
TARGET_LOAD = 0.90            # offered GPU-seconds / (CLUSTER_GPUS * DAY_S)
GPUS_PER_POD = 8
CHECKPOINT_S = 1_800          # Gantry extension column: checkpoint interval of every job

POD_SIZES = [16, 32, 64, 128, 256]
POD_WEIGHTS = [40, 25, 18, 11, 6]                  # smaller gangs more common
QUEUES = ["pretraining", "rl", "applied", "safety"]
QUEUE_WEIGHTS = [20_000, 16_000, 18_000, 6_000]    # nominal quota in the cluster spec

MEDIAN_S = 2.5 * 3600         # lognormal duration: median 2.5 h ...
SIGMA = 0.8                   # ... log-sd 0.8 ...
MIN_S, MAX_S = 600, 12 * 3600 # ... clipped to [10 min, 12 h]


def mean_clipped_lognormal(median, sigma, lo, hi):
    """E[min(max(X, lo), hi)] for X lognormal with the given median and log-sd."""
    mu = math.log(median)
    phi = lambda z: 0.5 * (1 + math.erf(z / math.sqrt(2)))
    a, b = (math.log(lo) - mu) / sigma, (math.log(hi) - mu) / sigma
    middle = math.exp(mu + sigma ** 2 / 2) * (phi(b - sigma) - phi(a - sigma))
    return lo * phi(a) + middle + hi * (1 - phi(b))


# Expected-value arrival rate for TARGET_LOAD (jobs per second).
mean_pods = sum(p * w for p, w in zip(POD_SIZES, POD_WEIGHTS)) / sum(POD_WEIGHTS)
mean_job_gpu_s = mean_pods * GPUS_PER_POD * mean_clipped_lognormal(MEDIAN_S, SIGMA, MIN_S, MAX_S)
NOMINAL_RATE = TARGET_LOAD * CLUSTER_GPUS / mean_job_gpu_s


def generate(rate):
    """The jobs submitted in one day at `rate`, drawn from a fresh RNG seeded with SEED.

    With a fixed seed the i-th job's size, queue and duration do not depend on the rate (only
    the arrival gaps scale by 1/rate), so the offered load only grows with the rate.
    """
    rng = random.Random(SEED)
    rows, t = [], 0.0
    while True:
        t += rng.expovariate(rate)                 # Poisson arrivals over the day
        if t >= DAY_S:
            return rows
        pods = rng.choices(POD_SIZES, POD_WEIGHTS)[0]
        queue = rng.choices(QUEUES, QUEUE_WEIGHTS)[0]
        duration = round(min(max(rng.lognormvariate(math.log(MEDIAN_S), SIGMA), MIN_S), MAX_S))
        rows.append((f"day-{len(rows):04d}", int(t), duration, pods, GPUS_PER_POD, queue, 0,
                     CHECKPOINT_S))


def load(rows):
    return sum(r[2] * r[3] * r[4] for r in rows) / (CLUSTER_GPUS * DAY_S)


# One day's draw is noisy (a few 256-pod x 12 h gangs move the total by several percent), so
# tune the rate for this seed: bisect until the realised offered load is TARGET_LOAD.
lo, hi = NOMINAL_RATE / 2, NOMINAL_RATE * 2
for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if load(generate(mid)) < TARGET_LOAD else (lo, mid)
RATE = hi
rows = generate(RATE)

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "trace.csv"), "w") as out:
    out.write("job_id,submit_s,duration_s,pods,gpus_per_pod,queue,priority,checkpoint_s\n")
    out.writelines(",".join(map(str, r)) + "\n" for r in rows)

offered = load(rows) * CLUSTER_GPUS * DAY_S
print(f"arrival rate: {RATE * 3600:.2f} jobs/h (expected-value rate {NOMINAL_RATE * 3600:.2f} jobs/h)")
print(f"jobs: {len(rows)}")
print(f"offered load: {offered / (CLUSTER_GPUS * DAY_S):.1%} of {CLUSTER_GPUS} GPUs x {DAY_S} s "
      f"({offered:.4g} GPU-s)")
durs = sorted(r[2] for r in rows)
print(f"duration: median {durs[len(durs) // 2] / 3600:.2f} h, min {durs[0]} s, max {durs[-1]} s")
pod_counts = Counter(r[3] for r in rows)
print("pods:", ", ".join(f"{p}: {pod_counts[p]}" for p in POD_SIZES))
queue_counts = Counter(r[5] for r in rows)
print("queues:", ", ".join(f"{q}: {queue_counts[q]}" for q in QUEUES))
