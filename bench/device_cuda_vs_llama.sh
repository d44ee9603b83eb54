#!/usr/bin/env bash
# bench/device_cuda_vs_llama.sh: hearth's CUDA engine against llama.cpp's CUDA build on the q36
# file (hearth gen --preset q36 --quant q4_k_m), on the GPU machine (run there by the device tool
# with .peer carried). Builds hearth, waits for (or runs) bench/device_peer_build.sh, writes the
# file to /dev/shm, then per rep runs each group of rows as one fresh process of each tool,
# interleaved (hearth, llama.cpp, hearth, ...): pp512 and tg128; pp4096; tg128 after 4096
# rows; tg128 after 32768 rows. Rep 0 of each is dropped. KV f16 on both sides; llama-bench
# -ngl 99 -fa 1, -ub 512 (-ub 2048 -b 2048 on pp4096, its best). hearth's pp4096 process also
# runs the pass with marks at 2048 and 4096 (the time two points add).
# Groups e, f, g (issue F11): pp2048 after 0, 8192 and 32768 rows (llama-bench -ub 2048 -b 2048).
#   REPS (default 2) measured reps; SETS (default "a b c d") which groups of rows
# Samples to $OUT/samples.tsv, the table to stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
. bench/device_deps.sh
reps=${REPS:-2} groups=${SETS:-a b c d}
[ -f /tmp/llama-cuda/done ] || { pgrep -f device_peer_build.sh >/dev/null || (setsid nohup bash bench/device_peer_build.sh >/tmp/peer-build.log 2>&1 &); }
# HEARTH_BIN_READY=1: build/hearth was put there (a carried binary, bench/device_wg.sh), not built
[ "${HEARTH_BIN_READY:-0}" = 1 ] && [ -x build/hearth ] || make -j16 build/hearth >"$out/make.log" 2>&1 || { tail -20 "$out/make.log"; exit 1; }
[ -f /dev/shm/q36.gguf ] || build/hearth gen --preset q36 --quant q4_k_m --seed 1 -o /dev/shm/q36.gguf >"$out/gen.log" 2>&1 \
    || { cat "$out/gen.log"; exit 1; }
while [ ! -f /tmp/llama-cuda/done ]; do
    pgrep -f device_peer_build.sh >/dev/null || { tail -30 /tmp/peer-build.log; exit 1; }
    sleep 5
done
cp /tmp/peer-build.log "$out/peer.log" 2>/dev/null
lb=/tmp/llama-cuda/bin/llama-bench m=/dev/shm/q36.gguf
# hearth GROUP: rows "test<TAB>t/s" from hearth bench's table
hearth_rows() {
    local args
    case $1 in a) args="-p 512 -n 128" ;; b) args="-p 4096 -n 0 --marks 2048,4096" ;; c) args="-p 0 -n 128 -d 4096" ;;
                d) args="-p 0 -n 128 -d 32768" ;; e) args="-p 2048 -n 0" ;; f) args="-p 2048 -n 0 -d 8192" ;;
                g) args="-p 2048 -n 0 -d 32768" ;; esac
    build/hearth bench --device cuda -m "$m" $args -r 1 --kv f16 2>>"$out/err.log" |
        awk -F'|' 'NR > 2 {for (i = 2; i <= 8; i++) gsub(/^ +| +$/, "", $i); print $6 "\t" $7}'
}
llama_rows() {
    local args
    case $1 in a) args="-p 512 -n 128 -ub 512 -b 512" ;; b) args="-p 4096 -n 0 -ub 2048 -b 2048" ;;
                c) args="-p 0 -n 128 -d 4096 -ub 512 -b 512" ;; d) args="-p 0 -n 128 -d 32768 -ub 2048 -b 2048" ;;
                e) args="-p 2048 -n 0 -ub 2048 -b 2048" ;; f) args="-p 2048 -n 0 -d 8192 -ub 2048 -b 2048" ;;
                g) args="-p 2048 -n 0 -d 32768 -ub 2048 -b 2048" ;; esac
    "$lb" -m "$m" -ngl 99 -fa 1 $args -r 1 -ctk f16 -ctv f16 -o csv 2>>"$out/err.log" |
        awk -F'"?,"?' 'NR == 1 {for (i = 1; i <= NF; i++) {if ($i ~ /avg_ts/) c = i; if ($i == "n_prompt") p = i; if ($i == "n_gen") g = i; if ($i == "n_depth") d = i}; next}
                       {t = ($(p) > 0 ? "pp" $(p) : "tg" $(g)); if (d && $(d) > 0) t = t " @ d" $(d); gsub(/"/, "", $c); print t "\t" $c}'
}
printf 'test\trep\ttool\tts\n' >"$out/samples.tsv"
for rep in $(seq 0 "$reps"); do
    for gr in $groups; do
        hearth_rows "$gr" | while IFS=$'\t' read -r t v; do printf '%s\t%s\thearth\t%s\n' "$t" "$rep" "$v"; done >>"$out/samples.tsv"
        llama_rows "$gr" | while IFS=$'\t' read -r t v; do printf '%s\t%s\tllama\t%s\n' "$t" "$rep" "$v"; done >>"$out/samples.tsv"
        echo "rep $rep group $gr: $(grep -P "\t$rep\t" "$out/samples.tsv" | tail -4 | tr '\t\n' ' ;')"
    done
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "llama.cpp $(cat /tmp/llama-cuda/done); hearth $(git log -1 --format=%h 2>/dev/null)"
python3 - "$out/samples.tsv" <<'PY'
import sys, statistics as st
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]).readlines()[1:]]
tests = []
for t, r, tool, ts in rows:
    if t not in tests: tests.append(t)
print("| test | hearth t/s | llama.cpp t/s | paired ratio, median (min..max) | reps |")
print("|---|---:|---:|---:|---:|")
for t in tests:
    h = {r: float(ts) for tt, r, tool, ts in rows if tt == t and tool == "hearth" and r != "0" and ts}
    l = {r: float(ts) for tt, r, tool, ts in rows if tt == t and tool == "llama" and r != "0" and ts}
    ks = sorted(set(h) & set(l))
    if not ks:
        if h: print(f"| {t} | {st.median(h.values()):.2f} | - | no peer row | {len(h)} |")
        continue
    q = [h[k] / l[k] for k in ks]
    print(f"| {t} | {st.median(h[k] for k in ks):.2f} | {st.median(l[k] for k in ks):.2f} | {st.median(q):.3f}x ({min(q):.3f}..{max(q):.3f}) | {len(ks)} |")
PY
