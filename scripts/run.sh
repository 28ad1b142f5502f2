#!/usr/bin/env bash
# Gantry's main job for now: build the example policies, validate each as an admin would, and
# measure them against native Rust. (The simulated 7,500-node cluster comes next.)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
scripts/build-plugins.sh
cargo build --release --quiet -p gantry
gantry="$CARGO_TARGET_DIR/release/gantry"
for policy in gpu_fit gpu_binpack team_quota; do
    echo
    "$gantry" policy validate "$CARGO_TARGET_DIR/wasm32-wasip2/plugin/$policy.wasm"
done
echo
"$gantry" bench policy --nodes 7500
