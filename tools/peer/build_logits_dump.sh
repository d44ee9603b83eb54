#!/usr/bin/env bash
# tools/peer/build_logits_dump.sh: compiles tools/peer/logits_dump.c against the peer build
# (llama.cpp's include/llama.h and libllama from tools/peer/build.sh) into the peer cache
# folder, and prints the binary's path on stdout (that one line). Idempotent: rebuilds only
# when the source or libllama is newer than the binary. Nothing is written into the repo.
# tests/unit/test_peer.c runs the binary (and skips when it is missing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
[ -f "$PEER_SRC/include/llama.h" ] || { echo "build_logits_dump: no llama.cpp clone at $PEER_SRC: run tools/peer/build.sh" >&2; exit 1; }
[ -f "$PEER_BIN/libllama.so" ] || { echo "build_logits_dump: no libllama.so in $PEER_BIN: run tools/peer/build.sh" >&2; exit 1; }
tool=$PEER_DIR/logits_dump
src=$here/logits_dump.c
if [ ! -x "$tool" ] || [ "$src" -nt "$tool" ] || [ "$PEER_BIN/libllama.so" -nt "$tool" ]; then
    ${CC:-cc} -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -o "$tool.tmp.$$" "$src" \
        -I"$PEER_SRC/include" -I"$PEER_SRC/ggml/include" \
        -L"$PEER_BIN" -lllama -lggml -lggml-base -Wl,-rpath,"$PEER_BIN" >&2
    mv -f "$tool.tmp.$$" "$tool"
fi
echo "$tool"
