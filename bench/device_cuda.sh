#!/usr/bin/env bash
# bench/device_cuda.sh: the CUDA engine on the GPU machine (run there by the device tool with
# .peer/debs carried for Debian's libcjson packages, since the host reaches no registry). Builds
# hearth and the tests for sm_90a, then: the CUDA unit tests; test_engine on tiny, tiny-dense and
# small (engine_open's auto picks the GPU there: logits against the float64 reference within the
# derived bands, batched against stepped, determinism); every gate on the GPU
# (HEARTH_GATES_DEVICE=cuda) at tiny, small and tiny-dense (the dense qwen35); the engine at the
# real widths (test_engine --wide); then hearth bench on the q36 file, GPU and CPU. Each step is time-boxed so the
# whole fits one 600 s command; logs go to $OUT, a summary to stdout.
#   STEPS (default "unit engine gates wide q36") which steps to run (engine_tiny:
#   test_engine --tiny alone; gates_tiny: the gates at tiny alone; mutants: the mutant
#   runner on the GPU, each gate red under the defects planted in the CUDA engine;
#   q36_graphs_off: the bench with HEARTH_CUDA_GRAPHS=0; pdl: decode on the q36 file with
#   programmatic dependent launch on and off (HEARTH_CUDA_PDL=0), interleaved, PDL_REPS pairs;
#   ncu: Nsight Compute's time, DRAM bytes and registers of each kernel of one decode token
#   on the q36 file, graphs off, into $OUT/ncu.csv); WIDE_S the wide step's time box
#   (default 290 s); PP, TG, REPS the q36 bench's -p, -n, -r (512, 64, 3)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
. bench/device_deps.sh
steps=${STEPS:-unit engine gates wide q36}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; git log -1 --format=%h 2>/dev/null; } >"$out/host.txt" 2>&1
cat "$out/host.txt"
t0=$(date +%s)
make -j16 build/hearth build/tests/test_cuda build/tests/test_engine build/gates build/mut/test_engine >"$out/make.log" 2>&1 \
    || { tail -30 "$out/make.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
export HEARTH_TMP=/dev/shm
step() { # name, seconds, command...
    local name=$1 limit=$2; shift 2
    local s=$(date +%s)
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc $rc in $(( $(date +%s) - s )) s: $(grep -E 'passed|FAIL|SKIP' "$out/$name.log" | tail -4 | tr '\n' ' ')"
}
for s in $steps; do
    case $s in
    unit) step unit 60 build/tests/test_cuda ;;
    engine) step engine 200 build/tests/test_engine ;;
    engine_tiny) step engine_tiny 100 build/tests/test_engine --tiny ;;
    gates) HEARTH_GATES_DEVICE=cuda step gates_tiny 100 build/gates all tiny
           HEARTH_GATES_DEVICE=cuda step gates_small 150 build/gates all small
           HEARTH_GATES_DEVICE=cuda step gates_tiny_dense 100 build/gates all tiny-dense ;;
    gates_tiny) HEARTH_GATES_DEVICE=cuda step gates_tiny 100 build/gates all tiny ;;
    mutants) HEARTH_GATES_DEVICE=cuda step mutants 300 tests/gates/mutants ;;
    wide) build/hearth gen --preset wide --quant q4_k_m --seed 1 -o /dev/shm/shared-wide-q4_k_m.gguf >/dev/null 2>&1
          step wide ${WIDE_S:-290} build/tests/test_engine --wide ;;
    q36) build/hearth gen --preset q36 --quant q4_k_m --seed 1 -o /dev/shm/q36.gguf >"$out/gen.log" 2>&1
         step q36_cuda 150 build/hearth bench --device cuda -m /dev/shm/q36.gguf -p ${PP:-512} -n ${TG:-64} -r ${REPS:-3} --kv f16 ;
         cat "$out/q36_cuda.log" ;;
    pdl) [ -f /dev/shm/q36.gguf ] || build/hearth gen --preset q36 --quant q4_k_m --seed 1 -o /dev/shm/q36.gguf >"$out/gen.log" 2>&1
         for i in $(seq ${PDL_REPS:-2}); do
             step pdl_on_$i 120 build/hearth bench --device cuda -m /dev/shm/q36.gguf -p 512 -n 128 -r 2 --kv f16
             HEARTH_CUDA_PDL=0 step pdl_off_$i 120 build/hearth bench --device cuda -m /dev/shm/q36.gguf -p 512 -n 128 -r 2 --kv f16
         done
         grep -h "^|" "$out"/pdl_*.log ;;
    ncu) [ -f /dev/shm/q36.gguf ] || build/hearth gen --preset q36 --quant q4_k_m --seed 1 -o /dev/shm/q36.gguf >"$out/gen.log" 2>&1
         # bench -p 16 -n 4 -r 1: a warm-up pass, the prompt, then decode steps; kernels past the
         # first NCU_SKIP are one decode token's (about 650 launches) and a few more
         HEARTH_CUDA_GRAPHS=0 step ncu_run ${NCU_S:-200} ncu --clock-control none --csv --print-units base \
             --launch-skip ${NCU_SKIP:-4000} --launch-count ${NCU_COUNT:-700} \
             --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__registers_per_thread,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active \
             build/hearth bench --device cuda -m /dev/shm/q36.gguf -p 16 -n 16 -r 1 --kv f16
         grep -v '^==PROF==' "$out/ncu_run.log" | grep '^"' >"$out/ncu.csv"; wc -l "$out/ncu.csv" ;;
    q36_graphs_off) HEARTH_CUDA_GRAPHS=0 step q36_nograph 100 build/hearth bench --device cuda -m /dev/shm/q36.gguf -p 512 -n 64 -r 2 --kv f16 ;
         cat "$out/q36_nograph.log" ;;
    esac
done
