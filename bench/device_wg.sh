#!/bin/bash
# bench/device_wg.sh: a GPU call for the prompt attention's wgmma form (F11 item 1,
# attn_wg.cuh, the default since da0a0a8), with binaries built here and carried (BIN, default
# .dev/bin: hearth, test_cuda, test_gdn_chunk, gates, and for the mutant runner mut_hearth and
# mut_test_engine; stripped they are 25 MB and the tree 38 MiB of the 64 carried, so pack them:
# $BIN/bins.tar.xz, ~3 MB, is unpacked first), so no build time is spent there.
# STEPS picks (default "attn ab unit agent gates ncu"):
#   attn    test_cuda's attn_matches_ref alone (the other forms against the default, bit for bit);
#   ab      q36 made in /dev/shm; pp2048 at depths 32,768 and 8,192 (DEPTHS), forms 6 and 8 (the
#           default), interleaved, REPS rounds (one process each, the figure it prints);
#   unit    all of test_cuda and test_gdn_chunk;
#   ncu     Nsight Compute on one launch of form 8 (NCU_FORMS="8 6": both) at 32k (the timed
#           pass's first: the fill's 16 passes x 10 layers skipped);
#   gates   `gates all tiny`, `gates all small` and `gates all tiny-dense` (the dense qwen35's MLP)
#           on the cuda engine, f16 KV rows, under HEARTH_CUDA_ATTN_WHOLE=${GATE_FORM:-8};
#   engine  test_engine --tiny (the packed mut_test_engine, no mutant set: test_engine itself), whose
#           auto device is the cuda engine: tiny and tiny-dense against the float64 reference;
#   mutants tests/gates/mutants on the cuda engine, f16 KV rows, the same form;
#   abbin   two builds of the default form against each other: $B/hearth and $B/hearth_b (a
#           branch's build, packed beside; $B/test_cuda_b, if there, run first), and $B/hearth_c
#           where packed (with $B/test_cuda_c), pp2048 at DEPTHS, interleaved, REPS rounds;
#   rows    bench/device_cuda_vs_llama.sh with the carried hearth: ROWS_SETS (default "e f g":
#           pp2048 after 0, 8,192 and 32,768 rows) against llama-bench, ROWS_REPS (2) reps after
#           rep 0, interleaved; llama.cpp's CUDA build (bench/device_peer_build.sh, ~4.5 min, .peer
#           carried whole) starts in the background when the call begins and stays on a warm
#           machine for the next call;
#   agentvs bench/device_agent.sh with the carried hearth (HEARTH_BIN_READY=1): hearth serve against
#           llama-server on the agent trace (AGENT_TRACE, default agent; AGENT_REPS, default 1,
#           after rep 0), F11's session bar; waits for the peer's build like rows;
#   chatvs  the same on the chat trace (bench/agent_turns.py --trace chat: a chat with thinking);
#   agentsp the agent step with HEARTH_SPARES=${SPARES:-64} (spares enough for the whole
#           session made at start: no pinned point buffer allocated beside its passes);
#   stall   Nsight Compute's warp states and per-SASS-instruction stall samples of one attention
#           launch at 32k: stall_details.txt, stall_raw.csv and stall_sass.csv (the source page,
#           which bench/ncu_stalls.py sums by opcode and reason); STALL_KERNEL, STALL_SKIP and
#           STALL_COUNT pick another kernel's launches (default attn_wg_kernel, 160, 1);
#   abenv   one binary under several environments, pp2048 at DEPTHS, interleaved, REPS rounds:
#           AB_ENVS="LABEL=NAME=VALUE[,NAME=VALUE] ..."; an entry LABEL@b runs $B/hearth_b (device_pack_bins.sh's
#           REV) as it is (default: "a=HEARTH_CUDA_FM_TILE=1 b@b", the defaults against hearth_b);
#   prof    HEARTH_CUDA_PROFILE's per-op table of pp2048 at 32k, per PROF_ENVS entry (as AB_ENVS);
#   sass    cuobjdump's SASS of attn_wg_kernel<256> in the carried hearth (sass_wg256.txt) and
#           its instruction mix;
#   loop    test_cuda LOOP_N times (default 50, F11 item 5: a race would show as a failing run),
#           LOOP_PAR processes at once (default 1), cut to the time left; prints the count of runs and of failed ones;
#   agent   hearth alone on bench/agent_turns.py's agent trace to 40k tokens (one rep after the
#           dropped rep 0; q36 with Qwen3's tokenizer from a carried .peer/tokenizer-qwen3.tar.xz,
#           Qwen3.5's template, one slot, 64k context): each turn's wall time against its pass
#           (F11 item 2: what a turn spends outside the pass, <= 30 ms at 40k). Its two reps run
#           back to back with no idle time, so the second runs out of the 64 spares made at start
#           and pins its points on the passes' path (~45 ms each, nineteenth session): agentvs,
#           where hearth idles while llama-server runs its turns, is the one to read for the bar.
# Each step is cut to the time left (DEADLINE, default 570 s).
# Local preparation: bench/device_pack_bins.sh [DIR] [REV] does what follows (REV: hearth_b
# built at that revision). By hand (nvcc 13.0, sm_90a):
#   make build/hearth build/tests/test_cuda build/tests/test_gdn_chunk build/gates build/mut/hearth build/mut/test_engine
#   mkdir -p .dev/bin && for b in build/hearth build/tests/test_cuda build/tests/test_gdn_chunk build/gates; do
#     strip -o .dev/bin/$(basename $b) $b; done
#   strip -o .dev/bin/mut_hearth build/mut/hearth; strip -o .dev/bin/mut_test_engine build/mut/test_engine
#   (cd .dev/bin && tar -cJf bins.tar.xz hearth test_cuda test_gdn_chunk gates mut_hearth mut_test_engine
#    && rm hearth test_cuda test_gdn_chunk gates mut_hearth mut_test_engine)
# then the device tool: carry [".peer", BIN] (or only what the steps read: .peer/debs, and
# .peer/tokenizer-qwen3.tar.xz for agent), command `BIN=... bash bench/device_wg.sh`.
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
. bench/device_deps.sh >/dev/null 2>&1
t_start=$(date +%s) deadline=${DEADLINE:-570}
. bench/device_step.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader; nproc; } >"$out/host.txt" 2>&1
cat "$out/host.txt"
B=${BIN:-.dev/bin}
# or the binaries packed (tar -cJf $B/bins.tar.xz: six stripped binaries are 25 MB, 3 MB packed)
[ -f "$B/bins.tar.xz" ] && tar -xJf "$B/bins.tar.xz" -C "$B"
# a carried folder may say what it was built for: $B/env (shell assignments, e.g. STEPS and
# DEADLINE) read here, so a call whose command line is fixed runs that folder's steps (written
# as `: ${STEPS:=...}`, a command line's own STEPS wins)
echo "binaries: $($B/hearth --version 2>&1 | head -1); b: $($B/hearth_b --version 2>/dev/null | head -1); c: $($B/hearth_c --version 2>/dev/null | head -1)" | tee -a "$out/host.txt"
if [ -f "$B/env" ]; then . "$B/env"; deadline=${DEADLINE:-$deadline}; cat "$B/env"; fi
mkdir -p build/mut build/tests
cp $B/hearth build/hearth; cp $B/gates build/gates 2>/dev/null
cp $B/mut_hearth build/mut/hearth 2>/dev/null; cp $B/mut_test_engine build/mut/test_engine 2>/dev/null
export HEARTH_TMP=/dev/shm
# (PEER=1: start it in a call without those steps, for the warm machine's next call)
case " ${STEPS:-} ${PEER:+ rows} " in *" rows "*|*" agentvs "*)
    [ -f /tmp/llama-cuda/done ] || pgrep -f device_peer_build.sh >/dev/null ||
        (setsid nohup bash bench/device_peer_build.sh >/tmp/peer-build.log 2>&1 &) ;;
esac
q36() { [ -f /dev/shm/q36.gguf ] || step gen 60 $B/hearth gen --preset q36 --quant q4_k_m --seed 1 -o /dev/shm/q36.gguf; }
# pp2048 after each of DEPTHS rows, REPS rounds, the variants interleaved within a round, one
# process each (the figure it prints, to pp2048_dDEPTH_LABEL_ROUND.log); a variant is
# "LABEL BINARY [NAME=VALUE]"
pp_rounds() {
    local i d v label bin var
    for i in $(seq 1 "${REPS:-2}"); do
        for d in ${DEPTHS:-32768 8192}; do
            for v in "$@"; do
                read -r label bin var <<<"$v"
                step "pp2048_d${d}_${label}_$i" 90 env $var $bin bench --device cuda -m /dev/shm/q36.gguf --kv f16 -p 2048 -n 0 -d $d -r 2
            done
        done
    done
}
for s in ${STEPS:-attn ab unit agent gates ncu}; do
    case $s in
    attn) HEARTH_ATTN_ONLY=1 step attn 60 $B/test_cuda ;;
    ab) q36
        pp_rounds "w6 $B/hearth HEARTH_CUDA_ATTN_WHOLE=6" "w8 $B/hearth HEARTH_CUDA_ATTN_WHOLE=8" ;;
    abbin) [ -x $B/hearth_b ] || { echo "== abbin: no $B/hearth_b"; continue; }
           q36
           [ -x $B/test_cuda_b ] && step unit_b 120 $B/test_cuda_b
           [ -x $B/test_cuda_c ] && step unit_c 120 $B/test_cuda_c
           if [ -x $B/hearth_c ]; then pp_rounds "a $B/hearth" "b $B/hearth_b" "c $B/hearth_c"
           else pp_rounds "a $B/hearth" "b $B/hearth_b"; fi ;;
    rows) l=$(left); [ "$l" -lt 120 ] && { echo "== rows: skipped, ${l} s left"; continue; }
          # ROWS_ENV=best: the environment abenv found best in this call (abenv_best.env)
          ( [ "${ROWS_ENV:-}" = best ] && [ -f "$out/abenv_best.env" ] && { export $(cat "$out/abenv_best.env"); echo "== rows under $(cat "$out/abenv_best.env")"; }
            HEARTH_BIN_READY=1 SETS=${ROWS_SETS:-e f g} REPS=${ROWS_REPS:-2} timeout $(( l - 15 )) bash bench/device_cuda_vs_llama.sh ) \
              >"$out/rows.log" 2>&1
          echo "== rows: rc $?"; grep -E "^\||llama.cpp |NVIDIA" "$out/rows.log" | head -20 ;;
    engine) step engine_tiny 150 build/mut/test_engine --tiny ;;
    unit) step unit 120 $B/test_cuda
          step unit_chunk 120 $B/test_gdn_chunk ;;
    ncu) q36
         command -v ncu >/dev/null || { echo "== ncu: none here"; continue; }
         for w in ${NCU_FORMS:-8}; do
             k=$([ $w = 8 ] && echo attn_wg_kernel || echo attn_mma_whole)
             HEARTH_CUDA_ATTN_WHOLE=$w HEARTH_CUDA_GRAPHS=0 step "ncu_w$w" 150 ncu --clock-control none --kernel-name "regex:$k" \
                 --launch-skip 160 --launch-count 1 --set full $B/hearth bench --device cuda -m /dev/shm/q36.gguf --kv f16 -p 2048 -n 0 -d 32768 -r 1
             grep -E "Duration|Issue Slots Busy|Achieved Occupancy|Registers Per|Stall|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Compute \(SM\) Throughput|Memory Throughput|Shared Memory|excessive" "$out/ncu_w$w.log" | head -30
         done ;;
    stall) q36
           command -v ncu >/dev/null || { echo "== stall: no ncu here"; continue; }
           # where the attention's warps wait, per SASS instruction (bench/ncu_stalls.py reads _sass.csv)
           # (STALL_KERNEL, STALL_SKIP, STALL_COUNT: another kernel's launches, e.g. mmq_kernel with
           # STALL_SKIP past the 32k fill's 16 passes: 16 x that kernel's launches a pass, which
           # HEARTH_CUDA_PROFILE's per-op call counts give)
           HEARTH_CUDA_GRAPHS=0 step stall 150 ncu --clock-control none --kernel-name regex:${STALL_KERNEL:-attn_wg_kernel} \
               --launch-skip ${STALL_SKIP:-160} --launch-count ${STALL_COUNT:-1} --section SpeedOfLight --section WarpStateStats --section SourceCounters \
               --section SchedulerStats -f -o "$out/stall" $B/hearth bench --device cuda -m /dev/shm/q36.gguf --kv f16 -p 2048 -n 0 -d 32768 -r 1
           ncu -i "$out/stall.ncu-rep" --page details --print-details all >"$out/stall_details.txt" 2>&1
           ncu -i "$out/stall.ncu-rep" --page raw --csv >"$out/stall_raw.csv" 2>&1
           ncu -i "$out/stall.ncu-rep" --page source --csv --print-source sass >"$out/stall_sass.csv" 2>&1
           grep -iE "Duration|stall|Warp Cycles|Eligible" "$out/stall_details.txt" | head -40
           rm -f "$out/stall.ncu-rep" ;;
    abenv) q36 # AB_ENVS: LABEL=NAME=VALUE ..., one binary, interleaved (DEPTHS, REPS)
           vs=(); for x in ${AB_ENVS:-a=HEARTH_CUDA_FM_TILE=1 b@b}; do
               case $x in *@*) vs+=("${x%@*} $B/hearth_${x#*@}") ;; *) vs+=("${x%%=*} $B/hearth ${x#*=}") ;; esac
               vs[-1]=${vs[-1]//,/ } # LABEL=A=1,B=2: both variables
           done
           pp_rounds "${vs[@]}"
           for f in "$out"/pp2048_d*_*.log; do echo "$(basename $f .log) $(grep -oE 'pp2048 @ d[0-9]+ \| +[0-9.]+' $f | grep -oE '[0-9.]+$')"; done
           # the carried binary's environment with the best mean at DEPTHS' first depth, for the
           # rows step of the same call (ROWS_ENV=best): abenv_best.env
           d1=${DEPTHS:-32768}; d1=${d1%% *} best= bv=0
           for x in ${AB_ENVS:-}; do
               case $x in *@*) continue ;; esac
               l=${x%%=*} v=$(cat "$out"/pp2048_d${d1}_${l}_*.log 2>/dev/null | grep -oE 'pp2048 @ d[0-9]+ \| +[0-9.]+' | grep -oE '[0-9.]+$' |
                   awk '{s += $1; n++} END {if (n) printf "%.2f", s / n; else print 0}')
               awk -v a="$v" -v b="$bv" 'BEGIN {exit !(a > b)}' && best=$x bv=$v
           done
           [ -n "$best" ] && { echo "${best#*=}" | tr , ' ' >"$out/abenv_best.env"; echo "== abenv: best of the carried binary's: ${best%%=*} ($bv t/s)"; } ;;
    prof) q36 # HEARTH_CUDA_PROFILE's table at 32k, per PROF_ENVS entry (LABEL=NAME=VALUE; default: the defaults)
          for x in ${PROF_ENVS:-def=HEARTH_CUDA_PROFILE=1}; do
              HEARTH_CUDA_PROFILE=1 step prof_d32k_${x%%=*} 120 env ${x#*=} $B/hearth bench --device cuda -m /dev/shm/q36.gguf --kv f16 -p 2048 -n 0 -d 32768 -r 1
              grep -E "^cuda profile|router|attn \||gate up|down|delta|t/s" "$out/prof_d32k_${x%%=*}.log" | head -12
          done ;;
    gates) for p in tiny small tiny-dense; do
               HEARTH_CUDA_ATTN_WHOLE=${GATE_FORM:-8} HEARTH_GATES_DEVICE=cuda HEARTH_GATES_KV=f16 step "gates_${p}_f16" 150 build/gates all $p
           done ;;
    agent|agentsp)
           tok=/tmp/tok-qwen3; mkdir -p $tok && tar -xJf .peer/tokenizer-qwen3.tar.xz -C $tok || continue
           [ -f /dev/shm/q36t.gguf ] || step gen_tok 90 $B/hearth gen --preset q36 --quant q4_k_m --seed 1 --tokenizer $tok -o /dev/shm/q36t.gguf
           sp=; [ $s = agentsp ] && sp=HEARTH_SPARES=${SPARES:-64}
           echo "spares: ${sp:-default}" >"$out/$s.env"
           step $s 240 env $sp python3 bench/agent_turns.py --trace agent --reps 1 --target-tokens 40000 --out "$out/$s" --hearth-cmd \
               "$B/hearth serve -m /dev/shm/q36t.gguf -c 65536 -np 1 --device cuda --metrics --chat-template-file tests/fixtures/templates/Qwen3.5-4B.jinja --port {port}"
           grep -E "^\| *[0-9]+ \||total" "$out"/$s/*.md 2>/dev/null | head -24 ;;
    sass) cu=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
          [ -n "$cu" ] || { echo "== sass: no cuobjdump here"; continue; }
          "$cu" -sass $B/hearth 2>&1 | awk '/Function : .*attn_wg_kernelILi256/ {on = 1} on && /Function : / && !/attn_wg_kernelILi256/ {on = 0} on' >"$out/sass_wg256.txt"
          echo "== sass: $(grep -c '/\*[0-9a-f]*\*/' "$out/sass_wg256.txt") instructions in attn_wg_kernel<256>; the most used:"
          grep -o '/\*[0-9a-f]*\*/ *[A-Z][A-Z0-9_.]*' "$out/sass_wg256.txt" | awk '{print $2}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -25 ;;
    agentvs|chatvs)
             l=$(left); [ "$l" -lt 120 ] && { echo "== $s: skipped, ${l} s left"; continue; }
             tr=${AGENT_TRACE:-agent}; [ $s = chatvs ] && tr=chat
             ( HEARTH_BIN_READY=1 OUT="$out/$s" TRACE=$tr REPS=${AGENT_REPS:-1} DEADLINE=$(( l - 10 )) \
                   bash bench/device_agent.sh ) >"$out/$s.log" 2>&1
             echo "== $s: rc $?"; grep -E "^\||^==|total" "$out/$s.log" | tail -40 ;;
    loop) n=0 bad=0 par=${LOOP_PAR:-1} # LOOP_PAR processes at once (a run is ~15 s on an H100)
          while [ "$n" -lt "${LOOP_N:-50}" ] && [ "$(left)" -gt 40 ]; do
              pids=() k=0
              while [ "$k" -lt "$par" ] && [ "$n" -lt "${LOOP_N:-50}" ]; do
                  n=$((n + 1)) k=$((k + 1))
                  timeout 120 $B/test_cuda >"$out/loop_run_$n.log" 2>&1 & pids+=("$!:$n")
              done
              for p in "${pids[@]}"; do
                  if wait "${p%%:*}"; then rm -f "$out/loop_run_${p#*:}.log"
                  else bad=$((bad + 1)); mv "$out/loop_run_${p#*:}.log" "$out/loop_fail_${p#*:}.log"; fi
              done
          done
          echo "== loop: test_cuda $n runs ($par at once), $bad failed" | tee "$out/loop.log" ;;
    mutants) HEARTH_CUDA_ATTN_WHOLE=${GATE_FORM:-8} HEARTH_GATES_DEVICE=cuda HEARTH_GATES_KV=f16 step mutants 500 tests/gates/mutants
             tail -40 "$out/mutants.log" | grep -E "\||passed|FAIL" | tail -30 ;;
    esac
done
# at most 8 files come back: every log in one archive, the host line beside it
# (only the top folder's host.txt stays beside it: a step's folder goes whole, its own host.txt too)
tar czf /tmp/wg-logs.tgz -C "$out" . && find "$out" -mindepth 1 -maxdepth 1 ! -name host.txt -exec rm -rf {} + ; mv /tmp/wg-logs.tgz "$out/logs.tgz"
echo "== done, $(left) s left"
