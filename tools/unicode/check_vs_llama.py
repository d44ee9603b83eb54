#!/usr/bin/env python3
"""check_vs_llama.py: compares src/unicode_data.c (letter/number/mark/space per code point)
with the tables of the llama.cpp peer (src/unicode-data.cpp of its clone). Prints the
count of code points that differ and the first few; exits 1 if any differ.
    python3 tools/unicode/check_vs_llama.py [PEER_SRC]   (default ~/.cache/hearth-peer/llama.cpp)"""
import os, re, sys

peer = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser('~/.cache/hearth-peer/llama.cpp')
MAX = 0x110000
ours = bytearray(MAX)
src = open(os.path.join(os.path.dirname(__file__), '../../src/unicode_data.c')).read()
vals = [int(x, 16) for x in re.findall(r'0x([0-9a-f]{7})', src.split('{', 1)[1])]
for i, v in enumerate(vals):
    end = vals[i + 1] >> 4 if i + 1 < len(vals) else MAX
    for c in range(v >> 4, end):
        ours[c] = v & 15

text = open(os.path.join(peer, 'src/unicode-data.cpp')).read()
body = text.split('unicode_ranges_flags', 1)[1].split('};', 1)[0]
pairs = [(int(a, 16), int(b, 16)) for a, b in re.findall(r'\{0x([0-9A-Fa-f]+), 0x([0-9A-Fa-f]+)\}', body)]
theirs = bytearray(MAX)
for i in range(len(pairs) - 1):
    (c0, f), (c1, _) = pairs[i], pairs[i + 1]
    g = (1 if f & 0x4 else 0) | (2 if f & 0x2 else 0) | (4 if f & 0x10 else 0)
    for c in range(c0, min(c1, MAX)):
        theirs[c] = g
wsbody = text.split('unicode_set_whitespace', 1)[1].split('};', 1)[0]
for w in re.findall(r'0x([0-9A-Fa-f]+)', wsbody):
    theirs[int(w, 16)] |= 8
diff = [c for c in range(MAX) if ours[c] != theirs[c]]
print(f'{len(diff)} code points differ')
for c in diff[:20]:
    print(f'  U+{c:04X} ours={ours[c]} peer={theirs[c]}')
sys.exit(1 if diff else 0)
