/*
** engine.c: opening and closing an engine's parts in order (see engine.h).
*/
#include "core/engine.h"
#include "core/crash.h"
#include "base/mem.h"
#include "base/units.h"
#include "core/modules.h"
#include "core/otlp.h"
#include "lua/json.h"

#include <lauxlib.h>

#include <malloc.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

int engine_open_store(struct engine *en, const struct config *cfg, err_t *e) {
  memset(en, 0, sizeof *en);
  en->cfg = cfg;
  return store_open(cfg->db, cfg->durability_full ? STORE_FULL : STORE_NORMAL, &en->store, e);
}

/* See engine.h. */
void engine_process_init(void) {
  /* The soft limit on open files up to the hard one, as Redis and nginx
  ** do (shells and services start at 1024): connections, the database,
  ** the workspace and skills' requests share it. */
  struct rlimit rl;
  if (!getrlimit(RLIMIT_NOFILE, &rl)) {
    rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > (1u << 20) ? (1u << 20) : rl.rlim_max;
    if (rl.rlim_cur < want) {
      rl.rlim_cur = want;
      setrlimit(RLIMIT_NOFILE, &rl); /* (refused: the limit stays, which serve copes with) */
    }
  }
  mem_init();
  uv_replace_allocator(mem_alloc, mem_realloc, mem_calloc, free);
  httpc_global_init(NULL);
}

/* core.llm_settings: the LLM endpoint from the configuration, the key read
** from the variable it names. */
static void llm_settings(struct engine *en, const struct config *cfg) {
  lua_State *L = lrt_L(en->lrt);
  lua_createtable(L, 0, 3);
  lua_pushstring(L, cfg->llm_base_url), lua_setfield(L, -2, "base_url");
  lua_pushstring(L, cfg->llm_model), lua_setfield(L, -2, "model");
  const char *key = cfg->llm_api_key_env ? getenv(cfg->llm_api_key_env) : NULL;
  if (key) lua_pushstring(L, key), lua_setfield(L, -2, "api_key");
  lrt_register_value(en->lrt, "llm_settings");
}

int engine_open_runtime(struct engine *en, const struct config *cfg, err_t *e) {
  if (!en->cfg) memset(en, 0, sizeof *en);
  en->cfg = cfg;
  struct lrt_opts lo = {.slice_ms = cfg->slice_ms, .run_memory = cfg->run_memory,
                        .state_memory = cfg->total_memory};
  if (lrt_new(&lo, &en->lrt, e)) return e->code;
  en->skills = skills_new(en->lrt, (const char *const *)cfg->env, cfg->skill_env,
                          cfg->nskill_env);
  llm_settings(en, cfg);
  modules_register(en);
  return 0;
}

static int boot(struct engine *en, err_t *e) {
  if (lrt_boot(en->lrt, e)) return e->code;
  lua_State *L = lrt_L(en->lrt);
  if (lrt_require(en->lrt, "loader", e)) return e->code;
  lua_pop(L, 1);
  return 0;
}

/* Tell the HTTP client where the engine's API listens, as the configuration
** says (serve corrects it with the address it bound): skills' requests may
** not go there. A host name other than localhost is not looked up here
** (no blocking lookup at start); such an API is kept from skills by the
** header their requests carry (httpc.h, HTTPC_SKILL_HEADER). */
static void set_self(struct engine *en, const char *listen) {
  struct sockaddr_storage ss;
  const char *colon = listen ? strrchr(listen, ':') : NULL;
  if (!colon || colon == listen) return;
  char host[128];
  size_t hl = (size_t)(colon - listen);
  if (listen[0] == '[' && hl >= 2 && listen[hl - 1] == ']') listen++, hl -= 2;
  if (hl >= sizeof host) return;
  memcpy(host, listen, hl);
  host[hl] = 0;
  int port = atoi(colon + 1);
  if (port <= 0 || port > 65535) return;
  if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
  if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) &&
      uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss))
    return;
  httpc_set_self(en->http, (struct sockaddr *)&ss);
}

/* Keep freed memory rather than give it back at once. Each commit runs on
** one of libuv's pool threads, whose malloc arena glibc trims as soon as a
** transaction's memory is freed (128 KB at the top): the next commit then
** faults the same pages in again, which was a quarter of the commit
** thread's time under load. Freed memory is still reused. */
static void keep_freed_memory(void) {
#ifdef M_TRIM_THRESHOLD
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif
}

/* Record which run a crash of this process interrupts, beside the
** database (a SQLite file's "-crashes" file; for PostgreSQL, a file in the
** working folder named after the URL: store_side_path), and count the
** crashes earlier processes recorded there against their runs before any
** is resumed (core/crash.h). */
static int arm_crashes(struct engine *en, err_t *e) {
  char path[4096];
  if (store_side_path(en->store, "-crashes", path, sizeof path))
    return err_set(e, ERR_TOOBIG, "the database's name is too long for its crash record");
  int rc = crash_arm(path, e);
  int counted = rc ? 0 : crash_collect(en->store, path, e);
  if (rc || counted < 0) return e->code;
  if (counted)
    fprintf(stderr, "moonloop: %d crash%s of the engine recorded while a run was executing: "
            "counted against %s (a run that crashes it %d times is quarantined)\n", counted,
            counted == 1 ? "" : "es", counted == 1 ? "its run" : "their runs", SCHED_MAX_CRASHES);
  return 0;
}

/* See engine.h. */
int engine_open(struct engine *en, const struct config *cfg, enum sched_mode mode, int verbose,
                err_t *e) {
  keep_freed_memory();
  if (engine_open_store(en, cfg, e)) return e->code;
  if (engine_open_runtime(en, cfg, e)) return e->code;
  if (uv_loop_init(&en->loop)) return err_set(e, ERR_INTERNAL, "cannot create the event loop");
  en->loop_open = 1;
  if (httpc_new(&en->loop, &en->http, e)) return e->code;
  set_self(en, cfg->listen);
  struct sched_opts so = {
    .loop = &en->loop, .store = en->store, .lrt = en->lrt, .skills = en->skills,
    .http = en->http, .mode = mode, .lease_ttl_ms = cfg->lease_ttl_ms,
    .default_retries = cfg->retries, .backoff_ms = cfg->backoff_ms,
    .backoff_max_ms = cfg->backoff_max_ms, .step_output_limit = cfg->step_output,
    .event_limit = cfg->event_limit, .max_parked = (int)cfg->parked_runs,
    .run_log_limit = cfg->run_logs, .invoke_depth = (int)cfg->invoke_depth,
    .run_tree = (int)cfg->run_tree,
    .retention_ms = cfg->retention_ms,
    .verbose = verbose,
    .api_callers = (const char *const *)cfg->deployers,
  };
  if (sched_new(&so, &en->sched, e)) return e->code;
  if (arm_crashes(en, e)) return e->code;
  otlp_start(en);
  return boot(en, e);
}

int engine_load_file(struct engine *en, const char *path, int register_it, struct skill **out,
                     struct skill_error *se) {
  char *src;
  size_t len;
  se->line = 0;
  if (skills_read_file(path, &src, &len, &se->err)) return se->err.code;
  int rc = skills_load(en->skills, src, len, path, out, se);
  free(src);
  if (rc) return rc;
  struct skill *s = *out;
  char other[512];
  if (register_it && store_skill_held_elsewhere(en->store, s->id, path, other, sizeof other))
    /* As serve's workspace does: the id is another file's. A draft is
    ** tried without taking the live skill's place by running its file. */
    return err_set(&se->err, ERR_CONFLICT, "%s: skill id '%s' is already defined by %s, not "
                   "registered (to try this file without registering it: run(\"%s\"))", path,
                   s->id, other, path);
  int64_t now = units_now_ms();
  journal_t *j = journal_new();
  struct version_row v = {.version = s->version, .skill = s->id, .source = s->source,
                          .file = path, .loaded_at = now, .triggers = s->triggers};
  journal_version(j, &v);
  if (register_it) {
    char *scopes = skills_scopes(s), *limits = skills_slot_limits(s);
    struct skill_row k = {.id = s->id, .version = s->version, .file = path,
                          .description = s->description, .triggers = s->triggers,
                          .updated_at = now, .scopes = scopes, .limits = limits};
    journal_skill(j, &k);
    free(scopes), free(limits);
  }
  rc = store_commit(en->store, j, &se->err);
  /* The store refused the registration (a concurrency scope of the skill
  ** has another limit in another live skill): said, as the API's 409 does,
  ** not taken for a registered skill. */
  const char *refused = rc ? NULL : store_skill_refusal(journal_entry(j, journal_count(j) - 1));
  if (refused) rc = err_set(&se->err, ERR_CONFLICT, "%s", refused);
  journal_free(j);
  return rc;
}

/* See engine.h. (Added by the refactor: one copy for cli_run.c and repl.c.) */
int engine_load_registered(struct engine *en, const char *id, struct skill **out, err_t *e) {
  cJSON *rec;
  if (store_get_skill(en->store, id, &rec, e)) {
    if (e->code == ERR_NOTFOUND)
      err_set(e, ERR_NOTFOUND, "no skill '%s': not a file and not a registered skill (see "
              "moonloop skills)", id);
    return e->code;
  }
  cJSON *v = cJSON_GetObjectItem(rec, "version");
  if (!cJSON_IsString(v)) {
    cJSON_Delete(rec);
    return err_set(e, ERR_NOTFOUND, "skill '%s' has no live version (its file was removed or "
                   "never loaded)", id);
  }
  if ((*out = skills_find(en->skills, v->valuestring))) {
    cJSON_Delete(rec);
    return 0;
  }
  char *source = NULL, *file = NULL;
  int rc = store_get_version(en->store, v->valuestring, &source, NULL, &file, e);
  cJSON_Delete(rec);
  if (rc) return rc;
  struct skill_error se;
  rc = skills_load_recorded(en->skills, source, strlen(source), file ? file : id, out, &se);
  if (rc) *e = se.err;
  free(source);
  free(file);
  return rc;
}

int engine_run(struct engine *en) { return uv_run(&en->loop, UV_RUN_DEFAULT); }

static void walk_close(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

void engine_close(struct engine *en) {
  if (en->http) {
    httpc_close(en->http, NULL, NULL);
    en->http = NULL;
  }
  if (en->loop_open) {
    uv_run(&en->loop, UV_RUN_DEFAULT);
    uv_walk(&en->loop, walk_close, NULL);
    uv_run(&en->loop, UV_RUN_DEFAULT);
    uv_loop_close(&en->loop);
    en->loop_open = 0;
  }
  sched_free(en->sched);
  skills_free(en->skills);
  lrt_free(en->lrt);
  store_close(en->store);
  memset(en, 0, sizeof *en);
}
