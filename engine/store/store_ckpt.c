/*
** store_ckpt.c: the SQLite store's checkpoints, off the commit path.
**
** In WAL mode a commit appends its pages to the "-wal" file; a checkpoint
** copies them back into the database file and syncs it, and the WAL is then
** written again from its start. By default SQLite checkpoints inside the
** commit that takes the WAL past 1,000 pages: that commit, and every run
** waiting on it, pays for copying about 4 MB and syncing the database file
** (milliseconds, every few hundred commits).
**
** Here the writer's automatic checkpoint is off. Its WAL hook, called after
** each commit with the WAL's length in pages, wakes a thread of the store's
** own at every CKPT_PAGES pages, which checkpoints on a connection of its
** own (PASSIVE: it waits for no reader and no writer; the writer goes on
** committing meanwhile). The WAL starts again from its start at the first
** commit after a checkpoint that copied all of it: on a quiet engine, the
** thread's. Under commits back to back the thread stays behind by what was
** committed while it copied; at CKPT_BEHIND pages the writer checkpoints
** itself, as SQLite would have at every 1,000, with little left to copy.
** The thread starts with the first checkpoint, so a command that writes
** little never starts it.
*/
#include "base/mem.h"
#include "store/store_db.h"

#include <pthread.h>
#include <stdlib.h>

#define CKPT_PAGES 1000   /* SQLite's own default */
#define CKPT_BEHIND 4000  /* 16 MB of WAL with 4 kB pages */

struct store_ckpt {
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int started, want, stop;
  int mark;           /* the WAL's length that wakes the thread next (the writer's) */
  sqlite3 *db;        /* the thread's connection */
  const char *sync;   /* its PRAGMA synchronous: the writer's */
  const char *path;
};

/* The thread: one PASSIVE checkpoint each time it is woken. A failure
** (the file gone, busy) leaves the WAL as it is: the next wake tries
** again, and the writer's own checkpoint is the backstop. */
static void *ckpt_main(void *arg) {
  struct store_ckpt *c = arg;
  pthread_mutex_lock(&c->mu);
  for (;;) {
    while (!c->want && !c->stop) pthread_cond_wait(&c->cv, &c->mu);
    if (c->stop) break;
    c->want = 0;
    pthread_mutex_unlock(&c->mu);
    if (!c->db && store__sqlite_conn(c->path, &c->db, NULL) == 0 &&
        sqlite3_exec(c->db, c->sync, NULL, NULL, NULL) != SQLITE_OK) {
      sqlite3_close(c->db);
      c->db = NULL;
    }
    if (c->db) sqlite3_wal_checkpoint_v2(c->db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
    pthread_mutex_lock(&c->mu);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

/* The writer's WAL hook (its thread, after a commit): wake the
** checkpointer at each CKPT_PAGES pages, checkpoint here past CKPT_BEHIND
** (busy if the thread is at it: the next commit tries again). */
static int on_wal(void *arg, sqlite3 *db, const char *name, int pages) {
  struct store_ckpt *c = arg;
  if (pages < CKPT_PAGES) c->mark = CKPT_PAGES; /* the WAL started again */
  if (pages >= CKPT_BEHIND) {
    sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
    return SQLITE_OK;
  }
  if (pages < c->mark) return SQLITE_OK;
  c->mark = pages + CKPT_PAGES;
  pthread_mutex_lock(&c->mu);
  if (!c->started && !c->stop)
    c->started = pthread_create(&c->th, NULL, ckpt_main, c) == 0;
  c->want = 1;
  pthread_cond_signal(&c->cv);
  int started = c->started;
  pthread_mutex_unlock(&c->mu);
  /* No thread (out of threads): as SQLite would have. */
  if (!started) sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
  return SQLITE_OK;
}

/* See store_db.h. */
int store__ckpt_start(store_t *s, int full) {
  struct store_ckpt *c = mem_calloc(1, sizeof *c);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  c->sync = full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL";
  c->path = s->path;
  c->mark = CKPT_PAGES;
  s->ckpt = c;
  sqlite3_wal_autocheckpoint(s->w, 0);
  sqlite3_wal_hook(s->w, on_wal, c);
  return 0;
}

/* See store_db.h. */
void store__ckpt_stop(store_t *s) {
  struct store_ckpt *c = s->ckpt;
  if (!c) return;
  if (s->w) sqlite3_wal_hook(s->w, NULL, NULL);
  pthread_mutex_lock(&c->mu);
  c->stop = 1;
  pthread_cond_signal(&c->cv);
  int started = c->started;
  pthread_mutex_unlock(&c->mu);
  if (started) pthread_join(c->th, NULL);
  sqlite3_close(c->db);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
  s->ckpt = NULL;
}
