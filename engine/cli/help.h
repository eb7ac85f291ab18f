/*
** help.h: everything written about the command line is generated from
** main.c's two tables (commands and options: the parser's own, with
** their descriptions), so --help, the man page moonloop(1) and the
** shell completions cannot drift apart:
**
**   moonloop --help                      usage: commands, options for every command
**   moonloop help --man                  the man page (troff), made at build time
**   moonloop help --completion bash|zsh  a completion script, made at build time
**
** A command or option without a description still shows (with
** "(no description)"); tests/func/test_install.py fails on it.
*/
#ifndef ML_HELP_H
#define ML_HELP_H
#include <stdio.h>

#include "cli/cli.h"

/* A command: its name, its bit in options' masks, what runs it, its
** usage line, how many positional arguments it takes (-1: any), and what
** it does in a sentence. */
struct command {
  const char *name;
  int bit;
  int (*fn)(struct cli *c);
  const char *usage;
  int max_args;
  const char *text;
};

/* An option: its name, whether it takes a value, which commands take it,
** the name of its value (NULL for a flag) and what it means. */
struct option {
  const char *name;
  int has_arg;
  int cmds;
  const char *value, *text;
};

/* The tables, each ending with a NULL name; all is the mask of every command. */
struct help_tables {
  const struct command *commands;
  const struct option *options;
  int all;
  const char *version;
};

/* moonloop --help: the commands' usage lines, then the options for every command. */
void help_usage(FILE *f, const struct help_tables *t);

/* moonloop COMMAND --help (and moonloop help COMMAND): its usage line, what
** it does, the options of its own, and where the options for every command
** are (the database, the configuration, the server). */
void help_command(FILE *f, const struct help_tables *t, const struct command *c);

/* moonloop help --man: moonloop(1) in troff's man macros. */
void help_man(FILE *f, const struct help_tables *t);

/* moonloop help --completion SHELL: 0, or -1 for a shell it cannot write for. */
int help_completion(FILE *f, const char *shell, const struct help_tables *t);

#endif
