#!/usr/bin/env python3
"""serve_share_test.py: a prefix shared by requests that arrive together is prefilled once
(F13 item 3f; run by tests/cli/serve.sh beside serve_test.py, whose Server it uses). On the
demo model: sub-agents that share one long system prompt, sent at once, on as many slots as
requests and on fewer. One request prefills the prefix, the others wait for its point at
their first differing message and resume there (timings: cache_n, prompt_n), and every
greedy answer and its log-probabilities equal a cold server's. A short shared prefix is not
waited for: each request prefills it. The same on a tiny f32 model (`hearth gen`): its
matrix products take the activations unrounded (the demo's q8_0 rounds them to 8-bit
blocks, which hides a last-bit change), so a leader's piece cut off its chunk grid, or a
follower resumed from a state that is not a cold pass's, shows in the log-probabilities.

Also here, the turns of prompts in flight (sched.c's prompt_turns): two long prompts that share
nothing, sent together on -np 2, are prefilled first come, first served, a pass's worth of rows a
step, so the first one's answer streams while the second is prefilled (under a round robin both
would end their prefill at the same step).

Prints one "ok"/"FAIL" line per check and "N passed, N failed" at the end."""
import json
import os
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checks  # noqa: E402
from serve_test import HEARTH, TMP, Server, check, metric  # noqa: E402

DEMO = os.environ.get("HEARTH_DEMO", "demo/hearth-demo-q8_0.gguf")
TASKS = ["Tell me a fortune.", "What does John 3:16 say?", "Who are you, and what do you know?",
         "Explain the jargon word kludge."]


def conversations(n_chars):
    """sub-agents' first requests: one long system prompt (the demo's held-out text's start),
    each its own task"""
    text = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../demo/heldout.txt"),
                encoding="utf-8").read()
    system = "You are one of four sub-agents. Read this first.\n" + text[:n_chars]
    return [[{"role": "system", "content": system}, {"role": "user", "content": t}] for t in TASKS]


def ask(srv, msgs, extra=None):
    body = {"messages": msgs, "max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 2, **(extra or {})}
    code, j = srv.post("/v1/chat/completions", body, timeout=120)
    assert code == 200, j
    return {"content": j["choices"][0]["message"]["content"], "logprobs": j["choices"][0]["logprobs"]["content"],
            "prompt_n": j["timings"]["prompt_n"], "cache_n": j["timings"]["cache_n"],
            "n": j["usage"]["prompt_tokens"], "why": j["timings"].get("cache")}


def at_once(srv, convs):
    """every conversation sent at the same moment, one thread each"""
    out = [None] * len(convs)
    go = threading.Barrier(len(convs))

    def one(k):
        go.wait()
        out[k] = ask(srv, convs[k])
    th = [threading.Thread(target=one, args=(k,)) for k in range(len(convs))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return out


def user_start(srv, msgs):
    """the row where the user's message begins in the rendered prompt: the first message start
    after the system prompt, where the sub-agents' prompts part"""
    _, t = srv.post("/apply-template", {"messages": msgs})
    _, ids = srv.post("/tokenize", {"content": t["prompt"]})
    _, im = srv.post("/tokenize", {"content": "<|im_start|>"})
    return [i for i, x in enumerate(ids["tokens"]) if x == im["tokens"][0]][1]


def cold_answers(model, convs):
    """each conversation as a cold server answers it (cache_prompt false: from row 0 on a
    cleared slot), and the row where the prompts part"""
    cold = Server(model, "-np", "1")
    got = [ask(cold, c, {"cache_prompt": False}) for c in convs]
    m = user_start(cold, convs[0])
    cold.stop()
    check(f"{os.path.basename(model)}: the cold answers started at row 0; the shared prefix is long ({m} rows)",
          all(c["cache_n"] == 0 for c in got) and m >= 512, f"{[c['why'] for c in got]}, {m}")
    return got, m


def shared(model, np_, convs, cold, m):
    name = f"{os.path.basename(model)} -np {np_}"
    srv = Server(model, "-np", str(np_), "--metrics")
    got = at_once(srv, convs)
    _, mt = srv.request("GET", "/metrics")
    srv.stop()
    rows = sum(g["prompt_n"] for g in got)
    want = m + sum(g["n"] - m for g in got)
    print(f"     {name}: prefix {m} rows; prompt rows {[g['prompt_n'] for g in got]} (sum {rows}, once: {want}, "
          f"each its own: {sum(g['n'] for g in got)}); cached {[g['cache_n'] for g in got]}")
    check(f"{name}, {len(convs)} sub-agents at once: the shared {m}-row prefix prefilled once "
          f"(prompt rows {rows} = prefix + each one's tail {want})", rows == want,
          "; ".join(str(g["why"]) for g in got))
    check(f"{name}: one request prefilled from row 0, the others resumed at the first message where they part",
          sorted(g["cache_n"] for g in got) == [0] + [m] * (len(got) - 1), str([g["cache_n"] for g in got]))
    if np_ >= len(convs):  # on fewer slots the later ones resume from a free slot's own point instead
        check(f"{name}: /metrics counts the waits and the point shared",
              metric(mt, "cache_flight_waits_total") >= 1 and metric(mt, "cache_flight_shares_total") >= 1,
              f"waits {metric(mt, 'cache_flight_waits_total')}, shares {metric(mt, 'cache_flight_shares_total')}")
    bad = [k for k in range(len(got)) if got[k]["content"] != cold[k]["content"] or
           got[k]["logprobs"] != cold[k]["logprobs"]]
    check(f"{name}: every answer and its log-probabilities equal a cold server's, bit for bit", not bad,
          "; ".join(f"{k}: {got[k]['content']!r} vs cold {cold[k]['content']!r}" for k in bad))


def short_prefix():
    """a shared prefix under the bound (a few chunks) is not waited for: each request prefills it"""
    convs = [[{"role": "system", "content": "You are terse."}, {"role": "user", "content": t}] for t in TASKS]
    srv = Server(DEMO, "-np", "4", "--metrics")
    got = at_once(srv, convs)
    _, mt = srv.request("GET", "/metrics")
    srv.stop()
    check("a short shared prefix (a system prompt of a few words): no request waits, each prefills its prompt",
          all(g["cache_n"] == 0 and g["prompt_n"] == g["n"] for g in got) and
          metric(mt, "cache_flight_waits_total") == 0, str([(g["cache_n"], g["prompt_n"], g["n"]) for g in got]))


def first_come(model):
    """two prompts of ~6 passes each (rows_per_pass 512 on the CPU), no prefix in common, sent
    together on -np 2, both answers streamed token by token. First come, first served: the
    first queued one's prefill takes the steps' rows until it ends, then the other's pieces run
    beside its decode rows, so by the other's first token it has streamed about one token a pass
    of the other's prompt. A round robin ends both prefills at the same step (~1 token). Which of
    the two came first is read from the streams (a thread may start late): a count of steps,
    not of time."""
    import http.client
    import time
    text = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../demo/heldout.txt"),
                encoding="utf-8").read()
    msgs = [[{"role": "user", "content": f"Reader {k}: " + text[k * 10000:(k + 1) * 10000]}] for k in range(2)]
    s = Server(model, "-np", "2", "-c", "4096")
    seen, lock = [], threading.Lock()

    def one(k):
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=300)
        c.request("POST", "/v1/chat/completions", body=json.dumps(
            {"messages": msgs[k], "max_tokens": 40, "temperature": 0, "ignore_eos": True, "stream": True}),
            headers={"Content-Type": "application/json"})
        for line in c.getresponse():
            line = line.decode().strip()
            ch = json.loads(line[6:])["choices"] if line.startswith("data: {") else []
            if ch and ch[0]["delta"].get("content"):
                with lock:
                    seen.append("ab"[k])
        c.close()
    th = [threading.Thread(target=one, args=(k,)) for k in range(2)]
    th[0].start()
    time.sleep(0.02)  # the second arrives inside the first's prefill
    th[1].start()
    for t in th:
        t.join()
    s.stop()
    first = seen[0] if seen else "?"
    other = "b" if first == "a" else "a"
    before = seen.index(other) if other in seen else -1
    check("two prompts in flight: the first queued is prefilled first, its answer streaming while the other's "
          "prefill runs (its tokens before the other's first)", before >= 4, f"{before} tokens of {first} before {other}'s "
          f"first ({''.join(seen[:16])})")


def main():
    if not os.path.exists(DEMO):
        print(f"SKIP serve_share_test: {DEMO} missing")
        print("0 passed, 0 failed")
        return 0
    convs = conversations(4000)
    cold, m = cold_answers(DEMO, convs)
    shared(DEMO, 4, convs, cold, m)
    shared(DEMO, 2, convs, cold, m)
    short_prefix()
    first_come(DEMO)
    tiny = os.path.join(TMP, "share-tiny-f32.gguf")
    subprocess.run([HEARTH, "gen", "--preset", "tiny", "--quant", "f32", "--seed", "1", "-o", tiny], check=True,
                   capture_output=True)
    convs = conversations(2500)
    cold, m = cold_answers(tiny, convs)
    shared(tiny, 4, convs, cold, m)
    return 1 if checks.summary() else 0


if __name__ == "__main__":
    sys.exit(main())
