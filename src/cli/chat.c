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

/* A file, or standard input for "-"; false with the message printed. */
static bool read_input(const char *path, char **data, size_t *len) {
    herr e;
    if (read_file(strcmp(path, "-") ? path : "/dev/stdin", data, len, &e) == 0) return true;
    fprintf(stderr, "hearth template: %s\n", e.msg);
    return false;
}

int cmd_template(int argc, char **argv) {
    const char *model = NULL, *tmpl_path = NULL, *msgs_path = NULL, *tools_path = NULL, *bos = NULL, *eos = NULL;
    int thinking = -1; /* not given; else the index of "0" or "1" */
    int64_t now = 0;
    bool gen_prompt = false, json = false, batch = false;
    static const char *const zero_one[] = {"0", "1", NULL};
    const arg_opt opts[] = {
        ARG_STR("--model", "-m", &model, "FILE",
                "GGUF file: its tokenizer.chat_template (ChatML when it has none)\n"
                "and its vocabulary (for --json's token positions)"),
        ARG_STR("--template", NULL, &tmpl_path, "FILE", "a Jinja template file instead of the GGUF's"),
        ARG_STR("--messages", NULL, &msgs_path, "FILE",
                "JSON: an array of messages, or an object with \"messages\" and\n"
                "optionally \"tools\", \"add_generation_prompt\", \"enable_thinking\",\n"
                "\"bos_token\", \"eos_token\", \"extra\" (more variables); - is stdin"),
        ARG_STR("--tools", NULL, &tools_path, "FILE", "JSON array of tool definitions (overrides the messages file's)"),
        ARG_FLAG("--add-generation-prompt", NULL, &gen_prompt, "override the messages file's add_generation_prompt"),
        ARG_ENUM("--enable-thinking", NULL, &thinking, zero_one, "override the messages file's enable_thinking"),
        ARG_STR("--bos", NULL, &bos, "TEXT", "override the messages file's bos_token"),
        ARG_STR("--eos", NULL, &eos, "TEXT", "override the messages file's eos_token"),
        ARG_I64("--now", NULL, &now, 1, INT64_MAX / 2, "SECONDS",
                "the time strftime_now formats (seconds since 1970, UTC; default: now)"),
        ARG_FLAG("--json", NULL, &json,
                 "print {\"text\", \"n_tokens\", \"starts\"}: starts are the token\n"
                 "positions where messages begin (needs -m)"),
        ARG_FLAG("--batch", NULL, &batch,
                 "the messages file is an array of such objects: print one JSON\n"
                 "line per chat, {\"ok\": true, \"text\": ...} or {\"ok\": false, \"error\": ...}\n"
                 "(what tools/ref/jinja_render.py --batch prints)"),
        ARG_END,
    };
    const arg_cmd cmd = {
        .name = "template",
        .usage = "hearth template (-m FILE | --template FILE.jinja [-m FILE]) --messages FILE\n"
                 "                       [--add-generation-prompt] [--enable-thinking 0|1] [--tools FILE]\n"
                 "                       [--bos TEXT] [--eos TEXT] [--now SECONDS] [--json | --batch]",
        .about = "Renders a chat template as Hugging Face transformers would and prints the text.",
        .opts = opts,
    };
    int prc = args_parse(&cmd, argc, argv, NULL, NULL);
    if (prc != ARGS_RUN) return prc;
    if (!msgs_path || (!model && !tmpl_path)) {
        fprintf(stderr, "hearth template: --messages and one of -m or --template are required\n");
        return 2;
    }
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
        if (!read_input(tmpl_path, &src, &len)) goto done;
        t = chat_template_parse(src, len, &e);
    } else {
        t = chat_template_from_gguf(g, &e);
    }
    if (!t) { fprintf(stderr, "hearth template: %s: %s\n", tmpl_path ? tmpl_path : model, e.msg); goto done; }
    if (!read_input(msgs_path, &msgs, &len)) goto done;
    if (batch) {
        rc = render_batch(t, msgs, len, now);
        goto done;
    }
    chat_input in;
    if (chat_input_parse(msgs, len, &in, &root, &e) != 0) { fprintf(stderr, "hearth template: %s: %s\n", msgs_path, e.msg); goto done; }
    if (tools_path) {
        if (!read_input(tools_path, &tsrc, &len)) goto done;
        if (!(tools = cJSON_ParseWithLength(tsrc, len)) || !cJSON_IsArray(tools)) {
            fprintf(stderr, "hearth template: %s: expected a JSON array of tools\n", tools_path);
            goto done;
        }
        in.tools = tools;
    }
    if (gen_prompt) in.add_generation_prompt = true;
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
