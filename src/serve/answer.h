/* answer.h: turns a model's generated text, as it arrives, into the parts of an answer:
 * reasoning (a <think> block), content, and tool calls, and finds stop strings. Bytes that
 * could still begin a stop string, a </think>, or a <tool_call> are held back until they
 * are known, so the parts handed out are the same however the text was cut into pieces:
 * a streamed answer and a whole one agree (tests/unit/test_answer.c).
 *
 * Tool calls, in both formats these models write, between <tool_call> and </tool_call>:
 *   Qwen3:        {"name": "f", "arguments": {"x": 1}}
 *   Qwen3.5/3.6:  <function=f><parameter=x>1</parameter></function>
 * A call is handed out as CALL_START (its name), CALL_ARGS (pieces of its arguments' JSON
 * text, which joined make one object) and CALL_END, all once its </tool_call> is read: a call
 * cut off (by the length limit, a stop string or the model's end) is no call, and its text
 * is handed out as content, so a stream never sends a call that its end takes back (a
 * stream's call comes at once when it closes, not as it is written). A Qwen3.5 parameter's
 * value is text when the tool's schema says "string", else JSON where it parses as JSON (else
 * text). A block in neither format is handed out as content. */
#ifndef HEARTH_SERVE_ANSWER_H
#define HEARTH_SERVE_ANSWER_H

#include <stdbool.h>
#include <stddef.h>
#include <cjson/cJSON.h>

typedef enum answer_part {
    ANSWER_REASONING,
    ANSWER_CONTENT,
    ANSWER_CALL_START, /* s: the function's name */
    ANSWER_CALL_ARGS,  /* s: the next piece of the arguments' JSON text */
    ANSWER_CALL_END,   /* n = 0 */
} answer_part;

/* each part's bytes are s[0..n) */
typedef void (*answer_sink)(void *cls, answer_part part, const char *s, size_t n);

typedef struct answer_opts {
    bool split_think;       /* else a thinking block stays in the content */
    bool think_open;        /* the prompt left a <think> open: the text starts inside it */
    const cJSON *tools;     /* the request's tools, or NULL: no tool calls are parsed */
    const char *const *stop;
    int n_stop;
    bool one_call;          /* parallel_tool_calls false: the answer ends with its first call
                             * (what follows its </tool_call> is dropped, as after a stop string) */
} answer_opts;

typedef struct answer {
    answer_opts o;
    answer_sink sink;
    void *cls;
    char *text;             /* everything pushed (cut at a stop string) */
    size_t len, cap;
    size_t scanned;         /* searched for stop strings up to here */
    size_t emitted;         /* handed out up to here */
    size_t stop_max;
    int think;              /* 1 inside a thinking block, 0 outside, -1 not known yet */
    bool skip_nl;           /* after </think> or a call: newlines are dropped */
    bool finished;
    const char *stop_word;  /* the stop string found, or NULL */
    int n_calls;            /* calls started */
    bool call_ended;        /* one_call: the answer ended at its call */
    size_t call_scan;       /* a call held back: its </tool_call> searched for below this offset */
    /* a Qwen3.5 call being read: between its parameters, in a parameter's value, or after
     * </function> up to </tool_call> */
    enum { CALL_NONE, CALL_PARAMS, CALL_VALUE, CALL_TAIL } call;
    char *call_name, *param;
    bool args_open;         /* "{" handed out */
    bool param_text;        /* the value is a string (text), else JSON where it parses */
} answer;

void answer_init(answer *a, const answer_opts *o, answer_sink sink, void *cls);
void answer_free(answer *a);
/* More text; finished: none will follow. Returns true when this push found a stop string,
 * or (one_call) closed the first call (the answer is then finished: the caller stops
 * generating). */
bool answer_push(answer *a, const char *s, size_t n, bool finished);

#endif
