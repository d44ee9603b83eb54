#!/usr/bin/env bash
# tests/cli/tokenize.sh: `hearth tokenize` and `hearth detokenize` on llama.cpp's vocab-only
# file for Qwen2 (committed gzipped in tests/fixtures/vocab): ids as llama-tokenize prints
# them, JSON lines on stdin, round trips, and the errors a user can cause.
set -u
cd "$(dirname "$0")/../.."
source tests/cli/lib.sh

V=$TMP/tok-qwen2.gguf
gzip -dc tests/fixtures/vocab/ggml-vocab-qwen2.gguf.gz > "$V"
H=$HEARTH

# ids that llama-tokenize --ids gives for the same text and file
want='[9707, 1879, 220, 151644, 872, 198, 6023, 128247, 220, 151650, 198]'
got=$($H tokenize -m "$V" $'Hello world <|im_start|>user\nhi</s> [PAD151650]\n' 2>&1)
[ "$got" = "$want" ] && ok "tokenize TEXT" || bad "tokenize TEXT" "got $got"
want='[9707, 1879, 82639, 318, 4906, 91, 29, 872, 198, 6023, 522, 82, 29, 220, 151650, 198]'
got=$($H tokenize -m "$V" --no-parse-special $'Hello world <|im_start|>user\nhi</s> [PAD151650]\n' 2>&1)
[ "$got" = "$want" ] && ok "tokenize --no-parse-special" || bad "tokenize --no-parse-special" "got $got"

got=$(printf '%s\n' '"caf\u00e9 \ud83d\ude00"' '"<|im_end|>"' '""' | $H tokenize -m "$V" 2>&1)
want=$'[924, 58858, 90316]\n[151645]\n[]'
[ "$got" = "$want" ] && ok "tokenize JSON lines on stdin" || bad "tokenize JSON lines on stdin" "got $got"

text=$'def f(x):\n    return x ** 2  # caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd <|im_end|>\n\n'
ids=$($H tokenize -m "$V" "$text")
$H detokenize -m "$V" "$ids" > "$TMP/rt.txt"
printf '%s' "$text" | cmp -s - "$TMP/rt.txt" && ok "detokenize IDS gives the text back" \
    || bad "detokenize IDS gives the text back" "$(od -c "$TMP/rt.txt" | head)"
got=$(printf '%s\n' '[9707, 1879]' '[151644, 198, 2]' | $H detokenize -m "$V" 2>&1)
[ "$got" = $'"Hello world"\n"<|im_start|>\\n#"' ] && ok "detokenize JSON lines on stdin" \
    || bad "detokenize JSON lines on stdin" "got $got"
got=$($H detokenize -m "$V" --no-render-special '[151644, 9707]')
[ "$got" = "Hello" ] && ok "detokenize --no-render-special" || bad "detokenize --no-render-special" "got $got"

check_fails "tokenize without -m" "-m FILE is required" $H tokenize hi
check_fails "tokenize on a missing file" "hearth tokenize: .*nope" $H tokenize -m "$TMP/nope.gguf" hi
check_fails "tokenize a non-JSON stdin line" "line 2 is not a JSON string" \
    bash -c "printf '\"ok\"\nnot json\n' | $H tokenize -m $V"
check_fails "tokenize refuses a NUL it cannot pass" "not a JSON string" \
    bash -c "printf '\"a\\\\u0000b\"\n' | $H tokenize -m $V"
check_fails "detokenize an id out of range" "element 1 is not a token id" $H detokenize -m "$V" '[1, 151936]'
check_fails "detokenize a non-list" "not a JSON list" $H detokenize -m "$V" '{"a": 1}'
check_fails "detokenize a fractional id" "element 0" $H detokenize -m "$V" '[1.5]'
check_fails "unknown option" "unknown option" $H tokenize -m "$V" --frobnicate hi
printf 'GGUF\x03\x00\x00\x00' > "$TMP/trunc.gguf"
check_fails "tokenize on a truncated GGUF" "hearth tokenize: " $H tokenize -m "$TMP/trunc.gguf" hi
summary
