# Sourced by the scripts that test a running server (api-fuzz.sh, ui-test.sh): a scratch folder,
# a real `gantry serve` on a free loopback port with the given tokens file, stopped and cleaned
# up on exit. After `start_test_server TOKENS_YAML_TEXT [serve args…]`: $work, $pid and $url.
work="$(mktemp -d)"
pid=""
cleanup() {
    if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

random_token() { od -An -tx1 -N16 /dev/urandom | tr -d ' \n'; }

start_test_server() {
    printf '%s' "$1" >"$work/tokens.yaml"
    shift
    GANTRY_PLUGIN_DIR="$CARGO_TARGET_DIR/wasm32-wasip2/plugin" \
        "$CARGO_TARGET_DIR/release/gantry" serve --listen 127.0.0.1:0 --data-dir "$work/data" \
        --tokens "$work/tokens.yaml" --log-every-s 3600 "$@" >"$work/serve.log" 2>&1 &
    pid=$!
    url=""
    for _ in $(seq 600); do
        url="$(sed -n 's|.*API on \(http://[^ ]*\)/api .*|\1|p' "$work/serve.log")"
        if [ -n "$url" ] && curl -fs "$url/readyz" >/dev/null; then return 0; fi
        kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log"; exit 1; }
        sleep 0.1
    done
    echo "gantry serve did not start:"; cat "$work/serve.log"; exit 1
}
