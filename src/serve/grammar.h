/* grammar.h: grammar-constrained sampling. A GBNF grammar (llama.cpp's notation: rules
 * `name ::= alternatives`, literals, [character classes], ., ( ), * + ? {m,n}, # comments)
 * compiled to byte-level rules (classes over code points become UTF-8 byte sequences), and
 * a matcher that runs them as a pushdown automaton over bytes: its state is a set of
 * stacks (each a position in a rule and the positions it returns to), hash-consed, and
 * every set met is a state of a DFA built lazily (a state's 256 transitions computed on
 * first use), so a byte already seen from a state costs one table read.
 *
 * The vocabulary side (gvocab) is built once per vocabulary: every token's bytes in a trie
 * laid out in preorder, so a walk takes a trie node a transition, skips a whole subtree at
 * the first byte the grammar refuses, and takes one whole where every byte class below it
 * leaves the state unchanged. A mask comes from a position cache (grammar.c): per stack
 * top, the tokens it accepts or refuses whatever lies below are found once by one walk
 * and shared through the gvocab by every request whose grammar holds the same rules; only
 * the tokens that run past the top's rule are walked against the whole state. Masks are
 * also cached per DFA state. Worst case a mask: about three walks of the trie. Entries can
 * be made before any request (gvocab_prime: the server primes JSON's and tool calls' at
 * start-up, schema_prime), so a first request finds its free-text tops' made too.
 *
 * Limits: no left recursion (refused by name at compile time, as is a rule that repeats
 * the empty string); at most GRAMMAR_MAX_ELEMS elements; a matcher whose tables outgrow
 * their caps rebuilds them from its current stacks, and one whose stacks outgrow
 * GMATCH_MAX_STACKS (an ambiguous grammar) fails the request with a message. */
#ifndef HEARTH_SERVE_GRAMMAR_H
#define HEARTH_SERVE_GRAMMAR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"
#include "text/tokenizer.h"

#define GRAMMAR_MAX_TEXT (1 << 20)   /* bytes of GBNF text */
#define GRAMMAR_MAX_ELEMS (1 << 20)  /* compiled elements */
#define GRAMMAR_MAX_REPEAT 10000     /* {m,n} bounds */
#define GMATCH_MAX_STACKS 4096       /* stacks one state may hold */

typedef struct grammar grammar;   /* compiled, immutable: share it between matchers */
typedef struct gvocab gvocab;     /* a vocabulary's token bytes and trie (immutable), and the position
                                   * entries its matchers share (behind a mutex) */
typedef struct gmatch gmatch;     /* one generation's state over a grammar */

/* Compiles GBNF text[0..len) whose start rule is "root". NULL with e naming the rule, line
 * and column of what is wrong. */
grammar *grammar_parse(const char *text, size_t len, herr *e);
void grammar_free(grammar *g);
int32_t grammar_n_rules(const grammar *g);

/* The vocabulary of t: each token's bytes as the streaming decoder renders them without
 * control tokens (tokenizer_piece(id, false)); tokens with no bytes are never allowed by
 * a grammar but for the end-of-generation ones, allowed where the grammar is complete. */
gvocab *gvocab_new(const tokenizer *t);
/* The same from explicit pieces (tests and benchmarks): pieces[i][0..lens[i]), eog[i]. */
gvocab *gvocab_from(int32_t n, const char *const *pieces, const size_t *lens, const bool *eog);
void gvocab_free(gvocab *v);
int32_t gvocab_n(const gvocab *v);
/* token id's bytes as the vocabulary holds them (*len set) */
const char *gvocab_piece(const gvocab *v, int32_t id, size_t *len);
int64_t gvocab_trie_nodes(const gvocab *v);

/* A matcher at the grammar's start (NULL with e set when even the start is too ambiguous). */
gmatch *gmatch_new(const grammar *g, const gvocab *v, herr *e);
void gmatch_free(gmatch *m);
/* Advances over bytes s[0..n): 0, or -1 (state unchanged) when the grammar refuses them. */
int gmatch_bytes(gmatch *m, const char *s, size_t n);
/* Advances over a token: an end-of-generation token where the grammar is complete ends it
 * (gmatch_ended); -1 (state unchanged) when the grammar refuses the token. */
int gmatch_token(gmatch *m, int32_t id);
/* Whether the token would be taken (no state change). */
bool gmatch_token_ok(gmatch *m, int32_t id);
/* The grammar is complete here (an end-of-generation token may come). */
bool gmatch_complete(const gmatch *m);
bool gmatch_ended(const gmatch *m);
/* The allowed tokens as bits (bit i of bits[i / 64]); (n_vocab + 63) / 64 words. Returns
 * the count allowed, or -1 with e set when the state grew past its caps. The bits stay
 * valid until the next call on m. */
int64_t gmatch_mask(gmatch *m, const uint64_t **bits, herr *e);
/* logits[i] = -INFINITY for every token the grammar refuses; the count allowed (or -1). */
int64_t gmatch_apply(gmatch *m, float *logits, herr *e);
/* The same for bits from gmatch_mask (8 logits a step where the CPU has AVX2). */
void gmatch_apply_bits(const uint64_t *bits, float *logits, int32_t n_vocab);

/* Counters for benchmarks: DFA states and stack nodes made, masks walked and served from
 * the cache, trie nodes visited by the walks. */
typedef struct gmatch_stats {
    int64_t states, nodes, masks_walked, masks_cached, trie_visits, rebuilds;
    int64_t masks_whole;    /* masks made by walking the whole trie (no position entries) */
    int64_t entries;        /* position entries made (grammar.c: the position cache) */
    int64_t entry_visits;   /* trie nodes their abstract walks visited */
    int64_t entries_shared; /* entries found made in the vocabulary's table */
    int64_t transitions;    /* DFA transitions computed (each once) */
} gmatch_stats;
gmatch_stats gmatch_get_stats(const gmatch *m);

/* Tests and benchmarks: every mask a whole walk of the trie from the state (the path the
 * position cache replaces; the same bits). */
void gmatch_set_whole_walks(gmatch *m, bool on);
/* Tests: a planted defect in the position cache, to see the mask comparison go red:
 * 1 its context-dependent tokens refused unchecked, 2 accepted unchecked; 0 none. */
void gmatch_plant_defect(gmatch *m, int defect);
/* Benchmarks: position entries taken from and given to the vocabulary's shared table (the
 * default), or made by this matcher alone (a request's first masks as on a fresh server). */
void gmatch_set_share(gmatch *m, bool on);
/* Benchmarks: entries taken from the vocabulary's primed ones only (gvocab_prime), none
 * given to its table (a grammar's first request on a server that primed at start-up). */
void gmatch_set_share_primed(gmatch *m);

/* Priming, once per vocabulary (at start-up): the position entries of every stack top of
 * the states g reaches, breadth first over bytes from its start, within max_states states,
 * made and pinned in v's shared table (never emptied, at most 2,048 entries and 64 MiB), so
 * a later request whose grammar holds the same rules (JSON's string, a tool call's text)
 * finds them made instead of walking the trie for them. 0, or -1 when g's start is too
 * ambiguous. Counts added to *ps (may be NULL). It ends early once *stop is set (stop may be
 * NULL). Safe beside matchers of v (the table's mutex), though meant to run before them. */
typedef struct gvocab_prime_stats {
    int64_t states;         /* DFA states whose stacks were primed */
    int64_t entries;        /* entries made (and pinned) */
    int64_t found;          /* entries found pinned already (by an earlier grammar) */
    int64_t visits;         /* trie nodes the entries' walks visited */
    bool full;              /* the pinned entries reached their caps: priming stopped */
} gvocab_prime_stats;
int gvocab_prime(gvocab *v, const grammar *g, int32_t max_states, const atomic_bool *stop, gvocab_prime_stats *ps);
/* The pinned entries' count, and their bytes into *bytes (may be NULL). */
int64_t gvocab_primed(const gvocab *v, int64_t *bytes);
/* The trie's and the token pieces' bytes (pinned entries apart). */
int64_t gvocab_bytes(const gvocab *v);

/* The bytes of GBNF string-literal text for s[0..n) (quotes not included): a new string. */
char *gbnf_escape(const char *s, size_t n);

#endif
