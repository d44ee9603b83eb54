/* convert.c: `hearth convert`'s library part. Reads config.json (cJSON) into model_hparams
 * (Qwen3.5/3.6 MoE, qwen35moe; or the dense Qwen3_5ForCausalLM / ForConditionalGeneration's
 * text model, qwen35: mlp.gate_proj / up_proj / down_proj as ffn_gate / ffn_up / ffn_down),
 * opens the safetensors files (src/safetensors.h), and writes the GGUF tensors of
 * model_tensor_specs() one by one, each made from its HF tensor(s) with the transforms of
 * llama.cpp's convert_hf_to_gguf.py (conversion/qwen.py: Qwen3NextModel,
 * _LinearAttentionVReorderBase, Qwen3_5MoeTextModel; conversion/base.py for the key names
 * and the type choice):
 *   - every "*norm.weight" but linear_attn.norm gets +1 (HF applies those norms as 1 + w);
 *   - A_log -> ssm_a = -exp(A_log); dt_bias -> ssm_dt.bias; conv1d [C,1,W] squeezed to {W, C};
 *   - GDN V heads re-tiled from grouped by key head (HF: value head g*r + j belongs to key
 *     head g, r = Gv/Gk) to tiled order (GGUF: position j*Gk + g, so value head n reads key
 *     head n % Gk): the v rows of in_proj_qkv, the rows of in_proj_z (blocks of S), the rows
 *     of in_proj_a / in_proj_b, A_log, dt_bias, the v channels of conv1d and the columns of
 *     out_proj (blocks of S); q and k parts are untouched;
 *   - experts (per-expert 2-D, stacked 3-D, or fused gate_up_proj split in halves, gate
 *     first) stacked into {E, F, X} / {F, E, X}; shared_expert_gate [1, E] -> {E}.
 * Every HF tensor is checked for presence and shape (after dropping size-1 dims) before the
 * output file is created, so a bad checkpoint leaves no file behind. Large tensors are
 * streamed in row chunks (token_embd, output) or per expert, never held whole.
 *   - the MTP block (config mtp_num_hidden_layers 1, tensors mtp.*), as llama.cpp's
 *     _QwenMtpMixin: its layer mtp.layers.0.* becomes blk.N (N = num_hidden_layers, with
 *     the trunk's names and rules), fc -> nextn.eh_proj, pre_fc_norm_embedding -> nextn.enorm,
 *     pre_fc_norm_hidden -> nextn.hnorm, norm -> nextn.shared_head_norm (norms + 1);
 *     block_count counts it and nextn_predict_layers is 1.
 * Not converted: any vision tower. */
#include "make/convert.h"
#include "format/gguf.h"
#include "format/quant.h"
#include "make/gen.h"
#include "format/safetensors.h"
#include "make/vocab_import.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int convert_quant_parse(const char *s, convert_quant *q, herr *e) {
    char low[16];
    size_t n = strlen(s);
    if (n >= sizeof low) return herr_set(e, "unknown quantization '%.32s' (f32, q8_0, q4_k_m)", s);
    for (size_t i = 0; i <= n; i++) low[i] = (char)tolower((unsigned char)s[i]);
    if (!strcmp(low, "f32")) *q = CONVERT_F32;
    else if (!strcmp(low, "q8_0")) *q = CONVERT_Q8_0;
    else if (!strcmp(low, "q4_k_m")) *q = CONVERT_Q4_K_M;
    else return herr_set(e, "unknown quantization '%s' (f32, q8_0, q4_k_m)", s);
    return 0;
}

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = xmalloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static bool file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* A JSON file (at most 256 MiB: an index of a huge checkpoint is a few MB); errors name it
 * by its file name (the caller adds the folder). */
static int json_load(const char *path, cJSON **out, herr *e) {
    const char *slash = strrchr(path, '/');
    const char *shown = slash ? slash + 1 : path;
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size > ((uint64_t)256 << 20))
        return herr_set(e, "%s: larger than 256 MiB", shown);
    char *buf;
    size_t len;
    if (read_file(path, &buf, &len, e) < 0) {
        /* read_file's message begins with the path: keep it from the file name on */
        size_t skip = (size_t)(shown - path);
        if (e && !strncmp(e->msg, path, skip)) memmove(e->msg, e->msg + skip, strlen(e->msg + skip) + 1);
        return -1;
    }
    *out = cJSON_ParseWithLength(buf, len);
    free(buf);
    if (!*out) return herr_set(e, "%s: not valid JSON", shown);
    return 0;
}

/* ---- config.json ---- */

typedef struct cfg {
    const cJSON *root, *text; /* text: text_config of a multimodal checkpoint (wins), or NULL */
} cfg;

static const cJSON *cfg_item(const cfg *c, const char *key) {
    const cJSON *j = c->text ? cJSON_GetObjectItemCaseSensitive(c->text, key) : NULL;
    if (!j || cJSON_IsNull(j)) j = cJSON_GetObjectItemCaseSensitive(c->root, key);
    return j && !cJSON_IsNull(j) ? j : NULL;
}

static int json_int(const cJSON *j, const char *what, int64_t *out, herr *e) {
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || fabs(j->valuedouble) > 9.0e15)
        return herr_set(e, "config.json: %s is not a whole number", what);
    *out = (int64_t)j->valuedouble;
    return 0;
}

static int cfg_int(const cfg *c, const char *key, int64_t *out, bool required, herr *e) {
    const cJSON *j = cfg_item(c, key);
    if (!j) return required ? herr_set(e, "config.json: missing %s", key) : 0;
    return json_int(j, key, out, e);
}

static int cfg_float(const cJSON *j, const char *what, double *out, herr *e) {
    if (!cJSON_IsNumber(j)) return herr_set(e, "config.json: %s is not a number", what);
    *out = j->valuedouble;
    return 0;
}

typedef struct cfg_extra {
    bool has_layer_types;       /* the converter then writes attention.recurrent_layers */
    bool tied;                  /* tie_word_embeddings */
} cfg_extra;

/* config.json's parsed root into hp and x */
static int config_from_json(const cJSON *root, model_hparams *hp, cfg_extra *x, herr *e) {
    memset(hp, 0, sizeof *hp);
    memset(x, 0, sizeof *x);
    int rc = -1;
    cfg c = {.root = root, .text = NULL};
    if (!cJSON_IsObject(root)) { herr_set(e, "config.json: not a JSON object"); goto out; }
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (cJSON_IsObject(tc)) c.text = tc;

    const cJSON *mt = cfg_item(&c, "model_type");
    if (!cJSON_IsString(mt)) { herr_set(e, "config.json: missing model_type"); goto out; }
    if (!strcmp(mt->valuestring, "qwen3_next")) {
        herr_set(e, "config.json: model_type qwen3_next (fused in_proj_qkvz) is not supported: convert reads Qwen3.5/3.6 MoE");
        goto out;
    }
    const bool dense = !strcmp(mt->valuestring, "qwen3_5_text") || !strcmp(mt->valuestring, "qwen3_5");
    if (strcmp(mt->valuestring, "qwen3_5_moe_text") && strcmp(mt->valuestring, "qwen3_5_moe") && !dense) {
        herr_set(e, "config.json: model_type \"%.64s\": convert reads Qwen3.5/3.6 (qwen3_5_moe_text, qwen3_5_moe, "
                    "qwen3_5_text, qwen3_5)", mt->valuestring);
        goto out;
    }
    const cJSON *act = cfg_item(&c, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu"))) {
        herr_set(e, "config.json: hidden_act must be \"silu\"");
        goto out;
    }
    const cJSON *ab = cfg_item(&c, "attention_bias");
    if (ab && cJSON_IsTrue(ab)) { herr_set(e, "config.json: attention_bias true is not supported"); goto out; }

    snprintf(hp->arch, sizeof hp->arch, dense ? "qwen35" : "qwen35moe");
    int64_t key_dim = 0, val_dim = 0, n_key = 0, n_val = 0;
    hp->ssm_d_conv = 4;
    hp->full_attn_interval = 4;
    if (cfg_int(&c, "num_hidden_layers", &hp->n_layer, true, e) < 0 ||
        cfg_int(&c, "max_position_embeddings", &hp->n_ctx_train, true, e) < 0 ||
        cfg_int(&c, "hidden_size", &hp->n_embd, true, e) < 0 ||
        cfg_int(&c, "vocab_size", &hp->n_vocab, true, e) < 0 ||
        cfg_int(&c, "num_attention_heads", &hp->n_head, true, e) < 0 ||
        cfg_int(&c, "num_key_value_heads", &hp->n_head_kv, true, e) < 0 ||
        cfg_int(&c, "num_experts", &hp->n_expert, !dense, e) < 0 ||
        cfg_int(&c, "num_experts_per_tok", &hp->n_expert_used, !dense, e) < 0 ||
        cfg_int(&c, "moe_intermediate_size", &hp->n_ff_exp, !dense, e) < 0 ||
        cfg_int(&c, "shared_expert_intermediate_size", &hp->n_ff_shexp, !dense, e) < 0 ||
        cfg_int(&c, "intermediate_size", &hp->n_ff, dense, e) < 0 ||
        cfg_int(&c, "linear_conv_kernel_dim", &hp->ssm_d_conv, false, e) < 0 ||
        cfg_int(&c, "linear_key_head_dim", &key_dim, true, e) < 0 ||
        cfg_int(&c, "linear_value_head_dim", &val_dim, true, e) < 0 ||
        cfg_int(&c, "linear_num_key_heads", &n_key, true, e) < 0 ||
        cfg_int(&c, "linear_num_value_heads", &n_val, true, e) < 0 ||
        cfg_int(&c, "full_attention_interval", &hp->full_attn_interval, false, e) < 0 ||
        cfg_int(&c, "mtp_num_hidden_layers", &hp->n_layer_nextn, false, e) < 0)
        goto out;
    if (hp->n_layer_nextn < 0 || hp->n_layer_nextn > 1) {
        herr_set(e, "config.json: mtp_num_hidden_layers %" PRId64 ": hearth converts 0 or 1 MTP block", hp->n_layer_nextn);
        goto out;
    }
    if (hp->n_head < 1 || hp->n_head > 1024) {
        herr_set(e, "config.json: num_attention_heads %" PRId64 " is out of range", hp->n_head);
        goto out;
    }
    hp->head_dim = hp->n_embd / hp->n_head;
    if (cfg_int(&c, "head_dim", &hp->head_dim, false, e) < 0) goto out;
    if (key_dim != val_dim) {
        herr_set(e, "config.json: linear_key_head_dim %" PRId64 " != linear_value_head_dim %" PRId64
                 " (hearth's GDN state is square)", key_dim, val_dim);
        goto out;
    }
    /* bounded before the product (model_hparams_check bounds the rest) */
    if (n_val < 1 || n_val > 1024 || val_dim < 1 || val_dim > 1024) {
        herr_set(e, "config.json: linear_num_value_heads %" PRId64 " or linear_value_head_dim %" PRId64
                 " is out of range [1, 1024]", n_val, val_dim);
        goto out;
    }
    hp->ssm_d_state = key_dim;
    hp->ssm_n_group = n_key;
    hp->ssm_dt_rank = n_val;
    hp->ssm_d_inner = n_val * val_dim;

    const cJSON *eps = cfg_item(&c, "rms_norm_eps");
    double d = 0;
    if (!eps) { herr_set(e, "config.json: missing rms_norm_eps"); goto out; }
    if (cfg_float(eps, "rms_norm_eps", &d, e) < 0) goto out;
    hp->rms_eps = (float)d;

    /* RoPE: rope_parameters (transformers 5) or rope_scaling, with top-level keys as the
     * fallback, as the converter mirrors them */
    const cJSON *rp = cfg_item(&c, "rope_parameters");
    if (!cJSON_IsObject(rp)) rp = cfg_item(&c, "rope_scaling");
    if (!cJSON_IsObject(rp)) rp = NULL;
    const cJSON *j = rp ? cJSON_GetObjectItemCaseSensitive(rp, "rope_type") : NULL;
    if (!j && rp) j = cJSON_GetObjectItemCaseSensitive(rp, "type");
    if (j && (!cJSON_IsString(j) || strcmp(j->valuestring, "default"))) {
        herr_set(e, "config.json: rope_type \"%.32s\" is not supported (hearth runs plain RoPE)",
                 cJSON_IsString(j) ? j->valuestring : "?");
        goto out;
    }
    double theta = 10000.0, prf = 0.25;
    j = rp ? cJSON_GetObjectItemCaseSensitive(rp, "rope_theta") : NULL;
    if (!j) j = cfg_item(&c, "rope_theta");
    if (j && cfg_float(j, "rope_theta", &theta, e) < 0) goto out;
    j = rp ? cJSON_GetObjectItemCaseSensitive(rp, "partial_rotary_factor") : NULL;
    if (!j) j = cfg_item(&c, "partial_rotary_factor");
    if (j && cfg_float(j, "partial_rotary_factor", &prf, e) < 0) goto out;
    if (!(prf > 0 && prf <= 1)) { herr_set(e, "config.json: partial_rotary_factor %g is out of (0, 1]", prf); goto out; }
    hp->rope_theta = (float)theta;
    hp->rope_dims = (int64_t)((double)hp->head_dim * prf); /* int() in the converter: truncates */
    const int32_t def_sections[4] = {11, 11, 10, 0};
    memcpy(hp->rope_sections, def_sections, sizeof def_sections);
    j = rp ? cJSON_GetObjectItemCaseSensitive(rp, "mrope_section") : NULL;
    if (j) {
        if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) > 4) {
            herr_set(e, "config.json: mrope_section must be an array of at most 4 integers");
            goto out;
        }
        memset(hp->rope_sections, 0, sizeof hp->rope_sections);
        for (int i = 0; i < cJSON_GetArraySize(j); i++) {
            int64_t v = 0;
            if (json_int(cJSON_GetArrayItem(j, i), "mrope_section", &v, e) < 0) goto out;
            if (v < 0 || v > 1024) { herr_set(e, "config.json: mrope_section[%d] = %" PRId64 " is out of range", i, v); goto out; }
            hp->rope_sections[i] = (int32_t)v;
        }
    }
    if (model_hparams_check(hp, e) < 0) { herr_wrap(e, "config.json"); goto out; }

    /* layer_types (the converter writes them as attention.recurrent_layers) win over the interval */
    x->tied = cJSON_IsTrue(cfg_item(&c, "tie_word_embeddings"));
    const cJSON *lt = cfg_item(&c, "layer_types");
    x->has_layer_types = lt != NULL;
    if (lt) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != hp->n_layer) {
            herr_set(e, "config.json: layer_types must list num_hidden_layers = %" PRId64 " entries", hp->n_layer);
            goto out;
        }
        for (int il = 0; il < hp->n_layer; il++) {
            const cJSON *t = cJSON_GetArrayItem(lt, il);
            if (cJSON_IsString(t) && !strcmp(t->valuestring, "linear_attention")) hp->is_recurrent[il] = true;
            else if (cJSON_IsString(t) && !strcmp(t->valuestring, "full_attention")) hp->is_recurrent[il] = false;
            else {
                herr_set(e, "config.json: layer_types[%d] is neither \"linear_attention\" nor \"full_attention\"", il);
                goto out;
            }
        }
    }
    rc = 0;
out:
    return rc;
}

static int read_config(const char *hf_dir, model_hparams *hp, cfg_extra *x, herr *e) {
    char *path = path_join(hf_dir, "config.json");
    cJSON *root = NULL;
    int rc = json_load(path, &root, e);
    free(path);
    if (rc < 0) return -1;
    rc = config_from_json(root, hp, x, e);
    cJSON_Delete(root);
    return rc;
}

int convert_read_config(const char *hf_dir, model_hparams *hp, herr *e) {
    cfg_extra x;
    return read_config(hf_dir, hp, &x, e);
}

int convert_parse_config(const char *json, size_t len, model_hparams *hp, herr *e) {
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return herr_set(e, "config.json: not valid JSON");
    cfg_extra x;
    const int rc = config_from_json(root, hp, &x, e);
    cJSON_Delete(root);
    return rc;
}

/* ---- the checkpoint's tensors, from one file or shards ---- */

typedef struct hf_entry {
    char *name;                 /* without a "language_model." part (multimodal checkpoints) */
    const st_tensor *t;
    int file;
    bool used;
} hf_entry;

typedef struct hf_set {
    st_file **files;
    int n_files;
    hf_entry *ents;
    int64_t n;
} hf_set;

static char *normalize_name(const char *raw) {
    if (!strncmp(raw, "model.mtp.", 10)) return xstrdup(raw + 6); /* the MTP block as "mtp." */
    const char *lm = strstr(raw, "language_model.");
    if (!lm) return xstrdup(raw);
    size_t pre = (size_t)(lm - raw), skip = strlen("language_model.");
    char *s = xmalloc(strlen(raw) - skip + 1);
    memcpy(s, raw, pre);
    strcpy(s + pre, lm + skip);
    return s;
}

static int ent_cmp(const void *a, const void *b) {
    return strcmp(((const hf_entry *)a)->name, ((const hf_entry *)b)->name);
}

static hf_entry *hf_find(const hf_set *s, const char *name) {
    hf_entry key = {.name = (char *)name};
    return bsearch(&key, s->ents, (size_t)s->n, sizeof *s->ents, ent_cmp);
}

static void hf_close(hf_set *s) {
    for (int64_t i = 0; i < s->n; i++) free(s->ents[i].name);
    free(s->ents);
    for (int i = 0; i < s->n_files; i++) st_close(s->files[i]);
    free(s->files);
    memset(s, 0, sizeof *s);
}

static bool plain_file_name(const char *s) {
    return s[0] && strcmp(s, ".") && strcmp(s, "..") && !strchr(s, '/');
}

static int hf_open(hf_set *s, const char *dir, herr *e) {
    memset(s, 0, sizeof *s);
    char *index_path = path_join(dir, "model.safetensors.index.json");
    const char **names = NULL;
    int n_names = 0;
    cJSON *index = NULL;
    int rc = -1;
    bool named = false;
    if (file_exists(index_path)) {
        if (json_load(index_path, &index, e) < 0) goto out;
        const cJSON *wm = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
        if (!cJSON_IsObject(wm)) {
            herr_set(e, "model.safetensors.index.json: weight_map is missing or not an object");
            goto out;
        }
        for (const cJSON *j = wm->child; j; j = j->next) {
            if (!cJSON_IsString(j) || !plain_file_name(j->valuestring)) {
                herr_set(e, "model.safetensors.index.json: weight_map[\"%.200s\"] is not a file name in the folder",
                         j->string ? j->string : "?");
                goto out;
            }
            bool seen = false;
            for (int i = 0; i < n_names && !seen; i++) seen = !strcmp(names[i], j->valuestring);
            if (!seen) {
                names = xrealloc(names, sizeof *names * (size_t)(n_names + 1));
                names[n_names++] = j->valuestring;
            }
        }
        if (!n_names) { herr_set(e, "model.safetensors.index.json: weight_map is empty"); goto out; }
    } else {
        char *single = path_join(dir, "model.safetensors");
        bool ok = file_exists(single);
        free(single);
        if (!ok) {
            herr_set(e, "no model.safetensors or model.safetensors.index.json");
            goto out;
        }
        names = xmalloc(sizeof *names);
        names[0] = "model.safetensors";
        n_names = 1;
    }
    s->files = xcalloc((size_t)n_names, sizeof *s->files);
    int64_t total = 0;
    for (int i = 0; i < n_names; i++) {
        char *p = path_join(dir, names[i]);
        int r = st_open(&s->files[i], p, e);
        free(p);
        if (r < 0) { named = true; goto out; } /* st_open's message holds the path */
        s->n_files++;
        total += st_n_tensors(s->files[i]);
    }
    s->ents = xcalloc((size_t)(total ? total : 1), sizeof *s->ents);
    for (int i = 0; i < s->n_files; i++)
        for (int64_t k = 0; k < st_n_tensors(s->files[i]); k++) {
            const st_tensor *t = st_tensor_at(s->files[i], k);
            s->ents[s->n++] = (hf_entry){.name = normalize_name(t->name), .t = t, .file = i};
        }
    qsort(s->ents, (size_t)s->n, sizeof *s->ents, ent_cmp);
    for (int64_t i = 1; i < s->n; i++)
        if (!strcmp(s->ents[i].name, s->ents[i - 1].name)) {
            herr_set(e, "tensor %.200s appears twice (in %s and %s)", s->ents[i].name, names[s->ents[i - 1].file],
                     names[s->ents[i].file]);
            goto out;
        }
    if (index) { /* every tensor the index names is where it says */
        const cJSON *wm = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
        for (const cJSON *j = wm->child; j; j = j->next) {
            char *nm = normalize_name(j->string);
            hf_entry *en = hf_find(s, nm);
            free(nm);
            if (!en || strcmp(names[en->file], j->valuestring) || strcmp(en->t->name, j->string)) {
                herr_set(e, "model.safetensors.index.json lists %.200s in %.100s, which does not hold it", j->string,
                         j->valuestring);
                goto out;
            }
        }
    }
    rc = 0;
out:
    free(index_path);
    free(names);
    cJSON_Delete(index);
    if (rc < 0) {
        if (!named) herr_wrap(e, "%s", dir);
        hf_close(s);
    }
    return rc;
}

/* ---- producing the GGUF tensors ---- */

typedef struct conv_ctx {
    hf_set hf;
    const model_hparams *hp;
    convert_quant quant;
    gguf_writer *w;
    bool dry;                   /* pass 1: look-ups and shape checks only */
    float *buf, *buf2;
    size_t buf_cap, buf2_cap;
    uint8_t *qbuf;
    size_t qbuf_cap;
} conv_ctx;

static float *grow(float **p, size_t *cap, size_t n) {
    if (n > *cap) {
        *p = xrealloc(*p, n * sizeof **p);
        *cap = n;
    }
    return *p;
}

static void shape_str(char *b, size_t n, const int64_t *shape, int nd) {
    int o = snprintf(b, n, "[");
    for (int d = 0; d < nd && o > 0 && (size_t)o < n; d++) o += snprintf(b + o, n - (size_t)o, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (o > 0 && (size_t)o < n) snprintf(b + o, n - (size_t)o, "]");
}

/* shapes equal once size-1 dims are dropped (squeezing never moves data) */
static bool same_squeezed(const int64_t *a, int na, const int64_t *b, int nb) {
    int i = 0, k = 0;
    for (;;) {
        while (i < na && a[i] == 1) i++;
        while (k < nb && b[k] == 1) k++;
        if (i == na || k == nb) return i == na && k == nb;
        if (a[i++] != b[k++]) return false;
    }
}

/* The HF tensor `name` with the expected PyTorch shape; marks it used. */
static const st_tensor *need(conv_ctx *c, const char *name, int nd, const int64_t *shape, herr *e) {
    hf_entry *en = hf_find(&c->hf, name);
    char want[128], got[128];
    shape_str(want, sizeof want, shape, nd);
    if (!en) return herr_set(e, "missing tensor %s, expected shape %s", name, want), NULL;
    if (!same_squeezed(en->t->shape, en->t->n_dims, shape, nd)) {
        shape_str(got, sizeof got, en->t->shape, en->t->n_dims);
        return herr_set(e, "tensor %s has shape %s, expected %s (from config.json)", name, got, want), NULL;
    }
    if (en->t->dtype != ST_F32 && en->t->dtype != ST_F16 && en->t->dtype != ST_BF16)
        return herr_set(e, "tensor %s has dtype %s: convert reads F32, F16 and BF16", name, st_dtype_name(en->t->dtype)), NULL;
    en->used = true;
    return en->t;
}

static const st_tensor *need2(conv_ctx *c, const char *name, int64_t d0, int64_t d1, herr *e) {
    int64_t s[2] = {d0, d1};
    return need(c, name, 2, s, e);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* The converter's type choice (conversion/base.py): 1-D tensors, *_norm.weight, the
 * routers, the conv taps and names not ending in .weight stay F32; everything else takes the
 * file type, falling back to F16 when a row is not a whole number of Q8_0 blocks.
 * q4_k_m is what llama-quantize Q4_K_M makes of the f32 file (gen_tensor_type: Q4_K, with
 * Q6_K / Q5_K / Q8_0 where its rules say; it quantizes the shared expert's gate too). A row
 * that is not a whole number of 256-blocks would take Q5_0 there, which hearth does not
 * write: OUT_TYPE_NONE then (the caller names the tensor). */
#define OUT_TYPE_NONE UINT32_MAX
static uint32_t out_type(const model_hparams *hp, const tensor_spec *s, convert_quant q) {
    if (q == CONVERT_Q4_K_M) {
        const uint32_t t = gen_tensor_type(hp, s, GEN_Q4_K_M);
        return quant_can_quantize(t) ? t : OUT_TYPE_NONE;
    }
    if (q == CONVERT_F32 || s->n_dims <= 1 || ends_with(s->name, "_norm.weight") || !ends_with(s->name, ".weight"))
        return QT_F32;
    if (s->role == TR_FFN_GATE_INP || s->role == TR_FFN_GATE_INP_SHEXP || s->role == TR_SSM_CONV1D) return QT_F32;
    if (s->ne[0] % QK8_0) return QT_F16;
    return QT_Q8_0;
}

/* Writes rows [row0, row0 + n) (each ne0 floats) of GGUF tensor idx in its type. */
static int emit_rows(conv_ctx *c, int64_t idx, uint32_t type, int64_t ne0, int64_t row0, int64_t n, const float *src,
                     herr *e) {
    const size_t rb = qtype_row_bytes(type, ne0);
    HEARTH_CHECK(rb > 0);
    if (type == QT_F32)
        return gguf_writer_write(c->w, idx, (uint64_t)row0 * rb, src, (uint64_t)n * rb, e);
    if ((size_t)n * rb > c->qbuf_cap) {
        c->qbuf = xrealloc(c->qbuf, (size_t)n * rb);
        c->qbuf_cap = (size_t)n * rb;
    }
    for (int64_t r = 0; r < n; r++) {
        if (type == QT_F16) {
            f16_t *o = (f16_t *)(c->qbuf + (size_t)r * rb);
            for (int64_t i = 0; i < ne0; i++) o[i] = f32_to_f16(src[r * ne0 + i]);
        } else {
            quant_quantize_row(type, src + r * ne0, c->qbuf + (size_t)r * rb, ne0);
        }
    }
    return gguf_writer_write(c->w, idx, (uint64_t)row0 * rb, c->qbuf, (uint64_t)n * rb, e);
}

/* The whole tensor as floats into c->buf. */
static float *read_all(conv_ctx *c, const st_tensor *t, herr *e) {
    float *b = grow(&c->buf, &c->buf_cap, (size_t)(t->numel ? t->numel : 1));
    return st_read_f32(t, 0, t->numel, b, e) < 0 ? NULL : b;
}

/* A plain copy, streamed in chunks of rows: HF [rows, ne0] is GGUF {ne0, rows}. */
#define CHUNK_FLOATS ((int64_t)1 << 22)
static int copy_plain(conv_ctx *c, const tensor_spec *s, int64_t idx, uint32_t type, const st_tensor *t, herr *e) {
    const int64_t ne0 = s->ne[0], rows = t->numel / ne0;
    int64_t per = CHUNK_FLOATS / ne0;
    if (per < 1) per = 1;
    float *b = grow(&c->buf, &c->buf_cap, (size_t)((per < rows ? per : rows) * ne0));
    for (int64_t r = 0; r < rows; r += per) {
        int64_t n = rows - r < per ? rows - r : per;
        if (st_read_f32(t, r * ne0, n * ne0, b, e) < 0 || emit_rows(c, idx, type, ne0, r, n, b, e) < 0) return -1;
    }
    return 0;
}

/* The converter computes in the stored dtype for F16/F32 sources (others become F32 first):
 * an F16 source's result is rounded to F16 again. */
static float like_source(const st_tensor *t, float v) {
    return t->dtype == ST_F16 ? f16_to_f32(f32_to_f16(v)) : v;
}

/* V-head re-tiling: GGUF block n (n = j*Gk + g) takes HF block g*r + j, r = Gv/Gk. */
static int64_t tiled_src(const model_hparams *hp, int64_t n) {
    const int64_t Gk = hp->ssm_n_group, r = hp->ssm_dt_rank / hp->ssm_n_group;
    return (n % Gk) * r + n / Gk;
}

/* rows [first, first + Gv*blk) of an (rows x ne0) matrix re-tiled in blocks of blk rows */
static void retile_rows(const model_hparams *hp, const float *src, float *dst, int64_t rows, int64_t ne0, int64_t first,
                        int64_t blk) {
    memcpy(dst, src, sizeof(float) * (size_t)(rows * ne0));
    const size_t bb = sizeof(float) * (size_t)(blk * ne0);
    for (int64_t n = 0; n < hp->ssm_dt_rank; n++)
        memcpy(dst + (first + n * blk) * ne0, src + (first + tiled_src(hp, n) * blk) * ne0, bb);
}

/* a layer's tensor names' start: the trunk's model.layers.N, the MTP block's mtp.layers.0 */
static const char *layer_prefix(const conv_ctx *c, int il, char *buf, size_t n) {
    if (il >= c->hp->n_layer) snprintf(buf, n, "mtp.layers.%d", il - (int)c->hp->n_layer);
    else snprintf(buf, n, "model.layers.%d", il);
    return buf;
}

/* which of the expert layouts a layer uses */
enum exp_layout { EXP_PER_EXPERT, EXP_STACKED, EXP_FUSED };

static const char *const exp_proj[3] = {"gate_proj", "up_proj", "down_proj"};

/* The stacked expert tensor `which` (0 gate, 1 up, 2 down) of layer il, expert by expert. */
static int make_experts(conv_ctx *c, const tensor_spec *s, int64_t idx, uint32_t type, int il, int which, herr *e) {
    const model_hparams *hp = c->hp;
    const int64_t X = hp->n_expert, F = hp->n_ff_exp, E = hp->n_embd;
    const int64_t r0 = which == 2 ? E : F, r1 = which == 2 ? F : E; /* one expert's HF [r0, r1] */
    char nm[160], alt[160], pb[32];
    const char *pre = layer_prefix(c, il, pb, sizeof pb);
    /* find the layout from what exists */
    enum exp_layout lay;
    snprintf(nm, sizeof nm, "%s.mlp.experts.0.%s.weight", pre, exp_proj[which]);
    const char *fused_base = which == 2 ? "down_proj" : "gate_up_proj";
    if (hf_find(&c->hf, nm)) lay = EXP_PER_EXPERT;
    else {
        snprintf(nm, sizeof nm, "%s.mlp.experts.%s.weight", pre, exp_proj[which]);
        snprintf(alt, sizeof alt, "%s.mlp.experts.%s", pre, exp_proj[which]);
        if (hf_find(&c->hf, nm) || hf_find(&c->hf, alt)) lay = EXP_STACKED;
        else {
            snprintf(nm, sizeof nm, "%s.mlp.experts.%s.weight", pre, fused_base);
            snprintf(alt, sizeof alt, "%s.mlp.experts.%s", pre, fused_base);
            if (hf_find(&c->hf, nm) || hf_find(&c->hf, alt)) lay = which == 2 ? EXP_STACKED : EXP_FUSED;
            else {
                snprintf(nm, sizeof nm, "%s.mlp.experts.0.%s.weight", pre, exp_proj[which]);
                return herr_set(e, "missing tensor %s (nor a stacked mlp.experts.%s or mlp.experts.gate_up_proj)", nm,
                                exp_proj[which]);
            }
        }
    }
    const st_tensor *whole = NULL;
    int64_t per_off = 0, base_off = 0; /* offset of expert x: base_off + x * per_off */
    if (lay != EXP_PER_EXPERT) {
        const char *base = lay == EXP_FUSED ? "gate_up_proj" : exp_proj[which];
        snprintf(nm, sizeof nm, "%s.mlp.experts.%s.weight", pre, base);
        if (!hf_find(&c->hf, nm)) snprintf(nm, sizeof nm, "%s.mlp.experts.%s", pre, base);
        int64_t shape[3] = {X, lay == EXP_FUSED ? 2 * F : r0, r1};
        if (!(whole = need(c, nm, 3, shape, e))) return -1;
        per_off = shape[1] * r1;
        base_off = lay == EXP_FUSED && which == 1 ? F * E : 0;
    }
    float *b = c->dry ? NULL : grow(&c->buf, &c->buf_cap, (size_t)(r0 * r1));
    for (int64_t x = 0; x < X; x++) {
        const st_tensor *t = whole;
        int64_t off = base_off + x * per_off;
        if (lay == EXP_PER_EXPERT) {
            snprintf(nm, sizeof nm, "%s.mlp.experts.%" PRId64 ".%s.weight", pre, x, exp_proj[which]);
            if (!(t = need2(c, nm, r0, r1, e))) return -1;
            off = 0;
        }
        if (c->dry) continue;
        if (st_read_f32(t, off, r0 * r1, b, e) < 0 || emit_rows(c, idx, type, s->ne[0], x * r0, r0, b, e) < 0) return -1;
    }
    return 0;
}

static int make_tensor(conv_ctx *c, const tensor_spec *s, int64_t idx, uint32_t type, herr *e) {
    const model_hparams *hp = c->hp;
    const int64_t E = hp->n_embd, S = hp->ssm_d_state, Gv = hp->ssm_dt_rank, Kd = hp_key_dim(hp);
    const int64_t Vd = hp_value_dim(hp), C = hp_conv_dim(hp), W = hp->ssm_d_conv;
    char nm[160];
    const int il = s->layer;
    char pb[32];
    const char *pre = il >= 0 ? layer_prefix(c, il, pb, sizeof pb) : "";
#define LNAME(suffix) (snprintf(nm, sizeof nm, "%s.%s", pre, suffix), nm)
    const st_tensor *t = NULL;
    float *b;
    switch (s->role) {
    /* plain copies: HF [ne1, ne0] (or [ne0]) */
    case TR_TOKEN_EMBD: t = need2(c, "model.embed_tokens.weight", s->ne[1], s->ne[0], e); break;
    case TR_OUTPUT: t = need2(c, "lm_head.weight", s->ne[1], s->ne[0], e); break;
    case TR_ATTN_Q: t = need2(c, LNAME("self_attn.q_proj.weight"), s->ne[1], s->ne[0], e); break;
    case TR_ATTN_K: t = need2(c, LNAME("self_attn.k_proj.weight"), s->ne[1], s->ne[0], e); break;
    case TR_ATTN_V: t = need2(c, LNAME("self_attn.v_proj.weight"), s->ne[1], s->ne[0], e); break;
    case TR_ATTN_OUT: t = need2(c, LNAME("self_attn.o_proj.weight"), s->ne[1], s->ne[0], e); break;
    case TR_FFN_GATE_INP: t = need2(c, LNAME("mlp.gate.weight"), s->ne[1], s->ne[0], e); break;
    case TR_FFN_GATE_SHEXP: t = need2(c, LNAME("mlp.shared_expert.gate_proj.weight"), s->ne[1], s->ne[0], e); break;
    case TR_FFN_UP_SHEXP: t = need2(c, LNAME("mlp.shared_expert.up_proj.weight"), s->ne[1], s->ne[0], e); break;
    case TR_FFN_DOWN_SHEXP: t = need2(c, LNAME("mlp.shared_expert.down_proj.weight"), s->ne[1], s->ne[0], e); break;
    case TR_FFN_GATE: t = need2(c, LNAME("mlp.gate_proj.weight"), s->ne[1], s->ne[0], e); break;
    case TR_FFN_UP: t = need2(c, LNAME("mlp.up_proj.weight"), s->ne[1], s->ne[0], e); break;
    case TR_FFN_DOWN: t = need2(c, LNAME("mlp.down_proj.weight"), s->ne[1], s->ne[0], e); break;
    case TR_FFN_GATE_INP_SHEXP: t = need2(c, LNAME("mlp.shared_expert_gate.weight"), 1, E, e); break;
    case TR_SSM_NORM: t = need(c, LNAME("linear_attn.norm.weight"), 1, &S, e); break; /* no +1 */
    case TR_NEXTN_EH_PROJ: t = need2(c, "mtp.fc.weight", E, 2 * E, e); break;
    case TR_FFN_GATE_EXPS: return make_experts(c, s, idx, type, il, 0, e);
    case TR_FFN_UP_EXPS: return make_experts(c, s, idx, type, il, 1, e);
    case TR_FFN_DOWN_EXPS: return make_experts(c, s, idx, type, il, 2, e);

    /* zero-centred norms: + 1 */
    case TR_OUTPUT_NORM: case TR_ATTN_NORM: case TR_POST_NORM: case TR_ATTN_Q_NORM: case TR_ATTN_K_NORM:
    case TR_NEXTN_ENORM: case TR_NEXTN_HNORM: case TR_NEXTN_HEAD_NORM: {
        const char *n = s->role == TR_OUTPUT_NORM ? "model.norm.weight"
                        : s->role == TR_NEXTN_ENORM ? "mtp.pre_fc_norm_embedding.weight"
                        : s->role == TR_NEXTN_HNORM ? "mtp.pre_fc_norm_hidden.weight"
                        : s->role == TR_NEXTN_HEAD_NORM ? "mtp.norm.weight"
                        : s->role == TR_ATTN_NORM ? LNAME("input_layernorm.weight")
                        : s->role == TR_POST_NORM ? LNAME("post_attention_layernorm.weight")
                        : s->role == TR_ATTN_Q_NORM ? LNAME("self_attn.q_norm.weight")
                                                    : LNAME("self_attn.k_norm.weight");
        if (!(t = need(c, n, 1, &s->ne[0], e)) || c->dry) return t ? 0 : -1;
        if (!(b = read_all(c, t, e))) return -1;
        for (int64_t i = 0; i < t->numel; i++) b[i] = like_source(t, b[i] + 1.0f);
        return emit_rows(c, idx, type, s->ne[0], 0, 1, b, e);
    }

    /* GDN: V heads re-tiled */
    case TR_SSM_A: case TR_SSM_DT: {
        t = need(c, LNAME(s->role == TR_SSM_A ? "linear_attn.A_log" : "linear_attn.dt_bias"), 1, &Gv, e);
        if (!t || c->dry) return t ? 0 : -1;
        if (!(b = read_all(c, t, e))) return -1;
        float *o = grow(&c->buf2, &c->buf2_cap, (size_t)Gv);
        for (int64_t n = 0; n < Gv; n++) {
            float v = b[tiled_src(hp, n)];
            o[n] = s->role == TR_SSM_A ? like_source(t, -expf(v)) : v;
        }
        return emit_rows(c, idx, type, Gv, 0, 1, o, e);
    }
    case TR_ATTN_QKV: case TR_ATTN_GATE: case TR_SSM_BETA: case TR_SSM_ALPHA: {
        const char *n = s->role == TR_ATTN_QKV ? "linear_attn.in_proj_qkv.weight"
                        : s->role == TR_ATTN_GATE ? "linear_attn.in_proj_z.weight"
                        : s->role == TR_SSM_BETA ? "linear_attn.in_proj_b.weight"
                                                 : "linear_attn.in_proj_a.weight";
        const int64_t rows = s->ne[1], first = s->role == TR_ATTN_QKV ? 2 * Kd : 0;
        const int64_t blk = s->role == TR_ATTN_QKV || s->role == TR_ATTN_GATE ? S : 1;
        if (!(t = need2(c, LNAME(n), rows, E, e)) || c->dry) return t ? 0 : -1;
        if (!(b = read_all(c, t, e))) return -1;
        float *o = grow(&c->buf2, &c->buf2_cap, (size_t)(rows * E));
        retile_rows(hp, b, o, rows, E, first, blk);
        return emit_rows(c, idx, type, E, 0, rows, o, e);
    }
    case TR_SSM_CONV1D: {
        int64_t shape[3] = {C, 1, W};
        if (!(t = need(c, LNAME("linear_attn.conv1d.weight"), 3, shape, e)) || c->dry) return t ? 0 : -1;
        if (!(b = read_all(c, t, e))) return -1;
        float *o = grow(&c->buf2, &c->buf2_cap, (size_t)(C * W));
        retile_rows(hp, b, o, C, W, 2 * Kd, S); /* channel c's taps are row c of {W, C} */
        return emit_rows(c, idx, type, W, 0, C, o, e);
    }
    case TR_SSM_OUT: {
        if (!(t = need2(c, LNAME("linear_attn.out_proj.weight"), E, Vd, e)) || c->dry) return t ? 0 : -1;
        if (!(b = read_all(c, t, e))) return -1;
        float *o = grow(&c->buf2, &c->buf2_cap, (size_t)(E * Vd));
        for (int64_t r = 0; r < E; r++)
            for (int64_t n = 0; n < Gv; n++)
                memcpy(o + r * Vd + n * S, b + r * Vd + tiled_src(hp, n) * S, sizeof(float) * (size_t)S);
        return emit_rows(c, idx, type, Vd, 0, E, o, e);
    }
    default:
        HEARTH_DIE("convert: no rule for tensor %s", s->name);
    }
#undef LNAME
    if (!t) return -1;
    if (c->dry) return 0;
    return copy_plain(c, s, idx, type, t, e);
}

static int load_vocab(const convert_opts *o, vocab_def *v, bool *builtin, herr *e) {
    char *p = path_join(o->hf_dir, "tokenizer.json");
    int rc = 0;
    *builtin = !file_exists(p);
    if (!*builtin) {
        rc = vocab_def_from_hf(v, p, e);
    } else {
        if (o->log) fprintf(o->log, "convert: no tokenizer.json in %s: using hearth's built-in vocabulary\n", o->hf_dir);
        vocab_def_builtin(v);
    }
    free(p);
    return rc;
}

int convert_hf(const convert_opts *o, convert_stats *st, herr *e) {
    const double t0 = time_now();
    if (!o->out_path || !o->out_path[0]) return herr_set(e, "no output file");
    model_hparams hp;
    cfg_extra x;
    if (read_config(o->hf_dir, &hp, &x, e) < 0) return herr_wrap(e, "%s", o->hf_dir);
    conv_ctx c = {.hp = &hp, .quant = o->quant, .dry = true};
    if (hf_open(&c.hf, o->hf_dir, e) < 0) return -1;
    if (hp.n_layer_nextn == 1 && (o->no_mtp || !hf_find(&c.hf, "mtp.fc.weight"))) {
        if (o->log && !o->no_mtp)
            fprintf(o->log, "convert: config.json has mtp_num_hidden_layers 1 but the checkpoint has no mtp.fc.weight: "
                            "written without the MTP block\n");
        hp.n_layer_nextn = 0;
    }

    vocab_def v;
    memset(&v, 0, sizeof v);
    tensor_spec *specs = NULL;
    int64_t *index = NULL;
    uint32_t *types = NULL;
    bool opened = false;
    int rc = -1;
    const bool tied = x.tied;
    const int64_t n_specs = model_tensor_specs(&hp, &specs);
    index = xmalloc(sizeof *index * (size_t)n_specs);
    types = xmalloc(sizeof *types * (size_t)n_specs);
    c.w = gguf_writer_new();

    /* pass 1: every HF tensor present with its shape, before any file is made */
    int64_t n_out = 0;
    for (int64_t i = 0; i < n_specs; i++) {
        index[i] = -1;
        if (specs[i].role == TR_OUTPUT && tied && !hf_find(&c.hf, "lm_head.weight")) continue; /* tied: token_embd serves */
        if (make_tensor(&c, &specs[i], -1, 0, e) < 0) goto out;
        types[i] = out_type(&hp, &specs[i], o->quant);
        if (types[i] == OUT_TYPE_NONE) {
            herr_set(e, "%s: rows of %" PRId64 " are not a whole number of 256-element blocks: q4_k_m would need "
                        "Q5_0 there, which hearth does not write (use --quant q8_0)", specs[i].name, specs[i].ne[0]);
            goto out;
        }
        index[i] = gguf_add_tensor(c.w, specs[i].name, types[i], specs[i].n_dims, specs[i].ne);
        n_out++;
    }
    int64_t n_unused = 0;
    for (int64_t i = 0; i < c.hf.n; i++)
        if (!c.hf.ents[i].used) {
            if (o->log && n_unused < 5) fprintf(o->log, "convert: not converted: %s\n", c.hf.ents[i].name);
            n_unused++;
        }
    if (o->log && n_unused > 5) fprintf(o->log, "convert: ... %" PRId64 " tensors not converted in all\n", n_unused);

    bool builtin;
    if (load_vocab(o, &v, &builtin, e) < 0) goto out;
    if (v.n_tokens > hp.n_vocab) {
        herr_set(e, "the %s has %" PRId64 " tokens, more than the model's %" PRId64 " embedding rows",
                 builtin ? "built-in vocabulary (no tokenizer.json in the folder)" : "tokenizer", v.n_tokens, hp.n_vocab);
        goto out;
    }
    const int64_t n_real = v.n_real;
    vocab_def_pad(&v, hp.n_vocab);

    model_hparams_write(&hp, c.w);
    if (x.has_layer_types) {
        bool rec[MODEL_MAX_LAYERS];
        const int n_all = (int)(hp.n_layer + hp.n_layer_nextn); /* the MTP block's layer: attention */
        for (int il = 0; il < n_all; il++) rec[il] = il < hp.n_layer && hp.is_recurrent[il];
        char k[128];
        snprintf(k, sizeof k, "%s.attention.recurrent_layers", hp.arch);
        gguf_set_arr_data(c.w, k, GGUF_TYPE_BOOL, rec, (uint64_t)n_all);
    }
    {
        char name[256];
        const char *base = o->hf_dir;
        size_t L = strlen(base);
        while (L > 1 && base[L - 1] == '/') L--;
        size_t s0 = L;
        while (s0 > 0 && base[s0 - 1] != '/') s0--;
        snprintf(name, sizeof name, "%.*s", (int)(L - s0), base + s0);
        gguf_set_str(c.w, "general.name", name);
    }
    /* LLAMA_FTYPE_ALL_F32 / MOSTLY_Q8_0 / MOSTLY_Q4_K_M */
    gguf_set_u32(c.w, "general.file_type", o->quant == CONVERT_Q8_0 ? 7 : o->quant == CONVERT_Q4_K_M ? 15 : 0);
    gguf_set_u32(c.w, "general.quantization_version", 2);
    gguf_set_str(c.w, "hearth.convert.source", "Hugging Face safetensors");
    vocab_def_write(&v, c.w);

    /* pass 2: the data */
    if (gguf_writer_open(c.w, o->out_path, e) < 0) goto out;
    opened = true;
    c.dry = false;
    for (int64_t i = 0; i < n_specs; i++) {
        if (index[i] < 0) continue;
        if (make_tensor(&c, &specs[i], index[i], types[i], e) < 0) goto out;
    }
    if (gguf_writer_close(c.w, e) < 0) goto out;
    if (st) {
        struct stat sb;
        st->n_tensors = n_out;
        st->n_vocab = hp.n_vocab;
        st->n_unused = n_unused;
        st->file_bytes = stat(o->out_path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
        st->seconds = time_now() - t0;
    }
    if (o->log && n_real != hp.n_vocab)
        fprintf(o->log, "convert: tokenizer: %" PRId64 " tokens, padded with [PAD] to %" PRId64 "\n", n_real, hp.n_vocab);
    rc = 0;
out:
    gguf_writer_free(c.w);
    if (rc < 0 && opened) unlink(o->out_path);
    hf_close(&c.hf);
    free(c.buf);
    free(c.buf2);
    free(c.qbuf);
    free(specs);
    free(index);
    free(types);
    vocab_def_free(&v);
    return rc;
}
