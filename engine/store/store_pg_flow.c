/*
** store_pg_flow.c: the PostgreSQL store's part for triggers and flow, as
** store_flow.c is SQLite's (journal.h gives each entry's contract):
** accepted events, waits and their deliveries, cancellation, concurrency
** slots, cron ticks; dispatching events; the registry's changes; a run's
** end; and retention (store_prune.c's).
**
** Waits and events meet in exactly one transaction, whichever comes
** first: registering a wait looks for an event that already arrived;
** dispatching an event looks for the waits registered on its name. Both
** run under the store's write lock (store_pg.c), so, as on SQLite, the
** second sees the first and no event slips between them.
*/
#include "base/fault.h"
#include "base/ids.h"
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/units.h"
#include "base/vocab.h"
#include "store/store_pg_db.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Statement sql with v[0..nv), returning rows, on the writer. */
static PGresult *wrun(struct pg_store *s, const char *sql, const struct store_val *v, int nv,
                      const char *what, err_t *e) {
  return store__pg_run(s, &s->w, NULL, sql, v, nv, what, e);
}

/* A statement that returns no rows, on the writer. */
static int wdo(struct pg_store *s, const char *sql, const struct store_val *v, int nv,
               int64_t *changed, const char *what, err_t *e) {
  return store__pg_do(s, &s->w, sql, v, nv, changed, what, e);
}

/* Outcome JSON of an ended run, for its parent, from row i of res (id,
** status, output, error): {run_id, status, output, error}. */
static char *outcome_json(const PGresult *res, int i) {
  const char *c[4];
  for (int k = 0; k < 4; k++) c[k] = PQgetisnull(res, i, k) ? NULL : PQgetvalue(res, i, k);
  return jsontext_run_outcome(c[0], c[1], c[2], c[3]);
}

/* J_EVENT: accept an event; the result is its id (the first event's id for
** a repeated idempotency key). */
static int write_event(struct pg_store *s, const struct jentry *je, err_t *e) {
  const struct event_row *ev = &je->u.event;
  struct store_val v[5] = {SV_TEXT(ev->id), SV_TEXT(ev->name), SV_TEXT(ev->data),
                           SV_TEXT(ev->idem), SV_INT(ev->ts)};
  int64_t changed = 0;
  if (wdo(s, "INSERT INTO events(id, name, data, idem, ts) VALUES($1,$2,$3,$4,$5)"
          " ON CONFLICT DO NOTHING", v, 5, &changed, "accepting an event", e))
    return e->code;
  if (changed == 0 && ev->idem) {
    /* A repeat of an idempotency key: answer with the first event's id. */
    PGresult *r = wrun(s, "SELECT id FROM events WHERE idem = $1", v + 3, 1, "accepting an event", e);
    if (!r) return e->code;
    if (PQntuples(r) == 1) journal_set_result(je, store__pg_dup(r, 0, 0));
    PQclear(r);
  } else {
    journal_set_result(je, mem_strdup(ev->id));
  }
  return 0;
}

/* See store_pg_db.h: J_RUN_NEW with a key. The first run of (skill, key)
** wins: a repeat writes nothing and its result is the first run's id. */
int store__pg_put_keyed_run(struct pg_store *s, const struct jentry *je, err_t *e) {
  const struct run_row *r = &je->u.run;
  struct store_val v[2] = {SV_TEXT(r->skill), SV_TEXT(r->idem)};
  PGresult *q = wrun(s, "SELECT id FROM runs WHERE skill = $1 AND idem = $2", v, 2,
                     "looking up a key", e);
  if (!q) return e->code;
  char *first = PQntuples(q) ? store__pg_dup(q, 0, 0) : NULL;
  PQclear(q);
  if (first) {
    journal_set_result(je, first);
    return 0;
  }
  if (store__pg_put_run(s, r, "creating a run", e)) return e->code;
  struct store_val u[2] = {SV_TEXT(r->id), SV_TEXT(r->idem)};
  return wdo(s, "UPDATE runs SET idem = $2 WHERE id = $1", u, 2, NULL, "keeping a run's key", e);
}

/* Insert a wait row; result (may be NULL) delivered now. */
static int insert_wait(struct pg_store *s, const struct wait_row *w, const char *result, err_t *e) {
  struct store_val v[10] = {
    SV_TEXT(w->run_id), SV_INT(w->seq), SV_TEXT(w->kind), SV_TEXT(w->name),
    SV_TEXT(w->match), SV_INT(w->since), SV_TIME(w->timeout_at),
    SV_TEXT(w->owner), SV_TEXT(result), SV_TIME(result ? units_now_ms() : 0)};
  return wdo(s, "INSERT INTO waits(run_id, seq, kind, name, match_json, since,"
             " timeout_at, owner, result, delivered_at) VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)",
             v, 10, NULL, "registering a wait", e);
}

/* Ask the owner of run_id (if unfinished) to cancel it, for reason; a
** run asked before keeps the first reason. */
static int flag_cancel(struct pg_store *s, const char *run_id, const char *reason, err_t *e) {
  struct store_val v[2] = {SV_TEXT(run_id), SV_TEXT(reason)};
  return wdo(s, "UPDATE runs SET cancel_requested = 1, cancel_reason = $2 WHERE id = $1"
             " AND status NOT IN (" VOCAB_RUN_ENDED_SQL ") AND cancel_requested = 0",
             v, 2, NULL,
             "flagging a cancellation", e);
}

/* Record that run_id's wait seq took event_id. */
static int put_delivery(struct pg_store *s, const char *run_id, const char *event_id, int seq,
                        err_t *e) {
  struct store_val v[3] = {SV_TEXT(run_id), SV_TEXT(event_id), SV_INT(seq)};
  return wdo(s, "INSERT INTO deliveries(run_id, event_id, seq) VALUES($1,$2,$3)"
             " ON CONFLICT DO NOTHING", v, 3, NULL, "recording a delivery", e);
}

/* The first event since w->since that matches w and this run has not taken. */
static int find_event(struct pg_store *s, const struct wait_row *w, char **result,
                      char **event_id, err_t *e) {
  struct store_val v[4] = {SV_TEXT(w->name), SV_INT(w->since), SV_TEXT(w->run_id),
                           SV_TEXT(w->exclude)};
  PGresult *r = wrun(s,
    "SELECT id, name, data, ts FROM events WHERE name = $1 AND ts >= $2"
    " AND id IS DISTINCT FROM $4 AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE"
    " d.run_id = $3 AND d.event_id = events.id) ORDER BY ts, id LIMIT 1000", v, 4,
    "finding events", e);
  if (!r) return e->code;
  for (int i = 0; i < PQntuples(r); i++) {
    char *ej = store__event_json(PQgetvalue(r, i, 0), PQgetvalue(r, i, 1),
                                 PQgetisnull(r, i, 2) ? NULL : PQgetvalue(r, i, 2),
                                 store__pg_i64(r, i, 3));
    if (ej && store__event_matches(ej, w->match)) {
      *result = ej;
      *event_id = store__pg_dup(r, i, 0);
      break;
    }
    free(ej);
  }
  PQclear(r);
  return 0;
}

/* J_WAIT: register a wait, or renew it (a replay, a new owner); the result
** is what it got already: a child's outcome, or a matching event. */
static int write_wait(struct pg_store *s, const struct jentry *je, err_t *e) {
  const struct wait_row *w = &je->u.wait;
  struct store_val k[2] = {SV_TEXT(w->run_id), SV_INT(w->seq)};
  PGresult *r = wrun(s, "SELECT result FROM waits WHERE run_id = $1 AND seq = $2", k, 2,
                     "reading a wait", e);
  if (!r) return e->code;
  int exists = PQntuples(r) == 1;
  char *result = exists ? store__pg_dup(r, 0, 0) : NULL;
  PQclear(r);
  if (exists) {
    /* Registered before (a replay, or a new owner): keep what it got. */
    if (result) {
      journal_set_result(je, result);
      return 0;
    }
    struct store_val v[4] = {SV_TEXT(w->run_id), SV_INT(w->seq), SV_TEXT(w->owner),
                             SV_TIME(w->timeout_at)};
    return wdo(s, "UPDATE waits SET owner = $3, timeout_at = $4 WHERE run_id = $1 AND seq = $2",
               v, 4, NULL, "renewing a wait", e);
  }
  char *event_id = NULL;
  if (!strcmp(w->kind, "child")) {
    struct store_val v[1] = {SV_TEXT(w->name)};
    r = wrun(s, "SELECT id, status, output, error FROM runs WHERE id = $1", v, 1,
             "reading a child run", e);
    if (!r) return e->code;
    if (PQntuples(r) == 1 && store__is_terminal(PQgetvalue(r, 0, 1))) result = outcome_json(r, 0);
    PQclear(r);
  } else if (find_event(s, w, &result, &event_id, e)) {
    return e->code;
  }
  int err = insert_wait(s, w, result, e);
  if (!err && event_id) {
    err = put_delivery(s, w->run_id, event_id, w->seq, e);
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
** one with nothing delivered is closed in this transaction (delivered_at
** set, result NULL): an event dispatched after this commit is not taken
** by it. */
static int write_wait_end(struct pg_store *s, const struct jentry *je, err_t *e) {
  const struct wait_end *w = &je->u.wait_end;
  struct store_val k[3] = {SV_TEXT(w->run_id), SV_INT(w->seq), SV_INT(units_now_ms())};
  PGresult *r = wrun(s, w->keep
    ? "UPDATE waits SET delivered_at = CASE WHEN result IS NULL THEN $3 ELSE delivered_at END"
      " WHERE run_id = $1 AND seq = $2 RETURNING result"
    : "DELETE FROM waits WHERE run_id = $1 AND seq = $2 RETURNING result",
    k, w->keep ? 3 : 2, "ending a wait", e);
  if (!r) return e->code;
  if (PQntuples(r) == 1) journal_set_result(je, store__pg_dup(r, 0, 0));
  PQclear(r);
  return 0;
}

/* Hand a child run's outcome to the waits on it. */
static int child_done(struct pg_store *s, const char *child_id, const char *outcome, err_t *e) {
  struct store_val v[3] = {SV_TEXT(child_id), SV_TEXT(outcome), SV_INT(units_now_ms())};
  return wdo(s, "UPDATE waits SET result = $2, delivered_at = $3"
             " WHERE kind = 'child' AND name = $1 AND result IS NULL AND delivered_at IS NULL",
             v, 3, NULL,
             "delivering a child's outcome", e);
}

/* Cancel run_id and its descendants: ones held by a live engine are flagged
** for it (a run asked before keeps the first reason); the others (queued,
** or left by an engine that stopped or died) end now, with the message
** their owner would give them, and their parents' waits get the outcome.
** A run that asks for its own (by_run: it ends) means its descendants: its
** own end is in the same group. */
static int write_cancel(struct pg_store *s, const struct jentry *je, err_t *e) {
  const struct cancel_row *c = &je->u.cancel;
  int self = c->by_run && !strcmp(c->by_run, c->run_id);
  struct store_val v[2] = {SV_TEXT(c->run_id), SV_INT(c->at)};
  PGresult *tree = wrun(s,
    "WITH RECURSIVE tree(id) AS (SELECT $1::text COLLATE \"C\" UNION SELECT r.id FROM runs r JOIN tree"
    " ON r.parent_id = tree.id) SELECT runs.id, status, (EXISTS (SELECT 1 FROM leases l"
    " WHERE l.owner = runs.owner AND l.expires_at > $2))::int FROM runs JOIN tree"
    " ON runs.id = tree.id", v, 2, "finding runs to cancel", e);
  if (!tree) return e->code;
  int found = 0, err = 0;
  const char *top_status = NULL;
  for (int i = 0; i < PQntuples(tree); i++)
    if (!strcmp(PQgetvalue(tree, i, 0), c->run_id)) {
      found = 1;
      top_status = PQgetvalue(tree, i, 1);
    }
  if (!found) {
    journal_set_result(je, mem_strdup("notfound"));
  } else if (store__is_terminal(top_status)) {
    char buf[64];
    snprintf(buf, sizeof buf, "ended:%s", top_status);
    journal_set_result(je, mem_strdup(buf));
  } else {
    char msg[600];
    jsontext_cancel_message(c->reason, msg, sizeof msg);
    char *errjson = jsontext_message(msg);
    const char *top = "cancelling";
    for (int i = 0, n = 0; i < PQntuples(tree) && !err && n < 256; i++) {
      const char *id = PQgetvalue(tree, i, 0);
      if (self && !strcmp(id, c->run_id)) continue;
      if (store__is_terminal(PQgetvalue(tree, i, 1))) continue;
      n++;
      if (atoi(PQgetvalue(tree, i, 2))) {
        err = flag_cancel(s, id, c->reason, e);
        continue;
      }
      if (!strcmp(id, c->run_id)) top = "cancelled";
      struct store_val u[3] = {SV_TEXT(id), SV_INT(c->at), SV_TEXT(errjson)};
      PGresult *o = wrun(s,
        "UPDATE runs SET status = 'cancelled', ended_at = $2, error = $3, wake_at = NULL,"
        " owner = NULL WHERE id = $1 RETURNING id, status, output, error", u, 3,
        "cancelling a run", e);
      if (!o) {
        err = e->code;
        break;
      }
      char *outcome = PQntuples(o) == 1 ? outcome_json(o, 0) : NULL;
      PQclear(o);
      err = store__pg_run_ended(s, id, "cancelled", e);
      if (outcome && !err) err = child_done(s, id, outcome, e);
      free(outcome);
    }
    free(errjson);
    if (!err) journal_set_result(je, mem_strdup(top));
  }
  PQclear(tree);
  return err;
}

/* J_CRON: record a cron tick and start its run, unless another engine
** fired that tick already; the result is "1" when the run was created.
** One statement decides: the tick is written only over an older one. */
static int write_cron(struct pg_store *s, const struct jentry *je, err_t *e) {
  const struct cron_row *c = &je->u.cron;
  struct store_val v[3] = {SV_TEXT(c->skill), SV_TEXT(c->spec), SV_INT(c->tick)};
  int64_t changed = 0;
  if (wdo(s, "INSERT INTO cron_state(skill, spec, last_tick) VALUES($1,$2,$3)"
          " ON CONFLICT(skill, spec) DO UPDATE SET last_tick = excluded.last_tick"
          " WHERE cron_state.last_tick < excluded.last_tick", v, 3, &changed,
          "recording a cron tick", e))
    return e->code;
  if (!changed) return 0;   /* another engine fired it */
  if (!c->run.id) return 0; /* only the state (first registration) */
  if (store__pg_put_run(s, &c->run, "creating a cron run", e)) return e->code;
  journal_set_result(je, mem_strdup("1"));
  return 0;
}

/* See store_pg_db.h: the journal entries of this file, by kind. */
int store__pg_write_flow(struct pg_store *s, const struct jentry *je, err_t *e) {
  switch (je->kind) {
  case J_EVENT: return write_event(s, je, e);
  case J_WAIT: return write_wait(s, je, e);
  case J_WAIT_END: return write_wait_end(s, je, e);
  case J_CHILD_DONE: return child_done(s, je->u.child.child_id, je->u.child.outcome, e);
  case J_CANCEL: return write_cancel(s, je, e);
  case J_SLOT: return store__write_slot((store_t *)(void *)s, je, e);
  case J_CRON: return write_cron(s, je, e);
  default: return err_set(e, ERR_INTERNAL, "store: unknown journal entry kind %d", (int)je->kind);
  }
}

/* See store_pg_db.h: a run ended, so drop its waits, and hand its slots
** and queue places on (store_queue.c; the group holds the whole write
** lock when the run had any: pg_commit). */
int store__pg_run_ended(struct pg_store *s, const char *run_id, const char *status, err_t *e) {
  static const char *const sql[] = {
    "DELETE FROM waits WHERE run_id = $1",
    /* A step still open (asleep, waiting, running) ended with its run: the
    ** trace must not show it asleep forever. A completed run has none. */
    "UPDATE steps SET status = CASE (SELECT status FROM runs WHERE id = $1)"
    " WHEN 'cancelled' THEN 'cancelled' ELSE 'failed' END,"
    " ended_at = (SELECT ended_at FROM runs WHERE id = $1), wake_at = NULL, retry_at = NULL"
    " WHERE run_id = $1 AND status IN ('running', 'sleeping', 'waiting')",
    /* A completed run got its summary with its status (store_pg.c's
    ** J_RUN_SET statement); the others get it once their steps are ended. */
    "UPDATE runs SET (steps, failed_steps, retries, tokens) = (SELECT count(*),"
    " coalesce(sum((status = 'failed')::int), 0), coalesce(sum(greatest(attempts - 1, 0)), 0),"
    " coalesce(sum(moonloop_tokens(usage)), 0) FROM steps WHERE run_id = $1) WHERE id = $1",
  };
  struct store_val v[1] = {SV_TEXT(run_id)};
  if (store__slots_free((store_t *)(void *)s, run_id, NULL, e))
    return e->code;
  size_t n = vocab_run_status(status) == RUN_COMPLETED ? 1 : 3;
  for (size_t i = 0; i < n; i++)
    if (wdo(s, sql[i], v, 1, NULL, i < 2 ? "cleaning up after a run" : "summing up a run's steps",
            e))
      return e->code;
  /* The run, summed up, goes into the figures' rollup in this transaction. */
  return store__rollup_run((store_t *)(void *)s, run_id, 1, e);
}

/* Start the runs of skills triggered by this event (the event name in
** one of their triggers). */
static int trigger_runs(struct pg_store *s, const char *ej, const char *name, const char *data,
                        int64_t now, int *runs, err_t *e) {
  struct store_val v[1] = {SV_TEXT(name)};
  PGresult *r = wrun(s,
    "SELECT DISTINCT s.id, s.version FROM skills s, jsonb_array_elements(CASE WHEN"
    " jsonb_typeof(s.triggers::jsonb) = 'array' THEN s.triggers::jsonb ELSE '[]'::jsonb END) t"
    " WHERE s.version IS NOT NULL AND t.value ->> 'event' = $1 ORDER BY s.id", v, 1,
    "finding triggered skills", e);
  if (!r) return e->code;
  cJSON *trig = cJSON_CreateObject();
  cJSON_AddStringToObject(trig, "kind", "event");
  cJSON_AddItemToObject(trig, "event", cJSON_Parse(ej));
  char *tj = jsontext_print_text(trig);
  cJSON_Delete(trig);
  int err = 0;
  for (int i = 0; i < PQntuples(r) && !err; i++) {
    char id[27];
    ids_ulid(now, id);
    struct run_row run = {
      .id = id, .skill = PQgetvalue(r, i, 0), .version = PQgetvalue(r, i, 1), .status = "queued",
      .entry = "run", .trigger = tj, .input = data ? data : "null", .created_at = now,
    };
    err = store__pg_put_run(s, &run, "starting a triggered run", e);
    if (!err) (*runs)++;
  }
  PQclear(r);
  free(tj);
  return err;
}

/* Deliver the event to the pending waits on its name that it matches. */
static int deliver_event(struct pg_store *s, const char *id, const char *name, const char *ej,
                         int64_t ts, int64_t now, err_t *e) {
  struct store_val v[3] = {SV_TEXT(name), SV_INT(ts), SV_TEXT(id)};
  PGresult *r = wrun(s,
    "SELECT run_id, seq, kind, match_json FROM waits"
    " WHERE kind IN ('event', 'cancel') AND name = $1 AND result IS NULL"
    " AND delivered_at IS NULL AND since <= $2"
    " AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.run_id = waits.run_id"
    " AND d.event_id = $3)", v, 3, "finding waits", e);
  if (!r) return e->code;
  int err = 0;
  for (int i = 0; i < PQntuples(r) && !err; i++) {
    if (!store__event_matches(ej, PQgetisnull(r, i, 3) ? NULL : PQgetvalue(r, i, 3))) continue;
    const char *run_id = PQgetvalue(r, i, 0);
    int seq = atoi(PQgetvalue(r, i, 1));
    struct store_val u[4] = {SV_TEXT(run_id), SV_INT(seq), SV_TEXT(ej), SV_INT(now)};
    err = wdo(s, "UPDATE waits SET result = $3, delivered_at = $4 WHERE run_id = $1 AND seq = $2",
              u, 4, NULL, "delivering an event", e);
    if (!err) err = put_delivery(s, run_id, id, seq, e);
    if (!err && !strcmp(PQgetvalue(r, i, 2), "cancel")) err = flag_cancel(s, run_id, ej, e);
  }
  PQclear(r);
  return err;
}

/* See store.h: up to limit events, oldest first, in one transaction. */
int store__pg_dispatch(store_t *st, int64_t now, int limit, int *runs, err_t *e) {
  struct pg_store *s = pg_of(st);
  *runs = 0;
  if (store__pg_begin(s, PG_LOCK_ALL, e)) return e->code;
  struct store_val v[1] = {SV_INT(limit)};
  PGresult *r = wrun(s, "SELECT id, name, data, ts FROM events WHERE dispatched = 0"
                     " ORDER BY ts, id LIMIT $1", v, 1, "reading events", e);
  if (!r) {
    store__pg_rollback(s);
    return e->code;
  }
  int n = 0, err = 0;
  for (int i = 0; i < PQntuples(r) && !err; i++) {
    const char *id = PQgetvalue(r, i, 0), *name = PQgetvalue(r, i, 1);
    const char *data = PQgetisnull(r, i, 2) ? NULL : PQgetvalue(r, i, 2);
    int64_t ts = store__pg_i64(r, i, 3);
    char *ej = store__event_json(id, name, data, ts);
    err = trigger_runs(s, ej, name, data, now, runs, e);
    if (!err) err = deliver_event(s, id, name, ej, ts, now, e);
    free(ej);
    struct store_val u[1] = {SV_TEXT(id)};
    if (!err) err = wdo(s, "UPDATE events SET dispatched = 1 WHERE id = $1", u, 1, NULL,
                        "dispatching an event", e);
    n++;
  }
  PQclear(r);
  if (!err && n && fault_hit(FAULT_DISPATCH_FAIL))
    err = err_set(e, ERR_IO, "store: dispatching events: the transaction failed (fault injected: "
                  "dispatch_fail)");
  if (err) {
    store__pg_rollback(s);
    *runs = 0;
    return err;
  }
  if (store__pg_commit_tx(s, n > 0, e)) {
    *runs = 0;
    return e->code;
  }
  return n;
}

/* See store.h: events after *cursor in the order their transactions
** committed (events.n: numbered under the write lock, as SQLite's rowids
** are), one transaction. */
int store__pg_deliver(store_t *st, int64_t *cursor, int limit, err_t *e) {
  struct pg_store *s = pg_of(st);
  if (store__pg_begin(s, PG_LOCK_ALL, e)) return e->code;
  int err = 0, n = 0, wrote = 0;
  int64_t at = *cursor;
  if (at < 0) {
    /* Start at the oldest event no engine has dispatched yet. */
    PGresult *q = wrun(s, "SELECT coalesce((SELECT min(n) FROM events WHERE dispatched = 0) - 1,"
                       " (SELECT max(n) FROM events), 0)", NULL, 0, "finding events to deliver",
                       e);
    if (!q) err = e->code;
    else at = store__pg_i64(q, 0, 0);
    PQclear(q);
  }
  struct store_val v[2] = {SV_INT(at), SV_INT(limit)};
  PGresult *r = err ? NULL : wrun(s, "SELECT n, id, name, data, ts, dispatched FROM events"
                                  " WHERE n > $1 ORDER BY n LIMIT $2", v, 2, "reading events", e);
  if (!err && !r) err = e->code;
  int64_t now = units_now_ms();
  for (int i = 0; r && i < PQntuples(r) && !err; i++) {
    at = store__pg_i64(r, i, 0);
    n++;
    if (store__pg_i64(r, i, 5)) continue; /* dispatched: delivered then */
    const char *id = PQgetvalue(r, i, 1), *name = PQgetvalue(r, i, 2);
    int64_t ts = store__pg_i64(r, i, 4);
    char *ej = store__event_json(id, name, PQgetisnull(r, i, 3) ? NULL : PQgetvalue(r, i, 3), ts);
    err = deliver_event(s, id, name, ej, ts, now, e);
    free(ej);
    wrote = 1;
  }
  PQclear(r);
  if (err) {
    store__pg_rollback(s);
    return err;
  }
  if (store__pg_commit_tx(s, wrote, e)) return e->code;
  *cursor = at;
  return n;
}

/* See store_pg_db.h: SKILL_ERROR records a load error; SKILL_REMOVE clears
** the live version. */
int store__pg_skill_change(struct pg_store *s, const struct skill_row *r, err_t *e) {
  struct store_val v[4] = {SV_TEXT(r->id), SV_TEXT(r->file), SV_TEXT(r->error),
                           SV_INT(r->updated_at)};
  if (r->op == SKILL_ERROR)
    return wdo(s, "INSERT INTO skills(id, file, error, updated_at) VALUES($1, $2, $3, $4)"
               " ON CONFLICT(id) DO UPDATE SET error = $3, updated_at = $4", v, 4, NULL,
               "changing a skill's record", e);
  struct store_val u[2] = {SV_TEXT(r->id), SV_INT(r->updated_at)};
  if (wdo(s, "UPDATE skills SET version = NULL, error = NULL, updated_at = $2 WHERE id = $1", u,
          2, NULL, "changing a skill's record", e))
    return e->code;
  /* A skill that never had a version (only a load error) leaves no record. */
  return wdo(s, "DELETE FROM skills WHERE id = $1 AND version IS NULL AND error IS NULL"
             " AND NOT EXISTS (SELECT 1 FROM versions WHERE skill = $1)", v, 1, NULL,
             "forgetting a skill", e);
}

/* ---- retention (store_prune.c's) ---- */

#define PRUNE_BATCH 2000

/* One batch: the number of runs deleted, or a negative code. The batch's
** ids go to the deletes as one array. */
static int prune_batch(struct pg_store *s, int64_t before, err_t *e) {
  static const char *const del[] = {
    "DELETE FROM steps WHERE run_id = ANY($1::text[])",
    "DELETE FROM attempts WHERE run_id = ANY($1::text[])",
    "DELETE FROM logs WHERE run_id = ANY($1::text[])",
    "DELETE FROM deliveries WHERE run_id = ANY($1::text[])",
    "DELETE FROM waits WHERE run_id = ANY($1::text[])",
    "DELETE FROM flow_batch WHERE run_id = ANY($1::text[])",
    "DELETE FROM runs WHERE id = ANY($1::text[])",
  };
  if (store__pg_begin(s, PG_LOCK_ALL, e)) return e->code;
  struct store_val v[2] = {SV_INT(before), SV_INT(PRUNE_BATCH)};
  PGresult *r = wrun(s, "SELECT array_agg(id), count(*) FROM (SELECT id FROM runs WHERE status IN"
                     " (" VOCAB_RUN_ENDED_SQL ") AND ended_at < $1 LIMIT $2) x", v, 2,
                     "choosing runs to prune", e);
  if (!r) {
    store__pg_rollback(s);
    return e->code;
  }
  int n = (int)store__pg_i64(r, 0, 1);
  int rc = 0;
  struct store_val ids[1] = {SV_TEXT(n ? PQgetvalue(r, 0, 0) : NULL)};
  /* The runs leave the figures' rollup in the transaction that deletes them. */
  static const struct store_wq each = {NULL, "SELECT unnest($1::text[])"};
  if (n) rc = store__rollup_forget((store_t *)(void *)s, &each, ids, 1, e);
  for (size_t i = 0; !rc && n && i < sizeof del / sizeof *del; i++)
    rc = wdo(s, del[i], ids, 1, NULL, "pruning history", e);
  PQclear(r);
  if (rc) {
    store__pg_rollback(s);
    return rc;
  }
  if (store__pg_commit_tx(s, 0, e)) return e->code;
  return n;
}

/* See store.h: runs batch by batch, then the dispatched events. */
int store__pg_prune(store_t *st, int64_t before, int64_t *runs, int64_t *events, err_t *e) {
  struct pg_store *s = pg_of(st);
  *runs = *events = 0;
  int n;
  while ((n = prune_batch(s, before, e)) > 0) *runs += n;
  if (n < 0) return n;
  if (store__pg_begin(s, PG_LOCK_ALL, e)) return e->code;
  struct store_val v[1] = {SV_INT(before)};
  if (wdo(s, "DELETE FROM events WHERE dispatched = 1 AND ts < $1", v, 1, events,
          "pruning events", e)) {
    store__pg_rollback(s);
    return e->code;
  }
  return store__pg_commit_tx(s, 0, e);
}
