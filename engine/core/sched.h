/*
** sched.h: the scheduler: one libuv loop that runs every run's coroutine,
** commits their journal writes in groups, and keeps the process's lease.
**
** Loop iteration:
**
**   timers, I/O completions, commit completions   (libuv callbacks: they
**         |                                        only mark tasks ready)
**         v
**   idle: resume every ready task until it yields an op; the op's writes
**         go into the open journal group
**         v
**   prepare: hand the open group to the commit thread if none is in flight
**         v
**   poll (the commit thread syncs meanwhile; other runs keep running)
**
** A task that wrote a step waits for the group holding that write to be
** durable before it is resumed: a run never moves past a step whose result
** could still be lost. Groups commit one at a time, in order, so a later
** group's durability implies every earlier one's.
**
** Modes: SCHED_SOLO runs only the runs it is given (moonloop run) and
** those they start; SCHED_SERVE also claims unowned work from the store
** (queued runs, runs of dead processes) and notices other processes'
** writes within about 50 ms (PRAGMA data_version).
*/
#ifndef ML_SCHED_H
#define ML_SCHED_H
#include <stdint.h>

#include <uv.h>

#include "base/err.h"
#include "core/httpc.h"
#include "lua/lrt.h"
#include "lua/skill.h"
#include "store/journal.h"
#include "store/store.h"

typedef struct sched sched_t;

/* SCHED_REPL: as SCHED_SOLO, but it stays open (lease, ticks) while it
** has no runs, until sched_stop: the REPL starts runs between prompts. */
enum sched_mode { SCHED_SOLO, SCHED_SERVE, SCHED_REPL };

struct sched_opts {
  uv_loop_t *loop;
  store_t *store;
  lrt_t *lrt;
  skills_t *skills;
  httpc_t *http;
  enum sched_mode mode;
  const char *lease_kind;   /* "run", "serve" */
  int64_t lease_ttl_ms;     /* default 15000 */
  int default_retries;      /* default 3 */
  int64_t backoff_ms;       /* first retry delay, default 1000 */
  int64_t backoff_max_ms;   /* default 10 minutes */
  int64_t step_output_limit;/* bytes, default 1 MB */
  int64_t event_limit;      /* bytes of an event's data, default 1 MB */
  int max_parked;           /* runs parked in memory before eviction, default 10000 */
  int64_t run_log_limit;    /* bytes of log lines a run keeps, default 16 MB (0: the default) */
  int invoke_depth;         /* how deep runs may invoke runs, default 64 (0: the default) */
  int run_tree;             /* runs one tree of invokes may start here, default 10000 (0: the default) */
  int64_t retention_ms;     /* serve: prune history older than this every hour (0: keep all) */
  int verbose;              /* print each step to stderr as it completes */
  const char *const *api_callers; /* skills whose http requests may reach the engine's API
                                     (the configuration's deployers; NULL-terminated) */
};

/* What a finished run reports to whoever waits for it. */
struct sched_result {
  const char *run_id;
  const char *status; /* completed, failed, cancelled, skipped */
  const char *output; /* JSON text, or NULL */
  const char *error;  /* JSON text {message, step, ...}, or NULL */
};

typedef void (*sched_done_cb)(const struct sched_result *r, void *arg);

int sched_new(const struct sched_opts *o, sched_t **out, err_t *e);

/* Take the lease and start the loop's handles. */
int sched_start(sched_t *s, err_t *e);

/* Start a new run of skill. trigger and input are JSON text (input may be
** NULL). run_id (>= 27 bytes) gets the new id. The run is journaled in
** the next group; it is live here at once (its coroutine made), and runs
** its first step once that group is durable. */
int sched_run_new(sched_t *s, struct skill *skill, const char *trigger, const char *input,
                  const char *parent_id, char *run_id, err_t *e);

/* Go on with a run this process now owns (claimed or taken): replay its
** journal, then run live. A run whose code was executing each time its
** process crashed (core/crash.h: a crash, never a kill), SCHED_MAX_CRASHES
** times since its last checkpoint, is failed instead (quarantined); one
** whose cancellation is pending ends cancelled. ERR_BUSY when its skill
** version could not be read just now (the database away): nothing was
** done, and the caller may try again. */
#define SCHED_MAX_CRASHES 3
int sched_adopt(sched_t *s, const struct run_row *row, err_t *e);

/* Call cb when run_id, executed by this process, reaches a terminal
** status (once, from the loop; "abandoned" too, when the process lets it
** go without finishing it). */
void sched_on_done(sched_t *s, const char *run_id, sched_done_cb cb, void *arg);

/* Attach (GET /v1/runs/{id}?wait=): cb(arg, 1) once run_id has ended
** (completed, failed or cancelled, its end durable), whichever process
** executes it, or cb(arg, 0) when wait_ms runs out first; once, from the
** loop. A run of this process reports its end at once; for a run executed
** elsewhere the 50 ms tick asks the store, only when another connection
** committed, in one indexed query over the runs watched. Waiting costs a
** heap timer and a few bytes. Returns 0 and *out (for sched_unwatch), 1
** when the run has ended already (cb never fires), or a negative code
** (ERR_NOTFOUND for an unknown run). */
struct sched_watch;
typedef void (*sched_watch_cb)(void *arg, int ended);
int sched_watch(sched_t *s, const char *run_id, int64_t wait_ms, sched_watch_cb cb, void *arg,
                struct sched_watch **out, err_t *e);

/* Stop a watch before it fires (its client went away). Not from its own
** callback, nor from the callback of another watch of the same run. */
void sched_unwatch(sched_t *s, struct sched_watch *w);

/* Call cb for every run that ends in this process (completed, failed or
** cancelled), once its end is durable. Up to 4 observers. */
void sched_on_finish(sched_t *s, sched_done_cb cb, void *arg);

/* serve: the workspace is registered, so the registry's triggers are the
** live set: cron triggers start now (catching up missed ticks), not from
** what the registry held before this start. */
void sched_triggers_live(sched_t *s);

/* Runs in this process that have not finished. */
int sched_active(const sched_t *s);

/* Watch the journal (the REPL prints each step as it completes): cb is
** called from the loop for every entry of each committed group (steps,
** attempts, logs, ...), in order, once the group is durable. One
** observer per scheduler; NULL removes it. */
typedef void (*sched_observer_cb)(const struct jentry *e, void *arg);
void sched_observe(sched_t *s, sched_observer_cb cb, void *arg);

/* Drop every live run without a write (the REPL's Ctrl-C): each stays
** resumable from its journal by whoever takes it (moonloop run --resume,
** or any engine once this process's lease is gone). Their done callbacks
** fire with status "abandoned". */
void sched_abandon_all(sched_t *s);

/* Stop: no new work (no claims, events, cron ticks). Step bodies in flight
** get up to grace_ms to reach their checkpoint; every other run is
** released at once, without a write. Then the open group is committed, the
** lease given up (its runs become claimable at once) and the handles
** closed: the loop returns. grace_ms 0 releases everything at once. */
void sched_stop(sched_t *s, int64_t grace_ms);
void sched_free(sched_t *s);

/* ---- control operations, for the HTTP server ------------------------
** Each validates its input at once (a failure returns a negative code and
** the callback never fires), then writes through the open journal group;
** the callback fires once the write is durable, from the loop, with the
** JSON body to answer with, or with an error. */

struct sched_reply {
  int rc;              /* 0, or a negative ERR_* code (ERR_NOTFOUND -> 404, ...) */
  const char *message; /* when rc != 0 */
  const char *json;    /* when rc == 0: the answer's JSON body */
};
typedef void (*sched_reply_cb)(const struct sched_reply *r, void *arg);

/* POST /v1/events: events is a JSON array of {name, data, id?} (id: an
** idempotency key; a repeat is accepted and ignored). Answers {"ids": [...]},
** the event ids in order (a repeat gets the first event's id). */
int sched_send_events(sched_t *s, const cJSON *events, sched_reply_cb cb, void *arg, err_t *e);

/* POST /v1/skills/{id}/invoke: start a run of skill's live version with
** input data_json. wait_ms 0 answers {"run_id"} once its row is durable;
** wait_ms > 0 answers when the run ends, {"run_id", "status", "output",
** "error"}, or after wait_ms with {"run_id", "status": "running"} (still
** going). key (NULL: none, at most SCHED_KEY_MAX bytes) makes the start
** idempotent: a key the skill's runs already have starts nothing and
** answers for the first run (with wait_ms, once it ends). */
#define SCHED_KEY_MAX 256
int sched_invoke(sched_t *s, const char *skill, const char *data_json, const char *key,
                 int64_t wait_ms, sched_reply_cb cb, void *arg, err_t *e);

/* POST /v1/runs/{id}/cancel: answers {"run_id", "status"}; ERR_CONFLICT
** for a run that already ended. Children are cancelled too. */
int sched_cancel(sched_t *s, const char *run_id, sched_reply_cb cb, void *arg, err_t *e);

/* POST /v1/runs/{id}/rerun: a new run of the same skill with the same
** input; answers {"run_id"} of the new run. */
int sched_rerun(sched_t *s, const char *run_id, const char *key, sched_reply_cb cb, void *arg,
                err_t *e);

/* The trigger of a rerun of run (its record, as store_get_run gives it),
** malloc'd JSON text: {"kind": "rerun", "run_id", "key"?}, with the run's
** event when an event started it. Also `moonloop rerun`'s, without a server. */
char *sched_rerun_trigger(const cJSON *run, const char *key);

/* PUT /v1/skills/{id}: validate Lua source and register it as the live
** version of skill id (the id in the source must match), as the file
** `file` (the sidecar's path; NULL: "<id>.lua"); answers the skill record.
** A source that fails answers its error (ERR_INVALID: file, line; ERR_CONFLICT:
** the id belongs to another file) and keeps it as the skill's load error. */
int sched_put_skill(sched_t *s, const char *id, const char *file, const char *source,
                    size_t len, sched_reply_cb cb, void *arg, err_t *e);

/* Whether the registry would refuse source as skill id's file `file` (as
** a PUT judges it: the file another skill's, the id another existing
** file's, a concurrency scope with another limit in another live skill):
** 0, or the refusal's code and message. skills.deploy asks before it
** writes, so that a deploy the engine would refuse fails, saying why. */
int sched_skill_refusal(sched_t *s, const char *id, const char *file, const char *source,
                        size_t len, err_t *e);

/* ---- the skill registry, for the sidecar ---------------------------- */

/* A skill file's source changed (or appeared): validate it as `moonloop
** check` does, refuse an id that another existing file already defines,
** then make it its skill's live version. New runs start on it; runs in
** flight finish on the version they started with. A file that fails is
** recorded as its skill's last load error ({message, file, line, at}: the
** skill is the one this file registered before, or the file's default id)
** and the previous version stays live. The callback answers with the
** skill record, or with the error. Synchronous failures: only out of memory. */
int sched_load_file(sched_t *s, const char *path, const char *source, size_t len,
                    sched_reply_cb cb, void *arg, err_t *e);

/* A skill file was removed: the skill it registered has no live version
** any more (its triggers stop; runs in flight finish). Answers the skill
** record; ERR_NOTFOUND when no skill came from that file. */
int sched_unload_file(sched_t *s, const char *path, sched_reply_cb cb, void *arg, err_t *e);

/* DELETE /v1/skills/{id} (the standalone sidecar's file deletions), and a
** file that now declares another id: skill id has no live version any more
** (its triggers stop; runs in flight finish). With file (may be NULL),
** only when id's live version came from that file: a deletion that arrives
** after another file took the id changes nothing. Answers the skill record;
** ERR_NOTFOUND for an unknown skill, one with no live version, or one whose
** file is another. */
int sched_unload_skill(sched_t *s, const char *id, const char *file, sched_reply_cb cb,
                       void *arg, err_t *e);

/* Figures for benchmarks and /metrics. Resume samples (the loop-thread
** time of one resume and the op it yields, in ns) are kept only when
** enabled, up to cap of them. */
#define SCHED_STEP_BUCKETS 10
extern const double sched_step_bounds_ms[SCHED_STEP_BUCKETS]; /* upper bounds, the last is +Inf */

struct sched_stats {
  uint64_t resumes, commits, committed_entries;
  uint64_t step_buckets[SCHED_STEP_BUCKETS]; /* steps ended, by duration (not cumulative) */
  uint64_t step_count;
  double step_sum_ms;
  uint64_t runs_completed, runs_failed, runs_cancelled, runs_skipped;
  uint64_t takeovers;   /* runs resumed that another process had started */
  uint64_t replays;     /* runs booted from a journal with steps in it (takeovers, wakes after an eviction) */
  uint64_t leases_lost; /* times this process found its lease gone (fenced) */
  uint64_t commit_failures; /* commits that failed (and were tried again) */
  int writes_refused;   /* 1 while the database cannot be written: writes get 503 */
  int ready;            /* tasks ready to resume now */
  uint32_t *samples;
  size_t nsamples, cap;
};
void sched_stats_enable(sched_t *s, size_t cap);
const struct sched_stats *sched_stats(const sched_t *s);

/* This process's lease owner id. */
const char *sched_owner(const sched_t *s);

#endif
