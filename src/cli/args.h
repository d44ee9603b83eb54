/* args.h: strict parsing of numeric flags for the subcommands: a value that is not a
 * whole number in range is an error naming the flag, never a silent 0. */
#ifndef HEARTH_ARGS_H
#define HEARTH_ARGS_H

#include <stdbool.h>
#include <stdint.h>

bool arg_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out, const char *cmd);
bool arg_f32(const char *flag, const char *s, float lo, float hi, float *out, const char *cmd);
/* "1,2,3" -> ids; false with a message on a bad element. *out is malloc'd. */
bool arg_id_list(const char *flag, const char *s, int32_t **out, int64_t *n, const char *cmd);

#endif
