#!/usr/bin/env python3
"""bench/chat_turns.py: an 8-turn chat with a growing context (a system prompt, a tool, thinking
on), sent turn by turn to hearth serve with its prompt cache, to hearth serve with the cache
off (cache_prompt: false), and to llama.cpp's llama-server (its default checkpoints), all on
the same file and the same turns. The assistant turns are fixed text (not each server's own
reply), so all three see the same prompts. Each server runs alone on the box while it is
measured: per turn the three requests go one after another, and whole conversations are
repeated (each repetition with its own system prompt, so it starts cold).

Per turn it reports the prompt tokens, the tokens each server prefilled, and the prompt time
(each server's own timings.prompt_ms, medians over the repetitions), and hearth's prompt time
against the time to prefill only the rows it prefilled with no cache machinery: a second
server given the context's ids, then the whole prompt as a /completion, which resumes from
the point at that context's last row (a message start) and prefills exactly those rows (the
goal: <= 1.1). That second
request is sent after the other servers' turns, as hearth's cached turn is; the same rows
right after their own context (a process that just ran a pass) are reported beside it.

usage: bench/chat_turns.py -m FILE [-r REPS] [-t THREADS] [--turns 8] [--gen 16] [--log FILE]
Needs build/hearth and tools/peer/build.sh's llama-server."""
import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    def __init__(self, argv, port, log):
        self.port = port
        self.p = subprocess.Popen(argv, stdout=log, stderr=log)
        for _ in range(600):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            if self.p.poll() is not None:
                raise RuntimeError(f"{argv[0]} exited with {self.p.returncode}")
            time.sleep(0.1)
        raise RuntimeError(f"{argv[0]} did not come up")

    def chat(self, body):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        j = json.loads(r.read())
        if r.status != 200:
            raise RuntimeError(f"{r.status}: {j}")
        return j

    def post(self, path, body):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        j = json.loads(r.read())
        if r.status != 200:
            raise RuntimeError(f"{path} {r.status}: {j}")
        return j

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()


WORDS = ("the hearth keeps a fire of oak and ash through the winter night while stones hold the heat "
         "and the family gathers near with bread and stories of the river the mill and the old road").split()


def text(seed, n):
    return " ".join(WORDS[(seed * 7 + i * 13) % len(WORDS)] for i in range(n))


def conversation(rep, turns):
    system = f"Session {rep}. You are a careful assistant for a museum of domestic history. " + text(rep, 220)
    tools = [{"type": "function", "function": {"name": "lookup_exhibit", "description": "find an exhibit by name",
                                               "parameters": {"type": "object", "properties": {
                                                   "name": {"type": "string"}}, "required": ["name"]}}}]
    msgs = [{"role": "system", "content": system}]
    out = []
    for t in range(turns):
        msgs.append({"role": "user", "content": f"Question {t + 1}: " + text(rep * 31 + t, 60 + 10 * t)})
        out.append([dict(m) for m in msgs])
        msgs.append({"role": "assistant", "content": "Answer: " + text(rep * 17 + t, 80),
                     "reasoning_content": "thinking " + text(t, 40)})
    return tools, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", required=True)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--gen", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--log", default=None)
    a = ap.parse_args()
    peer = subprocess.run([os.path.join(ROOT, "tools/peer/path.sh")], capture_output=True, text=True).stdout.strip()
    llama = os.path.join(peer, "llama-server")
    log = open(a.log or tempfile.mktemp(suffix=".log"), "ab")
    hp, lp = free_port(), free_port()
    hearth = Server([os.path.join(ROOT, "build/hearth"), "serve", "-m", a.m, "--port", str(hp), "-np", "1", "-c",
                     str(a.ctx), "-t", str(a.t), "--device", "cpu"], hp, log)
    dp = free_port()  # a second hearth for the denominator, so the first keeps its own state
    denom = Server([os.path.join(ROOT, "build/hearth"), "serve", "-m", a.m, "--port", str(dp), "-np", "1", "-c",
                    str(a.ctx), "-t", str(a.t), "--device", "cpu"], dp, log)
    peer_s = Server([llama, "-m", a.m, "--port", str(lp), "-np", "1", "-c", str(a.ctx), "-t", str(a.t), "--jinja",
                     "-ctk", "f16", "-ctv", "f16"], lp, log)
    rows = {}  # turn -> lists
    t_start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load0 = os.getloadavg()
    try:
        for rep in range(a.r + 1):  # rep 0 is a warm-up, dropped
            tools, turns = conversation(rep, a.turns)
            for t, msgs in enumerate(turns):
                base = {"messages": msgs, "tools": tools, "max_tokens": a.gen, "temperature": 0,
                        "chat_template_kwargs": {"enable_thinking": True}}
                # the denominator: the same rows hearth prefilled, after the same context, with
                # no cache machinery, on a second hearth: the context's ids alone, then all of
                # them, resumed from the point at the context's end: its prompt time is those rows'. Its
                # context goes in before hearth's turn and the measured request after the other
                # servers' turns, so that, like hearth's cached turn, it runs after other
                # processes had the box (a request right after its own process's last pass runs
                # on warm threads and caches: the "right after" column, measured too)
                ids = hearth.post("/tokenize", {"content": hearth.post("/apply-template", base)["prompt"]})["tokens"]
                on = hearth.chat(base)
                cached = on["timings"]["cache_n"]

                def denom_context():
                    denom.post("/completion", {"prompt": ids[:cached], "n_predict": 1, "temperature": 0,
                                               "cache_prompt": False})

                def denom_rows():
                    live = denom.post("/completion", {"prompt": ids, "n_predict": 1, "temperature": 0})
                    assert live["timings"]["cache_n"] == cached, live["timings"]
                    return live["timings"]["prompt_ms"]

                if cached > 0:
                    denom_context()
                off = hearth.chat(dict(base, cache_prompt=False))
                ll = peer_s.chat(base)
                if cached > 0:
                    live_ms = denom_rows()
                    denom_context()
                    warm_ms = denom_rows()
                else:
                    live_ms = warm_ms = off["timings"]["prompt_ms"]
                if rep == 0:
                    continue
                r = rows.setdefault(t, {"n": [], "on_ms": [], "on_n": [], "off_ms": [], "ll_ms": [], "ll_n": [],
                                        "live_ms": [], "warm_ms": []})
                r["live_ms"].append(live_ms)
                r["warm_ms"].append(warm_ms)
                r["n"].append(on["usage"]["prompt_tokens"])
                r["on_ms"].append(on["timings"]["prompt_ms"])
                r["on_n"].append(on["timings"]["prompt_n"])
                r["off_ms"].append(off["timings"]["prompt_ms"])
                r["ll_ms"].append(ll["timings"]["prompt_ms"])
                r["ll_n"].append(ll["timings"]["prompt_n"])
    finally:
        hearth.stop()
        denom.stop()
        peer_s.stop()
    med = statistics.median
    print(f"Conditions: {os.cpu_count()} cores, load {load0[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; "
          f"started {t_start}; file `{a.m}` ({os.path.getsize(a.m)} bytes); -np 1 -c {a.ctx} -t {a.t}, KV f16 on both; "
          f"{a.r} repetitions after a dropped warm-up, medians (min..max); {a.gen} tokens generated per turn, greedy.")
    print()
    print("| turn | prompt tokens | new tokens | hearth prefilled | hearth ms (cache) | hearth ms (no cache) | "
          "llama-server prefilled | llama-server ms | prefill of those rows alone, ms | hearth / that | "
          "those rows right after their context, ms | hearth / that | hearth / llama-server |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    prev = 0
    for t in sorted(rows):
        r = rows[t]
        n = med(r["n"])
        new = n - prev if t else n
        ratios = [on / live for on, live in zip(r["on_ms"], r["live_ms"])]
        vs = [on / ll for on, ll in zip(r["on_ms"], r["ll_ms"])]
        warm = [on / w for on, w in zip(r["on_ms"], r["warm_ms"])]
        print(f"| {t + 1} | {n:.0f} | {new:.0f} | {med(r['on_n']):.0f} | {med(r['on_ms']):.1f} "
              f"({min(r['on_ms']):.1f}..{max(r['on_ms']):.1f}) | {med(r['off_ms']):.1f} | {med(r['ll_n']):.0f} | "
              f"{med(r['ll_ms']):.1f} ({min(r['ll_ms']):.1f}..{max(r['ll_ms']):.1f}) | {med(r['live_ms']):.1f} | "
              f"{med(ratios):.2f} ({min(ratios):.2f}..{max(ratios):.2f}) | {med(r['warm_ms']):.1f} | "
              f"{med(warm):.2f} ({min(warm):.2f}..{max(warm):.2f}) | {med(vs):.2f} ({min(vs):.2f}..{max(vs):.2f}) |")
        prev = n
    return 0


if __name__ == "__main__":
    sys.exit(main())
