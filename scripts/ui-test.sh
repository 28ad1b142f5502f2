#!/usr/bin/env bash
# Browser tests of the web UI (web/tests/ui.test.mjs): playwright-core driving Debian's
# Chromium, headless, against a real `gantry serve` with an admin and a viewer token.
# Screenshots and results.json go to $CARGO_TARGET_DIR/ui-artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
if ! command -v chromium >/dev/null; then
    # playwright's own browser download is not used: Debian's Chromium is what the test drives.
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
scripts/ui-build.sh
# Rebuild so the binary embeds the UI just built (build.rs watches web/dist/).
cargo build --release --quiet -p gantry
gantry="$CARGO_TARGET_DIR/release/gantry"
artifacts="$CARGO_TARGET_DIR/ui-artifacts"
rm -rf "$artifacts"
work="$(mktemp -d)"
pid=""
cleanup() {
    if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
admin="ui-admin-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
viewer="ui-viewer-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
printf 'tokens:\n  - {name: alice, role: admin, token: %s}\n  - {name: bob, role: viewer, token: %s}\n' \
    "$admin" "$viewer" >"$work/tokens.yaml"
# A heavy load fills the cluster within seconds, so there are pending jobs to explain.
GANTRY_PLUGIN_DIR="$CARGO_TARGET_DIR/wasm32-wasip2/plugin" \
    "$gantry" serve --listen 127.0.0.1:0 --data-dir "$work/data" --tokens "$work/tokens.yaml" \
    --log-every-s 3600 --jobs-per-s 200 >"$work/serve.log" 2>&1 &
pid=$!
url=""
for _ in $(seq 600); do
    url="$(sed -n 's|.*API on \(http://[^ ]*\)/api .*|\1|p' "$work/serve.log")"
    if [ -n "$url" ] && curl -fs "$url/readyz" >/dev/null; then break; fi
    kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log"; exit 1; }
    sleep 0.1
done
[ -n "$url" ] || { echo "gantry serve did not start:"; cat "$work/serve.log"; exit 1; }
GANTRY_URL="$url" ADMIN_TOKEN="$admin" VIEWER_TOKEN="$viewer" UI_ARTIFACTS="$artifacts" \
    PLUGIN_DIR="$CARGO_TARGET_DIR/wasm32-wasip2/plugin" CHROMIUM="$(command -v chromium)" \
    node web/tests/ui.test.mjs
