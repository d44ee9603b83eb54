#!/usr/bin/env python3
"""hf_parity.py: the independent reference for `hearth convert`: a tiny random
Qwen3_5MoeForCausalLM built with Hugging Face transformers, saved with save_pretrained
(safetensors), and its logits for a fixed id sequence, written as a test fixture
(tests/fixtures/hf_tiny/, see its README.md).

Runs where torch + transformers (>= 5 with the qwen3_5_moe classes) are installed, i.e. on
the GPU machine; the GPU itself is optional (only a cross-check run uses it):

    PYTHONUNBUFFERED=1 python3 tools/ref/hf_parity.py --out $OUT

Writes under OUT:
  hf_tiny/config.json, hf_tiny/model.safetensors   the checkpoint (save_pretrained's names;
        tensors re-stored as BF16 / F16 / F32 by role, values already rounded to those types
        before the runs, so the stored weights are exactly the ones the logits came from)
  hf_tiny/logits_f32.bin   HF on the CPU in float32: n x V float32 little-endian
  hf_tiny/logits_f64.bin   HF on the CPU in float64 (with the f32 casts inside the model's
        norms, router, rotary table and delta rule replaced by float64 equivalents, see
        patch_f64): n x V float64 little-endian
  hf_tiny/reference.json   ids, shapes, versions, what was patched, summary figures
  debug.bin + debug.json   per-layer intermediates (embedding, mixer out, MoE out, residual
        after each layer, final norm) of both CPU runs, and the GPU float32 logits
  log.txt is written by the caller (tee)

Weights are random but not trivial: every zero-centred norm weight (applied by HF as 1 + w)
is drawn around 0 so that the converter's +1 folding is visible, the GDN's own norm
(a plain multiply) around 1, A_log and dt_bias per head, and V heads != K heads so the
converter's V-head re-tiling is exercised."""
import argparse, datetime, json, os, platform, shutil, sys, tempfile

import torch
import torch.nn.functional as F

import transformers
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
import transformers.models.qwen3_5_moe.modeling_qwen3_5_moe as M
import safetensors
from safetensors import safe_open
from safetensors.torch import load_file, save_file

N_IDS = 100          # crosses HF's (and hearth's) 64-row chunk boundary, last chunk partial
SEED = 20261118

CONFIG = dict(
    vocab_size=1024,            # >= hearth's built-in vocabulary (1000 tokens)
    hidden_size=128,
    num_hidden_layers=4,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    linear_num_key_heads=2,
    linear_num_value_heads=4,   # 2 V heads per K head: re-tiling matters
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=64,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
)


def store_dtype(name):
    """The dtype a tensor is stored with in the fixture (values are rounded to it first)."""
    if any(s in name for s in ("embed_tokens", "lm_head", "mlp.experts", "mlp.shared_expert.")):
        return torch.bfloat16
    if any(s in name for s in ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "out_proj")):
        return torch.float16
    return torch.float32


def init_weights(model, gen):
    """Random weights of O(1) activations; see the module docstring."""
    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=gen, dtype=torch.float64) * std + mean

    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = tuple(p.shape)
            if name.endswith("linear_attn.norm.weight"):
                v = normal(shape, 0.3, 1.0)                       # plain multiply
            elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                v = normal(shape, 0.3)                            # zero-centred: 1 + w
            elif name.endswith("A_log"):
                v = torch.log(torch.rand(shape, generator=gen, dtype=torch.float64) * 1.95 + 0.05)
            elif name.endswith("dt_bias"):
                v = normal(shape, 0.5, -1.0)
            elif "conv1d" in name:
                v = normal(shape, 0.5)
            elif "embed_tokens" in name:
                v = normal(shape, 1.0)
            elif name.endswith("mlp.gate.weight"):              # router: spread the experts
                v = normal(shape, 2.0 / shape[-1] ** 0.5)
            elif p.ndim >= 2:                                     # any matrix: fan-in scaling
                v = normal(shape, 1.0 / shape[-1] ** 0.5)
            else:
                raise SystemExit(f"no init rule for {name} {shape}")
            v = v.to(torch.float32).to(store_dtype(name)).to(torch.float32)
            p.copy_(v.to(p.dtype))


class Capture:
    """Forward hooks: per layer the mixer's output, the MoE block's output and the residual
    stream after the layer; plus the embedding and the final norm."""

    def __init__(self, model):
        self.data, self.handles = {}, []
        m = model.model

        def hook(key):
            def f(_mod, _inp, out):
                t = out[0] if isinstance(out, (tuple, list)) else out
                self.data[key] = t.detach()[0].cpu().clone()
            return f

        self.handles.append(m.embed_tokens.register_forward_hook(hook("embed")))
        for i, layer in enumerate(m.layers):
            mixer = layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn
            self.handles.append(mixer.register_forward_hook(hook(f"layer{i}.mixer")))
            self.handles.append(layer.mlp.register_forward_hook(hook(f"layer{i}.moe")))
            self.handles.append(layer.register_forward_hook(hook(f"layer{i}.out")))
        self.handles.append(m.norm.register_forward_hook(hook("final_norm")))

    def remove(self):
        for h in self.handles:
            h.remove()


def run(model, ids, device, capture=False):
    model.to(device).eval()
    cap = Capture(model) if capture else None
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], device=device), use_cache=False)
    logits = out.logits[0].detach().cpu().clone()
    data = None
    if cap:
        cap.remove()
        data = cap.data
    return logits, data


# ---- float64: the model's own forward, minus its casts to float32 ----
PATCH_CALLS = {}


def _count(key):
    PATCH_CALLS[key] = PATCH_CALLS.get(key, 0) + 1


def patch_f64(model):
    """HF's Qwen3.5 code computes its norms, the router softmax, the rotary table and the
    delta rule in float32 even for a float64 model. For the float64 run these are replaced
    by the same formulas in the input's dtype. The delta rule is HF's sequential
    (recurrent) form: S <- exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q, q and k
    L2-normalised with eps 1e-6, q scaled by 1/sqrt(Dk), value head h reading key head
    h // (Hv/Hk) (HF's repeat_interleave). What remains float32: g = -exp(A_log) *
    softplus(a + dt_bias) is formed by the GDN module with .float() (relative error
    ~6e-8 in each decay)."""
    def rms_fwd(self, x):
        _count("rmsnorm")
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight.to(x.dtype))

    def rmsg_fwd(self, hidden_states, gate):
        _count("rmsnorm_gated")
        h = hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight.to(h.dtype) * h * F.silu(gate.to(h.dtype))

    def router_fwd(self, hidden_states):
        _count("router")
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        logits = F.linear(hidden_states, self.weight)
        probs = torch.softmax(logits, dim=-1)
        top, idx = torch.topk(probs, self.top_k, dim=-1)
        top = top / top.sum(dim=-1, keepdim=True)
        return logits, top, idx

    def rope_fwd(self, x, position_ids):
        _count("rope")
        pos = position_ids
        if pos.ndim == 3:   # (3 or 4, batch, seq): for text every component is the token index
            for r in range(1, pos.shape[0]):
                if not torch.equal(pos[r], pos[0]):
                    raise RuntimeError("rope patch: position components differ (not plain text)")
            pos = pos[0]
        rp = self.config.rope_parameters
        hd = getattr(self.config, "head_dim", None) or self.config.hidden_size // self.config.num_attention_heads
        dim = int(hd * rp.get("partial_rotary_factor", 1.0))
        inv = 1.0 / (float(rp["rope_theta"]) ** (torch.arange(0, dim, 2, dtype=torch.float64, device=x.device) / dim))
        freqs = pos[..., None].to(torch.float64) * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                   use_qk_l2norm_in_kernel=False, **kwargs):
        _count("delta_rule")
        dt = torch.float64
        Hk, Dk = key.shape[-2:]
        Hv, Dv = value.shape[-2:]
        if Hk != Hv:
            query, key = (x.repeat_interleave(Hv // Hk, dim=2) for x in (query, key))
        q, k, v, b, gg = [x.transpose(1, 2).to(dt) for x in (query, key, value, beta, g)]
        if use_qk_l2norm_in_kernel:
            q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
            k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        q = q / Dk ** 0.5
        B, _, T, _ = q.shape
        S = torch.zeros(B, Hv, Dk, Dv, dtype=dt, device=q.device) if initial_state is None else initial_state.to(dt)
        o = torch.zeros(B, Hv, T, Dv, dtype=dt, device=q.device)
        for t in range(T):
            S = S * gg[:, :, t].exp()[..., None, None]
            kt = k[:, :, t]
            u = (S * kt[..., None]).sum(-2)
            d = (v[:, :, t] - u) * b[:, :, t, None]
            S = S + kt[..., None] * d[..., None, :]
            o[:, :, t] = (S * q[:, :, t, :, None]).sum(-2)
        return o.transpose(1, 2).contiguous().to(query.dtype), (S if output_final_state else None)

    M.Qwen3_5MoeRMSNorm.forward = rms_fwd
    M.Qwen3_5MoeRMSNormGated.forward = rmsg_fwd
    M.Qwen3_5MoeTopKRouter.forward = router_fwd
    M.Qwen3_5MoeTextRotaryEmbedding.forward = rope_fwd
    for fname in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"):
        if hasattr(M, fname):
            setattr(M, fname, delta_rule)
    for mod in model.modules():   # older layouts keep the kernels as attributes
        for attr in ("chunk_gated_delta_rule", "recurrent_gated_delta_rule"):
            if hasattr(mod, attr) and callable(getattr(mod, attr)):
                setattr(mod, attr, delta_rule)


def rel_rms(a, b):
    a, b = a.double(), b.double()
    return float(((a - b).pow(2).sum() / b.pow(2).sum().clamp_min(1e-300)).sqrt())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    args = ap.parse_args()
    out_dir = args.out
    fx = os.path.join(out_dir, "hf_tiny")
    os.makedirs(fx, exist_ok=True)
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)

    print("python", platform.python_version(), "torch", torch.__version__, "transformers", transformers.__version__,
          "safetensors", safetensors.__version__, flush=True)
    cfg = Qwen3_5MoeTextConfig(**CONFIG)
    print("config:", json.dumps(cfg.to_dict(), default=str)[:3000], flush=True)
    model = Qwen3_5MoeForCausalLM(cfg).to(torch.float32)
    init_weights(model, gen)
    for n, p in model.named_parameters():
        print(f"  param {n} {tuple(p.shape)} {p.dtype}")

    # the checkpoint: save_pretrained, then re-store each tensor in its role's dtype
    tmp = tempfile.mkdtemp()
    model.save_pretrained(tmp)
    print("save_pretrained wrote:", sorted(os.listdir(tmp)), flush=True)
    st_files = sorted(f for f in os.listdir(tmp) if f.endswith(".safetensors"))
    tensors, meta = {}, None
    for f in st_files:
        with safe_open(os.path.join(tmp, f), "pt") as h:
            meta = h.metadata()
        tensors.update(load_file(os.path.join(tmp, f)))
    stored = {}
    for n, t in tensors.items():
        d = store_dtype(n)
        t32 = t.to(torch.float32)
        if not torch.equal(t32.to(d).to(torch.float32), t32):
            print(f"WARNING {n}: values not representable in {d}; stored as float32", flush=True)
            d = torch.float32
        stored[n] = t32.to(d).contiguous()
    save_file(stored, os.path.join(fx, "model.safetensors"), metadata=meta or {"format": "pt"})
    shutil.copy(os.path.join(tmp, "config.json"), os.path.join(fx, "config.json"))
    names = {n: [str(t.dtype).replace("torch.", ""), list(t.shape)] for n, t in sorted(stored.items())}
    for n, (d, s) in names.items():
        print(f"  saved {n} {d} {s}")

    # a reload through from_pretrained must give back the same weights (names round trip)
    try:
        re = Qwen3_5MoeForCausalLM.from_pretrained(fx, dtype=torch.float32)
        sd0, sd1 = model.state_dict(), re.state_dict()
        mism = [k for k in sd0 if k not in sd1 or not torch.equal(sd0[k].float(), sd1[k].float())]
        print("reload mismatches:", len(mism), mism[:10], flush=True)
        del re
    except Exception as ex:  # a check only
        print("reload failed:", repr(ex), flush=True)

    V = CONFIG["vocab_size"]
    ids = [(7 + 37 * i + (i * i) % 101) % V for i in range(N_IDS)]
    summary = {}

    summary["experts_implementation_f32"] = str(getattr(model.config, "_experts_implementation", None))
    lg32, dbg32 = run(model, ids, "cpu", capture=True)
    print("cpu f32 logits", tuple(lg32.shape), "rms", float(lg32.pow(2).mean().sqrt()), flush=True)

    lg_gpu = None
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        try:
            lg_gpu, _ = run(model, ids, "cuda")
            summary["gpu_f32_vs_cpu_f32_rel_rms"] = rel_rms(lg_gpu, lg32)
            summary["gpu_device"] = torch.cuda.get_device_name(0)
            print("gpu f32 vs cpu f32 rel rms", summary["gpu_f32_vs_cpu_f32_rel_rms"], flush=True)
        except Exception as ex:
            print("gpu run failed:", repr(ex), flush=True)
        model.to("cpu")

    # float64 unpatched first (what HF gives as is), then patched
    m64 = model.to(torch.float64)
    # the default experts path (torch grouped_mm) takes no float64: use the eager loop
    try:
        if hasattr(m64, "set_experts_implementation"):
            m64.set_experts_implementation("eager")
    except Exception as ex:
        print("set_experts_implementation failed:", repr(ex), flush=True)
    for mod in m64.modules():
        cfg_ = getattr(mod, "config", None)
        if cfg_ is not None and getattr(cfg_, "_experts_implementation", "eager") != "eager":
            try:
                cfg_._experts_implementation = "eager"
            except Exception as ex:
                print("cannot set _experts_implementation:", repr(ex), flush=True)
    summary["experts_implementation_f64"] = str(getattr(m64.config, "_experts_implementation", None))
    try:
        lg64_raw, _ = run(m64, ids, "cpu")
    except Exception as ex:
        print("unpatched f64 run failed:", repr(ex), flush=True)
        lg64_raw = torch.full((len(ids), V), float("nan"), dtype=torch.float64)
    patch_f64(m64)
    lg64, dbg64 = run(m64, ids, "cpu", capture=True)
    summary["patch_calls"] = dict(PATCH_CALLS)
    summary["f64_unpatched_vs_f64_rel_rms"] = rel_rms(lg64_raw, lg64)
    summary["f32_vs_f64_rel_rms"] = rel_rms(lg32, lg64)
    summary["f32_vs_f64_max_abs"] = float((lg32.double() - lg64).abs().max())
    summary["top1_f32_eq_f64"] = int((lg32.argmax(-1) == lg64.argmax(-1)).sum())
    print("summary", json.dumps(summary), flush=True)

    with open(os.path.join(fx, "logits_f32.bin"), "wb") as f:
        f.write(lg32.to(torch.float32).contiguous().numpy().astype("<f4").tobytes())
    with open(os.path.join(fx, "logits_f64.bin"), "wb") as f:
        f.write(lg64.to(torch.float64).contiguous().numpy().astype("<f8").tobytes())

    ref = {
        "made_by": "tools/ref/hf_parity.py",
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "safetensors": safetensors.__version__},
        "model_class": "Qwen3_5MoeForCausalLM",
        "config_args": CONFIG,
        "seed": SEED,
        "ids": ids,
        "n_ids": len(ids),
        "n_vocab": V,
        "logits_f32": {"file": "logits_f32.bin", "dtype": "float32 little-endian", "shape": [len(ids), V],
                       "how": "HF forward on the CPU, float32, one batch of all ids, no cache"},
        "logits_f64": {"file": "logits_f64.bin", "dtype": "float64 little-endian", "shape": [len(ids), V],
                       "how": "the same in float64 with the float32 casts patched out (see patch_f64)"},
        "tensors": names,
        "summary": summary,
    }
    with open(os.path.join(fx, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)

    # debug dump: raw arrays one after another, described in debug.json
    index, off = [], 0
    with open(os.path.join(out_dir, "debug.bin"), "wb") as f:
        arrays = [(f"f32.{k}", v.to(torch.float32), "<f4") for k, v in dbg32.items()]
        arrays += [(f"f64.{k}", v.to(torch.float64), "<f8") for k, v in dbg64.items()]
        arrays += [("f64_unpatched.logits", lg64_raw.to(torch.float64), "<f8")]
        if lg_gpu is not None:
            arrays.append(("gpu_f32.logits", lg_gpu.to(torch.float32), "<f4"))
        for name, t, dt in arrays:
            b = t.contiguous().numpy().astype(dt).tobytes()
            index.append({"name": name, "dtype": dt, "shape": list(t.shape), "offset": off})
            f.write(b)
            off += len(b)
    with open(os.path.join(out_dir, "debug.json"), "w") as f:
        json.dump(index, f, indent=1)
    print("done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
