/* spec.c: see spec.h. */
#include "engine/spec.h"
#include "base/util.h"
#include "engine/mutant.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

engine_span spec_verify_span(int seq, const int32_t *ids, int k, const int64_t *marks, engine_point *const *points, float *logits) {
    const bool anchored = !MUTANT("spec_no_anchors"); /* mutant: the rows chunked, not a decode step's each */
    return (engine_span){.seq = seq, .ids = ids, .n = k + 1, .marks = marks, .n_marks = k, .points = points,
                         .anchors = anchored ? marks : NULL, .n_anchors = anchored ? k : 0, .want = ENGINE_LOGITS_ALL,
                         .logits = logits};
}

int spec_init(spec_ctx *sc, engine *eng, int seq, int k, herr *e) {
    memset(sc, 0, sizeof *sc);
    if (k < 1 || k > SPEC_MAX) return herr_set(e, "--spec-mtp %d: expects 1 to %d drafts a step", k, SPEC_MAX);
    if (!engine_get_info(eng).mtp) return herr_set(e, "--spec-mtp: the engine was opened without the MTP block");
    const int64_t V = engine_get_info(eng).n_vocab;
    sc->eng = eng, sc->seq = seq, sc->k = k;
    sc->points = xcalloc((size_t)k, sizeof *sc->points);
    sc->ids = xmalloc(sizeof(int32_t) * (size_t)(k + 1));
    sc->drafts = xmalloc(sizeof(int32_t) * (size_t)k);
    sc->marks = xmalloc(sizeof(int64_t) * (size_t)k);
    sc->logits = malloc(sizeof(float) * (size_t)(k + 1) * (size_t)V);
    if (!sc->logits) {
        spec_free(sc);
        return herr_set(e, "--spec-mtp %d: cannot allocate %d rows of logits", k, k + 1);
    }
    for (int i = 0; i < k; i++) {
        sc->marks[i] = i + 1;
        if (engine_point_new(eng, &sc->points[i], e) < 0) {
            spec_free(sc);
            return herr_wrap(e, "--spec-mtp %d: a point for each draft", k);
        }
    }
    return 0;
}

void spec_free(spec_ctx *sc) {
    for (int i = 0; sc->points && i < sc->k; i++)
        if (sc->points[i]) engine_point_free(sc->eng, sc->points[i]);
    free(sc->points);
    free(sc->ids);
    free(sc->drafts);
    free(sc->marks);
    free(sc->logits);
    memset(sc, 0, sizeof *sc);
}

int spec_step(spec_ctx *sc, sampler *sm, int32_t last, int64_t n_out, int room, int32_t *out, herr *e) {
    const engine_info in = engine_get_info(sc->eng);
    const int64_t V = in.n_vocab, pos = engine_seq_pos(sc->eng, sc->seq);
    if (room < 1) return herr_set(e, "no room for a token");
    if (pos >= in.n_ctx) return herr_set(e, "the context of %" PRId64 " tokens is full", in.n_ctx);
    /* drafts: no more than the tokens still wanted after this step's own, nor the context holds */
    int k = sc->k;
    if (k > room - 1) k = room - 1;
    if (k > in.n_ctx - pos - 1) k = (int)(in.n_ctx - pos - 1);
    if (k > 0) {
        k = engine_mtp_draft(sc->eng, sc->seq, last, k, sc->drafts, NULL, e);
        if (k < 0) return -1;
        for (int i = 0; i < k && sc->replay; i++)
            if (n_out + i < sc->n_replay) sc->drafts[i] = sc->replay[n_out + i];
    }
    sc->ids[0] = last;
    memcpy(sc->ids + 1, sc->drafts, sizeof(int32_t) * (size_t)k);
    const engine_span sp = spec_verify_span(sc->seq, sc->ids, k, sc->marks, sc->points, sc->logits);
    if (engine_run(sc->eng, &sp, 1, e) < 0) return -1;
    int n = 0, j = 0; /* tokens made; drafts kept */
    for (int i = 0; i <= k; i++) {
        float *row = sc->logits + (size_t)i * (size_t)V;
        for (int t = 0; t < sc->n_mask; t++) row[sc->mask[t]] = -INFINITY;
        if (i == k) {
            out[n++] = sampler_sample(sm, row);
            break;
        }
        bool kept;
        out[n++] = sampler_sample_draft(sm, row, sc->drafts[i], &kept);
        if (!kept) break;
        j++;
    }
    sc->n_steps++;
    sc->n_drafted += k;
    sc->n_accepted += j;
    /* the sequence holds last and drafts 1..k; it keeps last and the first j: the point of mark j + 1 */
    if (j < k && !MUTANT("spec_no_restore") && engine_restore(sc->eng, sc->seq, sc->points[j], e) < 0) return -1;
    return n;
}
