/*
** journal.c: a group of journal entries with an arena for their strings
** (see journal.h). Entries are stored in one growing array; strings are
** copied into fixed-size arena blocks that live as long as the group, so
** appending costs a memcpy and, rarely, a malloc.
*/
#include "store/journal.h"
#include "base/err.h"

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
  journal_t *j = calloc(1, sizeof(journal_t));
  if (j) j->fenced = -1;
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
  memset(e, 0, sizeof *e);
  e->kind = kind;
  return e;
}

/* Copy a run row's strings into the arena. */
static void copy_run(journal_t *j, struct run_row *c, const struct run_row *r, int *fail) {
  *c = *r;
  c->id = dup(j, r->id, fail);
  c->skill = dup(j, r->skill, fail);
  c->version = dup(j, r->version, fail);
  c->status = dup(j, r->status, fail);
  c->entry = dup(j, r->entry, fail);
  c->trigger = dup(j, r->trigger, fail);
  c->parent_id = dup(j, r->parent_id, fail);
  c->input = dup(j, r->input, fail);
  c->output = dup(j, r->output, fail);
  c->error = dup(j, r->error, fail);
  c->owner = dup(j, r->owner, fail);
  c->idem = dup(j, r->idem, fail);
  c->by_run = dup(j, r->by_run, fail);
  c->cancel_reason = NULL; /* read from the store only, never journaled */
}

int journal_run_new(journal_t *j, const struct run_row *r) {
  struct jentry *e = add(j, J_RUN_NEW);
  if (!e) return ERR_NOMEM;
  int fail = 0;
  copy_run(j, &e->u.run, r, &fail);
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
  c->triggers = dup(j, v->triggers, &fail);
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
  case J_VERSION: case J_SKILL: case J_CRON: return NULL;
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

int journal_event(journal_t *j, const struct event_row *ev) {
  struct jentry *e = add(j, J_EVENT);
  if (!e) return ERR_NOMEM;
  int fail = 0;
  struct event_row *c = &e->u.event;
  *c = *ev;
  c->id = dup(j, ev->id, &fail);
  c->name = dup(j, ev->name, &fail);
  c->data = dup(j, ev->data, &fail);
  c->idem = dup(j, ev->idem, &fail);
  c->by_run = dup(j, ev->by_run, &fail);
  return fail ? ERR_NOMEM : 0;
}

int journal_wait(journal_t *j, const struct wait_row *w) {
  struct jentry *e = add(j, J_WAIT);
  if (!e) return ERR_NOMEM;
  int fail = 0;
  struct wait_row *c = &e->u.wait;
  *c = *w;
  c->run_id = dup(j, w->run_id, &fail);
  c->kind = dup(j, w->kind, &fail);
  c->name = dup(j, w->name, &fail);
  c->match_path = dup(j, w->match_path, &fail);
  c->match_value = dup(j, w->match_value, &fail);
  c->owner = dup(j, w->owner, &fail);
  c->exclude = dup(j, w->exclude, &fail);
  return fail ? ERR_NOMEM : 0;
}

int journal_wait_end(journal_t *j, const struct wait_end *w) {
  struct jentry *e = add(j, J_WAIT_END);
  if (!e) return ERR_NOMEM;
  int fail = 0;
  e->u.wait_end = *w;
  e->u.wait_end.run_id = dup(j, w->run_id, &fail);
  return fail ? ERR_NOMEM : 0;
}

int journal_child_done(journal_t *j, const struct child_done *cd) {
  struct jentry *e = add(j, J_CHILD_DONE);
  if (!e) return ERR_NOMEM;
  int fail = 0;
  e->u.child.child_id = dup(j, cd->child_id, &fail);
  e->u.child.outcome = dup(j, cd->outcome, &fail);
  return fail ? ERR_NOMEM : 0;
}

int journal_cancel(journal_t *j, const struct cancel_row *cr) {
  struct jentry *e = add(j, J_CANCEL);
  if (!e) return ERR_NOMEM;
  int fail = 0;
  e->u.cancel = *cr;
  e->u.cancel.run_id = dup(j, cr->run_id, &fail);
  e->u.cancel.reason = dup(j, cr->reason, &fail);
  e->u.cancel.by_run = dup(j, cr->by_run, &fail);
  return fail ? ERR_NOMEM : 0;
}

int journal_slot(journal_t *j, const struct slot_row *sr) {
  struct jentry *e = add(j, J_SLOT);
  if (!e) return ERR_NOMEM;
  int fail = 0;
  e->u.slot = *sr;
  e->u.slot.run_id = dup(j, sr->run_id, &fail);
  e->u.slot.skill = dup(j, sr->skill, &fail);
  e->u.slot.key = dup(j, sr->key, &fail);
  return fail ? ERR_NOMEM : 0;
}

int journal_cron(journal_t *j, const struct cron_row *cr) {
  struct jentry *e = add(j, J_CRON);
  if (!e) return ERR_NOMEM;
  int fail = 0;
  struct cron_row *c = &e->u.cron;
  *c = *cr;
  c->skill = dup(j, cr->skill, &fail);
  c->spec = dup(j, cr->spec, &fail);
  copy_run(j, &c->run, &cr->run, &fail);
  return fail ? ERR_NOMEM : 0;
}
