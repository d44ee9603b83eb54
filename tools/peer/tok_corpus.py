#!/usr/bin/env python3
"""tok_corpus.py: writes tests/fixtures/tok/corpus.jsonl, the deterministic tokenizer corpus
(same output on every run). One JSON object per line: {"t": TEXT} for valid UTF-8 without
NUL, else {"hex": BYTES}. Cases: many scripts, combining marks, emoji (ZWJ, flags, keycaps),
code, whitespace runs, digits, contractions, punctuation, invalid UTF-8 and special-token
texts, plus random mixes of all of them.
    python3 tools/peer/tok_corpus.py [OUT]"""
import json
import os
import random
import sys

R = random.Random(20260928)

WORDS = {
    'latin': "café naïve résumé façade Ærø Straße Ünïcödé señor año niño pingüino Zürich crème brûlée "
             "Đà Nẵng tiếng Việt người ơn giỏi Łódź żółć Čeština příliš žluťoučký kůň Ørsted fjörður".split(),
    'english': "the quick brown fox jumps over lazy dog hello world tokenizer inference server model "
               "HELLO World CamelCase snake_case kebab-case don't I'm you're we've they'll she'd it's".split(),
    'cjk': "你好 世界 中文分词 测试 人工智能 日本語 こんにちは カタカナ ひらがな 東京都 漢字 한국어 안녕하세요 "
           "서울특별시 繁體中文 龍 𠀀𠀁 𪚥".split(),
    'arabic': "مرحبا بالعالم اللغة العربية السَّلَامُ عَلَيْكُم ١٢٣٤٥ كتاب".split(),
    'hebrew': "שלום עולם עִבְרִית בְּרֵאשִׁית ספר".split(),
    'devanagari': "नमस्ते दुनिया हिन्दी भाषा क्षत्रिय श्री संस्कृतम् ०१२३".split(),
    'thai': "สวัสดี ภาษาไทย ประเทศไทย กรุงเทพมหานคร น้ำ".split(),
    'cyrillic': "Привет мир русский язык Ёлка ЩУКА україна Їжак српски".split(),
    'greek': "Γειά σου κόσμε ελληνικά Ωμέγα ΑΒΓΔ ά ὢ ᾯ".split(),
    'other': "ქართული Հայերեն தமிழ் বাংলা ಕನ್ನಡ ພາສາລາວ ភាសាខ្មែរ ᏣᎳᎩ ትግርኛ ꦗꦮ".split(),
    'emoji': ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇸🇬🇧", "1️⃣", "#️⃣", "❤️", "🧑🏿‍💻", "🫠",
              "👩‍❤️‍💋‍👨", "🐈‍⬛", "☕", "⌚", "✊🏻", "🏴󠁧󠁢󠁳󠁣󠁴󠁿"],
    'symbols': "€ £ ¥ © ® ™ ° ± × ÷ ∑ ∞ ≠ ≤ √ ∫ → ⇒ ★ ♥ ♪ ✓ ✗ § ¶ † ‡ • … ‰ ′ ″ ½ ¾ ² ³ Ⅻ ⅷ".split(),
}
MARKS = ["\u0301", "\u0300", "\u0308", "\u0327", "\u0303", "\u20e3", "\u0651", "\u093f", "\u0e31",
         "\u05b7", "\u1ab0", "\ufe0f", "\u200d", "\u034f", "\u0489"]
WS = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\t\t", "\u00a0", "\u3000", "\u2028",
      "\u0085", "\u000b", "\u000c", "\u2009", "\u200b", "\ufeff", " \t \n"]
PUNCT = ["!", "!!!", "?", "?!", "...", "…", ",", ";", ":", "-", "--", "—", "–", "(", ")", "[", "]", "{",
         "}", "\"", "'", "`", "«", "»", "¿", "¡", "<", ">", "</", "/>", "==", "===", "->", "=>", "&&",
         "||", "#", "@", "$", "%", "^", "&", "*", "_", "~", "|", "\\", "。", "、", "「", "」", "！"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL",
                "'D", "'Re", "'rE", "'lL", "'Ll", "'x", "'", "''", "’s"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "</s>", "[PAD151646]", "[PAD151700]",
            "[PAD151934]", "<|im_start", "im_end|>", "<|", "|>", "<s>", "<think>", "</think>",
            "<tool_call>", "<|fim_prefix|>", "[PAD"]
CODE = [
    'def f(x):\n    return x ** 2  # square\n',
    'for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n',
    'const obj = { "key": [1, 2, 3], nested: { a: null } };',
    '#include <stdio.h>\nint main(void) { printf("%d\\n", 42); return 0; }\n',
    '<div class="x">Hello &amp; <b>bye</b></div>',
    'SELECT id, name FROM users WHERE age >= 18 ORDER BY name;',
    '$ ls -la | grep "\\.c$" && echo done',
    '    if x:\n        pass\n    else:\n        raise ValueError("bad")\n',
    'fn main() -> Result<(), Box<dyn Error>> { Ok(()) }',
    '{"a":1,"b":[true,false,null],"c":"\\u00e9"}',
    'x=1;y=2;z=x+y*3/4-5%6',
    '0x1F 0b1010 1e-9 3.14159 -42 1_000_000 12,345.67',
    'https://example.com/path?q=1&r=two#frag',
    'user@example.org',
    '    \n\n\t\t# comment\n',
]
INVALID = [b"\xff", b"\xfe\xff", b"\x80", b"\xbf\xbf", b"\xc3", b"\xc3(", b"\xe4\xb8", b"\xe4\xb8x",
           b"\xf0\x9f\x98", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xed\xbf\xbf",
           b"\xf0\x80\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xfc", b"\x00", b"a\x00b", b"\xc2\xa0\xc2",
           b"\xe2\x82", b"\xef\xbf\xbd"]
# Above U+10FFFF: llama.cpp throws from unicode_cpt_to_utf8 and aborts; kept so that hearth is
# seen not to crash (its expected output is null).
CRASHERS = [b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xf7\xbf\xbf\xbf"]


def pick(xs):
    return xs[R.randrange(len(xs))]


def word():
    return pick(WORDS[pick(list(WORDS))])


def piece():
    k = R.randrange(12)
    if k < 4:
        return word()
    if k == 4:
        return pick(WS)
    if k == 5:
        return pick(PUNCT)
    if k == 6:
        return str(R.randrange(10 ** R.randrange(1, 12)))
    if k == 7:
        return pick(CONTRACTIONS)
    if k == 8:
        return pick(MARKS)
    if k == 9:
        return chr(R.choice([R.randrange(0x20, 0x7f), R.randrange(0xa0, 0x3000), R.randrange(0x0, 0x20),
                             R.randrange(0x10000, 0x30000), R.randrange(0xe000, 0xfffe)]))
    if k == 10:
        return pick(SPECIALS)
    return " " + word()


def sentence(n):
    return "".join(piece() for _ in range(n))


def cases():
    out = []
    add = out.append
    # fixed cases
    for ws in WS:
        for pre in ["", "a", "hello", "你好", "1"]:
            add(pre + ws)
            add(ws + pre)
            add(pre + ws + pre)
    for n in [1, 2, 3, 5, 8, 17, 64]:
        add(" " * n)
        add("\n" * n)
        add("\t" * n)
        add(" " * n + "x")
        add("x" + " " * n)
        add("\r\n" * n)
        add(" \n" * n + "end")
    for c in CONTRACTIONS:
        for ctx in ["I{}", "he{} ", "{}", " {}", "{}s", "don{}t", "WE{} GO", "'{}", "{}{}"]:
            add(ctx.replace("{}", c))
    for digits in ["0", "12", "123", "1234", "12345678901234567890", "3.14", "1,000", "٣٤٥", "१२३", "１２３",
                   "²³", "½", "Ⅻ", "a1b2c3", "x123y", " 42", "42 ", "(1)", "#1", "v2.0.1"]:
        add(digits)
        add("abc " + digits + " def")
    for p in PUNCT:
        add(p)
        add(" " + p)
        add(p + "\n")
        add(p * 3 + "\n\n")
        add("word" + p + "word")
    for s in SPECIALS:
        for ctx in ["{}", " {}", "{} ", "a{}b", "{}\n", "\n{}\n", "{}{}", "x {} y", "<{}>", "{}user\nhi"]:
            add(ctx.replace("{}", s))
    add("<|im_start|>user\nhi<|im_end|>")
    add("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>\n")
    add("<|im_<|im_end|>start|>")
    add("<|endoftext|><|endoftext|><|endoftext|>")
    add("[PAD151646][PAD151647] [PAD151648]\n")
    for m in MARKS:
        for base in ["a", "e", " ", "1", "!", "\n", "", "ab", "你", "ก", "क", "😀"]:
            add(base + m)
            add(base + m + m + "x")
            add(m + base)
    for e in WORDS['emoji']:
        add(e)
        add(" " + e)
        add("hi" + e + "!")
        add(e * 3)
    for lang, ws in WORDS.items():
        add(" ".join(ws))
        add("".join(ws))
        add("\n".join(ws) + "\n")
    for c in CODE:
        add(c)
        add(c.replace("    ", "\t"))
    for b in INVALID:
        add(b)
        add(b"abc" + b + b"def")
        add(b" " + b + b" ")
        add(b + "你好".encode())
    for b in CRASHERS:
        add(b)
        add(b"x " + b)
    # long ones
    add("a" * 3000)
    add("ab " * 700)
    add(" " * 1000 + "x")
    add("\n" * 500)
    add("9" * 800)
    add("😀" * 300)
    add("é" * 500)
    add("\u0301" * 300)
    add(sentence(800))
    # random mixes
    while len(out) < 2600:
        k = R.randrange(10)
        if k < 7:
            add(sentence(R.randrange(1, 25)))
        elif k < 9:
            add(pick(CODE)[R.randrange(10):] + sentence(R.randrange(1, 6)))
        else:
            raw = sentence(R.randrange(1, 10)).encode()
            pos = R.randrange(len(raw) + 1)
            add(raw[:pos] + pick(INVALID) + raw[pos:])
    # the batch separator of tok_expected.py must not occur inside a case
    return [c for c in out if "[PAD151935]" not in (c if isinstance(c, str) else c.decode('utf-8', 'replace'))]


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, 'tests/fixtures/tok/corpus.jsonl')
    os.makedirs(os.path.dirname(path), exist_ok=True)
    seen = set()
    n = 0
    with open(path, 'w', encoding='utf-8', newline='\n') as f:
        for c in cases():
            b = c.encode('utf-8', 'surrogatepass') if isinstance(c, str) else c
            if b in seen:
                continue
            seen.add(b)
            try:
                s = b.decode('utf-8')
                ok = '\x00' not in s and not any(0xd800 <= ord(ch) <= 0xdfff for ch in s)
            except UnicodeDecodeError:
                ok = False
            f.write(json.dumps({"t": s} if ok else {"hex": b.hex()}, ensure_ascii=False) + "\n")
            n += 1
    print(f"{n} cases -> {path}")


if __name__ == '__main__':
    main()
