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
artifacts="$CARGO_TARGET_DIR/ui-artifacts"
rm -rf "$artifacts"
source scripts/test-server.sh
admin="ui-admin-$(random_token)"
viewer="ui-viewer-$(random_token)"
# A heavy load fills the cluster within seconds, so there are pending jobs to explain.
start_test_server "$(printf 'tokens:\n  - {name: alice, role: admin, token: %s}\n  - {name: bob, role: viewer, token: %s}\n' "$admin" "$viewer")" \
    --jobs-per-s 200
GANTRY_URL="$url" ADMIN_TOKEN="$admin" VIEWER_TOKEN="$viewer" UI_ARTIFACTS="$artifacts" \
    PLUGIN_DIR="$CARGO_TARGET_DIR/wasm32-wasip2/plugin" CHROMIUM="$(command -v chromium)" \
    node web/tests/ui.test.mjs
