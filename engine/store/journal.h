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

/* A run, as the runs table holds it. Strings may be NULL; JSON fields hold
** JSON text. idem: the caller's idempotency key (invoke's key), unique per
** skill: a new run with a key its skill already has is not created; the
** entry's result is then the first run's id. by_run (journal entries
** only, not stored): the run that creates this one (a child of
** step.invoke, an on_failure run), whose owner must still hold it
** (fencing); NULL for runs started from outside. */
struct run_row {
  const char *id, *skill, *version, *status, *entry, *trigger, *parent_id;
  const char *input, *output, *error, *owner;
  int64_t created_at, started_at, ended_at, deadline_at, wake_at;
  const char *idem, *by_run;
  /* Read when a run is claimed or taken over (never written from here):
  ** processes that died while it was executing since its last checkpoint,
  ** and a cancellation asked for while it was owned. */
  int crashes, cancel_requested;
  const char *cancel_reason;
};

/* A change of a run's status. NULL output/error and 0 times leave the
** stored values; wake_at is always written (0 clears it). A terminal status
** releases the run's owner. */
struct run_set {
  const char *run_id, *status, *output, *error;
  int64_t started_at, ended_at, wake_at;
  int clear_crashes; /* the run reached a checkpoint: its crash count goes back to 0
                     ** (with a NULL status, that is all the entry does) */
};

/* A step's latest state; written again (replaced) as the step moves on. */
struct step_row {
  const char *run_id;
  int seq;
  const char *id, *kind, *status, *output, *error, *usage;
  int attempts;
  int64_t started_at, ended_at, wake_at, retry_at;
};

/* One attempt of a step that did not succeed (successful attempts are
** implied by the step row). */
struct attempt_row {
  const char *run_id;
  int seq, n;
  const char *status, *error, *traceback;
  int64_t started_at, ended_at, retry_at;
};

struct log_row {
  const char *run_id;
  int seq; /* the step it belongs to, 0 for none */
  int64_t ts;
  const char *level, *msg;
};

/* A version of a skill: its source, and the triggers this load of it
** produced (JSON; they may differ between loads of one source, when they
** come from env). */
struct version_row {
  const char *version, *skill, *source, *file;
  int64_t loaded_at;
  const char *triggers;
};

/* A change to a skill's registry record:
**   SKILL_PUT     the live version (and file, description, triggers); error as given
**   SKILL_ERROR   only the last rejected load of its file (JSON); the live version stays
**   SKILL_REMOVE  no live version any more (its file was deleted); the error is cleared */
enum skill_op { SKILL_PUT, SKILL_ERROR, SKILL_REMOVE };
struct skill_row {
  enum skill_op op;
  const char *id, *version, *file, *description, *triggers, *error;
  int64_t updated_at;
};

/* An accepted event. A repeat of an idempotency key is ignored; the
** entry's result is then the first event's id. by_run: the run whose
** send_event step sends it (NULL: from outside). */
struct event_row {
  const char *id, *name, *data, *idem;
  int64_t ts;
  const char *by_run;
};

/* A run parks on something durable: an event (kind "event"), a child run
** (kind "child": name is the child's id) or a cancelling event (kind
** "cancel", seq < 0). An event that arrived since `since` and matches is
** taken at once: the entry's result is then the event (JSON). Registering
** the same (run_id, seq) again is harmless: a delivered result is returned. */
struct wait_row {
  const char *run_id;
  int seq;
  const char *kind, *name, *match_path, *match_value, *owner;
  const char *exclude; /* an event that never counts: the run's own triggering event */
  int64_t since, timeout_at;
};

/* End a wait: its result (if it was delivered meanwhile) is the entry's
** result, and the wait is removed. With keep, the row stays until the
** step's end is recorded (a J_WAIT_END without keep, in the group that
** completes the step): a crash between the two finds the event it took
** there again. A wait kept with nothing delivered is closed: nothing is
** delivered to it any more (its timeout passed). */
struct wait_end {
  const char *run_id;
  int seq;
  int keep;
};

/* A child run ended: deliver its outcome to the parent's wait. */
struct child_done {
  const char *child_id, *outcome;
};

/* Cancel a run and its children. Unowned runs end at once; owned ones are
** flagged for their owner (a run flagged before keeps the first reason).
** The entry's result is the run's status after it ("cancelled",
** "cancelling"), or "ended:<status>" if it had ended. by_run: the run that
** asks (its end, a timed-out invoke), NULL: from outside; a run that names
** itself (its end) cancels its descendants only. */
struct cancel_row {
  const char *run_id, *reason;
  int64_t at;
  const char *by_run;
};

/* A concurrency slot: acquire (the result is "1" when granted; otherwise
** the run queues in order) or release (every slot and queue place of the run). */
struct slot_row {
  const char *run_id, *skill, *key;
  int limit, acquire;
  int64_t at;
};

/* A cron tick: fired once across all engines. When the tick is newer than
** the last one fired for (skill, spec), the run is created and the entry's
** result is "1". */
struct cron_row {
  const char *skill, *spec;
  int64_t tick;
  struct run_row run;
};

enum jkind {
  J_RUN_NEW, J_RUN_SET, J_STEP, J_ATTEMPT, J_LOG, J_VERSION, J_SKILL,
  J_EVENT, J_WAIT, J_WAIT_END, J_CHILD_DONE, J_CANCEL, J_SLOT, J_CRON,
};

struct jentry {
  enum jkind kind;
  union {
    struct run_row run;
    struct run_set set;
    struct step_row step;
    struct attempt_row attempt;
    struct log_row log;
    struct version_row version;
    struct skill_row skill;
    struct event_row event;
    struct wait_row wait;
    struct wait_end wait_end;
    struct child_done child;
    struct cancel_row cancel;
    struct slot_row slot;
    struct cron_row cron;
  } u;
  char *result; /* set by the store for entries that answer (malloc'd; freed with the group) */
  void *tag;    /* the caller's, to find its answer after the commit */
  int dropped;  /* taken back before its commit (journal_drop): the store skips it */
};

typedef struct journal journal_t;

journal_t *journal_new(void);
void journal_free(journal_t *j);
size_t journal_count(const journal_t *j);
const struct jentry *journal_entry(const journal_t *j, size_t i);
/* Bytes of strings held, to bound a group's size. */
size_t journal_bytes(const journal_t *j);

/* The owner whose lease this group renews and is fenced by (NULL: none).
** The store refuses the whole group when that lease is gone. */
int journal_set_owner(journal_t *j, const char *owner, int64_t lease_expires_at);
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

/* Append a copy of an entry. Each returns 0, or ERR_NOMEM. */
int journal_run_new(journal_t *j, const struct run_row *r);
int journal_run_set(journal_t *j, const struct run_set *s);
int journal_step(journal_t *j, const struct step_row *s);
int journal_attempt(journal_t *j, const struct attempt_row *a);
int journal_log(journal_t *j, const struct log_row *l);
int journal_version(journal_t *j, const struct version_row *v);
int journal_skill(journal_t *j, const struct skill_row *s);
int journal_event(journal_t *j, const struct event_row *ev);
int journal_wait(journal_t *j, const struct wait_row *w);
int journal_wait_end(journal_t *j, const struct wait_end *w);
int journal_child_done(journal_t *j, const struct child_done *c);
int journal_cancel(journal_t *j, const struct cancel_row *c);
int journal_slot(journal_t *j, const struct slot_row *s);
int journal_cron(journal_t *j, const struct cron_row *c);

/* The entry appended last (to tag it), or NULL. */
struct jentry *journal_last(journal_t *j);

/* Set an entry's result (the store does, during a commit). */
void journal_set_result(const struct jentry *e, char *result);

#endif
