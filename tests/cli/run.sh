# run.sh: `hearth run` and `hearth bench` end to end on the tiny preset: generation works,
# greedy output is the same twice and across thread counts, marks report their points, and
# bad input (flags, ids, a prompt past the context, a file of another kind) is a clean error.
. "$(dirname "$0")/lib.sh"
m=$TMP/run-tiny.gguf
$HEARTH gen --preset tiny --quant q4_k_m --seed 3 -o "$m" >/dev/null 2>&1 || { bad "gen tiny" "gen failed"; summary; exit; }

check "run -p generates text and timings" bash -c "$HEARTH run -m $m -p 'Hello there' -n 8 2>&1 | grep -q 'decode: '"
a=$($HEARTH run -m "$m" -p "The hearth is warm" -n 12 --ids-out -t 1 2>/dev/null)
b=$($HEARTH run -m "$m" -p "The hearth is warm" -n 12 --ids-out -t 2 2>/dev/null)
c=$($HEARTH run -m "$m" -p "The hearth is warm" -n 12 --ids-out -t 3 2>/dev/null)
if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ]; then ok "greedy ids identical for -t 1, 2, 3"; else bad "greedy ids identical for -t 1, 2, 3" "$a / $b / $c"; fi
check "--ids in, --ids-out a JSON list" bash -c "$HEARTH run -m $m --ids 1,2,3 -n 4 --ids-out 2>/dev/null | grep -Eq '^\[[0-9]+(,[0-9]+){3}\]$'"
s1=$($HEARTH run -m "$m" -p "x" -n 10 --temp 0.8 --seed 5 --ids-out 2>/dev/null)
s2=$($HEARTH run -m "$m" -p "x" -n 10 --temp 0.8 --seed 5 --ids-out 2>/dev/null)
if [ -n "$s1" ] && [ "$s1" = "$s2" ]; then ok "sampling is reproducible per seed"; else bad "sampling is reproducible per seed" "$s1 / $s2"; fi
ids=$(python3 -c "print(','.join(str(i % 900 + 1) for i in range(100)))")
check "--marks reports each point" bash -c "$HEARTH run -m $m --ids $ids -n 1 --marks 30,99 2>&1 | grep -q 'point 1: position 99, [0-9]* bytes'"

check_fails "prompt past the context" "exceed the context of 50 tokens \(-c\)" $HEARTH run -m "$m" --ids "$ids" -n 1 -c 50
check_fails "context fills before -n tokens: exit 1" "the context of 10 tokens \(-c\) filled after" $HEARTH run -m "$m" --ids 1,2,3 -n 20 -c 10
check_fails "mark past the prompt" "position 200 is outside the prompt's positions" $HEARTH run -m "$m" --ids 1,2,3 -n 1 --marks 200
check_fails "marks out of order" "position 2 does not come after" $HEARTH run -m "$m" --ids 1,2,3 -n 1 --marks 3,2
check_fails "token id outside the vocabulary" "outside the vocabulary" $HEARTH run -m "$m" --ids 1,99999 -n 1
check_fails "bad -n" "-n expects a whole number" $HEARTH run -m "$m" -p hi -n abc
check_fails "bad --temp" "--temp expects a number" $HEARTH run -m "$m" -p hi --temp -1
check_fails "bad id list" "not a token id" $HEARTH run -m "$m" --ids 1,x,3
check_fails "unknown option" "unknown option" $HEARTH run -m "$m" -p hi --frobnicate
check_fails "-p and --ids together" "exactly one of" $HEARTH run -m "$m" -p hi --ids 1
check_fails "missing file" "No such file|cannot open|open" $HEARTH run -m "$TMP/nope.gguf" -p hi
printf 'GGUF\003\000\000\000garbage' > "$TMP/trunc.gguf"
check_fails "truncated file" "GGUF|byte|truncated|end of" $HEARTH run -m "$TMP/trunc.gguf" -p hi
v=tests/fixtures/vocab/ggml-vocab-qwen2.gguf.gz
if [ -f "$v" ]; then
    gzip -dc "$v" > "$TMP/vocab-qwen2.gguf"
    check_fails "a file of another architecture" 'architecture is "qwen2"' $HEARTH run -m "$TMP/vocab-qwen2.gguf" -p hi
else
    skip "a file of another architecture" "no vocab fixture"
fi
# --spec-mtp: the MTP block drafts, one pass verifies; the greedy text is the plain decode's
mm=$TMP/run-tiny-mtp.gguf
if $HEARTH gen --preset tiny --quant q4_k_m --seed 3 --mtp -o "$mm" >/dev/null 2>&1; then
    p1=$($HEARTH run -m "$mm" -p "The hearth is warm" -n 24 -t 2 2>/dev/null)
    p2=$($HEARTH run -m "$mm" -p "The hearth is warm" -n 24 -t 2 --spec-mtp 3 2>/dev/null)
    if [ -n "$p1" ] && [ "$p1" = "$p2" ]; then ok "--spec-mtp 3: the plain decode's text"; else bad "--spec-mtp 3: the plain decode's text" "$p1 / $p2"; fi
    # 24 tokens: the prompt pass gives the first, four steps of 4 drafts + 1 the next 20, the
    # last step drafts 2 for the 3 left
    g=$($HEARTH run -m "$mm" -p "The hearth is warm" -n 24 -t 2 --ids-out 2>/dev/null | tr -d '[]')
    out=$($HEARTH run -m "$mm" -p "The hearth is warm" -n 24 -t 2 --ids-out --spec-mtp 4 --spec-replay "$g" 2>&1)
    if grep -q "^\[$g\]$" <<<"$out" && grep -q 'spec: 5 steps, 18 drafted, 18 accepted (100.0%), 4.60 tokens a step' <<<"$out"; then
        ok "--spec-replay of the output: every draft kept"; else bad "--spec-replay of the output: every draft kept" "$out"; fi
    s1=$($HEARTH run -m "$mm" -p x -n 10 --temp 0.8 --seed 5 --ids-out --spec-mtp 2 2>/dev/null)
    s2=$($HEARTH run -m "$mm" -p x -n 10 --temp 0.8 --seed 5 --ids-out --spec-mtp 2 2>/dev/null)
    if [ -n "$s1" ] && [ "$s1" = "$s2" ]; then ok "--spec-mtp sampling is reproducible per seed"; else bad "--spec-mtp sampling is reproducible per seed" "$s1 / $s2"; fi
    check_fails "--spec-mtp: context fills before -n tokens: exit 1" "the context of 10 tokens \(-c\) filled after" $HEARTH run -m "$mm" --ids 1,2,3 -n 20 -c 10 --spec-mtp 3
else bad "gen tiny --mtp" "gen failed"; fi
check_fails "--spec-mtp on a file without the block" "no MTP block" $HEARTH run -m "$m" -p hi -n 2 --spec-mtp 2
check_fails "--spec-mtp 9" "--spec-mtp expects a whole number in \[0, 8\]" $HEARTH run -m "$m" -p hi --spec-mtp 9
check_fails "--spec-replay without --spec-mtp" "--spec-replay needs --spec-mtp" $HEARTH run -m "$m" -p hi --spec-replay 1,2
rm -f "$mm"
check "bench prints pp and tg rows" bash -c "$HEARTH bench -m $m -p 16 -n 4 -r 1 | grep -q 'tg4'"
check_fails "bench bad -r" "-r expects" $HEARTH bench -m "$m" -r 0
rm -f "$m" "$TMP/trunc.gguf" "$TMP/vocab-qwen2.gguf"
summary
