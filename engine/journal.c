/*
** journal.c: a group of journal entries with an arena for their strings
** (see journal.h). Entries are stored in one growing array; strings are
** copied into fixed-size arena blocks that live as long as the group, so
** appending costs a memcpy and, rarely, a malloc.
*/
#include "journal.h"
#include "err.h"

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
};

journal_t *journal_new(void) { return calloc(1, sizeof(journal_t)); }

void journal_free(journal_t *j) {
  if (!j) return;
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

int journal_set_owner(journal_t *j, const char *owner, int64_t lease_expires_at) {
  free(j->owner);
  j->owner = owner ? strdup(owner) : NULL;
  j->lease_expires_at = lease_expires_at;
  return owner && !j->owner ? ERR_NOMEM : 0;
}

const char *journal_owner(const journal_t *j, int64_t *lease_expires_at) {
  if (lease_expires_at) *lease_expires_at = j->lease_expires_at;
  return j->owner;
}

/* Copy s into the arena; NULL stays NULL. Sets *fail on allocation failure. */
static const char *dup(journal_t *j, const char *s, int *fail) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  struct block *b = j->blocks;
  if (!b || b->cap - b->used < n) {
    size_t cap = n > ARENA_BLOCK ? n : ARENA_BLOCK;
    b = malloc(sizeof *b + cap);
    if (!b) {
      *fail = 1;
      return NULL;
    }
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

/* Reserve a new entry of the given kind; NULL when out of memory. */
static struct jentry *add(journal_t *j, enum jkind kind) {
  if (j->n == j->cap) {
    size_t cap = j->cap ? j->cap * 2 : 256;
    struct jentry *e = realloc(j->e, cap * sizeof *e);
    if (!e) return NULL;
    j->e = e;
    j->cap = cap;
  }
  struct jentry *e = &j->e[j->n++];
  e->kind = kind;
  return e;
}

int journal_run_new(journal_t *j, const struct run_row *r) {
  struct jentry *e = add(j, J_RUN_NEW);
  if (!e) return ERR_NOMEM;
  int fail = 0;
  struct run_row *c = &e->u.run;
  *c = *r;
  c->id = dup(j, r->id, &fail);
  c->skill = dup(j, r->skill, &fail);
  c->version = dup(j, r->version, &fail);
  c->status = dup(j, r->status, &fail);
  c->entry = dup(j, r->entry, &fail);
  c->trigger = dup(j, r->trigger, &fail);
  c->parent_id = dup(j, r->parent_id, &fail);
  c->input = dup(j, r->input, &fail);
  c->output = dup(j, r->output, &fail);
  c->error = dup(j, r->error, &fail);
  c->owner = dup(j, r->owner, &fail);
  return fail ? ERR_NOMEM : 0;
}

int journal_run_set(journal_t *j, const struct run_set *s) {
  struct jentry *e = add(j, J_RUN_SET);
  if (!e) return ERR_NOMEM;
  int fail = 0;
  struct run_set *c = &e->u.set;
  *c = *s;
  c->run_id = dup(j, s->run_id, &fail);
  c->status = dup(j, s->status, &fail);
  c->output = dup(j, s->output, &fail);
  c->error = dup(j, s->error, &fail);
  return fail ? ERR_NOMEM : 0;
}

int journal_step(journal_t *j, const struct step_row *s) {
  struct jentry *e = add(j, J_STEP);
  if (!e) return ERR_NOMEM;
  int fail = 0;
  struct step_row *c = &e->u.step;
  *c = *s;
  c->run_id = dup(j, s->run_id, &fail);
  c->id = dup(j, s->id, &fail);
  c->kind = dup(j, s->kind, &fail);
  c->status = dup(j, s->status, &fail);
  c->output = dup(j, s->output, &fail);
  c->error = dup(j, s->error, &fail);
  c->usage = dup(j, s->usage, &fail);
  return fail ? ERR_NOMEM : 0;
}

int journal_attempt(journal_t *j, const struct attempt_row *a) {
  struct jentry *e = add(j, J_ATTEMPT);
  if (!e) return ERR_NOMEM;
  int fail = 0;
  struct attempt_row *c = &e->u.attempt;
  *c = *a;
  c->run_id = dup(j, a->run_id, &fail);
  c->status = dup(j, a->status, &fail);
  c->error = dup(j, a->error, &fail);
  c->traceback = dup(j, a->traceback, &fail);
  return fail ? ERR_NOMEM : 0;
}

int journal_log(journal_t *j, const struct log_row *l) {
  struct jentry *e = add(j, J_LOG);
  if (!e) return ERR_NOMEM;
  int fail = 0;
  struct log_row *c = &e->u.log;
  *c = *l;
  c->run_id = dup(j, l->run_id, &fail);
  c->level = dup(j, l->level, &fail);
  c->msg = dup(j, l->msg, &fail);
  return fail ? ERR_NOMEM : 0;
}

int journal_version(journal_t *j, const struct version_row *v) {
  struct jentry *e = add(j, J_VERSION);
  if (!e) return ERR_NOMEM;
  int fail = 0;
  struct version_row *c = &e->u.version;
  *c = *v;
  c->version = dup(j, v->version, &fail);
  c->skill = dup(j, v->skill, &fail);
  c->source = dup(j, v->source, &fail);
  c->file = dup(j, v->file, &fail);
  return fail ? ERR_NOMEM : 0;
}

int journal_skill(journal_t *j, const struct skill_row *s) {
  struct jentry *e = add(j, J_SKILL);
  if (!e) return ERR_NOMEM;
  int fail = 0;
  struct skill_row *c = &e->u.skill;
  *c = *s;
  c->id = dup(j, s->id, &fail);
  c->version = dup(j, s->version, &fail);
  c->file = dup(j, s->file, &fail);
  c->description = dup(j, s->description, &fail);
  c->triggers = dup(j, s->triggers, &fail);
  c->error = dup(j, s->error, &fail);
  return fail ? ERR_NOMEM : 0;
}
