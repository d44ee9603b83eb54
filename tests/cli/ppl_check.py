#!/usr/bin/env python3
"""ppl_check.py: `hearth perplexity` against llama.cpp's llama-perplexity on one file and
text, the same windows (-c) on both sides, both on the CPU.

    ppl_check.py HEARTH LLAMA_BIN_DIR MODEL TEXT CTX f32|quant [THREADS [CHUNKS]]

Exit 0: agree; 1: a check failed (a line "check failed: ..."); 3: a setup error (a program
failed or printed nothing to compare).

Both print the cumulative perplexity after each window ("[k]ppl,", 4 decimals), from which
each window's mean negative log-likelihood is recovered: S_k = k n ln(cum_k), window k =
(S_k - S_{k-1}) / n, n tokens scored a window. The rounding to 4 decimals puts at most
k n x 0.5e-4 / cum_k on S_k: 2.6e-4 after 139 windows of 63 tokens at ppl 1,700, 4e-6 a
window; hearth's --json gives its own windows exactly.

f32 files: |ln ppl_hearth - ln ppl_llama| <= BAND_F32 = 5e-5. Both keep weights and
activations in f32 and differ in summation order only: logits agree to ~1e-6 relative
(test_peer.c), which moves a token's v by ~1e-6 x a few logit units. The larger part is a
routing near-tie within that round-off: one position then takes another expert, and its
v moves by up to ~0.05 (the largest single-window shift seen, 7e-4 over a window of 63,
tiny seed 1); over the ~9,000 tokens of the suite's text that is 5e-6 a flip. Measured:
1e-7 to 5.3e-6 (tiny seeds 1-3, 139 windows; 4e-7 over 28). The band allows ~10 such
flips; a change of method (the wrong half scored, a target shifted by one, no BOS reset)
moves ln ppl by 1e-2 or more.

quant files (q8_0, q4_k_m): both programs quantize every matmul's activations alike but
carry independent rounding noise once one element rounds the other way, and then route
differently at ~10% of positions (test_peer.c): each window's v differs by noise of sd
~0.007-0.009 (measured, tiny), independent between windows (each starts from an empty
state) and of mean zero when the two compute the same thing. So the check is the paired
one: |mean d| <= T_MAX x sd(d) / sqrt(W) over the W windows' differences d, T_MAX = 4
(a 4-sigma two-sided test: a false alarm 6e-5 of runs; measured |t| 0.25-2.5 over tiny
seeds 1-3, 28 and 139 windows); plus every window within D_MAX = 0.1 (an expert's whole
output at a few positions of a window: measured max 0.031), which a broken weight format
or block scale exceeds at once."""
import json, math, re, statistics, subprocess, sys

BAND_F32 = 5e-5
T_MAX = 4.0
D_MAX = 0.1


def fail(msg):
    print(f"check failed: {msg}")
    sys.exit(1)


def setup_error(msg):
    print(f"setup error: {msg}")
    sys.exit(3)


def llama_windows(log, n):
    cum = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+),", log)]
    if not cum:
        return None, None
    s = [k * n * math.log(c) for k, c in enumerate(cum, 1)]
    wins = [(s[i] - (s[i - 1] if i else 0.0)) / n for i in range(len(s))]
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
    return wins, (float(m.group(1)), float(m.group(2))) if m else None


def run_hearth(hearth, model, text, ctx, threads="2", chunks=(), device="cpu"):
    """hearth perplexity --json: {ppl, error, window_nll, tokens_scored, windows, ...}"""
    h = subprocess.run([hearth, "perplexity", "-m", model, "-f", text, "-c", str(ctx), "-t", str(threads), "--device",
                        device, "--json"] + list(chunks), capture_output=True, text=True)
    if h.returncode != 0:
        setup_error(f"hearth perplexity exit {h.returncode}: {h.stderr[-2000:]}")
    return json.loads(h.stdout)


def run_llama(llama_dir, model, text, ctx, n_scored, threads="2", chunks=()):
    """llama-perplexity: (window means, ppl, error bar)"""
    # llama.cpp's logger writes from a thread of its own and now and then loses its last
    # lines at exit (seen once in ~20 runs here; peer.sh notes the same of llama-completion;
    # three times in a row once, on 2 cores with two more suites running beside it): a run
    # whose output lacks the final estimate is run again, up to eight times
    for _ in range(8):
        l = subprocess.run([f"{llama_dir}/llama-perplexity", "-m", model, "-f", text, "-c", str(ctx), "-b", str(ctx),
                            "-t", str(threads)] + list(chunks), capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if l.returncode != 0:
            setup_error(f"llama-perplexity exit {l.returncode}: {l.stderr[-2000:]}")
        lw, lfinal = llama_windows(l.stdout + l.stderr, n_scored)
        if lw is not None and lfinal is not None:
            return lw, lfinal[0], lfinal[1]
    setup_error(f"no perplexity in llama-perplexity's output: {(l.stdout + l.stderr)[-2000:]}")


def paired(d):
    """mean, sd and t of per-window differences"""
    mean = statistics.mean(d)
    sd = statistics.stdev(d)
    t = mean / (sd / math.sqrt(len(d))) if sd > 0 else (0.0 if mean == 0 else math.inf)
    return mean, sd, t


def check_f32(hj, lw, lppl, lerr, who="llama.cpp"):
    """the f32 band on ln ppl and on the error bar (module docstring); returns a failure or None"""
    dl = math.log(hj["ppl"]) - math.log(lppl)
    if abs(dl) > BAND_F32:
        return f"f32: |ln(ppl ratio)| against {who} {abs(dl):.3e} > {BAND_F32:.0e}"
    # the error bar, ppl x sd(v) / sqrt(n - 1): the same formula on both sides, so it moves as
    # ppl does (BAND_F32) plus sd(v)'s share of the same per-token shifts, and by a 5-decimal
    # print (0.5e-5 / err); 10 x BAND_F32 covers both
    if lerr is not None and abs(hj["error"] / lerr - 1) > 10 * BAND_F32 + 0.5e-5 / lerr:
        return f"f32: error bar hearth {hj['error']:.5f}, {who} {lerr:.5f}"
    return None


def check_quant(d):
    """the paired test of quantized files (module docstring); returns a failure or None"""
    if len(d) < 3:
        setup_error("the paired test needs at least 3 windows")
    mean, sd, t = paired(d)
    print(f"  paired: sd {sd:.3e}, t {t:.2f}")
    if abs(t) > T_MAX:
        return f"quant: paired t {t:.2f} beyond {T_MAX} (mean window difference {mean:.3e})"
    if max(map(abs, d)) > D_MAX:
        return f"quant: a window differs by {max(map(abs, d)):.3e} > {D_MAX}"
    return None


def main():
    if len(sys.argv) not in (7, 8, 9):
        setup_error(__doc__.splitlines()[3].strip())
    hearth, llama_dir, model, text, ctx, kind = sys.argv[1:7]
    threads = sys.argv[7] if len(sys.argv) > 7 else "2"
    chunks = ["--chunks", sys.argv[8]] if len(sys.argv) > 8 else []
    if kind not in ("f32", "quant"):
        setup_error(f"kind must be f32 or quant, not {kind}")
    hj = run_hearth(hearth, model, text, ctx, threads, chunks)
    n = hj["tokens_scored"] // hj["windows"]
    lw, lppl, lerr = run_llama(llama_dir, model, text, ctx, n, threads, chunks)
    hw = hj["window_nll"]
    if len(lw) != len(hw):
        fail(f"windows: hearth {len(hw)}, llama.cpp {len(lw)}")
    d = [a - b for a, b in zip(hw, lw)]
    dl = math.log(hj["ppl"]) - math.log(lppl)
    print(f"{model}: -c {ctx}, {len(hw)} windows of {n} scored tokens: PPL hearth {hj['ppl']:.4f}, "
          f"llama.cpp {lppl:.4f}, ln ratio {dl:.3e}; per window d mean {statistics.mean(d):.3e}, "
          f"max |d| {max(map(abs, d)):.3e}")
    why = check_f32(hj, lw, lppl, lerr) if kind == "f32" else check_quant(d)
    if why:
        fail(why)


if __name__ == "__main__":
    main()
