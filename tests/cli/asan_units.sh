# asan_units.sh: the unit programs built with AddressSanitizer + UBSan (build-asan/tests/,
# `make asan`), each run as tests/run runs the plain ones, then the gates at tiny
# (build-asan/gates) and the commands' shell suites against build-asan/hearth: any memory
# error, leak or undefined behaviour aborts the program and fails the suite. test_engine and
# test_peer run their tiny models only (--tiny): the small preset runs the same code at sizes
# that take minutes under ASan on 2 cores, and the plain build runs it in full. One summary line.
cd "$(dirname "$0")/../.."
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
p=0 f=0 s=0

# run NAME CMD...: CMD passes when it exits 0, prints "N passed, 0 failed" and no sanitizer
# report; its counts join the summary
run() {
    local name=$1; shift
    local out rc line tf
    out=$("$@" 2>&1); rc=$?
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$out" | tail -n 1)
    tf=$(sed -nE 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/p' <<<"$line")
    if [ -z "$line" ] || [ $rc -ne 0 ] || [ "$tf" != 0 ] || grep -q "Sanitizer\|runtime error" <<<"$out"; then
        echo "FAIL asan $name (exit $rc)"
        grep -E "^(FAIL|SKIP)|ERROR|runtime error|SUMMARY" <<<"$out" | head -n 20 | sed 's/^/     /'
        f=$((f + 1))
        return
    fi
    echo "ok   asan $name: $line"
    grep -E '^SKIP' <<<"$out" | sed 's/^/     /'
    p=$((p + $(sed -nE 's/^([0-9]+) passed.*/\1/p' <<<"$line")))
    s=$((s + $(sed -nE 's/.*, ([0-9]+) skipped.*/\1/p;t;s/.*/0/p' <<<"$line")))
}

n=0
for t in build-asan/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    # (a test_cuda left by an older `make asan`: built without CUDA, it only skips)
    [ "$name" = test_cuda ] && continue
    n=$((n + 1))
    case $name in test_engine|test_peer) run "$name --tiny" "$t" --tiny ;; *) run "$name" "$t" ;; esac
done
if [ $n -eq 0 ]; then echo "SKIP asan units: build-asan/tests/ is empty (make asan)"; s=$((s + 1)); fi
# the gates at the tiny shape (every invariant of the engine contract, through engine.h)
if [ -x build-asan/gates ]; then run "gates all tiny" build-asan/gates all tiny
else echo "SKIP asan gates: build-asan/gates missing (make asan)"; s=$((s + 1)); fi
# the shell suites of the commands (hearth run, chat, gen, tokenize, convert, perplexity) against the
# ASan + UBSan binary; serve's, the fuzz replays' and gguf_bad's run it in their own suites
if [ -x build-asan/hearth ]; then
    for suite in run chat gen tokenize convert; do
        run "tests/cli/$suite.sh" env HEARTH=build-asan/hearth bash tests/cli/$suite.sh
    done
    # perplexity's own checks (its windows, batching, bad input); its figures against
    # llama-perplexity are the plain suite's (the same arithmetic, four minutes more here)
    run "tests/cli/perplexity.sh (PPL_PEER=0)" env HEARTH=build-asan/hearth PPL_PEER=0 bash tests/cli/perplexity.sh
else
    echo "SKIP asan shell suites: build-asan/hearth missing (make asan)"; s=$((s + 1))
fi
echo "$p passed, $f failed, $s skipped"
[ $f -eq 0 ]
