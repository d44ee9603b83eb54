#!/usr/bin/env bash
# bench/device_peer_build.sh: builds llama.cpp's llama-bench for CUDA (sm_90) on the GPU machine
# from the source carried in .peer/llama-src.tar.xz (bench/device_pack.sh makes it from the
# node-llama-cpp bundle's commit), into /tmp/llama-cuda; /tmp/llama-cuda/done marks a finished build (another call on the
# same machine finds it). Start it with setsid to let it run on after the call that started it:
#   setsid nohup bash bench/device_peer_build.sh >/tmp/peer-build.log 2>&1 &
# -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90, Release, about 4.5 minutes with -j16.
set -euo pipefail
cd "$(dirname "$0")/.."
src=/tmp/llama.cpp bld=/tmp/llama-cuda
[ -f "$bld/done" ] && exit 0
[ -f "$src/CMakeLists.txt" ] || { mkdir -p "$src" && tar -xJf .peer/llama-src.tar.xz -C "$src"; }
cmake -S "$src" -B "$bld" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
cmake --build "$bld" -j16 --target llama-bench
cp .peer/llama-src.commit "$bld/done"
