/*
** crash.c: record which run's code was executing when the process crashed
** (see crash.h).
**
** The handler does only what is safe in a signal handler: it copies the
** current run's id (26 characters) and a newline into a static buffer,
** writes it with one write(2) to a file opened (O_APPEND) when the
** handlers were armed, puts back the signal's previous disposition and
** raises the signal again. The signal is blocked while the handler runs,
** so the raised one is delivered when it returns, with the previous
** disposition: the process dies as it would have (a core dump, or a
** sanitizer's report). A fault signal that returns would fault again in
** any case.
*/
#include "core/crash.h"
#include "base/fault.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#define RUN_ID_LEN 26
#define ALT_STACK_SIZE (64 * 1024)

static const int crash_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
#define NSIG_CRASH ((int)(sizeof crash_signals / sizeof crash_signals[0]))

static struct sigaction previous[NSIG_CRASH];
static int armed;
static volatile sig_atomic_t record_fd = -1;
static const char *volatile current_run;
static char line[RUN_ID_LEN + 1];
static char alt_stack[ALT_STACK_SIZE]; /* for the process's life: the handler runs on it */

/* The handler of every crash signal: record, then die as before. */
static void on_crash(int sig) {
  const char *id = current_run;
  if (record_fd >= 0 && id) {
    memcpy(line, id, RUN_ID_LEN);
    line[RUN_ID_LEN] = '\n';
    ssize_t w = write(record_fd, line, sizeof line);
    (void)w; /* nothing more can be done about a failed write here */
  }
  for (int i = 0; i < NSIG_CRASH; i++) {
    if (crash_signals[i] != sig) continue;
    struct sigaction back = previous[i];
#ifdef MOONLOOP_FAULTS
    /* A test's crash point wants the plain default: no sanitizer report. */
    if (fault_crash_requested) {
      memset(&back, 0, sizeof back);
      back.sa_handler = SIG_DFL;
    }
#endif
    sigaction(sig, &back, NULL);
  }
  raise(sig);
}

/* See crash.h. */
int crash_arm(const char *path, err_t *e) {
  if (path && record_fd < 0) {
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
      return err_set(e, ERR_IO, "cannot open '%s' to record crashes: %s", path, strerror(errno));
    record_fd = fd;
  }
  if (armed) return 0;
  /* A crash from a C stack overflow leaves no stack to run the handler on. */
  stack_t ss = {.ss_sp = alt_stack, .ss_size = sizeof alt_stack, .ss_flags = 0};
  if (sigaltstack(&ss, NULL)) {
    return err_set(e, ERR_INTERNAL, "cannot set an alternate signal stack: %s", strerror(errno));
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_crash;
  sa.sa_flags = SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < NSIG_CRASH; i++) sigaction(crash_signals[i], &sa, &previous[i]);
  armed = 1;
  return 0;
}

/* See crash.h. */
void crash_set_run(const char *run_id) { current_run = run_id; }

/* Whether s (n bytes) is a run id: 26 characters of Crockford's base 32. */
static int is_run_id(const char *s, size_t n) {
  if (n != RUN_ID_LEN) return 0;
  for (size_t i = 0; i < n; i++)
    if (!strchr("0123456789ABCDEFGHJKMNPQRSTVWXYZ", s[i])) return 0;
  return 1;
}

/* See crash.h. */
int crash_collect(store_t *s, const char *path, err_t *e) {
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return 0;
    return err_set(e, ERR_IO, "cannot read the crash record '%s': %s", path, strerror(errno));
  }
  if (flock(fd, LOCK_EX)) {
    close(fd);
    return err_set(e, ERR_IO, "cannot lock the crash record '%s': %s", path, strerror(errno));
  }
  char buf[64 * (RUN_ID_LEN + 1)];
  size_t len = 0;
  ssize_t got;
  int n = 0, rc = 0;
  /* A crash record holds a line per crash; a long one is read in parts,
  ** each part's whole lines counted before the next. */
  while (!rc && (got = read(fd, buf + len, sizeof buf - len)) > 0) {
    len += (size_t)got;
    size_t start = 0;
    for (size_t i = 0; i < len && !rc; i++) {
      if (buf[i] != '\n') continue;
      if (is_run_id(buf + start, i - start)) {
        char id[RUN_ID_LEN + 1];
        memcpy(id, buf + start, RUN_ID_LEN);
        id[RUN_ID_LEN] = 0;
        if (store_count_crash(s, id, e)) rc = e->code;
        else n++;
      }
      start = i + 1;
    }
    memmove(buf, buf + start, len - start);
    len -= start;
    if (len == sizeof buf) len = 0; /* a line that long is no record: drop it */
  }
  /* Counted (or not a record): empty the file, so no crash counts twice. */
  if (!rc && ftruncate(fd, 0))
    rc = err_set(e, ERR_IO, "cannot empty the crash record '%s': %s", path, strerror(errno));
  close(fd); /* (releases the lock) */
  return rc ? rc : n;
}
