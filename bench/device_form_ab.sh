#!/usr/bin/env bash
# bench/device_form_ab.sh: switches of the CUDA engine against its default on the GPU, after
# bench/device_f7.sh's build (hearth and /dev/shm/q36.gguf made there or here):
#   1. hearth bench -p 2048 -n 0 at each depth of DEPTHS (default "0 8192"), the default and
#      each of SWITCH (e.g. HEARTH_CUDA_MMQ_NF=0; several: space-separated) interleaved REPS
#      times (default 2), -r 2 each
#   2. HEARTH_CUDA_PROFILE=1 over pp2048 at depth PROF_DEPTH (default 0), each way: the GPU
#      time by op
#   3. with NCU_KERNEL set (a regex over mangled names, e.g. mmq_kernelILi12ELi2ELb1): Nsight
#      Compute's full set over one launch of it in pp2048 (NCU_SKIP launches skipped, default 10)
# Logs to $OUT/ab.tgz (one file a run), the pp2048 lines and the profiles to stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}/ab; mkdir -p "$out"
sw=${SWITCH:?SWITCH=NAME=VALUE} m=/dev/shm/q36.gguf
[ -f $m ] || build/hearth gen --preset q36 --quant q4_k_m --seed 1 -o $m >"$out/gen.log" 2>&1 || { cat "$out/gen.log"; exit 1; }
b() { build/hearth bench --device cuda -m $m --kv f16 "$@"; }
name() { local v=${1#*=}; echo "${1%%=*}_$v" | sed 's/^HEARTH_CUDA_//'; }
for d in ${DEPTHS:-0 8192}; do
    for i in $(seq "${REPS:-2}"); do
        b -p 2048 -n 0 -d "$d" -r 2 >"$out/d${d}_default_$i.log" 2>&1
        echo "d$d default $i: $(grep -h 'pp2048' "$out/d${d}_default_$i.log" | sed 's/|[^|]*q36.gguf//')"
        for s in $sw; do
            env "$s" build/hearth bench --device cuda -m $m --kv f16 -p 2048 -n 0 -d "$d" -r 2 >"$out/d${d}_$(name "$s")_$i.log" 2>&1
            echo "d$d $s $i: $(grep -h 'pp2048' "$out/d${d}_$(name "$s")_$i.log" | sed 's/|[^|]*q36.gguf//')"
        done
    done
done
pd=${PROF_DEPTH:-0}
HEARTH_CUDA_PROFILE=1 b -p 2048 -n 0 -d "$pd" -r 1 >"$out/prof_default.log" 2>&1
for s in $sw; do
    HEARTH_CUDA_PROFILE=1 env "$s" build/hearth bench --device cuda -m $m --kv f16 -p 2048 -n 0 -d "$pd" -r 1 >"$out/prof_$(name "$s").log" 2>&1
done
echo "profile at depth $pd (GPU time of the profiled passes; the attention row):"
for f in default $(for s in $sw; do name "$s"; done); do
    echo "  $f: $(grep -h 'cuda profile' "$out/prof_$f.log") $(grep -h '^| attn |' "$out/prof_$f.log")"
done
if [ -n "${NCU_KERNEL:-}" ]; then
    HEARTH_CUDA_GRAPHS=0 timeout 200 ncu --clock-control none --kernel-name-base mangled --kernel-name "regex:$NCU_KERNEL" \
        --launch-skip "${NCU_SKIP:-10}" --launch-count 1 --set full build/hearth bench --device cuda -m $m --kv f16 -p 2048 -n 0 -r 1 \
        >"$out/ncu.log" 2>&1
    grep -E "Duration|Issue Slots Busy|Achieved Occupancy|Registers Per|Stall|L2 Hit|Mem Busy|Max Bandwidth|Compute \(SM\) Throughput|Memory Throughput|Executed Ipc" "$out/ncu.log" | head -30
fi
# the device tool returns at most 8 files: the logs in one archive
tar czf "$out.tgz" -C "$out" . && rm -rf "$out"
