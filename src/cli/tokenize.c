/* tokenize.c: `hearth tokenize` (text -> ids) and `hearth detokenize` (ids -> text) over a
 * GGUF file's vocabulary; a vocab-only file will do. One argument is one input; without it
 * every stdin line is one JSON input and gets one JSON output line, for batch use. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "format/gguf.h"
#include "text/tokenizer.h"

typedef struct opts {
    const char *model, *input;
    bool no_parse_special, no_bos, no_render_special;
} opts;

/* Parses the flags of tokenize or detokenize; returns ARGS_RUN to run, or an exit code. */
static int parse_args(int argc, char **argv, opts *o, bool detok) {
    *o = (opts){0};
    const arg_opt tok_opts[] = {
        ARG_STR("--model", "-m", &o->model, "FILE", "GGUF file whose vocabulary to use (vocab-only files work)"),
        ARG_FLAG("--no-parse-special", NULL, &o->no_parse_special,
                 "do not turn control-token texts such as <|im_start|> into\n"
                 "their ids (user-defined tokens are still split out)"),
        ARG_FLAG("--no-bos", NULL, &o->no_bos, "do not prepend BOS even where the vocabulary asks for it"),
        ARG_END,
    };
    const arg_opt detok_opts[] = {
        ARG_STR("--model", "-m", &o->model, "FILE", "GGUF file whose vocabulary to use"),
        ARG_FLAG("--no-render-special", NULL, &o->no_render_special, "control tokens (<|im_end|>, ...) give no text"),
        ARG_END,
    };
    const arg_cmd tok_cmd = {
        .name = "tokenize",
        .usage = "hearth tokenize -m FILE [--no-parse-special] [--no-bos] [TEXT]",
        .about = "Prints the ids of TEXT as a JSON list, like llama-tokenize --ids. Without TEXT, reads\n"
                 "standard input one JSON string per line (\"hi\\n\") and prints one list per line.",
        .opts = tok_opts,
        .pos_name = "TEXT",
        .max_pos = 1,
    };
    const arg_cmd detok_cmd = {
        .name = "detokenize",
        .usage = "hearth detokenize -m FILE [--no-render-special] [IDS]",
        .about = "Writes the text of IDS, a JSON list such as [9707, 1879], to standard output as it is.\n"
                 "Without IDS, reads standard input one JSON list per line and prints one JSON string\n"
                 "per line (bytes that are not UTF-8 are passed through inside the quotes).",
        .opts = detok_opts,
        .pos_name = "IDS",
        .max_pos = 1,
    };
    const arg_cmd *cmd = detok ? &detok_cmd : &tok_cmd;
    int rc = args_parse(cmd, argc, argv, &o->input, NULL);
    if (rc != ARGS_RUN) return rc;
    if (!o->model) {
        fprintf(stderr, "hearth %s: -m FILE is required\n", cmd->name);
        args_usage(cmd, stderr);
        return 2;
    }
    return ARGS_RUN;
}

static int open_vocab(const char *cmd, const char *path, gguf_file **g, tokenizer **t) {
    herr e;
    if (gguf_open(g, path, &e) != 0) {
        fprintf(stderr, "hearth %s: %s\n", cmd, e.msg);
        return 1;
    }
    if (tokenizer_load(t, *g, &e) != 0) {
        fprintf(stderr, "hearth %s: %s: %s\n", cmd, path, e.msg);
        gguf_close(*g);
        return 1;
    }
    return 0;
}

/* Reads one line of any length (NULs included); NULL at the end of input. */
static char *read_line(FILE *in, char **buf, size_t *cap, size_t *len) {
    ssize_t n = getline(buf, cap, in);
    if (n < 0) return NULL;
    *len = (size_t)n;
    while (*len && ((*buf)[*len - 1] == '\n' || (*buf)[*len - 1] == '\r')) (*buf)[--*len] = 0;
    return *buf;
}

static void print_ids(const tokenizer *t, const opts *o, const char *text, size_t len) {
    int64_t n;
    int32_t *ids = tokenizer_encode_prompt(t, text, len, !o->no_parse_special, !o->no_bos, &n);
    putchar('[');
    for (int64_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    fputs("]\n", stdout);
    free(ids);
}

int cmd_tokenize(int argc, char **argv) {
    opts o;
    int rc = parse_args(argc, argv, &o, false);
    if (rc != ARGS_RUN) return rc;
    gguf_file *g;
    tokenizer *t;
    if (open_vocab(argv[0], o.model, &g, &t)) return 1;
    rc = 0;
    if (o.input) {
        print_ids(t, &o, o.input, strlen(o.input));
    } else {
        char *line = NULL;
        size_t cap = 0, len, lineno = 0;
        while (read_line(stdin, &line, &cap, &len)) {
            lineno++;
            /* cJSON strings end at a NUL: refuse rather than cut the text short */
            cJSON *j = memchr(line, 0, len) || strstr(line, "\\u0000") ? NULL : cJSON_ParseWithLength(line, len);
            if (!cJSON_IsString(j)) {
                fprintf(stderr, "hearth tokenize: stdin line %zu is not a JSON string (without NUL)\n", lineno);
                cJSON_Delete(j);
                rc = 1;
                break;
            }
            const char *s = cJSON_GetStringValue(j);
            print_ids(t, &o, s, strlen(s));
            cJSON_Delete(j);
            fflush(stdout);
        }
        free(line);
    }
    tokenizer_free(t);
    gguf_close(g);
    return rc;
}

/* Parses a JSON list of ids, each checked against the vocabulary. */
static int32_t *parse_ids(const char *s, size_t len, int32_t n_vocab, int64_t *n, char *why, size_t why_n) {
    cJSON *j = cJSON_ParseWithLength(s, len);
    if (!cJSON_IsArray(j)) {
        snprintf(why, why_n, "not a JSON list of ids");
        cJSON_Delete(j);
        return NULL;
    }
    int64_t cnt = cJSON_GetArraySize(j), i = 0;
    int32_t *ids = xmalloc((size_t)(cnt ? cnt : 1) * sizeof *ids);
    const cJSON *el;
    cJSON_ArrayForEach(el, j) {
        double v = cJSON_IsNumber(el) ? el->valuedouble : -1;
        if (!cJSON_IsNumber(el) || v != (double)(int64_t)v || v < 0 || v >= n_vocab) {
            snprintf(why, why_n, "element %lld is not a token id in [0, %d)", (long long)i, n_vocab);
            free(ids);
            cJSON_Delete(j);
            return NULL;
        }
        ids[i++] = (int32_t)v;
    }
    cJSON_Delete(j);
    *n = cnt;
    return ids;
}

/* The text as a JSON string; bytes >= 0x80 pass as they are. */
static void put_json_string(const char *p, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c < 0x20 || c == 0x7f) printf("\\u%04x", c);
        else putchar(c);
    }
    fputs("\"\n", stdout);
}

int cmd_detokenize(int argc, char **argv) {
    opts o;
    int rc = parse_args(argc, argv, &o, true);
    if (rc != ARGS_RUN) return rc;
    gguf_file *g;
    tokenizer *t;
    if (open_vocab(argv[0], o.model, &g, &t)) return 1;
    rc = 0;
    char why[128];
    char *text = NULL;
    size_t text_cap = 0;
    char *line = NULL;
    size_t cap = 0, len = 0, lineno = 0;
    for (;;) {
        const char *src = o.input;
        if (src) {
            len = strlen(src);
        } else {
            if (!read_line(stdin, &line, &cap, &len)) break;
            src = line;
        }
        lineno++;
        int64_t n;
        int32_t *ids = parse_ids(src, len, tokenizer_n_vocab(t), &n, why, sizeof why);
        if (!ids) {
            if (o.input) fprintf(stderr, "hearth detokenize: %s\n", why);
            else fprintf(stderr, "hearth detokenize: stdin line %zu: %s\n", lineno, why);
            rc = 1;
            break;
        }
        size_t tl = 0;
        for (int64_t i = 0; i < n; i++) {
            size_t pl;
            const char *p = tokenizer_piece(t, ids[i], !o.no_render_special, &pl);
            if (tl + pl > text_cap) {
                text_cap = 2 * (tl + pl) + 64;
                text = xrealloc(text, text_cap);
            }
            if (pl) memcpy(text + tl, p, pl); /* an empty piece may come with no text buffer yet */
            tl += pl;
        }
        free(ids);
        if (o.input) {
            fwrite(text, 1, tl, stdout);
            break;
        }
        put_json_string(text, tl);
        fflush(stdout);
    }
    free(text);
    free(line);
    tokenizer_free(t);
    gguf_close(g);
    return rc;
}
