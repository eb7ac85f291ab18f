/*
** vocab.h: the words of the run record that filters check against: run
** statuses and trigger kinds. One list for the API, the CLI and the REPL.
*/
#ifndef ML_VOCAB_H
#define ML_VOCAB_H

/* The run statuses, NULL-terminated, in the order of a run's life. */
extern const char *const vocab_run_statuses[];

/* The kinds of trigger a run can have, NULL-terminated. */
extern const char *const vocab_trigger_kinds[];

/* Both lists as text, for messages. */
#define VOCAB_RUN_STATUSES "queued, running, sleeping, waiting, completed, failed, cancelled"
#define VOCAB_TRIGGER_KINDS "event, cron, invoke, rerun, on_failure"

/* Whether s is a run status / a trigger kind. */
int vocab_is_run_status(const char *s);
int vocab_is_trigger_kind(const char *s);

#endif
