/*
** store_prune.c: retention. Deletes the history of runs that ended before
** a time (the run, its steps, attempts, logs, deliveries), in batches of
** one transaction each so an engine sharing the database is never held up
** for long, and dispatched events accepted before that time. Runs that
** have not ended are never touched, whatever their age.
*/
#include "base/vocab.h"
#include "store/store_db.h"

#define PRUNE_BATCH 2000

/* One batch: returns the number of runs deleted, or a negative code. */
static int prune_batch(store_t *s, int64_t before, err_t *e) {
  static const char *const del[] = {
    "DELETE FROM steps WHERE run_id IN (SELECT id FROM temp.prune_ids)",
    "DELETE FROM attempts WHERE run_id IN (SELECT id FROM temp.prune_ids)",
    "DELETE FROM logs WHERE run_id IN (SELECT id FROM temp.prune_ids)",
    "DELETE FROM deliveries WHERE run_id IN (SELECT id FROM temp.prune_ids)",
    "DELETE FROM waits WHERE run_id IN (SELECT id FROM temp.prune_ids)",
    "DELETE FROM flow_batch WHERE run_id IN (SELECT id FROM temp.prune_ids)",
    "DELETE FROM runs WHERE id IN (SELECT id FROM temp.prune_ids)",
  };
  if (store__exec(s->w, "CREATE TEMP TABLE IF NOT EXISTS prune_ids(id TEXT PRIMARY KEY)", e) ||
      store__exec(s->w, "BEGIN IMMEDIATE", e))
    return e->code;
  int rc = store__exec(s->w, "DELETE FROM temp.prune_ids", e);
  int n = 0;
  if (!rc) {
    sqlite3_stmt *st = store__prep(s->w,
      "INSERT INTO temp.prune_ids SELECT id FROM runs WHERE status IN"
      " (" VOCAB_RUN_ENDED_SQL ") AND ended_at < ?1 LIMIT ?2", e);
    if (!st) rc = e->code;
    else {
      sqlite3_bind_int64(st, 1, before);
      sqlite3_bind_int(st, 2, PRUNE_BATCH);
      if (sqlite3_step(st) != SQLITE_DONE) rc = store__db_err(e, s->w, "choosing runs to prune");
      n = sqlite3_changes(s->w);
      sqlite3_finalize(st);
    }
  }
  /* The runs leave the figures' rollup in the transaction that deletes them. */
  static const struct store_wq ids = {"SELECT id FROM temp.prune_ids", NULL};
  if (!rc && n) rc = store__rollup_forget(s, &ids, NULL, 0, e);
  for (size_t i = 0; !rc && n && i < sizeof del / sizeof *del; i++) rc = store__exec(s->w, del[i], e);
  if (rc) {
    store__exec(s->w, "ROLLBACK", NULL);
    return rc;
  }
  if (store__exec(s->w, "COMMIT", e)) return e->code;
  return n;
}

/* See store.h: runs batch by batch, then the dispatched events. */
int store__sqlite_prune(store_t *s, int64_t before, int64_t *runs, int64_t *events, err_t *e) {
  *runs = *events = 0;
  int n;
  while ((n = prune_batch(s, before, e)) > 0) *runs += n;
  if (n < 0) return n;
  sqlite3_stmt *st = store__prep(s->w, "DELETE FROM events WHERE dispatched = 1 AND ts < ?1", e);
  if (!st) return e->code;
  sqlite3_bind_int64(st, 1, before);
  int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : store__db_err(e, s->w, "pruning events");
  *events = sqlite3_changes(s->w);
  sqlite3_finalize(st);
  return rc;
}
