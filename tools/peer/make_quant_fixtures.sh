#!/usr/bin/env bash
# tools/peer/make_quant_fixtures.sh: builds tools/peer/quant_known.c against the peer's ggml
# (the llama.cpp CPU build of tools/peer/build.sh) and writes tests/fixtures/quant/*.bin,
# ggml's own answers for hearth's quantizer, dequantizer and dot tests (test_quant.c).
# Re-running gives the same bytes on an x86-64 AVX2 machine.  --bench prints ggml's
# vec_dot speed instead.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
repo=$(cd "$here/../.." && pwd)
[ -f "$PEER_SRC/ggml/include/ggml.h" ] || { echo "make_quant_fixtures: no llama.cpp clone at $PEER_SRC: run tools/peer/build.sh" >&2; exit 1; }
libdir=$PEER_BIN
[ -f "$libdir/libggml-cpu.so" ] || { echo "make_quant_fixtures: no libggml-cpu.so in $libdir: run tools/peer/build.sh" >&2; exit 1; }
tool=$PEER_DIR/quant_known
${CC:-cc} -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -o "$tool" "$here/quant_known.c" -I"$PEER_SRC/ggml/include" \
    -L"$libdir" -lggml-cpu -lggml-base -lm -Wl,-rpath,"$libdir"
if [ "${1:-}" = --bench ]; then exec "$tool" --bench; fi
out=$repo/tests/fixtures/quant
mkdir -p "$out"
"$tool" "$out"
commit=$(git -C "$PEER_SRC" log -1 --format='%h (%cd)' --date=short 2>/dev/null || echo unknown)
cat >"$out/README.md" <<MD
# Quant known answers

Written by tools/peer/make_quant_fixtures.sh with ggml from llama.cpp $commit (the peer
build, CPU backend on x86-64). One file per type: deterministic input row, ggml's reference
quantization (from_float_ref), its dequantization (to_float), an activation row, the
activation as ggml's CPU backend quantizes it for the dot, and ggml's vec_dot result. The
layout is documented at the top of tools/peer/quant_known.c; tests/unit/test_quant.c reads it.
MD
