#!/usr/bin/env bash
# bench/cpu_vs_llama.sh: hearth's CPU engine against llama.cpp's CPU build on the same file,
# the same thread count, the same tests and the same KV type (f16), with the two programs'
# repetitions interleaved in one run.
#
# Why interleaved: on a shared box the load drifts over minutes. Running all of hearth's reps
# and then all of llama.cpp's puts that drift into the ratio; running hearth rep i right
# before llama.cpp rep i makes each pair see (nearly) the same machine, so the paired ratio
# hearth_i / llama_i is steadier than the ratio of two medians, and its spread says how far
# the comparison can be trusted.
#
# usage: bench/cpu_vs_llama.sh [-r REPS] [-t THREADS] [-m FILE] [--tests LIST]
#                              [--preset NAME] [--quant Q] [--log FILE]
#   -r REPS        measured reps per (test, threads), after one dropped warm-up rep (env REPS, default 10)
#   -t THREADS     comma list of thread counts                 (env THREADS, default 1,2)
#   -m FILE        GGUF file; made with `hearth gen` if absent  (env MODEL, default
#                  /tmp/hearth-bench-PRESET-QUANT.gguf)
#   --tests LIST   comma list of ppN / tgN                      (env TESTS, default pp512,tg128)
#   --preset/--quant  what `hearth gen` makes when FILE is absent (env PRESET=small, QUANT=q4_k_m)
#   --log FILE     raw samples, one line per run                (env LOG, default a file in /tmp)
# Prints the conditions and a markdown table for bench/RESULTS.md on stdout; progress on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

reps=${REPS:-10} threads=${THREADS:-1,2} tests=${TESTS:-pp512,tg128}
preset=${PRESET:-small} quant=${QUANT:-q4_k_m}
model=${MODEL:-${HEARTH_BENCH_FILE:-}} log=${LOG:-}
usage() { sed -n '12,21p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case $1 in -r|-t|-m|--tests|--preset|--quant|--log)
        [ $# -ge 2 ] || { echo "cpu_vs_llama.sh: $1 wants a value" >&2; exit 2; } ;;
    esac
    case $1 in
        -r) reps=$2; shift 2 ;;
        -t) threads=$2; shift 2 ;;
        -m) model=$2; shift 2 ;;
        --tests) tests=$2; shift 2 ;;
        --preset) preset=$2; shift 2 ;;
        --quant) quant=$2; shift 2 ;;
        --log) log=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "cpu_vs_llama.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
[[ $reps =~ ^[1-9][0-9]*$ ]] || { echo "cpu_vs_llama.sh: -r wants a count >= 1, got '$reps'" >&2; exit 2; }
IFS=, read -ra thread_list <<<"$threads"
IFS=, read -ra test_list <<<"$tests"
for t in "${test_list[@]}"; do
    [[ $t =~ ^(pp|tg)[1-9][0-9]*$ ]] || { echo "cpu_vs_llama.sh: a test is ppN or tgN, got '$t'" >&2; exit 2; }
done

peer=$(tools/peer/path.sh) || { echo "llama.cpp peer not built: run tools/peer/build.sh" >&2; exit 1; }
[ -x build/hearth ] || { echo "build/hearth missing: run make -j2 build/hearth" >&2; exit 1; }
made=""
if [ -z "$model" ]; then model=/tmp/hearth-bench-$preset-$quant.gguf; fi
if [ ! -f "$model" ]; then
    build/hearth gen --preset "$preset" --quant "$quant" --seed 1 -o "$model" >&2
    made=" (made here: \`hearth gen --preset $preset --quant $quant --seed 1\`)"
fi
[ -n "$log" ] || log=$(mktemp /tmp/cpu_vs_llama.XXXXXX.tsv)
printf 'test\tthreads\trep\ttool\tts\n' >"$log"
errf=$(mktemp /tmp/cpu_vs_llama.err.XXXXXX)
trap 'rm -f "$errf"' EXIT

# One run of each program for a test at a thread count; prints its t/s. Each call is a fresh
# process with -r 1, so both pay load and their own internal warm-up every time alike; the
# outer rep 0 is dropped on top of that, for the page cache and the CPU's clocks.
pn_of() { case $1 in pp*) echo "${1#pp} 0" ;; tg*) echo "0 ${1#tg}" ;; esac; }
run_hearth() { # test threads
    local p n out ts
    read -r p n <<<"$(pn_of "$1")"
    # --device cpu: the peer is a CPU build, so hearth must not pick CUDA on a box that has it
    out=$(build/hearth bench -m "$model" -p "$p" -n "$n" -t "$2" -r 1 --kv f16 --device cpu 2>"$errf") \
        || { cat "$errf" >&2; echo "hearth bench failed" >&2; return 1; }
    # the row: | model | size | backend | threads | test | t/s | reps | note |
    ts=$(awk -F'|' -v t="$1" '{for (i = 2; i <= 7; i++) gsub(/^ +| +$/, "", $i)}
                               $6 == t && $4 == "cpu" {print $7}' <<<"$out")
    [[ $ts =~ ^[0-9.]+$ ]] || { echo "no cpu $1 row in hearth's output:" >&2; echo "$out" >&2; return 1; }
    echo "$ts"
}
run_llama() { # test threads
    local p n out ts
    read -r p n <<<"$(pn_of "$1")"
    out=$("$peer/llama-bench" -m "$model" -p "$p" -n "$n" -t "$2" -r 1 -ctk f16 -ctv f16 -o json 2>"$errf") \
        || { cat "$errf" >&2; echo "llama-bench failed" >&2; return 1; }
    ts=$(jq -r --argjson p "$p" --argjson n "$n" \
        '.[] | select(.n_prompt == $p and .n_gen == $n and .type_k == "f16" and .type_v == "f16") | .avg_ts' <<<"$out")
    [[ $ts =~ ^[0-9.]+$ ]] || { echo "no $1 result in llama-bench's output:" >&2; echo "$out" >&2; return 1; }
    echo "$ts"
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
for t in "${thread_list[@]}"; do
    for rep in $(seq 0 "$reps"); do
        for test in "${test_list[@]}"; do
            h=$(run_hearth "$test" "$t")
            l=$(run_llama "$test" "$t")
            printf '%s\t%s\t%s\thearth\t%s\n%s\t%s\t%s\tllama\t%s\n' "$test" "$t" "$rep" "$h" "$test" "$t" "$rep" "$l" >>"$log"
            note=""; [ "$rep" = 0 ] && note=" (warm-up, dropped)"
            printf 't=%s rep %s%s %s: hearth %.2f, llama.cpp %.2f t/s\n' "$t" "$rep" "$note" "$test" "$h" "$l" >&2
        done
    done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
# the working tree may differ from HEAD (others edit src/ while this runs): say so
commit=$(git describe --always --dirty --abbrev=7)
peer_ver=$("$peer/llama-bench" --version 2>&1 | grep -m1 -o 'commit [0-9a-f]*' || echo "unknown")
cat <<EOF
Conditions: $cpu, $(nproc) cores (nproc); load average $load_before before, $load_after after;
started $started; hearth commit $commit; llama.cpp $peer_ver (\`$peer\`);
file \`$model\`, $(stat -c %s "$model") bytes$made.
Flags: \`hearth bench -m FILE -p P -n N -t T -r 1 --kv f16 --device cpu\` and
\`llama-bench -m FILE -p P -n N -t T -r 1 -ctk f16 -ctv f16 -o json\`, one run each, alternating
(hearth then llama.cpp) for every rep and test; $reps reps after one dropped warm-up rep.
Ratio: hearth rep i / llama.cpp rep i. Raw samples: \`$log\`.

EOF
python3 - "$log" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(dict)  # (test, threads) -> tool -> {rep: ts}
order = []
with open(sys.argv[1]) as f:
    next(f)
    for line in f:
        test, threads, rep, tool, ts = line.split()
        key = (test, int(threads))
        if key not in order: order.append(key)
        if rep != "0":  # rep 0 is the warm-up
            runs[key].setdefault(tool, {})[int(rep)] = float(ts)
def span(xs, fmt):
    return f"{fmt % statistics.median(xs)} ({fmt % min(xs)} .. {fmt % max(xs)})"
print("| test | threads | hearth t/s, median (min .. max) | llama.cpp t/s, median (min .. max) "
      "| hearth / llama.cpp, paired, median (min .. max) | verdict |")
print("| --- | ---: | ---: | ---: | ---: | --- |")
for key in order:
    h, l = runs[key]["hearth"], runs[key]["llama"]
    reps = sorted(h)
    ratios = [h[i] / l[i] for i in reps]
    if min(ratios) <= 1.0 <= max(ratios): verdict = "inside the noise"
    elif min(ratios) > 1.0: verdict = f"hearth faster in all {len(reps)} pairs"
    else: verdict = f"llama.cpp faster in all {len(reps)} pairs"
    print(f"| {key[0]} | {key[1]} | {span([h[i] for i in reps], '%.2f')} | "
          f"{span([l[i] for i in reps], '%.2f')} | {span(ratios, '%.3fx')} | {verdict} |")
PY
