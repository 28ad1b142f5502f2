#!/usr/bin/env bash
# Builds the web UI (web/, TypeScript and Vite) into web/dist/, which the next cargo build of
# gantry embeds. npm packages come from web/package-lock.json; npm's download cache is kept
# under the gantry cache folder so a fresh clone does not fetch them again.
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
npm run --silent build
