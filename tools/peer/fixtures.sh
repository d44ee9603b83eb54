#!/usr/bin/env bash
# tools/peer/fixtures.sh: copies test data (not code) from the peer's llama.cpp clone into
# tests/fixtures/, and writes tests/fixtures/SOURCES.md saying where each file came from.
#
#   tests/fixtures/vocab/ggml-vocab-{qwen2,qwen35}.gguf.gz  vocab-only GGUF files, gzip -9n
#                       (5.9 MB each raw, 1.7 MB packed; tests unpack them with gzip -dc)
#   tests/fixtures/vocab/ggml-vocab-*.gguf.inp / .out       llama.cpp's tokenizer test vectors:
#                       texts separated by "\n__ggml_vocab_test__\n", one line of ids per text
#   tests/fixtures/templates/*.jinja                        chat templates from models/templates
#   tests/fixtures/templates/{chatml,llama3}.{jinja,expected} and conversation.json
#                       two templates with their expected rendering of conversation.json,
#                       taken from llama.cpp's tests/test-chat-template.cpp
#
# Needs the clone only (tools/peer/build.sh makes it; the build need not be finished).
# Re-running gives the same bytes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
repo=$(cd "$here/../.." && pwd)
src=$PEER_SRC
[ -d "$src/models" ] || { echo "fixtures: no llama.cpp clone at $src: run tools/peer/build.sh" >&2; exit 1; }
vocab=$repo/tests/fixtures/vocab
tmpl=$repo/tests/fixtures/templates
mkdir -p "$vocab" "$tmpl"
commit=$(git -C "$src" log -1 --format='%h (%cd)' --date=short)

for v in qwen2 qwen35; do
    f=$src/models/ggml-vocab-$v.gguf
    [ -f "$f" ] || { echo "fixtures: $f not in this llama.cpp, skipped" >&2; continue; }
    gzip -9nc "$f" >"$vocab/ggml-vocab-$v.gguf.gz"
    for ext in inp out; do [ -f "$f.$ext" ] && cp "$f.$ext" "$vocab/"; done
done

for t in Qwen3.5-4B Qwen-Qwen3-0.6B meta-llama-Llama-3.1-8B-Instruct; do
    f=$src/models/templates/$t.jinja
    if [ -f "$f" ]; then cp "$f" "$tmpl/"; else echo "fixtures: $f missing, skipped" >&2; fi
done

# Two small templates with their expected output, straight from llama.cpp's own test.
python3 - "$src/tests/test-chat-template.cpp" "$tmpl" <<'PY'
import json, re, sys
src, out = sys.argv[1], sys.argv[2]
text = open(src, encoding="utf-8").read()
lit = r'(?:u8)?"((?:[^"\\]|\\.)*)"'
def unc(s):  # decode a C string literal body (the escapes these tests use)
    return re.sub(r'\\(.)', lambda m: {'n': '\n', 't': '\t', 'r': '\r'}.get(m.group(1), m.group(1)), s)
conv = re.search(r'std::vector<llama_chat_message> conversation \{(.*?)\};', text, re.S).group(1)
msgs = [{"role": unc(r), "content": unc(c)} for r, c in re.findall(r'\{' + lit + r',\s*' + lit + r'\}', conv)]
json.dump({"messages": msgs, "add_generation_prompt": True, "bos_token": "", "eos_token": ""},
          open(f"{out}/conversation.json", "w"), indent=1)
for name, stem in (("teknium/OpenHermes-2.5-Mistral-7B", "chatml"), ("Llama-3", "llama3")):
    m = re.search(r'/\* \.name= \*/\s*"' + re.escape(name) + r'",\s*/\* \.template_str= \*/\s*' + lit +
                  r',\s*/\* \.expected_output= \*/\s*' + lit, text)
    if not m:
        print(f"fixtures: test case {name} not found, skipped", file=sys.stderr); continue
    open(f"{out}/{stem}.jinja", "w").write(unc(m.group(1)))
    open(f"{out}/{stem}.expected", "w").write(unc(m.group(2)))
PY

{
    echo "# Test fixtures: where they come from"
    echo
    echo "Written by tools/peer/fixtures.sh from llama.cpp $commit, as bundled in the npm"
    echo "package $PEER_NPM_PKG@$PEER_NPM_VERSION (llama.cpp is MIT-licensed; these are its test"
    echo "data, no code). Re-run the script to refresh them."
    echo
    echo "| file | from llama.cpp | bytes |"
    echo "| --- | --- | --- |"
    for f in "$vocab"/* "$tmpl"/*; do
        b=$(basename "$f")
        case $b in
            *.gguf.gz) o="models/${b%.gz} (gzip -9n)" ;;
            ggml-vocab-*) o="models/$b" ;;
            chatml.*) o="tests/test-chat-template.cpp, case teknium/OpenHermes-2.5-Mistral-7B" ;;
            llama3.*) o="tests/test-chat-template.cpp, case Llama-3" ;;
            conversation.json) o="tests/test-chat-template.cpp, the conversation the cases render" ;;
            *) o="models/templates/$b" ;;
        esac
        echo "| ${f#"$repo/tests/fixtures/"} | $o | $(stat -c %s "$f") |"
    done
} >"$repo/tests/fixtures/SOURCES.md"
du -cb "$vocab" "$tmpl" | tail -n 1 | awk '{printf "fixtures: %.2f MB in tests/fixtures\n", $1 / 1e6}' >&2
