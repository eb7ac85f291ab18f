/*
** sched_int.h: the scheduler's own internals, shared by its files and by
** nothing else:
**
**   sched.c         the centre: the ready queue, concurrency slots, runs
**                   (starting, adopting, ending), the tick, start and stop
**   sched_commit.c  the commit pipeline (journal groups and the jobs of the
**                   commit thread) and the process's lease
**   sched_heap.c    the timer heap and the map of live runs by id
**   sched_cron.c    cron triggers (through run.h's sched__ functions)
**   sched_watch.c   who waits for runs to end (sched_on_done, attach)
**
** What the run context needs from the scheduler is in run.h's sched__
** section; this header is for the scheduler's files only.
**
** Invariants: everything here is touched from the loop thread only, except
** a job in flight (s->inflight), which the commit thread owns from
** uv_queue_work until its after_work callback. At most one job is in
** flight. s->open collects the writes of the current loop iteration;
** s->retry, when not empty, is a group whose commit failed: it commits
** again before anything else, so groups stay in order.
*/
#ifndef ML_SCHED_INT_H
#define ML_SCHED_INT_H
#include "core/run.h"
#include "core/sched.h"

/* Something to call once the group it belongs to is durable: fn, or efn
** with the journal entry idx of that group (to read the store's answer).
** A request from outside (fail set) wrote entries first..idx; when the
** group cannot be committed, fail is called instead (with the reason) and
** those entries are dropped: nothing of the request is stored. */
struct gwait {
  void (*fn)(void *arg);
  void (*efn)(void *arg, const struct jentry *e);
  void (*fail)(void *arg, const char *msg);
  void *arg;
  size_t first, idx;
};

/* A journal group and what waits for it to be durable. noted: its runs'
** traces already say that it failed once. */
struct group {
  journal_t *j;
  struct gwait *w;
  size_t nw, cap;
  int noted;
};

struct job;  /* sched_commit.c's */
struct wrun; /* sched_watch.c's: the waiters of one run */

/* Who waits for runs to end (sched_watch.c): run id -> waiters. */
struct sched_watches {
  struct wrun **b;      /* chained buckets, a power of two */
  size_t nb, n;
  size_t nremote;       /* entries whose run may end in another process */
  size_t nremote_watch; /* watches on those: the tick asks the store only then */
  int failing;          /* the last check could not read the store: the tick asks again */
};

#define SCHED_TREE_BUCKETS 256
struct tree_count;

struct sched {
  struct sched_opts o;
  char owner[40];
  uv_idle_t idle;
  uv_prepare_t prepare;
  uv_timer_t heap_timer;
  uv_timer_t tick;
  struct wake_poll *wake; /* watching the store's wake-up descriptor (sched.c), or NULL */
  int handles_open;
  struct group open;
  struct group retry;    /* a group whose commit failed, to commit first (retry.j set) */
  int64_t retry_at;
  int64_t lease_until;   /* the lease's expiry as this process last renewed it */
  int lease_doubt;       /* too close to lease_until: no step body or request starts */
  int lease_wanted;      /* the lease was lost and a new one could not be taken yet */
  struct {               /* commits failing (a full disk, a lock held): one episode */
    int64_t since;       /* when the first failed, 0 when healthy */
    int64_t delay;       /* the back-off before the next try */
    int count;
    char msg[1024];
  } fail;
  struct job *inflight;
  struct task *ready_head, *ready_tail;
  struct stimer **heap;
  size_t heap_n, heap_cap;
  struct task *cur;
  struct run *runs;
  int nruns;
  struct sched_watches watches;
  int stopping;
  int claim_wanted;
  int dispatch_wanted;
  int64_t dispatch_at;       /* a dispatch (or delivery) that failed goes again then (ms) */
  int64_t last_job_ms;       /* when the pipeline last took a job other than a commit */
  struct run_row *later;     /* claimed runs whose version could not be read just now, */
  size_t nlater;             /* adopted again at later_at (sched__adopt_later) */
  int64_t later_at;
  int poll_wanted;
  int poll_failing; /* the last poll could not read the store: the next tick polls again */
  struct run **map; /* live runs by id: open addressing, NULL or TOMBSTONE */
  size_t map_cap, map_n;
  int parked;       /* main tasks parked on a sleep, wait or invoke, in memory */
  struct cron_entry *crons;
  struct tree_count *trees[SCHED_TREE_BUCKETS]; /* sched_tree.c: runs started per tree of invokes */
  int crons_built; /* the cron entries were built once since the engine started */
  struct stimer grace;       /* the end of the shutdown's grace period */
  int64_t stop_deadline;     /* stopping: past it, writes the store refuses are given up */
  int triggers_live;         /* serve: the registry holds the live set (sched_triggers_live) */
  int64_t deliver_cursor;    /* without the live triggers: events delivered so far
                             ** (store_deliver; -1 before the first look) */
  struct { sched_done_cb cb; void *arg; } finish[4];
  int nfinish;
  int64_t data_version;
  /* skills' live versions as last looked up (sched__live_skill), until the
  ** registry changes here (sched__live_forget) or anywhere (the tick) */
  struct { char id[132]; struct skill *sk; } live[16];
  int nlive, live_next;
  int64_t last_commit_ms, last_claim_ms, last_reap_ms, last_prune_ms, last_file_check_ms;
  struct sched_stats stats;
  sched_observer_cb observer; /* sched_observe (the REPL) */
  void *observer_arg;
};

/* ---- sched_commit.c ---- */

/* Adopt again, once their second is up, the claimed runs whose skill
** version could not be read (the tick). */
void sched__adopt_later(sched_t *s);

/* Make g an empty group with a new journal. */
void sched__group_init(struct group *g);
/* Whether g holds no entry and no waiter (or no journal at all). */
int sched__group_empty(const struct group *g);
/* Start the next job of the commit pipeline if none is in flight. */
void sched__maybe_submit(sched_t *s);
/* Take a new lease for this process (a new owner name). */
int sched__take_lease(sched_t *s, err_t *e);
/* Stopping, and the store refuses the last writes: stop without them. */
void sched__give_up(sched_t *s);
/* Check that the database file is still at its path (the tick, every second). */
void sched__check_store(sched_t *s);
/* Resume the ready tasks from the next loop turn (unless the lease gate holds). */
void sched__kick(sched_t *s);
/* Whether this process may start a step body or a request now: its lease,
** as it last renewed it, does not expire within the margin. */
int sched__lease_fresh(sched_t *s);

/* ---- sched_watch.c ---- */

/* A run of this process ended (its end durable), or was abandoned. */
void sched__watch_ended(sched_t *s, const struct sched_result *res);
/* Another connection committed: which watched runs executed elsewhere ended? */
void sched__watch_poll(sched_t *s);
/* The scheduler stops: every watch is told its wait is over (the run goes
** on in whichever process takes it); done waiters hear "abandoned" from
** the runs released. */
void sched__watch_stop(sched_t *s);
/* Free every waiter without calling it (the scheduler is freed). */
void sched__watch_free(sched_t *s);

/* ---- sched_heap.c ---- */

/* Arm the loop's heap timer for the earliest timer (stop it if none). */
void sched__heap_rearm(sched_t *s);
/* Add r to the map of live runs / take it out. */
void sched__map_put(sched_t *s, struct run *r);
void sched__map_del(sched_t *s, struct run *r);

#endif
