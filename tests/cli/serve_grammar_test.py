#!/usr/bin/env python3
"""serve_grammar_test.py: structured output, logit_bias and n_probs through `hearth serve`
(run by tests/cli/serve.sh beside serve_test.py, whose Server it uses). The demo model
(demo/hearth-demo-q8_0.gguf) is weak: unconstrained it does not write JSON, so a JSON answer
that parses and validates shows the mask at work. The thinking rule (no mask inside
<think>) is shown with the test seam HEARTH_TEST_REPLY (scripted tokens, each checked by the
grammar once it applies).

Prints one "ok"/"FAIL" line per check and "N passed, N failed" at the end."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checks  # noqa: E402
import serve_test as st  # noqa: E402
from serve_test import Server, check, TMP  # noqa: E402

DEMO = os.environ.get("HEARTH_DEMO", "demo/hearth-demo-q8_0.gguf")
QWEN35 = "tests/fixtures/templates/Qwen3.5-4B.jinja"
NO_THINK = {"enable_thinking": False}


def loads(text):
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


def person_ok(o):
    return (isinstance(o, dict) and set(o) == {"name", "age", "pet"} and isinstance(o["name"], str) and
            len(o["name"]) <= 12 and isinstance(o["age"], int) and o["pet"] in ("cat", "dog", "none"))


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
                                           "pet": {"enum": ["cat", "dog", "none"]}},
          "required": ["name", "age", "pet"], "additionalProperties": False}


def structured(s):
    msgs = [{"role": "user", "content": "Describe a person as JSON with name, age and pet."}]
    base = {"messages": msgs, "max_tokens": 120, "temperature": 0, "chat_template_kwargs": NO_THINK}
    code, j = s.post("/v1/chat/completions", base)
    plain = j["choices"][0]["message"]["content"] if code == 200 else None
    check("unconstrained, the demo model writes no valid JSON (what the mask must fix)",
          code == 200 and not person_ok(loads(plain)), repr(plain)[:200])
    rf = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON}}
    code, j = s.post("/v1/chat/completions", {**base, "response_format": rf})
    c = j["choices"][0]["message"]["content"] if code == 200 else None
    check("response_format json_schema: the answer parses and validates", code == 200 and person_ok(loads(c)),
          str(j)[:300])
    code, ev = s.stream("/v1/chat/completions", {**base, "response_format": rf, "stream": True})[0:3:2]
    streamed = "".join(ch["delta"].get("content") or "" for e in ev if e != "[DONE]" for ch in e.get("choices", []))
    check("response_format json_schema streamed: the same text", code == 200 and streamed == c, repr(streamed)[:200])
    code, j = s.post("/v1/chat/completions", {**base, "max_tokens": 300, "response_format": {"type": "json_object"}})
    c = j["choices"][0]["message"]["content"] if code == 200 else ""
    o = loads(c)
    check("response_format json_object: a JSON object (or cut by max_tokens as a prefix of one)",
          code == 200 and (isinstance(o, dict) or (j["choices"][0]["finish_reason"] == "length" and c.startswith("{"))),
          repr(c)[:200])
    # llama-server's own fields on /completion
    code, j = s.post("/completion", {"prompt": "Is the sky green?", "n_predict": 10, "temperature": 0,
                                     "grammar": "root ::= (\"yes\" | \"no\") \".\""})
    check("/completion grammar: the answer is one of the grammar's sentences",
          code == 200 and j["content"] in ("yes.", "no.") and j["stop_type"] == "eos", str(j)[:200])
    code, j = s.post("/completion", {"prompt": "A person:", "n_predict": 120, "temperature": 0, "json_schema": PERSON})
    check("/completion json_schema: parses and validates", code == 200 and person_ok(loads(j.get("content"))),
          str(j)[:300])
    # bad grammars and schemas: 400 naming what is wrong
    for name, body, needle in [
        ("a GBNF without root", {"grammar": "a ::= \"x\""}, "root"),
        ("a GBNF with an undefined rule", {"grammar": "root ::= item"}, "\"item\""),
        ("a left-recursive GBNF", {"grammar": "root ::= root \"a\" | \"a\""}, "left-recursive"),
        ("a schema with pattern", {"json_schema": {"type": "string", "pattern": "^a"}}, "\"pattern\""),
        ("a schema format not done", {"json_schema": {"type": "string", "format": "email"}}, "email"),
        ("two grammar sources", {"grammar": "root ::= \"a\"", "json_schema": {}}, "only one"),
        ("a response_format type unknown", {"response_format": {"type": "xml"}}, "xml"),
    ]:
        code, j = s.post("/completion", {"prompt": "x", "n_predict": 4, **body})
        msg = (j or {}).get("error", {}).get("message", "")
        check(f"400 for {name}, naming it", code == 400 and needle in msg, f"{code} {msg}")


def tools(model):
    s = Server(model, "-np", "1", "--chat-template-file", QWEN35)
    tl = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "unit": {"type": "string", "enum": ["C", "F"]}, "days": {"type": "integer"}}, "required": ["unit", "days"]}}},
          {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
              "zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}}]
    base = {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": tl, "max_tokens": 120,
            "temperature": 0, "chat_template_kwargs": NO_THINK}
    code, j = s.post("/v1/chat/completions", base)
    auto_calls = j["choices"][0]["message"].get("tool_calls") if code == 200 else None
    check("tool_choice auto: the demo model writes no call", code == 200 and not auto_calls, str(j)[:200])
    def fits(c):
        a = loads(c["function"]["arguments"]) or {}
        return ((c["function"]["name"] == "get_weather" and a.get("unit") in ("C", "F") and isinstance(a.get("days"), int))
                or (c["function"]["name"] == "get_time" and a == {"zone": a.get("zone")} and a["zone"] in ("UTC", "CET")))
    # max_tokens 200: room for two calls. "required" with parallel calls allowed takes one or
    # more (llama-server's (tool_call)+): the weak model, held to calls, writes a second (and
    # more, until the limit: a call cut there stays content); with parallel_tool_calls false
    # or a named function the grammar ends at the first call
    for tc, extra, want in [("required", {}, None), ("required", {"parallel_tool_calls": False}, None),
                            ({"type": "function", "function": {"name": "get_time"}}, {}, "get_time")]:
        code, j = s.post("/v1/chat/completions", {**base, "max_tokens": 200, "tool_choice": tc, **extra})
        calls = j["choices"][0]["message"].get("tool_calls") or [] if code == 200 else []
        many = tc == "required" and not extra
        ok = (calls and all(fits(c) for c in calls) and (want is None or calls[0]["function"]["name"] == want) and
              (len(calls) >= 2 if many else len(calls) == 1 and j["choices"][0]["finish_reason"] == "tool_calls"))
        check(f"tool_choice {json.dumps(tc)} {json.dumps(extra)}: {'two or more calls' if many else 'one call'} whose "
              "arguments fit their schema", ok, str(j)[:400])
    atools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in tl]
    abody = {"model": "m", "max_tokens": 200, "messages": base["messages"], "tools": atools,
             "thinking": {"type": "disabled"}, "temperature": 0}
    for tc, want in [({"type": "any"}, None), ({"type": "any", "disable_parallel_tool_use": True}, None),
                     ({"type": "tool", "name": "get_weather"}, "get_weather")]:
        code, j = s.post("/v1/messages", {**abody, "tool_choice": tc})
        uses = [b for b in (j or {}).get("content", []) if b.get("type") == "tool_use"]
        many = tc["type"] == "any" and "disable_parallel_tool_use" not in tc
        check(f"messages tool_choice {json.dumps(tc)}: {'two or more tool_use blocks' if many else 'a tool_use block'}",
              code == 200 and (len(uses) >= 2 if many else len(uses) == 1 and j.get("stop_reason") == "tool_use") and
              all(want is None or u["name"] == want for u in uses) and all(isinstance(u.get("input"), dict) for u in uses),
              str(j)[:300])
    code, j = s.post("/v1/chat/completions", {**base, "tool_choice": {"type": "function", "function": {"name": "x"}}})
    check("tool_choice naming no tool: 400 naming it", code == 400 and "\"x\"" in j["error"]["message"], str(j)[:200])
    s.stop()


def thinking(model):
    """the mask applies after </think>, never inside: the scripted reasoning is no JSON and
    passes; the scripted answer after it must satisfy the grammar"""
    reply = os.path.join(TMP, "grammar-reply.txt")
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 60, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {
                "a": {"type": "integer"}}, "required": ["a"]}}}}
    for text, ok_want in [("{not [json\n</think>\n\n{\"a\": 12}", True), ("plan\n</think>\n\nnot json", False)]:
        with open(reply, "w") as f:
            f.write(text)
        s = Server(model, "-np", "1", "--chat-template-file", QWEN35, env={"HEARTH_TEST_REPLY": reply})
        code, j = s.post("/v1/chat/completions", body)
        s.stop()
        if ok_want:
            m = j["choices"][0]["message"] if code == 200 else {}
            check("grammar after </think>: reasoning free, the answer JSON", code == 200 and
                  m.get("reasoning_content") == "{not [json\n" and loads(m.get("content")) == {"a": 12}, str(j)[:300])
        else:
            check("grammar after </think>: an answer outside the grammar fails (the scripted token is refused)",
                  code == 500 and "grammar" in j["error"]["message"], str(j)[:300])


def bias_and_probs(s):
    p = {"prompt": "In the beginning", "n_predict": 6, "temperature": 0, "return_tokens": True}
    code, j = s.post("/completion", p)
    first = j["tokens"][0] if code == 200 else None
    check("/completion baseline", code == 200 and first is not None, str(j)[:200])
    for name, lb in [("array form, false", [[first, False]]), ("map form, -100", {str(first): -100})]:
        code, j2 = s.post("/completion", {**p, "logit_bias": lb})
        check(f"logit_bias {name}: the greedy first token is never chosen", code == 200 and j2["tokens"][0] != first,
              str(j2)[:200])
    code, tk = s.post("/tokenize", {"content": " Moses"})
    boost = tk["tokens"][0]
    code, j2 = s.post("/completion", {**p, "logit_bias": [[" Moses", 100]]})
    check("logit_bias by text, +100: its token comes first", code == 200 and j2["tokens"][0] == boost, str(j2)[:200])
    code, j2 = s.post("/completion", {**p, "logit_bias": [["x", "y"]]})
    check("logit_bias with a bias not a number: 400", code == 400 and "logit_bias" in j2["error"]["message"])
    code, j2 = s.post("/completion", {**p, "logit_bias": {"999999999": 1}})
    check("logit_bias with an id out of range: 400", code == 400 and "token id" in j2["error"]["message"])
    code, j = s.post("/completion", {**p, "n_probs": 3})
    cp = j.get("completion_probabilities") or [] if code == 200 else []
    ok = len(cp) == j.get("tokens_predicted") == len(j.get("tokens", [])) and all(
        e["id"] == t and len(e["top_logprobs"]) == 3 and e["top_logprobs"][0]["id"] == t and
        abs(e["top_logprobs"][0]["logprob"] - e["logprob"]) < 1e-6 and e["logprob"] <= 0 and
        isinstance(e["bytes"], list) and "token" in e for e, t in zip(cp, j.get("tokens", [])))
    check("n_probs 3: completion_probabilities, one per token, the greedy token first", code == 200 and ok, str(j)[:400])
    code, _, ev = s.stream("/completion", {**p, "n_probs": 2, "stream": True})
    n = sum(len(e.get("completion_probabilities") or []) for e in ev if isinstance(e, dict))
    check("n_probs streamed: every token's probabilities in the chunks", code == 200 and n == 6, str(ev)[:300])
    code, j = s.post("/completion", {**p, "logprobs": True, "top_logprobs": 2})
    check("logprobs on /completion: completion_probabilities", code == 200 and
          len(j.get("completion_probabilities") or []) == 6, str(j)[:200])
    code, j = s.post("/completion", {**p, "n_probs": 21})
    check("n_probs over 20: 400 naming it", code == 400 and "n_probs" in j["error"]["message"])
    code, j = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n_probs": 2})
    check("n_probs on chat: 400 pointing at logprobs", code == 400 and "logprobs" in j["error"]["message"])


def concurrent(model):
    """Two slots sampling under grammars at once: their matchers share the vocabulary's
    position entries (grammar.c), made by whichever request met a stack top first."""
    import threading
    s = Server(model, "-np", "2")
    msgs = [{"role": "user", "content": "Describe a person as JSON with name, age and pet."}]
    base = {"messages": msgs, "max_tokens": 120, "temperature": 0, "chat_template_kwargs": NO_THINK}
    rf = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON}}
    bodies = [{**base, "response_format": rf}, {**base, "max_tokens": 200, "response_format": {"type": "json_object"}},
              {**base, "response_format": rf, "temperature": 0.8, "seed": 7},
              {**base, "max_tokens": 200, "temperature": 0.8, "seed": 9, "response_format": {"type": "json_object"}}]
    out = [None] * len(bodies)

    def go(k):
        out[k] = s.post("/v1/chat/completions", bodies[k], timeout=300)

    th = [threading.Thread(target=go, args=(k,)) for k in range(len(bodies))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    s.stop()
    for k, (code, j) in enumerate(out):
        c = j["choices"][0]["message"]["content"] if code == 200 else ""
        o = loads(c)
        ok = code == 200 and (person_ok(o) if k % 2 == 0 else (isinstance(o, dict) or (
            j["choices"][0]["finish_reason"] == "length" and c.startswith("{"))))
        check(f"-np 2, four grammar requests at once: answer {k} ({'json_schema' if k % 2 == 0 else 'json_object'}"
              f"{', sampled' if k >= 2 else ''}) valid", ok, repr(c or j)[:200])


READY = "grammar vocabulary ready"


def metrics(s):
    """the grammar figures of /metrics (those it lacks left out)"""
    code, text = s.request("GET", "/metrics")
    out = {}
    for k in ("grammar_vocab_ready", "grammar_vocab_builds_total", "grammar_primed_entries", "grammar_vocab_waits_total",
              "grammar_masks_total", "grammar_entries_found_total", "grammar_entries_made_total"):
        try:
            out[k] = st.metric(text, k) if code == 200 else None
        except KeyError:
            pass
    return out


def log_lines(path, needle):
    with open(path, errors="replace") as f:
        return [ln for ln in f if needle in ln]


def startup(model):
    """The grammar vocabulary (the trie and the entries every JSON and tool-call grammar
    reaches) is made at start-up on a thread of its own (sched.c), never on a request's path:
    the server logs it ready and /metrics counts one build before any request; the first
    json_object request finds every entry made (json_object's grammar is one of the primed),
    a schema's finds its strings'. A request that races the build (held back by the test seam
    HEARTH_TEST_GRAMMAR_DELAY_MS) waits for it, no second is built, and its answer is the
    same; /health answers meanwhile; a SIGTERM meanwhile lets the waiting request go."""
    import time
    msgs = [{"role": "user", "content": "Describe a person as JSON with name, age and pet."}]
    body = {"messages": msgs, "max_tokens": 40, "temperature": 0, "chat_template_kwargs": NO_THINK,
            "response_format": {"type": "json_object"}}
    log = os.path.join(TMP, f"grammar-startup-{os.getpid()}.log")
    s = Server(model, "-np", "1", "--metrics", log=log)
    for _ in range(300):
        if log_lines(log, READY):
            break
        time.sleep(0.1)
    m0 = metrics(s)
    check("start-up: the grammar vocabulary is logged ready and counted built before any request",
          len(log_lines(log, READY)) == 1 and m0.get("grammar_vocab_builds_total") == 1 and
          m0.get("grammar_primed_entries", 0) > 0 and m0.get("grammar_masks_total") == 0, f"{m0} {log_lines(log, READY)}")
    code, j = s.post("/v1/chat/completions", body)
    first = j["choices"][0]["message"]["content"] if code == 200 else None
    m1 = metrics(s)
    check("the first json_object request builds nothing and finds every entry made (primed)",
          code == 200 and first and m1.get("grammar_vocab_builds_total") == 1 and m1.get("grammar_vocab_waits_total") == 0
          and m1.get("grammar_masks_total", 0) > 0 and m1.get("grammar_entries_found_total", 0) > 0 and
          m1.get("grammar_entries_made_total") == 0, f"{m1} {str(j)[:200]}")
    rf = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON}}
    code, j = s.post("/v1/chat/completions", {**body, "max_tokens": 120, "response_format": rf})
    m2 = metrics(s)
    check("a json_schema request then finds primed entries too (its strings')",
          code == 200 and m2.get("grammar_entries_found_total", 0) > m1.get("grammar_entries_found_total", 0) and
          m2.get("grammar_vocab_builds_total") == 1, f"{m2} {str(j)[:200]}")
    s.stop()
    log = os.path.join(TMP, f"grammar-race-{os.getpid()}.log")
    s = Server(model, "-np", "1", "--metrics", log=log, env={"HEARTH_TEST_GRAMMAR_DELAY_MS": "3000"})
    t0 = time.monotonic()
    code, h = s.request("GET", "/health")
    t_health = time.monotonic() - t0
    early = not log_lines(log, READY)
    check("/health answers at once while the grammar vocabulary is being made", code == 200 and t_health < 1.0 and early,
          f"{code} {h} {t_health:.2f} s, ready already: {not early}")
    code, j = s.post("/v1/chat/completions", body)
    t_req = time.monotonic() - t0
    raced = j["choices"][0]["message"]["content"] if code == 200 else None
    m3 = metrics(s)
    check("a grammar request racing the build waits for it (one build) and gets the same answer",
          code == 200 and raced == first and early and m3.get("grammar_vocab_waits_total") == 1 and
          m3.get("grammar_vocab_builds_total") == 1 and len(log_lines(log, READY)) == 1 and t_req > 1.5,
          f"{m3} {t_req:.2f} s {raced!r} vs {first!r}")
    s.stop()
    # stopped while a grammar request waits for the vocabulary: the request is let go (503) and
    # the server exits at once, not after building it
    import threading
    s = Server(model, "-np", "1", log=log, env={"HEARTH_TEST_GRAMMAR_DELAY_MS": "20000"})
    out = []
    th = threading.Thread(target=lambda: out.append(s.post("/v1/chat/completions", body, timeout=30)))
    th.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    rc = s.stop()
    t_stop = time.monotonic() - t0
    th.join()
    code, j = out[0] if out else (None, None)
    check("SIGTERM while a grammar request waits for the vocabulary: it gets 503, the server exits at once",
          rc == 0 and t_stop < 5 and code == 503 and "stopping" in str(j), f"rc {rc}, {t_stop:.2f} s, {code} {str(j)[:200]}")


def one_call(model):
    """parallel_tool_calls: false (OpenAI chat and Responses; Anthropic's tool_choice
    disable_parallel_tool_use: true): at most one tool call comes back. The model (scripted by
    HEARTH_TEST_REPLY) writes two; the answer ends at the first one's </tool_call>, as
    llama-server's grammar (one call, then the end) makes it."""
    reply = os.path.join(TMP, "two-calls.txt")
    with open(reply, "w") as f:
        f.write("<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>\n"
                "<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n</function>\n</tool_call>")
    s = Server(model, "-np", "1", "--chat-template-file", QWEN35, env={"HEARTH_TEST_REPLY": reply})
    tl = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string"}}, "required": ["zone"]}}}]
    base = {"messages": [{"role": "user", "content": "Time in UTC and CET?"}], "tools": tl, "max_tokens": 400,
            "temperature": 0, "chat_template_kwargs": NO_THINK}

    def zones(j):
        calls = (j or {}).get("choices", [{}])[0].get("message", {}).get("tool_calls") or []
        return [loads(c["function"]["arguments"]).get("zone") for c in calls]
    code, j = s.post("/v1/chat/completions", base)
    check("two calls written, parallel_tool_calls absent: both returned", code == 200 and zones(j) == ["UTC", "CET"],
          str(j)[:300])
    code, j = s.post("/v1/chat/completions", {**base, "parallel_tool_calls": True})
    check("parallel_tool_calls true: both returned", code == 200 and zones(j) == ["UTC", "CET"], str(j)[:300])
    code, j = s.post("/v1/chat/completions", {**base, "parallel_tool_calls": False})
    one = j
    check("parallel_tool_calls false: only the first call, finish_reason tool_calls",
          code == 200 and zones(j) == ["UTC"] and j["choices"][0]["finish_reason"] == "tool_calls" and
          not j["choices"][0]["message"].get("content"), str(j)[:300])
    code, _, ev = s.stream("/v1/chat/completions", {**base, "parallel_tool_calls": False, "stream": True})
    tcs = [tc for e in ev if isinstance(e, dict) for ch in e.get("choices", []) for tc in
           (ch.get("delta", {}).get("tool_calls") or [])]
    fins = [ch.get("finish_reason") for e in ev if isinstance(e, dict) for ch in e.get("choices", []) if ch.get("finish_reason")]
    check("parallel_tool_calls false, streamed: one call", code == 200 and len({tc.get("index") for tc in tcs}) == 1 and
          fins == ["tool_calls"], str(ev)[:400])
    # tool_choice "required" (the grammar in force, each scripted token checked by it): one or
    # more calls while parallel calls are allowed, as llama-server's (tool_call)+; the scripted
    # second call is refused (the request fails) where the grammar allows only one
    for extra, want in [({}, ["UTC", "CET"]), ({"parallel_tool_calls": True}, ["UTC", "CET"]),
                        ({"parallel_tool_calls": False}, ["UTC"])]:
        code, j = s.post("/v1/chat/completions", {**base, "tool_choice": "required", **extra})
        check(f"tool_choice required {json.dumps(extra)}: {len(want)} call(s)", code == 200 and zones(j) == want and
              j["choices"][0]["finish_reason"] == "tool_calls" and not j["choices"][0]["message"].get("content"),
              str(j)[:300])
    code, _, ev = s.stream("/v1/chat/completions", {**base, "tool_choice": "required", "stream": True})
    tcs = [tc for e in ev if isinstance(e, dict) for ch in e.get("choices", []) for tc in
           (ch.get("delta", {}).get("tool_calls") or [])]
    fins = [ch.get("finish_reason") for e in ev if isinstance(e, dict) for ch in e.get("choices", []) if ch.get("finish_reason")]
    streamed = {}
    for tc in tcs:
        streamed[tc.get("index")] = streamed.get(tc.get("index"), "") + (tc.get("function") or {}).get("arguments", "")
    check("tool_choice required, streamed: the same two calls", code == 200 and fins == ["tool_calls"] and
          [(loads(a) or {}).get("zone") for _, a in sorted(streamed.items())] == ["UTC", "CET"], str(ev)[:400])
    code, j = s.post("/v1/chat/completions", {**base, "tool_choice": {"type": "function", "function": {"name": "get_time"}}})
    check("tool_choice naming get_time: the scripted second call is refused (one call only)", code != 200, str(j)[:300])
    code, j = s.post("/v1/chat/completions", {**base, "parallel_tool_calls": "no"})
    check("parallel_tool_calls not a boolean: 400 naming it", code == 400 and "parallel_tool_calls" in str(j), str(j)[:200])
    atools = [{"name": "get_time", "input_schema": tl[0]["function"]["parameters"]}]
    abody = {"model": "m", "max_tokens": 400, "messages": base["messages"], "tools": atools,
             "thinking": {"type": "disabled"}}
    for tc, want in [({"type": "auto"}, 2), ({"type": "auto", "disable_parallel_tool_use": True}, 1),
                     ({"type": "any"}, 2), ({"type": "any", "disable_parallel_tool_use": True}, 1)]:
        code, j = s.post("/v1/messages", {**abody, "tool_choice": tc})
        uses = [b for b in (j or {}).get("content", []) if b.get("type") == "tool_use"]
        check(f"messages tool_choice {json.dumps(tc)}: {want} tool_use block(s)", code == 200 and len(uses) == want and
              j.get("stop_reason") == "tool_use", str(j)[:300])
    rbody = {"model": "m", "input": "Time in UTC and CET?", "max_output_tokens": 400, "reasoning": {"effort": "none"},
             "tools": [{"type": "function", "name": "get_time", "parameters": tl[0]["function"]["parameters"]}]}
    for ptc, tch, want in [(True, "auto", 2), (False, "auto", 1), (True, "required", 2), (False, "required", 1)]:
        code, j = s.post("/v1/responses", {**rbody, "parallel_tool_calls": ptc, "tool_choice": tch})
        fcs = [it for it in (j or {}).get("output", []) if it.get("type") == "function_call"]
        check(f"responses parallel_tool_calls {ptc}, tool_choice {tch}: {want} function_call item(s)",
              code == 200 and len(fcs) == want and j.get("parallel_tool_calls") is ptc, str(j)[:300])
    s.stop()


def main():
    if not os.path.exists(DEMO):
        print(f"SKIP serve_grammar_test: {DEMO} missing")
        print("0 passed, 0 failed")
        return 0
    startup(DEMO)
    s = Server(DEMO, "-np", "1")
    structured(s)
    bias_and_probs(s)
    s.stop()
    tools(DEMO)
    thinking(DEMO)
    one_call(DEMO)
    concurrent(DEMO)
    return 1 if checks.summary() else 0


if __name__ == "__main__":
    sys.exit(main())
