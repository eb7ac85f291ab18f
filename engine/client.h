/*
** client.h: the command line against a running engine. When --server URL
** (or $MOONLOOP_URL) is set, commands go through the HTTP API instead of
** opening the database: same output formats, same exit statuses as the
** file mode (a connection failure exits 1 with "cannot reach the engine at
** URL: ..."). Requests carry `Authorization: Bearer TOKEN` when the variable
** named by token_env (MOONLOOP_TOKEN) is set.
**
** Blocking (libcurl's easy interface): for the CLI only, never on the
** engine's loop.
*/
#ifndef ML_CLIENT_H
#define ML_CLIENT_H
#include <cJSON.h>

#include "cli.h"
#include "config.h"
#include "err.h"

/* One request to the engine at cfg->server: method, path (with any query,
** already percent-encoded) and an optional body (JSON text; Lua source for
** PUT). *status gets the HTTP status (0 when no answer came), *answer the
** parsed JSON body (or NULL; caller frees). Returns 0 for a 2xx answer;
** otherwise a negative ERR_* code following the status (400 ERR_INVALID,
** 401 ERR_AUTH, 404 ERR_NOTFOUND, 409 ERR_CONFLICT, 413 ERR_TOOBIG, 503
** ERR_BUSY, other ERR_INTERNAL) with the server's error message in e, or
** ERR_IO when the engine could not be reached. */
int client_call(const struct config *cfg, const char *method, const char *path,
                const char *body, long *status, cJSON **answer, err_t *e);

/* The commands over HTTP (called by cli_runs, cli_trace, cli_skills,
** cli_invoke when c->cfg.server is set); they return the exit status. */
int client_runs(struct cli *c);
/* GET /v1/runs with c's filters: the list, or NULL after printing why. */
cJSON *client_list_runs(struct cli *c);
int client_trace(struct cli *c);
int client_skills(struct cli *c);
int client_invoke(struct cli *c);
/* send (data: the checked --data JSON), cancel, rerun over HTTP. */
int client_send(struct cli *c, const char *data);
int client_cancel(struct cli *c);
int client_rerun(struct cli *c);

#endif
