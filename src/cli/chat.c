/* cli/chat.c: `hearth template`: renders a chat template (a GGUF file's, or a .jinja file)
 * with a conversation from JSON, and with a vocabulary shows where each message begins in
 * tokens. The text is what the server would tokenize. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "format/gguf.h"
#include "text/tokenizer.h"

static void usage_template(FILE *out) {
    fprintf(out,
            "usage: hearth template (-m FILE | --template FILE.jinja [-m FILE]) --messages FILE\n"
            "                       [--add-generation-prompt] [--enable-thinking 0|1] [--tools FILE]\n"
            "                       [--bos TEXT] [--eos TEXT] [--now SECONDS] [--json | --batch]\n\n"
            "Renders a chat template as Hugging Face transformers would and prints the text.\n"
            "  -m, --model FILE     GGUF file: its tokenizer.chat_template (ChatML when it has none)\n"
            "                       and its vocabulary (for --json's token positions)\n"
            "  --template FILE      a Jinja template file instead of the GGUF's\n"
            "  --messages FILE      JSON: an array of messages, or an object with \"messages\" and\n"
            "                       optionally \"tools\", \"add_generation_prompt\", \"enable_thinking\",\n"
            "                       \"bos_token\", \"eos_token\", \"extra\" (more variables); - is stdin\n"
            "  --tools FILE         JSON array of tool definitions (overrides the messages file's)\n"
            "  --add-generation-prompt, --enable-thinking 0|1, --bos TEXT, --eos TEXT\n"
            "                       override the messages file's settings\n"
            "  --now SECONDS        the time strftime_now formats (seconds since 1970, UTC; default: now)\n"
            "  --json               print {\"text\", \"n_tokens\", \"starts\"}: starts are the token\n"
            "                       positions where messages begin (needs -m)\n"
            "  --batch              the messages file is an array of such objects: print one JSON\n"
            "                       line per chat, {\"ok\": true, \"text\": ...} or {\"ok\": false, \"error\": ...}\n"
            "                       (what tools/ref/jinja_render.py --batch prints)\n");
}

static int render_batch(const chat_template *t, const char *json, size_t len, int64_t now) {
    cJSON *all = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsArray(all)) {
        fprintf(stderr, "hearth template: --batch needs a JSON array of chats\n");
        cJSON_Delete(all);
        return 1;
    }
    for (const cJSON *x = all->child; x; x = x->next) {
        char *text = NULL;
        chat_input in;
        herr e;
        size_t n;
        cJSON *o = cJSON_CreateObject();
        int rc = chat_input_from_json(x, &in, &e);
        in.now = now;
        if (rc == 0 && chat_render(t, &in, &text, &n, &e) == 0) {
            cJSON_AddTrueToObject(o, "ok");
            cJSON_AddStringToObject(o, "text", text);
        } else {
            cJSON_AddFalseToObject(o, "ok");
            cJSON_AddStringToObject(o, "error", e.msg);
        }
        char *line = cJSON_PrintUnformatted(o);
        puts(line);
        free(line);
        free(text);
        cJSON_Delete(o);
    }
    cJSON_Delete(all);
    return 0;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) { free(buf); buf = NULL; }
            buf = nb;
        }
    }
    if (f != stdin) fclose(f);
    if (buf) { *len = n; buf[n < cap ? n : cap - 1] = 0; }
    return buf;
}

int cmd_template(int argc, char **argv) {
    const char *model = NULL, *tmpl_path = NULL, *msgs_path = NULL, *tools_path = NULL, *bos = NULL, *eos = NULL, *now_s = NULL;
    int gen_prompt = -1, thinking = -2;
    bool json = false, batch = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage_template(stdout); return 0; }
        if (!strcmp(a, "--add-generation-prompt")) { gen_prompt = 1; continue; }
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--batch")) { batch = true; continue; }
        const char **dst = !strcmp(a, "-m") || !strcmp(a, "--model") ? &model : !strcmp(a, "--template") ? &tmpl_path
                         : !strcmp(a, "--messages") ? &msgs_path : !strcmp(a, "--tools") ? &tools_path
                         : !strcmp(a, "--bos") ? &bos : !strcmp(a, "--eos") ? &eos : !strcmp(a, "--now") ? &now_s : NULL;
        if (!dst && strcmp(a, "--enable-thinking")) {
            fprintf(stderr, "hearth template: unknown option '%s'\n", a);
            usage_template(stderr);
            return 2;
        }
        if (!val) { fprintf(stderr, "hearth template: %s needs a value\n", a); return 2; }
        i++;
        if (dst) { *dst = val; continue; }
        if (strcmp(val, "0") && strcmp(val, "1")) { fprintf(stderr, "hearth template: --enable-thinking takes 0 or 1\n"); return 2; }
        thinking = val[0] - '0';
    }
    if (!msgs_path || (!model && !tmpl_path)) {
        fprintf(stderr, "hearth template: --messages and one of -m or --template are required\n");
        return 2;
    }
    int64_t now = 0;
    if (now_s && !arg_i64("--now", now_s, 1, INT64_MAX / 2, &now, "template")) return 2;
    if (json && !model) { fprintf(stderr, "hearth template: --json needs -m FILE for the vocabulary\n"); return 2; }
    int rc = 1;
    herr e;
    gguf_file *g = NULL;
    tokenizer *tok = NULL;
    chat_template *t = NULL;
    cJSON *root = NULL, *tools = NULL;
    char *text = NULL, *src = NULL, *msgs = NULL, *tsrc = NULL;
    int32_t *ids = NULL;
    int64_t *starts = NULL;
    size_t len;
    if (model) {
        if (gguf_open(&g, model, &e) != 0) { fprintf(stderr, "hearth template: %s\n", e.msg); goto done; }
        if (json && tokenizer_load(&tok, g, &e) != 0) { fprintf(stderr, "hearth template: %s: %s\n", model, e.msg); goto done; }
    }
    if (tmpl_path) {
        if (!(src = slurp(tmpl_path, &len))) { fprintf(stderr, "hearth template: cannot read %s\n", tmpl_path); goto done; }
        t = chat_template_parse(src, len, &e);
    } else {
        t = chat_template_from_gguf(g, &e);
    }
    if (!t) { fprintf(stderr, "hearth template: %s: %s\n", tmpl_path ? tmpl_path : model, e.msg); goto done; }
    if (!(msgs = slurp(msgs_path, &len))) { fprintf(stderr, "hearth template: cannot read %s\n", msgs_path); goto done; }
    if (batch) {
        rc = render_batch(t, msgs, len, now);
        goto done;
    }
    chat_input in;
    if (chat_input_parse(msgs, len, &in, &root, &e) != 0) { fprintf(stderr, "hearth template: %s: %s\n", msgs_path, e.msg); goto done; }
    if (tools_path) {
        if (!(tsrc = slurp(tools_path, &len)) || !(tools = cJSON_ParseWithLength(tsrc, len)) || !cJSON_IsArray(tools)) {
            fprintf(stderr, "hearth template: %s: expected a JSON array of tools\n", tools_path);
            goto done;
        }
        in.tools = tools;
    }
    if (gen_prompt >= 0) in.add_generation_prompt = gen_prompt;
    if (thinking >= 0) in.enable_thinking = thinking;
    if (bos) in.bos_token = bos;
    if (eos) in.eos_token = eos;
    in.now = now;
    size_t n;
    if (chat_render(t, &in, &text, &n, &e) != 0) { fprintf(stderr, "hearth template: %s\n", e.msg); goto done; }
    if (!json) {
        fwrite(text, 1, n, stdout);
        rc = 0;
        goto done;
    }
    int64_t n_ids;
    ids = tokenizer_encode_alloc(tok, text, n, true, &n_ids);
    int64_t max = n_ids + 1;
    starts = xmalloc((size_t)max * sizeof *starts);
    int64_t k = chat_message_starts(t, &in, tok, text, n, ids, n_ids, starts, max, &e);
    if (k < 0) { fprintf(stderr, "hearth template: %s\n", e.msg); goto done; }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "text", text);
    cJSON_AddNumberToObject(o, "n_tokens", (double)n_ids);
    cJSON *arr = cJSON_AddArrayToObject(o, "starts");
    for (int64_t i = 0; i < k; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber((double)starts[i]));
    char *s = cJSON_PrintUnformatted(o);
    puts(s);
    free(s);
    cJSON_Delete(o);
    rc = 0;
done:
    free(starts);
    free(ids);
    free(text);
    free(src);
    free(msgs);
    free(tsrc);
    cJSON_Delete(root);
    cJSON_Delete(tools);
    chat_template_free(t);
    tokenizer_free(tok);
    if (g) gguf_close(g);
    return rc;
}
