/* fuzz_cache.c: libFuzzer target for the prompt cache's files (src/serve/cache.c's entry
 * reader, through pcache_load as /slots restore and a restart's directory scan use it),
 * with a CPU engine on a micro qwen35moe model (made at start: 1 GDN + 1 attention layer,
 * state 16, so a file of a few points is a few KB). The first byte: bit 0 fixes the
 * checksum after the input's other bytes, bit 1 also fixes the row and point hashes to the
 * file's ids (so the fuzzer reaches what lies past them), bit 2 resumes a sequence from an
 * accepted file and runs a decode step on it. The rest is the file. Properties: a file is
 * refused with a reason or loaded; a loaded one restores and runs.
 * HEARTH_FUZZ_CACHE_SEEDS=DIR writes seed files (real entries of this model) into DIR and
 * exits: tests/fuzz/corpus/cache was made so. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "make/gen.h"
#include "model/model.h"
#include "engine/engine.h"
#include "serve/cache.h"

#define HEAD 72 /* cache.c's file_head: 8 magic, 8 fields of 8, 8 checksum */

static model *m;
static engine *eng;
static char path[256];

static uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static void wr64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static void make_seeds(const char *dir) {
    herr e;
    pcache *c;
    if (pcache_open(&c, eng, NULL, &e) < 0) { fprintf(stderr, "%s\n", e.msg); exit(1); }
    const int64_t lens[] = {4, 9, 24};
    for (int s = 0; s < 3; s++) {
        const int64_t n = lens[s];
        int32_t ids[32];
        for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)((i * 37 + s * 11) % 1000);
        const int64_t marks[] = {n / 2 > 0 ? n / 2 : 1, n};
        const int nm = marks[0] == n ? 1 : 2;
        engine_point *pts[2] = {NULL, NULL};
        for (int k = 0; k < nm; k++) engine_point_new(eng, &pts[k], &e);
        engine_seq_clear(eng, 0);
        engine_span sp = {.seq = 0, .ids = ids, .n = n, .marks = marks, .n_marks = nm, .points = pts};
        char out[512];
        int64_t rows;
        snprintf(out, sizeof out, "%s/seed-%lld-rows.hcache", dir, (long long)n);
        if (engine_run(eng, &sp, 1, &e) < 0 || pcache_save(c, 0, ids, n, pts, nm, out, &rows, &e) < 0) {
            fprintf(stderr, "fuzz_cache: seeds: %s\n", e.msg);
            exit(1);
        }
        for (int k = 0; k < nm; k++) engine_point_free(eng, pts[k]);
        /* the fuzzer's own format: a mode byte (fix nothing, resume) before the file */
        FILE *f = fopen(out, "rb");
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        uint8_t *b = malloc((size_t)len + 1);
        b[0] = 4;
        if (fread(b + 1, 1, (size_t)len, f) != (size_t)len) exit(1);
        fclose(f);
        f = fopen(out, "wb");
        fwrite(b, 1, (size_t)len + 1, f);
        fclose(f);
        free(b);
        printf("%s: %ld bytes\n", out, len + 1);
    }
    pcache_free(c);
    exit(0);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    herr e;
    model_hparams hp;
    gen_preset("tiny", &hp, &e);
    hp.n_embd = 64; hp.n_layer = 2; hp.full_attn_interval = 2; hp.n_head = 2; hp.n_head_kv = 1; hp.head_dim = 32;
    hp.rope_dims = 16; hp.n_expert = 4; hp.n_expert_used = 2; hp.n_ff_exp = 64; hp.n_ff_shexp = 64;
    hp.ssm_d_state = 16; hp.ssm_n_group = 1; hp.ssm_dt_rank = 2; hp.ssm_d_inner = 32;
    if (model_hparams_check(&hp, &e) < 0) { fprintf(stderr, "fuzz_cache: %s\n", e.msg); exit(1); }
    char model_path[256];
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(model_path, sizeof model_path, "%s/hearth-fuzz-cache-%d.gguf", tmp, (int)getpid());
    snprintf(path, sizeof path, "%s/hearth-fuzz-cache-%d.hcache", tmp, (int)getpid());
    gen_opts go = {.preset = "tiny", .quant = GEN_F32, .seed = 1, .n_threads = 1, .out_path = model_path, .hparams = &hp};
    engine_opts eo = {.device = ENGINE_CPU, .n_threads = 1, .n_ctx = 64, .n_seq_max = 1, .cache_budget = 16 << 20,
                      .kv_f16 = true};
    if (gen_write(&go, NULL, &e) < 0 || model_load(&m, model_path, &e) < 0 || engine_open(&eng, m, &eo, &e) < 0) {
        fprintf(stderr, "fuzz_cache: %s\n", e.msg);
        exit(1);
    }
    unlink(model_path); /* the mapping stays */
    const char *seeds = getenv("HEARTH_FUZZ_CACHE_SEEDS");
    if (seeds && seeds[0]) make_seeds(seeds);
    return 0;
}

/* makes the file's hashes and checksum right for its ids (when its header's shapes leave
 * the offsets inside the file) */
static void fix(uint8_t *b, size_t n, bool hashes) {
    if (n < HEAD) return;
    const uint64_t rows = rd64(b + 16), n_pts = rd64(b + 24), kv_bytes = rd64(b + 32);
    const uint64_t state = 4 * rd64(b + 40) * (rd64(b + 48) + rd64(b + 56));
    if (hashes && rows >= 1 && rows <= 64 && n_pts >= 1 && n_pts <= 64 && kv_bytes < n && state < n) {
        const int32_t *ids = (const int32_t *)(b + HEAD);
        uint64_t at = HEAD + 4 * rows;
        if (at + 8 + 8 * rows + kv_bytes <= n) {
            wr64(b + at, engine_ids_hash(eng, ids, 0));
            wr64(b + at + 8 + 8 * (rows - 1), engine_ids_hash(eng, ids, (int64_t)rows));
            at += 8 + 8 * rows + kv_bytes;
            for (uint64_t k = 0; k < n_pts && at + 16 <= n; k++, at += 16 + state) {
                const int64_t pos = (int64_t)rd64(b + at);
                if (pos >= 1 && (uint64_t)pos <= rows) wr64(b + at + 8, engine_ids_hash(eng, ids, pos));
            }
        }
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = HEAD; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    wr64(b + 64, h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const unsigned mode = data[0];
    uint8_t *b = malloc(size);
    memcpy(b, data + 1, size - 1);
    if (mode & 3) fix(b, size - 1, mode & 2);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, size - 1, f) != size - 1 || fclose(f) != 0) { perror(path); exit(1); }
    herr e;
    pcache *c;
    if (pcache_open(&c, eng, NULL, &e) < 0) { fprintf(stderr, "%s\n", e.msg); exit(1); }
    int64_t rows;
    if (pcache_load(c, path, &rows, &e) < 0) {
        FUZZ_CHECK(e.msg[0], "refused without a reason");
    } else {
        const int32_t *ids = (const int32_t *)(b + HEAD);
        FUZZ_CHECK(rows >= 1 && (size_t)(HEAD + 4 * rows) <= size - 1, "%lld rows", (long long)rows);
        int ei, pi;
        const int64_t best = pcache_best(c, ids, rows + 1, NULL, NULL, &ei, &pi);
        FUZZ_CHECK(best >= 1 && best <= rows, "a loaded entry offers row %lld of %lld", (long long)best, (long long)rows);
        if (mode & 4) {
            const int32_t *held;
            int64_t pos;
            FUZZ_CHECK(pcache_restore(c, ei, pi, 0, &held, &pos, &e) == 0, "an accepted entry fails to restore: %s", e.msg);
            FUZZ_CHECK(pos == best && engine_seq_pos(eng, 0) == pos, "resumed at %lld", (long long)pos);
            const int32_t next = 1;
            engine_span sp = {.seq = 0, .ids = &next, .n = 1};
            if (pos < engine_get_info(eng).n_ctx) FUZZ_CHECK(engine_run(eng, &sp, 1, &e) == 0, "decode after resume: %s", e.msg);
        }
    }
    engine_seq_clear(eng, 0);
    pcache_free(c);
    free(b);
    return 0;
}
