#!/usr/bin/env bash
# tests/cli/shapes.sh: hearth serve and llama-server on the same GGUF file, the shapes of what
# a client can notice compared (tests/cli/shapes_test.py). When the llama.cpp peer is not built
# (tools/peer/build.sh) the suite is a visible skip; in CI, where the peer is built, a missing
# one fails.
set -u
cd "$(dirname "$0")/../.."
source tests/cli/lib.sh
if ! bin=$(tools/peer/path.sh); then
    if [ -n "${CI:-}" ]; then check "CI: the llama.cpp peer is built" false; summary; exit; fi
    skip "shapes against llama-server" "llama.cpp peer not built: run tools/peer/build.sh"
    summary; exit
fi
PEER_BIN=$bin python3 tests/cli/shapes_test.py
