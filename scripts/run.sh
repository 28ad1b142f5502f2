#!/usr/bin/env bash
# Gantry's main job with no cluster configured: build it and the example policies, then run a
# simulated copy of the 7,500-node cluster in ../shared/clusters/ under a steady synthetic load.
# Extra arguments go to `gantry serve` (for example --duration-s 60).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
scripts/build-plugins.sh
cargo build --release --quiet -p gantry
exec "$CARGO_TARGET_DIR/release/gantry" serve "$@"
