/* state.h: the CPU engine's sequences: per sequence, the attention layers' KV rows (n_ctx
 * rows, f32 or f16, allocated at open; pages are touched only as rows are written), the
 * GDN layers' lanes and rings; and the copies between them and points or KV ranges. */
#ifndef HEARTH_CPU_STATE_H
#define HEARTH_CPU_STATE_H

#include "engine/engine.h"

/* rows of the trunk's last hidden state a sequence keeps from its last pass (the MTP
 * block's input after a verify pass's accepted rows: at least the most drafts + 1) */
#define CPU_MTP_KEEP 16

typedef struct cpu_seq {
    void *k[MODEL_MAX_LAYERS], *v[MODEL_MAX_LAYERS];  /* attention: (n_ctx, Hkv*D) f32 or f16; with
                                                       * the MTP block, its layer's (index n_layer) too */
    float *lane[MODEL_MAX_LAYERS];                    /* GDN: (Gv, S, S), rows = key dim */
    float *ring[MODEL_MAX_LAYERS];                    /* GDN: (d_conv-1, conv_dim) pre-conv rows, oldest first */
    /* MTP (engine_opts.mtp): h, the trunk's last row after output_norm (E floats; zeros at
     * position 0 or when unknown), and the last CPU_MTP_KEEP rows' h of the last pass, the
     * first at position h_pos0 */
    float *mtp_h;
    float *mtp_rows;
    int64_t mtp_pos0, mtp_n;
} cpu_seq;

/* n sequences of n_ctx rows (with the MTP block's KV rows and h where mtp); -1 (naming -c and
 * -np) when the memory is not there */
int cpu_state_new(cpu_seq **out, const model_hparams *hp, int n, int64_t n_ctx, bool kv_f16, bool mtp, herr *e);
void cpu_state_free(cpu_seq *s, int n, const model_hparams *hp);
void cpu_state_zero(cpu_seq *s, const model_hparams *hp);                 /* lanes, rings and h to 0 */
void cpu_state_copy(cpu_seq *s, const model_hparams *hp, engine_point *p, bool to_point);
/* KV rows [a, b): every attention layer's K rows then V rows, packed (the MTP block's last) */
void cpu_state_kv(cpu_seq *s, const model_hparams *hp, bool kv_f16, int64_t a, int64_t b, void *data, bool to_data);

#endif
