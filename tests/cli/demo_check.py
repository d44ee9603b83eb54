#!/usr/bin/env python3
"""demo_check.py: the trained demo model (demo/, tools/demo/) against PyTorch and llama.cpp.

    demo_check.py HEARTH LLAMA_BIN_DIR [DEMO_DIR] [--checkpoint DIR] [--table]

DEMO_DIR (default demo/) holds the shipped hearth-demo-q8_0.gguf, report.json (train.py's:
PyTorch's perplexity on the held-out windows, each window's mean negative log-likelihood)
and heldout.txt. The checkpoint (train.py's hf/: config, safetensors shards; 37 MB, so not in
the repo: the device tool carries at most 64 MiB of tree) is where tools/demo/finish.sh puts
it, build/demo/hearth-demo; with --checkpoint the checks are all of these, without it (CI) the
shipped q8_0 file's alone (2 and 4):
  1. `hearth convert` of the checkpoint at q8_0 is byte for byte the shipped file (the
     file is what the checkpoint says, nothing edited by hand); f32 and q4_k_m are made too.
  2. hearth perplexity -c 512 on heldout.txt (CPU) of each file, and llama-perplexity's.
  3. f32: hearth against PyTorch within BAND_F32 in ln ppl, and against llama.cpp (both
     tests/cli/ppl_check.py's f32 band: the three compute the same f32 function and differ in
     summation order; the weights PyTorch scored are the checkpoint's exactly, rounded to
     their stored types before its evaluation).
  4. q8_0, q4_k_m: hearth against llama.cpp by the paired per-window test (ppl_check.py); and
     hearth as close to PyTorch's f32 figure as llama.cpp is on the same file: |ln ppl_hearth
     - ln ppl_torch| <= |ln ppl_llama - ln ppl_torch| + 4 x the standard error of the mean
     paired difference (hearth and llama.cpp read the same quantized weights; how far both
     are from f32 is the quantization's, not the program's).
--table prints the Markdown rows for bench/RESULTS.md and the model card.
Exit 0: all hold; 1: a check failed ("check failed: ..."); 3: setup error."""
import json, math, os, shutil, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ppl_check as pc  # noqa: E402

CTX = 512
T_PAIR = 4.0


def main():
    argv = sys.argv[1:]
    ckpt = None
    if "--checkpoint" in argv:
        i = argv.index("--checkpoint")
        if i + 1 >= len(argv):
            pc.setup_error("--checkpoint needs a folder")
        ckpt = argv[i + 1]
        del argv[i:i + 2]
    args = [a for a in argv if not a.startswith("--")]
    table = "--table" in argv
    if len(args) < 2:
        pc.setup_error(__doc__.splitlines()[2].strip())
    hearth, llama_dir = args[0], args[1]
    demo = args[2] if len(args) > 2 else "demo"
    shipped = os.path.join(demo, "hearth-demo-q8_0.gguf")
    text = os.path.join(demo, "heldout.txt")
    report = json.load(open(os.path.join(demo, "report.json")))
    torch_ppl = report["ppl_torch"]
    tmp = tempfile.mkdtemp()
    failures = []
    try:
        # convert names the file (general.name) after the checkpoint's folder: keep it hearth-demo
        files = {} if ckpt else {"q8_0": shipped}
        for q in ("f32", "q8_0", "q4_k_m") if ckpt else ():
            files[q] = os.path.join(tmp, f"hearth-demo-{q}.gguf")
            r = subprocess.run([hearth, "convert", ckpt, "--quant", q, "-o", files[q]], capture_output=True, text=True)
            if r.returncode != 0:
                pc.setup_error(f"hearth convert --quant {q}: {r.stderr[-2000:]}")
        if ckpt and open(files["q8_0"], "rb").read() != open(shipped, "rb").read():
            failures.append(f"hearth convert --quant q8_0 of {ckpt} is not byte for byte {shipped}")
        elif ckpt:
            print(f"ok: {shipped} is hearth convert --quant q8_0 of {ckpt}, byte for byte")
        rows = []
        for q, f in files.items():
            hj = pc.run_hearth(hearth, f, text, CTX)
            n = hj["tokens_scored"] // hj["windows"]
            lw, lppl, lerr = pc.run_llama(llama_dir, f, text, CTX, n)
            if len(lw) != len(hj["window_nll"]) or hj["windows"] != torch_ppl["windows"]:
                failures.append(f"{q}: windows hearth {hj['windows']}, llama.cpp {len(lw)}, PyTorch {torch_ppl['windows']}")
                continue
            d = [a - b for a, b in zip(hj["window_nll"], lw)]
            mean, sd, t = pc.paired(d)
            se = sd / math.sqrt(len(d))
            dh = math.log(hj["ppl"]) - math.log(torch_ppl["ppl"])
            dl = math.log(lppl) - math.log(torch_ppl["ppl"])
            print(f"{q}: PPL hearth {hj['ppl']:.4f} +/- {hj['error']:.4f}, llama.cpp {lppl:.4f}, PyTorch f32 "
                  f"{torch_ppl['ppl']:.4f}; ln(hearth/torch) {dh:.2e}, ln(llama/torch) {dl:.2e}, paired "
                  f"hearth-llama mean {mean:.2e} (t {t:.2f})")
            rows.append((q, hj, lppl, dh, dl))
            if q == "f32":
                why = pc.check_f32(hj, None, torch_ppl["ppl"], None, "PyTorch") or pc.check_f32(hj, lw, lppl, lerr)
            else:
                why = pc.check_quant(d)
                if not why and abs(dh) > abs(dl) + T_PAIR * se:
                    why = (f"{q}: hearth is {abs(dh):.2e} from PyTorch in ln ppl, llama.cpp {abs(dl):.2e}; "
                           f"allowed {abs(dl):.2e} + {T_PAIR} x {se:.1e}")
            if why:
                failures.append(why)
        if table:
            print("\n| file | hearth (CPU) | llama.cpp (CPU) | PyTorch f32 (GPU) | ln(hearth/PyTorch) | ln(llama.cpp/PyTorch) |")
            print("| --- | --- | --- | --- | --- | --- |")
            for q, hj, lppl, dh, dl in rows:
                print(f"| {q} | {hj['ppl']:.4f} +/- {hj['error']:.4f} | {lppl:.4f} | {torch_ppl['ppl']:.4f} | "
                      f"{dh:+.2e} | {dl:+.2e} |")
    finally:
        shutil.rmtree(tmp)
    if failures:
        for f in failures:
            print(f"check failed: {f}")
        sys.exit(1)


if __name__ == "__main__":
    main()
