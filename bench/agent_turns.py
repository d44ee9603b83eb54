#!/usr/bin/env python3
"""bench/agent_turns.py: hearth serve against llama-server on agent-shaped traffic: the sessions
of F13 item 3 (3a..3g), made deterministically from a seed (no downloads), sent the way an agent
sends them: each request is the whole history so far, max_tokens 1 (the cost measured is the
prompt's), temperature 0, the same chat template on both servers.

  agent  a coding-agent loop: four tools in OpenAI's `tools` field (read_file, write_file,
         run_shell, search; JSON-schema parameters), a system prompt, one user task, then per
         turn an assistant message (reasoning_content and one call in tool_calls) and a `tool`
         message carrying a long result (about 1.5-3k tokens of code, logs or search hits),
         until the prompt reaches about --target-tokens (default 40000: 16 tool turns, 17 requests, 41.7k tokens
         with Qwen3's tokenizer; 15000: 6 tool turns, 7 requests, 14.9k)
  chat   a chat with thinking: user and assistant turns, the assistant's carrying
         reasoning_content (Qwen's template drops the <think> blocks before the last user
         message), about 12 turns to --chat-tokens (default 6000)
  edit   (F13 3d) the agent loop to half its turns, then the user's task (the second message)
         edited, as a client that lets its user edit and resend does, and the loop goes on from
         the edited history
  billing (F13 3g) the agent loop as Claude Code sends it: POST /v1/messages (thinking and
         tool_use blocks, tool_result blocks), the system prompt's first block the
         x-anthropic-billing-header line, its cch= hash new in every request
  interleave (F13 3c) --conversations (4) agent loops, each its own seed and workspace, sent
         round-robin one request at a time (A's turn 0, B's, C's, D's, A's turn 1, ...) to both
         servers run with -np --slots (default 2)
  restart (F13 3e) the agent loop, the server stopped (SIGTERM) and started again before request
         --restart-after (default: half of them), both on -np 1: hearth with --cache-dir DIR (the
         same folder again); llama-server with --slot-save-path DIR, this script saving slot 0
         after every request (POST /slots/0?action=save, one file per conversation; save_ms, in no
         wall) and restoring it before the first request after the restart (?action=restore; its
         wall in restore_ms and in that request's wall_ms). The restart is not timed; the
         scenario's totals count the requests after it
  subagents (F13 3f) --subagents (8) conversations on -np --slots (default --subagents) sharing
         one system prompt of about --shared-tokens (10000, the session number at its head) and the
         tool list, each its own task and then tool steps (300-1200-token results), --subagent-turns
         (4) requests each; one thread per sub-agent, all started together, each sending its next
         request when its answer came

--trace takes one name, several joined by commas, both (agent,chat) or all (the seven, 3a..3g).
Where a scenario names its slots, the script sets -np on both commands (replacing the one given)
and restarts the servers for it; llama-server's -c is then multiplied by the slots over the -np
given, as there -c is the KV of all slots (unless --kv-unified) while hearth's is each slot's, so
a slot keeps the context the commands gave it. Give both commands --cache-ram.

Per turn and server it records timings.prompt_n (rows prefilled), timings.cache_n and
usage.prompt_tokens_details.cached_tokens (rows resumed), timings.prompt_ms and the wall time of
the request seen by this client. Repetitions interleave the servers (hearth rep 0, llama rep 0,
hearth rep 1, ...); rep 0 is a warm-up and dropped; each rep is a new conversation (its own
workspace/session id at the head of the prompt, so nothing carries between reps) or, with
--fresh server, a new server process. Medians over the measured reps with (min..max) beside
them; totals per trace; the ratio hearth/llama of total wall time (per rep, paired).

Servers: --hearth-cmd / --llama-cmd are command lines started by this script ("{port}" is
replaced by a free port, else `--port N` is appended), waited for on /health and stopped with
SIGTERM; or --hearth-url / --llama-url for servers already running (then neither --fresh server
nor the restart trace is possible, and interleave and subagents run on the servers' own slots).
Either side may be left out (then only the other is measured). Example:

  bench/agent_turns.py --trace all --reps 2 --target-tokens 15000 --out /tmp/at \\
    --hearth-cmd "build/hearth serve -m /tmp/small.gguf -c 32768 -np 1 -t 2 --device cpu \\
                  --cache-ram 8192 --chat-template-file tests/fixtures/templates/Qwen3.5-4B.jinja --port {port}" \\
    --llama-cmd "$(tools/peer/path.sh)/llama-server -m /tmp/small.gguf -c 32768 -np 1 -t 2 --jinja \\
                  --cache-ram 8192 --chat-template-file tests/fixtures/templates/Qwen3.5-4B.jinja --port {port}"

Writes to --out: samples.tsv (one row per request), results.md (the conditions, a table per
scenario of rows prefilled (sum of timings.prompt_n), total time to first token (the sum of the
requests' wall times to the answer, max_tokens 1), p50 and p99 of the requests' wall times, hearth
beside llama-server with the ratio; then the per-request tables), hearth.log and llama.log (the
servers' output); the tables go to stdout too.
--deadline S stops starting new conversations after S seconds and still writes the tables.
--print-trace dumps the requests of one rep as JSON lines and exits (no server needed).
Python 3 standard library only."""
import argparse
import http.client
import json
import os
import random
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------------------------------------
# text makers: deterministic from a random.Random; sizes are in estimated tokens (characters
# divided by a per-kind ratio measured with Qwen3's tokenizer, see CPT)

CPT = {"code": 3.1, "log": 2.15, "hits": 3.1, "prose": 5.0}  # characters per token, estimated

NOUNS = ("slot request cache token offset length config parser state result index count handle stream queue "
         "worker session entry table buffer header body chunk point prefix span batch layer weight tensor "
         "vocab template message reply client server socket timeout limit budget shard replica file path "
         "digest checksum record frame window row column block group expert router gate norm scale").split()
VERBS = ("read write open close parse check find load store free init reset push pop grow trim split join "
         "copy move send recv match merge flush drain build render resolve apply update count emit").split()
TYPES = ("int", "size_t", "int64_t", "uint32_t", "const char *", "double", "bool", "float")
MODS = ("api", "sched", "http", "cache", "engine", "tokenizer", "chat", "answer", "request", "gguf", "quant",
        "arena", "state", "forward", "gdn", "attn", "moe", "matmul", "pool", "vocab", "jinja", "util")
DIRS = ("src/serve", "src/engine", "src/text", "src/format", "src/base", "tests/unit", "tests/cli", "tools")
WORDS = ("the a this that it we should check whether how why when then so because but and or not only "
         "also first next after before again still likely probably seems looks means function file test "
         "fails passes returns error value case path branch loop call caller callee change fix patch "
         "build output line count size buffer request cache slot state prompt token offset length limit "
         "handler parser config option flag default missing extra wrong right same different new old "
         "read write look see find compare confirm run rerun verify assume expect note remember plan").split()


def ident(r, parts=2):
    return "_".join(r.choice(VERBS if i == 0 else NOUNS) for i in range(parts))


def sentence(r, lo=8, hi=22):
    w = [r.choice(WORDS) for _ in range(r.randint(lo, hi))]
    if r.random() < 0.4:
        w.insert(r.randrange(len(w)), f"`{ident(r)}`")
    if r.random() < 0.2:
        w.insert(r.randrange(len(w)), f"{r.choice(DIRS)}/{r.choice(MODS)}.c:{r.randint(10, 900)}")
    s = " ".join(w)
    return s[0].upper() + s[1:] + r.choice(".....?:")


def prose(r, tokens):
    out, n = [], 0
    while n < tokens * CPT["prose"]:
        para = " ".join(sentence(r) for _ in range(r.randint(2, 5)))
        out.append(para)
        n += len(para) + 2
    return "\n\n".join(out)


def c_function(r):
    name = f"{r.choice(MODS)}_{ident(r)}"
    args = ", ".join(f"{r.choice(TYPES)} {r.choice(NOUNS)}{i}" for i in range(r.randint(1, 4)))
    lines = [f"/* {sentence(r, 6, 14)} */", f"static {r.choice(TYPES)} {name}({args}) {{"]
    depth = 1
    for _ in range(r.randint(6, 22)):
        ind = "    " * depth
        k = r.random()
        a, b = r.choice(NOUNS), r.choice(NOUNS)
        if k < 0.18 and depth < 3:
            lines.append(f"{ind}for (size_t i = 0; i < {a}->n_{b}; i++) {{")
            depth += 1
        elif k < 0.33 and depth < 3:
            lines.append(f"{ind}if ({a}->{b} {r.choice(['<', '>=', '==', '!='])} {r.randint(0, 4096)}) {{")
            depth += 1
        elif k < 0.43 and depth > 1:
            depth -= 1
            lines.append("    " * depth + "}")
        elif k < 0.55:
            lines.append(f"{ind}if ({ident(r)}({a}, {b}, &e) < 0) return herr_wrap(e, \"{name}: {a} {b}\");")
        elif k < 0.65:
            lines.append(f"{ind}// {sentence(r, 5, 12)}")
        else:
            lines.append(f"{ind}{a}->{b} = {ident(r)}({a}->{r.choice(NOUNS)}, {r.randint(1, 512)}) + {b}_{r.choice(NOUNS)};")
    while depth > 1:
        depth -= 1
        lines.append("    " * depth + "}")
    lines += [f"    return {r.choice(['0', '-1', 'n', 'rc', 'total'])};", "}", ""]
    return lines


def py_function(r):
    name = ident(r)
    lines = [f"def {name}({', '.join(r.choice(NOUNS) for _ in range(r.randint(1, 3)))}):",
             f'    """{sentence(r, 6, 16)}"""']
    for _ in range(r.randint(4, 14)):
        a, b = r.choice(NOUNS), r.choice(NOUNS)
        k = r.random()
        if k < 0.2:
            lines.append(f"    for {a} in {b}s:")
            lines.append(f"        {a}.{r.choice(VERBS)}({r.choice(NOUNS)}={r.randint(0, 99)})")
        elif k < 0.4:
            lines.append(f"    if {a}.{b} is None or len({a}.{b}) > {r.randint(8, 4096)}:")
            lines.append(f"        raise ValueError(f\"{name}: bad {b} {{{a}.{b}!r}}\")")
        else:
            lines.append(f"    {a} = {ident(r)}({b}, {r.choice(NOUNS)}[{r.randint(0, 7)}])")
    lines += [f"    return {r.choice(NOUNS)}", ""]
    return lines


def code_file(r, tokens, path):
    py = path.endswith(".py")
    lines = ([f'"""{path}: {sentence(r, 6, 14)}"""', "import os", "import sys", ""] if py else
             [f"/* {path}: {sentence(r, 6, 14)} */", '#include "base/herr.h"', "#include <stdint.h>",
              "#include <string.h>", ""])
    n = 0
    while n < tokens * CPT["code"]:
        for ln in (py_function(r) if py else c_function(r)):
            lines.append(ln)
            n += len(ln) + 8
    return "\n".join(f"{i + 1:6d}\t{ln}" for i, ln in enumerate(lines))  # like cat -n


def log_text(r, tokens):
    out, n = [], 0
    t = r.randint(0, 3600 * 10)
    while n < tokens * CPT["log"]:
        k = r.random()
        t += r.randint(0, 4)
        ts = f"2026-10-{r.randint(1, 28):02d}T{t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d}.{r.randint(0, 999):03d}Z"
        if k < 0.35:
            ln = (f"[{ts}] {r.choice(['INFO', 'INFO', 'DEBUG', 'WARN'])} {r.choice(MODS)}-{r.randint(0, 15)}: "
                  f"{r.choice(VERBS)} {r.choice(NOUNS)} id={r.getrandbits(32):08x} rows={r.randint(1, 65536)} "
                  f"in {r.uniform(0.01, 900):.2f} ms")
        elif k < 0.55:
            f = f"{r.choice(DIRS)}/{r.choice(MODS)}.c"
            ln = (f"{f}:{r.randint(1, 2000)}:{r.randint(1, 80)}: {r.choice(['warning', 'error', 'note'])}: "
                  f"{sentence(r, 4, 10)} [-W{r.choice(['unused-variable', 'shadow', 'sign-compare', 'format'])}]")
        elif k < 0.75:
            ln = (f"test_{ident(r)} ({r.choice(MODS)}) ... {r.choice(['ok', 'ok', 'ok', 'FAIL', 'skipped'])} "
                  f"({r.uniform(0, 3):.3f}s)")
        elif k < 0.85:
            ln = (f'  File "{r.choice(DIRS)}/{r.choice(MODS)}.py", line {r.randint(1, 900)}, in {ident(r)}\n'
                  f"    {r.choice(NOUNS)} = {ident(r)}({r.choice(NOUNS)})")
        else:
            ln = (f"cc -std=c11 -O2 -Wall -Wextra -Isrc -c -o build/obj/{r.choice(DIRS)}/{r.choice(MODS)}.o "
                  f"{r.choice(DIRS)}/{r.choice(MODS)}.c")
        out.append(ln)
        n += len(ln) + 1
    return "\n".join(out)


def search_hits(r, tokens, pattern):
    out, n = [], 0
    while n < tokens * CPT["hits"]:
        f = f"{r.choice(DIRS)}/{r.choice(MODS)}.{r.choice(['c', 'c', 'h', 'py'])}"
        for _ in range(r.randint(1, 6)):
            ln = (f"{f}:{r.randint(1, 3000)}:    {pattern}({r.choice(NOUNS)}, {r.choice(NOUNS)}->{r.choice(NOUNS)}, "
                  f"{r.randint(0, 64)});  // {sentence(r, 3, 9)}")
            out.append(ln)
            n += len(ln) + 1
    return "\n".join(out)


def schema(props, required):
    return {"type": "object", "properties": props, "required": required}


def agent_tools(ws):
    s = {"type": "string"}
    return [
        {"type": "function", "function": {
            "name": "read_file", "description": f"Read a text file of the workspace {ws}, with line numbers.",
            "parameters": schema({"path": dict(s, description="path relative to the workspace root"),
                                  "start_line": {"type": "integer", "description": "first line, 1-based"},
                                  "end_line": {"type": "integer", "description": "last line, inclusive"}}, ["path"])}},
        {"type": "function", "function": {
            "name": "write_file", "description": "Create or overwrite a file with the given content.",
            "parameters": schema({"path": dict(s, description="path relative to the workspace root"),
                                  "content": dict(s, description="the whole new content of the file")},
                                 ["path", "content"])}},
        {"type": "function", "function": {
            "name": "run_shell", "description": "Run a shell command in the workspace and return its output.",
            "parameters": schema({"command": dict(s, description="the command line, run by bash"),
                                  "timeout_s": {"type": "integer", "description": "seconds before it is killed"}},
                                 ["command"])}},
        {"type": "function", "function": {
            "name": "search", "description": "Search the workspace for a regular expression (ripgrep).",
            "parameters": schema({"pattern": dict(s, description="a regular expression"),
                                  "glob": dict(s, description="only files matching this glob"),
                                  "max_results": {"type": "integer"}}, ["pattern"])}},
    ]


def tool_turn(r, turn, lo=1500, hi=3000):
    """One step of the agent loop: the assistant's message (reasoning_content and one call of the
    tool the turn number picks) and the tool's result of about lo..hi tokens; and the estimated
    tokens the two add."""
    kind = ("read_file", "run_shell", "search", "read_file", "write_file", "run_shell")[(turn - 1) % 6]
    size = r.randint(lo, hi)
    path = f"{r.choice(DIRS)}/{r.choice(MODS)}.{r.choice(['c', 'c', 'c', 'py'])}"
    if kind == "read_file":
        args = {"path": path}
        result = code_file(r, size, path)
    elif kind == "run_shell":
        args = {"command": r.choice(["make -j8 test 2>&1 | tail -400", "tests/run serve 2>&1",
                                     f"build/hearth serve -m /tmp/m.gguf --port 0 2>&1 | head -300",
                                     "python3 tests/cli/serve_test.py -v 2>&1"]), "timeout_s": 600}
        result = log_text(r, size)
    elif kind == "search":
        pat = ident(r)
        args = {"pattern": pat, "glob": "*.{c,h,py}"}
        result = search_hits(r, size, pat)
    else:
        body = "\n".join(c_function(r) + c_function(r))
        args = {"path": path, "content": body}
        result = (f"wrote {len(body)} bytes to {path}\n$ make -j8 build/hearth && tests/run unit\n"
                  + log_text(r, size - len(body) / CPT["code"]))
    call_id = f"call_{turn:02d}{r.getrandbits(40):010x}"
    asst = {"role": "assistant", "content": "",
            "reasoning_content": prose(r, r.randint(60, 260)),
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": kind, "arguments": json.dumps(args)}}]}
    tool = {"role": "tool", "tool_call_id": call_id, "content": result}
    return asst, tool, (len(asst["reasoning_content"]) / CPT["prose"] + len(json.dumps(args)) / CPT["code"] + 40
                        + size)


def agent_trace(seed, session, target_tokens):
    """[(messages, tools)] per request: the history up to each tool result. The content depends
    on seed only; session (a number) is written into the workspace path at the head of the
    prompt (the first tool's description), so each rep is a new conversation of the same size."""
    r = random.Random(seed)
    ws = f"/srv/ws-{session:06d}"
    tools = agent_tools(ws)
    system = ("You are a coding agent working in a C11 repository. Work in small steps: read before you "
              "write, run the tests after each change, and report what you changed and why.\n\n"
              + prose(r, 260))
    user = (f"The server sometimes answers a resumed conversation more slowly than a cold one. Find why "
            f"`{ident(r)}` in {r.choice(DIRS)}/{r.choice(MODS)}.c prefills rows it could resume, fix it, and "
            f"add a test.\n\n" + prose(r, 120))
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    out = [[dict(m) for m in msgs]]
    est = (len(system) + len(user)) / CPT["prose"] + 700  # the tools block and the template's text
    turn = 0
    while est < target_tokens * 1.04:  # the estimate errs 2-3% high: the last prompt reaches the target
        turn += 1
        asst, tool, grow = tool_turn(r, turn)
        msgs += [asst, tool]
        out.append([dict(m) for m in msgs])
        est += grow
    return [(m, tools) for m in out]


def chat_trace(seed, session, target_tokens, turns=12):
    """[(messages, None)] per request: the history up to each user message. Each assistant turn
    carries reasoning_content (the template keeps it only after the last user message)."""
    r = random.Random(seed * 7919 + 1)
    per = max(60, int(target_tokens / turns * 0.92))  # the template's text and the system prompt besides
    system = f"Session {session:06d}. You are a patient assistant who explains systems software.\n\n" + prose(r, 120)
    msgs = [{"role": "system", "content": system}]
    out = []
    for _ in range(turns):
        msgs.append({"role": "user", "content": prose(r, int(per * r.uniform(0.25, 0.45)))})
        out.append([dict(m) for m in msgs])
        msgs.append({"role": "assistant", "content": prose(r, int(per * r.uniform(0.55, 0.75))),
                     "reasoning_content": prose(r, r.randint(80, 300))})
    return [(m, None) for m in out]


MESSAGES = "messages"  # a trace item (body, MESSAGES): a whole /v1/messages body, not chat messages


def edit_trace(seed, session, target_tokens):
    """the agent trace to half its turns, then the same turns again and on with the user's task
    (message 1) edited: the request after the edit diverges inside that message"""
    reqs = agent_trace(seed, session, target_tokens)
    k = max(1, len(reqs) // 2)
    out = reqs[:k]
    for msgs, tools in reqs[k - 1:]:
        m = [dict(x) for x in msgs]
        m[1]["content"] = m[1]["content"].replace("fix it, and add a test",
                                                  "fix it without changing the file format, and add a test", 1)
        out.append((m, tools))
    return out


def messages_body(msgs, tools, cch, max_tokens=1):
    """chat messages (a system prompt first; tool calls, tool results) and OpenAI tools as Claude
    Code's POST /v1/messages body: the billing line with hash cch as the system prompt's first block,
    thinking and tool_use blocks, tool_result blocks (tests/cli/scenarios_test.py sends these too)"""
    body = {"model": "m", "max_tokens": max_tokens, "temperature": 0, "stream": False,
            "system": [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.37.3a3; "
                                                f"cc_entrypoint=cli; cch={cch};"},
                       {"type": "text", "text": msgs[0]["content"]}],
            "tools": [{"name": x["function"]["name"], "description": x["function"]["description"],
                       "input_schema": x["function"]["parameters"]} for x in tools],
            "messages": []}
    for m in msgs[1:]:
        if m["role"] == "user":
            body["messages"].append({"role": "user", "content": m["content"]})
        elif m["role"] == "assistant":
            c = m["tool_calls"][0]
            body["messages"].append({"role": "assistant", "content": [
                {"type": "thinking", "thinking": m["reasoning_content"], "signature": ""},
                {"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                 "input": json.loads(c["function"]["arguments"])}]})
        else:
            body["messages"].append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}]})
    return body


def billing_trace(seed, session, target_tokens):
    """the agent trace as Anthropic's messages, Claude Code's billing line first in the system
    prompt with a hash that differs in every request"""
    return [(messages_body(msgs, tools, f"{(session * 1000 + t) * 2654435761 % 16 ** 5:05x}"), MESSAGES)
            for t, (msgs, tools) in enumerate(agent_trace(seed, session, target_tokens))]


def interleave_plan(a, session):
    """(F13 3c) --conversations agent loops (each its own seed and workspace), sent round-robin one
    request at a time: A's turn 0, B's, C's, D's, A's turn 1, ... A conversation that ends
    earlier drops out of the round."""
    convs = [agent_trace(a.seed * 7919 + 17 * k, session * 10 + k, a.target_tokens)
             for k in range(a.conversations)]
    steps = []
    for t in range(max(len(c) for c in convs)):
        for k, c in enumerate(convs):
            if t < len(c):
                steps.append({"label": f"{chr(65 + k)}{t:02d}", "conv": chr(65 + k), "msgs": c[t][0],
                              "tools": c[t][1], "phase": ""})
    return steps


def restart_plan(a, session):
    """(F13 3e) the agent loop; the server restarted before request --restart-after (default: half
    the requests). Requests before it are marked phase "before" (not in the scenario's totals)."""
    reqs = agent_trace(a.seed, session, a.target_tokens)
    k = min(max(1, a.restart_after or len(reqs) // 2), len(reqs) - 1) if len(reqs) > 1 else 1
    return [{"label": t, "conv": "A", "msgs": m, "tools": tl, "phase": "before" if t < k else "after",
             "restart": t == k} for t, (m, tl) in enumerate(reqs)]


def subagent_plans(a, session):
    """(F13 3f) --subagents conversations sharing one system prompt of about --shared-tokens (the
    session number at its head, then prose) and one tool list; each its own task and then
    --subagent-turns - 1 tool steps with results of 300-1200 tokens. [[step]] per sub-agent."""
    r = random.Random(a.seed * 104729 + 3)
    tools = agent_tools(f"/srv/ws-{session:06d}")
    system = (f"Session {session:06d}. You are one of {a.subagents} sub-agents of a coding agent in a C11 "
              f"repository; each works on its own task and reports back in a few lines.\n\n"
              + prose(r, max(100, a.shared_tokens - 700)))  # ~700: the tools block and the template's text
    plans = []
    for k in range(a.subagents):
        rk = random.Random(a.seed * 104729 + 1000 + k)
        user = (f"Sub-task {k + 1} of {a.subagents}: find every caller of `{ident(rk)}` in "
                f"{rk.choice(DIRS)}/{rk.choice(MODS)}.c and check its error paths.\n\n" + prose(rk, 80))
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        steps = [[dict(m) for m in msgs]]
        for turn in range(1, a.subagent_turns):
            asst, tool, _ = tool_turn(rk, turn, 300, 1200)
            msgs += [asst, tool]
            steps.append([dict(m) for m in msgs])
        conv = chr(65 + k) if k < 26 else f"S{k}"
        plans.append([{"label": f"{conv}{t:02d}", "conv": conv, "msgs": m, "tools": tools, "phase": ""}
                      for t, m in enumerate(steps)])
    return plans


TRACES = ("agent", "chat", "interleave", "edit", "restart", "subagents", "billing")  # F13 3a..3g in order


def make_trace(name, a, session):
    """[(messages, tools)] in send order (for subagents: the sub-agents' requests one after another)"""
    plan = make_plan(name, a, session)
    if name == "subagents":
        plan = [x for p in plan for x in p]
    return [(x["msgs"], x["tools"]) for x in plan]


def make_plan(name, a, session):
    """[step] in send order, a step {label, conv, msgs, tools, phase[, restart]}; for subagents
    [[step]] per sub-agent (sent concurrently)"""
    if name == "interleave":
        return interleave_plan(a, session)
    if name == "restart":
        return restart_plan(a, session)
    if name == "subagents":
        return subagent_plans(a, session)
    if name == "agent":
        reqs = agent_trace(a.seed, session, a.target_tokens)
    elif name == "edit":
        reqs = edit_trace(a.seed, session, a.target_tokens)
    elif name == "billing":
        reqs = billing_trace(a.seed, session, a.target_tokens)
    else:
        reqs = chat_trace(a.seed, session, a.chat_tokens, a.chat_turns)
    return [{"label": t, "conv": "", "msgs": m, "tools": tl, "phase": ""} for t, (m, tl) in enumerate(reqs)]


# ---------------------------------------------------------------------------------------------
# servers

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    def __init__(self, name, cmd, url, log_path, start_timeout):
        self.name, self.cmd, self.log_path, self.start_timeout = name, cmd, log_path, start_timeout
        self.base_cmd = cmd  # as given; self.cmd: the one running (a scenario's slots or folder set in it)
        self.proc = None
        if url:
            u = urllib.parse.urlparse(url)
            self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        else:
            self.host, self.port = "127.0.0.1", None

    def start(self):
        if not self.cmd:
            self.wait_health()
            return
        self.port = free_port()
        argv = shlex.split(self.cmd.replace("{port}", str(self.port)))
        if "{port}" not in self.cmd:
            argv += ["--port", str(self.port)]
        log = open(self.log_path, "ab")
        log.write(f"\n=== {time.strftime('%H:%M:%S')} start: {' '.join(argv)}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.wait_health()

    def use(self, cmd):
        """Have this command running: a server started with another (or none) is restarted."""
        if not self.base_cmd:
            self.wait_health()
            return
        if self.proc is not None and self.proc.poll() is None and cmd == self.cmd:
            return
        self.stop()
        self.cmd = cmd
        self.start()

    def wait_health(self):
        t0 = time.time()
        while time.time() - t0 < self.start_timeout:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before /health (see {self.log_path})")
            try:
                c = http.client.HTTPConnection(self.host, self.port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name}: no 200 from /health in {self.start_timeout} s")

    def metrics_to_log(self):
        """The server's /metrics (where it serves them: hearth with --metrics, llama-server with
        --metrics) appended to its log before it stops: the counters behind a run's times"""
        try:
            c = http.client.HTTPConnection(self.host, self.port, timeout=5)
            c.request("GET", "/metrics")
            resp = c.getresponse()
            body = resp.read()
            if resp.status == 200:
                with open(self.log_path, "ab") as log:
                    log.write(f"=== {time.strftime('%H:%M:%S')} /metrics before the stop\n".encode() + body)
        except OSError:
            pass

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.metrics_to_log()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def post(self, path, body, headers=None, timeout=1800):
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        data = json.dumps(body).encode()
        t0 = time.perf_counter()
        c.request("POST", path, body=data, headers=h)
        resp = c.getresponse()
        raw = resp.read()
        wall = (time.perf_counter() - t0) * 1000
        c.close()
        try:
            j = json.loads(raw)
        except ValueError:
            j = {"raw": raw[:400].decode("utf-8", "replace")}
        if resp.status != 200:
            raise RuntimeError(f"{self.name} {path}: HTTP {resp.status}: {json.dumps(j)[:600]}")
        return j, wall


def request_body(msgs, tools):
    b = {"messages": msgs, "max_tokens": 1, "temperature": 0, "cache_prompt": True, "stream": False}
    if tools:
        b["tools"] = tools
    return b


def get_opt(argv, names):
    val = None
    for i, x in enumerate(argv):
        if x in names and i + 1 < len(argv):
            val = argv[i + 1]
        for n in names:
            if x.startswith(n + "="):
                val = x[len(n) + 1:]
    return val


def set_opt(argv, names, value):
    """argv with every NAME VALUE / NAME=VALUE of names set to value, or names[0] VALUE appended"""
    found = False
    for i, x in enumerate(argv):
        if x in names and i + 1 < len(argv):
            argv[i + 1], found = str(value), True
        for n in names:
            if x.startswith(n + "="):
                argv[i], found = f"{n}={value}", True
    return argv if found else argv + [names[0], str(value)]


def scenario_slots(tr, a):
    """-np a scenario runs with; None: the command's own"""
    if tr == "interleave":
        return a.slots or 2
    if tr == "subagents":
        return a.slots or a.subagents
    if tr == "restart":
        return 1  # one conversation, and llama-server's save and restore name its slot 0
    return None


def scenario_cmd(srv, tr, a, folder=None):
    """srv's command for a scenario: -np set to its slots (llama-server's -c then scaled with it:
    there -c is the KV of all slots unless --kv-unified, in hearth the context of each, so each slot
    keeps the context the command gave it); for restart hearth's --cache-dir or llama-server's
    --slot-save-path set to folder."""
    if not srv.base_cmd:
        return None
    argv = shlex.split(srv.base_cmd)
    np_ = scenario_slots(tr, a)
    if np_:
        old = int(get_opt(argv, ("-np", "--parallel")) or 1)
        argv = set_opt(argv, ("-np", "--parallel"), np_)
        ctx = get_opt(argv, ("-c", "--ctx-size"))
        if srv.name == "llama" and ctx and int(ctx) > 0 and not {"-kvu", "--kv-unified"} & set(argv):
            argv = set_opt(argv, ("-c", "--ctx-size"), int(ctx) // max(1, old) * np_)
    if tr == "restart" and folder:
        argv = set_opt(argv, ("--cache-dir",) if srv.name == "hearth" else ("--slot-save-path",), folder)
    return shlex.join(argv).replace("'{port}'", "{port}")


def run_plan(tr, plan, srv, conv_id, a, emit):
    """Send one scenario's requests to srv; emit(step, result) per request. restart: srv stopped and
    started again (same command) before the step marked restart, not timed; llama-server saves its
    slot 0 after every request (filename per conversation, the wall in save_ms, not in wall_ms) and
    restores it before the first request after the restart (the restore's wall in restore_ms and
    added to that request's wall_ms: it is on that request's path). subagents: one thread per
    sub-agent, all started at once, each sending its requests back to back."""
    t_base = time.perf_counter()
    if tr == "subagents":
        lock = threading.Lock()
        out, errors = [], []
        gate = threading.Barrier(len(plan))

        def agent(steps):
            try:
                gate.wait()
                for st in steps:
                    t0 = (time.perf_counter() - t_base) * 1000
                    res = one_turn(srv, st["msgs"], st["tools"], f"{conv_id}-{st['conv']}")
                    with lock:
                        out.append((st, dict(res, t0_ms=round(t0, 1))))
            except Exception as e:  # noqa: BLE001 (raised again in the main thread)
                errors.append(e)
                gate.abort()

        threads = [threading.Thread(target=agent, args=(p,)) for p in plan]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            raise errors[0]
        order = {id(st): i for i, st in enumerate(x for p in plan for x in p)}
        for st, res in sorted(out, key=lambda x: order[id(x[0])]):
            emit(st, res)
        return
    fname = f"{conv_id}.bin"
    for st in plan:
        restore_ms, save_ms = "", ""
        if st.get("restart"):
            srv.stop()
            srv.start()
            if srv.name == "llama":
                _, restore_ms = srv.post("/slots/0?action=restore", {"filename": fname})
                restore_ms = round(restore_ms, 3)
        t0 = (time.perf_counter() - t_base) * 1000
        res = one_turn(srv, st["msgs"], st["tools"], f"{conv_id}-{st['conv']}" if st["conv"] else conv_id)
        if restore_ms != "":
            res["wall_ms"] = round(res["wall_ms"] + restore_ms, 3)
        if tr == "restart" and srv.name == "llama":
            _, save_ms = srv.post("/slots/0?action=save", {"filename": fname})
            save_ms = round(save_ms, 3)
        emit(st, dict(res, t0_ms=round(t0, 1), restore_ms=restore_ms, save_ms=save_ms))


def one_turn(srv, msgs, tools, conv):
    if tools == MESSAGES:  # Anthropic's usage: input_tokens are those not read from the cache
        j, wall = srv.post("/v1/messages", msgs, {"X-Session-Id": conv})
        u = j.get("usage") or {}
        if "timings" not in j and "input_tokens" in u:  # llama-server: no timings here, the usage says it
            j["timings"] = {"prompt_n": u["input_tokens"], "cache_n": u.get("cache_read_input_tokens", "")}
        u = {"prompt_tokens": u.get("input_tokens", 0) + u.get("cache_read_input_tokens", 0),
             "prompt_tokens_details": {"cached_tokens": u.get("cache_read_input_tokens", "")}}
    else:
        j, wall = srv.post("/v1/chat/completions", request_body(msgs, tools), {"X-Session-Id": conv})
        u = j.get("usage") or {}
    t = j.get("timings") or {}
    det = u.get("prompt_tokens_details") or {}
    return {"prompt_tokens": u.get("prompt_tokens", ""), "prompt_n": t.get("prompt_n", ""),
            "cache_n": t.get("cache_n", ""), "cached_tokens": det.get("cached_tokens", ""),
            "prompt_ms": t.get("prompt_ms", ""), "wall_ms": round(wall, 3),
            "predicted_n": t.get("predicted_n", ""), "queue_ms": t.get("queue_ms", ""),
            "cache_info": json.dumps(t.get("cache"))[:200] if "cache" in t else ""}


def template_check(servers, msgs, tools):
    """Both servers' rendering of one prompt (POST /apply-template): the same text or not."""
    texts = {}
    for s in servers:
        try:
            j, _ = s.post("/apply-template", request_body(msgs, tools))
            texts[s.name] = j.get("prompt", "")
        except Exception as e:  # noqa: BLE001 (reported, not fatal)
            texts[s.name] = None
            print(f"note: {s.name} /apply-template: {e}", file=sys.stderr)
    vals = [v for v in texts.values() if v is not None]
    if len(vals) < 2:
        return "not compared"
    a, b = vals[0], vals[1]
    if a == b:
        return f"identical ({len(a)} characters)"
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    return (f"DIFFERENT: {len(a)} vs {len(b)} characters, first difference at {i}: "
            f"{a[max(0, i - 40):i + 40]!r} vs {b[max(0, i - 40):i + 40]!r}")


# ---------------------------------------------------------------------------------------------
# tables

COLS = ["trace", "rep", "server", "turn", "messages", "prompt_tokens", "prompt_n", "cache_n", "cached_tokens",
        "prompt_ms", "wall_ms", "predicted_n", "queue_ms", "load1", "cache_info", "conv", "phase", "t0_ms", "restore_ms", "save_ms"]

SCENARIO = {"agent": "3a the append-only agent loop", "chat": "3b a chat with thinking",
            "interleave": "3c conversations interleaved round-robin on fewer slots",
            "edit": "3d an early message edited, then the conversation goes on",
            "restart": "3e the server restarted mid-session (totals: the requests after it)",
            "subagents": "3f sub-agents sharing one system prompt and tool list, sent concurrently",
            "billing": "3g Claude Code's requests, the billing line new each time"}


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def cell(vals, fmt="{:.0f}"):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    m = fmt.format(statistics.median(vals))
    lo, hi = fmt.format(min(vals)), fmt.format(max(vals))
    return m if lo == hi else f"{m} ({lo}..{hi})"


def tables(samples, trace, names):
    """The per-turn table of one trace (markdown lines) and notes."""
    rows = [s for s in samples if s["trace"] == trace and s["rep"] != 0]
    if not rows:
        return [], []
    turns = sorted({s["turn"] for s in rows})
    reps = {n: sorted({s["rep"] for s in rows if s["server"] == n}) for n in names}
    full = {n: [rp for rp in reps[n] if {s["turn"] for s in rows if s["server"] == n and s["rep"] == rp} == set(turns)]
            for n in names}

    def get(n, t, key, rep=None):
        return [num(s[key]) for s in rows if s["server"] == n and s["turn"] == t and (rep is None or s["rep"] == rep)]

    hdr = "| turn | tokens in prompt |"
    sep = "|---:|---:|"
    for n in names:
        hdr += f" {n} prompt_n | {n} cache_n | {n} prompt ms | {n} wall ms | {n} outside ms |"
        sep += "---:|---:|---:|---:|---:|"
    if len(names) == 2:
        hdr += " wall ratio h/l |"
        sep += "---:|"
    lines, notes = [hdr, sep], []
    for t in turns:
        toks = {n: [v for v in get(n, t, "prompt_tokens") if v is not None] for n in names}
        tok_vals = sorted({int(v) for n in names for v in toks[n]})
        line = f"| {t} | {'/'.join(str(v) for v in tok_vals) or '-'} |"
        if len(tok_vals) > 1:
            notes.append(f"turn {t}: the servers' prompt_tokens differ: "
                         + ", ".join(f"{n} {sorted({int(v) for v in toks[n]})}" for n in names))
        for n in names:
            # outside: the turn's wall time less its pass (F11 item 2), paired per rep
            outside = [w - p for rp in reps[n] for w, p in zip(get(n, t, "wall_ms", rp), get(n, t, "prompt_ms", rp))
                       if w is not None and p is not None]
            line += (f" {cell(get(n, t, 'prompt_n'))} | {cell(get(n, t, 'cache_n'))} |"
                     f" {cell(get(n, t, 'prompt_ms'), '{:.1f}')} | {cell(get(n, t, 'wall_ms'), '{:.1f}')} |"
                     f" {cell(outside, '{:.1f}')} |")
        if len(names) == 2:
            h, l_ = names
            q = []
            for rp in set(reps[h]) & set(reps[l_]):
                hw, lw = get(h, t, "wall_ms", rp), get(l_, t, "wall_ms", rp)
                if hw and lw and hw[0] and lw[0]:
                    q.append(hw[0] / lw[0])
            line += f" {cell(q, '{:.2f}')} |"
            hp = [v for v in get(h, t, "prompt_n") if v is not None]
            lp = [v for v in get(l_, t, "prompt_n") if v is not None]
            if hp and lp and statistics.median(hp) > statistics.median(lp):
                notes.append(f"turn {t}: {h} prefilled more rows than {l_} "
                             f"({statistics.median(hp):.0f} against {statistics.median(lp):.0f})")
        lines.append(line)
    # totals: per rep, the sums over the turns of complete reps
    line = "| total | |"
    tot = {}
    for n in names:
        tot[n] = {}
        for rp in full[n]:
            tot[n][rp] = {k: sum(v for v in (num(s[k]) for s in rows if s["server"] == n and s["rep"] == rp) if v)
                          for k in ("prompt_n", "cache_n", "prompt_ms", "wall_ms")}
            tot[n][rp]["outside"] = tot[n][rp]["wall_ms"] - tot[n][rp]["prompt_ms"]
        line += "".join(f" {cell([tot[n][rp][k] for rp in tot[n]], f)} |" for k, f in
                        (("prompt_n", "{:.0f}"), ("cache_n", "{:.0f}"), ("prompt_ms", "{:.0f}"), ("wall_ms", "{:.0f}"),
                         ("outside", "{:.0f}")))
    if len(names) == 2:
        h, l_ = names
        q = [tot[h][rp]["wall_ms"] / tot[l_][rp]["wall_ms"] for rp in set(tot[h]) & set(tot[l_]) if tot[l_][rp]["wall_ms"]]
        line += f" **{cell(q, '{:.3f}')}** |"
    lines.append(line)
    notes.append("measured reps (complete): " + ", ".join(f"{n} {full[n]}" for n in names))
    return lines, notes


def quantile(vals, q):
    """linear between the closest ranks (numpy's default); p99 of fewer than 100 values leans on the largest"""
    v = sorted(vals)
    if not v:
        return None
    x = q * (len(v) - 1)
    i = int(x)
    return v[i] if i + 1 >= len(v) else v[i] + (v[i + 1] - v[i]) * (x - i)


def summary(samples, traces, names):
    """One row per scenario: rows prefilled (sum of prompt_n), total time to first token (sum of
    the requests' wall_ms: max_tokens 1, so the answer is the first token), p50 and p99 of the
    requests' wall_ms; each the median over the measured reps with (min..max), and the ratio
    hearth/llama paired per rep. restart counts only the requests after the restart."""
    keys = (("prompt_n", "rows prefilled", "{:.0f}"), ("ttft", "TTFT total ms", "{:.0f}"),
            ("p50", "TTFT p50 ms", "{:.1f}"), ("p99", "TTFT p99 ms", "{:.1f}"))
    hdr, sep = "| scenario | requests |", "|---|---:|"
    for _, title, _ in keys:
        for n in names:
            hdr += f" {n} {title} |"
            sep += "---:|"
        if len(names) == 2:
            hdr += " h/l |"
            sep += "---:|"
    lines = [hdr, sep]
    for tr in traces:
        rows = [x for x in samples if x["trace"] == tr and x["rep"] != 0 and x["phase"] != "before"]
        if not rows:
            continue
        want = max(len([x for x in rows if x["server"] == n and x["rep"] == rp]) for n in names
                   for rp in {x["rep"] for x in rows})
        per = {n: {} for n in names}
        for n in names:
            for rp in sorted({x["rep"] for x in rows if x["server"] == n}):
                rr = [x for x in rows if x["server"] == n and x["rep"] == rp]
                if len(rr) != want:  # an incomplete rep (deadline, error) is left out
                    continue
                w = [x["wall_ms"] for x in rr]
                pn = [num(x["prompt_n"]) for x in rr]
                per[n][rp] = {"prompt_n": None if None in pn else sum(pn), "ttft": sum(w),
                              "p50": quantile(w, 0.5), "p99": quantile(w, 0.99)}
        line = f"| {tr} | {want} |"
        for k, _, fmt in keys:
            for n in names:
                line += f" {cell([v[k] for v in per[n].values()], fmt)} |"
            if len(names) == 2:
                h, l_ = names
                q = [per[h][rp][k] / per[l_][rp][k] for rp in set(per[h]) & set(per[l_])
                     if per[l_][rp][k] and per[h][rp][k] is not None]
                line += f" **{cell(q, '{:.2f}')}** |"
        lines.append(line)
    return lines


def scenario_notes(samples, tr, names):
    """lines above a scenario's per-request table: what its labels mean and what is not in its totals"""
    rows = [x for x in samples if x["trace"] == tr and x["rep"] != 0]
    out = []
    if tr == "interleave":
        out.append("Sent one at a time in the order A00, B00, C00, D00, A01, ...; the table lists each "
                   "conversation's requests together (a letter: the conversation, the number: its request).")
    elif tr == "restart":
        after = sorted({x["turn"] for x in rows if x["phase"] == "after"})
        if after:
            out.append(f"The server restarted (not timed) before request {after[0]}; the per-scenario table counts "
                       f"requests {after[0]}..{after[-1]}, the total row below all of them.")
        for n in names:
            rs = [num(x["restore_ms"]) for x in rows if x["server"] == n and num(x["restore_ms"]) is not None]
            sv = [num(x["save_ms"]) for x in rows if x["server"] == n and num(x["save_ms"]) is not None]
            if rs or sv:
                out.append(f"{n}: /slots/0?action=restore {cell(rs, '{:.1f}')} ms (in the first request's wall); "
                           f"?action=save after every request {cell(sv, '{:.1f}')} ms each (not in any wall).")
    elif tr == "subagents":
        out.append("The sub-agents' requests sent concurrently (one thread each, started together, each "
                   "sending its next request when its answer came); a letter: the sub-agent, the number: its request.")
        for n in names:
            spans = []
            for rp in sorted({x["rep"] for x in rows if x["server"] == n}):
                rr = [x for x in rows if x["server"] == n and x["rep"] == rp and num(x["t0_ms"]) is not None]
                if rr:
                    spans.append(max(num(x["t0_ms"]) + x["wall_ms"] for x in rr))
            if spans:
                out.append(f"{n}: first request sent to last answer {cell(spans)} ms.")
    return out + ([""] if out else [])


def binary_version(cmd):
    """The first lines of `BINARY --version` (hearth: its version and commit; llama-server: its
    build), for the conditions."""
    try:
        p = subprocess.run([shlex.split(cmd)[0], "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return ""
    lines = [ln.strip() for ln in (p.stdout + p.stderr).splitlines()
             if ln.strip() and ("version" in ln.lower() or "commit" in ln.lower() or "hearth" in ln.lower())]
    return "; ".join(lines[:2])[:200]


def git_head():
    try:
        return subprocess.run(["git", "-C", ROOT, "log", "-1", "--format=%h %cd", "--date=short"],
                              capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hearth-cmd", help="command line starting hearth serve ({port}: the port)")
    ap.add_argument("--llama-cmd", help="command line starting llama-server ({port}: the port)")
    ap.add_argument("--hearth-url", help="a hearth serve already running, e.g. http://127.0.0.1:8080")
    ap.add_argument("--llama-url", help="a llama-server already running")
    ap.add_argument("--reps", type=int, default=2, help="measured reps per server, after the dropped rep 0 (default 2)")
    ap.add_argument("--trace", default="both",
                    help=f"{', '.join(TRACES)}, or several joined by commas; both: agent and chat; "
                         f"all: the seven, in F13 3a..3g's order")
    ap.add_argument("--target-tokens", type=int, default=40000, help="agent trace: prompt tokens at its end (estimated)")
    ap.add_argument("--chat-tokens", type=int, default=6000, help="chat trace: prompt tokens at its end (estimated)")
    ap.add_argument("--chat-turns", type=int, default=12)
    ap.add_argument("--conversations", type=int, default=4, help="interleave: agent loops sent round-robin (default 4)")
    ap.add_argument("--slots", type=int, default=0,
                    help="-np of interleave and subagents (default: 2 and --subagents); set on both servers' commands")
    ap.add_argument("--restart-after", type=int, default=0,
                    help="restart: the request before which the server restarts (default: half the requests)")
    ap.add_argument("--subagents", type=int, default=8, help="subagents: conversations sent concurrently (default 8)")
    ap.add_argument("--subagent-turns", type=int, default=4, help="subagents: requests of each (default 4)")
    ap.add_argument("--shared-tokens", type=int, default=10000,
                    help="subagents: the shared system prompt and tool list, tokens (estimated; default 10000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fresh", choices=("conversation", "server"), default="conversation",
                    help="what makes each rep cold: a new conversation (default) or a new server process")
    ap.add_argument("--out", default="/tmp/agent_turns")
    ap.add_argument("--deadline", type=float, default=0, help="seconds: start no conversation after this (0: none)")
    ap.add_argument("--start-timeout", type=float, default=900)
    ap.add_argument("--label", default="", help="a line of conditions written above the tables")
    ap.add_argument("--print-trace", action="store_true", help="print rep 1's requests as JSON lines and exit")
    a = ap.parse_args()
    traces = ["agent", "chat"] if a.trace == "both" else list(TRACES) if a.trace == "all" else a.trace.split(",")
    if any(t not in TRACES for t in traces):
        ap.error(f"--trace: {a.trace!r}: name one or more of {', '.join(TRACES)} (or both, all)")

    if a.print_trace:
        for tr in traces:
            for t, (msgs, tools) in enumerate(make_trace(tr, a, 1)):
                print(json.dumps({"trace": tr, "turn": t, **(msgs if tools == MESSAGES else request_body(msgs, tools))}))
        return 0

    os.makedirs(a.out, exist_ok=True)
    servers = []
    if a.hearth_cmd or a.hearth_url:
        servers.append(Server("hearth", a.hearth_cmd, a.hearth_url, os.path.join(a.out, "hearth.log"), a.start_timeout))
    if a.llama_cmd or a.llama_url:
        servers.append(Server("llama", a.llama_cmd, a.llama_url, os.path.join(a.out, "llama.log"), a.start_timeout))
    if not servers:
        ap.error("give --hearth-cmd/--hearth-url and/or --llama-cmd/--llama-url")
    if a.fresh == "server" and any(not s.cmd for s in servers):
        ap.error("--fresh server needs --hearth-cmd/--llama-cmd (servers this script starts)")
    if "restart" in traces and any(not s.cmd for s in servers):
        ap.error("the restart trace needs --hearth-cmd/--llama-cmd (servers this script starts and restarts)")
    names = [s.name for s in servers]
    no_cram = [s.name for s in servers if s.cmd and not {"-cram", "--cache-ram"} & {x.split("=")[0] for x in shlex.split(s.cmd)}]
    if no_cram:  # F13 3 compares the servers with a prompt cache in RAM on both
        print(f"note: no --cache-ram in the command of {', '.join(no_cram)}: its default applies", file=sys.stderr)
    versions = {s.name: binary_version(s.cmd) for s in servers if s.cmd}

    class Stopped(Exception):
        pass

    def on_term(*_):  # timeout(1)'s SIGTERM: stop here, still write the tables of what was measured
        raise Stopped("SIGTERM")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    t_start = time.time()
    samples = []
    tsv_path = os.path.join(a.out, "samples.tsv")
    tsv = open(tsv_path, "w")
    tsv.write("\t".join(COLS) + "\n")
    checks = {}
    cmds = {}  # (trace, server): the command a scenario ran with, where it differs from the one given
    loads = []
    stopped_early = ""
    try:
        for s in servers:
            t0 = time.time()
            s.use(s.base_cmd)
            print(f"{s.name}: up in {time.time() - t0:.1f} s on port {s.port}", flush=True)
        for tr in traces:  # the template checked once per trace, on the servers as given
            last = make_trace(tr, a, 0)[-1]
            if len(servers) == 2 and last[1] != MESSAGES:
                checks[tr] = template_check(servers, *last)
                print(f"{tr}: the last prompt rendered by both servers: {checks[tr]}", flush=True)
        if a.fresh == "server":
            for s in servers:
                s.stop()
        for tr in traces:
            for rep in range(a.reps + 1):
                if a.deadline and time.time() - t_start > a.deadline:
                    stopped_early = f"the deadline ({a.deadline:.0f} s) stopped {tr} before rep {rep}"
                    print(stopped_early, flush=True)
                    break
                for s in servers:
                    # each (trace, rep, server) its own session: nothing resumes across reps or servers
                    session = (1 + TRACES.index(tr)) * 100000 + rep * 10 + names.index(s.name)
                    plan = make_plan(tr, a, session)
                    folder = None
                    if tr == "restart":  # a new folder per rep, removed after it
                        folder = os.path.abspath(os.path.join(a.out, f"restart-{s.name}-{rep}"))
                        shutil.rmtree(folder, ignore_errors=True)
                        os.makedirs(folder)
                    cmd = scenario_cmd(s, tr, a, folder)
                    if s.base_cmd:
                        cmds.setdefault((tr, s.name), cmd)
                    s.use(cmd)
                    t0 = time.time()
                    load1 = round(os.getloadavg()[0], 2)  # the box's load as this conversation starts
                    loads.append(load1)

                    def emit(st, res):
                        row = {"trace": tr, "rep": rep, "server": s.name, "turn": st["label"], "conv": st["conv"],
                               "phase": st["phase"], "messages": len(st["msgs"]["messages"] if st["tools"] == MESSAGES
                                                                     else st["msgs"]), **res, "load1": load1}
                        samples.append(row)
                        tsv.write("\t".join(str(row.get(c, "")) for c in COLS) + "\n")
                        tsv.flush()

                    run_plan(tr, plan, s, f"{tr}-{session}", a, emit)
                    span = time.time() - t0
                    if a.fresh == "server" or tr == "restart":
                        s.stop()
                    if folder:
                        shutil.rmtree(folder, ignore_errors=True)
                    last = [x for x in samples if x["trace"] == tr and x["rep"] == rep and x["server"] == s.name]
                    print(f"{tr} rep {rep} {s.name}: {len(last)} requests, {last[-1]['prompt_tokens']} tokens in the last, "
                          f"prefilled {sum(num(x['prompt_n']) or 0 for x in last):.0f} rows, "
                          f"wall {sum(x['wall_ms'] for x in last) / 1000:.2f} s summed, {span:.2f} s from first "
                          f"to last (load {load1} at its start)", flush=True)
    except Stopped:
        stopped_early = "stopped by SIGTERM"
        print(stopped_early, file=sys.stderr, flush=True)
    except Exception as e:  # noqa: BLE001 (the tables of what was measured still get written)
        stopped_early = f"stopped by an error: {e}"
        print(stopped_early, file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for s in servers:
            s.stop()
        tsv.close()

    md = [f"conditions: {a.label}" if a.label else "",
          f"checkout at {git_head()} (the binaries' own versions below); seed {a.seed}; reps measured {a.reps} (rep 0 dropped); fresh {a.fresh}; "
          f"started {time.strftime('%Y-%m-%d %H:%M', time.gmtime(t_start))} UTC, {time.time() - t_start:.0f} s"
          + (f"; load average {min(loads):.2f}..{max(loads):.2f} at the conversations' starts" if loads else ""),
          ""]
    for s in servers:
        md.append(f"- {s.name}: `{s.base_cmd or 'at ' + s.host + ':' + str(s.port)}`" + (f" ({versions[s.name]})" if versions.get(s.name) else ""))
    if no_cram:
        md.append(f"No --cache-ram given to {', '.join(no_cram)} (its default applied).")
    md.append("")
    md.append("#### per scenario (F13 3)")
    md.append("")
    md.append("rows prefilled: the sum of timings.prompt_n; TTFT: each request's wall time to its answer "
              "(max_tokens 1, not streamed: the answer is the first token), total the sum over the requests; "
              "each the median over the measured reps (min..max); h/l: hearth over llama-server, paired per rep. "
              "restart: the requests after the restart only, llama-server's restore on the first one's path.")
    md.append("")
    md += summary(samples, traces, names)
    md.append("")
    for tr in traces:
        lines, notes = tables(samples, tr, names)
        size = (f"--chat-tokens {a.chat_tokens}, {a.chat_turns} turns" if tr == "chat" else
                f"{a.conversations} conversations of --target-tokens {a.target_tokens}" if tr == "interleave" else
                f"{a.subagents} sub-agents, {a.subagent_turns} requests each, --shared-tokens {a.shared_tokens}"
                if tr == "subagents" else f"--target-tokens {a.target_tokens}")
        md.append(f"#### trace {tr}: {SCENARIO[tr]} ({size})")
        md.append("")
        for n in names:
            if cmds.get((tr, n)) and cmds[(tr, n)] != next(x.base_cmd for x in servers if x.name == n):
                md.append(f"{n} ran as `{cmds[(tr, n)]}`" + (" (the folder new each rep)" if tr == "restart" else "") + ".")
                md.append("")
        md += scenario_notes(samples, tr, names)
        if tr in checks:
            md.append(f"The last prompt as both servers render it (/apply-template): {checks[tr]}.")
            md.append("")
        md += lines or ["(no complete measured rep)"]
        md.append("")
        md += [f"- {n}" for n in notes]
        md.append("")
    if stopped_early:
        md.append(f"Note: {stopped_early}.")
    text = "\n".join(md).strip() + "\n"
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(text)
    print(text)
    return 1 if stopped_early.startswith("stopped by an error") else 0


if __name__ == "__main__":
    sys.exit(main())
