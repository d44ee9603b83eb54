#!/usr/bin/env python3
"""serve_hostile_test.py: what a new user and a hostile one found in `hearth serve` (F14's
defects and hostile shapes), each checked end to end on the tiny synthetic model: idle
sockets that must not lock anyone out, errors that are JSON everywhere, a NUL in a JSON
string refused by name, fields that change the answer implemented or refused by name,
ignore_eos as llama-server means it, and the shapes that crashed the peers answered with a
clear 4xx while the server serves on. Each check was seen red with its defect planted back.

Prints one "ok"/"FAIL" line per check and "N passed, N failed" at the end (the helpers and
the counters are serve_test.py's)."""
import json
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checks  # noqa: E402
from serve_test import HEARTH, TMP, Server, check  # noqa: E402

MSGS = [{"role": "user", "content": "Name a hearth."}]


def safe(fn, *a, **kw):
    """fn's answer, or (0, the exception) when it raised (a timeout)"""
    try:
        return fn(*a, **kw)
    except OSError as e:
        return 0, repr(e)


def err_msg(j):
    return j.get("error", {}).get("message", "") if isinstance(j, dict) else ""


def raw_request(port, data, timeout=10):
    """bytes sent as they are; the status and the body of the answer"""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    out = b""
    try:
        while True:
            k = s.recv(65536)
            if not k:
                break
            out += k
            head, _, body = out.partition(b"\r\n\r\n")
            cl = [int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length:")]
            if cl and len(body) >= cl[0]:
                break
    except (socket.timeout, ConnectionResetError):
        pass
    s.close()
    head, _, body = out.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/") else 0
    return status, head.decode("latin-1"), body


def bodies(s, model):
    """item 2 (NUL), 3 (image parts), 10 (malformed tools, n_keep, samplers, t_max_predict_ms)
    and the hostile shapes: each a 400 naming the field, or a correct answer"""
    st_, j = s.post("/tokenize", {"content": "a\u0000b"})
    check("/tokenize of a string with \\u0000 -> 400 naming the field and \\u0000",
          st_ == 400 and '"content"' in err_msg(j) and "\\u0000" in err_msg(j), f"{st_} {j}")
    st_, j = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello\u0000 TAIL"}], "max_tokens": 1})
    check("chat content with \\u0000 -> 400 naming messages[0].content",
          st_ == 400 and '"messages"[0].content' in err_msg(j), f"{st_} {j}")
    st_, j = s.post("/tokenize", {"content": "a\\u0000b"})  # an escaped backslash: the text \u0000, no NUL
    check("the six characters \\u0000 (escaped backslash) are text, tokenized", st_ == 200 and len(j["tokens"]) >= 3,
          f"{st_} {j}")
    st_, j = s.request("POST", "/tokenize", raw=b'{"content": "a\x00b"}')
    check("a raw NUL byte in the body -> 400 invalid JSON", st_ == 400 and "NUL byte" in err_msg(j), f"{st_} {j}")
    st_, j = s.request("POST", "/tokenize", raw=b'{"content": "ab"} {"x": 1}')
    check("text after the JSON value -> 400 invalid JSON", st_ == 400 and "not valid JSON" in err_msg(j), f"{st_} {j}")

    for part in ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                 {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                 {"type": "input_image", "image_url": "https://example.com/x.png"}):
        body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}],
                "max_tokens": 2}
        st_, j = s.post("/v1/chat/completions", body)
        check(f"a {part['type']} part -> 400 naming it", st_ == 400 and f'"{part["type"]}"' in err_msg(j) and
              "content[1]" in err_msg(j), f"{st_} {j}")
    st_, j = s.post("/apply-template", {"messages": [{"role": "user", "content": [{"type": "image_url",
                                                                                   "image_url": {"url": "x"}}]}]})
    check("/apply-template refuses an image part too", st_ == 400, f"{st_} {j}")

    for tools, what in (([{"type": "function"}], '"tools"[0].function'), ([{"type": "function", "function": {}}],
                        '"tools"[0].function.name'), ([{"function": {"name": "f"}}], '"tools"[0].type'),
                        ([{"type": "function", "function": {"name": "f", "parameters": "x"}}],
                         '"tools"[0].function.parameters'), ([5], '"tools"[0]')):
        st_, j = s.post("/v1/chat/completions", {"messages": MSGS, "tools": tools, "max_tokens": 1})
        check(f"malformed tools {json.dumps(tools)} -> 400 naming {what}", st_ == 400 and what in err_msg(j),
              f"{st_} {j}")

    # n_keep / n_discard: hearth never shifts the context, so they change nothing; out of range is refused
    for field, val, code in (("n_keep", -5, 400), ("n_keep", 10 ** 9, 400), ("n_discard", -1, 400), ("n_keep", 8, 200),
                             ("n_keep", -1, 200), ("n_cmpl", 3, 400), ("n_cmpl", 10 ** 9, 400)):
        st_, j = s.post("/completion", {"prompt": "hello", "n_predict": 2, field: val})
        check(f"{field} {val} -> {code}", st_ == code and (code == 200 or f'"{field}"' in err_msg(j)), f"{st_} {j}")

    # samplers: the stages run as named. Without a temperature stage the draw is at temperature
    # 1 (llama.cpp's meaning), so temperature 0 is then no greedy answer
    base = {"prompt": "Once upon a time", "n_predict": 16, "temperature": 0, "return_tokens": True, "ignore_eos": True,
            "seed": 3}
    _, greedy = s.post("/completion", base)
    st_, j = s.post("/completion", {**base, "samplers": "edkypmxt"})
    check("samplers: llama-server's default letters, temperature 0 -> the greedy answer",
          st_ == 200 and j["tokens"] == greedy["tokens"], f"{st_} {j}")
    st_, j = s.post("/completion", {**base, "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"]})
    check("samplers: names, temperature 0 -> the greedy answer", st_ == 200 and j["tokens"] == greedy["tokens"],
          f"{st_} {j}")
    st_, j = s.post("/completion", {**base, "samplers": ["top_k"], "top_k": 0})
    check("samplers without temperature: temperature 0 is ignored, the draw is at temperature 1 (not greedy)",
          st_ == 200 and j["tokens"] != greedy["tokens"], f"{j.get('tokens')} vs {greedy['tokens']}")
    for bad in (["top_k", "wizard"], "kz", 5, ["top_k", "penalties"], ["top_k", "top_k"]):
        st_, j = s.post("/completion", {**base, "samplers": bad})
        check(f"samplers {json.dumps(bad)} -> 400 naming samplers", st_ == 400 and '"samplers"' in err_msg(j),
              f"{st_} {j}")
    # without samplers, llama-server's default order (top_k, top_p, min_p, then the
    # temperature), on the server and in hearth run (the same seed, ids and KV type): at a high
    # temperature the cuts made before it differ from those made after (the old default)
    hot = {**base, "temperature": 3, "top_k": 40, "top_p": 0.9, "min_p": 0.2, "seed": 5, "n_predict": 24}
    _, ids = s.post("/tokenize", {"content": base["prompt"]})
    got = {}
    for name, order in (("default", None), ("llama", ["top_k", "top_p", "min_p", "temperature"]),
                        ("temperature first", ["temperature", "top_k", "min_p", "top_p"])):
        st_, j = s.post("/completion", {**hot, "samplers": order} if order else hot)
        got[name] = j.get("tokens") if st_ == 200 else f"{st_} {j}"
    r = subprocess.run([HEARTH, "run", "-m", model, "--ids", ",".join(map(str, ids["tokens"])), "-n", "24", "-t", "2",
                        "--kv", "f16", "--ids-out", "--ignore-eos", "--temp", "3", "--top-k", "40", "--top-p", "0.9",
                        "--min-p", "0.2", "--seed", "5"], capture_output=True, text=True)
    got["run"] = json.loads(r.stdout) if r.returncode == 0 else r.stderr
    check("no samplers: llama-server's default order on the server and in hearth run (not the temperature first)",
          got["default"] == got["llama"] == got["run"] and got["default"] != got["temperature first"], str(got))

    # hostile shapes that broke the peers: each a clear 4xx or a correct answer
    hostile = [
        ("temperature 1e6", {"temperature": 1e6}, 400), ("top_p -1", {"top_p": -1}, 400), ("top_k -5", {"top_k": -5}, 400),
        ("min_p 2", {"min_p": 2}, 400), ("repeat_penalty -1", {"repeat_penalty": -1}, 400),
        ("presence_penalty -100", {"presence_penalty": -100}, 400),
        ("frequency_penalty -1e9", {"frequency_penalty": -1e9}, 400), ("n 1e9", {"n": 10 ** 9}, 400),
        ("n_predict 1e12", {"n_predict": 10 ** 12}, 400), ("n_keep as a string", {"n_keep": "x"}, 400),
        ("temperature NaN-ish string", {"temperature": "nan"}, 400), ("top_k 1e300", {"top_k": 1e300}, 400),
    ]
    for name, extra, code in hostile:
        st_, j = s.post("/completion", {"prompt": "hello", "n_predict": 2, **extra})
        check(f"hostile: {name} -> {code}", st_ == code and "message" in j.get("error", {}), f"{st_} {j}")
    st_, j = s.post("/completion", {"prompt": "word " * 10000, "n_predict": 1})  # a 50 KB prompt over the context
    check("hostile: a 50 KB prompt over the context -> 400 naming the context", st_ == 400 and "context" in err_msg(j),
          f"{st_} {str(j)[:200]}")
    st_, j = s.post("/tokenize", {"content": "[" * 200000 + "a" * 300000})
    check("hostile: a 500 KB text to tokenize (brackets, no recursion on input)", st_ == 200 and len(j["tokens"]) > 1000,
          f"{st_} {str(j)[:200]}")
    st_, j = s.request("POST", "/tokenize", raw=b'{"content": ' + b"[" * 5000 + b"]" * 5000 + b"}")
    check("hostile: JSON nested 5000 deep -> 400, no crash", st_ == 400, f"{st_} {j}")
    st_, _ = s.request("GET", "/health")
    check("hostile: the server serves on", st_ == 200)


def busy_slot(model):
    """a second request to a busy id_slot waits for it and is answered (one slot, a queue)"""
    s = Server(model, "-np", "2")
    out = {}

    def go(k, n):
        out[k] = s.post("/completion", {"prompt": "hello there", "n_predict": n, "id_slot": 0, "temperature": 0,
                                        "ignore_eos": True})

    t1 = threading.Thread(target=go, args=(1, 400))
    t1.start()
    time.sleep(0.3)
    t2 = threading.Thread(target=go, args=(2, 4))
    t2.start()
    t1.join()
    t2.join()
    check("a second request to a busy id_slot is answered after the first, on that slot",
          out[1][0] == 200 and out[2][0] == 200 and out[2][1]["id_slot"] == 0 and
          out[2][1]["tokens_predicted"] == 4, f"{out[1][0]} {out[2]}")
    st_, j = s.post("/completion", {"prompt": "x", "n_predict": 1, "id_slot": 9})
    check("an id_slot that does not exist -> 400", st_ == 400, f"{st_} {j}")
    s.stop()


def ignore_eos(model):
    """item 12: ignore_eos never samples an end token (llama-server's meaning), server and CLI.
    At temperature 100 the draw is near uniform over the 1024 ids: 2000 draws meet the end
    ids several times when they are not masked"""
    eog = [993, 995]
    s = Server(model, "-np", "1")
    st_, j = s.post("/completion", {"prompt": [5, 6, 7], "n_predict": 2000, "temperature": 100, "top_k": 0,
                                    "top_p": 1, "min_p": 0, "seed": 11, "ignore_eos": True, "return_tokens": True})
    toks = j.get("tokens", []) if st_ == 200 else []
    check("ignore_eos: 2000 tokens at temperature 100, none an end token", st_ == 200 and len(toks) == 2000 and
          not set(toks) & set(eog), f"{st_} {len(toks)} tokens, end ids at {[i for i, t in enumerate(toks) if t in eog][:5]}")
    s.stop()
    r = subprocess.run([HEARTH, "run", "-m", model, "--ids", "5,6,7", "-n", "2000", "--temp", "100", "--seed", "11",
                        "--ignore-eos", "--ids-out", "-t", "2"], capture_output=True, text=True)
    ids = json.loads(r.stdout) if r.returncode == 0 else []
    check("hearth run --ignore-eos: 2000 tokens at temperature 100, none an end token",
          len(ids) == 2000 and not set(ids) & set(eog), f"rc {r.returncode} {len(ids)} ids, "
          f"end ids at {[i for i, t in enumerate(ids) if t in eog][:5]} {r.stderr[-200:]}")


def scripted(model):
    """items 4, 5 and t_max_predict_ms, through the test seam HEARTH_TEST_REPLY (every answer
    is the tokens of a given text)"""
    reply = os.path.join(TMP, "hostile-reply.txt")
    with open(reply, "w") as f:  # the template's prompt ends inside <think>: the reply is all thinking
        f.write("only thinking here\n</think>\n\n")
    s = Server(model, "-np", "1", env={"HEARTH_TEST_REPLY": reply})
    body = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "think"}]}
    st_, whole = s.post("/v1/messages", body)
    st2, _, ev = s.stream("/v1/messages", {**body, "stream": True})
    blocks = {}
    for e in ev:  # as the SDK's finalMessage() builds them
        if e == "[DONE]":
            continue
        if e["type"] == "content_block_start":
            blocks[e["index"]] = dict(e["content_block"])
        elif e["type"] == "content_block_delta" and e["delta"]["type"] == "thinking_delta":
            blocks[e["index"]]["thinking"] += e["delta"]["thinking"]
        elif e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta":
            blocks[e["index"]]["text"] += e["delta"]["text"]
    streamed = [blocks[k] for k in sorted(blocks)]
    check("messages: a thinking-only answer, whole and streamed give the same blocks (no empty text block)",
          st_ == 200 and st2 == 200 and whole["content"] == streamed and [b["type"] for b in streamed] == ["thinking"],
          f"{whole.get('content')} vs {streamed}")
    # item 4: a repeated conversation resumes: Anthropic's usage says so, and the timings come too
    st_, again = s.post("/v1/messages", body)
    u, t = again.get("usage", {}), again.get("timings", {})
    check("messages: usage.cache_read_input_tokens counts the resumed rows, input_tokens the rest, timings there",
          st_ == 200 and u.get("cache_read_input_tokens", 0) > 0 and "cache_creation_input_tokens" in u and
          u["input_tokens"] + u["cache_read_input_tokens"] == t.get("prompt_n", -1) + t.get("cache_n", -1)
          and t.get("cache_n") == u["cache_read_input_tokens"], str(again)[:400])
    delta = [e for e in ev if e != "[DONE]" and e["type"] == "message_delta"]
    check("messages stream: message_delta carries the usage and the timings",
          len(delta) == 1 and "timings" in delta[0] and "cache_read_input_tokens" in delta[0]["usage"], str(delta))
    s.stop()
    # t_max_predict_ms: past the limit, the answer ends at the first newline on (stop type limit)
    with open(reply, "w") as f:
        f.write("".join(f"line {k}\n" for k in range(400)))
    s = Server(model, "-np", "1", env={"HEARTH_TEST_REPLY": reply})
    st_, j = s.post("/completion", {"prompt": "go", "n_predict": 1500, "t_max_predict_ms": 1})
    check("t_max_predict_ms 1: the answer ends early, stop_type limit", st_ == 200 and
          0 < j["tokens_predicted"] < 1500 and j["stop_type"] == "limit", f"{st_} {str(j)[:300]}")
    st_, j = s.post("/completion", {"prompt": "go", "n_predict": 300})
    check("without it the same request runs to n_predict", st_ == 200 and j["tokens_predicted"] == 300, str(j)[:200])
    s.stop()


def slots_save(model):
    """item 9: /slots save refuses the name of the prompt cache's own files"""
    cdir = os.path.join(TMP, f"hostile-cache-{os.getpid()}")
    s = Server(model, "-np", "1", "--cache-dir", cdir)
    s.post("/v1/chat/completions", {"messages": MSGS, "max_tokens": 2})
    s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "another"}], "max_tokens": 2})
    # entries reach the disk from the cache's writer thread, after the answers: wait for one
    deadline = time.time() + 10
    live = []
    while not live and time.time() < deadline:
        live = sorted(f for f in os.listdir(cdir) if f.endswith(".hcache"))
        if not live:
            time.sleep(0.05)
    before = {f: open(os.path.join(cdir, f), "rb").read() for f in live}
    st_, j = s.post("/slots/0?action=save", {"filename": live[0] if live else "x.hcache"})
    check("/slots save onto a live cache file's name -> 400, the file untouched",
          len(live) >= 1 and st_ == 400 and "hcache" in err_msg(j) and
          open(os.path.join(cdir, live[0]), "rb").read() == before[live[0]], f"{st_} {j} {live}")
    st_, j = s.post("/slots/0?action=save", {"filename": "mine.bin"})
    check("/slots save to another name works", st_ == 200, f"{st_} {j}")
    s.stop()


def cache_reason(model):
    """item 8: timings.cache gives the whole reason: a cache file corrupted after the start
    is refused when read back, and the answer says why (the checksum), not the first 80
    characters of the message"""
    cdir = os.path.join(TMP, f"hostile-why-{os.getpid()}")
    conv = [{"role": "system", "content": "You answer about hearths."}, {"role": "user", "content": "What is one?"}]
    s = Server(model, "-np", "1", "--cache-dir", cdir)
    s.post("/v1/chat/completions", {"messages": conv, "max_tokens": 4})
    s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "other"}], "max_tokens": 4})
    s.stop()
    s = Server(model, "-np", "1", "--cache-dir", cdir)
    for f in os.listdir(cdir):
        p = os.path.join(cdir, f)
        b = bytearray(open(p, "rb").read())
        b[-10] ^= 0x40
        open(p, "wb").write(b)
    st_, j = s.post("/v1/chat/completions", {"messages": conv + [{"role": "assistant", "content": "x"},
                                                                 {"role": "user", "content": "more"}], "max_tokens": 4})
    why = j.get("timings", {}).get("cache", "") if st_ == 200 else ""
    check("timings.cache: the whole reason a cache file was refused (its checksum), not cut at 80 characters",
          "checksum does not match" in why, f"{st_} {why!r}")
    s.stop()


def idle_sockets(model):
    """item 1: idle or slow clients lock nobody out. 100 sockets that send nothing (or half a
    head) hold no thread: /health and a chat answer at once meanwhile; the idle ones are cut
    after the head timeout (10 s), not --timeout; one address holds at most its cap while
    another is served"""
    s = Server(model, "-np", "1")
    idle = []
    for k in range(100):
        so = socket.create_connection(("127.0.0.1", s.port))
        if k % 2:
            so.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # half a head
        idle.append(so)
    t0 = time.monotonic()
    st_, j = safe(s.request, "GET", "/health", timeout=5)
    t_health = time.monotonic() - t0
    t0 = time.monotonic()
    st2, j2 = safe(s.post, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 4}, timeout=10)
    t_chat = time.monotonic() - t0
    check("100 idle sockets: /health and a chat answer at once", st_ == 200 and st2 == 200 and t_health < 1 and
          t_chat < 3, f"/health {st_} in {t_health:.2f} s, chat {st2} in {t_chat:.2f} s")
    for so in idle:
        so.close()
    s.stop()
    # cut after the head timeout
    s = Server(model, "-np", "1", "--timeout", "30")
    so = socket.create_connection(("127.0.0.1", s.port))
    so.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    so.settimeout(20)
    t0 = time.monotonic()
    try:
        closed = so.recv(100) == b""
    except ConnectionResetError:
        closed = True
    except socket.timeout:
        closed = False
    dt = time.monotonic() - t0
    so.close()
    check("a head that never ends is cut after the head timeout (10 s), not --timeout (30 s)", closed and dt < 15,
          f"closed {closed} after {dt:.1f} s")
    # the per-address cap: 300 sockets from 127.0.0.1 hold 256 at most; 127.0.0.2 is served
    many = []
    for _ in range(300):
        try:
            many.append(socket.create_connection(("127.0.0.1", s.port), timeout=2))
        except OSError:
            break
    time.sleep(0.5)
    shut = 0
    for so in many:
        so.setblocking(False)
        try:
            if so.recv(1) == b"":
                shut += 1
        except BlockingIOError:
            pass
        except OSError:
            shut += 1
    other = socket.create_connection(("127.0.0.1", s.port), timeout=5, source_address=("127.0.0.2", 0))
    other.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    other.settimeout(5)
    try:
        ans = other.recv(4096)
    except OSError as e:
        ans = repr(e).encode()
    other.close()
    check("300 sockets from one address: those over its cap (256) are closed, another address is served",
          shut >= 300 - 256 and ans.startswith(b"HTTP/1.1 200"), f"{shut} closed, other: {ans[:40]!r}")
    for so in many:
        so.close()
    s.stop()


def long_generation(model):
    """item 1: the connection timeout is for reading requests and for readers that stop, not
    for generating: an answer made for longer than --timeout 1, and those whose first byte
    comes later than it (queued behind that one), are whole, streamed or not"""
    s = Server(model, "-np", "1", "--timeout", "1", "-c", "8192")
    outs = {}

    def go(k, body):
        t = time.monotonic()
        if body.get("stream"):
            try:
                r = s.stream("/completion", body)
            except Exception as e:  # cut off: an incomplete chunked body
                r = (0, None, [repr(e)])
            outs[k] = (r[0], r[2][-1].get("tokens_predicted") if r[2] and isinstance(r[2][-1], dict) else None,
                       time.monotonic() - t)
        else:
            st_, j = safe(s.post, "/completion", body, timeout=600)  # the sanitizers' builds are slow
            outs[k] = (st_, j.get("tokens_predicted") if isinstance(j, dict) else None, time.monotonic() - t)

    n_long = 8000  # tiny decodes ~2k tokens/s here: seconds, over --timeout 1
    th = [threading.Thread(target=go, args=("long", {"prompt": "go", "n_predict": n_long, "ignore_eos": True})),
          threading.Thread(target=go, args=("whole", {"prompt": "go", "n_predict": 3, "ignore_eos": True})),
          threading.Thread(target=go, args=("stream", {"prompt": "go", "n_predict": 3, "ignore_eos": True,
                                                       "stream": True}))]
    for t in th:
        t.start()
        time.sleep(0.2)
    for t in th:
        t.join()
    check("a whole answer generated for longer than --timeout comes whole",
          outs["long"][0] == 200 and outs["long"][1] == n_long and outs["long"][2] > 1.5, str(outs["long"]))
    check("answers queued behind it past --timeout come whole, streamed or not",
          outs["whole"][:2] == (200, 3) and outs["stream"][:2] == (200, 3) and outs["stream"][2] > 1.5,
          f"{outs['whole']} {outs['stream']}")
    s.stop()


def json_errors(model):
    """item 7: errors are JSON everywhere: a 100 KB header line gets 431 with a JSON body"""
    s = Server(model, "-np", "1")
    st_, head, body = raw_request(s.port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100000 + b"\r\n\r\n")
    try:
        j = json.loads(body)
    except ValueError:
        j = None
    check("a 100 KB header -> 431 with a JSON error body", st_ == 431 and "application/json" in head and
          isinstance(j, dict) and "message" in j.get("error", {}), f"{st_} {head[:100]!r} {body[:100]!r}")
    st_, _ = s.request("GET", "/health")
    check("serving on after it", st_ == 200)
    s.stop()


def main():
    model = os.path.join(TMP, "serve-tiny.gguf")
    subprocess.run([HEARTH, "gen", "--preset", "tiny", "--quant", "q4_k_m", "--seed", "1", "-o", model], check=True,
                   capture_output=True)
    only = os.environ.get("HOSTILE_ONLY", "")
    s = Server(model, "-np", "2")
    if not only or "bodies" in only:
        bodies(s, model)
    s.stop()
    for name, fn in (("busy_slot", busy_slot), ("ignore_eos", ignore_eos), ("scripted", scripted),
                     ("slots_save", slots_save), ("cache_reason", cache_reason),
                     ("idle_sockets", idle_sockets), ("long_generation", long_generation), ("json_errors", json_errors)):
        if not only or name in only:
            fn(model)
    return 1 if checks.summary() else 0


if __name__ == "__main__":
    sys.exit(main())
