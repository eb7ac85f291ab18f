/*
** journal.c: a group of journal entries with an arena for their strings
** (see journal.h). Entries are stored in one growing array; strings are
** copied into fixed-size arena blocks that live as long as the group, so
** appending costs a memcpy and, rarely, a malloc. What each kind holds is
** journal.h's lists; the code per kind is generated from them here.
*/
#include "store/journal.h"
#include "base/mem.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_BLOCK 65536

struct block {
  struct block *next;
  size_t used, cap;
  char data[];
};

struct journal {
  struct jentry *e;
  size_t n, cap;
  struct block *blocks;
  size_t bytes;
  char *owner;
  int64_t lease_expires_at;
  long fenced; /* the entry the store refused (ERR_FENCED), or -1 */
};

journal_t *journal_new(void) {
  journal_t *j = mem_calloc(1, sizeof(journal_t));
  j->fenced = -1;
  return j;
}

void journal_free(journal_t *j) {
  if (!j) return;
  for (size_t i = 0; i < j->n; i++) free(j->e[i].result);
  for (struct block *b = j->blocks, *next; b; b = next) {
    next = b->next;
    free(b);
  }
  free(j->e);
  free(j->owner);
  free(j);
}

size_t journal_count(const journal_t *j) { return j->n; }
const struct jentry *journal_entry(const journal_t *j, size_t i) { return &j->e[i]; }
size_t journal_bytes(const journal_t *j) { return j->bytes; }

void journal_set_owner(journal_t *j, const char *owner, int64_t lease_expires_at) {
  free(j->owner);
  j->owner = owner ? mem_strdup(owner) : NULL;
  j->lease_expires_at = lease_expires_at;
}

const char *journal_owner(const journal_t *j, int64_t *lease_expires_at) {
  if (lease_expires_at) *lease_expires_at = j->lease_expires_at;
  return j->owner;
}

/* Copy s into the arena; NULL stays NULL. */
static const char *dup(journal_t *j, const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  struct block *b = j->blocks;
  if (!b || b->cap - b->used < n) {
    size_t cap = n > ARENA_BLOCK ? n : ARENA_BLOCK;
    b = mem_alloc(sizeof *b + cap);
    b->used = 0;
    b->cap = cap;
    b->next = j->blocks;
    j->blocks = b;
  }
  char *p = b->data + b->used;
  memcpy(p, s, n);
  b->used += n;
  j->bytes += n;
  return p;
}

/* Reserve a new entry of the given kind. */
static struct jentry *add(journal_t *j, enum jkind kind) {
  if (j->n == j->cap) {
    j->cap = j->cap ? j->cap * 2 : 256;
    j->e = mem_realloc(j->e, j->cap * sizeof *j->e);
  }
  struct jentry *e = &j->e[j->n++];
  memset(e, 0, sizeof *e);
  e->kind = kind;
  return e;
}

/* ---- the kinds (journal.h's lists) ---- */

/* journal_kinds: each kind's fields, with their offsets. */
#define FIELD(S, use, type, name) \
  {#name, JOURNAL_##use, JOURNAL_##type, (unsigned short)offsetof(struct S, name)},
#define KIND_FIELDS(KIND, fn, S, m, F) static const struct journal_field fields_##fn[] = {F(FIELD, S)};
JOURNAL_KINDS(KIND_FIELDS)
#define KIND(KIND, fn, S, m, F) \
  [J_##KIND] = {#fn, fields_##fn, sizeof fields_##fn / sizeof fields_##fn[0]},
const struct journal_kind journal_kinds[J_COUNT] = {JOURNAL_KINDS(KIND)};

/* copy_<fn>(j, c): make the entry c (a bitwise copy of the caller's
** struct) the group's own: its strings copied into the arena, a run's too;
** READ fields zeroed. Straight-line code, one statement per string. */
#define COPY(S, use, type, name) COPY_##use(type, name)
#define COPY_COL(type, name) COPY_##type(name)
#define COPY_ARG(type, name) COPY_##type(name)
#define COPY_READ(type, name) memset(&c->name, 0, sizeof c->name);
#define COPY_TEXT(name) c->name = dup(j, c->name);
#define COPY_INT(name)
#define COPY_I64(name)
#define COPY_TIME(name)
#define COPY_OP(name)
#define COPY_RUN(name) copy_run_new(j, &c->name);
#define COPIER(KIND, fn, S, m, F) \
  static void copy_##fn(journal_t *j, struct S *c) { F(COPY, S) }
JOURNAL_KINDS(COPIER)

/* journal_<fn>(j, row): append a copy of row (journal.h). */
#define APPEND(KIND, fn, S, m, F) \
  void journal_##fn(journal_t *j, const struct S *row) { \
    struct jentry *e = add(j, J_##KIND); \
    e->u.m = *row; \
    copy_##fn(j, &e->u.m); \
  }
JOURNAL_KINDS(APPEND)

/* See journal.h. */
void journal_add(journal_t *j, enum jkind kind, const void *row) {
  switch (kind) {
#define ADD(KIND, fn, S, m, F) case J_##KIND: journal_##fn(j, row); break;
  JOURNAL_KINDS(ADD)
#undef ADD
  case J_COUNT: break;
  }
}

struct jentry *journal_last(journal_t *j) { return j->n ? &j->e[j->n - 1] : NULL; }

const char *journal_run_of(const struct jentry *e) {
  switch (e->kind) {
  case J_RUN_NEW: return e->u.run.by_run;
  case J_RUN_SET: return e->u.set.run_id;
  case J_STEP: return e->u.step.run_id;
  case J_ATTEMPT: return e->u.attempt.run_id;
  case J_LOG: return e->u.log.run_id;
  case J_EVENT: return e->u.event.by_run;
  case J_WAIT: return e->u.wait.run_id;
  case J_WAIT_END: return e->u.wait_end.run_id;
  case J_CHILD_DONE: return e->u.child.child_id;
  case J_CANCEL: return e->u.cancel.by_run;
  case J_SLOT: return e->u.slot.run_id;
  case J_VERSION: case J_SKILL: case J_CRON: case J_COUNT: return NULL;
  }
  return NULL;
}

void journal_drop(journal_t *j, size_t i) {
  if (i >= j->n) return;
  j->e[i].dropped = 1;
  free(j->e[i].result); /* an answer of an attempt that did not commit */
  j->e[i].result = NULL;
}

void journal_disown_run(journal_t *j, size_t i) {
  if (i >= j->n || j->e[i].kind != J_RUN_NEW) return;
  struct run_row *r = &j->e[i].u.run;
  r->status = "queued"; /* static strings outlive the group */
  r->owner = NULL;
  r->started_at = 0;
}

void journal_set_fenced(const journal_t *j, long i) { ((journal_t *)j)->fenced = i; }
long journal_fenced(const journal_t *j) { return j->fenced; }

void journal_set_result(const struct jentry *e, char *result) {
  struct jentry *m = (struct jentry *)e;
  free(m->result);
  m->result = result;
}
