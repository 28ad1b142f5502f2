#!/usr/bin/env bash
# Every test Gantry has, from a fresh machine: installs the toolchain and the wasm32-wasip2
# target, builds the policies from plugins/ and the web UI, checks formatting and lints, runs the
# tests, fuzzes the API and drives the UI in a browser.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
step() { printf '\n==> %s\n' "$*"; }
# What this run compiled is printed at the end, from cargo's fingerprints newer than this mark
# (cargo runs --quiet here, so its own "Compiling" lines never show): a second run with nothing
# changed compiles nothing, since the UI build writes web/dist only where the UI changed.
run_start="$(mktemp)"
trap 'rm -f "$run_start"' EXIT

step "toolchain, policies, the web UI and Chromium"
# Chromium first: the browser tests come last, and a machine that cannot install it should
# say so before the long steps, not after them.
scripts/chromium.sh
scripts/build-plugins.sh
# Before any cargo build, so the one build of gantry embeds the UI.
scripts/ui-build.sh

step "format"
cargo fmt --all --check

step "lints"
cargo clippy --release --workspace --all-targets --quiet -- -D warnings

step "sizes (scripts/sizes.py: files under host/ over 1,500 lines, production functions over 150)"
python3 scripts/sizes.py

step "import circles (scripts/circles.py: file-level circles inside each crate under host/)"
python3 scripts/circles.py

step "test control plane (tests/cluster: kube-apiserver, etcd, kwok, kubectl, kube-scheduler + Coscheduling; built once and cached)"
# The kube e2e tests in the cargo run below start it from these binaries. A failed build stops
# here with the reason; the e2e tests never skip once this is set.
GANTRY_CLUSTER_BIN="$(tests/cluster/build.sh)"
export GANTRY_CLUSTER_BIN

step "image (deploy/Containerfile: a static musl binary with the policies, built with buildah)"
# kube_image.rs unpacks it and runs it chrooted against the test control plane: containers
# cannot run on these machines (crun and runc fail with "setrlimit: Operation not permitted").
GANTRY_IMAGE="$(scripts/image.sh)"
export GANTRY_IMAGE

step "tests"
# The control-plane tests (host/gantry/tests/kube_*.rs) are #[ignore]d, so a bare `cargo test`
# is green without tests/cluster; here, with it built above, they run too.
cargo test --release --workspace --quiet -- --include-ignored 2>&1 | tee "$CARGO_TARGET_DIR/test.log"
# That run built target/release/gantry with the UI of the first step: the steps below use it.
export GANTRY_BINARY_CURRENT=1

step "cluster bench, small (tests/cluster/bench.sh: Gantry, native kube-scheduler, Coscheduling, raw binder)"
# Bad sizes and workloads are refused with exit 2 before anything starts.
bench_refuses() { # script (bench or scale), expected-text, arguments...
    local script="tests/cluster/$1.sh" expected="$2" out code=0
    shift 2
    out="$("$script" "$@" 2>&1)" || code=$?
    [[ "$code" == 2 && "$out" == *"$expected"* ]] \
        || { echo "$script $*: exit $code, '$out' (wanted exit 2 naming '$expected')"; return 1; }
}
# Both workloads, small: all four contenders bind every pod and no gang binds partly; the
# figures are printed, never thresholds (the acceptance runs are bench.sh --nodes 1000 --pods
# 5000 and --workload openai at 1,000 to 7,500 nodes).
bench_small() { # name, arguments...
    local name="$1"
    shift
    tests/cluster/bench.sh "$@" --json --timeout-s 300 --idle-s 2 \
        >"$CARGO_TARGET_DIR/bench-$name.json" && python3 - "$CARGO_TARGET_DIR/bench-$name.json" <<'PY'
import json, sys
out = json.load(open(sys.argv[1]))
print(json.dumps(out["ratios"]))
runs = out["contenders"]
print(json.dumps({n: o.get("api_requests_per_bound_pod_by_verb") for n, o in runs.items()}))
bad = [f"{name}: {o['pods_unbound']} unbound, {o['partial_gangs']} partial gangs"
       for name, o in runs.items() if o["pods_unbound"] or o["partial_gangs"]]
bad += [f"{name}: no API requests counted" for name, o in runs.items()
        if not o.get("api_requests_per_bound_pod")]
if bad:
    sys.exit("bench: " + "; ".join(bad))
PY
}
if bench_refuses bench "unknown workload 'slurm'" --workload slurm \
    && bench_refuses bench "defined for 32 to 7500 nodes, not 7501" --workload openai --nodes 7501 \
    && bench_refuses bench "sizes itself from --nodes" --workload openai --nodes 64 --pods 10 \
    && bench_refuses scale "a curve needs two sizes or more" --nodes 1000 \
    && bench_refuses scale "'1k' is not a node count" --nodes 1000,1k \
    && bench_small mixed --nodes 64 --pods 300 \
    && bench_small openai --workload openai --nodes 64
then
    echo "test result: ok. 1 passed; 0 failed (cluster bench: refusals; every pod bound, no partial gang)" >>"$CARGO_TARGET_DIR/test.log"
else
    echo "test result: FAILED. 0 passed; 1 failed (cluster bench)" >>"$CARGO_TARGET_DIR/test.log"
fi

step "API fuzzing (schemathesis)"
if scripts/api-fuzz.sh; then
    echo "test result: ok. 1 passed; 0 failed (schemathesis: no 5xx)" >>"$CARGO_TARGET_DIR/test.log"
else
    echo "test result: FAILED. 0 passed; 1 failed (schemathesis)" >>"$CARGO_TARGET_DIR/test.log"
fi

step "web UI in a browser (@playwright/test, Debian's Chromium; artifacts in \$CARGO_TARGET_DIR/ui-artifacts)"
if scripts/ui-test.sh 2>&1 | tee "$CARGO_TARGET_DIR/ui-test.log"; then
    n="$(sed -n 's/^ui tests: \([0-9]*\) passed.*/\1/p' "$CARGO_TARGET_DIR/ui-test.log")"
    echo "test result: ok. ${n:-1} passed; 0 failed (browser UI tests)" >>"$CARGO_TARGET_DIR/test.log"
else
    echo "test result: FAILED. 0 passed; 1 failed (browser UI tests)" >>"$CARGO_TARGET_DIR/test.log"
fi
step "what this run compiled (cargo's fingerprints written since it began)"
compiled="$(find "$CARGO_TARGET_DIR" -path '*/.fingerprint/*' -type f -newer "$run_start" 2>/dev/null \
    | sed -E 's#.*/\.fingerprint/([^/]+)/.*#\1#; s/-[0-9a-f]{16}$//' | sort -u || true)"
if [[ -n "$compiled" ]]; then
    printf 'Compiling %s\n' $compiled
else
    echo "compiled nothing: every crate, test and policy was fresh"
fi
# One closing line for the whole run, in the form CI reads.
awk '/^test result:/ { p += $4; f += $6 } END { printf "\n%d passed, %d failed\n", p, f; exit (f > 0) }' \
    "$CARGO_TARGET_DIR/test.log"
