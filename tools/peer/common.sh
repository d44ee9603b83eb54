# tools/peer/common.sh: shared settings of the peer scripts (sourced, not run).
# The peer is llama.cpp as bundled in the npm package node-llama-cpp (a git bundle of
# llama.cpp of 2026-09-28, which supports qwen35moe). Nothing of it enters the repo: it is
# fetched, cloned and built under HEARTH_PEER_DIR.
PEER_NPM_PKG=node-llama-cpp
PEER_NPM_VERSION=3.22.1
PEER_DIR=${HEARTH_PEER_DIR:-${HOME:-/tmp}/.cache/hearth-peer}
PEER_SRC=$PEER_DIR/llama.cpp
PEER_BUILD=$PEER_DIR/build-cpu
PEER_BIN=$PEER_BUILD/bin
# Binaries the tests use; path.sh succeeds only when every one of them is built.
PEER_TARGETS=(llama-cli llama-server llama-bench llama-tokenize llama-completion llama-simple
              llama-quantize llama-gguf-split llama-gguf test-llama-archs llama-perplexity)

# The CPU features to build for, from /proc/cpuinfo, never AMX: a CPU may list AMX while
# the kernel does not grant its tile state, and ggml's native build then dies with SIGILL
# in its AMX kernel on any Q8_0 file. So GGML_NATIVE is off and each extension that the
# CPU lists is turned on by name (the same set -march=native would pick, less AMX).
cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $cpu_flags " == *" $1 "* ]] && echo ON || echo OFF; }
PEER_FEATURES=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
    -DGGML_SSE42="$(has sse4_2)" -DGGML_AVX="$(has avx)" -DGGML_AVX2="$(has avx2)" -DGGML_FMA="$(has fma)"
    -DGGML_F16C="$(has f16c)" -DGGML_BMI2="$(has bmi2)" -DGGML_AVX_VNNI="$(has avx_vnni)"
    -DGGML_AVX512="$(has avx512f)" -DGGML_AVX512_VBMI="$(has avx512vbmi)"
    -DGGML_AVX512_VNNI="$(has avx512_vnni)" -DGGML_AVX512_BF16="$(has avx512_bf16)")

peer_missing() { # prints the targets whose binary is not in PEER_BIN yet (all, if built for other flags)
    local t
    if [ -d "$PEER_BUILD" ] && [ "$(cat "$PEER_BUILD/.hearth-flags" 2>/dev/null)" != "${PEER_FEATURES[*]}" ]; then
        printf '%s\n' "${PEER_TARGETS[@]}"; return
    fi
    for t in "${PEER_TARGETS[@]}"; do [ -x "$PEER_BIN/$t" ] || echo "$t"; done
}
