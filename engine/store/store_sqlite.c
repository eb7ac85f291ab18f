/*
** store_sqlite.c: the store (store.h) on an embedded SQLite file.
**
** Two connections to one WAL-mode database: the writer, used by whoever
** commits (the scheduler's commit thread), and the reader, used by the loop
** thread and the CLI. WAL lets the reader see the last committed state
** while a commit is being synced, so the loop never waits for a writer.
**
** Schema (migrations are numbered by PRAGMA user_version; add, never edit):
**
**   skills   (id) -> live version, file, description, triggers, last error
**   versions (version) -> skill, source, file: every source ever loaded
**   runs     (id) -> skill, version, status, trigger, input, output, error,
**            times, owner (the lease holding it while unfinished), idem
**            (invoke's key: unique per skill); once ended, a summary of
**            its steps (steps, failed_steps, retries, tokens); crashes
**            (how many processes died while it was executing, since its
**            last checkpoint: a run that keeps killing the engine is
**            failed instead of resumed again, see sched_adopt); prio
**            (its priority in the slot queues, kept from its first acquire)
**   steps    (run_id, seq) -> id, kind, status, output, attempts, times
**   attempts (run_id, seq, n) -> failed attempts with error and traceback
**   logs     run_id, seq, ts, level, msg
**   events   (id) -> name, data, idempotency key, dispatched
**   waits    (run_id, seq) -> what a parked run waits for (an event, a
**            child run, a cancelling event; match_json: the event's fields
**            that must be equal) and, once delivered, the result;
**            kept until its step's end is recorded (delivered_at without a
**            result: closed, ended with nothing)
**   deliveries (run_id, event_id): events a run's waits already took
**   slots, slot_queue: concurrency slots held, and runs queued for them
**            (skill: the skill's id or "@scope"; key: "path=value" or "")
**   flow_gcra (q, key) -> tat: throttle and rate limit state (GCRA)
**   flow_once (q, key) -> run_id, until: idempotency and singleton keys
**   flow_skips (skill, reason) -> n: runs flow control skipped
**   flow_batch (run_id, seq) -> event: the events batched into a run
**   cron_state (skill, spec) -> the last tick fired
**   leases   (owner) -> kind, host, pid, expires_at
**
** Indexes for reading history: runs_ended (ended runs by skill, status
** and time, store_stats.c) and runs_event (runs by the id of the event that started
** them).
**
** A run is owned by at most one live lease. Finished runs have no owner.
** Claiming work takes unowned unfinished runs; reaping clears the owner of
** runs whose lease expired or whose process died.
**
** This file holds the connections, the schema, the core journal entries
** (store_commit), leases and claiming work. The other parts of the store:
** store_flow.c (events, waits, cancellation, slots, cron), store_prune.c
** (retention) and store_read.c (every read: run records, lists, skills);
** what they share is in store_db.h.
*/
#include "base/buf.h"
#include "base/fault.h"
#include "base/mem.h"
#include "base/proc.h"
#include "base/units.h"
#include "base/vocab.h"
#include "store/store_db.h"

#include <dirent.h>
#include <pwd.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

/* store_rollup.c's store__hist_key of d, in SQL without a logarithm:
** ROLLUP_E counts the powers of two from 128 to 2^46 at or below d (e),
** and the key is e * 64 + (d >> e) from 128 on. */
#define ROLLUP_GE(k) "(d >= 1 << " #k ")"
#define ROLLUP_E \
  "(" ROLLUP_GE(7) "+" ROLLUP_GE(8) "+" ROLLUP_GE(9) "+" ROLLUP_GE(10) "+" ROLLUP_GE(11) "+" \
  ROLLUP_GE(12) "+" ROLLUP_GE(13) "+" ROLLUP_GE(14) "+" ROLLUP_GE(15) "+" ROLLUP_GE(16) "+" \
  ROLLUP_GE(17) "+" ROLLUP_GE(18) "+" ROLLUP_GE(19) "+" ROLLUP_GE(20) "+" ROLLUP_GE(21) "+" \
  ROLLUP_GE(22) "+" ROLLUP_GE(23) "+" ROLLUP_GE(24) "+" ROLLUP_GE(25) "+" ROLLUP_GE(26) "+" \
  ROLLUP_GE(27) "+" ROLLUP_GE(28) "+" ROLLUP_GE(29) "+" ROLLUP_GE(30) "+" ROLLUP_GE(31) "+" \
  ROLLUP_GE(32) "+" ROLLUP_GE(33) "+" ROLLUP_GE(34) "+" ROLLUP_GE(35) "+" ROLLUP_GE(36) "+" \
  ROLLUP_GE(37) "+" ROLLUP_GE(38) "+" ROLLUP_GE(39) "+" ROLLUP_GE(40) "+" ROLLUP_GE(41) "+" \
  ROLLUP_GE(42) "+" ROLLUP_GE(43) "+" ROLLUP_GE(44) "+" ROLLUP_GE(45) "+" ROLLUP_GE(46) ")"
#define ROLLUP_KEY "CASE WHEN d < 128 THEN d ELSE " ROLLUP_E " * 64 + (d >> " ROLLUP_E ") END"

static const char *const migrations[] = {
  /* 1: the durable core */
  "CREATE TABLE skills("
  "  id TEXT PRIMARY KEY, version TEXT, file TEXT, description TEXT,"
  "  triggers TEXT, error TEXT, updated_at INTEGER NOT NULL);"
  "CREATE TABLE versions("
  "  version TEXT PRIMARY KEY, skill TEXT NOT NULL, source TEXT NOT NULL,"
  "  file TEXT, loaded_at INTEGER NOT NULL);"
  "CREATE INDEX versions_skill ON versions(skill, loaded_at);"
  "CREATE TABLE runs("
  "  id TEXT PRIMARY KEY, skill TEXT NOT NULL, version TEXT NOT NULL,"
  "  status TEXT NOT NULL, entry TEXT NOT NULL DEFAULT 'run', trigger TEXT NOT NULL,"
  "  parent_id TEXT, input TEXT, output TEXT, error TEXT,"
  "  created_at INTEGER NOT NULL, started_at INTEGER, ended_at INTEGER,"
  "  deadline_at INTEGER, wake_at INTEGER, owner TEXT);"
  "CREATE INDEX runs_skill ON runs(skill, id);"
  "CREATE INDEX runs_status ON runs(status, id);"
  "CREATE INDEX runs_parent ON runs(parent_id) WHERE parent_id IS NOT NULL;"
  "CREATE INDEX runs_owner ON runs(owner) WHERE owner IS NOT NULL;"
  "CREATE INDEX runs_unowned ON runs(id) WHERE owner IS NULL"
  "  AND status IN ('queued','running','sleeping','waiting');"
  "CREATE TABLE steps("
  "  run_id TEXT NOT NULL, seq INTEGER NOT NULL, id TEXT NOT NULL, kind TEXT NOT NULL,"
  "  status TEXT NOT NULL, output TEXT, error TEXT, usage TEXT,"
  "  attempts INTEGER NOT NULL DEFAULT 1, started_at INTEGER, ended_at INTEGER,"
  "  wake_at INTEGER, retry_at INTEGER, PRIMARY KEY(run_id, seq)) WITHOUT ROWID;"
  "CREATE TABLE attempts("
  "  run_id TEXT NOT NULL, seq INTEGER NOT NULL, n INTEGER NOT NULL, status TEXT NOT NULL,"
  "  error TEXT, traceback TEXT, started_at INTEGER, ended_at INTEGER, retry_at INTEGER,"
  "  PRIMARY KEY(run_id, seq, n)) WITHOUT ROWID;"
  "CREATE TABLE logs("
  "  run_id TEXT NOT NULL, seq INTEGER NOT NULL, ts INTEGER NOT NULL,"
  "  level TEXT NOT NULL, msg TEXT NOT NULL);"
  "CREATE INDEX logs_run ON logs(run_id, seq);"
  "CREATE TABLE events("
  "  id TEXT PRIMARY KEY, name TEXT NOT NULL, data TEXT, idem TEXT UNIQUE,"
  "  ts INTEGER NOT NULL, dispatched INTEGER NOT NULL DEFAULT 0);"
  "CREATE TABLE timers(run_id TEXT PRIMARY KEY, seq INTEGER, wake_at INTEGER NOT NULL);"
  "CREATE INDEX timers_wake ON timers(wake_at);"
  "CREATE TABLE leases("
  "  owner TEXT PRIMARY KEY, kind TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL,"
  "  pid_start INTEGER NOT NULL, started_at INTEGER NOT NULL, expires_at INTEGER NOT NULL);",
  /* 2: triggers and flow: waits, deliveries, cancellation, concurrency, cron */
  "DROP TABLE timers;"
  "ALTER TABLE runs ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;"
  "ALTER TABLE runs ADD COLUMN cancel_reason TEXT;"
  "CREATE INDEX runs_cancel ON runs(owner) WHERE cancel_requested = 1;"
  "CREATE INDEX events_pending ON events(ts, id) WHERE dispatched = 0;"
  "CREATE INDEX events_name ON events(name, ts);"
  "CREATE TABLE waits("
  "  run_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL,"
  "  match_path TEXT, match_value TEXT, since INTEGER NOT NULL, timeout_at INTEGER,"
  "  owner TEXT, result TEXT, delivered_at INTEGER,"
  "  PRIMARY KEY(run_id, seq)) WITHOUT ROWID;"
  "CREATE INDEX waits_pending ON waits(kind, name) WHERE result IS NULL;"
  "CREATE INDEX waits_delivered ON waits(run_id) WHERE result IS NOT NULL;"
  "CREATE TABLE deliveries("
  "  run_id TEXT NOT NULL, event_id TEXT NOT NULL, seq INTEGER NOT NULL,"
  "  PRIMARY KEY(run_id, event_id)) WITHOUT ROWID;"
  "CREATE TABLE slots("
  "  skill TEXT NOT NULL, key TEXT NOT NULL, run_id TEXT NOT NULL, since INTEGER NOT NULL,"
  "  PRIMARY KEY(skill, key, run_id)) WITHOUT ROWID;"
  "CREATE INDEX slots_run ON slots(run_id);"
  "CREATE TABLE slot_queue("
  "  skill TEXT NOT NULL, key TEXT NOT NULL, run_id TEXT NOT NULL, since INTEGER NOT NULL,"
  "  PRIMARY KEY(skill, key, since, run_id)) WITHOUT ROWID;"
  "CREATE INDEX slot_queue_run ON slot_queue(run_id);"
  "CREATE TABLE cron_state("
  "  skill TEXT NOT NULL, spec TEXT NOT NULL, last_tick INTEGER NOT NULL,"
  "  PRIMARY KEY(skill, spec)) WITHOUT ROWID;",
  /* 3: idempotent starts: invoke's key, unique per skill, kept with its
  ** run (and pruned with it) */
  "ALTER TABLE runs ADD COLUMN idem TEXT;"
  "CREATE UNIQUE INDEX runs_idem ON runs(skill, idem) WHERE idem IS NOT NULL;",
  /* 4: health figures (store_stats.c). An ended run keeps a summary of
  ** its steps (count, failed, retries after the first attempt, LLM tokens),
  ** written when it ends (store__run_ended) and filled here for the runs
  ** that ended before. runs_ended covers every column the figures read
  ** of ended runs, by skill, status and creation time (status before
  ** time: a window's runs are counted by status without reading their
  ** entries); partial, so a run's entry is written once, when it ends
  ** (with its summary), not at every status change. runs_event
  ** finds the runs an event started (LIKE guards json_valid: a trigger
  ** that is not JSON never fails an insert). */
  "ALTER TABLE runs ADD COLUMN steps INTEGER;"
  "ALTER TABLE runs ADD COLUMN failed_steps INTEGER;"
  "ALTER TABLE runs ADD COLUMN retries INTEGER;"
  "ALTER TABLE runs ADD COLUMN tokens INTEGER;"
  "UPDATE runs SET (steps, failed_steps, retries, tokens) = (" STORE_STEP_SUMMARY "runs.id)"
  "  WHERE status IN ('completed','failed','cancelled');"
  "CREATE INDEX runs_ended ON runs(skill, status, created_at, started_at, ended_at,"
  "  steps, failed_steps, retries, tokens, id)"
  "  WHERE status = 'completed' OR status = 'failed' OR status = 'cancelled';"
  "CREATE INDEX runs_event ON runs("
  "  CASE WHEN json_valid(trigger) THEN json_extract(trigger, '$.event.id') END)"
  "  WHERE trigger LIKE '{\"kind\":\"event\"%';",
  /* 5: the triggers each version's latest load produced */
  "ALTER TABLE versions ADD COLUMN triggers TEXT;",
  /* 6: quarantine: processes that died while the run was executing */
  "ALTER TABLE runs ADD COLUMN crashes INTEGER NOT NULL DEFAULT 0;",
  /* 7: a wait matches on several fields: match_json, a JSON object of
  ** path -> value, replaces the one path and value (kept waits are
  ** carried over; "event." in a path meant the event itself) */
  "ALTER TABLE waits ADD COLUMN match_json TEXT;"
  "UPDATE waits SET match_json = json_object(CASE WHEN match_path LIKE 'event.%'"
  "  THEN substr(match_path, 7) ELSE match_path END, json(match_value))"
  "  WHERE match_path IS NOT NULL AND json_valid(match_value);"
  "ALTER TABLE waits DROP COLUMN match_path;"
  "ALTER TABLE waits DROP COLUMN match_value;",
  /* 8: flow control (store_queue.c): why a run is queued (JSON, NULL when
  ** it is not), a slot handed to a run by another run's release that its
  ** owner has not taken up yet (slot_granted, found through runs_granted),
  ** and each queue place's limit, so a release can hand its slot on. */
  "ALTER TABLE runs ADD COLUMN queued TEXT;"
  "ALTER TABLE runs ADD COLUMN slot_granted INTEGER NOT NULL DEFAULT 0;"
  "CREATE INDEX runs_granted ON runs(owner) WHERE slot_granted = 1;"
  "ALTER TABLE slot_queue ADD COLUMN lim INTEGER NOT NULL DEFAULT 1;"
  /* throttle and rate_limit: one row per (kind:skill, key), its
  ** theoretical arrival time (GCRA); a run's admission time, kept so a
  ** replay or another engine never admits it twice */
  "CREATE TABLE flow_gcra(q TEXT NOT NULL, key TEXT NOT NULL, tat INTEGER NOT NULL,"
  "  PRIMARY KEY(q, key)) WITHOUT ROWID;"
  "ALTER TABLE runs ADD COLUMN flow_at INTEGER;"
  /* idempotency and singleton: the run of each (kind:skill, key), and
  ** until when it holds the key (idempotency) */
  "CREATE TABLE flow_once(q TEXT NOT NULL, key TEXT NOT NULL, run_id TEXT NOT NULL,"
  "  until INTEGER NOT NULL, PRIMARY KEY(q, key)) WITHOUT ROWID;"
  /* priority: queued runs are handed slots highest first, then in order */
  "ALTER TABLE slot_queue ADD COLUMN prio INTEGER NOT NULL DEFAULT 0;"
  "CREATE INDEX slot_queue_order ON slot_queue(skill, key, prio DESC, since, run_id);"
  /* runs skipped by flow control, counted per skill and reason (/metrics) */
  "CREATE TABLE flow_skips(skill TEXT NOT NULL, reason TEXT NOT NULL, n INTEGER NOT NULL,"
  "  PRIMARY KEY(skill, reason)) WITHOUT ROWID;"
  /* batch: the events gathered into each batch's run */
  "CREATE TABLE flow_batch(run_id TEXT NOT NULL, seq INTEGER NOT NULL, event TEXT NOT NULL,"
  "  PRIMARY KEY(run_id, seq)) WITHOUT ROWID;",
  /* 9: nothing: PostgreSQL's 9 numbers events in the order they were
  ** committed, which SQLite's rowid is already; kept so both dialects
  ** count their migrations alike */
  "",
  /* 10: the figures' rollup (store_rollup.c): per skill and hour of
  ** creation, the ended runs' counts (by status: every ended status,
  ** vocab.h's), summaries and histograms, kept as
  ** runs end; built here from the runs that ended before, with coarse
  ** histograms ("~" then key:count, ROLLUP_KEY's keys). */
  "CREATE TABLE stats_rollup(skill TEXT NOT NULL, hour INTEGER NOT NULL,"
  "  completed INTEGER NOT NULL, failed INTEGER NOT NULL, cancelled INTEGER NOT NULL,"
  "  skipped INTEGER NOT NULL,"
  "  unstarted INTEGER NOT NULL, steps INTEGER NOT NULL, failed_steps INTEGER NOT NULL,"
  "  retries INTEGER NOT NULL, tokens INTEGER NOT NULL, dur TEXT NOT NULL, wait TEXT NOT NULL,"
  "  PRIMARY KEY(skill, hour)) WITHOUT ROWID;"
  "INSERT INTO stats_rollup SELECT skill, created_at / 3600000 * 3600000 AS h,"
  "  sum(status = 'completed'), sum(status = 'failed'), sum(status = 'cancelled'),"
  "  sum(status = 'skipped'),"
  "  sum(started_at IS NULL OR started_at = 0), coalesce(sum(steps), 0),"
  "  coalesce(sum(failed_steps), 0), coalesce(sum(retries), 0), coalesce(sum(tokens), 0), '', ''"
  "  FROM runs WHERE status IN (" VOCAB_RUN_ENDED_SQL ") GROUP BY skill, h;"
  /* the histograms in one pass over the runs: keys counted per skill,
  ** hour and kind (0: durations, 1: waits), then written out per row */
  "CREATE TEMP TABLE rollup_keys(skill TEXT NOT NULL, hour INTEGER NOT NULL,"
  "  kind INTEGER NOT NULL, k INTEGER NOT NULL, n INTEGER NOT NULL,"
  "  PRIMARY KEY(skill, hour, kind, k)) WITHOUT ROWID;"
  "INSERT INTO temp.rollup_keys SELECT skill, h, kind, " ROLLUP_KEY " AS k, count(*) FROM"
  "  (SELECT skill, created_at / 3600000 * 3600000 AS h, 0 AS kind, ended_at - started_at AS d"
  "   FROM runs WHERE status IN (" VOCAB_RUN_ENDED_SQL ") AND started_at != 0"
  "   AND ended_at != 0 AND ended_at >= started_at"
  "   UNION ALL SELECT skill, created_at / 3600000 * 3600000, 1, started_at - created_at"
  "   FROM runs WHERE status IN (" VOCAB_RUN_ENDED_SQL ") AND started_at != 0"
  "   AND started_at >= created_at)"
  "  GROUP BY skill, h, kind, k;"
  "UPDATE stats_rollup SET"
  "  dur = coalesce((SELECT '~' || group_concat(k || ':' || n, ' ') FROM temp.rollup_keys t"
  "    WHERE t.skill = stats_rollup.skill AND t.hour = stats_rollup.hour AND t.kind = 0), ''),"
  "  wait = coalesce((SELECT '~' || group_concat(k || ':' || n, ' ') FROM temp.rollup_keys t"
  "    WHERE t.skill = stats_rollup.skill AND t.hour = stats_rollup.hour AND t.kind = 1), '');"
  "DROP TABLE temp.rollup_keys;",
  /* 11: the status skipped (vocab.h): runs_ended covers every terminal
  ** status, so the figures count skipped runs as they count the others
  ** (the queries that read it name the same list) */
  "DROP INDEX runs_ended;"
  "CREATE INDEX runs_ended ON runs(skill, status, created_at, started_at, ended_at,"
  "  steps, failed_steps, retries, tokens, id)"
  "  WHERE status IN (" VOCAB_RUN_ENDED_SQL ");",
  /* 12: the partial indexes on runs say their status condition as an OR
  ** of comparisons (vocab.h's VOCAB_RUN_ENDED_OR): SQLite evaluated the
  ** IN lists of 11 and 1 by building a temporary b-tree on every insert
  ** of a run and every update of its status, which cost more than the
  ** table's index writes. The queries that read them name the same. */
  "DROP INDEX runs_ended;"
  "CREATE INDEX runs_ended ON runs(skill, status, created_at, started_at, ended_at,"
  "  steps, failed_steps, retries, tokens, id)"
  "  WHERE " VOCAB_RUN_ENDED_OR ";"
  "DROP INDEX runs_unowned;"
  "CREATE INDEX runs_unowned ON runs(id) WHERE owner IS NULL AND " VOCAB_RUN_UNENDED_OR ";",
  /* 13: a live skill's concurrency limits shared with other skills
  ** (journal.h's skill_row.scopes), which the store judges when another
  ** skill is registered (store_queue.c's store__scope_clash) */
  "ALTER TABLE skills ADD COLUMN scopes TEXT;",
  /* 14: a live skill's concurrency limits (journal.h's skill_row.limits),
  ** which govern its runs queued under an earlier version too
  ** (store_queue.c's current_limits) */
  "ALTER TABLE skills ADD COLUMN limits TEXT;",
  /* 15: a run's priority in its queues (the skill's priority(event)),
  ** recorded by its first acquire (store_queue.c), so that an engine
  ** taking the run up later never calls the function again; NULL until
  ** then, and for a skill without one */
  "ALTER TABLE runs ADD COLUMN prio INTEGER;",
};
#define NMIGRATIONS ((int)(sizeof migrations / sizeof migrations[0]))


static const char *const wsql[W_COUNT] = {
  [W_BEGIN] = "BEGIN IMMEDIATE",
  [W_COMMIT] = "COMMIT",
  [W_ROLLBACK] = "ROLLBACK",
  [W_LEASE_RENEW] = "UPDATE leases SET expires_at = ?2 WHERE owner = ?1",
};

/* The writer's statements for journal entries of the core kinds. Their
** parameters are the COL fields of the entry's kind (journal.h), named
** after them (":run_id") and bound from journal_kinds by name (bind_row).
** An INSERT is written from the kind's fields: head "(columns)
** VALUES(:columns)" tail; sql, when set, is the whole statement. Opening
** the store checks that every COL field has its parameter and that no
** parameter is left without a field. */
static const struct wrow {
  int w;
  enum jkind kind;
  const char *head, *tail, *sql;
} wrows[] = {
  {W_RUN_NEW, J_RUN_NEW, "INSERT INTO runs", "", NULL},
  /* A run's status while it has not ended: its owner stays (a statement
  ** that sets the column rewrites its entry in each index that holds it),
  ** and it has no summary yet. */
  {W_RUN_SET, J_RUN_SET, NULL, NULL,
   "UPDATE runs SET status = :status, output = COALESCE(:output, output),"
   " error = COALESCE(:error, error), started_at = COALESCE(:started_at, started_at),"
   " ended_at = COALESCE(:ended_at, ended_at), wake_at = :wake_at,"
   " (steps, failed_steps, retries, tokens) = (NULL, NULL, NULL, NULL)"
   " WHERE id = :run_id"},
  /* Its end (an ended status, write_entry): it is no one's now. A run that
  ** completes gets the summary of its steps (store_stats.c reads it) in
  ** the same write; a failed or cancelled one gets it from
  ** store__run_ended, once its open steps are ended too. */
  {W_RUN_END, J_RUN_SET, NULL, NULL,
   "UPDATE runs SET status = :status, output = COALESCE(:output, output),"
   " error = COALESCE(:error, error), started_at = COALESCE(:started_at, started_at),"
   " ended_at = COALESCE(:ended_at, ended_at), wake_at = :wake_at, owner = NULL,"
   " (steps, failed_steps, retries, tokens) = (SELECT " STORE_STEP_SUMS(":status = 'completed'")
   " FROM steps WHERE run_id = :run_id AND :status = 'completed')"
   " WHERE id = :run_id"},
  {W_STEP, J_STEP, "INSERT OR REPLACE INTO steps", "", NULL},
  {W_ATTEMPT, J_ATTEMPT, "INSERT OR REPLACE INTO attempts", "", NULL},
  {W_LOG, J_LOG, "INSERT INTO logs", "", NULL},
  {W_VERSION, J_VERSION, "INSERT INTO versions",
   " ON CONFLICT(version) DO UPDATE SET triggers = COALESCE(excluded.triggers, triggers)", NULL},
  {W_SKILL, J_SKILL, "INSERT INTO skills",
   " ON CONFLICT(id) DO UPDATE SET version = :version, file = COALESCE(:file, file),"
   " description = :description, triggers = :triggers, error = :error, updated_at = :updated_at,"
   " scopes = :scopes, limits = :limits",
   NULL},
};
#define NWROWS (sizeof wrows / sizeof wrows[0])

/* The SQL of a wrow, malloc'd. */
static char *wrow_sql(const struct wrow *r) {
  if (r->sql) return mem_strdup(r->sql);
  const struct journal_kind *k = &journal_kinds[r->kind];
  buf_t cols = BUF_INIT, vals = BUF_INIT;
  for (size_t i = 0; i < k->nfields; i++) {
    if (k->fields[i].use != JOURNAL_COL) continue;
    const char *sep = cols.len ? ", " : "";
    buf_printf(&cols, "%s%s", sep, k->fields[i].name);
    buf_printf(&vals, "%s:%s", sep, k->fields[i].name);
  }
  buf_t sql = BUF_INIT;
  buf_printf(&sql, "%s(%s) VALUES(%s)%s", r->head, buf_str(&cols), buf_str(&vals), r->tail);
  buf_free(&cols);
  buf_free(&vals);
  return buf_take(&sql);
}

/* Prepare the writer's statements, and find each journal field's
** parameter in the statement that writes its kind (s->wparam). A field
** without its parameter, or a parameter without its field, is a mistake
** in this file: say which. */
static int prepare_writes(store_t *s, err_t *e) {
  for (int i = 0; i < W_COUNT; i++) {
    if (!wsql[i]) continue;
    if (sqlite3_prepare_v3(s->w, wsql[i], -1, SQLITE_PREPARE_PERSISTENT, &s->ws[i], NULL))
      return store__db_err(e, s->w, "preparing statements");
  }
  for (size_t n = 0; n < NWROWS; n++) {
    const struct wrow *r = &wrows[n];
    const struct journal_kind *k = &journal_kinds[r->kind];
    char *sql = wrow_sql(r);
    int rc = sqlite3_prepare_v3(s->w, sql, -1, SQLITE_PREPARE_PERSISTENT, &s->ws[r->w], NULL);
    free(sql);
    if (rc) return store__db_err(e, s->w, "preparing statements");
    int used = 0;
    for (size_t i = 0; i < k->nfields && i < STORE_MAX_FIELDS; i++) {
      const struct journal_field *f = &k->fields[i];
      if (f->use != JOURNAL_COL) continue;
      char name[64];
      snprintf(name, sizeof name, ":%s", f->name);
      int p = sqlite3_bind_parameter_index(s->ws[r->w], name);
      if (!p || f->type == JOURNAL_OP || f->type == JOURNAL_RUN)
        return err_set(e, ERR_INTERNAL, "store: the statement that writes '%s' entries has no "
                       "parameter for its column %s", k->name, name);
      s->wparam[r->w][i] = (unsigned char)p;
      used++;
    }
    if (k->nfields > STORE_MAX_FIELDS || used != sqlite3_bind_parameter_count(s->ws[r->w]))
      return err_set(e, ERR_INTERNAL, "store: the statement that writes '%s' entries has "
                     "parameters that are no column of journal.h's list", k->name);
  }
  return 0;
}

/* Bind row (a struct of the kind statement w writes) to w's parameters. */
static sqlite3_stmt *bind_row(store_t *s, int w, enum jkind kind, const void *row) {
  const struct journal_kind *k = &journal_kinds[kind];
  sqlite3_stmt *st = s->ws[w];
  for (size_t i = 0; i < k->nfields; i++) {
    int p = s->wparam[w][i];
    if (!p) continue;
    const char *at = (const char *)row + k->fields[i].offset;
    switch (k->fields[i].type) {
    case JOURNAL_TEXT: store__bind_text(st, p, *(const char *const *)at); break;
    case JOURNAL_INT: sqlite3_bind_int(st, p, *(const int *)at); break;
    case JOURNAL_I64: sqlite3_bind_int64(st, p, *(const int64_t *)at); break;
    case JOURNAL_TIME: store__bind_time(st, p, *(const int64_t *)at); break;
    default: break; /* never a column (prepare_writes) */
    }
  }
  return st;
}


/* See store.h: the file's path. */
static const char *sqlite_path(const store_t *s) { return s->path; }

/* Who else holds the write lock of the database at path, as words in buf
** (", held by process 123 (moonloop), which is stopped"); "" when no other
** process does, as far as this one can see. In WAL mode the writer's lock
** is a POSIX lock on byte 120 of the -shm file (SQLite's WAL_WRITE_LOCK).
** It is looked up in /proc/locks, never by opening the -shm file: closing
** any descriptor of a file drops every POSIX lock this process holds on
** it, SQLite's own included. */
static void lock_holder(const char *path, char *buf, size_t n) {
  buf[0] = 0;
  if (!path || !*path) return;
  char shm[PATH_MAX + 8];
  snprintf(shm, sizeof shm, "%s-shm", path);
  struct stat st;
  if (stat(shm, &st) != 0) return;
  FILE *f = fopen("/proc/locks", "r");
  if (!f) return;
  char line[256];
  long pid = 0;
  while (!pid && fgets(line, sizeof line, f)) {
    char type[16];
    long p;
    unsigned maj, min;
    unsigned long ino;
    long long start;
    if (sscanf(line, "%*d: POSIX %*s %15s %ld %x:%x:%lu %lld", type, &p, &maj, &min, &ino,
               &start) == 6 && !strcmp(type, "WRITE") && ino == (unsigned long)st.st_ino &&
        maj == major(st.st_dev) && min == minor(st.st_dev) && start == 120 &&
        p != (long)getpid())
      pid = p;
  }
  fclose(f);
  if (!pid) return;
  char pp[64], comm[64] = "?";
  char state = 0;
  snprintf(pp, sizeof pp, "/proc/%ld/stat", pid);
  FILE *sf = fopen(pp, "r");
  if (sf) {
    if (fgets(line, sizeof line, sf)) {
      char *open_paren = strchr(line, '('), *close_paren = strrchr(line, ')');
      if (open_paren && close_paren && close_paren > open_paren) {
        snprintf(comm, sizeof comm, "%.*s", (int)(close_paren - open_paren - 1), open_paren + 1);
        state = close_paren[1] == ' ' ? close_paren[2] : 0;
      }
    }
    fclose(sf);
  }
  snprintf(buf, n, ", held by process %ld (%s)%s", pid, comm,
           state == 'T' || state == 't' ? ", which is stopped (SIGSTOP): it holds the lock until "
           "it is continued or killed" : "");
}

/* What the system said of db's last failed I/O (errno), or 0: SQLite keeps
** it for some errors only (sqlite3_system_errno); the files keep theirs,
** the WAL's too (a failed COMMIT writes there). */
static int system_errno(sqlite3 *db) {
  int v = sqlite3_system_errno(db);
  if (v) return v;
  if (sqlite3_file_control(db, "main", SQLITE_FCNTL_LAST_ERRNO, &v) == SQLITE_OK && v) return v;
  sqlite3_file *j = NULL;
  if (sqlite3_file_control(db, "main", SQLITE_FCNTL_JOURNAL_POINTER, &j) == SQLITE_OK && j &&
      j->pMethods && j->pMethods->xFileControl(j, SQLITE_FCNTL_LAST_ERRNO, &v) == SQLITE_OK)
    return v;
  return 0;
}

/* The folder of path, into dir. */
static void dir_of(const char *path, char *dir, size_t n) {
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, n, ".");
  else if (slash == path) snprintf(dir, n, "/");
  else snprintf(dir, n, "%.*s", (int)(slash - path), path);
}

/* A user's name (or "?"), into buf: getpwuid's answer lasts to its next call. */
static const char *user_name(uid_t uid, char *buf, size_t n) {
  struct passwd *pw = getpwuid(uid);
  snprintf(buf, n, "%s", pw && pw->pw_name ? pw->pw_name : "?");
  return buf;
}

/* When this process may not read and write path, or create files in its
** folder (SQLite's -wal and -shm go there), what stands in the way, for
** the end of an error ("; this process runs as nobody (uid 65534), and
** 'r.db' belongs to root with mode 0644: ..."); "" when nothing does. A
** restore done as root, or a service with another user, is the usual
** cause, and SQLite's "attempt to write a readonly database" names none. */
static void perm_hint(const char *path, char *buf, size_t n) {
  char dir[1024];
  struct stat st;
  const char *what = NULL;
  buf[0] = 0;
  dir_of(path, dir, sizeof dir);
  if (stat(path, &st) == 0 && access(path, R_OK | W_OK) != 0) what = path;
  else if (stat(dir, &st) == 0 && access(dir, W_OK | X_OK) != 0) what = dir;
  if (!what) return;
  uid_t me = geteuid();
  char mine[64], theirs[64];
  snprintf(buf, n, "; this process runs as %s (uid %ld), and '%s' belongs to %s with mode %04o: "
           "give it to that user (chown), or run the engine as its owner%s",
           user_name(me, mine, sizeof mine), (long)me, what,
           user_name(st.st_uid, theirs, sizeof theirs), (unsigned)(st.st_mode & 07777),
           what == dir ? " (SQLite creates its -wal and -shm files beside the database)" : "");
}

/* Report the connection's last error as an ERR_IO with context; a busy
** database (ERR_BUSY) says who holds its write lock. */
int store__db_err(err_t *e, sqlite3 *db, const char *what) {
  int code = sqlite3_errcode(db);
  if (code == SQLITE_BUSY || code == SQLITE_LOCKED) {
    char who[300];
    lock_holder(sqlite3_db_filename(db, "main"), who, sizeof who);
    return err_set(e, ERR_BUSY, "store: %s: %s: the database's write lock was not free for 10 s%s",
                   what, sqlite3_errmsg(db), who);
  }
  /* SQLite's "disk I/O error" says neither what the system said nor of
  ** which file: an operator needs both (a chattr +i, a vanished mount). */
  int prim = code & 0xff;
  int filed = prim == SQLITE_IOERR || prim == SQLITE_CANTOPEN || prim == SQLITE_READONLY ||
              prim == SQLITE_FULL;
  int sys = filed ? system_errno(db) : 0;
  const char *file = sqlite3_db_filename(db, "main");
  char hint[1400] = "";
  if ((prim == SQLITE_READONLY || prim == SQLITE_CANTOPEN) && file) perm_hint(file, hint, sizeof hint);
  if (sys)
    return err_set(e, ERR_IO, "store: %s: %s (%s, on %s or the files beside it)%s", what,
                   sqlite3_errmsg(db), strerror(sys), file, hint);
  if (filed && file && *file)
    return err_set(e, ERR_IO, "store: %s: %s (on %s)%s", what, sqlite3_errmsg(db), file, hint);
  return err_set(e, ERR_IO, "store: %s: %s", what, sqlite3_errmsg(db));
}

/* Run sql (one or more statements, no parameters) on db; ERR_IO with the
** start of the SQL on failure. */
int store__exec(sqlite3 *db, const char *sql, err_t *e) {
  char *msg = NULL;
  if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
    err_set(e, ERR_IO, "store: %s (in: %.80s)", msg ? msg : "error", sql);
    sqlite3_free(msg);
    return ERR_IO;
  }
  return 0;
}

/* Fill e with why path could not be opened: what the file system says
** when it tells more than SQLite's "unable to open database file" (the
** folder is missing, not a folder, not writable; path is a folder), else
** SQLite's message. */
static int open_error(const char *path, const char *sqlite_msg, err_t *e) {
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
    return err_set(e, ERR_IO, "cannot open database '%s': it is a folder, not a file", path);
  char dir[1024];
  dir_of(path, dir, sizeof dir);
  if (stat(dir, &st) != 0 && errno == ENOENT)
    return err_set(e, ERR_IO, "cannot open database '%s': the folder '%s' does not exist", path,
                   dir);
  if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode))
    return err_set(e, ERR_IO, "cannot open database '%s': '%s' is not a folder", path, dir);
  if (access(path, F_OK) != 0 && access(dir, W_OK | X_OK) != 0)
    return err_set(e, ERR_IO, "cannot create database '%s': the folder '%s' is not writable (%s)",
                   path, dir, strerror(errno));
  char hint[1400];
  perm_hint(path, hint, sizeof hint);
  return err_set(e, ERR_IO, "cannot open database '%s': %s%s", path, sqlite_msg, hint);
}

/* See store_backend.h. */
int store__sqlite_absent(const char *path) {
  struct stat st;
  char wal[PATH_MAX + 8], dir[1024];
  snprintf(wal, sizeof wal, "%s-wal", path);
  if (stat(path, &st) == 0 || errno != ENOENT || stat(wal, &st) == 0) return 0;
  /* A folder that is not there: opening says so, and creates nothing. */
  dir_of(path, dir, sizeof dir);
  return stat(dir, &st) == 0;
}

/* See store_db.h: a busy timeout of 10 s. */
int store__sqlite_conn(const char *path, sqlite3 **db, err_t *e) {
  /* store__fault_vfs: in a test build with faults armed, the files go
  ** through the VFS that can fail their writes and fsyncs. */
  int rc = sqlite3_open_v2(path, db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                                       SQLITE_OPEN_NOMUTEX, store__fault_vfs());
  if (rc != SQLITE_OK) {
    open_error(path, *db ? sqlite3_errmsg(*db) : sqlite3_errstr(rc), e);
    sqlite3_close(*db);
    *db = NULL;
    return ERR_IO;
  }
  sqlite3_busy_timeout(*db, 10000);
  return 0;
}

/* An upgrade of a database from version `from` (one with leases) while
** another process holds a live lease on it: refused
** (store__upgrade_refused says why). */
static int upgrade_refused(sqlite3 *db, int from, err_t *e) {
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(db, "SELECT kind, host, pid, pid_start, expires_at FROM leases", -1, &st,
                         NULL) != SQLITE_OK)
    return 0;
  int rc = 0;
  while (!rc && sqlite3_step(st) == SQLITE_ROW)
    rc = store__upgrade_refused(from, NMIGRATIONS, (const char *)sqlite3_column_text(st, 0),
                                (const char *)sqlite3_column_text(st, 1),
                                (long)sqlite3_column_int64(st, 2), sqlite3_column_int64(st, 3),
                                sqlite3_column_int64(st, 4), e);
  sqlite3_finalize(st);
  return rc;
}

/* Bring the schema up to date, one migration per transaction. */
static int migrate(sqlite3 *db, err_t *e) {
  sqlite3_stmt *st;
  int version = 0;
  if (sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL) != SQLITE_OK)
    return store__db_err(e, db, "reading the schema version");
  if (sqlite3_step(st) == SQLITE_ROW) version = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  if (version > NMIGRATIONS)
    return err_set(e, ERR_INVALID,
                   "database schema version %d is newer than this moonloop knows (%d): "
                   "upgrade moonloop", version, NMIGRATIONS);
  if (version > 0 && version < NMIGRATIONS && upgrade_refused(db, version, e)) return e->code;
  for (int v = version; v < NMIGRATIONS; v++) {
    char sql[64];
    if (store__exec(db, "BEGIN IMMEDIATE", e)) return ERR_IO;
    /* Another process may have migrated meanwhile: check again inside the lock. */
    int now = 0;
    if (sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL) == SQLITE_OK) {
      if (sqlite3_step(st) == SQLITE_ROW) now = sqlite3_column_int(st, 0);
      sqlite3_finalize(st);
    }
    if (now > v) {
      store__exec(db, "COMMIT", e);
      v = now - 1;
      continue;
    }
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d", v + 1);
    if (store__exec(db, migrations[v], e) || store__exec(db, sql, e)) {
      err_prefix(e, "migrating the database to version %d", v + 1);
      store__exec(db, "ROLLBACK", NULL);
      return ERR_IO;
    }
    if (store__exec(db, "COMMIT", e)) return ERR_IO;
  }
  return 0;
}

/* Put the database in WAL mode. Asking when it already is changes nothing,
** and is only a read: another process writing then is no obstacle. Setting
** it (a new file) can meet a busy database past the busy handler (SQLite
** does not wait in every case): try again for a while. */
static int use_wal(sqlite3 *db, err_t *e) {
  for (int tries = 0;; tries++) {
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL);
    if (rc == SQLITE_OK) {
      rc = sqlite3_step(st);
      const char *mode = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(st, 0) : NULL;
      int wal = mode && !strcmp(mode, "wal");
      sqlite3_finalize(st);
      if (wal) return 0;
      if (rc == SQLITE_ROW) rc = sqlite3_exec(db, "PRAGMA journal_mode=WAL", NULL, NULL, NULL);
      if (rc == SQLITE_OK) return 0;
    }
    if ((rc != SQLITE_BUSY && rc != SQLITE_LOCKED) || tries >= 100)
      return store__db_err(e, db, "reading the file");
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
  }
}

/* ---- the file under the path ----
**
** The engine writes into the file it opened. If that file is deleted (or
** another put in its place) while it runs, every commit would be
** acknowledged into a file no one will read again: the engine would look
** healthy and lose everything at its next start. So the store checks,
** before every commit and when asked (the engine's tick), that the path
** still names the file it has open (SQLite's SQLITE_FCNTL_HAS_MOVED: a
** stat of the path against the open file's inode). And a new database is
** not created at a path where a process still has a deleted one open: a
** writer (moonloop send) would write where that engine never reads. */

/* The path of the file descriptor of this process that has the file
** (dev, ino) open, as "/proc/PID/fd/N", in buf; "" when none is found. */
static void own_fd_of(dev_t dev, ino_t ino, char *buf, size_t n) {
  buf[0] = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return;
  struct dirent *de;
  while ((de = readdir(d))) {
    int fd = atoi(de->d_name);
    struct stat st;
    if (de->d_name[0] != '.' && fstat(fd, &st) == 0 && st.st_dev == dev && st.st_ino == ino) {
      snprintf(buf, n, "/proc/%ld/fd/%d", (long)getpid(), fd);
      break;
    }
  }
  closedir(d);
}

/* The WAL's path beside the database's, in buf. */
static void wal_path(const store_t *s, char *buf, size_t n) { snprintf(buf, n, "%s-wal", s->path); }

/* Whether the WAL's path no longer names the WAL the engine has open (a
** `rm moonloop.db-wal`: the newest commits, and every one after, would go
** into a file no one reads again); ERR_IO saying so. */
static int check_wal_moved(store_t *s, err_t *e) {
  char wal[PATH_MAX + 8];
  wal_path(s, wal, sizeof wal);
  struct stat st;
  int gone = stat(wal, &st) != 0;
  if (!s->wal_known || (!gone && st.st_dev == s->wal_dev && st.st_ino == s->wal_ino)) return 0;
  char fd[64];
  own_fd_of(s->wal_dev, s->wal_ino, fd, sizeof fd);
  return err_set(e, ERR_IO, "the database's write-ahead log '%s' was %s " STORE_FILE_GONE
                 ": writes are refused from now on (its newest commits are there, and nothing "
                 "more is acknowledged into a file no one will read)%s%s%s. Stop this process "
                 "with SIGTERM, not kill -9: a clean stop writes what that file holds "
                 "into the database", wal, gone ? "deleted" : "replaced by another file",
                 *fd ? "; it is " : "", fd, *fd ? " while this process runs" : "");
}

/* Whether the file at the path was cut or overwritten in place (a `>
** moonloop.db`, a copytruncate, a restore written over it: the same inode,
** so SQLITE_FCNTL_HAS_MOVED cannot tell): a length that is no multiple of
** its pages, and (head: the tick's check) a first page that is no
** SQLite's; ERR_IO saying so. */
static int check_damaged(store_t *s, int head, err_t *e) {
  struct stat st;
  if (stat(s->path, &st) || st.st_ino != s->ino || st.st_dev != s->dev) return 0;
  /* (Empty is a new database's length until its first checkpoint: only
  ** after it had pages is it cut.) */
  int bad = (st.st_size == 0 && s->seen_size > 0) || (s->page_size > 0 && st.st_size % s->page_size);
  if (st.st_size > s->seen_size) s->seen_size = st.st_size;
  char magic[16] = {0};
  if (!bad && head && st.st_size > 0) {
    /* Read through SQLite's own descriptor: closing another one of this
    ** file would drop every POSIX lock this process holds on it (the
    ** next process to close would take the WAL away). */
    sqlite3_file *f = NULL;
    bad = sqlite3_file_control(s->r, "main", SQLITE_FCNTL_FILE_POINTER, &f) == SQLITE_OK && f &&
          f->pMethods && (f->pMethods->xRead(f, magic, sizeof magic, 0) != SQLITE_OK ||
                          memcmp(magic, "SQLite format 3", 16));
  }
  if (!bad) return 0;
  return err_set(e, ERR_IO, "the database file '%s' was %s " STORE_FILE_GONE
                 " (%lld bytes now): writes are refused from now on (nothing more is "
                 "acknowledged into a damaged file). Stop this process and put the database "
                 "back from a backup", s->path,
                 st.st_size == 0 ? "emptied" : "cut short or overwritten", (long long)st.st_size);
}

/* Whether the path no longer names the file db has open, or its WAL, or
** the file was damaged in place; ERR_IO saying so. */
static int check_moved(store_t *s, sqlite3 *db, err_t *e) {
  int moved = 0;
  if (check_wal_moved(s, e) || check_damaged(s, db == s->r, e)) return e->code;
  if (sqlite3_file_control(db, "main", SQLITE_FCNTL_HAS_MOVED, &moved) != SQLITE_OK || !moved)
    return 0;
  struct stat st;
  int gone = stat(s->path, &st) != 0;
  char fd[64];
  own_fd_of(s->dev, s->ino, fd, sizeof fd);
  return err_set(e, ERR_IO, "the database file '%s' was %s " STORE_FILE_GONE ": "
                 "writes are refused from now on (nothing more is acknowledged into a file no "
                 "one will read). What was written before is in the file this process still "
                 "has open%s%s%s and in the WAL beside the path, '%s-wal' (leave it there: the "
                 "last writes may be only in it). To keep them: copy the file back while this "
                 "process runs (cp %s %s), stop this process with kill -9 (a clean stop folds "
                 "the WAL into the file it has open and removes it), and start again: SQLite "
                 "applies the WAL to the copy", s->path,
                 gone ? "deleted" : "replaced by another file", *fd ? " (" : "", fd,
                 *fd ? " while it runs)" : "", s->path, *fd ? fd : "FILE", s->path);
}

/* See store.h: through the reader (the caller's thread's connection). */
static int sqlite_check_file(store_t *s, err_t *e) { return check_moved(s, s->r, e); }

/* A process that still has a deleted file named path open (its pid, and
** its name in comm), found through /proc; 0 when none is (or /proc cannot
** tell: other users' processes are not visible). */
static long deleted_holder(const char *path, char *comm, size_t ncomm) {
  char dir[PATH_MAX], full[PATH_MAX + 16], want[PATH_MAX + 32];
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  snprintf(full, sizeof full, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
  if (slash == path) snprintf(full, sizeof full, "/");
  if (!realpath(full, dir)) return 0;
  snprintf(want, sizeof want, "%s%s%s (deleted)", dir, strcmp(dir, "/") ? "/" : "", base);
  long found = 0;
  DIR *proc = opendir("/proc");
  struct dirent *p;
  while (proc && !found && (p = readdir(proc))) {
    long pid = atol(p->d_name);
    if (pid <= 0 || pid == (long)getpid()) continue;
    char fdir[64];
    snprintf(fdir, sizeof fdir, "/proc/%ld/fd", pid);
    DIR *fds = opendir(fdir);
    struct dirent *f;
    while (fds && !found && (f = readdir(fds))) {
      char link[sizeof fdir + 260], target[PATH_MAX + 32];
      snprintf(link, sizeof link, "%s/%s", fdir, f->d_name);
      ssize_t n = readlink(link, target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = 0;
      if (!strcmp(target, want)) found = pid;
    }
    if (fds) closedir(fds);
  }
  if (proc) closedir(proc);
  comm[0] = 0;
  if (found) {
    char cpath[64];
    snprintf(cpath, sizeof cpath, "/proc/%ld/comm", found);
    FILE *c = fopen(cpath, "r");
    if (c) {
      if (fgets(comm, (int)ncomm, c)) comm[strcspn(comm, "\n")] = 0;
      fclose(c);
    }
  }
  return found;
}

static const struct store_ops sqlite_ops;
static void sqlite_close(store_t *s);

/* See store.h: the writer first (WAL, durability, migrations, its
** statements), then the reader. */
int store__sqlite_open(const char *path, enum store_durability d, store_t **out, err_t *e) {
  struct stat st;
  if (stat(path, &st) != 0 && errno == ENOENT) {
    char comm[64];
    long pid = deleted_holder(path, comm, sizeof comm);
    if (pid)
      return err_set(e, ERR_IO, "there is no database at '%s', but process %ld (%s) still has a "
                     "deleted file of that name open: it was deleted while in use. Nothing was "
                     "written: a new database there would be one that process never reads. "
                     "Stop it first (its log says where its data is), or use another --db",
                     path, pid, *comm ? comm : "?");
    /* SQLite would take a WAL without its database for a stale one and
    ** delete it: the writes it holds (events accepted, steps completed
    ** since the last checkpoint) would be gone without a word. */
    char wal[PATH_MAX + 8];
    snprintf(wal, sizeof wal, "%s-wal", path);
    if (stat(wal, &st) == 0 && st.st_size > 0)
      return err_set(e, ERR_IO, "there is no database at '%s', but its WAL '%s' is there (%lld bytes): "
                     "the database file was deleted or moved without it, and the WAL may hold its "
                     "last writes. Nothing was done: a new database there would throw them away. "
                     "Put the database file back at that path (SQLite then applies the WAL), or, to "
                     "start a new database there, move '%s' and '%s-shm' away first",
                     path, wal, (long long)st.st_size, wal, path);
  }
  /* SQLite's memory statistics take a global mutex on every allocation,
  ** which the loop and commit threads would contend for; nothing reads
  ** them. Only possible before SQLite initializes (later: a no-op). */
  static int configured;
  if (!configured) {
    configured = 1;
    sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
  }
  store_t *s = mem_calloc(1, sizeof *s);
  s->base.ops = &sqlite_ops;
  s->path = mem_strdup(path);
  if (store__sqlite_conn(path, &s->w, e)) goto fail;
  if (stat(path, &st) == 0) {
    s->dev = st.st_dev;
    s->ino = st.st_ino;
  }
  if (use_wal(s->w, e)) {
    /* The first read of the file: where a file that is not SQLite shows. */
    if ((sqlite3_errcode(s->w) & 0xff) == SQLITE_NOTADB)
      err_set(e, ERR_IO, "'%s' is not a moonloop database (SQLite: %s)", path,
              sqlite3_errmsg(s->w));
    else if ((sqlite3_errcode(s->w) & 0xff) == SQLITE_CORRUPT)
      err_set(e, ERR_IO, "'%s' is damaged (SQLite: %s): put it back from a backup; `sqlite3 %s "
              ".recover` saves what can still be read", path, sqlite3_errmsg(s->w), path);
    else
      err_prefix(e, "cannot use '%s' as a database", path);
    goto fail;
  }
  if (store__exec(s->w, d == STORE_FULL ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL", e))
    goto fail;
  if (migrate(s->w, e)) goto fail;
  store__ckpt_start(s, d == STORE_FULL);
  {
    /* The WAL exists from the first transaction on, as long as the file
    ** is open: which one it is, for check_wal_moved. */
    char wal[PATH_MAX + 8];
    wal_path(s, wal, sizeof wal);
    if (stat(wal, &st) == 0) {
      s->wal_dev = st.st_dev;
      s->wal_ino = st.st_ino;
      s->wal_known = 1;
    }
    sqlite3_stmt *ps;
    if (sqlite3_prepare_v2(s->w, "PRAGMA page_size", -1, &ps, NULL) == SQLITE_OK) {
      if (sqlite3_step(ps) == SQLITE_ROW) s->page_size = (long)sqlite3_column_int64(ps, 0);
      sqlite3_finalize(ps);
    }
  }
  if (prepare_writes(s, e)) goto fail;
  if (store__sqlite_conn(path, &s->r, e)) goto fail;
  /* The reader maps the file instead of copying pages into its cache:
  ** history reads (stats over a million runs) touch many pages once. */
  store__exec(s->r, "PRAGMA mmap_size=1073741824", NULL);
  *out = s;
  return 0;
fail:
  sqlite_close(s);
  return e ? e->code : ERR_IO;
}

/* See store.h. */
static void sqlite_close(store_t *s) {
  store__ckpt_stop(s);
  /* The file deleted under this process: closing would fold the WAL into
  ** the deleted file and remove it, and with it the last writes (the
  ** next open refuses to start a new database beside a WAL). */
  struct stat st;
  if (s->path && s->w && stat(s->path, &st) != 0 && errno == ENOENT) {
    sqlite3_db_config(s->w, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, NULL);
    if (s->r) sqlite3_db_config(s->r, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, NULL);
  }
  for (int i = 0; i < W_COUNT; i++) sqlite3_finalize(s->ws[i]);
  store__flow_close(s);
  for (int i = 0; i < STORE_CACHED_STMTS; i++) sqlite3_finalize(s->cache[i].st);
  store__sqlite_read_close(s);
  store__fence_free(&s->fence);
  buf_free(&s->base.scratch);
  sqlite3_close(s->w);
  sqlite3_close(s->r);
  free(s->path);
  free(s);
}

/* ---- binding helpers ---- */

/* Bind text v (not copied: it must outlive the step), or NULL for NULL. */
void store__bind_text(sqlite3_stmt *st, int i, const char *v) {
  if (v) sqlite3_bind_text(st, i, v, -1, SQLITE_STATIC);
  else sqlite3_bind_null(st, i);
}

/* Bind a time, with 0 meaning "none" (NULL). */
void store__bind_time(sqlite3_stmt *st, int i, int64_t v) {
  if (v) sqlite3_bind_int64(st, i, v);
  else sqlite3_bind_null(st, i);
}

/* Step a bound write statement to completion and reset it. */
int store__step(store_t *s, sqlite3_stmt *st, err_t *e, const char *what) {
  int rc = sqlite3_step(st);
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  if (rc != SQLITE_DONE && rc != SQLITE_ROW) return store__db_err(e, s->w, what);
  return 0;
}

/* Column i as a malloc'd string, or NULL for NULL. */
char *store__col_dup(sqlite3_stmt *st, int i) {
  const unsigned char *t = sqlite3_column_text(st, i);
  return t ? mem_strdup((const char *)t) : NULL;
}

/* Run each of the n statements of sql on the writer, in order, with ?1
** bound to arg; stops at the first failure (what names it). */
sqlite3_stmt *store__cached(store_t *s, const char *sql, err_t *e) {
  int i = 0;
  for (; i < STORE_CACHED_STMTS && s->cache[i].sql; i++)
    if (s->cache[i].sql == sql) {
      sqlite3_reset(s->cache[i].st);
      sqlite3_clear_bindings(s->cache[i].st);
      return s->cache[i].st;
    }
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v3(s->w, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL) != SQLITE_OK) {
    store__db_err(e, s->w, "preparing a statement");
    return NULL;
  }
  if (i < STORE_CACHED_STMTS) {
    s->cache[i].sql = sql;
    s->cache[i].st = st;
  }
  /* A full cache only happens if someone passes non-static SQL: then the
  ** statement leaks no more than one per call site ever seen. */
  return st;
}

int store__exec_bound(store_t *s, const char *const *sql, size_t n, const char *arg,
                      const char *what, err_t *e) {
  for (size_t i = 0; i < n; i++) {
    sqlite3_stmt *st = store__cached(s, sql[i], e);
    if (!st) return e->code;
    store__bind_text(st, 1, arg);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return store__db_err(e, s->w, what);
  }
  return 0;
}

/* Insert a run row (every COL field of struct run_row) inside the open
** transaction; what names the write in an error. A run without an entry
** point runs "run"; without a trigger, its trigger is "{}". */
int store__put_run(store_t *s, const struct run_row *r, const char *what, err_t *e) {
  struct run_row row = *r;
  if (!row.entry) row.entry = "run";
  if (!row.trigger) row.trigger = "{}";
  return store__step(s, bind_row(s, W_RUN_NEW, J_RUN_NEW, &row), e, what);
}


/* J_RUN_NEW of a run that a run creates (a child, an on_failure run),
** whose id the creator may derive from its own step: a replay of that
** step creates the same id again. A run with that id there already is
** not created twice: the entry's result is then its id (the creator drops
** its new copy), it is not the committer's for fencing, and if the
** committer held it, it is released: a claim takes it over with its
** journal. */
static int put_run_of_run(store_t *s, const struct jentry *je, err_t *e) {
  const struct run_row *r = &je->u.run;
  sqlite3_stmt *q = store__cached(s, "SELECT 1 FROM runs WHERE id = ?1", e);
  if (!q) return e->code;
  store__bind_text(q, 1, r->id);
  int rc = sqlite3_step(q);
  sqlite3_reset(q);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return store__db_err(e, s->w, "looking up a run");
  if (rc == SQLITE_DONE) return store__put_run(s, r, "creating a run", e);
  sqlite3_stmt *u = store__cached(s, "UPDATE runs SET owner = NULL WHERE id = ?1 AND owner = ?2", e);
  if (!u) return e->code;
  store__bind_text(u, 1, r->id);
  store__bind_text(u, 2, r->owner);
  if (store__step(s, u, e, "releasing a run")) return e->code;
  store__fence_remove(&s->fence, r->id);
  journal_set_result(je, mem_strdup(r->id));
  return 0;
}

/* Write one journal entry inside the open transaction: the core kinds
** here, the others through store_flow.c. */
static int write_entry(store_t *s, const struct jentry *je, err_t *e) {
  switch (je->kind) {
  case J_RUN_NEW:
    if (je->u.run.idem) return store__put_keyed_run(s, je, e);
    if (je->u.run.by_run) return put_run_of_run(s, je, e);
    return store__put_run(s, &je->u.run, "creating a run", e);
  case J_RUN_SET: {
    const struct run_set *r = &je->u.set;
    if (r->clear_crashes) {
      static const char *const sql[] = {"UPDATE runs SET crashes = 0 WHERE id = ?1"};
      if (store__exec_bound(s, sql, 1, r->run_id, "updating a run", e)) return e->code;
      if (!r->status) return 0;
    }
    int end = store__is_terminal(r->status);
    if (store__step(s, bind_row(s, end ? W_RUN_END : W_RUN_SET, J_RUN_SET, r), e,
                    "updating a run"))
      return e->code;
    return end ? store__run_ended(s, r->run_id, r->status, e) : 0;
  }
  case J_STEP:
    return store__step(s, bind_row(s, W_STEP, J_STEP, &je->u.step), e, "recording a step");
  case J_ATTEMPT:
    return store__step(s, bind_row(s, W_ATTEMPT, J_ATTEMPT, &je->u.attempt), e,
                       "recording an attempt");
  case J_LOG:
    return store__step(s, bind_row(s, W_LOG, J_LOG, &je->u.log), e, "recording a log line");
  case J_VERSION:
    return store__step(s, bind_row(s, W_VERSION, J_VERSION, &je->u.version), e,
                       "recording a skill version");
  case J_SKILL:
    if (je->u.skill.op != SKILL_PUT) return store__skill_change(s, &je->u.skill, e);
    {
      /* A scope another live skill gives another limit: refused here. */
      struct skill_row refused;
      char why[1600];
      int clash = store__scope_clash(s, je, &refused, why, sizeof why, e);
      if (clash) return clash < 0 ? e->code : store__skill_change(s, &refused, e);
    }
    if (store__step(s, bind_row(s, W_SKILL, J_SKILL, &je->u.skill), e, "registering a skill"))
      return e->code;
    return store__limits_changed(s, &je->u.skill, e);
  default:
    return store__write_flow(s, je, e);
  }
}

/* ---- fencing ----
**
** A group that names an owner commits only what that owner may write: its
** lease must exist (renewed in the same transaction), and every entry that
** writes for a run (journal_run_of) must be for a run that owner holds, as
** the runs table says. A process that lost a run (its lease was reaped,
** the run was taken with run --resume or cancelled as unowned) can then
** never write over whoever has it now, even under a new lease of its own.
** New runs must be the owner's or nobody's.
**
** Checking the runs table for every entry would cost the commit thread a
** lookup per step. It need not: while an owner's lease never expires from
** one renewal to the next, no other process may take or end its runs
** (reaping, claiming, run --resume and cancelling an unowned run all need
** the lease dead: expired, or its process gone), and only the owner itself
** renews its lease. So the runs found to be the owner's stay known to be
** (s->fence, across transactions) until one of these: a renewal finds the
** lease expired (another process may have acted meanwhile: check again),
** another owner commits, a transaction fails (it may have created runs that
** are gone again), or the run ends (once its end is committed; within the
** transaction it still writes its last entries: its parent's delivery, an
** on_failure run). */

/* 0 when owner holds run_id; else ERR_CONFLICT, saying who does. */
static int fence_check(store_t *s, const char *owner, const char *run_id, err_t *e) {
  if (store__fence_find(&s->fence, run_id) >= 0) return 0;
  sqlite3_stmt *st = store__cached(s, "SELECT owner, status FROM runs WHERE id = ?1", e);
  if (!st) return e->code;
  store__bind_text(st, 1, run_id);
  int rc = sqlite3_step(st);
  const char *holder = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(st, 0) : NULL;
  if (rc == SQLITE_ROW && holder && !strcmp(holder, owner)) {
    sqlite3_reset(st);
    store__fence_add(&s->fence, run_id);
    return 0;
  }
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
    store__db_err(e, s->w, "checking a run's owner");
  } else if (rc == SQLITE_DONE) {
    err_set(e, ERR_CONFLICT, "fenced: run %s does not exist (this process is %s)", run_id,
            owner);
  } else {
    err_set(e, ERR_CONFLICT, "fenced: run %s is %s, held by %s, not by this process (%s)",
            run_id, (const char *)sqlite3_column_text(st, 1), holder ? holder : "no process",
            owner);
  }
  sqlite3_reset(st);
  return e->code;
}

/* The fencing check of one entry (see above). */
static int fence_entry(store_t *s, const char *owner, const struct jentry *je, err_t *e) {
  const struct run_row *nr = je->kind == J_RUN_NEW ? &je->u.run
                             : je->kind == J_CRON && je->u.cron.run.id ? &je->u.cron.run : NULL;
  if (nr && nr->owner && strcmp(nr->owner, owner))
    return err_set(e, ERR_CONFLICT, "fenced: a new run (%s) for another owner (%s) in a group "
                   "of %s", nr->id, nr->owner, owner);
  const char *run = journal_run_of(je);
  if (run && fence_check(s, owner, run, e)) return e->code;
  if (nr && nr->owner) store__fence_add(&s->fence, nr->id);
  return 0;
}

/* Renew owner's lease until `expires` inside the open transaction:
** ERR_CONFLICT when it is gone. Found expired (not yet reaped), the runs
** known to be its own are checked again. */
static int renew_lease(store_t *s, const char *owner, int64_t expires, err_t *e) {
  if (strcmp(s->fence.owner, owner)) {
    store__fence_clear(&s->fence);
    snprintf(s->fence.owner, sizeof s->fence.owner, "%s", owner);
  }
  sqlite3_stmt *q = store__cached(s, "SELECT expires_at FROM leases WHERE owner = ?1", e);
  if (!q) return e->code;
  store__bind_text(q, 1, owner);
  int rc = sqlite3_step(q);
  int64_t was = rc == SQLITE_ROW ? sqlite3_column_int64(q, 0) : 0;
  sqlite3_reset(q);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return store__db_err(e, s->w, "reading the lease");
  if (rc == SQLITE_DONE)
    return err_set(e, ERR_CONFLICT, "lease lost: another process took over the runs of %s",
                   owner);
  if (fault_hit(FAULT_LEASE_REFUSED))
    return err_set(e, ERR_CONFLICT, "lease lost: another process took over the runs of %s "
                   "(fault injected: lease_refused)", owner);
  if (was < units_now_ms()) {
    store__fence_clear(&s->fence);
    snprintf(s->fence.owner, sizeof s->fence.owner, "%s", owner);
  }
  sqlite3_stmt *st = s->ws[W_LEASE_RENEW];
  store__bind_text(st, 1, owner);
  sqlite3_bind_int64(st, 2, expires);
  return store__step(s, st, e, "renewing the lease");
}

/* See store.h: renew the lease (fencing), write every entry, commit; roll
** back on any failure. */
static int sqlite_commit(store_t *s, const journal_t *j, err_t *e) {
  if (store__step(s, s->ws[W_BEGIN], e, "beginning a transaction")) return e->code;
  int64_t expires;
  const char *owner = journal_owner(j, &expires);
  journal_set_fenced(j, -1);
  /* A group tried again must not keep the answers of the attempt that
  ** failed (they were rolled back with it). */
  for (size_t i = 0, n = journal_count(j); i < n; i++) {
    const struct jentry *je = journal_entry(j, i);
    if (je->result) journal_set_result(je, NULL);
  }
  if (owner && renew_lease(s, owner, expires, e)) goto fail;
  int ended = 0;
  /* The figures' rollup gets the group's run ends in one write per skill
  ** and hour, after the entries. */
  store__rollup_gather(s);
  for (size_t i = 0, n = journal_count(j); i < n; i++) {
    const struct jentry *je = journal_entry(j, i);
    if (je->dropped) continue;
    if (owner && fence_entry(s, owner, je, e)) {
      if (e->code == ERR_CONFLICT) journal_set_fenced(j, (long)i);
      goto fail;
    }
    if (write_entry(s, je, e)) goto fail;
    ended |= je->kind == J_RUN_SET && store__is_terminal(je->u.set.status);
  }
  if (store__rollup_flush(s, e)) goto fail;
  /* Last, just before it counts: is the file still the one at the path? */
  if (check_moved(s, s->w, e)) goto fail;
  fault_delay(FAULT_COMMIT);
  if (fault_hit(FAULT_COMMIT_FAIL)) {
    err_set(e, ERR_IO, "store: committing: the transaction failed (fault injected: commit_fail)");
    goto fail;
  }
  if (store__step(s, s->ws[W_COMMIT], e, "committing")) goto fail;
  /* Runs that ended are no one's now. */
  for (size_t i = 0, n = ended ? journal_count(j) : 0; i < n; i++) {
    const struct jentry *je = journal_entry(j, i);
    if (!je->dropped && je->kind == J_RUN_SET && store__is_terminal(je->u.set.status))
      store__fence_remove(&s->fence, je->u.set.run_id);
  }
  return 0;
fail:
  store__rollup_drop(s);
  store__step(s, s->ws[W_ROLLBACK], NULL, "rolling back");
  store__fence_clear(&s->fence);
  return e->code;
}

/* ---- leases and claiming work ---- */

/* Prepare sql on db or fill e. */
sqlite3_stmt *store__prep(sqlite3 *db, const char *sql, err_t *e) {
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
    store__db_err(e, db, "preparing a query");
    return NULL;
  }
  return st;
}

/* See store.h. */
static int sqlite_lease_acquire(store_t *s, const struct lease *l, err_t *e) {
  sqlite3_stmt *st = store__prep(s->w,
    "INSERT OR REPLACE INTO leases(owner, kind, host, pid, pid_start, started_at, expires_at)"
    " VALUES(?1,?2,?3,?4,?5,?6,?7)", e);
  if (!st) return e->code;
  store__bind_text(st, 1, l->owner);
  store__bind_text(st, 2, l->kind);
  store__bind_text(st, 3, l->host);
  sqlite3_bind_int64(st, 4, l->pid);
  sqlite3_bind_int64(st, 5, l->pid_start);
  sqlite3_bind_int64(st, 6, units_now_ms());
  sqlite3_bind_int64(st, 7, l->expires_at);
  int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : store__db_err(e, s->w, "taking a lease");
  sqlite3_finalize(st);
  return rc;
}

/* Release the runs of owner and delete its lease; inside a transaction.
** The runs keep their concurrency slots: a slot belongs to a run, and a
** run whose process died may have a step still running out there; the
** next owner resumes the run in the slot it holds. */
static int release_owner(store_t *s, const char *owner, err_t *e) {
  static const char *const sql[] = {
    "UPDATE runs SET owner = NULL WHERE owner = ?1", "DELETE FROM leases WHERE owner = ?1",
  };
  return store__exec_bound(s, sql, 2, owner, "releasing a lease", e);
}

/* See store.h. */
static int sqlite_lease_release(store_t *s, const char *owner, err_t *e) {
  if (store__exec(s->w, "BEGIN IMMEDIATE", e)) return e->code;
  if (release_owner(s, owner, e)) {
    store__exec(s->w, "ROLLBACK", NULL);
    return e->code;
  }
  return store__exec(s->w, "COMMIT", e);
}

/* Whether a lease row (owner, host, pid, pid_start, expires_at) is dead:
** expired, or its process is gone on this host. */
static int lease_row_dead(sqlite3_stmt *st, const char *host, int64_t now) {
  return store__lease_dead((const char *)sqlite3_column_text(st, 1),
                           (long)sqlite3_column_int64(st, 2), sqlite3_column_int64(st, 3),
                           sqlite3_column_int64(st, 4), host, now);
}

/* See store.h. (The crash record, not the reaping of a dead lease, says a
** run crashed the engine: a `kill -9` must never count against a run.) */
static int sqlite_count_crash(store_t *s, const char *run_id, err_t *e) {
  static const char *const sql[] = {
    "UPDATE runs SET crashes = crashes + 1 WHERE id = ?1"
    " AND status NOT IN (" VOCAB_RUN_ENDED_SQL ")",
  };
  if (store__exec(s->w, "BEGIN IMMEDIATE", e)) return e->code;
  if (store__exec_bound(s, sql, 1, run_id, "counting a crash", e)) {
    store__exec(s->w, "ROLLBACK", NULL);
    return e->code;
  }
  return store__exec(s->w, "COMMIT", e) ? e->code : 0;
}

/* Reap dead leases inside an open write transaction. */
static int reap_locked(store_t *s, const char *host, int64_t now, err_t *e) {
  sqlite3_stmt *st = store__prep(s->w, "SELECT owner, host, pid, pid_start, expires_at FROM leases", e);
  if (!st) return e->code;
  char *dead[64];
  int n = 0;
  while (n < 64 && sqlite3_step(st) == SQLITE_ROW)
    if (lease_row_dead(st, host, now)) dead[n++] = mem_strdup((const char *)sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  int rc = 0;
  for (int i = 0; i < n; i++) {
    if (!rc && release_owner(s, dead[i], e)) rc = e->code;
    free(dead[i]);
  }
  return rc ? rc : n;
}

/* See store.h. */
static int sqlite_reap(store_t *s, const char *host, int64_t now, err_t *e) {
  if (store__exec(s->w, "BEGIN IMMEDIATE", e)) return e->code;
  int n = reap_locked(s, host, now, e);
  if (n < 0) {
    store__exec(s->w, "ROLLBACK", NULL);
    return n;
  }
  if (store__exec(s->w, "COMMIT", e)) return e->code;
  return n;
}

/* Fill r from the current row of st (STORE_CLAIM_COLS); strings are malloc'd. */
static void row_from_stmt(sqlite3_stmt *st, struct run_row *r) {
  struct store_cur c;
  store__sqlite_cur(&c, st, 0);
  store__run_row(&c, r, 1);
}

/* 0 when owner holds a live lease (its row exists and has not expired at
** now), inside the open write transaction: what every write that takes
** runs for owner requires, so a process whose lease is gone cannot take
** runs under its dead name (nobody would ever run them: reaping releases
** only the runs of leases that exist). ERR_CONFLICT ("lease lost") when
** the row is gone, ERR_BUSY when it expired and was not renewed yet. */
static int lease_live(store_t *s, const char *owner, int64_t now, err_t *e) {
  sqlite3_stmt *q = store__cached(s, "SELECT expires_at FROM leases WHERE owner = ?1", e);
  if (!q) return e->code;
  store__bind_text(q, 1, owner);
  int rc = sqlite3_step(q);
  int64_t expires = rc == SQLITE_ROW ? sqlite3_column_int64(q, 0) : 0;
  sqlite3_reset(q);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return store__db_err(e, s->w, "reading a lease");
  if (rc == SQLITE_DONE)
    return err_set(e, ERR_CONFLICT, "lease lost: another process took over the runs of %s",
                   owner);
  if (expires <= now)
    return err_set(e, ERR_BUSY, "the lease of %s expired %lld ms ago and was not renewed yet: "
                   "it takes no runs until it is", owner, (long long)(now - expires));
  return 0;
}

/* See store.h: only for a live lease of owner (lease_live). */
static int sqlite_claim(store_t *s, const char *owner, int limit, struct run_row **rows, size_t *n,
                err_t *e) {
  *rows = NULL;
  *n = 0;
  /* Asked every few seconds, and after every write another connection
  ** may have made: its statements are prepared once (store__cached). */
  if (store__step(s, s->ws[W_BEGIN], e, "beginning a transaction")) return e->code;
  if (lease_live(s, owner, units_now_ms(), e)) {
    store__step(s, s->ws[W_ROLLBACK], NULL, "rolling back");
    return e->code;
  }
  sqlite3_stmt *st = store__cached(s,
    "UPDATE runs SET owner = ?1 WHERE id IN (SELECT id FROM runs INDEXED BY runs_unowned"
    " WHERE owner IS NULL AND " VOCAB_RUN_UNENDED_OR " ORDER BY id LIMIT ?2)"
    " RETURNING " STORE_CLAIM_COLS, e);
  if (!st) {
    store__step(s, s->ws[W_ROLLBACK], NULL, "rolling back");
    return e->code;
  }
  store__bind_text(st, 1, owner);
  sqlite3_bind_int(st, 2, limit);
  size_t cap = 0;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (*n == cap) {
      cap = cap ? cap * 2 : 16;
      *rows = mem_realloc(*rows, cap * sizeof **rows);
    }
    row_from_stmt(st, &(*rows)[(*n)++]);
  }
  if (rc != SQLITE_DONE) store__db_err(e, s->w, "claiming runs");
  sqlite3_reset(st);
  if (rc == SQLITE_DONE) fault_delay(FAULT_CLAIM);
  if (rc != SQLITE_DONE || store__step(s, s->ws[W_COMMIT], e, "committing a claim")) {
    store__step(s, s->ws[W_ROLLBACK], NULL, "rolling back");
    store_rows_free(*rows, *n);
    *rows = NULL;
    *n = 0;
    return e->code;
  }
  return 0;
}

/* See store.h: reap dead leases first, so a run whose owner died can be
** taken at once; the taker needs a live lease (lease_live). */
static int sqlite_take_run(store_t *s, const char *run_id, const char *owner, const char *host,
                   int64_t now, struct run_row **row, err_t *e) {
  *row = NULL;
  if (store__exec(s->w, "BEGIN IMMEDIATE", e)) return e->code;
  int rc = reap_locked(s, host, now, e);
  sqlite3_stmt *st = NULL;
  if (rc < 0) goto done;
  rc = lease_live(s, owner, now, e);
  if (rc) goto done;
  st = store__prep(s->w, "SELECT " STORE_CLAIM_COLS " FROM runs WHERE id = ?1", e);
  if (!st) {
    rc = e->code;
    goto done;
  }
  store__bind_text(st, 1, run_id);
  if (sqlite3_step(st) != SQLITE_ROW) {
    rc = err_set(e, ERR_NOTFOUND, "no run with id '%s'", run_id);
    goto done;
  }
  struct run_row *r = mem_calloc(1, sizeof *r);
  row_from_stmt(st, r);
  sqlite3_finalize(st);
  st = NULL;
  if (store__is_terminal(r->status)) {
    rc = err_set(e, ERR_CONFLICT, "run %s is already %s: nothing to resume", run_id,
                 r->status);
  } else if (r->owner && strcmp(r->owner, owner)) {
    sqlite3_stmt *l = store__prep(s->w, "SELECT kind, host, pid, expires_at FROM leases WHERE owner=?1", e);
    if (l) {
      store__bind_text(l, 1, r->owner);
      if (sqlite3_step(l) == SQLITE_ROW)
        rc = err_set(e, ERR_CONFLICT,
                     "run %s is held by a live process (moonloop %s, pid %lld on %s); "
                     "its lease expires in %llds unless renewed",
                     run_id, sqlite3_column_text(l, 0), sqlite3_column_int64(l, 2),
                     sqlite3_column_text(l, 1),
                     (long long)(sqlite3_column_int64(l, 3) - now + 999) / 1000);
      sqlite3_finalize(l);
    } else {
      rc = e->code;
    }
  }
  if (!rc) {
    st = store__prep(s->w, "UPDATE runs SET owner = ?2 WHERE id = ?1", e);
    if (!st) rc = e->code;
    else {
      store__bind_text(st, 1, run_id);
      store__bind_text(st, 2, owner);
      if (sqlite3_step(st) != SQLITE_DONE) rc = store__db_err(e, s->w, "taking a run");
    }
  }
  if (rc) store_rows_free(r, 1);
  else *row = r;
done:
  sqlite3_finalize(st);
  if (rc) store__exec(s->w, "ROLLBACK", NULL);
  else if (store__exec(s->w, "COMMIT", e)) {
    store_rows_free(*row, 1);
    *row = NULL;
    rc = e->code;
  }
  return rc;
}

static const struct store_ops sqlite_ops = {
  .name = "sqlite",
  .close = sqlite_close,
  .path = sqlite_path,
  .check_file = sqlite_check_file,
  .commit = sqlite_commit,
  .lease_acquire = sqlite_lease_acquire,
  .lease_release = sqlite_lease_release,
  .reap = sqlite_reap,
  .count_crash = sqlite_count_crash,
  .claim = sqlite_claim,
  .take_run = sqlite_take_run,
  .dispatch = store__sqlite_dispatch,
  .deliver = store__sqlite_deliver,
  .prune = store__sqlite_prune,
  .data_version = store__sqlite_data_version,
  .rq = store__sqlite_rq,
  .rfilter = store__sqlite_rfilter,
  .rbegin = store__sqlite_rbegin,
  .rend = store__sqlite_rend,
  .reader_open = store__sqlite_reader_open,
  .reader_close = store__sqlite_reader_close,
  .wq = store__sqlite_wq,
};
