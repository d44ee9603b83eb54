/* test_sampler.c: src/engine/sampler.c. Without a request's "samplers", the stages run in
 * llama-server's default order (its --samplers: penalties, dry, top_n_sigma, top_k, typ_p,
 * top_p, min_p, xtc, temperature; the ones hearth has: top_k, top_p, min_p, then the
 * temperature), so the cuts are made on the logits before the temperature spreads them:
 * a token min_p or top_p cuts at temperature 1 is never drawn, whatever the temperature. */
#include "harness.h"
#include "engine/sampler.h"

#include <math.h>

#define V 64
#define DRAWS 4000

/* logits falling by 0.25 a token: token i has p_i / p_0 = e^(-i/4) */
static void ramp(float *lg) {
    for (int i = 0; i < V; i++) lg[i] = 3.0f - 0.25f * (float)i;
}

/* the tokens drawn (DRAWS draws, one sampler) into hist[V] */
static void draws(const sampler_opts *o, const float *lg, int *hist) {
    sampler s;
    sampler_init(&s, o, V);
    memset(hist, 0, sizeof(int) * V);
    for (int k = 0; k < DRAWS; k++) hist[sampler_sample(&s, lg)]++;
    sampler_free(&s);
}

TEST(default_order_is_llama_servers) {
    float lg[V];
    ramp(lg);
    int hist[V];
    /* min_p 0.5 on the logits: e^(-i/4) >= 0.5 keeps i <= 2 (4 ln 2 = 2.77). Temperature 4
     * first would keep e^(-i/16) >= 0.5: i <= 11. */
    sampler_opts o = {.temp = 4, .min_p = 0.5f, .top_p = 1, .seed = 7};
    draws(&o, lg, hist);
    int past = 0, kept = 0;
    for (int i = 0; i < V; i++) {
        if (i > 2) past += hist[i];
        kept += i <= 2 && hist[i] > 0;
    }
    CHECK_MSG(past == 0 && kept == 3, "min_p before the temperature: %d of %d draws past token 2, %d of 3 kept drawn",
              past, DRAWS, kept);
    /* top_p 0.5 on the logits: the head reaching half the mass at temperature 1; the
     * temperature (8) then evens out what is left, so each kept token comes up often */
    double sum = 0, acc = 0;
    for (int i = 0; i < V; i++) sum += exp(lg[i] - lg[0]);
    int head = 0;
    while (head < V && (acc += exp(lg[head] - lg[0]) / sum) < 0.5) head++;
    o = (sampler_opts){.temp = 8, .top_p = 0.5f, .seed = 11};
    draws(&o, lg, hist);
    past = 0;
    for (int i = head + 1; i < V; i++) past += hist[i];
    CHECK_MSG(past == 0 && hist[head] > DRAWS / (2 * (head + 1)),
              "top_p before the temperature: %d draws past token %d, %d of it", past, head, hist[head]);
    /* top_k, top_p, min_p, temperature named in that order: the same draws, one by one */
    sampler_opts d = {.temp = 1.5f, .top_k = 20, .top_p = 0.9f, .min_p = 0.05f, .seed = 3};
    sampler_opts n = d;
    n.ordered = true;
    memcpy(n.order, "kpmt", 5);
    sampler a, b;
    sampler_init(&a, &d, V);
    sampler_init(&b, &n, V);
    int differ = 0;
    for (int k = 0; k < DRAWS; k++) differ += sampler_sample(&a, lg) != sampler_sample(&b, lg);
    sampler_free(&a);
    sampler_free(&b);
    CHECK_MSG(differ == 0, "the default order and samplers [top_k, top_p, min_p, temperature]: %d of %d draws differ",
              differ, DRAWS);
}

TEST(greedy_and_named_orders) {
    float lg[V];
    ramp(lg);
    lg[9] = lg[0]; /* a tie: the lowest id */
    sampler_opts o = {.temp = 0, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .seed = 1};
    sampler s;
    sampler_init(&s, &o, V);
    CHECK(sampler_greedy(&o) && sampler_sample(&s, lg) == 0);
    sampler_free(&s);
    /* a named order with the temperature first: min_p then cuts the spread logits (more kept) */
    ramp(lg);
    int hist[V];
    o = (sampler_opts){.temp = 4, .min_p = 0.5f, .top_p = 1, .seed = 7, .ordered = true};
    memcpy(o.order, "tm", 3);
    draws(&o, lg, hist);
    int past = 0;
    for (int i = 3; i < V; i++) past += hist[i];
    CHECK_MSG(past > 0, "samplers [temperature, min_p]: the cut after the temperature keeps more (%d past token 2)", past);
}

int main(void) {
    RUN(default_order_is_llama_servers);
    RUN(greedy_and_named_orders);
    return harness_done();
}
