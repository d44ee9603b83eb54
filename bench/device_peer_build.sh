#!/usr/bin/env bash
# bench/device_peer_build.sh: builds llama.cpp's llama-bench and llama-server for CUDA (sm_90) on
# the GPU machine from the source carried in .peer/llama-src.tar.xz (bench/device_pack.sh makes it
# from the node-llama-cpp bundle's commit), into /tmp/llama-cuda; /tmp/llama-cuda/done marks a
# finished build (another call on the same machine finds it; a build of llama-bench alone, from
# before llama-server was added, is built on). Start it with setsid to let it run on after the
# call that started it:
#   setsid nohup bash bench/device_peer_build.sh >/tmp/peer-build.log 2>&1 &
# -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90, Release, about 4.5 minutes with -j16 (llama-bench).
# llama-server's build also reads the web UI's build glue (scripts/ui-assets.cmake,
# tools/ui/*.in, tools/ui/sources.cmake), which device_pack.sh leaves out of the tarball: `bench/
# device_agent.sh pack` puts them in .peer/llama-server-extra.tar.xz, unpacked over the source here.
set -euo pipefail
cd "$(dirname "$0")/.."
src=/tmp/llama.cpp bld=/tmp/llama-cuda
[ -f "$bld/done" ] && [ -x "$bld/bin/llama-server" ] && [ -x "$bld/bin/llama-bench" ] && exit 0
[ -f "$src/CMakeLists.txt" ] || { mkdir -p "$src" && tar -xJf .peer/llama-src.tar.xz -C "$src"; }
[ -f .peer/llama-server-extra.tar.xz ] && tar -xJf .peer/llama-server-extra.tar.xz -C "$src"
rm -f "$bld/done"
cmake -S "$src" -B "$bld" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
cmake --build "$bld" -j16 --target llama-bench llama-server
cp .peer/llama-src.commit "$bld/done"
