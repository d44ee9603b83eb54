/* arena.h: the CPU engine's scratch: one block sized at open from the model, the rows a
 * pass can hold and the context (cpu_scratch_bound in forward.c adds up what each op
 * asks for), handed out by bumping an offset and given back by rewinding to a mark, so a
 * pass allocates nothing. Asking past the block is a broken bound, not a user's error:
 * it aborts with the sizes. */
#ifndef HEARTH_CPU_ARENA_H
#define HEARTH_CPU_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef struct cpu_arena {
    uint8_t *base;
    size_t size, used, high;  /* high: the most ever used (tests and bench report it) */
} cpu_arena;

#define ARENA_ALIGN 64
/* bytes an allocation of n takes in the arena (for the bounds) */
static inline size_t arena_round(size_t n) { return (n + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1); }

int cpu_arena_init(cpu_arena *a, size_t size);   /* -1 when the memory is not there */
void cpu_arena_free(cpu_arena *a);
void *cpu_arena_get(cpu_arena *a, size_t bytes);
static inline size_t cpu_arena_mark(const cpu_arena *a) { return a->used; }
static inline void cpu_arena_rewind(cpu_arena *a, size_t mark) { a->used = mark; }

#endif
