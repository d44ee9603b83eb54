#!/usr/bin/env python3
"""tok_expected.py: the ids llama.cpp's llama-tokenize gives for every case of
tests/fixtures/tok/corpus.jsonl, with and without special-token parsing, for the vocab-only
files ggml-vocab-qwen2.gguf and ggml-vocab-qwen35.gguf; written to
tests/fixtures/tok/expected.VOCAB.jsonl, one line per case: {"p": IDS, "n": IDS}, where p is
with special parsing, n without ("n" left out when equal to p), null where llama.cpp aborts.
Run through tools/peer/tok_expected.sh, which finds the peer.

Cases are tokenized in one llama-tokenize run per file and mode, joined by the user-defined
token [PAD151935]: llama.cpp cuts special tokens out first and tokenizes the pieces between
them independently, so each case's ids are exactly those of a run on it alone. A sample of
cases is also run alone to show that this holds."""
import json, os, random, subprocess, sys, tempfile

SEP_TEXT, SEP_ID = "[PAD151935]", 151935
bindir, modeldir, root = sys.argv[1], sys.argv[2], sys.argv[3]
tok = os.path.join(bindir, 'llama-tokenize')


def load_corpus(path):
    out = []
    for line in open(path, encoding='utf-8'):
        o = json.loads(line)
        out.append(o['t'].encode('utf-8') if 't' in o else bytes.fromhex(o['hex']))
    return out


def aborts_llama(b):
    """True when llama.cpp's lenient UTF-8 decoder yields a code point past U+10FFFF (which
    it then fails to encode, throwing out of llama_tokenize)."""
    i = 0
    while i < len(b):
        c = b[i]
        n = 1 if c < 0x80 else 0 if c < 0xc0 else 2 if c < 0xe0 else 3 if c < 0xf0 else 4 if c < 0xf8 else 0
        if n == 0 or i + n > len(b) or any((b[i + k] & 0xc0) != 0x80 for k in range(1, n)):
            i += 1
            continue
        if n == 4 and (((c & 7) << 18) | ((b[i + 1] & 0x3f) << 12)) > 0x10ffff:
            return True
        i += n
    return False


def run(model, data, special):
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(data)
    try:
        cmd = [tok, '-m', model, '--ids', '--log-disable', '--no-escape', '-f', f.name]
        if not special:
            cmd.append('--no-parse-special')
        r = subprocess.run(cmd, capture_output=True)
        if r.returncode != 0:
            return None
        line = [l for l in r.stdout.decode().splitlines() if l.startswith('[')][-1]
        return json.loads(line)
    finally:
        os.unlink(f.name)


def main():
    cases = load_corpus(os.path.join(root, 'tests/fixtures/tok/corpus.jsonl'))
    for vocab in ['qwen2', 'qwen35']:
        model = os.path.join(modeldir, f'ggml-vocab-{vocab}.gguf')
        res = {}
        for special in [True, False]:
            batch = [i for i, c in enumerate(cases) if not aborts_llama(c)]
            ids = run(model, SEP_TEXT.encode().join(cases[i] for i in batch), special)
            if ids is None:
                sys.exit(f'llama-tokenize failed on the batch ({vocab})')
            parts, cur = [], []
            for t in ids:
                if t == SEP_ID:
                    parts.append(cur)
                    cur = []
                else:
                    cur.append(t)
            parts.append(cur)
            if len(parts) != len(batch):
                sys.exit(f'{vocab}: {len(parts)} pieces for {len(batch)} cases')
            got = [None] * len(cases)
            for i, p in zip(batch, parts):
                got[i] = p
            for i, c in enumerate(cases):
                if got[i] is None:
                    got[i] = run(model, c, special)  # stays None where llama.cpp aborts
            sample = random.Random(7).sample(batch, 40)
            same = sum(run(model, cases[i], special) == got[i] for i in sample)
            print(f'{vocab} special={special}: {len(batch)} cases batched, '
                  f'{sum(g is None for g in got)} abort in llama.cpp; {same}/{len(sample)} sampled cases '
                  'give the same ids alone', file=sys.stderr)
            if same != len(sample):
                sys.exit('batching changed the ids')
            res[special] = got
        out = os.path.join(root, f'tests/fixtures/tok/expected.{vocab}.jsonl')
        with open(out, 'w') as f:
            for p, n in zip(res[True], res[False]):
                o = {"p": p}
                if n != p:
                    o["n"] = n
                f.write(json.dumps(o, separators=(',', ':')) + '\n')
        print(f'wrote {out}', file=sys.stderr)


main()
