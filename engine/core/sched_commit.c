/*
** sched_commit.c: the scheduler's commit pipeline and its lease (see
** sched.h for the loop iteration, sched_int.h for the shared state).
**
** Writes of the loop's tasks go into the open journal group (s->open);
** whoever must wait for them to be durable adds a waiter to that group
** (sched__after_commit, sched__after_entry). The pipeline runs one job at
** a time on libuv's thread pool:
**
**   commit    a journal group, in one transaction that also renews the
**             lease (an empty group renews it when nothing else has lately)
**   dispatch  accepted events: start triggered runs, deliver to waits
**   prune     history past the retention (serve, hourly)
**   reap      leases of dead processes (serve)
**   claim     unowned unfinished runs (serve), adopted here
**
** Jobs use the store's writer connection, which nothing else touches while
** a job is in flight; the loop thread only reads. Groups commit in order:
** a failed group is kept (s->retry) and committed again before any other,
** so a later group's durability still implies every earlier one's. A
** commit refused because the lease is gone (another process fenced this
** one) drops every run of this process without writing anything.
*/
#include "base/ids.h"
#include "base/proc.h"
#include "base/term.h"
#include "base/units.h"
#include "core/sched_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CLAIM_BATCH 500

enum job_kind { JOB_COMMIT, JOB_CLAIM, JOB_REAP, JOB_DISPATCH, JOB_PRUNE };

/* One job of the pipeline: filled by work_cb on the commit thread, read by
** after_work_cb on the loop thread. */
struct job {
  uv_work_t work;
  sched_t *s;
  enum job_kind kind;
  struct group g;
  int rc;
  err_t err;
  struct run_row *rows;
  size_t nrows;
};

/* ---- journal groups ---- */

/* See sched_int.h. */
int sched__group_init(struct group *g) {
  memset(g, 0, sizeof *g);
  g->j = journal_new();
  return g->j ? 0 : ERR_NOMEM;
}

/* See sched_int.h. */
int sched__group_empty(const struct group *g) { return !g->j || (!journal_count(g->j) && !g->nw); }

/* A new, zeroed waiter of the open group. Aborts when out of memory: a
** task that wrote could then never be resumed. */
static struct gwait *add_wait(sched_t *s) {
  struct group *g = &s->open;
  if (g->nw == g->cap) {
    size_t cap = g->cap ? g->cap * 2 : 256;
    struct gwait *w = realloc(g->w, cap * sizeof *w);
    if (!w) abort(); /* cannot keep the promise to resume: nothing sane is left */
    g->w = w;
    g->cap = cap;
  }
  struct gwait *w = &g->w[g->nw++];
  memset(w, 0, sizeof *w);
  return w;
}

/* See run.h: call fn(arg) once the open group is durable. */
void sched__after_commit(sched_t *s, void (*fn)(void *arg), void *arg) {
  struct gwait *w = add_wait(s);
  w->fn = fn;
  w->arg = arg;
}

/* See run.h. */
void sched__after_entry(sched_t *s, void (*fn)(void *arg, const struct jentry *e), void *arg) {
  size_t n = journal_count(s->open.j);
  struct gwait *w = add_wait(s);
  w->efn = fn;
  w->arg = arg;
  w->idx = n ? n - 1 : 0;
}

/* ---- the commit pipeline ---- */

/* The commit thread: run the job against the store's writer connection. */
static void work_cb(uv_work_t *w) {
  struct job *j = w->data;
  sched_t *s = j->s;
  switch (j->kind) {
  case JOB_COMMIT:
    j->rc = store_commit(s->o.store, j->g.j, &j->err);
    break;
  case JOB_CLAIM:
    j->rc = store_claim(s->o.store, s->owner, CLAIM_BATCH, &j->rows, &j->nrows, &j->err);
    break;
  case JOB_REAP:
    j->rc = store_reap(s->o.store, proc_hostname(), units_now_ms(), &j->err);
    break;
  case JOB_PRUNE: {
    int64_t runs = 0, events = 0;
    j->rc = store_prune(s->o.store, units_now_ms() - s->o.retention_ms, &runs, &events, &j->err);
    j->nrows = (size_t)runs;
    break;
  }
  case JOB_DISPATCH: {
    int runs = 0;
    j->rc = store_dispatch(s->o.store, units_now_ms(), 200, &runs, &j->err);
    j->nrows = (size_t)runs;
    break;
  }
  }
}

static void lease_lost(sched_t *s, const char *why);

/* Errors of the engine that concern a run go into its trace: a group that
** failed to commit gets a warning line for each run it touches (it is
** retried as a whole, so the lines land with the writes). */
static void note_commit_failure(journal_t *j, const char *why) {
  const char *done[32];
  int n = 0;
  size_t count = journal_count(j);
  char msg[1200];
  snprintf(msg, sizeof msg, "engine: writing this run's journal failed, retrying: %s", why);
  for (size_t i = 0; i < count && n < 32; i++) {
    const struct jentry *e = journal_entry(j, i);
    const char *id = e->kind == J_STEP ? e->u.step.run_id : e->kind == J_RUN_SET ? e->u.set.run_id
                   : NULL;
    if (!id) continue;
    int seen = 0;
    for (int k = 0; k < n && !seen; k++) seen = !strcmp(done[k], id);
    if (seen) continue;
    done[n++] = id;
    struct log_row l = {.run_id = id, .seq = 0, .ts = units_now_ms(), .level = "warn", .msg = msg};
    journal_log(j, &l);
  }
}

/* Call what waits for the group g, in order, then free the group. */
static void group_done(struct group *g) {
  for (size_t i = 0; i < g->nw; i++) {
    struct gwait *w = &g->w[i];
    if (w->efn) w->efn(w->arg, journal_entry(g->j, w->idx));
    else w->fn(w->arg);
  }
  journal_free(g->j);
  free(g->w);
}

/* A commit job came back: on success, note what the group asks for next
** (a dispatch, a poll), show it to the observer and call its waiters; when
** fenced, drop the runs first; on another failure, keep the group to
** commit again first, after 200 ms. */
static void commit_done(sched_t *s, struct job *j) {
  if (j->rc == 0) {
    s->last_commit_ms = units_now_ms();
    s->stats.commits++;
    s->stats.committed_entries += journal_count(j->g.j);
    for (size_t i = 0, n = journal_count(j->g.j); i < n; i++) {
      const struct jentry *je = journal_entry(j->g.j, i);
      if (je->kind == J_EVENT) s->dispatch_wanted = 1;
      if (je->kind == J_CHILD_DONE || je->kind == J_CANCEL || (je->kind == J_WAIT && je->result))
        s->poll_wanted = 1;
    }
    if (s->observer)
      for (size_t i = 0, n = journal_count(j->g.j); i < n; i++)
        s->observer(journal_entry(j->g.j, i), s->observer_arg);
    group_done(&j->g);
  } else if (j->rc == ERR_CONFLICT) {
    /* Fenced: another process owns our runs now. They are dropped first,
    ** without writing anything, so their waiters find them aborted. */
    lease_lost(s, j->err.msg);
    group_done(&j->g);
  } else {
    fprintf(stderr, "moonloop: commit failed, retrying: %s\n", j->err.msg);
    note_commit_failure(j->g.j, j->err.msg);
    s->retry = j->g;
    s->retry_at = units_now_ms() + 200;
  }
}

/* The loop thread, once a job is back: act on its result, free it, and
** start the next job. */
static void after_work_cb(uv_work_t *w, int status) {
  struct job *j = w->data;
  sched_t *s = j->s;
  s->inflight = NULL;
  if (status == UV_ECANCELED) j->rc = err_set(&j->err, ERR_BUSY, "cancelled");
  switch (j->kind) {
  case JOB_COMMIT:
    commit_done(s, j);
    break;
  case JOB_CLAIM:
    s->last_claim_ms = units_now_ms();
    if (j->rc) {
      fprintf(stderr, "moonloop: claiming runs failed: %s\n", j->err.msg);
    } else {
      for (size_t i = 0; i < j->nrows && !s->stopping; i++) {
        err_t e;
        if (sched_adopt(s, &j->rows[i], &e))
          term_printf(stderr, "moonloop: cannot resume run %s: %s\n", j->rows[i].id, e.msg);
      }
      if (j->nrows == CLAIM_BATCH) s->claim_wanted = 1;
      store_rows_free(j->rows, j->nrows);
    }
    break;
  case JOB_REAP:
    s->last_reap_ms = units_now_ms();
    if (j->rc > 0) s->claim_wanted = 1;
    break;
  case JOB_PRUNE:
    s->last_prune_ms = units_now_ms();
    if (j->rc) fprintf(stderr, "moonloop: pruning history failed: %s\n", j->err.msg);
    else if (j->nrows) fprintf(stderr, "moonloop: pruned %zu runs past the retention\n", j->nrows);
    break;
  case JOB_DISPATCH:
    if (j->rc < 0) {
      fprintf(stderr, "moonloop: dispatching events failed: %s\n", j->err.msg);
    } else {
      if (j->rc == 200) s->dispatch_wanted = 1; /* more are waiting */
      if (j->nrows) s->claim_wanted = 1;
      if (j->rc > 0) s->poll_wanted = 1;
    }
    break;
  }
  free(j);
  sched__maybe_submit(s);
}

/* Hand j to the commit thread; j is freed if that fails. */
static void submit(sched_t *s, struct job *j) {
  j->s = s;
  j->work.data = j;
  s->inflight = j;
  if (uv_queue_work(s->o.loop, &j->work, work_cb, after_work_cb)) {
    s->inflight = NULL;
    free(j);
  }
}

/* Submit a new job of kind (not a commit); nothing when out of memory. */
static void submit_new(sched_t *s, enum job_kind kind) {
  struct job *j = calloc(1, sizeof *j);
  if (!j) return;
  j->kind = kind;
  submit(s, j);
}

/* See sched_int.h: a failed group first, then the open group (or an empty
** one to renew the lease), then dispatching events, and in serve mode
** pruning, reaping or claiming when they are due. */
void sched__maybe_submit(sched_t *s) {
  if (s->inflight) return;
  int64_t now = units_now_ms();
  int64_t ttl = s->o.lease_ttl_ms;
  struct job *j;
  if (!sched__group_empty(&s->retry)) {
    if (now < s->retry_at) return;
    if (!(j = calloc(1, sizeof *j))) return;
    j->kind = JOB_COMMIT;
    j->g = s->retry;
    memset(&s->retry, 0, sizeof s->retry);
    journal_set_owner(j->g.j, s->owner, now + ttl);
    submit(s, j);
    return;
  }
  /* An empty group still renews the lease when nothing else has lately. */
  int renew = s->handles_open && now - s->last_commit_ms > ttl / 3;
  if (!sched__group_empty(&s->open) || renew) {
    if (!(j = calloc(1, sizeof *j))) return;
    j->kind = JOB_COMMIT;
    j->g = s->open;
    if (sched__group_init(&s->open)) abort();
    journal_set_owner(j->g.j, s->owner, now + ttl);
    submit(s, j);
    return;
  }
  if (s->dispatch_wanted && !s->stopping) {
    s->dispatch_wanted = 0;
    submit_new(s, JOB_DISPATCH);
    return;
  }
  if (s->o.mode != SCHED_SERVE || s->stopping) return;
  if (s->o.retention_ms > 0 && now - s->last_prune_ms > 3600 * 1000) {
    submit_new(s, JOB_PRUNE);
    return;
  }
  if (now - s->last_reap_ms > ttl / 2) {
    submit_new(s, JOB_REAP);
    return;
  }
  if (s->claim_wanted || now - s->last_claim_ms > 2000) {
    s->claim_wanted = 0;
    submit_new(s, JOB_CLAIM);
  }
}

/* ---- the lease ---- */

/* See sched_int.h: a new owner name (kind-pid-random) and its lease row;
** taking it counts as a commit for the lease's renewal. */
int sched__take_lease(sched_t *s, err_t *e) {
  unsigned char rnd[6];
  ids_random(rnd, sizeof rnd);
  snprintf(s->owner, sizeof s->owner, "%s-%ld-%02x%02x%02x%02x%02x%02x", s->o.lease_kind,
           (long)getpid(), rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5]);
  struct lease l = {
    .owner = s->owner, .kind = s->o.lease_kind, .host = proc_hostname(), .pid = (long)getpid(),
    .pid_start = proc_start_time((long)getpid()),
    .expires_at = units_now_ms() + s->o.lease_ttl_ms,
  };
  s->last_commit_ms = units_now_ms();
  return store_lease_acquire(s->o.store, &l, e);
}

/* The store fenced a commit: another process took this one's runs. Drop
** them all (without a write) and, for a long-lived engine, take a new lease. */
static void lease_lost(sched_t *s, const char *why) {
  fprintf(stderr, "moonloop: %s; dropping this process's runs\n", why);
  while (s->runs) run_abort(s->runs, NULL, NULL);
  /* Long-lived engines go on with a new lease (the REPL too: its next
  ** runs need one). */
  if ((s->o.mode == SCHED_SERVE || s->o.mode == SCHED_REPL) && !s->stopping) {
    err_t e;
    if (sched__take_lease(s, &e)) fprintf(stderr, "moonloop: cannot take a new lease: %s\n", e.msg);
    s->claim_wanted = s->o.mode == SCHED_SERVE;
  }
}
