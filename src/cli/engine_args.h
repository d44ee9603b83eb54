/* engine_args.h: the flags that run, bench (and serve) share for the engine: the device
 * and marks given as prompt positions. Errors are printed as "hearth CMD: ..." and name
 * the flag; false means exit 2. */
#ifndef HEARTH_CLI_ENGINE_ARGS_H
#define HEARTH_CLI_ENGINE_ARGS_H

#include <stdbool.h>
#include <stdint.h>
#include "engine/engine.h"

bool cli_device(const char *v, engine_device *out, const char *cmd);
/* "m1,m2,..." -> positions, each in [1, n_prompt], strictly ascending; *out is malloc'd */
bool cli_marks(const char *v, int64_t n_prompt, int64_t **out, int64_t *n, const char *cmd);

#endif
