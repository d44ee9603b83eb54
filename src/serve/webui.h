/* webui.h: the chat page served at / (src/serve/webui.html, embedded in the binary at build
 * time: nothing is read or fetched at run time). */
#ifndef HEARTH_SERVE_WEBUI_H
#define HEARTH_SERVE_WEBUI_H

#include <stddef.h>

/* the page's bytes (UTF-8 HTML, not NUL-terminated) and their count */
const char *webui_page(size_t *len);

#endif
