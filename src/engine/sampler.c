/* sampler.c: greedy and temperature sampling with top-k, top-p and min-p, in llama.cpp's way: in
 * the order a request names (llama-server's "samplers"), else in llama-server's default order. */
#include "engine/sampler.h"
#include "base/util.h"
#include "engine/mutant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>

void sampler_init(sampler *s, const sampler_opts *o, int64_t n_vocab) {
    s->o = *o;
    s->n_drawn = 0;
    s->n_vocab = n_vocab;
    s->cand = xmalloc(sizeof *s->cand * (size_t)n_vocab);
}

void sampler_free(sampler *s) {
    free(s->cand);
    s->cand = NULL;
}

int32_t sampler_argmax(const float *logits, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return (int32_t)best;
}

static int cand_cmp(const void *a, const void *b) {
    const struct sampler_cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

bool sampler_greedy(const sampler_opts *o) { return !(o->temp > 0) && (!o->ordered || strchr(o->order, 't')); }

/* llama-server's default --samplers, less the stages hearth refuses (penalties run before, on
 * the logits: sampler_penalize; dry, top_n_sigma, typ_p and xtc are refused when asked for) */
static const char DEFAULT_ORDER[] = "kpmt";

/* llama.cpp's stages in the given order, on logits (cand[].p holds a logit): the candidates
 * left are cand[0, n), n returned */
static int64_t stages(sampler *s, const float *logits, const char *order) {
    const int64_t V = s->n_vocab;
    int64_t n = V;
    bool sorted = false;
    for (int64_t i = 0; i < V; i++) s->cand[i] = (struct sampler_cand){(int32_t)i, logits[i]};
    for (const char *c = order; *c; c++) {
        if ((*c == 'k' && s->o.top_k > 0 && s->o.top_k < n) || (*c == 'p' && s->o.top_p < 1)) {
            if (!sorted) qsort(s->cand, (size_t)n, sizeof *s->cand, cand_cmp);
            sorted = true;
        }
        if (*c == 'k' && s->o.top_k > 0 && s->o.top_k < n) {
            n = s->o.top_k;
        } else if (*c == 'p' && s->o.top_p < 1) { /* the smallest head whose probability reaches top_p */
            double sum = 0, acc = 0;
            for (int64_t i = 0; i < n; i++) sum += exp((double)s->cand[i].p - s->cand[0].p);
            int64_t k = 0;
            while (k < n) {
                acc += exp((double)s->cand[k++].p - s->cand[0].p) / sum;
                if (acc >= s->o.top_p) break;
            }
            n = k;
        } else if (*c == 'm' && s->o.min_p > 0) { /* p >= min_p * max p: logit >= max + log(min_p) */
            float mx = s->cand[0].p;
            for (int64_t i = 1; i < n; i++) mx = s->cand[i].p > mx ? s->cand[i].p : mx;
            const float lo = mx + logf(s->o.min_p);
            int64_t k = 0;
            for (int64_t i = 0; i < n; i++)
                if (s->cand[i].p >= lo) s->cand[k++] = s->cand[i];
            n = k;
        } else if (*c == 't' && !(s->o.temp > 0)) { /* only the best (ties: the first, the lowest id) */
            int64_t b = 0;
            for (int64_t i = 1; i < n; i++)
                if (s->cand[i].p > s->cand[b].p) b = i;
            s->cand[0] = s->cand[b];
            n = 1;
        } else if (*c == 't') {
            for (int64_t i = 0; i < n; i++) s->cand[i].p /= s->o.temp;
        }
    }
    return n;
}

/* a uniform draw in [0, 1): the RNG is counter-based (seed, n_drawn) */
static double draw(sampler *s) { return (double)(rng_at(s->o.seed, s->n_drawn++) >> 11) * (1.0 / 9007199254740992.0); }

static int32_t sample_ordered(sampler *s, const float *logits, const char *order) {
    const int64_t n = stages(s, logits, order);
    float mx = s->cand[0].p;
    for (int64_t i = 1; i < n; i++) mx = s->cand[i].p > mx ? s->cand[i].p : mx;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += exp((double)s->cand[i].p - mx);
    double r = draw(s) * sum;
    double acc = 0;
    for (int64_t i = 0; i < n; i++) {
        acc += exp((double)s->cand[i].p - mx);
        if (r < acc) return s->cand[i].id;
    }
    return s->cand[n - 1].id;
}

int32_t sampler_sample(sampler *s, const float *logits) {
    if (sampler_greedy(&s->o)) return sampler_argmax(logits, s->n_vocab); /* every stage keeps the best */
    return sample_ordered(s, logits, s->o.ordered ? s->o.order : DEFAULT_ORDER);
}

int32_t sampler_sample_draft(sampler *s, const float *logits, int32_t d, bool *accepted) {
    if (sampler_greedy(&s->o)) {
        const int32_t b = sampler_argmax(logits, s->n_vocab);
        *accepted = b == d;
        return b;
    }
    const int64_t n = stages(s, logits, s->o.ordered ? s->o.order : DEFAULT_ORDER);
    float mx = s->cand[0].p;
    for (int64_t i = 1; i < n; i++) mx = s->cand[i].p > mx ? s->cand[i].p : mx;
    double sum = 0, wd = 0;
    for (int64_t i = 0; i < n; i++) {
        const double w = exp((double)s->cand[i].p - mx);
        sum += w;
        if (s->cand[i].id == d) wd = w;
    }
    /* keep d with probability p(d) = wd / sum */
    if (draw(s) * sum < wd) {
        *accepted = true;
        return d;
    }
    *accepted = false;
    /* p without d, renormalized: the rest's weights, sum - wd of them (> 0 here: p(d) < 1) */
    const double r = draw(s) * (MUTANT("spec_residual_keeps_d") ? sum : sum - wd);
    double acc = 0;
    int64_t last = -1;
    for (int64_t i = 0; i < n; i++) {
        if (s->cand[i].id == d && !MUTANT("spec_residual_keeps_d")) continue;
        acc += exp((double)s->cand[i].p - mx);
        last = i;
        if (r < acc) return s->cand[i].id;
    }
    return s->cand[last].id; /* (acc short of r by rounding only) */
}

static int id_cmp(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

bool sampler_penalizes(const sampler_opts *o) {
    const bool rep = o->repeat_penalty > 0 && o->repeat_penalty != 1;
    return o->repeat_last_n > 0 && (rep || o->presence_penalty != 0 || o->frequency_penalty != 0);
}

void sampler_penalize(const sampler_opts *o, float *logits, const int32_t *hist, int64_t n_hist) {
    const bool rep = o->repeat_penalty > 0 && o->repeat_penalty != 1;
    if (!sampler_penalizes(o)) return;
    const int64_t n = n_hist < o->repeat_last_n ? n_hist : o->repeat_last_n;
    if (n <= 0) return;
    int32_t *w = xmalloc(sizeof(int32_t) * (size_t)n);
    memcpy(w, hist + n_hist - n, sizeof(int32_t) * (size_t)n);
    qsort(w, (size_t)n, sizeof *w, id_cmp);
    for (int64_t i = 0; i < n;) { /* each distinct id once, with its count */
        int64_t j = i;
        while (j < n && w[j] == w[i]) j++;
        float *l = &logits[w[i]];
        if (rep) *l = *l > 0 ? *l / o->repeat_penalty : *l * o->repeat_penalty;
        *l -= (float)(j - i) * o->frequency_penalty + o->presence_penalty;
        i = j;
    }
    free(w);
}
