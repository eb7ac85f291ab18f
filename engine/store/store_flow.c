/*
** store_flow.c: the SQLite store's part for triggers and flow (see
** journal.h for each entry's contract): accepted events, waits and their
** deliveries, cancellation, cron ticks (concurrency slots and queues:
** store_queue.c); and the job
** around them: dispatching events. (Polling what a process's runs got,
** store_poll, is a read: store_read.c.)
**
** Waits and events meet in exactly one transaction, whichever comes
** first: registering a wait looks for an event that already arrived (since
** the run was created, not yet taken by this run); dispatching an event
** looks for the waits registered on its name. SQLite runs write
** transactions one at a time, so no event slips between the two.
**
** Matching: a wait may hold a match, a JSON object of path -> value
** ({"data.service": "api", "data.version": "2"}); the event's value at
** each path, as compact JSON, must equal that value's.
*/
#include "base/fault.h"
#include "base/ids.h"
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/units.h"
#include "base/vocab.h"
#include "store/store_db.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  F_EVENT_INSERT, F_EVENT_BY_IDEM, F_WAIT_GET, F_WAIT_UPDATE, F_WAIT_INSERT, F_EVENTS_SINCE,
  F_DELIVERY_INSERT, F_WAIT_DELETE, F_WAIT_CLOSE, F_CHILD_DONE, F_RUN_OUTCOME, F_CANCEL_FLAG,
  F_CRON_GET, F_CRON_SET, F_RUN_BY_IDEM, F_RUN_SET_IDEM,
  F_COUNT
};

static const char *const fsql[F_COUNT] = {
  [F_EVENT_INSERT] = "INSERT INTO events(id, name, data, idem, ts) VALUES(?1,?2,?3,?4,?5)"
                     " ON CONFLICT(idem) DO NOTHING",
  [F_EVENT_BY_IDEM] = "SELECT id FROM events WHERE idem = ?1",
  [F_WAIT_GET] = "SELECT result FROM waits WHERE run_id = ?1 AND seq = ?2",
  [F_WAIT_UPDATE] = "UPDATE waits SET owner = ?3, timeout_at = ?4 WHERE run_id = ?1 AND seq = ?2",
  [F_WAIT_INSERT] = "INSERT INTO waits(run_id, seq, kind, name, match_json, since,"
                    " timeout_at, owner, result, delivered_at)"
                    " VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10)",
  [F_EVENTS_SINCE] = "SELECT id, name, data, ts FROM events WHERE name = ?1 AND ts >= ?2"
                     " AND id IS NOT ?4 AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE"
                     " d.run_id = ?3 AND d.event_id = events.id) ORDER BY ts, id LIMIT 1000",
  [F_DELIVERY_INSERT] = "INSERT OR IGNORE INTO deliveries(run_id, event_id, seq) VALUES(?1,?2,?3)",
  [F_WAIT_DELETE] = "DELETE FROM waits WHERE run_id = ?1 AND seq = ?2",
  /* A closed wait (ended with nothing: delivered_at set, result NULL)
  ** takes nothing more. */
  [F_WAIT_CLOSE] = "UPDATE waits SET delivered_at = ?3 WHERE run_id = ?1 AND seq = ?2"
                   " AND result IS NULL",
  [F_CHILD_DONE] = "UPDATE waits SET result = ?2, delivered_at = ?3"
                   " WHERE kind = 'child' AND name = ?1 AND result IS NULL AND delivered_at IS NULL",
  [F_RUN_OUTCOME] = "SELECT id, status, output, error FROM runs WHERE id = ?1",
  [F_CANCEL_FLAG] = "UPDATE runs SET cancel_requested = 1, cancel_reason = ?2 WHERE id = ?1"
                    " AND status NOT IN (" VOCAB_RUN_ENDED_SQL ") AND cancel_requested = 0",
  [F_CRON_GET] = "SELECT last_tick FROM cron_state WHERE skill = ?1 AND spec = ?2",
  [F_CRON_SET] = "INSERT INTO cron_state(skill, spec, last_tick) VALUES(?1,?2,?3)"
                 " ON CONFLICT(skill, spec) DO UPDATE SET last_tick = ?3",
  [F_RUN_BY_IDEM] = "SELECT id FROM runs WHERE skill = ?1 AND idem = ?2",
  [F_RUN_SET_IDEM] = "UPDATE runs SET idem = ?2 WHERE id = ?1",
};

/* The statement f of the writer, prepared on first use. */
static sqlite3_stmt *fst(store_t *s, int f, err_t *e) {
  if (!s->fs[f] &&
      sqlite3_prepare_v3(s->w, fsql[f], -1, SQLITE_PREPARE_PERSISTENT, &s->fs[f], NULL)) {
    store__db_err(e, s->w, "preparing a statement");
    return NULL;
  }
  return s->fs[f];
}

/* Finalize this file's statements (store_close). */
void store__flow_close(store_t *s) {
  for (int i = 0; i < F_COUNT; i++) {
    sqlite3_finalize(s->fs[i]);
    s->fs[i] = NULL;
  }
}

/* Outcome JSON of an ended run, for its parent, from a row of (id,
** status, output, error): {run_id, status, output, error}. */
static char *outcome_json(sqlite3_stmt *st) {
  return jsontext_run_outcome((const char *)sqlite3_column_text(st, 0),
                          (const char *)sqlite3_column_text(st, 1),
                          (const char *)sqlite3_column_text(st, 2),
                          (const char *)sqlite3_column_text(st, 3));
}

/* J_EVENT: accept an event; the result is its id (the first event's id for
** a repeated idempotency key). */
static int write_event(store_t *s, const struct jentry *je, err_t *e) {
  const struct event_row *ev = &je->u.event;
  sqlite3_stmt *st = fst(s, F_EVENT_INSERT, e);
  if (!st) return e->code;
  store__bind_text(st, 1, ev->id);
  store__bind_text(st, 2, ev->name);
  store__bind_text(st, 3, ev->data);
  store__bind_text(st, 4, ev->idem);
  sqlite3_bind_int64(st, 5, ev->ts);
  if (store__step(s, st, e, "accepting an event")) return e->code;
  if (sqlite3_changes(s->w) == 0 && ev->idem) {
    /* A repeat of an idempotency key: answer with the first event's id. */
    sqlite3_stmt *q = fst(s, F_EVENT_BY_IDEM, e);
    if (!q) return e->code;
    store__bind_text(q, 1, ev->idem);
    if (sqlite3_step(q) == SQLITE_ROW) journal_set_result(je, store__col_dup(q, 0));
    sqlite3_reset(q);
    sqlite3_clear_bindings(q);
  } else {
    journal_set_result(je, mem_strdup(ev->id));
  }
  return 0;
}

/* See store_db.h: J_RUN_NEW with a key. The first run of (skill, key)
** wins: a repeat writes nothing and its result is the first run's id. The
** look-up and the insert are in one write transaction, and the unique
** index runs_idem stands behind them. */
int store__put_keyed_run(store_t *s, const struct jentry *je, err_t *e) {
  const struct run_row *r = &je->u.run;
  sqlite3_stmt *q = fst(s, F_RUN_BY_IDEM, e);
  if (!q) return e->code;
  store__bind_text(q, 1, r->skill);
  store__bind_text(q, 2, r->idem);
  int rc = sqlite3_step(q);
  char *first = rc == SQLITE_ROW ? store__col_dup(q, 0) : NULL;
  sqlite3_reset(q);
  sqlite3_clear_bindings(q);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return store__db_err(e, s->w, "looking up a key");
  if (first) {
    journal_set_result(je, first);
    return 0;
  }
  if (store__put_run(s, r, "creating a run", e)) return e->code;
  sqlite3_stmt *st = fst(s, F_RUN_SET_IDEM, e);
  if (!st) return e->code;
  store__bind_text(st, 1, r->id);
  store__bind_text(st, 2, r->idem);
  return store__step(s, st, e, "keeping a run's key");
}

/* Insert a wait row; result (may be NULL) delivered now. */
static int insert_wait(store_t *s, const struct wait_row *w, const char *result, err_t *e) {
  sqlite3_stmt *st = fst(s, F_WAIT_INSERT, e);
  if (!st) return e->code;
  store__bind_text(st, 1, w->run_id);
  sqlite3_bind_int(st, 2, w->seq);
  store__bind_text(st, 3, w->kind);
  store__bind_text(st, 4, w->name);
  store__bind_text(st, 5, w->match);
  sqlite3_bind_int64(st, 6, w->since);
  store__bind_time(st, 7, w->timeout_at);
  store__bind_text(st, 8, w->owner);
  store__bind_text(st, 9, result);
  store__bind_time(st, 10, result ? units_now_ms() : 0);
  return store__step(s, st, e, "registering a wait");
}

/* Ask the owner of run_id (if unfinished) to cancel it, for reason. */
static int flag_cancel(store_t *s, const char *run_id, const char *reason, err_t *e) {
  sqlite3_stmt *st = fst(s, F_CANCEL_FLAG, e);
  if (!st) return e->code;
  store__bind_text(st, 1, run_id);
  store__bind_text(st, 2, reason);
  return store__step(s, st, e, "flagging a cancellation");
}

/* The first event since w->since that matches w and this run has not taken. */
static int find_event(store_t *s, const struct wait_row *w, char **result, char **event_id,
                      err_t *e) {
  sqlite3_stmt *st = fst(s, F_EVENTS_SINCE, e);
  if (!st) return e->code;
  store__bind_text(st, 1, w->name);
  sqlite3_bind_int64(st, 2, w->since);
  store__bind_text(st, 3, w->run_id);
  store__bind_text(st, 4, w->exclude);
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    char *ej = store__event_json((const char *)sqlite3_column_text(st, 0),
                          (const char *)sqlite3_column_text(st, 1),
                          (const char *)sqlite3_column_text(st, 2), sqlite3_column_int64(st, 3));
    if (ej && store__event_matches(ej, w->match)) {
      *result = ej;
      *event_id = store__col_dup(st, 0);
      break;
    }
    free(ej);
  }
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : store__db_err(e, s->w, "finding events");
}

/* J_WAIT: register a wait, or renew it (a replay, a new owner); the result
** is what it got already: a child's outcome, or a matching event. */
static int write_wait(store_t *s, const struct jentry *je, err_t *e) {
  const struct wait_row *w = &je->u.wait;
  sqlite3_stmt *st = fst(s, F_WAIT_GET, e);
  if (!st) return e->code;
  store__bind_text(st, 1, w->run_id);
  sqlite3_bind_int(st, 2, w->seq);
  int rc = sqlite3_step(st);
  int exists = rc == SQLITE_ROW;
  char *result = exists ? store__col_dup(st, 0) : NULL;
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  if (exists) {
    /* Registered before (a replay, or a new owner): keep what it got. */
    if (result) {
      journal_set_result(je, result);
      return 0;
    }
    st = fst(s, F_WAIT_UPDATE, e);
    if (!st) return e->code;
    store__bind_text(st, 1, w->run_id);
    sqlite3_bind_int(st, 2, w->seq);
    store__bind_text(st, 3, w->owner);
    store__bind_time(st, 4, w->timeout_at);
    return store__step(s, st, e, "renewing a wait");
  }
  char *event_id = NULL;
  if (!strcmp(w->kind, "child")) {
    st = fst(s, F_RUN_OUTCOME, e);
    if (!st) return e->code;
    store__bind_text(st, 1, w->name);
    if (sqlite3_step(st) == SQLITE_ROW && store__is_terminal((const char *)sqlite3_column_text(st, 1)))
      result = outcome_json(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
  } else if (find_event(s, w, &result, &event_id, e)) {
    return e->code;
  }
  int err = insert_wait(s, w, result, e);
  if (!err && event_id) {
    st = fst(s, F_DELIVERY_INSERT, e);
    if (!st) err = e->code;
    else {
      store__bind_text(st, 1, w->run_id);
      store__bind_text(st, 2, event_id);
      sqlite3_bind_int(st, 3, w->seq);
      err = store__step(s, st, e, "recording a delivery");
    }
    if (!err && !strcmp(w->kind, "cancel")) err = flag_cancel(s, w->run_id, result, e);
  }
  free(event_id);
  if (err) {
    free(result);
    return err;
  }
  journal_set_result(je, result);
  return 0;
}

/* J_WAIT_END: end a wait; the result is what it got meanwhile, if
** anything. Kept (keep), the row stays for the step's end to remove, and
** one with nothing delivered is closed in this transaction: an event
** dispatched after this commit is not taken by it. */
static int write_wait_end(store_t *s, const struct jentry *je, err_t *e) {
  const struct wait_end *w = &je->u.wait_end;
  sqlite3_stmt *st = fst(s, F_WAIT_GET, e);
  if (!st) return e->code;
  store__bind_text(st, 1, w->run_id);
  sqlite3_bind_int(st, 2, w->seq);
  if (sqlite3_step(st) == SQLITE_ROW) journal_set_result(je, store__col_dup(st, 0));
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  if (w->keep && je->result) return 0;
  st = fst(s, w->keep ? F_WAIT_CLOSE : F_WAIT_DELETE, e);
  if (!st) return e->code;
  store__bind_text(st, 1, w->run_id);
  sqlite3_bind_int(st, 2, w->seq);
  if (w->keep) sqlite3_bind_int64(st, 3, units_now_ms());
  return store__step(s, st, e, "ending a wait");
}

/* J_CHILD_DONE: hand a child run's outcome to the waits on it. */
static int write_child_done(store_t *s, const struct jentry *je, err_t *e) {
  sqlite3_stmt *st = fst(s, F_CHILD_DONE, e);
  if (!st) return e->code;
  store__bind_text(st, 1, je->u.child.child_id);
  store__bind_text(st, 2, je->u.child.outcome);
  sqlite3_bind_int64(st, 3, units_now_ms());
  return store__step(s, st, e, "delivering a child's outcome");
}

/* Cancel run_id and its descendants: ones held by a live engine are flagged
** for it (a run asked before keeps the first reason); the others (queued,
** or left by an engine that stopped or died) end now, with the message
** their owner would give them, and their parents' waits get the outcome.
** A run that asks for its own (by_run: it ends) means its descendants: its
** own end is in the same group. */
static int write_cancel(store_t *s, const struct jentry *je, err_t *e) {
  const struct cancel_row *c = &je->u.cancel;
  int self = c->by_run && !strcmp(c->by_run, c->run_id);
  sqlite3_stmt *st = store__prep(s->w,
    "WITH RECURSIVE tree(id) AS (SELECT ?1 UNION SELECT r.id FROM runs r JOIN tree"
    " ON r.parent_id = tree.id) SELECT runs.id, status, EXISTS (SELECT 1 FROM leases l"
    " WHERE l.owner = runs.owner AND l.expires_at > ?2) FROM runs JOIN tree"
    " ON runs.id = tree.id", e);
  if (!st) return e->code;
  store__bind_text(st, 1, c->run_id);
  sqlite3_bind_int64(st, 2, c->at);
  char *ids[256];
  int owned[256], n = 0, rc, found = 0;
  char *top_status = NULL;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    const char *id = (const char *)sqlite3_column_text(st, 0);
    const char *status = (const char *)sqlite3_column_text(st, 1);
    if (!strcmp(id, c->run_id)) {
      found = 1;
      top_status = mem_strdup(status);
      if (self) continue;
    }
    if (store__is_terminal(status) || n == 256) continue;
    owned[n] = sqlite3_column_int(st, 2);
    ids[n++] = mem_strdup(id);
  }
  sqlite3_finalize(st);
  int err = 0;
  if (rc != SQLITE_DONE) err = store__db_err(e, s->w, "finding runs to cancel");
  if (!err && !found) {
    journal_set_result(je, mem_strdup("notfound"));
  } else if (!err && store__is_terminal(top_status)) {
    char buf[64];
    snprintf(buf, sizeof buf, "ended:%s", top_status);
    journal_set_result(je, mem_strdup(buf));
  } else if (!err) {
    char msg[600];
    jsontext_cancel_message(c->reason, msg, sizeof msg);
    char *errjson = jsontext_message(msg);
    const char *top = "cancelling";
    for (int i = 0; i < n && !err; i++) {
      if (owned[i]) {
        err = flag_cancel(s, ids[i], c->reason, e);
        continue;
      }
      sqlite3_stmt *u = store__prep(s->w,
        "UPDATE runs SET status = 'cancelled', ended_at = ?2, error = ?3, wake_at = NULL,"
        " owner = NULL WHERE id = ?1 RETURNING id, status, output, error", e);
      if (!u) {
        err = e->code;
        break;
      }
      store__bind_text(u, 1, ids[i]);
      sqlite3_bind_int64(u, 2, c->at);
      store__bind_text(u, 3, errjson);
      char *outcome = sqlite3_step(u) == SQLITE_ROW ? outcome_json(u) : NULL;
      sqlite3_finalize(u);
      err = store__run_ended(s, ids[i], "cancelled", e);
      if (!strcmp(ids[i], c->run_id)) top = "cancelled";
      if (outcome && !err) {
        struct jentry fake = {.kind = J_CHILD_DONE};
        fake.u.child.child_id = ids[i];
        fake.u.child.outcome = outcome;
        err = write_child_done(s, &fake, e);
      }
      free(outcome);
    }
    free(errjson);
    if (!err) journal_set_result(je, mem_strdup(top));
  }
  for (int i = 0; i < n; i++) free(ids[i]);
  free(top_status);
  return err;
}

/* J_CRON: record a cron tick and start its run, unless another engine
** fired that tick already; the result is "1" when the run was created. */
static int write_cron(store_t *s, const struct jentry *je, err_t *e) {
  const struct cron_row *c = &je->u.cron;
  sqlite3_stmt *st = fst(s, F_CRON_GET, e);
  if (!st) return e->code;
  store__bind_text(st, 1, c->skill);
  store__bind_text(st, 2, c->spec);
  int have = sqlite3_step(st) == SQLITE_ROW;
  int64_t last = have ? sqlite3_column_int64(st, 0) : 0;
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  if (have && last >= c->tick) return 0; /* another engine fired it */
  sqlite3_stmt *set = fst(s, F_CRON_SET, e);
  if (!set) return e->code;
  store__bind_text(set, 1, c->skill);
  store__bind_text(set, 2, c->spec);
  sqlite3_bind_int64(set, 3, c->tick);
  if (store__step(s, set, e, "recording a cron tick")) return e->code;
  if (!c->run.id) return 0; /* only the state (first registration) */
  if (store__put_run(s, &c->run, "creating a cron run", e)) return e->code;
  journal_set_result(je, mem_strdup("1"));
  return 0;
}

/* See store_db.h: the journal entries of this file, by kind. */
int store__write_flow(store_t *s, const struct jentry *je, err_t *e) {
  switch (je->kind) {
  case J_EVENT: return write_event(s, je, e);
  case J_WAIT: return write_wait(s, je, e);
  case J_WAIT_END: return write_wait_end(s, je, e);
  case J_CHILD_DONE: return write_child_done(s, je, e);
  case J_CANCEL: return write_cancel(s, je, e);
  case J_SLOT: return store__write_slot(s, je, e);
  case J_CRON: return write_cron(s, je, e);
  default: return err_set(e, ERR_INTERNAL, "store: unknown journal entry kind %d", (int)je->kind);
  }
}

/* See store_db.h: a run ended, so drop its waits, slots and queue places. */
int store__run_ended(store_t *s, const char *run_id, const char *status, err_t *e) {
  /* Its slots and queue places go to the runs queued behind it. */
  if (store__slots_free(s, run_id, NULL, e)) return e->code;
  static const char *const sql[] = {
    "DELETE FROM waits WHERE run_id = ?1",
    /* A step still open (asleep, waiting, running) ended with its run: the
    ** trace must not show it asleep forever. A completed run has none. */
    "UPDATE steps SET status = CASE (SELECT status FROM runs WHERE id = ?1)"
    " WHEN 'cancelled' THEN 'cancelled' ELSE 'failed' END,"
    " ended_at = (SELECT ended_at FROM runs WHERE id = ?1), wake_at = NULL, retry_at = NULL"
    " WHERE run_id = ?1 AND status IN ('running', 'sleeping', 'waiting')",
  };
  static const char *const summary[] = {
    "UPDATE runs SET (steps, failed_steps, retries, tokens) = (" STORE_STEP_SUMMARY "?1)"
    " WHERE id = ?1",
  };
  /* A completed run has no open steps, and got its summary with its
  ** status (W_RUN_SET); the others get it once their steps are ended. */
  int completed = vocab_run_status(status) == RUN_COMPLETED;
  if (store__exec_bound(s, sql, completed ? 1 : 2, run_id, "cleaning up after a run", e))
    return e->code;
  if (!completed && store__exec_bound(s, summary, 1, run_id, "summing up a run's steps", e))
    return e->code;
  /* The run, summed up, goes into the figures' rollup in this transaction. */
  return store__rollup_run(s, run_id, 1, e);
}

/* Start the runs of skills triggered by this event. */
static int trigger_runs(store_t *s, const char *ej, const char *name, const char *data,
                        int64_t now, int *runs, err_t *e) {
  sqlite3_stmt *st = store__cached(s,
    "SELECT DISTINCT s.id, s.version FROM skills s, json_each(s.triggers) t"
    " WHERE s.version IS NOT NULL AND json_extract(t.value, '$.event') = ?1", e);
  if (!st) return e->code;
  store__bind_text(st, 1, name);
  cJSON *trig = cJSON_CreateObject();
  cJSON_AddStringToObject(trig, "kind", "event");
  cJSON_AddItemToObject(trig, "event", cJSON_Parse(ej));
  char *tj = jsontext_print_text(trig);
  cJSON_Delete(trig);
  int err = 0;
  while (!err && sqlite3_step(st) == SQLITE_ROW) {
    char id[27];
    ids_ulid(now, id);
    struct run_row r = {
      .id = id, .skill = (const char *)sqlite3_column_text(st, 0),
      .version = (const char *)sqlite3_column_text(st, 1), .status = "queued", .entry = "run",
      .trigger = tj, .input = data ? data : "null", .created_at = now,
    };
    err = store__put_run(s, &r, "starting a triggered run", e);
    if (!err) (*runs)++;
  }
  sqlite3_reset(st);
  free(tj);
  return err;
}

/* Deliver the event to the pending waits on its name that it matches. */
static int deliver_event(store_t *s, const char *id, const char *name, const char *ej,
                         int64_t ts, int64_t now, err_t *e) {
  sqlite3_stmt *st = store__cached(s,
    "SELECT run_id, seq, kind, match_json FROM waits"
    " WHERE kind IN ('event', 'cancel') AND name = ?1 AND result IS NULL"
    " AND delivered_at IS NULL AND since <= ?2"
    " AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.run_id = waits.run_id"
    " AND d.event_id = ?3)", e);
  if (!st) return e->code;
  store__bind_text(st, 1, name);
  sqlite3_bind_int64(st, 2, ts);
  store__bind_text(st, 3, id);
  int err = 0;
  while (!err && sqlite3_step(st) == SQLITE_ROW) {
    if (!store__event_matches(ej, (const char *)sqlite3_column_text(st, 3))) continue;
    const char *run_id = (const char *)sqlite3_column_text(st, 0);
    int seq = sqlite3_column_int(st, 1);
    sqlite3_stmt *u = store__cached(s,
      "UPDATE waits SET result = ?3, delivered_at = ?4 WHERE run_id = ?1 AND seq = ?2", e);
    sqlite3_stmt *d = fst(s, F_DELIVERY_INSERT, e);
    if (!u || !d) {
      err = e->code;
      break;
    }
    store__bind_text(u, 1, run_id);
    sqlite3_bind_int(u, 2, seq);
    store__bind_text(u, 3, ej);
    sqlite3_bind_int64(u, 4, now);
    int rc = sqlite3_step(u);
    sqlite3_reset(u);
    if (rc != SQLITE_DONE) err = store__db_err(e, s->w, "delivering an event");
    if (!err) {
      store__bind_text(d, 1, run_id);
      store__bind_text(d, 2, id);
      sqlite3_bind_int(d, 3, seq);
      err = store__step(s, d, e, "recording a delivery");
    }
    if (!err && !strcmp((const char *)sqlite3_column_text(st, 2), "cancel"))
      err = flag_cancel(s, run_id, ej, e);
  }
  sqlite3_reset(st);
  return err;
}

/* See store.h. */
int store__sqlite_dispatch(store_t *s, int64_t now, int limit, int *runs, err_t *e) {
  *runs = 0;
  /* Asked after every write another connection may have made: its
  ** statements are prepared once (store__cached). */
  if (store__step(s, s->ws[W_BEGIN], e, "beginning a transaction")) return e->code;
  sqlite3_stmt *st = store__cached(s,
    "SELECT id, name, data, ts FROM events WHERE dispatched = 0 ORDER BY ts, id LIMIT ?1", e);
  if (!st) {
    store__step(s, s->ws[W_ROLLBACK], NULL, "rolling back");
    return e->code;
  }
  sqlite3_bind_int(st, 1, limit);
  int n = 0, err = 0;
  while (!err && sqlite3_step(st) == SQLITE_ROW) {
    const char *id = (const char *)sqlite3_column_text(st, 0);
    const char *name = (const char *)sqlite3_column_text(st, 1);
    const char *data = (const char *)sqlite3_column_text(st, 2);
    int64_t ts = sqlite3_column_int64(st, 3);
    char *ej = store__event_json(id, name, data, ts);
    err = trigger_runs(s, ej, name, data, now, runs, e);
    if (!err) err = deliver_event(s, id, name, ej, ts, now, e);
    free(ej);
    if (!err) {
      sqlite3_stmt *u = store__cached(s, "UPDATE events SET dispatched = 1 WHERE id = ?1", e);
      if (!u) err = e->code;
      else {
        store__bind_text(u, 1, id);
        if (sqlite3_step(u) != SQLITE_DONE) err = store__db_err(e, s->w, "dispatching an event");
        sqlite3_reset(u);
      }
    }
    n++;
  }
  sqlite3_reset(st);
  if (!err && n && fault_hit(FAULT_DISPATCH_FAIL))
    err = err_set(e, ERR_IO, "store: dispatching events: the transaction failed (fault injected: "
                  "dispatch_fail)");
  if (err || store__step(s, s->ws[W_COMMIT], e, "committing")) {
    store__step(s, s->ws[W_ROLLBACK], NULL, "rolling back");
    *runs = 0;
    return e->code ? e->code : ERR_IO;
  }
  return n;
}

/* See store.h: events after *cursor (rowids: the order their transactions
** committed in), one transaction. */
int store__sqlite_deliver(store_t *s, int64_t *cursor, int limit, err_t *e) {
  if (store__exec(s->w, "BEGIN IMMEDIATE", e)) return e->code;
  int err = 0, n = 0;
  if (*cursor < 0) {
    /* Start at the oldest event no engine has dispatched yet. */
    sqlite3_stmt *q = store__cached(s,
      "SELECT coalesce((SELECT min(rowid) FROM events WHERE dispatched = 0) - 1,"
      " (SELECT max(rowid) FROM events), 0)", e);
    if (!q) err = e->code;
    else if (sqlite3_step(q) == SQLITE_ROW) *cursor = sqlite3_column_int64(q, 0);
    else err = store__db_err(e, s->w, "finding events to deliver");
    if (q) sqlite3_reset(q);
  }
  sqlite3_stmt *st = err ? NULL : store__cached(s,
    "SELECT rowid, id, name, data, ts, dispatched FROM events WHERE rowid > ?1"
    " ORDER BY rowid LIMIT ?2", e);
  if (!err && !st) err = e->code;
  if (st) {
    sqlite3_bind_int64(st, 1, *cursor);
    sqlite3_bind_int(st, 2, limit);
  }
  int64_t at = *cursor, now = units_now_ms();
  while (!err && sqlite3_step(st) == SQLITE_ROW) {
    at = sqlite3_column_int64(st, 0);
    n++;
    if (sqlite3_column_int(st, 5)) continue; /* dispatched: delivered then */
    const char *id = (const char *)sqlite3_column_text(st, 1);
    const char *name = (const char *)sqlite3_column_text(st, 2);
    int64_t ts = sqlite3_column_int64(st, 4);
    char *ej = store__event_json(id, name, (const char *)sqlite3_column_text(st, 3), ts);
    err = deliver_event(s, id, name, ej, ts, now, e);
    free(ej);
  }
  if (st) sqlite3_reset(st);
  if (err || store__exec(s->w, "COMMIT", e)) {
    store__exec(s->w, "ROLLBACK", NULL);
    return e->code ? e->code : ERR_IO;
  }
  *cursor = at;
  return n;
}

/* See store_db.h: SKILL_ERROR records a load error; SKILL_REMOVE clears
** the live version. */
int store__skill_change(store_t *s, const struct skill_row *r, err_t *e) {
  const char *sql = r->op == SKILL_ERROR
    ? "INSERT INTO skills(id, file, error, updated_at) VALUES(?1, ?2, ?3, ?4)"
      " ON CONFLICT(id) DO UPDATE SET error = ?3, updated_at = ?4"
    : "UPDATE skills SET version = NULL, error = NULL, updated_at = ?4 WHERE id = ?1";
  sqlite3_stmt *st = store__prep(s->w, sql, e);
  if (!st) return e->code;
  store__bind_text(st, 1, r->id);
  store__bind_text(st, 2, r->file);
  store__bind_text(st, 3, r->error);
  sqlite3_bind_int64(st, 4, r->updated_at);
  int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return store__db_err(e, s->w, "changing a skill's record");
  /* A skill that never had a version (only a load error) leaves no record. */
  static const char *const forget[] = {
    "DELETE FROM skills WHERE id = ?1 AND version IS NULL AND error IS NULL"
    " AND NOT EXISTS (SELECT 1 FROM versions WHERE skill = ?1)",
  };
  return r->op == SKILL_ERROR ? 0 : store__exec_bound(s, forget, 1, r->id, "forgetting a skill", e);
}
