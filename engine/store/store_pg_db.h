/*
** store_pg_db.h: internals shared by the files of the PostgreSQL store
** (store_pg.c: connections, schema, the core journal entries, fencing,
** leases, claiming work, LISTEN/NOTIFY; store_pg_flow.c: events, waits,
** cancellation, concurrency slots, cron, dispatching, retention;
** store_pg_read.c: the SQL of every read and cursors over results).
** Nothing outside the store includes this.
**
** Connections: s->w is the writer (the commit thread, or a command that
** writes), s->r the reader (the loop thread, the CLI), as in the SQLite
** store. Each keeps its own prepared statements (by the address of their
** SQL text, or a key of the caller's) and is opened again after it breaks
** (a restarted server, a lost network): the next call starts that on a
** thread (store_pg.c's reopen), and a later one finds it open.
*/
#ifndef ML_STORE_PG_DB_H
#define ML_STORE_PG_DB_H
#include <libpq-fe.h>
#include <stdatomic.h>

#include "store/store_backend.h"

#define PG_STMTS 224
#define PG_FILTER_SHAPES 128

/* One connection and what lives as long as its session does. */
struct pgconn {
  PGconn *c;
  const char *role;   /* "writer", "reader": in messages */
  int reader;         /* LISTENs for other processes' writes */
  int64_t retry_at;   /* a reader that lost its connection tries again then (ms) */
  int silent;         /* the last round trip got no answer in time: the connection was closed */
  char why[700];      /* why the last connection failed */
  int opened;         /* it was open once: opened again on a thread when it breaks */
  struct opening *opening; /* being opened again on a thread (store_pg.c's reopen) */
  int nstmts;
  struct { const void *key; char name[12]; } stmts[PG_STMTS];
};

struct pg_store {
  struct store_base base; /* first: store.c finds the backend table there */
  struct pgconn w, r;
  char *url;     /* as given: what libpq connects with */
  char *shown;   /* the URL without its password: store_path, messages */
  enum store_durability durability;
  struct fence_set fence;
  int64_t notified;            /* data_version: notifications and reconnections seen */
  int64_t others;              /* those of other connections than the writer (store_woken) */
  atomic_int writer_pid;       /* the writer's backend (set on the commit thread) */
  int64_t xid;                 /* the write transaction in progress (txid_current) */
  int64_t doubt_xid;           /* a commit whose outcome is unknown (0: none) */
  const journal_t *doubt_j;    /* the group it was */
  char *claim_doubt;           /* runs a claim took whose COMMIT went unanswered: a JSON array
                                  of ids, or NULL (pg_claim) */
  char filter_keys[2][PG_FILTER_SHAPES]; /* keys of the run list statements */
};

static inline struct pg_store *pg_of(store_t *s) { return (struct pg_store *)(void *)s; }

/* The key of the writers' lock (an advisory lock of the database), taken
** by every write transaction but a claim: PostgreSQL's stand-in for
** SQLite's one writer at a time, so the two stores' transactions reason
** alike. Whole (PG_LOCK_ALL) by every transaction that meets other
** processes' writes (events, waits, cancellation, slots, cron, keys,
** leases, dispatching); shared (PG_LOCK_SHARED) by a journal group that
** only records its own runs' steps and states (store_pg.c's group_mode):
** those of several engines commit side by side. */
enum { PG_LOCK_NONE, PG_LOCK_ALL, PG_LOCK_SHARED };
#define PG_WRITE_LOCK 0x6d6c6f6f70LL /* "mloop" */
#define PG_LOCK_TEXT "469970677616" /* the same, for SQL texts */

/* How long one round trip to the server may take (ms) before the
** connection is taken for lost: $MOONLOOP_PG_TIMEOUT seconds, 30 by
** default (store_pg.c's store__pg_result says why). */
extern int store__pg_answer_ms;

/* PQexec(pc->c, sql), waiting for the answer at most store__pg_answer_ms:
** past that the connection is closed and the result says it was lost
** (store__pg_err then says the server did not answer). */
PGresult *store__pg_exec_raw(struct pgconn *pc, const char *sql);

/* Make sure pc is connected (opening it again if it broke); ERR_BUSY when
** the server cannot be reached, saying why. */
int store__pg_ensure(struct pg_store *s, struct pgconn *pc, err_t *e);

/* Run the statement sql (prepared once per session, keyed by key, or by
** sql's address when key is NULL) with v[0..nv): the result when it
** succeeded (PQclear it), else NULL with e filled ("store: what: ..."). */
PGresult *store__pg_run(struct pg_store *s, struct pgconn *pc, const void *key, const char *sql,
                        const struct store_val *v, int nv, const char *what, err_t *e);
/* The same, for a statement that returns no rows: 0, or a negative code;
** *changed (when not NULL) gets the rows it changed. */
int store__pg_do(struct pg_store *s, struct pgconn *pc, const char *sql, const struct store_val *v,
                 int nv, int64_t *changed, const char *what, err_t *e);
/* Run sql (one or more statements, no parameters) on pc. */
int store__pg_exec(struct pg_store *s, struct pgconn *pc, const char *sql, const char *what,
                   err_t *e);
/* Fill e from a failed result (or the connection, res NULL): ERR_BUSY for
** what waiting may cure (a lock, a deadlock, a serialization failure),
** ERR_IO otherwise. */
int store__pg_err(struct pg_store *s, struct pgconn *pc, const PGresult *res, const char *what,
                  err_t *e);

/* Begin a write transaction on the writer holding PG_WRITE_LOCK as lock
** says (PG_LOCK_NONE: without it, for claims). */
int store__pg_begin(struct pg_store *s, int lock, err_t *e);
/* Commit it (with a NOTIFY for the other processes when notify), or roll
** it back. */
int store__pg_commit_tx(struct pg_store *s, int notify, err_t *e);
void store__pg_rollback(struct pg_store *s);

/* Column i of row r as a malloc'd string, or NULL for NULL. */
char *store__pg_dup(const PGresult *res, int r, int i);
/* Column i of row r as a whole number (NULL: 0). */
int64_t store__pg_i64(const PGresult *res, int r, int i);

/* Insert a run row inside the open transaction. */
int store__pg_put_run(struct pg_store *s, const struct run_row *r, const char *what, err_t *e);
/* J_RUN_NEW with an idempotency key. */
int store__pg_put_keyed_run(struct pg_store *s, const struct jentry *je, err_t *e);
/* Write one of store_pg_flow.c's entries inside the open transaction. */
int store__pg_write_flow(struct pg_store *s, const struct jentry *je, err_t *e);
/* SKILL_ERROR and SKILL_REMOVE changes to the registry. */
int store__pg_skill_change(struct pg_store *s, const struct skill_row *r, err_t *e);
/* A run ended with status: drop its waits, slots and queue places; unless
** it completed, end its steps still open; keep the summary of its steps. */
int store__pg_run_ended(struct pg_store *s, const char *run_id, const char *status, err_t *e);

/* The backend table's entries in the other files. */
int store__pg_dispatch(store_t *s, int64_t now, int limit, int *runs, err_t *e);
int store__pg_deliver(store_t *s, int64_t *cursor, int limit, err_t *e);
int store__pg_prune(store_t *s, int64_t before, int64_t *runs, int64_t *events, err_t *e);
int store__pg_wq(store_t *s, const struct store_wq *q, const struct store_val *v, int nv,
                 struct store_cur *c, const char *what, err_t *e);
int store__pg_rq(store_t *s, void *conn, enum store_rq q, const struct store_val *v, int nv,
                 struct store_cur *c, err_t *e);
int store__pg_rfilter(store_t *s, const struct run_filter *f, int count, int limit,
                      struct store_cur *c, err_t *e);
int store__pg_rbegin(store_t *s, void *conn, err_t *e);
void store__pg_rend(store_t *s, void *conn, int began);
/* A cursor over the rows of res (freed when closed). */
void store__pg_cur(struct store_cur *c, PGresult *res);

#endif
