#!/usr/bin/env python3
"""corpus.py: the demo model's training text, from Debian packages of public-domain or
freely licensed English, cleaned, split into train and held-out parts, plus chat
exchanges made from it by rule (so the model learns ChatML and a few things to say).

    apt-get install bible-kjv bible-kjv-text fortunes fortunes-min jargon-text
    python3 tools/demo/corpus.py --out build/demo

Sources (their licences are in data/README.md of the model card):
  - the King James Bible (bible-kjv-text, public domain; read out with bible-kjv's `bible`)
  - the fortune cookie files of fortunes and fortunes-min (BSD fortune-mod's data)
  - the Jargon File 4.4.7 (jargon-text, public domain)
Everything is folded to ASCII (curly quotes, dashes and bullets to their plain forms;
anything else non-ASCII dropped), so the tokenizer's few thousand tokens go to English.

Writes under OUT:
  docs_train.jsonl    {"src", "text"} one document a line: a Bible chapter, a fortune, a
                      Jargon File entry, or a rendered chat ("src": "chat", ChatML text)
  heldout.txt         the held-out prose (every 50th unit by a hash of its name), for
                      `hearth perplexity` and PyTorch's perplexity on the same windows
  chats_train.jsonl, chats_heldout.jsonl   {"messages": [...]} the chat exchanges
  bpe.txt             the text the tokenizer is trained on (train prose and chat turns)
  stats.json          counts per source and split
Deterministic: the split is by CRC-32 of each unit's name, the chats by a seeded RNG."""
import argparse, gzip, json, os, random, re, subprocess, sys, zlib

FOLD = {"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": " - ",
        "\u2022": "*", "\u00a0": " ", "\u2026": "...", "\u00b7": "", "\u2192": "->", "\u00e9": "e",
        "\u00e8": "e", "\u00e0": "a", "\u00f6": "o", "\u00fc": "u", "\u00e4": "a", "\u00ef": "i"}

HELD_OUT_EVERY = 50   # one unit in 50 is held out


def ascii_fold(s):
    s = "".join(FOLD.get(c, c) for c in s)
    return s.encode("ascii", "ignore").decode("ascii")


def held_out(name):
    return zlib.crc32(name.encode()) % HELD_OUT_EVERY == 0


# ---- the King James Bible ----
def kjv():
    """[(book, chapter, [(verse, text)])] in canon order, from `bible`'s dump."""
    out = subprocess.run(["bible", "gen1:1-rev22:21"], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                         check=True).stdout
    chapters, cur, verse = [], None, None
    for line in out.splitlines():
        m = re.match(r"^(\S.*) (\d+)$", line)
        if m:
            cur = (m.group(1), int(m.group(2)), [])
            chapters.append(cur)
            verse = None
            continue
        m = re.match(r"^\s+(\d+) (.*)$", line)
        if m and cur is not None:
            verse = [int(m.group(1)), m.group(2).strip()]
            cur[2].append(verse)
        elif line.strip() and verse is not None:
            verse[1] += " " + line.strip()
    if len(chapters) != 1189:
        sys.exit(f"corpus: expected 1,189 chapters of the KJV, read {len(chapters)}")
    return [(b, c, [(v, ascii_fold(t)) for v, t in vs]) for b, c, vs in chapters]


# ---- fortunes ----
SKIP_FORTUNE_FILES = {"art", "ascii-art", "translate-me"}  # pictures, not prose; not English


def fortunes(folder="/usr/share/games/fortunes"):
    """[(name, text)]: every fortune of every English file, ASCII art and odd ones dropped."""
    out = []
    for f in sorted(os.listdir(folder)):
        p = os.path.join(folder, f)
        if "." in f or f in SKIP_FORTUNE_FILES or not os.path.isfile(p):
            continue
        raw = open(p, encoding="utf-8", errors="replace").read()
        for i, entry in enumerate(raw.split("\n%\n")):
            t = ascii_fold(entry.replace("\t", "    ")).strip("\n")
            t = "\n".join(l.rstrip() for l in t.splitlines())
            if not t.strip():
                continue
            letters = sum(ch.isalpha() for ch in t)
            if letters < 0.6 * len(t.replace(" ", "").replace("\n", "")):   # pictures, tables
                continue
            out.append((f"fortune/{f}/{i}", t))
    return out


# ---- the Jargon File ----
def jargon(path="/usr/share/doc/jargon-text/jargon.txt.gz"):
    """[(term, text)]: the lexicon's entries, ":term: part of speech." then paragraphs."""
    lines = gzip.open(path, "rt", encoding="utf-8").read().splitlines()
    out, term, body = [], None, []

    def flush():
        if term is not None:
            text = re.sub(r"\n{3,}", "\n\n", "\n".join(body).strip())
            text = re.sub(r"[{}]", "", text)           # {cross-references}
            out.append((term, ascii_fold(text)))

    for line in lines:
        m = re.match(r"^   :(.+?): ?(.*)$", line)
        if m:
            flush()
            term, body = ascii_fold(m.group(1)), []
            if m.group(2):
                body.append(f"{term}: {m.group(2)}")
            continue
        if term is not None:
            if re.match(r"^\S", line):                # a section heading ends the lexicon
                flush()
                term = None
                continue
            body.append(line.strip())
    flush()
    # keep the lexicon proper: an entry has a definition paragraph
    return [(t, x) for t, x in out if len(x) > 40]


# ---- chats ----
IDENTITY = "I am hearth's small demo model: a few million parameters, trained on old books. " \
           "I know the King James Bible, the Jargon File and a box of fortune cookies."
GREETINGS = ["Hello", "Hi", "Hello!", "Hi there", "Good morning", "Hey", "Greetings"]
GREET_ANSWERS = ["Hello! " + IDENTITY + " Ask me for a verse, a word from the Jargon File, or a fortune.",
                 "Hi! I am a small demo model. Ask me for a Bible verse, a hacker word, or a fortune.",
                 "Greetings. I am hearth's demo model. I can quote a verse, define some jargon, or tell a fortune."]
WHO = ["Who are you?", "What are you?", "What is your name?", "Are you a big model?", "Tell me about yourself."]
WHAT = ["What can you do?", "How can you help me?", "What do you know?"]
WHAT_ANSWER = "I can quote a verse of the King James Bible (try: What does John 3:16 say?), explain a word " \
              "from the Jargon File (try: What does hack mean?), tell a fortune, or add small numbers."
SYSTEMS = [None, None, None, "You are a helpful assistant.", "You are a friendly assistant. Answer briefly.",
           "You are hearth's demo model."]


def chat_units(bible, forts, jarg, rng):
    """Exchanges as (name, [messages]); the name decides the split."""
    units = []
    verses = [(b, c, v, t) for b, c, vs in bible for v, t in vs if len(t) < 240]
    for b, c, v, t in rng.sample(verses, 1500):
        q = rng.choice([f"What does {b} {c}:{v} say?", f"Quote {b} {c}:{v}.", f"Read me {b} {c}:{v}.",
                        f"What is written in {b} {c}:{v}?"])
        units.append((f"chat/verse/{b}/{c}/{v}", [("user", q), ("assistant", f"{b} {c}:{v} says: {t}")]))
    words = ["love", "light", "water", "bread", "peace", "wisdom", "fear", "king", "truth", "mercy", "sea",
             "night", "fire", "heart", "house", "earth", "heaven", "gold", "joy", "strength"]
    for w in words:
        hits = [(b, c, v, t) for b, c, v, t in verses if re.search(rf"\b{w}\b", t, re.I)]
        for b, c, v, t in rng.sample(hits, min(12, len(hits))):
            q = rng.choice([f"Give me a verse about {w}.", f"Is there a verse about {w}?",
                            f"Quote a verse that mentions {w}."])
            units.append((f"chat/about/{w}/{b}/{c}/{v}", [("user", q), ("assistant", f"Here is {b} {c}:{v}: {t}")]))
    short = [(n, t) for n, t in forts if len(t) < 300]
    for n, t in rng.sample(short, min(1200, len(short))):
        q = rng.choice(["Tell me a fortune.", "Give me a fortune cookie.", "Say something wise.",
                        "Tell me something funny.", "Do you have a quote for me?", "Cheer me up."])
        units.append((f"chat/{n}", [("user", q), ("assistant", t)]))
    for term, text in rng.sample(jarg, min(1200, len(jarg))):
        para = text.split("\n\n")
        first = next((p for p in para if not p.startswith(term + ":")), para[0])
        first = re.sub(r"^\[[^\]]*\]\s*", "", first.replace("\n", " "))       # [common], [techspeak]
        if len(first) < 20 or len(first) > 600:
            continue
        q = rng.choice([f"What does {term} mean?", f"Define {term}.", f"What is {term}?",
                        f"Explain the word {term}."])
        units.append((f"chat/jargon/{term}", [("user", q), ("assistant", f"{term}: {first}")]))
    for i in range(120):
        units.append((f"chat/hello/{i}", [("user", rng.choice(GREETINGS)), ("assistant", rng.choice(GREET_ANSWERS))]))
        units.append((f"chat/who/{i}", [("user", rng.choice(WHO)), ("assistant", IDENTITY)]))
        units.append((f"chat/what/{i}", [("user", rng.choice(WHAT)), ("assistant", WHAT_ANSWER)]))
    for i in range(600):
        a, b = rng.randint(0, 50), rng.randint(0, 50)
        q = rng.choice([f"What is {a} plus {b}?", f"What is {a} + {b}?", f"Add {a} and {b}."])
        units.append((f"chat/add/{a}/{b}/{i}", [("user", q), ("assistant", f"{a} plus {b} is {a + b}.")]))
    # two-turn conversations: a later request resumes where the first left off
    singles = [u for u in units if not u[0].startswith("chat/add")]
    for i in range(800):
        (n1, m1), (n2, m2) = rng.sample(singles, 2)
        units.append((f"chat/two/{i}/{n1}/{n2}", m1 + m2))
    out = []
    for name, msgs in units:
        sys_prompt = rng.choice(SYSTEMS)
        m = ([{"role": "system", "content": sys_prompt}] if sys_prompt else []) + \
            [{"role": r, "content": c} for r, c in msgs]
        out.append((name, m))
    return out


def render(messages):
    """The chat as the model's template renders it (tools/demo/template.jinja), thinking off:
    each assistant turn opens with an empty think block."""
    s = ""
    for m in messages:
        if m["role"] == "assistant":
            s += f"<|im_start|>assistant\n<think>\n\n</think>\n\n{m['content']}<|im_end|>\n"
        else:
            s += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="build/demo")
    ap.add_argument("--seed", type=int, default=20261204)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(a.seed)
    bible, forts, jarg = kjv(), fortunes(), jargon()
    prose = [(f"kjv/{b}/{c}", f"{b} {c}\n\n" + "\n".join(f"{v} {t}" for v, t in vs)) for b, c, vs in bible]
    prose += forts
    prose += [(f"jargon/{t}", x) for t, x in jarg]
    chats = chat_units(bible, forts, jarg, rng)
    stats = {}
    with open(f"{a.out}/docs_train.jsonl", "w") as dt, open(f"{a.out}/heldout.txt", "w") as ho, \
            open(f"{a.out}/bpe.txt", "w") as bp, open(f"{a.out}/chats_train.jsonl", "w") as ct, \
            open(f"{a.out}/chats_heldout.jsonl", "w") as ch:
        for name, text in prose:
            src = name.split("/")[0]
            split = "heldout" if held_out(name) else "train"
            st = stats.setdefault(f"{src}/{split}", [0, 0])
            st[0] += 1
            st[1] += len(text)
            if split == "heldout":
                ho.write(text + "\n\n")
            else:
                dt.write(json.dumps({"src": src, "text": text}) + "\n")
                bp.write(text + "\n\n")
        for name, msgs in chats:
            split = "heldout" if held_out(name) else "train"
            st = stats.setdefault(f"chat/{split}", [0, 0])
            text = render(msgs)
            st[0] += 1
            st[1] += len(text)
            if split == "heldout":
                ch.write(json.dumps({"messages": msgs}) + "\n")
            else:
                ct.write(json.dumps({"messages": msgs}) + "\n")
                dt.write(json.dumps({"src": "chat", "text": text}) + "\n")
                bp.write("\n".join(m["content"] for m in msgs) + "\n\n")
    stats = {k: {"units": v[0], "chars": v[1]} for k, v in sorted(stats.items())}
    json.dump(stats, open(f"{a.out}/stats.json", "w"), indent=1)
    for k, v in stats.items():
        print(f"{k:16s} {v['units']:6d} units {v['chars']:9d} chars")


if __name__ == "__main__":
    main()
