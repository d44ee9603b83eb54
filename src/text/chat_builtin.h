/* chat_builtin.h: chat templates compiled into the binary, by name (llama-server's
 * --chat-template NAME): chatml and the Qwen ones. chat_builtin.c is generated from
 * tests/fixtures/templates by tools/templates/gen_builtin.py. */
#ifndef HEARTH_CHAT_BUILTIN_H
#define HEARTH_CHAT_BUILTIN_H

/* the template's Jinja text, or NULL when no built-in has that name */
const char *chat_builtin_text(const char *name);
/* the i-th built-in's name (0, 1, ...), NULL past the last: for messages */
const char *chat_builtin_name(int i);

#endif
