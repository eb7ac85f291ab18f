/*
** store.h: the one narrow interface between the engine and its durable
** state. Everything the scheduler, the CLI and the HTTP API need from the
** database goes through these functions, so another backend (PostgreSQL, for
** engines on several hosts) can be added beside SQLite without touching them.
**
** Two sides:
**   - writes: store_commit (a journal group in one transaction), leases,
**     claiming work. They use the writer connection and may block on a sync,
**     so the scheduler calls them from its commit thread; one thread at a
**     time per store.
**   - reads: run records (DESIGN's JSON shape), run lists, skill sources.
**     They use the reader connection, from one thread at a time, and never
**     wait for a writer (WAL).
**
** Times are milliseconds since the epoch. Run records are cJSON trees the
** caller frees with cJSON_Delete.
*/
#ifndef ML_STORE_H
#define ML_STORE_H
#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "base/buf.h"
#include "base/err.h"
#include "store/journal.h"

typedef struct store store_t;

enum store_durability {
  STORE_FULL,   /* every commit group is synced to disk before it counts */
  STORE_NORMAL, /* WAL's default: survives a process crash, not a power loss */
};

/* Open (creating and migrating as needed) the database at path: a SQLite
** file, or a PostgreSQL database when path is a "postgresql://" (or
** "postgres://") URL (the database must exist; its tables are made). */
int store_open(const char *path, enum store_durability d, store_t **out, err_t *e);
/* Whether path is a SQLite file that is not there (nor its WAL), in a
** folder that is: a command that only reads would create an empty database
** there and show no history. */
int store_absent(const char *path);

/* Whether the database setting names a database on a server (a
** PostgreSQL URL) rather than a file: such a database is never created
** by opening it, so there is no file to look for first. */
int store_is_server(const char *path);
void store_close(store_t *s);
const char *store_path(const store_t *s);

/* The path of a file of this host's own beside the database, for records
** a process leaves for the next one (the crash record): the SQLite file's
** path with suffix added; for a database on a server, a file in the
** working folder named after its URL without the password
** ("moonloop-pg-user_host_5432_db-crashes" for
** postgresql://user:pw@host:5432/db).
** ERR_TOOBIG when it does not fit in n bytes. */
int store_side_path(const store_t *s, const char *suffix, char *out, size_t n);

/* 0 while the path still names the file this store has open; ERR_IO with
** an explanation once it was deleted or replaced (every commit checks it
** too, and fails then: nothing is acknowledged into a file no one reads).
** A read: it uses the reader connection.
** store_open refuses to create a new file at a path where another process
** still has a deleted database of that name open. */
int store_check_file(store_t *s, err_t *e);

/* ---- writes ---------------------------------------------------------- */

/* Commit every entry of j (but the dropped ones) in one transaction. When
** j names an owner, its lease is renewed in the same transaction, and the
** whole group is refused with ERR_CONFLICT if that lease no longer exists
** ("lease lost"; journal_fenced(j) is -1) or if an entry writes for a run
** that owner does not hold ("fenced: ..."; journal_fenced(j) is that
** entry's index). See store_sqlite.c's fencing. */
int store_commit(store_t *s, const journal_t *j, err_t *e);

/* How the message of a failed store_commit begins when the store cannot
** tell yet whether an earlier try of this group committed (its COMMIT went
** out and the answer was lost with the connection, PostgreSQL's): its
** writers must not hear that nothing was stored. The store finds out
** before it commits anything else. */
#define STORE_IN_DOUBT "in doubt: "

/* In the message of a write refused because the database's files are not
** the ones the process opened (deleted, replaced, damaged in place): the
** engine says "DATABASE FILE GONE" for it. */
#define STORE_FILE_GONE "while this process had it open"

/* A process's lease: while it is held, the runs it owns are its to run. */
struct lease {
  const char *owner; /* unique per process */
  const char *kind;  /* "serve", "run" */
  const char *host;
  long pid;
  long long pid_start; /* the process's start time, to tell a reused pid */
  int64_t expires_at;
};

/* Take a lease (insert its row). */
int store_lease_acquire(store_t *s, const struct lease *l, err_t *e);

/* Give up a lease: its unfinished runs become claimable at once. */
int store_lease_release(store_t *s, const char *owner, err_t *e);

/* Release the runs of leases that expired or whose process is gone (on
** this host); returns the number of leases reaped, or a negative code. */
int store_reap(store_t *s, const char *host, int64_t now, err_t *e);

/* Count one crash of the engine against run_id, whose code was executing
** when the process crashed (core/crash.c recorded it); a run that has
** ended is left alone. Its next checkpoint clears the count. */
int store_count_crash(store_t *s, const char *run_id, err_t *e);

/* Claim up to limit unowned, unfinished runs for owner, oldest first.
** *rows gets an array of n runs (free with store_rows_free). Only for an
** owner whose lease is live, checked in the same transaction: ERR_CONFLICT
** ("lease lost") when its lease row is gone, ERR_BUSY when it expired and
** was not renewed yet. A claim that failed may have taken runs all the
** same (PostgreSQL: its COMMIT went unanswered); the next claims hand
** those back too, as many as the database shows are owner's, so n may
** exceed limit. */
int store_claim(store_t *s, const char *owner, int limit, struct run_row **rows, size_t *n,
                err_t *e);

/* Take one run for owner (moonloop run --resume): allowed when it is
** unfinished and unowned, or its owner's lease is gone, and owner's own
** lease is live (as for store_claim). ERR_CONFLICT says who holds it;
** ERR_NOTFOUND / ERR_CONFLICT for unknown or finished runs. */
int store_take_run(store_t *s, const char *run_id, const char *owner, const char *host,
                   int64_t now, struct run_row **row, err_t *e);

void store_rows_free(struct run_row *rows, size_t n);

/* Dispatch up to limit accepted events, oldest first, in one transaction:
** start a run of every live skill with a matching event trigger (queued,
** for any engine to claim), and deliver the event to the runs waiting for
** it. *runs gets the number of runs started. Returns the number of events
** dispatched, or a negative code. */
int store_dispatch(store_t *s, int64_t now, int limit, int *runs, err_t *e);

/* Deliver accepted events to the waits registered for them (as
** store_dispatch does), without starting any run or marking an event
** dispatched: for an engine that does not hold the live triggers (moonloop
** run, the REPL, serve before its workspace is registered), whose runs
** must still get the events they wait for; starting the runs an event
** triggers is left to an engine that does (store_dispatch). Looks at up to
** limit events accepted after *cursor, a position in the order events
** were committed that it advances (-1 at first: from the oldest event not
** dispatched yet). Returns how many it looked at, or a negative code. */
int store_deliver(store_t *s, int64_t *cursor, int limit, err_t *e);

/* Retention: delete the history of runs that ended before `before` (ms),
** and dispatched events accepted before it; runs not ended are kept.
** Counts go to *runs and *events. Works in batches of one transaction. */
int store_prune(store_t *s, int64_t before, int64_t *runs, int64_t *events, err_t *e);

/* ---- reads ----------------------------------------------------------- */

/* The run record of DESIGN (with steps, attempts and logs when with_steps). */
int store_get_run(store_t *s, const char *id, int with_steps, cJSON **out, err_t *e);

/* The same record as JSON text, appended to out: what the API answers,
** written from the rows without a tree (store_get_run parses it). Strings
** are valid UTF-8 (bytes that are not show as U+FFFD); on failure out is
** as it was. ERR_NOTFOUND for an unknown run. */
int store_run_json(store_t *s, const char *id, int with_steps, buf_t *out, err_t *e);

/* A run's status into status (n bytes); ERR_NOTFOUND for an unknown run. */
int store_run_status(store_t *s, const char *id, char *status, size_t n, err_t *e);

/* The run an idempotent start of skill with key made (runs_idem): 1 and
** its id in id, 0 when there is none, or a negative code. */
int store_keyed_run(store_t *s, const char *skill, const char *key, char *id, size_t n, err_t *e);

/* Which of the runs ids_json names (a JSON array of run ids) have ended
** (completed, failed, cancelled, skipped): cb(arg, id) for each, in one indexed
** query. Returns how many, or a negative code. */
int store_runs_ended(store_t *s, const char *ids_json, void (*cb)(void *arg, const char *id),
                     void *arg, err_t *e);

/* A registered skill's live version (the hash) into version (n bytes):
** ERR_NOTFOUND for an unknown skill, or one with no live version. */
int store_live_version(store_t *s, const char *skill, char *version, size_t n, err_t *e);

/* One step as the journal holds it, for replay: the steps of a run in
** order. *out is an array of objects {seq, id, kind, status, output (JSON
** text), error, attempts, started_at, ended_at, wake_at, retry_at}; a
** step still "running" also has interrupted (how many of its attempts were
** cut by a stopped process) and attempt_started_at (when its attempt in
** flight started, if after the first). */
int store_get_steps(store_t *s, const char *run_id, cJSON **out, err_t *e);

struct run_filter {
  const char *skill, *status, *trigger, *parent_id;
  int64_t since, until; /* created_at bounds, 0 = none */
  const char *before;   /* paging: only runs with an id below this one */
  int limit;            /* 0 = 100 */
};

/* Runs matching f, newest first, as run records without steps. */
int store_list_runs(store_t *s, const struct run_filter *f, cJSON **out, err_t *e);

/* The same list as a JSON array, appended to out (store_list_runs parses
** it). With next (nnext bytes): when more runs match past f's limit, the
** id of the last run written (the next page starts below it), else "". */
int store_list_runs_json(store_t *s, const struct run_filter *f, buf_t *out, char *next,
                         size_t nnext, err_t *e);

/* How many runs match f (its limit and paging are ignored). */
int store_count_runs(store_t *s, const struct run_filter *f, int64_t *n, err_t *e);

/* Runs by status, {"completed": 12, "failed": 1, ...}, for /metrics: the
** ended statuses summed from the figures' rollup (vocab.h's
** VOCAB_RUN_COUNTS_SQL), so a scrape reads hundreds of rows, not every run. */
int store_count_by_status(store_t *s, cJSON **out, err_t *e);

/* Flow control's figures (store_queue.c): queued runs by reason
** ({"queued": {"concurrency": n, "throttle": n, ..., "engine": n}}: "engine"
** for runs waiting for an engine to take them) and runs skipped, per skill
** and reason ({"skipped": [{"skill", "reason", "n"}]}). */
int store_flow_counts(store_t *s, cJSON **out, err_t *e);

/* The limit a list of concurrency limits ([{"scope", "key"?, "limit"}]: a
** skill's limits, or skills_scopes' list that the store judges) gives
** (scope, key), or 0 when it names that scope and key nowhere. */
int64_t store_scope_limit(const cJSON *limits, const char *scope, const char *key);

/* Why the store refused a skill's registration (je: a J_SKILL PUT whose
** scopes clash with another live skill's, store__scope_clash), or NULL when
** je was written as asked (or is no such entry). */
const char *store_skill_refusal(const struct jentry *je);

/* The events batched into run_id (flow control's batch), as a malloc'd
** JSON list in *out, oldest first; *out NULL when it has none. */
int store_batch_events(store_t *s, const char *run_id, char **out, err_t *e);

/* ---- health figures and the event stream (store_stats.c) ------------- */

/* A window of history cut into equal intervals. since and until are ms;
** since is moved back to a multiple of the interval (intervals line up
** from one query to the next); interval 0 picks one from the window's
** length (at most 60 intervals: 1h -> 1m, 24h -> 30m, 7d -> 3h). More than
** STORE_STATS_MAX_INTERVALS intervals is ERR_INVALID. */
struct stats_query {
  const char *skill; /* store_stats_skill's skill */
  int64_t since, until, interval;
};
#define STORE_STATS_MAX_INTERVALS 1000

/* One skill's figures over the window, as docs/api.md shows them: run
** counts by outcome, failure rate, run duration and queue wait percentiles,
** per interval and over the window; the same run figures for the window
** before (to say what changed); steps: duration percentiles, retries, LLM
** tokens, the slowest and the most failing steps; the versions loaded in
** the window (deploy markers). A run counts in the interval its created_at
** falls in. ERR_NOTFOUND for a skill neither registered nor ever run. */
int store_stats_skill(store_t *s, const struct stats_query *q, cJSON **out, err_t *e);

/* Every skill's run figures over the window and the one before, with its
** series per interval and the versions loaded in the window (no step
** figures): {"since", "until", "interval", "interval_ms", "skills": [...]}. */
int store_stats_overview(store_t *s, const struct stats_query *q, cJSON **out, err_t *e);

struct event_filter {
  const char *before; /* paging: only events with an id below this one */
  int limit;          /* 0 = 50 */
};

/* Recent events, newest first: [{id, name, ts, dispatched, data (null
** when over 4 KB: data_bytes says how big), runs: [{id, skill, status}]
** (the runs it started)}]. */
int store_list_events(store_t *s, const struct event_filter *f, cJSON **out, err_t *e);

/* The source of a version (and its skill id and file); caller frees. */
int store_get_version(store_t *s, const char *version, char **source, char **skill, char **file,
                      err_t *e);

/* A skill's registry record as DESIGN shows it; ERR_NOTFOUND if unknown. */
int store_get_skill(store_t *s, const char *id, cJSON **out, err_t *e);

/* Whether an event accepted under id key `key` has another name than
** name: ERR_CONFLICT saying so (a send would be dropped as its repeat,
** silently), 0 when none has the key or it has this name. A read, before
** the write: two sends racing with one key still give one event. */
int store_event_key_clash(store_t *s, const char *key, const char *name, err_t *e);

/* Whether id's live version was registered from another file than file,
** one that still exists (a skill's id belongs to its file while that file
** is there; a sidecar's "//HOST/PATH" counts as there): 1 with its name in
** other, else 0. The same file under another spelling is not another. */
int store_skill_held_elsewhere(store_t *s, const char *id, const char *file, char *other,
                               size_t n);
int store_list_skills(store_t *s, cJSON **out, err_t *e);

/* The version a rerun of a run of skill (which ran run_version) starts on,
** malloc'd in *out: the skill's live version; the run's own when the skill
** was never registered (a file run with `moonloop run FILE`); ERR_CONFLICT
** when it is registered but has no live version (its file was deleted or
** never loaded): a rerun is a new run, and those stopped with the file. */
int store_rerun_version(store_t *s, const char *skill, const char *run_version, char **out,
                        err_t *e);

/* What the runs of owner got from others: waits delivered
** ({"deliveries": [{"run_id", "seq"}]}) and cancellations asked for
** ({"cancels": [{"run_id", "reason"}]}), and concurrency slots handed to
** its queued runs by other runs' releases ({"grants": [run_id]}). */
int store_poll(store_t *s, const char *owner, cJSON **out, err_t *e);

/* The last cron tick fired for (skill, spec), or 0 when none was. */
int64_t store_cron_last(store_t *s, const char *skill, const char *spec);

/* Whether a live "serve" lease holds this database (for invoke --wait). */
int store_engine_alive(store_t *s, int64_t now);

/* ---- moving up (store_copy.c) ------------------------------------------ */

/* Told how far the copy of table is: done of its total rows (0 as it
** starts, total once it is done). */
typedef void (*store_copy_cb)(void *arg, const char *table, int64_t done, int64_t total);

/* Copy every table of src (a SQLite store) into dst (a PostgreSQL store),
** in one transaction on dst, reading src in one snapshot that no process
** can write to meanwhile. Refused, with nothing written: ERR_INVALID when
** the stores are not SQLite into PostgreSQL, when their schema versions
** differ or a table or column is on one side only; ERR_CONFLICT when a
** live lease holds src (an engine serving it) or dst has a row anywhere.
** *counts (when not NULL) gets {table: rows copied} on success. cb (may
** be NULL) is told the progress every few thousand rows. */
int store_copy(store_t *src, store_t *dst, store_copy_cb cb, void *arg, cJSON **counts,
               err_t *e);

/* A number that changes when another connection commits (PRAGMA data_version). */
int64_t store_data_version(store_t *s);

/* A descriptor that becomes readable when another process may have
** committed (then store_data_version says whether it did): PostgreSQL's
** reader connection, which LISTENs for the other processes' NOTIFY; -1
** when the store has none (SQLite), or while that connection is down. It
** changes when the connection is opened again; it stays the store's:
** watch a duplicate. */
int store_wake_fd(store_t *s);

/* Read what arrived on the wake-up descriptor: 1 when it says another
** process committed (this process's own commits, which also change
** store_data_version, do not wake it). */
int store_woken(store_t *s);

#endif
