#!/usr/bin/env bash
# demo.sh: the trained demo model (demo/, tools/demo/): the README's main job answers in
# English words and says what the model is; the shipped q8_0 file's held-out perplexity in
# hearth against llama-perplexity's (paired per window) and as close to PyTorch's f32 figure
# as llama.cpp's (tests/cli/demo_check.py derives the bands; the checkpoint's f32 and q4_k_m
# rows need the checkpoint, which is not in the repo: tools/demo/finish.sh runs those).
. "$(dirname "$0")/lib.sh"
D=demo
M=$D/hearth-demo-q8_0.gguf
[ -f /usr/share/dict/words ] || { bad "the word list /usr/share/dict/words (Debian's wamerican; scripts/setup-deps.sh)"; summary; exit; }
[ -f "$M" ] || { bad "the demo model $M is in the tree"; summary; exit; }

# English words: the answer is valid UTF-8, and of its words (letters and apostrophes,
# lowercased) at least 80% are in Debian's American English word list (wamerican, 104k words)
# or the held-out text (for the Bible's names and old forms: "straightway", "Herodians").
# Random weights of the same shape write invalid UTF-8 or sub-word fragments: the planted
# defect below must fail it.
english() { # FILE: the answer's text
    python3 - "$1" "$D/heldout.txt" <<'EOF'
import re, sys
try:
    ans = open(sys.argv[1], encoding="utf-8").read()
except UnicodeDecodeError as ex:
    sys.exit(f"not UTF-8: {ex}")
text = open(sys.argv[2], encoding="utf-8").read() + open("/usr/share/dict/words", encoding="utf-8").read()
known = set(re.findall(r"[a-z']+", text.lower()))
words = re.findall(r"[a-z']+", ans.lower())
hit = sum(w in known for w in words)
print(f"{hit}/{len(words)} words known: {ans!r}")
sys.exit(0 if len(words) >= 5 and hit >= 0.8 * len(words) else 1)
EOF
}
q='<|im_start|>user
Who are you?<|im_end|>
<|im_start|>assistant
<think>

</think>

'
"$HEARTH" run -m "$M" -p "$q" -n 40 --temp 0 >"$TMP/demo-answer.txt" 2>"$TMP/demo-run.err"
out=$(english "$TMP/demo-answer.txt") && ok "hearth run: the demo model answers in English words ($out)" ||
    bad "the demo model's answer is English words" "$out $(tail -3 "$TMP/demo-run.err")"
# the defect the check must catch: the same shapes with random weights
"$HEARTH" gen --preset tiny --quant q8_0 --seed 1 -o "$TMP/demo-random.gguf" >/dev/null 2>&1
"$HEARTH" run -m "$TMP/demo-random.gguf" -p "Who are you?" -n 40 --temp 0 >"$TMP/demo-random.txt" 2>/dev/null
out=$(english "$TMP/demo-random.txt" 2>&1) && bad "random weights pass the English check" "$out" ||
    ok "random weights fail the English check ($(cut -c1-60 <<<"$out"))"
# and valid UTF-8 that is not words: the demo's answer with each word's letters reversed
rev -- "$TMP/demo-answer.txt" >"$TMP/demo-reversed.txt"
out=$(english "$TMP/demo-reversed.txt" 2>&1) && bad "reversed words pass the English check" "$out" ||
    ok "the answer's words reversed fail the English check ($(cut -c1-60 <<<"$out"))"

# the README's main job, as a newcomer runs it
if out=$(HEARTH_PORT=0 timeout 300 scripts/demo.sh 2>&1); then
    n=$(grep -c '^   content: ' <<<"$out")
    if [ "$n" = 2 ] && grep -q 'hearth-demo is a small demo model' <<<"$out" && grep -q 'the model: hearth-demo' <<<"$out"; then
        grep '^   content: ' <<<"$out" | sed -E 's/^ +content: +//' >"$TMP/demo-main.txt"
        w=$(english "$TMP/demo-main.txt") && ok "scripts/demo.sh: names hearth-demo, says it is a small demo model, two answers in English ($w)" ||
            bad "scripts/demo.sh's answers are English words" "$w"
    else
        bad "scripts/demo.sh names the model, says it is a small demo model, answers twice" "$out"
    fi
else
    bad "scripts/demo.sh runs" "$out"
fi

# the model card's figures: demo_check.py against PyTorch (report.json) and llama.cpp
if ! bin=$(tools/peer/path.sh 2>/dev/null); then
    if [ -n "${CI:-}" ]; then check "CI: the llama.cpp peer is built" false; summary; exit; fi
    skip "demo perplexity against PyTorch and llama-perplexity" "llama.cpp peer not built: run tools/peer/build.sh"
else
    check "demo perplexity: the q8_0 file against llama-perplexity and PyTorch" \
        python3 tests/cli/demo_check.py "$HEARTH" "$bin" "$D"
fi
summary
