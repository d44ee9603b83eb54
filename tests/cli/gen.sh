#!/usr/bin/env bash
# tests/cli/gen.sh: `hearth gen` from the command line: clean messages and non-zero exits on
# bad options and bad tokenizer files (2 for usage, 1 for failures), no output left after a
# failure, byte-identical files for one seed whatever -t, `hearth inspect` listing the
# tensors, the Q4_K_M mix equal to llama-quantize's (when the llama.cpp peer is built), and
# Qwen3's real tokenizer (when tools/peer/fetch_tokenizer.sh has cached it).
# The llama-quantize comparison runs on tiny and small (about 10 s more on 2 cores).
set -u
cd "$(dirname "$0")/../.."
source tests/cli/lib.sh
T=$TMP/gen
mkdir -p "$T"
G=("$HEARTH" gen)

# check_rc NAME WANT CMD...: CMD exits with status WANT.
check_rc() {
    local n=$1 want=$2; shift 2; local out rc
    out=$("$@" 2>&1); rc=$?
    if [ "$rc" = "$want" ]; then ok "$n"; else bad "$n" "exit $rc, expected $want: $out"; fi
}

# ---- usage errors ----
check_fails "unknown preset" "unknown preset 'huge' \(tiny, small, wide, q36, q35-122b, q35-397b, tiny-dense, wide-dense, q35-0.8b, q35-2b, q35-4b, q35-9b, q35-27b\)" "${G[@]}" --preset huge --quant f32 -o "$T/x.gguf"
check_fails "bad --quant" "unknown quantization 'q5_k' \(f32, q8_0, q4_k_m\)" "${G[@]}" --preset tiny --quant q5_k -o "$T/x.gguf"
check_fails "missing -o" "-o FILE is required" "${G[@]}" --preset tiny --quant f32
check_fails "missing --preset" "--preset is required" "${G[@]}" --quant f32 -o "$T/x.gguf"
check_fails "unknown option" "unknown option '--frobnicate'" "${G[@]}" --preset tiny --frobnicate -o "$T/x.gguf"
check_fails "option without a value" "-o needs a value" "${G[@]}" --preset tiny -o
check_fails "bad --seed" "--seed expects a whole number in \\[0, [0-9]+\\], got '-3'" "${G[@]}" --preset tiny --seed -3 -o "$T/x.gguf"
check_fails "bad -t" "-t expects a whole number in \\[1, 1024\\], got '0'" "${G[@]}" --preset tiny -t 0 -o "$T/x.gguf"
check_rc "usage errors exit 2" 2 "${G[@]}" --preset huge -o "$T/x.gguf"

# ---- bad tokenizer files ----
check_fails "unreadable tokenizer" "nope/tokenizer.json: No such file" \
    "${G[@]}" --preset tiny --quant f32 --tokenizer "$T/nope/tokenizer.json" -o "$T/x.gguf"
printf '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [' >"$T/bad.json"
check_fails "malformed tokenizer.json" "bad.json: not valid JSON" \
    "${G[@]}" --preset tiny --quant f32 --tokenizer "$T/bad.json" -o "$T/x.gguf"
mkdir -p "$T/bad2"
echo '{"pre_tokenizer": {"type": "ByteLevel"}, "model": {"vocab": {"a": 0, "b": 1}, "merges": ["a b", "ab"]}}' \
    >"$T/bad2/tokenizer.json"
check_fails "tokenizer.json with a bad merge" "bad2/tokenizer.json: model.merges\[1\]" \
    "${G[@]}" --preset tiny --quant f32 --tokenizer "$T/bad2" -o "$T/x.gguf"
echo '{"pre_tokenizer": {"type": "ByteLevel"}, "model": {"merges": []}}' >"$T/bad2/tokenizer.json"
check_fails "tokenizer.json without a vocab" "tokenizer.json: model.vocab" \
    "${G[@]}" --preset tiny --quant f32 --tokenizer "$T/bad2/tokenizer.json" -o "$T/x.gguf"
echo '{"pre_tokenizer": {"type": "ByteLevel"}, "model": {"vocab": {"a": 0}, "merges": []}}' >"$T/bad2/tokenizer.json"
echo '{"eos_token": ' >"$T/bad2/tokenizer_config.json"
check_fails "malformed tokenizer_config.json" "bad2/tokenizer_config.json: not valid JSON" \
    "${G[@]}" --preset tiny --quant f32 --tokenizer "$T/bad2" -o "$T/x.gguf"
check_rc "failures exit 1" 1 "${G[@]}" --preset tiny --quant f32 --tokenizer "$T/bad.json" -o "$T/x.gguf"
if [ -e "$T/x.gguf" ]; then bad "no output after failures" "$T/x.gguf exists"; else ok "no output after failures"; fi
check_fails "unwritable output" "no_dir/x.gguf" "${G[@]}" --preset tiny --quant f32 -o "$T/no_dir/x.gguf"
# the Qwen3.5 size presets are accepted and their tensor tables laid out: the run reaches the
# open of its output (in a missing folder) and fails there, so no multi-GB file is written
for p in q35-0.8b q35-2b q35-4b q35-9b q35-27b q35-122b q35-397b; do
    check_fails "preset $p: tables laid out, stops at the open" "no_dir/$p\.gguf" \
        "${G[@]}" --preset "$p" --quant q4_k_m -o "$T/no_dir/$p.gguf"
done

# ---- files ----
check "gen tiny q4_k_m -t 2" "${G[@]}" --preset tiny --quant q4_k_m --seed 3 -t 2 -o "$T/tiny.gguf"
check "gen tiny q4_k_m -t 1" "${G[@]}" --preset tiny --quant q4_k_m --seed 3 -t 1 -o "$T/tiny1.gguf"
check "same seed, other thread count: same bytes" cmp "$T/tiny.gguf" "$T/tiny1.gguf"
check "gen tiny q4_k_m seed 4" "${G[@]}" --preset tiny --quant q4_k_m --seed 4 -o "$T/tiny4.gguf"
if cmp -s "$T/tiny.gguf" "$T/tiny4.gguf"; then bad "other seed: other bytes" "seeds 3 and 4 wrote the same file"
else ok "other seed: other bytes"; fi
check "gen tiny f32" "${G[@]}" --preset tiny --quant f32 -o "$T/tiny-f32.gguf"
check "gen tiny q8_0" "${G[@]}" --preset tiny --quant q8_0 -o "$T/tiny-q8_0.gguf"

# tensor NAME TYPE lines of `hearth inspect` (names of qwen35moe tensors only)
tensor_types() { "$HEARTH" inspect "$1" | awk '$1 ~ /^(blk\.|token_embd|output)/ && NF >= 3 {print $1, $2}' | sort; }

has_inspect=0
"$HEARTH" inspect --help >/dev/null 2>&1 && has_inspect=1
if [ $has_inspect = 1 ]; then
    out=$("$HEARTH" inspect "$T/tiny.gguf" 2>&1)
    missing=""
    for tn in token_embd.weight output.weight output_norm.weight blk.0.attn_qkv.weight blk.0.ssm_a \
              blk.0.ssm_dt.bias blk.3.attn_q.weight blk.3.attn_k_norm.weight blk.3.ffn_down_exps.weight; do
        grep -q -- "$tn" <<<"$out" || missing="$missing $tn"
    done
    n=$(tensor_types "$T/tiny.gguf" | wc -l)
    if [ -n "$missing" ]; then bad "inspect lists the tensors" "missing:$missing"
    elif [ "$n" != 76 ]; then bad "inspect lists the tensors" "$n tensors, expected 76"
    else ok "inspect lists the tensors"; fi
else
    skip "inspect lists the tensors" "hearth inspect not built"
fi

# ---- the built-in vocabulary compresses English, and llama.cpp reads it the same way ----
text='The people would like to know the answer to this question, because it is important.'
if ids=$("$HEARTH" tokenize -m "$T/tiny.gguf" "$text" 2>/dev/null); then
    n=$(tr -cd ',' <<<"$ids" | wc -c); n=$((n + 1))
    if [ "$n" -lt $(( ${#text} / 2 )) ]; then ok "built-in vocab compresses English"
    else bad "built-in vocab compresses English" "$n tokens for ${#text} bytes: $ids"; fi
    if peer=$(tools/peer/path.sh 2>/dev/null) && [ -x "$peer/llama-tokenize" ]; then
        lids=$("$peer/llama-tokenize" -m "$T/tiny.gguf" -p "$text" --ids --log-disable 2>/dev/null | tail -n 1)
        if [ "$lids" = "$ids" ]; then ok "built-in vocab: llama-tokenize agrees"
        else bad "built-in vocab: llama-tokenize agrees" "hearth $ids
llama.cpp $lids"; fi
    else
        skip "built-in vocab: llama-tokenize agrees" "llama.cpp peer not built"
    fi
else
    skip "built-in vocab compresses English" "hearth tokenize not built"
    skip "built-in vocab: llama-tokenize agrees" "hearth tokenize not built"
fi

# ---- the Q4_K_M mix against llama-quantize ----
# compare_mix NAME SRC OURS: llama-quantize SRC to Q4_K_M gives every tensor OURS's type.
compare_mix() {
    local n=$1 src=$2 ours=$3 out
    if ! out=$("$peer/llama-quantize" --allow-requantize "$src" "$T/lq.gguf" Q4_K_M 2 2>&1); then
        bad "$n" "llama-quantize failed: $(tail -n 5 <<<"$out")"; return
    fi
    local d
    d=$(diff <(tensor_types "$ours") <(tensor_types "$T/lq.gguf"))
    if [ -z "$d" ] && [ -n "$(tensor_types "$ours")" ]; then ok "$n"; else bad "$n" "hearth < > llama-quantize:
$d"; fi
    rm -f "$T/lq.gguf"
}
if [ $has_inspect = 1 ] && peer=$(tools/peer/path.sh 2>/dev/null) && [ -x "$peer/llama-quantize" ]; then
    compare_mix "tiny Q4_K_M types = llama-quantize's" "$T/tiny-f32.gguf" "$T/tiny.gguf"
    "${G[@]}" --preset small --quant q8_0 -o "$T/small-q8_0.gguf" 2>/dev/null
    "${G[@]}" --preset small --quant q4_k_m -o "$T/small.gguf" 2>/dev/null
    compare_mix "small Q4_K_M types = llama-quantize's" "$T/small-q8_0.gguf" "$T/small.gguf"
    rm -f "$T/small-q8_0.gguf" "$T/small.gguf"
else
    skip "tiny Q4_K_M types = llama-quantize's" "llama.cpp peer or hearth inspect not built (tools/peer/build.sh)"
    skip "small Q4_K_M types = llama-quantize's" "llama.cpp peer or hearth inspect not built"
fi

# ---- Qwen3's real tokenizer ----
qdir=${HEARTH_PEER_DIR:-${HOME:-/tmp}/.cache/hearth-peer}/tokenizer-qwen3
if [ -f "$qdir/tokenizer.json" ]; then
    out=$("${G[@]}" --preset tiny --quant q4_k_m --tokenizer "$qdir/tokenizer.json" -o "$T/qwen3.gguf" 2>&1); rc=$?
    if [ $rc != 0 ]; then bad "gen with Qwen3's tokenizer" "$out"
    elif ! grep -q "151669 tokens" <<<"$out" || ! grep -q "grown to 151808" <<<"$out"; then
        bad "gen with Qwen3's tokenizer" "expected 151669 tokens grown to 151808: $out"
    else ok "gen with Qwen3's tokenizer"; fi
    if [ $has_inspect = 1 ]; then
        out=$("$HEARTH" inspect "$T/qwen3.gguf" 2>&1)
        if grep -q 'tokenizer.ggml.tokens: \[string x 151808\]' <<<"$out" &&
           grep -q 'tokenizer.ggml.eos_token_id: u32 151645' <<<"$out" &&
           grep -q 'tokenizer.ggml.bos_token_id: u32 151643' <<<"$out"; then ok "Qwen3 vocab size and special ids"
        else bad "Qwen3 vocab size and special ids" "$(grep tokenizer <<<"$out")"; fi
    else
        skip "Qwen3 vocab size and special ids" "hearth inspect not built"
    fi
    if peer=$(tools/peer/path.sh 2>/dev/null) && [ -x "$peer/llama-tokenize" ]; then
        out=$("$peer/llama-tokenize" -m "$T/qwen3.gguf" -p "<|im_start|>user<|im_end|><think>" --ids --log-disable 2>&1)
        if grep -q '\[151644, 872, 151645, 151667\]' <<<"$out"; then ok "llama.cpp tokenizes with the imported vocab"
        else bad "llama.cpp tokenizes with the imported vocab" "$out"; fi
    else
        skip "llama.cpp tokenizes with the imported vocab" "llama.cpp peer not built"
    fi
    rm -f "$T/qwen3.gguf"
else
    for c in "gen with Qwen3's tokenizer" "Qwen3 vocab size and special ids" "llama.cpp tokenizes with the imported vocab"; do
        skip "$c" "no Qwen3 tokenizer cached: tools/peer/fetch_tokenizer.sh"
    done
fi

rm -rf "$T"
summary
