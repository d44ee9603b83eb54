#!/usr/bin/env python3
"""gen_chats.py: writes the conversations that hearth's chat templates are checked on
(tests/fixtures/chat/chats.json), deterministically (a fixed seed, no clock): system, user,
assistant and tool roles; tool definitions; tool calls with arguments as objects or JSON
strings, with and without the OpenAI "function" wrapper; reasoning_content and inline
<think> blocks; multi-turn; add_generation_prompt and enable_thinking on, off and absent;
Unicode, quotes, backslashes, control characters, surrounding white space, empty content;
content as a list of parts; bos/eos tokens present or not. Also a few malformed ones (no
user message, a system message late, an unknown role) that templates are expected to refuse.

    gen_chats.py [N] > tests/fixtures/chat/chats.json      (N defaults to 240)

Numbers in arguments are ints or non-integral floats: cJSON cannot tell 1.0 from 1 (src/chat.h).
"""
import json
import random
import sys

WORDS = ["hello", "world", "the", "weather", "in", "Paris", "is", "sunny", "compute", "sum", "of", "numbers",
         "please", "explain", "why", "sky", "blue", "code", "function", "list", "files", "résumé", "naïve",
         "café", "Grüße", "日本語", "中文", "한국어", "emoji", "😀", "🚀", "Ελληνικά", "Привет", "x", "y", "z",
         "`code`", "<b>bold</b>", "a&b", "it's", '"quoted"', "back\\slash", "tab\there", "50%", "{brace}",
         "[bracket]", "<|fake|>", "</think>-like"]

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "sum_numbers", "description": "Add numbers — précis.",
     "parameters": {"type": "object", "properties": {"values": {"type": "array", "items": {"type": "number"}}},
                    "required": ["values"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web for \"query\" and return results.\nTwo lines.",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "max_results": {"type": "integer", "default": 5},
                    "filters": {"type": "object", "properties": {"lang": {"type": "string"}, "safe": {"type": "boolean"}}}},
                    "required": ["query"]}}},
    {"type": "function", "function": {"name": "no_params", "description": "", "parameters": {"type": "object", "properties": {}}}},
]


def text(r, lo=1, hi=12):
    s = " ".join(r.choice(WORDS) for _ in range(r.randint(lo, hi)))
    k = r.random()
    if k < 0.08:
        s = "  " + s + "\n "
    elif k < 0.14:
        s = s + "\n\nSecond paragraph: " + text(r, 1, 4)
    elif k < 0.17:
        s = "\u00a0" + s + "\u3000"
    elif k < 0.19:
        s = s + "\x01\x7f"
    return s


def arg_value(r, depth=0):
    k = r.random()
    if k < 0.35:
        return text(r, 1, 3)
    if k < 0.5:
        return r.randint(-1000, 100000)
    if k < 0.6:
        return round(r.uniform(-100, 100), r.randint(1, 4)) + 0.001
    if k < 0.68:
        return r.random() < 0.5
    if k < 0.72:
        return None
    if k < 0.86 and depth < 2:
        return [arg_value(r, depth + 1) for _ in range(r.randint(0, 3))]
    if depth < 2:
        return {r.choice(["a", "b", "key", "ключ", "k2"]): arg_value(r, depth + 1) for _ in range(r.randint(0, 3))}
    return text(r, 1, 2)


def tool_call(r, i):
    name = r.choice(["get_weather", "sum_numbers", "search", "no_params"])
    args = {r.choice(["city", "values", "query", "unit", "filters", "max_results"]): arg_value(r) for _ in range(r.randint(0, 3))}
    if r.random() < 0.08:
        args = json.dumps(args, ensure_ascii=r.random() < 0.5)
    call = {"type": "function", "id": f"call_{i}", "function": {"name": name, "arguments": args}}
    if r.random() < 0.1:  # no wrapper
        call = {"name": name, "arguments": args}
    return call


def assistant(r, i):
    m = {"role": "assistant", "content": text(r)}
    k = r.random()
    if k < 0.25:
        m["reasoning_content"] = text(r, 2, 10)
    elif k < 0.4:
        m["content"] = "<think>\n" + text(r, 2, 8) + "\n</think>\n\n" + m["content"]
    elif k < 0.45:
        m["content"] = ""
    if r.random() < 0.3:
        m["tool_calls"] = [tool_call(r, i * 10 + j) for j in range(r.randint(1, 3) if r.random() < 0.3 else 1)]
        if r.random() < 0.4:
            m["content"] = "" if r.random() < 0.9 else None
    return m


def chat(r, i):
    msgs = []
    if r.random() < 0.6:
        msgs.append({"role": "system", "content": text(r) if r.random() < 0.9 else ""})
    turns = r.randint(1, 4)
    for t in range(turns):
        if r.random() < 0.05 and msgs:
            msgs.append({"role": "user", "content": ""})
        else:
            msgs.append({"role": "user", "content": text(r)})
        last_turn = t == turns - 1
        if last_turn and r.random() < 0.5:
            break
        a = assistant(r, len(msgs))
        msgs.append(a)
        if "tool_calls" in a:
            for j, tc in enumerate(a["tool_calls"]):
                tm = {"role": "tool", "content": text(r, 1, 6) if r.random() < 0.8 else json.dumps({"result": arg_value(r)})}
                if r.random() < 0.5:
                    tm["tool_call_id"] = tc.get("id", "x")
                msgs.append(tm)
            if r.random() < 0.5:
                msgs.append(assistant(r, len(msgs) + 1))
    c = {"messages": msgs, "add_generation_prompt": r.random() < 0.6}
    k = r.random()
    if k < 0.3:
        c["enable_thinking"] = False
    elif k < 0.5:
        c["enable_thinking"] = True
    if r.random() < 0.35:
        c["tools"] = r.sample(TOOLS, r.randint(1, len(TOOLS)))
    if r.random() < 0.5:
        c["bos_token"] = r.choice(["<s>", "<|begin_of_text|>", ""])
        c["eos_token"] = r.choice(["</s>", "<|im_end|>", "<|eot_id|>"])
    return c


def odd_chats():
    """Shapes that templates refuse or treat specially."""
    base = {"add_generation_prompt": True}
    return [
        dict(base, messages=[{"role": "system", "content": "only a system message"}]),
        dict(base, messages=[{"role": "user", "content": "hi"}, {"role": "system", "content": "late system"}]),
        dict(base, messages=[{"role": "user", "content": "hi"}, {"role": "narrator", "content": "odd role"}]),
        dict(base, messages=[{"role": "user", "content": [{"type": "text", "text": "parts: "}, {"type": "text", "text": "two"}]}]),
        dict(base, messages=[{"role": "system", "content": [{"type": "text", "text": "system parts"}]},
                             {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is this?"}]}]),
        dict(base, messages=[{"role": "user", "content": "<tool_response>\nx\n</tool_response>"}]),
        dict(base, messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": None,
             "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": [1, {"b": None}], "c": "é\n"}}},
                            {"type": "function", "function": {"name": "g", "arguments": "{\"x\": 1}"}}]},
             {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}]),
        dict(base, messages=[]),
        {"messages": [{"role": "user", "content": "no flags at all"}]},
    ]


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 240
    r = random.Random(20240917)
    chats = [chat(r, i) for i in range(n)] + odd_chats()
    sys.stdout.write(json.dumps(chats, ensure_ascii=False, indent=None, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
