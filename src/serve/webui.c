/* webui.c: webui.html's bytes in the binary, by the assembler's .incbin (no generator, no xxd;
 * gcc's and clang's assemblers both take it). The path is the repository's, as make runs from
 * its root; the Makefile names webui.html as this object's input, so an edit rebuilds it. */
#include "serve/webui.h"

__asm__(".pushsection .rodata\n"
        ".balign 16\n"
        ".local hearth_webui_start\n"
        "hearth_webui_start:\n"
        ".incbin \"src/serve/webui.html\"\n"
        ".local hearth_webui_end\n"
        "hearth_webui_end:\n"
        ".byte 0\n"
        ".popsection\n");

extern const char hearth_webui_start[], hearth_webui_end[];

const char *webui_page(size_t *len) {
    *len = (size_t)(hearth_webui_end - hearth_webui_start);
    return hearth_webui_start;
}
