/*
** remote.h: the engine's HTTP API from another process (the CLI's
** --server mode, the standalone sidecar). Requests carry `Authorization:
** Bearer TOKEN` when the variable named by token_env (MOONLOOP_TOKEN) is
** set.
**
** Blocking (libcurl's easy interface): for command-line processes only,
** never on the engine's loop.
*/
#ifndef ML_REMOTE_H
#define ML_REMOTE_H
#include <cJSON.h>

#include "base/err.h"
#include "lua/config.h"

/* One request to the engine at cfg->server: method, path (with any query,
** already percent-encoded) and an optional body (JSON text; Lua source for
** PUT). *status gets the HTTP status (0 when no answer came), *answer the
** parsed JSON body (or NULL; caller frees). Returns 0 for a 2xx answer;
** otherwise a negative ERR_* code following the status (400 ERR_INVALID,
** 401 ERR_AUTH, 404 ERR_NOTFOUND, 409 ERR_CONFLICT, 413 ERR_TOOBIG, 503
** ERR_BUSY, other ERR_INTERNAL) with the server's error message in e, or
** ERR_IO when the engine could not be reached. */
int remote_call(const struct config *cfg, const char *method, const char *path,
                const char *body, long *status, cJSON **answer, err_t *e);

#endif
