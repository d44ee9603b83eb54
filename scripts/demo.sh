#!/usr/bin/env bash
# The main job on the embedded default: installs missing Debian packages, builds hearth,
# makes the demo model if absent (a synthetic tiny qwen35moe file: random weights, so the
# text is gibberish until a trained demo model lands), starts `hearth serve` on the CPU
# engine, and shows one chat exchange through its OpenAI endpoint with curl, then stops it.
#   HEARTH_MODEL  the GGUF file (default models/demo-tiny-q4_k_m.gguf, made here)
#   HEARTH_PORT   the port (default: any free one)
#   HEARTH_KEEP=1 keep serving after the exchange (until Ctrl-C)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
command -v curl >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl >/dev/null; }
export PATH="$PATH:/usr/local/cuda/bin"
make -j"$(nproc)" build/hearth
model=${HEARTH_MODEL:-models/demo-tiny-q4_k_m.gguf}
if [ ! -f "$model" ]; then
    mkdir -p "$(dirname "$model")"
    build/hearth gen --preset tiny --quant q4_k_m --seed 1 -o "$model"
fi
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
echo "   (hearth gen --preset tiny: the qwen35moe architecture with random weights; its words are noise)"
body='{"messages": [{"role": "user", "content": "Tell me about hearths."}], "max_tokens": 32, "temperature": 0}'
echo "== POST $url/v1/chat/completions  $body"
curl -s "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "$body" | python3 -c '
import json, sys
r = json.load(sys.stdin)
m = r["choices"][0]["message"]
print("   reasoning_content:", json.dumps(m.get("reasoning_content", "")))
print("   content:          ", json.dumps(m["content"]))
print("   usage:            ", json.dumps(r["usage"]))
t = r["timings"]
print("   timings:           prompt %d tokens in %.1f ms, %d generated at %.0f tok/s" % (t["prompt_n"], t["prompt_ms"], t["predicted_n"], t["predicted_per_second"]))'
if [ "${HEARTH_KEEP:-0}" = 1 ]; then
    echo "== serving on $url (Ctrl-C stops it)"
    wait $server
fi
