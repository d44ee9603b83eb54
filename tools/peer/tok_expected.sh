#!/usr/bin/env bash
# tools/peer/tok_expected.sh: regenerates tests/fixtures/tok/expected.{qwen2,qwen35}.jsonl,
# llama.cpp's ids for the tokenizer corpus (tok_corpus.py), with llama-tokenize on the
# vocab-only files of its clone. Needs the peer (tools/peer/build.sh); the results are
# committed, so the tests run without it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
bin=$("$here/path.sh") || { echo "tok_expected: llama.cpp peer not built (tools/peer/build.sh)" >&2; exit 1; }
python3 "$here/tok_corpus.py" >&2
exec python3 "$here/tok_expected.py" "$bin" "$PEER_SRC/models" "$here/../.."
