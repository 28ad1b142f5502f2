#!/usr/bin/env bash
# Builds the test control plane (kube-apiserver, etcd, kwok), kubectl, the same release's own
# kube-scheduler (native gang scheduling, installed as kube-scheduler-native), and kube-scheduler
# 1.34 with scheduler-plugins' Coscheduling plugin (plus that plugin's PodGroup CRD) once, and
# caches them.
#
# Binaries land in ${XDG_CACHE_HOME:-$HOME/.cache}/gantry/cluster/bin/<key>/, where <key> hashes
# everything that decides their content (the wrapper module's go.mod, go.sum and sources, the
# kwok pin and the Go version). GOPATH, GOMODCACHE and GOCACHE live under the same cache folder,
# so a CI job that restores that one folder reuses downloads and compiled packages.
#
# Prints the binary folder on stdout (logs go to stderr), so callers can do
#   GANTRY_CLUSTER_BIN=$(tests/cluster/build.sh)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# kwok is installed with `go install ...@version` (its go.mod has no replaces); pinned here.
KWOK_VERSION=v0.8.0

cache="${XDG_CACHE_HOME:-$HOME/.cache}/gantry/cluster"
export GOPATH="$cache/go" GOMODCACHE="$cache/go/pkg/mod" GOCACHE="$cache/go-build"
# Never fetch another Go toolchain: the proxy serves modules, and the local Go is new enough.
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly
# The machine is shared: two compile jobs at most, at low priority.
export GOMAXPROCS="${GOMAXPROCS:-2}"

command -v go >/dev/null || { echo "build.sh: go not found on PATH (the control plane is built from Go modules)" >&2; exit 1; }
key="$(
    cd "$here"
    {
        cat controlplane/go.mod controlplane/go.sum scheduler/go.mod scheduler/go.sum
        find controlplane/cmd scheduler/cmd -name '*.go' -print0 | sort -z | xargs -0 cat
        echo "kwok $KWOK_VERSION"
        go env GOVERSION
    } | sha256sum | cut -c1-16
)"
bin="$cache/bin/$key"
if [[ -x "$bin/kube-apiserver" && -x "$bin/etcd" && -x "$bin/kubectl" && -x "$bin/kwok" && -x "$bin/kube-scheduler" && -x "$bin/kube-scheduler-native" && -f "$bin/podgroup-crd.yaml" ]]; then
    echo "$bin"
    exit 0
fi

staging="$cache/bin/.staging-$key-$$"
rm -rf "$staging"
mkdir -p "$staging"
trap 'rm -rf "$staging"' EXIT
start=$(date +%s)
echo "build.sh: building kube-apiserver, etcd, kubectl and kube-scheduler into $bin (first time only; several minutes)" >&2
(
    cd "$here/controlplane"
    nice -n 10 go build -p 2 -trimpath -ldflags='-s -w' -o "$staging/" ./cmd/kube-apiserver ./cmd/etcd ./cmd/kubectl
    nice -n 10 go build -p 2 -trimpath -ldflags='-s -w' -o "$staging/kube-scheduler-native" ./cmd/kube-scheduler
) >&2
# kube-scheduler with Coscheduling, from its own module: scheduler-plugins pins Kubernetes 1.34.
# Its PodGroup CRD comes from the same module version, so the CRD matches the plugin.
echo "build.sh: building kube-scheduler with the Coscheduling plugin" >&2
(
    cd "$here/scheduler"
    nice -n 10 go build -p 2 -trimpath -ldflags='-s -w' -o "$staging/" ./cmd/kube-scheduler
    cp "$(go list -m -f '{{.Dir}}' sigs.k8s.io/scheduler-plugins)/manifests/coscheduling/crd.yaml" "$staging/podgroup-crd.yaml"
    chmod u+w "$staging/podgroup-crd.yaml"
) >&2
echo "build.sh: installing kwok $KWOK_VERSION" >&2
GOBIN="$staging" GOFLAGS= nice -n 10 go install -p 2 -trimpath -ldflags='-s -w' "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2
# Publish atomically, so an interrupted build never leaves a half-filled folder that looks done.
mkdir -p "$cache/bin"
rm -rf "$bin"
mv "$staging" "$bin"
trap - EXIT
echo "build.sh: built in $(( $(date +%s) - start )) s" >&2
echo "$bin"
