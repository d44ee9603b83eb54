/* state.c: see state.h. */
#include "engine/cpu/state.h"
#include "engine/mutant.h"

#include <stdlib.h>
#include <string.h>

static size_t kv_row_bytes(const model_hparams *hp, bool kv_f16) {
    return (size_t)(hp->n_head_kv * hp->head_dim) * (kv_f16 ? 2 : 4);
}

/* the layers whose state a sequence holds: the trunk's, and the MTP block's (its KV rows) */
static int n_layers_held(const cpu_seq *s, const model_hparams *hp) { return (int)hp->n_layer + (s->mtp_h != NULL); }

int cpu_state_new(cpu_seq **out, const model_hparams *hp, int n, int64_t n_ctx, bool kv_f16, bool mtp, herr *e) {
    cpu_seq *s = xcalloc((size_t)n, sizeof *s);
    const size_t row = kv_row_bytes(hp, kv_f16);
    const size_t lane = (size_t)(hp->ssm_dt_rank * hp->ssm_d_state * hp->ssm_d_state);
    const size_t ring = (size_t)((hp->ssm_d_conv - 1) * hp_conv_dim(hp));
    for (int i = 0; i < n && mtp; i++) {
        s[i].mtp_h = calloc((size_t)hp->n_embd, sizeof(float));
        s[i].mtp_rows = calloc((size_t)(CPU_MTP_KEEP * hp->n_embd), sizeof(float));
        if (!s[i].mtp_h || !s[i].mtp_rows) {
            cpu_state_free(s, n, hp);
            return herr_set(e, "cannot allocate the MTP block's rows for %d sequences: lower -np", n);
        }
    }
    for (int i = 0; i < n; i++)
        for (int il = 0; il < n_layers_held(&s[i], hp); il++) {
            bool ok;
            if (hp->is_recurrent[il]) {
                s[i].lane[il] = calloc(lane, sizeof(float));
                s[i].ring[il] = calloc(ring, sizeof(float));
                ok = s[i].lane[il] && s[i].ring[il];
            } else {
                s[i].k[il] = malloc(row * (size_t)n_ctx);
                s[i].v[il] = malloc(row * (size_t)n_ctx);
                ok = s[i].k[il] && s[i].v[il];
            }
            if (!ok) {
                cpu_state_free(s, n, hp);
                return herr_set(e, "cannot allocate %d sequences of %lld tokens (%.1f MiB of KV rows each): lower -c or -np", n,
                                (long long)n_ctx, (double)row * 2.0 * (double)n_ctx * (double)hp->n_layer / (1 << 20));
            }
        }
    *out = s;
    return 0;
}

void cpu_state_free(cpu_seq *s, int n, const model_hparams *hp) {
    if (!s) return;
    for (int i = 0; i < n; i++) {
        for (int il = 0; il < n_layers_held(&s[i], hp); il++) {
            free(s[i].k[il]);
            free(s[i].v[il]);
            free(s[i].lane[il]);
            free(s[i].ring[il]);
        }
        free(s[i].mtp_h);
        free(s[i].mtp_rows);
    }
    free(s);
}

void cpu_state_zero(cpu_seq *s, const model_hparams *hp) {
    const size_t lane = (size_t)(hp->ssm_dt_rank * hp->ssm_d_state * hp->ssm_d_state);
    const size_t ring = (size_t)((hp->ssm_d_conv - 1) * hp_conv_dim(hp));
    for (int il = 0; il < hp->n_layer; il++)
        if (hp->is_recurrent[il]) {
            memset(s->lane[il], 0, lane * sizeof(float));
            memset(s->ring[il], 0, ring * sizeof(float));
        }
    if (s->mtp_h) memset(s->mtp_h, 0, sizeof(float) * (size_t)hp->n_embd);
    s->mtp_n = 0;
}

void cpu_state_copy(cpu_seq *s, const model_hparams *hp, engine_point *p, bool to_point) {
    int64_t g = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        if (!hp->is_recurrent[il]) continue;
        float *pl = p->lanes + (size_t)g * p->lane_floats, *pr = p->rings + (size_t)g * p->ring_floats;
        g++;
        if (to_point) {
            memcpy(pl, s->lane[il], sizeof(float) * p->lane_floats);
            memcpy(pr, s->ring[il], sizeof(float) * p->ring_floats);
        } else {
            memcpy(s->lane[il], pl, sizeof(float) * p->lane_floats);
            if (!MUTANT("restore_ring_skip")) /* mutant: restore copies the lanes, not the rings */
                memcpy(s->ring[il], pr, sizeof(float) * p->ring_floats);
        }
    }
}

void cpu_state_kv(cpu_seq *s, const model_hparams *hp, bool kv_f16, int64_t a, int64_t b, void *data, bool to_data) {
    const size_t row = kv_row_bytes(hp, kv_f16), n = row * (size_t)(b - a);
    uint8_t *d = data;
    for (int il = 0; il < n_layers_held(s, hp); il++) {
        if (il < hp->n_layer && hp->is_recurrent[il]) continue;
        uint8_t *k = (uint8_t *)s->k[il] + row * (size_t)a, *v = (uint8_t *)s->v[il] + row * (size_t)a;
        if (to_data) {
            memcpy(d, k, n);
            memcpy(d + n, v, n);
        } else {
            memcpy(k, d, n);
            memcpy(v, d + n, n);
        }
        d += 2 * n;
    }
}
