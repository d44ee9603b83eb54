#!/usr/bin/env python3
"""serve_responses_test.py: OpenAI's Responses API (POST /v1/responses) through `hearth serve`
(run by tests/cli/serve.sh beside serve_test.py, whose Server it uses), on the demo model
(demo/hearth-demo-q8_0.gguf) at temperature 0. A Response must equal the chat endpoint's answer
to the same conversation (the same prompt: instructions as the system message, function_call
and function_call_output items as the assistant's tool call and the tool's message); the
stream's events must put together the same Response as the whole answer, in order, numbered
from 0; a second turn resumes from the cache; tool calls (the test seam HEARTH_TEST_REPLY
scripts them, the demo model cannot write one) come back as function_call items.

Prints one "ok"/"FAIL" line per check and "N passed, N failed" at the end."""
import http.client
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checks  # noqa: E402
from serve_test import Server, check, TMP  # noqa: E402

DEMO = os.environ.get("HEARTH_DEMO", "demo/hearth-demo-q8_0.gguf")
QWEN35 = "tests/fixtures/templates/Qwen3.5-4B.jinja"

# the published event names (OpenAI's API reference; the npm openai package's
# ResponseStreamEvent union) hearth may send
EVENTS = {"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
          "response.output_text.delta", "response.output_text.done", "response.content_part.done",
          "response.output_item.done", "response.function_call_arguments.delta",
          "response.function_call_arguments.done", "response.reasoning_text.delta", "response.reasoning_text.done",
          "response.reasoning_summary_part.added", "response.reasoning_summary_text.delta",
          "response.reasoning_summary_text.done", "response.reasoning_summary_part.done",
          "response.completed", "response.incomplete", "response.failed"}


def stream(s, body):
    """(status, [(event name, data)]) of a streamed Response"""
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    c.request("POST", "/v1/responses", body=json.dumps({**body, "stream": True}).encode(),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    out = []
    for block in text.split("\n\n"):
        name = data = None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
        if data is not None:
            out.append((name, data))
    return r.status, out


def assemble(events):
    """the Response a client puts together from the events, as the npm client's
    ResponseStream does: items added, their text and arguments from the deltas, replaced by
    output_item.done, the final lifecycle event's Response around them; (items, None) when an
    item the deltas made differs from its output_item.done"""
    items, final = [], None
    for _, e in events:
        t = e["type"]
        if t == "response.output_item.added":
            assert e["output_index"] == len(items)
            items.append(json.loads(json.dumps(e["item"])))
        elif t == "response.content_part.added":
            items[e["output_index"]]["content"].append(e["part"])
        elif t == "response.reasoning_summary_part.added":
            items[e["output_index"]]["summary"].append(e["part"])
        elif t in ("response.output_text.delta", "response.reasoning_text.delta"):
            items[e["output_index"]]["content"][e["content_index"]]["text"] += e["delta"]
        elif t == "response.reasoning_summary_text.delta":
            items[e["output_index"]]["summary"][e["summary_index"]]["text"] += e["delta"]
        elif t == "response.function_call_arguments.delta":
            items[e["output_index"]]["arguments"] += e["delta"]
        elif t == "response.output_item.done":
            # what the deltas made must be the item done (but for its status)
            if {**items[e["output_index"]], "status": e["item"]["status"]} != e["item"]:
                return items, None
            items[e["output_index"]] = e["item"]
        elif t in ("response.completed", "response.incomplete", "response.failed"):
            final = e["response"]
    return items, final


def no_ids(r):
    """a Response (or item) without what differs between two answers to one request: ids,
    times, what the cache served"""
    j = json.loads(re.sub(r'"(resp|rs|msg|fc|call)_[0-9a-f]{16}', r'"\1_X', json.dumps(r)))
    for k in ("created_at", "timings"):
        j.pop(k, None)
    if isinstance(j.get("usage"), dict):
        j["usage"]["input_tokens_details"].pop("cached_tokens", None)
    return j


def texts(r):
    """(reasoning, message text) of a Response's output"""
    rs = "".join(c["text"] for it in r.get("output", []) if it["type"] == "reasoning" for c in it.get("content", []))
    tx = "".join(c["text"] for it in r.get("output", []) if it["type"] == "message" for c in it["content"])
    return rs, tx


def whole_and_streamed(s):
    body = {"model": "m", "input": "Tell me about the hearth.", "instructions": "You are terse.",
            "max_output_tokens": 40, "temperature": 0, "reasoning": {"effort": "low"}}
    code, r = s.post("/v1/responses", body)
    check("responses: a Response (404 before)", code == 200 and r.get("object") == "response" and
          r["id"].startswith("resp_") and r["status"] in ("completed", "incomplete") and
          isinstance(r.get("created_at"), int), str(r)[:300])
    if code != 200:
        return
    kinds = [it["type"] for it in r["output"]]
    rs, tx = texts(r)
    check("responses: a reasoning item (effort low: thinking on), then the message", kinds[:1] == ["reasoning"] and
          rs and r["output"][0]["summary"] == [] and all(k in ("reasoning", "message") for k in kinds), str(kinds))
    u = r["usage"]
    check("responses: usage (input, output, reasoning tokens within the output, cached) and timings",
          u["input_tokens"] > 0 and 0 < u["output_tokens"] <= 40 and
          0 < u["output_tokens_details"]["reasoning_tokens"] <= u["output_tokens"] and
          u["total_tokens"] == u["input_tokens"] + u["output_tokens"] and
          u["input_tokens_details"]["cached_tokens"] >= 0 and r["timings"]["predicted_n"] == u["output_tokens"], str(u))
    # the same conversation on the chat endpoint: the same prompt and answer
    chat = {"messages": [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": "Tell me about the hearth."}],
            "max_tokens": 40, "temperature": 0, "chat_template_kwargs": {"enable_thinking": True}}
    code, c = s.post("/v1/chat/completions", chat)
    m = c["choices"][0]["message"] if code == 200 else {}
    check("responses: instructions reach the prompt as the system message (chat's answer and prompt size)",
          code == 200 and c["usage"]["prompt_tokens"] == u["input_tokens"] and
          (m.get("reasoning_content") or "") == rs and (m.get("content") or "") == tx, f"{m} vs {rs!r} {tx!r}")
    code2, r2 = s.post("/v1/responses", {**body, "instructions": "Answer in one word."})
    check("responses: other instructions, another prompt", code2 == 200 and
          r2["usage"]["input_tokens"] != u["input_tokens"], str(r2.get("usage")))
    code, ev = stream(s, body)
    names = [n for n, _ in ev]
    seqs = [e.get("sequence_number") for _, e in ev]
    check("streamed: every event named as its type, a published one, numbered 0, 1, 2, ...", code == 200 and
          all(n == e["type"] and n in EVENTS for n, e in ev) and seqs == list(range(len(ev))), str(names)[:300])
    last = "response.incomplete" if r["status"] == "incomplete" else "response.completed"
    check("streamed: created, in_progress first, the item events between, the final one last",
          names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                        "response.content_part.added"] and names[-1] == last and
          ev[0][1]["response"]["status"] == "in_progress" and ev[0][1]["response"]["output"] == [], str(names)[:300])
    items, final = assemble(ev)
    check("streamed: the events put together the whole answer's Response", final is not None and
          no_ids(final) == no_ids(r) and [no_ids(i) for i in items] == no_ids(r)["output"],
          f"{json.dumps(final)[:400]} vs {json.dumps(r)[:400]}")
    deltas = [e for n, e in ev if n == "response.output_text.delta"]
    check("streamed: output_text deltas each name the message item and content part",
          all(d["item_id"].startswith("msg_") and d["content_index"] == 0 for d in deltas) and
          "".join(d["delta"] for d in deltas) == tx, str(deltas)[:300])
    # reasoning.summary asked: the thinking stands in the summary (hearth writes none of its own)
    code, rsum = s.post("/v1/responses", {**body, "reasoning": {"effort": "low", "summary": "auto"}})
    it = rsum["output"][0] if code == 200 else {}
    code, ev = stream(s, {**body, "reasoning": {"effort": "low", "summary": "auto"}})
    items, final = assemble(ev)
    names = [n for n, _ in ev]
    check("reasoning.summary auto: the thinking as the summary (summary_text), whole and streamed alike",
          it.get("type") == "reasoning" and it["summary"] == [{"type": "summary_text", "text": rs}] and
          "content" not in it and texts(rsum)[1] == tx and final is not None and no_ids(final) == no_ids(rsum) and
          "response.reasoning_summary_text.delta" in names and "response.reasoning_text.delta" not in names,
          f"{str(it)[:200]} {names[:8]}")
    # effort none: thinking off, no reasoning item
    code, r = s.post("/v1/responses", {**body, "reasoning": {"effort": "none"}})
    check("reasoning effort none: no reasoning item, reasoning_tokens 0", code == 200 and
          all(it["type"] != "reasoning" for it in r["output"]) and
          r["usage"]["output_tokens_details"]["reasoning_tokens"] == 0, str(r)[:300])
    # max_output_tokens: incomplete, its reason
    code, r = s.post("/v1/responses", {**body, "max_output_tokens": 3})
    check("max_output_tokens 3: status incomplete, reason max_output_tokens, the item incomplete",
          code == 200 and r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "max_output_tokens"} and
          r["usage"]["output_tokens"] == 3 and r["output"][-1]["status"] == "incomplete", str(r)[:300])
    code, r = s.post("/v1/responses", {**body, "store": True, "metadata": {"k": "v"}, "user": "u1",
                                       "parallel_tool_calls": False})
    check("store, metadata, user, parallel_tool_calls accepted; store false: nothing kept", code == 200 and
          r["store"] is False and r["metadata"] == {"k": "v"} and r["user"] == "u1" and
          r["parallel_tool_calls"] is False, str(r)[:300])


def second_turn(s):
    """turn 2 sends turn 1's items back (stateless): the cache serves the prefix"""
    t1 = [{"role": "user", "content": [{"type": "input_text", "text": "Name a hearth."}]}]
    body = {"model": "m", "instructions": "You are terse.", "max_output_tokens": 16, "temperature": 0,
            "reasoning": {"effort": "none"}}
    code, r1 = s.post("/v1/responses", {**body, "input": t1})
    t2 = t1 + (r1.get("output") or []) + [{"role": "user", "content": "Another?"}]
    code2, r2 = s.post("/v1/responses", {**body, "input": t2})
    u = r2.get("usage", {})
    check("second turn: cached_tokens > 0, the rest prefilled", code == 200 and code2 == 200 and
          u["input_tokens_details"]["cached_tokens"] > 0 and
          r2["timings"]["prompt_n"] == u["input_tokens"] - u["input_tokens_details"]["cached_tokens"], str(u))
    _, tx = texts(r1)
    chat = {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a hearth."},
                         {"role": "assistant", "content": tx}, {"role": "user", "content": "Another?"}],
            "max_tokens": 16, "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}}
    code, c = s.post("/v1/chat/completions", chat)
    check("second turn: the output items read back as the assistant's message (chat's prompt and answer)",
          code == 200 and c["usage"]["prompt_tokens"] == u["input_tokens"] and
          c["choices"][0]["message"]["content"] == texts(r2)[1], f"{c.get('usage')} {u}")


def structured(s):
    person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    body = {"model": "m", "input": "Describe a person as JSON.", "max_output_tokens": 80, "temperature": 0,
            "reasoning": {"effort": "none"}}
    code, r = s.post("/v1/responses", {**body, "text": {"format": {"type": "json_schema", "name": "person",
                                                                   "schema": person, "strict": True}}})
    tx = texts(r)[1] if code == 200 else ""
    try:
        o = json.loads(tx)
    except ValueError:
        o = None
    check("text.format json_schema: the answer parses and fits the schema", isinstance(o, dict) and
          set(o) == {"name", "age"} and isinstance(o["age"], int) and r["text"]["format"]["type"] == "json_schema",
          repr(tx)[:200])
    code, plain = s.post("/v1/responses", body)
    check("without text.format the demo model writes no such JSON (the mask did it)", code == 200 and
          texts(plain)[1] != tx, repr(texts(plain)[1])[:100])


def errors(s):
    def bad(name, body, *words):
        code, j = s.post("/v1/responses", {"model": "m", **body})
        msg = j["error"]["message"] if isinstance(j, dict) and "error" in j else str(j)
        check(f"400 naming it: {name}", code == 400 and all(w in msg for w in words) and
              j["error"]["type"] == "invalid_request_error", f"{code} {msg}")
    img = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    bad("an input_image part", {"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"}, img]}]},
        "input_image", '"input"[0].content[1]')
    bad("an input_file part", {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
        "input_file")
    bad("an unknown item type", {"input": [{"type": "web_search_call", "id": "w"}]}, '"input"[0]', "web_search_call")
    bad("an unknown role", {"input": [{"role": "wizard", "content": "x"}]}, '"input"[0].role')
    bad("previous_response_id", {"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "stores no")
    bad("an item_reference", {"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference")
    bad("a hosted tool", {"input": "x", "tools": [{"type": "web_search"}]}, '"tools"[0]', "web_search")
    bad("a function tool without a name", {"input": "x", "tools": [{"type": "function"}]}, '"tools"[0].name')
    bad("a function_call without call_id", {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
        "call_id")
    bad("max_output_tokens 0", {"input": "x", "max_output_tokens": 0}, "max_output_tokens")
    bad("an unknown reasoning effort", {"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning")
    bad("text.format of an unknown type", {"input": "x", "text": {"format": {"type": "yaml"}}}, "text", "yaml")
    bad("json_schema without a schema", {"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}},
        "schema")
    bad("no input", {"instructions": "x"}, '"input"')
    bad("a schema keyword not done", {"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {
        "type": "string", "pattern": "a+"}}}}, "pattern")


def tool_calls(model):
    reply = os.path.join(TMP, "responses-reply.txt")
    with open(reply, "w") as f:  # the prompt opens <think> (effort high): the reply starts in it
        f.write("plan it\n</think>\n\nLooking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                "San Jose, \"CA\"\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
                "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>")
    want = [("get_weather", {"city": 'San Jose, "CA"', "days": 3}), ("get_weather", {"city": "Oslo"})]
    tools = [{"type": "function", "name": "get_weather", "description": "weather by city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}]
    body = {"model": "m", "input": "weather?", "tools": tools, "max_output_tokens": 200, "reasoning": {"effort": "high"}}
    s = Server(model, "-np", "1", "--chat-template-file", QWEN35, env={"HEARTH_TEST_REPLY": reply})
    code, r = s.post("/v1/responses", body)
    out = r.get("output", []) if code == 200 else []
    calls = [it for it in out if it["type"] == "function_call"]
    got = [(c["name"], json.loads(c["arguments"])) for c in calls]
    check("tool calls: reasoning, message, then two function_call items with call_id, name, arguments",
          [it["type"] for it in out] == ["reasoning", "message", "function_call", "function_call"] and got == want and
          all(c["call_id"].startswith("call_") and c["id"].startswith("fc_") and c["status"] == "completed"
              for c in calls) and len({c["call_id"] for c in calls}) == 2 and texts(r) == ("plan it\n", "Looking.\n") and
          r["status"] == "completed", str(out)[:400])
    code, ev = stream(s, body)
    items, final = assemble(ev)
    args = [e for n, e in ev if n == "response.function_call_arguments.delta"]
    check("tool calls streamed: the same items, their arguments from the deltas, a done event each",
          final is not None and no_ids(final)["output"] == no_ids(r)["output"] and
          [no_ids(i) for i in items] == no_ids(r)["output"] and len(args) >= 2 and
          [e["arguments"] for n, e in ev if n == "response.function_call_arguments.done"] ==
          [c["arguments"] for c in calls], str([n for n, _ in ev])[:300])
    _, p_tools = s.post("/apply-template", {"messages": [{"role": "user", "content": "weather?"}],
                                            "tools": [{"type": "function", "function": {
                                                "name": "get_weather", "description": "weather by city",
                                                "parameters": tools[0]["parameters"]}}]})
    _, c = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "weather?"}], "max_tokens": 200,
                                           "tools": [{"type": "function", "function": {
                                               "name": "get_weather", "description": "weather by city",
                                               "parameters": tools[0]["parameters"]}}],
                                           "chat_template_kwargs": {"enable_thinking": True}})
    check("tool calls: the tools reach the prompt as chat's do (the same prompt size)",
          "get_weather" in p_tools.get("prompt", "") and c["usage"]["prompt_tokens"] == r["usage"]["input_tokens"],
          f"{c.get('usage')} vs {r.get('usage')}")
    code, r = s.post("/v1/responses", {**body, "tool_choice": "none"})
    check("tool_choice none: no function_call items, the call's text stays in the message", code == 200 and
          all(it["type"] != "function_call" for it in r["output"]) and "<tool_call>" in texts(r)[1], str(r)[:300])
    s.stop()


def round_trip(model):
    """a function call's round trip on the demo model: the calls and their outputs sent back
    as items must give chat's prompt (assistant tool_calls, tool messages) and its answer"""
    s = Server(model, "-np", "1", "--chat-template-file", QWEN35)
    tools = [{"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}]
    items = [{"role": "user", "content": "weather in Oslo?"},
             {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "ask it"}]},
             {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "get_weather",
              "arguments": "{\"city\": \"Oslo\"}"},
             {"type": "function_call_output", "call_id": "call_a", "output": "rain, 4 C"}]
    code, r = s.post("/v1/responses", {"model": "m", "input": items, "tools": tools, "max_output_tokens": 24,
                                       "temperature": 0, "reasoning": {"effort": "none"}})
    msgs = [{"role": "user", "content": "weather in Oslo?"},
            {"role": "assistant", "content": "", "reasoning_content": "ask it", "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "get_weather",
                                                                   "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": "rain, 4 C"}]
    ctools = [{"type": "function", "function": {"name": "get_weather", "parameters": tools[0]["parameters"]}}]
    code2, c = s.post("/v1/chat/completions", {"messages": msgs, "tools": ctools, "max_tokens": 24, "temperature": 0,
                                               "chat_template_kwargs": {"enable_thinking": False}})
    _, p = s.post("/apply-template", {"messages": msgs, "tools": ctools})
    check("function_call_output round trip: chat's prompt (with the tool's answer) and chat's answer",
          code == 200 and code2 == 200 and "rain, 4 C" in p.get("prompt", "") and
          c["usage"]["prompt_tokens"] == r["usage"]["input_tokens"] and
          c["choices"][0]["message"]["content"] == texts(r)[1], f"{str(r)[:300]} vs {str(c)[:300]}")
    # tool_choice naming a function: the grammar of the template's call form makes the demo
    # model write one, which comes back as a function_call item with arguments of its schema
    cities = [{"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Oslo", "Paris", "Rome"]}}, "required": ["city"]}}]
    code, r = s.post("/v1/responses", {"model": "m", "input": "weather in Oslo?", "tools": cities, "temperature": 0,
                                       "tool_choice": {"type": "function", "name": "get_weather"},
                                       "max_output_tokens": 200, "reasoning": {"effort": "none"}})
    calls = [it for it in r.get("output", []) if it["type"] == "function_call"] if code == 200 else []
    args = json.loads(calls[0]["arguments"]) if calls else None
    check("tool_choice a function: the demo model's forced call is a function_call item fitting its schema",
          len(calls) == 1 and calls[0]["name"] == "get_weather" and isinstance(args, dict) and list(args) == ["city"]
          and args["city"] in ("Oslo", "Paris", "Rome") and r["status"] == "completed", str(r)[:400])
    s.stop()


def sigterm_mid_stream(model):
    """SIGTERM while a Response streams: the stream ends with response.failed (status failed,
    the error's message), its open item closed incomplete, the numbering unbroken"""
    s = Server(model, "-np", "1")
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    c.request("POST", "/v1/responses", body=json.dumps({
        "model": "m", "input": "a long story", "max_output_tokens": 3000, "ignore_eos": True, "stream": True,
        "reasoning": {"effort": "none"}}).encode(), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    first = b""
    while b"response.output_text.delta" not in first:  # the message item is open, its text streaming
        line = r.readline()
        if not line:
            break
        first += line
    rc = s.stop()
    text = first.decode() + r.read().decode()
    c.close()
    ev = []
    for block in text.split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: "):
                ev.append(json.loads(line[6:]))
    last = ev[-1] if ev else {}
    resp = last.get("response", {})
    check("SIGTERM mid-stream: response.failed last, status failed with the error, the message item incomplete",
          rc == 0 and last.get("type") == "response.failed" and resp.get("status") == "failed" and
          resp.get("error", {}).get("message") and resp["output"] and resp["output"][-1]["status"] == "incomplete" and
          [e["sequence_number"] for e in ev] == list(range(len(ev))), f"rc {rc} {str(last)[:300]}")


def main():
    if not os.path.exists(DEMO):
        print(f"SKIP serve_responses_test: {DEMO} missing")
        print("0 passed, 0 failed")
        return 0
    s = Server(DEMO, "-np", "1")
    whole_and_streamed(s)
    second_turn(s)
    structured(s)
    errors(s)
    s.stop()
    tool_calls(DEMO)
    round_trip(DEMO)
    sigterm_mid_stream(DEMO)
    return 1 if checks.summary() else 0


if __name__ == "__main__":
    sys.exit(main())
