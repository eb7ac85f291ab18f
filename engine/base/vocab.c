/*
** vocab.c: the word lists of vocab.h's tables, and looking words up.
*/
#include "base/vocab.h"

#include <string.h>

#define VOCAB_W(N, w, end) w,
const char *const vocab_run_statuses[] = {VOCAB_RUN_STATUS_LIST(VOCAB_W) NULL};
const char *const vocab_step_statuses[] = {VOCAB_STEP_STATUS_LIST(VOCAB_W) NULL};
const char *const vocab_step_kinds[] = {VOCAB_STEP_KIND_LIST(VOCAB_W) NULL};
const char *const vocab_trigger_kinds[] = {VOCAB_TRIGGER_KIND_LIST(VOCAB_W) NULL};
#undef VOCAB_W

#define VOCAB_END(N, w, end) end,
static const char run_status_ended[] = {VOCAB_RUN_STATUS_LIST(VOCAB_END)};
#undef VOCAB_END

/* The place of s in list, or VOCAB_NONE. */
static int index_of(const char *const *list, const char *s) {
  for (int i = 0; s && list[i]; i++)
    if (!strcmp(list[i], s)) return i;
  return VOCAB_NONE;
}

/* See vocab.h. */
int vocab_run_status(const char *s) { return index_of(vocab_run_statuses, s); }
int vocab_step_status(const char *s) { return index_of(vocab_step_statuses, s); }
int vocab_step_kind(const char *s) { return index_of(vocab_step_kinds, s); }
int vocab_trigger_kind(const char *s) { return index_of(vocab_trigger_kinds, s); }

/* See vocab.h. */
int vocab_is_run_status(const char *s) { return vocab_run_status(s) != VOCAB_NONE; }
int vocab_is_trigger_kind(const char *s) { return vocab_trigger_kind(s) != VOCAB_NONE; }

/* See vocab.h. */
int vocab_run_ended(const char *s) {
  int i = vocab_run_status(s);
  return i != VOCAB_NONE && run_status_ended[i];
}
