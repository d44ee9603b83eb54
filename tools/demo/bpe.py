#!/usr/bin/env python3
"""bpe.py: trains the demo model's byte-level BPE tokenizer and writes it as a Hugging Face
tokenizer.json (+ tokenizer_config.json with the chat template), the form `hearth convert`,
`hearth gen --tokenizer` and transformers all read. Standard library only.

    python3 tools/demo/bpe.py --text build/demo/bpe.txt --vocab 4096 --out tools/demo/tokenizer

The method is GPT-2's: the text is split into pre-tokens by Qwen2's split pattern (the one
Qwen3's tokenizer.json names, tokenizer.ggml.pre "qwen2"), each pre-token is mapped to
GPT-2's byte symbols, and the most frequent adjacent pair of symbols is merged, again and
again, counting each pre-token once per occurrence, until the vocabulary has --vocab
tokens: 256 byte symbols, the merges, and the special tokens last. Ties go to the pair whose
(left, right) strings sort first, so a run is deterministic.

Python's `re` has no \\p{L}: letters are [^\\W\\d_] and numbers \\d here (exact for ASCII, and
the corpus is folded to ASCII). That only steers which merges are learnt: the file names the
real pattern, and every program that encodes with it (hearth, llama.cpp, Hugging Face's
tokenizers) splits with \\p{L} and \\p{N} themselves."""
import argparse, collections, heapq, json, os, re, sys

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
PY_PATTERN = re.compile(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|(?:[^\r\n\w]|_)?[^\W\d_]+|\d| ?(?:[^\s\w]|_)+[\r\n]*|"
                        r"\s*[\r\n]+|\s+(?!\S)|\s+")
# (content, special): Qwen's, as Qwen3's tokenizer.json marks them (think tags not special)
SPECIALS = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
            ("<think>", False), ("</think>", False)]


def byte_symbols():
    """GPT-2's map of the 256 bytes to printable characters."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


def train(text, vocab_size, log=sys.stderr):
    sym = byte_symbols()
    counts = collections.Counter(PY_PATTERN.findall(text))
    words = [[sym[b] for b in w.encode("utf-8")] for w in counts]
    freq = [counts[w] for w in counts]
    n_merges = vocab_size - 256 - len(SPECIALS)
    pairs = collections.Counter()
    where = collections.defaultdict(set)
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pairs[(a, b)] += freq[i]
            where[(a, b)].add(i)
    heap = [(-c, p) for p, c in pairs.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < n_merges and heap:
        c, p = heapq.heappop(heap)
        if pairs.get(p, 0) != -c or c == 0:
            continue                        # stale entry: its count changed since it was pushed
        merges.append(p)
        a, b = p
        ab = a + b
        touched = collections.Counter()
        for i in list(where[p]):
            w, f = words[i], freq[i]
            j, out = 0, []
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(ab)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            for x, y in zip(w, w[1:]):
                touched[(x, y)] -= f
            for x, y in zip(out, out[1:]):
                touched[(x, y)] += f
                where[(x, y)].add(i)
            words[i] = out
        for q, d in touched.items():
            if d:
                pairs[q] += d
                if pairs[q] > 0:
                    heapq.heappush(heap, (-pairs[q], q))
        del pairs[p]
        del where[p]
        if len(merges) % 500 == 0:
            print(f"bpe: {len(merges)} merges, last {ab!r} ({-c})", file=log)
    return merges


def tokenizer_json(merges):
    sym = byte_symbols()
    vocab = {sym[b]: b for b in range(256)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    added = []
    for content, special in SPECIALS:
        added.append({"id": len(vocab), "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": special})
        vocab[content] = len(vocab)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": dict(byte_level),
        "decoder": dict(byte_level),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", required=True)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--out", required=True, help="a folder: tokenizer.json and tokenizer_config.json go there")
    ap.add_argument("--template", default=os.path.join(os.path.dirname(__file__), "template.jinja"))
    a = ap.parse_args()
    if a.vocab < 256 + len(SPECIALS) + 1:
        sys.exit(f"bpe: --vocab {a.vocab}: needs at least {256 + len(SPECIALS) + 1}")
    text = open(a.text, encoding="utf-8").read()
    merges = train(text, a.vocab)
    tj = tokenizer_json(merges)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "tokenizer.json"), "w") as f:
        json.dump(tj, f, ensure_ascii=False, indent=None, separators=(",", ":"))
    cfg = {"tokenizer_class": "Qwen2Tokenizer", "model_max_length": 4096, "add_bos_token": False,
           "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
           "unk_token": None, "errors": "replace", "clean_up_tokenization_spaces": False,
           "split_special_tokens": False, "chat_template": open(a.template).read()}
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
    print(f"bpe: {len(tj['model']['vocab'])} tokens ({len(merges)} merges) to {a.out}")


if __name__ == "__main__":
    main()
