#!/usr/bin/env bash
# bench/device_seg_sweep.sh: the attention segment length (HEARTH_CUDA_SEG) against decode at
# depth and prefill, on the q36 file, on the GPU machine: per SEG value (default "512 256
# 128"), hearth bench pp512 + tg128, tg128 after 4096 and after 32768 rows, pp4096; then the
# per-op GPU profile (HEARTH_CUDA_PROFILE=1, graphs off) of 32 decode steps after 4096 rows
# for the first and last value. Starts bench/device_peer_build.sh in the background first
# (for a comparison run right after). Logs to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
. bench/device_deps.sh
[ -f /tmp/llama-cuda/done ] || (setsid nohup bash bench/device_peer_build.sh >/tmp/peer-build.log 2>&1 &)
make -j16 build/hearth >"$out/make.log" 2>&1 || { tail -20 "$out/make.log"; exit 1; }
[ -f /dev/shm/q36.gguf ] || build/hearth gen --preset q36 --quant q4_k_m --seed 1 -o /dev/shm/q36.gguf >"$out/gen.log" 2>&1
m=/dev/shm/q36.gguf segs=${SEGS:-512 256 128}
for sg in $segs; do
    for a in "-p 512 -n 128 -r 3" "-p 0 -n 128 -d 4096 -r 3" "-p 0 -n 128 -d 32768 -r 2" "-p 4096 -n 0 -r 2"; do
        HEARTH_CUDA_SEG=$sg timeout 100 build/hearth bench --device cuda -m $m $a --kv f16 2>>"$out/err.log" |
            awk -v sg=$sg -F'|' 'NR > 2 {print "seg " sg ":" $6 "|" $7 "|" $9}'
    done
done | tee "$out/sweep.txt"
first=${segs%% *} last=${segs##* }
for sg in $first $last; do
    HEARTH_CUDA_SEG=$sg HEARTH_CUDA_PROFILE=1 timeout 100 build/hearth bench --device cuda -m $m -p 0 -n 32 -d 4096 -r 1 --kv f16 \
        >"$out/profile-d4096-seg$sg.txt" 2>&1
    grep -E "passes|^\| attn|^\| gdn delta|^\| moe gate" "$out/profile-d4096-seg$sg.txt" | tail -8
done
