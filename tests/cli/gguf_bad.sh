# gguf_bad.sh: `hearth inspect` on valid and malformed GGUF files made by mkgguf.py: the
# valid ones print, each bad one exits 1 (not by a signal) with a message naming the field.
# The same files are replayed under build-asan/hearth when that build exists (`make asan`),
# and the fuzzer's regression inputs (tests/fuzz/regress/gguf/*.bin) are replayed too.
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh

dir="$TMP/gguf_bad"
if ! python3 tests/cli/mkgguf.py bad "$dir"; then
    bad "mkgguf.py" "could not write the test files"
    summary
    exit
fi

check "inspect --help" "$HEARTH" inspect --help
check_fails "inspect without FILE is bad usage" "usage" "$HEARTH" inspect
out=$("$HEARTH" inspect "$dir/nope.gguf" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "hearth inspect: .*No such file" <<<"$out" && ok "missing file exits 1" || bad "missing file exits 1" "rc=$rc $out"

for v in valid align64 no-tensors one-f32; do
    check "inspect $v" "$HEARTH" inspect "$dir/$v.gguf"
done
out=$("$HEARTH" inspect "$dir/valid.gguf" 2>&1)
for want in "architecture: test" "version:      3" 'tokenizer.ggml.tokens: \[string x 4\] "a", "b", "", "Ġthe"' \
            "test.nested: \[array x 3\]" "blk.0.attn_q.weight +q8_0 +\[64, 2\] +136" "total: 424 bytes" \
            "by type: f32 1"; do
    grep -Eq -- "$want" <<<"$out" && ok "inspect shows /$want/" || bad "inspect shows /$want/" "$out"
done
out=$("$HEARTH" inspect "$dir/align64.gguf" 2>&1)
grep -q "alignment:    64" <<<"$out" && ok "inspect shows alignment 64" || bad "inspect shows alignment 64" "$out"

# Each bad file: exit 1 with "hearth inspect: PATH: ..." naming the field, then " at byte N".
while IFS=$'\t' read -r f pat; do
    check_fails "refuses $f" "hearth inspect: .*$pat" "$HEARTH" inspect "$dir/$f"
    out=$("$HEARTH" inspect "$dir/$f" 2>&1)
    [ "$f" = bad-empty.gguf ] || grep -Eq "at byte [0-9]+" <<<"$out" && ok "$f names a byte offset" \
        || bad "$f names a byte offset" "$out"
done <"$dir/MANIFEST"

regress=(tests/fuzz/regress/gguf/*.bin)
if [ -e "${regress[0]}" ]; then
    for f in "${regress[@]}"; do
        out=$("$HEARTH" inspect "$f" 2>&1); rc=$?
        [ $rc -le 1 ] && ok "fuzz regression $(basename "$f") (exit $rc)" || bad "fuzz regression $(basename "$f")" "rc=$rc $out"
    done
else
    skip "fuzz regressions" "tests/fuzz/regress/gguf/ holds no inputs"
fi

ASAN=${HEARTH_ASAN:-build-asan/hearth}
if [ -x "$ASAN" ]; then
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    n=0 nbad=0
    for f in "$dir"/*.gguf tests/fuzz/regress/gguf/*.bin tests/fuzz/corpus/gguf/*.bin; do
        [ -e "$f" ] || continue
        n=$((n + 1))
        out=$("$ASAN" inspect "$f" 2>&1 >/dev/null); rc=$?
        if [ $rc -gt 1 ] || grep -q "Sanitizer" <<<"$out"; then
            nbad=$((nbad + 1)); bad "asan: inspect $(basename "$f")" "rc=$rc $out"
        fi
    done
    [ $nbad -eq 0 ] && ok "asan: $n files clean under AddressSanitizer + UBSan"
else
    skip "asan replay" "$ASAN not built (run: make asan)"
fi

summary
