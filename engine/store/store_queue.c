/*
** store_queue.c: flow control in the store (J_SLOT; see
** docs/architecture.md, "Flow control"): admission (idempotency,
** debounce, rate limit, singleton, throttle), then concurrency slots and
** the queues of runs waiting for them.
**
** A run of a skill with limits executes only while it holds a slot of
** every limit: `slots` (queue, key, run_id) rows. A queue is a skill's id
** (its own limits) or "@" and a scope's name (a limit shared by every
** skill naming it); a key is "path=value" of the limit's key ("" when it
** has none), so two limits of one skill never share a count. A run that
** cannot have all of them takes a place in every queue instead
** (`slot_queue`, with the limit it was asked under), ordered by
** (priority descending, since, run_id): the skill's priority(event), then
** its creation time, so a run that gave its slots back while parked is
** ahead of runs created after it. A run's priority is kept in runs.prio
** from its first acquire, and read back by any engine that takes the run
** up, so priority(event) is called once per run.
**
** Invariants, each kept inside one write transaction:
**  - a run holds the slots of all its limits or of none;
**  - a limit (queue, key) is granted only while count(slots) < limit;
**  - room never lasts while a queued run could use it: room appears only
**    when a slot is deleted, and every deletion goes through
**    store__slots_free, which hands it at once to the queue's runs in
**    order (passing over those another limit blocks). So queued runs go
**    first, in order, a run never waits while its limits have room, no
**    engine asks again on a timer, and a run blocked by one limit never
**    holds up the runs behind it in another (room found by a new run's
**    acquire is room no queued run can use).
**
** A run granted its slots by another run's release becomes "running" in
** the same transaction. When it has the releasing run's owner, that
** engine takes it up from the release's result (it resumes at once);
** otherwise (another engine, or none) it is marked slot_granted, its
** owner finds it through store_poll and acknowledges it with an acquire
** (answered "1", which clears the mark).
** A queued run's reason is kept in runs.queued (JSON) while it waits.
**
** Before its slots, a run is admitted, once (runs.flow_at keeps when it
** may start): idempotency, debounce and singleton through the key's
** holder in flow_once; rate limit and throttle through a GCRA row per
** key in flow_gcra (no queue is kept for them: a throttled run is given
** its start time and the core wakes it then). An acquire's result says
** what came of it: "1" (slots held), NULL (queued for slots), "wait:MS"
** (admitted, to start at MS) or "skip:MESSAGE" (the run is to end,
** skipped, with that message; counted in flow_skips).
**
** Both backends run this file: each statement is written in both dialects
** (struct store_wq: SQLite's, then PostgreSQL's) and run on the writer
** through the backend table, inside the journal group's transaction. On
** PostgreSQL, the transaction of a J_SLOT entry holds the whole write
** lock (store_pg.c's group_mode), and so does a group that ends a run
** holding slots or queue places (pg_commit looks before it writes): no
** two engines ever count one (queue, key) at once, as SQLite's one
** writer ensures.
*/
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/units.h"
#include "base/vocab.h"
#include "store/store_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A statement in both dialects. */
#define WQ(name, lite, pg) static const struct store_wq name = {lite, pg}

WQ(HELD_SQL, "SELECT 1 FROM slots WHERE run_id = ?1 LIMIT 1",
   "SELECT 1 FROM slots WHERE run_id = $1 LIMIT 1");
WQ(ACK_SQL, "UPDATE runs SET slot_granted = 0 WHERE id = ?1 AND slot_granted = 1",
   "UPDATE runs SET slot_granted = 0 WHERE id = $1 AND slot_granted = 1");
WQ(INUSE_SQL, "SELECT count(*) FROM slots WHERE skill = ?1 AND key = ?2",
   "SELECT count(*) FROM slots WHERE skill = $1 AND key = $2");
WQ(TAKE_SQL, "INSERT OR IGNORE INTO slots(skill, key, run_id, since) VALUES(?1,?2,?3,?4)",
   "INSERT INTO slots(skill, key, run_id, since) VALUES($1,$2,$3,$4) ON CONFLICT DO NOTHING");
WQ(PLACE_SQL,
   "INSERT OR IGNORE INTO slot_queue(skill, key, run_id, since, lim, prio) VALUES(?1,?2,?3,?4,?5,?6)",
   "INSERT INTO slot_queue(skill, key, run_id, since, lim, prio) VALUES($1,$2,$3,$4,$5,$6)"
   " ON CONFLICT DO NOTHING");
WQ(LEAVE_SQL, "DELETE FROM slot_queue WHERE run_id = ?1", "DELETE FROM slot_queue WHERE run_id = $1");
WQ(DROP_SQL, "DELETE FROM slots WHERE run_id = ?1", "DELETE FROM slots WHERE run_id = $1");
/* ?3: granted by a release; ?4: the releasing run's owner, who takes its
** own runs' grants up from the release's result (no mark needed). */
WQ(STARTED_SQL,
   "UPDATE runs SET status = CASE WHEN status = 'queued' THEN 'running' ELSE status END,"
   " started_at = COALESCE(started_at, ?2), queued = NULL,"
   " slot_granted = ?3 AND owner IS NOT ?4 WHERE id = ?1 RETURNING owner IS ?4",
   "UPDATE runs SET status = CASE WHEN status = 'queued' THEN 'running' ELSE status END,"
   " started_at = COALESCE(started_at, $2), queued = NULL,"
   " slot_granted = CASE WHEN $3::int <> 0 AND owner IS DISTINCT FROM $4::text THEN 1 ELSE 0 END"
   " WHERE id = $1 RETURNING (owner IS NOT DISTINCT FROM $4::text)::int");
WQ(OWNER_SQL, "SELECT owner FROM runs WHERE id = ?1", "SELECT owner FROM runs WHERE id = $1");
/* A run queued before its first step has not started: no started_at. */
WQ(QUEUED_SQL,
   "UPDATE runs SET status = 'queued', queued = ?2, slot_granted = 0, started_at = CASE WHEN EXISTS"
   " (SELECT 1 FROM steps WHERE run_id = ?1) THEN started_at END WHERE id = ?1"
   " AND status NOT IN (" VOCAB_RUN_ENDED_SQL ")",
   "UPDATE runs SET status = 'queued', queued = $2, slot_granted = 0, started_at = CASE WHEN EXISTS"
   " (SELECT 1 FROM steps WHERE run_id = $1) THEN started_at END WHERE id = $1"
   " AND status NOT IN (" VOCAB_RUN_ENDED_SQL ")");
WQ(PLACES_SQL, "SELECT skill, key, since, lim FROM slot_queue WHERE run_id = ?1",
   "SELECT skill, key, since, lim FROM slot_queue WHERE run_id = $1");
/* UNION ALL: the pairs are made distinct by store__slots_free (SQLite's
** UNION builds a temporary b-tree each time, and every run's end reads
** this). */
WQ(PAIRS_SQL,
   "SELECT skill, key FROM slots WHERE run_id = ?1"
   " UNION ALL SELECT skill, key FROM slot_queue WHERE run_id = ?1",
   "SELECT skill, key FROM slots WHERE run_id = $1"
   " UNION ALL SELECT skill, key FROM slot_queue WHERE run_id = $1");
WQ(HEAD_SQL,
   "SELECT run_id FROM slot_queue INDEXED BY slot_queue_order WHERE skill = ?1 AND key = ?2"
   " ORDER BY prio DESC, since, run_id LIMIT ?3 OFFSET ?4",
   "SELECT run_id FROM slot_queue WHERE skill = $1 AND key = $2"
   " ORDER BY prio DESC, since, run_id LIMIT $3 OFFSET $4");
WQ(FLOW_AT_SQL, "SELECT flow_at, started_at, queued FROM runs WHERE id = ?1",
   "SELECT flow_at, started_at, queued FROM runs WHERE id = $1");
/* A run's priority, kept from its first acquire (flowctl.c sends it back). */
WQ(PRIO_SQL, "UPDATE runs SET prio = ?2 WHERE id = ?1 AND prio IS NULL",
   "UPDATE runs SET prio = $2 WHERE id = $1 AND prio IS NULL");
WQ(SET_FLOW_AT_SQL, "UPDATE runs SET flow_at = ?2 WHERE id = ?1",
   "UPDATE runs SET flow_at = $2 WHERE id = $1");
WQ(TAT_SQL, "SELECT tat FROM flow_gcra WHERE q = ?1 AND key = ?2",
   "SELECT tat FROM flow_gcra WHERE q = $1 AND key = $2");
WQ(SET_TAT_SQL,
   "INSERT INTO flow_gcra(q, key, tat) VALUES(?1,?2,?3) ON CONFLICT(q, key) DO UPDATE SET tat = ?3",
   "INSERT INTO flow_gcra(q, key, tat) VALUES($1,$2,$3)"
   " ON CONFLICT(q, key) DO UPDATE SET tat = excluded.tat");
WQ(ONCE_SQL,
   "SELECT o.run_id, o.until, r.status FROM flow_once o LEFT JOIN runs r ON r.id = o.run_id"
   " WHERE o.q = ?1 AND o.key = ?2",
   "SELECT o.run_id, o.until, r.status FROM flow_once o LEFT JOIN runs r ON r.id = o.run_id"
   " WHERE o.q = $1 AND o.key = $2");
WQ(SET_ONCE_SQL,
   "INSERT INTO flow_once(q, key, run_id, until) VALUES(?1,?2,?3,?4)"
   " ON CONFLICT(q, key) DO UPDATE SET run_id = ?3, until = ?4",
   "INSERT INTO flow_once(q, key, run_id, until) VALUES($1,$2,$3,$4)"
   " ON CONFLICT(q, key) DO UPDATE SET run_id = excluded.run_id, until = excluded.until");
WQ(REPLACE_SQL,
   "UPDATE runs SET cancel_requested = 1, cancel_reason = ?2 WHERE id = ?1"
   " AND status NOT IN (" VOCAB_RUN_ENDED_SQL ") AND cancel_requested = 0",
   "UPDATE runs SET cancel_requested = 1, cancel_reason = $2 WHERE id = $1"
   " AND status NOT IN (" VOCAB_RUN_ENDED_SQL ") AND cancel_requested = 0");
/* A debounced run superseded: its owner asks again at once (store_poll's
** grants), and is told it is skipped. */
WQ(SUPERSEDE_SQL, "UPDATE runs SET slot_granted = 1 WHERE id = ?1 AND status = 'queued'",
   "UPDATE runs SET slot_granted = 1 WHERE id = $1 AND status = 'queued'");
/* The key's latest run, when its burst began, whether it still waits,
** and when it was made (the order of the events: see debounce). */
WQ(DEBOUNCE_SQL,
   "SELECT o.run_id, o.until, r.status = 'queued' AND r.started_at IS NULL, r.created_at"
   " FROM flow_once o LEFT JOIN runs r ON r.id = o.run_id WHERE o.q = ?1 AND o.key = ?2",
   "SELECT o.run_id, o.until, (r.status = 'queued' AND r.started_at IS NULL)::int, r.created_at"
   " FROM flow_once o LEFT JOIN runs r ON r.id = o.run_id WHERE o.q = $1 AND o.key = $2");
WQ(SKIPPED_SQL,
   "INSERT INTO flow_skips(skill, reason, n) VALUES(?1, ?2, 1)"
   " ON CONFLICT(skill, reason) DO UPDATE SET n = n + 1",
   "INSERT INTO flow_skips(skill, reason, n) VALUES($1, $2, 1)"
   " ON CONFLICT(skill, reason) DO UPDATE SET n = flow_skips.n + 1");
WQ(BATCH_OPEN_SQL,
   "SELECT o.run_id, o.until, (SELECT count(*) FROM flow_batch b WHERE b.run_id = o.run_id)"
   " FROM flow_once o JOIN runs r ON r.id = o.run_id WHERE o.q = ?1 AND o.key = ?2"
   " AND r.status = 'queued' AND r.started_at IS NULL",
   "SELECT o.run_id, o.until, (SELECT count(*) FROM flow_batch b WHERE b.run_id = o.run_id)"
   " FROM flow_once o JOIN runs r ON r.id = o.run_id WHERE o.q = $1 AND o.key = $2"
   " AND r.status = 'queued' AND r.started_at IS NULL");
/* The event as the run's trigger holds it, or its input as data (a run
** started otherwise). PostgreSQL's json keeps the text as written. */
WQ(BATCH_ADD_SQL,
   "INSERT OR IGNORE INTO flow_batch(run_id, seq, event) SELECT ?1, ?2,"
   " coalesce(json_extract(trigger, '$.event'), json_object('data', json(coalesce(input, 'null'))))"
   " FROM runs WHERE id = ?3",
   "INSERT INTO flow_batch(run_id, seq, event) SELECT $1::text, $2::int,"
   " coalesce((trigger::json -> 'event')::text,"
   "  json_build_object('data', coalesce(input, 'null')::json)::text)"
   " FROM runs WHERE id = $3 ON CONFLICT DO NOTHING");
WQ(BATCH_FULL_SQL, "UPDATE runs SET flow_at = ?2, slot_granted = 1 WHERE id = ?1",
   "UPDATE runs SET flow_at = $2, slot_granted = 1 WHERE id = $1");
/* The concurrency limits in force for run_id: its skill's live ones. */
WQ(CURLIM_SQL, "SELECT k.limits FROM runs r JOIN skills k ON k.id = r.skill WHERE r.id = ?1",
   "SELECT k.limits FROM runs r JOIN skills k ON k.id = r.skill WHERE r.id = $1");
/* The queues of q whose key starts with ?2 (?3 characters). */
WQ(QUEUES_SQL,
   "SELECT DISTINCT key FROM slot_queue WHERE skill = ?1 AND substr(key, 1, ?3) = ?2",
   "SELECT DISTINCT key FROM slot_queue WHERE skill = $1 AND substr(key, 1, $3::int) = $2");
WQ(BATCH_CLOSE_SQL, "DELETE FROM flow_once WHERE q = ?1 AND key = ?2",
   "DELETE FROM flow_once WHERE q = $1 AND key = $2");

/* One limit of a run: its kind ("concurrency", "throttle", "rate"), its
** queue, key and limit, and for the per-period kinds the period (ms) and
** the burst. */
struct lim {
  char *q, *key;
  const char *kind; /* also "idempotency", "singleton" (admission only) */
  int64_t since, limit, period, burst;
  int cancel;       /* singleton: a new run cancels the live one */
  int64_t max_wait; /* debounce: the longest a burst of events waits (ms; 0: no bound) */
  int64_t prio;     /* concurrency: the run's priority in the queue (higher first) */
};

/* Run statement q with v[0..nv) on the writer; *c a cursor over its rows
** (close it). */
static int wq_open(store_t *s, const struct store_wq *q, const struct store_val *v, int nv,
                   struct store_cur *c, const char *what, err_t *e) {
  return store__ops(s)->wq(s, q, v, nv, c, what, e);
}

/* Run statement q to its end (its rows, if any, unread). */
static int wq_do(store_t *s, const struct store_wq *q, const struct store_val *v, int nv,
                 const char *what, err_t *e) {
  struct store_cur c;
  if (wq_open(s, q, v, nv, &c, what, e)) return e->code;
  int rc;
  while ((rc = cur_next(&c)) == 1) {
  }
  if (rc < 0) c.ops->err(&c, e, what);
  cur_close(&c);
  return rc < 0 ? e->code : 0;
}

/* Open q and move to its first row: 1 (a row, c open), 0 (none, c
** closed), -1 (an error, e filled, c closed). */
static int wq_row(store_t *s, const struct store_wq *q, const struct store_val *v, int nv,
                  struct store_cur *c, const char *what, err_t *e) {
  if (wq_open(s, q, v, nv, c, what, e)) return -1;
  int rc = cur_next(c);
  if (rc == 1) return 1;
  if (rc < 0) c->ops->err(c, e, what);
  cur_close(c);
  return rc < 0 ? -1 : 0;
}

/* Column i of c as a malloc'd string, or NULL. */
static char *col_dup(const struct store_cur *c, int i) {
  const char *t = cur_text(c, i);
  return t ? mem_strdup(t) : NULL;
}

/* Whether key (a limit's "[tag:]path=value", or the tag, or "") is one
** of skill_row.limits' entry x: the same queue, and the same key or, when
** x's ends with '=', a value of its path. */
static int limit_is(const cJSON *x, const char *q, const char *key) {
  const char *xq = cJSON_GetStringValue(cJSON_GetObjectItem(x, "q"));
  const char *xk = cJSON_GetStringValue(cJSON_GetObjectItem(x, "key"));
  if (!xq || !xk || strcmp(xq, q)) return 0;
  size_t n = strlen(xk);
  return n && xk[n - 1] == '=' ? !strncmp(key, xk, n) : !strcmp(key, xk);
}

/* Set the limits of l[0..n) that are concurrency limits to the ones in
** force for run_id: those its skill's live version gives (skills.limits,
** written by each PUT), so a limit lowered or raised governs the runs
** already queued, and those of older versions that ask again. A limit
** the live version no longer has (or a skill registered before migration
** 14) keeps the number it was asked under. */
static int current_limits(store_t *s, const char *run_id, struct lim *l, int n, err_t *e) {
  struct store_val id[1] = {SV_TEXT(run_id)};
  struct store_cur c;
  int rc = wq_row(s, &CURLIM_SQL, id, 1, &c, "reading a skill's limits", e);
  if (rc <= 0) return rc < 0 ? e->code : 0;
  cJSON *cur = cur_text(&c, 0) ? cJSON_Parse(cur_text(&c, 0)) : NULL;
  cur_close(&c);
  for (int i = 0; i < n; i++) {
    if (l[i].kind && strcmp(l[i].kind, "concurrency")) continue;
    const cJSON *x;
    cJSON_ArrayForEach(x, cur)
      if (limit_is(x, l[i].q, l[i].key)) l[i].limit = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(x, "limit"));
  }
  cJSON_Delete(cur);
  return 0;
}

/* Whether limit l has room (1), not (0), or -1 on error. No queue is
** consulted: room never lasts while a queued run could take it (every
** deletion hands it on at once), so room found here is free for anyone. */
static int has_room(store_t *s, const struct lim *l, err_t *e) {
  struct store_val v[2] = {SV_TEXT(l->q), SV_TEXT(l->key)};
  struct store_cur c;
  int r = wq_row(s, &INUSE_SQL, v, 2, &c, "counting slots", e);
  if (r <= 0) return r < 0 ? -1 : 1;
  int64_t inuse = cur_i64(&c, 0);
  cur_close(&c);
  return inuse < l->limit;
}

/* Run statement q with $1 = run_id (and $2 = b when given). */
static int exec_run(store_t *s, const struct store_wq *q, const char *run_id, const char *b,
                    const char *what, err_t *e) {
  struct store_val v[2] = {SV_TEXT(run_id), SV_TEXT(b)};
  return wq_do(s, q, v, b ? 2 : 1, what, e);
}

/* Give run_id the slots of its n limits, leave its queues, and mark it
** started (granted: by another run's release, for its owner to notice). */
static int take(store_t *s, const char *run_id, const struct lim *l, int n, int granted,
                const char *owner, int *mine, err_t *e) {
  int64_t now = units_now_ms();
  for (int i = 0; i < n; i++) {
    struct store_val v[4] = {SV_TEXT(l[i].q), SV_TEXT(l[i].key), SV_TEXT(run_id), SV_INT(now)};
    if (wq_do(s, &TAKE_SQL, v, 4, "taking a slot", e)) return e->code;
  }
  if (exec_run(s, &LEAVE_SQL, run_id, NULL, "leaving a slot queue", e)) return e->code;
  struct store_val v[4] = {SV_TEXT(run_id), SV_INT(now), SV_INT(granted), SV_TEXT(owner)};
  struct store_cur c;
  int r = wq_row(s, &STARTED_SQL, v, 4, &c, "starting a queued run", e);
  if (r < 0) return e->code;
  if (mine) *mine = r == 1 && cur_i64(&c, 0);
  if (r == 1) cur_close(&c);
  return 0;
}

/* Why a run waits on limit l (in use: inuse), as runs.queued's JSON. */
static char *reason_json(const struct lim *l) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "reason", "concurrency");
  if (l->q[0] == '@') cJSON_AddStringToObject(o, "scope", l->q + 1);
  else cJSON_AddStringToObject(o, "skill", l->q);
  if (l->key[0]) cJSON_AddStringToObject(o, "key", l->key);
  cJSON_AddNumberToObject(o, "limit", (double)l->limit);
  char *js = jsontext_print_text(o);
  cJSON_Delete(o);
  return js;
}

static void lims_free(struct lim *l, int n) {
  for (int i = 0; i < n; i++) free(l[i].q), free(l[i].key);
  free(l);
}

/* The theoretical arrival time (us) of limit l's GCRA row, or 0 (none). */
static int64_t tat_of(store_t *s, const struct lim *l, char *q, err_t *e) {
  snprintf(q, 300, "%s:%s", l->kind, l->q);
  struct store_val v[2] = {SV_TEXT(q), SV_TEXT(l->key)};
  struct store_cur c;
  int r = wq_row(s, &TAT_SQL, v, 2, &c, "reading a throttle", e);
  if (r <= 0) return r;
  int64_t tat = cur_i64(&c, 0);
  cur_close(&c);
  return tat;
}

/* Write limit l's GCRA row (q from tat_of). */
static int set_tat(store_t *s, const struct lim *l, const char *q, int64_t tat, err_t *e) {
  struct store_val v[3] = {SV_TEXT(q), SV_TEXT(l->key), SV_INT(tat)};
  return wq_do(s, &SET_TAT_SQL, v, 3, "keeping a throttle", e);
}

/* "1 per 1h" for limit l, in out. */
static void per_text(const struct lim *l, char *out, size_t n) {
  char d[32];
  units_fmt_duration(l->period, d, sizeof d);
  snprintf(out, n, "%lld run%s per %s%s%s", (long long)l->limit, l->limit == 1 ? "" : "s", d,
           l->key[0] ? ", key " : "", l->key);
}

/* Write (q, key)'s holder in flow_once: run_id, until. */
static int set_once(store_t *s, const char *q, const char *key, const char *run_id, int64_t until,
                    const char *what, err_t *e) {
  struct store_val v[4] = {SV_TEXT(q), SV_TEXT(key), SV_TEXT(run_id), SV_INT(until)};
  return wq_do(s, &SET_ONCE_SQL, v, 4, what, e);
}

/* Idempotency (idem) or singleton limit l for the run of je: 1 when it
** may go on; 0 when it is skipped (the result says why); -1 on error. A
** singleton in cancel mode flags the live run for cancellation (its owner
** ends it; the new run then waits for the key's one slot). */
static int once_check(store_t *s, const struct jentry *je, const struct lim *l, int idem,
                      int64_t now, err_t *e) {
  char q[300], msg[800];
  snprintf(q, sizeof q, "%s:%s", l->kind, l->q);
  struct store_val v[2] = {SV_TEXT(q), SV_TEXT(l->key)};
  struct store_cur c;
  int rc = wq_row(s, &ONCE_SQL, v, 2, &c, "reading a run key", e);
  if (rc < 0) return -1;
  char *holder = rc == 1 ? col_dup(&c, 0) : NULL;
  int64_t until = rc == 1 ? cur_i64(&c, 1) : 0;
  int live = rc == 1 && cur_text(&c, 2) && !store__is_terminal(cur_text(&c, 2));
  if (rc == 1) cur_close(&c);
  int r = 1;
  const char *key = l->key[0] ? l->key : "(none)";
  if (holder && strcmp(holder, je->u.slot.run_id)) {
    if (idem && until > now) {
      char d[32];
      units_fmt_duration(l->period, d, sizeof d);
      snprintf(msg, sizeof msg, "skip:skipped by idempotency: run %s already started for key %s "
               "(within %s)", holder, key, d);
      r = 0;
    } else if (!idem && live && !l->cancel) {
      snprintf(msg, sizeof msg, "skip:skipped by singleton: run %s is running for key %s", holder, key);
      r = 0;
    } else if (!idem && live) {
      char why[400];
      snprintf(why, sizeof why, "replaced by run %s (singleton, key %s)", je->u.slot.run_id, key);
      if (exec_run(s, &REPLACE_SQL, holder, why, "cancelling a singleton's run", e)) r = -1;
    }
  }
  if (r == 0) journal_set_result(je, mem_strdup(msg));
  free(holder);
  return r;
}

/* Make run_id the run of l's key (until: idempotency's period's end). */
static int once_set(store_t *s, const struct lim *l, const char *run_id, int64_t now, err_t *e) {
  char q[300];
  snprintf(q, sizeof q, "%s:%s", l->kind, l->q);
  return set_once(s, q, l->key, run_id, !strcmp(l->kind, "idempotency") ? now + l->period : 0,
                  "keeping a run key", e);
}

/* Debounce limit l for the run of je: the key's latest run. First asking
** (first): the run becomes the key's latest; a latest run still waiting
** is superseded (its owner is told to ask again at once, and asking
** again it is skipped), and the burst it began carries on; the run's start
** is period after now, but no later than max_wait after the burst began.
** *start gets it. Runs need not ask in the order of their events: a run
** whose engine died before it asked is taken over and asks later (up to
** a lease later) than a run made after it, so one that finds the key's
** latest made after it is skipped (a later event superseded it), never
** the latest, whether that waits or already started. Asking again: a run
** that is no longer the key's latest is skipped (0, the result says
** why). 1: go on; -1: error. */
static int debounce(store_t *s, const struct jentry *je, const struct lim *l, int first,
                    int64_t now, int64_t *start, err_t *e) {
  const char *self = je->u.slot.run_id;
  char q[300];
  snprintf(q, sizeof q, "debounce:%s", l->q);
  struct store_val v[2] = {SV_TEXT(q), SV_TEXT(l->key)};
  struct store_cur c;
  int rc = wq_row(s, &DEBOUNCE_SQL, v, 2, &c, "reading a debounce", e);
  if (rc < 0) return -1;
  char *latest = rc == 1 ? col_dup(&c, 0) : NULL;
  int64_t began = rc == 1 ? cur_i64(&c, 1) : 0;
  int waiting = rc == 1 && cur_i64(&c, 2);
  int newer = rc == 1 && !cur_null(&c, 3) && cur_i64(&c, 3) > je->u.slot.at;
  if (rc == 1) cur_close(&c);
  int r = 1;
  if (!first || newer) {
    if (latest && strcmp(latest, self)) {
      char msg[400];
      snprintf(msg, sizeof msg, "skip:debounced: a later event started run %s", latest);
      journal_set_result(je, mem_strdup(msg));
      r = 0;
    }
    free(latest);
    return r;
  }
  if (latest && strcmp(latest, self) && waiting) {
    if (exec_run(s, &SUPERSEDE_SQL, latest, NULL, "superseding a debounced run", e)) r = -1;
  } else {
    began = now; /* a new burst */
  }
  free(latest);
  if (r < 0) return r;
  *start = now + l->period;
  if (l->max_wait > 0 && began + l->max_wait < *start) *start = began + l->max_wait;
  if (*start < now) *start = now;
  return set_once(s, q, l->key, self, began, "keeping a debounce", e) ? -1 : 1;
}

/* Count a skip of a run of skill for reason (rate_limit, idempotency,
** singleton, debounce), for /metrics. */
static int count_skip(store_t *s, const char *skill, const char *reason, err_t *e) {
  struct store_val v[2] = {SV_TEXT(skill), SV_TEXT(reason)};
  return wq_do(s, &SKIPPED_SQL, v, 2, "counting a skip", e);
}

/* Batch limit l (limit: max events; period: timeout) for the run of je,
** asking first. A batch of the key still waiting takes the run's event
** and the run is skipped (0, the result names the batch's run); a batch
** that becomes full is closed and its run woken (its start time now,
** marked slot_granted so its owner asks at once). Else the run opens a
** batch of its own: *start is when it closes by timeout. 1: go on; -1:
** error. */
static int batch_join(store_t *s, const struct jentry *je, const struct lim *l, int64_t now,
                      int64_t *start, err_t *e) {
  const char *self = je->u.slot.run_id;
  char q[300];
  snprintf(q, sizeof q, "batch:%s", l->q);
  struct store_val v[2] = {SV_TEXT(q), SV_TEXT(l->key)};
  struct store_cur c;
  int rc = wq_row(s, &BATCH_OPEN_SQL, v, 2, &c, "reading a batch", e);
  if (rc < 0) return -1;
  char *open = rc == 1 ? col_dup(&c, 0) : NULL;
  int64_t n = rc == 1 ? cur_i64(&c, 2) : 0;
  if (rc == 1) cur_close(&c);
  const char *into = open && strcmp(open, self) && n < l->limit ? open : self;
  if (into == self) n = 0; /* a new batch */
  struct store_val a[3] = {SV_TEXT(into), SV_INT(n + 1), SV_TEXT(self)};
  int err = wq_do(s, &BATCH_ADD_SQL, a, 3, "adding to a batch", e);
  int full = n + 1 >= l->limit;
  if (!err && into != self && full) {
    struct store_val f[2] = {SV_TEXT(into), SV_INT(now)};
    err = wq_do(s, &BATCH_FULL_SQL, f, 2, "closing a batch", e);
  }
  if (!err && full)
    err = wq_do(s, &BATCH_CLOSE_SQL, v, 2, "closing a batch", e);
  else if (!err && into == self)
    err = set_once(s, q, l->key, self, now + l->period, "opening a batch", e);
  if (err) {
    free(open);
    return -1;
  }
  if (into != self) {
    char msg[200];
    snprintf(msg, sizeof msg, "skip:batched into run %s", into);
    journal_set_result(je, mem_strdup(msg));
    free(open);
    return 0;
  }
  free(open);
  *start = full ? now : now + l->period;
  return 1;
}

/* The throttles of l (n limits) at the start of a run admitted to start
** at *at (ms; reserved: by this function, before), now: a second GCRA per
** key, on the starts themselves ("start:" rows in flow_gcra). The
** admission's reservations space the runs while an engine runs them; runs
** whose start times came while no engine was up would otherwise all start
** when the next one comes up. A run on time (less than one interval late)
** counts from its reserved time, so the steady state adds nothing; a late
** one counts from now, and when the starts' row says it is too soon, it
** reserves the next free start time (*at; the row counts it, and it starts
** then without asking the row again, unless late again). 1: the run
** starts now; 0: *at is its start time (flow_at to write, negative:
** reserved here); -1: error. */
static int throttle_start(store_t *s, const struct lim *l, int n, int64_t now, int64_t *at,
                          int reserved, err_t *e) {
  int64_t now_us = now * 1000, start = now_us, base[8];
  char q[8][300];
  int64_t tat[8], T[8];
  int nt = 0, ontime = 1;
  for (int i = 0; i < n && nt < 8; i++) {
    if (strcmp(l[i].kind, "throttle")) continue;
    struct lim t = l[i];
    t.kind = "start:throttle";
    T[nt] = t.period * 1000 / t.limit;
    tat[nt] = tat_of(s, &t, q[nt], e);
    if (tat[nt] < 0) return -1;
    ontime &= now_us - *at * 1000 < T[nt];
    nt++;
  }
  if (reserved && ontime) return 1;
  for (int i = 0, k = 0; i < n && k < nt; i++) {
    if (strcmp(l[i].kind, "throttle")) continue;
    base[k] = !reserved && now_us - *at * 1000 < T[k] ? *at * 1000 : now_us;
    if (tat[k] > base[k]) base[k] = tat[k];
    int64_t first = base[k] - l[i].burst * T[k];
    if (first > start) start = first;
    k++;
  }
  for (int i = 0, k = 0; i < n && k < nt; i++) {
    if (strcmp(l[i].kind, "throttle")) continue;
    struct lim t = l[i];
    t.kind = "start:throttle";
    if (set_tat(s, &t, q[k], base[k] + T[k], e)) return -1;
    k++;
  }
  if (start <= now_us) return 1;
  *at = (start + 999) / 1000;
  return 0;
}

/* Judge the run of je, admitted at *at (ms), by its rate limits and
** singletons, then reserve its throttles' start times: the limits that
** count runs (not events), so they see a batch's run or a debounced
** burst's last run once, when its start time came, and never the runs
** that joined a batch or were debounced into a later one. Rate limits
** and singletons are checked before anything is written, so a run they
** skip changes no count. *at moves to the throttles' earliest start. 1:
** the run goes on; 0: it is skipped (the result says why); -1: error. */
static int judge(store_t *s, const struct jentry *je, struct lim *l, int n, int64_t now, int64_t *at,
                 err_t *e) {
  int64_t now_us = now * 1000;
  char q[300];
  /* Rate limits: at most limit per period, GCRA with a tolerance of
  ** limit - 1 intervals; refused changes nothing. */
  for (int i = 0; i < n; i++) {
    if (strcmp(l[i].kind, "rate")) continue;
    int64_t T = l[i].period * 1000 / l[i].limit, tau = l[i].period * 1000 - T;
    int64_t tat = tat_of(s, &l[i], q, e);
    if (tat < 0) return -1;
    if (tat - tau > now_us) {
      char why[400], msg[600];
      per_text(&l[i], why, sizeof why);
      snprintf(msg, sizeof msg, "skip:skipped by rate_limit: at most %s", why);
      journal_set_result(je, mem_strdup(msg));
      return 0;
    }
  }
  for (int i = 0; i < n; i++) {
    if (strcmp(l[i].kind, "singleton")) continue;
    int r = once_check(s, je, &l[i], 0, now, e);
    if (r <= 0) return r;
  }
  for (int i = 0; i < n; i++) {
    if (!strcmp(l[i].kind, "singleton")) {
      if (once_set(s, &l[i], je->u.slot.run_id, now, e)) return -1;
      continue;
    }
    if (strcmp(l[i].kind, "rate") && strcmp(l[i].kind, "throttle")) continue;
    int64_t T = l[i].period * 1000 / l[i].limit;
    int64_t tat = tat_of(s, &l[i], q, e);
    if (tat < 0) return -1;
    if (tat < now_us) tat = now_us;
    if (!strcmp(l[i].kind, "throttle")) {
      /* The earliest start the throttle allows: burst starts may run
      ** ahead of the steady rate. */
      int64_t start = tat - l[i].burst * T;
      if (start < now_us) start = now_us;
      if ((start + 999) / 1000 > *at) *at = (start + 999) / 1000;
    }
    if (set_tat(s, &l[i], q, tat + T, e)) return -1;
  }
  return 1;
}

/* The kind of l's limit that defers a run's start ("batch" or
** "debounce": the skill has one at most), or NULL. */
static const char *deferral(const struct lim *l, int n) {
  for (int i = 0; i < n; i++)
    if (!strcmp(l[i].kind, "batch") || !strcmp(l[i].kind, "debounce")) return l[i].kind;
  return NULL;
}

/* Whether a run's runs.queued (JSON text, or NULL) says it waits for its
** batch or its debounce: admitted, but not judged yet (see admit). */
static int deferred_reason(const char *queued) {
  cJSON *o = queued ? cJSON_Parse(queued) : NULL;
  const char *r = cJSON_GetStringValue(cJSON_GetObjectItem(o, "reason"));
  int yes = r && (!strcmp(r, "batch") || !strcmp(r, "debounce"));
  cJSON_Delete(o);
  return yes;
}

/* Admit the run of je to start: once per run (runs.flow_at keeps when),
** in the documented order (docs/skills.md, "Flow control"): idempotency
** (a repeat is skipped), batch (an event joins an open batch, its run
** skipped), debounce (a newer event supersedes the waiting run); then
** judge(): rate limits and singletons (refused: the result is "skip:" and
** why) and throttles (a start time reserved, in order: GCRA, whose row
** keeps the next free time, so no queue is read or kept). A run that its
** batch or debounce defers is judged when its start time came and it
** asks again, not before: until then it is queued with that reason
** (runs.queued), which is how it is known to be still unjudged. A start
** time still to come queues the run: the result is "wait:" and that time
** (ms). Returns 1 when the run may go on to its slots, 0 when the result
** says why not, -1 on error. */
static int admit(store_t *s, const struct jentry *je, struct lim *l, int n, err_t *e) {
  const struct slot_row *sl = &je->u.slot;
  int per = 0;
  for (int i = 0; i < n; i++) per += strcmp(l[i].kind, "concurrency") != 0;
  if (!per) return 1;
  struct store_val id[1] = {SV_TEXT(sl->run_id)};
  struct store_cur c;
  int rc = wq_row(s, &FLOW_AT_SQL, id, 1, &c, "reading a run", e);
  if (rc < 0) return -1;
  int have = rc == 1 && !cur_null(&c, 0);
  int64_t at = have ? cur_i64(&c, 0) : 0;
  /* Negative: a start time reserved by throttle_start; 0: its start
  ** counted by throttle_start (see below). */
  int reserved = at < 0;
  if (reserved) at = -at;
  int started = rc == 1 && !cur_null(&c, 1);
  /* Waiting for its batch or debounce: not judged yet. */
  int deferred = have && deferral(l, n) && deferred_reason(rc == 1 ? cur_text(&c, 2) : NULL);
  if (rc == 1) cur_close(&c);
  int64_t now = units_now_ms();
  if (!have) {
    /* Idempotency: a repeat of the key is skipped before anything else. */
    for (int i = 0; i < n; i++) {
      if (strcmp(l[i].kind, "idempotency")) continue;
      int r = once_check(s, je, &l[i], 1, now, e);
      if (r <= 0) return r;
    }
    at = now;
    for (int i = 0; i < n; i++) {
      if (strcmp(l[i].kind, "batch")) continue;
      int64_t start = now;
      int r = batch_join(s, je, &l[i], now, &start, e);
      if (r <= 0) return r;
      if (start > at) at = start;
    }
    for (int i = 0; i < n; i++) {
      if (strcmp(l[i].kind, "debounce")) continue;
      int64_t start = now;
      int r = debounce(s, je, &l[i], 1, now, &start, e);
      if (r <= 0) return r;
      if (start > at) at = start;
    }
    /* Deferred: judged when its start time comes. */
    deferred = at > now;
    if (!deferred) {
      int r = judge(s, je, l, n, now, &at, e);
      if (r <= 0) return r;
    }
    for (int i = 0; i < n; i++)
      if (!strcmp(l[i].kind, "idempotency") && once_set(s, &l[i], sl->run_id, now, e)) return -1;
    struct store_val f[2] = {SV_TEXT(sl->run_id), SV_INT(at)};
    if (wq_do(s, &SET_FLOW_AT_SQL, f, 2, "admitting a run", e)) return -1;
  } else {
    for (int i = 0; i < n; i++) {
      /* A debounced run asking again: is it still the key's latest? */
      int64_t unused = 0;
      if (!strcmp(l[i].kind, "debounce") && debounce(s, je, &l[i], 0, now, &unused, e) <= 0)
        return je->result ? 0 : -1;
    }
    if (deferred && at <= now) {
      /* Its batch closed, or its debounce's period passed: judged now. */
      at = now;
      int r = judge(s, je, l, n, now, &at, e);
      if (r <= 0) return r;
      deferred = 0;
      struct store_val f[2] = {SV_TEXT(sl->run_id), SV_INT(at)};
      if (wq_do(s, &SET_FLOW_AT_SQL, f, 2, "admitting a run", e)) return -1;
    }
  }
  /* 0: its start was counted already (it waits for its slots only). */
  int counted = have && at == 0;
  if (at <= now && (!have || !started) && !counted) {
    /* About to start: the throttle's spacing holds for the starts too. */
    int r = throttle_start(s, l, n, now, &at, reserved, e);
    if (r < 0) return -1;
    int throttled = 0;
    for (int i = 0; i < n; i++) throttled |= !strcmp(l[i].kind, "throttle");
    if (!r || throttled) {
      /* Reserved for later (negative), or counted now (0): a run that
      ** asks again (taken over, or its engine restarted, while it waits
      ** for a concurrency slot) must not be counted a second time. */
      struct store_val f[2] = {SV_TEXT(sl->run_id), SV_INT(r ? 0 : -at)};
      if (wq_do(s, &SET_FLOW_AT_SQL, f, 2, "admitting a run", e)) return -1;
    }
  }
  if (at <= now) return 1;
  /* Its start time has not come: queued, with the words of what it waits
  ** for: its batch or debounce (not judged yet), or its throttle. */
  const char *why_kind = deferred ? deferral(l, n) : "throttle";
  int deb = deferred;
  for (int i = 0; i < n; i++) {
    if (strcmp(l[i].kind, why_kind)) continue;
    char until[40], d[32];
    units_rfc3339(at, until, sizeof until);
    units_fmt_duration(l[i].period, d, sizeof d);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "reason", l[i].kind);
    cJSON_AddStringToObject(o, "skill", l[i].q);
    if (l[i].key[0]) cJSON_AddStringToObject(o, "key", l[i].key);
    if (!deb) cJSON_AddNumberToObject(o, "limit", (double)l[i].limit);
    cJSON_AddStringToObject(o, "period", d);
    cJSON_AddStringToObject(o, "until", until);
    char *why = jsontext_print_text(o);
    cJSON_Delete(o);
    int err = exec_run(s, &QUEUED_SQL, sl->run_id, why, "queueing a run", e);
    free(why);
    if (err) return -1;
    break;
  }
  char res[40];
  snprintf(res, sizeof res, "wait:%lld", (long long)at);
  journal_set_result(je, mem_strdup(res));
  return 0;
}

/* Acquire: see journal.h. */
static int acquire(store_t *s, const struct jentry *je, err_t *e) {
  const struct slot_row *sl = &je->u.slot;
  struct store_val id[1] = {SV_TEXT(sl->run_id)};
  struct store_cur c;
  int rc = wq_row(s, &HELD_SQL, id, 1, &c, "finding slots", e);
  if (rc < 0) return e->code;
  if (rc == 1) {
    cur_close(&c);
    /* Held already: granted by a release, or kept across a takeover. */
    if (exec_run(s, &ACK_SQL, sl->run_id, NULL, "taking up a slot", e)) return e->code;
    journal_set_result(je, mem_strdup("1"));
    return 0;
  }
  cJSON *list = cJSON_Parse(sl->limits ? sl->limits : "[]");
  int n = cJSON_GetArraySize(list), blocked = -1, err = 0, has_prio = 0;
  int64_t prio = 0;
  struct lim *l = mem_calloc((size_t)(n ? n : 1), sizeof *l);
  for (int i = 0; i < n; i++) {
    const cJSON *x = cJSON_GetArrayItem(list, i);
    const char *q = cJSON_GetStringValue(cJSON_GetObjectItem(x, "q"));
    const char *k = cJSON_GetStringValue(cJSON_GetObjectItem(x, "key"));
    l[i].q = mem_strdup(q ? q : "");
    l[i].key = mem_strdup(k ? k : "");
    l[i].since = sl->at;
    l[i].limit = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(x, "limit"));
    const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(x, "kind"));
    static const char *const kinds[] = {"throttle", "rate", "idempotency", "singleton", "debounce",
                                        "batch"};
    const cJSON *pr = cJSON_GetObjectItem(x, "priority");
    l[i].prio = cJSON_IsNumber(pr) ? (int64_t)pr->valuedouble : 0;
    if (cJSON_IsNumber(pr)) has_prio = 1, prio = l[i].prio;
    const cJSON *mw = cJSON_GetObjectItem(x, "max_wait");
    l[i].max_wait = cJSON_IsNumber(mw) ? (int64_t)mw->valuedouble : 0;
    l[i].kind = "concurrency";
    for (size_t k = 0; kind && k < sizeof kinds / sizeof kinds[0]; k++)
      if (!strcmp(kind, kinds[k])) l[i].kind = kinds[k];
    const char *mode = cJSON_GetStringValue(cJSON_GetObjectItem(x, "mode"));
    l[i].cancel = mode && !strcmp(mode, "cancel");
    l[i].period = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(x, "period"));
    l[i].burst = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(x, "burst"));
  }
  cJSON_Delete(list);
  /* Its priority (each concurrency limit carries the same), recorded the
  ** first time: whatever engine asks for the run later sends it back. */
  if (has_prio) {
    struct store_val p[2] = {SV_TEXT(sl->run_id), SV_INT(prio)};
    err = wq_do(s, &PRIO_SQL, p, 2, "recording a run's priority", e);
  }
  /* Admission first (rate limit, throttle), once per run; then the slots,
  ** of the concurrency limits only (moved to the front of l). */
  int admitted = err ? -1 : admit(s, je, l, n, e);
  if (admitted < 0) err = e->code;
  if (!admitted && je->result && !strncmp(je->result, "skip:", 5) && n) {
    /* "skip:skipped by rate_limit: ..." or "skip:debounced: ...": the word. */
    const char *w = je->result + 5;
    const char *reason = !strncmp(w, "debounced", 9) ? "debounce" : !strncmp(w, "batched", 7) ? "batch"
                       : !strncmp(w, "skipped by rate_limit", 21) ? "rate_limit"
                       : !strncmp(w, "skipped by idempotency", 22) ? "idempotency" : "singleton";
    const char *skill = l[0].q[0] == '@' ? "?" : l[0].q;
    if (count_skip(s, skill, reason, e)) err = e->code;
  }
  int nc = 0;
  for (int i = 0; i < n; i++)
    if (!strcmp(l[i].kind, "concurrency")) {
      struct lim t = l[nc];
      l[nc++] = l[i];
      l[i] = t;
    }
  if (!err && admitted > 0 && nc) err = current_limits(s, sl->run_id, l, nc, e);
  for (int i = 0; !err && admitted > 0 && i < nc && blocked < 0; i++) {
    int room = has_room(s, &l[i], e);
    if (room < 0) err = e->code;
    if (room <= 0) blocked = i;
  }
  if (err || admitted <= 0) {
    /* an error, or not admitted (yet): the result says what */
  } else if (blocked < 0) {
    err = take(s, sl->run_id, l, nc, 0, NULL, NULL, e);
    if (!err) journal_set_result(je, mem_strdup("1"));
  } else {
    for (int i = 0; i < nc && !err; i++) {
      struct store_val p[6] = {SV_TEXT(l[i].q), SV_TEXT(l[i].key), SV_TEXT(sl->run_id),
                               SV_INT(l[i].since), SV_INT(l[i].limit), SV_INT(l[i].prio)};
      err = wq_do(s, &PLACE_SQL, p, 6, "queueing for a slot", e);
    }
    char *why = reason_json(&l[blocked]);
    if (!err) err = exec_run(s, &QUEUED_SQL, sl->run_id, why, "queueing a run", e);
    free(why);
  }
  lims_free(l, n);
  return err;
}

/* Try to grant run_id (queued) every limit it waits on. *blocked_here
** is set when the limit (q, key) is the one without room. */
static int try_grant(store_t *s, const char *run_id, const char *q, const char *key,
                     const char *owner, int *granted, int *blocked_here, err_t *e) {
  *granted = *blocked_here = 0;
  struct store_val id[1] = {SV_TEXT(run_id)};
  struct store_cur c;
  if (wq_open(s, &PLACES_SQL, id, 1, &c, "reading queue places", e)) return e->code;
  int n = 0, cap = 4, rc;
  struct lim *l = mem_calloc((size_t)cap, sizeof *l);
  while ((rc = cur_next(&c)) == 1) {
    if (n == cap) l = mem_realloc(l, (size_t)(cap *= 2) * sizeof *l);
    l[n].q = col_dup(&c, 0);
    l[n].key = col_dup(&c, 1);
    l[n].since = cur_i64(&c, 2);
    l[n].limit = cur_i64(&c, 3);
    l[n].kind = "concurrency";
    n++;
  }
  int err = rc == 0 ? 0 : c.ops->err(&c, e, "reading queue places");
  cur_close(&c);
  if (!err && n) err = current_limits(s, run_id, l, n, e);
  int ok = n > 0;
  for (int i = 0; i < n && ok && !err; i++) {
    int room = has_room(s, &l[i], e);
    if (room < 0) err = e->code;
    else if (!room) {
      ok = 0;
      *blocked_here = l[i].q && l[i].key && !strcmp(l[i].q, q) && !strcmp(l[i].key, key);
    }
  }
  if (!err && ok) {
    int mine = 0;
    err = take(s, run_id, l, n, 1, owner, &mine, e);
    if (!err) *granted = mine ? 2 : 1;
  }
  lims_free(l, n);
  return err;
}

/* Hand the room in (q, key) to the runs of its queue, in order: each
** whose every limit has room is granted, one blocked by another limit is
** passed over (it keeps its place), until one finds this limit full. At
** most HAND_MAX places are looked at per release, to bound the
** transaction; the rest wait for the next release. */
#define HAND_MAX 256
static int hand_on(store_t *s, const char *q, const char *key, const char *owner, cJSON *granted,
                   err_t *e) {
  int skip = 0; /* places passed over, still at the head */
  while (skip < HAND_MAX) {
    /* Read a batch first: the grants below change the table. */
    struct store_val v[4] = {SV_TEXT(q), SV_TEXT(key), SV_INT(16), SV_INT(skip)};
    struct store_cur c;
    if (wq_open(s, &HEAD_SQL, v, 4, &c, "reading a queue", e)) return e->code;
    char *ids[16];
    int n = 0, rc = 0;
    while (n < 16 && (rc = cur_next(&c)) == 1) ids[n++] = col_dup(&c, 0);
    int err = rc >= 0 ? 0 : c.ops->err(&c, e, "reading a queue");
    cur_close(&c);
    int stop = n < 16;
    for (int i = 0; i < n && !err; i++) {
      int got = 0, full = 0;
      err = try_grant(s, ids[i], q, key, owner, &got, &full, e);
      /* The releasing run's own engine takes its grants up from the result. */
      if (!err && got == 2 && granted) cJSON_AddItemToArray(granted, cJSON_CreateString(ids[i]));
      if (!err && !got) skip++;
      if (full) {
        stop = 1;
        break;
      }
    }
    for (int i = 0; i < n; i++) free(ids[i]);
    if (err) return err;
    if (stop) return 0;
  }
  return 0;
}

/* See store_backend.h. */
int store__slots_free(store_t *s, const char *run_id, cJSON *granted, err_t *e) {
  struct store_val id[1] = {SV_TEXT(run_id)};
  struct store_cur c;
  if (wq_open(s, &PAIRS_SQL, id, 1, &c, "reading slots", e)) return e->code;
  char *pairs[32][2];
  int n = 0, rc;
  while (n < 32 && (rc = cur_next(&c)) == 1) {
    const char *sk = cur_text(&c, 0), *k = cur_text(&c, 1);
    int seen = 0;
    for (int i = 0; i < n && !seen; i++)
      seen = !strcmp(pairs[i][0] ? pairs[i][0] : "", sk ? sk : "") &&
             !strcmp(pairs[i][1] ? pairs[i][1] : "", k ? k : "");
    if (seen) continue;
    pairs[n][0] = col_dup(&c, 0);
    pairs[n][1] = col_dup(&c, 1);
    n++;
  }
  int err = n == 32 || rc >= 0 ? 0 : c.ops->err(&c, e, "reading slots");
  cur_close(&c);
  char *owner = NULL;
  if (!err && n && granted) {
    /* Whose result it is: that owner needs no mark for its own runs. */
    int r = wq_row(s, &OWNER_SQL, id, 1, &c, "reading a run's owner", e);
    if (r < 0) err = e->code;
    if (r == 1) {
      owner = col_dup(&c, 0);
      cur_close(&c);
    }
  }
  /* Without a pair the run holds no slot and no queue place (PAIRS_SQL
  ** reads both tables): nothing to delete. Most runs end so (their skill
  ** has no limits), and every run's end comes here. */
  if (!err && n) err = exec_run(s, &DROP_SQL, run_id, NULL, "releasing a slot", e);
  if (!err && n) err = exec_run(s, &LEAVE_SQL, run_id, NULL, "leaving a slot queue", e);
  for (int i = 0; i < n && !err; i++) err = hand_on(s, pairs[i][0], pairs[i][1], owner, granted, e);
  free(owner);
  for (int i = 0; i < n; i++) free(pairs[i][0]), free(pairs[i][1]);
  return err;
}

/* See store_backend.h. */
int store__write_slot(store_t *s, const struct jentry *je, err_t *e) {
  if (je->u.slot.acquire) return acquire(s, je, e);
  cJSON *granted = cJSON_CreateArray();
  int err = store__slots_free(s, je->u.slot.run_id, granted, e);
  if (!err && cJSON_GetArraySize(granted) > 0) journal_set_result(je, jsontext_print_text(granted));
  cJSON_Delete(granted);
  return err;
}

/* See store_backend.h. Every queue of the PUT's limits is handed on:
** where a limit rose, its head runs start now (marked slot_granted for
** their owners, as another engine's release does); where it fell or
** stayed, the head finds it full at once. */
int store__limits_changed(store_t *s, const struct skill_row *k, err_t *e) {
  if (k->op != SKILL_PUT || !k->limits) return 0;
  cJSON *list = cJSON_Parse(k->limits);
  const cJSON *x;
  int err = 0;
  cJSON_ArrayForEach(x, list) {
    const char *q = cJSON_GetStringValue(cJSON_GetObjectItem(x, "q"));
    const char *key = cJSON_GetStringValue(cJSON_GetObjectItem(x, "key"));
    if (!q || !key || err) continue;
    struct store_val v[3] = {SV_TEXT(q), SV_TEXT(key), SV_INT((int64_t)strlen(key))};
    struct store_cur c;
    if (wq_open(s, &QUEUES_SQL, v, 3, &c, "reading a skill's queues", e)) {
      err = e->code;
      break;
    }
    int n = 0, cap = 8, rc;
    char **keys = mem_calloc((size_t)cap, sizeof *keys);
    while ((rc = cur_next(&c)) == 1) {
      if (n == cap) keys = mem_realloc(keys, (size_t)(cap *= 2) * sizeof *keys);
      keys[n++] = col_dup(&c, 0);
    }
    if (rc < 0) err = c.ops->err(&c, e, "reading a skill's queues");
    cur_close(&c);
    for (int i = 0; i < n; i++) {
      /* A key of another limit of q that merely begins alike is not one. */
      if (!err && keys[i] && limit_is(x, q, keys[i])) err = hand_on(s, q, keys[i], NULL, NULL, e);
      free(keys[i]);
    }
    free(keys);
  }
  cJSON_Delete(list);
  return err;
}

WQ(SCOPES_SQL,
   "SELECT id, scopes FROM skills WHERE id <> ?1 AND version IS NOT NULL AND scopes IS NOT NULL",
   "SELECT id, scopes FROM skills WHERE id <> $1 AND version IS NOT NULL AND scopes IS NOT NULL");

/* See store.h. */
int64_t store_scope_limit(const cJSON *limits, const char *scope, const char *key) {
  const cJSON *x;
  cJSON_ArrayForEach(x, limits) {
    const char *sc = cJSON_GetStringValue(cJSON_GetObjectItem(x, "scope"));
    const char *k = cJSON_GetStringValue(cJSON_GetObjectItem(x, "key"));
    if (sc && !strcmp(sc, scope) && (k ? key && !strcmp(k, key) : !key))
      return (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(x, "limit"));
  }
  return 0;
}

/* The start of a refused PUT's entry result; the message follows. */
#define SCOPE_REFUSED "conflict:"

/* See store.h. */
const char *store_skill_refusal(const struct jentry *je) {
  size_t n = sizeof SCOPE_REFUSED - 1;
  if (!je || je->kind != J_SKILL || !je->result || strncmp(je->result, SCOPE_REFUSED, n))
    return NULL;
  return je->result + n;
}

/* Whether id is in the JSON list ok (of ids). */
static int listed(const cJSON *ok, const char *id) {
  const cJSON *x;
  cJSON_ArrayForEach(x, ok)
    if (cJSON_IsString(x) && !strcmp(x->valuestring, id)) return 1;
  return 0;
}

/* See store_backend.h. The engine checked the registry before it journaled
** the PUT, but another engine (or a PUT through one) may have registered a
** clashing skill since: the store, whose write transactions are one at a
** time for this (PostgreSQL: the whole lock, store_pg.c's group_mode), is
** the judge. The skills registered earlier in the same transaction count. */
int store__scope_clash(store_t *s, const struct jentry *je, struct skill_row *refused, char *why,
                       size_t n, err_t *e) {
  const struct skill_row *k = &je->u.skill;
  if (!k->scopes) return 0;
  cJSON *mine = cJSON_Parse(k->scopes), *ok = k->scopes_ok ? cJSON_Parse(k->scopes_ok) : NULL;
  struct store_val v[1] = {SV_TEXT(k->id)};
  struct store_cur c;
  char msg[1200] = "";
  int rc = 0;
  if (wq_open(s, &SCOPES_SQL, v, 1, &c, "reading skills' scopes", e)) {
    cJSON_Delete(mine), cJSON_Delete(ok);
    return -1;
  }
  while (!msg[0] && (rc = cur_next(&c)) == 1) {
    const char *other = cur_text(&c, 0);
    cJSON *theirs = cJSON_Parse(cur_text(&c, 1) ? cur_text(&c, 1) : "[]");
    const cJSON *x;
    cJSON_ArrayForEach(x, mine) {
      const char *scope = cJSON_GetStringValue(cJSON_GetObjectItem(x, "scope"));
      const char *key = cJSON_GetStringValue(cJSON_GetObjectItem(x, "key"));
      int64_t want = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(x, "limit"));
      int64_t has = scope ? store_scope_limit(theirs, scope, key) : 0;
      if (!has || has == want || !other || listed(ok, other)) continue;
      snprintf(msg, sizeof msg, "%s: concurrency scope '%s'%s%s has limit %lld here, but skill "
               "'%s' gives it limit %lld in the registry (the database judges: a skill registered "
               "through another engine counts too): every "
               "skill naming a scope must give it the same limit", k->file ? k->file : k->id,
               scope, key ? ", key " : "", key ? key : "", (long long)want, other, (long long)has);
      break;
    }
    cJSON_Delete(theirs);
  }
  if (!msg[0] && rc < 0) c.ops->err(&c, e, "reading skills' scopes");
  cur_close(&c);
  cJSON_Delete(mine), cJSON_Delete(ok);
  if (!msg[0]) return rc < 0 ? -1 : 0;
  cJSON *ej = cJSON_CreateObject();
  char at[40];
  units_rfc3339(k->updated_at, at, sizeof at);
  cJSON_AddStringToObject(ej, "message", msg);
  if (k->file) cJSON_AddStringToObject(ej, "file", k->file);
  cJSON_AddNullToObject(ej, "line");
  cJSON_AddStringToObject(ej, "at", at);
  if (!cJSON_PrintPreallocated(ej, why, (int)n, 0)) snprintf(why, n, "{\"message\": \"scope clash\"}");
  cJSON_Delete(ej);
  *refused = *k;
  refused->op = SKILL_ERROR;
  refused->error = why;
  journal_set_result(je, mem_printf(SCOPE_REFUSED "%s", msg));
  return 1;
}

/* See store.h. */
int store_flow_counts(store_t *s, cJSON **out, err_t *e) {
  struct store_cur q = {0}, k = {0};
  if (store__rq(s, NULL, RQ_FLOW_QUEUED, NULL, 0, &q, e)) return e->code;
  cJSON *o = cJSON_CreateObject(), *qd = cJSON_AddObjectToObject(o, "queued");
  cJSON *sk = cJSON_AddArrayToObject(o, "skipped");
  while (cur_next(&q) == 1) cJSON_AddNumberToObject(qd, cur_text(&q, 0), (double)cur_i64(&q, 1));
  cur_close(&q);
  if (store__rq(s, NULL, RQ_FLOW_SKIPS, NULL, 0, &k, e)) {
    cJSON_Delete(o);
    return e->code;
  }
  while (cur_next(&k) == 1) {
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "skill", cur_text(&k, 0));
    cJSON_AddStringToObject(x, "reason", cur_text(&k, 1));
    cJSON_AddNumberToObject(x, "n", (double)cur_i64(&k, 2));
    cJSON_AddItemToArray(sk, x);
  }
  cur_close(&k);
  *out = o;
  return 0;
}

/* See store.h. */
int store_batch_events(store_t *s, const char *run_id, char **out, err_t *e) {
  *out = NULL;
  struct store_val v[1] = {SV_TEXT(run_id)};
  struct store_cur c = {0};
  if (store__rq(s, NULL, RQ_BATCH_EVENTS, v, 1, &c, e)) return e->code;
  if (cur_next(&c) == 1 && cur_i64(&c, 1) > 0 && cur_text(&c, 0)) *out = mem_strdup(cur_text(&c, 0));
  cur_close(&c);
  return 0;
}
