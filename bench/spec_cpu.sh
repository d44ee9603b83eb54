#!/usr/bin/env bash
# bench/spec_cpu.sh: speculative decoding's step at forced acceptance on the CPU engine
# (F17 item 4's method on the CPU): `hearth run` decodes N tokens plain, then with --spec-mtp K
# for each K, its drafts replayed from the plain output (--spec-replay: every draft kept, the
# block's drafting still run and timed); rounds interleaved, round 0 dropped; prints each run's
# decode tok/s and the medians. FILE: a file with the MTP block (hearth gen --mtp).
#   bench/spec_cpu.sh FILE [N=128] [ROUNDS=4] [KS="1 2 3 4"] [THREADS=2]
set -eu
f=$1 n=${2:-128} rounds=${3:-4} ks=${4:-"1 2 3 4"} t=${5:-2}
H=${HEARTH:-build/hearth}
ids=$(python3 -c "print(','.join(str((i * 104729) % 900 + 3) for i in range(64)))")
want=$($H run -m "$f" --ids "$ids" -n "$n" -t "$t" --ids-out 2>/dev/null | tr -d '[]')
declare -A got
for r in $(seq 0 "$rounds"); do
    for k in 0 $ks; do
        if [ "$k" = 0 ]; then out=$($H run -m "$f" --ids "$ids" -n "$n" -t "$t" --ids-out 2>&1)
        else out=$($H run -m "$f" --ids "$ids" -n "$n" -t "$t" --ids-out --spec-mtp "$k" --spec-replay "$want" 2>&1); fi
        grep -q "^\[$want\]$" <<<"$out" || { echo "k=$k: other tokens than the plain decode's" >&2; exit 1; }
        tps=$(sed -nE 's/^decode: .* ([0-9.]+) tok\/s$/\1/p' <<<"$out")
        echo "round $r k=$k decode $tps tok/s $(grep '^spec:' <<<"$out" || true)"
        [ "$r" = 0 ] || got[$k]="${got[$k]:-} $tps"
    done
done
for k in 0 $ks; do
    echo "k=$k median $(tr ' ' '\n' <<<"${got[$k]}" | sed '/^$/d' | sort -g | awk '{a[NR]=$1} END {print (NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2) " (min " a[1] ", max " a[NR] ", " NR " runs)"}')"
done
