/* mutant.h: planted defects for the gates (DESIGN.md invariant 7). They exist only in the
 * test build (-DHEARTH_MUTANTS, the library the gates link): there MUTANT(name) is true
 * when HEARTH_MUTANT=name is in the environment. In the binary users run every MUTANT(...)
 * is the constant false and the defects are compiled out. tests/gates/mutants shows each
 * gate red under each of its mutants. Call sites sit outside inner loops. */
#ifndef HEARTH_MUTANT_H
#define HEARTH_MUTANT_H

#include <stdbool.h>

#ifdef HEARTH_MUTANTS
bool mutant_on(const char *name);
#define MUTANT(name) mutant_on(name)
#else
#define MUTANT(name) ((void)(name), false)
#endif

#endif
