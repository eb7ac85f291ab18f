/*
** vocab.h: the words of the run record, in one table each: run statuses,
** step statuses, step kinds and trigger kinds. From these lists come the
** enums the engine compares (never the strings), the word lists that
** filters check against (API, CLI, REPL, runs.list), the Lua runtime's
** core.VOCAB (lua/modules.lua's checks) and the dashboard's vocab.js
** (written at build time by cmake/gen_vocab.c, web/app.js reads it).
** A new word is a row here; everything that lists or checks words follows.
**
** A run's life:
**
**   queued -> running -> (sleeping | waiting -> running)* -> completed
**                                                          | failed
**                                                          | cancelled
**   queued -> skipped  (flow control turned it away before any of its code
**                       ran: rate limit, singleton, idempotency, debounce,
**                       batch; its error says why)
**
** X(NAME, "word", ended): ended is 1 for the terminal statuses.
*/
#ifndef ML_VOCAB_H
#define ML_VOCAB_H
#include <stddef.h>

#define VOCAB_RUN_STATUS_LIST(X) \
  X(QUEUED, "queued", 0)         \
  X(RUNNING, "running", 0)       \
  X(SLEEPING, "sleeping", 0)     \
  X(WAITING, "waiting", 0)       \
  X(COMPLETED, "completed", 1)   \
  X(FAILED, "failed", 1)         \
  X(CANCELLED, "cancelled", 1)   \
  X(SKIPPED, "skipped", 1)

/* A step's status: X(NAME, "word", ended). */
#define VOCAB_STEP_STATUS_LIST(X) \
  X(RUNNING, "running", 0)        \
  X(SLEEPING, "sleeping", 0)      \
  X(WAITING, "waiting", 0)        \
  X(COMPLETED, "completed", 1)    \
  X(FAILED, "failed", 1)

/* A step's kind: X(NAME, "word", 0), the step function it comes from. */
#define VOCAB_STEP_KIND_LIST(X) \
  X(RUN, "run", 0)              \
  X(SLEEP, "sleep", 0)          \
  X(WAIT, "wait", 0)            \
  X(INVOKE, "invoke", 0)        \
  X(SEND, "send", 0)            \
  X(PARALLEL, "parallel", 0)

/* What started a run: X(NAME, "word", 0). */
#define VOCAB_TRIGGER_KIND_LIST(X) \
  X(EVENT, "event", 0)             \
  X(CRON, "cron", 0)               \
  X(INVOKE, "invoke", 0)           \
  X(RERUN, "rerun", 0)             \
  X(ON_FAILURE, "on_failure", 0)

/* The enums; -1 (VOCAB_NONE) stands for a word that is not in the list. */
#define VOCAB_NONE (-1)
enum run_status {
#define VOCAB_E(N, w, end) RUN_##N,
  VOCAB_RUN_STATUS_LIST(VOCAB_E)
#undef VOCAB_E
};
enum step_status {
#define VOCAB_E(N, w, end) STEP_##N,
  VOCAB_STEP_STATUS_LIST(VOCAB_E)
#undef VOCAB_E
};
enum step_kind {
#define VOCAB_E(N, w, end) STEP_KIND_##N,
  VOCAB_STEP_KIND_LIST(VOCAB_E)
#undef VOCAB_E
};
enum trigger_kind {
#define VOCAB_E(N, w, end) TRIGGER_##N,
  VOCAB_TRIGGER_KIND_LIST(VOCAB_E)
#undef VOCAB_E
};

/* The words of each list, NULL-terminated, in the table's order. */
extern const char *const vocab_run_statuses[];
extern const char *const vocab_step_statuses[];
extern const char *const vocab_step_kinds[];
extern const char *const vocab_trigger_kinds[];

/* A word's value in its list (enum run_status, ...), or VOCAB_NONE for
** NULL or a word the list does not have. */
int vocab_run_status(const char *s);
int vocab_step_status(const char *s);
int vocab_step_kind(const char *s);
int vocab_trigger_kind(const char *s);

/* Whether s is a run status / a trigger kind. */
int vocab_is_run_status(const char *s);
int vocab_is_trigger_kind(const char *s);

/* Whether s is a terminal run status (completed, failed, cancelled, skipped). */
int vocab_run_ended(const char *s);

/* A list's words as "a, b, c", for messages (a string constant: the
** list's words joined, less the first ", "). */
#define VOCAB_JOIN(N, w, end) ", " w
#define VOCAB_RUN_STATUSES (VOCAB_RUN_STATUS_LIST(VOCAB_JOIN) + 2)
#define VOCAB_TRIGGER_KINDS (VOCAB_TRIGGER_KIND_LIST(VOCAB_JOIN) + 2)
#define VOCAB_STEP_KINDS (VOCAB_STEP_KIND_LIST(VOCAB_JOIN) + 2)

/* The terminal run statuses as SQL string literals, for `status IN (...)`
** and `NOT IN`: "'','completed','failed',..." (a leading '' that no run's
** status is, so that the list is one string constant). */
#define VOCAB_SQL_ENDED_1(w) ",'" w "'"
#define VOCAB_SQL_ENDED_0(w)
#define VOCAB_SQL_ENDED(N, w, end) VOCAB_SQL_ENDED_##end(w)
#define VOCAB_RUN_ENDED_SQL "''" VOCAB_RUN_STATUS_LIST(VOCAB_SQL_ENDED)

/* The same sets as one condition on the column status, an OR of
** comparisons: "(status = '' OR status = 'completed' OR ...)" (the first
** term, which no run's status meets, makes the list one string constant).
** SQLite evaluates an IN list of more than two constants by building a
** temporary b-tree each time the statement runs; in a partial index's
** WHERE clause that is on every insert and on every update of its
** columns, which cost more than all the runs table's index writes
** together. SQLite's partial indexes say their condition this way, and
** a query that reads one names the same condition, word for word. */
#define VOCAB_SQL_OR_1(w) " OR status = '" w "'"
#define VOCAB_SQL_OR_0(w)
#define VOCAB_SQL_OR_ENDED(N, w, end) VOCAB_SQL_OR_##end(w)
#define VOCAB_SQL_OR_UNENDED(N, w, end) VOCAB_SQL_OR_##end##_NOT(w)
#define VOCAB_SQL_OR_1_NOT(w)
#define VOCAB_SQL_OR_0_NOT(w) " OR status = '" w "'"
#define VOCAB_RUN_ENDED_OR "(status = ''" VOCAB_RUN_STATUS_LIST(VOCAB_SQL_OR_ENDED) ")"
#define VOCAB_RUN_UNENDED_OR "(status = ''" VOCAB_RUN_STATUS_LIST(VOCAB_SQL_OR_UNENDED) ")"

/* The number of runs in each status, read cheaply: the statuses not ended
** from the runs table (few rows, through runs_status), each ended one
** summed from the figures' rollup (stats_rollup, a column per ended
** status, which retention keeps in step with the runs), not counted over
** every run the database ever kept. One statement in both dialects
** (CAST: PostgreSQL's sum of a bigint is a numeric). */
#define VOCAB_SQL_SUM_1(w) \
  " UNION ALL SELECT '" w "', CAST(coalesce(sum(" w "), 0) AS BIGINT) FROM stats_rollup"
#define VOCAB_SQL_SUM_0(w)
#define VOCAB_SQL_SUM(N, w, end) VOCAB_SQL_SUM_##end(w)

#define VOCAB_RUN_COUNTS_SQL                                            \
  "SELECT status, count(*) FROM runs WHERE " VOCAB_RUN_UNENDED_OR \
  " GROUP BY status" VOCAB_RUN_STATUS_LIST(VOCAB_SQL_SUM)

#endif
