/* debug.h: introspection for the engine's own tests (not for the server): which experts
 * each row chose. Backends fill it where they route. */
#ifndef HEARTH_ENGINE_DEBUG_H
#define HEARTH_ENGINE_DEBUG_H

#include "engine/engine.h"

/* While set, every engine_run writes the experts chosen for each of its rows (in span
 * order, all rows of the call) and layer: (rows, n_layer, K) int32. NULL stops it. */
void engine_debug_route_trace(engine *eng, int32_t *buf);

#endif
