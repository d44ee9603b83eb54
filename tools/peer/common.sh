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
              llama-quantize llama-gguf-split llama-gguf test-llama-archs)

peer_missing() { # prints the targets whose binary is not in PEER_BIN yet
    local t
    for t in "${PEER_TARGETS[@]}"; do [ -x "$PEER_BIN/$t" ] || echo "$t"; done
}
