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

# as_llama_quantize NAME F32 OURS: OURS (hearth convert --quant q4_k_m) has every tensor's type and
# bytes that llama-quantize Q4_K_M makes of F32
bin=$(tools/peer/path.sh 2>/dev/null) || bin=
as_llama_quantize() {
    local n=$1 out d
    if [ -z "$bin" ]; then
        if [ -n "${CI:-}" ]; then check "CI: the llama.cpp peer is built" false; else skip "$n" "llama.cpp peer not built"; fi
    elif ! out=$("$bin/llama-quantize" "$2" "$3.llama.gguf" Q4_K_M 2 2>&1); then
        bad "$n" "llama-quantize: $out"
    elif d=$(diff <(python3 tests/cli/gguf_tensors.py "$3") <(python3 tests/cli/gguf_tensors.py "$3.llama.gguf")); then ok "$n"
    else bad "$n" "$d"; fi
}

# q4_k_m: the same tensor types and the same bytes as llama-quantize Q4_K_M makes of the f32
# file, on a random checkpoint whose rows are whole 256-blocks (tests/cli/mk_hf.py)
python3 tests/cli/mk_hf.py "$T/hf256" 1
check "convert f32 (256-wide)" "${C[@]}" "$T/hf256" -o "$T/w_f32.gguf"
check "convert q4_k_m (256-wide)" "${C[@]}" "$T/hf256" --quant q4_k_m -o "$T/w_q4.gguf"
as_llama_quantize "q4_k_m: every tensor's type and bytes as llama-quantize Q4_K_M" "$T/w_f32.gguf" "$T/w_q4.gguf"
check "run q4_k_m (256-wide)" "$HEARTH" run -m "$T/w_q4.gguf" --ids 7,45,85,127 -n 4 -t 2

# the MTP block (mk_hf.py --mtp: the same trunk values): kept as blk.4's, shown by inspect,
# left out by --no-mtp; drafts change no token; its Q4_K_M types and bytes are llama-quantize's
python3 tests/cli/mk_hf.py "$T/hfm" 1 --mtp
check "convert f32 with the MTP block" "${C[@]}" "$T/hfm" -o "$T/m_f32.gguf"
out=$("$HEARTH" inspect "$T/m_f32.gguf" 2>&1)
if grep -q '^mtp: 1 block, blk.4 (20 tensors' <<<"$out" && grep -q 'blk.4.nextn.eh_proj.weight  *f32  *\[512, 256\]' <<<"$out" &&
   grep -q 'recurrent_layers: \[bool x 5\] true, true, true, false, false' <<<"$out" && grep -q 'block_count: u32 5' <<<"$out"; then
    ok "inspect: the MTP block"; else bad "inspect: the MTP block" "$(grep -E '^mtp|blk.4|block_count|recurrent' <<<"$out")"; fi
check "convert --no-mtp" "${C[@]}" "$T/hfm" --no-mtp -o "$T/m_no.gguf"
if "$HEARTH" inspect "$T/m_no.gguf" 2>&1 | grep -q '^mtp: none'; then ok "--no-mtp leaves it out"; else bad "--no-mtp leaves it out" "an mtp line says otherwise"; fi
plain=$("$HEARTH" run -m "$T/w_f32.gguf" --ids 7,45,85,127 -n 12 -t 2 --ids-out 2>/dev/null)
spec=$("$HEARTH" run -m "$T/m_f32.gguf" --ids 7,45,85,127 -n 12 -t 2 --ids-out --spec-mtp 3 2>/dev/null)
if [ -n "$plain" ] && [ "$plain" = "$spec" ]; then ok "--spec-mtp 3 on the converted block: the trunk's tokens"
else bad "--spec-mtp 3 on the converted block: the trunk's tokens" "$plain against $spec"; fi
check_fails "--spec-mtp on a file without the block" "no MTP block" "$HEARTH" run -m "$T/w_f32.gguf" --ids 7,45 -n 2 --spec-mtp 2
check "convert q4_k_m with the MTP block" "${C[@]}" "$T/hfm" --quant q4_k_m -o "$T/m_q4.gguf"
as_llama_quantize "q4_k_m with the MTP block: every tensor's type and bytes as llama-quantize Q4_K_M" "$T/m_f32.gguf" "$T/m_q4.gguf"

# the dense Qwen3_5ForCausalLM (mk_hf.py --dense, with its MTP block): architecture qwen35, the
# MLP's three matrices copied as they are (each GGUF tensor's bytes = the checkpoint's), its
# Q4_K_M bytes as llama-quantize's, runs and drafts
python3 tests/cli/mk_hf.py "$T/hfd" 1 --dense --mtp
check "convert f32 of a dense checkpoint" "${C[@]}" "$T/hfd" -o "$T/d_f32.gguf"
out=$("$HEARTH" inspect "$T/d_f32.gguf" 2>&1)
if grep -q '^architecture: qwen35$' <<<"$out" && grep -q 'qwen35.feed_forward_length: u32 512' <<<"$out" &&
   grep -q '^mtp: 1 block, blk.4' <<<"$out" && ! grep -q 'exps' <<<"$out"; then ok "inspect: qwen35, its MLP width, the MTP block"
else bad "inspect: qwen35, its MLP width, the MTP block" "$(grep -E '^architecture|feed_forward|^mtp' <<<"$out")"; fi
if d=$(python3 - "$T/hfd/model.safetensors" "$T/d_f32.gguf" <<'PY'
import json, struct, sys
st = open(sys.argv[1], "rb").read()
n = struct.unpack_from("<Q", st, 0)[0]
hdr = json.loads(st[8:8 + n])
def hf(name):
    a, b = hdr[name]["data_offsets"]
    return st[8 + n + a:8 + n + b]
g = open(sys.argv[2], "rb").read()
pos = 0
def take(fmt):
    global pos
    v = struct.unpack_from("<" + fmt, g, pos); pos += struct.calcsize("<" + fmt); return v
def string():
    global pos
    (k,) = take("Q"); s = g[pos:pos + k].decode(); pos += k; return s
def skip_value(t):
    global pos
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if t == 8: string()
    elif t == 9:
        (et,) = take("I"); (cnt,) = take("Q")
        for _ in range(cnt): skip_value(et)
    else: pos += sizes[t]
_, _, n_t, n_kv = take("4sIQQ")
align = 32
for _ in range(n_kv):
    key = string(); (t,) = take("I")
    if key == "general.alignment": (align,) = take("I")
    else: skip_value(t)
infos = {}
for _ in range(n_t):
    name = string(); (nd,) = take("I"); ne = take("%dQ" % nd); (ty,) = take("I"); (off,) = take("Q")
    infos[name] = (ne, ty, off)
base = (pos + align - 1) // align * align
bad = []
for il, pre in ((0, "model.layers.0."), (3, "model.layers.3."), (4, "mtp.layers.0.")):
    for ours, theirs in (("ffn_gate", "gate_proj"), ("ffn_up", "up_proj"), ("ffn_down", "down_proj")):
        ne, ty, off = infos[f"blk.{il}.{ours}.weight"]
        cnt = 1
        for d in ne: cnt *= d
        if ty != 0 or g[base + off:base + off + 4 * cnt] != hf(pre + "mlp." + theirs + ".weight"):
            bad.append(f"blk.{il}.{ours}")
print(" ".join(bad))
sys.exit(1 if bad else 0)
PY
); then ok "dense: ffn_gate / ffn_up / ffn_down are mlp.gate_proj / up_proj / down_proj, byte for byte (blk.0, 3, 4)"
else bad "dense: ffn_gate / ffn_up / ffn_down are mlp.gate_proj / up_proj / down_proj, byte for byte (blk.0, 3, 4)" "$d"; fi
plain=$("$HEARTH" run -m "$T/d_f32.gguf" --ids 7,45,85,127 -n 12 -t 2 --ids-out 2>/dev/null)
spec=$("$HEARTH" run -m "$T/d_f32.gguf" --ids 7,45,85,127 -n 12 -t 2 --ids-out --spec-mtp 2 2>/dev/null)
if [ -n "$plain" ] && [ "$plain" = "$spec" ]; then ok "dense: runs, --spec-mtp 2 the same tokens"; else bad "dense: runs, --spec-mtp 2 the same tokens" "$plain / $spec"; fi
check "convert q4_k_m of a dense checkpoint" "${C[@]}" "$T/hfd" --quant q4_k_m -o "$T/d_q4.gguf"
as_llama_quantize "dense q4_k_m: every tensor's type and bytes as llama-quantize Q4_K_M" "$T/d_f32.gguf" "$T/d_q4.gguf"

rm -rf "$T"
summary
