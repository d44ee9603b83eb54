#!/usr/bin/env bash
# bench/cpu_depth_ab.sh: the CPU engine at depth, several hearth builds against llama.cpp's CPU
# build, interleaved: each round runs every binary once per test (a fresh process each), so a
# drift of the box's load reaches all of them alike; round 0 is printed but dropped by the
# summary. A test is "pPROMPT" (prompt rows after DEPTH rows) or "gGEN" (decode steps after
# DEPTH rows); both tools get f16 KV rows, the same threads and the same file.
# usage: bench/cpu_depth_ab.sh -m FILE [-t 2] [-d 8192] [--tests p512,g32] [--rounds 3]
#                              [--llama PATH/llama-bench] NAME=HEARTH_BINARY ...
# Prints one line a run ("round name test tok/s") and, at the end, the median of rounds 1.. per
# (name, test) with min..max, and each hearth build's paired ratio to llama.cpp.
set -euo pipefail
model= threads=2 depth=8192 tests=p512,g32 rounds=3
llama=${LLAMA_BENCH:-/root/.cache/hearth-peer/build-cpu/bin/llama-bench}
bins=()
while [ $# -gt 0 ]; do
    case $1 in
        -m) model=$2; shift 2 ;;
        -t) threads=$2; shift 2 ;;
        -d) depth=$2; shift 2 ;;
        --tests) tests=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --llama) llama=$2; shift 2 ;;
        *=*) bins+=("$1"); shift ;;
        *) echo "cpu_depth_ab.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -f "$model" ] || { echo "cpu_depth_ab.sh: -m FILE: no such file '$model'" >&2; exit 2; }
[ ${#bins[@]} -gt 0 ] || { echo "cpu_depth_ab.sh: name the hearth builds as NAME=BINARY" >&2; exit 2; }
log=$(mktemp)
echo "# $(date -u '+%F %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $model; -t $threads -d $depth; tests $tests; rounds 0..$rounds (0 dropped)"
for r in $(seq 0 "$rounds"); do
    for t in ${tests//,/ }; do
        n=${t:1}
        if [ "${t:0:1}" = p ]; then hp="-p $n -n 0" lp="-p $n -n 0" key="pp$n"; else hp="-p 0 -n $n" lp="-p 0 -n $n" key="tg$n"; fi
        for b in "${bins[@]}"; do
            name=${b%%=*} bin=${b#*=}
            v=$("$bin" bench -m "$model" $hp -d "$depth" -t "$threads" -r 2 --kv f16 --device cpu 2>/dev/null | awk -F'|' -v k="$key" '$6 ~ k {gsub(/ /, "", $7); print $7}')
            echo "$r $name $key $v" | tee -a "$log"
        done
        if [ -x "$llama" ]; then
            v=$("$llama" -m "$model" $lp -d "$depth" -t "$threads" -r 2 -fa 1 -ctk f16 -ctv f16 -o csv 2>/dev/null | tail -1 | awk -F, '{gsub(/"/, ""); print $(NF-1)}')
            echo "$r llama $key $v" | tee -a "$log"
        fi
    done
done
python3 - "$log" <<'EOF'
import sys, statistics as st
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 4]
vals = {}
for r, name, key, v in rows:
    if int(r) == 0 or v in ("", "nan"):
        continue
    vals.setdefault((name, key), {})[int(r)] = float(v)
print("| test | build | tok/s, median (min..max) | / llama.cpp, paired median (min..max) |")
print("|---|---|---:|---:|")
for (name, key), d in sorted(vals.items(), key=lambda x: (x[0][1], x[0][0])):
    xs = list(d.values())
    cell = f"{st.median(xs):,.2f} ({min(xs):,.2f}..{max(xs):,.2f})"
    ref = vals.get(("llama", key))
    ratio = ""
    if ref and name != "llama":
        rs = [d[r] / ref[r] for r in d if r in ref]
        if rs:
            ratio = f"{st.median(rs):.3f} ({min(rs):.3f}..{max(rs):.3f})"
    print(f"| {key} | {name} | {cell} | {ratio} |")
EOF
rm -f "$log"
