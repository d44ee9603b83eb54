/* mutant.c: reads HEARTH_MUTANT once (test build only; see mutant.h). */
#include "engine/mutant.h"

#ifdef HEARTH_MUTANTS
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const char *active;

static void read_env(void) {
    const char *v = getenv("HEARTH_MUTANT");
    active = (v && *v) ? v : NULL;
}

bool mutant_on(const char *name) {
    pthread_once(&once, read_env);
    return active && strcmp(active, name) == 0;
}
#else
typedef int mutant_c_is_empty_in_the_shipped_build;
#endif
