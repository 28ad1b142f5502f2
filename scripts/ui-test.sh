#!/usr/bin/env bash
# Browser tests of the web UI (web/tests/ui.spec.mjs): @playwright/test driving Debian's
# Chromium, headless, against a real `gantry serve` with an admin and a viewer token.
# Everything goes to $CARGO_TARGET_DIR/ui-artifacts/: screenshots and results.json, report.json,
# html-report/, and test-results/ with the trace and a screenshot of each failed test.
# Ends with `ui tests: N passed; M failed`, the line scripts/test.sh counts.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
scripts/chromium.sh >/dev/null
scripts/ui-build.sh
# Rebuild so the binary embeds the UI just built (build.rs watches web/dist/). Under
# scripts/test.sh, `cargo test` already built it with this UI: building it again here, with the
# features `cargo build -p gantry` resolves rather than the whole workspace's, would compile
# gantry once more, and the next `cargo test` again.
if [ -z "${GANTRY_BINARY_CURRENT:-}" ]; then
    cargo build --release --quiet -p gantry
fi
artifacts="$CARGO_TARGET_DIR/ui-artifacts"
rm -rf "$artifacts"
source scripts/test-server.sh
admin="ui-admin-$(random_token)"
viewer="ui-viewer-$(random_token)"
# The demo's cluster with every queue reclaiming its quota by eviction (off by default, as in
# Kueue), so that some jobs are preempted and a job's history can show it.
mkdir -p "$artifacts"
reclaiming="$artifacts/reclaiming-cluster.yaml"
sed 's/^\(    nominal_gpus: .*\)$/\1\n    reclaim_within_cohort: any/' \
    ../shared/clusters/openai-like-7500.yaml >"$reclaiming"
# Nodes fail far more often than the demo's default (one every 3 min), so that within seconds
# a running job has been restarted by a node failure, and Suspect, Repair and Preflight nodes
# show on the heatmap: over 7,500 nodes, a failure every 4 s or so. The breaker's hourly cap is
# raised so that it never trips on this rate: a tripped breaker would stop the restarts (the
# banner's test intercepts /api/health to show a tripped one instead).
failures="$artifacts/failures.yaml"
cat >"$failures" <<'YAML'
mtbf_node_days: 0.35
repair_s: 240
preflight_s: 60
health:
  max_cordons_per_hour: 1000000
YAML
# A heavy load fills the cluster within seconds, so there are pending jobs to explain.
start_test_server "$(printf 'tokens:\n  - {name: alice, role: admin, token: %s}\n  - {name: bob, role: viewer, token: %s}\n' "$admin" "$viewer")" \
    --jobs-per-s 200 --cluster "$reclaiming" --failures "$failures"
rc=0
(cd web && GANTRY_URL="$url" ADMIN_TOKEN="$admin" VIEWER_TOKEN="$viewer" UI_ARTIFACTS="$artifacts" \
    PLUGIN_DIR="$CARGO_TARGET_DIR/wasm32-wasip2/plugin" CHROMIUM="$(command -v chromium)" \
    npx playwright test --config playwright.config.mjs) || rc=$?
# Counted from the JSON reporter. An error outside any test (a missing variable, a failing
# hook) or no report at all is a failure.
read -r passed failed skipped < <(node -e '
    let s = { expected: 0, unexpected: 0, flaky: 0, skipped: 0 }, errors = 1;
    try {
        const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
        s = r.stats;
        errors = r.errors.length;
    } catch {}
    console.log(s.expected, s.unexpected + s.flaky + (errors > 0 ? 1 : 0), s.skipped);
' "$artifacts/report.json")
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
echo "traces and screenshots of failures: $artifacts/test-results; report: $artifacts/html-report/index.html"
if [ "$skipped" -gt 0 ]; then echo "ui tests skipped: $skipped"; fi
echo "ui tests: $passed passed; $failed failed"
[ "$failed" -eq 0 ]
