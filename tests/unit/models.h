/* models.h: test support: synthetic model files made once per test process with the gen
 * library (so tests need no fixture files), in $HEARTH_TMP or /tmp, and the few numeric
 * helpers the comparing tests share (deterministic ids, relative RMS, argmax). */
#ifndef HEARTH_TEST_MODELS_H
#define HEARTH_TEST_MODELS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <math.h>
#include "make/gen.h"
#include "engine/engine.h"

/* n deterministic token ids in [0, V) */
static inline int32_t *test_ids(int64_t n, int64_t V, uint64_t seed) {
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(rng_at(seed, (uint64_t)i) % (uint64_t)V);
    return ids;
}

/* one span of one sequence: the tests' prefill and step */
static inline int test_run(engine *eng, int seq, const int32_t *ids, int64_t n, float *logits, engine_logits want,
                           herr *e) {
    engine_span sp = {.seq = seq, .ids = ids, .n = n, .want = logits ? want : ENGINE_LOGITS_NONE, .logits = logits};
    return engine_run(eng, &sp, 1, e);
}

/* relative RMS difference of a against the reference b */
static inline double rel_rms_fd(const float *a, const double *b, int64_t n) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += b[i] * b[i];
    }
    return sqrt(d / (r > 0 ? r : 1));
}

static inline double rel_rms_ff(const float *a, const float *b, int64_t n) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return sqrt(d / (r > 0 ? r : 1));
}

static inline double rel_rms_dd(const double *a, const double *b, int64_t n) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        d += (a[i] - b[i]) * (a[i] - b[i]);
        r += b[i] * b[i];
    }
    return sqrt(d / (r > 0 ? r : 1));
}

static inline int64_t argmax_d(const double *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

/* Path of preset/quant at seed 1, written on first use. Exits the test on failure. */
static inline const char *test_model(const char *preset, const char *quant) {
    static char paths[16][512];
    static int n;
    char want[512];
    const char *dir = getenv("HEARTH_TMP") ? getenv("HEARTH_TMP") : "/tmp";
    /* a file a suite made once for its programs (tests/cli/wide.sh: the real widths take
     * a while to write), else one of this process's own */
    snprintf(want, sizeof want, "%s/shared-%s-%s.gguf", dir, preset, quant);
    if (access(want, R_OK) == 0) {
        snprintf(paths[n], sizeof paths[n], "%s", want);
        return paths[n++];
    }
    snprintf(want, sizeof want, "%s/test-%s-%s-%d.gguf", dir, preset, quant, (int)getpid());
    for (int i = 0; i < n; i++)
        if (!strcmp(paths[i], want)) return paths[i];
    gen_opts o = {.preset = preset, .seed = 1, .out_path = want};
    herr e;
    if (gen_quant_parse(quant, &o.quant, &e) < 0 || gen_write(&o, NULL, &e) < 0) {
        fprintf(stderr, "test_model(%s, %s): %s\n", preset, quant, e.msg);
        exit(1);
    }
    snprintf(paths[n], sizeof paths[n], "%s", want);
    return paths[n++];
}

static inline void test_models_cleanup(void) {
    const char *dir = getenv("HEARTH_TMP") ? getenv("HEARTH_TMP") : "/tmp";
    const char *presets[] = {"tiny", "small", "tiny-dense"}, *quants[] = {"f32", "q8_0", "q4_k_m"};
    char p[512];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            snprintf(p, sizeof p, "%s/test-%s-%s-%d.gguf", dir, presets[i], quants[j], (int)getpid());
            unlink(p);
        }
}

#endif
