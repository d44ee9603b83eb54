/* schema.h: JSON Schema into GBNF text for grammar.h, and the grammars of forced tool calls.
 *
 * Supported (what agents' schemas use): type (one or a list), properties, required,
 * additionalProperties (false, true or a schema; absent counts as false, as llama.cpp's
 * converter does: fewer invented keys), items, minItems, maxItems (up to 1000), enum, const,
 * anyOf, oneOf (as anyOf), allOf of one schema, $ref to #, #/$defs/NAME and
 * #/definitions/NAME (recursion allowed), string minLength/maxLength, and string formats
 * date, time, date-time and uuid. Annotations (title, description, default, examples,
 * $schema, $id, $comment, deprecated, readOnly, writeOnly) are ignored. Any other keyword
 * is refused by name with its place in the schema, never ignored. Properties come in the
 * schema's order. Whitespace between tokens is bounded (a newline and up to 20 blanks), so
 * a weak model cannot run on in blanks. */
#ifndef HEARTH_SERVE_SCHEMA_H
#define HEARTH_SERVE_SCHEMA_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "base/util.h"

/* The GBNF of JSON text valid under schema (start rule "root"); a new string, or NULL
 * with e naming the keyword and where it is ("json_schema: \"pattern\" is not supported
 * (at /properties/name)"). what names the field in errors. */
char *schema_to_gbnf(const cJSON *schema, const char *what, herr *e);

/* The GBNF of a tool call of the chat tools (OpenAI's [{"type": "function", "function":
 * {"name", "parameters"}}]), only the one named name when it is not NULL: Qwen3.5/3.6's
 * <tool_call><function=NAME><parameter=P>...</parameter></function></tool_call> when xml,
 * else Qwen3's <tool_call>{"name": ..., "arguments": {...}}</tool_call>. Exactly one call,
 * or with many one or more (parallel calls), a newline at most between and after them. A
 * string parameter's text (xml) may not contain "</". NULL with e set (a tool without a
 * name, a name not among the tools, a schema refused). */
char *schema_tool_gbnf(const cJSON *tools, const char *name, bool xml, bool many, herr *e);

/* Primes vocabulary v for the grammars above (gvocab_prime, grammar.h): the stack tops of
 * any JSON value, of a schema of every type and format, and of tool calls in both forms
 * (one or more calls) with parameters of each kind, within max_states DFA states a grammar. Once per
 * vocabulary, at start-up; it ends early once *stop is set (may be NULL); counts added to *ps. */
struct gvocab;
struct gvocab_prime_stats;
void schema_prime(struct gvocab *v, int32_t max_states, const atomic_bool *stop, struct gvocab_prime_stats *ps);

#endif
