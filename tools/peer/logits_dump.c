/* logits_dump.c: llama.cpp's logits for a given id sequence, for hearth's peer-parity test
 * (tests/unit/test_peer.c). Built against the peer build (llama.h, libllama) by
 * build_logits_dump.sh into the peer cache folder; never part of hearth's build.
 *
 *   logits_dump [options] MODEL IDS OUT
 *     IDS   raw little-endian int32 token ids (the whole file)
 *     OUT   the logits file (format below)
 *   options:
 *     -t N            threads (default 2)
 *     --kv f32|f16    KV cache type (default f32: no rounding of K and V rows)
 *     --fa on|off|auto  flash attention (default off: plain f32 mul_mat + soft_max)
 *     --last          output only the last position (default: every position)
 *     --stepped       one llama_decode per token instead of one for all (the decode path:
 *                     for finding which side a difference comes from)
 *     --routes FILE   also write the experts every layer chose at every position, and the
 *                     router's margin there (format below), read from the graph's
 *                     "ffn_moe_topk-L" and "ffn_moe_probs-L" nodes by an eval callback
 *     --repack on|off weight repacking into the CPU's extra buffer types (default on, as
 *                     llama.cpp's tools run)
 *
 * All ids are evaluated as one llama_decode call with one sequence, n_batch = n_ubatch = n
 * (one ubatch, so one graph: the chunked/fused GDN prompt path, as a prompt is run), CPU
 * only (no devices offloaded: n_gpu_layers 0).
 *
 * OUT, little-endian:
 *   char magic[4] = "HLD1"; u32 n_vocab; u32 n_pos;
 *   i32 pos[n_pos]            the positions (0-based) whose rows follow
 *   f32 logits[n_pos][n_vocab]
 *
 * --routes FILE, little-endian:
 *   char magic[4] = "HLR1"; u32 n_layer; u32 K; u32 n_pos;
 *   i32 experts[n_pos][n_layer][K]   in the order llama.cpp chose them (-1: not seen)
 *   f32 margin[n_pos][n_layer]       p_K - p_(K+1) of the router's softmax (sorted
 *                                    probabilities; how near the K-th choice was a tie)
 * Exit 0 on success; 1 with a message on stderr otherwise. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet_log(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    if (level >= GGML_LOG_LEVEL_WARN && level != GGML_LOG_LEVEL_CONT) fputs(text, stderr);
}

/* --routes: what the eval callback collects */
#define MAX_LAYERS 256
static int32_t *r_experts;  /* [n][MAX_LAYERS][K] */
static float *r_margin;     /* [n][MAX_LAYERS] */
static int r_K, r_n, r_layers, r_start; /* r_start: position of the current decode's first row */

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x > y ? -1 : x < y;
}

/* "PREFIX-L" exactly (not "PREFIX-L (reshaped)" and the like): L, else -1 */
static int node_layer(const char *name, const char *prefix) {
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n)) return -1;
    char *end;
    long il = strtol(name + n, &end, 10);
    return end != name + n && *end == 0 && il >= 0 && il < MAX_LAYERS ? (int)il : -1;
}

static bool route_cb(struct ggml_tensor *t, bool ask, void *ud) {
    (void)ud;
    int il_topk = node_layer(t->name, "ffn_moe_topk-"), il_probs = node_layer(t->name, "ffn_moe_probs-");
    if (ask) return il_topk >= 0 || il_probs >= 0;
    if (il_topk < 0 && il_probs < 0) return true;
    const int il = il_topk >= 0 ? il_topk : il_probs;
    if (il + 1 > r_layers) r_layers = il + 1;
    if (il_topk >= 0 && t->type == GGML_TYPE_I32 && t->ne[0] == r_K) { /* i32 [K, n_tokens], maybe strided */
        for (int64_t j = 0; j < t->ne[1] && r_start + j < r_n; j++)
            for (int64_t k = 0; k < r_K; k++)
                r_experts[((r_start + j) * MAX_LAYERS + il) * r_K + k] =
                    *(const int32_t *)((const char *)t->data + j * t->nb[1] + k * t->nb[0]);
    } else if (il_probs >= 0 && t->type == GGML_TYPE_F32) { /* f32 [X, n_tokens] */
        const int64_t X = t->ne[0];
        float *p = malloc(sizeof(float) * (size_t)X);
        for (int64_t j = 0; p && j < t->ne[1] && r_start + j < r_n; j++) {
            for (int64_t x = 0; x < X; x++) p[x] = *(const float *)((const char *)t->data + j * t->nb[1] + x * t->nb[0]);
            qsort(p, (size_t)X, sizeof(float), cmp_desc);
            r_margin[(r_start + j) * MAX_LAYERS + il] = r_K < X ? p[r_K - 1] - p[r_K] : 1.0f;
        }
        free(p);
    }
    return true;
}

static int usage(void) {
    fprintf(stderr, "usage: logits_dump [-t N] [--kv f32|f16] [--fa on|off|auto] [--last] [--stepped] [--routes FILE] [--repack on|off] MODEL IDS OUT\n");
    return 1;
}

int main(int argc, char **argv) {
    int n_threads = 2, last_only = 0, repack = 1, stepped = 0;
    const char *routes_path = NULL;
    enum ggml_type kv = GGML_TYPE_F32;
    enum llama_flash_attn_type fa = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    const char *pos_args[3];
    int n_pos_args = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-t") && i + 1 < argc) n_threads = atoi(argv[++i]);
        else if (!strcmp(a, "--kv") && i + 1 < argc) {
            const char *v = argv[++i];
            if (!strcmp(v, "f32")) kv = GGML_TYPE_F32;
            else if (!strcmp(v, "f16")) kv = GGML_TYPE_F16;
            else return usage();
        } else if (!strcmp(a, "--fa") && i + 1 < argc) {
            const char *v = argv[++i];
            if (!strcmp(v, "on")) fa = LLAMA_FLASH_ATTN_TYPE_ENABLED;
            else if (!strcmp(v, "off")) fa = LLAMA_FLASH_ATTN_TYPE_DISABLED;
            else if (!strcmp(v, "auto")) fa = LLAMA_FLASH_ATTN_TYPE_AUTO;
            else return usage();
        } else if (!strcmp(a, "--repack") && i + 1 < argc) {
            repack = !strcmp(argv[++i], "on");
        } else if (!strcmp(a, "--last")) last_only = 1;
        else if (!strcmp(a, "--stepped")) stepped = 1;
        else if (!strcmp(a, "--routes") && i + 1 < argc) routes_path = argv[++i];
        else if (a[0] == '-' && a[1]) return usage();
        else if (n_pos_args < 3) pos_args[n_pos_args++] = a;
        else return usage();
    }
    if (n_pos_args != 3 || n_threads < 1) return usage();

    /* ids */
    FILE *f = fopen(pos_args[1], "rb");
    if (!f) { perror(pos_args[1]); return 1; }
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (bytes <= 0 || bytes % 4) { fprintf(stderr, "%s: not a non-empty int32 file\n", pos_args[1]); fclose(f); return 1; }
    int32_t n = (int32_t)(bytes / 4);
    llama_token *ids = malloc(sizeof(llama_token) * (size_t)n);
    if (!ids || fread(ids, 4, (size_t)n, f) != (size_t)n) { fprintf(stderr, "%s: read failed\n", pos_args[1]); return 1; }
    fclose(f);

    llama_log_set(quiet_log, NULL);
    llama_backend_init();

    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.use_extra_bufts = repack != 0;
    struct llama_model *model = llama_model_load_from_file(pos_args[0], mp);
    if (!model) { fprintf(stderr, "%s: llama.cpp could not load the model\n", pos_args[0]); return 1; }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int32_t V = llama_vocab_n_tokens(vocab);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) { fprintf(stderr, "id %d at %d out of range (vocab %d)\n", ids[i], i, V); return 1; }

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n + 1;
    cp.n_batch = (uint32_t)n;
    cp.n_ubatch = (uint32_t)n;
    cp.n_seq_max = 1;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.type_k = kv;
    cp.type_v = kv;
    cp.flash_attn_type = fa;
    cp.no_perf = true;
    if (routes_path) {
        char arch[64], key[128], val[32];
        if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch) < 0) arch[0] = 0;
        snprintf(key, sizeof key, "%s.expert_used_count", arch);
        r_K = llama_model_meta_val_str(model, key, val, sizeof val) < 0 ? 0 : atoi(val);
        if (r_K < 1 || r_K > 64) { fprintf(stderr, "--routes: no %s in the model\n", key); return 1; }
        r_n = n;
        r_experts = malloc(sizeof(int32_t) * (size_t)n * MAX_LAYERS * (size_t)r_K);
        r_margin = calloc((size_t)n * MAX_LAYERS, sizeof(float));
        if (!r_experts || !r_margin) { fprintf(stderr, "out of memory\n"); return 1; }
        memset(r_experts, 0xff, sizeof(int32_t) * (size_t)n * MAX_LAYERS * (size_t)r_K);
        cp.cb_eval = route_cb;
        cp.cb_eval_user_data = NULL;
    }
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "llama_init_from_model failed\n"); return 1; }

    const uint32_t n_pos = last_only ? 1u : (uint32_t)n;
    const int32_t first = last_only ? n - 1 : 0;
    float *out = malloc(sizeof(float) * (size_t)n_pos * (size_t)V);
    struct llama_batch b = llama_batch_init(n, 0, 1);
    if (!out) { fprintf(stderr, "out of memory\n"); return 1; }
    /* one decode of every id (the prompt path), or one decode per id (the decode path) */
    for (int32_t start = 0; start < n; start += stepped ? 1 : n) {
        const int32_t len = stepped ? 1 : n;
        b.n_tokens = len;
        for (int32_t i = 0; i < len; i++) {
            b.token[i] = ids[start + i];
            b.pos[i] = start + i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = (int8_t)(start + i >= first);
        }
        r_start = start;
        int rc = llama_decode(ctx, b);
        if (rc != 0) { fprintf(stderr, "llama_decode returned %d at position %d\n", rc, start); return 1; }
        for (int32_t i = 0; i < len; i++) {
            if (start + i < first) continue;
            const float *row = llama_get_logits_ith(ctx, i);
            if (!row) { fprintf(stderr, "no logits for position %d\n", start + i); return 1; }
            memcpy(out + (size_t)(start + i - first) * (size_t)V, row, sizeof(float) * (size_t)V);
        }
    }

    FILE *o = fopen(pos_args[2], "wb");
    if (!o) { perror(pos_args[2]); return 1; }
    uint32_t uv = (uint32_t)V;
    fwrite("HLD1", 1, 4, o);
    fwrite(&uv, 4, 1, o);
    fwrite(&n_pos, 4, 1, o);
    for (int32_t i = first; i < n; i++) fwrite(&i, 4, 1, o);
    fwrite(out, sizeof(float), (size_t)n_pos * (size_t)V, o);
    if (fclose(o) != 0) { perror(pos_args[2]); return 1; }
    free(out);
    if (routes_path) {
        FILE *r = fopen(routes_path, "wb");
        if (!r) { perror(routes_path); return 1; }
        uint32_t h[3] = {(uint32_t)r_layers, (uint32_t)r_K, (uint32_t)n};
        fwrite("HLR1", 1, 4, r);
        fwrite(h, 4, 3, r);
        for (int32_t t = 0; t < n; t++)
            for (int il = 0; il < r_layers; il++)
                fwrite(r_experts + ((size_t)t * MAX_LAYERS + (size_t)il) * (size_t)r_K, sizeof(int32_t), (size_t)r_K, r);
        for (int32_t t = 0; t < n; t++) fwrite(r_margin + (size_t)t * MAX_LAYERS, sizeof(float), (size_t)r_layers, r);
        if (fclose(r) != 0) { perror(routes_path); return 1; }
    }

    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(ids);
    return 0;
}
