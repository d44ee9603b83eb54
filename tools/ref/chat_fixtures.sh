#!/usr/bin/env bash
# chat_fixtures.sh: regenerates tests/fixtures/chat/: the conversations (gen_chats.py) and, for
# every template in tests/fixtures/templates/ and tests/fixtures/chat/templates/, the expected
# rendering of each as "INDEX ok BYTES FNV1A64" or "INDEX error" (jinja_render.py --hashes).
# strftime_now is pinned to HEARTH_NOW (2024-07-26 00:00 UTC); tests/unit/test_chat.c uses the same.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=tests/fixtures/chat
python3 tools/ref/gen_chats.py > $out/chats.json
export HEARTH_NOW=1721952000
mkdir -p $out/expected
rm -f $out/expected/*.hashes
for t in tests/fixtures/templates/*.jinja $out/templates/*.jinja; do
    python3 tools/ref/jinja_render.py "$t" --hashes $out/chats.json > "$out/expected/$(basename "$t" .jinja).hashes"
done
python3 -c 'import jinja2, sys; print(f"jinja2 {jinja2.__version__}, python {sys.version.split()[0]}")' > $out/expected/VERSION
