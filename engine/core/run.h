/*
** run.h: the run context: what a run and its tasks are inside the engine,
** and the ops their coroutines yield (the Lua side is lua/run.lua).
**
** A run has one main task (its coroutine); step.parallel adds child tasks.
** A task is always in exactly one state:
**
**              resume                 yield op
**    READY ------------> RUNNING ------------------> PARKED
**      ^                    |                          |
**      |                    | returns / errors         | completion (group durable,
**      |                    v                          |  timer, HTTP response):
**      |                  DONE                         |  push the values to
**      +-----------------------------------------------+  resume with
**
** Runs go  running -> (sleeping | waiting -> running)* -> completed | failed | cancelled.
** A run that is aborted (timeout, cancel, lost lease) stops at once: its
** timers and transfers are cancelled; a commit it waits on cannot be, so
** the run is kept (by reference count) until that commit reports back.
**
** This header is internal to the scheduler and the run context.
*/
#ifndef ML_RUN_H
#define ML_RUN_H
#include <stdint.h>

#include <lua.h>

#include "core/httpc.h"
#include "core/op.h" /* the ops a run's coroutine yields, and their handlers */
#include "core/sched.h"
#include "lua/skill.h"


/* A timer in the scheduler's heap. */
struct stimer {
  int64_t at;  /* ms since the epoch */
  size_t idx;  /* position in the heap, 0 when not armed */
  void (*fn)(struct stimer *t);
};

enum task_state { T_READY, T_RUNNING, T_PARKED, T_DONE };

struct run;

struct task {
  struct run *run;
  lua_State *co;
  int co_ref;
  enum task_state state;
  int nres;             /* values pushed on co to resume with */
  int waits;            /* completions still due before it is ready */
  struct task *next_ready;
  struct stimer timer;  /* sleeps and backoffs */
  httpc_xfer *xfer;     /* an HTTP request in flight */
  /* the step whose body is running, if any */
  int step_seq, step_attempt;
  char *step_id;
  int64_t step_started;
  int step_marked;      /* its "running" row has been journaled */
  int step_timed_out;
  int in_delay;         /* parked in a body's OP_DELAY, on t->timer */
  int in_body;          /* a step body is running (between step_begin and step_end) */
  int64_t step_timeout_ms;
  struct stimer step_timer;
  /* LLM token usage of the step whose body is running (all its attempts) */
  int64_t usage_prompt, usage_completion, usage_total, usage_calls;
  /* a step.parallel child: its parent task and place */
  struct task *parent;
  int child_index;
  /* a step.parallel parent: its children and what they returned */
  struct task **kids;
  int nkids, kids_left;
  char **kid_value;
  int *kid_ok;
  /* a sleep, wait or invoke in progress (the main task; a step.parallel
  ** child's invoke inside its body) */
  int wait_seq;
  char *wait_id;
  const char *wait_kind; /* "sleep", "wait", "invoke" */
  char *wait_child;      /* invoke: the child run's id */
  int64_t wait_started, wait_until;
  int waiting;           /* registered and not yet ending */
  int parked_long;       /* counted in the scheduler's parked runs */
};

struct run {
  char id[27];
  sched_t *sched;
  struct skill *skill;
  char *trigger, *input, *parent_id, *fail_error;
  const char *entry; /* "run" or "on_failure" */
  int64_t created_at, started_at, deadline_at;
  int64_t since;     /* events from this time on count for its waits: its triggering event's time, or its creation */
  char *trigger_event; /* the id of its triggering event (never counts for its waits), or NULL */
  struct task main;
  int refs;          /* pending completions that cannot be cancelled, plus one while live */
  int finished;      /* its terminal status is journaled */
  int aborted;
  int dormant;       /* parked without a coroutine: woken by replay */
  int unborn;        /* its row is not durable yet: its main task waits for it
                     ** (run_start_created), so no step body runs before */
  int64_t wake_at;   /* dormant: when to wake (0: when something is delivered) */
  struct stimer wake;
  struct stimer deadline;
  int mem_acct;      /* the memory account of its coroutines (lrt.h), while it has them */
  int crashes;       /* processes that died while it executed, since its last checkpoint
                     ** (from the store; cleared at its next durable write) */
  char *limits;      /* its limits with their keys' values (flowctl_limits), once asked */
  int has_prio;      /* prio is known: computed here, or recorded in the store (runs.prio) */
  int64_t prio;      /* its priority in its queues (flowctl.c's queue_prio) */
  int slot_held, slot_pending, slot_ever; /* slots: held, asked for, held once */
  int64_t log_bytes;   /* bytes of log lines it wrote in this process (run_lua.c's c_log) */
  int64_t log_dropped; /* lines dropped past limits.run_logs */
  struct stimer flow_timer; /* a throttled run asks again at its start time (flowctl.c) */
  struct run *prev, *next; /* the scheduler's list of live runs */
};

/* Build a run from a stored row, push its coroutine (replaying journal,
** a cJSON array from store_get_steps or NULL) and make its main task ready.
** A run whose coroutine cannot be made (its skill's shared state is over
** budget, out of memory) fails at once with the reason in its trace;
** returns 0 either way (e then holds the reason). */
int run_start(sched_t *s, struct run *r, const cJSON *journal, err_t *e);

/* Start a new run r whose row (its J_RUN_NEW) is the open group's last
** entry: its coroutine is made now, but its main task is first resumed
** once that row is durable, so no step body of it runs for a run the
** database may never hold (a crash before the commit, a fenced parent, a
** refused request). When the row is taken back instead, or the store
** found the run there already (a child id made again by a replay), r is
** dropped here without a write. Returns 0, as run_start. */
int run_start_created(sched_t *s, struct run *r, err_t *e);

/* Build a run's coroutine and make its main task ready: replaying journal
** (a cJSON array from store_get_steps, or NULL for a new run). The run
** must be linked already. */
int run_boot(struct run *r, const cJSON *journal, err_t *e);

/* Keep a stored run without a coroutine until wake_at (0: until something
** is delivered to it); it is then replayed. */
int run_start_dormant(sched_t *s, struct run *r, int64_t wake_at);

/* Wake a dormant run: read its journal and replay it. */
void run_wake(struct run *r);

/* Resume a ready task once and handle what it yields. */
void run_resume(struct task *t);

/* Abort a run: cancel what can be cancelled, journal status (unless
** NULL) with error, and release it. */
void run_abort(struct run *r, const char *status, const char *error_json);

/* Release a reference; frees the run at zero. */
void run_unref(struct run *r);

/* The store says a wait of r (at seq) got its result. */
void run_delivered(struct run *r, int seq);

/* Someone asked to cancel r (reason: a message or the cancelling event). */
void run_cancelled(struct run *r, const char *reason);

/* The ops' handlers (run_op_commit, ...; the flow steps' in run_flow.c)
** are declared by op.h, from its table, and called from run_resume. */
/* The step's time is up while t's body waits for a child run (an invoke
** in a step.parallel branch): end the wait now. */
void run__wait_stop(struct task *t);
/* A step.parallel child ended with (ok, value JSON). */
void run_child_ended(struct task *t, int ok, const char *value);
/* Shared by run.c and run_flow.c. */
void run__park(struct task *t, int waits);
/* A task's timer (a sleep, a backoff, a delay) fired: one completion. */
void run__on_timer(struct stimer *tm);
/* Park t and, at time at, decode the op still on its coroutine's stack and
** run it again: for an op that found the store away for a moment (a
** PostgreSQL restart) before it changed anything. */
void run__op_again(struct task *t, int64_t at);
void run__complete(struct task *t);
void run__wait_durable(struct task *t);
void run__task_cancel(struct task *t);
void run__task_release(struct task *t);
void run__stop_kids(struct task *t);
void run__free_kids(struct task *t);
void run__finish(struct run *r, const char *status, const char *output, const char *error);
void run__verbose(struct run *r, const char *mark, const char *id, int64_t ms, const char *extra);
/* Give back r's concurrency slots (it parks for long, or ends: flowctl.c). */
void run__release_slot(struct run *r);
/* r's event, as its flow keys and its priority function read it: its
** trigger's event, or for a run not started by one, {data = its input}
** (cJSON, the caller's). */
cJSON *run__event(const struct run *r);
/* The value (compact JSON) at a path such as "event.data.service" in r's
** event (its input for runs not started by an event); "null" if absent. */
char *run__event_value(struct run *r, const char *path);
/* The same value as a flow control's key counts it: canonical, its
** objects' keys sorted, so {"a":1,"b":2} and {"b":2,"a":1} are one key.
** The one place a key's value is computed, for every flow option. */
char *run__event_key(struct run *r, const char *path);

/* ---- OP_HTTP's conversions, shared with the REPL (repl.c) ---- */

/* Headers of one request taken from its Lua table, at most. */
#define RUN_HTTP_MAX_HEADERS 64

/* Fill req from the request table at idx of co ({method, url, body,
** timeout (seconds, or a duration string), headers {name = value}}): its
** strings stay on co's stack, so they live until the caller pops them;
** hdrs gets "Name: value" lines (malloc'd, NULL-terminated) that req points
** to. Returns how many lines (free them with run__http_headers_free after
** httpc_start). */
int run__http_request_from_lua(lua_State *co, int idx, struct httpc_req *req,
                               char *hdrs[RUN_HTTP_MAX_HEADERS + 1]);
void run__http_headers_free(char **hdrs, int nh);

/* Push a response on co as Lua sees it: {status, body, headers}, or nil and
** the message of a failed transfer. Returns the number of values pushed. */
int run__push_http_response(lua_State *co, const struct httpc_resp *resp);
/* Resume t, in a step body whose time is up, with nil, "step '...' timed
** out after ..." and the reason "step_timeout". */
void run__step_timed_out(struct task *t);

/* Register the run context's C functions in core (log, step_begin, ...). */
void run_register_core(lrt_t *lrt, sched_t *s);

/* ---- scheduler internals used by the run context ---- */
/* A run boots from a journal that holds steps (moonloop_replays_total). */
void sched__count_replay(sched_t *s);
journal_t *sched__journal(sched_t *s);
void sched__after_commit(sched_t *s, void (*fn)(void *arg), void *arg);
/* Call fn with the entry appended last, once its group is durable. */
void sched__after_entry(sched_t *s, void (*fn)(void *arg, const struct jentry *e), void *arg);
/* A request from outside (HTTP, the sidecar) appended the entries of the
** open group from index first on: ok (may be NULL) gets the last of them
** once durable; if their group fails to commit, fail gets the reason
** instead, at once, and the entries are dropped (nothing was stored). */
void sched__after_request(sched_t *s, size_t first,
                          void (*ok)(void *arg, const struct jentry *last),
                          void (*fail)(void *arg, const char *msg), void *arg);
/* ERR_BUSY with the reason while the store cannot be written (commits are
** failing, the database file is gone): a new request is refused at once
** rather than left waiting. 0 otherwise. */
int sched__refuse_write(sched_t *s, err_t *e);
/* Drop run id here without a write (another process may own it now, or
** its creation was never stored), with the entries written for it (and
** for runs it created) that are not committed yet. */
void sched__drop_run(sched_t *s, const char *id);
struct run *sched__find(sched_t *s, const char *id);
void sched__parked(sched_t *s, int delta);
int sched__parked_count(const sched_t *s);
void sched__want_poll(sched_t *s);
/* Hand this process's runs now what the store holds for them (cancellations
** with the reason asked first, deliveries): after a cancel this process
** wrote, so a run it holds stops at once, as the store says. */
void sched__poll_now(sched_t *s);
void sched__want_dispatch(sched_t *s);
/* A step ended after ms (for the duration histogram). */
void sched__step_ended(sched_t *s, int64_t ms);
/* The scheduler is stopping: runs are released at their next checkpoint. */
int sched__draining(const sched_t *s);
/* A skill version, loaded (from the cache or the store). */
int sched__version_skill(sched_t *s, const char *version, struct skill **out, err_t *e);
/* The live version of a registered skill, loaded. */
int sched__live_skill(sched_t *s, const char *id, struct skill **out, err_t *e);
/* The registry changed here: forget the live versions looked up. */
void sched__live_forget(sched_t *s);
/* Whether the registry holds the live triggers yet (sched_triggers_live). */
int sched__triggers_live(const sched_t *s);
/* The registry changed: rearm the cron triggers (sched_cron.c). */
void sched__skills_changed(sched_t *s);
void sched__crons_free(sched_t *s);
struct cron_entry *sched__crons(sched_t *s);
void sched__set_crons(sched_t *s, struct cron_entry *list);
/* The runs the tree of invokes under root started in this process
** (sched_tree.c; limits.run_tree), one more, forget root (its run ended),
** and forget them all (the scheduler stops). */
int sched__tree_count(sched_t *s, const char *root);
void sched__tree_add(sched_t *s, const char *root);
void sched__tree_drop(sched_t *s, const char *root);
void sched__trees_free(sched_t *s);
/* Whether the cron entries were built once since the engine started. */
int sched__crons_built(const sched_t *s);
/* A new run of skill with the given id, created at `created` (at most now):
** journal its row and start it once the row is durable (run_start_created).
** sched_run_new's, with the id chosen by the caller (a child's id derived
** from its parent's step). */
int sched__run_new(sched_t *s, struct skill *skill, const char *id, int64_t created,
                   const char *trigger, const char *input, const char *parent_id, err_t *e);
/* Start a run whose row is already journaled (owned by this process). */
int sched__start_existing(sched_t *s, struct skill *skill, const char *id, const char *trigger,
                          const char *input, int64_t at, err_t *e);
void sched__timer_start(sched_t *s, struct stimer *t, int64_t at_ms);
void sched__timer_stop(sched_t *s, struct stimer *t);
void sched__ready(sched_t *s, struct task *t);
struct task *sched__current(sched_t *s);
void sched__set_current(sched_t *s, struct task *t);
const struct sched_opts *sched__opts(const sched_t *s);
/* A run reached a terminal status and that status is durable. */
void sched__run_done(sched_t *s, struct run *r, const char *status, const char *output,
                     const char *error);
void sched__run_unlink(sched_t *s, struct run *r);
/* sched_watch without looking at the store first (the caller knows the run
** has not ended: it just started it). */
struct sched_watch *sched__watch_add(sched_t *s, const char *run_id, int64_t wait_ms,
                                     sched_watch_cb cb, void *arg);
void sched__run_link(sched_t *s, struct run *r);

/* Push onto t's coroutine, protected (lrt_protect): fn(arg, e) pushes the
** values t resumes with. Returns 0; or, when the state had no memory left
** for it, fails t's run with the reason (limits.total_memory) and returns
** the code: the caller then stops (the run is aborted, t's coroutine gone). */
int run__push(struct task *t, int (*fn)(void *arg, err_t *e), void *arg);

/* run__push of plain values, one per letter of spec: 'n' a number (a
** double argument), 's' a string (const char *; NULL pushes nil), 'z'
** nil (no argument); at most RUN_PUSH_MAX. Sets t->nres on success. */
#define RUN_PUSH_MAX 4
int run__push_values(struct task *t, const char *spec, ...);

#endif
