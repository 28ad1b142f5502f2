#!/usr/bin/env bash
# Gantry's main job with no cluster configured: build it, the example policies and the web UI,
# then run a simulated copy of the 7,500-node cluster in ../shared/clusters/ under a steady
# synthetic load, with the API and the UI on http://127.0.0.1:7070/.
# Extra arguments go to `gantry serve` (for example --duration-s 60).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
scripts/build-plugins.sh
scripts/ui-build.sh
cargo build --release --quiet -p gantry
exec "$CARGO_TARGET_DIR/release/gantry" serve "$@"
