/* spec.h: speculative decoding with the model's MTP block, over engine.h alone (docs/DESIGN.md
 * "Speculative decoding"). A step drafts k tokens after the last one (engine_mtp_draft),
 * runs the last token and the drafts as one span anchored at every row (so each row's logits
 * are a decode step's bits) and marked at rows 1..k, keeps the drafts the sampler accepts
 * (sampler_sample_draft) and the sampler's own token after them, and restores the point
 * after the last row kept. Nothing is run twice. Greedy, the tokens are the plain decode's
 * bit for bit; sampled, they are distributed as its are. */
#ifndef HEARTH_SPEC_H
#define HEARTH_SPEC_H

#include "engine/engine.h"
#include "engine/sampler.h"

/* drafts a step, at most: the block's input after a restore is the verify pass's own row
 * while the CPU engine keeps it (CPU_MTP_KEEP rows), and past a few drafts acceptance falls */
#define SPEC_MAX 8

typedef struct spec_ctx {
    engine *eng;
    int seq;
    int k;                      /* drafts a step, at most */
    engine_point **points;      /* k: marks 1..k */
    int32_t *ids, *drafts;      /* k + 1, k */
    int64_t *marks;             /* k: 1..k, also the anchors */
    float *logits;              /* (k + 1) x V */
    const int32_t *mask;        /* ids whose logits are -inf before sampling (--ignore-eos), n_mask */
    int n_mask;
    const int32_t *replay;      /* drafts from here (the expected output, by output index) instead of
                                 * the block's: forced acceptance for benchmarks and tests */
    int64_t n_replay;
    int64_t n_steps, n_drafted, n_accepted;
} spec_ctx;

/* The verify span of a step: ids [last, d_1 .. d_k] of sequence seq, anchored at rows 1..k (each
 * row a decode step's bits) and marked there (marks = 1..k; points[i] the state after row i),
 * every row's logits into logits ((k + 1) x V). spec_step's and the server's (sched.c) alike. */
engine_span spec_verify_span(int seq, const int32_t *ids, int k, const int64_t *marks, engine_point *const *points, float *logits);

/* k drafts a step (1..SPEC_MAX); the engine opened with mtp */
int spec_init(spec_ctx *sc, engine *eng, int seq, int k, herr *e);
void spec_free(spec_ctx *sc);
/* One step from `last`, the token the sampler gave last (output index n_out - 1, not yet run):
 * writes to out the tokens it makes, the accepted drafts then the sampler's token (1 .. k + 1,
 * at most `room`), and returns how many (-1 with e set: nothing is lost, the sequence holds
 * what it held). The sequence then holds last and the accepted drafts; out's last token is
 * the next step's `last`. */
int spec_step(spec_ctx *sc, sampler *sm, int32_t last, int64_t n_out, int room, int32_t *out, herr *e);

#endif
