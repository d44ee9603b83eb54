/* model.c: qwen35moe and qwen35 hyperparameters (read, check, write) and the tensor table that both
 * the loader and the generator use, so the two can never disagree on a name or a shape. */
#include "model/model.h"
#include "format/quant.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const role_suffix[TR_COUNT] = {
    [TR_TOKEN_EMBD] = "token_embd.weight", [TR_OUTPUT_NORM] = "output_norm.weight",
    [TR_OUTPUT] = "output.weight",
    [TR_ATTN_NORM] = "attn_norm.weight", [TR_POST_NORM] = "post_attention_norm.weight",
    [TR_ATTN_QKV] = "attn_qkv.weight", [TR_ATTN_GATE] = "attn_gate.weight",
    [TR_SSM_CONV1D] = "ssm_conv1d.weight", [TR_SSM_DT] = "ssm_dt.bias", [TR_SSM_A] = "ssm_a",
    [TR_SSM_BETA] = "ssm_beta.weight", [TR_SSM_ALPHA] = "ssm_alpha.weight",
    [TR_SSM_NORM] = "ssm_norm.weight", [TR_SSM_OUT] = "ssm_out.weight",
    [TR_ATTN_Q] = "attn_q.weight", [TR_ATTN_K] = "attn_k.weight", [TR_ATTN_V] = "attn_v.weight",
    [TR_ATTN_OUT] = "attn_output.weight", [TR_ATTN_Q_NORM] = "attn_q_norm.weight",
    [TR_ATTN_K_NORM] = "attn_k_norm.weight",
    [TR_FFN_GATE_INP] = "ffn_gate_inp.weight", [TR_FFN_GATE_EXPS] = "ffn_gate_exps.weight",
    [TR_FFN_UP_EXPS] = "ffn_up_exps.weight", [TR_FFN_DOWN_EXPS] = "ffn_down_exps.weight",
    [TR_FFN_GATE_INP_SHEXP] = "ffn_gate_inp_shexp.weight",
    [TR_FFN_GATE_SHEXP] = "ffn_gate_shexp.weight", [TR_FFN_UP_SHEXP] = "ffn_up_shexp.weight",
    [TR_FFN_DOWN_SHEXP] = "ffn_down_shexp.weight",
    [TR_FFN_GATE] = "ffn_gate.weight", [TR_FFN_UP] = "ffn_up.weight", [TR_FFN_DOWN] = "ffn_down.weight",
    [TR_NEXTN_EH_PROJ] = "nextn.eh_proj.weight", [TR_NEXTN_ENORM] = "nextn.enorm.weight",
    [TR_NEXTN_HNORM] = "nextn.hnorm.weight", [TR_NEXTN_HEAD_NORM] = "nextn.shared_head_norm.weight",
};

static void spec_add(tensor_spec *s, int64_t *n, enum tensor_role role, int layer, uint32_t n_dims,
                     int64_t ne0, int64_t ne1, int64_t ne2) {
    tensor_spec *t = &s[(*n)++];
    memset(t, 0, sizeof *t);
    if (layer < 0) snprintf(t->name, sizeof t->name, "%s", role_suffix[role]);
    else snprintf(t->name, sizeof t->name, "blk.%d.%s", layer, role_suffix[role]);
    t->role = role;
    t->layer = layer;
    t->n_dims = n_dims;
    t->ne[0] = ne0; t->ne[1] = ne1; t->ne[2] = ne2; t->ne[3] = 1;
}

int64_t model_tensor_specs(const model_hparams *hp, tensor_spec **out) {
    const int64_t E = hp->n_embd, V = hp->n_vocab, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    const int64_t X = hp->n_expert, F = hp->n_ff_exp, Fs = hp->n_ff_shexp, Gv = hp->ssm_dt_rank;
    const int64_t n_all = hp->n_layer + (hp->n_layer_nextn == 1);
    tensor_spec *s = xcalloc((size_t)(3 + n_all * 20 + 4), sizeof *s);
    int64_t n = 0;
    spec_add(s, &n, TR_TOKEN_EMBD, -1, 2, E, V, 1);
    for (int il = 0; il < n_all; il++) { /* the MTP block's layer (il = n_layer) is an attention layer */
        spec_add(s, &n, TR_ATTN_NORM, il, 1, E, 1, 1);
        spec_add(s, &n, TR_POST_NORM, il, 1, E, 1, 1);
        if (hp->is_recurrent[il]) {
            spec_add(s, &n, TR_ATTN_QKV, il, 2, E, hp_conv_dim(hp), 1);
            spec_add(s, &n, TR_ATTN_GATE, il, 2, E, hp_value_dim(hp), 1);
            spec_add(s, &n, TR_SSM_CONV1D, il, 2, hp->ssm_d_conv, hp_conv_dim(hp), 1);
            spec_add(s, &n, TR_SSM_DT, il, 1, Gv, 1, 1);
            spec_add(s, &n, TR_SSM_A, il, 1, Gv, 1, 1);
            spec_add(s, &n, TR_SSM_BETA, il, 2, E, Gv, 1);
            spec_add(s, &n, TR_SSM_ALPHA, il, 2, E, Gv, 1);
            spec_add(s, &n, TR_SSM_NORM, il, 1, hp->ssm_d_state, 1, 1);
            spec_add(s, &n, TR_SSM_OUT, il, 2, hp_value_dim(hp), E, 1);
        } else {
            spec_add(s, &n, TR_ATTN_Q, il, 2, E, 2 * H * D, 1);
            spec_add(s, &n, TR_ATTN_K, il, 2, E, Hkv * D, 1);
            spec_add(s, &n, TR_ATTN_V, il, 2, E, Hkv * D, 1);
            spec_add(s, &n, TR_ATTN_OUT, il, 2, H * D, E, 1);
            spec_add(s, &n, TR_ATTN_Q_NORM, il, 1, D, 1, 1);
            spec_add(s, &n, TR_ATTN_K_NORM, il, 1, D, 1, 1);
        }
        if (hp->dense) {
            spec_add(s, &n, TR_FFN_GATE, il, 2, E, hp->n_ff, 1);
            spec_add(s, &n, TR_FFN_DOWN, il, 2, hp->n_ff, E, 1);
            spec_add(s, &n, TR_FFN_UP, il, 2, E, hp->n_ff, 1);
        } else {
            spec_add(s, &n, TR_FFN_GATE_INP, il, 2, E, X, 1);
            spec_add(s, &n, TR_FFN_GATE_EXPS, il, 3, E, F, X);
            spec_add(s, &n, TR_FFN_UP_EXPS, il, 3, E, F, X);
            spec_add(s, &n, TR_FFN_DOWN_EXPS, il, 3, F, E, X);
            spec_add(s, &n, TR_FFN_GATE_INP_SHEXP, il, 1, E, 1, 1);
            spec_add(s, &n, TR_FFN_GATE_SHEXP, il, 2, E, Fs, 1);
            spec_add(s, &n, TR_FFN_UP_SHEXP, il, 2, E, Fs, 1);
            spec_add(s, &n, TR_FFN_DOWN_SHEXP, il, 2, Fs, E, 1);
        }
        if (il == hp->n_layer) {
            spec_add(s, &n, TR_NEXTN_EH_PROJ, il, 2, 2 * E, E, 1);
            spec_add(s, &n, TR_NEXTN_ENORM, il, 1, E, 1, 1);
            spec_add(s, &n, TR_NEXTN_HNORM, il, 1, E, 1, 1);
            spec_add(s, &n, TR_NEXTN_HEAD_NORM, il, 1, E, 1, 1);
        }
    }
    spec_add(s, &n, TR_OUTPUT_NORM, -1, 1, E, 1, 1);
    if (!hp->tied) spec_add(s, &n, TR_OUTPUT, -1, 2, E, V, 1);
    *out = s;
    return n;
}

int model_hparams_check(model_hparams *hp, herr *e) {
    hp->dense = !strcmp(hp->arch, "qwen35");
    if (hp->dense) { /* no MoE: its fields 0 (the table below holds them there) */
        hp->n_expert = hp->n_expert_used = hp->n_ff_exp = hp->n_ff_shexp = 0;
        if (hp->n_ff < 1 || hp->n_ff > (1 << 20))
            return herr_set(e, "qwen35.feed_forward_length = %" PRId64 " is out of range [1, %d]", hp->n_ff, 1 << 20);
    }
    const int64_t moe = !hp->dense; /* the expert keys' lower bound, and 0 as the upper where dense */
    struct { const char *name; int64_t v, lo, hi; } r[] = {
        {"block_count", hp->n_layer, 1, MODEL_MAX_LAYERS},
        {"embedding_length", hp->n_embd, 1, 1 << 16},
        {"vocab_size", hp->n_vocab, 1, 1 << 22},
        {"attention.head_count", hp->n_head, 1, 1024},
        {"attention.head_count_kv", hp->n_head_kv, 1, 1024},
        {"attention.key_length", hp->head_dim, 2, 1024},
        {"rope.dimension_count", hp->rope_dims, 2, 1024},
        {"expert_count", hp->n_expert, moe, moe * 4096},
        {"expert_used_count", hp->n_expert_used, moe, moe * 4096},
        {"expert_feed_forward_length", hp->n_ff_exp, moe, moe << 16},
        {"expert_shared_feed_forward_length", hp->n_ff_shexp, moe, moe << 16},
        {"ssm.conv_kernel", hp->ssm_d_conv, 2, 16},
        {"ssm.state_size", hp->ssm_d_state, 1, 1024},
        {"ssm.group_count", hp->ssm_n_group, 1, 1024},
        {"ssm.time_step_rank", hp->ssm_dt_rank, 1, 1024},
        {"full_attention_interval", hp->full_attn_interval, 1, MODEL_MAX_LAYERS},
        {"context_length", hp->n_ctx_train, 1, (int64_t)1 << 24},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (r[i].v < r[i].lo || r[i].v > r[i].hi)
            return herr_set(e, "%s.%s = %" PRId64 " is out of range [%" PRId64 ", %" PRId64 "]", hp->arch,
                            r[i].name, r[i].v, r[i].lo, r[i].hi);
    if (hp->n_expert_used > hp->n_expert)
        return herr_set(e, "expert_used_count %" PRId64 " exceeds expert_count %" PRId64, hp->n_expert_used, hp->n_expert);
    if (hp->n_head % hp->n_head_kv != 0)
        return herr_set(e, "attention.head_count %" PRId64 " is not a multiple of head_count_kv %" PRId64, hp->n_head,
                        hp->n_head_kv);
    if (hp->ssm_dt_rank % hp->ssm_n_group != 0)
        return herr_set(e, "ssm.time_step_rank %" PRId64 " is not a multiple of ssm.group_count %" PRId64,
                        hp->ssm_dt_rank, hp->ssm_n_group);
    if (hp->ssm_d_inner != hp_value_dim(hp))
        return herr_set(e, "ssm.inner_size %" PRId64 " != time_step_rank x state_size = %" PRId64, hp->ssm_d_inner,
                        hp_value_dim(hp));
    if (hp->rope_dims > hp->head_dim || hp->rope_dims % 2)
        return herr_set(e, "rope.dimension_count %" PRId64 " must be even and at most key_length %" PRId64,
                        hp->rope_dims, hp->head_dim);
    if (hp->n_layer + (hp->n_layer_nextn == 1) > MODEL_MAX_LAYERS)
        return herr_set(e, "%s.block_count %" PRId64 " with an MTP block is above %d", hp->arch, hp->n_layer + 1, MODEL_MAX_LAYERS);
    for (int il = 0; il < hp->n_layer; il++) hp->is_recurrent[il] = (il + 1) % hp->full_attn_interval != 0;
    if (hp->n_layer < MODEL_MAX_LAYERS) hp->is_recurrent[hp->n_layer] = false; /* (the MTP block's layer, where there is one) */
    return 0;
}

static int get_i64(const gguf_file *f, const char *arch, const char *key, int64_t *out, bool required, herr *e) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    if (!gguf_find(f, full)) {
        if (required) return herr_set(e, "missing key %s", full);
        return 0;
    }
    uint64_t v;
    if (gguf_get_u64(f, full, &v, e) < 0) return -1;
    if (v > (uint64_t)INT64_MAX) return herr_set(e, "key %s: value too large", full);
    *out = (int64_t)v;
    return 0;
}

int model_hparams_read(const gguf_file *f, model_hparams *hp, herr *e) {
    memset(hp, 0, sizeof *hp);
    gguf_str arch;
    if (gguf_get_str(f, "general.architecture", &arch, e) < 0) return -1;
    if (!gguf_str_eq(arch, "qwen35moe") && !gguf_str_eq(arch, "qwen35"))
        return herr_set(e, "general.architecture is \"%.*s\": hearth serves \"qwen35moe\" and \"qwen35\"",
                        (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
    const bool dense = gguf_str_eq(arch, "qwen35");
    snprintf(hp->arch, sizeof hp->arch, dense ? "qwen35" : "qwen35moe");
    const char *a = hp->arch;
    int64_t block_count = 0, key_len = 0, val_len = 0;
    hp->full_attn_interval = 4;
    if (get_i64(f, a, "block_count", &block_count, true, e) < 0 ||
        get_i64(f, a, "nextn_predict_layers", &hp->n_layer_nextn, false, e) < 0 ||
        get_i64(f, a, "context_length", &hp->n_ctx_train, true, e) < 0 ||
        get_i64(f, a, "embedding_length", &hp->n_embd, true, e) < 0 ||
        get_i64(f, a, "attention.head_count", &hp->n_head, true, e) < 0 ||
        get_i64(f, a, "attention.head_count_kv", &hp->n_head_kv, true, e) < 0 ||
        get_i64(f, a, "attention.key_length", &key_len, true, e) < 0 ||
        get_i64(f, a, "attention.value_length", &val_len, true, e) < 0 ||
        get_i64(f, a, "rope.dimension_count", &hp->rope_dims, true, e) < 0 ||
        get_i64(f, a, "expert_count", &hp->n_expert, !dense, e) < 0 ||
        get_i64(f, a, "expert_used_count", &hp->n_expert_used, !dense, e) < 0 ||
        get_i64(f, a, "expert_feed_forward_length", &hp->n_ff_exp, !dense, e) < 0 ||
        get_i64(f, a, "expert_shared_feed_forward_length", &hp->n_ff_shexp, !dense, e) < 0 ||
        get_i64(f, a, "feed_forward_length", &hp->n_ff, dense, e) < 0 ||
        get_i64(f, a, "ssm.conv_kernel", &hp->ssm_d_conv, true, e) < 0 ||
        get_i64(f, a, "ssm.state_size", &hp->ssm_d_state, true, e) < 0 ||
        get_i64(f, a, "ssm.group_count", &hp->ssm_n_group, true, e) < 0 ||
        get_i64(f, a, "ssm.time_step_rank", &hp->ssm_dt_rank, true, e) < 0 ||
        get_i64(f, a, "ssm.inner_size", &hp->ssm_d_inner, true, e) < 0 ||
        get_i64(f, a, "full_attention_interval", &hp->full_attn_interval, false, e) < 0)
        return -1;
    if (hp->n_layer_nextn < 0 || hp->n_layer_nextn >= block_count)
        return herr_set(e, "%s.nextn_predict_layers %" PRId64 " must be below block_count %" PRId64, a, hp->n_layer_nextn,
                        block_count);
    hp->n_layer = block_count - hp->n_layer_nextn;
    if (key_len != val_len)
        return herr_set(e, "%s.attention.key_length %" PRId64 " != value_length %" PRId64, a, key_len, val_len);
    hp->head_dim = key_len;
    char k[128];
    snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", a);
    if (gguf_get_f32(f, k, &hp->rms_eps, e) < 0) return -1;
    snprintf(k, sizeof k, "%s.rope.freq_base", a);
    hp->rope_theta = 10000.0f;
    if (gguf_find(f, k) && gguf_get_f32(f, k, &hp->rope_theta, e) < 0) return -1;
    snprintf(k, sizeof k, "%s.rope.dimension_sections", a);
    const gguf_value *sec;
    if (gguf_get_arr(f, k, GGUF_TYPE_COUNT, &sec, e) < 0) return -1;
    for (uint64_t i = 0; i < 4 && i < sec->v.arr.n; i++) hp->rope_sections[i] = (int32_t)gguf_arr_int(sec, i);
    if (!(hp->rms_eps > 0 && hp->rms_eps < 1)) return herr_set(e, "%s.attention.layer_norm_rms_epsilon %g is out of (0, 1)", a, hp->rms_eps);
    if (!(hp->rope_theta > 0)) return herr_set(e, "%s.rope.freq_base %g must be positive", a, hp->rope_theta);
    /* vocab: the key is optional; the embedding's rows are the truth */
    const gguf_tensor *te = gguf_find_tensor(f, "token_embd.weight");
    if (!te) return herr_set(e, "missing tensor token_embd.weight");
    hp->n_vocab = te->ne[1];
    if (model_hparams_check(hp, e) < 0) return -1;
    /* an explicit recurrent-layer list wins over the interval */
    snprintf(k, sizeof k, "%s.attention.recurrent_layers", a);
    if (gguf_find(f, k)) {
        const gguf_value *rl;
        if (gguf_get_arr(f, k, GGUF_TYPE_COUNT, &rl, e) < 0) return -1;
        if (rl->v.arr.n < (uint64_t)hp->n_layer)
            return herr_set(e, "%s has %" PRIu64 " entries, expected %" PRId64, k, rl->v.arr.n, hp->n_layer);
        for (int il = 0; il < hp->n_layer; il++) hp->is_recurrent[il] = gguf_arr_int(rl, (uint64_t)il) != 0;
    }
    return 0;
}

void model_hparams_write(const model_hparams *hp, gguf_writer *w) {
    char k[128];
#define KEY(s) (snprintf(k, sizeof k, "%s.%s", hp->arch, s), k)
    gguf_set_str(w, "general.architecture", hp->arch);
    gguf_set_u32(w, KEY("block_count"), (uint32_t)(hp->n_layer + hp->n_layer_nextn));
    gguf_set_u32(w, KEY("context_length"), (uint32_t)hp->n_ctx_train);
    gguf_set_u32(w, KEY("embedding_length"), (uint32_t)hp->n_embd);
    gguf_set_u32(w, KEY("vocab_size"), (uint32_t)hp->n_vocab);
    gguf_set_u32(w, KEY("attention.head_count"), (uint32_t)hp->n_head);
    gguf_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)hp->n_head_kv);
    gguf_set_u32(w, KEY("attention.key_length"), (uint32_t)hp->head_dim);
    gguf_set_u32(w, KEY("attention.value_length"), (uint32_t)hp->head_dim);
    gguf_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), hp->rms_eps);
    gguf_set_u32(w, KEY("rope.dimension_count"), (uint32_t)hp->rope_dims);
    gguf_set_f32(w, KEY("rope.freq_base"), hp->rope_theta);
    gguf_set_arr_data(w, KEY("rope.dimension_sections"), GGUF_TYPE_INT32, hp->rope_sections, 4);
    if (hp->dense) {
        gguf_set_u32(w, KEY("feed_forward_length"), (uint32_t)hp->n_ff);
    } else {
        gguf_set_u32(w, KEY("expert_count"), (uint32_t)hp->n_expert);
        gguf_set_u32(w, KEY("expert_used_count"), (uint32_t)hp->n_expert_used);
        gguf_set_u32(w, KEY("expert_feed_forward_length"), (uint32_t)hp->n_ff_exp);
        gguf_set_u32(w, KEY("expert_shared_feed_forward_length"), (uint32_t)hp->n_ff_shexp);
    }
    gguf_set_u32(w, KEY("ssm.conv_kernel"), (uint32_t)hp->ssm_d_conv);
    gguf_set_u32(w, KEY("ssm.state_size"), (uint32_t)hp->ssm_d_state);
    gguf_set_u32(w, KEY("ssm.group_count"), (uint32_t)hp->ssm_n_group);
    gguf_set_u32(w, KEY("ssm.time_step_rank"), (uint32_t)hp->ssm_dt_rank);
    gguf_set_u32(w, KEY("ssm.inner_size"), (uint32_t)hp->ssm_d_inner);
    gguf_set_u32(w, KEY("full_attention_interval"), (uint32_t)hp->full_attn_interval);
    gguf_set_u32(w, KEY("nextn_predict_layers"), (uint32_t)hp->n_layer_nextn);
#undef KEY
}

static qtensor *slot_of(model *m, const tensor_spec *s) {
    if (s->layer < 0) {
        switch (s->role) {
        case TR_TOKEN_EMBD: return &m->token_embd;
        case TR_OUTPUT_NORM: return &m->output_norm;
        case TR_OUTPUT: return &m->output;
        default: HEARTH_DIE("global tensor with a layer role %d", (int)s->role);
        }
    }
    model_layer *l = &m->layers[s->layer];
    switch (s->role) {
    case TR_NEXTN_EH_PROJ: return &m->mtp.eh_proj;
    case TR_NEXTN_ENORM: return &m->mtp.enorm;
    case TR_NEXTN_HNORM: return &m->mtp.hnorm;
    case TR_NEXTN_HEAD_NORM: return &m->mtp.head_norm;
    case TR_ATTN_NORM: return &l->attn_norm;
    case TR_POST_NORM: return &l->post_norm;
    case TR_ATTN_QKV: return &l->attn_qkv;
    case TR_ATTN_GATE: return &l->attn_gate;
    case TR_SSM_CONV1D: return &l->ssm_conv1d;
    case TR_SSM_DT: return &l->ssm_dt;
    case TR_SSM_A: return &l->ssm_a;
    case TR_SSM_BETA: return &l->ssm_beta;
    case TR_SSM_ALPHA: return &l->ssm_alpha;
    case TR_SSM_NORM: return &l->ssm_norm;
    case TR_SSM_OUT: return &l->ssm_out;
    case TR_ATTN_Q: return &l->attn_q;
    case TR_ATTN_K: return &l->attn_k;
    case TR_ATTN_V: return &l->attn_v;
    case TR_ATTN_OUT: return &l->attn_out;
    case TR_ATTN_Q_NORM: return &l->attn_q_norm;
    case TR_ATTN_K_NORM: return &l->attn_k_norm;
    case TR_FFN_GATE_INP: return &l->ffn_gate_inp;
    case TR_FFN_GATE_EXPS: return &l->ffn_gate_exps;
    case TR_FFN_UP_EXPS: return &l->ffn_up_exps;
    case TR_FFN_DOWN_EXPS: return &l->ffn_down_exps;
    case TR_FFN_GATE_INP_SHEXP: return &l->ffn_gate_inp_shexp;
    case TR_FFN_GATE_SHEXP: return &l->ffn_gate_shexp;
    case TR_FFN_UP_SHEXP: return &l->ffn_up_shexp;
    case TR_FFN_DOWN_SHEXP: return &l->ffn_down_shexp;
    case TR_FFN_GATE: return &l->ffn_gate;
    case TR_FFN_UP: return &l->ffn_up;
    case TR_FFN_DOWN: return &l->ffn_down;
    default: HEARTH_DIE("layer tensor with a global role %d", (int)s->role);
    }
}

/* Small tensors the engine reads as plain floats (norms, gates' vectors, conv taps). */
static bool role_needs_f32(enum tensor_role r) {
    switch (r) {
    case TR_OUTPUT_NORM: case TR_ATTN_NORM: case TR_POST_NORM: case TR_SSM_CONV1D: case TR_SSM_DT:
    case TR_SSM_A: case TR_SSM_NORM: case TR_ATTN_Q_NORM: case TR_ATTN_K_NORM: case TR_FFN_GATE_INP_SHEXP:
    case TR_NEXTN_ENORM: case TR_NEXTN_HNORM: case TR_NEXTN_HEAD_NORM:
        return true;
    default:
        return false;
    }
}

static void shape_str(char *buf, size_t n, uint32_t n_dims, const int64_t *ne) {
    int o = snprintf(buf, n, "{");
    for (uint32_t d = 0; d < n_dims && o > 0 && (size_t)o < n; d++)
        o += snprintf(buf + o, n - (size_t)o, "%s%" PRId64, d ? ", " : "", ne[d]);
    if (o > 0 && (size_t)o < n) snprintf(buf + o, n - (size_t)o, "}");
}

int model_load_file(model **out, gguf_file *f, herr *e) {
    model *m = xcalloc(1, sizeof *m);
    if (model_hparams_read(f, &m->hp, e) < 0) { free(m); return -1; }
    tensor_spec *specs;
    int64_t n = model_tensor_specs(&m->hp, &specs);
    /* The MTP block is all or nothing: a file may say nextn_predict_layers 1 and hold none of
     * its tensors (a converter that dropped them); one that holds some must hold all */
    int64_t n_mtp = 0, n_mtp_found = 0;
    for (int64_t i = 0; i < n; i++)
        if (model_spec_is_mtp(&m->hp, &specs[i])) n_mtp++, n_mtp_found += gguf_find_tensor(f, specs[i].name) != NULL;
    m->has_mtp = n_mtp > 0 && n_mtp_found > 0;
    for (int64_t i = 0; i < n; i++) {
        const tensor_spec *s = &specs[i];
        if (!m->has_mtp && model_spec_is_mtp(&m->hp, s)) continue;
        const gguf_tensor *t = gguf_find_tensor(f, s->name);
        char want[96], got[96];
        shape_str(want, sizeof want, s->n_dims, s->ne);
        if (!t && s->role == TR_OUTPUT) t = gguf_find_tensor(f, "token_embd.weight"); /* tied output */
        if (!t && model_spec_is_mtp(&m->hp, s)) {
            herr_set(e, "missing tensor %s, expected shape %s (the file holds part of the MTP block, blk.%" PRId64 ")", s->name,
                     want, m->hp.n_layer);
            goto fail;
        }
        if (!t) {
            herr_set(e, "missing tensor %s, expected shape %s", s->name, want);
            goto fail;
        }
        bool same = true;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) same &= t->ne[d] == s->ne[d];
        if (!same) {
            shape_str(got, sizeof got, t->n_dims, t->ne);
            herr_set(e, "tensor %s has shape %s, expected %s", s->name, got, want);
            goto fail;
        }
        if (!qtype_supported(t->type) || t->type == QT_Q8_K) {
            herr_set(e, "tensor %s has type %s, which hearth cannot compute with (F32 F16 BF16 Q8_0 Q4_K Q5_K Q6_K)",
                     s->name, qtype_name(t->type));
            goto fail;
        }
        if (role_needs_f32(s->role) && t->type != QT_F32) {
            herr_set(e, "tensor %s has type %s, expected f32", s->name, qtype_name(t->type));
            goto fail;
        }
        if (qtype_row_bytes(t->type, t->ne[0]) == 0) {
            herr_set(e, "tensor %s: row of %" PRId64 " is not a multiple of %s's block of %" PRId64, s->name, t->ne[0],
                     qtype_name(t->type), qtype_block_elems(t->type));
            goto fail;
        }
        qtensor *q = slot_of(m, s);
        q->data = t->data;
        q->type = t->type;
        memcpy(q->ne, t->ne, sizeof q->ne);
        q->row_bytes = qtype_row_bytes(t->type, t->ne[0]);
        q->name = t->name;
    }
    free(specs);
    for (int il = 0; il < m->hp.n_layer; il++) m->layers[il].recurrent = m->hp.is_recurrent[il];
    if (m->has_mtp) m->layers[m->hp.n_layer].recurrent = false;
    m->file = f;
    *out = m;
    return 0;
fail:
    free(specs);
    free(m);
    return -1;
}

int model_load(model **out, const char *path, herr *e) {
    gguf_file *f;
    if (gguf_open(&f, path, e) < 0) return -1;
    if (model_load_file(out, f, e) < 0) {
        herr_wrap(e, "%s", path);
        gguf_close(f);
        return -1;
    }
    return 0;
}

void model_free(model *m) {
    if (!m) return;
    gguf_close(m->file);
    free(m);
}
