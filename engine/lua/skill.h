/*
** skill.h: skill versions loaded into the runtime.
**
** A version is the SHA-256 of a skill file's source. Loading compiles the
** source (text only, JIT off), runs its top level in a fresh sandbox under
** the slice budget, and validates the returned table strictly (lua/skill.lua).
** Loaded versions are cached by hash and live until the cache is freed, so
** every run finishes on the version it started with, whatever happens to
** the file meanwhile.
*/
#ifndef ML_SKILL_H
#define ML_SKILL_H
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "lua/config.h"
#include "lua/lrt.h"

struct skill {
  char version[65];
  char *id, *file, *description, *source;
  char *triggers;  /* JSON list of normalized triggers */
  char *cancel_on; /* JSON list, or NULL */
  int retries;     /* -1: the configured default */
  int64_t backoff_ms, timeout_ms; /* 0: default / none */
  int nlimits;    /* flow control: how many limits (0: none) */
  char *limits;   /* their JSON list [{kind, limit, key?, scope?, period?, burst?}], or NULL */
  int has_on_failure;
  int has_priority; /* its definition has priority(event): the order of its queued runs */
  int def_ref; /* registry ref of the definition table */
  int cfg_ref; /* registry ref of the table its runs share (0 until the first run) */
  int mem_group; /* its runs' memory accounts (lrt.h), and the account its top level's */
  int mem_acct;  /* objects were charged to while it loaded */
  struct skill *next;
};

/* Where a load failed: the message carries "file:line: ", line is 0 when unknown. */
struct skill_error {
  err_t err;
  int line;
};

typedef struct skills skills_t;

/* A cache of loaded versions for one runtime. env_names lists the
** variables every skill sees as env.* (NULL-terminated, may be NULL);
** grants (ngrants of them) add variables for one skill each: a skill sees
** the global list plus its own grant, nothing else. A skill with a grant
** has its top level run twice: once to learn its id, then again with the
** grant (the id must come out the same). */
skills_t *skills_new(lrt_t *r, const char *const *env_names, const struct skill_env *grants,
                     int ngrants);
void skills_free(skills_t *c);

/* Load (or find in the cache) the version of source. file names it in
** errors and gives the default id. A new version is validated in full,
** static checks included (lua/lint.lua). */
int skills_load(skills_t *c, const char *source, size_t len, const char *file,
                struct skill **out, struct skill_error *se);

/* The same for a version read back from the store (runs resume on it): it
** was accepted when it was registered, so checks added since (the static
** ones, keys that were dropped) do not refuse it. */
int skills_load_recorded(skills_t *c, const char *source, size_t len, const char *file,
                         struct skill **out, struct skill_error *se);

/* Validate source without keeping it (moonloop check, skills.deploy); *id
** gets the skill id (caller frees). Its top level sees the global env list
** only, never a skill_env grant's values (a source can claim any id): the
** grant's names read as unset. */
int skills_check(skills_t *c, const char *source, size_t len, const char *file, char **id,
                 struct skill_error *se);

/* The same; *warnings gets the static checks' warnings as a JSON list of
** {"line", "message"}, or NULL when there are none (caller frees).
** env_known: the skill will run with this configuration (moonloop check),
** so a literal env.NAME it does not grant the skill is an error; 0 when
** that is not known (skills.check from a skill), then nothing is said. */
int skills_check_warnings(skills_t *c, const char *source, size_t len, const char *file,
                          int env_known, char **id, char **warnings, struct skill_error *se);

/* The cached version with this hash, or NULL. */
struct skill *skills_find(skills_t *c, const char *version);

/* The concurrency limits sk shares with other skills (scope), as the
** store judges them (journal.h's skill_row.scopes): a JSON list of
** {"scope", "key"?, "limit"}, or NULL when it names no scope (malloc'd). */
char *skills_scopes(const struct skill *sk);

/* The key a limit counts under ("[tag:]path=value", or the tag, or ""
** without a path), malloc'd. value NULL: the key's prefix that every
** value of the path shares ("[tag:]path="; without a path, the key). */
char *skills_limit_key(const char *tag, const char *path, const char *value);

/* sk's concurrency limits as the store applies them to every run of the
** skill's id, queued or asking, whichever version it runs (journal.h's
** skill_row.limits): a JSON list of {"q", "key", "limit"}, key a prefix
** when it ends with '=' (skills_limit_key's, value NULL), or NULL when it
** has none (malloc'd). */
char *skills_slot_limits(const struct skill *sk);

/* The default id for a file: its base name without ".lua", '_' as '-'. */
void skills_default_id(const char *file, char *out, size_t n);

/* Read a whole file into a malloc'd NUL-terminated buffer. */
int skills_read_file(const char *path, char **out, size_t *len, err_t *e);

#endif
