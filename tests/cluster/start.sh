#!/usr/bin/env bash
# Starts the test control plane on loopback: etcd, kube-apiserver and kwok, from the binaries
# build.sh caches. Certificates, the admin token and all state go to a fresh temporary folder.
#
#   dir=$(tests/cluster/start.sh)      # prints the folder; $dir/kubeconfig is the admin config
#   tests/cluster/stop.sh "$dir"       # stops the three processes by PID and removes the folder
#
# GANTRY_CLUSTER_BIN may name a folder holding the binaries (build.sh's output) to skip the
# build check. Ready means: etcd answers, kube-apiserver's /readyz is ok, and kwok's /healthz is.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${GANTRY_CLUSTER_BIN:-$("$here/build.sh")}"
for b in etcd kube-apiserver kwok; do
    [[ -x "$bin/$b" ]] || { echo "start.sh: $bin/$b is missing; run tests/cluster/build.sh" >&2; exit 1; }
done
timeout_s="${GANTRY_CLUSTER_START_TIMEOUT_S:-60}"

dir="$(mktemp -d "${TMPDIR:-/tmp}/gantry-cluster.XXXXXX")"
started=$(date +%s)
fail() {
    echo "start.sh: $1" >&2
    for log in "$dir"/*.log; do
        [[ -f "$log" ]] && { echo "--- last lines of $log" >&2; tail -n 20 "$log" >&2; }
    done
    "$here/stop.sh" "$dir" >&2 || true
    exit 1
}

# Free loopback ports, chosen by the kernel, so that several clusters (and CI jobs) can coexist.
read -r etcd_port peer_port api_port kwok_port < <(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
PY
)

# A throwaway CA, a serving certificate for 127.0.0.1, the service-account key pair and one
# admin bearer token: nothing is reused between runs.
(
    cd "$dir"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=gantry-test-ca" \
        -keyout ca.key -out ca.crt 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
        -keyout apiserver.key -out apiserver.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
        -extfile apiserver.ext -out apiserver.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
) || fail "cannot generate certificates with openssl"
token="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
echo "$token,admin,admin,system:masters" >"$dir/tokens.csv"
cat >"$dir/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: gantry-test
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority-data: $(base64 -w0 "$dir/ca.crt")
users:
- name: admin
  user:
    token: $token
contexts:
- name: gantry-test
  context: {cluster: gantry-test, user: admin}
current-context: gantry-test
KC

# setsid: each process leads its own group, so stop.sh's signal reaches it and nothing else.
setsid "$bin/etcd" --name gantry-test --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "gantry-test=http://127.0.0.1:$peer_port" --listen-metrics-urls "" \
    --log-level warn >"$dir/etcd.log" 2>&1 </dev/null &
echo $! >"$dir/etcd.pid"

wait_for() { # what, command...
    local what="$1"; shift
    until "$@" >/dev/null 2>&1; do
        (( $(date +%s) - started < timeout_s )) || fail "$what not ready within ${timeout_s} s"
        sleep 0.2
    done
}
wait_for etcd curl -sf "http://127.0.0.1:$etcd_port/health"

# The upstream gang API (scheduling.k8s.io Workload and PodGroup, and the pods'
# spec.schedulingGroup) is beta in 1.37 but off by default: its feature gate and API version
# are turned on.
# Since 1.37 the endpoint reconciler refuses a loopback advertise address; nothing here reads
# the default Service's endpoints (clients are given the address), so it is turned off.
# No controller manager runs: ServiceAccount admission would wait for default accounts it
# creates, and TaintNodesByCondition would leave a not-ready taint only it removes.
# The command goes into a script of its own, so restart-apiserver.sh can run the same server
# again on the same port and etcd (the e2e tests restart it mid-run).
cat >"$dir/kube-apiserver.run" <<RUN
exec "$bin/kube-apiserver" \\
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$api_port" \
    --etcd-servers="http://127.0.0.1:$etcd_port" \
    --tls-cert-file="$dir/apiserver.crt" --tls-private-key-file="$dir/apiserver.key" \
    --client-ca-file="$dir/ca.crt" --token-auth-file="$dir/tokens.csv" \
    --authorization-mode=RBAC \
    --service-account-issuer=https://kubernetes.default.svc \
    --service-account-key-file="$dir/sa.pub" --service-account-signing-key-file="$dir/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 --endpoint-reconciler-type=none \
    --disable-admission-plugins=ServiceAccount,TaintNodesByCondition \
    --feature-gates=GenericWorkload=true --runtime-config=scheduling.k8s.io/v1beta1=true \
    --profiling=false --v=1
RUN
echo "$token" >"$dir/admin.token"
echo "$api_port" >"$dir/api.port"
setsid bash "$dir/kube-apiserver.run" >"$dir/kube-apiserver.log" 2>&1 </dev/null &
echo $! >"$dir/kube-apiserver.pid"
wait_for kube-apiserver curl -sf --cacert "$dir/ca.crt" -H "Authorization: Bearer $token" \
    "https://127.0.0.1:$api_port/readyz"

setsid "$bin/kwok" --kubeconfig="$dir/kubeconfig" --config="$here/kwok-stages.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --server-address="127.0.0.1:$kwok_port" >"$dir/kwok.log" 2>&1 </dev/null &
echo $! >"$dir/kwok.pid"
wait_for kwok curl -sf "http://127.0.0.1:$kwok_port/healthz"

echo "start.sh: control plane up in $(( $(date +%s) - started )) s: KUBECONFIG=$dir/kubeconfig" >&2
echo "$dir"
