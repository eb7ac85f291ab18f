/*
** watcher_batch.c: how the workspace watcher hands changes to the registry
** (see watcher.h and watcher_int.h): due files are read whole (only when
** nothing changed them during the read), compared with the last answered
** version, and sent as one batch of ops; the answers update the file
** records, log one line per file, and end the batch.
**
** Invariants: at most one batch is in flight (w->pending counts its ops
** not yet answered); in a batch unloads come before loads and no two loads
** claim the same id; the due timer is not armed while a batch is in
** flight; a failed submit is answered at once through handle().
*/
#include "base/ids.h"
#include "base/mem.h"
#include "base/term.h"
#include "sidecar/watcher_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SOURCE ((size_t)16 << 20)
#define RETRY_MIN_MS 500
#define RETRY_MAX_MS 30000
/* A batch takes the files due within this many ms from now: the two halves
** of a rename arrive a millisecond or two apart, and split across batches
** the id they move would be missing in between. */
#define BATCH_SLACK_MS 20

/* strdup that passes NULL through. */
static char *dupstr(const char *s) { return s ? mem_strdup(s) : NULL; }

/* ---- the log ------------------------------------------------------------ */

/* One line: "<prefix><word>  <file>: <text>". File names and load errors
** come from whoever writes the workspace: the line is escaped (term.h). */
static void log_line(watcher_t *w, const char *word, const char *rel, const char *path,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void log_line(watcher_t *w, const char *word, const char *rel, const char *path,
                     const char *fmt, ...) {
  if (!w->o.log) return;
  va_list ap;
  va_start(ap, fmt);
  char *text = mem_vprintf(fmt, ap);
  va_end(ap);
  term_printf(w->o.log, "%s%-8s  %s: %s\n", w->log_prefix, word, w->o.log_rel ? rel : path,
              text);
  free(text);
  fflush(w->o.log);
}

/* ---- batches ------------------------------------------------------------ */

/* Free the strings an op of a batch owns. */
static void op_free_strings(struct wop *op) {
  free(op->path), free(op->rel), free(op->id), free(op->fallback), free(op->source);
}

/* See watcher_int.h. */
void watcher__batch_free(watcher_t *w) {
  for (size_t i = 0; i < w->nbatch; i++) op_free_strings(&w->batch[i]);
  free(w->batch);
  w->batch = NULL;
  w->nbatch = 0;
}

static void build_batch(watcher_t *w);

/* See watcher_int.h. */
void watcher__on_due(uv_timer_t *t) { build_batch(t->data); }

/* See watcher_int.h. */
void watcher__arm_due(watcher_t *w) {
  if (w->stopping || w->pending) return;
  int64_t next = w->stale ? watcher__now_ms() : INT64_MAX;
  for (size_t i = 0; i < w->nfiles; i++) {
    const struct wfile *f = w->files[i];
    if (f->due && !f->busy && f->due < next) next = f->due;
  }
  if (next == INT64_MAX) {
    uv_timer_stop(&w->due_timer);
    return;
  }
  int64_t delay = next - watcher__now_ms();
  uv_timer_start(&w->due_timer, watcher__on_due, delay > 0 ? (uint64_t)delay : 0, 0);
}

/* Read a file whole, and only if nothing changed it during the read.
** Returns 0 with *src (malloc'd) and *st, 1 when it is being written (look
** again later), -1 when it is gone or not a regular file, -2 when it is
** too large, -3 when it is there but cannot be read (errno says why). */
static int read_whole(const char *path, char **src, size_t *len, struct wstat *ws) {
  /* O_NONBLOCK: opening a FIFO named x.lua would wait for a writer,
  ** holding the engine's loop (the fstat below then refuses it). */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return errno == ENOENT || errno == ENOTDIR ? -1 : -3;
  struct stat a, b, c;
  if (fstat(fd, &a) || !S_ISREG(a.st_mode)) {
    close(fd);
    return -1;
  }
  if ((size_t)a.st_size > MAX_SOURCE) {
    close(fd);
    return -2;
  }
  size_t cap = (size_t)a.st_size + 1, n = 0;
  char *buf = mem_alloc(cap);
  for (;;) {
    if (n + 1 >= cap) {
      if (cap > MAX_SOURCE) break;
      buf = mem_realloc(buf, cap * 2);
      cap *= 2;
    }
    ssize_t got = read(fd, buf + n, cap - n - 1);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    n += (size_t)got;
  }
  int bad = fstat(fd, &b);
  close(fd);
  bad = bad || stat(path, &c);
  struct wstat wa, wb, wc;
  watcher__wstat_of(&a, &wa);
  if (!bad) watcher__wstat_of(&b, &wb), watcher__wstat_of(&c, &wc);
  /* Written to, truncated or replaced while we read: not complete yet. */
  if (bad || !watcher__wstat_same(&wa, &wb) || !watcher__wstat_same(&wb, &wc) || n != (size_t)b.st_size) {
    free(buf);
    return bad ? -1 : 1;
  }
  buf[n] = 0;
  *src = buf;
  *len = n;
  *ws = wb;
  return 0;
}

/* Look at a due file: an op for the batch (1), nothing to do (0), or the
** record is no longer needed (-1). loads[0..*nloads) are the batch's loads
** so far: a load whose id one of them claims waits for the next batch,
** unless f is the file that holds that id now: then the other one waits
** (it is dropped from loads, and *nloads shrinks). */
static int look(watcher_t *w, struct wfile *f, struct wop *loads, size_t *nloads, struct wop *op) {
  char *path = watcher__local_path(w, f->rel);
  if (!path) {
    watcher__touch(w, f, RETRY_MIN_MS, 0);
    return 0;
  }
  char *src = NULL;
  size_t len = 0;
  struct wstat ws;
  int rc = read_whole(path, &src, &len, &ws);
  int why = errno; /* -3's reason, before free may change errno */
  free(path);
  if (rc == 1) {
    watcher__touch(w, f, WATCHER_DEBOUNCE_MS, 1);
    return 0;
  }
  if (rc == -1) {
    f->have_st = 0;
    /* Gone: its skill is unregistered, and so is the record of its
    ** refusal, which would else be listed for good (the registry clears
    ** it only while that record still names this file). */
    if (!f->id && !f->rejected) return -1;
    op->op.kind = WATCHER_UNLOAD;
    op->id = mem_strdup(f->id ? f->id : f->rejected);
    op->f = f;
    return 1;
  }
  if (rc == -2) {
    if (!f->quiet) log_line(w, "ignored", f->rel, f->path, "larger than 16 MB: not a skill file");
    f->quiet = 1;
    return 0;
  }
  if (rc == -3) {
    /* Not gone (permissions, a folder that cannot be read): refused, and
    ** what was live stays live until it can be read again. */
    if (!f->quiet)
      log_line(w, "rejected", f->rel, f->path, "cannot read it: %s%s", strerror(why),
               f->id ? "; its live version stays" : "");
    f->quiet = 1;
    return 0;
  }
  f->st = ws;
  f->have_st = 1;
  if (len == 0) {
    /* Truncated, and the new content is not there yet (or an empty file,
    ** which is no skill either): the live version stays. */
    free(src);
    return 0;
  }
  f->quiet = 0;
  char version[65];
  ids_sha256_hex(src, len, version);
  if (!f->force && !strcmp(version, f->version)) {
    free(src);
    return 0;
  }
  f->force = 0;
  struct skill *sk = NULL;
  struct skill_error se = {0};
  const char *id = NULL;
  if (w->o.skills && !skills_load(w->o.skills, src, len, f->path, &sk, &se)) id = sk->id;
  for (size_t i = 0; id && i < *nloads; i++) {
    struct wop *other = &loads[i];
    if (!other->id || strcmp(other->id, id)) continue;
    int holds = f->id && !strcmp(f->id, id);
    int other_holds = other->f->id && !strcmp(other->f->id, id);
    if (!holds || other_holds) {
      free(src);
      f->due = f->first = watcher__now_ms(); /* the next batch */
      return 0;
    }
    /* f holds the id now: it goes first, the other file waits. */
    struct wfile *of = other->f;
    of->busy = 0;
    of->due = of->first = watcher__now_ms();
    op_free_strings(other);
    memmove(other, other + 1, (*nloads - i - 1) * sizeof *other);
    (*nloads)--;
    break;
  }
  char dflt[256];
  skills_default_id(f->rel, dflt, sizeof dflt);
  op->op.kind = WATCHER_LOAD;
  op->id = dupstr(id);
  op->fallback = mem_strdup(f->id ? f->id : dflt);
  op->source = src;
  op->op.len = len;
  memcpy(op->version, version, sizeof op->version);
  op->f = f;
  return 1;
}

static void handle(struct wop *op, const struct watcher_result *r);
static void batch_end(watcher_t *w);

/* The registry could not be reached or could not write: try again later. */
static int is_transport(int rc) { return rc == ERR_IO || rc == ERR_BUSY; }

/* Records by name, for qsort. */
static int cmp_file(const void *a, const void *b) {
  return strcmp((*(struct wfile *const *)a)->rel, (*(struct wfile *const *)b)->rel);
}

/* Build the next batch from the due files and the stale ids, and submit it.
** Files are taken in name order, so which of two new files declaring one
** id comes first does not depend on the folder's order. */
static void build_batch(watcher_t *w) {
  if (w->stopping || w->pending) return;
  int64_t now = watcher__now_ms();
  if (w->nfiles > 1) qsort(w->files, w->nfiles, sizeof *w->files, cmp_file);
  size_t nstale = 0;
  for (struct stale *s = w->stale; s; s = s->next) nstale++;
  size_t cap = nstale + w->nfiles;
  struct wop *unloads = mem_calloc(cap + 1, sizeof *unloads), *loads = mem_calloc(cap + 1, sizeof *loads);
  size_t nu = 0, nl = 0;
  while (w->stale) {
    struct stale *s = w->stale;
    w->stale = s->next;
    struct wop *op = &unloads[nu++];
    op->op.kind = WATCHER_UNLOAD;
    op->id = s->id;
    op->path = s->path;
    const char *rel = s->path;
    if (!strncmp(rel, w->prefix, strlen(w->prefix))) rel += strlen(w->prefix);
    op->rel = mem_strdup(rel);
    free(s);
  }
  for (size_t i = 0; i < w->nfiles;) {
    struct wfile *f = w->files[i];
    if (!f->due || f->busy || f->due > now + BATCH_SLACK_MS) {
      i++;
      continue;
    }
    f->due = 0;
    struct wop tmp = {0};
    int rc = look(w, f, loads, &nl, &tmp);
    if (rc < 0) {
      watcher__remove_file(w, f); /* the table's last record moved to i */
      continue;
    }
    i++;
    if (rc == 0) continue;
    tmp.path = mem_strdup(f->path);
    tmp.rel = mem_strdup(f->rel);
    f->busy = 1;
    if (tmp.op.kind == WATCHER_UNLOAD) unloads[nu++] = tmp;
    else loads[nl++] = tmp;
  }
  /* Unloads first, then loads. */
  memcpy(unloads + nu, loads, nl * sizeof *loads);
  free(loads);
  w->batch = unloads;
  w->nbatch = nu + nl;
  w->pending = w->nbatch;
  if (w->nbatch == 0) {
    batch_end(w);
    return;
  }
  uv_timer_stop(&w->due_timer);
  /* Count first: a submit that fails at once answers through handle(). */
  for (size_t i = 0; i < w->nbatch; i++) {
    struct wop *op = &w->batch[i];
    op->w = w;
    op->op.path = op->path;
    op->op.rel = op->rel;
    op->op.id = op->id;
    op->op.fallback_id = op->fallback;
    op->op.source = op->source;
    op->op.version = op->version;
  }
  w->submitting = 1;
  for (size_t i = 0; i < w->nbatch && !w->stopping; i++) {
    struct wop *op = &w->batch[i];
    err_t e = {0};
    if (w->o.sink.submit(w->o.sink.ud, &op->op, op, &e)) {
      struct watcher_result r = {e.code ? e.code : ERR_INTERNAL, NULL, e.msg};
      handle(op, &r);
    }
  }
  w->submitting = 0;
  if (w->pending == 0 && !w->stopping) batch_end(w);
}

/* The registry's answer to one op of the batch. */
static void handle(struct wop *op, const struct watcher_result *r) {
  watcher_t *w = op->w;
  struct wfile *f = op->f;
  const char *msg = r->message && *r->message ? r->message : err_name(r->rc);
  if (op->op.kind == WATCHER_LOAD) {
    f->busy = 0;
    if (r->rc == 0) {
      const char *id = r->id ? r->id : op->id ? op->id : op->fallback;
      if (f->id && strcmp(f->id, id)) watcher__push_stale(w, f->id, f->path);
      free(f->id);
      f->id = mem_strdup(id);
      free(f->rejected);
      f->rejected = NULL;
      memcpy(f->version, op->version, sizeof f->version);
      f->conflict = 0;
      f->retries = 0;
      if (!w->ready) w->loaded++;
      log_line(w, "ok", f->rel, f->path, "skill '%s', version %.12s", id, op->version);
    } else if (is_transport(r->rc)) {
      int64_t delay = (int64_t)RETRY_MIN_MS << (f->retries < 6 ? f->retries : 6);
      if (delay > RETRY_MAX_MS) delay = RETRY_MAX_MS;
      if (!f->retries)
        log_line(w, "waiting", f->rel, f->path, "%s (trying again)", msg);
      f->retries++;
      if (!w->stopping) watcher__touch(w, f, delay, 0);
    } else {
      memcpy(f->version, op->version, sizeof f->version);
      /* Where the registry recorded the refusal (watcher.h's fallback_id). */
      if (!f->id) {
        free(f->rejected);
        f->rejected = mem_strdup(op->id ? op->id : op->fallback);
      }
      f->conflict = r->rc == ERR_CONFLICT;
      f->retries = 0;
      if (!w->ready) w->rejected++;
      log_line(w, "rejected", f->rel, f->path, "%s", msg);
    }
  } else {
    if (r->rc == 0 || r->rc == ERR_NOTFOUND) {
      if (r->rc == 0) {
        w->freed = 1;
        if (f && f->have_st)
          log_line(w, "removed", op->rel, op->path, "skill '%s' unregistered", op->id);
        else if (f)
          log_line(w, "removed", op->rel, op->path, "skill '%s' unregistered (the file is gone)",
                   op->id);
        else
          log_line(w, "removed", op->rel, op->path, "skill '%s' unregistered (no file declares "
                   "it any more)", op->id);
      }
      if (f) {
        f->busy = 0;
        free(f->id);
        f->id = NULL;
        free(f->rejected);
        f->rejected = NULL;
        f->version[0] = 0;
        if (!f->have_st && !f->due) watcher__remove_file(w, f);
        op->f = NULL;
      }
    } else if (is_transport(r->rc)) {
      if (f) {
        f->busy = 0;
        if (!w->stopping) watcher__touch(w, f, RETRY_MIN_MS, 0);
      } else if (!w->stopping) {
        watcher__push_stale(w, op->id, op->path);
      }
      log_line(w, "waiting", op->rel, op->path, "%s (trying again)", msg);
    } else {
      if (f) f->busy = 0;
      log_line(w, "error", op->rel, op->path, "cannot unregister skill '%s': %s", op->id, msg);
    }
  }
  if (--w->pending == 0 && !w->submitting) batch_end(w);
}

/* See watcher.h. */
void watcher_done(void *token, const struct watcher_result *r) {
  struct wop *op = token;
  if (op->w->stopping) {
    /* Nobody waits any more; the batch is freed with the watcher. */
    if (op->w->pending) op->w->pending--;
    return;
  }
  handle(op, r);
}

/* Every op of the batch was answered: free it, retry refused duplicates
** if an id was let go, say ready after the first scan, arm the next batch. */
static void batch_end(watcher_t *w) {
  watcher__batch_free(w);
  if (w->freed) {
    /* An id was let go: loads refused as duplicates may pass now. */
    w->freed = 0;
    for (size_t i = 0; i < w->nfiles; i++) {
      struct wfile *f = w->files[i];
      if (f->conflict && !f->busy) {
        f->force = 1;
        watcher__touch(w, f, 0, 0);
      }
    }
  }
  if (!w->ready) {
    /* The first scan is loaded once the loads it deferred are answered too. */
    int64_t now = watcher__now_ms();
    int more = w->stale != NULL;
    for (size_t i = 0; i < w->nfiles && !more; i++)
      more = w->files[i]->due && w->files[i]->due <= now;
    if (more) {
      build_batch(w);
      return;
    }
    w->ready = 1;
    if (w->o.on_ready) w->o.on_ready(w->o.ready_arg, w->loaded, w->rejected);
  }
  watcher__arm_due(w);
}
