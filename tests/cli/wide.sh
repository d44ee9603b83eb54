# wide.sh: the engine at the real widths of Qwen3.6-35B-A3B (vocab 248,320, 256 experts
# top-8, hidden 2048, 16/2 attention heads, 16/32 GDN heads, expert widths 512) with few
# layers (3 GDN + 1 attention: `hearth gen --preset wide`, 2.7 GB at q4_k_m): run with
# prompts of 1, 512, 513 and 2,048 rows (one, two and four passes), bench, every gate, and
# the engine tests (test_engine --wide: logits against the float64 reference through 513
# rows, batched against stepped, bits across thread counts after 2,048 rows). Toy shapes
# alone once hid an abort at 512 rows here. About 9 minutes on 2 cores, most of it the
# float64 reference (accuracy 3.3 min, 13.7 GB peak; test_engine 3.2 min); then the dense
# architecture at Qwen3.5-27B's widths (below).
. "$(dirname "$0")/lib.sh"
export HEARTH_TMP=$TMP  # where the programs below find the shared file
W=$TMP/shared-wide-q4_k_m.gguf  # models.h's test_model() finds it under this name
# ppl_vs_peer NAME MODEL TEXT: the paired test of tests/cli/ppl_check.py (windows of 64, 8 of
# them, 2 threads) against llama-perplexity; CI must have the peer, elsewhere a visible skip
ppl_vs_peer() {
    local bin
    if bin=$(tools/peer/path.sh 2>/dev/null); then
        check "$1" python3 tests/cli/ppl_check.py "$HEARTH" "$bin" "$2" "$3" 64 quant 2 8
    elif [ -n "${CI:-}" ]; then check "CI: the llama.cpp peer is built" false
    else skip "$1" "llama.cpp peer not built"; fi
}
check "gen wide q4_k_m" "$HEARTH" gen --preset wide --quant q4_k_m --seed 1 -o "$W"
ids() { seq 1 "$1" | awk '{printf "%s%d", (NR > 1 ? "," : ""), ($1 * 7919) % 248320}'; }
for n in 1 512 513 2048; do
    check "run at the real widths, prompt of $n rows" "$HEARTH" run -m "$W" --ids "$(ids "$n")" -n 2 -t 2 --ids-out \
        --marks "$( [ "$n" -gt 1 ] && echo "1,$((n - 1)),$n" || echo 1)"
done
check "bench at the real widths, pp512 tg4" "$HEARTH" bench -m "$W" -p 512 -n 4 -r 1 -t 2
for g in delta_rows_snap q_mark resume stale k_keep batch_inv anchor accuracy; do
    check "gate $g at the real widths" build/gates "$g" wide
done
check "engine tests at the real widths" build/tests/test_engine --wide
# hearth perplexity against llama-perplexity at the real widths (8 windows of 64: the
# paired test of tests/cli/ppl_check.py; about 20 s)
cat README.md docs/DESIGN.md | head -c 40000 >"$TMP/wide-ppl.txt"
ppl_vs_peer "perplexity at the real widths against llama-perplexity" "$W" "$TMP/wide-ppl.txt"
# the rows are scored on the engine's threads (31 rows x 248,320 logits a window: 7 shares
# of a million at -t 8, one at -t 1): the same figures to the last digit
cat README.md | head -c 6000 >"$TMP/wide-ppl-t.txt"
p1=$("$HEARTH" perplexity -m "$W" -f "$TMP/wide-ppl-t.txt" -c 64 --chunks 3 -t 1 --json 2>/dev/null)
p8=$("$HEARTH" perplexity -m "$W" -f "$TMP/wide-ppl-t.txt" -c 64 --chunks 3 -t 8 --json 2>/dev/null)
[ -n "$p1" ] && [ "$p1" = "$p8" ] && ok "perplexity: rows scored on 8 threads = on 1, to the last digit" ||
    bad "perplexity -t 8 against -t 1" "$p1 / $p8"
rm -f "$W"
# the dense architecture at the real widths of Qwen3.5-27B (F16: vocab 248,320, hidden 5,120,
# MLP 17,408, 24/4 attention heads, 16/48 GDN heads; `hearth gen --preset wide-dense`, 2.7 GB
# at q4_k_m, 3 GDN + 1 attention layer): prompts of 1 and 513 rows (two passes), and the paired
# perplexity test against llama-perplexity on 8 windows of 64. About 40 s on 2 cores; its gates
# (a minute or two each at these widths) run at tiny-dense (gates.sh, mutants).
WD=$TMP/shared-wide-dense-q4_k_m.gguf
check "gen wide-dense q4_k_m" "$HEARTH" gen --preset wide-dense --quant q4_k_m --seed 1 -o "$WD"
for n in 1 513; do
    check "run the dense model at the real widths, prompt of $n rows" "$HEARTH" run -m "$WD" --ids "$(ids "$n")" -n 2 -t 2 \
        --ids-out --marks "$( [ "$n" -gt 1 ] && echo "1,$((n - 1)),$n" || echo 1)"
done
head -c 40000 demo/heldout.txt >"$TMP/wide-dense-ppl.txt"
ppl_vs_peer "perplexity of the dense model at the real widths against llama-perplexity" "$WD" "$TMP/wide-dense-ppl.txt"
rm -f "$WD"
# a tied model at its real widths (Qwen3.5-0.8B: no output.weight, token_embd the head, at the
# output's type; 0.5 GB at q4_k_m): the same paired test against llama-perplexity. ~10 s
T8=$TMP/q35-0.8b-q4_k_m.gguf
check "gen q35-0.8b q4_k_m (tied)" "$HEARTH" gen --preset q35-0.8b --quant q4_k_m --seed 1 -o "$T8"
if "$HEARTH" inspect "$T8" 2>/dev/null | grep -q " output\.weight "; then bad "q35-0.8b: tied, yet an output.weight" "$T8"
else ok "q35-0.8b: no output.weight (tied)"; fi
ppl_vs_peer "perplexity of the tied q35-0.8b against llama-perplexity" "$T8" "$TMP/wide-dense-ppl.txt"
rm -f "$T8"
summary
