"""Re-make trace.csv: python3 generate.py (seeded, so the output is always the same)."""
import random

rng = random.Random(7)
rows = []
t = 0.0
for i in range(400):
    t += rng.expovariate(1 / 45.0)
    if rng.random() < 0.45:
        pods, gpus = rng.choice([2, 4, 4, 8, 8, 16]), 8
    else:
        pods, gpus = 1, rng.choice([1, 1, 2, 4, 8])
    queue = rng.choices(["pretraining", "rl", "applied"], [3, 2, 2])[0]
    duration = round(rng.uniform(300, 3600))
    rows.append(f"burst-{i:03d},{t:.0f},{duration},{pods},{gpus},{queue},0")
with open("trace.csv", "w") as out:
    out.write("job_id,submit_s,duration_s,pods,gpus_per_pod,queue,priority\n" + "\n".join(rows) + "\n")
