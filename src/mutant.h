/* mutant.h: planted defects for the gates (DESIGN.md invariant 5). A mutant is compiled in
 * everywhere and switched on by name with HEARTH_MUTANT=name in the environment; with the
 * variable unset every MUTANT(...) is false. tests/gates/mutants shows each gate red under
 * each of its mutants. Call sites sit outside inner loops: the check is a cached compare. */
#ifndef HEARTH_MUTANT_H
#define HEARTH_MUTANT_H

#include <stdbool.h>

bool mutant_on(const char *name);
#define MUTANT(name) mutant_on(name)

#endif
