/*
** store_db.h: internals shared by the files of the SQLite store
** (store_sqlite.c: connections, schema, the core journal entries, leases,
** claiming work; store_flow.c: events, waits, cancellation, concurrency
** slots, cron; store_prune.c: retention; store_read.c: every read).
** Nothing outside the store includes this.
**
** Connections: s->w is the writer (one thread at a time: the scheduler's
** commit thread, or a command that writes); s->r the reader (the loop
** thread, the CLI). Writes, and the reads a write transaction makes, use
** s->w; store_read.c uses s->r only.
*/
#ifndef ML_STORE_DB_H
#define ML_STORE_DB_H
#include <sqlite3.h>

#include "store.h"

/* The writer's prepared statements. */
enum {
  W_BEGIN, W_COMMIT, W_ROLLBACK, W_LEASE_RENEW,
  W_RUN_NEW, W_RUN_SET, W_STEP, W_ATTEMPT, W_LOG, W_VERSION, W_SKILL,
  W_COUNT
};

#define STORE_FLOW_STMTS 40

/* The columns of a run row, in struct run_row's order (store_sqlite.c's
** row_from_stmt and store_read.c's record_from_stmt read them by index). */
#define STORE_RUN_COLS \
  "id, skill, version, status, entry, trigger, parent_id, input, output, error," \
  " created_at, started_at, ended_at, deadline_at, wake_at, owner"

/* The columns of a run row taken to be executed (claimed or taken over):
** STORE_RUN_COLS, then crashes, cancel_requested, cancel_reason. */
#define STORE_CLAIM_COLS STORE_RUN_COLS ", crashes, cancel_requested, cancel_reason"

#define STORE_CACHED_STMTS 32

struct store {
  sqlite3 *w, *r;
  sqlite3_stmt *ws[W_COUNT];
  sqlite3_stmt *fs[STORE_FLOW_STMTS]; /* store_flow.c's, prepared on first use */
  /* the writer's statements from static SQL texts, by the text's address */
  struct { const char *sql; sqlite3_stmt *st; } cache[STORE_CACHED_STMTS];
  char *path;
};

/* The writer's prepared statement for a static SQL text (its address is
** the key), reset and ready to bind; prepared on first use. */
sqlite3_stmt *store__cached(store_t *s, const char *sql, err_t *e);

#define store_db_err store__db_err
int store__db_err(err_t *e, sqlite3 *db, const char *what);
int store__exec(sqlite3 *db, const char *sql, err_t *e);
sqlite3_stmt *store__prep(sqlite3 *db, const char *sql, err_t *e);
void store__bind_text(sqlite3_stmt *st, int i, const char *v);
void store__bind_time(sqlite3_stmt *st, int i, int64_t v);
/* Step a bound write statement to completion, then reset it. */
int store__step(store_t *s, sqlite3_stmt *st, err_t *e, const char *what);
/* Column i as a malloc'd string, or NULL. */
char *store__col_dup(sqlite3_stmt *st, int i);
/* Whether a run status is final (completed, failed, cancelled); NULL is not. */
int store__is_terminal(const char *status);
/* Run n statements on the writer with ?1 bound to arg, stopping at the first failure. */
int store__exec_bound(store_t *s, const char *const *sql, size_t n, const char *arg,
                      const char *what, err_t *e);
/* Insert a run row inside the open transaction (what names it in an error). */
int store__put_run(store_t *s, const struct run_row *r, const char *what, err_t *e);
/* Whether a lease row (owner, host, pid, pid_start, expires_at) is dead. */
int store__lease_dead(sqlite3_stmt *st, const char *host, int64_t now);
/* Write one of store_flow.c's entries inside the open transaction. */
int store__write_flow(store_t *s, const struct jentry *je, err_t *e);
/* SKILL_ERROR and SKILL_REMOVE changes to the registry. */
int store__skill_change(store_t *s, const struct skill_row *r, err_t *e);
/* A run ended with status: drop its waits, slots and queue places; unless
** it completed, end its steps still open. */
int store__run_ended(store_t *s, const char *run_id, const char *status, err_t *e);
/* Finalize store_flow.c's statements. */
void store__flow_close(store_t *s);

#endif
