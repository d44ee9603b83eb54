#!/usr/bin/env python3
"""mk_hf.py: a random Hugging Face Qwen3.5-MoE checkpoint (config.json + model.safetensors,
float32) with the standard library only, at widths where every matrix row is a whole number
of 256-element blocks (hidden 256, 4 heads of 64, 4 GDN value heads of 64, expert and shared
widths 256), so `hearth convert --quant q4_k_m` can write every tensor in llama-quantize's
Q4_K_M types. The tensor names and config keys are transformers' (tests/fixtures/hf_tiny is
the checkpoint transformers itself wrote, with the same layout).

    mk_hf.py OUT_DIR [SEED [CONFIG.json]] [--mtp] [--dense]

CONFIG.json, when given, replaces the config (the same keys; widths from it). --mtp adds the
multi-token-prediction block as Qwen3.5 checkpoints ship it (config mtp_num_hidden_layers 1;
mtp.fc, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.norm and mtp.layers.0.*, a
full-attention layer with its MoE); its names sort after the trunk's, so the trunk's values
are the same with and without it. --dense makes the dense Qwen3_5ForCausalLM instead
(model_type qwen3_5_text, intermediate_size 512, mlp.gate_proj / up_proj / down_proj)."""
import array, json, os, random, struct, sys

H, V, E, F, FS, L = 256, 1024, 4, 256, 256, 4
HK, HV, DK, DV = 2, 4, 64, 64
NH, NKV, HD = 4, 2, 64
CONFIG = {
    "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text", "hidden_size": H,
    "vocab_size": V, "num_hidden_layers": L,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
    "linear_num_key_heads": HK, "linear_num_value_heads": HV, "linear_key_head_dim": DK,
    "linear_value_head_dim": DV, "linear_conv_kernel_dim": 4, "num_experts": E, "num_experts_per_tok": 2,
    "moe_intermediate_size": F, "shared_expert_intermediate_size": FS, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096, "tie_word_embeddings": False, "partial_rotary_factor": 0.25,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
}


def tensors():
    c = CONFIG
    H, V, E, F, FS, L = (c["hidden_size"], c["vocab_size"], c.get("num_experts", 0), c.get("moe_intermediate_size", 0),
                         c.get("shared_expert_intermediate_size", 0), c["num_hidden_layers"])
    HK, HV, DK, DV = c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"], c["linear_value_head_dim"]
    NH, NKV, HD = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    t = {"model.embed_tokens.weight": [V, H], "lm_head.weight": [V, H], "model.norm.weight": [H]}
    layers = [(f"model.layers.{i}.", CONFIG["layer_types"][i]) for i in range(L)]
    if c.get("mtp_num_hidden_layers", 0):
        layers.append(("mtp.layers.0.", "full_attention"))
        t.update({"mtp.fc.weight": [H, 2 * H], "mtp.pre_fc_norm_embedding.weight": [H],
                  "mtp.pre_fc_norm_hidden.weight": [H], "mtp.norm.weight": [H]})
    for p, kind in layers:
        t[p + "input_layernorm.weight"] = [H]
        t[p + "post_attention_layernorm.weight"] = [H]
        if kind == "linear_attention":
            a = p + "linear_attn."
            t[a + "in_proj_qkv.weight"] = [2 * HK * DK + HV * DV, H]
            t[a + "in_proj_z.weight"] = [HV * DV, H]
            t[a + "in_proj_a.weight"] = [HV, H]
            t[a + "in_proj_b.weight"] = [HV, H]
            t[a + "A_log"] = [HV]
            t[a + "dt_bias"] = [HV]
            t[a + "conv1d.weight"] = [2 * HK * DK + HV * DV, 1, 4]
            t[a + "norm.weight"] = [DV]
            t[a + "out_proj.weight"] = [H, HV * DV]
        else:
            a = p + "self_attn."
            t[a + "q_proj.weight"] = [2 * NH * HD, H]
            t[a + "k_proj.weight"] = [NKV * HD, H]
            t[a + "v_proj.weight"] = [NKV * HD, H]
            t[a + "o_proj.weight"] = [H, NH * HD]
            t[a + "q_norm.weight"] = [HD]
            t[a + "k_norm.weight"] = [HD]
        m = p + "mlp."
        if "intermediate_size" in c:
            t[m + "gate_proj.weight"] = [c["intermediate_size"], H]
            t[m + "up_proj.weight"] = [c["intermediate_size"], H]
            t[m + "down_proj.weight"] = [H, c["intermediate_size"]]
            continue
        t[m + "gate.weight"] = [E, H]
        for e in range(E):
            t[m + f"experts.{e}.gate_proj.weight"] = [F, H]
            t[m + f"experts.{e}.up_proj.weight"] = [F, H]
            t[m + f"experts.{e}.down_proj.weight"] = [H, F]
        t[m + "shared_expert.gate_proj.weight"] = [FS, H]
        t[m + "shared_expert.up_proj.weight"] = [FS, H]
        t[m + "shared_expert.down_proj.weight"] = [H, FS]
        t[m + "shared_expert_gate.weight"] = [1, H]
    return t


def main():
    global CONFIG
    args = [a for a in sys.argv[1:] if a not in ("--mtp", "--dense")]
    out = args[0]
    if len(args) > 2:
        CONFIG = json.load(open(args[2]))
    if "--dense" in sys.argv:
        CONFIG = {k: v for k, v in CONFIG.items() if k not in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                                               "shared_expert_intermediate_size")}
        CONFIG.update(architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", intermediate_size=512)
    if "--mtp" in sys.argv:
        CONFIG = dict(CONFIG, mtp_num_hidden_layers=1)
    rng = random.Random(int(args[1]) if len(args) > 1 else 1)
    os.makedirs(out, exist_ok=True)
    header, blobs, off = {}, [], 0
    for name, shape in sorted(tensors().items()):
        n = 1
        for d in shape:
            n *= d
        std = 1.0 / shape[-1] ** 0.5 if len(shape) >= 2 else 0.3
        if name.endswith("A_log"):
            vals = [rng.uniform(-1.0, 1.0) for _ in range(n)]
        elif name.endswith("dt_bias"):
            vals = [rng.gauss(-1.0, 0.5) for _ in range(n)]
        else:
            vals = [rng.gauss(0.0, std) for _ in range(n)]
        b = array.array("f", vals).tobytes()
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=1)


if __name__ == "__main__":
    main()
