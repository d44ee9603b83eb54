#!/usr/bin/env python3
"""turn_overhead.py: what a turn of a long conversation costs outside the engine pass (F11).

Drives `hearth serve` (or llama-server) with one conversation that grows by --words words a
turn (max_tokens 1, greedy), then --tail turns of --tail-words words at the full depth, and
prints per turn the prompt size, the rows resumed from, the client's wall time, the
server's timings.prompt_ms and their difference (the work outside the prompt pass: HTTP,
JSON, rendering, tokenizing, matching, the cache's copies) with timings.cache.

  --mode chat    user messages, the assistant's replies appended as returned
  --mode agent   after the first turn: the reply with a tool call, then a tool message
  --mode completion  /completion with the text so far, cache_prompt

A long context on the CPU: the tiny preset's file with its context_length raised
(--patch-ctx SRC DST N rewrites that one metadata value; the weights do not care):
  build/hearth gen --preset tiny --quant q4_k_m -o /tmp/tiny.gguf
  python3 bench/turn_overhead.py --patch-ctx /tmp/tiny.gguf /tmp/tiny64k.gguf 65536
  build/hearth serve -m /tmp/tiny64k.gguf -c 65536 --device cpu --port 18911 \\
      --chat-template-file tests/fixtures/templates/Qwen3.5-4B.jinja &
  python3 bench/turn_overhead.py --turns 10 --words 4000 --tail 5
Standard library only."""
import argparse, json, random, struct, sys, time, urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, default=18911)
ap.add_argument("--turns", type=int, default=10)
ap.add_argument("--words", type=int, default=4000, help="words of each new message")
ap.add_argument("--tail", type=int, default=0, help="then this many turns of --tail-words words")
ap.add_argument("--tail-words", type=int, default=50)
ap.add_argument("--mode", default="chat", choices=["chat", "agent", "completion"])
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--patch-ctx", nargs=3, metavar=("SRC", "DST", "N"), help="write SRC with context_length N to DST, exit")
a = ap.parse_args()

if a.patch_ctx:
    src, dst, n = a.patch_ctx[0], a.patch_ctx[1], int(a.patch_ctx[2])
    b = bytearray(open(src, "rb").read())
    key = b"qwen35moe.context_length"
    i = b.find(key)
    if i < 0 or struct.unpack_from("<I", b, i + len(key))[0] != 4:  # GGUF type 4: u32
        sys.exit(f"{src}: no u32 {key.decode()}")
    old = struct.unpack_from("<I", b, i + len(key) + 4)[0]
    struct.pack_into("<I", b, i + len(key) + 4, n)
    open(dst, "wb").write(b)
    print(f"{dst}: context_length {old} -> {n}")
    sys.exit(0)

rnd = random.Random(a.seed)
W = ("the of and to in is was for on that with as by at from it an be this are or his which had not but were "
     "have first their one new after also has she her two its other who been all most than time into made over "
     "later when during some only them can may under he up would more out state these there such school").split()


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{a.port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as r:
        out = json.loads(r.read())
    return out, (time.perf_counter() - t0) * 1e3


def text(n):
    return " ".join(rnd.choice(W) for _ in range(n))


msgs = [{"role": "system", "content": "You are a helpful assistant."}]
prompt = ""
print("turn  n_prompt  cache_n  wall_ms  prompt_ms  other_ms  cache")
for t in range(a.turns + a.tail):
    words = a.words if t < a.turns else a.tail_words
    if a.mode == "completion":
        prompt += text(words) + "\n"
        out, wall = post("/completion", {"prompt": prompt, "n_predict": 1, "cache_prompt": True})
        tm = out["timings"]
        n = tm["cache_n"] + tm["prompt_n"]
        prompt += out["content"]
    else:
        if a.mode == "agent" and t > 0:
            msgs.append({"role": "tool", "tool_call_id": f"call_{t}", "content": text(words)})
        else:
            msgs.append({"role": "user", "content": text(words)})
        out, wall = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1, "temperature": 0})
        tm = out["timings"]
        n = out["usage"]["prompt_tokens"]
        m = {"role": "assistant", "content": out["choices"][0]["message"].get("content") or ""}
        if a.mode == "agent":
            m["tool_calls"] = [{"id": f"call_{t + 1}", "type": "function",
                                "function": {"name": "read_file", "arguments": "{\"path\": \"a.txt\"}"}}]
        msgs.append(m)
    print(f"{t:4d}  {n:8d}  {tm['cache_n']:7d}  {wall:7.1f}  {tm['prompt_ms']:9.1f}  {wall - tm['prompt_ms']:8.1f}  "
          f"{tm.get('cache', '')}", flush=True)
