/*
** vocab.c: run statuses and trigger kinds (see vocab.h).
*/
#include "base/vocab.h"

#include <string.h>

const char *const vocab_run_statuses[] = {"queued", "running", "sleeping", "waiting",
                                          "completed", "failed", "cancelled", NULL};

const char *const vocab_trigger_kinds[] = {"event", "cron", "invoke", "rerun", "on_failure", NULL};

/* Whether s is one of list's words. */
static int in_list(const char *const *list, const char *s) {
  for (; s && *list; list++)
    if (!strcmp(*list, s)) return 1;
  return 0;
}

/* See vocab.h. */
int vocab_is_run_status(const char *s) { return in_list(vocab_run_statuses, s); }

/* See vocab.h. */
int vocab_is_trigger_kind(const char *s) { return in_list(vocab_trigger_kinds, s); }
