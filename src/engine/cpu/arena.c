/* arena.c: see arena.h. */
#include "engine/cpu/arena.h"
#include "base/util.h"

#include <stdlib.h>

int cpu_arena_init(cpu_arena *a, size_t size) {
    a->size = arena_round(size);
    a->used = a->high = 0;
    a->base = aligned_alloc(ARENA_ALIGN, a->size ? a->size : ARENA_ALIGN);
    return a->base ? 0 : -1;
}

void cpu_arena_free(cpu_arena *a) {
    free(a->base);
    a->base = NULL;
}

void *cpu_arena_get(cpu_arena *a, size_t bytes) {
    bytes = arena_round(bytes);
    if (bytes > a->size - a->used)
        HEARTH_DIE("scratch bound broken: %zu more bytes asked with %zu of %zu in use", bytes, a->used, a->size);
    void *p = a->base + a->used;
    a->used += bytes;
    if (a->used > a->high) a->high = a->used;
    return p;
}
