/* main.c: the one binary. `hearth COMMAND ...` dispatches to src/cli/. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

/* the commit, from the Makefile: `git describe --always --dirty`, or "unknown" */
#ifndef HEARTH_GIT
#define HEARTH_GIT "unknown"
#endif

static int cmd_version(int argc, char **argv) {
    (void)argc;
    (void)argv;
    printf("hearth %s (git %s)\n", HEARTH_VERSION, HEARTH_GIT);
    return 0;
}

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *what;
} commands[] = {
    {"inspect", cmd_inspect, "print a GGUF file's metadata and tensor table"},
    {"gen", cmd_gen, "write a synthetic qwen35moe GGUF (tiny, small, wide, q36)"},
    {"run", cmd_run, "generate from a prompt on the CPU engine"},
    {"serve", cmd_serve, "serve llama-server's and OpenAI's HTTP API (chat, completions, ...)"},
    {"perplexity", cmd_perplexity, "a model's perplexity on a text, by llama-perplexity's method"},
    {"bench", cmd_bench, "prompt and decode throughput (pp/tg rows, medians)"},
    {"tokenize", cmd_tokenize, "text to token ids (JSON), like llama-tokenize --ids"},
    {"detokenize", cmd_detokenize, "token ids (JSON list) to text"},
    {"convert", cmd_convert, "convert a Hugging Face Qwen3.5/3.6 MoE checkpoint to GGUF"},
    {"template", cmd_template, "render a chat template (and show where messages begin)"},
    {"version", cmd_version, "print the version and the commit it was built from (also --version)"},
};

static void usage(FILE *out) {
    fprintf(out, "usage: hearth COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-11s %s\n", commands[i].name, commands[i].what);
    fprintf(out, "\n`hearth COMMAND --help` for a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--version")) return cmd_version(argc - 1, argv + 1);
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "hearth: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
