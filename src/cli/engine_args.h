/* engine_args.h: the flags that run, bench (and serve) share for the engine: the device
 * and marks given as prompt positions. Errors are printed as "hearth CMD: ..." and name
 * the flag; false means exit 2. */
#ifndef HEARTH_CLI_ENGINE_ARGS_H
#define HEARTH_CLI_ENGINE_ARGS_H

#include <stdbool.h>
#include <stdint.h>
#include "engine/engine.h"

bool cli_device_value(const char *v, engine_device *out); /* false when v is none of cpu, cuda, auto */
/* the same as an args.h ARG_FN parser: ARG_FN("--device", NULL, &dev, cli_parse_device, ...) */
int cli_parse_device(const char *v, void *dst, herr *e);
/* "m1,m2,..." -> positions, each in [1, n_prompt], strictly ascending; *out is malloc'd */
bool cli_marks(const char *v, int64_t n_prompt, int64_t **out, int64_t *n, const char *cmd);

#endif
