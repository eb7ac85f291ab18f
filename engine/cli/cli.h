/*
** cli.h: the command line. main() parses the arguments into a struct cli
** (every command declares the options it takes; any other is a usage
** error), loads the configuration, and calls the command's function.
** Commands return the process's exit status: 0 success, 1 the run or
** request failed, 2 usage error.
*/
#ifndef ML_CLI_H
#define ML_CLI_H
#include <stdint.h>
#include <stdio.h>

#include "lua/config.h"

enum { EXIT_OK = 0, EXIT_FAILED = 1, EXIT_USAGE = 2 };

struct cli {
  const char *cmd;
  const char **args; /* positional arguments after the command */
  int nargs;
  struct config cfg;
  int json, verbose, quiet, wait, follow;
  int api; /* moonloop check --api: print the API's tables */
  const char *data, *resume, *id, *skill, *status, *since, *trigger, *limit, *older_than;
  const char *event, *cron; /* moonloop new: the skeleton's trigger */
  const char *out_dir;      /* moonloop new: --workspace, where the files go (NULL: here) */
  const char *key;      /* invoke --key: the idempotency key */
  const char *wait_for; /* trace --wait: how long (NULL for invoke's --wait) */
  const char *until, *interval; /* stats */
  int color; /* stdout is a terminal */
};

int cli_run(struct cli *c);
int cli_invoke(struct cli *c);
int cli_runs(struct cli *c);
int cli_trace(struct cli *c);
int cli_skills(struct cli *c);
int cli_check(struct cli *c);
int cli_test(struct cli *c); /* cli_test.c */
int cli_replay(struct cli *c); /* cli_replay.c */
int cli_serve(struct cli *c);
int cli_sidecar(struct cli *c); /* cli_sidecar.c */
int cli_send(struct cli *c);
int cli_cancel(struct cli *c);
int cli_rerun(struct cli *c);
int cli_prune(struct cli *c);
int cli_stats(struct cli *c); /* cli_stats.c */
int cli_repl(struct cli *c); /* cli_repl.c */
int cli_new(struct cli *c);  /* cli_new.c */
int cli_db(struct cli *c);   /* cli_db.c: db copy */

/* Print "moonloop: message" to stderr and return status. */
int cli_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
struct engine;
/* Open the store of c's configuration for a command that reads history
** (runs, trace, skills, stats; not runs --follow, which waits for the
** first runs). Where the SQLite file is not there it creates none: it says
** so on stderr and returns CLI_NO_DB (the command has nothing to show).
** Else 0, or its status on failure (en closed). */
#define CLI_NO_DB (-1)
int cli_open_history(struct cli *c, struct engine *en);

/* The refusal of a command that works on the database file (prune, db
** copy) when a server is named: how to leave the server out, whether it
** came from --server or $MOONLOOP_URL. A static buffer. */
const char *cli_needs_file(const char *cmd, const char *server);

/* Parse --data (default null) into compact JSON text (caller frees), or NULL after printing the problem. */
char *cli_data_json(const struct cli *c);

/* Print a JSON value (pretty when human) followed by a newline; escape:
** for a person, with term.h's escapes in their JSON form (the text still
** reads as the same JSON); 0 for --json, which stays exact. */
void cli_print_json(FILE *f, const char *json, int pretty, int escape);

/* A growing list of paths (check and test gather the files they were given). */
struct cli_paths {
  char **v;
  int n, cap;
};

/* Append a copy of p. */
void cli_paths_add(struct cli_paths *l, const char *p);

/* Append the entries of folder dir (not those whose names start with a
** dot), joined to it ("x" for ".", "dir/x" otherwise), in name order; a
** folder that cannot be read adds none. */
void cli_paths_of_dir(struct cli_paths *out, const char *dir);

/* Sort the paths by their bytes. */
void cli_paths_sort(struct cli_paths *l);

/* Free the list and its paths. */
void cli_paths_free(struct cli_paths *l);

struct engine;

/* File mode: wait until run_id has ended (completed, failed, cancelled, skipped) or
** deadline_ms passes (0: none), looking at the run only when another
** process committed (PRAGMA data_version, asked every 20 ms). Returns 0
** once it ended, 1 at the deadline, or a negative code with e (an unknown
** run: ERR_NOTFOUND). cli_run.c. */
int cli_wait_run(struct engine *en, const char *run_id, int64_t deadline_ms, err_t *e);

/* A --wait value (trace): seconds or a duration ("30", "1.5", "2m") into
** *ms; 0, or EXIT_USAGE after printing why. */
int cli_wait_arg(const char *s, int64_t *ms);

/* Print a finished run's result the way DESIGN says (output on stdout, or
** the error on stderr); returns the exit status. output and error are JSON
** text or NULL. cli_run.c; client.c prints --server results with it too.
** (Added by the refactor: client.c had a copy.) */
int cli_report_run(const struct cli *c, const char *run_id, const char *status,
                   const char *output, const char *error);

#endif
