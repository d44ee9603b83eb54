#!/usr/bin/env bash
# tests/cli/chat.sh: `hearth template`: renderings against committed expectations and, where
# python3 with jinja2 is installed, live against tools/ref/jinja_render.py on every committed
# template, and on all of llama.cpp's models/templates/ when its source is cached with the
# peer (about 25 s on 2 cores); errors a user can cause; message starts (--json) on the
# tiny preset's vocabulary (tests/unit/test_chat.c checks their prefix property).
set -u
cd "$(dirname "$0")/../.."
source tests/cli/lib.sh
H=$HEARTH
F=tests/fixtures/templates
export HEARTH_NOW=1721952000

for t in chatml llama3; do
    got=$($H template --template $F/$t.jinja --messages $F/conversation.json 2>&1)
    [ "$got" = "$(cat $F/$t.expected)" ] && ok "template $t matches llama.cpp's expected text" \
        || bad "template $t matches llama.cpp's expected text" "$got"
done

# live comparison with python jinja2 (the reference), chat by chat
compare() { # template chats.json -> prints "identical total"
    python3 tools/ref/jinja_render.py "$1" --batch "$2" > "$TMP/ref.jsonl" 2>/dev/null || return 1
    $H template --template "$1" --messages "$2" --batch --now $HEARTH_NOW > "$TMP/got.jsonl" 2>"$TMP/got.err" || : > "$TMP/got.jsonl"
    python3 - "$TMP/ref.jsonl" "$TMP/got.jsonl" "$(grep -c . "$TMP/ref.jsonl")" <<'PY'
import json, sys
ref = [json.loads(l) for l in open(sys.argv[1])]
got = [json.loads(l) for l in open(sys.argv[2])]
got += [{"ok": False}] * (len(ref) - len(got))
same = sum(1 for a, b in zip(ref, got) if a["ok"] == b["ok"] and (not a["ok"] or a["text"] == b["text"]))
print(same, len(ref))
PY
}
if python3 -c 'import jinja2' 2>/dev/null; then
    CH=tests/fixtures/chat/chats.json
    for t in $F/*.jinja tests/fixtures/chat/templates/*.jinja; do
        r=$(compare "$t" $CH) || { bad "live $(basename $t)" "reference failed"; continue; }
        set -- $r
        [ "$1" = "$2" ] && ok "live $(basename $t .jinja): $1/$2 identical" || bad "live $(basename $t .jinja): $1/$2 identical"
    done
    L=${HEARTH_PEER_DIR:-$HOME/.cache/hearth-peer}/llama.cpp/models/templates
    if [ -d $L ]; then
        n=0 all=0 worst=""
        for t in $L/*.jinja; do
            r=$(compare "$t" $CH) || continue
            set -- $r
            all=$((all + 1))
            [ "$1" = "$2" ] && n=$((n + 1)) || worst="$worst $(basename $t) ($1/$2)"
        done
        [ -z "$worst" ] && ok "llama.cpp templates: $n/$all identical on every chat" || bad "llama.cpp templates: $n/$all identical" "$worst"
    else
        skip "llama.cpp templates" "no llama.cpp source at $L"
    fi
    q=/root/.cache/hearth-peer/tokenizer-qwen3/tokenizer_config.json
    if [ -f $q ]; then
        python3 -c 'import json,sys; sys.stdout.write(json.load(open(sys.argv[1]))["chat_template"])' $q > "$TMP/qwen3.jinja"
        cmp -s "$TMP/qwen3.jinja" $F/Qwen-Qwen3-0.6B.jinja && ok "Qwen3's tokenizer_config.json template is the fixture's" \
            || bad "Qwen3's tokenizer_config.json template is the fixture's"
    else
        skip "Qwen3 tokenizer_config.json" "not cached"
    fi
else
    skip "live comparison" "python3 jinja2 not installed"
fi

# errors a user can cause
printf 'ok\n{%% include "x" %%}\n' > "$TMP/inc.jinja"
check_fails "unsupported tag names itself and its line" "line 2: the 'include' tag is not supported" \
    $H template --template "$TMP/inc.jinja" --messages $F/conversation.json
printf '{{ messages[0].content | frobnicate }}' > "$TMP/unk.jinja"
check_fails "unknown filter" "no filter named 'frobnicate'" $H template --template "$TMP/unk.jinja" --messages $F/conversation.json
echo '{"messages": "nope"}' > "$TMP/bad.json"
check_fails "messages must be an array" '"messages" must be an array' $H template --template $F/chatml.jinja --messages "$TMP/bad.json"
check_fails "template raise_exception" "No messages provided" \
    $H template --template $F/Qwen3.5-4B.jinja --messages <(echo '{"messages": []}')
check_fails "needs --messages" "are required" $H template --template $F/chatml.jinja

# message starts on the tiny preset's vocabulary (a ChatML template)
if $H gen --preset tiny --quant f32 -o "$TMP/tiny.gguf" >/dev/null 2>&1; then
    out=$($H template -m "$TMP/tiny.gguf" --messages $F/conversation.json --json --add-generation-prompt 2>&1)
    starts=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["starts"])' "$out" 2>/dev/null)
    n_im=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["text"].count("<|im_start|>"))' "$out" 2>/dev/null)
    n_st=$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])["starts"]))' "$out" 2>/dev/null)
    [ -n "$n_st" ] && [ "$n_st" = "$n_im" ] && [ "${starts:1:1}" = "0" ] && ok "--json: a start at each <|im_start|> ($starts)" \
        || bad "--json: a start at each <|im_start|>" "$out"
else
    skip "--json message starts" "hearth gen --preset tiny failed"
fi
summary
