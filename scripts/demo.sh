#!/usr/bin/env bash
# The main job on the embedded default: installs missing Debian packages, builds hearth, starts
# `hearth serve` on the CPU engine with the demo model (demo/hearth-demo-q8_0.gguf: hearth-demo,
# a small qwen35moe model trained for a few minutes on old public-domain books; its card is
# demo/README.md), and shows a two-turn chat through its OpenAI endpoint with curl (the second
# turn resends the conversation and resumes from the first turn's point), then stops it.
#   HEARTH_MODEL  another GGUF file (default demo/hearth-demo-q8_0.gguf)
#   HEARTH_PORT   the port (default: any free one)
#   HEARTH_KEEP=1 keep serving after the exchange (until Ctrl-C)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
command -v curl >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl >/dev/null; }
export PATH="$PATH:/usr/local/cuda/bin"
make -j"$(nproc)" build/hearth
model=${HEARTH_MODEL:-demo/hearth-demo-q8_0.gguf}
[ -f "$model" ] || { echo "demo: no model file $model" >&2; exit 1; }
ready=$(mktemp)
rm -f "$ready"
build/hearth serve -m "$model" --port "${HEARTH_PORT:-0}" --ready-file "$ready" -np 2 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$ready"' EXIT
for _ in $(seq 100); do [ -s "$ready" ] && break; sleep 0.1; done
[ -s "$ready" ] || { echo "demo: the server did not start" >&2; exit 1; }
url=http://127.0.0.1:$(cat "$ready")
echo
echo "== the model: $(curl -s "$url/v1/models" | python3 -c 'import json,sys; d=json.load(sys.stdin)["data"][0]; print(d["id"], d["meta"])')"
if [ -z "${HEARTH_MODEL:-}" ]; then
    echo "   hearth-demo is a small demo model: 18.4M parameters trained for 6.4 minutes on the King James"
    echo "   Bible, the Jargon File and fortune cookies (demo/README.md). It answers in English words and"
    echo "   is often wrong; it knows nothing else."
fi
# one turn: POSTs the conversation so far (JSON messages) and prints the answer
turn() {
    echo "== POST $url/v1/chat/completions  {\"messages\": $1, \"max_tokens\": 48, \"temperature\": 0}"
    curl -s "$url/v1/chat/completions" -H 'Content-Type: application/json' \
        -d "{\"messages\": $1, \"max_tokens\": 48, \"temperature\": 0}" | python3 -c '
import json, sys
r = json.load(sys.stdin)
if "error" in r:
    sys.exit("demo: the server answered: " + json.dumps(r["error"]))
m = r["choices"][0]["message"]
print("   content:          ", json.dumps(m["content"]))
print("   usage:            ", json.dumps(r["usage"]))
t = r["timings"]
print("   timings:           prompt %d new tokens in %.1f ms (%d from the cache), %d generated at %.0f tok/s"
      % (t["prompt_n"], t["prompt_ms"], t.get("cache_n", 0), t["predicted_n"], t["predicted_per_second"]))
open(sys.argv[1], "w").write(json.dumps(m["content"]))' "$answer"
}
answer=$(mktemp)
q1='{"role": "user", "content": "Who are you?"}'
turn "[$q1]"
a1="{\"role\": \"assistant\", \"content\": $(cat "$answer")}"
turn "[$q1, $a1, {\"role\": \"user\", \"content\": \"What does John 3:16 say?\"}]"
rm -f "$answer"
if [ "${HEARTH_KEEP:-0}" = 1 ]; then
    echo "== serving on $url (Ctrl-C stops it)"
    wait $server
fi
