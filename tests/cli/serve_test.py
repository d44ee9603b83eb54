#!/usr/bin/env python3
"""serve_test.py: `hearth serve` end to end over HTTP (standard library only), on the tiny
synthetic model. Greedy answers are compared with `hearth run` on the same ids, bit for bit
(the same engine, KV type and pass cut), so a scheduler that leaks one slot into another,
resumes from a wrong point or mangles a prompt shows up as different tokens.

Prints one "ok"/"FAIL" line per check and "N passed, N failed" at the end."""
import http.client
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import checks
from checks import check

HEARTH = os.environ.get("HEARTH", "build/hearth")
TMP = os.environ.get("HEARTH_TMP") or tempfile.mkdtemp()


class Server:
    def __init__(self, model, *flags, env=None, log=None, preexec=None):
        self.ready = os.path.join(TMP, f"port-{os.getpid()}-{time.monotonic_ns()}")
        self.log = open(log or os.path.join(TMP, "serve.log"), "ab")
        self.p = subprocess.Popen([HEARTH, "serve", "-m", model, "--port", "0", "--ready-file", self.ready, "-t", "2",
                                   *flags], stdout=self.log, stderr=self.log,
                                  env={**os.environ, **env} if env else None, preexec_fn=preexec)
        for _ in range(200):
            if os.path.exists(self.ready) and open(self.ready).read().strip():
                break
            if self.p.poll() is not None:
                raise RuntimeError(f"hearth serve exited with {self.p.returncode}")
            time.sleep(0.05)
        self.port = int(open(self.ready).read())

    def request(self, method, path, body=None, headers=None, raw=None, timeout=60):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        c.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
        r = c.getresponse()
        text = r.read().decode()
        c.close()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def stream(self, path, body):
        """the SSE events of a streamed answer (parsed JSON, or the string [DONE])"""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        events = []
        for line in r.read().decode().split("\n"):
            if line.startswith("data: "):
                d = line[6:]
                events.append(d if d == "[DONE]" else json.loads(d))
        c.close()
        return r.status, r.getheader("Content-Type"), events

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return None


def metric(text, name):
    """a value of /metrics' Prometheus text"""
    for line in text.split("\n"):
        if line.startswith(f"hearth:{name} "):
            return float(line.split()[1])
    raise KeyError(name)


def run_ids(model, ids, n):
    """hearth run's greedy ids for a prompt of ids (KV f16 as the server's default)"""
    out = subprocess.run([HEARTH, "run", "-m", model, "--ids", ",".join(map(str, ids)), "-n", str(n), "-t", "2",
                          "--kv", "f16", "--ids-out", "--ignore-eos", "-c", "4096"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main():
    model = os.path.join(TMP, "serve-tiny.gguf")
    subprocess.run([HEARTH, "gen", "--preset", "tiny", "--quant", "q4_k_m", "--seed", "1", "-o", model], check=True,
                   capture_output=True)

    # flags
    r = subprocess.run([HEARTH, "serve", "-m", model, "--no-such-flag"], capture_output=True, text=True)
    check("an unknown flag is exit 2, named", r.returncode == 2 and "--no-such-flag" in r.stderr, r.stderr.strip())
    r = subprocess.run([HEARTH, "serve", "-m", model, "--reasoning-format", "odd"], capture_output=True, text=True)
    check("a bad --reasoning-format is exit 2, named", r.returncode == 2 and "reasoning-format" in r.stderr)

    s = Server(model, "-np", "2", "--metrics")
    st, j = s.request("GET", "/health")
    check("GET /health", st == 200 and j == {"status": "ok"}, str(j))
    st, j = s.request("GET", "/v1/models")
    check("GET /v1/models names the model", st == 200 and j["data"][0]["id"] == "serve-tiny.gguf", str(j)[:200])
    st, j = s.request("GET", "/props")
    check("GET /props: slots and context", st == 200 and j["total_slots"] == 2 and
          j["default_generation_settings"]["n_ctx"] == 4096, str(j)[:200])

    # tokenize / detokenize / apply-template
    st, j = s.post("/tokenize", {"content": "Hello world"})
    toks = j.get("tokens") if st == 200 else None
    check("POST /tokenize", st == 200 and isinstance(toks, list) and len(toks) > 0, str(j))
    st, j = s.post("/detokenize", {"tokens": toks})
    check("POST /detokenize inverts /tokenize", st == 200 and j.get("content") == "Hello world", str(j))
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a hearth."}]
    st, j = s.post("/apply-template", {"messages": msgs})
    check("POST /apply-template renders the messages", st == 200 and "Name a hearth." in j.get("prompt", ""), str(j))
    prompt_text = j["prompt"]
    _, j = s.post("/tokenize", {"content": prompt_text})
    prompt_ids = j["tokens"]

    # a chat answer equals hearth run on the same ids, bit for bit (greedy)
    want = run_ids(model, prompt_ids, 12)
    st, j = s.post("/completion", {"prompt": prompt_ids, "n_predict": 12, "temperature": 0, "ignore_eos": True,
                                   "return_tokens": True, "cache_prompt": False})
    check("/completion on ids: greedy tokens equal hearth run's", st == 200 and j.get("tokens") == want,
          f"{j.get('tokens') if isinstance(j, dict) else j} vs {want}")
    st, j = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 12, "temperature": 0, "ignore_eos": True})
    ok = st == 200 and j["choices"][0]["finish_reason"] == "length" and j["usage"]["completion_tokens"] == 12
    check("/v1/chat/completions: 12 tokens, finish length", ok, str(j)[:300])
    chat_answer = j["choices"][0]["message"] if ok else {}
    _, d = s.post("/detokenize", {"tokens": want})
    whole = (chat_answer.get("reasoning_content", "") + chat_answer.get("content", ""))
    check("the chat answer's text is the detokenized run ids (thinking split off)",
          d["content"].replace("</think>", "").replace("\n", "") == whole.replace("\n", ""),
          f"{d['content']!r} vs {chat_answer!r}")

    # streaming: the same text, the role first, usage, [DONE]
    st, ctype, ev = s.stream("/v1/chat/completions", {"messages": msgs, "max_tokens": 12, "temperature": 0,
                                                      "ignore_eos": True, "stream": True,
                                                      "stream_options": {"include_usage": True}})
    text = "".join((e["choices"][0]["delta"].get("reasoning_content") or "") +
                   (e["choices"][0]["delta"].get("content") or "") for e in ev if isinstance(e, dict) and e["choices"])
    check("stream: text/event-stream, role first, [DONE] last",
          st == 200 and ctype == "text/event-stream" and ev[0]["choices"][0]["delta"].get("role") == "assistant" and
          ev[-1] == "[DONE]", f"{st} {ctype} {ev[:1]} {ev[-1:]}")
    check("stream: the deltas add up to the whole answer", text == whole, f"{text!r} vs {whole!r}")
    usage = [e for e in ev if isinstance(e, dict) and "usage" in e]
    check("stream: include_usage sends usage", len(usage) == 1 and usage[0]["usage"]["completion_tokens"] == 12,
          str(usage))
    st, ctype, ev = s.stream("/completion", {"prompt": prompt_ids, "n_predict": 6, "temperature": 0, "stream": True,
                                             "ignore_eos": True})
    check("stream /completion: pieces then a stop event", st == 200 and ev[-1]["stop"] is True and
          ev[-1]["tokens_predicted"] == 6, str(ev[-1:]))

    # stop strings: the text ends before the stop string
    st, j = s.post("/v1/completions", {"prompt": prompt_ids, "max_tokens": 12, "temperature": 0, "ignore_eos": True})
    full = j["choices"][0]["text"]
    cut = full[3:6] if len(full) >= 8 else None
    if cut:
        st, j = s.post("/v1/completions", {"prompt": prompt_ids, "max_tokens": 12, "temperature": 0,
                                           "ignore_eos": True, "stop": [cut]})
        check("a stop string ends the text before it", st == 200 and j["choices"][0]["text"] == full[:full.find(cut)]
              and j["choices"][0]["finish_reason"] == "stop", f"{j['choices'][0]} (stop {cut!r} in {full!r})")
    else:
        check("the answer is long enough to cut", False, repr(full))

    # log-probabilities: greedy picks the best of top_logprobs, which are sorted and a part of a distribution
    st, j = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                                            "logprobs": True, "top_logprobs": 3})
    lp = j["choices"][0]["logprobs"]["content"] if st == 200 else []
    ok = len(lp) == 8 and all(
        t["logprob"] <= 0 and len(t["top_logprobs"]) == 3 and t["top_logprobs"][0]["token"] == t["token"] and
        abs(t["top_logprobs"][0]["logprob"] - t["logprob"]) < 1e-6 and
        all(a["logprob"] >= b["logprob"] for a, b in zip(t["top_logprobs"], t["top_logprobs"][1:])) and
        sum(math.exp(x["logprob"]) for x in t["top_logprobs"]) <= 1 + 1e-5 for t in lp)
    check("chat logprobs: greedy takes the best of top_logprobs, sorted, each <= 0", ok, str(lp[:2]))
    st, j = s.post("/v1/completions", {"prompt": prompt_ids, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                                       "logprobs": 2})
    tl = j["choices"][0]["logprobs"] if st == 200 else {}
    check("/v1/completions logprobs: one entry per token", st == 200 and len(tl["token_logprobs"]) == 6 and
          len(tl["top_logprobs"]) == 6 and len(tl["tokens"]) == 6, str(tl)[:300])
    # streamed, the same entries arrive spread over the chunks, in order: equal to the whole
    # answer's (the same greedy tokens, the same float printed the same way)
    st, _, ev = s.stream("/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "temperature": 0,
                                                  "ignore_eos": True, "logprobs": True, "top_logprobs": 3,
                                                  "stream": True})
    slp = [t for e in ev if e != "[DONE]" for c in e["choices"] if c.get("logprobs")
           for t in c["logprobs"]["content"]]
    check("streamed chat logprobs equal the whole answer's", st == 200 and slp == lp, f"{slp[:2]} vs {lp[:2]}")
    st, _, ev = s.stream("/v1/completions", {"prompt": prompt_ids, "max_tokens": 6, "temperature": 0,
                                             "ignore_eos": True, "logprobs": 2, "stream": True})
    stl = {k: [x for e in ev if e != "[DONE]" for c in e["choices"] if c.get("logprobs") for x in c["logprobs"][k]]
           for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    check("streamed /v1/completions logprobs equal the whole answer's (text_offset runs on)", st == 200 and stl == tl,
          f"{stl} vs {tl}"[:300])
    # penalties: this random model's greedy answer never repeats an id, so a penalty has nothing
    # to push away; pulled the other way (a repeat "penalty" of 0.01 multiplies every positive
    # logit of an id in the context by 100) greedy must pick only ids of the context
    plain = s.post("/completion", {"prompt": prompt_ids, "n_predict": 24, "temperature": 0, "ignore_eos": True,
                                   "return_tokens": True, "cache_prompt": False})[1]["tokens"]
    pen = s.post("/completion", {"prompt": prompt_ids, "n_predict": 24, "temperature": 0, "ignore_eos": True,
                                 "return_tokens": True, "cache_prompt": False, "repeat_penalty": 0.01,
                                 "repeat_last_n": -1})[1]["tokens"]
    check("repeat_penalty 0.01 over the context: greedy picks only ids of the context",
          pen != plain and all(t in set(prompt_ids) | set(pen[:k]) for k, t in enumerate(pen)), f"{pen} (plain {plain})")
    pres = s.post("/completion", {"prompt": prompt_ids, "n_predict": 24, "temperature": 0, "ignore_eos": True,
                                  "return_tokens": True, "cache_prompt": False, "presence_penalty": -2,
                                  "frequency_penalty": -2})[1]["tokens"]
    check("presence and frequency penalties change a greedy answer", pres != plain, f"{pres} vs {plain}")

    # multi-turn: turn 2 resumes from a point, prefills only the new part, and answers as a cold server
    turn1 = msgs
    st, a1 = s.post("/v1/chat/completions", {"messages": turn1, "max_tokens": 8, "temperature": 0})
    reply = a1["choices"][0]["message"]
    turn2 = turn1 + [{"role": "assistant", "content": reply.get("content", ""),
                      "reasoning_content": reply.get("reasoning_content", "")},
                     {"role": "user", "content": "And another one?"}]
    st, a2 = s.post("/v1/chat/completions", {"messages": turn2, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    cached = a2["usage"]["prompt_tokens_details"]["cached_tokens"]
    check("turn 2 reports cached tokens", st == 200 and cached > 0, str(a2.get("usage")))
    print(f"     turn 2: {a2['usage']['prompt_tokens']} prompt tokens, {cached} cached ({a2['timings']['cache']})")
    # a thinking chat: turn 1's answer was all reasoning, which turn 2's rendering drops, so
    # turn 2 diverges inside that assistant message: it must resume exactly at its start
    _, gp = s.post("/tokenize", {"content": "<|im_start|>assistant\n<think>\n"})
    assistant_start = a1["usage"]["prompt_tokens"] - len(gp["tokens"])
    check("a thinking chat: turn 2 resumes at the start of turn 1's assistant message",
          reply.get("reasoning_content") and cached == assistant_start, f"{cached} vs {assistant_start}")
    check("turn 2 prefills only what follows the cached rows",
          a2["timings"]["prompt_n"] == a2["usage"]["prompt_tokens"] - cached, str(a2.get("timings")))
    cold = Server(model, "-np", "1")
    _, c2 = cold.post("/v1/chat/completions", {"messages": turn2, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    check("turn 2 equals a cold server's answer", c2["choices"][0]["message"] == a2["choices"][0]["message"] and
          c2["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, f"{c2['choices'][0]} vs {a2['choices'][0]}")
    cold.stop()

    # parallel requests on 2 slots equal their solo runs
    p1 = prompt_ids
    p2 = prompt_ids[:-3] + [toks[0], toks[-1]] + prompt_ids[-3:]
    solo = [run_ids(model, p, 16) for p in (p1, p2)]
    res = [None, None]

    def go(k, p):
        res[k] = s.post("/completion", {"prompt": p, "n_predict": 16, "temperature": 0, "ignore_eos": True,
                                        "return_tokens": True, "cache_prompt": False})
    for rep in range(2):
        th = [threading.Thread(target=go, args=(k, p)) for k, p in enumerate((p1, p2))]
        [t.start() for t in th]
        [t.join() for t in th]
        check(f"parallel on 2 slots equals solo runs (round {rep})",
              all(r[0] == 200 and r[1]["tokens"] == solo[k] for k, r in enumerate(res)),
              f"{[r[1].get('tokens') for r in res]} vs {solo}")

    # bad input: each a 4xx with an error body, the server serving on
    bad = [
        ("malformed JSON", "/v1/chat/completions", b'{"messages": [', 400),
        ("not an object", "/v1/chat/completions", b'[1, 2]', 400),
        ("unknown role", "/v1/chat/completions", json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), 400),
        ("temperature of the wrong type", "/v1/chat/completions",
         json.dumps({"messages": msgs, "temperature": "hot"}).encode(), 400),
        ("max_tokens out of range", "/v1/chat/completions", json.dumps({"messages": msgs, "max_tokens": 10 ** 9}).encode(), 400),
        ("presence_penalty out of range", "/v1/chat/completions",
         json.dumps({"messages": msgs, "presence_penalty": 5}).encode(), 400),
        ("top_logprobs without logprobs", "/v1/chat/completions",
         json.dumps({"messages": msgs, "top_logprobs": 2}).encode(), 400),
        ("a response_format of an unknown type", "/v1/chat/completions",
         json.dumps({"messages": msgs, "response_format": {"type": "xml"}}).encode(), 400),
        ("prompt longer than the context", "/completion", json.dumps({"prompt": [1] * 5000}).encode(), 400),
        ("a token id outside the vocabulary", "/completion", json.dumps({"prompt": [5, 99999]}).encode(), 400),
        ("no messages", "/v1/chat/completions", json.dumps({"messages": []}).encode(), 400),
    ]
    for name, path, raw, code in bad:
        st, j = s.request("POST", path, raw=raw)
        check(f"bad input: {name} -> {code}", st == code and isinstance(j, dict) and "message" in j.get("error", {}),
              f"{st} {j}")
    # logit_bias on chat (serve_grammar_test.py: /completion's forms; json_object and grammar
    # are there too, on the demo model): the greedy first token banned by false is never
    # chosen, another boosted by 100 comes first
    lb = {"messages": msgs, "max_tokens": 1, "temperature": 0, "ignore_eos": True, "logprobs": True}

    def first_token(body):
        st, j = s.post("/v1/chat/completions", body)
        return j["choices"][0]["logprobs"]["content"][0]["bytes"] if st == 200 else f"{st} {j}"

    def token_bytes(t):
        return list(s.post("/detokenize", {"tokens": [t]})[1]["content"].encode())
    boost = next(t for t in toks if t != want[0])
    got = [first_token(lb), first_token({**lb, "logit_bias": {str(want[0]): False}}),
           first_token({**lb, "logit_bias": {str(boost): 100}})]
    check("logit_bias on chat: the greedy token banned (false) is not chosen, one boosted by 100 is",
          got[0] == token_bytes(want[0]) and isinstance(got[1], list) and got[1] != got[0] and
          got[2] == token_bytes(boost), f"{got} (greedy {want[0]}, boosted {boost})")
    # fields that would change the answer and are not done: refused by name (their neutral
    # values pass: logit_bias {}, typical_p 1, tool_choice "auto")
    refused = [
        ("typical_p", "/v1/chat/completions", {"messages": msgs, "typical_p": 0.5}),
        ("mirostat", "/completion", {"prompt": "x", "mirostat": 2}),
        ("echo", "/v1/completions", {"prompt": "x", "echo": True}),
        ("best_of", "/v1/completions", {"prompt": "x", "best_of": 3}),
        ("tool_choice", "/v1/chat/completions", {"messages": msgs, "tool_choice": "required"}),
        ("tool_choice", "/v1/messages", {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                                         "tool_choice": {"type": "any"}}),
    ]
    for name, path, body in refused:
        st, j = s.post(path, body)
        msg = j.get("error", {}).get("message", "") if isinstance(j, dict) else ""
        check(f"refused by name: {name} on {path} -> 400 naming it", st == 400 and f'"{name}"' in msg, f"{st} {j}")
    st, j = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1, "logit_bias": {}, "typical_p": 1,
                                            "tool_choice": "auto"})
    check("their neutral values pass", st == 200, f"{st} {j}")
    st, j = s.request("GET", "/no/such/path")
    check("unknown path -> 404", st == 404 and "error" in j, f"{st} {j}")
    st, j = s.request("GET", "/v1/chat/completions")
    check("wrong method -> 405", st == 405 and "error" in j, f"{st} {j}")
    st, j = s.request("POST", "/v1/chat/completions", raw=b'{"x": "' + b"a" * (17 << 20) + b'"}')
    check("body over --body-max -> 413", st == 413, f"{st}")
    st, j = s.request("GET", "/health")
    check("still serving after the bad input", st == 200)

    # a client that goes away mid-stream frees its slot
    sock = socket.create_connection(("127.0.0.1", s.port))
    body = json.dumps({"prompt": prompt_ids, "n_predict": 3000, "temperature": 0, "ignore_eos": True, "stream": True,
                       "id_slot": 1}).encode()
    sock.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                 str(len(body)).encode() + b"\r\n\r\n" + body)
    sock.recv(4096)
    sock.close()
    freed = False
    for _ in range(100):
        _, sl = s.request("GET", "/slots")
        if not sl[1]["is_processing"]:
            freed = True
            break
        time.sleep(0.05)
    check("a disconnect mid-stream frees the slot", freed, str(sl))

    st, m = s.request("GET", "/metrics")
    check("GET /metrics: Prometheus text with the cache counters", st == 200 and "hearth:cache_hits_total" in m and
          "hearth:prompt_tokens_total" in m, str(m)[:200])

    # slots: erase
    st, j = s.post("/slots/0?action=erase", {})
    _, sl = s.request("GET", "/slots")
    time.sleep(0.1)
    _, sl = s.request("GET", "/slots")
    check("POST /slots/0?action=erase empties the slot", st == 200 and sl[0]["n_tokens"] == 0, f"{j} {sl}")
    st, j = s.post("/slots/7?action=erase", {})
    check("erase of a slot that does not exist -> 400", st == 400, str(j))

    # fuzz: mutated request bodies (bytes flipped, cut, duplicated) are each answered (a 4xx, or
    # 200 where the mutation stayed valid) and the server lives on; under the sanitizers
    # (serve.sh's second run) any memory error in the request readers ends it here
    import random
    rnd = random.Random(7)
    seeds = [json.dumps({"messages": msgs, "max_tokens": 2, "temperature": 0, "stop": ["x"], "tools": [
                 {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}).encode(),
             json.dumps({"prompt": prompt_ids[:5], "n_predict": 2, "stream": False}).encode(),
             json.dumps({"model": "m", "max_tokens": 2, "system": "s", "messages": [
                 {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}).encode()]
    paths = ["/v1/chat/completions", "/completion", "/v1/messages"]
    codes = {}
    for it in range(150):
        k = it % 3
        b = bytearray(seeds[k])
        for _ in range(rnd.randint(1, 4)):
            op = rnd.randint(0, 2)
            i = rnd.randrange(len(b))
            if op == 0:
                b[i] = rnd.choice(b'{}[]",:0123456789aeflnrstu\\ \x00\xff')
            elif op == 1:
                del b[i:i + rnd.randint(1, 8)]
            else:
                b[i:i] = b[max(0, i - 8):i]
        st, _ = s.request("POST", paths[k], raw=bytes(b))
        codes[st] = codes.get(st, 0) + 1
    st, _ = s.request("GET", "/health")
    check("fuzz: 150 mutated bodies answered with 200 or 4xx, the server alive",
          st == 200 and all(c == 200 or 400 <= c < 500 for c in codes), str(codes))

    rc = s.stop()
    check("SIGTERM: the server exits 0", rc == 0, str(rc))

    # a slow client (slowloris) is cut off after --timeout and holds nothing
    slow = Server(model, "-np", "1", "--timeout", "2")
    so = socket.create_connection(("127.0.0.1", slow.port))
    so.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    st, _ = slow.request("GET", "/health")
    time.sleep(3.5)
    so.settimeout(2)
    try:
        closed = so.recv(100) == b""  # an orderly close; a timeout here means it is still held
    except ConnectionResetError:
        closed = True
    except socket.timeout:
        closed = False
    so.close()
    st2, _ = slow.request("GET", "/health")
    check("a client idle past --timeout is disconnected, others served meanwhile", st == 200 and closed and st2 == 200,
          f"{st} {closed} {st2}")
    slow.stop()

    # the shared cache: a conversation pushed out of its slot by another resumes from the
    # cache, on any slot, after a restart too (--cache-dir); bad files are refused and removed
    cdir = os.path.join(TMP, f"cache-{os.getpid()}")
    conv_a = [{"role": "system", "content": "You answer about hearths."}, {"role": "user", "content": "What is one?"}]
    conv_b = [{"role": "system", "content": "You answer about rivers, at length."}, {"role": "user", "content": "Name one."}]

    def chat(srv, msgs, n=8):
        st, j = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": n, "temperature": 0, "ignore_eos": True})
        assert st == 200, j
        return j

    c1 = Server(model, "-np", "1", "--cache-dir", cdir, "--metrics")
    r_a1 = chat(c1, conv_a)
    chat(c1, conv_b)  # the one slot now holds B: A's points went to the shared cache
    conv_a2 = conv_a + [{"role": "assistant", "content": r_a1["choices"][0]["message"]["content"],
                         "reasoning_content": r_a1["choices"][0]["message"].get("reasoning_content", "")},
                        {"role": "user", "content": "And its history?"}]
    r_a2 = chat(c1, conv_a2)
    check("shared cache: A's turn 2 resumes from the cache after B took the slot",
          "shared cache" in r_a2["timings"]["cache"] and r_a2["usage"]["prompt_tokens_details"]["cached_tokens"] > 0,
          r_a2["timings"]["cache"])
    m = wait_metrics(c1, lambda m: metric(m, "cache_disk_saves_total") >= 1)  # written by the writer thread
    check("shared cache: /metrics counts the hit and the file saved",
          metric(m, "cache_shared_hits_total") == 1 and metric(m, "cache_disk_saves_total") >= 1, m[-600:])
    chat(c1, conv_b)  # and A's turn-2 state goes to the cache and the disk in turn
    c1.stop()
    cold = Server(model, "-np", "1")
    want_a2 = chat(cold, conv_a2)
    cold.stop()
    check("shared cache: the resumed answer equals a cold server's",
          want_a2["choices"][0]["message"] == r_a2["choices"][0]["message"], f"{want_a2['choices'][0]} vs {r_a2['choices'][0]}")
    files = sorted(f for f in os.listdir(cdir) if f.endswith(".hcache"))
    check("--cache-dir holds the entries as files", len(files) >= 2, str(files))
    c2 = Server(model, "-np", "1", "--cache-dir", cdir, "--metrics")
    r = chat(c2, conv_a2)
    check("--cache-dir: after a restart A's turn 2 resumes from a file",
          "shared cache" in r["timings"]["cache"] and r["choices"][0]["message"] == want_a2["choices"][0]["message"],
          r["timings"]["cache"])
    c2.stop()
    # a corrupt file (one byte flipped), a truncated one, and one of another model
    n0 = int(files[0].split("-")[-1].split(".")[0])  # its rows: the KV data starts after the
    at = 72 + 12 * n0 + 8 + 10                      # header (72 bytes), ids and row hashes
    with open(os.path.join(cdir, files[0]), "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))
    with open(os.path.join(cdir, files[1]), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(cdir, files[1])) - 3)
    other = os.path.join(TMP, "serve-tiny-seed2.gguf")
    subprocess.run([HEARTH, "gen", "--preset", "tiny", "--quant", "q4_k_m", "--seed", "2", "-o", other], check=True,
                   capture_output=True)
    odir = os.path.join(TMP, f"cache-other-{os.getpid()}")
    o1 = Server(other, "-np", "1", "--cache-dir", odir)
    chat(o1, conv_a)
    chat(o1, conv_b)
    o1.stop()
    foreign = os.listdir(odir)  # A's and B's turns, written through
    for f in foreign:
        os.rename(os.path.join(odir, f), os.path.join(cdir, "other-" + f))
    n_before = len([f for f in os.listdir(cdir) if f.endswith(".hcache")])
    c3 = Server(model, "-np", "1", "--cache-dir", cdir, "--metrics")
    _, m = c3.request("GET", "/metrics")
    left = [f for f in os.listdir(cdir) if f.endswith(".hcache")]
    log = open(os.path.join(TMP, "serve.log")).read()
    check("--cache-dir: a corrupt, a truncated and a foreign file are refused and removed",
          files[0] not in left and files[1] not in left and not any(f.startswith("other-") for f in left) and
          metric(m, "cache_disk_refused_total") == 2 + len(foreign) and len(foreign) >= 1 and "checksum" in log and "another model" in log and "truncated" in log,
          f"{n_before} files before, {left} after; " + m[-300:])
    r = chat(c3, conv_a)
    check("--cache-dir: the server serves on after refusing them", r["usage"]["completion_tokens"] == 8)
    c3.stop()

    # the model file replaced while serving. Renamed over (the way to replace one): the server
    # serves on from the file it loaded, bit for bit, and says so once. Written in place (cp
    # over it: the same inode, truncated and rewritten): the mapped weights changed under it,
    # so every request and /health are 503 naming the file, nothing more goes to the cache,
    # no SIGBUS, SIGTERM exits 0; restarted on the new bytes, the old points are refused. (A
    # file cut short under a pass that reads it is a SIGBUS: exit 1 with a message, untested.)
    mdir = os.path.join(TMP, f"model-swap-{os.getpid()}")
    os.makedirs(mdir)
    mfile, mlog = os.path.join(mdir, "m.gguf"), os.path.join(TMP, f"serve-swap-{os.getpid()}.log")
    shutil.copyfile(model, mfile)
    sdir = os.path.join(mdir, "cache")
    ms = Server(mfile, "-np", "1", "--cache-dir", sdir, log=mlog)
    ask = {"prompt": "The hearth", "n_predict": 8, "temperature": 0}
    _, before = ms.post("/completion", ask)
    shutil.copyfile(other, mfile + ".new")
    os.rename(mfile + ".new", mfile)
    st, after = ms.post("/completion", ask)
    check("model file renamed over while serving: served on from the file loaded, the same answer, logged",
          st == 200 and after["content"] == before["content"] and "replaced or removed on disk" in open(mlog).read(),
          f"{st} {str(after)[:200]}")
    ms.stop()
    shutil.copyfile(model, mfile + ".new")
    os.rename(mfile + ".new", mfile)
    ms = Server(mfile, "-np", "1", "--cache-dir", sdir, log=mlog)
    r = chat(ms, conv_a)
    ino = os.stat(mfile).st_ino
    long_one = {}
    t = threading.Thread(target=lambda: long_one.update(
        r=ms.post("/completion", {"prompt": "The hearth", "n_predict": 3000, "ignore_eos": True, "temperature": 0})))
    t.start()
    time.sleep(0.5)  # under way: 3,000 tokens take the tiny model seconds
    # the files as the model is written: conv_a's slot went to the shared cache (and its answer's
    # end point to a file) when the long one took the slot
    files_before = sorted(os.listdir(sdir))
    with open(mfile, "r+b") as f:  # bytes in its middle rewritten, the size kept (no pass can fault)
        f.seek(os.path.getsize(mfile) // 2)
        f.write(b"\x55" * 4096)
    t.join()
    shutil.copyfile(other, mfile)  # and cp over it (truncated, rewritten) while no pass runs
    st0, j0 = long_one["r"]
    st, j = ms.post("/v1/chat/completions", {"messages": conv_a2, "max_tokens": 8, "temperature": 0})
    st_h, h = ms.request("GET", "/health")
    with open(mfile, "r+b") as f:  # and cut short: a pass would read past its end (SIGBUS)
        f.truncate(os.path.getsize(mfile) // 2)
    st2, j2 = ms.post("/completion", ask)
    check("model file written in place while serving: the request under way, the next ones and /health 503 "
          "naming it, nothing cached, alive",
          os.stat(mfile).st_ino == ino and st0 == 503 and "written in place" in j0["error"]["message"] and st == 503 and "written in place" in j["error"]["message"] and
          mfile in j["error"]["message"] and st_h == 503 and "written in place" in h["error"]["message"] and
          st2 == 503 and ms.p.poll() is None and sorted(os.listdir(sdir)) == files_before,
          f"under way {st0} {str(j0)[:200]}; {st} {str(j)[:300]} /health {st_h} then {st2}; files {files_before} -> {sorted(os.listdir(sdir))}")
    rc = ms.stop()
    check("model file written in place: SIGTERM exits 0", rc == 0, str(rc))
    shutil.copyfile(other, mfile)
    ms = Server(mfile, "-np", "1", "--cache-dir", sdir, "--metrics", log=mlog)
    _, m = ms.request("GET", "/metrics")
    r = chat(ms, conv_a)
    check("model file written in place: restarted on the new bytes, the old model's points are refused",
          metric(m, "cache_disk_refused_total") == len(files_before) and len(files_before) >= 1 and
          "another model" in open(mlog).read() and r["usage"]["completion_tokens"] == 8,
          m[-300:])
    ms.stop()

    # --cache-dir faults: a folder that cannot be one is refused at start by name; a full one
    # (a file size limit: writes fail as on a full disk) is logged and skipped, the entry kept
    # in RAM, no partial file left; a write a crash cut short (.tmp) is removed at start
    for name, bad_dir in (("a file", os.path.join(TMP, "serve-tiny.gguf")),
                          ("in a missing folder", os.path.join(TMP, "no", "such", "dir"))):
        p = subprocess.Popen([HEARTH, "serve", "-m", model, "--port", "0", "--cache-dir", bad_dir],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            err = p.communicate(timeout=30)[1]
        except subprocess.TimeoutExpired:  # it serves: the folder was taken
            p.kill()
            err = p.communicate()[1]
        check(f"--cache-dir {name}: exit 1 naming it", p.returncode == 1 and f"--cache-dir {bad_dir}:" in err,
              f"{p.returncode} {err.strip()[-300:]}")
    fdir = os.path.join(TMP, f"cache-full-{os.getpid()}")
    os.makedirs(fdir)
    stale = os.path.join(fdir, "0123-7.hcache.tmp.Ab12Cd")  # a writer that died 2 h ago
    open(stale, "wb").write(b"\0" * 100)
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    fresh = "0123-7.hcache.tmp.Ef34Gh"  # another replica's write under way: left alone
    open(os.path.join(fdir, fresh), "wb").write(b"\0" * 100)
    flog = os.path.join(TMP, f"serve-full-{os.getpid()}.log")

    def small_files():  # 64 KiB a file: every entry's write fails (EFBIG), as on a full disk
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))
    full = Server(model, "-np", "1", "--cache-dir", fdir, "--metrics", log=flog, preexec=small_files)
    chat(full, conv_a)
    chat(full, conv_b)  # A's state goes to the shared cache: its file cannot be written
    r = chat(full, conv_a2)
    m = wait_metrics(full, lambda m: metric(m, "cache_disk_write_failures_total") >= 1)
    log = open(flog).read()
    check("--cache-dir full: the write fails, logged, the server lives on", full.p.poll() is None and
          "failed: File too large (the entry stays in RAM only)" in log and metric(m, "cache_disk_saves_total") == 0, log[-400:])
    check("--cache-dir full: A's turn 2 resumes from the entry in RAM and answers as a cold server",
          "shared cache" in r["timings"]["cache"] and r["choices"][0]["message"] == want_a2["choices"][0]["message"],
          r["timings"]["cache"])
    rc = full.stop()
    check("--cache-dir full: SIGTERM exits 0", rc == 0, str(rc))
    # the same, with A's written-through points still pending when B takes the slot (the
    # writer held back 500 ms; B comes within --answer-point-wait, so no closing pass adds a
    # point to A's): the cache keeps A's entry in RAM on the file's promise, and when the
    # write fails it stays (it was let go once: A's turn 2 then started at row 0)
    fdir2 = os.path.join(TMP, f"cache-full2-{os.getpid()}")
    os.makedirs(fdir2)
    full = Server(model, "-np", "1", "--cache-dir", fdir2, "--metrics", "--answer-point-wait", "5000",
                  env={"HEARTH_TEST_WRITE_DELAY_MS": "500"}, preexec=small_files)
    chat(full, conv_a)
    chat(full, conv_b)
    r = chat(full, conv_a2)
    m = wait_metrics(full, lambda m: metric(m, "cache_disk_write_failures_total") >= 2)
    check("--cache-dir full, the write pending when the entry is put: A's turn 2 resumes from it in RAM, as a cold server",
          "shared cache" in r["timings"]["cache"] and r["choices"][0]["message"] == want_a2["choices"][0]["message"] and
          metric(m, "answer_points_skipped_total") >= 1, r["timings"]["cache"])
    full.stop()
    # listed once the writer is done (SIGTERM writes what waits): while it runs, a write
    # under way has a .tmp of its own
    left = os.listdir(fdir)
    check("--cache-dir full: no file and no partial file left, the stale .tmp removed at start, the fresh one kept",
          left == [fresh] and "an unfinished write) removed" in open(flog).read(), str(left))
    cache_disk(model, chat)
    llama_flags(model, chat)

    # /slots save and restore keep the points: a saved conversation resumes after a restart
    sdir = os.path.join(TMP, f"slots-{os.getpid()}")
    v1 = Server(model, "-np", "1", "--cache-dir", sdir)
    chat(v1, conv_a)
    st, j = v1.post("/slots/0?action=save", {"filename": "conv-a.bin"})
    check("/slots save writes the slot's points to a file", st == 200 and j["n_saved"] > 0 and
          os.path.exists(os.path.join(sdir, "conv-a.bin")), str(j))
    for name, body in (("a path", {"filename": "../x"}), ("a hidden name", {"filename": ".x"}), ("no name", {})):
        st, j = v1.post("/slots/0?action=save", body)
        check(f"/slots save refuses {name}", st == 400 and "filename" in j["error"]["message"], str(j))
    st, j = v1.post("/slots/0?action=restore", {"filename": "no-such.bin"})
    check("/slots restore of a missing file -> 400", st == 400, str(j))
    v1.stop()
    v2 = Server(model, "-np", "1", "--cache-dir", sdir)
    chat(v2, conv_b)
    st, j = v2.post("/slots/0?action=restore", {"filename": "conv-a.bin"})
    check("/slots restore reads it back", st == 200 and j["n_restored"] > 0, str(j))
    r = chat(v2, conv_a2)
    check("after a restart and a restore, A's turn 2 resumes from it and answers as a cold server",
          "shared cache" in r["timings"]["cache"] and r["choices"][0]["message"] == want_a2["choices"][0]["message"],
          r["timings"]["cache"])
    v2.stop()
    nod = Server(model, "-np", "1")
    st, j = nod.post("/slots/0?action=save", {"filename": "x.bin"})
    check("/slots save without --cache-dir -> 400 naming it", st == 400 and "--cache-dir" in j["error"]["message"], str(j))
    nod.stop()

    # a small --cache-ram: entries are evicted, the budget holds, answers stay right
    small = Server(model, "-np", "1", "--cache-ram", "3", "--metrics")
    for k in range(6):
        chat(small, [{"role": "system", "content": f"Conversation {k}."}, {"role": "user", "content": "Go on."}])
    _, m = small.request("GET", "/metrics")
    used = metric(m, "cache_bytes")
    ev = metric(m, "cache_entry_evictions_total") + metric(m, "cache_evictions_total")
    check("--cache-ram 3: evictions happen and the bytes stay under 3 MiB", ev > 0 and used <= 3 * 2 ** 20, f"{ev} {used}")
    r = chat(small, conv_a)
    check("--cache-ram 3: still serving", r["usage"]["completion_tokens"] == 8)
    r = chat(small, [{"role": "system", "content": "Conversation 0."}, {"role": "user", "content": "Go on."},
                     {"role": "assistant", "content": "x"}, {"role": "user", "content": "More."}])
    check("--cache-ram 3: a miss says its entry was evicted", r["timings"]["cache"].startswith("evicted"),
          r["timings"]["cache"])
    small.stop()

    # the API key, and the queue's bound
    k = Server(model, "--api-key", "sekrit", "--queue", "1")
    st, j = k.request("GET", "/v1/models")
    check("no key -> 401", st == 401, f"{st} {j}")
    st, j = k.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
    check("a wrong key -> 401", st == 401, f"{st} {j}")
    st, j = k.request("GET", "/v1/models", headers={"Authorization": "Bearer sekrit"})
    check("the key -> 200", st == 200, f"{st}")
    st, j = k.request("GET", "/health")
    check("/health needs no key", st == 200)
    hdr = {"Authorization": "Bearer sekrit", "Content-Type": "application/json"}
    outs = []

    def long_one():
        outs.append(k.request("POST", "/completion", {"prompt": prompt_ids, "n_predict": 2500, "temperature": 0,
                                                      "ignore_eos": True}, headers=hdr)[0])
    th = [threading.Thread(target=long_one) for _ in range(3)]
    for t in th:  # each answer runs ~2 s on tiny: the second waits, the third finds the queue full
        t.start()
        time.sleep(0.3)
    [t.join() for t in th]
    check("one slot, a queue of 1: the third request gets 503", sorted(outs) == [200, 200, 503], str(outs))
    k.stop()
    answer_end_points()
    completion_exact()
    template_kwargs(model)
    billing_header(model)
    tool_calls(model)
    cut_calls(model)
    sigterm_under_load(model)
    slow_readers(model)
    spare_points(model)
    return 1 if checks.summary() else 0


DEMO = os.environ.get("HEARTH_DEMO", "demo/hearth-demo-q8_0.gguf")


def answer_end_points():
    """A point at the end of every answer (F13 item 1), on the demo model (its template
    renders an answer in the history as the server generated it, as scripts/demo.sh shows):
    turn 2 resumes where its new message begins, past turn 1's answer, and its greedy answer
    and log-probabilities (every bit of the last logits row shows in them) equal a cold
    server's (with --answer-point-wait 0: the closing pass starts as the answer ends, and the
    next turn waits for it). With a long --answer-point-wait each next turn comes first, takes
    the slot and prefills the answer itself from its message's start: the same bits, the
    closings counted skipped. tests/gates/mutants runs this part alone (argument answer_end)
    against the scheduler built with close_decode (the decoded rows' state kept instead of the
    prefill), close_no_yield (a turn waits for the closing) and close_no_hold (a closing starts
    while the next turn is being rendered): red."""
    if not os.path.exists(DEMO):
        check(f"the demo model {DEMO} is there (answer-end points)", False)
        return

    def ask(srv, msgs, stream=False):
        body = {"messages": msgs, "max_tokens": 48, "temperature": 0, "logprobs": True, "top_logprobs": 2}
        if stream:
            st, _, ev = srv.stream("/v1/chat/completions", {**body, "stream": True,
                                                             "stream_options": {"include_usage": True}})
            text = "".join(e["choices"][0]["delta"].get("content") or "" for e in ev
                           if isinstance(e, dict) and e["choices"])
            lp = [t for e in ev if isinstance(e, dict) for c in e["choices"] if c.get("logprobs")
                  for t in c["logprobs"]["content"]]
            usage = [e["usage"] for e in ev if isinstance(e, dict) and e.get("usage")]
            return {"content": text, "logprobs": lp, "usage": usage[0] if usage else {}}
        st, j = srv.post("/v1/chat/completions", body)
        assert st == 200, j
        return {"content": j["choices"][0]["message"]["content"], "logprobs": j["choices"][0]["logprobs"]["content"],
                "usage": j["usage"], "cache": j["timings"]["cache"]}

    def new_message_at(srv, msgs):
        """where the last message of msgs (a user's) begins in the prompt: the rows a turn can resume past"""
        _, t = srv.post("/apply-template", {"messages": msgs})
        _, ids = srv.post("/tokenize", {"content": t["prompt"]})
        _, im = srv.post("/tokenize", {"content": "<|im_start|>"})
        return [i for i, x in enumerate(ids["tokens"]) if x == im["tokens"][0]][-2]  # the last: the generation prompt

    questions = ["What does John 3:16 say?", "And the verse after it?", "Tell me a fortune."]

    def converse(srv, settle=False):
        """settle: before each next turn, wait until the answer's closing pass is made (else
        the turn, sent at once, may take the slot first on a loaded box: closes_yield)"""
        convo = [{"role": "user", "content": "Who are you?"}]
        got = [ask(srv, convo)]
        wants = []
        for k, q in enumerate(questions):
            if settle:
                wait_metrics(srv, lambda m: metric(m, "answer_points_total") >= k + 1, limit=5)
            convo = convo + [{"role": "assistant", "content": got[-1]["content"]}, {"role": "user", "content": q}]
            got.append(ask(srv, convo, stream=k == 1))  # turn 3's answer arrives as a stream
            wants.append(new_message_at(srv, convo))
        return got, wants

    # --answer-point-wait 0: the closing pass starts as the answer ends, and the next turn,
    # sent once it is made, resumes past the answer (sent at once, it would race the engine
    # thread to the slot: on a loaded box the turn may come first and take it over)
    warm = Server(DEMO, "-np", "2", "--answer-point-wait", "0", "--metrics")
    got, wants = converse(warm, settle=True)
    for k in range(len(questions)):
        cached = got[k + 1]["usage"]["prompt_tokens_details"]["cached_tokens"]
        check(f"answer-end point: turn {k + 2} resumes past turn {k + 1}'s answer, where its new message begins",
              cached == wants[k] and cached > got[k]["usage"]["prompt_tokens"],
              f"{cached} cached of {got[k + 1]['usage']['prompt_tokens']} ({got[k + 1].get('cache')}); the new message at {wants[k]}")
    print(f"     turns 2-4: {[g['usage']['prompt_tokens_details']['cached_tokens'] for g in got[1:]]} cached of "
          f"{[g['usage']['prompt_tokens'] for g in got[1:]]} prompt tokens")
    _, m = warm.request("GET", "/metrics")
    check("answer-end point: every answer prefilled again (answer_points_total), none skipped",
          metric(m, "answer_points_total") >= 4 and metric(m, "answer_points_skipped_total") == 0,
          f"{metric(m, 'answer_points_total'):.0f} made, {metric(m, 'answer_points_skipped_total'):.0f} skipped")
    warm.stop()
    # --answer-point-wait 2000: each next turn comes within the wait, takes the slot and
    # prefills the answer in its own pass from the point at the answer's message start (no
    # closing pass to wait for), with the same bits
    quick = Server(DEMO, "-np", "2", "--answer-point-wait", "2000", "--metrics")
    got_q, _ = converse(quick)
    _, m = quick.request("GET", "/metrics")
    cq = [g["usage"]["prompt_tokens_details"]["cached_tokens"] for g in got_q[1:]]
    check("answer-end point skipped: a turn within --answer-point-wait resumes at the answer's message start, "
          "the closings counted skipped, none made",
          all(0 < c < w for c, w in zip(cq, wants)) and metric(m, "answer_points_skipped_total") == len(questions) and
          metric(m, "answer_points_total") == 0,
          f"cached {cq} (the new messages at {wants}); {metric(m, 'answer_points_skipped_total'):.0f} skipped, "
          f"{metric(m, 'answer_points_total'):.0f} made")
    check("answer-end point skipped: the turns' greedy answers and log-probabilities equal the closed server's",
          all(a["content"] == b["content"] and a["logprobs"] == b["logprobs"] for a, b in zip(got_q, got)))
    quick.stop()
    # --answer-point-wait 100 and every chat prompt's rendering 400 ms slower (the test seam
    # HEARTH_TEST_RENDER_DELAY_MS; a 40k-token prompt's takes tens of ms): each next turn, sent
    # at once, is still being rendered when its slot's closing pass comes due. The prompt on its
    # way holds the closing (sched_hold_begin), so the turn takes the slot as in the quick run:
    # every closing skipped but the last answer's (no turn follows it: made once it is due).
    # Red under close_no_hold (the closing starts while the turn renders, and the turn waits).
    held = Server(DEMO, "-np", "2", "--answer-point-wait", "100", "--metrics", env={"HEARTH_TEST_RENDER_DELAY_MS": "400"})
    convo, got_h = [{"role": "user", "content": "Who are you?"}], []
    got_h.append(ask(held, convo))
    for q in questions:
        convo = convo + [{"role": "assistant", "content": got_h[-1]["content"]}, {"role": "user", "content": q}]
        got_h.append(ask(held, convo))
    time.sleep(0.5)  # the last answer's closing: due after 100 ms, no prompt on its way
    _, m = held.request("GET", "/metrics")
    check("answer-end point held: a next turn still being rendered when the closing comes due takes the slot, "
          "every closing skipped but the last answer's",
          metric(m, "answer_points_skipped_total") == len(questions) and metric(m, "answer_points_total") == 1,
          f"{metric(m, 'answer_points_skipped_total'):.0f} skipped, {metric(m, 'answer_points_total'):.0f} made")
    check("answer-end point held: the turns' greedy answers and log-probabilities equal the closed server's",
          all(a["content"] == b["content"] and a["logprobs"] == b["logprobs"] for a, b in zip(got_h, got)))
    held.stop()
    convo = [{"role": "user", "content": "Who are you?"}]
    same = True
    for k, q in enumerate(questions):  # each turn on a server of its own
        convo = convo + [{"role": "assistant", "content": got[k]["content"]}, {"role": "user", "content": q}]
        cold = Server(DEMO, "-np", "1")
        c = ask(cold, convo)
        cold.stop()
        ok = c["content"] == got[k + 1]["content"] and c["logprobs"] == got[k + 1]["logprobs"] and \
            c["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        same = same and ok
        if not ok:
            print(f"    turn {k + 2}: cold {c['content']!r} vs warm {got[k + 1]['content']!r}"
                  f"{'' if c['content'] != got[k + 1]['content'] else ' (the same text, other log-probabilities)'}",
                  file=sys.stderr)
    check("answer-end point: every warm turn's greedy answer and log-probabilities equal a cold server's", same)


def completion_exact():
    """/completion warm equals cold (F14 item 11), on the demo model: a prompt resumes only
    where a cold pass of it has a chunk boundary (the delta rule's chunks laid from row 0 and
    restarted at each <|im_start|>, as a chat's at its message starts), so each warm answer's
    text and log-probabilities (every bit of a logits row shows in them) are a cold pass's.
    Prompts that extend the last one and its answer (resumed a whole number of chunks past
    the start or an <|im_start|>), a chat's rendering (resumed at a message start), and chat
    and /completion on one slot, each resuming from the other's points."""
    if not os.path.exists(DEMO):
        check(f"the demo model {DEMO} is there (/completion exact)", False)
        return
    warm, cold = Server(DEMO, "-np", "1"), Server(DEMO, "-np", "1")

    def done(srv, prompt, **kw):
        body = {"prompt": prompt, "n_predict": 24, "temperature": 0, "n_probs": 2, **kw}
        st, j = srv.post("/completion", body)
        assert st == 200, j
        return j

    def same(a, b):
        return a["content"] == b["content"] and a["completion_probabilities"] == b["completion_probabilities"]

    _, im = warm.post("/tokenize", {"content": "<|im_start|>"})
    im = im["tokens"][0]
    text = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
            "darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God "
            "said, Let there be light: and there was light. And God saw the light, that it was good: and God divided "
            "the light from the darkness.")
    msgs = [{"role": "user", "content": "Who are you?"}]
    chat_text = warm.post("/apply-template", {"messages": msgs})[1]["prompt"]
    prompts, got = [text], []
    for k in range(5):
        if k == 3:  # a chat's rendering, then its next turn's: resumed at a message start
            prompts.append(chat_text)
        elif k == 4:
            prompts.append(warm.post("/apply-template", {"messages": msgs + [
                {"role": "assistant", "content": got[-1]["content"]}, {"role": "user", "content": "And then?"}]})[1]["prompt"])
        elif k:
            prompts.append(prompts[-1] + got[-1]["content"] + " And")
        w = done(warm, prompts[-1], return_tokens=True)
        c = done(cold, prompts[-1], cache_prompt=False)
        got.append(w)
        _, ids = warm.post("/tokenize", {"content": prompts[-1]})
        ids = ids["tokens"]
        n = w["tokens_cached"]
        anchor = max([0] + [i for i in range(1, min(n, len(ids) - 1) + 1) if ids[i] == im])  # the last at or before n
        check(f"/completion {k + 1}: warm resumes on the grid (row {n} of {len(ids)}) and equals cold, text and "
              f"log-probabilities", (k in (0, 3) or n > 0) and (n - anchor) % 64 == 0 and same(w, c) and  # chunk 64
              c["tokens_cached"] == 0, f"{w['timings']['cache']}: {w['content']!r} vs {c['content']!r}"
              f"{' (the same text, other log-probabilities)' if w['content'] == c['content'] else ''}")
    # chat after /completion, /completion after chat, on one slot: each resumes from the
    # other's point and answers as a cold server
    chat = {"messages": msgs + [{"role": "assistant", "content": got[3]["content"]},
                                {"role": "user", "content": "And then?"}, ], "max_tokens": 24, "temperature": 0,
            "logprobs": True, "top_logprobs": 2}
    _, wj = warm.post("/v1/chat/completions", chat)
    _, cj = cold.post("/v1/chat/completions", {**chat, "cache_prompt": False})
    check("chat after /completion of its prompt: resumed from its point, equal to cold",
          wj["usage"]["prompt_tokens_details"]["cached_tokens"] > 0 and
          wj["choices"][0]["message"] == cj["choices"][0]["message"] and
          wj["choices"][0]["logprobs"] == cj["choices"][0]["logprobs"], f"{wj['timings']['cache']}")
    follow = warm.post("/apply-template", {"messages": chat["messages"] + [
        {"role": "assistant", "content": wj["choices"][0]["message"]["content"]}, {"role": "user", "content": "Why?"}]})[1]
    w, c = done(warm, follow["prompt"]), done(cold, follow["prompt"], cache_prompt=False)
    check("/completion after a chat: resumed from the chat's point, equal to cold",
          w["tokens_cached"] > 0 and same(w, c), f"{w['timings']['cache']}")
    warm.stop()
    cold.stop()


def template_kwargs(model):
    """--chat-template-kwargs (llama-server's): template variables for every request, under a
    request's own chat_template_kwargs; bad JSON is refused naming the flag."""
    tmpl = os.path.join(TMP, "kwargs.jinja")
    with open(tmpl, "w") as f:
        f.write("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
                "{%- if add_generation_prompt %}<|im_start|>assistant\n[{{ tag | default('none') }}]"
                "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
                "{%- endif %}{%- endif %}")
    for bad, why in (("{bad", "not valid JSON"), ("[1, 2]", "JSON object"), ('{"enable_thinking": "no"}', "true or false")):
        r = subprocess.run([HEARTH, "serve", "-m", model, "--chat-template-kwargs", bad], capture_output=True, text=True)
        check(f"--chat-template-kwargs {bad}: exit 2 naming the flag", r.returncode == 2 and
              "--chat-template-kwargs" in r.stderr and why in r.stderr, r.stderr.strip()[:300])
    s = Server(model, "-np", "1", "--chat-template-file", tmpl, "--chat-template-kwargs",
               '{"tag": "server", "enable_thinking": false}')
    msgs = [{"role": "user", "content": "Hi"}]
    _, j = s.post("/apply-template", {"messages": msgs})
    check("--chat-template-kwargs: the server's variables reach the template",
          j.get("prompt", "").endswith("[server]<think>\n\n</think>\n\n"), repr(j))
    _, j = s.post("/apply-template", {"messages": msgs, "chat_template_kwargs": {"tag": "request"}})
    check("--chat-template-kwargs: a request's own variable wins, the others stay",
          j.get("prompt", "").endswith("[request]<think>\n\n</think>\n\n"), repr(j))
    _, j = s.post("/apply-template", {"messages": msgs, "chat_template_kwargs": {"enable_thinking": True}})
    check("--chat-template-kwargs: a request's enable_thinking wins", j.get("prompt", "").endswith("[server]"), repr(j))
    st, j = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "chat_template_kwargs": {"enable_thinking": 1}})
    check("a request's bad enable_thinking -> 400 naming it", st == 400 and "enable_thinking" in j["error"]["message"], str(j))
    s.stop()


def billing_header(model):
    """Claude Code's x-anthropic-billing-header line (a per-request cch= hash) in the first
    system block of /v1/messages is dropped from the prompt, logged once: two requests that
    differ only in it hit the cache from token 0. --keep-billing-header keeps it (a miss)."""
    def body(cch, system_as_string=False):
        line = f"x-anthropic-billing-header: cc_version=2.1.37.3a3; cc_entrypoint=cli; cch={cch};"
        rest = "You are an agent for software engineering. Answer briefly."
        system = (line + "\n" + rest) if system_as_string else [{"type": "text", "text": line},
                                                                   {"type": "text", "text": rest}]
        return {"model": "m", "max_tokens": 4, "temperature": 0, "system": system,
                "messages": [{"role": "user", "content": "List the files."}]}
    log = os.path.join(TMP, f"serve-billing-{os.getpid()}.log")
    s = Server(model, "-np", "1", log=log)
    st1, j1 = s.post("/v1/messages", body("0a1b2"))
    st2, j2 = s.post("/v1/messages", body("9f8e7"))
    st3, j3 = s.post("/v1/messages", body("55555", system_as_string=True))
    _, n1 = s.post("/v1/messages/count_tokens", body("0a1b2"))
    _, n2 = s.post("/v1/messages/count_tokens", body("77777"))
    _, plain = s.post("/v1/messages/count_tokens", {**body("x"), "system": [{"type": "text", "text":
                      "You are an agent for software engineering. Answer briefly."}]})
    s.stop()
    u1, u2, u3 = (j.get("usage", {}) if isinstance(j, dict) else {} for j in (j1, j2, j3))
    prompt = u2.get("input_tokens", 0) + u2.get("cache_read_input_tokens", 0)
    check("billing line dropped: a second request differing only in cch= hits the cache from token 0",
          st1 == st2 == 200 and u1.get("cache_read_input_tokens") == 0 and u2.get("cache_read_input_tokens", 0) > 0 and
          u2["cache_read_input_tokens"] >= prompt - 8, f"{u1} then {u2}")
    check("billing line dropped from a string system prompt too (the same prompt, cached)",
          st3 == 200 and u3.get("cache_read_input_tokens") == u2.get("cache_read_input_tokens"), f"{u3}")
    check("count_tokens: the billing line is not counted",
          n1.get("input_tokens") == n2.get("input_tokens") == plain.get("input_tokens"), f"{n1} {n2} {plain}")
    said = open(log).read().count("x-anthropic-billing-header")
    check("the dropped billing line is logged once", said == 1, f"{said} lines")
    k = Server(model, "-np", "1", "--keep-billing-header")
    k.post("/v1/messages", body("0a1b2"))
    st, j = k.post("/v1/messages", body("9f8e7"))
    _, n3 = k.post("/v1/messages/count_tokens", body("0a1b2"))
    k.stop()
    check("--keep-billing-header: the line stays (the prompt differs at the hash: no cache hit, counted)",
          st == 200 and j["usage"]["cache_read_input_tokens"] == 0 and n3["input_tokens"] > n1["input_tokens"],
          f"{j.get('usage')} {n3}")


def spare_points(model):
    """F11: no point buffer allocated on a pass's path. The server makes spare point buffers
    at start and tops them up while idle (engine_point_reserve); here 4 a slot
    (HEARTH_SPARES), so two chats of 6 turns each on two slots, which take more points than
    the start made, take every one from a spare: /metrics' point_allocs_total stays 0, and
    the spares count in --cache-ram. Between turns the client waits for the spares to be
    back (the idle time a user's reading gives a server). tests/gates/mutants runs this part
    alone (argument spares) against the scheduler built with spare_topup_skip (no spares
    made ahead): red; and against spare_busy (spares made beside the passes) for the part
    after."""
    s = Server(model, "-np", "2", "--metrics", env={"HEARTH_SPARES": "4"})
    want = 4 * 2

    def spares_back():
        return wait_metrics(s, lambda m: metric(m, "cache_spare_points") >= want, limit=3)
    m = spares_back()
    check("spare points: made at start, none allocated yet", metric(m, "cache_spare_points") >= want and
          metric(m, "point_allocs_total") == 0, f"{metric(m, 'cache_spare_points')} spares, "
          f"{metric(m, 'point_allocs_total')} allocated")
    convos = [[{"role": "system", "content": f"You are agent {k}. Use tools."}, {"role": "user", "content": "Start."}]
              for k in range(2)]
    for turn in range(6):
        for c in convos:
            st, j = s.post("/v1/chat/completions", {"messages": c, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
            assert st == 200, j
            c += [{"role": "assistant", "content": j["choices"][0]["message"]["content"]},
                  {"role": "user", "content": f"Tool output {turn}: ok."}]
        m = spares_back()
    taken, allocs = metric(m, "cache_points_saved_total"), metric(m, "point_allocs_total")
    held = metric(m, "cache_bytes") + metric(m, "cache_spare_bytes")
    check("spare points: 12 turns of two chats take more points than the start made, none allocated on a pass's path",
          taken > want and allocs == 0, f"{taken:.0f} points taken, {allocs:.0f} allocated on the path, "
          f"{metric(m, 'point_reserved_total'):.0f} made ahead")
    check("spare points: held and spare bytes stay under --cache-ram", held <= 2 ** 30, f"{held:.0f}")
    s.stop()
    spares_idle_only(model)
    # HEARTH_SPARES (a bench's and a test's seam: spares kept a slot): 9 made at start on one
    # slot; a value out of 1..1024 (or not a number) keeps the default 64
    for val, n in (("9", 9), ("0", 64), ("x", 64), ("5000", 64)):
        s = Server(model, "-np", "1", "--metrics", env={"HEARTH_SPARES": val})
        m = wait_metrics(s, lambda m: metric(m, "cache_spare_points") >= n, limit=3)
        check(f"HEARTH_SPARES={val}: {n} spares made at start", metric(m, "cache_spare_points") == n,
              f"{metric(m, 'cache_spare_points'):.0f}")
        s.stop()


def spares_idle_only(model):
    """F11 item 2: spares are made only while the server is idle, never beside a request's
    pass or steps (on CUDA a point buffer is ~63 MB of pinned memory at q36, and pinning it
    stalled the engine's calls and the request's preparation 30-90 ms a turn). A chat of
    two messages takes points from the 4 spares of one slot, then decodes 800 tokens
    (~0.5-1 s on tiny): while it runs, no spare is made (point_reserved_total stays as it
    was once its points were taken); once it has ended and the server has been idle a
    while, the spares are back. Red under the mutant spare_busy (made as soon as short)."""
    s = Server(model, "-np", "1", "--metrics", env={"HEARTH_SPARES": "4"})
    m = wait_metrics(s, lambda m: metric(m, "cache_spare_points") >= 4, limit=3)
    r0 = metric(m, "point_reserved_total")
    body = {"messages": [{"role": "system", "content": "You are a careful agent."},
                         {"role": "user", "content": "List the files, then read each one and say what it does."}],
            "max_tokens": 800, "temperature": 0, "ignore_eos": True}
    out = []
    th = threading.Thread(target=lambda: out.append(s.post("/v1/chat/completions", body)[0]))
    th.start()
    seen = []
    while th.is_alive():
        _, m = s.request("GET", "/metrics")
        if metric(m, "requests_processing") >= 1:
            seen.append(metric(m, "point_reserved_total"))
        time.sleep(0.02)
    th.join()
    check("spare points: the request seen while it ran", out == [200] and len(seen) >= 5, f"{out}, {len(seen)} samples")
    check("spare points: none made while the request ran (only while idle)", set(seen) == {r0},
          f"point_reserved_total {sorted(set(seen))} during the request, {r0:.0f} made at start")
    # the answer's closing pass first (the answer prefilled again from its message's start:
    # seconds under the sanitizers), then the idle time the spares wait for
    wait_metrics(s, lambda m: metric(m, "answer_points_total") >= 1, limit=60)
    m = wait_metrics(s, lambda m: metric(m, "cache_spare_points") >= 4, limit=3)
    check("spare points: made again once the server is idle", metric(m, "cache_spare_points") >= 4 and
          metric(m, "point_reserved_total") > r0 and metric(m, "point_allocs_total") == 0,
          f"{metric(m, 'cache_spare_points'):.0f} spares, {metric(m, 'point_reserved_total'):.0f} made, "
          f"{metric(m, 'point_allocs_total'):.0f} allocated on the path")
    s.stop()


def wait_metrics(srv, cond, limit=10):
    """/metrics once cond holds on it (the cache's writer thread writes after the answer), or
    after limit seconds"""
    t0 = time.monotonic()
    while True:
        _, m = srv.request("GET", "/metrics")
        if cond(m) or time.monotonic() - t0 > limit:
            return m
        time.sleep(0.05)


def cache_disk(model, chat):
    """--cache-disk: the folder's files stay under the bound through many conversations, the
    least recently used removed first; a write is never waited for (the writer's planted sleep,
    HEARTH_TEST_WRITE_DELAY_MS, slows no turn); SIGTERM writes what is pending, then exits 0"""
    ddir = os.path.join(TMP, f"cache-disk-{os.getpid()}")
    for bad in ("0", "-2", "x"):
        r = subprocess.run([HEARTH, "serve", "-m", model, "--cache-dir", ddir, "--cache-disk", bad],
                           capture_output=True, text=True)
        check(f"--cache-disk {bad}: exit 2 naming it", r.returncode == 2 and "--cache-disk" in r.stderr, r.stderr.strip())

    def conv(k):
        return [{"role": "system", "content": f"Conversation {k} about the hearth."}, {"role": "user", "content": "Go on."}]

    d = Server(model, "-np", "1", "--cache-dir", ddir, "--cache-disk", "8", "--metrics")
    bound, over = 8 << 20, []
    for k in range(10):
        chat(d, conv(k))
        m = wait_metrics(d, lambda m: metric(m, "cache_disk_saves_total") >= 1 + k)
        size = sum(os.path.getsize(os.path.join(ddir, f)) for f in os.listdir(ddir) if f.endswith(".hcache"))
        if size > bound:
            over.append((k, size))
    _, m = d.request("GET", "/metrics")
    check("--cache-disk 8: the folder stays under 8 MiB through 10 conversations (files of ~2.4 MiB), the oldest removed",
          not over and metric(m, "cache_disk_evictions_total") >= 5 and metric(m, "cache_disk_max_bytes") == bound and
          metric(m, "cache_disk_write_failures_total") == 0 and metric(m, "cache_disk_refused_total") == 0,
          f"over the bound: {over}; " + " ".join(ln for ln in m.split("\n") if "cache_disk" in ln and not ln.startswith("#")))
    r = chat(d, conv(9) + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "More."}])
    check("--cache-disk 8: the latest conversation still resumes", r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0,
          r["timings"]["cache"])
    d.stop()
    # the writer sleeps 2 s before each file: a turn does not wait for it
    slow_dir = os.path.join(TMP, f"cache-slow-{os.getpid()}")
    fast = Server(model, "-np", "1", "--cache-dir", slow_dir + "-fast")
    chat(fast, conv(20))
    t0 = time.monotonic()
    chat(fast, conv(21))
    t_fast = time.monotonic() - t0
    fast.stop()
    slow = Server(model, "-np", "1", "--cache-dir", slow_dir, "--metrics", env={"HEARTH_TEST_WRITE_DELAY_MS": "2000"})
    times = []
    for k in range(3):
        t0 = time.monotonic()
        chat(slow, conv(30 + k))
        times.append(time.monotonic() - t0)
    _, m = slow.request("GET", "/metrics")
    pending = metric(m, "cache_disk_saves_total")
    check("a write is never waited for: with the writer sleeping 2 s a file, 3 turns each take about a turn's time",
          max(times) < t_fast + 1.0 and pending < 3, f"turns {[round(t, 3) for t in times]} s, a turn {t_fast:.3f} s; "
          f"{pending} files written meanwhile")
    rc = slow.stop()
    files = [f for f in os.listdir(slow_dir) if f.endswith(".hcache")]
    check("SIGTERM writes the pending files, then exits 0", rc == 0 and len(files) >= 3, f"exit {rc}, files {files}")


def llama_flags(model, chat):
    """llama-server's flags as its users type them: each with llama-server's meaning (tests/unit/
    test_args.c checks the parsing and the refusals; here what each does in a server)"""
    def server(*flags, **kw):
        try:
            return Server(model, *flags, **kw)
        except (RuntimeError, ValueError) as ex:  # refused at start (an unknown flag: exit 2)
            return str(ex)

    def ask(srv, body, path="/completion"):
        return srv.post(path, {"prompt": "The hearth", "n_predict": 12, **body})[1]

    log = os.path.join(TMP, f"serve-flags-{os.getpid()}.log")
    s = server("-ngl", "0", "-fa", "on", "-b", "512", "-ub", "256", "--no-webui", "--jinja", log=log)
    check("-ngl 0 -fa on -b 512 -ub 256 --no-webui: the CPU engine serves",
          not isinstance(s, str) and "engine cpu" in open(log).read() and ask(s, {"temperature": 0}).get("content"), s)
    if not isinstance(s, str):
        s.stop()
    # sampling defaults: a request that sets none samples with the server's
    s = server("--temp", "0")
    ok = not isinstance(s, str) and ask(s, {})["content"] == ask(s, {"temperature": 0})["content"]
    if not isinstance(s, str):
        s.stop()
    d = Server(model)  # llama-server's default, 0.8: not greedy
    differs = any(ask(d, {"seed": k})["content"] != ask(d, {"temperature": 0})["content"] for k in range(4))
    d.stop()
    check("--temp 0: a request that sets no temperature is greedy (the default 0.8 is not)", ok and differs, s)
    s = server("--seed", "42", "--temp", "1.5", "--top-k", "0", "--top-p", "1", "--min-p", "0")
    ok = not isinstance(s, str) and len({ask(s, {})["content"] for _ in range(3)}) == 1 and \
        ask(s, {})["content"] != ask(s, {"seed": 43})["content"]
    if not isinstance(s, str):
        s.stop()
    check("--seed 42: requests that set no seed draw alike; one with its own seed draws its own", ok, s)
    # --chat-template NAME, --reasoning-budget 0
    msgs = [{"role": "user", "content": "Hi"}]
    s = server("--chat-template", "chatml")
    st, j = (0, s) if isinstance(s, str) else s.post("/apply-template", {"messages": msgs})
    check("--chat-template chatml renders ChatML", st == 200 and
          j["prompt"] == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", j)
    if not isinstance(s, str):
        s.stop()
    s = server("--chat-template", "qwen3.5", "--reasoning-budget", "0")
    q = Server(model, "--chat-template-file", "tests/fixtures/templates/Qwen3.5-4B.jinja")
    _, want = q.post("/apply-template", {"messages": msgs, "chat_template_kwargs": {"enable_thinking": False}})
    _, think = q.post("/apply-template", {"messages": msgs})
    q.stop()
    st, j = (0, s) if isinstance(s, str) else s.post("/apply-template", {"messages": msgs})
    st2, j2 = (0, s) if isinstance(s, str) else s.post("/apply-template", {"messages": msgs, "chat_template_kwargs": {"enable_thinking": True}})
    check("--chat-template qwen3.5 --reasoning-budget 0: Qwen3.5's file's prompt with thinking off; a request turns it on",
          st == 200 and j["prompt"] == want["prompt"] and want["prompt"] != think["prompt"] and st2 == 200 and
          j2["prompt"] == think["prompt"], f"{j} vs {want}")
    if not isinstance(s, str):
        s.stop()
    # --slot-save-path: /slots save and restore without --cache-dir
    sdir = os.path.join(TMP, f"slot-save-{os.getpid()}")
    os.makedirs(sdir, exist_ok=True)
    s = server("--slot-save-path", sdir)
    if isinstance(s, str):
        check("--slot-save-path DIR: /slots save writes there, restore reads it back", False, s)
    else:
        ask(s, {"temperature": 0})
        st, j = s.post("/slots/0?action=save", {"filename": "a.bin"})
        st2, j2 = s.post("/slots/0?action=restore", {"filename": "a.bin"})
        check("--slot-save-path DIR: /slots save writes there, restore reads it back",
              st == 200 and os.path.exists(os.path.join(sdir, "a.bin")) and st2 == 200 and j2["n_restored"] > 0, f"{j} {j2}")
        s.stop()
    # --api-key-file
    kf = os.path.join(TMP, f"key-{os.getpid()}")
    open(kf, "w").write("sekrit\n")
    s = server("--api-key-file", kf)
    if isinstance(s, str):
        check("--api-key-file: its key is required", False, s)
    else:
        st, _ = s.request("GET", "/v1/models")
        st2, _ = s.request("GET", "/v1/models", headers={"Authorization": "Bearer sekrit"})
        check("--api-key-file: its key is required", st == 401 and st2 == 200, f"{st} {st2}")
        s.stop()
    # -c 0: the model's trained context (tiny: 8192)
    s = server("-c", "0")
    st, j = (0, s) if isinstance(s, str) else s.request("GET", "/props")
    check("-c 0: a slot's context is the model's trained one", st == 200 and j["default_generation_settings"]["n_ctx"] == 8192, j)
    if not isinstance(s, str):
        s.stop()
    # -cram 0: no shared cache in RAM (a conversation a slot let go is a miss), a slot's own
    # points still serve; -cram -1: no limit
    conv_a = [{"role": "system", "content": "You answer about hearths."}, {"role": "user", "content": "What is one?"}]
    conv_b = [{"role": "system", "content": "You answer about rivers."}, {"role": "user", "content": "Name one."}]
    s = server("-cram", "0")
    if isinstance(s, str):
        check("-cram 0: no shared cache in RAM, a slot's own points still serve", False, s)
    else:
        a1 = chat(s, conv_a)
        conv_a2 = conv_a + [{"role": "assistant", "content": a1["choices"][0]["message"]["content"]},
                            {"role": "user", "content": "More."}]
        own = chat(s, conv_a2)
        chat(s, conv_b)
        shared = chat(s, conv_a2 + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "And?"}])
        check("-cram 0: no shared cache in RAM, a slot's own points still serve",
              own["usage"]["prompt_tokens_details"]["cached_tokens"] > 0 and
              shared["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, f"{own['timings']['cache']} / {shared['timings']['cache']}")
        s.stop()
    s = server("-cram", "-1", "--metrics")
    check("-cram -1: serves, the budget unbounded", not isinstance(s, str) and chat(s, conv_a)["usage"]["completion_tokens"] == 8, s)
    if not isinstance(s, str):
        s.stop()


def loads_or_none(text):
    try:
        return json.loads(text)
    except ValueError:
        return None


def tool_calls(model):
    """Tool calls through the whole server: the random model cannot write one, so the test
    seam HEARTH_TEST_REPLY makes every answer the tokens of a given text (the engine still
    runs each step). Whole and streamed answers must carry the same calls; streamed, the call
    arrives in pieces (its name first, then its arguments), once its </tool_call> is written."""
    reply = os.path.join(TMP, "reply.txt")
    with open(reply, "w") as f:  # the template's prompt ends inside <think>: the reply starts in it
        f.write("plan it\n</think>\n\nLooking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                "San Jose, \"CA\"\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
                "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>")
    want = [("get_weather", {"city": 'San Jose, "CA"', "days": 3}), ("get_weather", {"city": "Oslo"})]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}}]
    msgs = [{"role": "user", "content": "weather?"}]
    s = Server(model, "-np", "1", "--metrics", env={"HEARTH_TEST_REPLY": reply})
    t_begin = time.monotonic()
    body = {"messages": msgs, "tools": tools, "max_tokens": 200, "temperature": 0}
    st, j = s.post("/v1/chat/completions", body)
    m = j["choices"][0]["message"] if st == 200 else {}
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m.get("tool_calls", [])]
    check("chat: two tool calls parsed, the thinking and the text apart", st == 200 and got == want and
          m.get("reasoning_content") == "plan it\n" and m.get("content") == "Looking.\n" and
          j["choices"][0]["finish_reason"] == "tool_calls", str(m)[-300:])
    ids = [c["id"] for c in m.get("tool_calls", [])]
    st, _, ev = s.stream("/v1/chat/completions", {**body, "stream": True})
    deltas = [tc for e in ev if e != "[DONE]" for c in e["choices"] for tc in c["delta"].get("tool_calls", [])]
    calls = {}
    for d in deltas:  # as the openai client joins them
        c = calls.setdefault(d["index"], {"id": None, "name": "", "args": ""})
        c["id"] = d.get("id") or c["id"]
        c["name"] += d.get("function", {}).get("name", "")
        c["args"] += d.get("function", {}).get("arguments", "")
    sgot = [(calls[k]["name"], loads_or_none(calls[k]["args"])) for k in sorted(calls)]
    check("streamed chat: the same calls from tool_calls deltas", st == 200 and sgot == want, str(deltas)[:400])
    check("streamed chat: each call starts with its id and name, its arguments in several pieces",
          len(deltas) > 4 and deltas[0].get("id") and deltas[0]["function"]["name"] == "get_weather" and
          sum(1 for d in deltas if d["index"] == 0 and d["function"].get("arguments")) >= 3, str(deltas)[:400])
    check("streamed chat: finish_reason tool_calls",
          [c["finish_reason"] for e in ev if e != "[DONE]" for c in e["choices"] if c["finish_reason"]] == ["tool_calls"])
    # Anthropic: tool_use blocks, whole and streamed (input_json_delta pieces joined)
    atools = [{"name": "get_weather", "input_schema": tools[0]["function"]["parameters"]}]
    abody = {"model": "m", "max_tokens": 200, "messages": msgs, "tools": atools}
    st, j = s.post("/v1/messages", abody)
    blocks = j.get("content", []) if st == 200 else []
    got = [(b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"]
    check("messages: tool_use blocks, stop_reason tool_use", st == 200 and got == want and
          j["stop_reason"] == "tool_use" and [b["type"] for b in blocks] == ["thinking", "text", "tool_use", "tool_use"],
          str(j)[:400])
    st, _, ev = s.stream("/v1/messages", {**abody, "stream": True})
    open_blocks, parts = {}, {}
    for e in ev:
        if e == "[DONE]":
            continue
        if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use":
            open_blocks[e["index"]] = e["content_block"]["name"]
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta":
            parts.setdefault(e["index"], []).append(e["delta"]["partial_json"])
    sgot = [(open_blocks[k], loads_or_none("".join(parts.get(k, [])))) for k in sorted(open_blocks)]
    check("streamed messages: the same calls from input_json_delta pieces", st == 200 and sgot == want and
          len(parts.get(min(open_blocks, default=0), [])) >= 3, str(ev)[:400])
    # /metrics' latency histograms: the 4 requests above, each in one bucket, the buckets
    # cumulative up to +Inf = count, the sums within the time the 4 took, and each value in
    # the right bucket: the sum lies between the sums of the buckets' lower and upper edges
    elapsed = time.monotonic() - t_begin
    _, m = s.request("GET", "/metrics")
    for h in ("time_to_first_token_seconds", "request_duration_seconds"):
        rows = [line.split() for line in m.split("\n") if line.startswith(f"hearth:{h}_bucket")]
        b = [float(r[1]) for r in rows]
        le = [float(r[0].split('"')[1]) for r in rows[:-1]]
        per = [y - x for x, y in zip([0.0] + b[:-1], b)]
        lo = sum(c * e for c, e in zip(per[1:], le))
        hi = sum(c * e for c, e in zip(per, le + [float("inf")]) if c)
        total = metric(m, f"{h}_sum")
        ok = (len(b) == 12 and all(x <= y for x, y in zip(b, b[1:])) and b[-1] == 4 and metric(m, f"{h}_count") == 4
              and 0 < total <= elapsed and lo <= total <= hi)
        check(f"/metrics: {h} histogram counts the 4 requests", ok, f"{b} sum {total} in [{lo}, {hi}], {elapsed:.3f} s")
    s.stop()
    # tool_choice "none": the template is given no tools, and the answer is text, not calls
    # (Qwen3.5's template, which renders tools; the same scripted reply)
    s = Server(model, "-np", "1", "--chat-template-file", "tests/fixtures/templates/Qwen3.5-4B.jinja",
               env={"HEARTH_TEST_REPLY": reply})
    _, with_tools = s.post("/apply-template", {"messages": msgs, "tools": tools})
    _, no_tools = s.post("/apply-template", {"messages": msgs})
    _, none_tools = s.post("/apply-template", {"messages": msgs, "tools": tools, "tool_choice": "none"})
    check("tool_choice none: the prompt is the one without tools", with_tools.get("prompt") != no_tools.get("prompt")
          and none_tools.get("prompt") == no_tools.get("prompt"), str(none_tools)[:200])
    st, j = s.post("/v1/chat/completions", {**body, "tool_choice": "none"})
    m = j["choices"][0]["message"] if st == 200 else {}
    check("tool_choice none: no tool_calls, the call's text stays content", st == 200 and not m.get("tool_calls") and
          "<tool_call>" in (m.get("content") or "") and j["choices"][0]["finish_reason"] != "tool_calls", str(m)[-300:])
    st, j = s.post("/v1/messages", {**abody, "tool_choice": {"type": "none"}})
    check("messages: tool_choice none gives text blocks, no tool_use", st == 200 and
          all(b["type"] != "tool_use" for b in j.get("content", [])) and j.get("stop_reason") != "tool_use", str(j)[:300])
    st, j = s.post("/v1/chat/completions", body)
    check("the same request without tool_choice: the calls parsed", st == 200 and
          len(j["choices"][0]["message"].get("tool_calls") or []) == 2, str(j)[:300])
    s.stop()
    # a NUL byte in the model's text (byte-level token 'Ā'): the whole answer and the stream
    # both carry all of it (a cJSON string ended at the NUL: the whole answer lost the rest)
    with open(reply, "wb") as f:
        f.write(b"before\x00after the NUL")
    s = Server(model, "-np", "1", env={"HEARTH_TEST_REPLY": reply})
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 50, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False}}
    st, j = s.post("/v1/chat/completions", body)
    whole = j["choices"][0]["message"]["content"] if st == 200 else None
    st2, _, ev = s.stream("/v1/chat/completions", {**body, "stream": True})
    streamed = "".join(c["delta"].get("content") or "" for e in ev if e != "[DONE]" for c in e["choices"])
    check("a NUL in the answer: whole and streamed both carry all of the text (the NUL as U+FFFD)",
          st == 200 and st2 == 200 and whole == streamed and whole.endswith("before\ufffdafter the NUL"),
          f"{whole!r} vs {streamed!r}")
    s.stop()


def cut_calls(model):
    """An unfinished tool call is not a call (F14 item 6): cut by max_tokens, or by the model
    ending inside it, its text stays in the content, and the answer says length or stop,
    never tool_calls / tool_use; whole and streamed alike (the stream holds a call's pieces
    back until its </tool_call>, so no call is sent that the end takes back)."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}}]
    atools = [{"name": "get_weather", "input_schema": tools[0]["function"]["parameters"]}]
    msgs = [{"role": "user", "content": "weather?"}]
    head = "plan it\n</think>\n\nLooking.\n"
    call = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n</function>\n</tool_call>")
    reply = os.path.join(TMP, "reply-cut.txt")
    for how, text in (("cut by max_tokens", head + call), ("the model ending inside it", head + call[:call.index("</par")])):
        with open(reply, "w") as f:
            f.write(text)
        s = Server(model, "-np", "1", env={"HEARTH_TEST_REPLY": reply})
        n = 200
        if how == "cut by max_tokens":  # the answer ends inside "Paris"
            _, tk = s.post("/tokenize", {"content": head + call[:call.index("Paris") + 3], "parse_special": True})
            n = len(tk["tokens"])
        fin, afin = ("length", "max_tokens") if n < 200 else ("stop", "end_turn")
        body = {"messages": msgs, "tools": tools, "max_tokens": n, "temperature": 0}
        st, j = s.post("/v1/chat/completions", body)
        m = j["choices"][0]["message"] if st == 200 else {}
        c = m.get("content") or ""
        check(f"a tool call {how}: no tool_calls, its text in the content, finish_reason {fin}", st == 200 and
              not m.get("tool_calls") and c.startswith("Looking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar")
              and call.startswith(c[len("Looking.\n"):]) and j["choices"][0]["finish_reason"] == fin, str(j)[-400:])
        st, _, ev = s.stream("/v1/chat/completions", {**body, "stream": True})
        ch = [x for e in ev if e != "[DONE]" for x in e["choices"]]
        check(f"a tool call {how}, streamed: no tool_calls delta, the same content, finish_reason {fin}", st == 200 and
              not any(x["delta"].get("tool_calls") for x in ch) and
              "".join(x["delta"].get("content") or "" for x in ch) == c and
              [x["finish_reason"] for x in ch if x["finish_reason"]] == [fin], str(ev)[-400:])
        abody = {"model": "m", "max_tokens": n, "messages": msgs, "tools": atools}
        st, j = s.post("/v1/messages", abody)
        blocks = j.get("content", []) if st == 200 else []
        check(f"messages, a tool call {how}: no tool_use block, its text in a text block, stop_reason {afin}",
              st == 200 and [b["type"] for b in blocks] == ["thinking", "text"] and blocks[1]["text"] == c and
              j["stop_reason"] == afin, str(j)[-400:])
        st, _, ev = s.stream("/v1/messages", {**abody, "stream": True})
        ev = [e for e in ev if e != "[DONE]"]
        text = "".join(e["delta"].get("text", "") for e in ev if e["type"] == "content_block_delta")
        check(f"messages streamed, a tool call {how}: no tool_use block, the same text, stop_reason {afin}",
              st == 200 and not any(e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"
                                    for e in ev) and text == c and
              [e["delta"]["stop_reason"] for e in ev if e["type"] == "message_delta"] == [afin], str(ev)[-400:])
        s.stop()


def sse_data(text):
    """the data lines of an SSE body: parsed JSON, or the string [DONE]"""
    out = []
    for line in text.split("\n"):
        if line.startswith("data: "):
            d = line[6:]
            out.append(d if d == "[DONE]" else loads_or_none(d))
    return out


def sigterm_under_load(model):
    """SIGTERM with both slots generating and requests queued, streamed and whole: the server
    exits 0 at once (under the sanitizers: with no leak and no race), every client gets a whole
    response, never a cut one: a whole answer 503, a stream an error event then [DONE]."""
    s = Server(model, "-np", "2", "--metrics")
    res = {}

    def whole(k):
        try:
            res[k] = s.post("/completion", {"prompt": f"hello {k}", "n_predict": 3000, "ignore_eos": True}, timeout=60)
        except Exception as e:  # noqa: BLE001 (any failure is the finding)
            res[k] = ("exception", repr(e))

    def stream(k):
        try:
            c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
            c.request("POST", "/v1/chat/completions", body=json.dumps({
                "messages": [{"role": "user", "content": f"story {k}"}], "max_tokens": 3000, "ignore_eos": True,
                "stream": True}).encode(), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            res[k] = (r.status, sse_data(r.read().decode()))
            c.close()
        except Exception as e:  # noqa: BLE001
            res[k] = ("exception", repr(e))
    th = [threading.Thread(target=whole if k % 2 else stream, args=(k,)) for k in range(6)]
    for t in th:
        t.start()
    busy = False
    for _ in range(400):  # both slots generating, the other 4 requests queued
        _, sl = s.request("GET", "/slots")
        _, m = s.request("GET", "/metrics")
        if all(x["is_processing"] and x["n_tokens"] > 0 for x in sl) and metric(m, "requests_deferred") == 4:
            busy = True
            break
        time.sleep(0.05)
    t0 = time.monotonic()
    rc = s.stop()
    took = time.monotonic() - t0
    for t in th:
        t.join(timeout=30)
    check("SIGTERM under load: both slots busy, 4 queued; the server exits 0 within 5 s", busy and rc == 0 and took < 5,
          f"busy {busy} rc {rc} in {took:.2f} s")
    wholes = [res.get(k) for k in range(1, 6, 2)]
    streams = [res.get(k) for k in range(0, 6, 2)]
    check("SIGTERM under load: every whole request answered 503 with an error body",
          all(w and w[0] == 503 and isinstance(w[1], dict) and w[1].get("error", {}).get("type") == "unavailable_error"
              for w in wholes), str(wholes)[:400])
    ends = [st[1][-2:] if st and st[0] == 200 else st for st in streams]
    check("SIGTERM under load: every stream ends whole, with an error event ('stopping') then [DONE]",
          all(isinstance(e, list) and len(e) == 2 and isinstance(e[0], dict) and
              "stopping" in str(e[0].get("error", {}).get("message")) and e[1] == "[DONE]" for e in ends), str(ends)[:400])
    check("SIGTERM under load: no client left waiting", not any(t.is_alive() for t in th))


def slow_readers(model):
    """A client that reads its stream slowly gets all of it, while another client is served;
    one that stops reading holds nothing past --timeout: cut off, its slot free."""
    s = Server(model, "-np", "2", "--timeout", "2")
    prompt = [5, 17, 200, 31, 8]

    def raw_stream(body, path="/completion"):
        so = socket.socket()
        so.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the server's sends block
        so.connect(("127.0.0.1", s.port))
        b = json.dumps(body).encode()
        so.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: " + str(len(b)).encode() + b"\r\n\r\n" + b)
        return so
    want = s.post("/completion", {"prompt": prompt, "n_predict": 300, "temperature": 0, "ignore_eos": True})[1]["content"]
    so = raw_stream({"prompt": prompt, "n_predict": 300, "temperature": 0, "ignore_eos": True, "stream": True})
    so.settimeout(30)
    data, other, t_other = b"", None, None
    while True:
        k = so.recv(1024)  # 1 KiB every 20 ms
        if not k:
            break
        data += k
        if other is None:  # meanwhile, the other slot answers a request
            t1 = time.monotonic()
            other = s.post("/completion", {"prompt": [9, 9, 9], "n_predict": 16})[0]
            t_other = time.monotonic() - t1
        if data.endswith(b"0\r\n\r\n"):  # the chunked body's end
            break
        time.sleep(0.02)
    so.close()
    body = data.split(b"\r\n\r\n", 1)[1]
    text = "".join(e["content"] for e in sse_data(re.sub(rb"\r\n[0-9a-f]+\r\n", b"", b"\r\n" + body).decode())
                   if isinstance(e, dict))
    check("a slow reader gets the whole stream, equal to the whole answer", text == want, f"{len(text)} vs {len(want)} chars")
    check("meanwhile another client is answered at once", other == 200 and t_other < 10, f"{other} in {t_other}")
    # a reader that stops: the answer is generated, the connection is cut after --timeout (chat's
    # events, ~200 bytes a token, so the stream is larger than what the kernel buffers: ~400 KB)
    so = raw_stream({"messages": [{"role": "user", "content": "go"}], "max_tokens": 2000, "ignore_eos": True,
                     "stream": True}, "/v1/chat/completions")
    so.recv(100)
    idle = False
    for _ in range(600):
        _, sl = s.request("GET", "/slots")
        if not any(x["is_processing"] for x in sl):
            idle = True
            break
        time.sleep(0.1)
    time.sleep(3)  # --timeout 2 without progress
    so.settimeout(10)
    data, closed = b"", False
    try:
        while True:
            k = so.recv(65536)
            if not k:
                closed = True
                break
            data += k
    except ConnectionResetError:
        closed = True
    except socket.timeout:
        pass
    so.close()
    cut = closed and not data.endswith(b"0\r\n\r\n")  # closed before the chunked body's end
    st, _ = s.request("GET", "/health")
    check("a reader that stops is cut off after --timeout (its stream unfinished), its slot free, the server serving",
          idle and cut and st == 200, f"idle {idle} closed {closed} {len(data)} bytes, ends {data[-12:]!r}, /health {st}")
    rc = s.stop()
    check("slow readers: SIGTERM exits 0", rc == 0, str(rc))


if __name__ == "__main__":
    if sys.argv[1:] == ["answer_end"]:  # tests/gates/mutants: this part alone
        answer_end_points()
        sys.exit(1 if checks.summary() else 0)
    if sys.argv[1:] == ["spares"]:  # tests/gates/mutants: this part alone
        tiny = os.path.join(TMP, "serve-tiny.gguf")
        subprocess.run([HEARTH, "gen", "--preset", "tiny", "--quant", "q4_k_m", "--seed", "1", "-o", tiny], check=True,
                       capture_output=True)
        spare_points(tiny)
        sys.exit(1 if checks.summary() else 0)
    sys.exit(main())
