/*
** fault.c: fault injection points (see fault.h).
*/
#include "base/fault.h"

#ifdef MOONLOOP_FAULTS
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void fault_point(const char *name) {
  const char *spec = getenv("MOONLOOP_FAULT");
  if (!spec) return;
  size_t n = strlen(name);
  for (const char *p = spec; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
    if (!strncmp(p, name, n) && p[n] == '=') {
      long ms = strtol(p + n + 1, NULL, 10);
      struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
      return;
    }
  }
}
volatile sig_atomic_t fault_crash_requested;

/* See fault.h. */
void fault_crash(const char *name, const char *text) {
  const char *spec = getenv("MOONLOOP_FAULT");
  if (!spec || !text) return;
  size_t n = strlen(name), t = strlen(text);
  for (const char *p = spec; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
    if (!strncmp(p, name, n) && p[n] == '=' && !strncmp(p + n + 1, text, t) &&
        (p[n + 1 + t] == 0 || p[n + 1 + t] == ',')) {
      /* A real crash, as a bad pointer would make: no cleanup; the crash
      ** handler (core/crash.c) records it, then the default kills. */
      fault_crash_requested = 1;
      raise(SIGSEGV);
    }
  }
}
#else
typedef int fault_unused_;
#endif
