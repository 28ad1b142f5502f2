#!/usr/bin/env bash
# Builds Gantry's image, gantry:0.1.0 (deploy/Containerfile), with buildah, and prints the OCI
# layout folder it wrote. The binary is static: cargo builds it for rustup's
# x86_64-unknown-linux-musl target. Run scripts/build-plugins.sh and scripts/ui-build.sh first
# (scripts/test.sh does): the image takes the example policies from the first and embeds the
# UI the second built.
#
#   oci=$(scripts/image.sh)      # then, for example: skopeo copy oci:$oci docker://REGISTRY/gantry:0.1.0
#
# buildah comes from Debian's packages and musl-gcc (for the C in `ring`) from musl-tools;
# both are installed when missing. buildah's storage is a folder of the target directory
# (vfs driver, chroot isolation), rebuilt on every run: nothing is left in /var/lib/containers.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
say() { echo "image.sh: $*" >&2; }

missing=()
command -v buildah >/dev/null || missing+=(buildah)
command -v musl-gcc >/dev/null || missing+=(musl-tools)
if ((${#missing[@]})); then
    say "installing ${missing[*]} from Debian's packages"
    apt-get update -qq >&2 && apt-get install -y -qq "${missing[@]}" >&2
fi
target=x86_64-unknown-linux-musl
rustup target list --installed | grep -qx "$target" || rustup target add "$target" >&2

say "building the static binary (cargo build --release --target $target -p gantry)"
cargo build --release --quiet --target "$target" -p gantry >&2

work="$CARGO_TARGET_DIR/image"
context="$work/context"
rm -rf "$context" "$work/storage" "$work/oci"
mkdir -p "$context/policies" "$context/data"
# The release profile keeps debug info for backtraces in tests; the image carries the binary
# without it (about 40 MiB instead of 230).
strip -o "$context/gantry" "$CARGO_TARGET_DIR/$target/release/gantry"
for policy in gpu_fit gpu_binpack team_quota keep_off; do
    file="$CARGO_TARGET_DIR/wasm32-wasip2/plugin/$policy.wasm"
    [[ -f "$file" ]] || { say "$file is missing: run scripts/build-plugins.sh first"; exit 1; }
    cp "$file" "$context/policies/"
done
printf 'root:x:0:0:root:/root:/sbin/nologin\ngantry:x:65532:65532:gantry:/var/lib/gantry:/sbin/nologin\n' >"$context/passwd"
printf 'root:x:0:\ngantry:x:65532:\n' >"$context/group"

# buildah stages layers in $TMPDIR (else /var/tmp): keep them beside its storage, removed below.
export TMPDIR="$work/storage/tmp"
mkdir -p "$TMPDIR"
buildah_() {
    buildah --root "$work/storage/root" --runroot "$work/storage/run" --storage-driver vfs "$@"
}
say "building gantry:0.1.0 with $(buildah --version)"
buildah_ bud --quiet --isolation chroot -f deploy/Containerfile -t gantry:0.1.0 "$context" >&2
buildah_ push --quiet gantry:0.1.0 "oci:$work/oci:0.1.0" >&2
# The layout is all that is kept; buildah's own copy is only a build's scratch space.
rm -rf "$work/storage"
mib() { echo $(( $(du -sb "$1" | cut -f1) / 1048576 )); }
say "wrote $work/oci: $(mib "$work/oci") MiB of compressed layers, $(mib "$context") MiB unpacked"
echo "$work/oci"
