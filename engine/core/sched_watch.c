/*
** sched_watch.c: who waits for a run to end (sched.h's sched_on_done and
** sched_watch; the attach of GET /v1/runs/{id}?wait=).
**
** A map from run id to the list of that run's waiters (chained buckets,
** doubled when as many entries as buckets). Two kinds of waiter:
**
**   done   (sched_on_done) is told the end of a run this process
**          executes, with its outcome, "abandoned" included (moonloop run,
**          run --resume, the REPL);
**   watch  (sched_watch) is told that the run ended (completed, failed,
**          cancelled, and durable), whichever process executed it, or
**          that its wait ran out.
**
** Waiting costs no work: a run this process executes reports its end
** through sched__run_done, which looks its id up here. A run executed
** elsewhere (another engine, a run queued by the CLI and not claimed here,
** a run this process lost to a takeover) cannot report here: its entry is
** marked remote, and when the 50 ms tick sees that another connection
** committed (PRAGMA data_version), sched__watch_poll asks the store, in one
** indexed query over the remote entries' ids only, which of them ended.
** A watch's wait is a timer in the scheduler's heap.
**
** Invariants: an entry exists while it has a waiter; a waiter is called
** at most once and is freed right after (or by sched_unwatch, which is
** never called from its own callback); watches are counted per entry
** (nwatch), so entries with only done waiters never go to the store.
*/
#include "base/buf.h"
#include "base/mem.h"
#include "base/units.h"
#include "base/vocab.h"
#include "core/sched_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct wrun;

/* One waiter (both kinds). */
struct sched_watch {
  sched_t *s;
  struct wrun *run;
  struct sched_watch *prev, *next;
  sched_done_cb done;   /* a done waiter */
  sched_watch_cb end;   /* a watch */
  void *arg;
  struct stimer timer;  /* a watch's wait */
};

/* The waiters of one run id. */
struct wrun {
  char id[27];
  int remote;  /* may end outside this process: the tick asks the store */
  int nwatch;  /* watches among the waiters */
  struct sched_watch *head;
  struct wrun *chain;
};

/* FNV-1a of a run id. */
static size_t hash_id(const char *id) {
  size_t h = 1469598103934665603u;
  for (; *id; id++) h = (h ^ (unsigned char)*id) * 1099511628211u;
  return h;
}

/* The bucket of id. */
static struct wrun **bucket(struct sched_watches *m, const char *id) {
  return &m->b[hash_id(id) & (m->nb - 1)];
}

/* Double the buckets (64 at first). */
static void grow(struct sched_watches *m) {
  size_t nb = m->nb ? m->nb * 2 : 64;
  struct wrun **b = mem_calloc(nb, sizeof *b);
  for (size_t i = 0; i < m->nb; i++)
    for (struct wrun *w = m->b[i], *next; w; w = next) {
      next = w->chain;
      struct wrun **slot = &b[hash_id(w->id) & (nb - 1)];
      w->chain = *slot;
      *slot = w;
    }
  free(m->b);
  m->b = b;
  m->nb = nb;
}

/* The entry of id, or NULL (made when create). */
static struct wrun *entry(struct sched_watches *m, const char *id, int create) {
  if (m->nb)
    for (struct wrun *w = *bucket(m, id); w; w = w->chain)
      if (!strcmp(w->id, id)) return w;
  if (!create) return NULL;
  if (m->n >= m->nb) grow(m);
  struct wrun *w = mem_calloc(1, sizeof *w);
  snprintf(w->id, sizeof w->id, "%s", id);
  struct wrun **slot = bucket(m, id);
  w->chain = *slot;
  *slot = w;
  m->n++;
  return w;
}

/* Drop an entry with no waiter left. */
static void entry_drop(struct sched_watches *m, struct wrun *w) {
  if (w->head) return;
  for (struct wrun **p = bucket(m, w->id); *p; p = &(*p)->chain)
    if (*p == w) {
      *p = w->chain;
      break;
    }
  if (w->remote) m->nremote--;
  m->n--;
  free(w);
}

/* Take waiter x out of its entry's list (the entry stays; see entry_drop). */
static void unlink_waiter(sched_t *s, struct sched_watch *x) {
  struct wrun *w = x->run;
  if (x->prev) x->prev->next = x->next;
  else w->head = x->next;
  if (x->next) x->next->prev = x->prev;
  if (x->end) {
    w->nwatch--;
    if (w->remote) s->watches.nremote_watch--;
    sched__timer_stop(s, &x->timer);
  }
}

/* A new waiter of id (at the list's head). */
static struct sched_watch *add(sched_t *s, const char *id) {
  struct sched_watch *x = mem_calloc(1, sizeof *x);
  struct wrun *w = entry(&s->watches, id, 1);
  x->s = s;
  x->run = w;
  x->next = w->head;
  if (w->head) w->head->prev = x;
  w->head = x;
  return x;
}

/* Mark an entry remote: its end may come from another process. */
static void mark_remote(sched_t *s, struct wrun *w) {
  if (w->remote) return;
  w->remote = 1;
  s->watches.nremote++;
  s->watches.nremote_watch += w->nwatch;
}

/* Call (and free) every watch of w with ended; w may be dropped after. */
static void fire_watches(sched_t *s, struct wrun *w, int ended) {
  for (struct sched_watch *x = w->head, *next; x; x = next) {
    next = x->next;
    if (!x->end) continue;
    unlink_waiter(s, x);
    x->end(x->arg, ended);
    free(x);
  }
}

/* See sched.h. */
void sched_on_done(sched_t *s, const char *run_id, sched_done_cb cb, void *arg) {
  struct sched_watch *x = add(s, run_id);
  x->done = cb;
  x->arg = arg;
}

/* A watch's wait ran out: it is told so, and goes. */
static void on_wait_over(struct stimer *t) {
  struct sched_watch *x = (struct sched_watch *)((char *)t - offsetof(struct sched_watch, timer));
  sched_t *s = x->s;
  struct wrun *w = x->run;
  unlink_waiter(s, x);
  x->end(x->arg, 0);
  free(x);
  entry_drop(&s->watches, w);
}

/* See sched_int.h. */
struct sched_watch *sched__watch_add(sched_t *s, const char *run_id, int64_t wait_ms,
                                     sched_watch_cb cb, void *arg) {
  struct sched_watch *x = add(s, run_id);
  struct wrun *w = x->run;
  x->end = cb;
  x->arg = arg;
  w->nwatch++;
  if (w->remote) s->watches.nremote_watch++;
  x->timer.fn = on_wait_over;
  sched__timer_start(s, &x->timer, units_now_ms() + wait_ms);
  /* Not executed here (or not yet): its end may come from elsewhere. */
  if (!sched__find(s, run_id)) mark_remote(s, w);
  return x;
}

/* See sched.h: a run live in this process has not ended (a run leaves the
** map when its end is journaled); for any other the store says. */
int sched_watch(sched_t *s, const char *run_id, int64_t wait_ms, sched_watch_cb cb, void *arg,
                struct sched_watch **out, err_t *e) {
  char status[32];
  *out = NULL;
  if (!sched__find(s, run_id)) {
    if (store_run_status(s->o.store, run_id, status, sizeof status, e)) return e->code;
    if (vocab_run_ended(status)) return 1;
  }
  *out = sched__watch_add(s, run_id, wait_ms, cb, arg);
  return 0;
}

/* See sched.h: never from w's own callback. */
void sched_unwatch(sched_t *s, struct sched_watch *x) {
  if (!x) return;
  struct wrun *w = x->run;
  unlink_waiter(s, x);
  free(x);
  entry_drop(&s->watches, w);
}

/* See sched_int.h: done waiters hear every end; watches only real ends
** (an abandoned run goes on elsewhere: its entry turns remote). */
void sched__watch_ended(sched_t *s, const struct sched_result *res) {
  struct wrun *w = entry(&s->watches, res->run_id, 0);
  if (!w) return;
  int abandoned = !strcmp(res->status, "abandoned");
  for (struct sched_watch *x = w->head, *next; x; x = next) {
    next = x->next;
    if (!x->done) continue;
    unlink_waiter(s, x);
    x->done(res, x->arg);
    free(x);
  }
  if (abandoned) mark_remote(s, w);
  else fire_watches(s, w, 1);
  entry_drop(&s->watches, w);
}

/* store_runs_ended's callback: that run ended elsewhere. */
static void on_remote_end(void *arg, const char *id) {
  sched_t *s = arg;
  struct wrun *w = entry(&s->watches, id, 0);
  if (!w) return;
  fire_watches(s, w, 1);
  entry_drop(&s->watches, w);
}

/* See sched_int.h: one query over the ids of remote entries with watches. */
void sched__watch_poll(sched_t *s) {
  struct sched_watches *m = &s->watches;
  if (!m->nremote_watch) return;
  buf_t ids = BUF_INIT;
  buf_add(&ids, "[", 1);
  size_t n = 0;
  for (size_t i = 0; i < m->nb; i++)
    for (struct wrun *w = m->b[i]; w; w = w->chain)
      if (w->remote && w->nwatch) {
        if (n++) buf_add(&ids, ",", 1);
        buf_add(&ids, "\"", 1);
        buf_add(&ids, w->id, strlen(w->id));
        buf_add(&ids, "\"", 1);
      }
  buf_add(&ids, "]", 1);
  err_t e;
  if (store_runs_ended(s->o.store, buf_str(&ids), on_remote_end, s, &e) < 0) {
    /* The tick asks again until it can read (one line while it cannot). */
    if (!m->failing) fprintf(stderr, "moonloop: checking runs waited for: %s; trying again\n", e.msg);
    m->failing = 1;
  } else {
    m->failing = 0;
  }
  buf_free(&ids);
}

/* See sched_int.h: every watch hears that its wait is over (ended 0). */
void sched__watch_stop(sched_t *s) {
  struct sched_watches *m = &s->watches;
  for (size_t i = 0; i < m->nb; i++)
    for (struct wrun *w = m->b[i], *next; w; w = next) {
      next = w->chain;
      if (!w->nwatch) continue;
      fire_watches(s, w, 0);
      entry_drop(m, w);
    }
}

/* See sched_int.h: at the scheduler's end nobody is called any more. */
void sched__watch_free(sched_t *s) {
  struct sched_watches *m = &s->watches;
  for (size_t i = 0; i < m->nb; i++)
    for (struct wrun *w = m->b[i], *next; w; w = next) {
      next = w->chain;
      for (struct sched_watch *x = w->head, *xn; x; x = xn) {
        xn = x->next;
        sched__timer_stop(s, &x->timer);
        free(x);
      }
      free(w);
    }
  free(m->b);
  memset(m, 0, sizeof *m);
}
