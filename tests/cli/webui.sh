#!/usr/bin/env bash
# webui.sh: the chat page at / in a real browser (tests/cli/webui_test.mjs): Debian's chromium
# (scripts/setup-deps.sh) driven headless by the npm package puppeteer-core, pinned, installed
# once into a cache folder outside the repo (HEARTH_NPM_DIR's sibling webui, default
# ~/.cache/hearth-npm/webui), against the demo model. Without chromium (or node) the suite
# fails under CI and says SKIP elsewhere; without the npm registry the install fails and so
# does this suite. CHROMIUM=PATH names another browser binary.
set -u
cd "$(dirname "$0")/../.."
chromium=${CHROMIUM:-/usr/bin/chromium}
for need in "$chromium" node npm; do
    if ! command -v "$need" >/dev/null 2>&1; then
        if [ -n "${CI:-}" ]; then echo "FAIL $need is not installed (scripts/setup-deps.sh installs it)"; echo "0 passed, 1 failed, 0 skipped"; exit 1; fi
        echo "SKIP the browser test: $need is not installed (scripts/setup-deps.sh installs chromium, node and npm)"
        echo "0 passed, 0 failed, 1 skipped"
        exit 0
    fi
done
base=${HEARTH_NPM_DIR:-${HOME:-/tmp}/.cache/hearth-npm/clients}
dir=$(dirname "$base")/webui
want="puppeteer-core@24.43.1"
mkdir -p "$dir"
if [ "$(cat "$dir/.installed" 2>/dev/null)" != "$want" ]; then
    [ -f "$dir/package.json" ] || echo '{"name": "hearth-webui", "private": true}' >"$dir/package.json"
    (cd "$dir" && npm install --silent --no-audit --no-fund $want) || { echo "FAIL npm install of $want"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
    echo "$want" >"$dir/.installed"
fi
CHROMIUM=$chromium WEBUI_NPM_DIR=$dir exec node tests/cli/webui_test.mjs
