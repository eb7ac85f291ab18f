/*
** store_db.h: internals shared by the files of the SQLite store
** (store_sqlite.c: connections, schema, the core journal entries, leases,
** claiming work; store_flow.c: events, waits, cancellation, concurrency
** slots, cron; store_prune.c: retention; store_sqlite_read.c: the SQL of
** every read, which store_read.c and store_stats.c write once for both
** backends, see store_backend.h). Nothing outside the store includes this.
**
** Connections: s->w is the writer (one thread at a time: the scheduler's
** commit thread, or a command that writes); s->r the reader (the loop
** thread, the CLI). Writes, and the reads a write transaction makes, use
** s->w; store_read.c uses s->r only.
*/
#ifndef ML_STORE_DB_H
#define ML_STORE_DB_H
#include <sqlite3.h>
#include <sys/types.h>

#include "store/store_backend.h"

/* The writer's prepared statements. */
enum {
  W_BEGIN, W_COMMIT, W_ROLLBACK, W_LEASE_RENEW,
  W_RUN_NEW, W_RUN_SET, W_RUN_END, W_STEP, W_ATTEMPT, W_LOG, W_VERSION, W_SKILL,
  W_COUNT
};

#define STORE_FLOW_STMTS 40
#define STORE_MAX_FIELDS 32 /* fields of a journal entry's kind (journal.h) */

#define STORE_CACHED_STMTS 96 /* the writer's statements store__cached keeps (flow control, the rollup) */
#define STORE_FILTER_SHAPES 128 /* a run filter's seven optional conditions */

/* The summary of a run's steps kept on an ended run (steps, failed_steps,
** retries, tokens), as the four columns of a SELECT over its steps, each
** NULL unless cond (SQL) holds. */
#define STORE_STEP_SUMS(cond) \
  "CASE WHEN " cond " THEN count(*) END," \
  " CASE WHEN " cond " THEN coalesce(sum(status = 'failed'), 0) END," \
  " CASE WHEN " cond " THEN coalesce(sum(max(attempts - 1, 0)), 0) END," \
  " CASE WHEN " cond " THEN coalesce(sum(CASE WHEN usage IS NOT NULL AND json_valid(usage)" \
  " THEN json_extract(usage, '$.total_tokens') END), 0) END"
/* The same, unconditional: a SELECT whose text ends where the run's id goes. */
#define STORE_STEP_SUMMARY "SELECT " STORE_STEP_SUMS("1") " FROM steps WHERE run_id = "

struct store {
  struct store_base base; /* first: store.c finds the backend table there */
  sqlite3 *w, *r;
  sqlite3_stmt *ws[W_COUNT];
  /* per statement of ws and field of the kind it writes: the field's
  ** parameter, 0 for a field it does not write (store_sqlite.c) */
  unsigned char wparam[W_COUNT][STORE_MAX_FIELDS];
  sqlite3_stmt *fs[STORE_FLOW_STMTS]; /* store_flow.c's, prepared on first use */
  /* the writer's statements from static SQL texts, by the text's address */
  struct { const char *sql; sqlite3_stmt *st; } cache[STORE_CACHED_STMTS];
  /* the reader's: each named read query's (store_sqlite_read.c), and
  ** the run list and count statements by filter shape */
  sqlite3_stmt *rq[RQ_COUNT];
  sqlite3_stmt *rfilter[2][STORE_FILTER_SHAPES];
  sqlite3_stmt *dv; /* PRAGMA data_version */
  sqlite3_stmt *rtx[2]; /* the reader's BEGIN and COMMIT (store__sqlite_rbegin) */
  char *path;
  dev_t dev;  /* the file opened at path */
  ino_t ino;
  long page_size; /* its pages' size: its length is a multiple of it */
  long long seen_size; /* the most its length was at a check (check_damaged) */
  dev_t wal_dev; /* its WAL ("-wal" beside it), once open (wal_known) */
  ino_t wal_ino;
  int wal_known;
  struct fence_set fence;
  struct store_ckpt *ckpt; /* the checkpointer (store_ckpt.c) */
};

/* The writer's prepared statement for a static SQL text (its address is
** the key), reset and ready to bind; prepared on first use. */
sqlite3_stmt *store__cached(store_t *s, const char *sql, err_t *e);

/* Open one connection to the SQLite file at path (created if missing),
** with the store's busy timeout and VFS; *db is NULL on failure. */
int store__sqlite_conn(const char *path, sqlite3 **db, err_t *e);

/* Checkpoint the writer's WAL on a thread of the store's own instead of in
** the commit that fills it (store_ckpt.c); full: the durability is "full"
** (the checkpointer syncs as the writer does). */
int store__ckpt_start(store_t *s, int full);
/* Stop the checkpointer (before the connections close). */
void store__ckpt_stop(store_t *s);

/* Finalize the reader's statements (store_sqlite_read.c). */
void store__sqlite_read_close(store_t *s);
/* A cursor over the rows of st (owned: finalized when closed, else reset). */
void store__sqlite_cur(struct store_cur *c, sqlite3_stmt *st, int owned);

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
/* Run n statements on the writer with ?1 bound to arg, stopping at the first failure. */
int store__exec_bound(store_t *s, const char *const *sql, size_t n, const char *arg,
                      const char *what, err_t *e);
/* Insert a run row inside the open transaction (what names it in an error). */
int store__put_run(store_t *s, const struct run_row *r, const char *what, err_t *e);
/* J_RUN_NEW with an idempotency key (store_flow.c). */
int store__put_keyed_run(store_t *s, const struct jentry *je, err_t *e);
/* Write one of store_flow.c's entries inside the open transaction. */
int store__write_flow(store_t *s, const struct jentry *je, err_t *e);
/* SKILL_ERROR and SKILL_REMOVE changes to the registry. */
int store__skill_change(store_t *s, const struct skill_row *r, err_t *e);
/* A run ended with status: drop its waits, slots and queue places; unless
** it completed, end its steps still open; keep the summary of its steps. */
int store__run_ended(store_t *s, const char *run_id, const char *status, err_t *e);
/* The VFS the store opens its files with: NULL (SQLite's default), or in
** a test build with MOONLOOP_FAULT set, store_faults.c's, whose writes and
** fsyncs obey the fault points disk_full and fsync_fail. */
const char *store__fault_vfs(void);
/* Finalize store_flow.c's statements. */
void store__flow_close(store_t *s);
/* The SQLite backend's table entries found in its other files. */
int store__sqlite_dispatch(store_t *s, int64_t now, int limit, int *runs, err_t *e);
int store__sqlite_deliver(store_t *s, int64_t *cursor, int limit, err_t *e);
int store__sqlite_prune(store_t *s, int64_t before, int64_t *runs, int64_t *events, err_t *e);
int store__sqlite_rq(store_t *s, void *conn, enum store_rq q, const struct store_val *v, int nv,
                     struct store_cur *c, err_t *e);
int store__sqlite_rfilter(store_t *s, const struct run_filter *f, int count, int limit,
                          struct store_cur *c, err_t *e);
int store__sqlite_rbegin(store_t *s, void *conn, err_t *e);
void store__sqlite_rend(store_t *s, void *conn, int began);
void *store__sqlite_reader_open(store_t *s, err_t *e);
void store__sqlite_reader_close(store_t *s, void *conn);
int store__sqlite_wq(store_t *s, const struct store_wq *q, const struct store_val *v, int nv,
                     struct store_cur *c, const char *what, err_t *e);
int64_t store__sqlite_data_version(store_t *s);

#endif
