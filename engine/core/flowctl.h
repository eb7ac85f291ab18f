/*
** flowctl.h: flow control in the core (flowctl.c): concurrency slots
** asked of the store before a run of a skill with limits resumes.
*/
#ifndef ML_FLOWCTL_H
#define ML_FLOWCTL_H

#include "core/sched.h"

struct run;

/* Whether r's skill has limits (its runs need slots to execute). */
int flowctl_needed(const struct run *r);

/* The JSON list of r's limits as the store takes them (journal.h's
** J_SLOT): [{"q", "key", "limit"}], the keys evaluated on r's event; a
** concurrency limit of a skill with priority(event) has r's "priority". */
char *flowctl_limits(struct run *r);

/* Ask the store for r's slots; the answer makes r ready, or leaves it
** queued until a release hands them on (flowctl_granted). */
void flowctl_gate(sched_t *s, struct run *r);

/* A release (here or in another engine) gave run_id its slots: take them
** up if that run lives here and waits for them. */
void flowctl_granted(sched_t *s, const char *run_id);

#endif
