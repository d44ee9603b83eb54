#!/usr/bin/env python3
"""mkgguf.py: writes small valid and malformed GGUF files for the bad-input suite and the
fuzz seed corpus, with the standard library only (no gguf-py), so the files do not come
from the code under test. Usage:
  mkgguf.py bad OUTDIR      valid*.gguf, bad-*.gguf and OUTDIR/MANIFEST (file<TAB>regex)
  mkgguf.py corpus OUTDIR   a few small valid files for tests/fuzz/corpus/gguf
"""
import os
import struct
import sys

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
          BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
# ggml type id -> (block elements, block bytes), the few used here
QT = {0: (1, 4), 1: (1, 2), 8: (32, 34), 12: (256, 144), 14: (256, 210), 30: (1, 2)}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def arr_body(et, items):
    """element type, count, elements; nested arrays are (et, items) pairs"""
    out = struct.pack("<IQ", et, len(items))
    for x in items:
        if et == STR:
            out += gstr(x)
        elif et == ARR:
            out += arr_body(*x)
        else:
            out += struct.pack(SCALAR[et], x)
    return out


def value(t, v):
    if t == STR:
        return gstr(v)
    if t == ARR:
        return arr_body(*v)
    return struct.pack(SCALAR[t], v)


def kv(key, t, v):
    return gstr(key) + struct.pack("<I", t) + value(t, v)


def nbytes(t, ne):
    be, bb = QT[t]
    n = ne[0] // be * bb
    for d in ne[1:]:
        n *= d
    return n


def pad(n, a):
    return (n + a - 1) // a * a


def build(kvs, tensors, align=32, version=3, magic=b"GGUF", n_kv=None, n_tensors=None,
          cut_data=0):
    """kvs: raw kv byte strings; tensors: dicts name/type/ne and optional ndims/offset/
    raw_ne (written as is). Returns the file bytes."""
    head = magic + struct.pack("<I", version)
    head += struct.pack("<Q", len(tensors) if n_tensors is None else n_tensors)
    head += struct.pack("<Q", len(kvs) if n_kv is None else n_kv)
    head += b"".join(kvs)
    off = 0
    sizes = []
    for t in tensors:
        ne = t["ne"]
        head += gstr(t["name"])
        head += struct.pack("<I", t.get("ndims", len(ne)))
        for d in t.get("raw_ne", ne):
            head += struct.pack("<q", d)
        head += struct.pack("<I", t["type"])
        head += struct.pack("<Q", t.get("offset", off))
        n = nbytes(t["type"], ne) if t["type"] in QT and min(ne) > 0 else 0
        n = n if n < 1 << 20 else 0  # absurd shapes are there to be refused: no data
        sizes.append(n)
        off = pad(off + n, align)
    if tensors:
        head += b"\0" * (pad(len(head), align) - len(head))
    data = bytearray()
    for i, n in enumerate(sizes):
        data += bytes((i * 37 + j) & 0xFF for j in range(n))
        data += b"\0" * (pad(len(data), align) - len(data))
    out = head + bytes(data)
    return out[:len(out) - cut_data] if cut_data else out


def base_kvs(align=None):
    k = [kv("general.architecture", STR, "test"), kv("general.name", STR, "tiny")]
    if align is not None:
        k.append(kv("general.alignment", U32, align))
    k += [kv("test.u32", U32, 7), kv("test.i32", I32, -3), kv("test.f32", F32, 0.5),
          kv("test.bool", BOOL, True), kv("test.empty", STR, ""),
          kv("test.ints", ARR, (I32, [1, -2, 3])),
          kv("tokenizer.ggml.tokens", ARR, (STR, ["a", "b", "", "\u0120the"])),
          kv("test.nested", ARR, (ARR, [(U8, [1, 2]), (STR, ["x"]), (ARR, [])]))]
    return k


def base_tensors():
    return [dict(name="token_embd.weight", type=0, ne=[8, 4]),
            dict(name="blk.0.attn_q.weight", type=8, ne=[64, 2]),
            dict(name="blk.0.ffn_down.weight", type=12, ne=[256]),
            dict(name="output_norm.weight", type=1, ne=[8])]


def nested(depth):
    v = (U8, [1])
    for _ in range(depth - 1):
        v = (ARR, [v])
    return v


def bad_cases():
    T = base_tensors
    K = base_kvs
    valid = build(K(), T())
    cases = [
        ("empty", b"", r"magic.*needs 4 bytes"),
        ("bad-magic", b"GGUX" + valid[4:], r"magic: not a GGUF file"),
        ("version1", build(K(), T(), version=1), r"version 1 is not supported"),
        ("version99", build(K(), T(), version=99), r"version 99 is not supported"),
        ("version-be", build(K(), T(), version=3 << 24), r"big-endian"),
        ("short-header", valid[:12], r"n_tensors: needs 8 bytes"),
        ("huge-n-kv", build(K(), T(), n_kv=1 << 60), r"n_kv [0-9]+ is more than"),
        ("huge-n-tensors", build(K(), T(), n_tensors=1 << 62), r"n_tensors [0-9]+ is more than"),
        ("n-kv-too-big", build(K(), T(), n_kv=len(K()) + 1), r"kv|tensor info"),
        ("huge-key-len", build([struct.pack("<Q", 1 << 40) + b"general"] + K(), T()),
         r"kv 0: key: length 1099511627776 runs past the end"),
        ("huge-string", build([gstr("general.name") + struct.pack("<IQ", STR, 1 << 50)], []),
         r"kv 0 \(general.name\): string value: length .* runs past the end"),
        ("unknown-value-type", build([gstr("test.x") + struct.pack("<I", 13) + b"\0" * 8], []),
         r"kv 0 \(test.x\): unknown value type 13"),
        ("huge-array", build([gstr("test.a") + struct.pack("<IIQ", ARR, U32, 1 << 62)], []),
         r"kv 0 \(test.a\): array count [0-9]+ of u32"),
        ("huge-str-array", build([gstr("test.a") + struct.pack("<IIQ", ARR, STR, 1 << 40)], []),
         r"kv 0 \(test.a\): array count [0-9]+ of strings"),
        ("bad-array-elem-len", build([kv("test.a", ARR, (STR, ["ok"]))[:-10] + struct.pack("<Q", 1 << 33)], []),
         r"element 0: string: length"),
        ("unknown-array-type", build([gstr("test.a") + struct.pack("<IIQ", ARR, 77, 0)], []),
         r"unknown array element type 77"),
        ("too-deep", build([kv("test.deep", ARR, nested(9))], []), r"nested deeper than 8"),
        ("dup-key", build(K() + [kv("test.u32", U32, 8)], T()), r"test.u32.*duplicate key"),
        ("dup-tensor", build(K(), T() + [dict(name="token_embd.weight", type=0, ne=[8])]),
         r"tensor info 4 \(token_embd.weight\): duplicate tensor name"),
        ("n-dims-5", build(K(), [dict(name="t", type=0, ne=[1, 1, 1, 1, 1])]), r"n_dims 5 is more than 4"),
        ("ne-zero", build(K(), [dict(name="t", type=0, ne=[0, 2])]), r"ne\[0\] = 0 is not positive"),
        ("ne-negative", build(K(), [dict(name="t", type=0, ne=[4, -1])]), r"ne\[1\] = -1 is not positive"),
        ("ne-overflow", build(K(), [dict(name="t", type=0, ne=[1 << 40, 1 << 30])]),
         r"element count overflows"),
        ("bytes-overflow", build(K(), [dict(name="t", type=0, ne=[1 << 62])]), r"byte size overflows"),
        ("unknown-tensor-type", build(K(), [dict(name="t", type=99, ne=[4])]), r"unknown tensor type 99"),
        ("row-not-blocks", build(K(), [dict(name="t", type=8, ne=[33])]), r"not a multiple of the .* block size 32"),
        ("unaligned-offset", build(K(), [dict(name="t", type=0, ne=[8], offset=4)]),
         r"tensor info 0 \(t\): offset 4 is not a multiple of the alignment 32"),
        ("data-past-end", build(K(), T(), cut_data=20), r"tensor info 3 \(output_norm.weight\): offset .* runs past the end"),
        ("offset-huge", build(K(), [dict(name="t", type=0, ne=[8], offset=(1 << 64) - 32)]),
         r"runs past the end"),
        ("align-not-pow2", build(K(48), T(), align=48), r"general.alignment.*48 is not a power of two"),
        ("align-zero", build(K(0), T()), r"general.alignment.*0 is not a power of two"),
        ("align-wrong-type", build([kv("general.alignment", U64, 32)], T()), r"general.alignment.*expected u32"),
        ("name-too-long", build(K(), [dict(name="x" * 64, type=0, ne=[8])]), r"name is 64 bytes"),
        ("trunc-in-kvs", valid[:300], r"kv [0-9]+.*(needs|runs past|could hold)"),
        ("trunc-in-infos", valid[:650], r"tensor info 3 \(output_norm.weight\): offset: needs 8 bytes"),
    ]
    return valid, cases


def corpus():
    return [
        ("valid", build(base_kvs(), base_tensors())),
        ("align64", build(base_kvs(64), base_tensors(), align=64)),
        ("no-tensors", build(base_kvs(), [])),
        ("one-f32", build([kv("general.architecture", STR, "x")], [dict(name="w", type=0, ne=[4, 2])])),
    ]


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("bad", "corpus"):
        sys.stderr.write(__doc__)
        return 2
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)
    if sys.argv[1] == "corpus":
        for name, b in corpus():  # .bin: git ignores *.gguf outside tests/fixtures
            open(os.path.join(out, name + ".bin"), "wb").write(b)
        return 0
    for name, b in corpus():
        open(os.path.join(out, name + ".gguf"), "wb").write(b)
    _, cases = bad_cases()
    with open(os.path.join(out, "MANIFEST"), "w") as m:
        for name, b, pat in cases:
            open(os.path.join(out, "bad-" + name + ".gguf"), "wb").write(b)
            m.write("bad-%s.gguf\t%s\n" % (name, pat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
