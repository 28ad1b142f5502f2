#!/usr/bin/env bash
# Build every policy under plugins/ into $CARGO_TARGET_DIR/wasm32-wasip2/plugin/*.wasm (the host
# tests and benches load them from there):
# - the Rust ones as wasm32-wasip2 components, with cargo;
# - the Python ones with componentize-py (pinned in plugins/python/requirements.txt, installed
#   into a cached venv), as gpu_fit_py.wasm, gpu_binpack_py.wasm, hostile_python_loop.wasm;
# - the JavaScript ones with ComponentizeJS (pinned in plugins/js/package-lock.json, installed
#   into a cached node_modules), as gpu_fit_js.wasm, team_quota_js.wasm.
# The tools live under ${XDG_CACHE_HOME:-$HOME/.cache}/gantry/, keyed by the hash of their pin
# file, and a Python or JS component is rebuilt only when its inputs (sources, WIT, tool pin)
# changed, so a warm run costs seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
packages=(gpu-fit gpu-binpack team-quota noop keep-off label-affinity)
for dir in plugins/hostile/*/; do
    [ -f "$dir/Cargo.toml" ] && packages+=("hostile-$(basename "$dir")")
done
args=()
for package in "${packages[@]}"; do args+=(-p "$package"); done
cargo build --quiet --profile plugin --target wasm32-wasip2 "${args[@]}"
echo "built ${#packages[@]} Rust policies into $CARGO_TARGET_DIR/wasm32-wasip2/plugin/"

out="$CARGO_TARGET_DIR/wasm32-wasip2/plugin"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/gantry"
wit=wit/policy-0.1.0
mkdir -p "$out/.stamps" "$cache"
hash_of() { cat "$@" | sha256sum | cut -c1-16; }

# componentize-py in a venv named after the hash of its pin file.
py_tool="$cache/componentize-py-$(hash_of plugins/python/requirements.txt)"
if [ ! -x "$py_tool/bin/componentize-py" ]; then
    echo "installing componentize-py into $py_tool"
    rm -rf "$py_tool"
    python3 -m venv "$py_tool"
    "$py_tool/bin/pip" install --quiet --disable-pip-version-check -r plugins/python/requirements.txt
fi
# ComponentizeJS in a node_modules named after the hash of the lock file.
js_tool="$cache/componentize-js-$(hash_of plugins/js/package-lock.json)"
if [ ! -x "$js_tool/node_modules/.bin/componentize-js" ]; then
    echo "installing ComponentizeJS into $js_tool"
    rm -rf "$js_tool"
    mkdir -p "$js_tool"
    cp plugins/js/package.json plugins/js/package-lock.json "$js_tool/"
    # `npm install` over the lock installs the locked versions; `npm ci` would also insist on
    # lock entries for other platforms' optional binaries, which the registry mirror omits.
    (cd "$js_tool" && npm install --no-audit --no-fund --loglevel=error)
fi

# build NAME KIND WORLD SOURCE...: rebuild $out/NAME.wasm unless its stamp (the hash of every
# input) is unchanged. Runs in the background; `wait_all` collects the failures.
pids=()
names=()
build() {
    local name=$1 kind=$2 world=$3
    shift 3
    local files
    files=$(find "$@" "$wit" -type f -not -name '*.pyc' | sort)
    local stamp
    # shellcheck disable=SC2086
    stamp=$( (echo "$kind $world"; cat $files; cat plugins/python/requirements.txt plugins/js/package-lock.json) | sha256sum | cut -c1-64)
    if [ -f "$out/$name.wasm" ] && [ "$(cat "$out/.stamps/$name" 2>/dev/null)" = "$stamp" ]; then
        return
    fi
    rm -f "$out/.stamps/$name"
    (
        log="$out/.stamps/$name.log"
        if [ "$kind" = python ]; then
            # --stub-wasi: the component imports no WASI at all (see plugins/README.md).
            local paths=()
            for dir in "$@"; do paths+=(-p "$dir"); done
            "$py_tool/bin/componentize-py" -d "$wit" -w "gantry:policy/$world@0.1.0" \
                componentize --stub-wasi "${paths[@]}" app -o "$out/$name.wasm" >"$log" 2>&1
        else
            # Every optional WASI feature off: the component imports only gantry:policy.
            "$js_tool/node_modules/.bin/componentize-js" "$1" --wit "$wit" \
                --world-name "gantry:policy/$world@0.1.0" \
                --disable stdio random clocks http fetch-event \
                -o "$out/$name.wasm" >"$log" 2>&1
        fi || { echo "error: building $name.wasm failed:" >&2; cat "$log" >&2; exit 1; }
        echo "$stamp" >"$out/.stamps/$name"
        echo "built $name.wasm"
    ) &
    pids+=($!)
    names+=("$name")
}
build gpu_fit_py python filter plugins/python/gpu-fit plugins/python/sdk
build gpu_binpack_py python score plugins/python/gpu-binpack plugins/python/sdk
build hostile_python_loop python filter plugins/hostile/python-loop
build gpu_fit_js js filter plugins/js/gpu-fit/policy.js
build team_quota_js js quota plugins/js/team-quota/policy.js
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ "$failed" = 0 ] || exit 1
echo "Python and JavaScript policies up to date in $out/"
