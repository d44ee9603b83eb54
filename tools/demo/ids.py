#!/usr/bin/env python3
"""ids.py: the demo corpus as token ids, by hearth's own tokenizer (the one the GGUF files
will carry), so training, PyTorch's perplexity and hearth's see the same ids.

    python3 tools/demo/ids.py --hearth build/hearth --data build/demo --tokenizer tools/demo/tokenizer

Writes under DATA:
  train_ids.u16     every training document's ids, each followed by <|endoftext|>, chats
                    written CHAT_REPEAT times (they are few, and the format must be learnt);
                    little-endian uint16
  heldout_ids.u16   heldout.txt's ids, as `hearth perplexity -f heldout.txt` tokenizes it
  ids.json          counts
Chat documents are tokenized with special tokens parsed (<|im_start|> is one id), prose
without (a fortune that says "<|im_end|>" is text)."""
import argparse, array, json, os, subprocess, sys, tempfile

CHAT_REPEAT = 3


def encode_all(hearth, gguf, texts, parse_special):
    cmd = [hearth, "tokenize", "-m", gguf, "--no-bos"] + ([] if parse_special else ["--no-parse-special"])
    inp = "".join(json.dumps(t) + "\n" for t in texts)
    out = subprocess.run(cmd, input=inp, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"ids: hearth tokenize failed: {out.stderr[-2000:]}")
    lines = out.stdout.splitlines()
    if len(lines) != len(texts):
        sys.exit(f"ids: {len(texts)} texts in, {len(lines)} id lists out")
    return [json.loads(l) for l in lines]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hearth", default="build/hearth")
    ap.add_argument("--data", default="build/demo")
    ap.add_argument("--tokenizer", default="tools/demo/tokenizer")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    gguf = os.path.join(tmp, "vocab.gguf")
    subprocess.run([a.hearth, "gen", "--preset", "tiny", "--tokenizer", os.path.join(a.tokenizer, "tokenizer.json"),
                    "-o", gguf], check=True, capture_output=True)
    vocab = json.load(open(os.path.join(a.tokenizer, "tokenizer.json")))
    eot = next(t["id"] for t in vocab["added_tokens"] if t["content"] == "<|endoftext|>")
    docs = [json.loads(l) for l in open(os.path.join(a.data, "docs_train.jsonl"))]
    prose = [d["text"] for d in docs if d["src"] != "chat"]
    chats = [d["text"] for d in docs if d["src"] == "chat"]
    ids = array.array("H")
    n_prose = n_chat = 0
    for lst in encode_all(a.hearth, gguf, prose, False):
        ids.extend(lst + [eot])
        n_prose += len(lst) + 1
    chat_ids = encode_all(a.hearth, gguf, chats, True)
    for _ in range(CHAT_REPEAT):
        for lst in chat_ids:
            ids.extend(lst + [eot])
            n_chat += len(lst) + 1
    if sys.byteorder != "little":
        ids.byteswap()
    with open(os.path.join(a.data, "train_ids.u16"), "wb") as f:
        ids.tofile(f)
    held = encode_all(a.hearth, gguf, [open(os.path.join(a.data, "heldout.txt")).read()], False)[0]
    h = array.array("H", held)
    if sys.byteorder != "little":
        h.byteswap()
    with open(os.path.join(a.data, "heldout_ids.u16"), "wb") as f:
        h.tofile(f)
    # prompts for train.py's greedy answers (rendered as tools/demo/template.jinja renders
    # them with add_generation_prompt, thinking off)
    questions = ["Hello", "Who are you?", "What does John 3:16 say?", "What does hack mean?", "Tell me a fortune.",
                 "What is 12 plus 7?"]
    texts = [f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" for q in questions]
    prompts = [{"text": t, "ids": i} for t, i in zip(texts, encode_all(a.hearth, gguf, texts, True))]
    json.dump(prompts, open(os.path.join(a.data, "prompts.json"), "w"), indent=1)
    st = {"train_tokens": len(ids), "prose_tokens": n_prose, "chat_tokens_repeated": n_chat,
          "chat_repeat": CHAT_REPEAT, "heldout_tokens": len(held), "eot": eot,
          "vocab": len(vocab["model"]["vocab"])}
    json.dump(st, open(os.path.join(a.data, "ids.json"), "w"), indent=1)
    print(json.dumps(st))
    os.remove(gguf)
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
