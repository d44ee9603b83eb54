# fuzz_replay.sh: every fuzz target's seeds and regressions (tests/fuzz/corpus/NAME and
# tests/fuzz/regress/NAME) replayed under AddressSanitizer + UBSan by the target built
# without libFuzzer (build-asan/replay/fuzz_NAME: `make asan`, which `make test` builds),
# so a crash the fuzzer once found, fixed since, stays fixed. Seconds, no clang needed.
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
for src in tests/fuzz/fuzz_*.c; do
    name=$(basename "$src" .c)
    name=${name#fuzz_}
    bin=build-asan/replay/fuzz_$name
    if [ ! -x "$bin" ]; then
        skip "replay $name" "$bin not built (make asan)"
        continue
    fi
    dirs=()
    for d in tests/fuzz/corpus/$name tests/fuzz/regress/$name; do [ -d "$d" ] && dirs+=("$d"); done
    if [ ${#dirs[@]} -eq 0 ]; then
        bad "replay $name" "no tests/fuzz/corpus/$name or tests/fuzz/regress/$name"
        continue
    fi
    out=$("$bin" "${dirs[@]}" 2>&1); rc=$?
    n=$(sed -nE 's/^([0-9]+) passed, 0 failed$/\1/p' <<<"$out")
    if [ $rc -eq 0 ] && [ -n "$n" ] && [ "$n" -gt 0 ] && ! grep -q "Sanitizer" <<<"$out"; then
        ok "replay $name: $n inputs of ${dirs[*]} clean under ASan + UBSan"
    else
        bad "replay $name" "rc=$rc $(tail -n 25 <<<"$out")"
    fi
done
summary
