/* test_model.c: the loader's checks on bad model files: another architecture, a missing
 * tensor, a wrong shape, a wrong type, a bad hyperparameter. Each is a file rewritten from a
 * good tiny one with one defect; each must fail with a message naming what was wrong. */
#include "harness.h"
#include "models.h"
#include "model/model.h"
#include "format/quant.h"
#include "engine/engine.h"
#include <math.h>

/* Copies src to dst through the writer, with one change: drop a tensor, reshape one,
 * retype one (data zeroed to the new size) or override one string/u32 key. */
typedef struct edit {
    const char *drop, *reshape, *retype, *key_str, *str_val, *key_u32;
    uint32_t u32_val;
} edit;

static bool rewrite(const char *src, const char *dst, const edit *ed) {
    herr e;
    gguf_file *f;
    if (gguf_open(&f, src, &e) < 0) { CHECK_MSG(0, "%s", e.msg); return false; }
    gguf_writer *w = gguf_writer_new();
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        if (ed->key_str && !strcmp(key, ed->key_str)) gguf_set_str(w, key, ed->str_val);
        else if (ed->key_u32 && !strcmp(key, ed->key_u32)) gguf_set_u32(w, key, ed->u32_val);
        else gguf_set_value(w, key, &kv->val);
    }
    int64_t *map = xcalloc((size_t)gguf_n_tensors(f), sizeof(int64_t));
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        map[i] = -1;
        if (ed->drop && !strcmp(t->name, ed->drop)) continue;
        int64_t ne[4];
        memcpy(ne, t->ne, sizeof ne);
        uint32_t type = t->type;
        if (ed->reshape && !strcmp(t->name, ed->reshape)) ne[1] += 256;
        if (ed->retype && !strcmp(t->name, ed->retype)) type = QT_F16;
        map[i] = gguf_add_tensor(w, t->name, type, t->n_dims, ne);
    }
    bool ok = gguf_writer_open(w, dst, &e) == 0;
    CHECK_MSG(ok, "%s", e.msg);
    for (int64_t i = 0; ok && i < gguf_n_tensors(f); i++) {
        if (map[i] < 0) continue;
        const gguf_tensor *t = gguf_tensor_at(f, i);
        uint64_t nb = gguf_writer_tensor_nbytes(w, map[i]);
        uint8_t *buf = xcalloc(nb ? nb : 1, 1);
        memcpy(buf, t->data, nb < t->nbytes ? nb : t->nbytes);
        ok = gguf_writer_write(w, map[i], 0, buf, nb, &e) == 0;
        free(buf);
    }
    ok = ok && gguf_writer_close(w, &e) == 0;
    gguf_writer_free(w);
    gguf_close(f);
    free(map);
    return ok;
}

static void expect_load_error(const edit *ed, const char *pattern1, const char *pattern2) {
    char dst[512];
    snprintf(dst, sizeof dst, "%s/bad-model-%d.gguf", getenv("HEARTH_TMP") ? getenv("HEARTH_TMP") : "/tmp", (int)getpid());
    if (!rewrite(test_model("tiny", "q4_k_m"), dst, ed)) return;
    herr e = {{0}};
    model *m = NULL;
    int rc = model_load(&m, dst, &e);
    CHECK_MSG(rc < 0, "a bad file loaded (expected an error with '%s')", pattern1);
    if (rc == 0) model_free(m);
    CHECK_MSG(strstr(e.msg, pattern1) != NULL, "message '%s' does not name '%s'", e.msg, pattern1);
    if (pattern2) CHECK_MSG(strstr(e.msg, pattern2) != NULL, "message '%s' does not say '%s'", e.msg, pattern2);
    printf("  %s\n", e.msg);
    unlink(dst);
}

TEST(good_file_loads) {
    herr e;
    model *m;
    CHECK_MSG(model_load(&m, test_model("tiny", "q4_k_m"), &e) == 0, "%s", e.msg);
    model_free(m);
}
TEST(other_architecture) {
    edit ed = {.key_str = "general.architecture", .str_val = "qwen3next"};
    expect_load_error(&ed, "qwen3next", "qwen35moe");
}
TEST(missing_tensor) {
    edit ed = {.drop = "blk.1.ssm_a"};
    expect_load_error(&ed, "missing tensor blk.1.ssm_a", "expected shape {4}");
}
TEST(wrong_shape) {
    edit ed = {.reshape = "blk.0.attn_gate.weight"};
    expect_load_error(&ed, "blk.0.attn_gate.weight", "expected {256, 512}");
}
TEST(wrong_type) {
    edit ed = {.retype = "blk.2.ssm_norm.weight"};
    expect_load_error(&ed, "blk.2.ssm_norm.weight", "expected f32");
}
TEST(bad_hyperparameter) {
    edit ed = {.key_u32 = "qwen35moe.expert_used_count", .u32_val = 99};
    expect_load_error(&ed, "expert_used_count", NULL);
}

/* llama-quantize --tensor-type can give an FFN's gate and up different types (so different
 * activation formats): a valid file the engine must run, not abort on */
TEST(mixed_ffn_types_run) {
    char dst[512];
    snprintf(dst, sizeof dst, "%s/mixed-%d.gguf", getenv("HEARTH_TMP") ? getenv("HEARTH_TMP") : "/tmp", (int)getpid());
    edit ed = {.retype = "blk.0.ffn_up_exps.weight"};
    if (!rewrite(test_model("tiny", "q4_k_m"), dst, &ed)) return;
    herr e;
    model *m;
    if (model_load(&m, dst, &e) < 0) { CHECK_MSG(0, "%s", e.msg); return; }
    engine *eng;
    engine_opts eo = {.n_threads = 2, .n_ctx = 64};
    CHECK(engine_open(&eng, m, &eo, &e) == 0);
    int32_t ids[5] = {1, 2, 3, 4, 5};
    float *lg = xmalloc(sizeof(float) * (size_t)m->hp.n_vocab);
    CHECK(test_run(eng, 0, ids, 5, lg, ENGINE_LOGITS_LAST, &e) == 0);
    bool finite = true;
    for (int64_t i = 0; i < m->hp.n_vocab; i++) finite &= isfinite(lg[i]) != 0;
    CHECK(finite);
    free(lg);
    engine_free(eng);
    model_free(m);
    unlink(dst);
}

int main(void) {
    RUN(good_file_loads);
    RUN(other_architecture);
    RUN(missing_tensor);
    RUN(wrong_shape);
    RUN(wrong_type);
    RUN(bad_hyperparameter);
    RUN(mixed_ffn_types_run);
    test_models_cleanup();
    return harness_done();
}
