#!/usr/bin/env bash
# bench/device_cuda_vs_llama.sh: hearth's CUDA engine against llama.cpp's CUDA build on the
# q36 file, on the GPU machine (run there by the device tool with .peer carried: the npm
# package's llama.cpp bundle in .peer/package and Debian's libcjson/libmicrohttpd packages).
# Builds hearth and llama-bench (-DGGML_CUDA=ON, sm_90), writes the q36 file to /dev/shm,
# then runs the tests interleaved: hearth rep i, then llama.cpp rep i, one fresh process of
# -r 1 each; rep 0 of each is dropped. llama-bench: -ngl 99 -fa 1, -ub 2048 on prompts of
# 2048 rows and more (its best, measured before), KV f16 on both sides.
#   REPS (default 3) measured reps; TESTS (default "pp512 tg128 pp4096")
# Samples to $OUT/samples.tsv, the table to stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
. bench/device_deps.sh
reps=${REPS:-3} tests=${TESTS:-pp512 tg128 pp4096}
src=/tmp/llama.cpp bld=/tmp/llama-cuda
(git -c advice.detachedHead=false clone -q .peer/package/llama/gitRelease.bundle "$src" &&
 cmake -S "$src" -B "$bld" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
     -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >"$out/peer.log" 2>&1 &&
 cmake --build "$bld" -j16 --target llama-bench >>"$out/peer.log" 2>&1) &
peer_pid=$!
make -j8 build/hearth >"$out/make.log" 2>&1 || { tail -20 "$out/make.log"; exit 1; }
build/hearth gen --preset q36 --quant q4_k_m --seed 1 -o /dev/shm/q36.gguf >"$out/gen.log" 2>&1 || { cat "$out/gen.log"; exit 1; }
wait $peer_pid || { tail -30 "$out/peer.log"; exit 1; }
lb=$bld/bin/llama-bench
m=/dev/shm/q36.gguf
pn() { case $1 in pp*) echo "${1#pp} 0" ;; tg*) echo "0 ${1#tg}" ;; esac; }
hearth_ts() { # test
    local p n; read -r p n <<<"$(pn "$1")"
    build/hearth bench --device cuda -m "$m" -p "$p" -n "$n" -r 1 --kv f16 2>>"$out/err.log" |
        awk -F'|' -v t="$1" '{for (i = 2; i <= 7; i++) gsub(/^ +| +$/, "", $i)} $6 == t && $4 == "cuda" {print $7}'
}
llama_ts() { # test
    local p n ub=512; read -r p n <<<"$(pn "$1")"
    [ "$p" -ge 2048 ] && ub=2048
    "$lb" -m "$m" -ngl 99 -fa 1 -ub "$ub" -b "$ub" -p "$p" -n "$n" -r 1 -ctk f16 -ctv f16 -o csv 2>>"$out/err.log" |
        awk -F'"?,"?' 'NR == 1 {for (i = 1; i <= NF; i++) if ($i ~ /avg_ts/) c = i; next} {print $c}' | tr -d '"'
}
printf 'test\trep\ttool\tts\n' >"$out/samples.tsv"
for rep in $(seq 0 "$reps"); do
    for t in $tests; do
        h=$(hearth_ts "$t"); l=$(llama_ts "$t")
        printf '%s\t%s\thearth\t%s\n%s\t%s\tllama\t%s\n' "$t" "$rep" "$h" "$t" "$rep" "$l" >>"$out/samples.tsv"
        echo "rep $rep $t: hearth $h, llama.cpp $l"
    done
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "llama.cpp $(git -C "$src" log -1 --format='%h of %cd' --date=short)"
python3 - "$out/samples.tsv" <<'PY'
import sys, statistics as st
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]).readlines()[1:]]
tests = []
for t, r, tool, ts in rows:
    if t not in tests: tests.append(t)
print("| test | hearth t/s | llama.cpp t/s | paired ratio, median (min..max) |")
print("|---|---:|---:|---:|")
for t in tests:
    h = {r: float(ts) for tt, r, tool, ts in rows if tt == t and tool == "hearth" and r != "0" and ts}
    l = {r: float(ts) for tt, r, tool, ts in rows if tt == t and tool == "llama" and r != "0" and ts}
    ks = sorted(set(h) & set(l))
    if not ks: print(f"| {t} | - | - | no samples |"); continue
    q = [h[k] / l[k] for k in ks]
    print(f"| {t} | {st.median(h.values()):.2f} | {st.median(l.values()):.2f} | {st.median(q):.3f}x ({min(q):.3f}..{max(q):.3f}) |")
PY
