/*
** client.h: the command line against a running engine. When --server URL
** (or $MOONLOOP_URL) is set, commands go through the HTTP API instead of
** opening the database: same output formats, same exit statuses as the
** file mode (a connection failure exits 1 with "cannot reach the engine at
** URL: ..."). Requests carry `Authorization: Bearer TOKEN` when the variable
** named by token_env (MOONLOOP_TOKEN) is set.
**
** Blocking (core/remote.c, libcurl's easy interface): for the CLI only, never on the
** engine's loop.
*/
#ifndef ML_CLIENT_H
#define ML_CLIENT_H
#include <cJSON.h>

#include "base/err.h"
#include "cli/cli.h"
#include "core/remote.h"
#include "lua/config.h"

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
