/*
** config.h: the engine's configuration. An optional Lua file
** (moonloop.conf.lua in the working folder, or --config FILE) returns a
** table; MOONLOOP_* variables override it, and command-line flags override
** both. The file runs in an empty sandbox (no libraries but string, table
** and math) and its table is validated strictly: an unknown key is an error.
*/
#ifndef ML_CONFIG_H
#define ML_CONFIG_H
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

/* Variables granted to one skill beyond the global `env` list
** (skill_env = { ["update-skill"] = { "GITHUB_TOKEN" } }). */
struct skill_env {
  char *skill;  /* the skill id */
  char **names; /* NULL-terminated */
};

struct config {
  char *file;            /* the configuration file read, or NULL */
  char *db;              /* moonloop.db */
  char *workspace;       /* skills */
  char *listen;          /* 127.0.0.1:8288 */
  char *server;          /* --server / MOONLOOP_URL: send commands to a running engine */
  char *token_env;       /* MOONLOOP_TOKEN */
  int durability_full;   /* 1: "full" (default), 0: "normal" */
  char *llm_base_url, *llm_model, *llm_api_key_env;
  char **env;            /* variables exposed to skills as env.*, NULL-terminated */
  struct skill_env *skill_env; /* skill_env: grants to one skill each */
  int nskill_env;
  char **deployers;      /* skills allowed to call skills.deploy, NULL-terminated */
  char **allowed_hosts;  /* Host names the HTTP API answers besides loopback and listen's */
  char **cancellers;     /* skills allowed to call runs.cancel, NULL-terminated */
  int64_t step_output;   /* limits.step_output, bytes */
  int64_t event_limit;   /* limits.event, bytes */
  int64_t slice_ms;      /* limits.run_seconds_between_yields, in ms */
  int64_t run_memory;    /* limits.run_memory, bytes */
  int64_t total_memory;  /* limits.total_memory: cap on all runs' and skills' Lua memory, bytes
                         ** (0: the default, half the machine's memory, at most 4 GB) */
  int64_t parked_runs;   /* limits.parked_runs: parked runs kept in memory (more are evicted) */
  int64_t run_logs;      /* limits.run_logs: bytes of log lines a run keeps (more are dropped) */
  int64_t invoke_depth;  /* limits.invoke_depth: how deep runs may invoke runs */
  int64_t run_tree;      /* limits.run_tree: the runs a tree of invokes may start in one process */
  int retries;           /* retry.retries: default retries of a step */
  int64_t backoff_ms;    /* retry.backoff: first retry delay */
  int64_t backoff_max_ms;/* retry.max_backoff */
  int64_t lease_ttl_ms;  /* lease: how long a silent process keeps its runs */
  char *otlp_endpoint;   /* otlp.endpoint: an OTLP/HTTP collector (traces go to ENDPOINT/v1/traces) */
  char *otlp_service;    /* otlp.service_name, default "moonloop" */
  int64_t retention_ms;  /* retention: serve prunes finished runs older than this (0: never) */
  int64_t shutdown_grace_ms; /* shutdown_grace: how long step bodies in flight may finish on SIGTERM */
};

/* Fill c with defaults, then the file (path, or moonloop.conf.lua when it
** exists and path is NULL), then MOONLOOP_* variables. */
int config_load(struct config *c, const char *path, err_t *e);

/* Whether a variable's name says it holds a secret (TOKEN, KEY, SECRET,
** PASSWORD, CREDENTIAL, ...): one that the global `env` list hands to
** every skill deserves a warning. */
int config_secret_name(const char *name);

/* The warning for the secret-looking names of the global `env` list, in
** out (one line, without "moonloop: "); returns how many there are (0: out
** is empty). moonloop check and serve print it. */
int config_env_warning(const struct config *c, char *out, size_t n);

/* Replace a string field (frees the old value). */
void config_set(char **field, const char *value);

void config_free(struct config *c);

#endif
