/* test_peer.c: peer parity: hearth's CPU engine against llama.cpp's CPU build on the same
 * GGUF files (`hearth gen` tiny and small at f32, q8_0, q4_k_m), logits at every position
 * of one 130-token prompt pass on both sides, with the float64 reference (tests/ref) as the
 * judge of which side is off when they disagree.
 *
 * llama.cpp's side is tools/peer/logits_dump.c (built into the peer cache folder by
 * tools/peer/build_logits_dump.sh): one llama_decode of the ids, 2 threads, CPU only, f32 KV
 * cache, flash attention off. Every test is a visible SKIP when the peer (tools/peer/path.sh)
 * or the dump tool is not built. HEARTH_PEER_VERBOSE=1 prints every position. */
#include "harness.h"
#include "models.h"
#include "ref/ref.h"
#include "engine.h"
#include "sampler.h"

#include <math.h>
#include <unistd.h>

#define N_IDS 130

static char peer_tool[1024];
static const char *peer_why; /* non-NULL: why the tests skip */

static void peer_find(void) {
    static bool done;
    if (done) return;
    done = true;
    char bin[900] = "";
    FILE *p = popen("bash tools/peer/path.sh 2>/dev/null", "r");
    bool ok = p && fgets(bin, sizeof bin, p);
    int rc = p ? pclose(p) : -1;
    if (!ok || rc != 0) { peer_why = "llama.cpp peer not built: run tools/peer/build.sh"; return; }
    bin[strcspn(bin, "\n")] = 0;
    /* path.sh prints $PEER_DIR/build-cpu/bin; build_logits_dump.sh writes $PEER_DIR/logits_dump */
    snprintf(peer_tool, sizeof peer_tool, "%s/../../logits_dump", bin);
    if (access(peer_tool, X_OK) != 0)
        peer_why = "llama.cpp peer not built: logits_dump missing, run tools/peer/build_logits_dump.sh";
}

static int32_t *test_ids(int64_t n, int64_t V, uint64_t seed) {
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(rng_at(seed, (uint64_t)i) % (uint64_t)V);
    return ids;
}

/* llama.cpp's logits for ids (n x V) from logits_dump; NULL with a message on failure */
static float *peer_logits(const char *model_path, const int32_t *ids, int64_t n, int64_t V) {
    const char *dir = getenv("HEARTH_TMP") ? getenv("HEARTH_TMP") : "/tmp";
    char ids_path[600], out_path[600], err_path[600], cmd[4096];
    snprintf(ids_path, sizeof ids_path, "%s/peer-ids-%d.bin", dir, (int)getpid());
    snprintf(out_path, sizeof out_path, "%s/peer-logits-%d.bin", dir, (int)getpid());
    snprintf(err_path, sizeof err_path, "%s/peer-err-%d.txt", dir, (int)getpid());
    FILE *f = fopen(ids_path, "wb");
    if (!f) { perror(ids_path); return NULL; }
    fwrite(ids, sizeof(int32_t), (size_t)n, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "'%s' -t 2 --kv f32 --fa off '%s' '%s' '%s' 2>'%s'", peer_tool, model_path, ids_path,
             out_path, err_path);
    int rc = system(cmd);
    float *lg = NULL;
    if (rc != 0) {
        fprintf(stderr, "    logits_dump failed (%d):\n", rc);
        char line[512];
        FILE *e = fopen(err_path, "r");
        for (int k = 0; e && k < 20 && fgets(line, sizeof line, e); k++) fprintf(stderr, "      %s", line);
        if (e) fclose(e);
        goto out;
    }
    f = fopen(out_path, "rb");
    char magic[4];
    uint32_t hv[2];
    if (!f || fread(magic, 1, 4, f) != 4 || memcmp(magic, "HLD1", 4) || fread(hv, 4, 2, f) != 2 || hv[0] != (uint32_t)V ||
        hv[1] != (uint32_t)n) {
        fprintf(stderr, "    %s: bad logits file\n", out_path);
        if (f) fclose(f);
        goto out;
    }
    int32_t *pos = xmalloc(sizeof(int32_t) * (size_t)n);
    lg = xmalloc(sizeof(float) * (size_t)(n * V));
    bool good = fread(pos, 4, (size_t)n, f) == (size_t)n && fread(lg, sizeof(float), (size_t)(n * V), f) == (size_t)(n * V);
    for (int64_t i = 0; good && i < n; i++) good = pos[i] == i;
    fclose(f);
    free(pos);
    if (!good) {
        fprintf(stderr, "    %s: short or out-of-order logits file\n", out_path);
        free(lg);
        lg = NULL;
    }
out:
    unlink(ids_path);
    unlink(out_path);
    unlink(err_path);
    return lg;
}

/* relative RMS difference of a against b (b the reference) */
static double rel_rms_ff(const float *a, const float *b, int64_t n) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return sqrt(d / (r > 0 ? r : 1));
}
static double rel_rms_fd(const float *a, const double *b, int64_t n) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += b[i] * b[i];
    }
    return sqrt(d / (r > 0 ? r : 1));
}
static int64_t argmax_d(const double *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}
/* best minus second-best logit, relative to the row's RMS */
static double top_margin_rel(const float *x, int64_t n) {
    int64_t b = sampler_argmax(x, n);
    double second = -INFINITY, ss = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i != b && x[i] > second) second = x[i];
        ss += (double)x[i] * x[i];
    }
    return (x[b] - second) / sqrt(ss / (double)n);
}
static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(const double *x, int64_t n) {
    double *c = xmalloc(sizeof(double) * (size_t)n);
    memcpy(c, x, sizeof(double) * (size_t)n);
    qsort(c, (size_t)n, sizeof(double), cmp_d);
    double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

static void check_file(const char *preset, const char *quant) {
    peer_find();
    if (peer_why) SKIP(peer_why);
    const char *path = test_model(preset, quant);
    herr e;
    model *m;
    if (model_load(&m, path, &e) < 0) { CHECK_MSG(0, "%s", e.msg); return; }
    const int64_t V = m->hp.n_vocab, N = N_IDS;
    const bool is_f32 = !strcmp(quant, "f32");
    int32_t *ids = test_ids(N, V, 7);

    float *pl = peer_logits(path, ids, N, V);
    if (!pl) { CHECK_MSG(0, "%s %s: no logits from llama.cpp", preset, quant); free(ids); model_free(m); return; }

    engine *eng;
    engine_opts eo = {.n_threads = 2, .n_ctx = N + 8, .kv_f16 = false};
    if (engine_open_cpu(&eng, m, &eo, &e) < 0) { CHECK_MSG(0, "%s", e.msg); return; }
    float *hl = xmalloc(sizeof(float) * (size_t)(N * V));
    seq *s = engine_seq_new(eng, &e);
    CHECK(engine_prefill(eng, s, ids, N, NULL, 0, NULL, hl, true, &e) == 0);
    engine_seq_free(eng, s);
    engine_free(eng);

    /* the float64 reference at every position */
    double *rl = xmalloc(sizeof(double) * (size_t)(N * V));
    ref_model *rm = ref_model_new(m);
    ref_seq *rs = ref_seq_new(rm, N);
    for (int64_t t = 0; t < N; t++) ref_step(rs, ids[t], rl + t * V);
    ref_seq_free(rs);
    ref_model_free(rm);

    double *r_hl = xmalloc(sizeof(double) * N), *r_hr = xmalloc(sizeof(double) * N), *r_lr = xmalloc(sizeof(double) * N);
    int64_t agree = 0, h_ref = 0, l_ref = 0;
    const bool verbose = getenv("HEARTH_PEER_VERBOSE") != NULL;
    for (int64_t t = 0; t < N; t++) {
        const float *h = hl + t * V, *l = pl + t * V;
        const double *r = rl + t * V;
        r_hl[t] = rel_rms_ff(h, l, V);
        r_hr[t] = rel_rms_fd(h, r, V);
        r_lr[t] = rel_rms_fd(l, r, V);
        int64_t th = sampler_argmax(h, V), tl = sampler_argmax(l, V), tr = argmax_d(r, V);
        agree += th == tl;
        h_ref += th == tr;
        l_ref += tl == tr;
        if (verbose)
            printf("    %s %s pos %3lld: hearth~llama %.2e  hearth~ref %.2e  llama~ref %.2e  top1 %s (margin %.3f rms)\n",
                   preset, quant, (long long)t, r_hl[t], r_hr[t], r_lr[t], th == tl ? "same" : "DIFF",
                   top_margin_rel(l, V));
    }
    double mx = 0, mx_hr = 0, mx_lr = 0;
    for (int64_t t = 0; t < N; t++) {
        mx = fmax(mx, r_hl[t]);
        mx_hr = fmax(mx_hr, r_hr[t]);
        mx_lr = fmax(mx_lr, r_lr[t]);
    }
    printf("  %-5s %-6s positions %lld: hearth~llama rel rms median %.2e max %.2e, top-1 agree %.1f%% | "
           "vs float64 ref: hearth median %.2e max %.2e top-1 %.1f%%, llama median %.2e max %.2e top-1 %.1f%%\n",
           preset, quant, (long long)N, median(r_hl, N), mx, 100.0 * agree / N, median(r_hr, N), mx_hr, 100.0 * h_ref / N,
           median(r_lr, N), mx_lr, 100.0 * l_ref / N);
    fflush(stdout);
    (void)is_f32;

    free(r_hl);
    free(r_hr);
    free(r_lr);
    free(rl);
    free(hl);
    free(pl);
    free(ids);
    model_free(m);
}

TEST(tiny_f32) { check_file("tiny", "f32"); }
TEST(tiny_q8_0) { check_file("tiny", "q8_0"); }
TEST(tiny_q4_k_m) { check_file("tiny", "q4_k_m"); }
TEST(small_f32) { check_file("small", "f32"); }
TEST(small_q8_0) { check_file("small", "q8_0"); }
TEST(small_q4_k_m) { check_file("small", "q4_k_m"); }

int main(int argc, char **argv) {
    bool tiny_only = argc > 1 && !strcmp(argv[1], "--tiny");
    RUN(tiny_f32);
    RUN(tiny_q8_0);
    RUN(tiny_q4_k_m);
    if (!tiny_only) {
        RUN(small_f32);
        RUN(small_q8_0);
        RUN(small_q4_k_m);
    }
    test_models_cleanup();
    return harness_done();
}
