/*
** journal.h: a group of journal entries, committed together in one store
** transaction (group commit). The scheduler appends the writes of one loop
** iteration to the open group; the store commits the whole group durably on
** its commit thread; then every run that waited on that group goes on.
**
** Entries own copies of their strings (in the group's arena), so callers can
** free or reuse theirs at once. A group is appended to on the loop thread,
** then handed over whole to the thread that commits it: never both at once.
*/
#ifndef ML_JOURNAL_H
#define ML_JOURNAL_H
#include <stddef.h>
#include <stdint.h>

/* ---- the entry kinds, written once ----
**
** Each kind of entry is a struct whose fields are listed once, in a macro
** below; journal.c generates from the lists the copying of an entry into
** the group (its strings into the group's arena) and a table of the
** fields (journal_kinds: names, types, offsets) from which the store binds
** its statements by the fields' names. Adding a field to a kind is one
** line here (and, for a stored one, the column in a migration).
**
** A field is _(S, USE, TYPE, name):
**   USE   COL   journaled, and written to the column of that name by the
**               store's statement for the kind (store_sqlite.c names its
**               parameters after the fields, and checks at open that each
**               COL field has one)
**         ARG   journaled, read by the store's own code (fencing, keys, the
**               kinds store_flow.c writes)
**         READ  read from the store only, never journaled (zeroed in a copy)
**   TYPE  TEXT  const char *: copied into the group's arena; NULL stays NULL
**               (and binds NULL)
**         INT   int
**         I64   int64_t, bound as it is
**         TIME  int64_t milliseconds; 0 means none (binds NULL)
**         OP    enum skill_op
**         RUN   struct run_row, copied with its strings
*/

/* A run, as the runs table holds it. Strings may be NULL; JSON fields hold
** JSON text. idem: the caller's idempotency key (invoke's key), unique per
** skill: a new run with a key its skill already has is not created; the
** entry's result is then the first run's id (store_flow.c writes it).
** by_run (journal entries only, not stored): the run that creates this one
** (a child of step.invoke, an on_failure run), whose owner must still hold
** it (fencing); NULL for runs started from outside. crashes,
** cancel_requested, cancel_reason, has_prio and prio: read when a run is
** claimed or taken over (never written from here): processes that died
** while it was executing since its last checkpoint, a cancellation asked
** for while it was owned, and its priority in its queues, recorded by
** its first acquire (has_prio 0: none recorded yet, runs.prio NULL). An
** entry with no entry point runs "run"; with no trigger, "{}". */
#define JOURNAL_RUN_ROW(_, S) \
  _(S, COL, TEXT, id) _(S, COL, TEXT, skill) _(S, COL, TEXT, version) _(S, COL, TEXT, status) \
  _(S, COL, TEXT, entry) _(S, COL, TEXT, trigger) _(S, COL, TEXT, parent_id) \
  _(S, COL, TEXT, input) _(S, COL, TEXT, output) _(S, COL, TEXT, error) _(S, COL, TEXT, owner) \
  _(S, COL, I64, created_at) _(S, COL, TIME, started_at) _(S, COL, TIME, ended_at) \
  _(S, COL, TIME, deadline_at) _(S, COL, TIME, wake_at) \
  _(S, ARG, TEXT, idem) _(S, ARG, TEXT, by_run) \
  _(S, READ, INT, crashes) _(S, READ, INT, cancel_requested) _(S, READ, TEXT, cancel_reason) \
  _(S, READ, INT, has_prio) _(S, READ, I64, prio)

/* A change of a run's status. NULL output/error and 0 times leave the
** stored values; wake_at is always written (0 clears it). A terminal status
** releases the run's owner. clear_crashes: the run reached a checkpoint,
** its crash count goes back to 0 (with a NULL status, that is all the
** entry does). */
#define JOURNAL_RUN_SET(_, S) \
  _(S, COL, TEXT, run_id) _(S, COL, TEXT, status) _(S, COL, TEXT, output) _(S, COL, TEXT, error) \
  _(S, COL, TIME, started_at) _(S, COL, TIME, ended_at) _(S, COL, TIME, wake_at) \
  _(S, ARG, INT, clear_crashes)

/* A step's latest state; written again (replaced) as the step moves on. */
#define JOURNAL_STEP_ROW(_, S) \
  _(S, COL, TEXT, run_id) _(S, COL, INT, seq) _(S, COL, TEXT, id) _(S, COL, TEXT, kind) \
  _(S, COL, TEXT, status) _(S, COL, TEXT, output) _(S, COL, TEXT, error) _(S, COL, TEXT, usage) \
  _(S, COL, INT, attempts) _(S, COL, TIME, started_at) _(S, COL, TIME, ended_at) \
  _(S, COL, TIME, wake_at) _(S, COL, TIME, retry_at)

/* One attempt of a step that did not succeed (successful attempts are
** implied by the step row). */
#define JOURNAL_ATTEMPT_ROW(_, S) \
  _(S, COL, TEXT, run_id) _(S, COL, INT, seq) _(S, COL, INT, n) _(S, COL, TEXT, status) \
  _(S, COL, TEXT, error) _(S, COL, TEXT, traceback) _(S, COL, TIME, started_at) \
  _(S, COL, TIME, ended_at) _(S, COL, TIME, retry_at)

/* A line of a run's trace; seq: the step it belongs to, 0 for none. */
#define JOURNAL_LOG_ROW(_, S) \
  _(S, COL, TEXT, run_id) _(S, COL, INT, seq) _(S, COL, I64, ts) _(S, COL, TEXT, level) \
  _(S, COL, TEXT, msg)

/* A version of a skill: its source, and the triggers this load of it
** produced (JSON; they may differ between loads of one source, when they
** come from env). */
#define JOURNAL_VERSION_ROW(_, S) \
  _(S, COL, TEXT, version) _(S, COL, TEXT, skill) _(S, COL, TEXT, source) _(S, COL, TEXT, file) \
  _(S, COL, I64, loaded_at) _(S, COL, TEXT, triggers)

/* A change to a skill's registry record:
**   SKILL_PUT     the live version (and file, description, triggers); error as given
**   SKILL_ERROR   only the last rejected load of its file (JSON); the live version stays
**   SKILL_REMOVE  no live version any more (its file was deleted); the error is cleared
** scopes: a PUT's concurrency limits shared with other skills (skill.h's
** skills_scopes), NULL for none. The store judges them in the PUT's
** transaction: when another live skill gives one of those scopes another
** limit (one in scopes_ok, a JSON list of ids whose files already say
** the new limit, aside), it writes the PUT as a SKILL_ERROR instead, and
** the entry's result says why (store.h's store_skill_refusal).
** limits: a PUT's concurrency limits (skill.h's skills_slot_limits), NULL
** for none: from the PUT on, they govern every run of the skill's id that
** asks for a slot or waits for one, whichever version it runs. */
enum skill_op { SKILL_PUT, SKILL_ERROR, SKILL_REMOVE };
#define JOURNAL_SKILL_ROW(_, S) \
  _(S, ARG, OP, op) _(S, COL, TEXT, id) _(S, COL, TEXT, version) _(S, COL, TEXT, file) \
  _(S, COL, TEXT, description) _(S, COL, TEXT, triggers) _(S, COL, TEXT, error) \
  _(S, COL, I64, updated_at) _(S, COL, TEXT, scopes) _(S, ARG, TEXT, scopes_ok) \
  _(S, COL, TEXT, limits)

/* An accepted event. A repeat of an idempotency key is ignored; the
** entry's result is then the first event's id. by_run: the run whose
** send_event step sends it (NULL: from outside). */
#define JOURNAL_EVENT_ROW(_, S) \
  _(S, ARG, TEXT, id) _(S, ARG, TEXT, name) _(S, ARG, TEXT, data) _(S, ARG, TEXT, idem) \
  _(S, ARG, I64, ts) _(S, ARG, TEXT, by_run)

/* A run parks on something durable: an event (kind "event"), a child run
** (kind "child": name is the child's id) or a cancelling event (kind
** "cancel", seq < 0). An event that arrived since `since` and matches is
** taken at once: the entry's result is then the event (JSON). Registering
** the same (run_id, seq) again is harmless: a delivered result is
** returned. match: a JSON object of path -> value ({"data.service":
** "api"}): an event matches when each path's value in it is that value
** (compared as compact JSON); NULL matches every event. exclude: an event
** that never counts (the run's own triggering event). */
#define JOURNAL_WAIT_ROW(_, S) \
  _(S, ARG, TEXT, run_id) _(S, ARG, INT, seq) _(S, ARG, TEXT, kind) _(S, ARG, TEXT, name) \
  _(S, ARG, TEXT, match) _(S, ARG, TEXT, owner) \
  _(S, ARG, TEXT, exclude) _(S, ARG, I64, since) _(S, ARG, TIME, timeout_at)

/* End a wait: its result (if it was delivered meanwhile) is the entry's
** result, and the wait is removed. With keep, the row stays until the
** step's end is recorded (a J_WAIT_END without keep, in the group that
** completes the step): a crash between the two finds the event it took
** there again. A wait kept with nothing delivered is closed: nothing is
** delivered to it any more (its timeout passed). */
#define JOURNAL_WAIT_END(_, S) _(S, ARG, TEXT, run_id) _(S, ARG, INT, seq) _(S, ARG, INT, keep)

/* A child run ended: deliver its outcome to the parent's wait. */
#define JOURNAL_CHILD_DONE(_, S) _(S, ARG, TEXT, child_id) _(S, ARG, TEXT, outcome)

/* Cancel a run and its children. Unowned runs end at once; owned ones are
** flagged for their owner (a run flagged before keeps the first reason).
** The entry's result is the run's status after it ("cancelled",
** "cancelling"), or "ended:<status>" if it had ended. by_run: the run that
** asks (its end, a timed-out invoke), NULL: from outside; a run that names
** itself (its end) cancels its descendants only. */
#define JOURNAL_CANCEL_ROW(_, S) \
  _(S, ARG, TEXT, run_id) _(S, ARG, TEXT, reason) _(S, ARG, I64, at) _(S, ARG, TEXT, by_run)

/* Concurrency slots (store_queue.c). Acquire: limits is a JSON list of
** {"q": the queue (a skill's id, or "@" and a scope's name), "key":
** "path=value" or "", "limit": N}; every limit is granted at once (the
** result is "1") or the run takes its place in every queue, in order of
** at (its creation); first, once, it is admitted (limits of the kinds
** "rate", "throttle", "debounce", "idempotency", "singleton"). The result:
** "1" (slots held), NULL (queued), "wait:MS" (to start at MS), or
** "skip:MESSAGE" (to end cancelled). Release: every slot and queue place
** of the run, handed on to the runs queued behind it; the result is the
** JSON list of the runs of the releasing run's owner granted a slot. */
#define JOURNAL_SLOT_ROW(_, S) \
  _(S, ARG, TEXT, run_id) _(S, ARG, TEXT, limits) _(S, ARG, INT, acquire) _(S, ARG, I64, at)

/* A cron tick: fired once across all engines. When the tick is newer than
** the last one fired for (skill, spec), the run is created and the entry's
** result is "1". */
#define JOURNAL_CRON_ROW(_, S) \
  _(S, ARG, TEXT, skill) _(S, ARG, TEXT, spec) _(S, ARG, I64, tick) _(S, ARG, RUN, run)

/* The kinds: J(KIND, fn, struct, member, fields): the enum value J_KIND,
** the function journal_fn that appends one, the struct, its member in
** struct jentry's union, and its field list. */
#define JOURNAL_KINDS(J) \
  J(RUN_NEW, run_new, run_row, run, JOURNAL_RUN_ROW) \
  J(RUN_SET, run_set, run_set, set, JOURNAL_RUN_SET) \
  J(STEP, step, step_row, step, JOURNAL_STEP_ROW) \
  J(ATTEMPT, attempt, attempt_row, attempt, JOURNAL_ATTEMPT_ROW) \
  J(LOG, log, log_row, log, JOURNAL_LOG_ROW) \
  J(VERSION, version, version_row, version, JOURNAL_VERSION_ROW) \
  J(SKILL, skill, skill_row, skill, JOURNAL_SKILL_ROW) \
  J(EVENT, event, event_row, event, JOURNAL_EVENT_ROW) \
  J(WAIT, wait, wait_row, wait, JOURNAL_WAIT_ROW) \
  J(WAIT_END, wait_end, wait_end, wait_end, JOURNAL_WAIT_END) \
  J(CHILD_DONE, child_done, child_done, child, JOURNAL_CHILD_DONE) \
  J(CANCEL, cancel, cancel_row, cancel, JOURNAL_CANCEL_ROW) \
  J(SLOT, slot, slot_row, slot, JOURNAL_SLOT_ROW) \
  J(CRON, cron, cron_row, cron, JOURNAL_CRON_ROW)

/* The structs, from the lists. */
#define JOURNAL_CTYPE_TEXT const char *
#define JOURNAL_CTYPE_INT int
#define JOURNAL_CTYPE_I64 int64_t
#define JOURNAL_CTYPE_TIME int64_t
#define JOURNAL_CTYPE_OP enum skill_op
#define JOURNAL_CTYPE_RUN struct run_row
#define JOURNAL_MEMBER(S, use, type, name) JOURNAL_CTYPE_##type name;
#define JOURNAL_STRUCT(KIND, fn, S, m, F) struct S { F(JOURNAL_MEMBER, S) };
JOURNAL_KINDS(JOURNAL_STRUCT)
#undef JOURNAL_STRUCT

#define JOURNAL_ENUM(KIND, fn, S, m, F) J_##KIND,
enum jkind { JOURNAL_KINDS(JOURNAL_ENUM) J_COUNT };
#undef JOURNAL_ENUM

/* An entry of any kind. */
#define JOURNAL_UNION(KIND, fn, S, m, F) struct S m;
union jrow { JOURNAL_KINDS(JOURNAL_UNION) };
#undef JOURNAL_UNION

struct jentry {
  enum jkind kind;
  union jrow u;
  char *result; /* set by the store for entries that answer (malloc'd; freed with the group) */
  void *tag;    /* the caller's, to find its answer after the commit */
  int dropped;  /* taken back before its commit (journal_drop): the store skips it */
};

/* The fields of each kind, for code that handles every kind alike (the
** store's binding, skill tests' rows from Lua tables): journal_kinds[kind]
** has the kind's name (its fn: "step", "run_new"), and its fields in the
** list's order. A RUN field's own fields are journal_kinds[J_RUN_NEW]'s. */
enum journal_use { JOURNAL_COL, JOURNAL_ARG, JOURNAL_READ };
enum journal_type { JOURNAL_TEXT, JOURNAL_INT, JOURNAL_I64, JOURNAL_TIME, JOURNAL_OP, JOURNAL_RUN };
struct journal_field {
  const char *name;
  unsigned char use, type; /* enum journal_use, enum journal_type */
  unsigned short offset;   /* in the kind's struct */
};
struct journal_kind {
  const char *name;
  const struct journal_field *fields;
  size_t nfields;
};
extern const struct journal_kind journal_kinds[J_COUNT];

typedef struct journal journal_t;

journal_t *journal_new(void);
void journal_free(journal_t *j);
size_t journal_count(const journal_t *j);
const struct jentry *journal_entry(const journal_t *j, size_t i);
/* Bytes of strings held, to bound a group's size. */
size_t journal_bytes(const journal_t *j);

/* The owner whose lease this group renews and is fenced by (NULL: none).
** The store refuses the whole group when that lease is gone. */
void journal_set_owner(journal_t *j, const char *owner, int64_t lease_expires_at);
const char *journal_owner(const journal_t *j, int64_t *lease_expires_at);

/* The run an entry writes for, whose owner alone may commit it (fencing):
** the run of a step, attempt, log line, status, wait or slot; the run that
** ended (J_CHILD_DONE); the run that creates a run, sends an event or asks
** for a cancellation (by_run). NULL for entries of no run: skill versions
** and registrations, cron ticks, and runs, events and cancellations from
** outside. */
const char *journal_run_of(const struct jentry *e);

/* Take entry i back before its group commits: the store skips it, and
** whoever waits on it finds it dropped. */
void journal_drop(journal_t *j, size_t i);

/* Turn the J_RUN_NEW at i into a queued run that no process owns (any
** engine may claim it): for a run started from outside by a process that
** lost its lease before the run's creation was committed. */
void journal_disown_run(journal_t *j, size_t i);

/* The store refused the group because of entry i (ERR_FENCED); -1 when none. */
void journal_set_fenced(const journal_t *j, long i);
long journal_fenced(const journal_t *j);

/* Append a copy of an entry: journal_run_new(j, &run_row), journal_step(j,
** &step_row), ... (one per kind, named by JOURNAL_KINDS). */
#define JOURNAL_APPEND(KIND, fn, S, m, F) void journal_##fn(journal_t *j, const struct S *row);
JOURNAL_KINDS(JOURNAL_APPEND)
#undef JOURNAL_APPEND
/* The same for a kind known at run time: row points to its struct. */
void journal_add(journal_t *j, enum jkind kind, const void *row);

/* The entry appended last (to tag it), or NULL. */
struct jentry *journal_last(journal_t *j);

/* Set an entry's result (the store does, during a commit). */
void journal_set_result(const struct jentry *e, char *result);

#endif
