/*
** main.c: the moonloop command: parse arguments, load the configuration,
** dispatch to a command (cli_*.c).
*/
#include "base/fault.h"
#include "base/mem.h"
#include "base/term.h"
#include "cli/cli.h"
#include "cli/help.h"
#include "core/engine.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
  C_RUN = 1 << 0, C_INVOKE = 1 << 1, C_RUNS = 1 << 2, C_TRACE = 1 << 3, C_SKILLS = 1 << 4,
  C_CHECK = 1 << 5, C_SERVE = 1 << 6, C_SEND = 1 << 7, C_CANCEL = 1 << 8, C_RERUN = 1 << 9,
  C_PRUNE = 1 << 10,
  C_STATS = 1 << 11, /* moonloop stats (cli_stats.c) */
  C_REPL = 1 << 13, /* moonloop repl (cli_repl.c) */
  C_TEST = 1 << 14, /* moonloop test (cli_test.c) */
  C_SIDECAR = 1 << 15, /* moonloop sidecar (cli_sidecar.c) */
  C_VERSION = 1 << 16, /* moonloop version, moonloop --version (here) */
  C_NEW = 1 << 17, /* moonloop new (cli_new.c) */
  C_REPLAY = 1 << 18, /* moonloop replay (cli_replay.c) */
  C_DB = 1 << 19, /* moonloop db copy (cli_db.c) */
  C_ALL = 0xfffff,
};

static const struct command commands[] = {
  {"run", C_RUN, cli_run, "run FILE-or-SKILL [--data JSON] | run --resume RUN_ID", 1,
   "Run one skill (a file, or a registered skill) to its end in this process and print "
   "its result; its run id goes to stderr first. With --resume, finish a run that a dead "
   "process left behind."},
  {"invoke", C_INVOKE, cli_invoke, "invoke SKILL [--data JSON] [--key KEY] [--wait]", 1,
   "Start a run of a registered skill. With --wait, print its result (and run it in "
   "this process when no engine holds the database)."},
  {"send", C_SEND, cli_send, "send NAME [--data JSON] [--id KEY]", 1,
   "Send an event: it starts the runs of the skills it triggers and resumes the runs "
   "waiting for it."},
  {"cancel", C_CANCEL, cli_cancel, "cancel RUN_ID", 1,
   "Cancel a run and its children."},
  {"rerun", C_RERUN, cli_rerun, "rerun RUN_ID [--key KEY]", 1,
   "Start a run again with the same input, on the skill's live version."},
  {"prune", C_PRUNE, cli_prune, "prune --older-than 30d", 0,
   "Delete the history of runs that ended longer ago than the given duration, and the "
   "dispatched events as old."},
  {"runs", C_RUNS, cli_runs, "runs [--skill ID] [--status S] [--since 7d] [--trigger KIND] [--limit N] [--follow]", 0,
   "List runs, newest first. With --follow, print runs as they start and end."},
  {"trace", C_TRACE, cli_trace, "trace RUN_ID [--wait SECONDS]", 1,
   "Show a run as a tree: steps, attempts, inputs, outputs, errors, logs, timings."},
  {"skills", C_SKILLS, cli_skills, "skills", 0,
   "List the registered skills, their versions, triggers and last load error."},
  {"new", C_NEW, cli_new, "new ID [--event NAME | --cron SPEC] [--workspace DIR]", 1,
   "Write a skill skeleton ID.lua and its test ID_test.lua (with - and . as _) that pass check and test as written, with an event or cron trigger or none; existing files are never overwritten."},
  {"stats", C_STATS, cli_stats, "stats [SKILL] [--since 7d] [--until TIME] [--interval 1h]", 1,
   "Show the health of every skill, or of one, over a window: runs by outcome per "
   "interval, failure rate, run and step duration percentiles, queue wait, retries, "
   "LLM tokens, the slowest and most failing steps, and the versions loaded (deploys). "
   "Sparklines on a terminal; the API's figures with --json."},
  {"check", C_CHECK, cli_check, "check FILE-or-DIR... | check --api", -1,
   "Load and validate skill files (or the skill files of folders) without deploying them."},
  {"test", C_TEST, cli_test, "test [FILES or DIRS] [--json] [-v]", -1,
   "Run skill tests (*_test.lua files) against mocks and a virtual clock."},
  {"replay", C_REPLAY, cli_replay, "replay RUN_ID... [--json]", -1,
   "Replay recorded runs from their journals against their own versions, running nothing "
   "and writing nothing, and report any run whose code no longer reaches the steps it recorded."},
  {"serve", C_SERVE, cli_serve, "serve [--workspace DIR] [--listen ADDR]", 0,
   "Run the engine: scheduler, cron, HTTP API and dashboard, and the sidecar that "
   "hot-loads the skill files of the workspace. Under systemd (Type=notify) it says "
   "READY=1 once the workspace's skills are registered and the API listens."},
  {"sidecar", C_SIDECAR, cli_sidecar, "sidecar --workspace DIR --server URL", 0,
   "Watch a workspace as a separate process and send its skill files to an engine's API."},
  {"repl", C_REPL, cli_repl, "repl [--workspace DIR]", 0,
   "Interactive Lua with the engine inside: load, run and step through skills."},
  {"db", C_DB, cli_db, "db copy SRC DST", 3,
   "Copy a SQLite database (SRC, a file) into an empty PostgreSQL database (DST, a "
   "postgresql:// URL) in one transaction: runs, steps, versions, skills, events, waits, "
   "cron and flow control state, idempotency keys. Refused while a process holds SRC, or "
   "when DST has rows or another schema version; nothing is written then. Progress on a "
   "terminal; the rows copied per table at the end."},
  {"version", C_VERSION, NULL, "version (or --version)", 0,
   "Print the version of moonloop."},
  {NULL, 0, NULL, NULL, 0, NULL},
};

/* Options: name, whether it takes a value, which commands accept it, the
** name of its value and what it means (--help, the man page, completions). */
static const struct option options[] = {
  {"db", 1, C_ALL, "PATH",
   "the database (default ./moonloop.db, or $MOONLOOP_DB)"},
  {"config", 1, C_ALL, "FILE",
   "the configuration (default ./moonloop.conf.lua if present, or $MOONLOOP_CONFIG)"},
  {"server", 1, C_ALL, "URL",
   "send the command to a running engine ($MOONLOOP_URL)"},
  {"json", 0, C_ALL, NULL,
   "machine-readable output"},
  {"verbose", 0, C_ALL, NULL,
   "show each step as it completes"},
  {"quiet", 0, C_ALL, NULL,
   "no step lines, even on a terminal"},
  {"data", 1, C_RUN | C_INVOKE | C_SEND, "JSON",
   "the run's input, or the event's data"},
  {"resume", 1, C_RUN, "RUN_ID",
   "finish this unfinished run"},
  {"wait", 0, C_INVOKE, NULL,
   "wait for the run to end and print its result"},
  {"wait", 1, C_TRACE, "SECONDS",
   "wait up to this long for the run to end (at most 300), then show it"},
  {"key", 1, C_INVOKE | C_RERUN, "KEY",
   "a key that makes the start idempotent: a repeat answers the first run"},
  {"id", 1, C_SEND, "KEY",
   "the event's idempotency key: a repeat is accepted once"},
  {"older-than", 1, C_PRUNE, "DURATION",
   "how old an ended run must be to go (30d)"},
  {"skill", 1, C_RUNS, "ID",
   "only runs of this skill"},
  {"status", 1, C_RUNS, "STATUS",
   "only runs with this status"},
  {"since", 1, C_RUNS | C_STATS, "TIME",
   "from this time: a duration back from now (7d, 24h) or an RFC 3339 time"},
  {"trigger", 1, C_RUNS, "KIND",
   "only runs started this way"},
  {"limit", 1, C_RUNS, "N",
   "at most N runs (default 100)"},
  {"follow", 0, C_RUNS, NULL,
   "keep printing runs as they start and end"},
  {"until", 1, C_STATS, "TIME",
   "up to this time (default now): a duration back from now or an RFC 3339 time"},
  {"interval", 1, C_STATS, "DURATION",
   "the length of one interval of the figures (default: the window cut into at most 60)"},
  {"workspace", 1, C_SERVE | C_SIDECAR | C_REPL | C_NEW, "DIR",
   "the folder of skill files to watch and load"},
  {"listen", 1, C_SERVE, "ADDR",
   "the HTTP API's address (default 127.0.0.1:8288)"},
  {"event", 1, C_NEW, "NAME",
   "the skeleton's trigger: this event"},
  {"cron", 1, C_NEW, "SPEC",
   "the skeleton's trigger: this cron schedule"},
  {"api", 0, C_CHECK, NULL,
   "print the tables of skill keys, steps and module functions instead"},
  {NULL, 0, 0, NULL, NULL},
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

/* See cli.h. The message often holds text from a skill (a load error, a
** run's error, an engine's answer): it is escaped for the terminal. */
int cli_fail(int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *msg = mem_vprintf(fmt, ap);
  va_end(ap);
  fputs("moonloop: ", stderr);
  term_fputs(msg, stderr, 0);
  fputc('\n', stderr);
  free(msg);
  return status;
}

/* See cli.h. */
const char *cli_needs_file(const char *cmd, const char *server) {
  static char msg[1200];
  const char *url = getenv("MOONLOOP_URL");
  int from_env = url && !strcmp(url, server);
  snprintf(msg, sizeof msg, "%s works on the database file, not through a server (%s, from %s): "
           "run it where the database is, %s", cmd, server, from_env ? "$MOONLOOP_URL" : "--server",
           from_env ? "with MOONLOOP_URL unset (env -u MOONLOOP_URL moonloop ...)" : "without --server");
  return msg;
}

#ifndef MOONLOOP_VERSION
#define MOONLOOP_VERSION "unknown" /* a build without CMakeLists.txt's definition */
#endif

/* moonloop version: the version this binary was built as. It needs no
** configuration, so it answers even where moonloop.conf.lua is broken. */
static int print_version(const struct cli *c) {
  /* A test build says so: its tests of injected faults need the points. */
  if (c->json) printf("{\"version\":\"%s\"%s}\n", MOONLOOP_VERSION, FAULT_COMPILED ? ",\"faults\":true" : "");
  else printf("moonloop %s\n", MOONLOOP_VERSION);
  return EXIT_OK;
}

/* The tables, for help.c: --help, the man page and the completions. */
static const struct help_tables tables = {commands, options, C_ALL, MOONLOOP_VERSION};

/* moonloop help [--man | --completion SHELL]: the usage, the man page, or
** a completion script (what the build installs). */
static int help(int argc, char **argv) {
  if (argc > 2 && !strcmp(argv[2], "--man")) {
    help_man(stdout, &tables);
    return EXIT_OK;
  }
  if (argc > 2 && !strcmp(argv[2], "--completion")) {
    if (argc > 3 && !help_completion(stdout, argv[3], &tables)) return EXIT_OK;
    return cli_fail(EXIT_USAGE, "help --completion: which shell? bash or zsh");
  }
  if (argc > 2 && strcmp(argv[2], "--help") && strcmp(argv[2], "-h")) {
    for (const struct command *k = commands; k->name; k++)
      if (!strcmp(k->name, argv[2])) {
        help_command(stdout, &tables, k);
        return EXIT_OK;
      }
    return cli_fail(EXIT_USAGE, "help: unknown argument '%s' (moonloop help [COMMAND | --man | "
                    "--completion bash|zsh])", argv[2]);
  }
  help_usage(stdout, &tables);
  return EXIT_OK;
}

/* Parse the arguments, load the configuration, run the command; its
** return value is the exit status. */
int main(int argc, char **argv) {
  /* Before anything allocates: the libraries follow base/mem.h's policy. */
  engine_process_init();
  struct cli c;
  memset(&c, 0, sizeof c);
  err_t fe;
  if (fault_init(&fe)) return cli_fail(EXIT_USAGE, "%s", fe.msg);
  const char *db = NULL, *config = NULL, *server = NULL, *workspace = NULL, *listen = NULL;
  const char **pos = mem_calloc((size_t)argc + 1, sizeof *pos);
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
    free(pos);
    return help(argc, argv);
  }
  if (!cmd) {
    int i = 1;
    while (i < argc && argv[i][0] == '-') i++;
    if (i < argc) cli_fail(EXIT_USAGE, "unknown command '%s'", argv[i]);
    help_usage(stderr, &tables);
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
      help_command(stdout, &tables, cmd);
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
    /* A name may have one entry per set of commands (--wait). */
    const struct option *o = options;
    while (o->name && (strcmp(o->name, name) || !(o->cmds & cmd->bit))) o++;
    if (!o->name) {
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
    else if (!strcmp(name, "wait")) c.wait = 1, c.wait_for = val;
    else if (!strcmp(name, "key")) c.key = val;
    else if (!strcmp(name, "skill")) c.skill = val;
    else if (!strcmp(name, "status")) c.status = val;
    else if (!strcmp(name, "since")) c.since = val;
    else if (!strcmp(name, "trigger")) c.trigger = val;
    else if (!strcmp(name, "limit")) c.limit = val;
    else if (!strcmp(name, "follow")) c.follow = 1;
    else if (!strcmp(name, "api")) c.api = 1;
    else if (!strcmp(name, "until")) c.until = val;
    else if (!strcmp(name, "interval")) c.interval = val;
    else if (!strcmp(name, "workspace")) workspace = val;
    else if (!strcmp(name, "listen")) listen = val;
    else if (!strcmp(name, "event")) c.event = val;
    else if (!strcmp(name, "cron")) c.cron = val;
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
  c.out_dir = workspace;
  if (listen) config_set(&c.cfg.listen, listen);
  int rc = cmd->fn(&c);
  config_free(&c.cfg);
  free(pos);
  return rc;
}
