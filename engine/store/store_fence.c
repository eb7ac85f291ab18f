/*
** store_fence.c: fencing's memory, shared by both backends: the runs a
** store found to be its committing owner's, so that a commit checks the
** runs table only for runs it has not seen yet (store_sqlite.c's fencing
** says when the set must be forgotten). An open-addressing set of run ids
** (ULIDs), linear probing, tombstones swept when it grows; used on the
** commit thread only.
*/
#include "base/mem.h"
#include "store/store_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Slot states of the set. */
enum { FS_FREE, FS_USED, FS_GONE };

static uint64_t fence_hash(const char *id) {
  uint64_t h = 1469598103934665603ull;
  for (; *id; id++) h = (h ^ (unsigned char)*id) * 1099511628211ull;
  return h;
}

/* The slot of id in the set, or -1. */
long store__fence_find(const struct fence_set *f, const char *id) {
  if (!f->cap) return -1;
  size_t i = (size_t)fence_hash(id) & (f->cap - 1);
  for (size_t k = 0; k < f->cap; k++, i = (i + 1) & (f->cap - 1)) {
    if (f->state[i] == FS_FREE) return -1;
    if (f->state[i] == FS_USED && !strcmp(f->ids[i], id)) return (long)i;
  }
  return -1;
}

/* Forget every run (and the owner). */
void store__fence_clear(struct fence_set *f) {
  if (f->state) memset(f->state, FS_FREE, f->cap);
  f->n = f->gone = 0;
  f->owner[0] = 0;
}

/* Remember id (a ULID) as the owner's. */
void store__fence_add(struct fence_set *f, const char *id) {
  if (strlen(id) >= sizeof f->ids[0] || store__fence_find(f, id) >= 0) return;
  if ((f->n + f->gone + 1) * 4 > f->cap * 3) {
    /* Grow (or just sweep the tombstones), rehashing what is kept. */
    size_t cap = f->n * 2 + 2 > f->cap / 2 ? (f->cap ? f->cap * 2 : 1024) : f->cap;
    char (*ids)[27] = mem_alloc(cap * sizeof *ids);
    unsigned char *state = mem_calloc(cap, 1);
    for (size_t i = 0; i < f->cap; i++) {
      if (f->state[i] != FS_USED) continue;
      size_t k = (size_t)fence_hash(f->ids[i]) & (cap - 1);
      while (state[k] == FS_USED) k = (k + 1) & (cap - 1);
      memcpy(ids[k], f->ids[i], sizeof ids[k]);
      state[k] = FS_USED;
    }
    free(f->ids), free(f->state);
    f->ids = ids, f->state = state, f->cap = cap, f->gone = 0;
  }
  size_t i = (size_t)fence_hash(id) & (f->cap - 1);
  while (f->state[i] == FS_USED) i = (i + 1) & (f->cap - 1);
  if (f->state[i] == FS_GONE) f->gone--;
  snprintf(f->ids[i], sizeof f->ids[i], "%s", id);
  f->state[i] = FS_USED;
  f->n++;
}

/* Forget id (a run that ended, or was lost). */
void store__fence_remove(struct fence_set *f, const char *id) {
  long i = store__fence_find(f, id);
  if (i < 0) return;
  f->state[i] = FS_GONE;
  f->n--;
  f->gone++;
}

/* See store_backend.h. */
void store__fence_free(struct fence_set *f) {
  free(f->ids);
  free(f->state);
  memset(f, 0, sizeof *f);
}

