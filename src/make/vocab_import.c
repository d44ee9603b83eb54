/* vocab_import.c: byte-level BPE vocabularies for `hearth gen`: the built-in one (learnt
 * here, deterministically, from a weighted list of common English words) and the import of
 * a Hugging Face tokenizer.json with cJSON. The token typing follows llama.cpp's converter
 * (conversion/base.py get_vocab_base, gguf-py SpecialVocab): model.vocab entries are
 * NORMAL, added tokens CONTROL when flagged special or shaped like "<|...|>", otherwise
 * USER_DEFINED; ids nobody defines become "[PAD{id}]" of type UNUSED. */
#include "make/vocab_import.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- GPT-2 byte-to-unicode ---- */

/* Printable Latin-1 bytes stand for themselves; the other 68 (controls, space, 127-160,
 * soft hyphen) are moved to U+0100.. in byte order, so every token is visible text. */
static bool byte_is_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

static uint32_t byte_codepoint(uint8_t b) {
    if (byte_is_printable(b)) return b;
    uint32_t n = 0;
    for (int c = 0; c < b; c++) n += !byte_is_printable(c);
    return 256 + n;
}

void vocab_byte_symbol(uint8_t b, char out[4]) {
    uint32_t cp = byte_codepoint(b);
    if (cp < 0x80) {
        out[0] = (char)cp; out[1] = 0;
    } else { /* every symbol is below U+0800: two UTF-8 bytes */
        out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); out[2] = 0;
    }
}

/* GPT-2 numbers its byte tokens printable bytes first, then the moved ones. */
static void byte_order(uint8_t order[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) if (byte_is_printable(b)) order[n++] = (uint8_t)b;
    for (int b = 0; b < 256; b++) if (!byte_is_printable(b)) order[n++] = (uint8_t)b;
}

/* ---- small growable arrays ---- */

static void push_token(vocab_def *v, int64_t *cap, char *text, int32_t type) {
    if (v->n_tokens == *cap) {
        *cap = *cap ? 2 * *cap : 1024;
        v->tokens = xrealloc(v->tokens, (size_t)*cap * sizeof *v->tokens);
        v->types = xrealloc(v->types, (size_t)*cap * sizeof *v->types);
    }
    v->tokens[v->n_tokens] = text;
    v->types[v->n_tokens] = type;
    v->n_tokens++;
}

static void push_merge(vocab_def *v, int64_t *cap, char *text) {
    if (v->n_merges == *cap) {
        *cap = *cap ? 2 * *cap : 1024;
        v->merges = xrealloc(v->merges, (size_t)*cap * sizeof *v->merges);
    }
    v->merges[v->n_merges++] = text;
}

static char *str_cat3(const char *a, const char *sep, const char *b) {
    size_t la = strlen(a), ls = strlen(sep), lb = strlen(b);
    char *s = xmalloc(la + ls + lb + 1);
    memcpy(s, a, la);
    memcpy(s + la, sep, ls);
    memcpy(s + la + ls, b, lb + 1);
    return s;
}

int64_t vocab_def_find(const vocab_def *v, const char *text) {
    for (int64_t i = 0; i < v->n_tokens; i++)
        if (v->tokens[i] && !strcmp(v->tokens[i], text)) return i;
    return -1;
}

/* Qwen's chat format (ChatML). The generation prompt opens a thinking block, as the
 * Qwen3.5/3.6 templates do; `enable_thinking=false` closes it at once. Reasoning of
 * assistant turns before the last message is dropped, so a later request diverges from
 * the live state at the last assistant turn, like with the real models. */
static const char builtin_chat_template[] =
    "{%- for message in messages -%}\n"
    "{%- if message.role == 'assistant' -%}\n"
    "{%- set content = message.content -%}\n"
    "{%- if '</think>' in content and not loop.last -%}\n"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}\n"
    "{%- endif -%}\n"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' -}}\n"
    "{%- else -%}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|im_start|>assistant\\n' -}}\n"
    "{%- if enable_thinking is defined and enable_thinking is false -%}\n"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}\n"
    "{%- else -%}\n"
    "{{- '<think>\\n' -}}\n"
    "{%- endif -%}\n"
    "{%- endif -%}\n";

/* ---- the built-in vocabulary ---- */

/* Common English words, most frequent first (weight ~ 1/rank, Zipf), plus words of chat
 * and code. Each is trained as " word" (mid-sentence, the usual GPT-2 pre-token), and
 * more rarely bare and capitalised (sentence start). */
static const char *const builtin_words[] = {
    "the", "of", "and", "to", "a", "in", "is", "it", "you", "that", "he", "was", "for", "on",
    "are", "with", "as", "I", "his", "they", "be", "at", "one", "have", "this", "from", "or",
    "had", "by", "not", "word", "but", "what", "some", "we", "can", "out", "other", "were",
    "all", "there", "when", "up", "use", "your", "how", "said", "an", "each", "she", "which",
    "do", "their", "time", "if", "will", "way", "about", "many", "then", "them", "write",
    "would", "like", "so", "these", "her", "long", "make", "thing", "see", "him", "two",
    "has", "look", "more", "day", "could", "go", "come", "did", "number", "sound", "no",
    "most", "people", "my", "over", "know", "water", "than", "call", "first", "who", "may",
    "down", "side", "been", "now", "find", "any", "new", "work", "part", "take", "get",
    "place", "made", "live", "where", "after", "back", "little", "only", "round", "man",
    "year", "came", "show", "every", "good", "me", "give", "our", "under", "name", "very",
    "through", "just", "form", "sentence", "great", "think", "say", "help", "low", "line",
    "differ", "turn", "cause", "much", "mean", "before", "move", "right", "boy", "old",
    "too", "same", "tell", "does", "set", "three", "want", "air", "well", "also", "play",
    "small", "end", "put", "home", "read", "hand", "port", "large", "spell", "add", "even",
    "land", "here", "must", "big", "high", "such", "follow", "act", "why", "ask", "men",
    "change", "went", "light", "kind", "off", "need", "house", "picture", "try", "us",
    "again", "animal", "point", "mother", "world", "near", "build", "self", "earth",
    "father", "head", "stand", "own", "page", "should", "country", "found", "answer",
    "school", "grow", "study", "still", "learn", "plant", "cover", "food", "sun", "four",
    "between", "state", "keep", "eye", "never", "last", "let", "thought", "city", "tree",
    "cross", "farm", "hard", "start", "might", "story", "saw", "far", "sea", "draw", "left",
    "late", "run", "while", "press", "close", "night", "real", "life", "few", "north",
    "question", "because", "system", "user", "assistant", "model", "function", "return",
    "value", "string", "list", "data", "file", "code", "import", "class", "print", "true",
    "false", "none", "null", "self", "def", "int", "float", "const", "struct", "example",
    "information", "problem", "result", "different", "important", "following", "however",
    "thinking", "answer", "reason", "step", "let's", "okay", "sure", "hello", "thanks",
};

/* Pre-tokens of whitespace and punctuation (Qwen2's split keeps ".\n" together and
 * attaches one space to the following word). */
static const struct { const char *text; int64_t weight; } builtin_pieces[] = {
    {"\n\n", 3000}, {"\n", 2500}, {"  ", 1500}, {"    ", 1200}, {"        ", 600},
    {".\n", 1200}, {".\n\n", 900}, {":\n", 500}, {"'s", 900}, {"'t", 700}, {"'re", 300},
    {"'ll", 250}, {"'ve", 250}, {" (", 500}, {"):\n", 300}, {" =", 600}, {" ==", 200},
    {" {\n", 300}, {"}\n", 300}, {"();\n", 200}, {" //", 150}, {" #", 150}, {"...", 200},
    {" -", 300}, {" \"", 300}, {"\",", 200}, {" **", 200}, {"**", 200}, {" ```", 150},
    {"```\n", 150},
};

#define BUILTIN_MAX_TOKENS 993 /* + 7 special tokens = 1000: the tiny preset's 1024 ends with [PAD] tokens */
#define BUILTIN_MAX_WORD 40

typedef struct { int32_t sym[BUILTIN_MAX_WORD]; int n; int64_t weight; } train_word;
typedef struct { int32_t a, b; int64_t w; } train_pair;

static int pair_cmp(const void *x, const void *y) {
    const train_pair *p = x, *q = y;
    if (p->a != q->a) return p->a < q->a ? -1 : 1;
    if (p->b != q->b) return p->b < q->b ? -1 : 1;
    return 0;
}

static void add_train_word(train_word *w, int64_t *n, const char *text, int64_t weight, const int32_t byte_id[256]) {
    size_t len = strlen(text);
    HEARTH_CHECK(len > 0 && len <= BUILTIN_MAX_WORD);
    train_word *t = &w[(*n)++];
    t->n = (int)len;
    t->weight = weight;
    for (size_t i = 0; i < len; i++) t->sym[i] = byte_id[(uint8_t)text[i]];
}

void vocab_def_builtin(vocab_def *v) {
    memset(v, 0, sizeof *v);
    int64_t tcap = 0, mcap = 0;
    uint8_t order[256];
    int32_t byte_id[256];
    byte_order(order);
    for (int i = 0; i < 256; i++) {
        char sym[4];
        vocab_byte_symbol(order[i], sym);
        byte_id[order[i]] = i;
        push_token(v, &tcap, xstrdup(sym), VTT_NORMAL);
    }

    /* The training set: every word in three forms, then the pieces. */
    const int64_t n_words = (int64_t)(sizeof builtin_words / sizeof builtin_words[0]);
    const int64_t n_pieces = (int64_t)(sizeof builtin_pieces / sizeof builtin_pieces[0]);
    train_word *words = xcalloc((size_t)(3 * n_words + n_pieces), sizeof *words);
    int64_t nw = 0;
    for (int64_t r = 0; r < n_words; r++) {
        const char *wd = builtin_words[r];
        int64_t weight = 40000 / (r + 10);
        char buf[BUILTIN_MAX_WORD + 2];
        snprintf(buf, sizeof buf, " %s", wd);
        add_train_word(words, &nw, buf, weight, byte_id);
        add_train_word(words, &nw, wd, weight / 4 + 1, byte_id);
        snprintf(buf, sizeof buf, "%s", wd);
        if (buf[0] >= 'a' && buf[0] <= 'z') {
            buf[0] = (char)(buf[0] - 'a' + 'A');
            add_train_word(words, &nw, buf, weight / 8 + 1, byte_id);
        }
    }
    for (int64_t i = 0; i < n_pieces; i++) add_train_word(words, &nw, builtin_pieces[i].text, builtin_pieces[i].weight, byte_id);

    /* Plain BPE: merge the heaviest adjacent pair (ties: the smaller ids), until the token
     * budget is spent or every word is one token. */
    train_pair *pairs = xmalloc((size_t)nw * BUILTIN_MAX_WORD * sizeof *pairs);
    while (v->n_tokens < BUILTIN_MAX_TOKENS) {
        int64_t np = 0;
        for (int64_t i = 0; i < nw; i++)
            for (int k = 0; k + 1 < words[i].n; k++)
                pairs[np++] = (train_pair){words[i].sym[k], words[i].sym[k + 1], words[i].weight};
        if (np == 0) break;
        qsort(pairs, (size_t)np, sizeof *pairs, pair_cmp);
        train_pair best = {0, 0, 0};
        for (int64_t i = 0; i < np;) {
            train_pair acc = pairs[i];
            int64_t j = i + 1;
            for (; j < np && pairs[j].a == acc.a && pairs[j].b == acc.b; j++) acc.w += pairs[j].w;
            if (acc.w > best.w) best = acc;
            i = j;
        }
        char *merged = str_cat3(v->tokens[best.a], "", v->tokens[best.b]);
        /* Two different pairs can spell the same string ("ab"+"c", "a"+"bc"): one token. */
        int64_t id = vocab_def_find(v, merged);
        if (id < 0) {
            id = v->n_tokens;
            push_token(v, &tcap, merged, VTT_NORMAL);
        } else {
            free(merged);
        }
        push_merge(v, &mcap, str_cat3(v->tokens[best.a], " ", v->tokens[best.b]));
        for (int64_t i = 0; i < nw; i++) {
            train_word *t = &words[i];
            int o = 0;
            for (int k = 0; k < t->n; k++) {
                if (k + 1 < t->n && t->sym[k] == best.a && t->sym[k + 1] == best.b) {
                    t->sym[o++] = (int32_t)id;
                    k++;
                } else {
                    t->sym[o++] = t->sym[k];
                }
            }
            t->n = o;
        }
    }
    free(pairs);
    free(words);

    /* Qwen's special tokens: the ChatML markers are CONTROL, the think/tool tags are plain
     * added tokens (special=false in Qwen's tokenizer.json), i.e. USER_DEFINED. */
    static const struct { const char *text; int32_t type; } specials[] = {
        {"<|endoftext|>", VTT_CONTROL}, {"<|im_start|>", VTT_CONTROL}, {"<|im_end|>", VTT_CONTROL},
        {"<think>", VTT_USER_DEFINED}, {"</think>", VTT_USER_DEFINED},
        {"<tool_call>", VTT_USER_DEFINED}, {"</tool_call>", VTT_USER_DEFINED},
    };
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        push_token(v, &tcap, xstrdup(specials[i].text), specials[i].type);
    v->n_real = v->n_tokens;
    v->pad = v->bos = vocab_def_find(v, "<|endoftext|>");
    v->eos = vocab_def_find(v, "<|im_end|>");
    v->add_bos = false;
    v->add_eos = false;
    v->chat_template = xstrdup(builtin_chat_template);
    snprintf(v->pre, sizeof v->pre, "qwen2");
}

/* ---- Hugging Face import ---- */

#define VOCAB_MAX_ID ((int64_t)1 << 22) /* model_hparams_check's bound on n_vocab */

static int parse_json(const char *path, cJSON **out, bool *missing, herr *e) {
    char *buf = NULL;
    size_t n = 0;
    *missing = false;
    if (read_file(path, &buf, &n, e) < 0) {
        *missing = errno == ENOENT;
        return -1;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(buf, n, &end, false);
    if (!j) {
        size_t off = end && end >= buf && end <= buf + n ? (size_t)(end - buf) : 0;
        free(buf);
        return herr_set(e, "%s: not valid JSON (near byte %zu)", path, off);
    }
    free(buf);
    *out = j;
    return 0;
}

/* A JSON number that is an integer in [0, max). */
static bool json_id(const cJSON *j, int64_t max, int64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d < (double)max) || d != (double)(int64_t)d) return false;
    *out = (int64_t)d;
    return true;
}

/* Any {"type": "ByteLevel"} inside (pre_tokenizer and decoder may nest Sequences). */
static bool has_byte_level(const cJSON *j) {
    if (!j) return false;
    if (cJSON_IsObject(j)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
        if (cJSON_IsString(t) && !strcmp(t->valuestring, "ByteLevel")) return true;
    }
    if (cJSON_IsObject(j) || cJSON_IsArray(j))
        for (const cJSON *c = j->child; c; c = c->next)
            if (has_byte_level(c)) return true;
    return false;
}

/* llama.cpp's converter also types added tokens shaped like "<|...|>" as CONTROL even
 * when not flagged special (Qwen's <|fim_prefix|> and friends). */
static bool looks_special(const char *s) {
    size_t n = strlen(s);
    if (n >= 4 && !strncmp(s, "<|", 2) && !strcmp(s + n - 2, "|>")) return true;
    static const char fw_open[] = "<\xef\xbd\x9c", fw_close[] = "\xef\xbd\x9c>"; /* <｜ ｜> */
    if (n >= 8 && !strncmp(s, fw_open, 4) && !strcmp(s + n - 4, fw_close)) return true;
    if (!strcmp(s, "<pad>") || !strcmp(s, "<mask>") || !strcmp(s, "<2mass>") || !strcmp(s, "[@BOS@]")) return true;
    if (n >= 8 && !strncmp(s, "<unused", 7) && s[n - 1] == '>') return true;
    return false;
}

/* A merge in pair form ["a", "b"]: spaces inside a part are written as U+0120 (like
 * gguf-py), then the parts are joined with one space, the GGUF form. */
static char *merge_from_pair(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *s = xmalloc(2 * (la + lb) + 2), *o = s;
    for (const char *p = a; *p; p++) {
        if (*p == ' ') { *o++ = (char)0xC4; *o++ = (char)0xA0; } else *o++ = *p;
    }
    *o++ = ' ';
    for (const char *p = b; *p; p++) {
        if (*p == ' ') { *o++ = (char)0xC4; *o++ = (char)0xA0; } else *o++ = *p;
    }
    *o = 0;
    return s;
}

/* Looks a configured special token up: added tokens first (what gguf-py does), then the
 * whole vocabulary. entry is a string or {"content": string}; NULL/null leaves *id. */
static int special_from_config(vocab_def *v, const cJSON *cfg, const char *field, const char *path, int64_t *id, herr *e) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(cfg, field);
    if (!j || cJSON_IsNull(j)) return 0;
    const char *text = NULL;
    if (cJSON_IsString(j)) text = j->valuestring;
    else if (cJSON_IsObject(j)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
        if (cJSON_IsString(c)) text = c->valuestring;
    }
    if (!text) return herr_set(e, "%s: %s: expected a string or an object with \"content\"", path, field);
    int64_t t = vocab_def_find(v, text);
    if (t < 0) return herr_set(e, "%s: %s \"%.64s\" is not a token of the vocabulary", path, field, text);
    *id = t;
    return 0;
}

static char *sibling_path(const char *path, const char *name) {
    const char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path) + 1 : 0;
    char *s = xmalloc(dir + strlen(name) + 1);
    memcpy(s, path, dir);
    strcpy(s + dir, name);
    return s;
}

static int read_tokenizer_config(vocab_def *v, const char *tok_path, herr *e) {
    char *path = sibling_path(tok_path, "tokenizer_config.json");
    cJSON *cfg = NULL;
    bool missing;
    int rc = 0;
    if (parse_json(path, &cfg, &missing, e) < 0) {
        rc = missing ? 0 : -1; /* the file is optional; a broken one is an error */
        goto done;
    }
    if (!cJSON_IsObject(cfg)) { rc = herr_set(e, "%s: expected a JSON object", path); goto done; }
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (cJSON_IsString(ct)) {
        v->chat_template = xstrdup(ct->valuestring);
    } else if (cJSON_IsArray(ct)) { /* [{"name": ..., "template": ...}]: the "default" one */
        const cJSON *pick = NULL;
        for (const cJSON *c = ct->child; c; c = c->next) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(c, "name");
            const cJSON *tp = cJSON_GetObjectItemCaseSensitive(c, "template");
            if (!cJSON_IsString(tp)) { rc = herr_set(e, "%s: chat_template: an entry without a \"template\" string", path); goto done; }
            if (!pick || (cJSON_IsString(nm) && !strcmp(nm->valuestring, "default"))) pick = tp;
        }
        if (pick) v->chat_template = xstrdup(pick->valuestring);
    } else if (ct && !cJSON_IsNull(ct)) {
        rc = herr_set(e, "%s: chat_template: expected a string or a list of named templates", path);
        goto done;
    }
    if (special_from_config(v, cfg, "bos_token", path, &v->bos, e) < 0 ||
        special_from_config(v, cfg, "eos_token", path, &v->eos, e) < 0 ||
        special_from_config(v, cfg, "pad_token", path, &v->pad, e) < 0) {
        rc = -1;
        goto done;
    }
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
    if (cJSON_IsBool(ab)) v->add_bos = cJSON_IsTrue(ab);
    const cJSON *ae = cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token");
    if (cJSON_IsBool(ae)) v->add_eos = cJSON_IsTrue(ae);
done:
    cJSON_Delete(cfg);
    free(path);
    return rc;
}

/* config.json's bos/eos/pad_token_id fill only what tokenizer_config.json left unset
 * (gguf-py keeps the first value it finds). */
static int read_model_config(vocab_def *v, const char *tok_path, herr *e) {
    char *path = sibling_path(tok_path, "config.json");
    cJSON *cfg = NULL;
    bool missing;
    int rc = 0;
    if (parse_json(path, &cfg, &missing, e) < 0) {
        rc = missing ? 0 : -1;
        goto done;
    }
    static const char *const keys[] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    int64_t *slots[] = {&v->bos, &v->eos, &v->pad};
    for (int i = 0; i < 3; i++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(cfg, keys[i]);
        int64_t id;
        if (*slots[i] < 0 && json_id(j, v->n_tokens, &id)) *slots[i] = id;
    }
done:
    cJSON_Delete(cfg);
    free(path);
    return rc;
}

int vocab_def_from_hf(vocab_def *v, const char *path, herr *e) {
    memset(v, 0, sizeof *v);
    v->bos = v->eos = v->pad = -1;
    snprintf(v->pre, sizeof v->pre, "qwen2");
    cJSON *root = NULL;
    bool missing;
    if (parse_json(path, &root, &missing, e) < 0) return -1;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) { herr_set(e, "%s: model: missing or not an object", path); goto fail; }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "BPE"))) {
        herr_set(e, "%s: model.type is %s%s%s: hearth gen imports byte-level BPE only", path,
                 cJSON_IsString(type) ? "\"" : "", cJSON_IsString(type) ? type->valuestring : "not a string",
                 cJSON_IsString(type) ? "\"" : "");
        goto fail;
    }
    if (!has_byte_level(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer")) &&
        !has_byte_level(cJSON_GetObjectItemCaseSensitive(root, "decoder"))) {
        herr_set(e, "%s: pre_tokenizer: no ByteLevel step: hearth gen imports byte-level BPE only", path);
        goto fail;
    }
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab) || !vocab->child) { herr_set(e, "%s: model.vocab: missing, empty or not an object", path); goto fail; }
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsArray(merges)) { herr_set(e, "%s: model.merges: missing or not an array", path); goto fail; }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added)) { herr_set(e, "%s: added_tokens: not an array", path); goto fail; }

    /* ids first, to size the table */
    int64_t n = 0, id = 0;
    for (const cJSON *c = vocab->child; c; c = c->next) {
        if (!json_id(c, VOCAB_MAX_ID, &id)) {
            herr_set(e, "%s: model.vocab[\"%.64s\"]: id is not an integer in [0, %" PRId64 ")", path, c->string, VOCAB_MAX_ID);
            goto fail;
        }
        if (id + 1 > n) n = id + 1;
    }
    int64_t ia = 0;
    if (cJSON_IsArray(added))
        for (const cJSON *c = added->child; c; c = c->next, ia++) {
            const cJSON *cid = cJSON_GetObjectItemCaseSensitive(c, "id");
            const cJSON *content = cJSON_GetObjectItemCaseSensitive(c, "content");
            if (!json_id(cid, VOCAB_MAX_ID, &id)) {
                herr_set(e, "%s: added_tokens[%" PRId64 "].id: not an integer in [0, %" PRId64 ")", path, ia, VOCAB_MAX_ID);
                goto fail;
            }
            if (!cJSON_IsString(content) || !content->valuestring[0]) {
                herr_set(e, "%s: added_tokens[%" PRId64 "].content: missing or not a non-empty string", path, ia);
                goto fail;
            }
            if (id + 1 > n) n = id + 1;
        }
    v->n_tokens = n;
    v->tokens = xcalloc((size_t)n, sizeof *v->tokens);
    v->types = xcalloc((size_t)n, sizeof *v->types);
    for (const cJSON *c = vocab->child; c; c = c->next) {
        json_id(c, VOCAB_MAX_ID, &id);
        if (!c->string || !c->string[0]) { herr_set(e, "%s: model.vocab: an empty token (id %" PRId64 ")", path, id); goto fail; }
        if (v->tokens[id]) {
            herr_set(e, "%s: model.vocab: id %" PRId64 " is used by both \"%.64s\" and \"%.64s\"", path, id, v->tokens[id], c->string);
            goto fail;
        }
        v->tokens[id] = xstrdup(c->string);
        v->types[id] = VTT_NORMAL;
    }
    if (cJSON_IsArray(added))
        for (const cJSON *c = added->child; c; c = c->next) {
            json_id(cJSON_GetObjectItemCaseSensitive(c, "id"), VOCAB_MAX_ID, &id);
            const char *text = cJSON_GetObjectItemCaseSensitive(c, "content")->valuestring;
            const cJSON *sp = cJSON_GetObjectItemCaseSensitive(c, "special");
            free(v->tokens[id]); /* an added token may repeat a vocab entry: it takes the id */
            v->tokens[id] = xstrdup(text);
            v->types[id] = (cJSON_IsTrue(sp) || looks_special(text)) ? VTT_CONTROL : VTT_USER_DEFINED;
        }
    v->n_real = 0;
    for (int64_t i = 0; i < n; i++) {
        if (v->tokens[i]) { v->n_real++; continue; }
        char buf[32];
        snprintf(buf, sizeof buf, "[PAD%" PRId64 "]", i);
        v->tokens[i] = xstrdup(buf);
        v->types[i] = VTT_UNUSED;
    }

    int64_t mcap = 0, im = 0;
    for (const cJSON *c = merges->child; c; c = c->next, im++) {
        if (cJSON_IsString(c)) {
            const char *sp = strchr(c->valuestring[0] ? c->valuestring + 1 : c->valuestring, ' ');
            if (!sp || !sp[1]) {
                herr_set(e, "%s: model.merges[%" PRId64 "]: \"%.64s\" is not \"left right\"", path, im, c->valuestring);
                goto fail;
            }
            push_merge(v, &mcap, xstrdup(c->valuestring));
        } else if (cJSON_IsArray(c) && cJSON_GetArraySize(c) == 2 && cJSON_IsString(c->child) &&
                   cJSON_IsString(c->child->next) && c->child->valuestring[0] && c->child->next->valuestring[0]) {
            push_merge(v, &mcap, merge_from_pair(c->child->valuestring, c->child->next->valuestring));
        } else {
            herr_set(e, "%s: model.merges[%" PRId64 "]: expected \"left right\" or [\"left\", \"right\"]", path, im);
            goto fail;
        }
    }
    cJSON_Delete(root);
    root = NULL;

    if (read_tokenizer_config(v, path, e) < 0 || read_model_config(v, path, e) < 0) goto fail;
    /* Defaults for files that name none: ChatML's end of turn ends generation, and
     * <|endoftext|> pads and begins (Qwen's config.json says bos = <|endoftext|>). */
    if (v->eos < 0) v->eos = vocab_def_find(v, "<|im_end|>");
    if (v->eos < 0) v->eos = vocab_def_find(v, "<|endoftext|>");
    if (v->pad < 0) v->pad = vocab_def_find(v, "<|endoftext|>");
    if (v->bos < 0) v->bos = v->pad;
    return 0;
fail:
    cJSON_Delete(root);
    vocab_def_free(v);
    return -1;
}

void vocab_def_pad(vocab_def *v, int64_t n_vocab) {
    HEARTH_CHECK(n_vocab >= v->n_tokens);
    if (n_vocab == v->n_tokens) return;
    v->tokens = xrealloc(v->tokens, (size_t)n_vocab * sizeof *v->tokens);
    v->types = xrealloc(v->types, (size_t)n_vocab * sizeof *v->types);
    for (int64_t i = v->n_tokens; i < n_vocab; i++) {
        char buf[32];
        snprintf(buf, sizeof buf, "[PAD%" PRId64 "]", i);
        v->tokens[i] = xstrdup(buf);
        v->types[i] = VTT_UNUSED;
    }
    v->n_tokens = n_vocab;
}

void vocab_def_write(const vocab_def *v, gguf_writer *w) {
    gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_set_str(w, "tokenizer.ggml.pre", v->pre);
    gguf_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens, (uint64_t)v->n_tokens);
    gguf_set_arr_data(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v->types, (uint64_t)v->n_tokens);
    gguf_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges, (uint64_t)v->n_merges);
    if (v->eos >= 0) gguf_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos);
    if (v->bos >= 0) gguf_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos);
    if (v->pad >= 0) gguf_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)v->pad);
    gguf_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos);
    gguf_set_bool(w, "tokenizer.ggml.add_eos_token", v->add_eos);
    if (v->chat_template) gguf_set_str(w, "tokenizer.chat_template", v->chat_template);
}

void vocab_def_free(vocab_def *v) {
    if (!v) return;
    for (int64_t i = 0; i < v->n_tokens; i++) free(v->tokens ? v->tokens[i] : NULL);
    for (int64_t i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->tokens);
    free(v->types);
    free(v->merges);
    free(v->chat_template);
    memset(v, 0, sizeof *v);
    v->bos = v->eos = v->pad = -1;
}
