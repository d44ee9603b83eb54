/* test_cache.c: src/serve/cache.c's bounds, on a micro model (1 GDN + 1 attention layer): the
 * entries a small budget pushes out of RAM with no file keep only their ids (to say why a
 * request missed), and those stay under PCACHE_GONE_MAX however many conversations pass
 * (the soak's RSS crept by them: 4096 such entries, each a prompt's ids, outside --cache-ram);
 * the latest evicted one still answers pcache_evicted_best. */
#include "harness.h"
#include "make/gen.h"
#include "engine/engine.h"
#include "serve/cache.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static engine *micro_engine(model **m, int64_t n_ctx, int64_t budget) {
    herr e;
    model_hparams hp;
    gen_preset("tiny", &hp, &e);
    hp.n_embd = 64; hp.n_layer = 2; hp.full_attn_interval = 2; hp.n_head = 2; hp.n_head_kv = 1; hp.head_dim = 32;
    hp.rope_dims = 16; hp.n_expert = 4; hp.n_expert_used = 2; hp.n_ff_exp = 64; hp.n_ff_shexp = 64;
    hp.ssm_d_state = 16; hp.ssm_n_group = 1; hp.ssm_dt_rank = 2; hp.ssm_d_inner = 32;
    char path[512];
    snprintf(path, sizeof path, "%s/test-cache-micro-%d.gguf", getenv("HEARTH_TMP") ? getenv("HEARTH_TMP") : "/tmp",
             (int)getpid());
    gen_opts go = {.preset = "tiny", .quant = GEN_F32, .seed = 1, .n_threads = 1, .out_path = path, .hparams = &hp};
    engine_opts eo = {.device = ENGINE_CPU, .n_threads = 1, .n_ctx = n_ctx, .n_seq_max = 1, .cache_budget = budget};
    engine *eng = NULL;
    if (gen_write(&go, NULL, &e) < 0 || model_load(m, path, &e) < 0 || engine_open(&eng, *m, &eo, &e) < 0) {
        fprintf(stderr, "    %s\n", e.msg);
        eng = NULL;
    }
    unlink(path);
    return eng;
}

TEST(evicted_ids_bounded) {
    model *m = NULL;
    const int64_t N = 1000; /* ids a conversation: 4 KB kept per evicted entry */
    engine *eng = micro_engine(&m, N + 8, 4 << 20);
    if (!eng) { CHECK(0); return; }
    herr e;
    pcache *c;
    CHECK(pcache_open(&c, eng, NULL, &e) == 0);
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)(N + 1));
    int64_t most = 0;
    for (int conv = 0; conv < 320; conv++) { /* 320 x 4 KB of ids: past the bound */
        for (int64_t i = 0; i < N; i++) ids[i] = (int32_t)((i * 7 + conv * 13 + 1) % 1000);
        ids[0] = conv; /* each conversation its own from the first id */
        engine_point *pt = NULL;
        if (engine_point_new(eng, &pt, &e) < 0) {
            CHECK(pcache_evict_older(c, 1e300));
            CHECK_MSG(engine_point_new(eng, &pt, &e) == 0, "%s", e.msg);
        }
        const int64_t mark = N;
        engine_seq_clear(eng, 0);
        engine_span sp = {.seq = 0, .ids = ids, .n = N, .marks = &mark, .n_marks = 1, .points = &pt};
        CHECK_MSG(engine_run(eng, &sp, 1, &e) == 0, "%s", e.msg);
        pcache_put(c, 0, ids, N, &pt, 1);
        const pcache_stats st = pcache_get_stats(c);
        if (st.gone_bytes > most) most = st.gone_bytes;
    }
    const pcache_stats st = pcache_get_stats(c);
    CHECK_MSG(st.n_evicted > 250, "%lld evictions", (long long)st.n_evicted);
    CHECK_MSG(most <= PCACHE_GONE_MAX && most > PCACHE_GONE_MAX / 2, "evicted entries kept %lld bytes of ids (bound %lld)",
              (long long)most, (long long)PCACHE_GONE_MAX);
    /* an entry evicted lately still says why a request that extends it missed; one evicted
     * long ago is forgotten */
    for (int k = 0; k < 2; k++) {
        const int conv = k ? 10 : 300;
        for (int64_t i = 0; i < N; i++) ids[i] = (int32_t)((i * 7 + conv * 13 + 1) % 1000);
        ids[0] = conv;
        ids[N] = 5;
        const int64_t got = pcache_evicted_best(c, ids, N + 1, NULL, NULL);
        CHECK_MSG(got == (k ? 0 : N), "conversation %d: evicted best %lld", conv, (long long)got);
    }
    free(ids);
    pcache_free(c);
    engine_free(eng);
    model_free(m);
}

int main(void) {
    RUN(evicted_ids_bounded);
    return harness_done();
}
