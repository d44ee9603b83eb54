#!/usr/bin/env bash
# tests/cli/peer.sh: hearth's GGUF files against llama.cpp, the peer (tools/peer/).
# (a) llama.cpp loads every file `hearth gen` writes (presets tiny and small × quants f32,
#     q8_0, q4_k_m) and greedily generates 8 tokens from it with llama-completion;
# (b) `hearth inspect` reads files llama.cpp wrote: a random qwen35moe model saved by
#     test-llama-archs, hearth's tiny model rewritten by llama-quantize, and llama.cpp's
#     vocab-only files. Tensor names are checked against llama.cpp's own reader (llama-gguf).
# When the peer is not built every check is a visible skip. HEARTH_PEER_PRESETS narrows
# part (a), e.g. HEARTH_PEER_PRESETS=tiny for a quick run.
set -u
cd "$(dirname "$0")/../.."
source tests/cli/lib.sh

presets=(${HEARTH_PEER_PRESETS:-tiny small})
quants=(f32 q8_0 q4_k_m)
checks=()
for p in "${presets[@]}"; do for q in "${quants[@]}"; do
    checks+=("gen $p $q" "llama.cpp generates from $p-$q")
done; done
checks+=("gen tiny f32 --mtp" "llama.cpp generates from tiny-f32 with the MTP block")
checks+=("test-llama-archs writes qwen35moe" "inspect test-llama-archs qwen35moe"
         "llama-quantize rewrites tiny to q8_0" "inspect llama-quantize q8_0"
         "llama-quantize rewrites tiny to Q4_K_M" "inspect llama-quantize Q4_K_M"
         "llama.cpp generates from its Q4_K_M of tiny"
         "inspect ggml-vocab-qwen2" "inspect ggml-vocab-qwen35")

if ! bin=$(tools/peer/path.sh); then
    # CI builds the peer (.ci/run): there a missing peer fails, it does not skip
    if [ -n "${CI:-}" ]; then check "CI: the llama.cpp peer is built" false; summary; exit; fi
    for c in "${checks[@]}"; do skip "$c" "llama.cpp peer not built: run tools/peer/build.sh"; done
    summary; exit
fi
src=$(dirname "$(dirname "$bin")")/llama.cpp
TMP=$TMP/peer; mkdir -p "$TMP"

# check_generates NAME FILE: llama.cpp loads FILE and greedily generates up to 8 tokens
# after "Hello" (llama-simple: non-interactive, greedy, stops early only at an end-of-
# generation token); it must exit 0, run a prompt pass and decode at least one token.
# (llama-completion -no-cnv does the same, but its logger is asynchronous and may drop its
# last lines, timings included, at exit; llama-simple writes to stderr directly.)
check_generates() {
    local n=$1 out rc
    out=$("$bin/llama-simple" -m "$2" -n 8 Hello </dev/null 2>&1); rc=$?
    if [ $rc -ne 0 ]; then bad "$n" "llama-simple exit $rc: $(grep -a -v 'llama_model_loader: - ' <<<"$out" | tail -n 20)"
    elif ! grep -Eaq 'decoded [1-9][0-9]* tokens' <<<"$out" ||
         ! grep -Eaq 'prompt eval time = +[0-9.]+ ms / +[1-9][0-9]* tokens' <<<"$out"; then
        bad "$n" "no prompt pass or no token decoded: $(tail -n 20 <<<"$out")"
    else ok "$n"; fi
}

# inspect_lists NAME FILE ARCH: `hearth inspect` exits 0, names ARCH, and names every tensor
# that llama.cpp's llama-gguf finds in FILE.
inspect_lists() {
    local n=$1 f=$2 arch=$3 out peer names want missing
    if [ ! -f "$f" ]; then bad "$n" "no file $f"; return; fi
    if ! out=$("$HEARTH" inspect "$f" 2>&1); then bad "$n" "exit non-zero: $(tail -n 20 <<<"$out")"; return; fi
    if ! grep -qw -- "$arch" <<<"$out"; then bad "$n" "architecture $arch not in the output: $(head -n 20 <<<"$out")"; return; fi
    # llama-gguf's "r" pass 0 lists n_tensors and every tensor's name (pass 1 repeats them)
    if ! peer=$("$bin/llama-gguf" "$f" r n 2>&1); then bad "$n" "llama-gguf cannot read $f: $(tail -n 5 <<<"$peer")"; return; fi
    names=$(sed -nE 's/^gguf_ex_read_0: tensor\[[0-9]+\]: name = ([^,]+), size.*/\1/p' <<<"$peer")
    want=$(sed -nE 's/^gguf_ex_read_0: n_tensors: ([0-9]+)$/\1/p' <<<"$peer")
    if [ -z "$want" ] || [ "$want" != "$(grep -c . <<<"$names")" ]; then
        bad "$n" "llama-gguf listed ${want:-?} tensors but named $(grep -c . <<<"$names")"; return
    fi
    missing=$(grep -vxF -f <(grep -oE '[A-Za-z0-9_.]+' <<<"$out") <<<"$names")
    if [ -n "$missing" ]; then bad "$n" "tensors llama-gguf lists but hearth inspect does not: $missing"; return; fi
    ok "$n"
}

# (a) hearth writes, llama.cpp loads and generates. Big files are removed once checked.
for p in "${presets[@]}"; do for q in "${quants[@]}"; do
    f=$TMP/$p-$q.gguf
    check "gen $p $q" "$HEARTH" gen --preset "$p" --quant "$q" -o "$f"
    check_generates "llama.cpp generates from $p-$q" "$f"
    [ "$p-$q" = tiny-f32 ] || rm -f "$f"
done; done

# a file with the MTP block (blk.N's nextn tensors): llama.cpp names every tensor and loads it
check "gen tiny f32 --mtp" "$HEARTH" gen --preset tiny --quant f32 --mtp -o "$TMP/tiny-mtp.gguf"
check_generates "llama.cpp generates from tiny-f32 with the MTP block" "$TMP/tiny-mtp.gguf"
rm -f "$TMP/tiny-mtp.gguf"

# (b) llama.cpp writes, hearth reads.
mkdir -p "$TMP/archs"
check "test-llama-archs writes qwen35moe" "$bin/test-llama-archs" -a qwen35moe -s 42 -o "$TMP/archs"
inspect_lists "inspect test-llama-archs qwen35moe" "$TMP/archs/qwen35moe-moe.gguf" qwen35moe

tiny=$TMP/tiny-f32.gguf
[ -f "$tiny" ] || "$HEARTH" gen --preset tiny --quant f32 -o "$tiny" >/dev/null 2>&1
check "llama-quantize rewrites tiny to q8_0" "$bin/llama-quantize" "$tiny" "$TMP/tiny-lq-q8_0.gguf" q8_0 1
inspect_lists "inspect llama-quantize q8_0" "$TMP/tiny-lq-q8_0.gguf" qwen35moe
check "llama-quantize rewrites tiny to Q4_K_M" "$bin/llama-quantize" "$tiny" "$TMP/tiny-lq-q4_k_m.gguf" Q4_K_M 1
inspect_lists "inspect llama-quantize Q4_K_M" "$TMP/tiny-lq-q4_k_m.gguf" qwen35moe
check_generates "llama.cpp generates from its Q4_K_M of tiny" "$TMP/tiny-lq-q4_k_m.gguf"

for v in qwen2 qwen35; do
    f=$src/models/ggml-vocab-$v.gguf
    if [ -f "$f" ]; then inspect_lists "inspect ggml-vocab-$v" "$f" qwen2
    else skip "inspect ggml-vocab-$v" "not in this llama.cpp"; fi
done
rm -rf "$TMP"
summary
