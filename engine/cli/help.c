/*
** help.c: --help, the man page and the shell completions, all written
** from main.c's tables (see help.h). The words for each command and
** option live here, once; which option goes with which command, which
** takes a value and the run statuses and trigger kinds (vocab.c) come
** from the tables the parser itself uses.
*/
#include "cli/help.h"
#include "base/vocab.h"

#include <string.h>

/* What a command does, in one sentence. */
static const struct {
  const char *name, *text;
} command_texts[] = {
  {"run", "Run one skill (a file, or a registered skill) to its end in this process and print "
          "its result; its run id goes to stderr first. With --resume, finish a run that a dead "
          "process left behind."},
  {"invoke", "Start a run of a registered skill. With --wait, print its result (and run it in "
             "this process when no engine holds the database)."},
  {"send", "Send an event: it starts the runs of the skills it triggers and resumes the runs "
           "waiting for it."},
  {"cancel", "Cancel a run and its children."},
  {"rerun", "Start a run again with the same input, on the skill's live version."},
  {"prune", "Delete the history of runs that ended longer ago than the given duration, and the "
            "dispatched events as old."},
  {"runs", "List runs, newest first. With --follow, print runs as they start and end."},
  {"trace", "Show a run as a tree: steps, attempts, inputs, outputs, errors, logs, timings."},
  {"skills", "List the registered skills, their versions, triggers and last load error."},
  {"stats", "Show the health of every skill, or of one, over a window: runs by outcome per "
            "interval, failure rate, run and step duration percentiles, queue wait, retries, "
            "LLM tokens, the slowest and most failing steps, and the versions loaded (deploys). "
            "Sparklines on a terminal; the API's figures with --json."},
  {"check", "Load and validate skill files (or the skill files of folders) without deploying them."},
  {"test", "Run skill tests (*_test.lua files) against mocks and a virtual clock."},
  {"serve", "Run the engine: scheduler, cron, HTTP API and dashboard, and the sidecar that "
            "hot-loads the skill files of the workspace. Under systemd (Type=notify) it says "
            "READY=1 once the workspace's skills are registered and the API listens."},
  {"sidecar", "Watch a workspace as a separate process and send its skill files to an engine's API."},
  {"repl", "Interactive Lua with the engine inside: load, run and step through skills."},
  {"version", "Print the version of moonloop."},
};

/* What an option means, and the name of its value. */
static const struct {
  const char *name, *value, *text;
} option_texts[] = {
  {"db", "PATH", "the database (default ./moonloop.db, or $MOONLOOP_DB)"},
  {"config", "FILE", "the configuration (default ./moonloop.conf.lua if present, or $MOONLOOP_CONFIG)"},
  {"server", "URL", "send the command to a running engine ($MOONLOOP_URL)"},
  {"json", NULL, "machine-readable output"},
  {"verbose", NULL, "show each step as it completes"},
  {"quiet", NULL, "no step lines, even on a terminal"},
  {"data", "JSON", "the run's input, or the event's data"},
  {"resume", "RUN_ID", "finish this unfinished run"},
  {"wait", NULL, "wait for the run to end and print its result"},
  {"id", "KEY", "the event's idempotency key: a repeat is accepted once"},
  {"older-than", "DURATION", "how old an ended run must be to go (30d)"},
  {"skill", "ID", "only runs of this skill"},
  {"status", "STATUS", "only runs with this status"},
  {"since", "TIME", "from this time: a duration back from now (7d, 24h) or an RFC 3339 time"},
  {"until", "TIME", "up to this time (default now): a duration back from now or an RFC 3339 time"},
  {"interval", "DURATION", "the length of one interval of the figures (default: the window cut into at most 60)"},
  {"trigger", "KIND", "only runs started this way"},
  {"limit", "N", "at most N runs (default 100)"},
  {"follow", NULL, "keep printing runs as they start and end"},
  {"workspace", "DIR", "the folder of skill files to watch and load"},
  {"listen", "ADDR", "the HTTP API's address (default 127.0.0.1:8288)"},
};

static const char *command_text(const char *name) {
  for (size_t i = 0; i < sizeof command_texts / sizeof command_texts[0]; i++)
    if (!strcmp(command_texts[i].name, name)) return command_texts[i].text;
  return "(no description)";
}

/* The option's value name ("" for a flag) and text. */
static const char *option_text(const struct option *o, const char **value) {
  for (size_t i = 0; i < sizeof option_texts / sizeof option_texts[0]; i++)
    if (!strcmp(option_texts[i].name, o->name)) {
      *value = o->has_arg ? (option_texts[i].value ? option_texts[i].value : "VALUE") : "";
      return option_texts[i].text;
    }
  *value = o->has_arg ? "VALUE" : "";
  return "(no description)";
}

/* See help.h. The options for every command are those whose mask is all. */
void help_usage(FILE *f, const struct help_tables *t) {
  fprintf(f, "usage: moonloop COMMAND [options]\n\ncommands:\n");
  for (const struct command *c = t->commands; c->name; c++) fprintf(f, "  moonloop %s\n", c->usage);
  fprintf(f, "\noptions for every command:\n");
  for (const struct option *o = t->options; o->name; o++) {
    if (o->cmds != t->all) continue;
    const char *value, *text = option_text(o, &value);
    char left[48];
    snprintf(left, sizeof left, "%s--%s%s%s", !strcmp(o->name, "verbose") ? "-v, " : "", o->name,
             *value ? " " : "", value);
    fprintf(f, "  %-16s %s\n", left, text);
  }
  fprintf(f, "  %-16s %s\n", "-h, --help", "this help, or a command's usage (moonloop COMMAND --help)");
}

/* ---- the man page -------------------------------------------------------------- */

/* Text for troff: backslashes doubled as \e, dashes as \-, and a line
** never starting with a dot or a quote. */
static void roff(FILE *f, const char *s) {
  if (*s == '.' || *s == '\'') fputs("\\&", f);
  for (; *s; s++) {
    if (*s == '\\') fputs("\\e", f);
    else if (*s == '-') fputs("\\-", f);
    else fputc(*s, f);
  }
}

/* The names of the commands that take option o, ", "-separated. */
static void commands_of(FILE *f, const struct help_tables *t, const struct option *o) {
  int first = 1;
  for (const struct command *c = t->commands; c->name; c++)
    if (o->cmds & c->bit) {
      fprintf(f, "%s\\fB%s\\fR", first ? "" : ", ", c->name);
      first = 0;
    }
}

/* See help.h. */
void help_man(FILE *f, const struct help_tables *t) {
  fprintf(f, ".\\\" moonloop(1), generated by `moonloop help --man` from the command line's own tables\n");
  fprintf(f, ".TH MOONLOOP 1 \"\" \"moonloop %s\" \"User Commands\"\n", t->version);
  /* No hyphenation: option names and commands must stay whole. */
  fprintf(f, ".nh\n");
  fprintf(f, ".SH NAME\nmoonloop \\- a durable orchestration engine for agent loops\n");
  fprintf(f, ".SH SYNOPSIS\n.B moonloop\n.I COMMAND\n[\\fIoptions\\fR]\n.br\n.B moonloop\n"
             "\\-\\-help | \\-\\-version\n");
  fprintf(f, ".SH DESCRIPTION\n"
             "Skills are Lua files; every run of a skill is a coroutine that yields to a C core on "
             "every step, and the core checkpoints each step in SQLite, so a run killed at any "
             "moment resumes from its last completed step.\n"
             ".PP\n"
             "Every command works on the database directly (\\fB\\-\\-db\\fR); "
             "\\fB\\-\\-server\\fR \\fIURL\\fR sends it to a running engine instead. "
             "\\fBmoonloop serve\\fR runs the engine, its HTTP API and dashboard.\n");
  fprintf(f, ".SH COMMANDS\n");
  for (const struct command *c = t->commands; c->name; c++) {
    fprintf(f, ".TP\n.B moonloop ");
    roff(f, c->usage);
    fputc('\n', f);
    roff(f, command_text(c->name));
    fputc('\n', f);
  }
  fprintf(f, ".TP\n.B moonloop help \\-\\-man | \\-\\-completion bash|zsh\n"
             "Print this page, or a shell completion script (both are generated from the same "
             "tables as \\fB\\-\\-help\\fR).\n");
  fprintf(f, ".SH OPTIONS\nOptions for every command:\n");
  for (int pass = 0; pass < 2; pass++) {
    if (pass) fprintf(f, ".PP\nOptions of some commands:\n");
    for (const struct option *o = t->options; o->name; o++) {
      if ((o->cmds == t->all) != !pass) continue;
      const char *value, *text = option_text(o, &value);
      fprintf(f, ".TP\n%s\\fB\\-\\-", !strcmp(o->name, "verbose") ? "\\fB\\-v\\fR, " : "");
      roff(f, o->name);
      fprintf(f, "\\fR%s%s%s\n", *value ? " \\fI" : "", value, *value ? "\\fR" : "");
      roff(f, text);
      if (pass) {
        fprintf(f, " (");
        commands_of(f, t, o);
        fprintf(f, ")");
      }
      fputc('\n', f);
    }
  }
  fprintf(f, ".TP\n\\fB\\-h\\fR, \\fB\\-\\-help\\fR\nThis help, or a command's usage "
             "(\\fBmoonloop\\fR \\fICOMMAND\\fR \\fB\\-\\-help\\fR).\n");
  fprintf(f, ".SH ENVIRONMENT\n"
             ".TP\n.B MOONLOOP_DB\nThe database, as \\fB\\-\\-db\\fR.\n"
             ".TP\n.B MOONLOOP_CONFIG\nThe configuration file, as \\fB\\-\\-config\\fR.\n"
             ".TP\n.B MOONLOOP_URL\nA running engine, as \\fB\\-\\-server\\fR.\n"
             ".TP\n.B MOONLOOP_TOKEN\nThe API token (the variable configuration's \\fItoken_env\\fR names).\n"
             ".TP\n.B MOONLOOP_WORKSPACE\\fR, \\fBMOONLOOP_LISTEN\nAs \\fB\\-\\-workspace\\fR and \\fB\\-\\-listen\\fR.\n"
             ".TP\n.B NOTIFY_SOCKET\nSet by systemd: \\fBserve\\fR sends READY=1 there once ready, "
             "and STOPPING=1 when it stops.\n"
             ".TP\n.B NO_COLOR\nNo colour, even on a terminal.\n");
  fprintf(f, ".SH EXIT STATUS\n0: success. 1: the run or the request failed. 2: a usage error.\n");
  fprintf(f, ".SH FILES\n"
             ".TP\n.I moonloop.conf.lua\nThe configuration, read from the working folder.\n"
             ".TP\n.I moonloop.db\nThe database (SQLite, WAL mode).\n"
             ".TP\n.I /etc/moonloop/moonloop.conf.lua\nThe configuration of the systemd service "
             "\\fBmoonloop.service\\fR, whose state lives in \\fI/var/lib/moonloop\\fR.\n");
  fprintf(f, ".SH SEE ALSO\n\\fBsystemctl\\fR(1), \\fBjournalctl\\fR(1); docs/operations.md in "
             "the source tree.\n");
}

/* ---- the completions --------------------------------------------------------------- */

/* The words of a NULL-terminated list, space-separated. */
static void words(FILE *f, const char *const *list) {
  for (const char *const *w = list; *w; w++) fprintf(f, "%s%s", w == list ? "" : " ", *w);
}

/* Whether option o's value is a file or folder name. */
static int takes_path(const struct option *o) {
  return !strcmp(o->name, "db") || !strcmp(o->name, "config") || !strcmp(o->name, "workspace");
}

/* A completion text for zsh: no quote, colon or bracket. */
static void zsh_text(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '\'') fputs("'\\''", f);
    else if (*s == ':' || *s == '[' || *s == ']') fputc(' ', f);
    else fputc(*s, f);
  }
}

static void bash(FILE *f, const struct help_tables *t) {
  fprintf(f, "# bash completion for moonloop %s, generated by `moonloop help --completion bash`\n"
             "# from the command line's own tables: do not edit.\n", t->version);
  fprintf(f, "_moonloop() {\n"
             "  local cur=\"${COMP_WORDS[COMP_CWORD]}\" prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n"
             "  local cmd=\"\" i w\n");
  /* The command is the first word that is neither an option nor an option's value. */
  fprintf(f, "  for ((i = 1; i < COMP_CWORD; i++)); do\n    w=\"${COMP_WORDS[i]}\"\n    case \"$w\" in\n      ");
  int first = 1;
  for (const struct option *o = t->options; o->name; o++)
    if (o->has_arg) fprintf(f, "%s--%s", first ? "" : "|", o->name), first = 0;
  fprintf(f, ") ((i++)) ;;\n      -*) ;;\n      *) cmd=\"$w\"; break ;;\n    esac\n  done\n");
  fprintf(f, "  case \"$prev\" in\n    ");
  first = 1;
  for (const struct option *o = t->options; o->name; o++)
    if (takes_path(o)) fprintf(f, "%s--%s", first ? "" : "|", o->name), first = 0;
  fprintf(f, ") COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n");
  fprintf(f, "    --status) COMPREPLY=($(compgen -W \"");
  words(f, vocab_run_statuses);
  fprintf(f, "\" -- \"$cur\")); return ;;\n    --trigger) COMPREPLY=($(compgen -W \"");
  words(f, vocab_trigger_kinds);
  fprintf(f, "\" -- \"$cur\")); return ;;\n    ");
  first = 1;
  for (const struct option *o = t->options; o->name; o++)
    if (o->has_arg && !takes_path(o) && strcmp(o->name, "status") && strcmp(o->name, "trigger"))
      fprintf(f, "%s--%s", first ? "" : "|", o->name), first = 0;
  fprintf(f, ") return ;;\n  esac\n");
  fprintf(f, "  if [[ -z \"$cmd\" ]]; then\n    COMPREPLY=($(compgen -W \"");
  for (const struct command *c = t->commands; c->name; c++) fprintf(f, "%s ", c->name);
  fprintf(f, "help --help --version\" -- \"$cur\"))\n    return\n  fi\n  local opts=\"\"\n  case \"$cmd\" in\n");
  for (const struct command *c = t->commands; c->name; c++) {
    fprintf(f, "    %s) opts=\"", c->name);
    first = 1;
    for (const struct option *o = t->options; o->name; o++)
      if (o->cmds & c->bit) fprintf(f, "%s--%s", first ? "" : " ", o->name), first = 0;
    fprintf(f, " --help\" ;;\n");
  }
  fprintf(f, "    help) opts=\"--man --completion\" ;;\n  esac\n"
             "  if [[ \"$cur\" == -* ]]; then\n    COMPREPLY=($(compgen -W \"$opts\" -- \"$cur\"))\n"
             "  else\n    case \"$cmd\" in\n      run|check|test) COMPREPLY=($(compgen -f -- \"$cur\")) ;;\n"
             "    esac\n  fi\n}\ncomplete -F _moonloop moonloop\n");
}

/* One option as _arguments wants it: '--name[text]:value:action'. */
static void zsh_option(FILE *f, const struct option *o) {
  const char *value, *text = option_text(o, &value);
  fprintf(f, "    '--%s[", o->name);
  zsh_text(f, text);
  fputc(']', f);
  if (o->has_arg) {
    fprintf(f, ":%s:", value);
    if (takes_path(o)) fputs("_files", f);
    else if (!strcmp(o->name, "status")) fputc('(', f), words(f, vocab_run_statuses), fputc(')', f);
    else if (!strcmp(o->name, "trigger")) fputc('(', f), words(f, vocab_trigger_kinds), fputc(')', f);
    else fputs(" ", f);
  }
  fputs("'", f);
}

static void zsh(FILE *f, const struct help_tables *t) {
  fprintf(f, "#compdef moonloop\n# zsh completion for moonloop %s, generated by `moonloop help "
             "--completion zsh`\n# from the command line's own tables: do not edit.\n\n", t->version);
  fprintf(f, "_moonloop() {\n  local curcontext=\"$curcontext\" state line\n  local -a commands\n"
             "  commands=(\n");
  for (const struct command *c = t->commands; c->name; c++) {
    fprintf(f, "    '%s:", c->name);
    /* The text up to its first stop is enough for a menu. */
    const char *text = command_text(c->name);
    size_t n = 0;
    while (text[n] && !(strchr(".:;", text[n]) && (text[n + 1] == ' ' || !text[n + 1]))) n++;
    if (n > 72) {
      n = 72;
      while (n && text[n] != ' ') n--;
    }
    char one[80];
    snprintf(one, sizeof one, "%.*s", (int)n, text);
    zsh_text(f, one);
    fprintf(f, "'\n");
  }
  fprintf(f, "  )\n  _arguments -C \\\n    '(- *)--help[show the usage]' \\\n"
             "    '(- *)--version[show the version]' \\\n");
  for (const struct option *o = t->options; o->name; o++)
    if (o->cmds == t->all) zsh_option(f, o), fprintf(f, " \\\n");
  fprintf(f, "    '1:command:->command' \\\n    '*::argument:->argument'\n"
             "  case $state in\n    command) _describe -t commands 'moonloop command' commands ;;\n"
             "    argument)\n      case $words[1] in\n");
  for (const struct command *c = t->commands; c->name; c++) {
    fprintf(f, "        %s) _arguments \\\n", c->name);
    for (const struct option *o = t->options; o->name; o++)
      if (o->cmds & c->bit && o->cmds != t->all) zsh_option(f, o), fprintf(f, " \\\n");
    int files = !strcmp(c->name, "run") || !strcmp(c->name, "check") || !strcmp(c->name, "test");
    fprintf(f, "            '*:%s' ;;\n", files ? "file:_files" : "argument: ");
  }
  fprintf(f, "      esac ;;\n  esac\n}\n\n_moonloop \"$@\"\n");
}

/* See help.h. */
int help_completion(FILE *f, const char *shell, const struct help_tables *t) {
  if (shell && !strcmp(shell, "bash")) bash(f, t);
  else if (shell && !strcmp(shell, "zsh")) zsh(f, t);
  else return -1;
  return 0;
}
