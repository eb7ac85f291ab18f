/*
** fault.c: fault injection points (see fault.h). The points' state is a
** table indexed by enum fault_id; counts are atomics, since points are met
** on the loop thread (allocations, transfers, reads) and on the commit
** thread (commits, fsyncs, renewals) while the loop thread arms them.
*/
#include "base/fault.h"

#ifdef MOONLOOP_FAULTS
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FAULT_TEXT_MAX 256

struct point {
  const char *name;
  enum fault_kind kind;
  atomic_long value;           /* DELAY: ms; COUNT: failures left; SPAN: until (monotonic ms) */
  char text[FAULT_TEXT_MAX];   /* TEXT: set once at start or by a log line, read on the loop */
  int has_text;
};

#define FAULT_ROW(id, name, kind, where) [FAULT_##id] = {name, kind, 0, "", 0},
static struct point points[FAULT_NPOINTS] = {FAULT_POINTS(FAULT_ROW)};
#undef FAULT_ROW

atomic_int fault__armed;
volatile sig_atomic_t fault_crash_requested;
static int enabled;

/* The monotonic clock in milliseconds (SPAN points). */
static long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* See fault.h: a COUNT point fails while its count lasts, a SPAN point
** until its time is over. */
int fault__hit(enum fault_id id) {
  struct point *p = &points[id];
  long n = atomic_load(&p->value);
  if (p->kind == FAULT_SPAN) return n > 0 && now_ms() < n;
  while (n > 0)
    if (atomic_compare_exchange_weak(&p->value, &n, n - 1)) return 1;
  return 0;
}

/* The names of every point, for an error message. */
static void point_names(char *out, size_t n) {
  size_t k = 0;
  out[0] = 0;
  for (int i = 0; i < FAULT_NPOINTS && k < n; i++)
    k += (size_t)snprintf(out + k, n - k, "%s%s", i ? ", " : "", points[i].name);
}

/* See fault.h. */
int fault_arm(const char *spec, err_t *e) {
  for (const char *p = spec; p && *p;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    const char *eq = memchr(p, '=', len);
    int i = 0;
    while (eq && i < FAULT_NPOINTS &&
           (strlen(points[i].name) != (size_t)(eq - p) || strncmp(points[i].name, p, (size_t)(eq - p))))
      i++;
    if (!eq || i == FAULT_NPOINTS) {
      char names[512];
      point_names(names, sizeof names);
      return err_set(e, ERR_INVALID, "MOONLOOP_FAULT: '%.*s' is no fault point=value (the points: "
                     "%s)", (int)len, p, names);
    }
    const char *v = eq + 1;
    size_t vlen = len - (size_t)(v - p);
    struct point *pt = &points[i];
    if (pt->kind == FAULT_TEXT) {
      snprintf(pt->text, sizeof pt->text, "%.*s", (int)vlen, v);
      pt->has_text = 1;
    } else {
      char *stop;
      long n = strtol(v, &stop, 10);
      if (stop != v + vlen || vlen == 0 || n < 0)
        return err_set(e, ERR_INVALID, "MOONLOOP_FAULT: %s wants a number (%s), got '%.*s'",
                       pt->name, pt->kind == FAULT_COUNT ? "how many times" : "milliseconds",
                       (int)vlen, v);
      atomic_store(&pt->value, pt->kind == FAULT_SPAN && n ? now_ms() + n : n);
    }
    atomic_store(&fault__armed, 1);
    p = end ? end + 1 : NULL;
  }
  return 0;
}

/* See fault.h. */
int fault_init(err_t *e) {
  const char *spec = getenv("MOONLOOP_FAULT");
  if (!spec) return 0;
  enabled = 1;
  return fault_arm(spec, e);
}

int fault_enabled(void) { return enabled; }

/* See fault.h. */
void fault_delay(enum fault_id id) {
  if (!atomic_load_explicit(&fault__armed, memory_order_relaxed)) return;
  long ms = atomic_load(&points[id].value);
  if (ms <= 0) return;
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* See fault.h. A line that arms a point says so on stderr, so a test's
** log shows where its fault came from. */
void fault_log(const char *msg) {
  if (!enabled || !msg) return;
  struct point *crash = &points[FAULT_CRASH_ON_LOG];
  if (crash->has_text && !strcmp(msg, crash->text)) {
    /* A real crash, as a bad pointer would make: no cleanup; the crash
    ** handler (core/crash.c) records it, then the default kills. */
    fault_crash_requested = 1;
    raise(SIGSEGV);
  }
  if (strncmp(msg, "fault: ", 7)) return;
  err_t e;
  if (fault_arm(msg + 7, &e)) fprintf(stderr, "moonloop: %s\n", e.msg);
  else fprintf(stderr, "moonloop: fault armed by a run: %s\n", msg + 7);
}
#else
typedef int fault_unused_;
#endif
