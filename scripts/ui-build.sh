#!/usr/bin/env bash
# Builds the web UI (web/, TypeScript and Vite) into web/dist/, which the next cargo build of
# gantry embeds. npm packages come from web/package-lock.json; npm's download cache is kept
# under the gantry cache folder so a fresh clone does not fetch them again.
# Vite builds into a scratch folder and only the files whose bytes changed are written to dist/
# (those no longer built are removed): gantry-server's build.rs watches dist/, so a build that
# changes nothing leaves it, and its mtimes, untouched, and cargo rebuilds nothing.
set -euo pipefail
cd "$(dirname "$0")/../web"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/gantry/npm"
# A copy of the lock file beside the installed packages says they match it. `npm install
# --no-save` installs the locked versions: this npm writes lock files that its own `npm ci`
# refuses (it lists only this platform's optional rollup/esbuild packages).
if ! cmp -s package-lock.json node_modules/.gantry-installed-lock.json 2>/dev/null; then
    # The browser tests drive Debian's Chromium: never let Playwright fetch browsers of its own.
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 \
        npm install --no-save --cache "$cache" --no-audit --no-fund --loglevel=error
    cp package-lock.json node_modules/.gantry-installed-lock.json
fi
staging="$(mktemp -d "${TMPDIR:-/tmp}/gantry-ui.XXXXXX")"
trap 'rm -rf "$staging"' EXIT
GANTRY_UI_OUT_DIR="$staging" npm run --silent build
mkdir -p dist
(cd "$staging" && find . -type f -print0) | while IFS= read -r -d '' file; do
    if ! cmp -s "$staging/$file" "dist/$file"; then
        mkdir -p "dist/$(dirname "$file")"
        cp "$staging/$file" "dist/$file"
    fi
done
(cd dist && find . -type f -print0) | while IFS= read -r -d '' file; do
    [ -e "$staging/$file" ] || rm -f "dist/$file"
done
find dist -mindepth 1 -type d -empty -delete
