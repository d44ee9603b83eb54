#!/usr/bin/env python3
"""replicas_test.py: `hearth serve` replicas behind nginx (deploy/nginx-hearth.conf itself, its
replica lines pointed at loopback ports), run by tests/cli/replicas.sh. Conversation affinity,
failover without a failed request, greedy answers equal to one server's, a shared --cache-dir
resumed from after a replica dies, and racing writers of one entry. Replicas are told apart by
--alias (the "model" of their answers and /v1/models).

Prints one "ok"/"FAIL" line per check and "N passed, N failed, N skipped" at the end."""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import checks

HEARTH = os.environ.get("HEARTH", "build/hearth")
NGINX = os.environ.get("NGINX", "nginx")
TMP = tempfile.mkdtemp(prefix="replicas-", dir=os.environ.get("HEARTH_TMP") or None)
DEPLOY = "deploy/nginx-hearth.conf"
procs = []
stops = {}  # alias: exit status on SIGTERM


def check(name, cond, detail=""):
    checks.check(name, cond, str(detail)[:600] if detail else "")  # the details here are logs: their first 600 characters


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def request(port, method, path, body=None, key=None, timeout=60):
    """(status, parsed JSON or text, headers) of one request on 127.0.0.1:port"""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    if key is not None:
        h["X-Session-Id"] = key
    c.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=h)
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    try:
        return r.status, json.loads(text), r
    except ValueError:
        return r.status, text, r


class Replica:
    def __init__(self, model, alias, *flags):
        self.alias = alias
        self.ready = os.path.join(TMP, f"ready-{alias}-{time.monotonic_ns()}")
        self.log_path = os.path.join(TMP, f"{alias}.log")
        self.p = subprocess.Popen([HEARTH, "serve", "-m", model, "--port", "0", "--ready-file", self.ready, "-t", "1",
                                   "--alias", alias, "--metrics", *flags],
                                  stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT)
        procs.append(self.p)
        for _ in range(400):
            if os.path.exists(self.ready) and open(self.ready).read().strip():
                break
            if self.p.poll() is not None:
                raise RuntimeError(f"hearth serve ({alias}) exited with {self.p.returncode}")
            time.sleep(0.025)
        self.port = int(open(self.ready).read())

    def metric(self, name):
        _, m, _ = request(self.port, "GET", "/metrics")
        for line in m.split("\n"):
            if line.startswith(f"hearth:{name} "):
                return float(line.split()[1])
        raise KeyError(name)

    def log(self):
        return open(self.log_path, errors="replace").read()

    def kill(self):
        self.p.kill()
        self.p.wait()

    def stop(self):
        """SIGTERM, as systemd stops it; its exit status is kept for the last check (under
        the sanitizers a leak makes it non-zero)"""
        self.p.send_signal(signal.SIGTERM)
        try:
            stops[self.alias] = self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            stops[self.alias] = "still running after 30 s"


class Nginx:
    """nginx as this user, everything in its own folder, with the deploy file's upstream and
    server blocks: its two replica lines pointed at `replicas`, more lines added after them"""

    def __init__(self, replicas):
        self.dir = tempfile.mkdtemp(prefix="nginx-", dir=TMP)
        os.chmod(self.dir, 0o755)  # workers run as nobody when the master is root
        self.port = free_port()
        conf = open(DEPLOY).read()
        subs = [(r"server 127\.0\.0\.1:8081 ", f"server 127.0.0.1:{replicas[0].port} "),
                (r"server 127\.0\.0\.1:8082 ", f"server 127.0.0.1:{replicas[1].port} "),
                (r"listen 8080;", f"listen 127.0.0.1:{self.port};")]
        for pat, rep in subs:
            conf, n = re.subn(pat, rep, conf)
            if n != 1:
                raise RuntimeError(f"{DEPLOY}: '{pat}' found {n} times, not once (the test points it at its replicas)")
        line = re.search(r"\n(\s*server 127\.0\.0\.1:%d [^\n]*)" % replicas[1].port, conf).group(1)
        for r in replicas[2:]:
            conf = conf.replace(line, line + "\n" + line.replace(str(replicas[1].port), str(r.port)))
        open(os.path.join(self.dir, "hearth.conf"), "w").write(conf)
        d = self.dir
        open(os.path.join(d, "nginx.conf"), "w").write(f"""worker_processes 1;
error_log {d}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    include {d}/hearth.conf;
}}
""")
        self.args = [NGINX, "-p", d, "-e", f"{d}/error.log", "-c", f"{d}/nginx.conf"]
        self.test = subprocess.run(self.args + ["-t", "-g", f"pid {d}/nginx.pid;"], capture_output=True, text=True)
        if self.test.returncode != 0:
            raise RuntimeError(f"nginx -t: {self.test.stderr}")
        self.p = subprocess.Popen(self.args + ["-g", f"daemon off; pid {d}/nginx.pid;"],
                                  stdout=subprocess.DEVNULL, stderr=open(f"{d}/stderr.log", "ab"))
        procs.append(self.p)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.p.poll() is not None:
                    raise RuntimeError(f"nginx exited: {open(f'{d}/stderr.log').read()} {self.error_log()}")
                time.sleep(0.025)

    def error_log(self):
        return open(os.path.join(self.dir, "error.log"), errors="replace").read()

    def stop(self):
        self.p.send_signal(signal.SIGQUIT)
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()


def chat_body(msgs, n=8):
    return {"messages": msgs, "max_tokens": n, "temperature": 0, "ignore_eos": True}


def ask(port, msgs, key=None):
    st, j, _ = request(port, "POST", "/v1/chat/completions", chat_body(msgs), key=key)
    return st, j


def follow(msgs, j):
    """msgs with the answer j and a next user turn"""
    m = j["choices"][0]["message"]
    a = {"role": "assistant", "content": m.get("content") or ""}
    if m.get("reasoning_content"):
        a["reasoning_content"] = m["reasoning_content"]
    return msgs + [a, {"role": "user", "content": f"Go on ({len(msgs) // 2 + 1})."}]


def cached(j):
    return j["usage"]["prompt_tokens_details"]["cached_tokens"]


def which(port, key):
    """the replica a conversation key lands on, by its alias in /v1/models"""
    st, j, _ = request(port, "GET", "/v1/models", key=key)
    return j["data"][0]["id"] if st == 200 else f"HTTP {st}"


def conversation(lb, ref, key, turns, msgs, label):
    """turns of one conversation through nginx, each compared with the reference server's
    answer to the same messages; returns (msgs for the next turn, [(replica, cached, why)])"""
    seen = []
    for t in range(turns):
        st, j = ask(lb.port, msgs, key)
        rst, rj = ask(ref.port, msgs)
        if st != 200:
            check(f"{label}: turn {t + 1} answered through nginx", False, f"{st} {lb.error_log()[-600:]}")
            return msgs, seen
        seen.append((j["model"], cached(j), j["timings"].get("cache", "")))
        check(f"{label}: turn {t + 1} equals one server's greedy answer",
              rst == 200 and j["choices"][0]["message"] == rj["choices"][0]["message"],
              f"{j['choices'][0]['message']} vs {rj['choices'][0]['message'] if rst == 200 else rj}")
        msgs = follow(msgs, j)
    return msgs, seen


def main():
    t0 = time.monotonic()
    model = os.path.join(TMP, "tiny.gguf")
    subprocess.run([HEARTH, "gen", "--preset", "tiny", "--quant", "q8_0", "--seed", "3", "-o", model], check=True,
                   capture_output=True)
    ref = Replica(model, "reference")
    sys_msg = {"role": "system", "content": "You keep the fire of a hearth."}

    # ------------------------------------------------------------ affinity and failover
    a, b, c = Replica(model, "replica-a"), Replica(model, "replica-b"), Replica(model, "replica-c")
    lb = Nginx([a, b])
    check("nginx -t accepts deploy/nginx-hearth.conf", lb.test.returncode == 0, lb.test.stderr)
    st, j, _ = request(lb.port, "GET", "/health")
    check("GET /health through nginx", st == 200 and j == {"status": "ok"}, j)

    msgs = [sys_msg, {"role": "user", "content": "How do I light it?"}]
    msgs, seen = conversation(lb, ref, "conv-1", 4, msgs, "conv-1")
    holders = {s[0] for s in seen}
    check("conv-1: its 4 turns stay on one replica", len(seen) == 4 and len(holders) == 1, seen)
    check("conv-1: turns 2-4 resume from the replica's points (cached_tokens > 0)",
          len(seen) == 4 and seen[0][1] == 0 and all(s[1] > 0 for s in seen[1:]), seen)
    holder = a if seen and seen[0][0] == "replica-a" else b
    other = b if holder is a else a
    check("conv-1: /metrics of the replicas agree (4 requests on the holder, none on the other)",
          holder.metric("requests_total") == 4 and other.metric("requests_total") == 0,
          f"{holder.alias} {holder.metric('requests_total')}, {other.alias} {other.metric('requests_total')}")

    keys = [f"user-{i}" for i in range(32)]
    where = {k: which(lb.port, k) for k in keys}
    check("conversation keys spread over both replicas", set(where.values()) == {"replica-a", "replica-b"}, where)
    again = {k: which(lb.port, k) for k in keys}
    check("each key lands where it landed before", again == where, again)
    check("without X-Session-Id the client's address is the key (the same replica each time)",
          len({which(lb.port, None) for _ in range(6)}) == 1)
    # consistent hashing: a third replica takes some keys over; none moves between the first two
    lb3 = Nginx([a, b, c])
    where3 = {k: which(lb3.port, k) for k in keys}
    moved = {k: (where[k], where3[k]) for k in keys if where3[k] != where[k]}
    check("a replica added: the keys that move go to it, none between the others (consistent)",
          moved and all(v[1] == "replica-c" for v in moved.values()), moved)
    lb3.stop()

    st, ctype, events = None, None, []
    cc = http.client.HTTPConnection("127.0.0.1", lb.port, timeout=60)
    cc.request("POST", "/v1/chat/completions", body=json.dumps({**chat_body(msgs), "stream": True}).encode(),
               headers={"Content-Type": "application/json", "X-Session-Id": "conv-1"})
    r = cc.getresponse()
    st, ctype = r.status, r.getheader("Content-Type")
    for line in r.read().decode().split("\n"):
        if line.startswith("data: "):
            events.append(line[6:])
    cc.close()
    check("a streamed answer passes through nginx as SSE events, ending in [DONE]",
          st == 200 and ctype.startswith("text/event-stream") and len(events) >= 3 and events[-1] == "[DONE]",
          f"{st} {ctype} {events[:3]}")

    holder.kill()
    msgs, seen = conversation(lb, ref, "conv-1", 2, msgs, "conv-1 after its replica died")
    check("conv-1: with its replica killed, the next turn is answered by the other (no failed request)",
          len(seen) == 2 and seen[0][0] == other.alias, seen)
    check("conv-1: there it is a miss, then a hit again on the turn after",
          len(seen) == 2 and seen[0][1] == 0 and seen[1][1] > 0 and seen[1][0] == other.alias, seen)
    check("nginx took the dead replica out (error.log: upstream server temporarily disabled)",
          "temporarily disabled" in lb.error_log(), lb.error_log()[-800:])
    lb.stop()
    other.stop()

    # ------------------------------------------------------------ the shared --cache-dir
    shared = os.path.join(TMP, "shared-cache")
    sa, sb = Replica(model, "replica-a", "--cache-dir", shared), Replica(model, "replica-b", "--cache-dir", shared)
    lb = Nginx([sa, sb])
    msgs = [sys_msg, {"role": "user", "content": "What wood burns best?"}]
    msgs, seen = conversation(lb, ref, "conv-s", 3, msgs, "shared conv-s")
    holder = sa if seen and seen[0][0] == "replica-a" else sb
    other = sb if holder is sa else sa
    check("shared conv-s: 3 turns on one replica, hits from turn 2",
          len(seen) == 3 and len({s[0] for s in seen}) == 1 and all(s[1] > 0 for s in seen[1:]), seen)
    holder.kill()
    msgs, seen = conversation(lb, ref, "conv-s", 2, msgs, "shared conv-s after its replica died")
    check("shared conv-s: the other replica resumes from the points the dead one wrote (cached_tokens > 0)",
          len(seen) == 2 and seen[0][0] == other.alias and seen[0][1] > 0 and "shared cache" in seen[0][2], seen)
    check("shared conv-s: and from its own slot on the turn after",
          len(seen) == 2 and seen[1][0] == other.alias and seen[1][1] > seen[0][1], seen)
    lb.stop()
    other.stop()
    # files another process spoiled or removed under a replica that had indexed them (at its
    # start): read back, a spoiled one is refused and removed, a removed one forgotten; either
    # way the turn is a miss with one server's answer, not a crash
    rst, rj = ask(ref.port, msgs)
    late = Replica(model, "replica-late", "--cache-dir", shared)
    spoiled = sorted(f for f in os.listdir(shared) if f.endswith(".hcache"))
    for f in spoiled:
        with open(os.path.join(shared, f), "r+b") as fh:
            fh.seek(-5, os.SEEK_END)
            b = fh.read(1)
            fh.seek(-5, os.SEEK_END)
            fh.write(bytes([b[0] ^ 0x10]))
    st, j = ask(late.port, msgs)
    gone = [f for f in spoiled if not os.path.exists(os.path.join(shared, f))]
    check("spoiled files under a replica: it refuses what it reads back, removes it and answers (a miss)",
          st == 200 and cached(j) == 0 and j["choices"][0]["message"] == rj["choices"][0]["message"] and
          gone and "checksum" in late.log() and late.metric("cache_disk_refused_total") == len(gone),
          f"{st} {str(j)[:200]} removed {gone} of {spoiled}")
    late.stop()
    late = Replica(model, "replica-late-2", "--cache-dir", shared)
    for f in os.listdir(shared):
        os.unlink(os.path.join(shared, f))
    st, j = ask(late.port, msgs)
    check("files removed under a replica that had indexed them: it answers (a miss), as one server",
          st == 200 and late.p.poll() is None and cached(j) == 0 and
          j["choices"][0]["message"] == rj["choices"][0]["message"], f"{st} {str(j)[:300]}")
    late.stop()

    # ------------------------------------------------------------ racing writers of one entry
    race = os.path.join(TMP, "race-cache")
    w1, w2 = Replica(model, "writer-1", "--cache-dir", race), Replica(model, "writer-2", "--cache-dir", race)
    gate = threading.Barrier(2)
    out = {}

    def both(fn):
        def run(w):
            gate.wait()
            out[w.alias] = fn(w)
        ts = [threading.Thread(target=run, args=(w,)) for w in (w1, w2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return out[w1.alias], out[w2.alias]

    msgs = [sys_msg, {"role": "user", "content": "And the ashes?"}]
    same = True
    ends = []  # where each turn's assistant message ends: its answer's point (+2: <|im_end|>\n)
    for _ in range(3):
        j1, j2 = both(lambda w: ask(w.port, msgs)[1])
        same = same and j1["choices"][0]["message"] == j2["choices"][0]["message"]
        ends.append(j1["usage"]["prompt_tokens"] + j1["usage"]["completion_tokens"] + 2)
        msgs = follow(msgs, j1)
    rounds = 15
    saves = [both(lambda w: request(w.port, "POST", "/slots/0?action=save", {"filename": "race.bin"})[0])
             for _ in range(rounds)]
    check("racing writers: both replicas wrote the same conversation's entries at once", same)
    check("racing writers: every /slots save of one file by both at once succeeded",
          all(s == (200, 200) for s in saves), saves)
    n1, n2 = w1.metric("cache_disk_saves_total"), w2.metric("cache_disk_saves_total")
    bad_lines = [ln for w in (w1, w2) for ln in w.log().split("\n") if "--cache-dir" in ln]
    # A replica's saves: the rounds' /slots saves, and each turn's own file (written through
    # when it ends; one that found the other's file of that turn first skips it, so at least
    # turn 1's). Not the point at the end of each answer (made after the turn's file, in the
    # step after the answer): the tiny model's answers are thinking, which the template drops
    # when the next turn is rendered, so that turn diverges inside the assistant message and
    # resumes from the point at its start; the answer's end point, which no later turn
    # reaches, is dropped (it went to the shared cache and a file of its own, 2 more saves
    # here, until 2026-12-06). So 1 + rounds <= n <= 3 + rounds.
    check("racing writers: each counted its saves and turns written, no error on stderr",
          1 + rounds <= n1 <= 3 + rounds and 1 + rounds <= n2 <= 3 + rounds and not bad_lines,
          f"{n1} {n2} {bad_lines[:3]}")
    w1.stop()
    w2.stop()
    files = sorted(os.listdir(race))
    entries = [f for f in files if f.endswith(".hcache")]
    # the same rows written by both make one file (the name is the entry's: prefix key, first
    # point, all ids, rows); which turns each replica wrote depends on who got there first (one
    # that found the other's file resumes from it, and its own entry then starts elsewhere), so
    # the count is 3 turns or more, and no two files may hold the same rows from the same point
    spans = [(f.split("-")[0], f.split("-")[1], f.split("-")[3]) for f in entries]
    check("racing writers: no temporary file left, one file per entry",
          len(entries) >= 3 and len(set(spans)) == len(spans) and not any(".tmp" in f for f in files), files)
    # the answers' end points the next turns left (above): no file of one point at its last row
    lone = sorted(int(f.split("-")[1]) for f in entries if f.split("-")[1] == f.split("-")[3].split(".")[0])
    check("racing writers: no file for an answer's end point that the next turn left (the template rewrote it)",
          lone == [] and len(ends) == 3, f"{lone} (the answers end at {ends})")
    v = Replica(model, "verifier", "--cache-dir", race)
    check("racing writers: every file loads in a fresh replica (checksums verified, none refused)",
          v.metric("cache_disk_refused_total") == 0 and v.metric("cache_entries") == len(entries),
          f"refused {v.metric('cache_disk_refused_total')}, entries {v.metric('cache_entries')} of {len(entries)}")
    st, j, _ = request(v.port, "POST", "/slots/0?action=restore", {"filename": "race.bin"})
    check("racing writers: the file both saved restores", st == 200 and j.get("n_restored", 0) > 0, j)
    v.stop()
    ref.stop()
    c.stop()
    check("the replicas left running exit 0 on SIGTERM", stops and all(v == 0 for v in stops.values()), stops)
    print(f"({time.monotonic() - t0:.1f} s)")


def on_term(*_):
    raise SystemExit("stopped by SIGTERM (replicas.sh's time limit?)")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_term)  # so that `finally` stops what was started
    try:
        main()
    except (Exception, SystemExit) as ex:  # a setup failure is a failed check, named
        check("the suite ran to its end", False, repr(ex))
    finally:
        for p in procs:  # SIGTERM first: nginx's master then stops its worker too
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(TMP, ignore_errors=True)
    sys.exit(1 if checks.summary(skipped=0) else 0)
