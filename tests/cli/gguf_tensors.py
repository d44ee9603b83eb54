#!/usr/bin/env python3
"""gguf_tensors.py: one line per tensor of a GGUF file, "name type-id sha256-of-its-bytes",
sorted by name: for comparing the tensor data of two files whose metadata differ. Standard
library only; reads GGUF v2/v3 (little-endian).

    gguf_tensors.py FILE"""
import hashlib, struct, sys

# ggml type id -> (block elements, block bytes), for the types hearth and llama-quantize write
BLOCK = {0: (1, 4), 1: (1, 2), 8: (32, 34), 12: (256, 144), 13: (256, 176), 14: (256, 210), 30: (1, 2),
         6: (32, 22), 7: (32, 24), 10: (256, 84), 11: (256, 110)}
SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def main():
    data = open(sys.argv[1], "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string():
        nonlocal pos
        n = take("Q")
        s = data[pos:pos + n].decode("utf-8", "replace")
        pos += n
        return s

    def skip_value(t):
        nonlocal pos
        if t == 8:
            string()
        elif t == 9:
            et, n = take("I"), take("Q")
            for _ in range(n):
                skip_value(et)
        else:
            pos += SCALAR[t]

    assert data[:4] == b"GGUF", "not a GGUF file"
    pos = 4
    _version, n_t, n_kv = take("I"), take("Q"), take("Q")
    align = 32
    for _ in range(n_kv):
        key, t = string(), take("I")
        if key == "general.alignment":
            align = take("I")
        else:
            skip_value(t)
    infos = []
    for _ in range(n_t):
        name = string()
        nd = take("I")
        ne = [take("Q") for _ in range(nd)]
        t, off = take("I"), take("Q")
        infos.append((name, ne, t, off))
    start = (pos + align - 1) // align * align
    for name, ne, t, off in sorted(infos):
        be, bb = BLOCK[t]
        n = 1
        for d in ne:
            n *= d
        size = n // be * bb
        print(name, t, hashlib.sha256(data[start + off:start + off + size]).hexdigest())


if __name__ == "__main__":
    main()
