/*
** sched_heap.c: two data structures of the scheduler (see sched_int.h).
**
** The timer heap: every timer of every run (sleeps, backoffs, deadlines,
** step timeouts, wake-ups, cron ticks) is a struct stimer in one binary
** min-heap ordered by `at`, driven by a single uv_timer_t armed for the
** earliest, so a hundred thousand sleeping runs cost a heap slot each, not
** a libuv handle each. Invariant: t->idx is t's slot + 1 while armed, 0
** when not; the loop timer is armed for heap[0] whenever the handles are
** open and the heap is not empty.
**
** The map of live runs: run id -> struct run, open addressing with linear
** probing in a power-of-two table kept at most half full (counting live
** entries); a deleted entry leaves a tombstone so probes go on past it.
*/
#include "base/mem.h"
#include "base/units.h"
#include "core/sched_int.h"

#include <stdlib.h>
#include <string.h>

/* ---- the map of live runs ---- */

#define TOMBSTONE ((struct run *)1)

/* FNV-1a of a run id. */
static size_t hash_id(const char *id) {
  size_t h = 1469598103934665603u;
  for (; *id; id++) h = (h ^ (unsigned char)*id) * 1099511628211u;
  return h;
}

/* Double the table (1024 slots at first) and put the live runs back. */
static void map_grow(sched_t *s) {
  struct run **old = s->map;
  size_t oldcap = s->map_cap;
  s->map_cap = oldcap ? oldcap * 2 : 1024;
  s->map = mem_calloc(s->map_cap, sizeof *s->map);
  s->map_n = 0;
  for (size_t i = 0; i < oldcap; i++)
    if (old[i] && old[i] != TOMBSTONE) sched__map_put(s, old[i]);
  free(old);
}

/* See sched_int.h: the table stays at most half full. */
void sched__map_put(sched_t *s, struct run *r) {
  if ((s->map_n + 1) * 2 > s->map_cap) map_grow(s);
  size_t i = hash_id(r->id) & (s->map_cap - 1);
  while (s->map[i] && s->map[i] != TOMBSTONE) i = (i + 1) & (s->map_cap - 1);
  s->map[i] = r;
  s->map_n++;
}

/* See run.h: the live run with that id, or NULL. */
struct run *sched__find(sched_t *s, const char *id) {
  if (!s->map_cap) return NULL;
  size_t i = hash_id(id) & (s->map_cap - 1);
  while (s->map[i]) {
    if (s->map[i] != TOMBSTONE && !strcmp(s->map[i]->id, id)) return s->map[i];
    i = (i + 1) & (s->map_cap - 1);
  }
  return NULL;
}

/* See sched_int.h: r's slot becomes a tombstone (probes go on past it). */
void sched__map_del(sched_t *s, struct run *r) {
  if (!s->map_cap) return;
  size_t i = hash_id(r->id) & (s->map_cap - 1);
  while (s->map[i]) {
    if (s->map[i] == r) {
      s->map[i] = TOMBSTONE;
      /* Tombstones count towards the load; map_n tracks live entries only
      ** for growth, which is fine at these sizes. */
      return;
    }
    i = (i + 1) & (s->map_cap - 1);
  }
}

/* ---- the timer heap ---- */

/* Swap heap slots a and b, keeping each timer's idx right. */
static void heap_swap(sched_t *s, size_t a, size_t b) {
  struct stimer *t = s->heap[a];
  s->heap[a] = s->heap[b];
  s->heap[b] = t;
  s->heap[a]->idx = a + 1;
  s->heap[b]->idx = b + 1;
}

/* Move slot i up while it is earlier than its parent. */
static void heap_up(sched_t *s, size_t i) {
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (s->heap[p]->at <= s->heap[i]->at) break;
    heap_swap(s, p, i);
    i = p;
  }
}

/* Move slot i down while a child is earlier. */
static void heap_down(sched_t *s, size_t i) {
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < s->heap_n && s->heap[l]->at < s->heap[m]->at) m = l;
    if (r < s->heap_n && s->heap[r]->at < s->heap[m]->at) m = r;
    if (m == i) break;
    heap_swap(s, i, m);
    i = m;
  }
}

static void heap_timer_cb(uv_timer_t *h);

/* See sched_int.h: arm the loop timer for the earliest entry of the heap
** (nothing before sched_start opens the handles). */
void sched__heap_rearm(sched_t *s) {
  if (!s->handles_open) return;
  if (!s->heap_n) {
    uv_timer_stop(&s->heap_timer);
    return;
  }
  int64_t d = s->heap[0]->at - units_now_ms();
  uv_timer_start(&s->heap_timer, heap_timer_cb, d > 0 ? (uint64_t)d : 0, 0);
}

/* See run.h: arm t for at_ms (re-arming it if it was armed). */
void sched__timer_start(sched_t *s, struct stimer *t, int64_t at_ms) {
  if (t->idx) sched__timer_stop(s, t);
  if (s->heap_n == s->heap_cap) {
    size_t cap = s->heap_cap ? s->heap_cap * 2 : 256;
    s->heap = mem_realloc(s->heap, cap * sizeof *s->heap);
    s->heap_cap = cap;
  }
  t->at = at_ms;
  s->heap[s->heap_n] = t;
  t->idx = ++s->heap_n;
  heap_up(s, s->heap_n - 1);
  if (s->heap[0] == t) sched__heap_rearm(s);
}

/* See run.h: disarm t (nothing if it is not armed). */
void sched__timer_stop(sched_t *s, struct stimer *t) {
  if (!t->idx) return;
  size_t i = t->idx - 1;
  int was_first = i == 0;
  s->heap_n--;
  if (i != s->heap_n) {
    s->heap[i] = s->heap[s->heap_n];
    s->heap[i]->idx = i + 1;
    heap_down(s, i);
    heap_up(s, i);
  }
  t->idx = 0;
  if (was_first) sched__heap_rearm(s);
}

/* The loop timer: fire every timer that is due, earliest first (a
** timer's fn may arm timers again), then re-arm for the next. */
static void heap_timer_cb(uv_timer_t *h) {
  sched_t *s = h->data;
  int64_t now = units_now_ms();
  while (s->heap_n && s->heap[0]->at <= now) {
    struct stimer *t = s->heap[0];
    sched__timer_stop(s, t);
    t->fn(t);
  }
  sched__heap_rearm(s);
}
