#!/usr/bin/env bash
# Races four contenders on the same cluster and the same pods, each on a fresh control plane:
#   gantry          `gantry serve --kubeconfig` with its default Wasm policies (gangs declared
#                   with the upstream Workload/PodGroup API)
#   native          upstream kube-scheduler of the control plane's release (1.37) with its
#                   native gang scheduling (GenericWorkload on; the same upstream gangs)
#   coscheduling    kube-scheduler 1.34 with scheduler-plugins' Coscheduling (what OpenAI ran;
#                   gangs as scheduler-plugins PodGroups)
#   raw-binder      `gantry kube bench-bind`: nodes decided up front, no scheduling: the ceiling
#
#   tests/cluster/bench.sh [--workload mixed|openai] --nodes N [--pods M] [--json]
#                          [--timeout-s S] [--idle-s S] [--only NAME]
#
# Workloads (host/gantry/src/bench/kube.rs): `mixed` (the default) is M pods, half in gangs of 4-32
# one-GPU pods, half single 1-2-GPU pods, 70% of the GPUs at N = M/5. `openai` sizes itself from
# N: 8-GPU pods (one per node) in gangs of 16 to 256 holding 70% of the GPUs asked for, single
# 8-GPU pods and a few 1-4-GPU ones, one burst asking for 90% of the cluster's GPUs.
#
# Each run: start etcd + kube-apiserver + kwok, install scheduler-plugins' PodGroup CRD, create N
# kwok nodes with 8 GPUs (racks of 8, blocks of 16 racks) and the pods, take the API server's
# request counters twice --idle-s apart with nothing running (the idle baseline: kwok and the
# control plane's own loops), then start the contender and time every binding from its start
# (cache sync included, for all) until every pod is bound or --timeout-s passes. Client limits:
# kube-rs has no client-side rate limiter, so kube-scheduler gets qps = burst = 5000, which
# never binds; Gantry and the raw binder keep the same 16 requests in flight.
#
# kwok runs no heartbeat or lease stages (kwok-stages.yaml): a node turns Ready once and nothing
# renews it, and no controller manager runs to mark it otherwise, so an idle control plane
# stays idle at any node count.
#
# Per contender: pods/s, time until every gang is placed, the largest gang's time to fully
# bound, partial gangs, unbound pods, GPU allocation, whether it timed out, the scheduler
# process's peak RSS and CPU seconds (from /proc), API-server requests per bound pod by verb and
# resource (`apiserver_request_total` after the run minus before, minus the idle rate over the
# run; kwok's pod status writes and the bench's own watch are in every contender's count), and
# the watches it held (`apiserver_longrunning_requests{verb="WATCH"}`, sampled each second,
# peak less the idle count and the bench's one watch) and opened (WATCH requests in the run,
# less the bench's). Prints a table, or with --json one
# object with the ratios the acceptance asks for.
#
# Exits 2 with the reason for a workload or size it cannot serve.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
usage="usage: bench.sh [--workload mixed|openai] --nodes N [--pods M] [--json] [--timeout-s S] [--idle-s S] [--only NAME]"
workload=mixed nodes=1000 pods="" json=false timeout_s=600 idle_s=10 only=""
refuse() { echo "bench.sh: $*" >&2; exit 2; }
while (($#)); do
    case "$1" in
        --workload) workload="${2:-}"; shift 2 ;;
        --nodes) nodes="${2:-}"; shift 2 ;;
        --pods) pods="${2:-}"; shift 2 ;;
        --timeout-s) timeout_s="${2:-}"; shift 2 ;;
        --idle-s) idle_s="${2:-}"; shift 2 ;;
        --json) json=true; shift ;;
        --only) only="${2:-}"; shift 2 ;;
        *) refuse "unknown argument $1; $usage" ;;
    esac
done
positive='^[1-9][0-9]*$'
[[ "$nodes" =~ $positive ]] || refuse "--nodes takes a positive integer, not '$nodes'"
[[ "$idle_s" =~ $positive && "$timeout_s" =~ $positive ]] \
    || refuse "--idle-s and --timeout-s take positive integers"
case "$workload" in
    mixed)
        pods="${pods:-5000}"
        [[ "$pods" =~ $positive ]] || refuse "--pods takes a positive integer, not '$pods'" ;;
    openai)
        [[ -z "$pods" ]] || refuse "the openai workload sizes itself from --nodes; drop --pods"
        # OPENAI_NODES in host/gantry/src/bench/kube.rs
        ((nodes >= 32 && nodes <= 7500)) \
            || refuse "the openai workload is defined for 32 to 7500 nodes, not $nodes" ;;
    *) refuse "unknown workload '$workload': use mixed or openai" ;;
esac
case "$only" in
    "" | gantry | native | coscheduling | raw-binder) ;;
    *) refuse "unknown contender '$only': use gantry, native, coscheduling or raw-binder" ;;
esac

bin="${GANTRY_CLUSTER_BIN:-$("$here/build.sh")}"
target="${CARGO_TARGET_DIR:-$repo/target}"
gantry="${GANTRY_BIN:-$target/release/gantry}"
[[ -x "$gantry" ]] || { echo "bench.sh: $gantry is missing; run cargo build --release -p gantry" >&2; exit 1; }
for b in kube-scheduler kube-scheduler-native kubectl podgroup-crd.yaml; do
    [[ -e "$bin/$b" ]] || { echo "bench.sh: $bin/$b is missing; run tests/cluster/build.sh" >&2; exit 1; }
done

work="$(mktemp -d "${TMPDIR:-/tmp}/gantry-bench.XXXXXX")"
dir="" sampler=""
cleanup() {
    [[ -n "$sampler" ]] && kill "$sampler" 2>/dev/null || true
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

# The API server's request counters and watch gauges, as Prometheus text.
scrape() {
    curl -sf --cacert "$dir/ca.crt" -H "Authorization: Bearer $(cat "$dir/admin.token")" \
        "https://127.0.0.1:$(cat "$dir/api.port")/metrics" \
        | grep -E '^apiserver_(request_total|longrunning_requests)\{' || true
}

# run NAME SCHEDULER_NAME GANG_API METRICS_URL COMMAND...: one contender on a fresh control plane
# (METRICS_URL: its Prometheus endpoint for cycle figures, or ""); its JSON
# goes to $work/NAME.json and its metric scrapes to $work/NAME.*. In COMMAND, @KUBECONFIG@
# stands for the cluster's kubeconfig.
run() {
    local name="$1" scheduler="$2" gang_api="$3" metrics_url="$4"
    shift 4
    if [[ -n "$only" && "$only" != "$name" ]]; then
        echo '{"skipped": true}' >"$work/$name.json"
        return
    fi
    dir="$("$here/start.sh")"
    local kubeconfig="$dir/kubeconfig"
    "$bin/kubectl" --kubeconfig "$kubeconfig" apply -f "$bin/podgroup-crd.yaml" >/dev/null
    "$bin/kubectl" --kubeconfig "$kubeconfig" wait --for condition=established --timeout=60s \
        crd/podgroups.scheduling.x-k8s.io >/dev/null
    "$gantry" kube create-nodes --spec "$work/spec.yaml" --kubeconfig "$kubeconfig" >&2
    local count
    count="$("$gantry" kube bench-pods --kubeconfig "$kubeconfig" --workload "$workload" \
        --pods "${pods:-0}" --nodes "$nodes" --gang-api "$gang_api" --scheduler-name "$scheduler")"
    local command=()
    for word in "$@"; do command+=("${word//@KUBECONFIG@/$kubeconfig}"); done
    echo "bench.sh: $name ($count pods; idle baseline ${idle_s} s)" >&2
    scrape >"$work/$name.m0"
    sleep "$idle_s"
    scrape >"$work/$name.m1"
    (
        while true; do
            scrape | grep '^apiserver_longrunning_requests{' | grep 'verb="WATCH"' || true
            echo ---
            sleep 1
        done
    ) >"$work/$name.watches" &
    sampler=$!
    local t1 t2
    t1="$(date +%s.%N)"
    "$gantry" kube bench-watch --kubeconfig "$kubeconfig" --pods "$count" --name "$name" \
        ${metrics_url:+--metrics-url "$metrics_url"} \
        --timeout-s "$timeout_s" -- "${command[@]}" >"$work/$name.json"
    t2="$(date +%s.%N)"
    scrape >"$work/$name.m2"
    kill "$sampler" 2>/dev/null || true
    wait "$sampler" 2>/dev/null || true
    sampler=""
    echo "$idle_s $t1 $t2" >"$work/$name.times"
    "$here/stop.sh" "$dir"
    dir=""
}

mkdir -p "$work/gantry-data"
# A free port for Gantry's API, so bench-watch can read its cycle figures from /metrics.
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
run gantry gantry upstream "http://127.0.0.1:$port/metrics" \
    "$gantry" serve --kubeconfig @KUBECONFIG@ --listen "127.0.0.1:$port" \
    --data-dir "$work/gantry-data"

# kube_scheduler NAME BINARY FLAGS... <PROFILE: a KubeSchedulerConfiguration for BINARY, whose
# profile (the `profiles:` list) comes on stdin, and a wrapper that writes it with the run's
# kubeconfig (bench-watch substitutes @KUBECONFIG@ in arguments only) and execs BINARY, so the
# process bench-watch samples is the scheduler itself. Both contenders get the same client
# limits and no leader election.
kube_scheduler() {
    local name="$1" binary="$2"
    shift 2
    {
        cat <<CFG
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: false
clientConnection:
  kubeconfig: @KUBECONFIG@
  qps: 5000
  burst: 5000
profiles:
CFG
        cat
    } >"$work/$name.yaml"
    cat >"$work/$name.sh" <<WRAP
#!/usr/bin/env bash
sed "s|@KUBECONFIG@|\$1|" "$work/$name.yaml" >"$work/$name-run.yaml"
exec "$binary" --config "$work/$name-run.yaml" --secure-port 0 --v=1 $* \
    >"$work/$name.log" 2>&1
WRAP
    chmod +x "$work/$name.sh"
}

# GenericWorkload turns on the Workload API's informers and the GangScheduling plugin in the
# default profile (pkg/scheduler/apis/config/v1/default_plugins.go).
kube_scheduler native "$bin/kube-scheduler-native" --feature-gates=GenericWorkload=true <<PROFILE
- schedulerName: native
PROFILE
run native native upstream "" "$work/native.sh" @KUBECONFIG@

kube_scheduler coscheduling "$bin/kube-scheduler" <<PROFILE
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
PROFILE
run coscheduling coscheduling plugins "" "$work/coscheduling.sh" @KUBECONFIG@

run raw-binder nobody plugins "" "$gantry" kube bench-bind --kubeconfig @KUBECONFIG@

python3 - "$work" "$workload" "$nodes" "$json" <<'PY'
import json, re, sys
from collections import defaultdict

work, workload, nodes, as_json = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "true"
names = ("gantry", "native", "coscheduling", "raw-binder")
line_re = re.compile(r'^(\w+)\{(.*)\} (\S+)$')
label_re = re.compile(r'(\w+)="([^"]*)"')

def parse(text):
    """(metric, labels) -> value, for the lines scrape() kept."""
    out = {}
    for line in text.splitlines():
        m = line_re.match(line)
        if m:
            out[(m.group(1), tuple(sorted(label_re.findall(m.group(2)))))] = float(m.group(3))
    return out

def requests(series):
    """Requests by 'VERB resource[/subresource]'."""
    by = defaultdict(float)
    for (metric, labels), value in series.items():
        if metric == "apiserver_request_total":
            l = dict(labels)
            resource = l.get("resource", "") + ("/" + l["subresource"] if l.get("subresource") else "")
            by[f'{l.get("verb", "?")} {resource or "(none)"}'] += value
    return by

def watches(series):
    return sum(v for (metric, _), v in series.items() if metric == "apiserver_longrunning_requests")

def api_load(name, bound):
    read = lambda suffix: parse(open(f"{work}/{name}.{suffix}").read())
    m0, m1, m2 = read("m0"), read("m1"), read("m2")
    idle_s, t1, t2 = (float(x) for x in open(f"{work}/{name}.times").read().split())
    r0, r1, r2 = requests(m0), requests(m1), requests(m2)
    by = {}
    for key in set(r1) | set(r2):
        idle_rate = (r1.get(key, 0) - r0.get(key, 0)) / idle_s
        run = r2.get(key, 0) - r1.get(key, 0) - idle_rate * (t2 - t1)
        if run > 0.5:
            by[key] = run
    samples = [parse(chunk) for chunk in open(f"{work}/{name}.watches").read().split("---")]
    peak = max((watches(s) for s in samples if s), default=0)
    per_pod = lambda x: round(x / bound, 3) if bound else None
    by_verb = defaultdict(float)
    for key, value in by.items():
        by_verb[key.split(" ")[0]] += value
    return {
        "api_requests_per_bound_pod": per_pod(sum(by.values())),
        "api_requests_per_bound_pod_by_verb": {k: per_pod(v) for k, v in sorted(by_verb.items())},
        "api_requests_per_bound_pod_by_verb_and_resource":
            {k: per_pod(v) for k, v in sorted(by.items(), key=lambda kv: -kv[1])},
        # The bench's own pod watch opened after the idle count, in both.
        "watches_held": max(0, int(peak - watches(m1) - 1)),
        "watches_opened": max(0, round(by_verb.get("WATCH", 0)) - 1),
    }

runs = {}
for name in names:
    run = json.load(open(f"{work}/{name}.json"))
    if not run.get("skipped"):
        run.update(api_load(name, run["pods_bound"]))
    runs[name] = run

def ratio(a, b, key):
    x, y = runs[a].get(key), runs[b].get(key)
    return round(x / y, 3) if x and y else None

out = {
    "workload": workload,
    "nodes": nodes,
    "pods": next((r["pods"] for r in runs.values() if "pods" in r), None),
    "contenders": runs,
    "ratios": {
        "gantry_pods_per_s_over_raw_binder": ratio("gantry", "raw-binder", "pods_per_s"),
        "gantry_pods_per_s_over_native": ratio("gantry", "native", "pods_per_s"),
        "gantry_pods_per_s_over_coscheduling": ratio("gantry", "coscheduling", "pods_per_s"),
        "gantry_api_requests_per_pod_over_native":
            ratio("gantry", "native", "api_requests_per_bound_pod"),
        "native_gang_time_over_gantry": ratio("native", "gantry", "all_gangs_placed_s"),
        "coscheduling_gang_time_over_gantry": ratio("coscheduling", "gantry", "all_gangs_placed_s"),
    },
}
if as_json:
    print(json.dumps(out))
    sys.exit(0)
print(f"{workload}: {nodes} nodes, {out['pods']} pods")
secs = lambda v: "never" if v is None else f"{v:.1f}"
print(f"{'contender':<13}{'pods/s':>8}{'gangs(s)':>10}{'largest(s)':>11}{'partial':>8}{'unbound':>8}"
      f"{'GPU':>7}{'RSS MiB':>9}{'CPU s':>7}{'req/pod':>8}{'watches':>8}{'opened':>8}  note")
for name, o in runs.items():
    if o.get("skipped"):
        print(f"{name:<13}skipped")
        continue
    rss = "-" if o["peak_rss_mib"] is None else f"{o['peak_rss_mib']:.0f}"
    cpu = "-" if o["cpu_s"] is None else f"{o['cpu_s']:.1f}"
    note = f"timed out with {o['pods_bound']} bound" if o["timed_out"] else ""
    print(f"{name:<13}{o['pods_per_s']:>8.1f}{secs(o['all_gangs_placed_s']):>10}"
          f"{secs(o['largest_gang_bound_s']):>11}{o['partial_gangs']:>8}{o['pods_unbound']:>8}"
          f"{o['gpu_allocation']:>7.1%}{rss:>9}{cpu:>7}{o['api_requests_per_bound_pod'] or 0:>8.2f}"
          f"{o['watches_held']:>8}{o['watches_opened']:>8}  {note}")
for name, o in runs.items():
    if not o.get("skipped"):
        verbs = ", ".join(f"{k} {v}" for k, v in o["api_requests_per_bound_pod_by_verb"].items())
        print(f"{name} requests per bound pod by verb: {verbs}")
    if o.get("cycles"):
        print(f"{name} cycles: {json.dumps(o['cycles'])}")
for k, v in out["ratios"].items():
    print(f"{k}: {v}")
PY
