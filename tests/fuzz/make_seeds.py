#!/usr/bin/env python3
"""make_seeds.py: writes the seed corpora of the fuzz targets into tests/fuzz/corpus/NAME/
(safetensors, hf_config, request, jinja, tokenizer, answer) from the repo's fixtures and a
few hand-made inputs, so they can be remade. gguf's seeds come from tests/cli/mkgguf.py,
cache's from the target itself (HEARTH_FUZZ_CACHE_SEEDS, see README.md).

Usage: python3 tests/fuzz/make_seeds.py [OUTDIR]   (default tests/fuzz/corpus)"""
import json
import os
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "fuzz", "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, meta=None):
    """a .safetensors file: tensors = [(name, dtype, shape, bytes)]"""
    hdr, blob = {}, b""
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dt, shape, data in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    h = json.dumps(hdr).encode()
    return struct.pack("<Q", len(h)) + h + blob


def main():
    # safetensors: every dtype convert meets, metadata, empty and scalar tensors
    f32 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.25)
    put("safetensors", "f32.safetensors", safetensors([("a.weight", "F32", [2, 2], f32)], {"format": "pt"}))
    put("safetensors", "f16-bf16.safetensors", safetensors([("h", "F16", [3], b"\x00\x3c\x00\xc0\x00\x7c"),
                                                            ("b", "BF16", [1, 3], b"\x80\x3f\x00\xc0\x80\x7f")]))
    put("safetensors", "ints.safetensors", safetensors([("i", "I64", [2], struct.pack("<2q", 1, -1)),
                                                        ("u", "U8", [3], b"abc"), ("z", "F32", [0, 4], b""),
                                                        ("s", "F32", [], struct.pack("<f", 7.0))]))
    put("safetensors", "empty.safetensors", safetensors([]))
    # hf_config: the fixture's, a multimodal one (text_config), one with rope_scaling
    cfg = json.load(open(os.path.join(ROOT, "tests", "fixtures", "hf_tiny", "config.json")))
    put("hf_config", "hf_tiny.json", json.dumps(cfg, indent=1))
    mm = {"model_type": "qwen3_5_moe", "text_config": dict(cfg, model_type="qwen3_5_moe_text"),
          "vision_config": {"depth": 2}, "tie_word_embeddings": True}
    put("hf_config", "multimodal.json", json.dumps(mm))
    old = dict(cfg)
    del old["rope_parameters"], old["layer_types"]
    old.update(rope_scaling={"type": "default", "mrope_section": [11, 11, 10]}, rope_theta=1e6, full_attention_interval=2)
    put("hf_config", "rope-scaling.json", json.dumps(old))
    # request: one body per endpoint selector (fuzz_request.c's first byte)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello", "reasoning_content": "think",
             "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
            {"role": "tool", "content": "42"}, {"role": "user", "content": [{"type": "text", "text": "more"}]}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties":
                                                                         {"x": {"type": "integer"}}}}}]
    bodies = [
        (0, {"messages": msgs, "max_tokens": 8, "temperature": 0, "stop": ["x", "\n\n"], "tools": tools, "stream": True,
             "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2, "seed": 3,
             "chat_template_kwargs": {"enable_thinking": False}, "response_format": {"type": "text"}}),
        (1, {"prompt": "Once upon a time", "n_predict": 16, "top_k": 5, "top_p": 0.9, "min_p": 0.1, "repeat_penalty": 1.1,
             "repeat_last_n": -1, "ignore_eos": True, "cache_prompt": False, "id_slot": 0, "return_tokens": True}),
        (2, {"prompt": [1, 2, 3, 99], "max_tokens": 4, "logprobs": 2, "presence_penalty": 0.5, "frequency_penalty": -0.5}),
        (3, {"model": "m", "max_tokens": 16, "system": [{"type": "text", "text": "s"}], "thinking": {"type": "enabled"},
             "stop_sequences": ["END"], "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
             "messages": [{"role": "user", "content": "hi"},
                          {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"},
                                                            {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]}),
        (4, {"messages": [{"role": "user", "content": [{"type": "text", "text": "count me"}]}]}),
        (5, {"content": "Hello <|im_start|> world", "add_special": True, "with_pieces": True, "parse_special": False}),
        (6, {"tokens": [9707, 1879, 0, 151643]}),
        (7, {"messages": msgs, "tools": tools}),
        (8, {"filename": "conv-a.bin"}),
        (9, {"model": "m", "instructions": "Be brief.", "max_output_tokens": 16, "temperature": 0, "top_p": 0.9,
             "reasoning": {"effort": "low", "summary": "auto"}, "store": True, "metadata": {"k": "v"}, "user": "u",
             "parallel_tool_calls": False, "tool_choice": {"type": "function", "name": "f"},
             "tools": [{"type": "function", "name": "f", "description": "d", "parameters": tools[0]["function"]["parameters"]}],
             "text": {"format": {"type": "json_schema", "name": "o", "schema": {"type": "object"}}},
             "input": [{"role": "developer", "content": "d"}, {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                       {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}]},
                       {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
                       {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\": 1}"},
                       {"type": "function_call_output", "call_id": "c1", "output": "42"}]}),
    ]
    for sel, b in bodies:
        put("request", f"endpoint-{sel}.bin", bytes([sel]) + json.dumps(b).encode())
    # jinja: each fixture template with a chat of the fixture chats
    chats = json.load(open(os.path.join(ROOT, "tests", "fixtures", "chat", "chats.json")))
    tdirs = [os.path.join(ROOT, "tests", "fixtures", "chat", "templates"), os.path.join(ROOT, "tests", "fixtures", "templates")]
    k = 0
    for d in tdirs:
        for name in sorted(os.listdir(d)):
            if not name.endswith(".jinja"):
                continue
            src = open(os.path.join(d, name), "rb").read()
            chat = chats[k * 7 % len(chats)]
            k += 1
            put("jinja", name.replace(".jinja", ".bin"), src + b"\0" + json.dumps(chat).encode())
    # tokenizer: flags byte (bit 0 qwen2, bit 1 specials) + text from the corpus and vectors
    lines = [json.loads(x) for x in open(os.path.join(ROOT, "tests", "fixtures", "tok", "corpus.jsonl"))]
    lines = [x["t"].encode() if "t" in x else bytes.fromhex(x["hex"]) for x in lines]
    picks = [lines[i] for i in range(0, len(lines), 97)][:26]
    inp = open(os.path.join(ROOT, "tests", "fixtures", "vocab", "ggml-vocab-qwen35.gguf.inp"), encoding="utf-8").read()
    picks += [t.encode() for t in inp.split("\n__ggml_vocab_test__\n")[:12]]
    picks += [b"<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>", b"\xff\xfe not utf-8 \xc3", b"   \n\n\t 12345 ABC's"]
    for i, raw in enumerate(picks):
        put("tokenizer", f"text-{i:02d}.bin", bytes([i & 3]) + raw)
    # answer: flags, piece seed, stop strings (NUL-ended), then the model's text
    texts = [
        (0x05, [], "<think>plan</think>\n\nHello <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                   "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"),
        (0x04, [], "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>\nafter"),
        (0x03, [], "still thinking</think>answer"),
        (0x0d, ["END"], "<think>a</think>b END c"),
        (0x14, ["zyy", "y"], "azyy1"),
        (0x04, [], "<tool_call><function=f><parameter=q>\"x\"</parameter>"),
        (0x00, [], "plain text \xe2\x82\xac"),
        (0x2c, ["END"], "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
                        "<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call> END"),
    ]
    for i, (fl, stops, text) in enumerate(texts):
        put("answer", f"text-{i}.bin", bytes([fl, 7]) + b"".join(s.encode() + b"\0" for s in stops) + text.encode())


if __name__ == "__main__":
    main()
