#!/usr/bin/env python3
"""bench/disk_hour.py: F13 item 5's long check. hearth serve with --cache-dir under a small
--cache-disk is driven with agent sessions for a fixed time (an hour by default) while a
sampler reads the folder's size every half second. Three agent loops at a time round-robin
over fewer slots (each turn moves a conversation out of its slot, so entries are made and
written), a new conversation starts when one ends, and every fifth new one first goes back to
a conversation finished earlier (its history plus a new message: the entry read from disk
when the RAM cache has let it go, or not found when --cache-disk removed it).

What it reports (and writes as JSON under --out):
- the folder's largest size seen against --cache-disk (files and .tmp files alike);
- the writer's counters from /metrics: saves, loads, evictions, skipped and failed writes;
- per request, the time outside the pass (wall ms minus timings.prompt_ms), split by whether
  a write finished while the request was in flight (saves_total moved) or none did, among the
  requests that read no entry from disk (loads_total still; those pay their read, reported
  apart): a write on the request's path shows as a larger overhead in the first group.

Usage: bench/disk_hour.py --model /tmp/small.gguf [--minutes 60] [--cache-disk 1024]
"""
import argparse
import json
import os
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agent_turns as at  # noqa: E402


def folder_bytes(d):
    n = 0
    try:
        with os.scandir(d) as it:
            for e in it:
                try:
                    if e.is_file(follow_symlinks=False):
                        n += e.stat(follow_symlinks=False).st_size
                except OSError:  # removed between the listing and the stat
                    pass
    except OSError:
        pass
    return n


def metrics(srv):
    with urllib.request.urlopen(f"http://{srv.host}:{srv.port}/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        k, v = line.rsplit(" ", 1)
        if "cache_disk" in k:
            out[k.split(":", 1)[-1]] = float(v)
    return out


def pct(vals, q):
    if not vals:
        return float("nan")
    s = sorted(vals)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hearth", default="build/hearth")
    ap.add_argument("--model", required=True)
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--cache-disk", type=int, default=1024, help="MiB")
    ap.add_argument("--cache-ram", type=int, default=512, help="MiB")
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--loops", type=int, default=3, help="agent loops at a time, round-robin")
    ap.add_argument("--target-tokens", type=int, default=6000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dir", default="/tmp/hearth-disk-hour")
    ap.add_argument("--out", default="bench/logs/disk-hour")
    a = ap.parse_args()

    os.makedirs(a.out, exist_ok=True)
    if os.path.isdir(a.dir):
        for f in os.listdir(a.dir):
            os.unlink(os.path.join(a.dir, f))
    cmd = (f"{a.hearth} serve -m {a.model} --port {{port}} -c 32768 -np {a.slots} -t {a.threads} --device cpu "
           f"--cache-ram {a.cache_ram} --cache-dir {a.dir} --cache-disk {a.cache_disk} --metrics")
    srv = at.Server("hearth", cmd, None, os.path.join(a.out, "server.log"), 300)
    srv.start()
    try:
        return drive(a, srv, cmd)
    finally:
        srv.stop()  # also when a request fails: no server left behind on the folder


def drive(a, srv, cmd):
    cap = a.cache_disk << 20
    peak = [0, 0.0]
    stop = threading.Event()
    t0 = time.time()
    sizes = []

    def sampler():
        while not stop.is_set():
            b = folder_bytes(a.dir)
            sizes.append((round(time.time() - t0, 1), b))
            if b > peak[0]:
                peak[0], peak[1] = b, time.time() - t0
            time.sleep(0.5)

    th = threading.Thread(target=sampler, daemon=True)
    th.start()

    rows = []
    session = 0
    finished = []  # (session, last history, tools) of conversations done

    def new_loop():
        nonlocal session
        session += 1
        reqs = at.agent_trace(1000 + session, session, a.target_tokens)
        # every fifth: first a return to a conversation finished earlier (five back, if any)
        if session % 5 == 0 and len(finished) >= 5:
            s, msgs, tools = finished[-5]
            back = msgs + [{"role": "user", "content": "Going back to this one: summarize what you changed."}]
            return {"session": s, "reqs": [(back, tools)], "i": 0, "return": True}
        return {"session": session, "reqs": reqs, "i": 0, "return": False}

    loops = [new_loop() for _ in range(a.loops)]
    deadline = t0 + a.minutes * 60
    k = 0
    m0 = metrics(srv)
    while time.time() < deadline:
        lp = loops[k % len(loops)]
        k += 1
        msgs, tools = lp["reqs"][lp["i"]]
        before = metrics(srv)
        r = at.one_turn(srv, msgs, tools, f"dh-{lp['session']}")
        after = metrics(srv)
        saves = after.get("cache_disk_saves_total", 0) - before.get("cache_disk_saves_total", 0)
        loads = after.get("cache_disk_loads_total", 0) - before.get("cache_disk_loads_total", 0)
        pm = float(r["prompt_ms"] or 0)
        rows.append({"t": round(time.time() - t0, 1), "session": lp["session"], "turn": lp["i"], "return": lp["return"],
                     "prompt_n": r["prompt_n"], "cache_n": r["cache_n"], "prompt_ms": pm, "wall_ms": r["wall_ms"],
                     "over_ms": round(r["wall_ms"] - pm, 3), "saves_during": saves, "loads_during": loads,
                     "disk_bytes": folder_bytes(a.dir)})
        lp["i"] += 1
        if lp["i"] == len(lp["reqs"]):
            if not lp["return"]:
                finished.append((lp["session"], lp["reqs"][-1][0], lp["reqs"][-1][1]))
            loops[loops.index(lp)] = new_loop()
    stop.set()
    th.join()
    m1 = metrics(srv)
    srv.stop()  # SIGTERM: the writes still waiting are made; the folder read after
    b_end = folder_bytes(a.dir)

    # a request that read an entry from disk pays the read on its path (that is the resume); the
    # write's effect is read from the others: a write finished while it ran, or none
    with_w = [x["over_ms"] for x in rows if x["saves_during"] > 0 and x["loads_during"] == 0]
    without = [x["over_ms"] for x in rows if x["saves_during"] == 0 and x["loads_during"] == 0]
    loaded = [x["over_ms"] for x in rows if x["loads_during"] > 0]
    delta = {k2: m1.get(k2, 0) - m0.get(k2, 0) for k2 in m1}
    rep = {
        "minutes": a.minutes, "cache_disk_bytes": cap, "peak_bytes": peak[0], "peak_at_s": round(peak[1], 1),
        "end_bytes": b_end, "requests": len(rows), "conversations": session,
        "returns": sum(1 for x in rows if x["return"]),
        "returns_resumed": sum(1 for x in rows if x["return"] and int(x["cache_n"] or 0) > 0),
        "rows_prefilled": sum(int(x["prompt_n"] or 0) for x in rows),
        "metrics_delta": delta,
        "over_ms_write_during": {"n": len(with_w), "p50": pct(with_w, .5), "p99": pct(with_w, .99),
                                 "max": max(with_w) if with_w else None},
        "over_ms_disk_read": {"n": len(loaded), "p50": pct(loaded, .5), "p99": pct(loaded, .99),
                              "max": max(loaded) if loaded else None},
        "over_ms_no_write": {"n": len(without), "p50": pct(without, .5), "p99": pct(without, .99),
                             "max": max(without) if without else None},
        "cmd": cmd, "git": at.git_head(),
    }
    with open(os.path.join(a.out, "report.json"), "w") as f:
        json.dump(rep, f, indent=1)
    with open(os.path.join(a.out, "requests.json"), "w") as f:
        json.dump(rows, f)
    with open(os.path.join(a.out, "sizes.json"), "w") as f:
        json.dump(sizes, f)
    print(json.dumps(rep, indent=1))
    ok = peak[0] <= cap
    print(f"disk: peak {peak[0] / 1048576:.1f} MiB against --cache-disk {a.cache_disk} MiB: {'under' if ok else 'OVER'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
