#!/usr/bin/env bash
# tools/peer/build.sh: builds llama.cpp (the peer hearth is checked against) for the CPU,
# once, outside the repo, and prints the folder of its binaries on stdout (that one line;
# progress goes to stderr). Run again, it only prints the folder.
#
#   HEARTH_PEER_DIR   cache folder (default ~/.cache/hearth-peer)
#   HEARTH_PEER_JOBS  parallel compile jobs (default 2)
#   HEARTH_PEER_SRC_TAR  take the source from this tarball (bench/device_pack.sh's, with its
#                     .commit file beside it) instead of npm: the GPU machine reaches no registry
#
# Source: `npm pack node-llama-cpp@3.22.1`, whose package/llama/gitRelease.bundle is a git
# bundle of llama.cpp; it is cloned to $HEARTH_PEER_DIR/llama.cpp and built in
# $HEARTH_PEER_DIR/build-cpu. Needs npm, git, cmake and a C++17 compiler.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
jobs=${HEARTH_PEER_JOBS:-2}
log() { echo "peer: $*" >&2; }

if [ -z "$(peer_missing)" ]; then echo "$PEER_BIN"; exit 0; fi

for tool in git cmake c++ tar; do
    command -v "$tool" >/dev/null 2>&1 || { log "needs $tool (see scripts/setup-deps.sh)"; exit 1; }
done
mkdir -p "$PEER_DIR"
# One build at a time per cache folder (two test runs may start it together).
exec 9>"$PEER_DIR/.lock"
if ! flock -n 9; then log "waiting for another build in $PEER_DIR"; flock 9; fi
if [ -z "$(peer_missing)" ]; then echo "$PEER_BIN"; exit 0; fi

tgz=$PEER_DIR/$PEER_NPM_PKG-$PEER_NPM_VERSION.tgz
bundle=$PEER_DIR/package/llama/gitRelease.bundle
t0=$SECONDS
if [ ! -d "$PEER_SRC/.git" ] && [ ! -f "$PEER_SRC/.hearth-commit" ] && [ -n "${HEARTH_PEER_SRC_TAR:-}" ]; then
    log "unpacking $HEARTH_PEER_SRC_TAR"
    rm -rf "$PEER_SRC.tmp" && mkdir -p "$PEER_SRC.tmp"
    tar -xJf "$HEARTH_PEER_SRC_TAR" -C "$PEER_SRC.tmp"
    cp "${HEARTH_PEER_SRC_TAR%.tar.xz}.commit" "$PEER_SRC.tmp/.hearth-commit"
    mv "$PEER_SRC.tmp" "$PEER_SRC"
fi
if [ ! -d "$PEER_SRC/.git" ] && [ ! -f "$PEER_SRC/.hearth-commit" ]; then
    if [ ! -f "$bundle" ]; then
        if [ ! -f "$tgz" ]; then
            command -v npm >/dev/null 2>&1 || { log "needs npm (see scripts/setup-deps.sh)"; exit 1; }
            log "fetching $PEER_NPM_PKG@$PEER_NPM_VERSION from npm"
            (cd "$PEER_DIR" && npm pack --silent "$PEER_NPM_PKG@$PEER_NPM_VERSION" >&2)
        fi
        log "unpacking the llama.cpp git bundle"
        tar -xzf "$tgz" -C "$PEER_DIR" package/llama/gitRelease.bundle
    fi
    log "cloning llama.cpp from the bundle"
    rm -rf "$PEER_SRC.tmp"
    git -c advice.detachedHead=false clone --quiet "$bundle" "$PEER_SRC.tmp" >&2
    mv "$PEER_SRC.tmp" "$PEER_SRC"
fi
log "llama.cpp $(cat "$PEER_SRC/.hearth-commit" 2>/dev/null || git -C "$PEER_SRC" log -1 --format='%h of %cd' --date=short)"

stamp="${PEER_FEATURES[*]}"
if [ -f "$PEER_BUILD/CMakeCache.txt" ] && [ "$(cat "$PEER_BUILD/.hearth-flags" 2>/dev/null)" != "$stamp" ]; then
    log "the cached build was configured for other CPU flags: rebuilding"
    rm -rf "$PEER_BUILD"
fi
if [ ! -f "$PEER_BUILD/CMakeCache.txt" ]; then
    log "configuring $PEER_BUILD"
    cmake -S "$PEER_SRC" -B "$PEER_BUILD" -DCMAKE_BUILD_TYPE=Release \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON "${PEER_FEATURES[@]}" >&2
    echo "$stamp" >"$PEER_BUILD/.hearth-flags"
fi

mapfile -t want < <(peer_missing)
log "building ${want[*]} with $jobs jobs (the first build takes a while)"
cmake --build "$PEER_BUILD" -j "$jobs" --target "${want[@]}" >&2
missing=$(peer_missing)
if [ -n "$missing" ]; then log "not built: $missing"; exit 1; fi
log "done in $((SECONDS - t0)) s"
echo "$PEER_BIN"
