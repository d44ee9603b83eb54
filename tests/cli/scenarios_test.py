#!/usr/bin/env python3
"""scenarios_test.py: F13's sessions (issue 32, item 3a-3g) played against warm servers on the
demo model with Qwen3.5's own template (tests/fixtures/templates/Qwen3.5-4B.jinja: tools, tool
results, thinking dropped from earlier turns), each turn's answer checked against a cold pass:

  a  the append-only agent loop (a tool, its calls and results; one result longer than a 512-row
     pass, so warm and cold cut their passes at other rows of the same chunk grid)
  b  a chat with thinking (bench/agent_turns.py's chat_trace): the template drops the earlier
     turns' thinking, so each turn diverges inside the last assistant message; then the chat's
     prompt as /completion text, which resumes from the chat's points
  c  four conversations interleaved round-robin on two slots (-np 2): every turn after the
     first resumes from the shared cache, its slot having served another conversation since.
     Two are chats with thinking; two agent loops with thinking off that write the model's own
     answers back, each followed by a tool's result: they resume at the answers' ends (F13 item
     1's point, made by a prefill of the answer while the other slot works)
  d  an edit of an early message (the user's task in a's conversation), then the edited
     conversation goes on
  e  a restart mid-session: the server of a, b and d ran with --cache-dir; a new one on the
     same folder resumes both of the earlier conversations from the files
  f  three sub-agents on -np 3 sharing one system prompt and tool list, sent at once, two
     requests each (their prompt passes and decode steps share engine calls); the shared prefix
     is prefilled once (one request from row 0, the others wait for its point)
  g  Claude Code's requests through /v1/messages, the first system block its
     x-anthropic-billing-header line with a cch= hash new in every request (dropped by default)
  h  (F13 item 2) conversations alternating on one slot with engine sequences to spare
     (--cache-gpu): a slot moving to another conversation parks its sequence, copying no row
     (/metrics: cache_rows_copied_total stays put), and the parked conversation's next turn
     takes its sequence over, writing no row either; then with one sequence to spare and three
     conversations, the parked ones are evicted (their rows copied to the host while the server
     idles) and resume from there. Every answer a cold pass's.

Each turn: greedy, a few tokens, with log-probabilities (the chosen token's log-softmax reads the
whole logits row, so one bit moved anywhere in it shows). The warm answer (message and
log-probabilities) must equal the cold one exactly, and the warm server must have resumed where
a point serves: cached_tokens equal to the last message start that the prompt shares with an
earlier prompt sent to that server, or with an earlier prompt and its answer and the template's
<|im_end|>\n (every message start of every prompt is a point, and the end of every answer,
kept in a slot, the shared cache or the files), so the test cannot pass by never using the cache.

The cold answers come from one server, -np 1, every request with cache_prompt false: no restore
and the sequence cleared, the same marks and so the same chunk grid as a fresh server's first
request. One check shows it: a late request's answer there equals a fresh server's.

(g) has no log-probabilities in Anthropic's API: its text and usage are compared with the cold
pass of the same prompt as a chat request (the messages read as hearth reads them; the prompt
sizes must agree, which also shows the billing line dropped), and after each /v1/messages turn
that chat request is sent to the warm server too: it resumes from the points the messages
request made and its log-probabilities must equal cold.

Red under planted defects (build/mut/hearth, HEARTH_MUTANT=...): copy_late and
restore_ring_skip in every scenario that resumes, neighbour_leak in f, close_decode in c (that
one in tests/gates/mutants: `scenarios_test.py c`); park_off (a slot never parks: its rows are
copied on the request's path) and park_reuse (an evicted parked sequence handed out with its rows
not copied) in h. Arguments: scenario letters to run (default
all). HEARTH_SERVE_EXTRA: flags every server gets (e.g. "--device cuda": the scenarios on the
CUDA engine, warm and cold both there; bench/device_f7.sh's scenarios step). Prints one
"ok"/"FAIL" line per check and "N passed, N failed" at the end."""
import os
import random
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tests", "cli"))
import agent_turns as at  # noqa: E402 (the traces' text makers and builders)
import serve_test  # noqa: E402 (its Server)
import checks  # noqa: E402
from checks import check  # noqa: E402

DEMO = os.environ.get("HEARTH_DEMO", "demo/hearth-demo-q8_0.gguf")
TEMPLATE = "tests/fixtures/templates/Qwen3.5-4B.jinja"
N_OUT = 3  # tokens per answer
LOOP_OUT = 60  # tokens per answer of 3c's loops that write their answers back
A_SIZES = [60, 480, 40, 40]  # 3a's tool results, estimated tokens: the second more than a pass's 512 rows


RUNNING = []  # servers started: stopped at the end whatever happened


EXTRA = os.environ.get("HEARTH_SERVE_EXTRA", "").split()


def server(*flags):
    # --answer-point-wait 0: every answer's closing pass starts as it ends and a next turn sent
    # at once waits for it, so the turns resume at the answers' ends whatever the box's speed
    # (the default wait, where a quick turn prefills the answer itself, is serve_test's)
    s = serve_test.Server(DEMO, "--chat-template-file", TEMPLATE, "--answer-point-wait", "0", *EXTRA, *flags)
    RUNNING.append(s)
    return s


def stop(s):
    if s in RUNNING:
        RUNNING.remove(s)
        s.stop()


# ---------------------------------------------------------------------------------------------
# traces: small and deterministic, made with bench/agent_turns.py's text makers

def short(text, chars):
    """text cut at a word boundary near chars"""
    return text if len(text) <= chars else text[:text.rfind(" ", 0, chars)] + "."


def agent_steps(seed, session, sizes):
    """an agent loop: a system prompt, a tool (run_shell: Qwen3.5's template writes ~550 tokens of
    tool instructions with it), the user's task, then per size an assistant message (reasoning
    and one call) and the tool's result, a log of about size estimated tokens (the demo's
    tokenizer makes ~1.3x as many). [(messages, tools)] per request: the history up to each result."""
    r = random.Random(seed)
    tools = [t for t in at.agent_tools(f"/srv/ws-{session:06d}") if t["function"]["name"] == "run_shell"]
    msgs = [{"role": "system", "content": "You are a coding agent in a C11 repository. Read before you write, run the "
                                          "tests after each change. " + short(at.prose(r, 40), 160)},
            {"role": "user", "content": f"Find why `{at.ident(r)}` prefills rows it could resume, fix it, and add a "
                                        f"test. " + short(at.prose(r, 40), 160)}]
    out = [[dict(m) for m in msgs]]
    for size in sizes:
        asst, tool, _ = at.tool_turn(r, 2, size, size)  # run_shell
        asst["reasoning_content"] = short(asst["reasoning_content"], 200)
        msgs += [asst, tool]
        out.append([dict(m) for m in msgs])
    return [(m, tools) for m in out]


def edited(msgs):
    """msgs with the user's task (message 1) edited, as a client that lets its user edit and resend"""
    m = [dict(x) for x in msgs]
    m[1]["content"] = m[1]["content"].replace("fix it, and add a test", "fix it without changing the file format, "
                                                                          "and add a test", 1)
    assert m[1]["content"] != msgs[1]["content"]
    return m


def chat_body(msgs, tools=None):
    b = {"messages": msgs, "max_tokens": N_OUT, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    if tools:
        b["tools"] = tools
    return b


# ---------------------------------------------------------------------------------------------
# one turn, warm against cold

class Warm:
    """a warm server and every prompt (ids) it was sent, to know where it should resume"""

    def __init__(self, *flags):
        self.flags = flags
        self.srv = server(*flags)
        self.seen = []  # prompts, and answers' ends: [ids] whose message starts are points
        self.im = None
        self.end = None  # what the template writes after an answer: <|im_end|>\n

    def restart(self):
        stop(self.srv)
        self.srv = server(*self.flags)

    def ids(self, body):
        st, t = self.srv.post("/apply-template", body)
        assert st == 200, t
        st, j = self.srv.post("/tokenize", {"content": t["prompt"]})
        assert st == 200, j
        if self.im is None:
            self.im = self.srv.post("/tokenize", {"content": "<|im_start|>"})[1]["tokens"][0]
            self.end = self.srv.post("/tokenize", {"content": "<|im_end|>\n"})[1]["tokens"]
        return j["tokens"]

    def resume_row(self, ids):
        """the last message start (an <|im_start|>, a point in every prompt that had it) that ids
        shares with a prompt sent before or an answer's end (the prompt, the answer and the
        template's <|im_end|>\n: a point where the next message begins, F13 item 1), short of its
        last row (one row is always run)"""
        best = 0
        for p in self.seen:
            n = 0
            lim = min(len(p), len(ids) - 1)
            while n < lim and p[n] == ids[n]:
                n += 1
            for i in range(n, best, -1):
                if ids[i] == self.im:
                    best = i
                    break
        return best


def post(srv, body, path="/v1/chat/completions"):
    st, j = srv.post(path, body)
    assert st == 200, f"{path}: HTTP {st}: {str(j)[:400]}"
    return j


def answer(j):
    c = j["choices"][0]
    return {"message": c["message"], "finish": c["finish_reason"], "logprobs": c["logprobs"]["content"],
            "prompt": j["usage"]["prompt_tokens"], "cached": j["usage"]["prompt_tokens_details"]["cached_tokens"],
            "cache": j["timings"].get("cache")}


def first_difference(w, c):
    """where the warm answer first differs from the cold one: the token, its log-probability and
    the runners-up on each side"""
    wl, cl = w["logprobs"], c["logprobs"]
    for k in range(max(len(wl), len(cl))):
        a, b = (wl[k] if k < len(wl) else None), (cl[k] if k < len(cl) else None)
        if a != b:
            def say(x):
                return "none" if x is None else (f"{x['token']!r} {x['logprob']!r} (top " +
                                                 ", ".join(f"{t['token']!r} {t['logprob']!r}" for t in x["top_logprobs"])
                                                 + ")")
            return f"token {k}: warm {say(a)}, cold {say(b)}"
    if w["message"] != c["message"] or w["finish"] != c["finish"]:
        return f"message: warm {w['message']!r} {w['finish']}, cold {c['message']!r} {c['finish']}"
    return f"prompt tokens: warm {w['prompt']}, cold {c['prompt']}"


def same(w, c):
    return (w["message"] == c["message"] and w["finish"] == c["finish"] and w["logprobs"] == c["logprobs"] and
            w["prompt"] == c["prompt"])


def judge(label, warm, ids, w, c, want=None):
    """the checks of one turn: the warm answer resumed where a point serves (want: that row, or
    the computed one) and equals the cold pass, every bit of its log-probabilities"""
    if want is None:
        want = warm.resume_row(ids)
    warm.seen += [ids, ids + [t["id"] for t in w["logprobs"]] + warm.end]
    print(f"     {label}: {len(ids)} prompt tokens, resumed at {w['cached']} ({w['cache']})")
    check(f"{label}: resumes where a point serves (row {want} of {len(ids)})",
          w["cached"] == want and (want > 0 or label.endswith("turn 1") or label.startswith("3f")) and
          w["prompt"] == len(ids), f"resumed at {w['cached']} of {w['prompt']} ({w['cache']})")
    check(f"{label}: the warm answer equals a cold pass, bit for bit" +
          (" (the same text, other log-probabilities)" if w["message"] == c["message"] and not same(w, c) else ""),
          same(w, c) and c["cached"] == 0, first_difference(w, c) if not same(w, c) else f"cold resumed {c['cached']}")


def turn(label, warm, cold, body):
    ids = warm.ids(body)
    w = answer(post(warm.srv, body))
    c = answer(post(cold, dict(body, cache_prompt=False)))
    judge(label, warm, ids, w, c)
    return w


# ---------------------------------------------------------------------------------------------
# the scenarios

def scenario_agent_edit_restart(cold, cache_dir):
    """3a, 3b, 3d, 3e on one server (-np 1, --cache-dir): a's loop, b's chat (its slot now
    another conversation: a's points go to the shared cache), d's edit of a's task and one more
    turn, then the restart (e): a's loop and d's go on, each resumed from the files."""
    t0 = time.monotonic()
    warm = Warm("-np", "1", "--cache-dir", cache_dir)
    a = agent_steps(11, 1, A_SIZES)
    for k, (msgs, tools) in enumerate(a[:3]):
        turn(f"3a agent turn {k + 1}", warm, cold, chat_body(msgs, tools))
    t1 = time.monotonic()
    b = at.chat_trace(12, 2, 300, turns=3)
    for k, (msgs, _) in enumerate(b):
        turn(f"3b chat turn {k + 1}", warm, cold, chat_body(msgs))
    completion_after_chat(warm, cold, chat_body(b[-1][0]))
    t2 = time.monotonic()
    d = [(edited(m), tl) for m, tl in a[3:5]]
    for k, (msgs, tools) in enumerate(d):
        turn(f"3d edit turn {k + 1}", warm, cold, chat_body(msgs, tools))
    t3 = time.monotonic()
    warm.restart()
    msgs, tools = a[3]
    turn("3e restart: a's loop goes on", warm, cold, chat_body(msgs, tools))
    msgs, tools = agent_steps(11, 1, A_SIZES + [40])[5]
    turn("3e restart: d's edited loop goes on", warm, cold, chat_body(edited(msgs), tools))
    print(f"     3a {t1 - t0:.1f} s, 3b {t2 - t1:.1f} s, 3d {t3 - t2:.1f} s, 3e {time.monotonic() - t3:.1f} s")
    return warm


def completion_after_chat(warm, cold, body):
    """the chat's last prompt as the text of a /completion request: it gets the marks a chat would
    have at its <|im_start|> rows, so it resumes from the chat's points (the same ids) and its
    answer and log-probabilities equal a cold pass"""
    text = warm.srv.post("/apply-template", body)[1]["prompt"]
    ids = warm.ids(body)
    want = warm.resume_row(ids)
    req = {"prompt": text, "n_predict": N_OUT, "temperature": 0, "n_probs": 2}
    w, c = post(warm.srv, req, "/completion"), post(cold, dict(req, cache_prompt=False), "/completion")
    print(f"     3b /completion: {len(ids)} prompt tokens, resumed at {w['tokens_cached']} ({w['timings'].get('cache')})")
    check(f"3b: the chat's prompt as /completion text resumes from the chat's points (row {want} of {len(ids)}) "
          f"and equals a cold pass, bit for bit", w["tokens_cached"] == want and c["tokens_cached"] == 0 and
          w["content"] == c["content"] and w["completion_probabilities"] == c["completion_probabilities"],
          f"resumed at {w['tokens_cached']} ({w['timings'].get('cache')}); warm {w['content']!r}, cold {c['content']!r}")


def scenario_billing(warm, cold):
    """3g on the restarted server of 3e: an agent loop as /v1/messages bodies, each with its own
    billing hash"""
    t0 = time.monotonic()
    for k, (msgs, tools) in enumerate(agent_steps(17, 7, [50, 50])):
        label = f"3g billing turn {k + 1}"
        mb = at.messages_body(msgs, tools, f"{(k * 2654435761 + 7) % 16 ** 5:05x}", max_tokens=N_OUT)
        body = chat_body(msgs, tools)
        ids = warm.ids(body)
        want = warm.resume_row(ids)
        m = post(warm.srv, mb, "/v1/messages")
        c = answer(post(cold, dict(body, cache_prompt=False)))
        u = m["usage"]
        blocks = {x["type"]: x for x in m["content"]}
        text = {"reasoning_content": blocks["thinking"]["thinking"] if "thinking" in blocks else None,
                "content": blocks["text"]["text"] if "text" in blocks else ""}
        cold_text = {"reasoning_content": c["message"].get("reasoning_content"), "content": c["message"]["content"] or ""}
        print(f"     {label}: {len(ids)} prompt tokens, /v1/messages resumed at {u['cache_read_input_tokens']} "
              f"({m['timings'].get('cache')})")
        check(f"{label}: /v1/messages drops the billing line and resumes where a point serves "
              f"(row {want} of {len(ids)})", u["input_tokens"] + u["cache_read_input_tokens"] == len(ids) and
              u["cache_read_input_tokens"] == want and (want > 0 or k == 0),
              f"{u}, {m['timings'].get('cache')}")
        check(f"{label}: /v1/messages answers as a cold pass of its prompt",
              text == cold_text and m["stop_reason"] == {"length": "max_tokens"}.get(c["finish"], m["stop_reason"]),
              f"warm {m['content']} {m['stop_reason']}, cold {c['message']} {c['finish']}")
        warm.seen.append(ids)
        w = answer(post(warm.srv, body))  # the same prompt as a chat request: from the points just made
        judge(f"{label} (the same prompt as a chat request)", warm, ids, w, c)
    print(f"     3g {time.monotonic() - t0:.1f} s")


def scenario_interleave(cold):
    """3c: four conversations, round-robin, one request at a time, on two slots. A and C are chats
    with thinking (bench/agent_turns.py's chat_trace: each turn's history rewritten); B and D
    agent loops with thinking off whose assistant turns are the model's own answers, each followed
    by a tool's result: the template writes an answer back as it was generated, so each turn
    resumes past the last answer, at its end's point (made while the other slot works)."""
    t0 = time.monotonic()
    warm = Warm("-np", "2")
    chats = {k: at.chat_trace(20 + k, 30 + k, 160, turns=3) for k in (0, 2)}
    loops = {}
    for k in (1, 3):
        r = random.Random(40 + k)
        loops[k] = [{"role": "system", "content": f"Session {30 + k:06d}. You are a build agent; answer in a few words "
                                                  f"and let the tools speak. " + short(at.prose(r, 30), 120)},
                    {"role": "user", "content": "Run the tests and tell me what fails. " + short(at.prose(r, 20), 80)}]
    past, prev_len = 0, {}
    for t in range(3):
        for k in range(4):
            label = f"3c interleave {'ABCD'[k]} turn {t + 1}"
            if k in chats:
                turn(label, warm, cold, chat_body(chats[k][t][0]))
                continue
            msgs = loops[k]
            body = dict(chat_body(msgs), chat_template_kwargs={"enable_thinking": False}, max_tokens=LOOP_OUT)
            w = turn(label, warm, cold, body)
            past += t > 0 and w["cached"] > prev_len[k]
            prev_len[k] = w["prompt"]
            r = random.Random(50 + 10 * k + t)
            msgs += [{"role": "assistant", "content": w["message"]["content"]},
                     {"role": "tool", "tool_call_id": f"call_{k}{t}", "content": at.log_text(r, 30)}]
    check("3c: the loops that write back their own answers resumed past them (at the answers' ends)", past >= 3,
          f"{past} of 4 turns")
    stop(warm.srv)
    print(f"     3c {time.monotonic() - t0:.1f} s")


def metrics(srv):
    """the server's /metrics values by name (without the hearth: prefix)"""
    st, t = srv.request("GET", "/metrics")
    assert st == 200, f"/metrics: HTTP {st}"
    return {k[len("hearth:"):]: float(v) for k, v in (ln.split(" ") for ln in t.split("\n") if ln.startswith("hearth:"))}


def build_loop(k):
    """an agent loop with thinking off that writes its answers back (3c's B and D)"""
    r = random.Random(40 + k)
    return [{"role": "system", "content": f"Session {30 + k:06d}. You are a build agent; answer in a few words "
                                          f"and let the tools speak. " + short(at.prose(r, 30), 120)},
            {"role": "user", "content": "Run the tests and tell me what fails. " + short(at.prose(r, 20), 80)}]


def loop_turn(label, warm, cold, msgs, k, t):
    """one turn of build_loop's conversation k: the answer, then a tool's result appended"""
    body = dict(chat_body(msgs), chat_template_kwargs={"enable_thinking": False}, max_tokens=LOOP_OUT)
    w = turn(label, warm, cold, body)
    r = random.Random(50 + 10 * k + t)
    msgs += [{"role": "assistant", "content": w["message"]["content"]},
             {"role": "tool", "tool_call_id": f"call_{k}{t}", "content": at.log_text(r, 30)}]
    return w


def wait_metric(srv, name, at_least, timeout=10):
    """/metrics once name reached at_least (or the timeout passed)"""
    end = time.monotonic() + timeout
    while True:
        m = metrics(srv)
        if m[name] >= at_least or time.monotonic() > end:
            return m
        time.sleep(0.05)


def scenario_park(cold):
    """3h: parked sequences (F13 item 2). One slot, two sequences to spare (the demo's sequence
    is 4.4 MiB at -c 4096: --cache-gpu 9), two append-only conversations alternating: every
    switch parks the slot's sequence and copies no row, every resume takes the parked sequence
    over and writes none. Then one to spare (--cache-gpu 5) and three conversations: the server,
    idle after a switch, evicts the parked one (its rows copied to the host, off the next
    request's path), and its next turn resumes from the host copy."""
    t0 = time.monotonic()
    warm = Warm("-np", "1", "--metrics", "--cache-gpu", "9")
    m0 = metrics(warm.srv)
    check("3h: --cache-gpu 9 gives the slot two sequences to spare", m0["cache_seqs_spare"] == 2,
          f"{m0['cache_seqs_spare']:.0f} spare (the demo's sequence size changed?)")
    loops = {k: build_loop(k) for k in (1, 3)}
    for t in range(3):
        for k in (1, 3):
            label = f"3h park {'AB'[k // 2]} turn {t + 1}"
            before = metrics(warm.srv)
            loop_turn(label, warm, cold, loops[k], k, t)
            after = metrics(warm.srv)
            if t == 0 and k == 1:
                continue
            d = {n: after[n] - before[n] for n in ("cache_rows_copied_total", "cache_rows_written_total",
                                                   "cache_parks_total", "cache_park_takeovers_total",
                                                   "cache_park_evictions_total")}
            check(f"{label}: the switch parked the other conversation's sequence, no row copied",
                  d["cache_rows_copied_total"] == 0 and d["cache_parks_total"] == 1 and
                  d["cache_park_evictions_total"] == 0, str(d))
            if t > 0:
                check(f"{label}: the resume took its parked sequence over, no row written",
                      d["cache_rows_written_total"] == 0 and d["cache_park_takeovers_total"] == 1, str(d))
    m = metrics(warm.srv)
    check("3h: at the end one parked sequence (the other conversation's), none evicted", m["cache_seqs_parked"] == 1 and m["cache_park_evictions_total"] == 0
          and m["cache_rows_copied_total"] == 0, f"{m['cache_seqs_parked']:.0f} parked, "
          f"{m['cache_park_evictions_total']:.0f} evicted, {m['cache_rows_copied_total']:.0f} rows copied")
    stop(warm.srv)

    warm = Warm("-np", "1", "--metrics", "--cache-gpu", "5")
    check("3h: --cache-gpu 5 gives the slot one sequence to spare", metrics(warm.srv)["cache_seqs_spare"] == 1)
    loops = {k: build_loop(k) for k in (0, 1, 2)}
    for t in range(2):
        for k in (0, 1, 2):
            label = f"3h evict {'ABC'[k]} turn {t + 1}"
            before = metrics(warm.srv)
            loop_turn(label, warm, cold, loops[k], k, t)
            if t == 0 and k == 0:
                continue
            # the switch parked the previous conversation in the spare sequence; idle, the server
            # evicts it: its rows copied to the host then
            after = wait_metric(warm.srv, "cache_park_evictions_idle_total", before["cache_park_evictions_idle_total"] + 1)
            check(f"{label}: idle, the parked sequence was evicted, its rows copied to the host",
                  after["cache_park_evictions_idle_total"] == before["cache_park_evictions_idle_total"] + 1 and
                  after["cache_rows_copied_total"] > before["cache_rows_copied_total"],
                  f"evictions {before['cache_park_evictions_idle_total']:.0f} -> "
                  f"{after['cache_park_evictions_idle_total']:.0f}, rows copied {before['cache_rows_copied_total']:.0f}"
                  f" -> {after['cache_rows_copied_total']:.0f}")
            if t > 0:
                check(f"{label}: resumed from the host copy (rows written)",
                      after["cache_rows_written_total"] > before["cache_rows_written_total"])
    stop(warm.srv)
    print(f"     3h {time.monotonic() - t0:.1f} s")


def scenario_subagents(cold, n=3, turns=2):
    """3f: n sub-agents sharing a system prompt and tool list, all sent at once, each sending its
    next request when its answer came; on -np n"""
    t0 = time.monotonic()
    warm = Warm("-np", str(n))
    r = random.Random(5)
    tools = [t for t in at.agent_tools("/srv/ws-000040") if t["function"]["name"] == "run_shell"]
    system = ("Session 000040. You are one of three sub-agents of a coding agent in a C11 repository; each works on "
              "its own task and reports back in a few lines. " + short(at.prose(r, 120), 500))
    plans = []
    for k in range(n):
        rk = random.Random(500 + k)
        msgs = [{"role": "system", "content": system},
                {"role": "user", "content": f"Sub-task {k + 1} of {n}: find every caller of `{at.ident(rk)}` and check "
                                            f"its error paths. " + short(at.prose(rk, 20), 80)}]
        steps = [[dict(m) for m in msgs]]
        for t in range(1, turns):
            asst, tool, _ = at.tool_turn(rk, 2, 40, 80)
            asst["reasoning_content"] = short(asst["reasoning_content"], 160)
            msgs += [asst, tool]
            steps.append([dict(m) for m in msgs])
        plans.append([chat_body(m, tools) for m in steps])
    ids = [[warm.ids(b) for b in p] for p in plans]
    got = [[None] * turns for _ in range(n)]
    errors = []
    gate = threading.Barrier(n)

    def agent(k):
        try:
            gate.wait()
            for t in range(turns):
                got[k][t] = answer(post(warm.srv, plans[k][t]))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))
            gate.abort()

    th = [threading.Thread(target=agent, args=(k,)) for k in range(n)]
    [x.start() for x in th]
    [x.join() for x in th]
    stop(warm.srv)
    check("3f sub-agents: every request answered", not errors, "; ".join(errors))
    if errors:
        return
    # the first wave shares the system prompt and tools (~700 rows, past the 4 chunks that make a
    # request wait for a leader: sched.c's in-flight sharing): one request prefills it, the others
    # resume at their user message's start, from the leader's point
    first = [got[k][0]["cached"] for k in range(n)]
    starts = [ids[k][0].index(warm.im, 1) for k in range(n)]
    check("3f sub-agents: the first wave's shared prefix prefilled once (one from row 0, the others at their "
          "user message's start)", first.count(0) == 1 and all(c in (0, st) for c, st in zip(first, starts)),
          f"resumed at {first}, user messages at {starts}")
    for t in range(turns):
        for k in range(n):
            c = answer(post(cold, dict(plans[k][t], cache_prompt=False)))
            # the first wave from the leader's point at the shared prefix's end (above); a later
            # turn from the sub-agent's own previous prompt
            if t == 0:
                warm.seen = []
                want = got[k][t]["cached"] if got[k][t]["cached"] in (0, ids[k][t].index(warm.im, 1)) else -1
            else:
                warm.seen = [ids[k][t - 1]]
                want = None
            judge(f"3f sub-agent {k + 1} turn {t + 1}", warm, ids[k][t], got[k][t], c, want)
    print(f"     3f {time.monotonic() - t0:.1f} s")


def cold_is_fresh(cold):
    """the shared cold server's answer with cache_prompt false, after many requests, equals a
    fresh server's first answer: a true cold pass"""
    msgs, tools = agent_steps(11, 1, A_SIZES)[1]
    body = chat_body(msgs, tools)
    c = answer(post(cold, dict(body, cache_prompt=False)))
    fresh = server("-np", "1")
    try:
        f = answer(post(fresh, body))
    finally:
        stop(fresh)
    check("the cold server's cache_prompt false answer equals a fresh server's first answer, bit for bit",
          same(f, c) and f["cached"] == 0 and c["cached"] == 0, first_difference(f, c))


def guarded(name, fn, *args):
    """fn(*args); an exception (a request refused, a server gone) is a failed check, not the end"""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001
        check(f"{name} ran to its end", False, repr(e)[:600])
        return None


def main():
    if not os.path.exists(DEMO):
        check(f"the demo model {DEMO} is there", False)
        return checks.summary()
    only = set("".join(sys.argv[1:])) or set("abcdefgh")  # scenario letters to run (default: all)
    t0 = time.monotonic()
    try:
        cold = server("-np", "1")
        if only & set("abdeg"):
            warm = guarded("3a, 3b, 3d, 3e", scenario_agent_edit_restart, cold,
                           os.path.join(tempfile.mkdtemp(dir=serve_test.TMP), "cache"))
            if warm:
                guarded("3g", scenario_billing, warm, cold)
        if "c" in only:
            guarded("3c", scenario_interleave, cold)
        if "f" in only:
            guarded("3f", scenario_subagents, cold)
        if "h" in only:
            guarded("3h", scenario_park, cold)
        if only == set("abcdefgh"):
            guarded("the cold server's check", cold_is_fresh, cold)
    finally:
        for x in list(RUNNING):
            stop(x)
    print(f"     {time.monotonic() - t0:.1f} s in all")
    return 1 if checks.summary() else 0


if __name__ == "__main__":
    sys.exit(main())
