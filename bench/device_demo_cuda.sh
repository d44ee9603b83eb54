#!/usr/bin/env bash
# bench/device_demo_cuda.sh: hearth perplexity on the CUDA engine on the GPU machine (carry
# .peer for Debian's libcjson/libmicrohttpd): builds hearth for sm_90a, then
#  - tiny f32 and q8_0 (hearth gen) on the README+DESIGN text: --device cuda against --device
#    cpu, windows of 128, 4 windows per call (-b 512) on the GPU, one on the CPU;
#  - with demo/ present (the trained demo model, tools/demo/finish.sh): its f32, q8_0 and
#    q4_k_m files converted here, hearth perplexity -c 512 on demo/heldout.txt, GPU.
# Logs and --json outputs to $OUT; the comparison is tools' work here afterwards
# (tests/cli/ppl_check.py's bands: f32 5e-5 in ln ppl; quantized files: the paired test).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
. bench/device_deps.sh
export PATH=$PATH:/usr/local/cuda/bin
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
make -j16 build/hearth >"$out/make.log" 2>&1 || { tail -30 "$out/make.log"; exit 1; }
cat README.md docs/DESIGN.md | head -c 40000 >/dev/shm/t.txt
for q in f32 q8_0; do
    build/hearth gen --preset tiny --quant $q --seed 1 -o /dev/shm/tiny-$q.gguf >/dev/null
    for d in cuda cpu; do
        b=512; [ $d = cpu ] && b=128
        build/hearth perplexity -m /dev/shm/tiny-$q.gguf -f /dev/shm/t.txt -c 128 -b $b --device $d --json \
            >"$out/tiny-$q-$d.json" 2>"$out/tiny-$q-$d.log"
        echo "tiny $q $d: $(cut -c1-120 "$out/tiny-$q-$d.json")"
    done
done
if [ -d demo/hearth-demo ]; then
    for q in f32 q8_0 q4_k_m; do
        build/hearth convert demo/hearth-demo --quant $q -o /dev/shm/demo-$q.gguf >/dev/null 2>&1
        build/hearth perplexity -m /dev/shm/demo-$q.gguf -f demo/heldout.txt -c 512 --device cuda --json \
            >"$out/demo-$q-cuda.json" 2>"$out/demo-$q-cuda.log"
        echo "demo $q cuda: $(cut -c1-120 "$out/demo-$q-cuda.json")"
    done
fi
