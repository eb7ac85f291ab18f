/*
** store_db.h: internals shared by the files of the SQLite store
** (store_sqlite.c: connections, schema, the core journal entries, reads;
** store_flow.c: events, waits, cancellation, concurrency slots, cron).
** Nothing outside the store includes this.
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

struct store {
  sqlite3 *w, *r;
  sqlite3_stmt *ws[W_COUNT];
  sqlite3_stmt *fs[STORE_FLOW_STMTS]; /* store_flow.c's, prepared on first use */
  char *path;
};

#define store_db_err store__db_err
int store__db_err(err_t *e, sqlite3 *db, const char *what);
int store__exec(sqlite3 *db, const char *sql, err_t *e);
sqlite3_stmt *store__prep(sqlite3 *db, const char *sql, err_t *e);
void store__bind_text(sqlite3_stmt *st, int i, const char *v);
void store__bind_time(sqlite3_stmt *st, int i, int64_t v);
/* Step a bound write statement to completion, then reset it. */
int store__step(store_t *s, sqlite3_stmt *st, err_t *e, const char *what);
/* Write one of store_flow.c's entries inside the open transaction. */
int store__write_flow(store_t *s, const struct jentry *je, err_t *e);
/* SKILL_ERROR and SKILL_REMOVE changes to the registry. */
int store__skill_change(store_t *s, const struct skill_row *r, err_t *e);
/* A run ended: drop its waits, slots and queue places. */
int store__run_ended(store_t *s, const char *run_id, err_t *e);
/* Release the slots held by the runs of owner (a dead lease). */
int store__release_owner_slots(store_t *s, const char *owner, err_t *e);
/* Finalize store_flow.c's statements. */
void store__flow_close(store_t *s);

#endif
