/*
** store_sqlite_read.c: the SQLite store's reader: the SQL of every named
** read query (store_backend.h's enum store_rq; store_read.c and
** store_stats.c write the answers from their rows), run list and count
** statements per filter shape, read snapshots, a second reader for the
** figures' overview, and PRAGMA data_version.
**
** Invariants: everything here uses the reader connection (s->r) only, or
** a second read-only connection of its own, never the writer, so a read
** never waits for a commit (WAL) and may run on the loop thread while the
** commit thread writes. The reader's statements are prepared once for the
** connection's life (one per query, one list and one count statement per
** filter shape); a cursor resets its statement when closed, so the reader
** never holds a read transaction between calls unless a snapshot was
** begun (store__sqlite_rbegin).
*/
#include "base/vocab.h"
#include "store/store_db.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The SQL of each read query, in SQLite's dialect: parameters and columns
** as store_backend.h lists them. */
static const char *const rsql[RQ_COUNT] = {
  [RQ_RUN] = "SELECT " STORE_RUN_COLS " FROM runs WHERE id = ?1",
  [RQ_STEPS] =
    "SELECT seq, id, kind, status, output, error, usage, attempts, started_at, ended_at,"
    " wake_at, retry_at FROM steps WHERE run_id = ?1 ORDER BY seq",
  [RQ_ATTEMPTS] =
    "SELECT seq, n, status, error, traceback, started_at, ended_at, retry_at FROM attempts"
    " WHERE run_id = ?1 ORDER BY seq, n",
  [RQ_LOGS] = "SELECT seq, ts, level, msg FROM logs WHERE run_id = ?1 ORDER BY seq, rowid",
  [RQ_CHILDREN] = "SELECT id, skill, status FROM runs WHERE parent_id = ?1 ORDER BY id",
  [RQ_RUN_STATUS] = "SELECT status FROM runs WHERE id = ?1",
  [RQ_KEYED_RUN] = "SELECT id FROM runs WHERE skill = ?1 AND idem = ?2",
  [RQ_EVENT_BY_KEY] = "SELECT name FROM events WHERE idem = ?1",
  /* One indexed query: the ids go in as one JSON array, each looked up
  ** by the primary key. */
  [RQ_RUNS_ENDED] =
    "SELECT id FROM runs WHERE id IN (SELECT value FROM json_each(?1))"
    " AND status IN (" VOCAB_RUN_ENDED_SQL ")",
  [RQ_LIVE_VERSION] = "SELECT version FROM skills WHERE id = ?1",
  /* A step in flight when its process stopped also says how many of its
  ** attempts were interrupted so far (they do not count against its
  ** retries) and when the attempt in flight started (the previous one's
  ** retry_at, or the step's start). */
  [RQ_STEP_JOURNAL] =
    "SELECT seq, id, kind, status, output, error, attempts, started_at, ended_at, wake_at,"
    " retry_at,"
    " CASE WHEN status = 'running' THEN (SELECT count(*) FROM attempts a WHERE"
    "  a.run_id = steps.run_id AND a.seq = steps.seq AND a.status = 'interrupted') END,"
    " CASE WHEN status = 'running' THEN (SELECT a.retry_at FROM attempts a WHERE"
    "  a.run_id = steps.run_id AND a.seq = steps.seq AND a.n = steps.attempts - 1) END"
    " FROM steps WHERE run_id = ?1 ORDER BY seq",
  [RQ_COUNT_BY_STATUS] = VOCAB_RUN_COUNTS_SQL,
  [RQ_VERSION] = "SELECT source, skill, file FROM versions WHERE version = ?1",
  [RQ_SKILL] = "SELECT id, version, file, description, triggers, error FROM skills WHERE id = ?1",
  [RQ_SKILLS] = "SELECT id, version, file, description, triggers, error FROM skills ORDER BY id",
  [RQ_SKILL_VERSIONS] =
    "SELECT version, loaded_at, triggers FROM versions WHERE skill = ?1 ORDER BY loaded_at, rowid",
  /* Delivered waits are few; the runs a process owns may be many: the
  ** delivered ones drive the join (CROSS JOIN fixes the order). */
  [RQ_POLL_DELIVERIES] =
    "SELECT w.run_id, w.seq FROM waits w INDEXED BY waits_delivered CROSS JOIN runs r"
    " ON r.id = w.run_id WHERE w.result IS NOT NULL AND w.kind != 'cancel' AND r.owner = ?1",
  [RQ_POLL_CANCELS] =
    "SELECT id, cancel_reason FROM runs WHERE owner = ?1 AND cancel_requested = 1"
    " AND status NOT IN (" VOCAB_RUN_ENDED_SQL ")",
  /* Slots handed to its queued runs by other runs' releases. */
  [RQ_POLL_GRANTS] =
    "SELECT id FROM runs INDEXED BY runs_granted WHERE owner = ?1 AND slot_granted = 1",
  [RQ_CRON_LAST] = "SELECT last_tick FROM cron_state WHERE skill = ?1 AND spec = ?2",
  [RQ_SERVE_LEASES] =
    "SELECT owner, host, pid, pid_start, expires_at FROM leases WHERE kind = 'serve'",
  /* The health figures (store_stats.c). Ended runs come from runs_ended
  ** alone (it covers every column read): one range per ended status,
  ** which the range says. */
  [RQ_ENDED_SUMS] =
    "SELECT created_at, 0, started_at, ended_at, steps, failed_steps, retries, tokens, id"
    " FROM runs INDEXED BY runs_ended WHERE skill = ?1 AND status = ?4"
    " AND " VOCAB_RUN_ENDED_OR
    " AND created_at >= ?2 AND created_at < ?3",
  [RQ_ENDED] =
    "SELECT created_at, 0, started_at, ended_at"
    " FROM runs INDEXED BY runs_ended WHERE skill = ?1 AND status = ?4"
    " AND " VOCAB_RUN_ENDED_OR
    " AND created_at >= ?2 AND created_at < ?3",
  [RQ_COUNT_ENDED] =
    "SELECT count(*) FROM runs INDEXED BY runs_ended WHERE skill = ?1 AND status = ?4"
    " AND " VOCAB_RUN_ENDED_OR
    " AND created_at >= ?2 AND created_at < ?3",
  [RQ_ROLLUP] =
    "SELECT hour, completed, failed, cancelled, skipped, unstarted, steps, failed_steps, retries,"
    " tokens, dur, wait FROM stats_rollup WHERE skill = ?1 AND hour >= ?2 AND hour < ?3",
  [RQ_ENDED_REFS] =
    "SELECT created_at, id, failed_steps, retries"
    " FROM runs INDEXED BY runs_ended WHERE skill = ?1 AND status = ?4"
    " AND " VOCAB_RUN_ENDED_OR
    " AND created_at >= ?2 AND created_at < ?3",
  /* The runs not ended yet, through runs_status (status, id) from the
  ** window's first ULID on. */
  [RQ_OPEN] =
    "SELECT created_at, 0, started_at, ended_at, NULL, NULL, NULL, NULL, id, skill"
    " FROM runs INDEXED BY runs_status WHERE status IN ('queued','running','sleeping','waiting')"
    " AND id >= ?4 AND created_at >= ?1 AND created_at < ?2 AND (?3 IS NULL OR skill = ?3)",
  [RQ_RUN_STEP_TIMES] =
    "SELECT id, kind, status, attempts, started_at, ended_at FROM steps WHERE run_id = ?1",
  [RQ_VERSIONS_IN] =
    "SELECT version, loaded_at FROM versions WHERE skill = ?1 AND loaded_at >= ?2"
    " AND loaded_at < ?3 ORDER BY loaded_at, rowid",
  [RQ_VERSION_BEFORE] =
    "SELECT version, loaded_at FROM versions WHERE skill = ?1 AND loaded_at < ?2"
    " ORDER BY loaded_at DESC, rowid DESC LIMIT 1",
  [RQ_SKILL_KNOWN] =
    "SELECT 1 FROM skills WHERE id = ?1 UNION ALL SELECT 1 FROM (SELECT 1 FROM runs"
    " WHERE skill = ?1 LIMIT 1)",
  /* A loose scan of runs_skill: one seek per skill. */
  [RQ_SKILL_NAMES] =
    "WITH RECURSIVE k(skill) AS (SELECT min(skill) FROM runs UNION ALL"
    " SELECT (SELECT min(skill) FROM runs WHERE skill > k.skill) FROM k WHERE k.skill IS NOT NULL)"
    " SELECT skill, 0 FROM k WHERE skill IS NOT NULL AND skill NOT IN (SELECT id FROM skills)"
    " UNION ALL SELECT id, 1 FROM skills ORDER BY 1",
  [RQ_EVENTS] =
    "SELECT id, name, data, ts, dispatched, length(data) FROM events ORDER BY id DESC LIMIT ?1",
  [RQ_EVENTS_BEFORE] =
    "SELECT id, name, data, ts, dispatched, length(data) FROM events"
    " WHERE id < ?1 ORDER BY id DESC LIMIT ?2",
  /* runs_event: the runs whose trigger names the event. */
  [RQ_EVENT_RUNS] =
    "SELECT id, skill, status FROM runs WHERE trigger LIKE '{\"kind\":\"event\"%'"
    " AND CASE WHEN json_valid(trigger) THEN json_extract(trigger, '$.event.id') END = ?1"
    " ORDER BY id",
  [RQ_FLOW_QUEUED] =
    "SELECT coalesce(json_extract(queued, '$.reason'), 'engine'), count(*) FROM runs"
    " WHERE status = 'queued' GROUP BY 1",
  [RQ_FLOW_SKIPS] = "SELECT skill, reason, n FROM flow_skips ORDER BY skill, reason",
  [RQ_BATCH_EVENTS] =
    "SELECT json_group_array(json(event)), count(*) FROM (SELECT event FROM flow_batch"
    " WHERE run_id = ?1 ORDER BY seq)",
  /* In the queue's order (slot_queue_order): priority, then since, then id. */
  [RQ_QUEUE_AHEAD] =
    "SELECT count(*) FROM slot_queue me JOIN slot_queue a INDEXED BY slot_queue_order"
    " ON a.skill = me.skill AND a.key = me.key"
    " AND (a.prio > me.prio OR (a.prio = me.prio AND (a.since < me.since"
    "  OR (a.since = me.since AND a.run_id < me.run_id))))"
    " WHERE me.run_id = ?1 AND me.skill = ?2 AND me.key = ?3",
};

/* ---- cursors over statements ------------------------------------------------ */

static int c_next(struct store_cur *c) {
  int rc = sqlite3_step(c->h);
  if (rc == SQLITE_ROW) return 1;
  if (rc == SQLITE_DONE) return 0;
  return ERR_IO;
}
static int c_null(const struct store_cur *c, int i) {
  return sqlite3_column_type(c->h, i) == SQLITE_NULL;
}
static int c_is_int(const struct store_cur *c, int i) {
  return sqlite3_column_type(c->h, i) == SQLITE_INTEGER;
}
static int64_t c_i64(const struct store_cur *c, int i) { return sqlite3_column_int64(c->h, i); }
static const char *c_text(const struct store_cur *c, int i) {
  return (const char *)sqlite3_column_text(c->h, i);
}
static size_t c_bytes(const struct store_cur *c, int i) {
  return (size_t)sqlite3_column_bytes(c->h, i);
}
static int c_err(const struct store_cur *c, err_t *e, const char *what) {
  return store__db_err(e, sqlite3_db_handle(c->h), what);
}
/* Reset the statement (which ends the read transaction it held, so the
** reader never pins an old snapshot), or finalize one of its own. Bindings
** are cleared: text is bound without a copy, so a stale pointer must never
** be read again. */
static void c_close(struct store_cur *c) {
  if (c->owned) {
    sqlite3_finalize(c->h);
    return;
  }
  sqlite3_reset(c->h);
  sqlite3_clear_bindings(c->h);
}

static const struct store_cur_ops cur_ops = {c_next, c_null, c_is_int, c_i64, c_text,
                                             c_bytes, c_err, c_close};

/* See store_db.h. */
void store__sqlite_cur(struct store_cur *c, sqlite3_stmt *st, int owned) {
  memset(c, 0, sizeof *c);
  c->ops = &cur_ops;
  c->h = st;
  c->owned = owned;
}

/* Bind v[0..nv) to st's parameters ?1.. (text without a copy). */
static void bind_vals(sqlite3_stmt *st, const struct store_val *v, int nv) {
  for (int i = 0; i < nv; i++) {
    switch (v[i].type) {
    case STORE_V_TEXT: sqlite3_bind_text(st, i + 1, v[i].s, -1, SQLITE_STATIC); break;
    case STORE_V_INT: sqlite3_bind_int64(st, i + 1, v[i].i); break;
    default: sqlite3_bind_null(st, i + 1); break;
    }
  }
}

/* See store_backend.h: on the reader, from the statement kept for q (one
** of its own when that one is in use: a query nested in itself); on conn,
** from a statement made for the call. */
int store__sqlite_rq(store_t *s, void *conn, enum store_rq q, const struct store_val *v, int nv,
                     struct store_cur *c, err_t *e) {
  sqlite3 *db = conn ? conn : s->r;
  sqlite3_stmt *st = conn ? NULL : s->rq[q];
  int owned = 0;
  if (!st || sqlite3_stmt_busy(st)) {
    sqlite3_stmt *fresh = NULL;
    if (sqlite3_prepare_v3(db, rsql[q], -1, conn ? 0 : SQLITE_PREPARE_PERSISTENT, &fresh,
                           NULL) != SQLITE_OK)
      return store__db_err(e, db, "preparing a query");
    if (!conn && !st) s->rq[q] = fresh;
    else owned = 1;
    st = fresh;
  }
  bind_vals(st, v, nv);
  store__sqlite_cur(c, st, owned);
  return 0;
}

/* See store_backend.h: the writer's statement cached for q's SQLite text. */
int store__sqlite_wq(store_t *s, const struct store_wq *q, const struct store_val *v, int nv,
                     struct store_cur *c, const char *what, err_t *e) {
  (void)what;
  sqlite3_stmt *st = store__cached(s, q->sqlite, e);
  if (!st) return e->code;
  bind_vals(st, v, nv);
  store__sqlite_cur(c, st, 0);
  return 0;
}

/* A run filter's shape: which of its seven conditions are set (a bit
** each), the index of its cached statements. */
static unsigned filter_shape(const struct run_filter *f) {
  return (f->skill ? 1u : 0) | (f->status ? 2u : 0) | (f->trigger ? 4u : 0) |
         (f->parent_id ? 8u : 0) | (f->since ? 16u : 0) | (f->until ? 32u : 0) |
         (f->before ? 64u : 0);
}

/* The WHERE clause of a run filter (parameters ?1 to ?7). */
static void filter_sql(const struct run_filter *f, char *out, size_t n) {
  snprintf(out, n, "WHERE 1%s%s%s%s%s%s%s", f->skill ? " AND skill = ?1" : "",
           f->status ? " AND status = ?2" : "",
           f->trigger ? " AND json_extract(trigger, '$.kind') = ?3" : "",
           f->parent_id ? " AND parent_id = ?4" : "", f->since ? " AND created_at >= ?5" : "",
           f->until ? " AND created_at < ?6" : "", f->before ? " AND id < ?7" : "");
}

/* See store_backend.h: the statement listing (count 0) or counting
** (count 1) the runs of f, prepared once per filter shape. */
int store__sqlite_rfilter(store_t *s, const struct run_filter *f, int count, int limit,
                          struct store_cur *c, err_t *e) {
  unsigned shape = filter_shape(f);
  sqlite3_stmt **slot = &s->rfilter[count][shape];
  if (!*slot) {
    char where[512], sql[1024];
    filter_sql(f, where, sizeof where);
    if (count) snprintf(sql, sizeof sql, "SELECT count(*) FROM runs %s", where);
    else snprintf(sql, sizeof sql, "SELECT " STORE_RUN_COLS " FROM runs %s ORDER BY id DESC LIMIT ?8",
                  where);
    if (sqlite3_prepare_v3(s->r, sql, -1, SQLITE_PREPARE_PERSISTENT, slot, NULL) != SQLITE_OK)
      return store__db_err(e, s->r, "preparing a query");
  }
  sqlite3_stmt *st = *slot;
  struct store_val v[8] = {SV_TEXT(f->skill), SV_TEXT(f->status), SV_TEXT(f->trigger),
                           SV_TEXT(f->parent_id), SV_INT(f->since), SV_INT(f->until),
                           SV_TEXT(f->before), SV_INT(limit)};
  bind_vals(st, v, count ? 7 : 8);
  store__sqlite_cur(c, st, 0);
  return 0;
}

/* Run the reader's BEGIN (k 0) or COMMIT (k 1) from a statement kept for
** it: a record read is a snapshot, and parsing the two words at every read
** cost as much as one of its queries. */
static int reader_tx(store_t *s, int k, err_t *e) {
  static const char *const sql[2] = {"BEGIN", "COMMIT"};
  if (!s->rtx[k] &&
      sqlite3_prepare_v3(s->r, sql[k], -1, SQLITE_PREPARE_PERSISTENT, &s->rtx[k], NULL) != SQLITE_OK)
    return e ? store__db_err(e, s->r, "preparing a read transaction") : ERR_IO;
  int rc = sqlite3_step(s->rtx[k]);
  sqlite3_reset(s->rtx[k]);
  if (rc != SQLITE_DONE) return e ? store__db_err(e, s->r, sql[k]) : ERR_IO;
  return 0;
}

/* See store_backend.h: a read transaction (none when one is open). */
int store__sqlite_rbegin(store_t *s, void *conn, err_t *e) {
  sqlite3 *db = conn ? conn : s->r;
  if (!sqlite3_get_autocommit(db)) return 0;
  if (db == s->r ? reader_tx(s, 0, e) : store__exec(db, "BEGIN", e)) return e->code;
  return 1;
}

void store__sqlite_rend(store_t *s, void *conn, int began) {
  sqlite3 *db = conn ? conn : s->r;
  if (began <= 0) return;
  if (db == s->r) reader_tx(s, 1, NULL);
  else store__exec(db, "COMMIT", NULL);
}

/* See store_backend.h: a read-only connection of its own to the file. */
void *store__sqlite_reader_open(store_t *s, err_t *e) {
  sqlite3 *db = NULL;
  if (sqlite3_open_v2(s->path, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) !=
      SQLITE_OK) {
    store__db_err(e, db, "opening a second reader");
    sqlite3_close(db);
    return NULL;
  }
  sqlite3_busy_timeout(db, 10000);
  store__exec(db, "PRAGMA mmap_size=1073741824", NULL);
  return db;
}

void store__sqlite_reader_close(store_t *s, void *conn) {
  (void)s;
  sqlite3_close(conn);
}

/* See store_db.h. */
void store__sqlite_read_close(store_t *s) {
  for (int i = 0; i < RQ_COUNT; i++) sqlite3_finalize(s->rq[i]);
  sqlite3_finalize(s->dv);
  for (int k = 0; k < 2; k++) sqlite3_finalize(s->rtx[k]);
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < STORE_FILTER_SHAPES; i++) sqlite3_finalize(s->rfilter[k][i]);
}

/* See store.h: asked every 50 ms, so from a statement kept for it. */
int64_t store__sqlite_data_version(store_t *s) {
  if (!s->dv && sqlite3_prepare_v3(s->r, "PRAGMA data_version", -1, SQLITE_PREPARE_PERSISTENT,
                                &s->dv, NULL) != SQLITE_OK)
    return -1;
  sqlite3_stmt *st = s->dv;
  int64_t v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
  sqlite3_reset(st);
  return v;
}
