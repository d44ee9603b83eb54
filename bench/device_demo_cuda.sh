#!/usr/bin/env bash
# bench/device_demo_cuda.sh: hearth perplexity on the CUDA engine on the GPU machine (carry
# .peer/debs for Debian's libcjson/libmicrohttpd): builds hearth for sm_90a, then
#  - tiny f32 and q8_0 (hearth gen) on the README+DESIGN text: --device cuda against --device
#    cpu, windows of 128, 4 windows per call (-b 512) on the GPU, one on the CPU;
#  - the trained demo model (demo/, tools/demo/finish.sh): hearth perplexity -c 512 on
#    demo/heldout.txt, GPU, of the shipped q8_0 file and, when carried,
#    build/demo/hearth-demo-q4_k_m.gguf (hearth convert of the checkpoint, which stays here).
# The --json outputs to $OUT/ppl.jsonl, a line each; the comparison is tools' work here afterwards
# (tests/cli/ppl_check.py's bands: f32 5e-5 in ln ppl; quantized files: the paired test).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
. bench/device_deps.sh
export PATH=$PATH:/usr/local/cuda/bin
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
make -j16 build/hearth >/tmp/make-demo.log 2>&1 || { tail -30 /tmp/make-demo.log; exit 1; }
cat README.md docs/DESIGN.md | head -c 40000 >/dev/shm/t.txt
for q in f32 q8_0; do
    build/hearth gen --preset tiny --quant $q --seed 1 -o /dev/shm/tiny-$q.gguf >/dev/null
    for d in cuda cpu; do
        b=512; [ $d = cpu ] && b=128
        build/hearth perplexity -m /dev/shm/tiny-$q.gguf -f /dev/shm/t.txt -c 128 -b $b --device $d --json \
            >/tmp/p.json 2>/tmp/p.log || tail -5 /tmp/p.log
        echo "{\"run\": \"tiny $q $d\", \"out\": $(cat /tmp/p.json)}" >>"$out/ppl.jsonl"
        echo "tiny $q $d: $(cut -c1-120 /tmp/p.json)"
    done
done
for f in demo/hearth-demo-q8_0.gguf build/demo/hearth-demo-q4_k_m.gguf; do
    [ -f "$f" ] || continue
    q=$(basename "$f" .gguf); q=${q#hearth-demo-}
    build/hearth perplexity -m "$f" -f demo/heldout.txt -c 512 --device cuda --json >/tmp/p.json 2>/tmp/p.log ||
        tail -5 /tmp/p.log
    echo "{\"run\": \"demo $q cuda\", \"out\": $(cat /tmp/p.json)}" >>"$out/ppl.jsonl"
    echo "demo $q cuda: $(cut -c1-120 /tmp/p.json)"
done
