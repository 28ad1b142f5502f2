#!/usr/bin/env bash
# Stops the control plane's kube-apiserver and starts it again, same port, same etcd: what a
# control-plane upgrade or crash looks like to clients. The e2e tests run it mid-run.
#   tests/cluster/restart-apiserver.sh DIR [DOWN_SECONDS] [SIGNAL]
# DOWN_SECONDS (default 2) is how long the API server stays away. SIGNAL (default TERM) stops
# it: TERM drains it gracefully, KILL is a crash (no goodbye bookmarks to its watchers, so they
# cannot resume where they were). Returns once /readyz is ok.
set -euo pipefail
dir="${1:?usage: restart-apiserver.sh DIR [DOWN_SECONDS] (the folder start.sh printed)}"
down="${2:-2}"
signal="${3:-TERM}"
[[ -f "$dir/kube-apiserver.run" ]] || { echo "restart-apiserver.sh: $dir was not made by this start.sh" >&2; exit 1; }
timeout_s="${GANTRY_CLUSTER_START_TIMEOUT_S:-60}"

pid="$(cat "$dir/kube-apiserver.pid")"
kill "-$signal" "$pid" 2>/dev/null || true
for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
kill -KILL "$pid" 2>/dev/null || true
sleep "$down"

echo "--- restarted $(date -u +%FT%TZ)" >>"$dir/kube-apiserver.log"
setsid bash "$dir/kube-apiserver.run" >>"$dir/kube-apiserver.log" 2>&1 </dev/null &
echo $! >"$dir/kube-apiserver.pid"
started=$(date +%s)
until curl -sf --cacert "$dir/ca.crt" -H "Authorization: Bearer $(cat "$dir/admin.token")" \
    "https://127.0.0.1:$(cat "$dir/api.port")/readyz" >/dev/null 2>&1; do
    if (( $(date +%s) - started >= timeout_s )); then
        echo "restart-apiserver.sh: kube-apiserver not ready within ${timeout_s} s; last lines of its log:" >&2
        tail -n 20 "$dir/kube-apiserver.log" >&2
        exit 1
    fi
    sleep 0.2
done
echo "restart-apiserver.sh: kube-apiserver back after $(( $(date +%s) - started )) s" >&2
