#!/usr/bin/env python3
"""train.py: trains hearth's demo model from a random start with PyTorch and transformers'
Qwen3_5MoeForCausalLM on the GPU machine, then measures its held-out perplexity in PyTorch
on the windows `hearth perplexity -c 512` scores.

    python3 tools/demo/corpus.py --out build/demo          # here: the text
    python3 tools/demo/bpe.py ...                          # here: the tokenizer (committed)
    python3 tools/demo/ids.py --data build/demo            # here: the ids, by hearth's tokenizer
    PYTHONUNBUFFERED=1 python3 tools/demo/train.py --data build/demo --minutes 7 --out $OUT   # there

Writes under OUT (at most 8 files of 16 MiB come back from the device):
  hf/config.json, hf/model.safetensors.index.json, hf/model-0000k-of-0000n.safetensors
        the checkpoint (save_pretrained; matrices stored as bfloat16, norms, router, conv
        taps, A_log and dt_bias as float32). The weights were rounded to those types before
        the final evaluation, so the file holds exactly the weights PyTorch's figure is for.
  report.json   config, parameter counts, versions, timings, the loss curve (train loss per
        step, held-out loss per evaluation), PyTorch's perplexity (every window's mean
        negative log-likelihood, the estimate and its error bar, llama-perplexity's method),
        and a few greedy answers
  loss.png      the loss curve

The model: qwen35moe's structure at a small size: 8 layers, Gated DeltaNet in three of each
four and attention in the fourth, 8 routed experts (top 2) and the shared expert, hidden
256, vocabulary 4,096 (tools/demo/tokenizer). Optimiser AdamW, bf16 autocast, lr warm-up
then cosine decay over the time budget, the router's load-balancing loss on; held-out loss
every EVAL_EVERY steps on a fixed subset of windows; the best checkpoint by it is kept."""
import argparse, array, json, math, os, platform, sys, time

import torch
import torch.nn.functional as F

import transformers
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

CTX = 512             # training sequence and perplexity window
EVAL_EVERY = 100      # steps between held-out evaluations
EVAL_WINDOWS = 24     # windows in each of those (the final evaluation uses all)

CONFIG = dict(
    vocab_size=4096,
    hidden_size=256,
    num_hidden_layers=8,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=256,
    shared_expert_intermediate_size=256,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    output_router_logits=True,
    router_aux_loss_coef=0.01,
    rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    bos_token_id=None,
    eos_token_id=4093,        # <|im_end|>
    pad_token_id=4091,        # <|endoftext|>
)


def store_dtype(name):
    """bfloat16 for matrices; float32 for what the converter keeps in F32 anyway."""
    keep32 = ("norm.weight", "layernorm.weight", "A_log", "dt_bias", "conv1d", "mlp.gate.weight",
              "shared_expert_gate")
    return torch.float32 if any(k in name for k in keep32) else torch.bfloat16


def load_u16(path):
    a = array.array("H")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return torch.tensor(a, dtype=torch.int64)


def set_eager_experts(model):
    """transformers' grouped-matmul experts path wants bf16 weights; the eager loop takes any."""
    try:
        if hasattr(model, "set_experts_implementation"):
            model.set_experts_implementation("eager")
    except Exception as ex:
        print("set_experts_implementation:", repr(ex), flush=True)


@torch.no_grad()
def perplexity(model, ids, ctx, n_windows=None, autocast=False, batch=16):
    """llama-perplexity's method on ids: windows [k ctx, (k+1) ctx), the logits of rows
    [ctx/2, ctx-1) scored against the next token; returns (window means, ppl, error)."""
    model.eval()
    dev = next(model.parameters()).device
    n = len(ids) // ctx if n_windows is None else min(n_windows, len(ids) // ctx)
    first = ctx // 2
    wins = []
    for k0 in range(0, n, batch):
        x = torch.stack([ids[k * ctx:(k + 1) * ctx] for k in range(k0, min(n, k0 + batch))]).to(dev)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=x, use_cache=False, output_router_logits=False).logits.float()
        lp = F.log_softmax(logits[:, first:ctx - 1], dim=-1)
        v = -lp.gather(-1, x[:, first + 1:, None]).squeeze(-1).double()
        wins += v.mean(-1).tolist()
        if k0 == 0:
            all_v = v.flatten()
        else:
            all_v = torch.cat([all_v, v.flatten()])
    model.train()
    m, m2, cnt = float(all_v.mean()), float((all_v * all_v).mean()), all_v.numel()
    var = m2 - m * m
    return wins, math.exp(m), math.exp(m) * math.sqrt(var / (cnt - 1)) if var > 0 else float("nan")


@torch.no_grad()
def greedy(model, ids_prompt, eos, n=60):
    model.eval()
    dev = next(model.parameters()).device
    x = torch.tensor([ids_prompt], device=dev)
    out = []
    for _ in range(n):
        t = int(model(input_ids=x, use_cache=False, output_router_logits=False).logits[0, -1].argmax())
        out.append(t)
        if t == eos:
            break
        x = torch.cat([x, torch.tensor([[t]], device=dev)], dim=1)
    model.train()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="build/demo")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--minutes", type=float, default=7.0, help="training time budget (evaluation not counted)")
    ap.add_argument("--batch", type=int, default=32, help="sequences of CTX tokens per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=20261204)
    a = ap.parse_args()
    os.makedirs(os.path.join(a.out, "hf"), exist_ok=True)
    torch.manual_seed(a.seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = True
    print("python", platform.python_version(), "torch", torch.__version__, "transformers", transformers.__version__,
          "device", torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", flush=True)

    train = load_u16(os.path.join(a.data, "train_ids.u16"))
    held = load_u16(os.path.join(a.data, "heldout_ids.u16"))
    prompts = json.load(open(os.path.join(a.data, "prompts.json"))) if os.path.exists(
        os.path.join(a.data, "prompts.json")) else []
    print(f"train tokens {len(train)}, held-out tokens {len(held)}", flush=True)

    cfg = Qwen3_5MoeTextConfig(**CONFIG)
    model = Qwen3_5MoeForCausalLM(cfg).to(torch.float32)
    set_eager_experts(model)
    model.to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    n_expert = sum(p.numel() for n_, p in model.named_parameters() if ".experts." in n_)
    print(f"parameters {n_params} (routed experts {n_expert})", flush=True)

    decay = [p for n_, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n_, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=dev == "cuda")
    budget = a.minutes * 60.0
    warm = 0.03
    g = torch.Generator().manual_seed(a.seed)
    curve, evals = [], []
    best = (float("inf"), None, -1)
    t_train, step, tokens = 0.0, 0, 0
    model.train()
    while t_train < budget:
        t0 = time.time()
        frac = t_train / budget
        lr = a.lr * (frac / warm if frac < warm else 0.5 * (1 + math.cos(math.pi * (frac - warm) / (1 - warm))))
        lr = max(lr, a.lr * 0.02)
        for grp in opt.param_groups:
            grp["lr"] = lr
        starts = torch.randint(0, len(train) - CTX - 1, (a.batch,), generator=g)
        x = torch.stack([train[s:s + CTX] for s in starts]).to(dev, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev == "cuda"):
            out = model(input_ids=x, labels=x, use_cache=False)
        loss = out.loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += x.numel()
        if dev == "cuda":
            torch.cuda.synchronize()
        t_train += time.time() - t0
        aux = float(out.aux_loss) if getattr(out, "aux_loss", None) is not None else None
        curve.append([step, round(t_train, 2), float(loss), aux, lr])
        if step % 20 == 0:
            print(f"step {step} t {t_train:.0f}s loss {float(loss):.4f} aux {aux} lr {lr:.2e} "
                  f"tok/s {tokens / t_train:.0f}", flush=True)
        if step % EVAL_EVERY == 0 or t_train >= budget:
            wins, ppl, _ = perplexity(model, held, CTX, EVAL_WINDOWS, autocast=True)
            hl = sum(wins) / len(wins)
            evals.append([step, round(t_train, 2), hl])
            print(f"  held-out loss {hl:.4f} (ppl {ppl:.2f}) at step {step}", flush=True)
            if hl < best[0]:
                best = (hl, {k: v.detach().clone() for k, v in model.state_dict().items()}, step)

    print(f"trained {step} steps, {tokens} tokens in {t_train:.1f} s; best held-out loss {best[0]:.4f} at step "
          f"{best[2]}", flush=True)
    model.load_state_dict(best[1])
    # the stored types, then the figure for exactly those weights
    with torch.no_grad():
        for n_, p in model.named_parameters():
            p.copy_(p.to(store_dtype(n_)).to(torch.float32))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    t0 = time.time()
    wins, ppl, err = perplexity(model, held, CTX, None, autocast=False)
    t_eval = time.time() - t0
    print(f"PyTorch perplexity (f32, {dev}): {ppl:.4f} +/- {err:.5f} over {len(wins)} windows in {t_eval:.1f} s",
          flush=True)

    answers = []
    for p in prompts:
        ids = greedy(model, p["ids"], CONFIG["eos_token_id"])
        answers.append({"prompt": p["text"], "ids": ids})
        print("answer to", repr(p["text"][-60:]), ids[:20], flush=True)

    # the checkpoint: save_pretrained's names (it maps transformers' internal layout to the
    # file's), each tensor then re-stored in its type, in shards of <= 15 MB + the index
    import shutil, tempfile
    from safetensors.torch import load_file, save_file
    model.to("cpu")
    tmp = tempfile.mkdtemp()
    model.save_pretrained(tmp)
    tensors = {}
    for f in sorted(os.listdir(tmp)):
        if f.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(tmp, f)))
    hf = os.path.join(a.out, "hf")
    shards, cur, size = [], {}, 0
    for n_ in sorted(tensors):
        t = tensors[n_].to(torch.float32).to(store_dtype(n_)).contiguous()
        if cur and size + t.numel() * t.element_size() > 15_000_000:
            shards.append(cur)
            cur, size = {}, 0
        cur[n_] = t
        size += t.numel() * t.element_size()
    shards.append(cur)
    weight_map, total = {}, 0
    for i, sh in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sh, os.path.join(hf, fn), metadata={"format": "pt"})
        for n_, t in sh.items():
            weight_map[n_] = fn
            total += t.numel() * t.element_size()
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
              open(os.path.join(hf, "model.safetensors.index.json"), "w"), indent=1)
    shutil.copy(os.path.join(tmp, "config.json"), os.path.join(hf, "config.json"))
    shutil.rmtree(tmp)
    print("saved:", sorted(os.listdir(hf)), total, "bytes", flush=True)

    report = {
        "made_by": "tools/demo/train.py",
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
        "config": CONFIG, "parameters": n_params, "routed_expert_parameters": n_expert,
        "train_tokens_available": len(train), "tokens_seen": tokens, "steps": step, "batch": a.batch,
        "ctx": CTX, "lr": a.lr, "train_seconds": t_train, "best_step": best[2],
        "curve": {"columns": ["step", "seconds", "train_loss", "aux_loss", "lr"], "rows": curve},
        "heldout_evals": {"columns": ["step", "seconds", "heldout_loss"], "rows": evals,
                          "windows": EVAL_WINDOWS, "autocast": "bf16"},
        "ppl_torch": {"ppl": ppl, "error": err, "windows": len(wins), "ctx": CTX,
                      "tokens_scored": len(wins) * (CTX - 1 - CTX // 2), "window_nll": wins,
                      "how": f"f32 on {dev}, TF32 off, weights as stored", "seconds": t_eval},
        "answers": answers,
    }
    json.dump(report, open(os.path.join(a.out, "report.json"), "w"), indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot([r[1] / 60 for r in curve], [r[2] for r in curve], lw=0.6, label="train loss (batch)")
        ax.plot([r[1] / 60 for r in evals], [r[2] for r in evals], "o-", label="held-out loss")
        ax.set_xlabel("training minutes (H200)")
        ax.set_ylabel("cross-entropy (nats/token)")
        ax.set_title(f"hearth demo model, {n_params / 1e6:.1f}M parameters")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "loss.png"), dpi=110)
    except Exception as ex:
        print("no figure:", repr(ex), flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
