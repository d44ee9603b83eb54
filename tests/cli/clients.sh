#!/usr/bin/env bash
# clients.sh: hearth serve through the real client libraries (tests/cli/clients.mjs): the
# `openai` and `@anthropic-ai/sdk` npm packages, pinned, installed once into a cache folder
# outside the repo (HEARTH_NPM_DIR, default ~/.cache/hearth-npm/clients). Needs node and npm
# (scripts/setup-deps.sh); without the npm registry the install fails and so does this suite.
set -u
cd "$(dirname "$0")/../.."
dir=${HEARTH_NPM_DIR:-${HOME:-/tmp}/.cache/hearth-npm/clients}
want="openai@7.60.0 @anthropic-ai/sdk@1.16.0"
mkdir -p "$dir"
if [ "$(cat "$dir/.installed" 2>/dev/null)" != "$want" ]; then
    [ -f "$dir/package.json" ] || echo '{"name": "hearth-clients", "private": true}' >"$dir/package.json"
    (cd "$dir" && npm install --silent --no-audit --no-fund $want) || { echo "npm install of $want failed"; echo "0 passed, 1 failed"; exit 1; }
    echo "$want" >"$dir/.installed"
fi
CLIENTS_DIR=$dir exec node tests/cli/clients.mjs
