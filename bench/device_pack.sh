#!/usr/bin/env bash
# bench/device_pack.sh: makes .peer, what the device scripts carry to the GPU machine (which
# reaches no registry), here, from Debian's archive and the CPU peer's llama.cpp checkout
# (tools/peer/build.sh makes it):
#   .peer/*.deb               libcjson and libmicrohttpd with libmicrohttpd's own needs
#                             (bench/device_deps.sh unpacks them there)
#   .peer/llama-src.tar.xz    llama.cpp's source at the peer's commit, less what a CUDA build of
#                             llama-bench/llama-perplexity/llama-server does not read (models,
#                             docs, the web UI, other backends: 4.2 MB against the 34 MB bundle)
#   .peer/llama-src.commit    that commit ("de3ff81 of 2026-09-28")
# The device's limit is 64 MiB for the tree and the carried paths together, and the tree holds
# the demo model (demo/, 55 MB): carry .peer/debs alone where llama.cpp is not built there.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${HEARTH_PEER_DIR:-$HOME/.cache/hearth-peer}/llama.cpp
[ -d "$src/.git" ] || { echo "device_pack: no llama.cpp checkout at $src: run tools/peer/build.sh first" >&2; exit 1; }
grep -qx '/.peer/' .git/info/exclude 2>/dev/null || echo /.peer/ >>.git/info/exclude
mkdir -p .peer/debs
(cd .peer/debs && apt-get download libcjson1 libcjson-dev libmicrohttpd12 libmicrohttpd-dev libgnutls30 libnettle8 \
    libhogweed6 libp11-kit0 libtasn1-6 libidn2-0 libunistring2 libgmp10 libffi8 >/dev/null)
skip=(models docs media gguf-py benches scripts conversion requirements)
for b in cann et hexagon hip metal musa opencl openvino rpc sycl virtgpu vulkan webgpu zdnn zendnn; do
    skip+=("ggml/src/ggml-$b")
done
tmp=$(mktemp -d)
git -C "$src" archive --format=tar HEAD | tar -x -C "$tmp"
for s in "${skip[@]}"; do rm -rf "${tmp:?}/$s"; done
# the web UI's sources: only its CMakeLists.txt is read with LLAMA_BUILD_UI=OFF
find "$tmp/tools/ui" -mindepth 1 -maxdepth 1 ! -name CMakeLists.txt -exec rm -rf {} +
tar -cJf .peer/llama-src.tar.xz -C "$tmp" .
rm -rf "$tmp"
git -C "$src" log -1 --format='%h of %cd' --date=short >.peer/llama-src.commit
du -sh .peer/debs .peer/llama-src.tar.xz
