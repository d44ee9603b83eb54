#!/usr/bin/env python3
"""serve_spec_test.py: `hearth serve --spec-mtp K` (run by tests/cli/serve.sh beside
serve_test.py, whose Server it uses), on a tiny model with the MTP block (`hearth gen --mtp`):
its random block drafts tokens the trunk nearly never takes, so the test seam
HEARTH_TEST_SPEC_REPLAY (drafts from the expected answer's ids) drives the kept drafts.
  - greedy answers, their log-probabilities and their ids equal a server's without it, prompts
    inside and past a 64-row chunk; timings' draft_n and draft_n_accepted (absent without it);
  - every draft kept where the drafts are the answer, some refused where every third is wrong,
    the answer the same;
  - an answer that ends on a kept draft (an end token the logit bias makes the argmax): the same
    answer, and a request continuing its text afterwards equals a cold server's;
  - seeded sampling reproducible; a request under a grammar drafts nothing; --spec-mtp on a file
    without the block refused by name.
Prints one "ok"/"FAIL" line per check and "N passed, N failed" at the end."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checks  # noqa: E402
from serve_test import HEARTH, TMP, Server, check  # noqa: E402


def ids(n, seed):
    return [(seed * 7919 + i * 104729) % 1000 + 3 for i in range(n)]


def complete(srv, prompt, n, extra=None):
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "return_tokens": True, "n_probs": 2, "cache_prompt": True,
            **(extra or {})}
    code, j = srv.post("/completion", body, timeout=120)
    assert code == 200, j
    return j


def main():
    model = os.path.join(TMP, "spec-tiny.gguf")
    plain_model = os.path.join(TMP, "spec-tiny-plain.gguf")
    subprocess.run([HEARTH, "gen", "--preset", "tiny", "--quant", "q4_k_m", "--seed", "1", "--mtp", "-o", model], check=True,
                   capture_output=True)
    subprocess.run([HEARTH, "gen", "--preset", "tiny", "--quant", "q4_k_m", "--seed", "1", "-o", plain_model], check=True,
                   capture_output=True)
    prompts = [ids(5, 1), ids(70, 2), ids(130, 3)]
    plain = Server(model, "-c", "1024")
    spec = Server(model, "-c", "1024", "--spec-mtp", "3")
    try:
        want = [complete(plain, p, 24) for p in prompts]
        got = [complete(spec, p, 24) for p in prompts]
        for p, w, g in zip(prompts, want, got):
            check(f"prompt of {len(p)}: the answer's ids and log-probabilities without --spec-mtp",
                  g["tokens"] == w["tokens"] and g["completion_probabilities"] == w["completion_probabilities"],
                  f"{g['tokens']} / {w['tokens']}")
            check(f"prompt of {len(p)}: timings draft_n {g['timings'].get('draft_n')}, draft_n_accepted "
                  f"{g['timings'].get('draft_n_accepted')}; none without",
                  g["timings"].get("draft_n", 0) > 0 and 0 <= g["timings"]["draft_n_accepted"] <= g["timings"]["draft_n"]
                  and "draft_n" not in w["timings"], str(g["timings"]))
        s1 = complete(spec, prompts[0], 16, {"temperature": 0.8, "seed": 5})
        s2 = complete(spec, prompts[0], 16, {"temperature": 0.8, "seed": 5})
        check("seeded sampling is reproducible", s1["tokens"] == s2["tokens"], f"{s1['tokens']} / {s2['tokens']}")
        code, j = spec.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                                                     "temperature": 0, "response_format": {"type": "json_object"}})
        check("a request under a grammar drafts nothing", code == 200 and j["timings"].get("draft_n") == 0, str(j)[:300])
        # an end token made the argmax at some row by its bias: the plain answer ends there
        eos, end = None, None
        for b in (1.0, 1.25, 1.5, 1.6, 1.7, 1.75, 2.0, 2.5):
            code, tk = plain.post("/tokenize", {"content": "<|im_end|>", "parse_special": True})
            eos = tk["tokens"][0] if code == 200 and tk.get("tokens") else None
            if eos is None:
                break
            w = complete(plain, prompts[1], 40, {"logit_bias": [[eos, b]]})
            if w["stop_type"] == "eos" and len(w["tokens"]) >= 2:  # a kept draft before it
                end = (b, w)
                break
    finally:
        spec.stop()
    check("an end token biased into the argmax after two tokens or more (the setup of the next checks)", end is not None,
          f"eos {eos}")
    # the drafts are the answers: every one kept; every third wrong: some refused; the same answers
    want_ids = want[1]["tokens"]
    for label, replay, all_kept in (("the answer", want_ids, True),
                                    ("every third wrong", [t if i % 3 != 2 else (t + 1) % 1000 + 3 for i, t in enumerate(want_ids)],
                                     False)):
        srv = Server(model, "-c", "1024", "--spec-mtp", "3", env={"HEARTH_TEST_SPEC_REPLAY": ",".join(map(str, replay))})
        try:
            g = complete(srv, prompts[1], 24)
            t = g["timings"]
            kept_ok = t["draft_n_accepted"] == t["draft_n"] > 0 if all_kept else 0 < t["draft_n_accepted"] < t["draft_n"]
            check(f"drafts from {label}: {t['draft_n_accepted']} of {t['draft_n']} kept, the same answer",
                  g["tokens"] == want_ids and g["completion_probabilities"] == want[1]["completion_probabilities"] and kept_ok,
                  f"{g['tokens']} / {want_ids}")
        finally:
            srv.stop()
    if end:
        b, w = end
        srv = Server(model, "-c", "1024", "--spec-mtp", "3",
                     env={"HEARTH_TEST_SPEC_REPLAY": ",".join(map(str, w["tokens"] + [eos]))})
        try:
            g = complete(srv, prompts[1], 40, {"logit_bias": [[eos, b]]})
            # every draft kept but the last step's after the end token (at most K - 1 = 2 of them)
            t = g["timings"]
            check(f"an answer that ends on a kept draft (the end token, bias {b}): the same answer, {t['draft_n_accepted']} of "
                  f"{t['draft_n']} drafts kept", g["tokens"] == w["tokens"] and g["stop_type"] == "eos"
                  and 0 <= t["draft_n"] - t["draft_n_accepted"] <= 2, f"{g['tokens']} / {w['tokens']} {t}")
            nxt = prompts[1] + w["tokens"] + ids(9, 4)
            warm = complete(srv, nxt, 12)
            cold_srv = Server(model, "-c", "1024")
            try:
                cold = complete(cold_srv, nxt, 12)
            finally:
                cold_srv.stop()
            check(f"then a request continuing the text (resumed at row {warm['timings']['cache_n']}) as a cold server answers",
                  warm["tokens"] == cold["tokens"] and warm["completion_probabilities"] == cold["completion_probabilities"]
                  and warm["timings"]["cache_n"] > 0, f"{warm['tokens']} / {cold['tokens']}")
        finally:
            srv.stop()
    p = subprocess.run([HEARTH, "serve", "-m", plain_model, "--port", "0", "--spec-mtp", "2"], capture_output=True, text=True,
                       timeout=60)
    check("--spec-mtp on a file without the block: refused by name", p.returncode != 0 and "--spec-mtp" in p.stderr
          and "no MTP block" in p.stderr, p.stderr[-300:])
    plain.stop()
    sys.exit(1 if checks.summary() else 0)


if __name__ == "__main__":
    main()
