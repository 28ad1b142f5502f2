#!/usr/bin/env bash
# Debian's Chromium, which the browser tests drive (playwright's own browser download is not
# used): installed when missing. scripts/test.sh runs this in its first step, so a machine that
# cannot get it fails in a minute, not after the Rust tests; scripts/ui-test.sh runs it too.
set -euo pipefail
if ! command -v chromium >/dev/null; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
command -v chromium
