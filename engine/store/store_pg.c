/*
** store_pg.c: the store (store.h) on a PostgreSQL database, for engines
** on several hosts sharing one durable history. Chosen by a database
** setting that is a URL: `db = "postgresql://user@host/dbname"`.
**
** The same schema as the SQLite store (store_sqlite.c draws it), in
** PostgreSQL's dialect, with the same numbered migrations (the version is
** the one row of moonloop_schema); the same run records, byte for byte
** (the reads are written once, store_read.c, from store_pg_read.c's SQL);
** the same guarantees:
**
**   - A journal group is one transaction. Durability "full" commits with
**     synchronous_commit on (acknowledged once PostgreSQL has flushed its
**     WAL), "normal" with it off (a crash of the server can lose the last
**     commits, never half of one).
**   - Every write transaction (but a claim) first takes one advisory lock
**     of the database, PG_WRITE_LOCK. Whole, by every transaction that
**     meets other processes' writes: those go one at a time, as on
**     SQLite, so what the SQLite store's comments argue from that (a wait
**     and an event meet in exactly one transaction, a cron tick fires
**     once, a slot count holds, fencing's memory stays true) holds here as
**     it is. Shared, by a journal group that only records the committer's
**     own runs (group_mode): several engines' steps commit side by side.
**     After the lock, every statement of the transaction sees what was
**     committed before it (READ COMMITTED takes a snapshot per
**     statement). Claims take unowned runs with FOR UPDATE SKIP LOCKED,
**     without the lock: engines claiming at once take disjoint runs.
**   - Fencing: the commit renews the group's lease and checks each run's
**     owner in the transaction, remembering the runs found to be the
**     owner's (store_fence.c) as store_sqlite.c explains.
**   - Other processes' writes are noticed through LISTEN/NOTIFY: each
**     transaction that writes something sends NOTIFY moonloop; the reader
**     LISTENs, and store_data_version counts what arrived (the engine's
**     50 ms tick asks, as it asks SQLite's PRAGMA data_version); the
**     engine's loop also watches the reader's socket (store_wake_fd) and
**     looks at once when another process's notification arrives.
**
** Connections: two per store, the writer (the commit thread) and the
** reader (the loop thread, the CLI). A broken connection (the server
** restarted, the network was lost) is opened again on a thread of its own
** (reopen), which the reader does not wait for and the writer a second at
** most; until the server answers, writes fail with the reason (the engine
** answers 503 and tries again) and reads fail likewise. A commit
** whose COMMIT was sent but not answered is looked up by its transaction
** id once the server answers again (txid_status), so a group is never
** written twice nor taken for lost when it committed.
**
** This file holds the connections, the schema, the core journal entries,
** fencing, leases, claiming work and LISTEN/NOTIFY; store_pg_flow.c the
** flow entries (events, waits, cancellation, slots, cron), dispatching and
** retention; store_pg_read.c the reads' SQL.
*/
#include "base/fault.h"
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/proc.h"
#include "base/units.h"
#include "base/vocab.h"
#include "store/store_pg_db.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Text columns compare and sort byte by byte (the "C" collation), as
** SQLite's do: run lists, skill lists and the figures' lookups must come
** in the same order from either store, whatever the database's locale. */
#define TX "TEXT COLLATE \"C\""

/* The migrations, numbered from 1 like SQLite's (store_sqlite.c says what
** each is for); add, never edit. */
static const char *const migrations[] = {
  /* 1: the durable core. n: the order rows were written in (SQLite's rowid). */
  "CREATE TABLE skills("
  "  id " TX " PRIMARY KEY, version " TX ", file " TX ", description " TX ","
  "  triggers " TX ", error " TX ", updated_at BIGINT NOT NULL);"
  "CREATE TABLE versions("
  "  version " TX " PRIMARY KEY, skill " TX " NOT NULL, source " TX " NOT NULL,"
  "  file " TX ", loaded_at BIGINT NOT NULL, n BIGINT GENERATED ALWAYS AS IDENTITY);"
  "CREATE INDEX versions_skill ON versions(skill, loaded_at, n);"
  "CREATE TABLE runs("
  "  id " TX " PRIMARY KEY, skill " TX " NOT NULL, version " TX " NOT NULL,"
  "  status " TX " NOT NULL, entry " TX " NOT NULL DEFAULT 'run', trigger " TX " NOT NULL,"
  "  parent_id " TX ", input " TX ", output " TX ", error " TX ","
  "  created_at BIGINT NOT NULL, started_at BIGINT, ended_at BIGINT,"
  "  deadline_at BIGINT, wake_at BIGINT, owner " TX ");"
  "CREATE INDEX runs_skill ON runs(skill, id);"
  "CREATE INDEX runs_status ON runs(status, id);"
  "CREATE INDEX runs_parent ON runs(parent_id) WHERE parent_id IS NOT NULL;"
  "CREATE INDEX runs_owner ON runs(owner) WHERE owner IS NOT NULL;"
  "CREATE INDEX runs_unowned ON runs(id) WHERE owner IS NULL"
  "  AND status IN ('queued','running','sleeping','waiting');"
  "CREATE TABLE steps("
  "  run_id " TX " NOT NULL, seq INTEGER NOT NULL, id " TX " NOT NULL, kind " TX " NOT NULL,"
  "  status " TX " NOT NULL, output " TX ", error " TX ", usage " TX ","
  "  attempts INTEGER NOT NULL DEFAULT 1, started_at BIGINT, ended_at BIGINT,"
  "  wake_at BIGINT, retry_at BIGINT, PRIMARY KEY(run_id, seq));"
  "CREATE TABLE attempts("
  "  run_id " TX " NOT NULL, seq INTEGER NOT NULL, n INTEGER NOT NULL, status " TX " NOT NULL,"
  "  error " TX ", traceback " TX ", started_at BIGINT, ended_at BIGINT, retry_at BIGINT,"
  "  PRIMARY KEY(run_id, seq, n));"
  "CREATE TABLE logs("
  "  run_id " TX " NOT NULL, seq INTEGER NOT NULL, ts BIGINT NOT NULL,"
  "  level " TX " NOT NULL, msg " TX " NOT NULL, n BIGINT GENERATED ALWAYS AS IDENTITY);"
  "CREATE INDEX logs_run ON logs(run_id, seq, n);"
  "CREATE TABLE events("
  "  id " TX " PRIMARY KEY, name " TX " NOT NULL, data " TX ", idem " TX " UNIQUE,"
  "  ts BIGINT NOT NULL, dispatched INTEGER NOT NULL DEFAULT 0);"
  "CREATE TABLE leases("
  "  owner " TX " PRIMARY KEY, kind " TX " NOT NULL, host " TX " NOT NULL, pid BIGINT NOT NULL,"
  "  pid_start BIGINT NOT NULL, started_at BIGINT NOT NULL, expires_at BIGINT NOT NULL);",
  /* 2: triggers and flow: waits, deliveries, cancellation, concurrency, cron
  ** (SQLite's 2 also drops its first timers table, which this never had) */
  "ALTER TABLE runs ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;"
  "ALTER TABLE runs ADD COLUMN cancel_reason TEXT;"
  "CREATE INDEX runs_cancel ON runs(owner) WHERE cancel_requested = 1;"
  "CREATE INDEX events_pending ON events(ts, id) WHERE dispatched = 0;"
  "CREATE INDEX events_name ON events(name, ts);"
  "CREATE TABLE waits("
  "  run_id " TX " NOT NULL, seq INTEGER NOT NULL, kind " TX " NOT NULL, name " TX " NOT NULL,"
  "  match_path " TX ", match_value " TX ", since BIGINT NOT NULL, timeout_at BIGINT,"
  "  owner " TX ", result " TX ", delivered_at BIGINT,"
  "  PRIMARY KEY(run_id, seq));"
  "CREATE INDEX waits_pending ON waits(kind, name) WHERE result IS NULL;"
  "CREATE INDEX waits_delivered ON waits(run_id) WHERE result IS NOT NULL;"
  "CREATE TABLE deliveries("
  "  run_id " TX " NOT NULL, event_id " TX " NOT NULL, seq INTEGER NOT NULL,"
  "  PRIMARY KEY(run_id, event_id));"
  "CREATE TABLE slots("
  "  skill " TX " NOT NULL, key " TX " NOT NULL, run_id " TX " NOT NULL, since BIGINT NOT NULL,"
  "  PRIMARY KEY(skill, key, run_id));"
  "CREATE INDEX slots_run ON slots(run_id);"
  "CREATE TABLE slot_queue("
  "  skill " TX " NOT NULL, key " TX " NOT NULL, run_id " TX " NOT NULL, since BIGINT NOT NULL,"
  "  PRIMARY KEY(skill, key, since, run_id));"
  "CREATE INDEX slot_queue_run ON slot_queue(run_id);"
  "CREATE TABLE cron_state("
  "  skill " TX " NOT NULL, spec " TX " NOT NULL, last_tick BIGINT NOT NULL,"
  "  PRIMARY KEY(skill, spec));",
  /* 3: idempotent starts: invoke's key, unique per skill */
  "ALTER TABLE runs ADD COLUMN idem TEXT;"
  "CREATE UNIQUE INDEX runs_idem ON runs(skill, idem) WHERE idem IS NOT NULL;",
  /* 4: health figures: an ended run's summary of its steps; runs_ended
  ** covers what the figures read of ended runs (an index-only scan);
  ** runs_event finds the runs an event started. moonloop_tokens reads a
  ** step's LLM usage, and a usage that is not JSON counts nothing instead
  ** of failing the commit that ends its run. */
  "CREATE FUNCTION moonloop_tokens(u TEXT) RETURNS NUMERIC LANGUAGE plpgsql IMMUTABLE AS $$"
  " BEGIN RETURN (u::json ->> 'total_tokens')::numeric;"
  " EXCEPTION WHEN others THEN RETURN NULL; END $$;"
  "ALTER TABLE runs ADD COLUMN steps BIGINT;"
  "ALTER TABLE runs ADD COLUMN failed_steps BIGINT;"
  "ALTER TABLE runs ADD COLUMN retries BIGINT;"
  "ALTER TABLE runs ADD COLUMN tokens BIGINT;"
  "CREATE INDEX runs_ended ON runs(skill, status, created_at)"
  "  INCLUDE (started_at, ended_at, steps, failed_steps, retries, tokens, id)"
  "  WHERE status IN ('completed','failed','cancelled');"
  "CREATE INDEX runs_event ON runs(((trigger::json) #>> '{event,id}'))"
  "  WHERE trigger LIKE '{\"kind\":\"event\"%';",
  /* 5: the triggers each version's latest load produced */
  "ALTER TABLE versions ADD COLUMN triggers TEXT;",
  /* 6: quarantine: processes that died while the run was executing */
  "ALTER TABLE runs ADD COLUMN crashes INTEGER NOT NULL DEFAULT 0;",
  /* 7: a wait matches on several fields: match_json, a JSON object of
  ** path -> value, replaces the one path and value (kept waits are
  ** carried over; "event." in a path meant the event itself; a value that
  ** is not JSON matched nothing, and is dropped as SQLite's json_valid
  ** drops it) */
  "ALTER TABLE waits ADD COLUMN match_json TEXT;"
  "CREATE FUNCTION moonloop_json_or_null(t TEXT) RETURNS JSON LANGUAGE plpgsql IMMUTABLE AS $$"
  " BEGIN RETURN t::json; EXCEPTION WHEN others THEN RETURN NULL; END $$;"
  "UPDATE waits SET match_json = json_build_object(CASE WHEN match_path LIKE 'event.%'"
  "  THEN substr(match_path, 7) ELSE match_path END, moonloop_json_or_null(match_value))::text"
  "  WHERE match_path IS NOT NULL AND moonloop_json_or_null(match_value) IS NOT NULL;"
  "ALTER TABLE waits DROP COLUMN match_path;"
  "ALTER TABLE waits DROP COLUMN match_value;",
  /* 8: flow control (store_queue.c; store_sqlite.c's 8 says what each is) */
  "ALTER TABLE runs ADD COLUMN queued TEXT;"
  "ALTER TABLE runs ADD COLUMN slot_granted INTEGER NOT NULL DEFAULT 0;"
  "CREATE INDEX runs_granted ON runs(owner) WHERE slot_granted = 1;"
  "ALTER TABLE slot_queue ADD COLUMN lim BIGINT NOT NULL DEFAULT 1;"
  "CREATE TABLE flow_gcra(q " TX " NOT NULL, key " TX " NOT NULL, tat BIGINT NOT NULL,"
  "  PRIMARY KEY(q, key));"
  "ALTER TABLE runs ADD COLUMN flow_at BIGINT;"
  "CREATE TABLE flow_once(q " TX " NOT NULL, key " TX " NOT NULL, run_id " TX " NOT NULL,"
  "  until BIGINT NOT NULL, PRIMARY KEY(q, key));"
  "ALTER TABLE slot_queue ADD COLUMN prio BIGINT NOT NULL DEFAULT 0;"
  "CREATE INDEX slot_queue_order ON slot_queue(skill, key, prio DESC, since, run_id);"
  "CREATE TABLE flow_skips(skill " TX " NOT NULL, reason " TX " NOT NULL, n BIGINT NOT NULL,"
  "  PRIMARY KEY(skill, reason));"
  "CREATE TABLE flow_batch(run_id " TX " NOT NULL, seq INTEGER NOT NULL, event " TX " NOT NULL,"
  "  PRIMARY KEY(run_id, seq));",
  /* 9: the order events were committed in (SQLite's rowid, which
  ** store_deliver follows): numbered under the write lock, so in the
  ** order their transactions commit (SQLite's 9 does nothing) */
  "ALTER TABLE events ADD COLUMN n BIGINT GENERATED ALWAYS AS IDENTITY;"
  "CREATE UNIQUE INDEX events_n ON events(n);",
  /* 10: the figures' rollup (store_sqlite.c's 10 says what it is);
  ** moonloop_hist_key is store_rollup.c's store__hist_key (the bit length
  ** of v, less 7, is e). */
  "CREATE TABLE stats_rollup(skill " TX " NOT NULL, hour BIGINT NOT NULL,"
  "  completed BIGINT NOT NULL, failed BIGINT NOT NULL, cancelled BIGINT NOT NULL,"
  "  skipped BIGINT NOT NULL,"
  "  unstarted BIGINT NOT NULL, steps BIGINT NOT NULL, failed_steps BIGINT NOT NULL,"
  "  retries BIGINT NOT NULL, tokens BIGINT NOT NULL, dur " TX " NOT NULL, wait " TX " NOT NULL,"
  "  PRIMARY KEY(skill, hour));"
  "CREATE FUNCTION moonloop_hist_key(v BIGINT) RETURNS BIGINT LANGUAGE sql IMMUTABLE AS $$"
  " SELECT CASE WHEN v < 128 THEN v ELSE (length(ltrim(v::bit(64)::text, '0')) - 7) * 64"
  " + (v >> (length(ltrim(v::bit(64)::text, '0')) - 7)) END $$;"
  "INSERT INTO stats_rollup SELECT skill, created_at / 3600000 * 3600000 AS h,"
  "  count(*) FILTER (WHERE status = 'completed'), count(*) FILTER (WHERE status = 'failed'),"
  "  count(*) FILTER (WHERE status = 'cancelled'), count(*) FILTER (WHERE status = 'skipped'),"
  "  count(*) FILTER (WHERE started_at IS NULL OR started_at = 0), coalesce(sum(steps), 0),"
  "  coalesce(sum(failed_steps), 0), coalesce(sum(retries), 0), coalesce(sum(tokens), 0), '', ''"
  "  FROM runs WHERE status IN (" VOCAB_RUN_ENDED_SQL ") GROUP BY skill, h;"
  "UPDATE stats_rollup r SET dur = x.t FROM (SELECT skill, h,"
  "  '~' || string_agg(k || ':' || n, ' ' ORDER BY k) AS t FROM"
  "  (SELECT skill, created_at / 3600000 * 3600000 AS h,"
  "   moonloop_hist_key(ended_at - started_at) AS k, count(*) AS n FROM runs"
  "   WHERE status IN (" VOCAB_RUN_ENDED_SQL ") AND started_at != 0 AND ended_at != 0"
  "   AND ended_at >= started_at GROUP BY 1, 2, 3) g GROUP BY 1, 2) x"
  "  WHERE r.skill = x.skill AND r.hour = x.h;"
  "UPDATE stats_rollup r SET wait = x.t FROM (SELECT skill, h,"
  "  '~' || string_agg(k || ':' || n, ' ' ORDER BY k) AS t FROM"
  "  (SELECT skill, created_at / 3600000 * 3600000 AS h,"
  "   moonloop_hist_key(started_at - created_at) AS k, count(*) AS n FROM runs"
  "   WHERE status IN (" VOCAB_RUN_ENDED_SQL ") AND started_at != 0"
  "   AND started_at >= created_at GROUP BY 1, 2, 3) g GROUP BY 1, 2) x"
  "  WHERE r.skill = x.skill AND r.hour = x.h;",
  /* 11: the status skipped (vocab.h): runs_ended covers every terminal
  ** status (the queries that read it name the same list) */
  "DROP INDEX runs_ended;"
  "CREATE INDEX runs_ended ON runs(skill, status, created_at)"
  "  INCLUDE (started_at, ended_at, steps, failed_steps, retries, tokens, id)"
  "  WHERE status IN (" VOCAB_RUN_ENDED_SQL ");",
  /* 12: nothing: SQLite's 12 says its partial indexes' conditions without
  ** IN lists, which PostgreSQL evaluates in place; kept so both dialects
  ** count their migrations alike (an empty statement is an error here) */
  "SELECT 1",
  /* 13: see SQLite's 13 */
  "ALTER TABLE skills ADD COLUMN scopes TEXT;",
  /* 14: see SQLite's 14 */
  "ALTER TABLE skills ADD COLUMN limits TEXT;",
  /* 15: see SQLite's 15 */
  "ALTER TABLE runs ADD COLUMN prio BIGINT;",
};
#define NMIGRATIONS ((int)(sizeof migrations / sizeof migrations[0]))

/* The summary of a run's steps kept on an ended run (steps, failed_steps,
** retries, tokens), as the four columns of a SELECT over its steps, each
** NULL unless cond (SQL) holds (store_db.h's STORE_STEP_SUMS). */
#define PG_STEP_SUMS(cond) \
  "CASE WHEN " cond " THEN count(*) END," \
  " CASE WHEN " cond " THEN coalesce(sum((status = 'failed')::int), 0) END," \
  " CASE WHEN " cond " THEN coalesce(sum(greatest(attempts - 1, 0)), 0) END," \
  " CASE WHEN " cond " THEN coalesce(sum(moonloop_tokens(usage)), 0) END"

/* ---- errors ---------------------------------------------------------------- */

/* Copy msg into out as one line: a line break becomes "; ", other runs of
** white space one space; none at the ends. libpq's messages come on
** several lines ("...failed: Connection refused\n\tIs the server...?"). */
static void one_line(const char *msg, char *out, size_t n) {
  size_t o = 0;
  int space = 0, brk = 0;
  for (const char *p = msg ? msg : ""; *p && o + 1 < n; p++) {
    if (*p == '\n' || *p == '\t' || *p == '\r' || *p == ' ') {
      space = o > 0;
      brk |= o > 0 && *p == '\n';
      continue;
    }
    if (brk && o + 3 < n) out[o++] = ';';
    if (space && o + 2 < n) out[o++] = ' ';
    space = brk = 0;
    out[o++] = *p;
  }
  out[o] = 0;
}

static int answer_ms(const struct pgconn *pc);

/* libpq's notices (NOTICE, WARNING from the server) would go to stderr:
** nothing the engine does should print them. */
static void no_notices(void *arg, const char *msg) { (void)arg, (void)msg; }

/* See store_pg_db.h. */
int store__pg_err(struct pg_store *s, struct pgconn *pc, const PGresult *res, const char *what,
                  err_t *e) {
  char msg[700];
  /* A server that does not answer: waiting may cure it (the API says 503). */
  if (pc->c && PQstatus(pc->c) == CONNECTION_BAD && pc->silent)
    return err_set(e, ERR_BUSY, "store: %s: PostgreSQL (%s) did not answer within %d s: the "
                   "connection was closed (a server stopped or stalled, a network cut off)", what,
                   s->shown, answer_ms(pc) / 1000);
  if (pc->c && PQstatus(pc->c) == CONNECTION_BAD) {
    one_line(PQerrorMessage(pc->c), msg, sizeof msg);
    return err_set(e, ERR_BUSY, "store: %s: the connection to PostgreSQL (%s) was lost: %s", what,
                   s->shown, *msg ? msg : "no answer");
  }
  const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
  const char *primary = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
  one_line(primary ? primary : res ? PQresultErrorMessage(res) : pc->c ? PQerrorMessage(pc->c)
           : "not connected", msg, sizeof msg);
  /* A lock not granted in time, a deadlock, a serialization failure:
  ** waiting and trying again may cure them. */
  if (state && (!strcmp(state, "55P03") || !strcmp(state, "40P01") || !strcmp(state, "40001")))
    return err_set(e, ERR_BUSY, "store: %s: %s", what, msg);
  return err_set(e, ERR_IO, "store: %s: %s", what, *msg ? msg : "PostgreSQL gave no reason");
}

/* ---- round trips with a deadline ------------------------------------------------
** libpq waits for an answer for as long as the connection stays up. A
** server that is stopped (SIGSTOP), stalled on a dead disk, or behind a
** network that drops packets while the kernel keeps the connection
** open, would hold the caller that long: the engine's loop on a read,
** its commit thread on a write, with every request waiting behind them
** and none refused. So each round trip is sent, then waited for with a
** deadline; past it the socket is shut down, libpq finds the connection
** lost, and the caller fails as it does when the server is away (the
** engine answers 503, backs off, and opens the connection again). A
** COMMIT caught so is looked up afterwards like any other whose answer was
** lost (pg_commit). The deadline is generous beside what a statement
** takes (a lock is waited for 10 s at most, lock_timeout). */

int store__pg_answer_ms = 30000;

/* The reader's round trips wait 5 s at most (less when the timeout is
** set lower): the engine's loop makes them, and while it waits nothing
** else moves (requests, /metrics, runs), so a stalled server froze the
** whole engine for the 30 s a write may wait. A read that gives up
** answers 503, which a client tries again. */
#define READ_ANSWER_MS 5000

/* How long pc's round trips wait for an answer (ms). */
static int answer_ms(const struct pgconn *pc) {
  return pc->reader && store__pg_answer_ms > READ_ANSWER_MS ? READ_ANSWER_MS : store__pg_answer_ms;
}

/* Wait until pc's answer is in, at most until deadline (ms): 0, or -1
** when it did not come (the connection is then shut down). */
static int await_answer(struct pgconn *pc, int64_t deadline) {
  while (PQisBusy(pc->c)) {
    int64_t left = deadline - units_now_ms();
    struct pollfd p = {.fd = PQsocket(pc->c), .events = POLLIN};
    int n = left > 0 ? poll(&p, 1, (int)left) : 0;
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      pc->silent = 1;
      shutdown(PQsocket(pc->c), SHUT_RDWR);
      PQconsumeInput(pc->c); /* finds the connection closed: CONNECTION_BAD */
      return -1;
    }
    if (!PQconsumeInput(pc->c)) return 0; /* PQgetResult says what broke */
  }
  return 0;
}

/* The results of what was sent on pc, as PQexec gathers them: the first
** error, else the last result; NULL when the send failed. */
static PGresult *gather(struct pgconn *pc, int sent) {
  if (!sent) return NULL;
  int64_t deadline = units_now_ms() + answer_ms(pc);
  PGresult *keep = NULL, *r;
  for (;;) {
    if (await_answer(pc, deadline)) break;
    if (!(r = PQgetResult(pc->c))) break;
    ExecStatusType st = PQresultStatus(r);
    if (keep && PQresultStatus(keep) == PGRES_FATAL_ERROR) PQclear(r);
    else PQclear(keep), keep = r;
    if (st == PGRES_COPY_IN || st == PGRES_COPY_OUT || st == PGRES_COPY_BOTH) break;
    if (PQstatus(pc->c) == CONNECTION_BAD) break;
  }
  return keep;
}

/* See store_pg_db.h. A NULL result (nothing could be sent, the answer
** never came) is libpq's "no result": PQresultStatus says
** PGRES_FATAL_ERROR and the connection's status says why. */
PGresult *store__pg_exec_raw(struct pgconn *pc, const char *sql) {
  return gather(pc, PQsendQuery(pc->c, sql));
}

static PGresult *prepare_raw(struct pgconn *pc, const char *name, const char *sql) {
  return gather(pc, PQsendPrepare(pc->c, name, sql, 0, NULL));
}

static PGresult *exec_prepared_raw(struct pgconn *pc, const char *name, int n,
                                   const char *const *v) {
  return gather(pc, PQsendQueryPrepared(pc->c, name, n, v, NULL, NULL, 0));
}

/* ---- connections ------------------------------------------------------------ */

/* The URL without its password (user:secret@ -> user@, password=... dropped). */
static char *url_shown(const char *url) {
  char *out = mem_strdup(url);
  char *p = strstr(out, "://");
  if (p) {
    p += 3;
    size_t hostpart = strcspn(p, "/?");
    char *at = memchr(p, '@', hostpart);
    char *colon = at ? memchr(p, ':', (size_t)(at - p)) : NULL;
    if (colon) memmove(colon, at, strlen(at) + 1);
  }
  char *q = strchr(out, '?');
  while (q) {
    char *param = q + 1;
    char *end = param + strcspn(param, "&");
    if (!strncmp(param, "password=", 9)) {
      if (*end) {
        memmove(param, end + 1, strlen(end + 1) + 1);
        continue; /* the next parameter is at param now */
      }
      *q = 0; /* the last one: cut it with its '?' or '&' (it looped here for ever) */
      break;
    }
    q = *end ? end : NULL;
  }
  return out;
}

/* What opening one connection needs and gives, apart from the store: a
** connection that broke is opened again on a thread of its own (reopen),
** which may outlive the store. */
struct opening {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* signalled when done */
  int refs;       /* the thread's, and the store's until it takes the result */
  int done;       /* the thread is through: c or why says how it went */
  char *url;
  char app[96];   /* application_name */
  int reader;
  enum store_durability durability;
  PGconn *c;      /* the connection, set up; NULL when it failed */
  int setup;      /* it failed setting up the session (else connecting) */
  int code;       /* then: ERR_BUSY (waiting may cure it) or ERR_IO */
  char why[700];  /* why it failed, on one line */
};

/* Open a connection as o says and set its session up: the URL's own
** parameters win over these defaults (keywords are read in order, dbname
** last); then the writer's durability and lock wait, or the reader's
** LISTEN. Fills o->c, or o->why. Blocks for as long as the server takes:
** connect_timeout for the connection, the answer deadline for the setup. */
static void conn_make(struct opening *o) {
  const char *keys[] = {"connect_timeout", "fallback_application_name", "client_encoding",
                        "keepalives_idle", "keepalives_interval", "keepalives_count",
                        "tcp_user_timeout", "dbname", NULL};
  const char *vals[] = {"10", o->app, "UTF8", "10", "5", "3", "30000", o->url, NULL};
  PGconn *c = PQconnectdbParams(keys, vals, 1);
  if (!c || PQstatus(c) != CONNECTION_OK) {
    one_line(c ? PQerrorMessage(c) : "out of memory", o->why, sizeof o->why);
    if (c) PQfinish(c);
    o->code = ERR_BUSY;
    return;
  }
  PQsetNoticeProcessor(c, no_notices, NULL);
  char setup[256];
  if (o->reader)
    snprintf(setup, sizeof setup, "LISTEN moonloop");
  else
    snprintf(setup, sizeof setup,
             "SET synchronous_commit = %s; SET lock_timeout = '10s';"
             " SET idle_in_transaction_session_timeout = '10s'",
             o->durability == STORE_FULL ? "on" : "off");
  struct pgconn *pc = mem_calloc(1, sizeof *pc);
  pc->c = c;
  PGresult *r = store__pg_exec_raw(pc, setup);
  if (PQresultStatus(r) == PGRES_COMMAND_OK) {
    o->c = c;
  } else {
    o->setup = 1;
    o->code = PQstatus(c) == CONNECTION_BAD ? ERR_BUSY : ERR_IO;
    one_line(r ? PQresultErrorMessage(r) : PQerrorMessage(c), o->why, sizeof o->why);
    PQfinish(c);
  }
  PQclear(r);
  free(pc);
}

/* A new opening of pc's connection (one reference, the caller's). */
static struct opening *opening_new(struct pg_store *s, struct pgconn *pc) {
  struct opening *o = mem_calloc(1, sizeof *o);
  pthread_mutex_init(&o->mu, NULL);
  pthread_cond_init(&o->cv, NULL);
  o->refs = 1;
  o->url = mem_strdup(s->url);
  snprintf(o->app, sizeof o->app, "moonloop %s (pid %ld on %s)", pc->role, (long)getpid(),
           proc_hostname());
  o->reader = pc->reader;
  o->durability = s->durability;
  return o;
}

/* Drop a reference to o; the last frees it (and a connection no one took). */
static void opening_drop(struct opening *o) {
  pthread_mutex_lock(&o->mu);
  int last = --o->refs == 0;
  pthread_mutex_unlock(&o->mu);
  if (!last) return;
  if (o->c) PQfinish(o->c);
  pthread_mutex_destroy(&o->mu);
  pthread_cond_destroy(&o->cv);
  free(o->url);
  free(o);
}

/* Put the connection c (set up) in place as pc's. */
static void conn_install(struct pg_store *s, struct pgconn *pc, PGconn *c) {
  if (pc->c) PQfinish(pc->c);
  pc->c = c;
  pc->opened = 1;
  pc->nstmts = 0;
  pc->silent = 0;
  pc->why[0] = 0;
  /* Whatever was sent while the reader was away counts as news. */
  if (pc->reader) s->notified++, s->others++;
  else atomic_store(&s->writer_pid, PQbackendPID(c));
}

/* The error of an opening that failed, into e (its reason kept in pc->why). */
static int opening_err(struct pg_store *s, struct pgconn *pc, const struct opening *o, err_t *e) {
  snprintf(pc->why, sizeof pc->why, "%s", o->why);
  if (o->setup)
    return err_set(e, o->code, "store: setting up the session on PostgreSQL (%s): %s", s->shown,
                   o->why);
  return err_set(e, ERR_BUSY, "cannot connect to PostgreSQL (%s): %s", s->shown, o->why);
}

/* Open pc's connection here and now (conn_make). */
static int conn_open(struct pg_store *s, struct pgconn *pc, err_t *e) {
  struct opening *o = opening_new(s, pc);
  if (pc->c) PQfinish(pc->c);
  pc->c = NULL;
  conn_make(o);
  int rc = 0;
  if (o->c) conn_install(s, pc, o->c), o->c = NULL;
  else rc = opening_err(s, pc, o, e);
  opening_drop(o);
  return rc;
}

/* The thread that opens a connection again (reopen). */
static void *opening_main(void *arg) {
  struct opening *o = arg;
  conn_make(o);
  pthread_mutex_lock(&o->mu);
  o->done = 1;
  pthread_cond_broadcast(&o->cv);
  pthread_mutex_unlock(&o->mu);
  opening_drop(o);
  return NULL;
}

/* How long the writer waits for its connection being opened again before
** its caller hears the server cannot be reached (ms): a server that is up
** answers well within it, so a commit after a restart goes through; one
** that does not answer leaves the commit thread free for the next try. */
#define PG_WRITER_WAIT_MS 1000

/* store__pg_ensure for a connection that was open and broke. Opening it
** again can take connect_timeout (10 s) when the server accepts
** connections and does not answer them (a stopped or overloaded
** postmaster, a network dropping packets): the reader serves the engine's
** loop (the API's reads, LISTEN), which must never wait that long, and
** the writer's commit thread must not either, or the writes waiting for it
** would hear nothing until then. So it is opened on a thread of its own:
** the reader does not wait for it, the writer PG_WRITER_WAIT_MS at most,
** and until it is open every call fails at once, saying the database
** cannot be reached (the API answers 503); the call that finds it open
** puts it in place. The reader tries again a second after a failed try at
** the soonest (the writer's callers have their own back-off). */
static int reopen(struct pg_store *s, struct pgconn *pc, err_t *e) {
  struct opening *o = pc->opening;
  int64_t now = units_now_ms();
  if (!o) {
    if (pc->reader && now < pc->retry_at)
      return err_set(e, ERR_BUSY, "cannot connect to PostgreSQL (%s): %s (tried again in %lld ms)",
                     s->shown, *pc->why ? pc->why : "no answer", (long long)(pc->retry_at - now));
    if (pc->c) PQfinish(pc->c); /* broken */
    pc->c = NULL;
    o = opening_new(s, pc);
    o->refs = 2;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int failed = pthread_create(&t, &attr, opening_main, o);
    pthread_attr_destroy(&attr);
    if (failed) {
      /* No thread to be had: open it here. */
      opening_drop(o);
      opening_drop(o);
      return conn_open(s, pc, e);
    }
    pc->opening = o;
  }
  pthread_mutex_lock(&o->mu);
  if (!pc->reader && !o->done) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += PG_WRITER_WAIT_MS / 1000;
    until.tv_nsec += (PG_WRITER_WAIT_MS % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    while (!o->done && pthread_cond_timedwait(&o->cv, &o->mu, &until) != ETIMEDOUT) {
    }
  }
  int done = o->done;
  PGconn *c = done ? o->c : NULL; /* the thread's to write until done */
  if (done) o->c = NULL;
  pthread_mutex_unlock(&o->mu);
  if (!done)
    return err_set(e, ERR_BUSY, "cannot connect to PostgreSQL (%s): %s", s->shown,
                   *pc->why ? pc->why : "the connection was lost, and is being opened again");
  pc->opening = NULL;
  int rc = 0;
  if (c) {
    conn_install(s, pc, c);
  } else {
    rc = opening_err(s, pc, o, e);
    pc->retry_at = units_now_ms() + 1000; /* the writer's tries are paced by its callers */
  }
  opening_drop(o);
  return rc;
}

/* See store_pg_db.h. The first connection is opened here and now (a
** command waits for it); one that broke, on a thread (reopen). */
int store__pg_ensure(struct pg_store *s, struct pgconn *pc, err_t *e) {
  if (pc->c && PQstatus(pc->c) == CONNECTION_OK) return 0;
  if (pc->opened) return reopen(s, pc, e);
  return conn_open(s, pc, e);
}

/* A statement's parameters as libpq takes them: numbers printed into num,
** text repaired into fixed when it is not valid UTF-8. */
#define PG_PARAMS 24
struct pgparams {
  const char *v[PG_PARAMS];
  char num[PG_PARAMS][24];
  char *fixed[PG_PARAMS];
};

/* Text that is not valid UTF-8, with each byte that does not start valid
** UTF-8 replaced by U+FFFD (as the reads show it from SQLite); NULL when
** it is valid (or out of memory: it then goes as it is, and PostgreSQL
** says what is wrong). PostgreSQL refuses invalid UTF-8 in text. */
static char *utf8_repair(const char *s) {
  size_t len = strlen(s);
  if (jsontext_utf8_valid(s, len)) return NULL;
  buf_t b = BUF_INIT;
  for (size_t i = 0; i < len;) {
    size_t ok = jsontext_utf8_prefix(s + i, len - i);
    buf_add(&b, s + i, ok);
    i += ok;
    if (i < len) {
      buf_add(&b, "\xEF\xBF\xBD", 3);
      i++;
    }
  }
  return buf_take(&b);
}

/* Lay v[0..nv) out as libpq's text parameters. */
static void params_of(struct pgparams *p, const struct store_val *v, int nv) {
  for (int i = 0; i < nv && i < PG_PARAMS; i++) {
    p->fixed[i] = NULL;
    switch (v[i].type) {
    case STORE_V_TEXT:
      p->fixed[i] = utf8_repair(v[i].s);
      p->v[i] = p->fixed[i] ? p->fixed[i] : v[i].s;
      break;
    case STORE_V_INT:
      snprintf(p->num[i], sizeof p->num[i], "%lld", (long long)v[i].i);
      p->v[i] = p->num[i];
      break;
    default: p->v[i] = NULL; break;
    }
  }
}

static void params_free(struct pgparams *p, int nv) {
  for (int i = 0; i < nv && i < PG_PARAMS; i++) free(p->fixed[i]);
}

/* The name of pc's prepared statement for key (preparing sql as it when
** new), or NULL with e filled. */
static const char *prepared(struct pg_store *s, struct pgconn *pc, const void *key,
                            const char *sql, const char *what, err_t *e) {
  for (int i = 0; i < pc->nstmts; i++)
    if (pc->stmts[i].key == key) return pc->stmts[i].name;
  if (pc->nstmts == PG_STMTS) {
    /* Only SQL made on the fly could fill the table: start it again. */
    PGresult *r = store__pg_exec_raw(pc, "DEALLOCATE ALL");
    PQclear(r);
    pc->nstmts = 0;
  }
  int i = pc->nstmts;
  snprintf(pc->stmts[i].name, sizeof pc->stmts[i].name, "s%d", i);
  PGresult *r = prepare_raw(pc, pc->stmts[i].name, sql);
  int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
  if (!ok) store__pg_err(s, pc, r, what, e);
  PQclear(r);
  if (!ok) return NULL;
  pc->stmts[i].key = key;
  pc->nstmts++;
  return pc->stmts[i].name;
}

/* See store_pg_db.h. */
PGresult *store__pg_run(struct pg_store *s, struct pgconn *pc, const void *key, const char *sql,
                        const struct store_val *v, int nv, const char *what, err_t *e) {
  if (nv > PG_PARAMS) {
    err_set(e, ERR_INTERNAL, "store: %s: %d parameters, at most %d", what, nv, PG_PARAMS);
    return NULL;
  }
  if (store__pg_ensure(s, pc, e)) return NULL;
  const char *name = prepared(s, pc, key ? key : sql, sql, what, e);
  if (!name) return NULL;
  struct pgparams p;
  params_of(&p, v, nv);
  PGresult *r = exec_prepared_raw(pc, name, nv, p.v);
  params_free(&p, nv);
  ExecStatusType st = PQresultStatus(r);
  if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) return r;
  store__pg_err(s, pc, r, what, e);
  PQclear(r);
  return NULL;
}

/* See store_pg_db.h. */
int store__pg_do(struct pg_store *s, struct pgconn *pc, const char *sql, const struct store_val *v,
                 int nv, int64_t *changed, const char *what, err_t *e) {
  PGresult *r = store__pg_run(s, pc, NULL, sql, v, nv, what, e);
  if (!r) return e->code;
  if (changed) *changed = atoll(PQcmdTuples(r));
  PQclear(r);
  return 0;
}

/* See store_pg_db.h. */
int store__pg_exec(struct pg_store *s, struct pgconn *pc, const char *sql, const char *what,
                   err_t *e) {
  if (store__pg_ensure(s, pc, e)) return e->code;
  PGresult *r = store__pg_exec_raw(pc, sql);
  ExecStatusType st = PQresultStatus(r);
  int rc = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK ? 0 : store__pg_err(s, pc, r, what, e);
  PQclear(r);
  return rc;
}

/* See store_pg_db.h. */
char *store__pg_dup(const PGresult *res, int r, int i) {
  return PQgetisnull(res, r, i) ? NULL : mem_strdup(PQgetvalue(res, r, i));
}

int64_t store__pg_i64(const PGresult *res, int r, int i) {
  return PQgetisnull(res, r, i) ? 0 : atoll(PQgetvalue(res, r, i));
}

/* ---- write transactions ------------------------------------------------------ */

/* Who holds the write lock, as words in buf (", held by moonloop writer
** (pid 12 on host) (PostgreSQL backend 34, idle in transaction for 8s)"),
** "" when nobody visible does. Asked outside any transaction. */
static void lock_holder(struct pg_store *s, char *buf, size_t n) {
  buf[0] = 0;
  char sql[700];
  snprintf(sql, sizeof sql,
           "SELECT a.application_name, a.pid, a.state, extract(epoch FROM now() - a.state_change)::int"
           " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory'"
           " AND l.granted AND l.classid = %lld AND l.objid = %lld AND l.objsubid = 1"
           " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
           " ORDER BY a.state_change LIMIT 1",
           (long long)(PG_WRITE_LOCK >> 32), (long long)(PG_WRITE_LOCK & 0xffffffffLL));
  PGresult *r = store__pg_exec_raw(&s->w, sql);
  if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
    snprintf(buf, n, ", held by %s (PostgreSQL backend %s, %s for %ss)",
             *PQgetvalue(r, 0, 0) ? PQgetvalue(r, 0, 0) : "a client", PQgetvalue(r, 0, 1),
             PQgetvalue(r, 0, 2), PQgetvalue(r, 0, 3));
  PQclear(r);
}

/* See store_pg_db.h: BEGIN, the transaction's id and the write lock in
** one round trip. The lock is waited for in the server, which queues its
** requests in order (a writer that wants it whole is not starved by a
** stream of shared holders), for at most the session's lock_timeout
** (10 s). A client frozen (SIGSTOP) while it holds the lock, or as it is
** granted, has its transaction ended by the server after 10 s idle
** (idle_in_transaction_session_timeout): the others wait that long at
** most, then go on. */
int store__pg_begin(struct pg_store *s, int lock, err_t *e) {
  static const char *const sql[] = {
    [PG_LOCK_NONE] = "BEGIN; SELECT txid_current()",
    [PG_LOCK_ALL] = "BEGIN; SELECT txid_current(), pg_advisory_xact_lock(" PG_LOCK_TEXT ")",
    [PG_LOCK_SHARED] =
      "BEGIN; SELECT txid_current(), pg_advisory_xact_lock_shared(" PG_LOCK_TEXT ")",
  };
  if (store__pg_ensure(s, &s->w, e)) return e->code;
  PGresult *r = store__pg_exec_raw(&s->w, sql[lock]);
  int ok = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
  const char *state = ok ? NULL : PQresultErrorField(r, PG_DIAG_SQLSTATE);
  int timed_out = state && !strcmp(state, "55P03");
  if (ok) s->xid = atoll(PQgetvalue(r, 0, 0));
  else if (!timed_out) store__pg_err(s, &s->w, r, "beginning a transaction", e);
  PQclear(r);
  if (ok) return 0;
  store__pg_rollback(s);
  if (timed_out) {
    char who[400];
    lock_holder(s, who, sizeof who);
    return err_set(e, ERR_BUSY, "store: beginning a transaction: the database's write lock "
                   "was not free for 10 s%s: a process stopped inside a commit holds it until "
                   "it is continued or killed, or PostgreSQL ends its idle transaction (10 s)",
                   who);
  }
  return e->code;
}

/* See store_pg_db.h. */
void store__pg_rollback(struct pg_store *s) {
  if (!s->w.c || PQstatus(s->w.c) != CONNECTION_OK) return;
  if (PQtransactionStatus(s->w.c) == PQTRANS_IDLE) return;
  PGresult *r = store__pg_exec_raw(&s->w, "ROLLBACK");
  PQclear(r);
}

/* See store_pg_db.h. A COMMIT that an aborted transaction answers with
** ROLLBACK is a failure too. */
int store__pg_commit_tx(struct pg_store *s, int notify, err_t *e) {
  PGresult *r = store__pg_exec_raw(&s->w, notify ? "NOTIFY moonloop; COMMIT" : "COMMIT");
  int ok = PQresultStatus(r) == PGRES_COMMAND_OK && !strcmp(PQcmdStatus(r), "COMMIT");
  if (!ok) {
    if (PQresultStatus(r) == PGRES_COMMAND_OK)
      err_set(e, ERR_IO, "store: committing: PostgreSQL rolled the transaction back");
    else
      store__pg_err(s, &s->w, r, "committing", e);
  }
  PQclear(r);
  if (!ok) store__pg_rollback(s);
  return ok ? 0 : e->code;
}

/* What became of transaction xid, asked on a new connection: 1 committed,
** 0 aborted (or unknown to the server: it never got its COMMIT through),
** -1 when the server cannot be asked (e filled). An xid still "in
** progress" is waited for: its backend may still be finishing it. A server
** that does not answer is asked again for up to `patience` tries, half a
** second apart (a restart takes a few seconds). */
static int xid_outcome(struct pg_store *s, int64_t xid, int patience, err_t *e) {
  int64_t t0 = units_now_ms();
  for (int tries = 0;; tries++) {
    if (store__pg_ensure(s, &s->w, e)) {
      /* A try that hangs until connect_timeout counts for its time. */
      if (tries >= patience || units_now_ms() - t0 >= (int64_t)patience * 500) return -1;
      struct timespec ts = {0, 500 * 1000000L};
      nanosleep(&ts, NULL);
      continue;
    }
    char sql[96];
    snprintf(sql, sizeof sql, "SELECT txid_status(%lld)", (long long)xid);
    PGresult *r = store__pg_exec_raw(&s->w, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
      /* "transaction ID ... is in the future": the server started again
      ** from a WAL that never got that transaction's commit. */
      const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
      if (state && !strcmp(state, "22023")) {
        PQclear(r);
        return 0;
      }
      store__pg_err(s, &s->w, r, "looking up a commit's outcome", e);
      PQclear(r);
      return -1;
    }
    char status[32] = "";
    if (PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
      snprintf(status, sizeof status, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    if (!strcmp(status, "committed")) return 1;
    if (strcmp(status, "in progress") || tries >= 100) return 0;
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
  }
}

/* ---- the core journal entries ---------------------------------------------------- */

/* The writer's statements for journal entries of the core kinds, made
** from journal.h's field lists as store_sqlite.c makes its own: their
** parameters are the kind's COL fields, $1 the first in the list's order.
** An INSERT is "head(columns) VALUES($1, ...)"; conflict, when set, is the
** key of an upsert whose other columns take the new row's values; tail
** follows; sql, when set, is the whole statement. A tail or a statement
** names a field as :name. Each is made once (core_sql), and a :name that
** is no COL field of its kind is refused when the store opens. */
static const struct pgwrow {
  enum jkind kind;
  const char *head, *conflict, *tail, *sql;
} pgwrows[] = {
  {J_RUN_NEW, "INSERT INTO runs", NULL, "", NULL},
  /* A run that completes gets the summary of its steps in the same write;
  ** a failed or cancelled one gets it from store__pg_run_ended. */
  {J_RUN_SET, NULL, NULL, NULL,
   "UPDATE runs SET status = :status, output = COALESCE(:output, output),"
   " error = COALESCE(:error, error), started_at = COALESCE(:started_at, started_at),"
   " ended_at = COALESCE(:ended_at, ended_at), wake_at = :wake_at,"
   " owner = CASE WHEN :status IN (" VOCAB_RUN_ENDED_SQL ") THEN NULL ELSE owner END,"
   " (steps, failed_steps, retries, tokens) = (SELECT " PG_STEP_SUMS(":status = 'completed'")
   " FROM steps WHERE run_id = :run_id AND :status = 'completed')"
   " WHERE id = :run_id"},
  {J_STEP, "INSERT INTO steps", "run_id, seq", "", NULL},
  {J_ATTEMPT, "INSERT INTO attempts", "run_id, seq, n", "", NULL},
  {J_LOG, "INSERT INTO logs", NULL, "", NULL},
  {J_VERSION, "INSERT INTO versions", NULL,
   " ON CONFLICT(version) DO UPDATE SET triggers = COALESCE(excluded.triggers, versions.triggers)",
   NULL},
  {J_SKILL, "INSERT INTO skills", NULL,
   " ON CONFLICT(id) DO UPDATE SET version = :version, file = COALESCE(:file, skills.file),"
   " description = :description, triggers = :triggers, error = :error, updated_at = :updated_at,"
   " scopes = :scopes, limits = :limits",
   NULL},
};
#define NPGWROWS (sizeof pgwrows / sizeof pgwrows[0])

/* Whether c can be part of a field's name. */
static int name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* Whether name is one of list's names ("run_id, seq"). */
static int in_list(const char *list, const char *name) {
  size_t len = strlen(name);
  for (const char *p = list; *p;) {
    size_t n = strcspn(p, ", ");
    if (n == len && !memcmp(p, name, len)) return 1;
    p += n;
    p += strspn(p, ", ");
  }
  return 0;
}

/* The parameter ($k) of the COL field called name (len bytes) of kind k,
** or 0 when it has none. */
static int col_param(const struct journal_kind *k, const char *name, size_t len) {
  int n = 0;
  for (size_t i = 0; i < k->nfields; i++) {
    if (k->fields[i].use != JOURNAL_COL) continue;
    n++;
    if (strlen(k->fields[i].name) == len && !memcmp(k->fields[i].name, name, len)) return n;
  }
  return 0;
}

/* The SQL of r, malloc'd (its :names turned into $k), or NULL with e
** filled for a :name that is no COL field of its kind. */
static char *wrow_sql(const struct pgwrow *r, err_t *e) {
  const struct journal_kind *k = &journal_kinds[r->kind];
  buf_t text = BUF_INIT;
  if (r->sql) {
    buf_puts(&text, r->sql);
  } else {
    buf_t cols = BUF_INIT, vals = BUF_INIT, set = BUF_INIT;
    int n = 0;
    for (size_t i = 0; i < k->nfields; i++) {
      const struct journal_field *f = &k->fields[i];
      if (f->use != JOURNAL_COL) continue;
      const char *sep = n++ ? ", " : "";
      buf_printf(&cols, "%s%s", sep, f->name);
      buf_printf(&vals, "%s:%s", sep, f->name);
      /* An upsert's other columns take the new row's values. */
      if (r->conflict && !in_list(r->conflict, f->name))
        buf_printf(&set, "%s%s = excluded.%s", set.len ? ", " : "", f->name, f->name);
    }
    buf_printf(&text, "%s(%s) VALUES(%s)", r->head, buf_str(&cols), buf_str(&vals));
    if (r->conflict) buf_printf(&text, " ON CONFLICT(%s) DO UPDATE SET %s", r->conflict, buf_str(&set));
    buf_puts(&text, r->tail);
    buf_free(&cols), buf_free(&vals), buf_free(&set);
  }
  buf_t out = BUF_INIT;
  const char *t = buf_str(&text);
  for (size_t i = 0; t[i];) {
    if (t[i] == ':' && t[i + 1] == ':') { /* a cast: as it is */
      buf_add(&out, t + i, 2);
      i += 2;
      continue;
    }
    if (t[i] != ':' || !name_char(t[i + 1])) {
      buf_add(&out, t + i, 1);
      i++;
      continue;
    }
    size_t len = 0;
    while (name_char(t[i + 1 + len])) len++;
    int p = col_param(k, t + i + 1, len);
    if (!p) {
      err_set(e, ERR_INTERNAL, "store: the statement that writes '%s' entries names :%.*s, "
              "which is no column of journal.h's list", k->name, (int)len, t + i + 1);
      buf_free(&text), buf_free(&out);
      return NULL;
    }
    buf_printf(&out, "$%d", p);
    i += 1 + len;
  }
  buf_free(&text);
  return buf_take(&out);
}

/* The statements of pgwrows, by kind, made once for the process. */
static char *core_sqls[J_COUNT];
static pthread_once_t core_once = PTHREAD_ONCE_INIT;
static err_t core_err;
static void make_core_sqls(void) {
  for (size_t i = 0; i < NPGWROWS && !core_err.code; i++)
    core_sqls[pgwrows[i].kind] = wrow_sql(&pgwrows[i], &core_err);
}

/* 0 once every core statement is made; ERR_INTERNAL naming a mistake. */
static int core_sql_check(err_t *e) {
  pthread_once(&core_once, make_core_sqls);
  if (core_err.code) return err_set(e, core_err.code, "%s", core_err.msg);
  return 0;
}

/* Write row, a struct of kind, with its kind's statement. */
static int write_row(struct pg_store *s, enum jkind kind, const void *row, const char *what,
                     err_t *e) {
  const struct journal_kind *k = &journal_kinds[kind];
  struct store_val v[32];
  int n = 0;
  for (size_t i = 0; i < k->nfields && n < 32; i++) {
    const struct journal_field *f = &k->fields[i];
    if (f->use != JOURNAL_COL) continue;
    const char *at = (const char *)row + f->offset;
    switch (f->type) {
    case JOURNAL_TEXT: v[n++] = SV_TEXT(*(const char *const *)at); break;
    case JOURNAL_INT: v[n++] = SV_INT(*(const int *)at); break;
    case JOURNAL_I64: v[n++] = SV_INT(*(const int64_t *)at); break;
    case JOURNAL_TIME: v[n++] = SV_TIME(*(const int64_t *)at); break;
    default: v[n++] = sv_text(NULL); break; /* never a column */
    }
  }
  PGresult *r = store__pg_run(s, &s->w, &core_sqls[kind], core_sqls[kind], v, n, what, e);
  if (!r) return e->code;
  PQclear(r);
  return 0;
}

/* See store_pg_db.h: a run without an entry point runs "run"; without a
** trigger, its trigger is "{}". */
int store__pg_put_run(struct pg_store *s, const struct run_row *r, const char *what, err_t *e) {
  struct run_row row = *r;
  if (!row.entry) row.entry = "run";
  if (!row.trigger) row.trigger = "{}";
  return write_row(s, J_RUN_NEW, &row, what, e);
}

/* J_RUN_NEW of a run that a run creates (a child, an on_failure run),
** whose id the creator may derive from its own step (store_sqlite.c's
** put_run_of_run): a run with that id there already is not created twice;
** the entry's result is then its id, it is not the committer's for
** fencing, and if the committer held it, it is released for a claim. */
static int put_run_of_run(struct pg_store *s, const struct jentry *je, err_t *e) {
  const struct run_row *r = &je->u.run;
  struct store_val v[2] = {SV_TEXT(r->id), SV_TEXT(r->owner)};
  PGresult *q = store__pg_run(s, &s->w, NULL, "SELECT 1 FROM runs WHERE id = $1", v, 1,
                              "looking up a run", e);
  if (!q) return e->code;
  int there = PQntuples(q) > 0;
  PQclear(q);
  if (!there) return store__pg_put_run(s, r, "creating a run", e);
  if (store__pg_do(s, &s->w, "UPDATE runs SET owner = NULL WHERE id = $1 AND owner = $2", v, 2,
                   NULL, "releasing a run", e))
    return e->code;
  store__fence_remove(&s->fence, r->id);
  journal_set_result(je, mem_strdup(r->id));
  return 0;
}

/* Write one journal entry inside the open transaction: the core kinds
** here, the others through store_pg_flow.c. */
static int write_entry(struct pg_store *s, const struct jentry *je, err_t *e) {
  switch (je->kind) {
  case J_RUN_NEW:
    if (je->u.run.idem) return store__pg_put_keyed_run(s, je, e);
    if (je->u.run.by_run) return put_run_of_run(s, je, e);
    return store__pg_put_run(s, &je->u.run, "creating a run", e);
  case J_RUN_SET: {
    const struct run_set *r = &je->u.set;
    if (r->clear_crashes) {
      struct store_val v[1] = {SV_TEXT(r->run_id)};
      if (store__pg_do(s, &s->w, "UPDATE runs SET crashes = 0 WHERE id = $1", v, 1, NULL,
                       "updating a run", e))
        return e->code;
      if (!r->status) return 0;
    }
    if (write_row(s, J_RUN_SET, r, "updating a run", e)) return e->code;
    if (store__is_terminal(r->status)) return store__pg_run_ended(s, r->run_id, r->status, e);
    return 0;
  }
  case J_STEP: return write_row(s, J_STEP, &je->u.step, "recording a step", e);
  case J_ATTEMPT: return write_row(s, J_ATTEMPT, &je->u.attempt, "recording an attempt", e);
  case J_LOG: return write_row(s, J_LOG, &je->u.log, "recording a log line", e);
  case J_VERSION: return write_row(s, J_VERSION, &je->u.version, "recording a skill version", e);
  case J_SKILL:
    if (je->u.skill.op != SKILL_PUT) return store__pg_skill_change(s, &je->u.skill, e);
    {
      /* A scope another live skill gives another limit: refused here. */
      struct skill_row refused;
      char why[1600];
      int clash = store__scope_clash((store_t *)(void *)s, je, &refused, why, sizeof why, e);
      if (clash) return clash < 0 ? e->code : store__pg_skill_change(s, &refused, e);
    }
    if (write_row(s, J_SKILL, &je->u.skill, "registering a skill", e)) return e->code;
    return store__limits_changed((store_t *)(void *)s, &je->u.skill, e);
  default:
    return store__pg_write_flow(s, je, e);
  }
}

/* ---- fencing (store_sqlite.c's, in this dialect) ---- */

/* 0 when owner holds run_id; else ERR_CONFLICT, saying who does. */
static int fence_check(struct pg_store *s, const char *owner, const char *run_id, err_t *e) {
  if (store__fence_find(&s->fence, run_id) >= 0) return 0;
  struct store_val v[1] = {SV_TEXT(run_id)};
  PGresult *r = store__pg_run(s, &s->w, NULL, "SELECT owner, status FROM runs WHERE id = $1", v, 1,
                              "checking a run's owner", e);
  if (!r) return e->code;
  int found = PQntuples(r) == 1;
  const char *holder = found && !PQgetisnull(r, 0, 0) ? PQgetvalue(r, 0, 0) : NULL;
  int rc = 0;
  if (holder && !strcmp(holder, owner))
    store__fence_add(&s->fence, run_id);
  else if (!found)
    rc = err_set(e, ERR_CONFLICT, "fenced: run %s does not exist (this process is %s)", run_id,
                 owner);
  else
    rc = err_set(e, ERR_CONFLICT, "fenced: run %s is %s, held by %s, not by this process (%s)",
                 run_id, PQgetvalue(r, 0, 1), holder ? holder : "no process", owner);
  PQclear(r);
  return rc;
}

/* The fencing check of one entry. */
static int fence_entry(struct pg_store *s, const char *owner, const struct jentry *je, err_t *e) {
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

/* Renew owner's lease until expires inside the open transaction:
** ERR_CONFLICT when it is gone. Found expired (not yet reaped), the runs
** known to be its own are checked again. */
static int renew_lease(struct pg_store *s, const char *owner, int64_t expires, err_t *e) {
  if (strcmp(s->fence.owner, owner)) {
    store__fence_clear(&s->fence);
    snprintf(s->fence.owner, sizeof s->fence.owner, "%s", owner);
  }
  struct store_val v[2] = {SV_TEXT(owner), SV_INT(expires)};
  /* The expiry it had, returned by the update that renews it. */
  PGresult *r = store__pg_run(s, &s->w, NULL,
    "UPDATE leases SET expires_at = $2 FROM (SELECT expires_at AS was FROM leases"
    " WHERE owner = $1) old WHERE owner = $1 RETURNING old.was", v, 2, "renewing the lease", e);
  if (!r) return e->code;
  int found = PQntuples(r) == 1;
  int64_t was = found ? store__pg_i64(r, 0, 0) : 0;
  PQclear(r);
  if (!found)
    return err_set(e, ERR_CONFLICT, "lease lost: another process took over the runs of %s",
                   owner);
  if (fault_hit(FAULT_LEASE_REFUSED))
    return err_set(e, ERR_CONFLICT, "lease lost: another process took over the runs of %s "
                   "(fault injected: lease_refused)", owner);
  if (was < units_now_ms()) {
    store__fence_clear(&s->fence);
    snprintf(s->fence.owner, sizeof s->fence.owner, "%s", owner);
  }
  return 0;
}

/* How a group takes the write lock: shared when it only records the
** committer's own runs (their steps, attempts, logs and states, new runs
** without a key) and the registry's upserts, which no other process's
** transaction reads to decide anything: such groups of several engines
** commit side by side. Whole when it meets other processes' writes
** (events, waits, child outcomes, cancellation, slots, cron ticks, keyed
** runs), where the store's reasoning needs one writer at a time. Fencing
** holds either way: every change of a run's owner but a claim (which
** takes only unowned runs) takes the lock whole, and the group renews its
** lease row first. */
static int group_mode(const journal_t *j) {
  for (size_t i = 0, n = journal_count(j); i < n; i++) {
    const struct jentry *je = journal_entry(j, i);
    if (je->dropped) continue;
    switch (je->kind) {
    case J_RUN_NEW:
      if (je->u.run.idem) return PG_LOCK_ALL;
      break;
    case J_SKILL:
      /* Scopes are judged against the other skills' (store__scope_clash):
      ** two engines registering at once must not both pass. New limits
      ** hand room on to queued runs (store__limits_changed), as a release. */
      if (je->u.skill.op == SKILL_PUT && (je->u.skill.scopes || je->u.skill.limits))
        return PG_LOCK_ALL;
      break;
    case J_RUN_SET: case J_STEP: case J_ATTEMPT: case J_LOG: case J_VERSION: break;
    default: return PG_LOCK_ALL;
    }
  }
  return PG_LOCK_SHARED;
}

/* Whether a run that j ends holds concurrency slots or queue places
** (1), not (0), or -1 with e filled; inside the transaction begun. */
static int ends_holding_slots(struct pg_store *s, const journal_t *j, err_t *e) {
  cJSON *ids = NULL;
  for (size_t i = 0, n = journal_count(j); i < n; i++) {
    const struct jentry *je = journal_entry(j, i);
    if (je->dropped || je->kind != J_RUN_SET || !store__is_terminal(je->u.set.status)) continue;
    if (!ids) ids = cJSON_CreateArray();
    cJSON_AddItemToArray(ids, cJSON_CreateString(je->u.set.run_id));
  }
  if (!ids) return 0;
  char *list = jsontext_print_text(ids);
  cJSON_Delete(ids);
  struct store_val v[1] = {SV_TEXT(list)};
  PGresult *r = store__pg_run(s, &s->w, NULL,
    "SELECT 1 FROM slots WHERE run_id IN (SELECT json_array_elements_text($1::json))"
    " UNION ALL SELECT 1 FROM slot_queue WHERE run_id IN"
    " (SELECT json_array_elements_text($1::json)) LIMIT 1", v, 1, "finding slots", e);
  free(list);
  if (!r) return -1;
  int held = PQntuples(r) > 0;
  PQclear(r);
  return held;
}

/* See store.h: settle a commit left in doubt, then renew the lease
** (fencing), write every entry, notify, commit; roll back on any failure.
** When the connection is lost during COMMIT, the transaction's outcome is
** asked of the server (again on the next try if it cannot be asked now):
** committed, the group counts as written, with the answers it got. */
static int pg_commit(store_t *st, const journal_t *j, err_t *e) {
  struct pg_store *s = pg_of(st);
  if (s->doubt_xid) {
    int done = xid_outcome(s, s->doubt_xid, 0, e);
    if (done < 0)
      return err_prefix(e, STORE_IN_DOUBT "whether the last commit went through is not known "
                        "yet (its answer was lost)");
    int same = s->doubt_j == j;
    s->doubt_xid = 0;
    s->doubt_j = NULL;
    if (done && same) return 0;
  }
  int mode = group_mode(j);
  if (store__pg_begin(s, mode, e)) return e->code;
  if (mode == PG_LOCK_SHARED) {
    /* A run that ends hands its slots on to other engines' runs: then the
    ** group takes the whole lock after all. Slots are taken only under
    ** it, so none can appear while the shared lock is held. */
    int held = ends_holding_slots(s, j, e);
    if (held < 0) goto fail;
    if (held) {
      store__pg_rollback(s);
      if (store__pg_begin(s, PG_LOCK_ALL, e)) return e->code;
    }
  }
  int64_t xid = s->xid;
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
  int ended = 0, wrote = 0;
  /* The figures' rollup gets the group's run ends in one write per skill
  ** and hour, after the entries (under its lock until the commit). */
  store__rollup_gather((store_t *)(void *)s);
  for (size_t i = 0, n = journal_count(j); i < n; i++) {
    const struct jentry *je = journal_entry(j, i);
    if (je->dropped) continue;
    if (owner && fence_entry(s, owner, je, e)) {
      if (e->code == ERR_CONFLICT) journal_set_fenced(j, (long)i);
      goto fail;
    }
    if (write_entry(s, je, e)) goto fail;
    wrote = 1;
    ended |= je->kind == J_RUN_SET && store__is_terminal(je->u.set.status);
  }
  if (store__rollup_flush((store_t *)(void *)s, e)) goto fail;
  fault_delay(FAULT_COMMIT);
  if (fault_hit(FAULT_COMMIT_FAIL)) {
    err_set(e, ERR_IO, "store: committing: the transaction failed (fault injected: commit_fail)");
    goto fail;
  }
  if (store__pg_commit_tx(s, wrote, e)) {
    if (PQstatus(s->w.c) != CONNECTION_BAD) goto fail_done;
    /* The COMMIT went out and no answer came back: ask what became of it. */
    err_t e2;
    int done = xid_outcome(s, xid, 10, &e2);
    if (done < 0) {
      s->doubt_xid = xid;
      s->doubt_j = j;
      err_set(e, ERR_IO, STORE_IN_DOUBT "store: committing: the connection to PostgreSQL (%s) was lost while "
              "committing, and whether it committed is not known yet (it is looked up before "
              "the next commit): %s", s->shown, e2.msg);
      goto fail_done;
    }
    if (!done) goto fail_done;
  }
  /* Runs that ended are no one's now. */
  for (size_t i = 0, n = ended ? journal_count(j) : 0; i < n; i++) {
    const struct jentry *je = journal_entry(j, i);
    if (!je->dropped && je->kind == J_RUN_SET && store__is_terminal(je->u.set.status))
      store__fence_remove(&s->fence, je->u.set.run_id);
  }
  return 0;
fail:
  store__rollup_drop((store_t *)(void *)s);
  store__pg_rollback(s);
fail_done:
  store__fence_clear(&s->fence);
  return e->code;
}

/* ---- leases and claiming work ---- */

/* A transaction of the statements sql[0..n) with $1 bound to arg, under
** the write lock; what names it in an error. */
static int tx_bound(struct pg_store *s, const char *const *sql, size_t n, const char *arg,
                    int notify, const char *what, err_t *e) {
  if (store__pg_begin(s, PG_LOCK_ALL, e)) return e->code;
  struct store_val v[1] = {SV_TEXT(arg)};
  for (size_t i = 0; i < n; i++)
    if (store__pg_do(s, &s->w, sql[i], v, 1, NULL, what, e)) {
      store__pg_rollback(s);
      return e->code;
    }
  return store__pg_commit_tx(s, notify, e);
}

/* See store.h. */
static int pg_lease_acquire(store_t *st, const struct lease *l, err_t *e) {
  struct pg_store *s = pg_of(st);
  struct store_val v[7] = {SV_TEXT(l->owner), SV_TEXT(l->kind), SV_TEXT(l->host), SV_INT(l->pid),
                           SV_INT(l->pid_start), SV_INT(units_now_ms()), SV_INT(l->expires_at)};
  static const char sql[] =
    "INSERT INTO leases(owner, kind, host, pid, pid_start, started_at, expires_at)"
    " VALUES($1,$2,$3,$4,$5,$6,$7) ON CONFLICT(owner) DO UPDATE SET kind = excluded.kind,"
    " host = excluded.host, pid = excluded.pid, pid_start = excluded.pid_start,"
    " started_at = excluded.started_at, expires_at = excluded.expires_at";
  if (store__pg_begin(s, PG_LOCK_ALL, e)) return e->code;
  if (store__pg_do(s, &s->w, sql, v, 7, NULL, "taking a lease", e)) {
    store__pg_rollback(s);
    return e->code;
  }
  return store__pg_commit_tx(s, 0, e);
}

/* Release the runs of owner and delete its lease, inside the open
** transaction. The runs keep their concurrency slots (store_sqlite.c's
** release_owner says why). */
static const char *const release_sql[] = {
  "UPDATE runs SET owner = NULL WHERE owner = $1", "DELETE FROM leases WHERE owner = $1",
};

/* See store.h. */
static int pg_lease_release(store_t *st, const char *owner, err_t *e) {
  return tx_bound(pg_of(st), release_sql, 2, owner, 1, "releasing a lease", e);
}

/* See store.h. (The crash record, not the reaping of a dead lease, says a
** run crashed the engine: a `kill -9` must never count against a run.) */
static int pg_count_crash(store_t *st, const char *run_id, err_t *e) {
  static const char *const sql[] = {
    "UPDATE runs SET crashes = crashes + 1 WHERE id = $1"
    " AND status NOT IN (" VOCAB_RUN_ENDED_SQL ")",
  };
  return tx_bound(pg_of(st), sql, 1, run_id, 0, "counting a crash", e);
}

/* Reap dead leases inside an open write transaction: how many, or a
** negative code. */
static int reap_locked(struct pg_store *s, const char *host, int64_t now, err_t *e) {
  PGresult *r = store__pg_run(s, &s->w, NULL,
    "SELECT owner, host, pid, pid_start, expires_at FROM leases", NULL, 0, "reading leases", e);
  if (!r) return e->code;
  int n = 0, rc = 0;
  for (int i = 0; i < PQntuples(r) && !rc; i++) {
    if (!store__lease_dead(PQgetvalue(r, i, 1), (long)store__pg_i64(r, i, 2),
                           store__pg_i64(r, i, 3), store__pg_i64(r, i, 4), host, now))
      continue;
    struct store_val v[1] = {SV_TEXT(PQgetvalue(r, i, 0))};
    if (store__pg_do(s, &s->w, release_sql[0], v, 1, NULL, "releasing a lease", e) ||
        store__pg_do(s, &s->w, release_sql[1], v, 1, NULL, "releasing a lease", e))
      rc = e->code;
    n++;
  }
  PQclear(r);
  return rc ? rc : n;
}

/* See store.h. */
static int pg_reap(store_t *st, const char *host, int64_t now, err_t *e) {
  struct pg_store *s = pg_of(st);
  if (store__pg_begin(s, PG_LOCK_ALL, e)) return e->code;
  int n = reap_locked(s, host, now, e);
  if (n < 0) {
    store__pg_rollback(s);
    return n;
  }
  if (store__pg_commit_tx(s, n > 0, e)) return e->code;
  return n;
}

/* 0 when owner holds a live lease (its row exists and has not expired at
** now), inside the open write transaction (store_sqlite.c's lease_live):
** ERR_CONFLICT ("lease lost") when the row is gone, ERR_BUSY when it
** expired and was not renewed yet. The row is kept (FOR SHARE) until the
** transaction ends: a reaper deleting it meanwhile waits, then releases
** what this transaction took. */
static int lease_live(struct pg_store *s, const char *owner, int64_t now, err_t *e) {
  struct store_val v[1] = {SV_TEXT(owner)};
  PGresult *r = store__pg_run(s, &s->w, NULL,
    "SELECT expires_at FROM leases WHERE owner = $1 FOR SHARE", v, 1, "reading a lease", e);
  if (!r) return e->code;
  int found = PQntuples(r) == 1;
  int64_t expires = found ? store__pg_i64(r, 0, 0) : 0;
  PQclear(r);
  if (!found)
    return err_set(e, ERR_CONFLICT, "lease lost: another process took over the runs of %s",
                   owner);
  if (expires <= now)
    return err_set(e, ERR_BUSY, "the lease of %s expired %lld ms ago and was not renewed yet: "
                   "it takes no runs until it is", owner, (long long)(now - expires));
  return 0;
}

/* Rows of STORE_CLAIM_COLS from res into a malloc'd array. */
static void rows_of(PGresult *res, struct run_row **rows, size_t *n) {
  int k = PQntuples(res);
  *rows = k ? mem_calloc((size_t)k, sizeof **rows) : NULL;
  *n = 0;
  struct store_cur c;
  store__pg_cur(&c, res);
  while (cur_next(&c) == 1) store__run_row(&c, &(*rows)[(*n)++], 1);
  /* c is not closed: res stays the caller's */
}

/* Add the ids of rows[0..n) to s->claim_doubt (a JSON array of run ids). */
static void doubt_add(struct pg_store *s, const struct run_row *rows, size_t n) {
  if (!n) return;
  cJSON *ids = s->claim_doubt ? cJSON_Parse(s->claim_doubt) : NULL;
  if (!cJSON_IsArray(ids)) cJSON_Delete(ids), ids = cJSON_CreateArray();
  for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(ids, cJSON_CreateString(rows[i].id));
  free(s->claim_doubt);
  s->claim_doubt = jsontext_print_text(ids);
  cJSON_Delete(ids);
}

/* See store.h: unowned unfinished runs, oldest first, locked with SKIP
** LOCKED so engines claiming at once take disjoint runs, without the
** write lock; only for a live lease of owner (lease_live).
**
** A claim whose COMMIT got no answer (the server crashed or stopped
** answering just then) may have committed: its runs are then owner's in
** the database, though the caller heard the claim fail and holds none of
** them, and no other engine takes a run from a live lease. Left so, they
** would stay queued for as long as owner lives. Their ids are kept
** (s->claim_doubt), and the next claims hand back those that owner holds
** in the database, until a claim commits with its answer. */
static int pg_claim(store_t *st, const char *owner, int limit, struct run_row **rows, size_t *n,
                    err_t *e) {
  struct pg_store *s = pg_of(st);
  *rows = NULL;
  *n = 0;
  if (store__pg_begin(s, PG_LOCK_NONE, e)) return e->code;
  if (lease_live(s, owner, units_now_ms(), e)) {
    store__pg_rollback(s);
    return e->code;
  }
  struct run_row *kept = NULL;
  size_t nkept = 0;
  if (s->claim_doubt) {
    /* Those of a claim in doubt that turned out to be owner's (read
    ** before this claim makes more runs owner's). */
    struct store_val dv[2] = {SV_TEXT(owner), SV_TEXT(s->claim_doubt)};
    PGresult *r = store__pg_run(s, &s->w, NULL,
      "SELECT " STORE_CLAIM_COLS " FROM runs WHERE owner = $1"
      " AND status IN ('queued','running','sleeping','waiting')"
      " AND id IN (SELECT json_array_elements_text($2::json))", dv, 2, "claiming runs", e);
    if (!r) {
      store__pg_rollback(s);
      return e->code;
    }
    rows_of(r, &kept, &nkept);
    PQclear(r);
  }
  struct store_val v[2] = {SV_TEXT(owner), SV_INT(limit)};
  PGresult *r = store__pg_run(s, &s->w, NULL,
    "UPDATE runs SET owner = $1 WHERE id IN (SELECT id FROM runs WHERE owner IS NULL"
    " AND status IN ('queued','running','sleeping','waiting') ORDER BY id LIMIT $2"
    " FOR UPDATE SKIP LOCKED) RETURNING " STORE_CLAIM_COLS, v, 2, "claiming runs", e);
  if (!r) {
    store_rows_free(kept, nkept);
    store__pg_rollback(s);
    return e->code;
  }
  rows_of(r, rows, n);
  PQclear(r);
  fault_delay(FAULT_CLAIM);
  if (store__pg_commit_tx(s, 0, e)) {
    /* Whether it committed is not known here (a server that answered
    ** with an error did not): whatever it took may be owner's now. */
    doubt_add(s, *rows, *n);
    store_rows_free(*rows, *n);
    store_rows_free(kept, nkept);
    *rows = NULL;
    *n = 0;
    return e->code;
  }
  if (nkept) {
    *rows = mem_realloc(*rows, (*n + nkept) * sizeof **rows);
    memcpy(*rows + *n, kept, nkept * sizeof *kept);
    *n += nkept;
    free(kept);
  }
  free(s->claim_doubt);
  s->claim_doubt = NULL;
  return 0;
}

/* See store.h: reap dead leases first, so a run whose owner died can be
** taken at once; the taker needs a live lease (lease_live). */
static int pg_take_run(store_t *st, const char *run_id, const char *owner, const char *host,
                       int64_t now, struct run_row **row, err_t *e) {
  struct pg_store *s = pg_of(st);
  *row = NULL;
  if (store__pg_begin(s, PG_LOCK_ALL, e)) return e->code;
  int rc = reap_locked(s, host, now, e);
  PGresult *res = NULL;
  struct run_row *r = NULL;
  if (rc < 0) goto done;
  rc = lease_live(s, owner, now, e);
  if (rc) goto done;
  struct store_val v[1] = {SV_TEXT(run_id)};
  res = store__pg_run(s, &s->w, NULL, "SELECT " STORE_CLAIM_COLS " FROM runs WHERE id = $1", v, 1,
                      "reading a run", e);
  if (!res) {
    rc = e->code;
    goto done;
  }
  size_t n;
  rows_of(res, &r, &n);
  if (!n) {
    rc = err_set(e, ERR_NOTFOUND, "no run with id '%s'", run_id);
    goto done;
  }
  if (store__is_terminal(r->status)) {
    rc = err_set(e, ERR_CONFLICT, "run %s is already %s: nothing to resume", run_id, r->status);
  } else if (r->owner && strcmp(r->owner, owner)) {
    struct store_val lv[1] = {SV_TEXT(r->owner)};
    PGresult *l = store__pg_run(s, &s->w, NULL,
      "SELECT kind, host, pid, expires_at FROM leases WHERE owner = $1", lv, 1, "reading a lease",
      e);
    if (!l) rc = e->code;
    else if (PQntuples(l) == 1)
      rc = err_set(e, ERR_CONFLICT,
                   "run %s is held by a live process (moonloop %s, pid %s on %s); "
                   "its lease expires in %llds unless renewed",
                   run_id, PQgetvalue(l, 0, 0), PQgetvalue(l, 0, 2), PQgetvalue(l, 0, 1),
                   (long long)(store__pg_i64(l, 0, 3) - now + 999) / 1000);
    PQclear(l);
  }
  if (!rc) {
    /* Only from the owner it was read with: a claim may not slip in. */
    struct store_val uv[3] = {SV_TEXT(run_id), SV_TEXT(owner), SV_TEXT(r->owner)};
    int64_t changed = 0;
    if (store__pg_do(s, &s->w, "UPDATE runs SET owner = $2 WHERE id = $1"
                     " AND owner IS NOT DISTINCT FROM $3", uv, 3, &changed, "taking a run", e))
      rc = e->code;
    else if (!changed)
      rc = err_set(e, ERR_CONFLICT, "run %s was claimed by another process meanwhile", run_id);
  }
done:
  PQclear(res);
  if (rc) {
    store_rows_free(r, r ? 1 : 0);
    store__pg_rollback(s);
    return rc;
  }
  if (store__pg_commit_tx(s, 1, e)) {
    store_rows_free(r, 1);
    return e->code;
  }
  *row = r;
  return 0;
}

/* ---- noticing other processes' writes ---- */

/* Count the notifications the reader got (LISTEN moonloop): every one in
** s->notified, those of other processes' connections (not this store's
** writer) in s->others too. Reads what arrived without waiting. */
static void take_notifications(struct pg_store *s) {
  err_t e;
  if (store__pg_ensure(s, &s->r, &e)) return;
  /* Broken: the next call opens it again (and counts that). */
  if (!PQconsumeInput(s->r.c)) return;
  int mine = atomic_load(&s->writer_pid);
  PGnotify *n;
  while ((n = PQnotifies(s->r.c))) {
    s->notified++;
    s->others += n->be_pid != mine;
    PQfreemem(n);
  }
}

/* See store.h: the notifications and reconnections of the reader, counted
** (this store's own commits too, as SQLite's data_version counts its
** writer's: what the engine wrote itself is noticed the same way). */
static int64_t pg_data_version(store_t *st) {
  struct pg_store *s = pg_of(st);
  take_notifications(s);
  return s->notified;
}

/* See store.h: whether another process's commit (or a reconnection) was
** among what arrived. */
static int pg_woken(store_t *st) {
  struct pg_store *s = pg_of(st);
  int64_t was = s->others;
  take_notifications(s);
  return s->others != was;
}

/* See store.h: the reader's socket, while it is connected. */
static int pg_wake_fd(store_t *st) {
  struct pg_store *s = pg_of(st);
  return s->r.c && PQstatus(s->r.c) == CONNECTION_OK ? PQsocket(s->r.c) : -1;
}

/* ---- opening and closing ---- */

/* See store.h: the file checks of SQLite have nothing to check here. */
static int pg_check_file(store_t *st, err_t *e) {
  (void)st, (void)e;
  return 0;
}

static const char *pg_path(const store_t *st) {
  return ((const struct pg_store *)(const void *)st)->shown;
}

static void pg_close(store_t *st) {
  struct pg_store *s = pg_of(st);
  if (s->w.c) PQfinish(s->w.c);
  if (s->r.c) PQfinish(s->r.c);
  /* A connection being opened again: its thread frees it. */
  if (s->w.opening) opening_drop(s->w.opening);
  if (s->r.opening) opening_drop(s->r.opening);
  store__fence_free(&s->fence);
  free(s->claim_doubt);
  buf_free(&s->base.scratch);
  free(s->url);
  free(s->shown);
  free(s);
}

/* The schema's version, read on pc outside any transaction (0: none
** yet), or a negative code. */
static int schema_version(struct pg_store *s, struct pgconn *pc, err_t *e) {
  int v = 0;
  for (int k = 0; k < 2; k++) {
    PGresult *r = store__pg_exec_raw(pc, k ? "SELECT max(version) FROM moonloop_schema"
                                  : "SELECT to_regclass('moonloop_schema') IS NOT NULL");
    int ok = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
    if (!ok) v = store__pg_err(s, pc, r, "reading the schema version", e);
    else if (k) v = (int)store__pg_i64(r, 0, 0);
    int exists = ok && !k && !strcmp(PQgetvalue(r, 0, 0), "t");
    PQclear(r);
    if (!ok || (!k && !exists)) break;
  }
  return v;
}

/* Bring the schema up to date, one migration per transaction under the
** write lock (another process may be migrating too: the version is read
** again inside the lock). A schema up to date is only read, through the
** reader. */
/* An upgrade of a database from version `from` (one with leases) while
** another process holds a live lease on it: refused
** (store__upgrade_refused says why). Inside the migration's transaction. */
static int upgrade_refused(struct pg_store *s, int from, err_t *e) {
  PGresult *r = store__pg_run(s, &s->w, NULL, "SELECT kind, host, pid, pid_start, expires_at "
                              "FROM leases", NULL, 0, "reading the leases", e);
  if (!r) return e->code;
  int rc = 0;
  for (int i = 0; !rc && i < PQntuples(r); i++)
    rc = store__upgrade_refused(from, NMIGRATIONS, PQgetvalue(r, i, 0), PQgetvalue(r, i, 1),
                                (long)store__pg_i64(r, i, 2), store__pg_i64(r, i, 3),
                                store__pg_i64(r, i, 4), e);
  PQclear(r);
  return rc;
}

static int migrate(struct pg_store *s, err_t *e) {
  int now = schema_version(s, &s->r, e);
  if (now < 0) return now;
  if (now == NMIGRATIONS) return 0;
  for (;;) {
    if (store__pg_begin(s, PG_LOCK_ALL, e)) return e->code;
    int version = 0;
    if (store__pg_exec(s, &s->w, "CREATE TABLE IF NOT EXISTS moonloop_schema(version INTEGER NOT NULL)",
                       "reading the schema version", e))
      goto fail;
    PGresult *r = store__pg_run(s, &s->w, NULL, "SELECT max(version) FROM moonloop_schema", NULL, 0,
                                "reading the schema version", e);
    if (!r) goto fail;
    version = (int)store__pg_i64(r, 0, 0);
    PQclear(r);
    if (version > NMIGRATIONS) {
      err_set(e, ERR_INVALID, "database schema version %d is newer than this moonloop knows "
              "(%d): upgrade moonloop", version, NMIGRATIONS);
      goto fail;
    }
    if (version == NMIGRATIONS) {
      store__pg_rollback(s);
      return 0;
    }
    if (version > 0 && version == now && upgrade_refused(s, version, e)) goto fail;
    char sql[96];
    snprintf(sql, sizeof sql, "DELETE FROM moonloop_schema; INSERT INTO moonloop_schema VALUES(%d)",
             version + 1);
    if (store__pg_exec(s, &s->w, migrations[version], "migrating", e) ||
        store__pg_exec(s, &s->w, sql, "migrating", e)) {
      err_prefix(e, "migrating the database to version %d", version + 1);
      goto fail;
    }
    if (store__pg_commit_tx(s, 0, e)) return e->code;
  }
fail:
  store__pg_rollback(s);
  return e->code;
}

static const struct store_ops pg_ops;

/* See store_backend.h: the reader (LISTEN), which also reads the schema's
** version; the writer when there are migrations to make, else at the first
** write (a command that only reads never opens it). */
int store__pg_open(const char *url, enum store_durability d, store_t **out, err_t *e) {
  const char *t = getenv("MOONLOOP_PG_TIMEOUT");
  if (t && atoi(t) > 0 && atoi(t) <= 3600) store__pg_answer_ms = atoi(t) * 1000;
  struct pg_store *s = mem_calloc(1, sizeof *s);
  s->base.ops = &pg_ops;
  s->durability = d;
  s->url = mem_strdup(url);
  s->shown = url_shown(url);
  s->w.role = "writer";
  s->r.role = "reader";
  s->r.reader = 1;
  if (core_sql_check(e) || conn_open(s, &s->r, e) || migrate(s, e)) {
    pg_close((store_t *)(void *)s);
    return e->code;
  }
  *out = (store_t *)(void *)s;
  return 0;
}

static const struct store_ops pg_ops = {
  .name = "postgresql",
  .close = pg_close,
  .path = pg_path,
  .check_file = pg_check_file,
  .commit = pg_commit,
  .lease_acquire = pg_lease_acquire,
  .lease_release = pg_lease_release,
  .reap = pg_reap,
  .count_crash = pg_count_crash,
  .claim = pg_claim,
  .take_run = pg_take_run,
  .dispatch = store__pg_dispatch,
  .deliver = store__pg_deliver,
  .prune = store__pg_prune,
  .data_version = pg_data_version,
  .wake_fd = pg_wake_fd,
  .woken = pg_woken,
  .rq = store__pg_rq,
  .wq = store__pg_wq,
  .rfilter = store__pg_rfilter,
  .rbegin = store__pg_rbegin,
  .rend = store__pg_rend,
};
