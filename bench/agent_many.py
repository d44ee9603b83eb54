#!/usr/bin/env python3
"""bench/agent_many.py: many agent sessions at once on one server (F13 item 6): --sessions N
independent agent loops sent concurrently to a server run with -np --slots (default N), hearth
serve against llama-server. Done when hearth's aggregate throughput at 16 sessions on -np 16 is
>= 1.5x llama-server's at a p99 time to first token no worse.

Each session is its own conversation (agent_turns.py's agent loop, made from a seed: its own
system prompt and task, then per turn an assistant message with reasoning and one tool call and
a tool result of --result-lo..--result-hi tokens), --turns requests long, the history growing.
A session sends its next request as soon as its previous answer has arrived; all start together.
Every request streams (stream_options.include_usage), temperature 0, ignore_eos, max_tokens
--max-tokens (default 32), so each answer decodes exactly that many tokens beside the other
sessions' prompts. The answer is not written back: the next request carries the trace's own
assistant message (as agent_turns.py does), so both servers see the same prompts.

Per request: the time to first token (the first streamed event carrying text, reasoning or a
tool call; the end, if none did), the wall to the last event, timings.prompt_n (rows prefilled)
and cache_n, the answer's tokens (usage.completion_tokens). Per rep and server: the wall from the
first request sent to the last answer, rows prefilled and tokens decoded over that wall (prompt
tok/s and decode tok/s: both over the same wall, the server doing both at once), their sum
(total tok/s, the criterion's throughput), TTFT p50 and p99 (nearest rank, over every request
of the rep), and for hearth with --metrics the point buffers allocated on the passes' path
(/metrics point_allocs_total, F11) during the rep. Reps interleave the servers (hearth rep 0,
llama rep 0, hearth rep 1, ...); rep 0 is a warm-up and dropped; each rep's sessions are new
conversations (the rep's number in their workspace path at the prompt's head). Medians over the
measured reps, (min..max) beside them, and the ratio hearth/llama of total tok/s and of TTFT p99.

Servers as in agent_turns.py: --hearth-cmd / --llama-cmd started here ("{port}" replaced, -np set
to --slots, llama-server's -c scaled by it over the command's own -np unless --kv-unified: there
-c is all slots' KV, in hearth each slot's; so give both commands -np 1 and the context a slot
gets), or --hearth-url / --llama-url already running. Writes to --out: samples.tsv
(a row per request), reps.tsv (a row per rep and server), results.md (the conditions and the
table; also on stdout), hearth.log, llama.log. --deadline S: no new rep after S seconds.
Python 3 standard library only. Example (this 2-core box, the small preset):

  bench/agent_many.py --sessions 4 --turns 4 --reps 3 --result-lo 150 --result-hi 300 --out /tmp/am \\
    --hearth-cmd "build/hearth serve -m /tmp/small.gguf -c 8192 -np 1 -t 2 --device cpu --metrics \\
                  --chat-template-file tests/fixtures/templates/Qwen3.5-4B.jinja --port {port}" \\
    --llama-cmd "$(tools/peer/path.sh)/llama-server -m /tmp/small.gguf -c 8192 -np 1 -t 2 --jinja \\
                  --chat-template-file tests/fixtures/templates/Qwen3.5-4B.jinja --port {port}"
"""
import argparse
import http.client
import json
import os
import random
import shlex
import signal
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agent_turns as at  # noqa: E402 (the trace's text makers and the server runner)


def session_trace(seed, session, turns, lo, hi):
    """[(messages, tools)] of one session: its own system prompt and task (from seed), then
    turns - 1 tool steps with results of lo..hi tokens; session (rep and index) is written in the
    workspace path at the prompt's head, so no two sessions or reps share a prefix past the
    template's first rows"""
    r = random.Random(seed)
    tools = at.agent_tools(f"/srv/ws-{session:08d}")
    system = (f"You are coding agent {seed % 1000} of a team working in a C11 repository. Work in small "
              f"steps: read before you write, run the tests after each change.\n\n" + at.prose(r, 200))
    user = (f"Find why `{at.ident(r)}` in {r.choice(at.DIRS)}/{r.choice(at.MODS)}.c prefills rows it could "
            f"resume, fix it, and add a test.\n\n" + at.prose(r, 80))
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    out = [[dict(m) for m in msgs]]
    for turn in range(1, turns):
        asst, tool, _ = at.tool_turn(r, turn, lo, hi)
        msgs += [asst, tool]
        out.append([dict(m) for m in msgs])
    return [(m, tools) for m in out]


def stream_turn(srv, msgs, tools, max_tokens, timeout=1800):
    """one streamed request: (ttft_ms, wall_ms, prompt_n, cache_n, prompt_tokens, completion_tokens)"""
    body = {"messages": msgs, "tools": tools, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "cache_prompt": True, "stream": True, "stream_options": {"include_usage": True}}
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=timeout)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    resp = c.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"{srv.name}: HTTP {resp.status}: {resp.read()[:400]!r}")
    ttft, timings, usage = None, {}, {}
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        for ch in ev.get("choices") or []:
            d = ch.get("delta") or {}
            if ttft is None and (d.get("content") or d.get("reasoning_content") or d.get("tool_calls")):
                ttft = (time.perf_counter() - t0) * 1000
        timings = ev.get("timings") or timings
        usage = ev.get("usage") or usage
    wall = (time.perf_counter() - t0) * 1000
    c.close()
    det = usage.get("prompt_tokens_details") or {}
    return {"ttft_ms": round(ttft if ttft is not None else wall, 3), "ttft_text": int(ttft is not None),
            "wall_ms": round(wall, 3), "prompt_n": timings.get("prompt_n", ""),
            "cache_n": timings.get("cache_n", det.get("cached_tokens", "")),
            "prompt_tokens": usage.get("prompt_tokens", ""),
            "completion_tokens": usage.get("completion_tokens", timings.get("predicted_n", ""))}


def point_allocs(srv):
    """hearth's /metrics point_allocs_total, or None (no --metrics, or llama-server)"""
    try:
        c = http.client.HTTPConnection(srv.host, srv.port, timeout=10)
        c.request("GET", "/metrics")
        r = c.getresponse()
        text = r.read().decode()
        c.close()
        for ln in text.split("\n"):
            if ln.startswith("hearth:point_allocs_total "):
                return float(ln.split()[1])
    except OSError:
        pass
    return None


def run_rep(srv, a, rep):
    """every session of one rep at once; [(session, turn, result)] and the rep's wall (ms)"""
    plans = [session_trace(a.seed * 7919 + 17 * k, rep * 1000 + k, a.turns, a.result_lo, a.result_hi)
             for k in range(a.sessions)]
    out, errors, lock = [], [], threading.Lock()
    gate = threading.Barrier(a.sessions + 1)

    def session(k):
        try:
            gate.wait()
            for t, (msgs, tools) in enumerate(plans[k]):
                t0 = (time.perf_counter() - t_base) * 1000
                res = stream_turn(srv, msgs, tools, a.max_tokens)
                with lock:
                    out.append((k, t, dict(res, t0_ms=round(t0, 1))))
        except Exception as e:  # noqa: BLE001 (raised again below)
            errors.append(e)
            gate.abort()

    threads = [threading.Thread(target=session, args=(k,), daemon=True) for k in range(a.sessions)]
    for th in threads:
        th.start()
    t_base = time.perf_counter()
    gate.wait()
    for th in threads:
        th.join()
    wall = (time.perf_counter() - t_base) * 1000
    if errors:
        raise errors[0]
    return sorted(out, key=lambda x: (x[0], x[1])), wall


def pct(vals, p):
    """nearest-rank percentile"""
    v = sorted(vals)
    return v[max(0, min(len(v) - 1, int(-(-p * len(v) // 100)) - 1))] if v else None


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def rep_row(name, rep, res, wall_ms, allocs):
    pn = sum(num(r["prompt_n"]) or 0 for _, _, r in res)
    dn = sum(num(r["completion_tokens"]) or 0 for _, _, r in res)
    s = wall_ms / 1000
    tt = [r["ttft_ms"] for _, _, r in res]
    return {"rep": rep, "server": name, "requests": len(res), "wall_s": round(s, 3), "rows_prefilled": int(pn),
            "tokens_decoded": int(dn), "prompt_tok_s": round(pn / s, 2), "decode_tok_s": round(dn / s, 2),
            "total_tok_s": round((pn + dn) / s, 2), "ttft_p50_ms": round(pct(tt, 50), 1),
            "ttft_p99_ms": round(pct(tt, 99), 1), "ttft_no_text": sum(1 - r["ttft_text"] for _, _, r in res),
            "point_allocs": "" if allocs is None else int(allocs), "load1": round(os.getloadavg()[0], 2)}


REP_COLS = ["rep", "server", "requests", "wall_s", "rows_prefilled", "tokens_decoded", "prompt_tok_s", "decode_tok_s",
            "total_tok_s", "ttft_p50_ms", "ttft_p99_ms", "ttft_no_text", "point_allocs", "load1"]
SAMPLE_COLS = ["rep", "server", "session", "turn", "prompt_tokens", "prompt_n", "cache_n", "completion_tokens",
               "ttft_ms", "ttft_text", "wall_ms", "t0_ms"]


def cell(vals, fmt):
    vals = [v for v in vals if v is not None and v != ""]
    if not vals:
        return "-"
    m, lo, hi = fmt.format(statistics.median(vals)), fmt.format(min(vals)), fmt.format(max(vals))
    return m if lo == hi else f"{m} ({lo}..{hi})"


def results_md(a, reps, names, cmds):
    rows = [r for r in reps if r["rep"] != 0]
    head = ["# agent_many.py: concurrent agent sessions", "",
            f"- {a.label}" if a.label else "- (no --label)",
            f"- {a.sessions} sessions at once on -np {a.slots or a.sessions}, {a.turns} requests each (tool results "
            f"{a.result_lo}..{a.result_hi} tokens), max_tokens {a.max_tokens} (ignore_eos), temperature 0, streamed; "
            f"seed {a.seed}; reps {a.reps} (rep 0 dropped, servers interleaved)",
            f"- measured reps: {sorted({r['rep'] for r in rows})}; load average (1 min) at the reps' ends: "
            f"{', '.join(str(r['load1']) for r in reps)}"]
    for n in names:
        head.append(f"- {n}: `{cmds.get(n) or 'url'}`")
    cols = [("wall s", "wall_s", "{:.2f}"), ("rows prefilled", "rows_prefilled", "{:.0f}"),
            ("tokens decoded", "tokens_decoded", "{:.0f}"), ("prompt tok/s", "prompt_tok_s", "{:.1f}"),
            ("decode tok/s", "decode_tok_s", "{:.2f}"), ("total tok/s", "total_tok_s", "{:.1f}"),
            ("TTFT p50 ms", "ttft_p50_ms", "{:.0f}"), ("TTFT p99 ms", "ttft_p99_ms", "{:.0f}"),
            ("point allocs on the path", "point_allocs", "{:.0f}")]
    lines = head + ["", "| server | " + " | ".join(c[0] for c in cols) + " |", "|---|" + "---:|" * len(cols)]
    for n in names:
        rr = [r for r in rows if r["server"] == n]
        lines.append(f"| {n} | " + " | ".join(cell([r[k] for r in rr], f) for _, k, f in cols) + " |")
    if len(names) == 2:
        h, l_ = names
        q_tp, q_p99 = [], []
        for rep in sorted({r["rep"] for r in rows}):
            hr = [r for r in rows if r["server"] == h and r["rep"] == rep]
            lr = [r for r in rows if r["server"] == l_ and r["rep"] == rep]
            if hr and lr:
                q_tp.append(hr[0]["total_tok_s"] / lr[0]["total_tok_s"])
                q_p99.append(hr[0]["ttft_p99_ms"] / lr[0]["ttft_p99_ms"])
        lines += ["", f"- total tok/s {h}/{l_} (per rep, paired): {cell(q_tp, '{:.2f}')}; "
                      f"TTFT p99 {h}/{l_}: {cell(q_p99, '{:.2f}')}",
                  f"- F13 item 6's bar (total tok/s ratio >= 1.5 at a TTFT p99 ratio <= 1): "
                  + ("met" if q_tp and statistics.median(q_tp) >= 1.5 and statistics.median(q_p99) <= 1 else "not met")
                  + " at this scale (the bar is set for 16 sessions on the GPU)"]
    nt = sum(r["ttft_no_text"] for r in rows)
    if nt:
        lines.append(f"- {nt} answers streamed no text, reasoning or call before their end: their TTFT is their wall")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--slots", type=int, default=0, help="-np of both servers (default: --sessions)")
    ap.add_argument("--turns", type=int, default=8, help="requests per session")
    ap.add_argument("--result-lo", type=int, default=1500)
    ap.add_argument("--result-hi", type=int, default=3000)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3, help="reps per server, rep 0 dropped")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hearth-cmd")
    ap.add_argument("--llama-cmd")
    ap.add_argument("--hearth-url")
    ap.add_argument("--llama-url")
    ap.add_argument("--out", default="/tmp/agent_many")
    ap.add_argument("--label", default="")
    ap.add_argument("--start-timeout", type=float, default=120)
    ap.add_argument("--deadline", type=float, default=0, help="no new rep after this many seconds")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    # a timeout's SIGTERM (bench/device_agent.sh) ends the run through finally: the reps done
    # so far are written and the servers stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    servers, cmds = [], {}
    for name, cmd, url in (("hearth", a.hearth_cmd, a.hearth_url), ("llama", a.llama_cmd, a.llama_url)):
        if not (cmd or url):
            continue
        srv = at.Server(name, cmd, url, os.path.join(a.out, f"{name}.log"), a.start_timeout)
        if cmd:  # -np set to the slots; llama-server's -c scaled with it (agent_turns.scenario_cmd's rule)
            argv = shlex.split(cmd)
            old = int(at.get_opt(argv, ("-np", "--parallel")) or 1)
            np_ = a.slots or a.sessions
            argv = at.set_opt(argv, ("-np", "--parallel"), np_)
            ctx = at.get_opt(argv, ("-c", "--ctx-size"))
            if name == "llama" and ctx and int(ctx) > 0 and not {"-kvu", "--kv-unified"} & set(argv):
                argv = at.set_opt(argv, ("-c", "--ctx-size"), int(ctx) // max(1, old) * np_)
            srv.cmd = srv.base_cmd = shlex.join(argv).replace("'{port}'", "{port}")
            cmds[name] = srv.cmd
        servers.append(srv)
    if not servers:
        ap.error("give --hearth-cmd/--hearth-url and/or --llama-cmd/--llama-url")
    names = [s.name for s in servers]
    reps, t_start = [], time.time()
    sf = open(os.path.join(a.out, "samples.tsv"), "w")
    sf.write("\t".join(SAMPLE_COLS) + "\n")
    try:
        for rep in range(a.reps):
            if a.deadline and rep > 1 and time.time() - t_start > a.deadline:
                print(f"deadline: stopped before rep {rep}", file=sys.stderr)
                break
            for srv in servers:
                srv.use(srv.cmd)
                before = point_allocs(srv)
                res, wall = run_rep(srv, a, rep)
                after = point_allocs(srv)
                row = rep_row(srv.name, rep, res, wall, after - before if before is not None and after is not None
                              else None)
                reps.append(row)
                for k, t, r in res:
                    sf.write("\t".join(str(x) for x in [rep, srv.name, k, t, r["prompt_tokens"], r["prompt_n"],
                                                        r["cache_n"], r["completion_tokens"], r["ttft_ms"],
                                                        r["ttft_text"], r["wall_ms"], r["t0_ms"]]) + "\n")
                sf.flush()
                print(f"rep {rep} {srv.name}: " + ", ".join(f"{k} {row[k]}" for k in REP_COLS[2:]), file=sys.stderr)
    finally:
        sf.close()
        for srv in servers:
            srv.stop()
        with open(os.path.join(a.out, "reps.tsv"), "w") as f:
            f.write("\t".join(REP_COLS) + "\n")
            for r in reps:
                f.write("\t".join(str(r[c]) for c in REP_COLS) + "\n")
        md = results_md(a, reps, names, cmds)
        with open(os.path.join(a.out, "results.md"), "w") as f:
            f.write(md)
        print(md)


if __name__ == "__main__":
    main()
