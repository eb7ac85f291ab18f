/*
** workspace.c: writing skill files inside the workspace, and nowhere else
** (see workspace.h).
*/
#include "base/workspace.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Whether real path p is below real path r (or r itself, when or_equal). */
static int below(const char *r, const char *p, int or_equal) {
  size_t n = strlen(r);
  if (n == 1 && r[0] == '/') return p[0] == '/' && (p[1] || or_equal);
  if (strncmp(p, r, n)) return 0;
  return p[n] == '/' || (!p[n] && or_equal);
}

/* The real path of path into out (PATH_MAX bytes): realpath() when it
** exists, else the real path of its nearest existing folder followed by
** the components that do not exist yet, none of which may be empty, "."
** or "..". Returns 0 or ERR_INVALID. */
static int resolve(const char *path, char *out, err_t *e) {
  char head[PATH_MAX], tail[PATH_MAX] = "";
  if (!*path || strlen(path) >= sizeof head)
    return err_set(e, ERR_INVALID, "'%.200s' is not a usable path", path);
  snprintf(head, sizeof head, "%s", path);
  for (;;) {
    if (realpath(head, out)) break;
    if (errno != ENOENT)
      return err_set(e, ERR_INVALID, "cannot resolve '%.200s': %s", head, strerror(errno));
    char *slash = strrchr(head, '/');
    const char *last = slash ? slash + 1 : head;
    if (!*last || !strcmp(last, ".") || !strcmp(last, ".."))
      return err_set(e, ERR_INVALID, "'%.200s' has an empty, '.' or '..' part where nothing "
                     "exists yet", path);
    /* last and tail are parts of path, which is shorter than PATH_MAX. */
    char t[2 * PATH_MAX + 2];
    snprintf(t, sizeof t, "%s%s%s", last, *tail ? "/" : "", tail);
    if (strlen(t) >= sizeof tail) return err_set(e, ERR_INVALID, "'%.200s' is too long", path);
    memcpy(tail, t, strlen(t) + 1);
    if (!slash) snprintf(head, sizeof head, ".");
    else if (slash == head) snprintf(head, sizeof head, "/");
    else *slash = 0;
  }
  if (*tail) {
    size_t n = strlen(out);
    if (n + 1 + strlen(tail) >= PATH_MAX)
      return err_set(e, ERR_INVALID, "'%.200s' is too long", path);
    snprintf(out + n, PATH_MAX - n, "%s%s", n == 1 && out[0] == '/' ? "" : "/", tail);
  }
  return 0;
}

/* The workspace's real path, and path's (as resolve), checked to be below
** it. Returns 0 or ERR_INVALID. */
static int check(const char *ws, const char *path, char *rws, char *rpath, err_t *e) {
  if (!realpath(ws, rws))
    return err_set(e, ERR_INVALID, "the workspace %s cannot be resolved (%s), so no file can be "
                   "placed in it", ws, strerror(errno));
  if (resolve(path, rpath, e)) return e->code;
  if (!below(rws, rpath, 0))
    return err_set(e, ERR_INVALID, "'%.300s' is outside the workspace %s (it resolves to %.300s): "
                   "the engine writes skill files only inside the workspace", path, ws, rpath);
  return 0;
}

/* See workspace.h. */
int workspace_inside(const char *ws, const char *path, err_t *e) {
  char rws[PATH_MAX], rpath[PATH_MAX];
  return check(ws, path, rws, rpath, e);
}

/* Write all of data to fd and sync it; -1 with errno on failure. */
static int write_all(int fd, const char *data, size_t len) {
  while (len) {
    ssize_t n = write(fd, data, len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    data += n, len -= (size_t)n;
  }
  return fsync(fd);
}

/* See workspace.h. */
int workspace_write(const char *ws, const char *path, const char *data, size_t len, err_t *e) {
  char rws[PATH_MAX], rpath[PATH_MAX];
  if (check(ws, path, rws, rpath, e)) return e->code;
  /* The components below the workspace: each folder is opened relative to
  ** the last with O_NOFOLLOW, so none can be a link when it is used. */
  char rel[PATH_MAX];
  snprintf(rel, sizeof rel, "%s", rpath + (strcmp(rws, "/") ? strlen(rws) + 1 : 1));
  int dir = open(rws, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return err_set(e, ERR_IO, "cannot open the workspace %s: %s", ws, strerror(errno));
  char *part = rel, *slash;
  while ((slash = strchr(part, '/'))) {
    *slash = 0;
    int next = openat(dir, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int err = errno;
    close(dir);
    if (next < 0)
      return err_set(e, err == ENOENT ? ERR_IO : ERR_INVALID, "cannot write %s: its folder '%s' "
                     "%s", path, part, err == ENOENT ? "does not exist"
                     : err == ELOOP || err == ENOTDIR ? "is a link or not a folder (the engine "
                                                        "follows no link inside the workspace)"
                     : strerror(err));
    dir = next;
    part = slash + 1;
  }
  /* A fresh temporary file (never an existing one, never through a link),
  ** then renamed over the target: readers see the old file or the new. */
  char tmp[64];
  int fd = -1;
  for (int i = 0; i < 100 && fd < 0; i++) {
    snprintf(tmp, sizeof tmp, ".deploy-%ld-%d.tmp", (long)getpid(), i);
    fd = openat(dir, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  int rc = 0;
  if (fd < 0) {
    rc = err_set(e, ERR_IO, "cannot write %s: %s", path, strerror(errno));
  } else {
    int bad = write_all(fd, data, len), err = errno;
    if (close(fd) && !bad) bad = 1, err = errno;
    if (!bad && renameat(dir, tmp, dir, part)) bad = 1, err = errno;
    if (bad) {
      rc = err_set(e, ERR_IO, "cannot write %s: %s", path, strerror(err));
      unlinkat(dir, tmp, 0);
    } else {
      fsync(dir); /* the rename itself, durable */
    }
  }
  close(dir);
  return rc;
}
