#!/usr/bin/env bash
# bench/device_f7.sh: everything issues F7 and F11 need from one GPU call, in order, each step
# time-boxed, stopping before DEADLINE seconds (default 570) so the call returns its logs:
#   build      hearth, the CUDA tests and the gates for sm_90a (llama.cpp's CUDA build starts
#              in the background first: bench/device_peer_build.sh)
#   unit       test_cuda, and test_gdn_chunk where it is built (the chunked delta rule on the GPU)
#   loop       test_cuda LOOP times (default 50) or until LOOP_S seconds (default 240) have gone:
#              the runs and the failures counted (a race shows as a run that fails); with
#              LOOP_UNTIL_PEER=1 also no longer than llama.cpp's build (the rows come next)
#   plant      test_cuda built from a copy of the tree whose fused tails run in the first block
#              to finish instead of the last (tail.cuh): fused_tails_match_apart must go red
#   engine     test_engine --tiny on the cuda engine, as built (defaults) and with every switch
#              named in FORMS (e.g. "HEARTH_CUDA_GDN_CHUNK=1")
#   gates      `gates all tiny` on the cuda engine, the same forms
#   gates_small `gates all small` on the cuda engine, as built
#   gates_f16  `gates all tiny` and `gates all small` on the cuda engine with f16 KV rows
#              (HEARTH_GATES_KV=f16: the tensor-core attention)
#   scenarios  tests/cli/scenarios_test.py on the cuda engine (HEARTH_SERVE_EXTRA="--device cuda"):
#              F13's sessions, every warm turn against a cold pass, bit for bit. The demo model is
#              not the CUDA engine's (head dim 64, state 64), so a tiny q8_0 file with Qwen3's
#              tokenizer (.peer/tokenizer-qwen3.tar.xz) stands in; scenario c is left out: its
#              random answers end in whitespace that Qwen3.5's template trims, so its count of
#              turns resumed at answers' ends cannot be met with them (on the CPU, with the demo
#              model, it runs in tests/cli/scenarios.sh)
#   depth      hearth bench --kv f16 pp2048 after 0, 8192, 32768 rows and tg128 after 32768,
#              one process each (hearth alone: a first look before the rows against llama.cpp)
#   prof       HEARTH_CUDA_PROFILE=1 over pp2048 after 32768 rows (the fill's passes included):
#              the GPU time by op
#   ncu        Nsight Compute on test_cuda's delta-rule timings (HEARTH_GDN_TIME_ONLY=1): the
#              chunked rule's two kernels of the 4,096-row pass, every section, to ncu_gdn.log
#   ncu_attn   Nsight Compute on one prompt attention launch (NCU_ATTN, a regex: default either
#              form of attn_mma.cuh's prompt kernel) of pp2048 after NCU_DEPTH rows (default
#              8192; the fill's NCU_DEPTH / 2048 passes x 10 layers skipped; every section, to
#              ncu_attn.log)
#   ncu_k      Nsight Compute on one launch of each kernel named in NCU_K (space-separated regexes
#              over mangled names, e.g. mmq_kernelILi12ELi8ELb1) in pp2048 at depth 0 (NCU_K_SKIP
#              launches of it skipped, default 3; full set, to ncu_k_N.log)
#   split      the split form of short passes' attention (the default) against the whole form
#              (HEARTH_CUDA_ATTN_SPLIT=0): hearth bench -p P -n 0 -d 32768 -r 2 for P in SPLIT_P
#              (default "64"), interleaved twice
#   points     hearth bench -p 4096 --marks 2048,4096 with pinned points and without
#              (HEARTH_CUDA_PINNED_POINTS=0), interleaved: what the two points add
#   ab         hearth bench -p 2048 -n 64 as built and under each of FORMS'
#              switches, interleaved, 2 pairs: what each form buys
#   rows       bench/device_cuda_vs_llama.sh (REPS, SETS): the five rows against llama.cpp,
#              with FORMS' switches exported when ROWS_FORMS=1
#   mutants    tests/gates/mutants on the cuda engine (with the forms' switches when
#              ROWS_FORMS=1; with f16 KV rows when MUT_KV=f16)
# The device's copy of .git is a stale snapshot (its `git log` names an old commit): never run
# git checkout or git clean there (clean removed the carried .peer). To build the committed HEAD
# while others edit the tree: here `git diff HEAD --binary > .dev/revert.patch; git ls-files
# --others --exclude-standard > .dev/untracked.txt`, and there `git apply -R .dev/revert.patch &&
# xargs -r rm -f < .dev/untracked.txt && ... bash bench/device_f7.sh`, carrying .dev/revert.patch,
# .dev/untracked.txt and .peer.
# STEPS picks (default "build unit engine gates points ab rows mutants"). Logs to $OUT (and all of
# them in $OUT/logs.tgz), one line a step to stdout. Run by the device tool with .peer carried.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
. bench/device_deps.sh
t_start=$(date +%s) deadline=${DEADLINE:-570}
steps=${STEPS:-build unit engine gates points ab rows mutants}
forms=${FORMS:-}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; git log -1 --format=%h 2>/dev/null; } >"$out/host.txt" 2>&1
cat "$out/host.txt"
export HEARTH_TMP=/dev/shm
. bench/device_step.sh
with_forms() { # name, seconds, command...: once as built, then once per form in FORMS
    local name=$1 limit=$2; shift 2
    step "$name" "$limit" "$@"
    for f in $forms; do
        step "${name}_${f%%=*}" "$limit" env "$f" "$@"
    done
}
# (NO_PEER=1: not now, so a call that times hearth alone has the machine to itself)
[ -f /tmp/llama-cuda/done ] || [ "${NO_PEER:-0}" = 1 ] || (setsid nohup bash bench/device_peer_build.sh >/tmp/peer-build.log 2>&1 &)
for s in $steps; do
    case $s in
    build) t0=$(date +%s)
           targets="build/hearth build/tests/test_cuda build/tests/test_engine build/gates build/mut/test_engine build/mut/hearth"
           grep -q 'test_gdn_chunk' Makefile && targets="$targets build/tests/test_gdn_chunk"
           make -j12 $targets >"$out/make.log" 2>&1 || { tail -30 "$out/make.log"; exit 1; }
           echo "== build: $(( $(date +%s) - t0 )) s" ;;
    unit) step unit 90 build/tests/test_cuda
          [ -x build/tests/test_gdn_chunk ] && step unit_chunk 120 build/tests/test_gdn_chunk ;;
    loop) t0=$(date +%s) runs=0 bad=0
          while [ $runs -lt "${LOOP:-50}" ] && [ $(( $(date +%s) - t0 )) -lt "${LOOP_S:-240}" ] && [ "$(left)" -gt 60 ] &&
                { [ "${LOOP_UNTIL_PEER:-0}" = 0 ] || [ ! -f /tmp/llama-cuda/done ]; }; do
              timeout 120 build/tests/test_cuda >"$out/loop_last.log" 2>&1 || { bad=$((bad + 1)); cp "$out/loop_last.log" "$out/loop_fail_$bad.log"; }
              runs=$((runs + 1))
          done
          echo "== loop: test_cuda $runs runs, $bad failed, $(( $(date +%s) - t0 )) s"
          grep -h "check failed\|^FAIL" "$out"/loop_fail_*.log 2>/dev/null | sort | uniq -c | head -5 ;;
    plant) rm -rf /tmp/plant && mkdir -p /tmp/plant && git ls-files | tar cf - -T - | tar xf - -C /tmp/plant
           ( cd /tmp/plant && sed -i 's/== total - 1;/== 0u;/' src/engine/cuda/tail.cuh && grep -q '== 0u;' src/engine/cuda/tail.cuh &&
             make -j16 build/tests/test_cuda ) >"$out/plant_build.log" 2>&1 || { echo "== plant: build failed"; continue; }
           step plant 120 /tmp/plant/build/tests/test_cuda
           grep -E "fused|^FAIL" "$out/plant.log" | head -5 ;;
    engine) with_forms engine_tiny 120 build/tests/test_engine --tiny ;;
    gates) HEARTH_GATES_DEVICE=cuda with_forms gates_tiny 150 build/gates all tiny ;;
    gates_small) HEARTH_GATES_DEVICE=cuda step gates_small 150 build/gates all small ;;
    gates_f16) HEARTH_GATES_DEVICE=cuda HEARTH_GATES_KV=f16 step gates_tiny_f16 150 build/gates all tiny
               HEARTH_GATES_DEVICE=cuda HEARTH_GATES_KV=f16 step gates_small_f16 150 build/gates all small ;;
    scenarios) tok=/tmp/tokenizer-qwen3 tiny=/dev/shm/tiny-qwen3.gguf
               [ -f $tok/tokenizer.json ] || { mkdir -p $tok && tar -xJf .peer/tokenizer-qwen3.tar.xz -C $tok; }
               [ -f $tiny ] || build/hearth gen --preset tiny --quant q8_0 --seed 1 --tokenizer $tok -o $tiny >"$out/gen_tiny.log" 2>&1
               HEARTH_DEMO=$tiny HEARTH_SERVE_EXTRA="--device cuda" step scenarios 240 python3 tests/cli/scenarios_test.py a b d e f g
               [ -f /dev/shm/serve.log ] && tail -20 /dev/shm/serve.log >"$out/scenarios_serve_tail.log" ;;
    depth) [ -f /dev/shm/q36.gguf ] || build/hearth gen --preset q36 --quant q4_k_m --seed 1 -o /dev/shm/q36.gguf >"$out/gen.log" 2>&1
           for d in 0 8192 32768; do
               step depth_$d 90 build/hearth bench --device cuda -m /dev/shm/q36.gguf -p 2048 -n 0 -d $d -r 1 --kv f16
           done
           step depth_tg 90 build/hearth bench --device cuda -m /dev/shm/q36.gguf -p 0 -n 128 -d 32768 -r 1 --kv f16
           grep -h "pp2048\|tg128" "$out"/depth_*.log | sed 's/|[^|]*q36.gguf//' ;;
    prof) [ -f /dev/shm/q36.gguf ] || build/hearth gen --preset q36 --quant q4_k_m --seed 1 -o /dev/shm/q36.gguf >"$out/gen.log" 2>&1
          HEARTH_CUDA_PROFILE=1 step prof_d32k 120 build/hearth bench --device cuda -m /dev/shm/q36.gguf -p 2048 -n 0 -d 32768 -r 1 --kv f16
          grep -A32 "cuda profile" "$out/prof_d32k.log" | grep -v "^|---" | head -34 ;;
    ncu) HEARTH_GDN_TIME_ONLY=1 step ncu_gdn 120 ncu --kernel-name regex:gdn_chunk --launch-skip 2 --launch-count 2 --set full \
             build/tests/test_cuda
         grep -E "^  [a-z_ ]*gdn_chunk|Duration|Issue Slots Busy|Achieved Occupancy" "$out/ncu_gdn.log" | sed 's/(const.*//' ;;
    ncu_attn) [ -f /dev/shm/q36.gguf ] || build/hearth gen --preset q36 --quant q4_k_m --seed 1 -o /dev/shm/q36.gguf >"$out/gen.log" 2>&1
         # the timed pass's first attention launch after NCU_DEPTH rows (the fill's passes of 2,048 rows x 10 layers skipped)
         nd=${NCU_DEPTH:-8192}
         HEARTH_CUDA_GRAPHS=0 step ncu_attn 150 ncu --clock-control none --kernel-name "regex:${NCU_ATTN:-attn_mma_(tile|whole)}" \
             --launch-skip $(( nd / 2048 * 10 )) --launch-count 1 \
             --set full build/hearth bench --device cuda -m /dev/shm/q36.gguf -p 2048 -n 0 -d "$nd" -r 1 --kv f16
         grep -E "Duration|Issue Slots Busy|Achieved Occupancy|Registers Per|Shared Memory Config|Stall|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Compute \(SM\) Throughput|Memory Throughput" "$out/ncu_attn.log" | head -30 ;;
    ncu_k) [ -f /dev/shm/q36.gguf ] || build/hearth gen --preset q36 --quant q4_k_m --seed 1 -o /dev/shm/q36.gguf >"$out/gen.log" 2>&1
           kn=0
           for k in ${NCU_K:-}; do
               kn=$((kn + 1))
               HEARTH_CUDA_GRAPHS=0 step ncu_k_$kn 120 ncu --clock-control none --kernel-name-base mangled --kernel-name "regex:$k" \
                   --launch-skip "${NCU_K_SKIP:-3}" --launch-count 1 --set full \
                   build/hearth bench --device cuda -m /dev/shm/q36.gguf -p 2048 -n 0 -r 1 --kv f16
               echo "-- $k"
               grep -E "Duration|Issue Slots Busy|Achieved Occupancy|Registers Per|L2 Hit|Mem Busy|Max Bandwidth|Compute \(SM\) Throughput|Memory Throughput|Executed Ipc|L1/TEX Cache Throughput|L2 Cache Throughput|DRAM Throughput|One or More Eligible|No Eligible|Stall" "$out/ncu_k_$kn.log" | head -24
           done ;;
    split) [ -f /dev/shm/q36.gguf ] || build/hearth gen --preset q36 --quant q4_k_m --seed 1 -o /dev/shm/q36.gguf >"$out/gen.log" 2>&1
           for p in ${SPLIT_P:-64}; do
               for i in 1 2; do
                   step "split_p${p}_on_$i" 90 build/hearth bench --device cuda -m /dev/shm/q36.gguf -p "$p" -n 0 -d 32768 -r 2 --kv f16
                   HEARTH_CUDA_ATTN_SPLIT=0 step "split_p${p}_off_$i" 90 build/hearth bench --device cuda -m /dev/shm/q36.gguf -p "$p" -n 0 -d 32768 -r 2 --kv f16
               done
           done
           grep -H "pp[0-9]" "$out"/split_*.log | sed 's/|[^|]*q36.gguf//' ;;
    points) [ -f /dev/shm/q36.gguf ] || build/hearth gen --preset q36 --quant q4_k_m --seed 1 -o /dev/shm/q36.gguf >"$out/gen.log" 2>&1
            for i in 1 2; do
                step points_pinned_$i 60 build/hearth bench --device cuda -m /dev/shm/q36.gguf -p 4096 -n 0 -r 2 --marks 2048,4096 --kv f16
                HEARTH_CUDA_PINNED_POINTS=0 step points_pageable_$i 60 build/hearth bench --device cuda -m /dev/shm/q36.gguf -p 4096 -n 0 -r 2 --marks 2048,4096 --kv f16
            done
            for i in 1 2; do for k in pinned pageable; do echo "$k $i: $(grep -h "pp4096 +" "$out/points_${k}_$i.log")"; done; done ;;
    ab) [ -f /dev/shm/q36.gguf ] || build/hearth gen --preset q36 --quant q4_k_m --seed 1 -o /dev/shm/q36.gguf >"$out/gen.log" 2>&1
        for f in $forms; do
            for i in 1 2; do
                step "ab_base_${f%%=*}_$i" 60 build/hearth bench --device cuda -m /dev/shm/q36.gguf -p 2048 -n 64 -r 2 --kv f16
                step "ab_${f%%=*}_$i" 60 env "$f" build/hearth bench --device cuda -m /dev/shm/q36.gguf -p 2048 -n 64 -r 2 --kv f16
            done
            grep -H "pp2048\|tg64" "$out"/ab_*.log | sed 's/|[^|]*q36.gguf//' | head -12
        done ;;
    rows) l=$(left); [ "$l" -lt 200 ] && { echo "== rows: skipped, ${l} s left"; continue; }
          ( [ "${ROWS_FORMS:-0}" = 1 ] && for f in $forms; do export "$f"; done
            timeout $(( l - 20 )) bash bench/device_cuda_vs_llama.sh ) >"$out/rows.log" 2>&1
          echo "== rows: rc $?"; grep -E "^\||llama.cpp |NVIDIA" "$out/rows.log" ;;
    mutants) ( [ "${ROWS_FORMS:-0}" = 1 ] && for f in $forms; do export "$f"; done
               [ -n "${MUT_KV:-}" ] && export HEARTH_GATES_KV=$MUT_KV
               HEARTH_GATES_DEVICE=cuda step mutants 400 tests/gates/mutants )
             tail -30 "$out/mutants.log" | grep -E "\||passed|FAIL" | tail -25 ;;
    esac
done
# the device tool returns at most 8 files a call: every log in one archive, and only the
# archive and the host line left in $OUT (so the archive is among what comes back)
tar czf /tmp/f7-logs.tgz -C "$out" . && find "$out" -mindepth 1 ! -name host.txt -delete && mv /tmp/f7-logs.tgz "$out/logs.tgz"
echo "done with $(left) s left"
