/*
** main.c: the moonloop command: parse arguments, load the configuration,
** dispatch to a command (cli_*.c).
*/
#include "cli.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
  C_RUN = 1 << 0, C_INVOKE = 1 << 1, C_RUNS = 1 << 2, C_TRACE = 1 << 3, C_SKILLS = 1 << 4,
  C_CHECK = 1 << 5, C_SERVE = 1 << 6, C_SEND = 1 << 7, C_CANCEL = 1 << 8, C_RERUN = 1 << 9,
  C_PRUNE = 1 << 10,
  C_REPL = 1 << 13, /* moonloop repl (cli_repl.c) */
  C_TEST = 1 << 14, /* moonloop test (cli_test.c) */
  C_SIDECAR = 1 << 15, /* moonloop sidecar (cli_sidecar.c) */
  C_VERSION = 1 << 16, /* moonloop version, moonloop --version (here) */
  C_REPLAY = 1 << 17, /* moonloop replay (cli_replay.c) */
  C_ALL = 0x3ffff,
};

struct command {
  const char *name;
  int bit;
  int (*fn)(struct cli *c);
  const char *usage;
  int max_args; /* positional arguments it takes at most; -1: any number */
};

static const struct command commands[] = {
  {"run", C_RUN, cli_run, "run FILE-or-SKILL [--data JSON] | run --resume RUN_ID", 1},
  {"invoke", C_INVOKE, cli_invoke, "invoke SKILL [--data JSON] [--wait]", 1},
  {"send", C_SEND, cli_send, "send NAME [--data JSON] [--id KEY]", 1},
  {"cancel", C_CANCEL, cli_cancel, "cancel RUN_ID", 1},
  {"rerun", C_RERUN, cli_rerun, "rerun RUN_ID", 1},
  {"prune", C_PRUNE, cli_prune, "prune --older-than 30d", 0},
  {"runs", C_RUNS, cli_runs, "runs [--skill ID] [--status S] [--since 7d] [--trigger KIND] [--limit N] [--follow]", 0},
  {"trace", C_TRACE, cli_trace, "trace RUN_ID", 1},
  {"skills", C_SKILLS, cli_skills, "skills", 0},
  {"check", C_CHECK, cli_check, "check FILE-or-DIR...", -1},
  {"test", C_TEST, cli_test, "test [FILES or DIRS] [--json] [-v]", -1},
  {"replay", C_REPLAY, cli_replay, "replay RUN_ID... [--json]", -1},
  {"serve", C_SERVE, cli_serve, "serve [--workspace DIR] [--listen ADDR]", 0},
  {"sidecar", C_SIDECAR, cli_sidecar, "sidecar --workspace DIR --server URL", 0},
  {"repl", C_REPL, cli_repl, "repl [--workspace DIR]", 0},
  {"version", C_VERSION, NULL, "version (or --version)", 0},
  {NULL, 0, NULL, NULL, 0},
};

/* Options: name, whether it takes a value, which commands accept it. */
struct option {
  const char *name;
  int has_arg;
  int cmds;
};

static const struct option options[] = {
  {"db", 1, C_ALL}, {"config", 1, C_ALL}, {"server", 1, C_ALL}, {"json", 0, C_ALL},
  {"verbose", 0, C_ALL}, {"quiet", 0, C_ALL},
  {"data", 1, C_RUN | C_INVOKE | C_SEND}, {"resume", 1, C_RUN}, {"wait", 0, C_INVOKE},
  {"id", 1, C_SEND}, {"older-than", 1, C_PRUNE},
  {"skill", 1, C_RUNS}, {"status", 1, C_RUNS}, {"since", 1, C_RUNS}, {"trigger", 1, C_RUNS},
  {"limit", 1, C_RUNS}, {"follow", 0, C_RUNS},
  {"workspace", 1, C_SERVE | C_SIDECAR | C_REPL}, {"listen", 1, C_SERVE},
  {NULL, 0, 0},
};

/* The option argument a names ("--db", "--db=x", "-v"), or NULL. */
static const struct option *option_of(const char *a) {
  if (a[0] != '-' || !a[1]) return NULL;
  if (!strcmp(a, "-v")) a = "--verbose";
  const char *n = a + (a[1] == '-' ? 2 : 1);
  size_t len = strcspn(n, "=");
  for (const struct option *o = options; o->name; o++)
    if (strlen(o->name) == len && !strncmp(o->name, n, len)) return o;
  return NULL;
}

/* Whether a, found where an option's value should be, is another option
** (the value was left out: `--skill --json`). */
static int is_option(const char *a) {
  return option_of(a) || !strcmp(a, "-h") || !strcmp(a, "--help") || !strcmp(a, "--version");
}

/* See cli.h. */
int cli_fail(int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("moonloop: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return status;
}

#ifndef MOONLOOP_VERSION
#define MOONLOOP_VERSION "unknown" /* a build without CMakeLists.txt's definition */
#endif

/* moonloop version: the version this binary was built as. It needs no
** configuration, so it answers even where moonloop.conf.lua is broken. */
static int print_version(const struct cli *c) {
  if (c->json) printf("{\"version\":\"%s\"}\n", MOONLOOP_VERSION);
  else printf("moonloop %s\n", MOONLOOP_VERSION);
  return EXIT_OK;
}

/* Print the usage: every command, then the options every command takes. */
static void usage(FILE *f) {
  fprintf(f, "usage: moonloop COMMAND [options]\n\ncommands:\n");
  for (const struct command *c = commands; c->name; c++) fprintf(f, "  moonloop %s\n", c->usage);
  fprintf(f,
          "\noptions for every command:\n"
          "  --db PATH        the database (default ./moonloop.db, or $MOONLOOP_DB)\n"
          "  --config FILE    the configuration (default ./moonloop.conf.lua if present)\n"
          "  --server URL     send the command to a running engine ($MOONLOOP_URL)\n"
          "  --json           machine-readable output\n"
          "  -v, --verbose    show each step as it completes\n"
          "  --quiet          no step lines, even on a terminal\n"
          "  -h, --help       this help, or a command's usage (moonloop COMMAND --help)\n");
}

/* Parse the arguments, load the configuration, run the command; its
** return value is the exit status. */
int main(int argc, char **argv) {
  struct cli c;
  memset(&c, 0, sizeof c);
  const char *db = NULL, *config = NULL, *server = NULL, *workspace = NULL, *listen = NULL;
  const char **pos = calloc((size_t)argc + 1, sizeof *pos);
  int npos = 0;
  const struct command *cmd = NULL;
  /* `moonloop --version` is `moonloop version`. */
  static char version_cmd[] = "version";
  if (argc > 1 && !strcmp(argv[1], "--version")) argv[1] = version_cmd;
  /* First pass: find the command, so options can be checked against it. */
  for (int i = 1; i < argc; i++) {
    if (argv[i][0] == '-') {
      const struct option *o = option_of(argv[i]);
      if (o && o->has_arg && !strchr(argv[i], '=')) {
        if (i + 1 >= argc || is_option(argv[i + 1])) {
          free(pos);
          return cli_fail(EXIT_USAGE, "--%s needs a value", o->name);
        }
        i++;
      }
      continue;
    }
    for (const struct command *k = commands; k->name; k++)
      if (!strcmp(k->name, argv[i])) cmd = k;
    break;
  }
  if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"))) {
    usage(stdout);
    free(pos);
    return EXIT_OK;
  }
  if (!cmd) {
    int i = 1;
    while (i < argc && argv[i][0] == '-') i++;
    if (i < argc) cli_fail(EXIT_USAGE, "unknown command '%s'", argv[i]);
    usage(stderr);
    free(pos);
    return EXIT_USAGE;
  }
  int seen_cmd = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!seen_cmd && !strcmp(a, cmd->name)) {
      seen_cmd = 1;
      continue;
    }
    if (a[0] != '-' || !a[1]) {
      pos[npos++] = a;
      continue;
    }
    if (!strcmp(a, "-v")) a = "--verbose";
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      printf("usage: moonloop %s\n", cmd->usage);
      free(pos);
      return EXIT_OK;
    }
    const char *name = a + (a[1] == '-' ? 2 : 1), *val = NULL;
    char buf[64];
    const char *eq = strchr(name, '=');
    if (eq && (size_t)(eq - name) < sizeof buf) {
      memcpy(buf, name, (size_t)(eq - name));
      buf[eq - name] = 0;
      name = buf;
      val = eq + 1;
    }
    const struct option *o = options;
    while (o->name && strcmp(o->name, name)) o++;
    if (!o->name || !(o->cmds & cmd->bit)) {
      free(pos);
      return cli_fail(EXIT_USAGE, "%s: unknown option '%s' (usage: moonloop %s)", cmd->name, a,
                      cmd->usage);
    }
    if (o->has_arg && !val) {
      if (i + 1 >= argc || is_option(argv[i + 1])) val = "";
      else val = argv[++i];
    }
    if (o->has_arg && !*val) {
      free(pos);
      return cli_fail(EXIT_USAGE, "%s: --%s needs a value (usage: moonloop %s)", cmd->name,
                      o->name, cmd->usage);
    }
    if (!strcmp(name, "db")) db = val;
    else if (!strcmp(name, "config")) config = val;
    else if (!strcmp(name, "server")) server = val;
    else if (!strcmp(name, "json")) c.json = 1;
    else if (!strcmp(name, "verbose")) c.verbose = 1;
    else if (!strcmp(name, "quiet")) c.quiet = 1;
    else if (!strcmp(name, "data")) c.data = val;
    else if (!strcmp(name, "resume")) c.resume = val;
    else if (!strcmp(name, "id")) c.id = val;
    else if (!strcmp(name, "older-than")) c.older_than = val;
    else if (!strcmp(name, "wait")) c.wait = 1;
    else if (!strcmp(name, "skill")) c.skill = val;
    else if (!strcmp(name, "status")) c.status = val;
    else if (!strcmp(name, "since")) c.since = val;
    else if (!strcmp(name, "trigger")) c.trigger = val;
    else if (!strcmp(name, "limit")) c.limit = val;
    else if (!strcmp(name, "follow")) c.follow = 1;
    else if (!strcmp(name, "workspace")) workspace = val;
    else if (!strcmp(name, "listen")) listen = val;
  }
  /* An argument the command does not take is a mistake, never ignored. */
  if (cmd->max_args >= 0 && npos > cmd->max_args) {
    int rc = cli_fail(EXIT_USAGE, "%s: unexpected argument '%s' (usage: moonloop %s)", cmd->name,
                      pos[cmd->max_args], cmd->usage);
    free(pos);
    return rc;
  }
  c.cmd = cmd->name;
  c.args = pos;
  c.nargs = npos;
  c.color = isatty(1) && !getenv("NO_COLOR");
  if (cmd->bit == C_VERSION) {
    free(pos);
    return print_version(&c);
  }
  err_t e;
  if (config_load(&c.cfg, config, &e)) {
    free(pos);
    config_free(&c.cfg);
    return cli_fail(EXIT_USAGE, "%s", e.msg);
  }
  if (db) config_set(&c.cfg.db, db);
  if (server) config_set(&c.cfg.server, server);
  if (workspace) config_set(&c.cfg.workspace, workspace);
  if (listen) config_set(&c.cfg.listen, listen);
  int rc = cmd->fn(&c);
  config_free(&c.cfg);
  free(pos);
  return rc;
}
