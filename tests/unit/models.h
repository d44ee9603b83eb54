/* models.h: test support: synthetic model files made once per test process with the gen
 * library (so tests need no fixture files), in $HEARTH_TMP or /tmp. */
#ifndef HEARTH_TEST_MODELS_H
#define HEARTH_TEST_MODELS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "gen.h"

/* Path of preset/quant at seed 1, written on first use. Exits the test on failure. */
static const char *test_model(const char *preset, const char *quant) {
    static char paths[16][512];
    static int n;
    char want[512];
    const char *dir = getenv("HEARTH_TMP") ? getenv("HEARTH_TMP") : "/tmp";
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

static void test_models_cleanup(void) {
    const char *dir = getenv("HEARTH_TMP") ? getenv("HEARTH_TMP") : "/tmp";
    const char *presets[] = {"tiny", "small"}, *quants[] = {"f32", "q8_0", "q4_k_m"};
    char p[512];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            snprintf(p, sizeof p, "%s/test-%s-%s-%d.gguf", dir, presets[i], quants[j], (int)getpid());
            unlink(p);
        }
}

#endif
