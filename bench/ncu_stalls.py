#!/usr/bin/env python3
"""bench/ncu_stalls.py: where a kernel's warps wait, from Nsight Compute's source page
(`ncu -i REP --page source --csv --print-source sass`, bench/device_wg.sh's stall step).

Prints the warp-stall samples summed by opcode, the instructions holding the most samples with
the stall reasons they carry, and each reason's share of all samples.
    bench/ncu_stalls.py stall_e1_sass.csv [TOP]
"""
import csv
import sys
from collections import Counter, defaultdict


def num(s):
    try:
        return float(s.replace(",", ""))
    except (ValueError, AttributeError):
        return 0.0


def main():
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40
    lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"#"') or l.startswith('"Address"') or "Source" in l[:40]), 0)
    rows = list(csv.reader(lines[start:]))
    head, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    col = {h: i for i, h in enumerate(head)}
    src = next((col[h] for h in head if h == "Source"), None)
    adr = next((col[h] for h in head if h == "Address"), None)
    allc = next((col[h] for h in head if h.startswith("Warp Stall Sampling (All")), None)
    if src is None or allc is None:
        sys.exit("ncu_stalls: no Source or 'Warp Stall Sampling (All Samples)' column in " + ", ".join(head))
    reasons = [h for h in head if h.startswith("stall_") or (h.startswith("smsp__pcsamp") and "stall" in h)]
    total = sum(num(r[allc]) for r in body) or 1.0
    by_op, by_reason = Counter(), Counter()
    for r in body:
        op = r[src].strip().split()
        op = [t for t in op if not t.startswith("@")]
        by_op[op[0].split(".")[0] if op else "?"] += num(r[allc])
        for h in reasons:
            by_reason[h] += num(r[col[h]])
    print(f"{path}: {int(total)} samples over {len(body)} instructions")
    print("\nby opcode (share of all samples):")
    for op, v in by_op.most_common(20):
        print(f"  {op:12s} {100 * v / total:5.1f}%")
    if reasons:
        print("\nby reason:")
        for h, v in by_reason.most_common(16):
            if v:
                print(f"  {h:40s} {100 * v / total:5.1f}%")
    print(f"\nthe {top} instructions with the most samples:")
    for r in sorted(body, key=lambda r: -num(r[allc]))[:top]:
        why = sorted(((num(r[col[h]]), h) for h in reasons), reverse=True)[:3]
        whys = ", ".join(f"{h.replace('stall_', '')} {100 * v / total:.1f}" for v, h in why if v)
        print(f"  {r[adr] if adr is not None else '':>8s} {100 * num(r[allc]) / total:5.1f}%  {r[src].strip()[:60]:60s} {whys}")


if __name__ == "__main__":
    main()
