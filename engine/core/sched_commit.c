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
**             (an engine without the live triggers: deliver only)
**   prune     history past the retention (serve, hourly)
**   reap      leases of dead processes (serve)
**   claim     unowned unfinished runs (serve), adopted here
**
** Jobs use the store's writer connection, which nothing else touches while
** a job is in flight; the loop thread only reads. Groups commit in order:
** a failed group is kept (s->retry) and committed again before any other,
** so a later group's durability still implies every earlier one's.
**
** Failures, and what each costs:
**
**   the store cannot write   (a full disk, a lock held past the busy
**                            timeout, the file deleted): the group is tried
**                            again with a growing back-off (200 ms to 5 s),
**                            one line on stderr per episode and one in each
**                            touched run's trace per group. Requests from
**                            outside in it (HTTP, the sidecar) are answered
**                            at once with the reason and their entries
**                            dropped; new ones are refused until a commit
**                            works again. Runs wait: nothing is lost.
**   a run is fenced          (the store says another process holds it): the
**                            run is dropped here, with its pending entries,
**                            and the group goes again without them.
**   the lease is lost        (reaped while this process was frozen): every
**                            run is dropped, and every pending entry written
**                            for one (journal_run_of) is taken back from the
**                            groups, so a new lease never commits old work;
**                            what came from outside (events, invokes,
**                            skills) is kept and commits under the new lease.
**
** The lease gate: a lease this process cannot show it still holds (its
** expiry as last renewed, less a margin of a quarter of the lease, has
** passed: it was frozen, or commits fail) starts no step body and sends no
** request (httpc's gate) until a renewal commits; a lost lease then drops
** the runs instead.
*/
#include "base/fault.h"
#include "base/ids.h"
#include "base/mem.h"
#include "base/proc.h"
#include "base/term.h"
#include "base/units.h"
#include "core/sched_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CLAIM_BATCH 500
/* Runs are claimed when another process's write may have made some
** claimable (a notification, a reconnection: sched.c's notice_writes), and
** at least this often whatever was noticed (ms): a wake-up that was lost
** (a notification sent while the connection was down, a claim that took
** runs and failed) costs a run this long at most. */
#define CLAIM_EVERY_MS 2000

enum job_kind { JOB_COMMIT, JOB_CLAIM, JOB_REAP, JOB_DISPATCH, JOB_DELIVER, JOB_PRUNE };

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
  int64_t cursor; /* JOB_DELIVER: the events looked at so far (store_deliver) */
};

/* ---- journal groups ---- */

/* See sched_int.h. */
void sched__group_init(struct group *g) {
  memset(g, 0, sizeof *g);
  g->j = journal_new();
}

/* See sched_int.h. */
int sched__group_empty(const struct group *g) { return !g->j || (!journal_count(g->j) && !g->nw); }

/* Whether g holds an entry that is not dropped. */
static int group_live(const struct group *g) {
  for (size_t i = 0, n = g->j ? journal_count(g->j) : 0; i < n; i++)
    if (!journal_entry(g->j, i)->dropped) return 1;
  return 0;
}

/* A new, zeroed waiter of the open group. */
static struct gwait *add_wait(sched_t *s) {
  struct group *g = &s->open;
  if (g->nw == g->cap) {
    size_t cap = g->cap ? g->cap * 2 : 256;
    g->w = mem_realloc(g->w, cap * sizeof *g->w);
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

/* See run.h. */
void sched__after_request(sched_t *s, size_t first,
                          void (*ok)(void *arg, const struct jentry *last),
                          void (*fail)(void *arg, const char *msg), void *arg) {
  size_t n = journal_count(s->open.j);
  struct gwait *w = add_wait(s);
  w->efn = ok;
  w->fail = fail;
  w->arg = arg;
  w->first = first;
  w->idx = n ? n - 1 : 0;
}

/* Answer the requests from outside waiting on g with msg, and drop their
** entries: a writer hears at once that nothing was stored. */
static void fail_requests(struct group *g, const char *msg) {
  for (size_t i = 0; i < g->nw; i++) {
    struct gwait *w = &g->w[i];
    if (!w->fail) continue;
    for (size_t k = w->first; k <= w->idx && k < journal_count(g->j); k++) journal_drop(g->j, k);
    void (*fail)(void *, const char *) = w->fail;
    void *arg = w->arg;
    w->fn = NULL, w->efn = NULL, w->fail = NULL;
    fail(arg, msg); /* may drop runs: other entries of g */
  }
}

/* Drop from g the entries written for run id, or for a run it created. */
static void drop_entries_of(struct group *g, const char *id) {
  for (size_t i = 0, n = g->j ? journal_count(g->j) : 0; i < n; i++) {
    const struct jentry *e = journal_entry(g->j, i);
    const char *of = journal_run_of(e);
    if ((of && !strcmp(of, id)) || (e->kind == J_RUN_NEW && !strcmp(e->u.run.id, id)))
      journal_drop(g->j, i);
  }
}

/* See run.h: the run, then the runs it started here (children). */
void sched__drop_run(sched_t *s, const char *id) {
  char keep[27];
  snprintf(keep, sizeof keep, "%s", id); /* id may belong to the run freed below */
  drop_entries_of(&s->retry, keep);
  drop_entries_of(&s->open, keep);
  struct run *r = sched__find(s, keep);
  if (r) run_abort(r, NULL, NULL);
  for (struct run *c = s->runs, *next; c; c = next) {
    next = c->next;
    if (c->parent_id && !strcmp(c->parent_id, keep)) {
      sched__drop_run(s, c->id);
      next = s->runs; /* the list changed under us: start over */
    }
  }
}

/* See run.h. */
int sched__refuse_write(sched_t *s, err_t *e) {
  if (!s->fail.since) return 0;
  return err_set(e, ERR_BUSY, "the engine cannot write to its database: %s; nothing was "
                 "stored, try again later", s->fail.msg);
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
  case JOB_DELIVER:
    j->rc = store_deliver(s->o.store, &j->cursor, 200, &j->err);
    break;
  }
}

static void lease_lost(sched_t *s, const char *why);

/* Errors of the engine that concern a run go into its trace: a group that
** failed to commit gets a warning line for each run it touches (it is
** retried as a whole, so the lines land with the writes), once per group
** however often it is tried. */
static void note_commit_failure(struct group *g, const char *why) {
  if (g->noted) return;
  g->noted = 1;
  journal_t *j = g->j;
  const char *done[32];
  int n = 0;
  size_t count = journal_count(j);
  char msg[1200];
  snprintf(msg, sizeof msg, "engine: writing this run's journal failed, retrying: %s", why);
  for (size_t i = 0; i < count && n < 32; i++) {
    const struct jentry *e = journal_entry(j, i);
    if (e->dropped) continue;
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

/* Call what the engine itself waits for in the group g (the waiters that
** are not requests from outside), in order, and forget them: the runs
** that go on write their next entries into the open group before it is
** handed to the commit thread. */
static void group_resume_runs(struct group *g) {
  for (size_t i = 0; i < g->nw; i++) {
    struct gwait *w = &g->w[i];
    if (w->fail) continue;
    if (w->efn) w->efn(w->arg, journal_entry(g->j, w->idx));
    else if (w->fn) w->fn(w->arg);
    w->efn = NULL, w->fn = NULL;
  }
}

/* Call what waits for the group g, in order, then free the group. */
static void group_done(struct group *g) {
  for (size_t i = 0; i < g->nw; i++) {
    struct gwait *w = &g->w[i];
    if (w->efn) w->efn(w->arg, journal_entry(g->j, w->idx));
    else if (w->fn) w->fn(w->arg);
  }
  journal_free(g->j);
  free(g->w);
  memset(g, 0, sizeof *g);
}

/* The lease is fresh again (a renewal committed): let what the gate held
** go (the idle handle's tasks, and requests httpc held: those may have met
** the gate without the loop noticing). */
static void lease_renewed(sched_t *s, int64_t until) {
  s->lease_until = until;
  if (!sched__lease_fresh(s)) return;
  if (s->o.http && httpc_held(s->o.http)) httpc_gate_open(s->o.http);
  if (!s->lease_doubt) return;
  s->lease_doubt = 0;
  fprintf(stderr, "moonloop: lease renewed: step bodies and requests go on\n");
  sched__kick(s);
}

/* A commit failed for a reason other than fencing: keep the group to try
** again first, after a back-off that grows; say so once per episode. */
static void commit_failed(sched_t *s, struct job *j) {
  int64_t now = units_now_ms();
  /* The refusal new writers hear: a commit in doubt is an earlier one's
  ** (theirs was not sent), which the message must not leave unclear. */
  char msg[sizeof s->fail.msg];
  size_t pre = strlen(STORE_IN_DOUBT);
  if (!strncmp(j->err.msg, STORE_IN_DOUBT, pre))
    snprintf(msg, sizeof msg, "an earlier commit is in doubt, and is looked up before anything "
             "else is written (%s)", j->err.msg + pre);
  else
    snprintf(msg, sizeof msg, "%s", j->err.msg);
  if (!s->fail.since) {
    s->fail.since = now;
    s->fail.count = 0;
    s->fail.delay = 200;
    snprintf(s->fail.msg, sizeof s->fail.msg, "%s", msg);
    fprintf(stderr, "moonloop: %s: %s; trying again with a back-off, runs wait, and new writes "
            "are refused meanwhile (HTTP 503)\n", strstr(j->err.msg, STORE_FILE_GONE)
            ? "DATABASE FILE GONE" :
            "cannot write to the database", msg);
  } else {
    s->fail.delay = s->fail.delay * 2 > 5000 ? 5000 : s->fail.delay * 2;
    if (strcmp(s->fail.msg, msg)) {
      snprintf(s->fail.msg, sizeof s->fail.msg, "%s", msg);
      fprintf(stderr, "moonloop: cannot write to the database: %s\n", msg);
    }
  }
  s->fail.count++;
  s->stats.commit_failures++;
  note_commit_failure(&j->g, j->err.msg);
  s->retry = j->g;
  memset(&j->g, 0, sizeof j->g);
  s->retry_at = now + s->fail.delay;
  /* Writers waiting on these groups hear now, not when the disk has room;
  ** but those of a group whose commit is in doubt (it may have been stored)
  ** wait for the store to find out, then hear what became of it. */
  if (strncmp(j->err.msg, STORE_IN_DOUBT, strlen(STORE_IN_DOUBT)))
    fail_requests(&s->retry, s->fail.msg);
  fail_requests(&s->open, s->fail.msg);
}

/* The store refused entry idx of the job's group: its run is another
** process's now. Drop the run and go again at once without it. */
static void run_fenced(sched_t *s, struct job *j, long idx) {
  const struct jentry *e = journal_entry(j->g.j, (size_t)idx);
  const char *of = journal_run_of(e);
  char id[27] = "";
  if (of) snprintf(id, sizeof id, "%s", of);
  else if (e->kind == J_RUN_NEW) snprintf(id, sizeof id, "%s", e->u.run.id);
  fprintf(stderr, "moonloop: %s; dropping %s here without writing\n", j->err.msg,
          *id ? "that run" : "that entry");
  s->retry = j->g;
  memset(&j->g, 0, sizeof j->g);
  s->retry_at = 0;
  if (*id) sched__drop_run(s, id);
  else journal_drop(s->retry.j, (size_t)idx);
}

/* A commit job came back: on success, note what the group asks for next
** (a dispatch, a poll), show it to the observer and call its waiters; when
** fenced, drop the run or (lease lost) the runs first; on another failure,
** keep the group to commit again first, after a back-off. A committed
** group whose requests are still to be answered goes to *answers. */
static void commit_done(sched_t *s, struct job *j, struct group *answers) {
  if (j->rc == 0) {
    int64_t until;
    journal_owner(j->g.j, &until);
    s->last_commit_ms = units_now_ms();
    if (s->fail.since) {
      char d[32];
      units_fmt_duration(s->last_commit_ms - s->fail.since, d, sizeof d);
      fprintf(stderr, "moonloop: the database is writable again (%d failed attempt%s over %s)\n",
              s->fail.count, s->fail.count == 1 ? "" : "s", d);
      s->fail.since = 0;
    }
    lease_renewed(s, until);
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
    /* The runs go on first; the requests from outside are answered once
    ** the next group is on its way (after_work_cb): the commit thread
    ** does not sit idle while the loop writes the answers. */
    group_resume_runs(&j->g);
    *answers = j->g;
    memset(&j->g, 0, sizeof j->g);
  } else if (j->rc == ERR_CONFLICT && journal_fenced(j->g.j) >= 0) {
    run_fenced(s, j, journal_fenced(j->g.j));
  } else if (j->rc == ERR_CONFLICT) {
    /* Fenced: another process owns our runs now. */
    s->retry = j->g;
    memset(&j->g, 0, sizeof j->g);
    s->retry_at = 0;
    lease_lost(s, j->err.msg);
  } else {
    commit_failed(s, j);
  }
}

/* Adopt the claimed runs rows[0..n). One whose skill version cannot be
** read just now (the database away) is this process's in the database
** all the same, and no other would take it: it is kept (moved out of
** rows) and adopted again a second later, rather than left unstarted. */
static void adopt_rows(sched_t *s, struct run_row *rows, size_t n) {
  for (size_t i = 0; i < n && !s->stopping; i++) {
    err_t e;
    if (!sched_adopt(s, &rows[i], &e)) continue;
    if (e.code != ERR_BUSY) {
      term_printf(stderr, "moonloop: cannot resume run %s: %s\n", rows[i].id, e.msg);
      continue;
    }
    if (!s->nlater)
      term_printf(stderr, "moonloop: cannot resume run %s yet, trying again in 1s: %s\n",
                  rows[i].id, e.msg);
    s->later = mem_realloc(s->later, (s->nlater + 1) * sizeof *s->later);
    s->later[s->nlater++] = rows[i];
    memset(&rows[i], 0, sizeof rows[i]);
    s->later_at = units_now_ms() + 1000;
  }
}

/* See sched_int.h. */
void sched__adopt_later(sched_t *s) {
  if (!s->nlater || units_now_ms() < s->later_at || s->stopping) return;
  struct run_row *rows = s->later;
  size_t n = s->nlater;
  s->later = NULL;
  s->nlater = 0;
  adopt_rows(s, rows, n);
  store_rows_free(rows, n);
}

/* A dispatch (or delivery) failed: its events are still there, and
** nothing else may ask for them again (another process's write, which
** wakes this one, may never come): try again a second later. */
static void dispatch_later(sched_t *s) {
  s->dispatch_wanted = 1;
  s->dispatch_at = units_now_ms() + 1000;
}

/* The loop thread, once a job is back: act on its result, free it, and
** start the next job. */
static void after_work_cb(uv_work_t *w, int status) {
  struct job *j = w->data;
  sched_t *s = j->s;
  struct group answers = {0};
  s->inflight = NULL;
  if (status == UV_ECANCELED) j->rc = err_set(&j->err, ERR_BUSY, "cancelled");
  switch (j->kind) {
  case JOB_COMMIT:
    commit_done(s, j, &answers);
    break;
  case JOB_CLAIM:
    s->last_claim_ms = units_now_ms();
    if (j->rc == ERR_CONFLICT) {
      /* The store found this process's lease gone: it took nothing, and
      ** this process's runs are another's now. */
      lease_lost(s, j->err.msg);
    } else if (j->rc) {
      fprintf(stderr, "moonloop: claiming runs failed: %s\n", j->err.msg);
    } else {
      adopt_rows(s, j->rows, j->nrows);
      if (j->nrows >= CLAIM_BATCH) s->claim_wanted = 1;
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
  case JOB_DELIVER:
    if (j->rc < 0) {
      fprintf(stderr, "moonloop: delivering events failed: %s\n", j->err.msg);
      dispatch_later(s);
    } else {
      s->deliver_cursor = j->cursor;
      if (j->rc == 200) s->dispatch_wanted = 1; /* more are waiting */
      if (j->rc > 0) s->poll_wanted = 1;
    }
    break;
  case JOB_DISPATCH:
    if (j->rc < 0) {
      fprintf(stderr, "moonloop: dispatching events failed: %s\n", j->err.msg);
      dispatch_later(s);
    } else {
      if (j->rc == 200) s->dispatch_wanted = 1; /* more are waiting */
      if (j->nrows) s->claim_wanted = 1;
      if (j->rc > 0) s->poll_wanted = 1;
    }
    break;
  }
  free(j);
  sched__maybe_submit(s);
  if (answers.j) group_done(&answers);
}

/* Hand j to the commit thread; j is freed if that fails. */
static void submit(sched_t *s, struct job *j) {
  if (j->kind != JOB_COMMIT) s->last_job_ms = units_now_ms();
  j->s = s;
  j->work.data = j;
  s->inflight = j;
  if (uv_queue_work(s->o.loop, &j->work, work_cb, after_work_cb)) {
    s->inflight = NULL;
    free(j);
  }
}

/* Submit a new job of kind (not a commit). */
static void submit_new(sched_t *s, enum job_kind kind) {
  struct job *j = mem_calloc(1, sizeof *j);
  j->kind = kind;
  submit(s, j);
}

/* See sched_int.h: a failed group first, then the open group (or an empty
** one to renew the lease), then dispatching events, and in serve mode
** pruning, reaping or claiming when they are due. While commits fail,
** nothing but the failed group is tried, and only once its back-off is
** over. */
void sched__maybe_submit(sched_t *s) {
  if (s->inflight) return;
  int64_t now = units_now_ms();
  int64_t ttl = s->o.lease_ttl_ms;
  struct job *j;
  if (s->retry.j && now < s->retry_at) return;
  if (s->lease_wanted) {
    /* The lease was lost and no new one could be taken: try again first. */
    err_t e;
    if (sched__take_lease(s, &e)) {
      s->retry_at = now + 1000;
      if (!s->retry.j) sched__group_init(&s->retry); /* holds the back-off */
      return;
    }
    s->lease_wanted = 0;
    fprintf(stderr, "moonloop: took a new lease (%s)\n", s->owner);
  }
  if (s->retry.j) {
    j = mem_calloc(1, sizeof *j);
    j->kind = JOB_COMMIT;
    j->g = s->retry;
    memset(&s->retry, 0, sizeof s->retry);
    journal_set_owner(j->g.j, s->owner, now + ttl);
    submit(s, j);
    return;
  }
  /* An empty group still renews the lease when nothing else has lately,
  ** or when the lease is getting short (commits are slow) or in doubt. */
  int renew = s->handles_open && (now - s->last_commit_ms > ttl / 3 ||
                                  s->lease_until - now < ttl / 2 || s->lease_doubt);
  int serve = s->o.mode == SCHED_SERVE && !s->stopping;
  int dispatch = s->dispatch_wanted && !s->stopping && now >= s->dispatch_at;
  int reap = serve && now - s->last_reap_ms > ttl / 2;
  int claim = serve && (s->claim_wanted || now - s->last_claim_ms > CLAIM_EVERY_MS);
  /* A busy engine has a group to commit each time the pipeline is free:
  ** the other jobs still get their turn, a second after the last at the
  ** latest, so that events are dispatched and runs claimed in bounded
  ** time however busy it is. */
  int starved = !s->fail.since && (dispatch || reap || claim) && now - s->last_job_ms >= 1000;
  if ((!sched__group_empty(&s->open) || renew) && !starved) {
    j = mem_calloc(1, sizeof *j);
    j->kind = JOB_COMMIT;
    j->g = s->open;
    sched__group_init(&s->open);
    journal_set_owner(j->g.j, s->owner, now + ttl);
    submit(s, j);
    return;
  }
  if (s->fail.since) return; /* the failed group's next try comes first */
  if (dispatch) {
    /* Only an engine whose registry holds the live triggers (serve, once
    ** its workspace is registered) starts the runs events trigger and
    ** marks events dispatched; any other only hands events to the waits
    ** registered for them, and leaves them to such an engine. */
    s->dispatch_wanted = 0;
    if (s->triggers_live) {
      submit_new(s, JOB_DISPATCH);
    } else {
      j = mem_calloc(1, sizeof *j);
      j->kind = JOB_DELIVER;
      j->cursor = s->deliver_cursor;
      submit(s, j);
    }
    return;
  }
  if (s->o.mode != SCHED_SERVE || s->stopping) return;
  if (s->o.retention_ms > 0 && now - s->last_prune_ms > 3600 * 1000) {
    submit_new(s, JOB_PRUNE);
    return;
  }
  if (reap) {
    submit_new(s, JOB_REAP);
    return;
  }
  if (claim) {
    s->claim_wanted = 0;
    submit_new(s, JOB_CLAIM);
  }
}

/* See sched_int.h: the file check of the tick. Commits check it too, but
** an idle engine commits only every third of its lease: writers should
** hear at once. */
void sched__check_store(sched_t *s) {
  err_t e;
  if (s->fail.since || !store_check_file(s->o.store, &e)) return;
  s->fail.since = units_now_ms();
  s->fail.count = 0;
  s->fail.delay = 5000;
  snprintf(s->fail.msg, sizeof s->fail.msg, "%s", e.msg);
  fprintf(stderr, "moonloop: DATABASE FILE GONE: %s\n", e.msg);
  /* What waits in the open group will not be stored: say so now. */
  fail_requests(&s->open, s->fail.msg);
}

/* See sched_int.h: a stopping engine whose store refuses its last writes
** (a full disk, a deleted file) past the grace period stops without them,
** saying so. They are the steps of runs it released (the next engine runs
** those steps again) and nothing acknowledged: writers were answered 503. */
void sched__give_up(sched_t *s) {
  size_t n = 0;
  struct group *gs[2] = {&s->retry, &s->open};
  for (int k = 0; k < 2; k++) {
    fail_requests(gs[k], s->fail.msg);
    for (size_t i = 0, c = gs[k]->j ? journal_count(gs[k]->j) : 0; i < c; i++) {
      if (!journal_entry(gs[k]->j, i)->dropped) n++;
      journal_drop(gs[k]->j, i);
    }
  }
  if (n)
    fprintf(stderr, "moonloop: stopping without %zu write%s the database refused (%s); the runs "
            "they belong to take those steps again in the next engine\n", n, n == 1 ? "" : "s",
            s->fail.msg);
  group_done(&s->retry);
  group_done(&s->open);
  sched__group_init(&s->open);
  s->fail.since = 0;
}

/* ---- the lease ---- */

/* See sched_int.h: a new owner name (kind-pid-random) and its lease row;
** taking it counts as a commit for the lease's renewal. */
int sched__take_lease(sched_t *s, err_t *e) {
  unsigned char rnd[6];
  ids_random(rnd, sizeof rnd);
  snprintf(s->owner, sizeof s->owner, "%s-%ld-%02x%02x%02x%02x%02x%02x", s->o.lease_kind,
           (long)getpid(), rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5]);
  int64_t now = units_now_ms();
  struct lease l = {
    .owner = s->owner, .kind = s->o.lease_kind, .host = proc_hostname(), .pid = (long)getpid(),
    .pid_start = proc_start_time((long)getpid()),
    .expires_at = now + s->o.lease_ttl_ms,
  };
  if (fault_hit(FAULT_LEASE_BUSY))
    return err_set(e, ERR_BUSY, "the database is busy (fault injected: lease_busy)");
  int rc = store_lease_acquire(s->o.store, &l, e);
  if (!rc) {
    s->last_commit_ms = now;
    lease_renewed(s, l.expires_at);
  }
  return rc;
}

/* See sched_int.h. A quarter of the lease covers the time from this check
** to the request leaving, and clocks that differ a little between hosts. */
int sched__lease_fresh(sched_t *s) {
  return units_now_ms() + s->o.lease_ttl_ms / 4 < s->lease_until;
}

/* Take back from g what this process wrote as the owner of its runs (the
** lease `lost` is gone): every entry written for a run, and cron ticks
** that would create runs it owns. What came from outside stays: events,
** cancellations, skill versions; a run started from outside (an invoke)
** stays too, as a queued run no one owns yet, since its caller may have
** been told its id. */
static void fence_group(struct group *g, const char *lost) {
  for (size_t i = 0, n = g->j ? journal_count(g->j) : 0; i < n; i++) {
    const struct jentry *e = journal_entry(g->j, i);
    if (journal_run_of(e)) journal_drop(g->j, i);
    else if (e->kind == J_RUN_NEW && e->u.run.owner && !strcmp(e->u.run.owner, lost))
      journal_disown_run(g->j, i);
    else if (e->kind == J_CRON && e->u.cron.run.owner && !strcmp(e->u.cron.run.owner, lost))
      journal_drop(g->j, i);
  }
}

/* The store fenced a commit: this process's lease is gone, and another
** process took its runs. Drop them all without a write, take back every
** entry written for them from the groups not yet committed (s->retry: the
** refused one, and s->open), and, for a long-lived engine, take a new
** lease under which what remains (what came from outside) commits. A new
** lease never commits old work: nothing of the old runs is left to. */
static void lease_lost(sched_t *s, const char *why) {
  char lost[sizeof s->owner];
  snprintf(lost, sizeof lost, "%s", s->owner);
  int n = s->nruns;
  char ttl[32];
  units_fmt_duration(s->o.lease_ttl_ms, ttl, sizeof ttl);
  fprintf(stderr, "moonloop: LEASE LOST: %s. This process could not renew its lease for longer "
          "than the lease lasts (%s): it was stopped, cut off from the database, or the database "
          "was away for every process; another process may have taken its runs. Dropping its %d run%s and every "
          "write for them not yet committed.\n", why, ttl, n, n == 1 ? "" : "s");
  s->stats.leases_lost++;
  while (s->runs) run_abort(s->runs, NULL, NULL);
  /* Claimed under the lease lost: whoever reaped it released them. */
  store_rows_free(s->later, s->nlater);
  s->later = NULL;
  s->nlater = 0;
  fence_group(&s->retry, lost);
  fence_group(&s->open, lost);
  /* Long-lived engines go on with a new lease (the REPL too: its next
  ** runs need one); a solo run has nothing left to do. */
  if ((s->o.mode == SCHED_SERVE || s->o.mode == SCHED_REPL) && !s->stopping) {
    err_t e;
    if (sched__take_lease(s, &e)) {
      fprintf(stderr, "moonloop: cannot take a new lease yet: %s\n", e.msg);
      s->lease_wanted = 1;
    } else {
      fprintf(stderr, "moonloop: took a new lease (%s)\n", s->owner);
    }
    s->claim_wanted = s->o.mode == SCHED_SERVE;
  } else {
    /* No lease to commit under: nothing more is written. */
    for (size_t i = 0, c = s->retry.j ? journal_count(s->retry.j) : 0; i < c; i++)
      journal_drop(s->retry.j, i);
    group_done(&s->open);
    sched__group_init(&s->open);
  }
  /* A group left with nothing to write is done: its waiters are the
  ** dropped runs' (and cron ticks'), which find nothing to do. */
  if (!group_live(&s->retry)) group_done(&s->retry);
}
