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
 * Exit 0 on success; 1 with a message on stderr otherwise. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet_log(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    if (level >= GGML_LOG_LEVEL_WARN && level != GGML_LOG_LEVEL_CONT) fputs(text, stderr);
}

static int usage(void) {
    fprintf(stderr, "usage: logits_dump [-t N] [--kv f32|f16] [--fa on|off|auto] [--last] [--repack on|off] MODEL IDS OUT\n");
    return 1;
}

int main(int argc, char **argv) {
    int n_threads = 2, last_only = 0, repack = 1;
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
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "llama_init_from_model failed\n"); return 1; }

    struct llama_batch b = llama_batch_init(n, 0, 1);
    b.n_tokens = n;
    for (int32_t i = 0; i < n; i++) {
        b.token[i] = ids[i];
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = (int8_t)(!last_only || i == n - 1);
    }
    int rc = llama_decode(ctx, b);
    if (rc != 0) { fprintf(stderr, "llama_decode returned %d\n", rc); return 1; }

    FILE *o = fopen(pos_args[2], "wb");
    if (!o) { perror(pos_args[2]); return 1; }
    uint32_t n_pos = last_only ? 1u : (uint32_t)n, uv = (uint32_t)V;
    fwrite("HLD1", 1, 4, o);
    fwrite(&uv, 4, 1, o);
    fwrite(&n_pos, 4, 1, o);
    for (int32_t i = last_only ? n - 1 : 0; i < n; i++) fwrite(&i, 4, 1, o);
    for (int32_t i = last_only ? n - 1 : 0; i < n; i++) {
        const float *row = llama_get_logits_ith(ctx, i);
        if (!row) { fprintf(stderr, "no logits for position %d\n", i); return 1; }
        fwrite(row, sizeof(float), (size_t)V, o);
    }
    if (fclose(o) != 0) { perror(pos_args[2]); return 1; }

    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(ids);
    return 0;
}
