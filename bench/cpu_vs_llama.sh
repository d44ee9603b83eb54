#!/usr/bin/env bash
# bench/cpu_vs_llama.sh: hearth's CPU engine and llama.cpp's CPU build on the same file, the
# same thread count and the same rows (pp512, tg128), in one run, medians of repetitions.
#   bench/cpu_vs_llama.sh [preset=small] [quant=q4_k_m] [threads=nproc] [reps=5]
# Prints both tables and the ratios; paste them into bench/RESULTS.md with the conditions.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-small} quant=${2:-q4_k_m} threads=${3:-$(nproc)} reps=${4:-5}
peer=$(tools/peer/path.sh) || { echo "llama.cpp peer not built: run tools/peer/build.sh" >&2; exit 1; }
file=${HEARTH_BENCH_FILE:-/tmp/hearth-bench-$preset-$quant.gguf}
[ -f "$file" ] || build/hearth gen --preset "$preset" --quant "$quant" --seed 1 -o "$file"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "commit: $(git rev-parse --short HEAD)  file: $file ($(stat -c %s "$file") bytes)  threads: $threads  reps: $reps"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
h=$(build/hearth bench -m "$file" -p 512 -n 128 -t "$threads" -r "$reps")
echo "$h"
# llama-bench: its first rep is slow, so ask for one more and drop it by taking medians of the rest
l=$("$peer/llama-bench" -m "$file" -p 512 -n 128 -t "$threads" -r "$((reps + 1))" -o json 2>/dev/null)
python3 - "$h" "$l" <<'PY'
import json, re, statistics, sys
h, l = sys.argv[1], json.loads(sys.argv[2])
ours = {}
for line in h.splitlines():
    m = re.match(r"\|.*\| (pp|tg)(\d+) \| ([\d.]+) \|", line)
    if m: ours[m.group(1) + m.group(2)] = float(m.group(3))
for r in l:
    name = ("pp%d" % r["n_prompt"]) if r["n_prompt"] else ("tg%d" % r["n_gen"])
    samples = r.get("samples_ts") or [r["avg_ts"]]
    med = statistics.median(samples[1:] if len(samples) > 1 else samples)
    o = ours.get(name)
    print(f"| {name} | hearth {o:.2f} t/s | llama.cpp {med:.2f} t/s (median of {max(len(samples)-1,1)}, first dropped) | ratio {o/med:.2f}x |")
PY
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
