#!/usr/bin/env bash
# tools/peer/tok_bench.sh: tokenizer speed, hearth vs llama.cpp's llama-tokenize, on the same
# 1 MB text (deterministic: English prose with some accented, CJK and Cyrillic words, and
# code), vocab-only ggml-vocab-qwen35.gguf, one thread each. Each tool runs REPS (5) times on the
# text and on an empty input; the best times are kept, and the empty run's time (loading the
# vocabulary) is subtracted (times are CPU seconds) to give tokens per second of tokenizing alone. hearth reads the
# text 5 times in one run (5 stdin lines), which keeps its short time above the noise; the
# llama-tokenize CLI takes one text per run. Not a test.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
hearth=${HEARTH:-$here/../../build/hearth}
reps=${REPS:-5}
bin=$("$here/path.sh") || { echo "tok_bench: llama.cpp peer not built (tools/peer/build.sh)" >&2; exit 1; }
vocab=$PEER_SRC/models/ggml-vocab-qwen35.gguf
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 - "$tmp" <<'PY'
import json, random, sys
R = random.Random(1)
words = ("the of and to in is was for on that with as by at from this be are an which or it not have "
         "inference server model token cache prompt request batch kernel memory state layer expert "
         "naïve café résumé Zürich 人工智能 東京 Привет мир").split()
code = ['def f(x):\n    return x * 2\n', 'for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n',
        'if err != nil {\n\treturn fmt.Errorf("bad: %w", err)\n}\n', '{"id": 42, "tags": ["a", "b"]}\n']
out, n = [], 0
while n < 1_000_000:
    if R.random() < 0.25:
        s = R.choice(code)
    else:
        s = " ".join(R.choice(words) for _ in range(R.randrange(5, 30)))
        s = s[0].upper() + s[1:] + R.choice([". ", ".\n", ", ", "? ", ".\n\n"])
    out.append(s)
    n += len(s.encode())
text = "".join(out).encode()[:1_000_000].decode("utf-8", "ignore")
open(sys.argv[1] + "/text.txt", "w").write(text)
open(sys.argv[1] + "/text.jsonl", "w").write(json.dumps(text) + "\n")
open(sys.argv[1] + "/text5.jsonl", "w").write((json.dumps(text) + "\n") * 5)
open(sys.argv[1] + "/empty.txt", "w").write("")
open(sys.argv[1] + "/empty.jsonl", "w").write('""\n')
PY

best() { # least CPU seconds (user + system) of REPS runs of "$@" with stdin from $1:
    local in=$1 b= t  # steadier than wall time on a shared machine (one thread each here)
    shift
    for _ in $(seq "$reps"); do
        t=$( { /usr/bin/time -f "%U %S" "$@" <"$in" >/dev/null; } 2>&1 | tail -n 1 | awk '{print $1 + $2}')
        if [ -z "$b" ] || awk "BEGIN{exit !($t < $b)}"; then b=$t; fi
    done
    echo "$b"
}
h_ids=$("$hearth" tokenize -m "$vocab" < "$tmp/text.jsonl")
l_ids=$("$bin/llama-tokenize" -m "$vocab" --ids --log-disable --no-escape -f "$tmp/text.txt" 2>/dev/null)
n=$(python3 -c 'import json,sys; print(len(json.loads(sys.stdin.read())))' <<<"$h_ids")
same=$([ "$(tr -d ' ' <<<"$h_ids")" = "$(tr -d ' ' <<<"$l_ids")" ] && echo yes || echo NO)
h_all=$(best "$tmp/text5.jsonl" "$hearth" tokenize -m "$vocab")
h_0=$(best "$tmp/empty.jsonl" "$hearth" tokenize -m "$vocab")
l_all=$(best /dev/null "$bin/llama-tokenize" -m "$vocab" --ids --log-disable --no-escape -f "$tmp/text.txt")
l_0=$(best /dev/null "$bin/llama-tokenize" -m "$vocab" --ids --log-disable --no-escape -f "$tmp/empty.txt")
bytes=$(wc -c < "$tmp/text.txt")
awk -v n="$n" -v b="$bytes" -v ha="$h_all" -v h0="$h_0" -v la="$l_all" -v l0="$l_0" -v same="$same" 'BEGIN {
    ht = (ha - h0) / 5; lt = la - l0; if (ht <= 0) ht = 0.001; if (lt <= 0) lt = 0.001
    printf "text: %d bytes, %d tokens (qwen35 vocab); ids identical to llama-tokenize: %s\n", b, n, same
    printf "hearth tokenize:  %.2f s for 5 texts, %.2f s load -> %.0f tok/s, %.1f MB/s tokenizing\n", ha, h0, n / ht, b / ht / 1e6
    printf "llama-tokenize:   %.2f s for 1 text,  %.2f s load -> %.0f tok/s, %.1f MB/s tokenizing\n", la, l0, n / lt, b / lt / 1e6
    printf "ratio hearth/llama.cpp (tokenizing alone): %.2fx\n", lt / ht
}'
