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
** parsed back (text that is not JSON stays a string).
*/
#include "store_db.h"
#include "proc.h"
#include "units.h"
#include "vocab.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* A run record without steps from a row of STORE_RUN_COLS. */
static cJSON *record_from_stmt(sqlite3_stmt *st) {
  cJSON *o = cJSON_CreateObject();
  add_text(o, "id", st, 0);
  add_text(o, "skill", st, 1);
  add_text(o, "version", st, 2);
  add_text(o, "status", st, 3);
  cJSON_AddItemToObject(o, "trigger", col_json(st, 5));
  add_text(o, "parent_id", st, 6);
  cJSON_AddItemToObject(o, "input", col_json(st, 7));
  cJSON_AddItemToObject(o, "output", col_json(st, 8));
  cJSON_AddItemToObject(o, "error", col_json(st, 9));
  add_time(o, "created_at", st, 10);
  add_time(o, "started_at", st, 11);
  add_time(o, "ended_at", st, 12);
  if (sqlite3_column_type(st, 13) != SQLITE_NULL) add_time(o, "deadline_at", st, 13);
  if (sqlite3_column_type(st, 14) != SQLITE_NULL) add_time(o, "wake_at", st, 14);
  return o;
}

/* Append to list the rows of the log cursor lg (seq, ts, level, msg) that
** belong to seq, from where it stands, as {ts, level, msg}; *lrc is the
** cursor's last step code. */
static void take_logs(sqlite3_stmt *lg, int *lrc, int seq, cJSON *list) {
  while (*lrc == SQLITE_ROW && sqlite3_column_int(lg, 0) == seq) {
    cJSON *l = cJSON_CreateObject();
    add_time(l, "ts", lg, 1);
    add_text(l, "level", lg, 2);
    add_text(l, "msg", lg, 3);
    cJSON_AddItemToArray(list, l);
    *lrc = sqlite3_step(lg);
  }
}

/* A step record without attempts and logs from a row of add_steps's step
** query (seq, id, kind, status, output, error, usage, attempts, started_at,
** ended_at, wake_at, retry_at). */
static cJSON *step_record(sqlite3_stmt *st) {
  cJSON *p = cJSON_CreateObject();
  cJSON_AddNumberToObject(p, "seq", sqlite3_column_int(st, 0));
  add_text(p, "id", st, 1);
  add_text(p, "kind", st, 2);
  add_text(p, "status", st, 3);
  cJSON_AddItemToObject(p, "output", col_json(st, 4));
  add_text(p, "error", st, 5);
  if (sqlite3_column_type(st, 6) != SQLITE_NULL) cJSON_AddItemToObject(p, "usage", col_json(st, 6));
  add_time(p, "started_at", st, 8);
  add_time(p, "ended_at", st, 9);
  if (sqlite3_column_type(st, 10) != SQLITE_NULL) add_time(p, "wake_at", st, 10);
  return p;
}

/* Add the attempts of the step row st to its record p: the failed ones
** from the attempt cursor at (seq, n, status, error, traceback,
** started_at, ended_at, retry_at; *arc its last step code), then the one
** the step row implies. */
static void add_attempts(cJSON *p, sqlite3_stmt *st, sqlite3_stmt *at, int *arc) {
  int seq = sqlite3_column_int(st, 0);
  int nattempts = sqlite3_column_int(st, 7);
  const char *status = (const char *)sqlite3_column_text(st, 3);
  cJSON *atts = cJSON_AddArrayToObject(p, "attempts");
  int last_n = 0;
  int64_t next_start = sqlite3_column_int64(st, 8);
  while (*arc == SQLITE_ROW && sqlite3_column_int(at, 0) < seq) *arc = sqlite3_step(at);
  while (*arc == SQLITE_ROW && sqlite3_column_int(at, 0) == seq) {
    cJSON *a = cJSON_CreateObject();
    last_n = sqlite3_column_int(at, 1);
    cJSON_AddNumberToObject(a, "n", last_n);
    add_text(a, "status", at, 2);
    add_text(a, "error", at, 3);
    if (sqlite3_column_type(at, 4) != SQLITE_NULL) add_text(a, "traceback", at, 4);
    add_time(a, "started_at", at, 5);
    add_time(a, "ended_at", at, 6);
    if (sqlite3_column_type(at, 7) != SQLITE_NULL) {
      add_time(a, "retry_at", at, 7);
      next_start = sqlite3_column_int64(at, 7);
    }
    cJSON_AddItemToArray(atts, a);
    *arc = sqlite3_step(at);
  }
  /* The attempt that succeeded, or the one in flight, is implied by the
  ** step row: it started when the last failed attempt's backoff ended. */
  const char *kind = (const char *)sqlite3_column_text(st, 2);
  if (kind && !strcmp(kind, "run") && last_n < nattempts && status &&
      (!strcmp(status, "completed") || !strcmp(status, "running"))) {
    cJSON *a = cJSON_CreateObject();
    char ts[40];
    cJSON_AddNumberToObject(a, "n", nattempts);
    cJSON_AddStringToObject(a, "status", status);
    cJSON_AddNullToObject(a, "error");
    if (next_start) {
      units_rfc3339(next_start, ts, sizeof ts);
      cJSON_AddStringToObject(a, "started_at", ts);
    } else {
      cJSON_AddNullToObject(a, "started_at");
    }
    add_time(a, "ended_at", st, 9);
    cJSON_AddItemToArray(atts, a);
  }
}

/* Attach steps (with attempts and logs) and the run-level logs to record o
** for run id. The three queries are ordered by seq and walked together. */
static int add_steps(store_t *s, cJSON *o, const char *id, err_t *e) {
  sqlite3_stmt *st = store__prep(s->r,
    "SELECT seq, id, kind, status, output, error, usage, attempts, started_at, ended_at,"
    " wake_at, retry_at FROM steps WHERE run_id = ?1 ORDER BY seq", e);
  sqlite3_stmt *at = store__prep(s->r,
    "SELECT seq, n, status, error, traceback, started_at, ended_at, retry_at FROM attempts"
    " WHERE run_id = ?1 ORDER BY seq, n", e);
  sqlite3_stmt *lg = store__prep(s->r,
    "SELECT seq, ts, level, msg FROM logs WHERE run_id = ?1 ORDER BY seq, rowid", e);
  if (!st || !at || !lg) {
    sqlite3_finalize(st), sqlite3_finalize(at), sqlite3_finalize(lg);
    return e->code;
  }
  store__bind_text(st, 1, id);
  store__bind_text(at, 1, id);
  store__bind_text(lg, 1, id);
  cJSON *steps = cJSON_AddArrayToObject(o, "steps");
  cJSON *runlogs = cJSON_AddArrayToObject(o, "logs");
  int arc = sqlite3_step(at), lrc = sqlite3_step(lg);
  /* Run-level logs come before any step (seq 0). */
  take_logs(lg, &lrc, 0, runlogs);
  while (sqlite3_step(st) == SQLITE_ROW) {
    int seq = sqlite3_column_int(st, 0);
    cJSON *p = step_record(st);
    add_attempts(p, st, at, &arc);
    cJSON *logs = cJSON_AddArrayToObject(p, "logs");
    while (lrc == SQLITE_ROW && sqlite3_column_int(lg, 0) < seq) lrc = sqlite3_step(lg);
    take_logs(lg, &lrc, seq, logs);
    cJSON_AddItemToArray(steps, p);
  }
  sqlite3_finalize(st), sqlite3_finalize(at), sqlite3_finalize(lg);
  return 0;
}

/* Attach the run's child runs (invoked by its steps): [{id, skill, status}]. */
static int add_children(store_t *s, cJSON *o, const char *id, err_t *e) {
  sqlite3_stmt *st = store__prep(s->r,
    "SELECT id, skill, status FROM runs WHERE parent_id = ?1 ORDER BY id", e);
  if (!st) return e->code;
  store__bind_text(st, 1, id);
  cJSON *kids = cJSON_AddArrayToObject(o, "children");
  while (sqlite3_step(st) == SQLITE_ROW) {
    cJSON *k = cJSON_CreateObject();
    add_text(k, "id", st, 0);
    add_text(k, "skill", st, 1);
    add_text(k, "status", st, 2);
    cJSON_AddItemToArray(kids, k);
  }
  sqlite3_finalize(st);
  return 0;
}

/* See store.h. */
int store_get_run(store_t *s, const char *id, int with_steps, cJSON **out, err_t *e) {
  *out = NULL;
  sqlite3_stmt *st = store__prep(s->r, "SELECT " STORE_RUN_COLS " FROM runs WHERE id = ?1", e);
  if (!st) return e->code;
  store__bind_text(st, 1, id);
  int rc = sqlite3_step(st);
  if (rc != SQLITE_ROW) {
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return store__db_err(e, s->r, "reading a run");
    return err_set(e, ERR_NOTFOUND, "no run with id '%s'", id);
  }
  cJSON *o = record_from_stmt(st);
  sqlite3_finalize(st);
  /* Read the steps in the same snapshot as the run itself. */
  if (with_steps && (add_steps(s, o, id, e) || add_children(s, o, id, e))) {
    cJSON_Delete(o);
    return e->code;
  }
  *out = o;
  return 0;
}

/* See store.h: each column that is not NULL, as a number or a string. */
int store_get_steps(store_t *s, const char *run_id, cJSON **out, err_t *e) {
  *out = NULL;
  /* A step in flight when its process stopped also says how many of its
  ** attempts were interrupted so far (they do not count against its
  ** retries) and when the attempt in flight started (the previous one's
  ** retry_at, or the step's start). */
  sqlite3_stmt *st = store__prep(s->r,
    "SELECT seq, id, kind, status, output, error, attempts, started_at, ended_at, wake_at,"
    " retry_at,"
    " CASE WHEN status = 'running' THEN (SELECT count(*) FROM attempts a WHERE"
    "  a.run_id = steps.run_id AND a.seq = steps.seq AND a.status = 'interrupted') END,"
    " CASE WHEN status = 'running' THEN (SELECT a.retry_at FROM attempts a WHERE"
    "  a.run_id = steps.run_id AND a.seq = steps.seq AND a.n = steps.attempts - 1) END"
    " FROM steps WHERE run_id = ?1 ORDER BY seq", e);
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
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) {
    cJSON_Delete(arr);
    return store__db_err(e, s->r, "reading steps");
  }
  *out = arr;
  return 0;
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

/* See store.h. */
int store_list_runs(store_t *s, const struct run_filter *f, cJSON **out, err_t *e) {
  *out = NULL;
  char where[512], sql[1024];
  filter_sql(f, where, sizeof where);
  snprintf(sql, sizeof sql, "SELECT " STORE_RUN_COLS " FROM runs %s ORDER BY id DESC LIMIT ?8", where);
  sqlite3_stmt *st = store__prep(s->r, sql, e);
  if (!st) return e->code;
  filter_bind(st, f);
  sqlite3_bind_int(st, 8, f->limit > 0 ? f->limit : 100);
  cJSON *arr = cJSON_CreateArray();
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) cJSON_AddItemToArray(arr, record_from_stmt(st));
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) {
    cJSON_Delete(arr);
    return store__db_err(e, s->r, "listing runs");
  }
  *out = arr;
  return 0;
}

/* See store.h. */
int store_count_runs(store_t *s, const struct run_filter *f, int64_t *n, err_t *e) {
  char where[512], sql[700];
  filter_sql(f, where, sizeof where);
  snprintf(sql, sizeof sql, "SELECT count(*) FROM runs %s", where);
  sqlite3_stmt *st = store__prep(s->r, sql, e);
  if (!st) return e->code;
  filter_bind(st, f);
  int rc = sqlite3_step(st) == SQLITE_ROW ? 0 : store__db_err(e, s->r, "counting runs");
  *n = rc ? 0 : sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
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
    return (*out = strdup(run_version)) ? 0 : err_set(e, ERR_NOMEM, "out of memory");
  }
  const cJSON *v = cJSON_GetObjectItem(rec, "version");
  int rc = cJSON_IsString(v) ? ((*out = strdup(v->valuestring)) ? 0 : err_set(e, ERR_NOMEM, "out of memory"))
         : err_set(e, ERR_CONFLICT, "skill '%s' has no live version (its file was deleted or "
                   "failed to load): restore it to rerun its runs", skill);
  cJSON_Delete(rec);
  return rc;
}

/* See store.h: delivered waits of owner's runs (not cancel waits) and the
** cancellations asked for them. */
int store_poll(store_t *s, const char *owner, cJSON **out, err_t *e) {
  *out = NULL;
  sqlite3_stmt *d = store__prep(s->r,
    /* Delivered waits are few; the runs a process owns may be many: the
    ** delivered ones drive the join (CROSS JOIN fixes the order). */
    "SELECT w.run_id, w.seq FROM waits w INDEXED BY waits_delivered CROSS JOIN runs r"
    " ON r.id = w.run_id WHERE w.result IS NOT NULL AND w.kind != 'cancel' AND r.owner = ?1", e);
  if (!d) return e->code;
  sqlite3_stmt *c = store__prep(s->r,
    "SELECT id, cancel_reason FROM runs WHERE owner = ?1 AND cancel_requested = 1"
    " AND status NOT IN ('completed','failed','cancelled')", e);
  if (!c) {
    sqlite3_finalize(d);
    return e->code;
  }
  store__bind_text(d, 1, owner);
  store__bind_text(c, 1, owner);
  cJSON *o = cJSON_CreateObject();
  cJSON *dl = cJSON_AddArrayToObject(o, "deliveries");
  cJSON *cl = cJSON_AddArrayToObject(o, "cancels");
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
  sqlite3_finalize(d);
  sqlite3_finalize(c);
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

/* See store.h. */
int64_t store_data_version(store_t *s) {
  sqlite3_stmt *st = store__prep(s->r, "PRAGMA data_version", NULL);
  int64_t v = -1;
  if (st && sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  return v;
}
