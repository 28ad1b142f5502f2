#!/usr/bin/env bash
# Races three contenders on the same cluster and the same pods, each on a fresh control plane:
#   gantry          `gantry serve --kubeconfig` with its default Wasm policies
#   coscheduling    kube-scheduler 1.34 with scheduler-plugins' Coscheduling (what OpenAI ran)
#   raw-binder      `gantry kube bench-bind`: nodes decided up front, no scheduling: the ceiling
#
#   tests/cluster/bench.sh --nodes N --pods M [--json] [--timeout-s S] [--only gantry|coscheduling|raw-binder]
#
# Each run: start etcd + kube-apiserver + kwok, install scheduler-plugins' PodGroup CRD, create N
# kwok nodes with 8 GPUs (racks of 8, blocks of 16 racks) and the M pods of
# `gantry_kube::bench::workload` (half in PodGroup gangs of 4-32 one-GPU pods, half single pods
# of 1-2 GPUs; 70% of the GPUs at N = M/5), then start the contender and time every binding
# from its start (cache sync included, for all three) until every pod is bound. Client limits:
# kube-rs has no client-side rate limiter, so kube-scheduler gets qps = burst = 5000, which
# never binds; Gantry and the raw binder keep the same 16 requests in flight.
#
# Prints a table, or with --json one object: each contender's pods/s, time to place every gang,
# partial gangs, unbound pods and GPU allocation, and the ratios the acceptance asks for.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
nodes=1000 pods=5000 json=false timeout_s=600 only=""
while (($#)); do
    case "$1" in
        --nodes) nodes="$2"; shift 2 ;;
        --pods) pods="$2"; shift 2 ;;
        --timeout-s) timeout_s="$2"; shift 2 ;;
        --json) json=true; shift ;;
        --only) only="$2"; shift 2 ;;
        *) echo "usage: bench.sh --nodes N --pods M [--json] [--timeout-s S] [--only NAME]" >&2; exit 2 ;;
    esac
done
[[ "$nodes" =~ ^[1-9][0-9]*$ && "$pods" =~ ^[1-9][0-9]*$ ]] || { echo "bench.sh: --nodes and --pods take positive integers" >&2; exit 2; }

bin="${GANTRY_CLUSTER_BIN:-$("$here/build.sh")}"
target="${CARGO_TARGET_DIR:-$repo/target}"
gantry="${GANTRY_BIN:-$target/release/gantry}"
[[ -x "$gantry" ]] || { echo "bench.sh: $gantry is missing; run cargo build --release -p gantry" >&2; exit 1; }
for b in kube-scheduler kubectl podgroup-crd.yaml; do
    [[ -e "$bin/$b" ]] || { echo "bench.sh: $bin/$b is missing; run tests/cluster/build.sh" >&2; exit 1; }
done

work="$(mktemp -d "${TMPDIR:-/tmp}/gantry-bench.XXXXXX")"
dir=""
cleanup() {
    [[ -n "$dir" ]] && "$here/stop.sh" "$dir" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/spec.yaml" <<SPEC
name: bench-$nodes
node_pools:
  - name: gpu
    count: $nodes
    gpus_per_node: 8
    gpu_type: H100-SXM5-80GB
    cpu_milli: 192000
    memory_mib: 2000000
    topology:
      - level: rack
        size: 8
      - level: block
        size: 16
queues:
  - name: default
SPEC

# run NAME SCHEDULER_NAME COMMAND...: one contender on a fresh control plane; its JSON goes to
# $work/NAME.json. In COMMAND, @KUBECONFIG@ stands for the cluster's kubeconfig.
run() {
    local name="$1" scheduler="$2"
    shift 2
    if [[ -n "$only" && "$only" != "$name" ]]; then
        echo '{"pods_per_s": 0, "all_gangs_placed_s": null, "partial_gangs": 0, "pods_unbound": 0, "gpu_allocation": 0, "skipped": true}' >"$work/$name.json"
        return
    fi
    dir="$("$here/start.sh")"
    local kubeconfig="$dir/kubeconfig"
    "$bin/kubectl" --kubeconfig "$kubeconfig" apply -f "$bin/podgroup-crd.yaml" >/dev/null
    "$bin/kubectl" --kubeconfig "$kubeconfig" wait --for condition=established --timeout=60s \
        crd/podgroups.scheduling.x-k8s.io >/dev/null
    "$gantry" kube create-nodes --spec "$work/spec.yaml" --kubeconfig "$kubeconfig" >&2
    "$gantry" kube bench-pods --kubeconfig "$kubeconfig" --pods "$pods" --scheduler-name "$scheduler"
    local command=()
    for word in "$@"; do command+=("${word//@KUBECONFIG@/$kubeconfig}"); done
    echo "bench.sh: $name" >&2
    "$gantry" kube bench-watch --kubeconfig "$kubeconfig" --pods "$pods" --name "$name" \
        --timeout-s "$timeout_s" -- "${command[@]}" >"$work/$name.json"
    "$here/stop.sh" "$dir"
    dir=""
}

mkdir -p "$work/gantry-data"
run gantry gantry "$gantry" serve --kubeconfig @KUBECONFIG@ --listen 127.0.0.1:0 \
    --data-dir "$work/gantry-data"

cat >"$work/scheduler.yaml" <<CFG
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: false
clientConnection:
  kubeconfig: @KUBECONFIG@
  qps: 5000
  burst: 5000
profiles:
- schedulerName: coscheduling
  plugins:
    multiPoint:
      enabled:
      - name: Coscheduling
    queueSort:
      enabled:
      - name: Coscheduling
      disabled:
      - name: "*"
  pluginConfig:
  - name: Coscheduling
    args:
      permitWaitingTimeSeconds: 60
CFG
# bench-watch substitutes @KUBECONFIG@ in arguments only, so the config is written per run by a
# small wrapper.
cat >"$work/kube-scheduler.sh" <<WRAP
#!/usr/bin/env bash
sed "s|@KUBECONFIG@|\$1|" "$work/scheduler.yaml" >"$work/scheduler-run.yaml"
exec "$bin/kube-scheduler" --config "$work/scheduler-run.yaml" --secure-port 0 --v=1 \
    >"$work/kube-scheduler.log" 2>&1
WRAP
chmod +x "$work/kube-scheduler.sh"
run coscheduling coscheduling "$work/kube-scheduler.sh" @KUBECONFIG@

run raw-binder nobody "$gantry" kube bench-bind --kubeconfig @KUBECONFIG@

python3 - "$work" "$nodes" "$pods" "$json" <<'PY'
import json, sys
work, nodes, pods, as_json = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "true"
runs = {name: json.load(open(f"{work}/{name}.json")) for name in ("gantry", "coscheduling", "raw-binder")}
def ratio(a, b):
    return round(a / b, 3) if a and b else None
g, c, r = runs["gantry"], runs["coscheduling"], runs["raw-binder"]
out = {
    "nodes": nodes,
    "pods": pods,
    "contenders": runs,
    "ratios": {
        "gantry_pods_per_s_over_raw_binder": ratio(g["pods_per_s"], r["pods_per_s"]),
        "gantry_pods_per_s_over_coscheduling": ratio(g["pods_per_s"], c["pods_per_s"]),
        "coscheduling_gang_time_over_gantry": ratio(c["all_gangs_placed_s"], g["all_gangs_placed_s"]),
    },
}
if as_json:
    print(json.dumps(out))
else:
    print(f"{nodes} nodes, {pods} pods")
    print(f"{'contender':<14}{'pods/s':>9}{'all gangs (s)':>15}{'partial gangs':>15}{'unbound':>9}{'GPU alloc':>11}")
    for name, o in runs.items():
        gangs = "never" if o["all_gangs_placed_s"] is None else f"{o['all_gangs_placed_s']:.1f}"
        print(f"{name:<14}{o['pods_per_s']:>9.1f}{gangs:>15}{o['partial_gangs']:>15}{o['pods_unbound']:>9}{o['gpu_allocation']:>11.1%}")
    for k, v in out["ratios"].items():
        print(f"{k}: {v}")
PY
