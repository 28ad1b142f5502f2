#!/usr/bin/env bash
# Stops a control plane that start.sh started, by the PIDs it recorded, and removes its folder.
#   tests/cluster/stop.sh DIR
set -uo pipefail
dir="${1:?usage: stop.sh DIR (the folder start.sh printed)}"
[[ -d "$dir" ]] || exit 0
# kwok first (it writes to the API server), etcd last (the API server needs it to drain).
for name in kwok kube-apiserver etcd; do
    pidfile="$dir/$name.pid"
    [[ -f "$pidfile" ]] || continue
    pid="$(cat "$pidfile")"
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
done
# The folder is ours only if start.sh made it (its PID files say so).
if [[ -f "$dir/etcd.pid" ]]; then
    rm -rf "$dir"
fi
