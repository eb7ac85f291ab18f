/*
** store_faults.c: the fault points of the database's files (base/fault.h:
** fsync_fail and disk_full), as a SQLite VFS over the default one that
** fails an fsync, or a write, where the file system would: SQLite then
** answers as it does to the real thing ("disk I/O error", "database or
** disk is full"), and so does the engine.
**
** Only in test builds (MOONLOOP_FAULTS), and only in a process started
** with MOONLOOP_FAULT set: otherwise the store opens its files through the
** default VFS and this file is not involved.
*/
#include "base/fault.h"
#include "store/store_db.h"

#ifdef MOONLOOP_FAULTS
#include <string.h>

/* A file of the fault VFS: the default VFS's file follows it in memory. */
struct ffile {
  sqlite3_file base;
  sqlite3_file *real;
};

static sqlite3_vfs *real_vfs;
static sqlite3_vfs fault_vfs;

#define REAL(f) (((struct ffile *)(f))->real)
#define CALL(f, m, ...) REAL(f)->pMethods->m(REAL(f), __VA_ARGS__)

static int f_close(sqlite3_file *f) { return REAL(f)->pMethods->xClose(REAL(f)); }
static int f_read(sqlite3_file *f, void *b, int n, sqlite3_int64 o) { return CALL(f, xRead, b, n, o); }

/* A write: disk_full fails it as a full file system does (ENOSPC). */
static int f_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 o) {
  if (fault_hit(FAULT_DISK_FULL)) return SQLITE_FULL;
  return CALL(f, xWrite, b, n, o);
}

static int f_truncate(sqlite3_file *f, sqlite3_int64 n) { return CALL(f, xTruncate, n); }

/* An fsync: fsync_fail fails it as an I/O error of the disk does (EIO). */
static int f_sync(sqlite3_file *f, int flags) {
  if (fault_hit(FAULT_FSYNC_FAIL)) return SQLITE_IOERR_FSYNC;
  return CALL(f, xSync, flags);
}

static int f_size(sqlite3_file *f, sqlite3_int64 *n) { return CALL(f, xFileSize, n); }
static int f_lock(sqlite3_file *f, int l) { return CALL(f, xLock, l); }
static int f_unlock(sqlite3_file *f, int l) { return CALL(f, xUnlock, l); }
static int f_reserved(sqlite3_file *f, int *r) { return CALL(f, xCheckReservedLock, r); }
static int f_fcntl(sqlite3_file *f, int op, void *arg) { return CALL(f, xFileControl, op, arg); }
static int f_sector(sqlite3_file *f) { return REAL(f)->pMethods->xSectorSize(REAL(f)); }
static int f_dev(sqlite3_file *f) { return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f)); }
static int f_shm_map(sqlite3_file *f, int pg, int sz, int ext, void volatile **p) {
  return CALL(f, xShmMap, pg, sz, ext, p);
}
static int f_shm_lock(sqlite3_file *f, int off, int n, int flags) {
  return CALL(f, xShmLock, off, n, flags);
}
static void f_shm_barrier(sqlite3_file *f) { REAL(f)->pMethods->xShmBarrier(REAL(f)); }
static int f_shm_unmap(sqlite3_file *f, int del) { return CALL(f, xShmUnmap, del); }
static int f_fetch(sqlite3_file *f, sqlite3_int64 o, int n, void **p) { return CALL(f, xFetch, o, n, p); }
static int f_unfetch(sqlite3_file *f, sqlite3_int64 o, void *p) { return CALL(f, xUnfetch, o, p); }

/* Version 3: the unix VFS's files have every method (WAL's shared memory,
** memory-mapped reads). A file whose methods are older keeps its own. */
static const sqlite3_io_methods methods = {
  3, f_close, f_read, f_write, f_truncate, f_sync, f_size, f_lock, f_unlock, f_reserved, f_fcntl,
  f_sector, f_dev, f_shm_map, f_shm_lock, f_shm_barrier, f_shm_unmap, f_fetch, f_unfetch,
};

/* Open the default VFS's file behind ours. */
static int f_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out) {
  (void)vfs;
  struct ffile *ff = (struct ffile *)f;
  ff->real = (sqlite3_file *)(ff + 1);
  memset(ff->real, 0, (size_t)real_vfs->szOsFile);
  int rc = real_vfs->xOpen(real_vfs, name, ff->real, flags, out);
  const sqlite3_io_methods *m = ff->real->pMethods;
  ff->base.pMethods = !m ? NULL : m->iVersion >= 3 ? &methods : NULL;
  if (m && m->iVersion < 3) {
    /* Not a file this wrapper knows how to forward: refuse it plainly. */
    m->xClose(ff->real);
    return SQLITE_CANTOPEN;
  }
  return rc;
}

static int f_delete(sqlite3_vfs *v, const char *n, int sync) {
  (void)v;
  return real_vfs->xDelete(real_vfs, n, sync);
}
static int f_access(sqlite3_vfs *v, const char *n, int flags, int *out) {
  (void)v;
  return real_vfs->xAccess(real_vfs, n, flags, out);
}
static int f_fullpath(sqlite3_vfs *v, const char *n, int size, char *out) {
  (void)v;
  return real_vfs->xFullPathname(real_vfs, n, size, out);
}
static void *f_dlopen(sqlite3_vfs *v, const char *n) {
  (void)v;
  return real_vfs->xDlOpen(real_vfs, n);
}
static void f_dlerror(sqlite3_vfs *v, int n, char *out) {
  (void)v;
  real_vfs->xDlError(real_vfs, n, out);
}
static void (*f_dlsym(sqlite3_vfs *v, void *h, const char *s))(void) {
  (void)v;
  return real_vfs->xDlSym(real_vfs, h, s);
}
static void f_dlclose(sqlite3_vfs *v, void *h) {
  (void)v;
  real_vfs->xDlClose(real_vfs, h);
}
static int f_random(sqlite3_vfs *v, int n, char *out) {
  (void)v;
  return real_vfs->xRandomness(real_vfs, n, out);
}
static int f_sleep(sqlite3_vfs *v, int us) {
  (void)v;
  return real_vfs->xSleep(real_vfs, us);
}
static int f_time(sqlite3_vfs *v, double *t) {
  (void)v;
  return real_vfs->xCurrentTime(real_vfs, t);
}
static int f_lasterr(sqlite3_vfs *v, int n, char *out) {
  (void)v;
  return real_vfs->xGetLastError ? real_vfs->xGetLastError(real_vfs, n, out) : 0;
}
static int f_time64(sqlite3_vfs *v, sqlite3_int64 *t) {
  (void)v;
  return real_vfs->xCurrentTimeInt64(real_vfs, t);
}

/* See store_db.h: registered on first use (the loop and commit threads
** open their connections one after the other, in store_open). */
const char *store__fault_vfs(void) {
  if (!fault_enabled()) return NULL;
  if (!real_vfs) {
    real_vfs = sqlite3_vfs_find(NULL);
    if (!real_vfs || real_vfs->iVersion < 2) return NULL;
    fault_vfs = (sqlite3_vfs){
      .iVersion = 2, .szOsFile = (int)sizeof(struct ffile) + real_vfs->szOsFile,
      .mxPathname = real_vfs->mxPathname, .zName = "moonloop-faults", .xOpen = f_open,
      .xDelete = f_delete, .xAccess = f_access, .xFullPathname = f_fullpath,
      .xDlOpen = f_dlopen, .xDlError = f_dlerror, .xDlSym = f_dlsym, .xDlClose = f_dlclose,
      .xRandomness = f_random, .xSleep = f_sleep, .xCurrentTime = f_time,
      .xGetLastError = f_lasterr, .xCurrentTimeInt64 = f_time64,
    };
    sqlite3_vfs_register(&fault_vfs, 0);
  }
  return fault_vfs.zName;
}
#else
const char *store__fault_vfs(void) { return NULL; }
#endif
