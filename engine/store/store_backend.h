/*
** store_backend.h: what a backend of the store provides, and what the two
** backends share. Nothing outside the store includes this.
**
** store.c dispatches every function of store.h through the table of the
** store it is given (struct store_ops), chosen once by store_open from the
** database setting: a "postgresql://" or "postgres://" URL opens the
** PostgreSQL store (store_pg*.c), anything else is the path of a SQLite
** file (store_sqlite*.c, store_flow.c, store_prune.c). Every store begins
** with a struct store_base, so store.c finds the table of either.
**
** Writes (journal groups, leases, claims, dispatching events, retention)
** are each backend's own: that is where the two databases differ (SQLite
** runs one write transaction at a time; PostgreSQL needs locks, upserts,
** SKIP LOCKED). Reads are written once (store_read.c: run records, lists,
** skills; store_stats.c: the health figures) against named read queries
** (enum store_rq): each backend has the SQL of every one of them in its
** own dialect and runs it on its reader connection, handing back a cursor
** over the rows (struct store_cur). So the run record, byte for byte, and
** the figures come from one place whichever database holds them.
*/
#ifndef ML_STORE_BACKEND_H
#define ML_STORE_BACKEND_H
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/fault.h"
#include "store/store.h"

/* The columns of a run row, in struct run_row's order (store__run_row and
** store_read.c's record writer read them by index). */
#define STORE_RUN_COLS \
  "id, skill, version, status, entry, trigger, parent_id, input, output, error," \
  " created_at, started_at, ended_at, deadline_at, wake_at, owner, queued"

/* The columns of a run row taken to be executed (claimed or taken over):
** STORE_RUN_COLS, then crashes, cancel_requested, cancel_reason, prio. */
#define STORE_CLAIM_COLS STORE_RUN_COLS ", crashes, cancel_requested, cancel_reason, prio"

/* ---- values bound to a query's parameters ------------------------------- */

/* A parameter's value: text (not copied: it must outlive the query), a
** whole number, or NULL. Parameters are positional: v[0] is ?1 (SQLite),
** $1 (PostgreSQL). */
struct store_val {
  enum { STORE_V_NULL, STORE_V_TEXT, STORE_V_INT } type;
  const char *s;
  int64_t i;
};
static inline struct store_val sv_text(const char *x) {
  return (struct store_val){x ? STORE_V_TEXT : STORE_V_NULL, x, 0};
}
static inline struct store_val sv_int(int64_t x) {
  return (struct store_val){STORE_V_INT, NULL, x};
}
/* A time, with 0 meaning none (NULL). */
static inline struct store_val sv_time(int64_t x) {
  return x ? sv_int(x) : (struct store_val){STORE_V_NULL, NULL, 0};
}
#define SV_TEXT(x) sv_text(x)
#define SV_INT(x) sv_int((int64_t)(x))
#define SV_TIME(x) sv_time((int64_t)(x))

/* ---- a cursor over a query's rows ------------------------------------------ */

struct store_cur;
struct store_cur_ops {
  /* Move to the next row: 1 when there is one, 0 when none is left, a
  ** negative code on failure (store__cur_err says what it was). */
  int (*next)(struct store_cur *c);
  int (*null)(const struct store_cur *c, int i);
  /* Whether column i of this row holds a whole number (not NULL, not text). */
  int (*is_int)(const struct store_cur *c, int i);
  int64_t (*i64)(const struct store_cur *c, int i);
  /* Column i as text (NULL for NULL), valid until the next move; its length. */
  const char *(*text)(const struct store_cur *c, int i);
  size_t (*bytes)(const struct store_cur *c, int i);
  /* Fill e with why next failed, as "store: what: the database's words". */
  int (*err)(const struct store_cur *c, err_t *e, const char *what);
  /* Done with it (resets or frees what the backend holds). */
  void (*close)(struct store_cur *c);
};

/* A cursor. The backend's fields: a statement or a result, a row. rc is
** the last move's answer (store__cur_next). */
struct store_cur {
  const struct store_cur_ops *ops;
  void *h, *aux;
  int row, nrows, owned;
  int rc;
};

/* Move c on; also kept in c->rc. */
static inline int cur_next(struct store_cur *c) { return c->rc = c->ops->next(c); }
static inline int cur_null(const struct store_cur *c, int i) { return c->ops->null(c, i); }
static inline int64_t cur_i64(const struct store_cur *c, int i) { return c->ops->i64(c, i); }
static inline int cur_int(const struct store_cur *c, int i) { return (int)c->ops->i64(c, i); }
static inline const char *cur_text(const struct store_cur *c, int i) { return c->ops->text(c, i); }
static inline size_t cur_bytes(const struct store_cur *c, int i) { return c->ops->bytes(c, i); }
/* Close c (NULL, or a cursor never opened: nothing). */
static inline void cur_close(struct store_cur *c) {
  if (c && c->ops) c->ops->close(c);
  if (c) c->ops = NULL;
}

/* ---- the named read queries ------------------------------------------------
** Each line: the query, its parameters (in order), the columns it gives. */
enum store_rq {
  /* store_read.c */
  RQ_RUN,             /* id -> STORE_RUN_COLS */
  RQ_STEPS,           /* run_id -> seq, id, kind, status, output, error, usage, attempts,
                      ** started_at, ended_at, wake_at, retry_at; by seq */
  RQ_ATTEMPTS,        /* run_id -> seq, n, status, error, traceback, started_at, ended_at,
                      ** retry_at; by seq, n */
  RQ_LOGS,            /* run_id -> seq, ts, level, msg; by seq, then as written */
  RQ_CHILDREN,        /* run_id -> id, skill, status; by id */
  RQ_RUN_STATUS,      /* id -> status */
  RQ_KEYED_RUN,       /* skill, idem -> id: the run an idempotent start made */
  RQ_EVENT_BY_KEY,    /* idem -> name: the event accepted under an id key */
  RQ_RUNS_ENDED,      /* a JSON array of run ids -> id, of those that ended */
  RQ_LIVE_VERSION,    /* skill -> version */
  RQ_STEP_JOURNAL,    /* run_id -> seq, id, kind, status, output, error, attempts, started_at,
                      ** ended_at, wake_at, retry_at, interrupted, attempt_started_at
                      ** (store_get_steps); by seq */
  RQ_COUNT_BY_STATUS, /* -> status, count */
  RQ_VERSION,         /* version -> source, skill, file */
  RQ_SKILL,           /* id -> id, version, file, description, triggers, error */
  RQ_SKILLS,          /* -> the same, every skill by id */
  RQ_SKILL_VERSIONS,  /* skill -> version, loaded_at, triggers; as loaded */
  RQ_POLL_DELIVERIES, /* owner -> run_id, seq: delivered waits (not cancel) of its runs */
  RQ_POLL_CANCELS,    /* owner -> id, cancel_reason: unfinished runs asked to cancel */
  RQ_POLL_GRANTS,     /* owner -> id: its queued runs handed slots by others' releases */
  RQ_CRON_LAST,       /* skill, spec -> last_tick */
  RQ_SERVE_LEASES,    /* -> owner, host, pid, pid_start, expires_at of "serve" leases */
  /* store_stats.c */
  RQ_ENDED_SUMS,      /* skill, since, until, status -> created_at, 0, started_at, ended_at,
                      ** steps, failed_steps, retries, tokens, id: ended runs of that status */
  RQ_ENDED,           /* the same parameters -> created_at, 0, started_at, ended_at */
  RQ_COUNT_ENDED,     /* the same parameters -> count */
  RQ_OPEN,            /* since, until, skill or NULL, the ULID time of since -> created_at,
                      ** 0, started_at, ended_at, NULL x4, id, skill: unfinished runs */
  RQ_RUN_STEP_TIMES,  /* run_id -> id, kind, status, attempts, started_at, ended_at */
  RQ_VERSIONS_IN,     /* skill, since, until -> version, loaded_at; as loaded */
  RQ_VERSION_BEFORE,  /* skill, since -> version, loaded_at: the last one loaded before */
  RQ_SKILL_KNOWN,     /* skill -> a row when registered or ever run */
  RQ_SKILL_NAMES,     /* -> skill, registered (0/1): registered and run skills, by name */
  RQ_ROLLUP,          /* skill, from, until -> hour, completed, failed, cancelled, unstarted,
                      ** steps, failed_steps, retries, tokens, dur, wait: the rollup's hours
                      ** in [from, until) (store_rollup.c) */
  RQ_ENDED_REFS,      /* skill, since, until, status -> created_at, id, failed_steps, retries:
                      ** ended runs of that status, for the step sample */
  RQ_EVENTS,          /* limit -> id, name, data, ts, dispatched, length(data); newest first */
  RQ_EVENTS_BEFORE,   /* before, limit -> the same, ids below before */
  RQ_EVENT_RUNS,      /* event id -> id, skill, status: runs it started; by id */
  /* store_queue.c */
  RQ_FLOW_QUEUED,     /* -> reason ("engine" when none), count: queued runs by reason */
  RQ_FLOW_SKIPS,      /* -> skill, reason, n: runs skipped by flow control */
  RQ_BATCH_EVENTS,    /* run_id -> a JSON list of its batch's events (oldest first), count */
  RQ_QUEUE_AHEAD,     /* run_id, queue, key -> count: the places ahead of the run's in that queue */
  RQ_COUNT
};

/* ---- write statements in both dialects ---------------------------------------- */

/* A statement written once per dialect (store_queue.c's flow control):
** SQLite's text (?1 ...) and PostgreSQL's ($1 ...). Backends key their
** prepared statements by its address. */
struct store_wq {
  const char *sqlite, *pg;
};

/* ---- the backend table ----------------------------------------------------- */

struct store_ops {
  const char *name; /* "sqlite", "postgresql" */
  void (*close)(store_t *s);
  const char *(*path)(const store_t *s);
  int (*check_file)(store_t *s, err_t *e);
  /* writes */
  int (*commit)(store_t *s, const journal_t *j, err_t *e);
  int (*lease_acquire)(store_t *s, const struct lease *l, err_t *e);
  int (*lease_release)(store_t *s, const char *owner, err_t *e);
  int (*reap)(store_t *s, const char *host, int64_t now, err_t *e);
  int (*count_crash)(store_t *s, const char *run_id, err_t *e);
  int (*claim)(store_t *s, const char *owner, int limit, struct run_row **rows, size_t *n,
               err_t *e);
  int (*take_run)(store_t *s, const char *run_id, const char *owner, const char *host,
                  int64_t now, struct run_row **row, err_t *e);
  int (*dispatch)(store_t *s, int64_t now, int limit, int *runs, err_t *e);
  int (*deliver)(store_t *s, int64_t *cursor, int limit, err_t *e);
  int (*prune)(store_t *s, int64_t before, int64_t *runs, int64_t *events, err_t *e);
  int64_t (*data_version)(store_t *s);
  int (*wake_fd)(store_t *s); /* NULL: none (store_wake_fd) */
  int (*woken)(store_t *s);
  /* reads: run query q with v[0..nv) on the reader (conn NULL) or on a
  ** connection from reader_open; *c is a cursor before the first row. */
  int (*rq)(store_t *s, void *conn, enum store_rq q, const struct store_val *v, int nv,
            struct store_cur *c, err_t *e);
  /* The runs of f, newest first, STORE_RUN_COLS (count 0; at most limit),
  ** or how many (count 1: one row, one column). */
  int (*rfilter)(store_t *s, const struct run_filter *f, int count, int limit,
                 struct store_cur *c, err_t *e);
  /* One snapshot for every read until rend (on conn, or the reader):
  ** 1 when begun here, 0 when one was open already, or a negative code. */
  int (*rbegin)(store_t *s, void *conn, err_t *e);
  void (*rend)(store_t *s, void *conn, int began);
  /* A second reader for another thread, in a snapshot of its own (the
  ** overview of the figures reads half its skills there); NULL when the
  ** backend has none, then the reader does all. */
  void *(*reader_open)(store_t *s, err_t *e);
  void (*reader_close)(store_t *s, void *conn);
  /* Run write statement q with v[0..nv) on the writer, inside the write
  ** transaction open (a journal group's); *c is a cursor before its first
  ** row (a SELECT's, a RETURNING's), to close when done. */
  int (*wq)(store_t *s, const struct store_wq *q, const struct store_val *v, int nv,
            struct store_cur *c, const char *what, err_t *e);
};

/* What every backend's store begins with. */
struct rollup_batch;
struct store_base {
  const struct store_ops *ops;
  buf_t scratch; /* the reader's, reused: a record's run-level logs */
  /* store_rollup.c's: the run ends of the group being written, while the
  ** store gathers them (store__rollup_gather); NULL otherwise */
  struct rollup_batch *rollup;
};

static inline const struct store_ops *store__ops(const store_t *s) {
  return ((const struct store_base *)(const void *)s)->ops;
}
static inline struct store_base *store__base(store_t *s) {
  return (struct store_base *)(void *)s;
}

/* The backends' opening functions (store.c chooses). */
int store__sqlite_open(const char *path, enum store_durability d, store_t **out, err_t *e);
/* store_absent for a SQLite path (store_sqlite.c). */
int store__sqlite_absent(const char *path);
int store__pg_open(const char *url, enum store_durability d, store_t **out, err_t *e);

/* The fault point reader_busy (base/fault.h), which every read passes:
** armed, the read is refused as a busy database would refuse it. */
static inline int store__read_fault(err_t *e) {
  if (!fault_hit(FAULT_READER_BUSY)) return 0;
  return err_set(e, ERR_BUSY, "store: reading: database is locked (fault injected: reader_busy)");
}

/* Run read query q on the reader (conn NULL) or conn: shorthand. */
static inline int store__rq(store_t *s, void *conn, enum store_rq q, const struct store_val *v,
                            int nv, struct store_cur *c, err_t *e) {
  if (store__read_fault(e)) return e->code;
  return store__ops(s)->rq(s, conn, q, v, nv, c, e);
}

/* ---- shared by both backends (store.c) -------------------------------------- */

/* Fill r from a row of STORE_RUN_COLS (and STORE_CLAIM_COLS's four more
** when the cursor has them: with_claim); strings are malloc'd. */
void store__run_row(const struct store_cur *c, struct run_row *r, int with_claim);
/* Whether a run status is final (completed, failed, cancelled, skipped); NULL is not. */
int store__is_terminal(const char *status);
/* Whether a lease is dead: expired, or its process is gone on this host. */
int store__lease_dead(const char *lease_host, long pid, long long pid_start, int64_t expires,
                      const char *host, int64_t now);
/* An upgrade of the schema from version `from` to `to` while a process
** (kind, pid, host) holds a live lease on the database: ERR_CONFLICT
** saying to stop every engine first. An engine that started before the
** upgrade goes on with the old schema's rules and never learns of the new
** columns (a skill registered through it left a changed concurrency
** limit unwritten); the upgrade is one-way. 0 when the lease is dead. */
int store__upgrade_refused(int from, int to, const char *kind, const char *lease_host, long pid,
                           long long pid_start, int64_t expires, err_t *e);
/* The JSON of an event as skills see it: {name, id, data, ts}; malloc'd. */
char *store__event_json(const char *id, const char *name, const char *data, int64_t ts);
/* Whether the event (JSON text) matches a wait's match (NULL: any event):
** each path of the JSON object match, relative to the event object {name,
** id, data, ts} ("data.request_id"), holds the match's value there, both
** printed as compact JSON (a missing path reads as null). A match that is
** not a JSON object matches nothing. */
int store__event_matches(const char *event_json_text, const char *match);

/* ---- flow control (store_queue.c), inside a write transaction -------------- */

/* J_SKILL (a PUT): whether its scopes clash with another live skill's
** (journal.h's skill_row.scopes): 1, *refused is the SKILL_ERROR to write
** instead (its error, the JSON of the message, in why[0..n)) and the
** entry's result says why (store_skill_refusal reads it); 0 when they agree; -1 on error. */
int store__scope_clash(store_t *s, const struct jentry *je, struct skill_row *refused, char *why,
                       size_t n, err_t *e);
/* J_SKILL (a PUT, written): its concurrency limits (skill_row.limits) are
** in force from now on, for the runs queued under an earlier version too:
** hand the room a raised limit makes to its queues' runs. */
int store__limits_changed(store_t *s, const struct skill_row *k, err_t *e);
/* J_SLOT: acquire every limit of a run, or queue it; or release them. */
int store__write_slot(store_t *s, const struct jentry *je, err_t *e);
/* Release run_id's slots and queue places and hand them to the runs
** queued behind it; the ids of the runs granted a slot are added to
** granted (a cJSON array) when it is not NULL. */
int store__slots_free(store_t *s, const char *run_id, cJSON *granted, err_t *e);

/* ---- the figures' rollup (store_rollup.c), inside a write transaction ---- */

/* Add run_id's part to the rollup (delta 1: the run has just ended, its
** summary written) or take it out (delta -1: before retention deletes
** it). Nothing for a run not ended, or gone. */
int store__rollup_run(store_t *s, const char *run_id, int delta, err_t *e);
/* A journal group's transaction: from store__rollup_gather on, the runs
** that end (store__rollup_run, delta 1) are summed up per skill and hour,
** and store__rollup_flush writes each sum once (before the commit);
** store__rollup_drop forgets them (the transaction failed). Either ends
** the gathering. */
void store__rollup_gather(store_t *s);
int store__rollup_flush(store_t *s, err_t *e);
void store__rollup_drop(store_t *s);
/* Take out of the rollup each run whose id is a row of ids (run with
** v[0..nv)): before retention deletes them. */
int store__rollup_forget(store_t *s, const struct store_wq *ids, const struct store_val *v, int nv,
                         err_t *e);
/* A duration's histogram bucket (its 7 highest bits: exact below 128),
** and the smallest value of a bucket. */
int64_t store__hist_key(int64_t v);
int64_t store__hist_floor(int64_t key);
/* Each (value, count) of a histogram's text (coarse buckets give their
** smallest value): 0, or -1 when the text is damaged (what was read before
** it has been given). */
int store__hist_each(const char *text, void (*each)(void *arg, int64_t value, int64_t n),
                     void *arg);

/* ---- fencing's memory (store_fence.c) ----------------------------------------
** The runs a store knows to be one owner's, across commits (see
** store_sqlite.c's fencing): an open-addressing set of run ids, used on the
** commit thread only. */
struct fence_set {
  char owner[64];
  char (*ids)[27];
  unsigned char *state; /* per slot: free, used, gone */
  size_t cap, n, gone;  /* cap a power of two */
};
long store__fence_find(const struct fence_set *f, const char *id);
void store__fence_add(struct fence_set *f, const char *id);
void store__fence_remove(struct fence_set *f, const char *id);
/* Forget every run and the owner. */
void store__fence_clear(struct fence_set *f);
void store__fence_free(struct fence_set *f);

#endif
