#!/bin/bash
# bench/device_wg.sh: a GPU call for the prompt attention's wgmma form (F11 item 1,
# attn_wg.cuh, HEARTH_CUDA_ATTN_WHOLE=8), with binaries built here and carried in .dev/bin
# (hearth, test_cuda, test_gdn_chunk; see below), so no build time is spent there:
#   1. test_cuda's attn_matches_ref alone (form 8 against the default, bit for bit);
#   2. q36 made in /dev/shm; pp2048 at depths 32,768 and 8,192, forms 6 (default) and 8,
#      interleaved, REPS rounds (one process each, the figure it prints);
#   3. all of test_cuda and test_gdn_chunk;
#   4. with the time left: Nsight Compute on one launch of form 8 (NCU_FORMS="8 6": both) at 32k
#      (the timed pass's first: the fill's 16 passes x 10 layers skipped).
# Local preparation (nvcc 13.0, sm_90a):
#   make build/hearth build/tests/test_cuda build/tests/test_gdn_chunk
#   mkdir -p .dev/bin && for b in build/hearth build/tests/test_cuda build/tests/test_gdn_chunk; do
#     strip -o .dev/bin/$(basename $b) $b; done
# then the device tool: carry [".peer/debs", ".dev/bin"], command `bash bench/device_wg.sh`.
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
. bench/device_deps.sh >/dev/null 2>&1
t_start=$(date +%s) deadline=${DEADLINE:-570}
. bench/device_step.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader; nproc; } >"$out/host.txt" 2>&1
cat "$out/host.txt"
B=.dev/bin
HEARTH_ATTN_ONLY=1 step attn 60 $B/test_cuda
export HEARTH_TMP=/dev/shm
step gen 60 $B/hearth gen --preset q36 --quant q4_k_m --seed 1 -o /dev/shm/q36.gguf
for i in $(seq 1 "${REPS:-2}"); do
    for d in 32768 8192; do
        for w in 6 8; do
            HEARTH_CUDA_ATTN_WHOLE=$w step "pp2048_d${d}_w${w}_$i" 90 \
                $B/hearth bench --device cuda -m /dev/shm/q36.gguf --kv f16 -p 2048 -n 0 -d $d -r 2
        done
    done
done
step unit 120 $B/test_cuda
step unit_chunk 120 $B/test_gdn_chunk
if command -v ncu >/dev/null; then
    for w in ${NCU_FORMS:-8}; do
        k=$([ $w = 8 ] && echo attn_wg_kernel || echo attn_mma_whole)
        HEARTH_CUDA_ATTN_WHOLE=$w HEARTH_CUDA_GRAPHS=0 step "ncu_w$w" 150 ncu --clock-control none --kernel-name "regex:$k" \
            --launch-skip 160 --launch-count 1 --set full $B/hearth bench --device cuda -m /dev/shm/q36.gguf --kv f16 -p 2048 -n 0 -d 32768 -r 1
        grep -E "Duration|Issue Slots Busy|Achieved Occupancy|Registers Per|Stall|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Compute \(SM\) Throughput|Memory Throughput|Shared Memory" "$out/ncu_w$w.log" | head -24
    done
fi
echo "== done, $(left) s left"
