/*
** sched.c: the scheduler's centre (see sched.h for the loop iteration it
** drives, sched_int.h for how its files divide the work).
**
** Here: the ready queue (libuv callbacks only mark tasks ready; the idle
** handle resumes them, at most DRAIN_MAX per turn so I/O is polled between
** batches), concurrency slots (a run of a skill with a limit runs only
** while it holds a slot, asked of the store through the journal), the live
** runs (starting, adopting a stored run, reporting their end), the 50 ms
** tick (noticing other processes' writes, polling deliveries and
** cancellations, stopping a solo scheduler whose work is done), and
** starting and stopping the whole.
**
** The commit pipeline and the lease are in sched_commit.c; the timer heap
** and the map of live runs in sched_heap.c; cron triggers in sched_cron.c.
**
** Invariants: a run is in s->runs (and the map) from run_start until it
** finishes or is aborted; a task in the ready queue holds a reference on
** its run until it has been resumed; the handles are open between
** sched_start and the tick that finds nothing left to do after
** sched_stop (or, solo, after the last run).
*/
#include "base/ids.h"
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/proc.h"
#include "base/units.h"
#include "base/vocab.h"
#include "core/flowctl.h"
#include "core/sched_int.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DRAIN_MAX 20000
#define TICK_MS 50

static void idle_cb(uv_idle_t *h);

/* The upper bounds (ms) of the step duration histogram's buckets. */
const double sched_step_bounds_ms[SCHED_STEP_BUCKETS] = {1, 5, 10, 50, 100, 500, 1000, 5000, 30000,
                                                         1e300};

/* See run.h: count a step's duration in the histogram. */
void sched__step_ended(sched_t *s, int64_t ms) {
  int i = 0;
  while (i < SCHED_STEP_BUCKETS - 1 && (double)ms > sched_step_bounds_ms[i]) i++;
  s->stats.step_buckets[i]++;
  s->stats.step_count++;
  s->stats.step_sum_ms += (double)ms;
}

/* Accessors: see sched.h and run.h. */
const char *sched_owner(const sched_t *s) { return s->owner; }
const struct sched_opts *sched__opts(const sched_t *s) { return &s->o; }
journal_t *sched__journal(sched_t *s) { return s->open.j; }
struct task *sched__current(sched_t *s) { return s->cur; }
void sched__set_current(sched_t *s, struct task *t) { s->cur = t; }
int sched_active(const sched_t *s) { return s->nruns; }

/* Parked runs (see run_flow.c's eviction), and what the next tick does. */
void sched__parked(sched_t *s, int delta) { s->parked += delta; }
int sched__parked_count(const sched_t *s) { return s->parked; }
void sched__want_poll(sched_t *s) { s->poll_wanted = 1; }
void sched__want_dispatch(sched_t *s) { s->dispatch_wanted = 1; }

/* ---- the ready queue ---- */

/* See run.h: queue t to be resumed (its run takes a reference until then);
** a run that needs a concurrency slot asks for it first. */
void sched__ready(sched_t *s, struct task *t) {
  struct run *r = t->run;
  if (t == &r->main && flowctl_needed(r) && !r->slot_held) {
    /* A run executes only while it holds its concurrency slots. */
    flowctl_gate(s, r);
    return;
  }
  t->run->refs++; /* released once the task has been resumed (or skipped) */
  t->state = T_READY;
  t->next_ready = NULL;
  if (s->ready_tail) s->ready_tail->next_ready = t;
  else s->ready_head = t;
  s->ready_tail = t;
  sched__kick(s);
}

/* See sched_int.h: resume ready tasks from the next loop turn on, unless
** the lease gate holds them. */
void sched__kick(sched_t *s) {
  if (s->handles_open && s->ready_head && !s->lease_doubt &&
      !uv_is_active((uv_handle_t *)&s->idle))
    uv_idle_start(&s->idle, idle_cb);
}

/* The lease gate closes: this process cannot show it still holds its
** lease, so no task resumes (a resume may start a step body) until a
** renewal commits (sched_commit.c's lease_renewed reopens it). */
static void hold(sched_t *s) {
  uv_idle_stop(&s->idle);
  if (s->lease_doubt) return;
  s->lease_doubt = 1;
  char at[40];
  units_rfc3339(s->lease_until, at, sizeof at);
  fprintf(stderr, "moonloop: this process cannot show it still holds its lease (renewed until "
          "%s, and it was stopped or its commits are late): no step body starts and no request "
          "goes out until it is renewed\n", at);
}

/* Resume ready tasks. Bounded, so I/O is polled between batches. The lease
** is checked before each resume: the process may have been frozen in the
** middle of a batch. */
static void idle_cb(uv_idle_t *h) {
  sched_t *s = h->data;
  int n = 0;
  while (s->ready_head && n++ < DRAIN_MAX) {
    if (!sched__lease_fresh(s)) {
      hold(s);
      return;
    }
    struct task *t = s->ready_head;
    s->ready_head = t->next_ready;
    if (!s->ready_head) s->ready_tail = NULL;
    t->next_ready = NULL;
    struct run *r = t->run;
    s->stats.resumes++;
    if (s->stats.nsamples < s->stats.cap) {
      uint64_t t0 = units_mono_ns();
      run_resume(t);
      s->stats.samples[s->stats.nsamples++] = (uint32_t)(units_mono_ns() - t0);
    } else {
      run_resume(t);
    }
    run_unref(r);
  }
  if (!s->ready_head) uv_idle_stop(&s->idle);
}

/* ---- runs ---- */

/* See run.h: r joins the live runs (list and map). */
void sched__run_link(sched_t *s, struct run *r) {
  sched__map_put(s, r);
  r->prev = NULL;
  r->next = s->runs;
  if (s->runs) s->runs->prev = r;
  s->runs = r;
  s->nruns++;
}

/* See run.h: r leaves the live runs. */
void sched__run_unlink(sched_t *s, struct run *r) {
  sched__map_del(s, r);
  if (r->prev) r->prev->next = r->next;
  else if (s->runs == r) s->runs = r->next;
  if (r->next) r->next->prev = r->prev;
  r->prev = r->next = NULL;
  s->nruns--;
}

/* See sched.h: at most 4 listeners. */
void sched_on_finish(sched_t *s, sched_done_cb cb, void *arg) {
  if (s->nfinish < 4) {
    s->finish[s->nfinish].cb = cb;
    s->finish[s->nfinish++].arg = arg;
  }
}

/* See run.h: count the end, tell the listeners (not for "abandoned") and
** the waiters on this run (sched_watch.c). */
void sched__run_done(sched_t *s, struct run *r, const char *status, const char *output,
                     const char *error) {
  struct sched_result res = {r->id, status, output, error};
  switch (vocab_run_status(status)) {
  case RUN_COMPLETED: s->stats.runs_completed++; break;
  case RUN_FAILED: s->stats.runs_failed++; break;
  case RUN_CANCELLED: s->stats.runs_cancelled++; break;
  case RUN_SKIPPED: s->stats.runs_skipped++; break;
  default: break; /* "abandoned": dropped here without an end */
  }
  if (strcmp(status, "abandoned"))
    for (int i = 0; i < s->nfinish; i++) s->finish[i].cb(&res, s->finish[i].arg);
  sched__watch_ended(s, &res);
}

/* A run struct for a run that starts now. */
static struct run *run_new(sched_t *s, struct skill *skill, const char *id, const char *trigger,
                           const char *input, const char *parent_id, int64_t now) {
  struct run *r = mem_calloc(1, sizeof *r);
  size_t idl = strnlen(id, sizeof r->id - 1);
  memcpy(r->id, id, idl); /* (zeroed past it) */
  r->sched = s;
  r->skill = skill;
  r->entry = "run";
  r->trigger = mem_strdup(trigger ? trigger : "{\"kind\":\"invoke\"}");
  r->input = input ? mem_strdup(input) : NULL;
  r->parent_id = parent_id ? mem_strdup(parent_id) : NULL;
  r->created_at = now;
  /* A run with limits starts executing when it holds their slots. */
  r->started_at = skill->nlimits ? 0 : now;
  /* The timeout counts from the start: a queued run's from its grant
  ** (flowctl.c), time spent queued not counted. */
  r->deadline_at = skill->timeout_ms && !skill->nlimits ? now + skill->timeout_ms : 0;
  return r;
}

/* A run of skill from here: journal it and start it once its row is
** durable (sched__run_new). */
int sched_run_new(sched_t *s, struct skill *skill, const char *trigger, const char *input,
                  const char *parent_id, char *run_id, err_t *e) {
  int64_t now = units_now_ms();
  char id[27];
  ids_ulid(now, id);
  if (run_id) memcpy(run_id, id, sizeof id);
  return sched__run_new(s, skill, id, now, trigger, input, parent_id, e);
}

/* See run.h. */
int sched__run_new(sched_t *s, struct skill *skill, const char *id, int64_t created,
                   const char *trigger, const char *input, const char *parent_id, err_t *e) {
  int64_t now = units_now_ms();
  struct run *r = run_new(s, skill, id, trigger, input, parent_id, now);
  if (created > 0 && created < now) r->created_at = created;
  struct run_row row = {
    .id = r->id, .skill = skill->id, .version = skill->version,
    .status = skill->nlimits ? "queued" : "running",
    .entry = "run", .trigger = r->trigger, .parent_id = parent_id, .input = input,
    .owner = s->owner, .created_at = r->created_at, .started_at = r->started_at,
    .deadline_at = r->deadline_at, .by_run = parent_id,
  };
  journal_run_new(s->open.j, &row);
  return run_start_created(s, r, e);
}

/* See run.h. */
int sched__start_existing(sched_t *s, struct skill *skill, const char *id, const char *trigger,
                          const char *input, int64_t at, err_t *e) {
  struct run *r = run_new(s, skill, id, trigger, input, NULL, at);
  return run_start(s, r, NULL, e);
}

/* See run.h: from the skill cache, else its source from the store. */
int sched__version_skill(sched_t *s, const char *version, struct skill **out, err_t *e) {
  if ((*out = skills_find(s->o.skills, version))) return 0;
  char *source = NULL, *file = NULL, *skill = NULL;
  struct skill_error se;
  int rc = store_get_version(s->o.store, version, &source, &skill, &file, &se.err);
  if (!rc) rc = skills_load_recorded(s->o.skills, source, strlen(source), file ? file : skill, out,
                                     &se);
  if (rc) err_set(e, rc, "cannot load version %.12s of skill '%s': %s", version,
                  skill ? skill : "?", se.err.msg);
  free(source), free(file), free(skill);
  return rc;
}

/* See run.h. Every invoke asks, and the answer changes only with the
** registry: the last answers are kept until this process changes the
** registry (sched__live_forget) or the tick sees that another connection
** committed (a version registered elsewhere is live here within 50 ms, as
** everything another process writes). */
int sched__live_skill(sched_t *s, const char *id, struct skill **out, err_t *e) {
  for (int i = 0; i < s->nlive; i++)
    if (!strcmp(s->live[i].id, id)) {
      *out = s->live[i].sk;
      return 0;
    }
  char version[80];
  if (store_live_version(s->o.store, id, version, sizeof version, e) ||
      sched__version_skill(s, version, out, e))
    return e->code;
  if (strlen(id) < sizeof s->live[0].id) {
    int i = s->nlive < (int)(sizeof s->live / sizeof s->live[0]) ? s->nlive++
          : s->live_next++ % (int)(sizeof s->live / sizeof s->live[0]);
    snprintf(s->live[i].id, sizeof s->live[i].id, "%s", id);
    s->live[i].sk = *out;
  }
  return 0;
}

/* See run.h. */
void sched__live_forget(sched_t *s) { s->nlive = 0; }

/* End an adopted run r without running any of its code (nor loading its
** skill): cancelled (reason) or failed (message). */
static void adopt_end(sched_t *s, struct run *r, const char *status, const char *msg) {
  char *ej = jsontext_message(msg);
  r->skill = NULL;
  r->main.run = r; /* finishing stops its (never started) main task */
  sched__run_link(s, r);
  r->refs = 1;
  run_abort(r, status, ej);
  free(ej);
}

/* See sched.h: a queued run starts; a parked one waits dormant; one that
** was running is replayed from its steps. A version that cannot be loaded
** fails the run, saying why (one that cannot be read just now is tried
** again by the caller). Before any of its code runs: a run whose
** cancellation was asked for while its owner could not act on it (an
** engine that died, `moonloop cancel` with no engine running) ends
** cancelled, and a run that was executing each time its process died,
** SCHED_MAX_CRASHES times since its last checkpoint, is failed
** (quarantined): resuming it would only take this engine down too. */
int sched_adopt(sched_t *s, const struct run_row *row, err_t *e) {
  struct skill *skill = NULL;
  struct run *r = mem_calloc(1, sizeof *r);
  snprintf(r->id, sizeof r->id, "%s", row->id);
  r->sched = s;
  r->entry = row->entry && !strcmp(row->entry, "on_failure") ? "on_failure" : "run";
  r->trigger = mem_strdup(row->trigger ? row->trigger : "{}");
  r->input = row->input ? mem_strdup(row->input) : NULL;
  r->parent_id = row->parent_id ? mem_strdup(row->parent_id) : NULL;
  r->created_at = row->created_at;
  r->started_at = row->started_at ? row->started_at : units_now_ms();
  r->deadline_at = row->deadline_at;
  r->crashes = row->crashes;
  r->has_prio = row->has_prio;
  r->prio = row->prio;
  if (row->cancel_requested) {
    char msg[600];
    jsontext_cancel_message(row->cancel_reason, msg, sizeof msg);
    adopt_end(s, r, "cancelled", msg);
    return 0;
  }
  if (row->crashes >= SCHED_MAX_CRASHES) {
    char msg[400];
    snprintf(msg, sizeof msg, "quarantined: the engine crashed %d times while "
             "this run's code was executing, with no step completed in between; it is failed instead "
             "of resumed again, so that it cannot crash the engine again", row->crashes);
    fprintf(stderr, "moonloop: run %s %s\n", r->id, msg);
    adopt_end(s, r, "failed", msg);
    return 0;
  }
  err_t le;
  if (sched__version_skill(s, row->version, &skill, &le)) {
    if (le.code == ERR_BUSY || le.code == ERR_IO) {
      /* The database could not be read just now (a server away): the
      ** run is not this version's fault. The caller may try again. */
      run_unref(r);
      return err_set(e, ERR_BUSY, "%s", le.msg);
    }
    /* The version cannot run here any more: the run fails, saying why. */
    adopt_end(s, r, "failed", le.msg);
    return 0;
  }
  r->skill = skill;
  /* A run with limits has its deadline from when it started executing
  ** (not stored: its skill's timeout after its started_at). */
  if (!r->deadline_at && skill->timeout_ms && skill->nlimits && row->started_at)
    r->deadline_at = row->started_at + skill->timeout_ms;
  int st = vocab_run_status(row->status);
  /* A queued run that started before (it gave its slots back while
  ** parked) is replayed like a running one. */
  if (st != RUN_QUEUED || row->started_at) {
    /* Taken over: say so in the run's trace. */
    s->stats.takeovers++;
    char msg[300];
    snprintf(msg, sizeof msg, "engine: resumed by %s on %s after its previous process stopped; "
             "replaying its journal", s->owner, proc_hostname());
    struct log_row l = {.run_id = r->id, .seq = 0, .ts = units_now_ms(), .level = "info",
                        .msg = msg};
    journal_log(s->open.j, &l);
  }
  if (st == RUN_QUEUED && !row->started_at) {
    if (!r->deadline_at && skill->timeout_ms && !skill->nlimits)
      r->deadline_at = r->started_at + skill->timeout_ms;
    if (skill->nlimits) {
      /* Queued for its limits' slots: the grant starts it (flowctl.c). */
      r->started_at = 0;
    } else {
      struct run_set set = {.run_id = r->id, .status = "running", .started_at = r->started_at};
      journal_run_set(s->open.j, &set);
    }
    return run_start(s, r, NULL, e);
  }
  /* A parked run costs no coroutine until it wakes: it is replayed then. */
  if (st == RUN_SLEEPING || st == RUN_WAITING)
    return run_start_dormant(s, r, row->wake_at);
  cJSON *steps = NULL;
  if (store_get_steps(s->o.store, r->id, &steps, e)) {
    if (e->code != ERR_BUSY && e->code != ERR_IO) {
      run_unref(r);
      return e->code;
    }
    /* The journal could not be read just now: the run is this process's
    ** all the same. It waits as a parked run does, and its wake reads the
    ** journal again (run_wake). */
    fprintf(stderr, "moonloop: run %s: reading its journal failed, trying again in 1s: %s\n",
                r->id, e->msg);
    return run_start_dormant(s, r, units_now_ms() + 1000);
  }
  int rc = run_start(s, r, steps, e);
  cJSON_Delete(steps);
  return rc;
}

/* See sched.h. */
void sched_triggers_live(sched_t *s) {
  if (s->triggers_live) return;
  s->triggers_live = 1;
  s->dispatch_wanted = 1; /* events that waited for the live triggers */
  sched__skills_changed(s);
}
int sched__triggers_live(const sched_t *s) { return s->triggers_live; }

/* sched_cron.c's list of cron entries. */
struct cron_entry *sched__crons(sched_t *s) { return s->crons; }
void sched__set_crons(sched_t *s, struct cron_entry *list) {
  s->crons = list;
  s->crons_built = 1;
}
int sched__crons_built(const sched_t *s) { return s->crons_built; }

/* Before the loop polls: hand the open group to the commit thread. */
static void prepare_cb(uv_prepare_t *h) {
  sched_t *s = h->data;
  sched__maybe_submit(s);
}

static void close_handles(sched_t *s);

/* Hand what other processes delivered to this process's runs: waits that
** got their event or child outcome, and cancellations. */
static void poll_runs(sched_t *s) {
  if (!s->nruns) return;
  cJSON *out;
  err_t e;
  if (store_poll(s->o.store, s->owner, &out, &e)) {
    /* What was delivered stays in the store: ask again at the next tick
    ** (the store may be busy a while: one line for the whole while). */
    if (!s->poll_failing) fprintf(stderr, "moonloop: polling: %s; trying again\n", e.msg);
    s->poll_failing = 1;
    s->poll_wanted = 1;
    return;
  }
  s->poll_failing = 0;
  const cJSON *x;
  cJSON_ArrayForEach(x, cJSON_GetObjectItem(out, "cancels")) {
    struct run *r = sched__find(s, cJSON_GetObjectItem(x, "run_id")->valuestring);
    if (r) run_cancelled(r, cJSON_GetObjectItem(x, "reason")->valuestring);
  }
  cJSON_ArrayForEach(x, cJSON_GetObjectItem(out, "deliveries")) {
    struct run *r = sched__find(s, cJSON_GetObjectItem(x, "run_id")->valuestring);
    if (r) run_delivered(r, cJSON_GetObjectItem(x, "seq")->valueint);
  }
  cJSON_ArrayForEach(x, cJSON_GetObjectItem(out, "grants")) flowctl_granted(s, x->valuestring);
  cJSON_Delete(out);
}

/* See run.h. */
void sched__poll_now(sched_t *s) {
  if (!s->stopping) poll_runs(s);
}

/* Notice other processes' writes: what they may have changed (runs to
** claim, events to dispatch, deliveries, watched runs, the registry) is
** looked at again. */
static void notice_writes(sched_t *s) {
  if (!s->stopping) {
    int64_t v = store_data_version(s->o.store);
    if (v != s->data_version) {
      s->data_version = v;
      s->claim_wanted = s->o.mode == SCHED_SERVE;
      s->dispatch_wanted = 1;
      s->poll_wanted = 1;
      sched__watch_poll(s); /* attached clients of runs executed elsewhere */
      sched__live_forget(s); /* the registry may have changed */
    } else if (s->watches.failing) {
      sched__watch_poll(s); /* the last check could not read the store */
    }
  }
  if (s->poll_wanted && !s->stopping) {
    s->poll_wanted = 0;
    poll_runs(s);
  }
}

/* ---- wake-ups from other processes' writes ----
** A store that can tell at once that another process committed
** (store_wake_fd: PostgreSQL's LISTEN) wakes the loop then, instead of at
** the next tick: an event accepted by one engine starts its run on another
** within milliseconds. The loop watches a duplicate of the store's
** descriptor, and the tick checks that it is still the same socket: a
** connection the store opens again (whose descriptor may get the old
** number) is watched anew, never a socket the store no longer reads. */
struct wake_poll {
  uv_poll_t h;
  sched_t *s;
  int fd; /* the duplicate */
};

static void wake_free(uv_handle_t *h) {
  struct wake_poll *w = h->data;
  close(w->fd);
  free(w);
}

static void wake_stop(sched_t *s) {
  if (!s->wake) return;
  uv_close((uv_handle_t *)&s->wake->h, wake_free);
  s->wake = NULL;
}

/* Whether the store's wake-up descriptor is the socket s->wake watches. */
static int wake_same(sched_t *s) {
  int fd = store_wake_fd(s->o.store);
  struct stat a, b;
  return fd >= 0 && s->wake && !fstat(fd, &a) && !fstat(s->wake->fd, &b) &&
         a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

static void wake_cb(uv_poll_t *h, int status, int events) {
  (void)events;
  sched_t *s = ((struct wake_poll *)h->data)->s;
  /* Only another process's commit: this one's own are noticed by the
  ** tick, as before (one wake-up per own commit would double its work). */
  if (store_woken(s->o.store)) notice_writes(s);
  /* Broken or opened again (data_version reads it): the tick watches anew. */
  if (status < 0 || !wake_same(s)) wake_stop(s);
}

/* Watch the store's wake-up descriptor, if it has one (the tick, and at start). */
static void wake_arm(sched_t *s) {
  if (s->stopping || !s->handles_open || wake_same(s)) return;
  wake_stop(s);
  int fd = store_wake_fd(s->o.store);
  int dup = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
  if (dup < 0) return;
  struct wake_poll *w = mem_calloc(1, sizeof *w);
  w->s = s;
  w->fd = dup;
  w->h.data = w;
  if (uv_poll_init(s->o.loop, &w->h, dup)) {
    close(dup);
    free(w);
    return;
  }
  s->wake = w;
  if (uv_poll_start(&w->h, UV_READABLE, wake_cb)) wake_stop(s);
}

/* Every 50 ms: notice other processes' writes, and stop a solo scheduler
** whose work is done. */
static void tick_cb(uv_timer_t *h) {
  sched_t *s = h->data;
  notice_writes(s);
  sched__adopt_later(s);
  wake_arm(s);
  int64_t now = units_now_ms();
  if (now - s->last_file_check_ms >= 1000) {
    s->last_file_check_ms = now;
    sched__check_store(s);
  }
  if (s->stopping && !s->nruns && !s->inflight && s->fail.since && now > s->stop_deadline)
    sched__give_up(s); /* the store refuses what is left: stop anyway */
  if ((s->stopping || s->o.mode == SCHED_SOLO) && !s->nruns && !s->inflight &&
      sched__group_empty(&s->open) && sched__group_empty(&s->retry)) {
    close_handles(s);
    return;
  }
  sched__maybe_submit(s);
}

/* httpc's gate: closed while this process cannot show it holds its lease. */
static int http_gate_closed(void *arg) { return !sched__lease_fresh(arg); }

/* See sched.h: options get their defaults here. */
int sched_new(const struct sched_opts *o, sched_t **out, err_t *e) {
  (void)e; /* nothing here fails: allocation cannot (base/mem.h) */
  sched_t *s = mem_calloc(1, sizeof *s);
  s->o = *o;
  if (!s->o.lease_kind)
    s->o.lease_kind = o->mode == SCHED_SERVE ? "serve" : o->mode == SCHED_REPL ? "repl" : "run";
  if (s->o.lease_ttl_ms <= 0) s->o.lease_ttl_ms = 15000;
  if (s->o.default_retries < 0) s->o.default_retries = 3;
  if (s->o.backoff_ms <= 0) s->o.backoff_ms = 1000;
  if (s->o.backoff_max_ms <= 0) s->o.backoff_max_ms = 600000;
  if (s->o.step_output_limit <= 0) s->o.step_output_limit = 1 << 20;
  if (s->o.event_limit <= 0) s->o.event_limit = 1 << 20;
  if (s->o.run_log_limit <= 0) s->o.run_log_limit = 16 << 20;
  if (s->o.invoke_depth <= 0) s->o.invoke_depth = 64;
  if (s->o.run_tree <= 0) s->o.run_tree = 10000;
  if (s->o.max_parked == 0) s->o.max_parked = 10000;
  sched__group_init(&s->open);
  s->data_version = -1;
  s->deliver_cursor = -1;
  if (s->o.http) httpc_set_gate(s->o.http, http_gate_closed, s);
  run_register_core(o->lrt, s);
  *out = s;
  return 0;
}

/* See run.h. */
void sched__count_replay(sched_t *s) { s->stats.replays++; }

/* See sched.h. The lease is the first write: while another process holds
** the database's write lock (one frozen inside a commit holds it until it
** is continued or killed), wait for it, saying every time what for. A
** refusal that comes at once (PostgreSQL at its connection limit) is
** tried again after a pause that doubles from 200 ms to 5 s: at once,
** it was hundreds of connection attempts a second, each a line here and
** in the server's log. */
int sched_start(sched_t *s, err_t *e) {
  int64_t since = units_now_ms(), pause_ms = 200;
  for (;;) {
    int64_t tried = units_now_ms();
    if (!sched__take_lease(s, e)) break;
    if (e->code != ERR_BUSY) return e->code;
    char d[32];
    units_fmt_duration(units_now_ms() - since, d, sizeof d);
    fprintf(stderr, "moonloop: waiting %s so far to take a lease: %s\n", d, e->msg);
    int64_t took = units_now_ms() - tried;
    if (took < pause_ms) usleep((useconds_t)((pause_ms - took) * 1000));
    if (pause_ms < 5000) pause_ms *= 2;
  }
  uv_loop_t *loop = s->o.loop;
  uv_idle_init(loop, &s->idle);
  uv_prepare_init(loop, &s->prepare);
  uv_timer_init(loop, &s->heap_timer);
  uv_timer_init(loop, &s->tick);
  s->idle.data = s->prepare.data = s->heap_timer.data = s->tick.data = s;
  s->handles_open = 1;
  uv_prepare_start(&s->prepare, prepare_cb);
  uv_timer_start(&s->tick, tick_cb, TICK_MS, TICK_MS);
  wake_arm(s);
  sched__kick(s);
  sched__heap_rearm(s);
  if (s->o.mode == SCHED_SERVE) s->claim_wanted = 1;
  sched__skills_changed(s);
  return 0;
}

/* Close the loop handles (once) and release the lease: the last thing a
** stopping scheduler does. */
static void close_handles(sched_t *s) {
  if (!s->handles_open) return;
  s->handles_open = 0;
  wake_stop(s);
  uv_close((uv_handle_t *)&s->idle, NULL);
  uv_close((uv_handle_t *)&s->prepare, NULL);
  uv_close((uv_handle_t *)&s->heap_timer, NULL);
  uv_close((uv_handle_t *)&s->tick, NULL);
  err_t e;
  if (store_lease_release(s->o.store, s->owner, &e))
    fprintf(stderr, "moonloop: releasing the lease: %s\n", e.msg);
}

/* A run with a step body in flight (in its main task or a parallel child).
** A child whose body waits for a child run (step.invoke) is at a durable
** point: its replay awaits the same child again. */
static int in_body(const struct run *r) {
  if (r->main.in_body) return 1;
  for (int i = 0; i < r->main.nkids; i++)
    if (r->main.kids[i] && r->main.kids[i]->in_body && !r->main.kids[i]->waiting) return 1;
  return 0;
}

/* Release every run that is not inside a step body (all of them when force). */
static void release_runs(sched_t *s, int force) {
  for (struct run *r = s->runs, *next; r; r = next) {
    next = r->next;
    if (force || !in_body(r)) run_abort(r, NULL, NULL);
  }
}

/* The shutdown's grace period ended: release the runs still in a body. */
static void on_grace_over(struct stimer *t) {
  sched_t *s = (sched_t *)((char *)t - offsetof(struct sched, grace));
  if (s->nruns)
    fprintf(stderr, "moonloop: grace period over: releasing %d run%s with a step in flight "
            "(the next engine runs those steps again)\n", s->nruns, s->nruns == 1 ? "" : "s");
  release_runs(s, 1);
}

/* See run.h. */
int sched__draining(const sched_t *s) { return s->stopping; }

/* See sched.h. */
void sched_stop(sched_t *s, int64_t grace_ms) {
  if (s->stopping) return;
  s->stopping = 1;
  s->stop_deadline = units_now_ms() + (grace_ms > 0 ? grace_ms : 0);
  sched__crons_free(s);
  sched__trees_free(s);
  sched__watch_stop(s); /* their clients are answered now, not at the grace's end */
  /* Runs are left to whoever takes them over: dropped here without a
  ** write; the lease release makes them claimable. Bodies in flight may
  ** first reach their checkpoint (run_resume releases them there). */
  release_runs(s, grace_ms <= 0);
  if (s->nruns) {
    s->grace.fn = on_grace_over;
    sched__timer_start(s, &s->grace, units_now_ms() + grace_ms);
  }
  if (!s->inflight && s->handles_open) {
    /* Commit what is open first; the tick closes the handles after. */
    sched__maybe_submit(s);
  }
}

/* See sched.h. */
void sched_observe(sched_t *s, sched_observer_cb cb, void *arg) {
  s->observer = cb;
  s->observer_arg = arg;
}

/* See sched.h: drop every run without a write. */
void sched_abandon_all(sched_t *s) {
  while (s->runs) run_abort(s->runs, NULL, NULL);
}

/* See sched.h. */
void sched_stats_enable(sched_t *s, size_t cap) {
  free(s->stats.samples);
  s->stats.samples = mem_calloc(cap, sizeof *s->stats.samples);
  s->stats.cap = s->stats.samples ? cap : 0;
  s->stats.nsamples = 0;
}

/* See sched.h: the ready count is computed now. */
const struct sched_stats *sched_stats(const sched_t *s) {
  int n = 0;
  for (struct task *t = s->ready_head; t; t = t->next_ready) n++;
  ((sched_t *)s)->stats.ready = n;
  ((sched_t *)s)->stats.writes_refused = s->fail.since != 0;
  return &s->stats;
}

/* See sched.h. */
void sched_free(sched_t *s) {
  if (!s) return;
  free(s->stats.samples);
  sched__watch_free(s);
  journal_free(s->open.j);
  free(s->open.w);
  journal_free(s->retry.j);
  free(s->retry.w);
  free(s->heap);
  free(s->map);
  store_rows_free(s->later, s->nlater);
  free(s);
}
