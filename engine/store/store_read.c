/*
** store_read.c: the reads of the SQLite store (store.h's "reads"): run
** records in DESIGN's JSON shape (with their steps, attempts, logs and
** child runs), the steps a replay needs, run lists and counts, skill
** records and versions, what a process's runs got from others (store_poll),
** cron state, and whether a serve engine holds the database.
**
** Invariants: every function here uses the reader connection (s->r) only,
** never the writer, so a read never waits for a commit (WAL) and may run on
** the loop thread while the commit thread writes. A read that needs several
** queries (a run with its steps) runs them in one snapshot. Times are
** stored as ms since the epoch and shown as RFC 3339; JSON columns are
** shown as the JSON they hold (text that is not JSON becomes a string).
**
** Run records and lists are read often (every API read, every attach):
** they come from prepared statements kept for the connection's life
** (store__rcached, and one list and one count statement per filter shape)
** and are written as JSON text straight from the rows; the cJSON forms
** parse that text, so the record's shape is written in one place. A
** cached statement is reset as soon as it is read (done()), so the reader
** never holds a read transaction between calls.
*/
#include "base/fault.h"
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/proc.h"
#include "base/units.h"
#include "base/vocab.h"
#include "store/store_db.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the reader's statements ------------------------------------------ */

/* See store_db.h: keyed by the SQL text's address, like store__cached on
** the writer. Bindings are cleared (text is bound without a copy, so a
** stale pointer must never be read again). */
sqlite3_stmt *store__rcached(store_t *s, const char *sql, err_t *e) {
  if (fault_hit(FAULT_READER_BUSY)) {
    err_set(e, ERR_BUSY, "store: reading: database is locked (fault injected: reader_busy)");
    return NULL;
  }
  int i = 0;
  for (; i < STORE_RCACHED_STMTS && s->rcache[i].sql; i++)
    if (s->rcache[i].sql == sql) {
      sqlite3_clear_bindings(s->rcache[i].st);
      return s->rcache[i].st;
    }
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v3(s->r, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL) != SQLITE_OK) {
    store__db_err(e, s->r, "preparing a query");
    return NULL;
  }
  if (i < STORE_RCACHED_STMTS) {
    s->rcache[i].sql = sql;
    s->rcache[i].st = st;
  } else {
    /* Only non-static SQL could fill the cache: keep working, uncached. */
    sqlite3_finalize(st);
    return store__prep(s->r, sql, e);
  }
  return st;
}

/* Done with a cached read statement (NULL: nothing): reset it, which ends
** the read transaction it held, so the reader never pins an old snapshot. */
static void done(sqlite3_stmt *st) {
  if (st) sqlite3_reset(st);
}

/* See store_db.h. */
void store__read_close(store_t *s) {
  for (int i = 0; i < STORE_RCACHED_STMTS; i++) sqlite3_finalize(s->rcache[i].st);
  buf_free(&s->scratch);
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < STORE_FILTER_SHAPES; i++) sqlite3_finalize(s->rfilter[k][i]);
}

/* ---- run records as JSON text ------------------------------------------
** Written straight into a buffer from the rows: no tree, no allocation
** per value. JSON columns (trigger, input, output, error, usage) hold JSON
** the engine wrote and go as they are (jsontext_put_value); text columns
** are escaped, with bytes that are not UTF-8 shown as U+FFFD. */

/* ,"key": and "key": for a literal key. */
#define KEY(b, k) BUF_LIT(b, ",\"" k "\":")
#define KEY1(b, k) BUF_LIT(b, "\"" k "\":")

/* Column i as a JSON string, or null. */
static void put_text(buf_t *b, sqlite3_stmt *st, int i) {
  const char *t = (const char *)sqlite3_column_text(st, i);
  if (!t) BUF_LIT(b, "null");
  else jsontext_put_string(b, t, (size_t)sqlite3_column_bytes(st, i));
}

/* Column i (JSON text) as a value, or null. */
static void put_json(buf_t *b, sqlite3_stmt *st, int i) {
  const char *t = (const char *)sqlite3_column_text(st, i);
  jsontext_put_value(b, t, t ? (size_t)sqlite3_column_bytes(st, i) : 0);
}

/* A time in ms as an RFC 3339 string (0 or less: null, as the store's
** NULL times are). */
static void put_ms(buf_t *b, int64_t ms) {
  char ts[40];
  units_rfc3339(ms, ts, sizeof ts);
  buf_add(b, "\"", 1);
  buf_puts(b, ts);
  buf_add(b, "\"", 1);
}

/* Column i as an RFC 3339 time, or null. */
static void put_time(buf_t *b, sqlite3_stmt *st, int i) {
  if (sqlite3_column_type(st, i) == SQLITE_NULL) BUF_LIT(b, "null");
  else put_ms(b, sqlite3_column_int64(st, i));
}

/* ,"key": followed by one of the put functions' values. */
#define PUT(b, k, fn, ...) (KEY(b, k), fn(b, __VA_ARGS__))
#define PUT1(b, k, fn, ...) (KEY1(b, k), fn(b, __VA_ARGS__))

/* The fields of a run record without steps, from a row of STORE_RUN_COLS,
** after its opening brace (the caller closes it). */
static void put_record_fields(buf_t *b, sqlite3_stmt *st) {
  PUT1(b, "id", put_text, st, 0);
  PUT(b, "skill", put_text, st, 1);
  PUT(b, "version", put_text, st, 2);
  PUT(b, "status", put_text, st, 3);
  PUT(b, "trigger", put_json, st, 5);
  PUT(b, "parent_id", put_text, st, 6);
  PUT(b, "input", put_json, st, 7);
  PUT(b, "output", put_json, st, 8);
  PUT(b, "error", put_json, st, 9);
  PUT(b, "created_at", put_time, st, 10);
  PUT(b, "started_at", put_time, st, 11);
  PUT(b, "ended_at", put_time, st, 12);
  if (sqlite3_column_type(st, 13) != SQLITE_NULL) PUT(b, "deadline_at", put_time, st, 13);
  if (sqlite3_column_type(st, 14) != SQLITE_NULL) PUT(b, "wake_at", put_time, st, 14);
  /* Why it waits to start (flow control: store_queue.c), while it does. */
  PUT(b, "queued", put_json, st, 16);
}

/* Append the rows of the log cursor lg (seq, ts, level, msg) that belong
** to seq, from where it stands, as [{ts, level, msg}]; *lrc is the
** cursor's last step code. */
static void put_logs(buf_t *b, sqlite3_stmt *lg, int *lrc, int seq) {
  buf_add(b, "[", 1);
  for (int first = 1; *lrc == SQLITE_ROW && sqlite3_column_int(lg, 0) == seq; first = 0) {
    buf_add(b, first ? "{" : ",{", first ? 1 : 2);
    PUT1(b, "ts", put_time, lg, 1);
    PUT(b, "level", put_text, lg, 2);
    PUT(b, "msg", put_text, lg, 3);
    buf_add(b, "}", 1);
    *lrc = sqlite3_step(lg);
  }
  buf_add(b, "]", 1);
}

/* The attempts of the step row st: the failed ones from the attempt
** cursor at (seq, n, status, error, traceback, started_at, ended_at,
** retry_at; *arc its last step code), then the one the step row implies. */
static void put_attempts(buf_t *b, sqlite3_stmt *st, sqlite3_stmt *at, int *arc) {
  int seq = sqlite3_column_int(st, 0);
  int nattempts = sqlite3_column_int(st, 7);
  const char *status = (const char *)sqlite3_column_text(st, 3);
  int last_n = 0, first = 1;
  int64_t next_start = sqlite3_column_int64(st, 8);
  buf_add(b, "[", 1);
  while (*arc == SQLITE_ROW && sqlite3_column_int(at, 0) < seq) *arc = sqlite3_step(at);
  for (; *arc == SQLITE_ROW && sqlite3_column_int(at, 0) == seq; first = 0) {
    last_n = sqlite3_column_int(at, 1);
    buf_add(b, first ? "{" : ",{", first ? 1 : 2);
    PUT1(b, "n", jsontext_put_int, last_n);
    PUT(b, "status", put_text, at, 2);
    PUT(b, "error", put_text, at, 3);
    if (sqlite3_column_type(at, 4) != SQLITE_NULL) PUT(b, "traceback", put_text, at, 4);
    PUT(b, "started_at", put_time, at, 5);
    PUT(b, "ended_at", put_time, at, 6);
    if (sqlite3_column_type(at, 7) != SQLITE_NULL) {
      PUT(b, "retry_at", put_time, at, 7);
      next_start = sqlite3_column_int64(at, 7);
    }
    buf_add(b, "}", 1);
    *arc = sqlite3_step(at);
  }
  /* The attempt that succeeded, or the one in flight, is implied by the
  ** step row: it started when the last failed attempt's backoff ended. */
  const char *kind = (const char *)sqlite3_column_text(st, 2);
  int word = vocab_step_status(status);
  if (vocab_step_kind(kind) == STEP_KIND_RUN && last_n < nattempts &&
      (word == STEP_COMPLETED || word == STEP_RUNNING)) {
    buf_add(b, first ? "{" : ",{", first ? 1 : 2);
    PUT1(b, "n", jsontext_put_int, nattempts);
    PUT(b, "status", jsontext_put_string, status, strlen(status));
    KEY(b, "error");
    BUF_LIT(b, "null");
    KEY(b, "started_at");
    if (next_start) put_ms(b, next_start);
    else BUF_LIT(b, "null");
    PUT(b, "ended_at", put_time, st, 9);
    buf_add(b, "}", 1);
  }
  buf_add(b, "]", 1);
}

static const char STEPS_SQL[] =
  "SELECT seq, id, kind, status, output, error, usage, attempts, started_at, ended_at,"
  " wake_at, retry_at FROM steps WHERE run_id = ?1 ORDER BY seq";
static const char ATTEMPTS_SQL[] =
  "SELECT seq, n, status, error, traceback, started_at, ended_at, retry_at FROM attempts"
  " WHERE run_id = ?1 ORDER BY seq, n";
static const char LOGS_SQL[] =
  "SELECT seq, ts, level, msg FROM logs WHERE run_id = ?1 ORDER BY seq, rowid";
static const char CHILDREN_SQL[] =
  "SELECT id, skill, status FROM runs WHERE parent_id = ?1 ORDER BY id";
static const char RUN_SQL[] = "SELECT " STORE_RUN_COLS " FROM runs WHERE id = ?1";

/* Append ,"steps":[...],"logs":[...],"children":[...] for run id: the
** step, attempt and log queries are ordered by seq and walked together. */
static int put_steps(store_t *s, buf_t *b, const char *id, err_t *e) {
  sqlite3_stmt *st = store__rcached(s, STEPS_SQL, e);
  sqlite3_stmt *at = st ? store__rcached(s, ATTEMPTS_SQL, e) : NULL;
  sqlite3_stmt *lg = at ? store__rcached(s, LOGS_SQL, e) : NULL;
  sqlite3_stmt *ch = lg ? store__rcached(s, CHILDREN_SQL, e) : NULL;
  if (!ch) return e->code;
  store__bind_text(st, 1, id);
  store__bind_text(at, 1, id);
  store__bind_text(lg, 1, id);
  store__bind_text(ch, 1, id);
  int arc = sqlite3_step(at), lrc = sqlite3_step(lg), src, crc, first = 1;
  KEY(b, "steps");
  buf_add(b, "[", 1);
  /* Run-level logs come before any step (seq 0); they are written after
  ** the steps, so they wait in the store's scratch buffer. */
  buf_t *runlogs = &s->scratch;
  runlogs->len = 0;
  put_logs(runlogs, lg, &lrc, 0);
  for (; (src = sqlite3_step(st)) == SQLITE_ROW; first = 0) {
    int seq = sqlite3_column_int(st, 0);
    buf_add(b, first ? "{" : ",{", first ? 1 : 2);
    PUT1(b, "seq", jsontext_put_int, seq);
    PUT(b, "id", put_text, st, 1);
    PUT(b, "kind", put_text, st, 2);
    PUT(b, "status", put_text, st, 3);
    PUT(b, "output", put_json, st, 4);
    PUT(b, "error", put_text, st, 5);
    if (sqlite3_column_type(st, 6) != SQLITE_NULL) PUT(b, "usage", put_json, st, 6);
    PUT(b, "started_at", put_time, st, 8);
    PUT(b, "ended_at", put_time, st, 9);
    if (sqlite3_column_type(st, 10) != SQLITE_NULL) PUT(b, "wake_at", put_time, st, 10);
    PUT(b, "attempts", put_attempts, st, at, &arc);
    while (lrc == SQLITE_ROW && sqlite3_column_int(lg, 0) < seq) lrc = sqlite3_step(lg);
    PUT(b, "logs", put_logs, lg, &lrc, seq);
    buf_add(b, "}", 1);
  }
  buf_add(b, "]", 1);
  PUT(b, "logs", buf_add, buf_str(runlogs), runlogs->len);
  KEY(b, "children");
  buf_add(b, "[", 1);
  for (first = 1; (crc = sqlite3_step(ch)) == SQLITE_ROW; first = 0) {
    buf_add(b, first ? "{" : ",{", first ? 1 : 2);
    PUT1(b, "id", put_text, ch, 0);
    PUT(b, "skill", put_text, ch, 1);
    PUT(b, "status", put_text, ch, 2);
    buf_add(b, "}", 1);
  }
  buf_add(b, "]", 1);
  int bad = (src != SQLITE_DONE) || (crc != SQLITE_DONE);
  done(st), done(at), done(lg), done(ch);
  if (bad) return store__db_err(e, s->r, "reading a run's steps");
  return 0;
}

/* See store.h. */
int store_run_json(store_t *s, const char *id, int with_steps, buf_t *out, err_t *e) {
  sqlite3_stmt *st = store__rcached(s, RUN_SQL, e);
  if (!st) return e->code;
  store__bind_text(st, 1, id);
  int rc = sqlite3_step(st);
  if (rc != SQLITE_ROW) {
    done(st);
    if (rc != SQLITE_DONE) return store__db_err(e, s->r, "reading a run");
    return err_set(e, ERR_NOTFOUND, "no run with id '%s'", id);
  }
  size_t at = out->len;
  buf_add(out, "{", 1);
  put_record_fields(out, st);
  /* The run statement stays open while the steps are read: one read
  ** transaction, so the steps are those of the same snapshot as the run. */
  rc = with_steps ? put_steps(s, out, id, e) : 0;
  done(st);
  buf_add(out, "}", 1);
  if (rc) {
    out->len = at;
    if (out->p) out->p[at] = 0;
  }
  return rc;
}

/* See store.h: the JSON text, parsed (the engine wrote it: it parses). */
int store_get_run(store_t *s, const char *id, int with_steps, cJSON **out, err_t *e) {
  *out = NULL;
  buf_t b = BUF_INIT;
  int rc = store_run_json(s, id, with_steps, &b, e);
  if (!rc && !(*out = cJSON_ParseWithLength(buf_str(&b), b.len)))
    rc = err_set(e, ERR_INTERNAL, "store: a run record that is not JSON: %.200s", buf_str(&b));
  buf_free(&b);
  return rc;
}

/* See store.h. */
int store_run_status(store_t *s, const char *id, char *status, size_t n, err_t *e) {
  static const char sql[] = "SELECT status FROM runs WHERE id = ?1";
  sqlite3_stmt *st = store__rcached(s, sql, e);
  if (!st) return e->code;
  store__bind_text(st, 1, id);
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) snprintf(status, n, "%s", (const char *)sqlite3_column_text(st, 0));
  done(st);
  if (rc == SQLITE_ROW) return 0;
  if (rc != SQLITE_DONE) return store__db_err(e, s->r, "reading a run");
  return err_set(e, ERR_NOTFOUND, "no run with id '%s'", id);
}

/* See store.h: one indexed query; the ids go in as one JSON array, each
** looked up by the primary key. */
int store_runs_ended(store_t *s, const char *ids_json, void (*cb)(void *arg, const char *id),
                     void *arg, err_t *e) {
  static const char sql[] =
    "SELECT id FROM runs WHERE id IN (SELECT value FROM json_each(?1))"
    " AND status IN ('completed','failed','cancelled')";
  sqlite3_stmt *st = store__rcached(s, sql, e);
  if (!st) return e->code;
  store__bind_text(st, 1, ids_json);
  int rc, n = 0;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    cb(arg, (const char *)sqlite3_column_text(st, 0));
    n++;
  }
  done(st);
  if (rc != SQLITE_DONE) return store__db_err(e, s->r, "reading runs' statuses");
  return n;
}

/* See store.h. */
int store_live_version(store_t *s, const char *skill, char *version, size_t n, err_t *e) {
  static const char sql[] = "SELECT version FROM skills WHERE id = ?1";
  sqlite3_stmt *st = store__rcached(s, sql, e);
  if (!st) return e->code;
  store__bind_text(st, 1, skill);
  int rc = sqlite3_step(st);
  const char *v = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(st, 0) : NULL;
  if (v) snprintf(version, n, "%s", v);
  done(st);
  if (v) return 0;
  if (rc == SQLITE_ROW) return err_set(e, ERR_NOTFOUND, "skill '%s' has no live version", skill);
  if (rc != SQLITE_DONE) return store__db_err(e, s->r, "reading a skill");
  return err_set(e, ERR_NOTFOUND, "no skill '%s' is registered", skill);
}

/* See store.h: each column that is not NULL, as a number or a string. */
int store_get_steps(store_t *s, const char *run_id, cJSON **out, err_t *e) {
  /* A step in flight when its process stopped also says how many of its
  ** attempts were interrupted so far (they do not count against its
  ** retries) and when the attempt in flight started (the previous one's
  ** retry_at, or the step's start). */
  static const char sql[] =
    "SELECT seq, id, kind, status, output, error, attempts, started_at, ended_at, wake_at,"
    " retry_at,"
    " CASE WHEN status = 'running' THEN (SELECT count(*) FROM attempts a WHERE"
    "  a.run_id = steps.run_id AND a.seq = steps.seq AND a.status = 'interrupted') END,"
    " CASE WHEN status = 'running' THEN (SELECT a.retry_at FROM attempts a WHERE"
    "  a.run_id = steps.run_id AND a.seq = steps.seq AND a.n = steps.attempts - 1) END"
    " FROM steps WHERE run_id = ?1 ORDER BY seq";
  *out = NULL;
  sqlite3_stmt *st = store__rcached(s, sql, e);
  if (!st) return e->code;
  store__bind_text(st, 1, run_id);
  cJSON *arr = cJSON_CreateArray();
  static const char *const names[] = {"seq", "id", "kind", "status", "output", "error",
                                      "attempts", "started_at", "ended_at", "wake_at",
                                      "retry_at", "interrupted", "attempt_started_at"};
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < 13; i++) {
      switch (sqlite3_column_type(st, i)) {
      case SQLITE_NULL: break;
      case SQLITE_INTEGER:
        cJSON_AddNumberToObject(o, names[i], (double)sqlite3_column_int64(st, i));
        break;
      default:
        cJSON_AddStringToObject(o, names[i], (const char *)sqlite3_column_text(st, i));
      }
    }
    cJSON_AddItemToArray(arr, o);
  }
  done(st);
  if (rc != SQLITE_DONE) {
    cJSON_Delete(arr);
    return store__db_err(e, s->r, "reading steps");
  }
  *out = arr;
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

/* Bind a run filter's values to filter_sql's parameters. */
static void filter_bind(sqlite3_stmt *st, const struct run_filter *f) {
  store__bind_text(st, 1, f->skill);
  store__bind_text(st, 2, f->status);
  store__bind_text(st, 3, f->trigger);
  store__bind_text(st, 4, f->parent_id);
  sqlite3_bind_int64(st, 5, f->since);
  sqlite3_bind_int64(st, 6, f->until);
  store__bind_text(st, 7, f->before);
}

/* The statement listing (count 0) or counting (count 1) the runs of f,
** bound; prepared once per filter shape. */
static sqlite3_stmt *filter_stmt(store_t *s, const struct run_filter *f, int count, err_t *e) {
  unsigned shape = filter_shape(f);
  sqlite3_stmt **slot = &s->rfilter[count][shape];
  if (!*slot) {
    char where[512], sql[1024];
    filter_sql(f, where, sizeof where);
    if (count) snprintf(sql, sizeof sql, "SELECT count(*) FROM runs %s", where);
    else snprintf(sql, sizeof sql, "SELECT " STORE_RUN_COLS " FROM runs %s ORDER BY id DESC LIMIT ?8",
                  where);
    if (sqlite3_prepare_v3(s->r, sql, -1, SQLITE_PREPARE_PERSISTENT, slot, NULL) != SQLITE_OK) {
      store__db_err(e, s->r, "preparing a query");
      return NULL;
    }
  }
  sqlite3_clear_bindings(*slot);
  filter_bind(*slot, f);
  return *slot;
}

/* See store.h. */
int store_list_runs_json(store_t *s, const struct run_filter *f, buf_t *out, char *next,
                         size_t nnext, err_t *e) {
  int limit = f->limit > 0 ? f->limit : 100;
  sqlite3_stmt *st = filter_stmt(s, f, 0, e);
  if (!st) return e->code;
  /* One more than asked when the caller pages: its presence says there is
  ** a next page, which starts below the last run shown. */
  sqlite3_bind_int(st, 8, next ? limit + 1 : limit);
  if (next) next[0] = 0;
  size_t at = out->len;
  int rc = 0, src, n = 0;
  buf_add(out, "[", 1);
  char last_id[64] = "";
  while ((src = sqlite3_step(st)) == SQLITE_ROW) {
    if (n == limit) {
      /* The row past the page: the last one written is where the next starts. */
      if (next) snprintf(next, nnext, "%s", last_id);
      break;
    }
    buf_add(out, n ? ",{" : "{", n ? 2 : 1);
    put_record_fields(out, st);
    buf_add(out, "}", 1);
    size_t idl = (size_t)sqlite3_column_bytes(st, 0);
    if (idl >= sizeof last_id) idl = sizeof last_id - 1;
    memcpy(last_id, sqlite3_column_text(st, 0), idl);
    last_id[idl] = 0;
    n++;
  }
  buf_add(out, "]", 1);
  done(st);
  if (src != SQLITE_DONE && src != SQLITE_ROW) rc = store__db_err(e, s->r, "listing runs");
  if (rc) {
    out->len = at;
    if (out->p) out->p[at] = 0;
  }
  return rc;
}

/* See store.h: the JSON text, parsed. */
int store_list_runs(store_t *s, const struct run_filter *f, cJSON **out, err_t *e) {
  *out = NULL;
  buf_t b = BUF_INIT;
  int rc = store_list_runs_json(s, f, &b, NULL, 0, e);
  if (!rc && !(*out = cJSON_ParseWithLength(buf_str(&b), b.len)))
    rc = err_set(e, ERR_INTERNAL, "store: a run list that is not JSON: %.200s", buf_str(&b));
  buf_free(&b);
  return rc;
}

/* See store.h. */
int store_count_runs(store_t *s, const struct run_filter *f, int64_t *n, err_t *e) {
  sqlite3_stmt *st = filter_stmt(s, f, 1, e);
  if (!st) return e->code;
  int rc = sqlite3_step(st) == SQLITE_ROW ? 0 : store__db_err(e, s->r, "counting runs");
  *n = rc ? 0 : sqlite3_column_int64(st, 0);
  done(st);
  return rc;
}

/* See store.h: every status is present, 0 when no run has it. */
int store_count_by_status(store_t *s, cJSON **out, err_t *e) {
  sqlite3_stmt *st = store__prep(s->r, "SELECT status, count(*) FROM runs GROUP BY status", e);
  if (!st) return e->code;
  cJSON *o = cJSON_CreateObject();
  for (const char *const *a = vocab_run_statuses; *a; a++) cJSON_AddNumberToObject(o, *a, 0);
  while (sqlite3_step(st) == SQLITE_ROW) {
    const char *k = (const char *)sqlite3_column_text(st, 0);
    cJSON_ReplaceItemInObject(o, k, cJSON_CreateNumber((double)sqlite3_column_int64(st, 1)));
  }
  sqlite3_finalize(st);
  *out = o;
  return 0;
}

/* See store.h. */
int store_get_version(store_t *s, const char *version, char **source, char **skill, char **file,
                      err_t *e) {
  sqlite3_stmt *st = store__prep(s->r, "SELECT source, skill, file FROM versions WHERE version = ?1", e);
  if (!st) return e->code;
  store__bind_text(st, 1, version);
  int rc = 0;
  if (sqlite3_step(st) == SQLITE_ROW) {
    if (source) *source = store__col_dup(st, 0);
    if (skill) *skill = store__col_dup(st, 1);
    if (file) *file = store__col_dup(st, 2);
  } else {
    rc = err_set(e, ERR_NOTFOUND, "no skill version '%.12s' in the database", version);
  }
  sqlite3_finalize(st);
  return rc;
}

/* ---- skills (cJSON trees: read seldom) ---- */

/* Parse column i as JSON; text that is not JSON is kept as a string. */
static cJSON *col_json(sqlite3_stmt *st, int i) {
  const char *t = (const char *)sqlite3_column_text(st, i);
  if (!t) return cJSON_CreateNull();
  cJSON *v = cJSON_Parse(t);
  return v ? v : cJSON_CreateString(t);
}

/* o[key] = column i as an RFC 3339 time, or null. */
static void add_time(cJSON *o, const char *key, sqlite3_stmt *st, int i) {
  if (sqlite3_column_type(st, i) == SQLITE_NULL) {
    cJSON_AddNullToObject(o, key);
    return;
  }
  char ts[40];
  units_rfc3339(sqlite3_column_int64(st, i), ts, sizeof ts);
  cJSON_AddStringToObject(o, key, ts);
}

/* o[key] = column i as a string, or null. */
static void add_text(cJSON *o, const char *key, sqlite3_stmt *st, int i) {
  const char *t = (const char *)sqlite3_column_text(st, i);
  if (t) cJSON_AddStringToObject(o, key, t);
  else cJSON_AddNullToObject(o, key);
}

/* A skill record from a row of (id, version, file, description, triggers, error). */
static cJSON *skill_record(store_t *s, sqlite3_stmt *st) {
  cJSON *o = cJSON_CreateObject();
  add_text(o, "id", st, 0);
  add_text(o, "version", st, 1);
  add_text(o, "file", st, 2);
  add_text(o, "description", st, 3);
  const char *trig = (const char *)sqlite3_column_text(st, 4);
  cJSON *t = trig ? cJSON_Parse(trig) : NULL;
  if (t && !cJSON_IsArray(t)) { /* none: an empty Lua table, stored as {} */
    cJSON_Delete(t);
    t = NULL;
  }
  cJSON_AddItemToObject(o, "triggers", t ? t : cJSON_CreateArray());
  cJSON *versions = cJSON_AddArrayToObject(o, "versions");
  sqlite3_stmt *v = store__prep(s->r,
    "SELECT version, loaded_at, triggers FROM versions WHERE skill = ?1"
    " ORDER BY loaded_at, rowid", NULL);
  if (v) {
    store__bind_text(v, 1, (const char *)sqlite3_column_text(st, 0));
    while (sqlite3_step(v) == SQLITE_ROW) {
      cJSON *x = cJSON_CreateObject();
      add_text(x, "version", v, 0);
      add_time(x, "loaded_at", v, 1);
      /* Versions loaded before moonloop kept triggers have none: null. */
      const char *vt = (const char *)sqlite3_column_text(v, 2);
      cJSON *tj = vt ? cJSON_Parse(vt) : NULL;
      if (tj && !cJSON_IsArray(tj)) { /* none: an empty Lua table, stored as {} */
        cJSON_Delete(tj);
        tj = cJSON_CreateArray();
      }
      cJSON_AddItemToObject(x, "triggers", tj ? tj : cJSON_CreateNull());
      cJSON_AddItemToArray(versions, x);
    }
    sqlite3_finalize(v);
  }
  cJSON_AddItemToObject(o, "error", col_json(st, 5));
  return o;
}

/* See store.h. */
int store_get_skill(store_t *s, const char *id, cJSON **out, err_t *e) {
  *out = NULL;
  sqlite3_stmt *st = store__prep(s->r,
    "SELECT id, version, file, description, triggers, error FROM skills WHERE id = ?1", e);
  if (!st) return e->code;
  store__bind_text(st, 1, id);
  int rc = 0;
  if (sqlite3_step(st) == SQLITE_ROW) *out = skill_record(s, st);
  else rc = err_set(e, ERR_NOTFOUND, "no skill '%s' is registered", id);
  sqlite3_finalize(st);
  return rc;
}

/* See store.h. */
int store_list_skills(store_t *s, cJSON **out, err_t *e) {
  sqlite3_stmt *st = store__prep(s->r,
    "SELECT id, version, file, description, triggers, error FROM skills ORDER BY id", e);
  if (!st) return e->code;
  cJSON *arr = cJSON_CreateArray();
  while (sqlite3_step(st) == SQLITE_ROW) cJSON_AddItemToArray(arr, skill_record(s, st));
  sqlite3_finalize(st);
  *out = arr;
  return 0;
}

/* See store.h. */
int store_rerun_version(store_t *s, const char *skill, const char *run_version, char **out,
                        err_t *e) {
  *out = NULL;
  cJSON *rec;
  if (store_get_skill(s, skill, &rec, e)) {
    if (e->code != ERR_NOTFOUND) return e->code;
    *out = mem_strdup(run_version);
    return 0;
  }
  const cJSON *v = cJSON_GetObjectItem(rec, "version");
  int rc = cJSON_IsString(v) ? (*out = mem_strdup(v->valuestring), 0)
         : err_set(e, ERR_CONFLICT, "skill '%s' has no live version (its file was deleted or "
                   "failed to load): restore it to rerun its runs", skill);
  cJSON_Delete(rec);
  return rc;
}

/* See store.h: delivered waits of owner's runs (not cancel waits) and the
** cancellations asked for them. */
int store_poll(store_t *s, const char *owner, cJSON **out, err_t *e) {
  /* Delivered waits are few; the runs a process owns may be many: the
  ** delivered ones drive the join (CROSS JOIN fixes the order). */
  static const char dsql[] =
    "SELECT w.run_id, w.seq FROM waits w INDEXED BY waits_delivered CROSS JOIN runs r"
    " ON r.id = w.run_id WHERE w.result IS NOT NULL AND w.kind != 'cancel' AND r.owner = ?1";
  static const char csql[] =
    "SELECT id, cancel_reason FROM runs WHERE owner = ?1 AND cancel_requested = 1"
    " AND status NOT IN ('completed','failed','cancelled')";
  /* Slots handed to its queued runs by other runs' releases. */
  static const char gsql[] =
    "SELECT id FROM runs INDEXED BY runs_granted WHERE owner = ?1 AND slot_granted = 1";
  *out = NULL;
  sqlite3_stmt *d = store__rcached(s, dsql, e);
  sqlite3_stmt *c = d ? store__rcached(s, csql, e) : NULL;
  sqlite3_stmt *g = c ? store__rcached(s, gsql, e) : NULL;
  if (!g) return e->code;
  store__bind_text(d, 1, owner);
  store__bind_text(c, 1, owner);
  store__bind_text(g, 1, owner);
  cJSON *o = cJSON_CreateObject();
  cJSON *dl = cJSON_AddArrayToObject(o, "deliveries");
  cJSON *cl = cJSON_AddArrayToObject(o, "cancels");
  cJSON *gl = cJSON_AddArrayToObject(o, "grants");
  while (sqlite3_step(g) == SQLITE_ROW)
    cJSON_AddItemToArray(gl, cJSON_CreateString((const char *)sqlite3_column_text(g, 0)));
  done(g);
  while (sqlite3_step(d) == SQLITE_ROW) {
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "run_id", (const char *)sqlite3_column_text(d, 0));
    cJSON_AddNumberToObject(x, "seq", sqlite3_column_int(d, 1));
    cJSON_AddItemToArray(dl, x);
  }
  while (sqlite3_step(c) == SQLITE_ROW) {
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "run_id", (const char *)sqlite3_column_text(c, 0));
    const char *reason = (const char *)sqlite3_column_text(c, 1);
    cJSON_AddStringToObject(x, "reason", reason ? reason : "cancelled");
    cJSON_AddItemToArray(cl, x);
  }
  done(d);
  done(c);
  *out = o;
  return 0;
}

/* See store.h. */
int64_t store_cron_last(store_t *s, const char *skill, const char *spec) {
  sqlite3_stmt *st = store__prep(s->r,
    "SELECT last_tick FROM cron_state WHERE skill = ?1 AND spec = ?2", NULL);
  if (!st) return 0;
  store__bind_text(st, 1, skill);
  store__bind_text(st, 2, spec);
  int64_t v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
  sqlite3_finalize(st);
  return v;
}

/* See store.h. */
int store_engine_alive(store_t *s, int64_t now) {
  sqlite3_stmt *st = store__prep(s->r,
    "SELECT owner, host, pid, pid_start, expires_at FROM leases WHERE kind = 'serve'", NULL);
  if (!st) return 0;
  int alive = 0;
  while (!alive && sqlite3_step(st) == SQLITE_ROW)
    alive = !store__lease_dead(st, proc_hostname(), now);
  sqlite3_finalize(st);
  return alive;
}

/* See store.h: asked every 50 ms, so from a cached statement. */
int64_t store_data_version(store_t *s) {
  static const char sql[] = "PRAGMA data_version";
  sqlite3_stmt *st = store__rcached(s, sql, NULL);
  int64_t v = -1;
  if (st && sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
  done(st);
  return v;
}
