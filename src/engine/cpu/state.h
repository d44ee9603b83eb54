/* state.h: the CPU engine's sequences: per sequence, the attention layers' KV rows (n_ctx
 * rows, f32 or f16, allocated at open; pages are touched only as rows are written), the
 * GDN layers' lanes and rings; and the copies between them and points or KV ranges. */
#ifndef HEARTH_CPU_STATE_H
#define HEARTH_CPU_STATE_H

#include "engine/engine.h"

typedef struct cpu_seq {
    void *k[MODEL_MAX_LAYERS], *v[MODEL_MAX_LAYERS];  /* attention: (n_ctx, Hkv*D) f32 or f16 */
    float *lane[MODEL_MAX_LAYERS];                    /* GDN: (Gv, S, S), rows = key dim */
    float *ring[MODEL_MAX_LAYERS];                    /* GDN: (d_conv-1, conv_dim) pre-conv rows, oldest first */
} cpu_seq;

/* n sequences of n_ctx rows; -1 (naming -c and -np) when the memory is not there */
int cpu_state_new(cpu_seq **out, const model_hparams *hp, int n, int64_t n_ctx, bool kv_f16, herr *e);
void cpu_state_free(cpu_seq *s, int n, const model_hparams *hp);
void cpu_state_zero(cpu_seq *s, const model_hparams *hp);                 /* lanes and rings to 0 */
void cpu_state_copy(cpu_seq *s, const model_hparams *hp, engine_point *p, bool to_point);
/* KV rows [a, b): every attention layer's K rows then V rows, packed */
void cpu_state_kv(cpu_seq *s, const model_hparams *hp, bool kv_f16, int64_t a, int64_t b, void *data, bool to_data);

#endif
