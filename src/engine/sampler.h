/* sampler.h: picks the next token from a logits row: greedy when temperature is 0 (ties go
 * to the lowest id), else top-k, top-p, min-p and temperature (llama-server's default order)
 * with a seeded RNG, so the same seed and logits give the same token on every machine. */
#ifndef HEARTH_SAMPLER_H
#define HEARTH_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

typedef struct sampler_opts {
    float temp;         /* 0 = greedy */
    int32_t top_k;      /* 0 = off */
    float top_p;        /* 1 = off */
    float min_p;        /* 0 = off */
    uint64_t seed;
    /* penalties over the last repeat_last_n ids of the context (sampler_penalize) */
    float repeat_penalty;     /* 1 (or 0) = off: a logit > 0 is divided by it, one < 0 multiplied */
    int32_t repeat_last_n;    /* 0 = off */
    float presence_penalty;   /* subtracted once from the logit of every id present */
    float frequency_penalty;  /* subtracted per occurrence */
    /* llama-server's "samplers": when ordered, the stages run in llama.cpp's way in this
     * order ('k' top_k, 'p' top_p, 'm' min_p, 't' temperature; a stage left out is not run,
     * so without 't' the draw is at temperature 1), each on the logits the stages before
     * it left; else llama-server's default order: top-k, top-p, min-p, then the temperature */
    bool ordered;
    char order[5];
} sampler_opts;

typedef struct sampler {
    sampler_opts o;
    uint64_t n_drawn;   /* draws so far: the RNG is counter-based (seed, n_drawn) */
    int64_t n_vocab;
    struct sampler_cand { int32_t id; float p; } *cand;
} sampler;

void sampler_init(sampler *s, const sampler_opts *o, int64_t n_vocab);
void sampler_free(sampler *s);
int32_t sampler_sample(sampler *s, const float *logits);
/* Speculative sampling of a draft d that had all the draft's mass (greedy drafts): keeps d
 * with probability p(d) under the distribution sampler_sample draws from (its stages on
 * logits), else draws from p without d, renormalized: so the token returned is distributed
 * as sampler_sample's (Leviathan et al. 2023 with q = delta(d)). Greedy: the argmax, d kept
 * where it is the argmax. *accepted: the token returned is d. */
int32_t sampler_sample_draft(sampler *s, const float *logits, int32_t d, bool *accepted);
/* whether sampler_sample is the argmax (of the penalized logits) under o */
bool sampler_greedy(const sampler_opts *o);
int32_t sampler_argmax(const float *logits, int64_t n);
/* whether sampler_penalize changes any logit under o (for some history) */
bool sampler_penalizes(const sampler_opts *o);
/* llama.cpp's repeat, presence and frequency penalties, in place, over the last
 * o->repeat_last_n of hist[0, n_hist) (the prompt and what was generated). */
void sampler_penalize(const sampler_opts *o, float *logits, const int32_t *hist, int64_t n_hist);

#endif
