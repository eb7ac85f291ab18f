/*
** sched_tree.c: the runs each tree of invokes started in this process,
** part of the scheduler. A run started otherwise (an event, cron, a
** client's invoke) is a root; the runs it invokes, theirs, and so on, name
** it in their trigger ("root"). limits.invoke_depth bounds how deep a tree
** goes but not how wide: a skill that invokes itself three times from
** step.parallel makes 3^depth runs, which filled the engine's memory
** (150,000 runs in 30 s) until it failed other skills' runs and died. Each
** root's count here bounds the whole tree (limits.run_tree): the invoke
** that would pass it fails, naming the limit.
**
** Counted per process, from its start: an engine that restarts counts a
** tree's new runs from 0 again (the tree stays bounded by the limit per
** process life). A root's count goes when the root run ends here.
*/
#include "base/mem.h"
#include "core/run.h"
#include "core/sched_int.h"

#include <stdlib.h>
#include <string.h>

struct tree_count {
  char root[32];
  int n;
  struct tree_count *next;
};

/* The bucket of root (FNV-1a of its id). */
static struct tree_count **bucket(sched_t *s, const char *root) {
  uint32_t h = 2166136261u;
  for (const char *p = root; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
  return &s->trees[h % SCHED_TREE_BUCKETS];
}

/* See run.h. */
int sched__tree_count(sched_t *s, const char *root) {
  for (struct tree_count *t = *bucket(s, root); t; t = t->next)
    if (!strcmp(t->root, root)) return t->n;
  return 0;
}

/* See run.h. */
void sched__tree_add(sched_t *s, const char *root) {
  struct tree_count **b = bucket(s, root);
  for (struct tree_count *t = *b; t; t = t->next)
    if (!strcmp(t->root, root)) {
      t->n++;
      return;
    }
  struct tree_count *t = mem_calloc(1, sizeof *t);
  snprintf(t->root, sizeof t->root, "%s", root);
  t->n = 1;
  t->next = *b;
  *b = t;
}

/* See run.h. */
void sched__tree_drop(sched_t *s, const char *root) {
  for (struct tree_count **p = bucket(s, root); *p; p = &(*p)->next)
    if (!strcmp((*p)->root, root)) {
      struct tree_count *t = *p;
      *p = t->next;
      free(t);
      return;
    }
}

/* See run.h. */
void sched__trees_free(sched_t *s) {
  for (int i = 0; i < SCHED_TREE_BUCKETS; i++)
    for (struct tree_count *t = s->trees[i], *n; t; t = n) {
      n = t->next;
      free(t);
    }
  memset(s->trees, 0, sizeof s->trees);
}
