#!/usr/bin/env python3
"""jinja_render.py: the reference for hearth's chat templates (src/chat.h): renders a chat
template the way Hugging Face transformers' apply_chat_template does, with python3's jinja2
and nothing else: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with
the loopcontrols extension and a no-op {% generation %} block, the raise_exception and
strftime_now globals, and transformers' tojson filter (json.dumps with ensure_ascii=False,
the given indent/separators/sort_keys). Render variables as transformers passes them:
messages, tools (None when absent), documents (None), add_generation_prompt, then the
special tokens and extra keyword arguments (enable_thinking, bos_token, eos_token, ...).

    jinja_render.py TEMPLATE CHAT.json            # prints the rendering (exit 1 on a template error)
    jinja_render.py TEMPLATE --batch CHATS.json   # one JSON line per chat: {"ok":..,"text"|"error":..}
    jinja_render.py TEMPLATE --hashes CHATS.json  # one line per chat: "i ok LEN FNV1A64" or "i error"

CHAT.json is an object: {"messages": [...], "tools": [...], "add_generation_prompt": bool,
"enable_thinking": bool, "bos_token": str, "eos_token": str, "extra": {name: value}}; only
"messages" is required, and a key left out is left undefined (tools: None). CHATS.json is a
list of such objects. strftime_now uses the time in $HEARTH_NOW (seconds since the epoch, UTC)
when set, so that renderings are reproducible.
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationTracker(Extension):
    """transformers' AssistantTracker without the tracking: {% generation %} renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    now = os.environ.get("HEARTH_NOW")
    if now is not None:
        return datetime.datetime.fromtimestamp(int(now), datetime.timezone.utc).strftime(fmt)
    return datetime.datetime.now().strftime(fmt)


def compile_template(src):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(src)


def render(tmpl, chat):
    kw = {"messages": chat["messages"], "tools": chat.get("tools"), "documents": None,
          "add_generation_prompt": bool(chat.get("add_generation_prompt", False))}
    for k in ("enable_thinking", "bos_token", "eos_token"):
        if k in chat:
            kw[k] = chat[k]
    kw.update(chat.get("extra", {}))
    return tmpl.render(**kw)


def fnv1a64(b):
    h = 0xcbf29ce484222325
    for c in b:
        h = ((h ^ c) * 0x100000001b3) & 0xffffffffffffffff
    return h


def main():
    args = sys.argv[1:]
    if len(args) not in (2, 3):
        sys.exit(__doc__)
    with open(args[0], encoding="utf-8", newline="") as f:
        src = f.read()
    mode = args[1] if len(args) == 3 else None
    with open(args[-1], encoding="utf-8") as f:
        data = json.load(f)
    try:
        tmpl = compile_template(src)
    except jinja2.TemplateError as e:
        if mode is None:
            sys.exit(f"template error: {e}")
        tmpl, parse_error = None, e
    out = sys.stdout.buffer
    if mode is None:
        try:
            out.write(render(tmpl, data).encode("utf-8"))
        except Exception as e:
            sys.exit(f"render error: {type(e).__name__}: {e}")
        return
    for i, chat in enumerate(data):
        try:
            if tmpl is None:
                raise parse_error
            text = render(tmpl, chat)
            b = text.encode("utf-8")
            ok = True
        except Exception as e:
            ok, err = False, f"{type(e).__name__}: {e}"
        if mode == "--batch":
            line = {"ok": True, "text": text} if ok else {"ok": False, "error": err}
            out.write((json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8"))
        elif mode == "--hashes":
            out.write((f"{i} ok {len(b)} {fnv1a64(b):016x}\n" if ok else f"{i} error\n").encode())
        else:
            sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
