/*
** store_pg_read.c: the PostgreSQL store's reader: the SQL of every named
** read query (store_backend.h's enum store_rq, in PostgreSQL's dialect;
** store_read.c and store_stats.c write the answers from the rows), run
** list and count statements per filter shape, read snapshots, and cursors
** over results.
**
** Everything here uses the reader connection (s->r), never the writer,
** as on SQLite. A result is read whole (libpq's default), so a cursor
** never fails once its query succeeded. A snapshot is a REPEATABLE READ,
** READ ONLY transaction: a run record's queries see one state.
*/
#include "base/vocab.h"
#include "store/store_pg_db.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The SQL of each read query: parameters and columns as store_backend.h
** lists them, the same as store_sqlite_read.c's. */
static const char *const rsql[RQ_COUNT] = {
  [RQ_RUN] = "SELECT " STORE_RUN_COLS " FROM runs WHERE id = $1",
  [RQ_STEPS] =
    "SELECT seq, id, kind, status, output, error, usage, attempts, started_at, ended_at,"
    " wake_at, retry_at FROM steps WHERE run_id = $1 ORDER BY seq",
  [RQ_ATTEMPTS] =
    "SELECT seq, n, status, error, traceback, started_at, ended_at, retry_at FROM attempts"
    " WHERE run_id = $1 ORDER BY seq, n",
  [RQ_LOGS] = "SELECT seq, ts, level, msg FROM logs WHERE run_id = $1 ORDER BY seq, n",
  [RQ_CHILDREN] = "SELECT id, skill, status FROM runs WHERE parent_id = $1 ORDER BY id",
  [RQ_RUN_STATUS] = "SELECT status FROM runs WHERE id = $1",
  [RQ_KEYED_RUN] = "SELECT id FROM runs WHERE skill = $1 AND idem = $2",
  [RQ_EVENT_BY_KEY] = "SELECT name FROM events WHERE idem = $1",
  [RQ_RUNS_ENDED] =
    "SELECT id FROM runs WHERE id IN (SELECT json_array_elements_text($1::json))"
    " AND status IN (" VOCAB_RUN_ENDED_SQL ")",
  [RQ_LIVE_VERSION] = "SELECT version FROM skills WHERE id = $1",
  [RQ_STEP_JOURNAL] =
    "SELECT seq, id, kind, status, output, error, attempts, started_at, ended_at, wake_at,"
    " retry_at,"
    " CASE WHEN status = 'running' THEN (SELECT count(*) FROM attempts a WHERE"
    "  a.run_id = steps.run_id AND a.seq = steps.seq AND a.status = 'interrupted') END,"
    " CASE WHEN status = 'running' THEN (SELECT a.retry_at FROM attempts a WHERE"
    "  a.run_id = steps.run_id AND a.seq = steps.seq AND a.n = steps.attempts - 1) END"
    " FROM steps WHERE run_id = $1 ORDER BY seq",
  [RQ_COUNT_BY_STATUS] = VOCAB_RUN_COUNTS_SQL,
  [RQ_VERSION] = "SELECT source, skill, file FROM versions WHERE version = $1",
  [RQ_SKILL] = "SELECT id, version, file, description, triggers, error FROM skills WHERE id = $1",
  [RQ_SKILLS] = "SELECT id, version, file, description, triggers, error FROM skills ORDER BY id",
  [RQ_SKILL_VERSIONS] =
    "SELECT version, loaded_at, triggers FROM versions WHERE skill = $1 ORDER BY loaded_at, n",
  [RQ_POLL_DELIVERIES] =
    "SELECT w.run_id, w.seq FROM waits w JOIN runs r ON r.id = w.run_id"
    " WHERE w.result IS NOT NULL AND w.kind != 'cancel' AND r.owner = $1",
  [RQ_POLL_CANCELS] =
    "SELECT id, cancel_reason FROM runs WHERE owner = $1 AND cancel_requested = 1"
    " AND status NOT IN (" VOCAB_RUN_ENDED_SQL ")",
  [RQ_POLL_GRANTS] = "SELECT id FROM runs WHERE owner = $1 AND slot_granted = 1",
  [RQ_CRON_LAST] = "SELECT last_tick FROM cron_state WHERE skill = $1 AND spec = $2",
  [RQ_SERVE_LEASES] =
    "SELECT owner, host, pid, pid_start, expires_at FROM leases WHERE kind = 'serve'",
  /* Ended runs from runs_ended alone (an index-only scan). */
  [RQ_ENDED_SUMS] =
    "SELECT created_at, 0, started_at, ended_at, steps, failed_steps, retries, tokens, id"
    " FROM runs WHERE skill = $1 AND status = $4"
    " AND status IN (" VOCAB_RUN_ENDED_SQL ") AND created_at >= $2 AND created_at < $3",
  [RQ_ENDED] =
    "SELECT created_at, 0, started_at, ended_at"
    " FROM runs WHERE skill = $1 AND status = $4"
    " AND status IN (" VOCAB_RUN_ENDED_SQL ") AND created_at >= $2 AND created_at < $3",
  [RQ_COUNT_ENDED] =
    "SELECT count(*) FROM runs WHERE skill = $1 AND status = $4"
    " AND status IN (" VOCAB_RUN_ENDED_SQL ") AND created_at >= $2 AND created_at < $3",
  [RQ_ROLLUP] =
    "SELECT hour, completed, failed, cancelled, skipped, unstarted, steps, failed_steps, retries,"
    " tokens, dur, wait FROM stats_rollup WHERE skill = $1 AND hour >= $2 AND hour < $3",
  [RQ_ENDED_REFS] =
    "SELECT created_at, id, failed_steps, retries FROM runs WHERE skill = $1 AND status = $4"
    " AND status IN (" VOCAB_RUN_ENDED_SQL ") AND created_at >= $2 AND created_at < $3",
  [RQ_OPEN] =
    "SELECT created_at, 0, started_at, ended_at, NULL, NULL, NULL, NULL, id, skill"
    " FROM runs WHERE status IN ('queued','running','sleeping','waiting')"
    " AND id >= $4 AND created_at >= $1 AND created_at < $2 AND ($3::text IS NULL OR skill = $3)",
  [RQ_RUN_STEP_TIMES] =
    "SELECT id, kind, status, attempts, started_at, ended_at FROM steps WHERE run_id = $1",
  [RQ_VERSIONS_IN] =
    "SELECT version, loaded_at FROM versions WHERE skill = $1 AND loaded_at >= $2"
    " AND loaded_at < $3 ORDER BY loaded_at, n",
  [RQ_VERSION_BEFORE] =
    "SELECT version, loaded_at FROM versions WHERE skill = $1 AND loaded_at < $2"
    " ORDER BY loaded_at DESC, n DESC LIMIT 1",
  [RQ_SKILL_KNOWN] =
    "SELECT 1 FROM skills WHERE id = $1 UNION ALL (SELECT 1 FROM runs WHERE skill = $1 LIMIT 1)",
  /* A loose scan of runs_skill: one seek per skill. */
  [RQ_SKILL_NAMES] =
    "WITH RECURSIVE k(skill) AS (SELECT min(skill) FROM runs UNION ALL"
    " SELECT (SELECT min(skill) FROM runs WHERE skill > k.skill) FROM k WHERE k.skill IS NOT NULL)"
    " SELECT skill, 0 FROM k WHERE skill IS NOT NULL AND skill NOT IN (SELECT id FROM skills)"
    " UNION ALL SELECT id, 1 FROM skills ORDER BY 1",
  [RQ_EVENTS] =
    "SELECT id, name, data, ts, dispatched, length(data) FROM events ORDER BY id DESC LIMIT $1",
  [RQ_EVENTS_BEFORE] =
    "SELECT id, name, data, ts, dispatched, length(data) FROM events"
    " WHERE id < $1 ORDER BY id DESC LIMIT $2",
  /* runs_event: the runs whose trigger names the event. */
  [RQ_EVENT_RUNS] =
    "SELECT id, skill, status FROM runs WHERE trigger LIKE '{\"kind\":\"event\"%'"
    " AND ((trigger::json) #>> '{event,id}') = $1 ORDER BY id",
  [RQ_FLOW_QUEUED] =
    "SELECT coalesce(queued::json ->> 'reason', 'engine'), count(*) FROM runs"
    " WHERE status = 'queued' GROUP BY 1",
  [RQ_FLOW_SKIPS] = "SELECT skill, reason, n FROM flow_skips ORDER BY skill, reason",
  [RQ_BATCH_EVENTS] =
    "SELECT json_agg(event::json ORDER BY seq)::text, count(*) FROM flow_batch WHERE run_id = $1",
  /* In the queue's order (slot_queue_order): priority, then since, then id. */
  [RQ_QUEUE_AHEAD] =
    "SELECT count(*) FROM slot_queue me JOIN slot_queue a"
    " ON a.skill = me.skill AND a.key = me.key"
    " AND (a.prio > me.prio OR (a.prio = me.prio AND (a.since < me.since"
    "  OR (a.since = me.since AND a.run_id < me.run_id))))"
    " WHERE me.run_id = $1 AND me.skill = $2 AND me.key = $3",
};

/* ---- cursors over results ------------------------------------------------------ */

static int c_next(struct store_cur *c) { return ++c->row < c->nrows ? 1 : 0; }
static int c_null(const struct store_cur *c, int i) { return PQgetisnull(c->h, c->row, i); }
/* int2, int4, int8 (pg_type's oids 21, 23, 20). */
static int c_is_int(const struct store_cur *c, int i) {
  Oid t = PQftype(c->h, i);
  return !PQgetisnull(c->h, c->row, i) && (t == 20 || t == 21 || t == 23);
}
static int64_t c_i64(const struct store_cur *c, int i) {
  return PQgetisnull(c->h, c->row, i) ? 0 : atoll(PQgetvalue(c->h, c->row, i));
}
static const char *c_text(const struct store_cur *c, int i) {
  return PQgetisnull(c->h, c->row, i) ? NULL : PQgetvalue(c->h, c->row, i);
}
static size_t c_bytes(const struct store_cur *c, int i) {
  return (size_t)PQgetlength(c->h, c->row, i);
}
static int c_err(const struct store_cur *c, err_t *e, const char *what) {
  (void)c;
  return err_set(e, ERR_IO, "store: %s: the result ended early", what);
}
static void c_close(struct store_cur *c) { PQclear(c->h); }

static const struct store_cur_ops cur_ops = {c_next, c_null, c_is_int, c_i64, c_text,
                                             c_bytes, c_err, c_close};

/* See store_pg_db.h. */
void store__pg_cur(struct store_cur *c, PGresult *res) {
  memset(c, 0, sizeof *c);
  c->ops = &cur_ops;
  c->h = res;
  c->row = -1;
  c->nrows = PQntuples(res);
}

/* See store_backend.h: on the writer, prepared once per session. */
int store__pg_wq(store_t *st, const struct store_wq *q, const struct store_val *v, int nv,
                 struct store_cur *c, const char *what, err_t *e) {
  struct pg_store *s = pg_of(st);
  PGresult *r = store__pg_run(s, &s->w, q, q->pg, v, nv, what, e);
  if (!r) return e->code;
  store__pg_cur(c, r);
  return 0;
}

/* See store_backend.h: on the reader. */
int store__pg_rq(store_t *st, void *conn, enum store_rq q, const struct store_val *v, int nv,
                 struct store_cur *c, err_t *e) {
  (void)conn;
  struct pg_store *s = pg_of(st);
  PGresult *r = store__pg_run(s, &s->r, NULL, rsql[q], v, nv, "reading", e);
  if (!r) return e->code;
  store__pg_cur(c, r);
  return 0;
}

/* See store_backend.h: the statement of each filter shape, with its
** parameters numbered in the order of the conditions it has (PostgreSQL
** wants every parameter it is given used). */
int store__pg_rfilter(store_t *st, const struct run_filter *f, int count, int limit,
                      struct store_cur *c, err_t *e) {
  struct pg_store *s = pg_of(st);
  struct store_val v[8];
  int n = 0;
  char where[512] = "WHERE true";
  size_t w = strlen(where);
#define COND(set, sql, val)                                                    \
  if (set) {                                                                   \
    v[n++] = val;                                                              \
    w += (size_t)snprintf(where + w, sizeof where - w, sql, n);                \
  }
  COND(f->skill, " AND skill = $%d", SV_TEXT(f->skill));
  COND(f->status, " AND status = $%d", SV_TEXT(f->status));
  COND(f->trigger, " AND (trigger::json ->> 'kind') = $%d", SV_TEXT(f->trigger));
  COND(f->parent_id, " AND parent_id = $%d", SV_TEXT(f->parent_id));
  COND(f->since, " AND created_at >= $%d", SV_INT(f->since));
  COND(f->until, " AND created_at < $%d", SV_INT(f->until));
  COND(f->before, " AND id < $%d", SV_TEXT(f->before));
#undef COND
  unsigned shape = (f->skill ? 1u : 0) | (f->status ? 2u : 0) | (f->trigger ? 4u : 0) |
                   (f->parent_id ? 8u : 0) | (f->since ? 16u : 0) | (f->until ? 32u : 0) |
                   (f->before ? 64u : 0);
  char sql[1024];
  if (count) {
    snprintf(sql, sizeof sql, "SELECT count(*) FROM runs %s", where);
  } else {
    v[n++] = SV_INT(limit);
    snprintf(sql, sizeof sql, "SELECT " STORE_RUN_COLS " FROM runs %s ORDER BY id DESC LIMIT $%d",
             where, n);
  }
  PGresult *r = store__pg_run(s, &s->r, &s->filter_keys[count][shape], sql, v, n, "listing runs", e);
  if (!r) return e->code;
  store__pg_cur(c, r);
  return 0;
}

/* See store_backend.h. */
int store__pg_rbegin(store_t *st, void *conn, err_t *e) {
  (void)conn;
  struct pg_store *s = pg_of(st);
  if (store__pg_ensure(s, &s->r, e)) return e->code;
  if (PQtransactionStatus(s->r.c) != PQTRANS_IDLE) return 0;
  if (store__pg_exec(s, &s->r, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
                     "beginning a read", e))
    return e->code;
  return 1;
}

void store__pg_rend(store_t *st, void *conn, int began) {
  (void)conn;
  struct pg_store *s = pg_of(st);
  if (began <= 0 || !s->r.c) return;
  PGresult *r = store__pg_exec_raw(&s->r, "COMMIT");
  PQclear(r);
}
