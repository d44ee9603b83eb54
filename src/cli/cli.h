/* cli.h: the subcommands of `hearth`. Each takes argv from the command name on
 * (argv[0] is "inspect", …) and returns the process exit code: 0 ok, 1 failure,
 * 2 bad usage. Errors go to stderr as "hearth COMMAND: message". */
#ifndef HEARTH_CLI_H
#define HEARTH_CLI_H

#define HEARTH_VERSION "0.5.0" /* `hearth --version` */

int cmd_inspect(int argc, char **argv);
int cmd_gen(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_serve(int argc, char **argv);
/* serve's flags into *o (checked, across flags too): ARGS_RUN, or the exit code (0 after
 * --help, 2 after an error, printed); strings it made stay valid until the next call */
struct serve_opts;
int serve_args(int argc, char **argv, struct serve_opts *o);
int cmd_perplexity(int argc, char **argv);

#endif
