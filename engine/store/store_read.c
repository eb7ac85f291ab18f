/*
** store_read.c: the reads of the store (store.h's "reads"), written once
** for both backends: run records in DESIGN's JSON shape (with their steps,
** attempts, logs and child runs), the steps a replay needs, run lists and
** counts, skill records and versions, what a process's runs got from
** others (store_poll), cron state, and whether a serve engine holds the
** database. The rows come from the backend's named read queries
** (store_backend.h), run on its reader connection: SQLite's SQL is in
** store_sqlite_read.c, PostgreSQL's in store_pg_read.c.
**
** Invariants: every function here reads through the reader only, never
** the writer, so a read never waits for a commit and may run on the loop
** thread while the commit thread writes. A read that needs several
** queries (a run with its steps) runs them in one snapshot. Times are
** stored as ms since the epoch and shown as RFC 3339; JSON columns are
** shown as the JSON they hold (text that is not JSON becomes a string).
**
** Run records and lists are read often (every API read, every attach):
** their statements are prepared once per reader connection, and they are
** written as JSON text straight from the rows; the cJSON forms parse that
** text, so the record's shape is written in one place. A cursor is closed
** as soon as it is read, so the reader holds nothing between calls.
*/
#include "base/cron.h"
#include "base/fault.h"
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/proc.h"
#include "base/units.h"
#include "base/vocab.h"
#include "store/store_backend.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- run records as JSON text ------------------------------------------
** Written straight into a buffer from the rows: no tree, no allocation
** per value. JSON columns (trigger, input, output, error, usage) hold JSON
** the engine wrote and go as they are (jsontext_put_value); text columns
** are escaped, with bytes that are not UTF-8 shown as U+FFFD. */

/* ,"key": and "key": for a literal key. */
#define KEY(b, k) BUF_LIT(b, ",\"" k "\":")
#define KEY1(b, k) BUF_LIT(b, "\"" k "\":")

/* Column i as a JSON string, or null. */
static void put_text(buf_t *b, const struct store_cur *st, int i) {
  const char *t = cur_text(st, i);
  if (!t) BUF_LIT(b, "null");
  else jsontext_put_string(b, t, cur_bytes(st, i));
}

/* Column i (JSON text) as a value, or null. */
static void put_json(buf_t *b, const struct store_cur *st, int i) {
  const char *t = cur_text(st, i);
  jsontext_put_value(b, t, t ? cur_bytes(st, i) : 0);
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
static void put_time(buf_t *b, const struct store_cur *st, int i) {
  if (cur_null(st, i)) BUF_LIT(b, "null");
  else put_ms(b, cur_i64(st, i));
}

/* ,"key": followed by one of the put functions' values. */
#define PUT(b, k, fn, ...) (KEY(b, k), fn(b, __VA_ARGS__))
#define PUT1(b, k, fn, ...) (KEY1(b, k), fn(b, __VA_ARGS__))

/* In a list of runs, an input or output larger than this is left out (null,
** with "input_bytes" / "output_bytes"): a page of 1,000 runs of 1 MB inputs
** was 2 GB of JSON, built while the engine's loop waited. The run's record
** (GET /v1/runs/{id}) has it whole. */
#define LIST_VALUE_MAX (16 * 1024)

/* Column i (JSON text) as key's value in a list: the value, or null and
** key_bytes when it is over LIST_VALUE_MAX. */
static void put_listed(buf_t *b, const char *key, const struct store_cur *st, int i) {
  size_t n = cur_null(st, i) ? 0 : cur_bytes(st, i);
  buf_printf(b, ",\"%s\":", key);
  if (n <= LIST_VALUE_MAX) {
    put_json(b, st, i);
    return;
  }
  BUF_LIT(b, "null");
  buf_printf(b, ",\"%s_bytes\":%zu", key, n);
}

/* The fields of a run record without steps, from a row of STORE_RUN_COLS,
** after its opening brace (the caller closes it); position > 0: the run's
** place in the queue its `queued` names, added to that object; listed: a
** run of a list (its large values left out, put_listed). */
static void put_record_fields(buf_t *b, const struct store_cur *st, int64_t position, int listed) {
  PUT1(b, "id", put_text, st, 0);
  PUT(b, "skill", put_text, st, 1);
  PUT(b, "version", put_text, st, 2);
  PUT(b, "status", put_text, st, 3);
  PUT(b, "trigger", put_json, st, 5);
  PUT(b, "parent_id", put_text, st, 6);
  if (listed) {
    put_listed(b, "input", st, 7);
    put_listed(b, "output", st, 8);
  } else {
    PUT(b, "input", put_json, st, 7);
    PUT(b, "output", put_json, st, 8);
  }
  PUT(b, "error", put_json, st, 9);
  PUT(b, "created_at", put_time, st, 10);
  PUT(b, "started_at", put_time, st, 11);
  PUT(b, "ended_at", put_time, st, 12);
  if (!cur_null(st, 13)) PUT(b, "deadline_at", put_time, st, 13);
  if (!cur_null(st, 14)) PUT(b, "wake_at", put_time, st, 14);
  /* Why it waits to start (flow control: store_queue.c), while it does:
  ** a queued run that ended (cancelled, skipped) keeps its reason in the
  ** row, but waits for nothing now. */
  const char *status = cur_text(st, 3);
  const char *q = status && vocab_run_status(status) == RUN_QUEUED ? cur_text(st, 16) : NULL;
  size_t qn = q ? strlen(q) : 0;
  if (position > 0 && qn > 2 && q[qn - 1] == '}') {
    KEY(b, "queued");
    buf_add(b, q, qn - 1);
    BUF_LIT(b, ",\"position\":");
    jsontext_put_int(b, position);
    buf_add(b, "}", 1);
  } else if (q) {
    PUT(b, "queued", put_json, st, 16);
  } else {
    BUF_LIT(b, ",\"queued\":null");
  }
}

/* A queued run's place (1: next) in the concurrency queue its reason
** (queued_json) names, or 0 (another reason, none, or an error: the
** record goes without). Counted when read, through slot_queue_order, so
** as exact as the read; one query per record, so not in lists. */
static int64_t queue_position(store_t *s, const char *run_id, const char *queued_json) {
  cJSON *q = queued_json ? cJSON_Parse(queued_json) : NULL;
  const char *reason = cJSON_GetStringValue(cJSON_GetObjectItem(q, "reason"));
  const char *scope = cJSON_GetStringValue(cJSON_GetObjectItem(q, "scope"));
  const char *skill = cJSON_GetStringValue(cJSON_GetObjectItem(q, "skill"));
  const char *key = cJSON_GetStringValue(cJSON_GetObjectItem(q, "key"));
  int64_t pos = 0;
  if (reason && !strcmp(reason, "concurrency") && (scope || skill)) {
    char *name = scope ? mem_printf("@%s", scope) : mem_strdup(skill);
    struct store_val v[3] = {SV_TEXT(run_id), SV_TEXT(name), SV_TEXT(key ? key : "")};
    struct store_cur c;
    err_t e;
    if (!store__rq(s, NULL, RQ_QUEUE_AHEAD, v, 3, &c, &e)) {
      if (cur_next(&c) == 1) pos = cur_i64(&c, 0) + 1;
      cur_close(&c);
    }
    free(name);
  }
  cJSON_Delete(q);
  return pos;
}

/* Append the rows of the log cursor lg (seq, ts, level, msg) that belong
** to seq, from where it stands, as [{ts, level, msg}]. */
static void put_logs(buf_t *b, struct store_cur *lg, int seq) {
  buf_add(b, "[", 1);
  for (int first = 1; lg->rc == 1 && cur_int(lg, 0) == seq; first = 0) {
    buf_add(b, first ? "{" : ",{", first ? 1 : 2);
    PUT1(b, "ts", put_time, lg, 1);
    PUT(b, "level", put_text, lg, 2);
    PUT(b, "msg", put_text, lg, 3);
    buf_add(b, "}", 1);
    cur_next(lg);
  }
  buf_add(b, "]", 1);
}

/* The attempts of the step row st: the failed ones from the attempt
** cursor at (seq, n, status, error, traceback, started_at, ended_at,
** retry_at), then the one the step row implies. */
static void put_attempts(buf_t *b, const struct store_cur *st, struct store_cur *at) {
  int seq = cur_int(st, 0);
  int nattempts = cur_int(st, 7);
  const char *status = cur_text(st, 3);
  int last_n = 0, first = 1;
  int64_t next_start = cur_i64(st, 8);
  buf_add(b, "[", 1);
  while (at->rc == 1 && cur_int(at, 0) < seq) cur_next(at);
  for (; at->rc == 1 && cur_int(at, 0) == seq; first = 0) {
    last_n = cur_int(at, 1);
    buf_add(b, first ? "{" : ",{", first ? 1 : 2);
    PUT1(b, "n", jsontext_put_int, last_n);
    PUT(b, "status", put_text, at, 2);
    PUT(b, "error", put_text, at, 3);
    if (!cur_null(at, 4)) PUT(b, "traceback", put_text, at, 4);
    PUT(b, "started_at", put_time, at, 5);
    PUT(b, "ended_at", put_time, at, 6);
    if (!cur_null(at, 7)) {
      PUT(b, "retry_at", put_time, at, 7);
      next_start = cur_i64(at, 7);
    }
    buf_add(b, "}", 1);
    cur_next(at);
  }
  /* The attempt that succeeded, or the one in flight, is implied by the
  ** step row: it started when the last failed attempt's backoff ended. */
  const char *kind = cur_text(st, 2);
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

/* Append ,"steps":[...],"logs":[...],"children":[...] for run id: the
** step, attempt and log queries are ordered by seq and walked together. */
static int put_steps(store_t *s, buf_t *b, const char *id, err_t *e) {
  struct store_val v[1] = {SV_TEXT(id)};
  struct store_cur st = {0}, at = {0}, lg = {0}, ch = {0};
  if (store__rq(s, NULL, RQ_STEPS, v, 1, &st, e) || store__rq(s, NULL, RQ_ATTEMPTS, v, 1, &at, e) ||
      store__rq(s, NULL, RQ_LOGS, v, 1, &lg, e) || store__rq(s, NULL, RQ_CHILDREN, v, 1, &ch, e)) {
    cur_close(&st), cur_close(&at), cur_close(&lg), cur_close(&ch);
    return e->code;
  }
  cur_next(&at);
  cur_next(&lg);
  int first = 1;
  KEY(b, "steps");
  buf_add(b, "[", 1);
  /* Run-level logs come before any step (seq 0); they are written after
  ** the steps, so they wait in the store's scratch buffer. */
  buf_t *runlogs = &store__base(s)->scratch;
  runlogs->len = 0;
  put_logs(runlogs, &lg, 0);
  for (; cur_next(&st) == 1; first = 0) {
    int seq = cur_int(&st, 0);
    buf_add(b, first ? "{" : ",{", first ? 1 : 2);
    PUT1(b, "seq", jsontext_put_int, seq);
    PUT(b, "id", put_text, &st, 1);
    PUT(b, "kind", put_text, &st, 2);
    PUT(b, "status", put_text, &st, 3);
    PUT(b, "output", put_json, &st, 4);
    PUT(b, "error", put_text, &st, 5);
    if (!cur_null(&st, 6)) PUT(b, "usage", put_json, &st, 6);
    PUT(b, "started_at", put_time, &st, 8);
    PUT(b, "ended_at", put_time, &st, 9);
    if (!cur_null(&st, 10)) PUT(b, "wake_at", put_time, &st, 10);
    PUT(b, "attempts", put_attempts, &st, &at);
    while (lg.rc == 1 && cur_int(&lg, 0) < seq) cur_next(&lg);
    PUT(b, "logs", put_logs, &lg, seq);
    buf_add(b, "}", 1);
  }
  buf_add(b, "]", 1);
  PUT(b, "logs", buf_add, buf_str(runlogs), runlogs->len);
  KEY(b, "children");
  buf_add(b, "[", 1);
  for (first = 1; cur_next(&ch) == 1; first = 0) {
    buf_add(b, first ? "{" : ",{", first ? 1 : 2);
    PUT1(b, "id", put_text, &ch, 0);
    PUT(b, "skill", put_text, &ch, 1);
    PUT(b, "status", put_text, &ch, 2);
    buf_add(b, "}", 1);
  }
  buf_add(b, "]", 1);
  struct store_cur *bad = st.rc < 0 ? &st : ch.rc < 0 ? &ch : at.rc < 0 ? &at : lg.rc < 0 ? &lg : NULL;
  int err = bad ? bad->ops->err(bad, e, "reading a run's steps") : 0;
  cur_close(&st), cur_close(&at), cur_close(&lg), cur_close(&ch);
  return err;
}

/* The text of column 0 of query q's first row for v (a malloc'd copy, or
** NULL: no row, or a NULL there); ERR_NOTFOUND is not set here. */
static int first_text(store_t *s, enum store_rq q, const struct store_val *v, int nv,
                      char **out, int *found, err_t *e) {
  struct store_cur c;
  *out = NULL;
  *found = 0;
  if (store__rq(s, NULL, q, v, nv, &c, e)) return e->code;
  int rc = cur_next(&c);
  if (rc == 1) {
    *found = 1;
    const char *t = cur_text(&c, 0);
    if (t) *out = mem_strdup(t);
    rc = 0;
  } else if (rc < 0) {
    rc = c.ops->err(&c, e, "reading");
  }
  cur_close(&c);
  return rc;
}

/* See store.h. The run's row and its steps are read in one snapshot. */
int store_run_json(store_t *s, const char *id, int with_steps, buf_t *out, err_t *e) {
  const struct store_ops *ops = store__ops(s);
  int began = with_steps ? ops->rbegin(s, NULL, e) : 0;
  if (began < 0) return e->code;
  struct store_val v[1] = {SV_TEXT(id)};
  struct store_cur st;
  if (store__rq(s, NULL, RQ_RUN, v, 1, &st, e)) {
    ops->rend(s, NULL, began);
    return e->code;
  }
  int rc = cur_next(&st);
  if (rc != 1) {
    if (rc < 0) st.ops->err(&st, e, "reading a run");
    else err_set(e, ERR_NOTFOUND, "no run with id '%s'", id);
    cur_close(&st);
    ops->rend(s, NULL, began);
    return e->code;
  }
  size_t at = out->len;
  buf_add(out, "{", 1);
  const char *status = cur_text(&st, 3);
  int64_t pos = status && !strcmp(status, "queued") ? queue_position(s, id, cur_text(&st, 16)) : 0;
  put_record_fields(out, &st, pos, 0);
  /* The run's cursor stays open while the steps are read: one snapshot,
  ** so the steps are those of the same commit as the run. */
  rc = with_steps ? put_steps(s, out, id, e) : 0;
  cur_close(&st);
  ops->rend(s, NULL, began);
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
  struct store_val v[1] = {SV_TEXT(id)};
  char *t;
  int found;
  if (first_text(s, RQ_RUN_STATUS, v, 1, &t, &found, e)) return e->code;
  if (found) snprintf(status, n, "%s", t ? t : "");
  free(t);
  return found ? 0 : err_set(e, ERR_NOTFOUND, "no run with id '%s'", id);
}

/* See store.h. */
int store_keyed_run(store_t *s, const char *skill, const char *key, char *id, size_t n, err_t *e) {
  struct store_val v[2] = {SV_TEXT(skill), SV_TEXT(key)};
  char *t;
  int found;
  if (first_text(s, RQ_KEYED_RUN, v, 2, &t, &found, e)) return e->code;
  if (found) snprintf(id, n, "%s", t ? t : "");
  free(t);
  return found;
}

/* See store.h. */
int store_event_key_clash(store_t *s, const char *key, const char *name, err_t *e) {
  struct store_val v[1] = {SV_TEXT(key)};
  char *t;
  int found;
  if (first_text(s, RQ_EVENT_BY_KEY, v, 1, &t, &found, e)) return e->code;
  int clash = found && t && strcmp(t, name);
  if (clash)
    err_set(e, ERR_CONFLICT, "event id '%s' was already used by an event named '%s': an id is "
            "the key of one event whatever its name (a repeat is accepted once), so this '%s' "
            "would be dropped: give it an id of its own", key, t, name);
  free(t);
  return clash ? ERR_CONFLICT : 0;
}

/* See store.h: one indexed query; the ids go in as one JSON array. */
int store_runs_ended(store_t *s, const char *ids_json, void (*cb)(void *arg, const char *id),
                     void *arg, err_t *e) {
  struct store_val v[1] = {SV_TEXT(ids_json)};
  struct store_cur c;
  if (store__rq(s, NULL, RQ_RUNS_ENDED, v, 1, &c, e)) return e->code;
  int rc, n = 0;
  while ((rc = cur_next(&c)) == 1) {
    cb(arg, cur_text(&c, 0));
    n++;
  }
  if (rc < 0) n = c.ops->err(&c, e, "reading runs' statuses");
  cur_close(&c);
  return n;
}

/* See store.h. */
int store_live_version(store_t *s, const char *skill, char *version, size_t n, err_t *e) {
  struct store_val v[1] = {SV_TEXT(skill)};
  char *t;
  int found;
  if (first_text(s, RQ_LIVE_VERSION, v, 1, &t, &found, e)) return e->code;
  if (t) snprintf(version, n, "%s", t);
  free(t);
  if (t) return 0;
  if (found) return err_set(e, ERR_NOTFOUND, "skill '%s' has no live version", skill);
  return err_set(e, ERR_NOTFOUND, "no skill '%s' is registered", skill);
}

/* See store.h: each column that is not NULL, as a number or a string. */
int store_get_steps(store_t *s, const char *run_id, cJSON **out, err_t *e) {
  *out = NULL;
  struct store_val v[1] = {SV_TEXT(run_id)};
  struct store_cur c;
  if (store__rq(s, NULL, RQ_STEP_JOURNAL, v, 1, &c, e)) return e->code;
  cJSON *arr = cJSON_CreateArray();
  static const char *const names[] = {"seq", "id", "kind", "status", "output", "error",
                                      "attempts", "started_at", "ended_at", "wake_at",
                                      "retry_at", "interrupted", "attempt_started_at"};
  int rc;
  while ((rc = cur_next(&c)) == 1) {
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < 13; i++) {
      if (cur_null(&c, i)) continue;
      if (c.ops->is_int(&c, i)) cJSON_AddNumberToObject(o, names[i], (double)cur_i64(&c, i));
      else cJSON_AddStringToObject(o, names[i], cur_text(&c, i));
    }
    cJSON_AddItemToArray(arr, o);
  }
  if (rc < 0) {
    c.ops->err(&c, e, "reading steps");
    cur_close(&c);
    cJSON_Delete(arr);
    return e->code;
  }
  cur_close(&c);
  *out = arr;
  return 0;
}

/* See store.h. */
int store_list_runs_json(store_t *s, const struct run_filter *f, buf_t *out, char *next,
                         size_t nnext, err_t *e) {
  int limit = f->limit > 0 ? f->limit : 100;
  struct store_cur c;
  /* One more than asked when the caller pages: its presence says there is
  ** a next page, which starts below the last run shown. */
  if (store__read_fault(e) || store__ops(s)->rfilter(s, f, 0, next ? limit + 1 : limit, &c, e))
    return e->code;
  if (next) next[0] = 0;
  size_t at = out->len;
  int rc = 0, src, n = 0;
  buf_add(out, "[", 1);
  char last_id[64] = "";
  while ((src = cur_next(&c)) == 1) {
    if (n == limit) {
      /* The row past the page: the last one written is where the next starts. */
      if (next) snprintf(next, nnext, "%s", last_id);
      break;
    }
    buf_add(out, n ? ",{" : "{", n ? 2 : 1);
    put_record_fields(out, &c, 0, 1);
    buf_add(out, "}", 1);
    const char *id = cur_text(&c, 0);
    size_t idl = cur_bytes(&c, 0);
    if (idl >= sizeof last_id) idl = sizeof last_id - 1;
    memcpy(last_id, id ? id : "", id ? idl : 0);
    last_id[id ? idl : 0] = 0;
    n++;
  }
  buf_add(out, "]", 1);
  if (src < 0) rc = c.ops->err(&c, e, "listing runs");
  cur_close(&c);
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
  struct store_cur c;
  *n = 0;
  if (store__read_fault(e) || store__ops(s)->rfilter(s, f, 1, 0, &c, e)) return e->code;
  int rc = cur_next(&c);
  if (rc == 1) *n = cur_i64(&c, 0);
  rc = rc == 1 ? 0 : rc < 0 ? c.ops->err(&c, e, "counting runs")
                            : err_set(e, ERR_IO, "store: counting runs: no answer");
  cur_close(&c);
  return rc;
}

/* See store.h: every status is present, 0 when no run has it. */
int store_count_by_status(store_t *s, cJSON **out, err_t *e) {
  struct store_cur c;
  if (store__rq(s, NULL, RQ_COUNT_BY_STATUS, NULL, 0, &c, e)) return e->code;
  cJSON *o = cJSON_CreateObject();
  for (const char *const *a = vocab_run_statuses; *a; a++) cJSON_AddNumberToObject(o, *a, 0);
  while (cur_next(&c) == 1)
    cJSON_ReplaceItemInObject(o, cur_text(&c, 0), cJSON_CreateNumber((double)cur_i64(&c, 1)));
  cur_close(&c);
  *out = o;
  return 0;
}

/* See store.h. */
int store_get_version(store_t *s, const char *version, char **source, char **skill, char **file,
                      err_t *e) {
  struct store_val v[1] = {SV_TEXT(version)};
  struct store_cur c;
  if (store__rq(s, NULL, RQ_VERSION, v, 1, &c, e)) return e->code;
  int rc = 0;
  if (cur_next(&c) == 1) {
    const char *t;
    if (source) *source = (t = cur_text(&c, 0)) ? mem_strdup(t) : NULL;
    if (skill) *skill = (t = cur_text(&c, 1)) ? mem_strdup(t) : NULL;
    if (file) *file = (t = cur_text(&c, 2)) ? mem_strdup(t) : NULL;
  } else {
    rc = err_set(e, ERR_NOTFOUND, "no skill version '%.12s' in the database", version);
  }
  cur_close(&c);
  return rc;
}

/* ---- skills (cJSON trees: read seldom) ---- */

/* Parse column i as JSON; text that is not JSON is kept as a string. */
static cJSON *col_json(const struct store_cur *c, int i) {
  const char *t = cur_text(c, i);
  if (!t) return cJSON_CreateNull();
  cJSON *v = cJSON_Parse(t);
  return v ? v : cJSON_CreateString(t);
}

/* o[key] = column i as an RFC 3339 time, or null. */
static void add_time(cJSON *o, const char *key, const struct store_cur *c, int i) {
  if (cur_null(c, i)) {
    cJSON_AddNullToObject(o, key);
    return;
  }
  char ts[40];
  units_rfc3339(cur_i64(c, i), ts, sizeof ts);
  cJSON_AddStringToObject(o, key, ts);
}

/* o[key] = column i as a string, or null. */
static void add_text(cJSON *o, const char *key, const struct store_cur *c, int i) {
  const char *t = cur_text(c, i);
  if (t) cJSON_AddStringToObject(o, key, t);
  else cJSON_AddNullToObject(o, key);
}

/* The skill's "next_fire": the soonest time one of its cron triggers
** matches after now (RFC 3339; a serve engine fires it then), or null when
** it has none (no cron trigger, no live version, none within 5 years). The
** operator's "when does this loop run next?", from the schedules
** themselves (cron.c), as sched_cron.c reads them. */
static void add_next_fire(cJSON *o, const cJSON *triggers) {
  int64_t now = units_now_ms(), soonest = -1;
  const cJSON *t;
  cJSON_ArrayForEach(t, triggers) {
    const cJSON *expr = cJSON_GetObjectItem(t, "cron"), *tz = cJSON_GetObjectItem(t, "tz");
    cron_t *c;
    err_t e;
    if (!cJSON_IsString(expr) ||
        cron_parse(expr->valuestring, cJSON_IsString(tz) ? tz->valuestring : NULL, &c, &e))
      continue;
    int64_t next = cron_next(c, now);
    cron_free(c);
    if (next >= 0 && (soonest < 0 || next < soonest)) soonest = next;
  }
  char ts[40];
  if (soonest < 0) {
    cJSON_AddNullToObject(o, "next_fire");
    return;
  }
  units_rfc3339(soonest, ts, sizeof ts);
  cJSON_AddStringToObject(o, "next_fire", ts);
}

/* A skill record from a row of (id, version, file, description, triggers, error). */
static cJSON *skill_record(store_t *s, const struct store_cur *st) {
  cJSON *o = cJSON_CreateObject();
  add_text(o, "id", st, 0);
  add_text(o, "version", st, 1);
  add_text(o, "file", st, 2);
  add_text(o, "description", st, 3);
  /* The live version's triggers: none when there is no live version (the
  ** file removed or never loaded; its versions keep theirs). */
  const char *trig = cur_text(st, 1) ? cur_text(st, 4) : NULL;
  cJSON *t = trig ? cJSON_Parse(trig) : NULL;
  if (t && !cJSON_IsArray(t)) { /* none: an empty Lua table, stored as {} */
    cJSON_Delete(t);
    t = NULL;
  }
  cJSON_AddItemToObject(o, "triggers", t ? t : cJSON_CreateArray());
  add_next_fire(o, t);
  cJSON *versions = cJSON_AddArrayToObject(o, "versions");
  struct store_val v[1] = {SV_TEXT(cur_text(st, 0))};
  struct store_cur vc;
  if (!store__rq(s, NULL, RQ_SKILL_VERSIONS, v, 1, &vc, NULL)) {
    while (cur_next(&vc) == 1) {
      cJSON *x = cJSON_CreateObject();
      add_text(x, "version", &vc, 0);
      add_time(x, "loaded_at", &vc, 1);
      /* Versions loaded before moonloop kept triggers have none: null. */
      const char *vt = cur_text(&vc, 2);
      cJSON *tj = vt ? cJSON_Parse(vt) : NULL;
      if (tj && !cJSON_IsArray(tj)) { /* none: an empty Lua table, stored as {} */
        cJSON_Delete(tj);
        tj = cJSON_CreateArray();
      }
      cJSON_AddItemToObject(x, "triggers", tj ? tj : cJSON_CreateNull());
      cJSON_AddItemToArray(versions, x);
    }
    cur_close(&vc);
  }
  cJSON_AddItemToObject(o, "error", col_json(st, 5));
  return o;
}

/* See store.h. */
int store_get_skill(store_t *s, const char *id, cJSON **out, err_t *e) {
  *out = NULL;
  struct store_val v[1] = {SV_TEXT(id)};
  struct store_cur c;
  if (store__rq(s, NULL, RQ_SKILL, v, 1, &c, e)) return e->code;
  int rc = 0;
  if (cur_next(&c) == 1) *out = skill_record(s, &c);
  else rc = err_set(e, ERR_NOTFOUND, "no skill '%s' is registered", id);
  cur_close(&c);
  return rc;
}

/* Whether a registered file still exists. "//HOST/PATH" names a file of a
** standalone sidecar (moonloop sidecar) on HOST: it exists until that
** sidecar unregisters it (DELETE /v1/skills/{id}). */
static int file_exists(const char *file) {
  return !strncmp(file, "//", 2) || access(file, F_OK) == 0;
}

/* Whether two registered file names are one file: the same name, or the
** same file on disk under two spellings ("skills/x.lua", "./skills/x.lua"). */
static int same_file(const char *a, const char *b) {
  if (!strcmp(a, b)) return 1;
  if (!strncmp(a, "//", 2) || !strncmp(b, "//", 2)) return 0;
  char ra[PATH_MAX], rb[PATH_MAX];
  return realpath(a, ra) && realpath(b, rb) && !strcmp(ra, rb);
}

/* See store.h. */
int store_skill_held_elsewhere(store_t *s, const char *id, const char *file, char *other,
                               size_t n) {
  cJSON *rec;
  err_t e;
  if (store_get_skill(s, id, &rec, &e)) return 0;
  const cJSON *v = cJSON_GetObjectItem(rec, "version"), *f = cJSON_GetObjectItem(rec, "file");
  int held = cJSON_IsString(v) && cJSON_IsString(f) && !same_file(f->valuestring, file) &&
             file_exists(f->valuestring);
  if (held) snprintf(other, n, "%s", f->valuestring);
  cJSON_Delete(rec);
  return held;
}

/* See store.h. */
int store_list_skills(store_t *s, cJSON **out, err_t *e) {
  struct store_cur c;
  if (store__rq(s, NULL, RQ_SKILLS, NULL, 0, &c, e)) return e->code;
  cJSON *arr = cJSON_CreateArray();
  while (cur_next(&c) == 1) cJSON_AddItemToArray(arr, skill_record(s, &c));
  cur_close(&c);
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
  *out = NULL;
  struct store_val v[1] = {SV_TEXT(owner)};
  struct store_cur d = {0}, c = {0}, g = {0};
  if (store__rq(s, NULL, RQ_POLL_DELIVERIES, v, 1, &d, e) ||
      store__rq(s, NULL, RQ_POLL_CANCELS, v, 1, &c, e) ||
      store__rq(s, NULL, RQ_POLL_GRANTS, v, 1, &g, e)) {
    cur_close(&d);
    cur_close(&c);
    return e->code;
  }
  cJSON *o = cJSON_CreateObject();
  cJSON *dl = cJSON_AddArrayToObject(o, "deliveries");
  cJSON *cl = cJSON_AddArrayToObject(o, "cancels");
  cJSON *gl = cJSON_AddArrayToObject(o, "grants");
  while (cur_next(&g) == 1) cJSON_AddItemToArray(gl, cJSON_CreateString(cur_text(&g, 0)));
  cur_close(&g);
  while (cur_next(&d) == 1) {
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "run_id", cur_text(&d, 0));
    cJSON_AddNumberToObject(x, "seq", cur_int(&d, 1));
    cJSON_AddItemToArray(dl, x);
  }
  while (cur_next(&c) == 1) {
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "run_id", cur_text(&c, 0));
    const char *reason = cur_text(&c, 1);
    cJSON_AddStringToObject(x, "reason", reason ? reason : "cancelled");
    cJSON_AddItemToArray(cl, x);
  }
  cur_close(&d);
  cur_close(&c);
  *out = o;
  return 0;
}

/* See store.h. */
int64_t store_cron_last(store_t *s, const char *skill, const char *spec) {
  struct store_val v[2] = {SV_TEXT(skill), SV_TEXT(spec)};
  struct store_cur c;
  if (store__rq(s, NULL, RQ_CRON_LAST, v, 2, &c, NULL)) return 0;
  int64_t t = cur_next(&c) == 1 ? cur_i64(&c, 0) : 0;
  cur_close(&c);
  return t;
}

/* See store.h. */
int store_engine_alive(store_t *s, int64_t now) {
  struct store_cur c;
  if (store__rq(s, NULL, RQ_SERVE_LEASES, NULL, 0, &c, NULL)) return 0;
  int alive = 0;
  while (!alive && cur_next(&c) == 1)
    alive = !store__lease_dead(cur_text(&c, 1), (long)cur_i64(&c, 2), cur_i64(&c, 3),
                               cur_i64(&c, 4), proc_hostname(), now);
  cur_close(&c);
  return alive;
}
