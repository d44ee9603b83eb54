#!/usr/bin/env bash
# bench/device_cpu_q36.sh: the CPU engine on Qwen3.6-35B-A3B's shapes against llama.cpp's
# CPU build, on the GPU machine's 16-core host (run there by the device tool, with .peer
# carried: llama.cpp's source and Debian's libcjson packages, bench/device_pack.sh, since the
# host reaches no registry). Builds both, writes the q36 file to /dev/shm, then runs
# bench/cpu_vs_llama.sh interleaved at -t 16. Logs and the table go to $OUT.
#   REPS (default 4: with the builds, 5 reps of ~75 s each fill the 600 s a device command
#   may run) measured reps per test after one dropped warm-up
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
for d in .peer/debs/*.deb; do dpkg -x "$d" / ; done
ldconfig
{ nproc; grep -m1 'model name' /proc/cpuinfo; free -g | head -2; uptime; } >"$out/host.txt"
export HEARTH_PEER_DIR=/tmp/hearth-peer HEARTH_PEER_SRC_TAR=$PWD/.peer/llama-src.tar.xz HEARTH_PEER_JOBS=16
tools/peer/build.sh >"$out/peer.log" 2>&1 &
peer_pid=$!
make -j8 build/hearth >"$out/make.log" 2>&1 || { tail -20 "$out/make.log"; exit 1; }
build/hearth gen --preset q36 --quant q4_k_m --seed 1 -o /dev/shm/q36.gguf >"$out/gen.log" 2>&1 \
    || { cat "$out/gen.log"; exit 1; }
wait $peer_pid || { tail -20 "$out/peer.log"; exit 1; }
uptime >>"$out/host.txt"
REPS=${REPS:-4} bench/cpu_vs_llama.sh -t 16 -m /dev/shm/q36.gguf --log "$out/samples.tsv" >"$out/q36.md" 2>"$out/bench.err"
rc=$?
cat "$out/q36.md"; tail -3 "$out/bench.err"
exit $rc
