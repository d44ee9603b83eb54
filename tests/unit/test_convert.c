/* test_convert.c: `hearth convert` against Hugging Face transformers itself. The fixture
 * tests/fixtures/hf_tiny (see its README.md) is a tiny random Qwen3_5MoeForCausalLM saved by
 * save_pretrained, with HF's logits for 100 ids in float32 and float64. The converted GGUF
 * must reproduce them through the CPU engine (f32 and q8_0) and through the float64
 * reference (tests/ref), and the same checkpoint re-laid as a multimodal, sharded checkpoint
 * with fused experts must convert to the same bytes. Bad files must fail with an error that
 * names what is wrong, leaving no output file. */
#include "harness.h"
#include "models.h"
#include "ref/ref.h"
#include "make/convert.h"
#include "engine/engine.h"
#include "format/gguf.h"
#include "format/quant.h"
#include "format/safetensors.h"
#include "engine/sampler.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#define FIXTURE "tests/fixtures/hf_tiny"

static char tmp_dir[512];

static const char *tmp_path(const char *name) {
    static char bufs[8][640];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", tmp_dir, name);
    return b;
}

static bool write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

/* ---- the fixture's reference ---- */

typedef struct fixture {
    int64_t n, V;
    int32_t *ids;
    float *hf32;        /* n x V: HF float32 */
    double *hf64;       /* n x V: HF float64 */
} fixture;

static bool fixture_load(fixture *fx) {
    memset(fx, 0, sizeof *fx);
    char *js = test_read(FIXTURE "/reference.json", NULL);
    if (!js) return false;
    cJSON *r = cJSON_Parse(js);
    free(js);
    const cJSON *ids = cJSON_GetObjectItem(r, "ids"), *nv = cJSON_GetObjectItem(r, "n_vocab");
    if (!cJSON_IsArray(ids) || !cJSON_IsNumber(nv)) { cJSON_Delete(r); return false; }
    fx->n = cJSON_GetArraySize(ids);
    fx->V = (int64_t)nv->valuedouble;
    fx->ids = xmalloc(sizeof(int32_t) * (size_t)fx->n);
    for (int64_t i = 0; i < fx->n; i++) fx->ids[i] = (int32_t)cJSON_GetArrayItem(ids, (int)i)->valuedouble;
    cJSON_Delete(r);
    size_t l32, l64;
    fx->hf32 = test_read(FIXTURE "/logits_f32.bin", &l32);
    fx->hf64 = test_read(FIXTURE "/logits_f64.bin", &l64);
    return fx->hf32 && fx->hf64 && l32 == sizeof(float) * (size_t)(fx->n * fx->V) &&
           l64 == sizeof(double) * (size_t)(fx->n * fx->V);
}

static void fixture_free(fixture *fx) {
    free(fx->ids);
    free(fx->hf32);
    free(fx->hf64);
}

/* ---- comparisons ---- */

typedef struct cmp_stats {
    double max_rel, median_rel;     /* per-row relative RMS difference */
    int64_t top1_same, top1_excused, rows;
} cmp_stats;

static int dcmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* rows of `got` (float or double, one of them NULL) against the reference rows `ref` (double);
 * a top-1 difference is excused only when the reference's best two logits are closer than
 * 2 * band * the row's RMS (the band's own noise could swap them) */
static cmp_stats compare(const float *got_f, const double *got_d, const double *ref, int64_t n, int64_t V, double band) {
    cmp_stats s = {0};
    double *rel = xmalloc(sizeof(double) * (size_t)n);
    for (int64_t r = 0; r < n; r++) {
        const double *y = ref + r * V;
        double d = 0, q = 0, best = -INFINITY, second = -INFINITY;
        int64_t ib = 0, ig = 0;
        double gbest = -INFINITY;
        for (int64_t i = 0; i < V; i++) {
            double g = got_f ? (double)got_f[r * V + i] : got_d[r * V + i];
            d += (g - y[i]) * (g - y[i]);
            q += y[i] * y[i];
            if (y[i] > best) { second = best; best = y[i]; ib = i; }
            else if (y[i] > second) second = y[i];
            if (g > gbest) { gbest = g; ig = i; }
        }
        rel[r] = sqrt(d / (q > 0 ? q : 1));
        if (rel[r] > s.max_rel) s.max_rel = rel[r];
        if (ig == ib) s.top1_same++;
        else if (best - second < 2 * band * sqrt(q / (double)V)) s.top1_excused++;
    }
    qsort(rel, (size_t)n, sizeof *rel, dcmp);
    s.median_rel = n ? rel[n / 2] : 0;
    s.rows = n;
    free(rel);
    return s;
}

static void report(const char *what, cmp_stats s, double band) {
    printf("  %-34s rel rms per row: max %.2e median %.2e (band %.0e); top-1 same %lld/%lld (%lld excused)\n", what,
           s.max_rel, s.median_rel, band, (long long)s.top1_same, (long long)s.rows, (long long)s.top1_excused);
}

/* Bands (relative RMS of a row of logits against the reference row).
 * F32: hearth's engine keeps weights and activations in f32; each dot product of length
 * K <= 256 (this model) rounds with relative error ~ sqrt(K) * 2^-24 = 9.5e-7 (a random walk
 * of round-offs); a token passes ~4 such stages per layer (mixer in/out, FFN in/out) over 4
 * layers plus the output matrix, errors adding in quadrature: sqrt(17) * 9.5e-7 = 3.9e-6; the
 * recurrent state carries the errors of every earlier token forward, decayed, at most
 * sqrt(100) = 10x more: 3.9e-5. HF's own f32 run has an error of the same kind, so against
 * HF f32 the two add in quadrature (5.5e-5); against HF f64 only hearth's counts. Band 1e-4
 * for both (about 2x, for expf/logf/sqrtf ulps and the chunked delta rule's reordered sums).
 * F64 reference: tests/ref computes in double from the GGUF's f32 weights; the GGUF holds
 * fl32(1 + w) for every zero-centred norm and fl32(-exp(A_log)), each off by <= 2^-24 =
 * 6e-8 relative from HF float64's exact values; HF's float64 run still forms the decay g in
 * f32 (6e-8 relative per step). Those relative errors of 6e-8 enter ~17 stages: sqrt(17) *
 * 6e-8 = 2.5e-7, carried at most 10x by the state: 2.5e-6. Band 5e-6 (2x).
 * Q8_0: weights rounded to 8 bits per block of 32, step d = amax/127, error rms
 * d/sqrt(12) <= 4/127/3.46 = 0.91% of a row's rms for rows with amax <= 4 rms, and the
 * activations the same way (Q8_0 partner): 1.3% per stage, sqrt(17) stages: 5.3%. Band 10%
 * (2x); a routing flip (two router probabilities within that noise) is a discontinuity
 * covered by the top-1 excuse and by the median, which must stay inside the band. */
#define BAND_F32 1e-4
#define BAND_F64 5e-6
#define BAND_Q8 0.10

static bool convert_to(const char *dir, const char *out, convert_quant q, herr *e) {
    convert_opts o = {.hf_dir = dir, .out_path = out, .quant = q, .log = NULL};
    convert_stats st;
    return convert_hf(&o, &st, e) == 0;
}

static float *run_all_logits(const model *m, const fixture *fx, herr *e) {
    engine *eng;
    engine_opts eo = {.n_threads = 2, .n_ctx = fx->n + 8};
    if (engine_open(&eng, m, &eo, e) < 0) return NULL;
    float *lg = xmalloc(sizeof(float) * (size_t)(fx->n * fx->V));
    int rc = test_run(eng, 0, fx->ids, fx->n, lg, ENGINE_LOGITS_ALL, e);
    engine_free(eng);
    if (rc < 0) { free(lg); return NULL; }
    return lg;
}

TEST(parity_f32) {
    fixture fx;
    if (!fixture_load(&fx)) { CHECK_MSG(0, "cannot read the fixture %s", FIXTURE); fixture_free(&fx); return; }
    herr e;
    const char *out = tmp_path("hf_tiny_f32.gguf");
    if (!convert_to(FIXTURE, out, CONVERT_F32, &e)) { CHECK_MSG(0, "convert: %s", e.msg); fixture_free(&fx); return; }
    model *m;
    if (model_load(&m, out, &e) < 0) { CHECK_MSG(0, "model_load: %s", e.msg); fixture_free(&fx); return; }
    const model_hparams *hp = &m->hp;
    CHECK(hp->n_vocab == fx.V && hp->n_layer == 4 && hp->n_embd == 128 && hp->ssm_n_group == 2 &&
          hp->ssm_dt_rank == 4 && hp->ssm_d_state == 64 && hp->rope_dims == 16 && hp->n_expert == 8 &&
          hp->n_expert_used == 2 && hp->head_dim == 64 && fabsf(hp->rope_theta - 1e7f) < 1 &&
          hp->is_recurrent[0] && hp->is_recurrent[2] && !hp->is_recurrent[3]);

    /* HF's own f32 run against its f64 run: what one f32 implementation's error looks like */
    double *hf32d = xmalloc(sizeof(double) * (size_t)(fx.n * fx.V));
    for (int64_t i = 0; i < fx.n * fx.V; i++) hf32d[i] = fx.hf32[i];
    report("HF f32 vs HF f64", compare(NULL, hf32d, fx.hf64, fx.n, fx.V, BAND_F32), BAND_F32);

    float *lg = run_all_logits(m, &fx, &e);
    CHECK_MSG(lg, "engine: %s", lg ? "" : e.msg);
    if (lg) {
        cmp_stats a = compare(lg, NULL, fx.hf64, fx.n, fx.V, BAND_F32);
        cmp_stats b = compare(lg, NULL, hf32d, fx.n, fx.V, BAND_F32);
        report("engine f32 vs HF f64", a, BAND_F32);
        report("engine f32 vs HF f32", b, BAND_F32);
        CHECK_MSG(a.max_rel <= BAND_F32, "engine vs HF f64: max rel %.3e > %.0e", a.max_rel, BAND_F32);
        CHECK_MSG(b.max_rel <= BAND_F32, "engine vs HF f32: max rel %.3e > %.0e", b.max_rel, BAND_F32);
        CHECK_MSG(a.top1_same == fx.n, "engine vs HF f64: top-1 differs at %lld rows", (long long)(fx.n - a.top1_same));
        CHECK_MSG(b.top1_same == fx.n, "engine vs HF f32: top-1 differs at %lld rows", (long long)(fx.n - b.top1_same));
    }

    /* the float64 reference on the same file */
    ref_model *rm = ref_model_new(m);
    ref_seq *rs = ref_seq_new(rm, fx.n);
    double *rl = xmalloc(sizeof(double) * (size_t)(fx.n * fx.V));
    for (int64_t t = 0; t < fx.n; t++) ref_step(rs, fx.ids[t], rl + t * fx.V);
    cmp_stats c = compare(NULL, rl, fx.hf64, fx.n, fx.V, BAND_F64);
    report("ref f64 vs HF f64", c, BAND_F64);
    report("ref f64 vs HF f32", compare(NULL, rl, hf32d, fx.n, fx.V, BAND_F32), BAND_F32);
    CHECK_MSG(c.max_rel <= BAND_F64, "ref vs HF f64: max rel %.3e > %.0e", c.max_rel, BAND_F64);
    CHECK_MSG(c.top1_same == fx.n, "ref vs HF f64: top-1 differs at %lld rows", (long long)(fx.n - c.top1_same));
    ref_seq_free(rs);
    ref_model_free(rm);
    free(rl);
    free(lg);
    free(hf32d);
    model_free(m);
    fixture_free(&fx);
}

TEST(parity_q8_0) {
    fixture fx;
    if (!fixture_load(&fx)) { CHECK_MSG(0, "cannot read the fixture %s", FIXTURE); fixture_free(&fx); return; }
    herr e;
    const char *out = tmp_path("hf_tiny_q8_0.gguf");
    if (!convert_to(FIXTURE, out, CONVERT_Q8_0, &e)) { CHECK_MSG(0, "convert: %s", e.msg); fixture_free(&fx); return; }
    model *m;
    if (model_load(&m, out, &e) < 0) { CHECK_MSG(0, "model_load: %s", e.msg); fixture_free(&fx); return; }
    CHECK(m->layers[0].attn_qkv.type == QT_Q8_0 && m->token_embd.type == QT_Q8_0 && m->output.type == QT_Q8_0 &&
          m->layers[0].ffn_gate_inp.type == QT_F32 && m->layers[0].ssm_conv1d.type == QT_F32 &&
          m->layers[0].ffn_down_exps.type == QT_Q8_0);
    float *lg = run_all_logits(m, &fx, &e);
    CHECK_MSG(lg, "engine: %s", lg ? "" : e.msg);
    if (lg) {
        cmp_stats a = compare(lg, NULL, fx.hf64, fx.n, fx.V, BAND_Q8);
        report("engine q8_0 vs HF f64", a, BAND_Q8);
        CHECK_MSG(a.median_rel <= BAND_Q8, "q8_0: median rel %.3e > %.2f", a.median_rel, BAND_Q8);
        CHECK_MSG(a.top1_same + a.top1_excused == fx.n, "q8_0: top-1 differs beyond the band at %lld rows",
                  (long long)(fx.n - a.top1_same - a.top1_excused));
    }
    free(lg);
    model_free(m);
    fixture_free(&fx);
}

/* llama.cpp (the peer, when tools/peer/build.sh and build_logits_dump.sh have built it) on
 * the converted file: the GGUF follows llama.cpp's conventions, not only hearth's. */
TEST(peer_parity) {
    char bin[900] = "", tool[1024], cmd[4096];
    FILE *p = popen("bash tools/peer/path.sh 2>/dev/null", "r");
    bool found = p && fgets(bin, sizeof bin, p);
    if (p && pclose(p) != 0) found = false;
    bin[strcspn(bin, "\n")] = 0;
    snprintf(tool, sizeof tool, "%s/../../logits_dump", bin);
    if (!found || access(tool, X_OK) != 0) SKIP("llama.cpp peer or its logits_dump not built (tools/peer/)");
    fixture fx;
    if (!fixture_load(&fx)) { CHECK_MSG(0, "cannot read the fixture %s", FIXTURE); fixture_free(&fx); return; }
    herr e;
    const char *gg = tmp_path("peer_f32.gguf"), *ids = tmp_path("peer_ids.bin"), *out = tmp_path("peer_logits.bin");
    CHECK(write_file(ids, fx.ids, sizeof(int32_t) * (size_t)fx.n));
    if (!convert_to(FIXTURE, gg, CONVERT_F32, &e)) { CHECK_MSG(0, "convert: %s", e.msg); fixture_free(&fx); return; }
    snprintf(cmd, sizeof cmd, "'%s' -t 2 --kv f32 --fa off '%s' '%s' '%s' >/dev/null 2>&1", tool, gg, ids, out);
    CHECK_MSG(system(cmd) == 0, "logits_dump failed: %s", cmd);
    size_t len;
    char *b = test_read(out, &len);
    const size_t head = 12 + 4 * (size_t)fx.n;
    bool good = b && len == head + sizeof(float) * (size_t)(fx.n * fx.V) && !memcmp(b, "HLD1", 4);
    CHECK_MSG(good, "%s: not the logits of %lld positions", out, (long long)fx.n);
    if (good) {
        float *lg = xmalloc(sizeof(float) * (size_t)(fx.n * fx.V));
        memcpy(lg, b + head, sizeof(float) * (size_t)(fx.n * fx.V));
        cmp_stats a = compare(lg, NULL, fx.hf64, fx.n, fx.V, BAND_F32);
        report("llama.cpp f32 vs HF f64", a, BAND_F32);
        CHECK_MSG(a.max_rel <= BAND_F32, "llama.cpp vs HF f64: max rel %.3e > %.0e", a.max_rel, BAND_F32);
        CHECK_MSG(a.top1_same == fx.n, "llama.cpp vs HF f64: top-1 differs at %lld rows", (long long)(fx.n - a.top1_same));
        free(lg);
    }
    free(b);
    fixture_free(&fx);
}

/* ---- writing safetensors files for the layout and bad-input cases ---- */

typedef struct wt {
    char name[160];
    const char *dtype;
    int nd;
    int64_t shape[4];
    const void *data;
    size_t nbytes;
} wt;

/* header JSON padded with spaces to a multiple of 8, then the data in order */
static bool st_write(const char *path, const wt *t, int n) {
    cJSON *h = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(h, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_AddObjectToObject(h, t[i].name);
        cJSON_AddStringToObject(o, "dtype", t[i].dtype);
        cJSON *sh = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < t[i].nd; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[d]));
        cJSON *of = cJSON_AddArrayToObject(o, "data_offsets");
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(off + t[i].nbytes)));
        off += t[i].nbytes;
    }
    char *js = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    size_t hl = strlen(js), pad = (8 - hl % 8) % 8;
    FILE *f = fopen(path, "wb");
    if (!f) { free(js); return false; }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((hl + pad) >> (8 * i));
    bool ok = fwrite(len8, 1, 8, f) == 8 && fwrite(js, 1, hl, f) == hl;
    for (size_t i = 0; i < pad && ok; i++) ok = fputc(' ', f) != EOF;
    for (int i = 0; i < n && ok; i++) ok = fwrite(t[i].data, 1, t[i].nbytes, f) == t[i].nbytes;
    free(js);
    return fclose(f) == 0 && ok;
}

/* the fixture's tensors as wt entries (pointing into the open file) */
static int fixture_tensors(st_file **sf, wt **out) {
    herr e;
    if (st_open(sf, FIXTURE "/model.safetensors", &e) < 0) { fprintf(stderr, "%s\n", e.msg); return -1; }
    int n = (int)st_n_tensors(*sf);
    wt *t = xcalloc((size_t)n, sizeof *t);
    for (int i = 0; i < n; i++) {
        const st_tensor *s = st_tensor_at(*sf, i);
        snprintf(t[i].name, sizeof t[i].name, "%s", s->name);
        t[i].dtype = st_dtype_name(s->dtype);
        t[i].nd = s->n_dims;
        for (int d = 0; d < s->n_dims; d++) t[i].shape[d] = s->shape[d];
        t[i].data = s->data;
        t[i].nbytes = s->nbytes;
    }
    *out = t;
    return n;
}

static const char *make_dir(const char *name) {
    const char *d = tmp_path(name);
    mkdir(d, 0755);
    return d;
}

static bool copy_config(const char *dir) {
    size_t n;
    char *c = test_read(FIXTURE "/config.json", &n);
    if (!c) return false;
    char p[700];
    snprintf(p, sizeof p, "%s/config.json", dir);
    bool ok = write_file(p, c, n);
    free(c);
    return ok;
}

static bool same_tensor_bytes(const char *a, const char *b, char *why, size_t why_n) {
    herr e;
    gguf_file *fa, *fb;
    if (gguf_open(&fa, a, &e) < 0) { snprintf(why, why_n, "%.200s", e.msg); return false; }
    if (gguf_open(&fb, b, &e) < 0) { snprintf(why, why_n, "%.200s", e.msg); gguf_close(fa); return false; }
    bool same = gguf_n_tensors(fa) == gguf_n_tensors(fb);
    if (!same) snprintf(why, why_n, "tensor counts differ");
    for (int64_t i = 0; same && i < gguf_n_tensors(fa); i++) {
        const gguf_tensor *x = gguf_tensor_at(fa, i), *y = gguf_find_tensor(fb, x->name);
        same = y && x->nbytes == y->nbytes && x->type == y->type && !memcmp(x->data, y->data, x->nbytes);
        if (!same) snprintf(why, why_n, "tensor %s differs", x->name);
    }
    gguf_close(fa);
    gguf_close(fb);
    return same;
}

/* The fixture re-laid as a multimodal checkpoint: config under text_config, names under
 * model.language_model., two shards with an index, and layer 0's experts fused into
 * gate_up_proj [X, 2F, E] + down_proj [X, E, F] (transformers' in-memory layout). */
TEST(layouts_same_bytes) {
    herr e;
    const char *plain = tmp_path("layout_plain.gguf"), *mm = tmp_path("layout_mm.gguf");
    if (!convert_to(FIXTURE, plain, CONVERT_F32, &e)) { CHECK_MSG(0, "convert: %s", e.msg); return; }
    st_file *sf;
    wt *t;
    int n = fixture_tensors(&sf, &t);
    if (n < 0) { CHECK(0); return; }
    const char *dir = make_dir("layout_mm");
    /* config */
    char *cj = test_read(FIXTURE "/config.json", NULL);
    cJSON *text = cJSON_Parse(cj);
    free(cj);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model_type", "qwen3_5_moe");
    cJSON_AddNumberToObject(root, "vocab_size", 1); /* wrong on purpose: text_config must win */
    cJSON_AddItemToObject(root, "text_config", text);
    char *out = cJSON_Print(root);
    cJSON_Delete(root);
    char p[700];
    snprintf(p, sizeof p, "%s/config.json", dir);
    CHECK(write_file(p, out, strlen(out)));
    free(out);
    /* fused experts of layer 0 */
    const int64_t X = 8, F = 32, E = 128;
    const size_t es = 2; /* bf16 */
    uint8_t *gate_up = xmalloc((size_t)(X * 2 * F * E) * es), *down = xmalloc((size_t)(X * E * F) * es);
    wt *u = xcalloc((size_t)n + 2, sizeof *u);
    int nu = 0;
    for (int i = 0; i < n; i++) {
        int x;
        char proj[32];
        if (sscanf(t[i].name, "model.layers.0.mlp.experts.%d.%31[a-z_].weight", &x, proj) == 2) {
            CHECK(!strcmp(t[i].dtype, "BF16"));
            size_t blk = (size_t)(F * E) * es;
            if (!strcmp(proj, "gate_proj")) memcpy(gate_up + (size_t)x * 2 * blk, t[i].data, blk);
            else if (!strcmp(proj, "up_proj")) memcpy(gate_up + (size_t)x * 2 * blk + blk, t[i].data, blk);
            else memcpy(down + (size_t)x * blk, t[i].data, blk);
            continue;
        }
        u[nu] = t[i];
        if (!strncmp(t[i].name, "model.", 6)) snprintf(u[nu].name, sizeof u[nu].name, "model.language_model.%s", t[i].name + 6);
        nu++;
    }
    u[nu++] = (wt){"model.language_model.layers.0.mlp.experts.gate_up_proj", "BF16", 3, {X, 2 * F, E}, gate_up,
                   (size_t)(X * 2 * F * E) * es};
    u[nu++] = (wt){"model.language_model.layers.0.mlp.experts.down_proj", "BF16", 3, {X, E, F}, down,
                   (size_t)(X * E * F) * es};
    /* two shards and the index */
    int half = nu / 2;
    char s1[700], s2[700];
    snprintf(s1, sizeof s1, "%s/model-00001-of-00002.safetensors", dir);
    snprintf(s2, sizeof s2, "%s/model-00002-of-00002.safetensors", dir);
    CHECK(st_write(s1, u, half) && st_write(s2, u + half, nu - half));
    cJSON *idx = cJSON_CreateObject(), *wm = cJSON_AddObjectToObject(idx, "weight_map");
    for (int i = 0; i < nu; i++)
        cJSON_AddStringToObject(wm, u[i].name, i < half ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors");
    out = cJSON_Print(idx);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    CHECK(write_file(p, out, strlen(out)));
    free(out);
    if (!convert_to(dir, mm, CONVERT_F32, &e)) CHECK_MSG(0, "convert (multimodal layout): %s", e.msg);
    else {
        char why[256] = "";
        CHECK_MSG(same_tensor_bytes(plain, mm, why, sizeof why), "multimodal/sharded/fused layout: %s", why);
    }
    /* an index that points outside the folder is refused */
    cJSON_ReplaceItemInObject(wm, u[0].name, cJSON_CreateString("../model.safetensors"));
    out = cJSON_Print(idx);
    CHECK(write_file(p, out, strlen(out)));
    free(out);
    CHECK(!convert_to(dir, mm, CONVERT_F32, &e) && strstr(e.msg, "not a file name in the folder"));
    printf("  bad index: %s\n", e.msg);
    cJSON_Delete(idx);
    free(gate_up);
    free(down);
    free(u);
    free(t);
    st_close(sf);
}

/* one bad case: convert must fail, name `want` in its message and leave no file */
static void expect_fail(const char *dir, const char *want, const char *what) {
    herr e;
    const char *out = tmp_path("bad.gguf");
    unlink(out);
    bool ok = convert_to(dir, out, CONVERT_F32, &e);
    CHECK_MSG(!ok, "%s: convert succeeded", what);
    if (!ok) {
        printf("  %-28s -> %s\n", what, e.msg);
        CHECK_MSG(strstr(e.msg, want), "%s: message \"%s\" does not name \"%s\"", what, e.msg, want);
    }
    CHECK_MSG(access(out, F_OK) != 0, "%s: an output file was left behind", what);
}

static void write_st_case(const char *dir, const wt *t, int n) {
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK(st_write(p, t, n));
}

TEST(bad_inputs) {
    st_file *sf;
    wt *t;
    int n = fixture_tensors(&sf, &t);
    if (n < 0) { CHECK(0); return; }
    char p[700];
    size_t len;
    char *whole = test_read(FIXTURE "/model.safetensors", &len);
    CHECK(whole != NULL);

    /* truncated: the last tensors' data is cut off */
    const char *d = make_dir("bad_truncated");
    CHECK(copy_config(d));
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    CHECK(write_file(p, whole, len / 2));
    expect_fail(d, "run past the end of the data", "truncated file");

    /* shorter than the 8-byte length, and a header length past the end */
    d = make_dir("bad_short");
    CHECK(copy_config(d));
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    CHECK(write_file(p, whole, 5));
    expect_fail(d, "too short", "5-byte file");
    d = make_dir("bad_hlen");
    CHECK(copy_config(d));
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    char *mod = xmalloc(len);
    memcpy(mod, whole, len);
    mod[6] = 0x10; /* header length ~ 2^52 */
    CHECK(write_file(p, mod, len));
    expect_fail(d, "header length", "header length past the end");
    /* a header that is not JSON */
    memcpy(mod, whole, len);
    memset(mod + 8, '{', 16);
    CHECK(write_file(p, mod, len));
    expect_fail(d, "not a JSON object", "garbled header");
    free(mod);

    /* offsets past the file: one tensor's data_offsets end beyond the data */
    d = make_dir("bad_offsets");
    CHECK(copy_config(d));
    {
        wt one = {"model.norm.weight", "F32", 1, {128}, t[0].data, 512};
        char q[700];
        snprintf(q, sizeof q, "%s/model.safetensors", d);
        CHECK(st_write(q, &one, 1));
        /* rewrite its header's end offset from 512 to 4096 */
        size_t l2;
        char *b = test_read(q, &l2);
        char *at = strstr(b + 8, "[0,512]");
        CHECK(at != NULL);
        if (at) memcpy(at, "[0,999]", 7);
        CHECK(write_file(q, b, l2));
        free(b);
    }
    expect_fail(d, "model.norm.weight: data_offsets [0, 999] run past the end", "offsets past the data");

    /* a size that does not match the shape */
    d = make_dir("bad_size");
    CHECK(copy_config(d));
    {
        wt one = {"model.norm.weight", "F32", 1, {100}, t[0].data, 512};
        write_st_case(d, &one, 1);
    }
    expect_fail(d, "hold 512 bytes, but F32 of 100 elements needs 400", "size != shape");

    /* a missing tensor */
    d = make_dir("bad_missing");
    CHECK(copy_config(d));
    wt *u = xcalloc((size_t)n, sizeof *u);
    int nu = 0;
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].name, "model.layers.2.mlp.gate.weight")) u[nu++] = t[i];
    write_st_case(d, u, nu);
    expect_fail(d, "missing tensor model.layers.2.mlp.gate.weight", "missing router");

    /* a missing expert */
    nu = 0;
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].name, "model.layers.1.mlp.experts.5.up_proj.weight")) u[nu++] = t[i];
    write_st_case(d, u, nu);
    expect_fail(d, "missing tensor model.layers.1.mlp.experts.5.up_proj.weight", "missing expert");

    /* a wrong shape (A_log of 3 heads instead of 4) */
    for (int i = 0; i < n; i++) {
        u[i] = t[i];
        if (!strcmp(t[i].name, "model.layers.1.linear_attn.A_log")) { u[i].shape[0] = 3; u[i].nbytes = 12; }
    }
    write_st_case(d, u, n);
    expect_fail(d, "tensor model.layers.1.linear_attn.A_log has shape [3], expected [4]", "wrong shape");

    /* a dtype convert does not read, and one nobody knows */
    for (int i = 0; i < n; i++) {
        u[i] = t[i];
        if (!strcmp(t[i].name, "model.layers.0.linear_attn.dt_bias")) u[i].dtype = "I32";
    }
    write_st_case(d, u, n);
    expect_fail(d, "model.layers.0.linear_attn.dt_bias has dtype I32", "integer dtype");
    for (int i = 0; i < n; i++)
        if (!strcmp(t[i].name, "model.layers.0.linear_attn.dt_bias")) u[i].dtype = "Q4";
    write_st_case(d, u, n);
    expect_fail(d, "unknown dtype \"Q4\"", "unknown dtype");

    /* no weights at all, and a config without a required key */
    d = make_dir("bad_empty");
    CHECK(copy_config(d));
    expect_fail(d, "no model.safetensors or model.safetensors.index.json", "no weights");
    d = make_dir("bad_config");
    {
        char *c = test_read(FIXTURE "/config.json", NULL);
        cJSON *j = cJSON_Parse(c);
        free(c);
        cJSON_DeleteItemFromObject(j, "num_experts");
        char *s = cJSON_Print(j);
        snprintf(p, sizeof p, "%s/config.json", d);
        CHECK(write_file(p, s, strlen(s)));
        free(s);
        cJSON_Delete(j);
    }
    write_st_case(d, t, n);
    expect_fail(d, "missing num_experts", "config without num_experts");

    free(u);
    free(whole);
    free(t);
    st_close(sf);
}

/* config.json values a product would overflow are refused by name (the fuzz target's
 * find: tests/fuzz/regress/hf_config), before any arithmetic on them */
TEST(config_bounds) {
    char *c = test_read(FIXTURE "/config.json", NULL);
    cJSON *j = cJSON_Parse(c);
    free(c);
    static const char *const keys[] = {"linear_num_value_heads", "linear_value_head_dim"};
    for (int k = 0; k < 2; k++) {
        cJSON *v = cJSON_Duplicate(j, true);
        cJSON_ReplaceItemInObject(v, keys[k], cJSON_CreateNumber(9e15));
        if (k == 1) cJSON_ReplaceItemInObject(v, "linear_key_head_dim", cJSON_CreateNumber(9e15));
        char *s = cJSON_PrintUnformatted(v);
        model_hparams hp;
        herr e;
        CHECK_MSG(convert_parse_config(s, strlen(s), &hp, &e) < 0 && strstr(e.msg, keys[k]), "%s", e.msg);
        free(s);
        cJSON_Delete(v);
    }
    char *s = cJSON_PrintUnformatted(j);
    model_hparams hp;
    herr e;
    CHECK_MSG(convert_parse_config(s, strlen(s), &hp, &e) == 0 && hp.ssm_d_inner == 4 * 64, "%s", e.msg);
    free(s);
    cJSON_Delete(j);
}

int main(void) {
    const char *base = getenv("HEARTH_TMP") ? getenv("HEARTH_TMP") : "/tmp";
    snprintf(tmp_dir, sizeof tmp_dir, "%s/test-convert-%d", base, (int)getpid());
    mkdir(tmp_dir, 0755);
    RUN(config_bounds);
    RUN(parity_f32);
    RUN(parity_q8_0);
    RUN(peer_parity);
    RUN(layouts_same_bytes);
    RUN(bad_inputs);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
    return harness_done();
}
