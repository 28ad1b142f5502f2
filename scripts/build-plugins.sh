#!/usr/bin/env bash
# Build every Rust policy under plugins/ as a wasm32-wasip2 component, into
# $CARGO_TARGET_DIR/wasm32-wasip2/plugin/*.wasm (the host tests and benches load them from there).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
packages=(gpu-fit gpu-binpack team-quota noop)
for dir in plugins/hostile/*/; do
    [ -f "$dir/Cargo.toml" ] && packages+=("hostile-$(basename "$dir")")
done
args=()
for package in "${packages[@]}"; do args+=(-p "$package"); done
cargo build --quiet --profile plugin --target wasm32-wasip2 "${args[@]}"
echo "built ${#packages[@]} policies into $CARGO_TARGET_DIR/wasm32-wasip2/plugin/"
