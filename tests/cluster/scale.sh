#!/usr/bin/env bash
# One contender's scaling curve on the live control plane: `bench.sh --workload openai --only
# NAME --json` at each size in turn, then its pods/s, its mean time to decide a job
# (scheduler_scheduling_attempt_duration_seconds), its mean cycle time (Gantry's
# gantry_scheduling_cycle_duration_seconds; a cycle decides the whole burst, which grows with
# the cluster) and its time to the last binding against the node count, each with the exponent
# of a least-squares fit on log-log axes: 1 grows linearly with the node count, 0 not at all,
# and a negative pods/s exponent means it slows down.
#
# Usage: tests/cluster/scale.sh [--nodes 1000,2500,5000,7500] [--only gantry] [--json]
#                               [--timeout-s S]
# A size or name it cannot serve exits 2 with the reason before anything starts.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

sizes="1000,2500,5000,7500" only="gantry" json=false timeout_s=900
usage() { echo "usage: $0 [--nodes N,N,...] [--only NAME] [--json] [--timeout-s S]" >&2; exit 2; }
while (($#)); do
    case "$1" in
        --nodes) sizes="${2:?}"; shift 2 ;;
        --only) only="${2:?}"; shift 2 ;;
        --json) json=true; shift ;;
        --timeout-s) timeout_s="${2:?}"; shift 2 ;;
        *) usage ;;
    esac
done
IFS=, read -ra nodes <<<"$sizes"
((${#nodes[@]} >= 2)) || { echo "scale.sh: a curve needs two sizes or more, not '$sizes'" >&2; exit 2; }
for n in "${nodes[@]}"; do
    [[ "$n" =~ ^[0-9]+$ ]] || { echo "scale.sh: '$n' is not a node count" >&2; exit 2; }
done

out="$(mktemp -d "${TMPDIR:-/tmp}/gantry-scale.XXXXXX")"
trap 'rm -rf "$out"' EXIT
for n in "${nodes[@]}"; do
    echo "scale.sh: $only at $n nodes" >&2
    # bench.sh refuses a size or name it cannot serve (exit 2), which ends the curve here.
    "$here/bench.sh" --workload openai --nodes "$n" --only "$only" --json --timeout-s "$timeout_s" \
        >"$out/$n.json"
done

python3 - "$out" "$only" "$json" "${nodes[@]}" <<'PY'
import json, math, sys

out, name, as_json, sizes = sys.argv[1], sys.argv[2], sys.argv[3] == "true", sys.argv[4:]
rows = []
for n in sizes:
    run = json.load(open(f"{out}/{n}.json"))
    o = run["contenders"][name]
    cycles = o.get("cycles") or {}
    rows.append({
        "nodes": int(n),
        "pods": o["pods"],
        "pods_bound": o["pods_bound"],
        "partial_gangs": o["partial_gangs"],
        "timed_out": o["timed_out"],
        "pods_per_s": o["pods_per_s"],
        "last_bind_s": o["last_bind_s"],
        "largest_gang_bound_s": o["largest_gang_bound_s"],
        "cycles": cycles.get("cycles"),
        "cycle_ms_mean": cycles.get("cycle_ms_mean"),
        "attempt_us_mean": cycles.get("attempt_us_mean"),
        "peak_rss_mib": o["peak_rss_mib"],
        "cpu_s": o["cpu_s"],
        "api_requests_per_bound_pod": o.get("api_requests_per_bound_pod"),
    })

def exponent(key):
    """Least-squares slope of log(key) on log(nodes); None without two positive points."""
    points = [(math.log(r["nodes"]), math.log(r[key])) for r in rows if r.get(key)]
    if len(points) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return round(sum((x - mx) * (y - my) for x, y in points) / sxx, 3) if sxx else None

exponents = {key: exponent(key) for key in
             ("pods_per_s", "cycle_ms_mean", "attempt_us_mean", "last_bind_s", "peak_rss_mib")}
result = {
    "workload": "openai",
    "contender": name,
    "sizes": rows,
    "exponents": exponents,
    # No worse than linear: the time to decide one job (kube-scheduler's scheduling cycle is
    # one pod's) grows at most in proportion to the node count, and so does the time per bound
    # pod (pods/s falls no faster than 1/nodes). A whole cycle of a burst decides as many jobs
    # as the burst has, which grow with the node count too, so its time is reported, and its
    # exponent is about 1 more than the decision's.
    "decision_time_no_worse_than_linear":
        None if exponents["attempt_us_mean"] is None else exponents["attempt_us_mean"] <= 1.0,
    "pods_per_s_no_worse_than_linear":
        None if exponents["pods_per_s"] is None else exponents["pods_per_s"] >= -1.0,
    "whole_cycle_no_worse_than_linear":
        None if exponents["cycle_ms_mean"] is None else exponents["cycle_ms_mean"] <= 1.0,
}
if as_json:
    print(json.dumps(result))
    sys.exit(0)
print(f"{name}, --workload openai")
print(f"{'nodes':>6}{'pods':>7}{'pods/s':>9}{'cycle ms':>10}{'attempt us':>11}{'last bind s':>12}"
      f"{'RSS MiB':>9}{'CPU s':>7}")
show = lambda v, f: "-" if v is None else format(v, f)
for r in rows:
    print(f"{r['nodes']:>6}{r['pods']:>7}{r['pods_per_s']:>9.1f}{show(r['cycle_ms_mean'], '.2f'):>10}"
          f"{show(r['attempt_us_mean'], '.1f'):>11}{show(r['last_bind_s'], '.2f'):>12}"
          f"{show(r['peak_rss_mib'], '.0f'):>9}{show(r['cpu_s'], '.2f'):>7}")
print("exponents against node count (1 = linear):", json.dumps(exponents))
print("time to decide a job no worse than linear:", result["decision_time_no_worse_than_linear"])
print("pods/s no worse than linear:", result["pods_per_s_no_worse_than_linear"])
print("a whole cycle of the burst (as many jobs as the burst) no worse than linear:",
      result["whole_cycle_no_worse_than_linear"])
PY
