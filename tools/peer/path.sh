#!/usr/bin/env bash
# tools/peer/path.sh: prints the folder of the built llama.cpp peer binaries and exits 0,
# or exits 1 silently when tools/peer/build.sh has not built all of them yet.
source "$(dirname "$0")/common.sh"
[ -z "$(peer_missing)" ] || exit 1
echo "$PEER_BIN"
