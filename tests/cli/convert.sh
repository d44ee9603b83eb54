#!/usr/bin/env bash
# tests/cli/convert.sh: `hearth convert` from the command line: usage errors (exit 2), a bad
# checkpoint (exit 1, no output left), and the fixture tests/fixtures/hf_tiny converted at f32
# and q8_0, inspected and run. The numbers (logits against Hugging Face) are checked by
# tests/unit/test_convert.c.
set -u
cd "$(dirname "$0")/../.."
source tests/cli/lib.sh
T=$TMP/convert
mkdir -p "$T"
C=("$HEARTH" convert)
FX=tests/fixtures/hf_tiny

check_rc() {
    local n=$1 want=$2; shift 2; local out rc
    out=$("$@" 2>&1); rc=$?
    if [ "$rc" = "$want" ]; then ok "$n"; else bad "$n" "exit $rc, expected $want: $out"; fi
}

check_fails "missing -o" "-o FILE is required" "${C[@]}" "$FX"
check_fails "missing HF_DIR" "HF_DIR is required" "${C[@]}" -o "$T/x.gguf"
check_fails "bad --quant" "unknown quantization 'q3_k' \(f32, q8_0, q4_k_m\)" "${C[@]}" "$FX" --quant q3_k -o "$T/x.gguf"
check_fails "q4_k_m of rows that are not whole 256-blocks" "token_embd.weight: rows of 128 .*Q5_0" \
    "${C[@]}" "$FX" --quant q4_k_m -o "$T/x.gguf"
check_fails "unknown option" "unknown option '--frobnicate'" "${C[@]}" "$FX" --frobnicate -o "$T/x.gguf"
check_rc "usage exits 2" 2 "${C[@]}" "$FX"
check_fails "folder without config.json" "config.json: No such file" "${C[@]}" "$T" -o "$T/x.gguf"
mkdir -p "$T/empty"
cp "$FX/config.json" "$T/empty/"
check_fails "folder without weights" "no model.safetensors or model.safetensors.index.json" "${C[@]}" "$T/empty" -o "$T/x.gguf"
mkdir -p "$T/trunc"
cp "$FX/config.json" "$T/trunc/"
head -c 1000000 "$FX/model.safetensors" >"$T/trunc/model.safetensors"
check_rc "truncated checkpoint exits 1" 1 "${C[@]}" "$T/trunc" -o "$T/x.gguf"
if [ -e "$T/x.gguf" ]; then bad "no output after a failure" "$T/x.gguf exists"; else ok "no output after a failure"; fi

for q in f32 q8_0; do
    check "convert $q" "${C[@]}" "$FX" --quant $q -o "$T/hf_tiny_$q.gguf"
    out=$("$HEARTH" inspect "$T/hf_tiny_$q.gguf" 2>&1)
    if grep -q 'qwen35moe.attention.recurrent_layers: \[bool x 4\] true, true, true, false' <<<"$out" &&
       grep -q 'blk.0.ssm_a ' <<<"$out"; then ok "inspect $q"; else bad "inspect $q" "$out"; fi
    check "run $q" "$HEARTH" run -m "$T/hf_tiny_$q.gguf" --ids 7,45,85,127 -n 4 -t 2
done

# q4_k_m: the same tensor types and the same bytes as llama-quantize Q4_K_M makes of the f32
# file, on a random checkpoint whose rows are whole 256-blocks (tests/cli/mk_hf.py)
python3 tests/cli/mk_hf.py "$T/hf256" 1
check "convert f32 (256-wide)" "${C[@]}" "$T/hf256" -o "$T/w_f32.gguf"
check "convert q4_k_m (256-wide)" "${C[@]}" "$T/hf256" --quant q4_k_m -o "$T/w_q4.gguf"
if bin=$(tools/peer/path.sh 2>/dev/null); then
    if ! out=$("$bin/llama-quantize" "$T/w_f32.gguf" "$T/w_q4_llama.gguf" Q4_K_M 2 2>&1); then
        bad "llama-quantize Q4_K_M of the f32 file" "$out"
    elif d=$(diff <(python3 tests/cli/gguf_tensors.py "$T/w_q4.gguf") <(python3 tests/cli/gguf_tensors.py "$T/w_q4_llama.gguf")); then
        ok "q4_k_m: every tensor's type and bytes as llama-quantize Q4_K_M"
    else bad "q4_k_m: every tensor's type and bytes as llama-quantize Q4_K_M" "$d"; fi
elif [ -n "${CI:-}" ]; then check "CI: the llama.cpp peer is built" false
else skip "q4_k_m against llama-quantize" "llama.cpp peer not built"; fi
check "run q4_k_m (256-wide)" "$HEARTH" run -m "$T/w_q4.gguf" --ids 7,45,85,127 -n 4 -t 2

rm -rf "$T"
summary
