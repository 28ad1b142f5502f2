# Sourced by the scripts: one toolchain, one cached target folder.
# CI clones afresh each run; keeping cargo's target folder outside the clone means wasmtime is
# compiled once per machine, not once per run.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gantry/target}"
export CARGO_TERM_PROGRESS_WHEN="${CARGO_TERM_PROGRESS_WHEN:-never}"
toolchain="$(sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml)"
if ! rustup run "$toolchain" rustc --version >/dev/null 2>&1 \
    || ! rustup target list --installed --toolchain "$toolchain" | grep -qx wasm32-wasip2; then
    rustup toolchain install "$toolchain" --profile minimal \
        --component clippy --component rustfmt --target wasm32-wasip2
fi
