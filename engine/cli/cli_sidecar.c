/*
** cli_sidecar.c: moonloop sidecar --workspace DIR --server URL: the
** workspace watcher as its own process, registering the skill files of DIR
** with the engine at URL through its HTTP API (standalone.h). It prints
** one line per file (ok, rejected with the reason, removed) and runs until
** SIGINT or SIGTERM.
*/
#include "cli/cli.h"
#include "sidecar/standalone.h"

/* moonloop sidecar: run until a signal; a start that fails exits 1 (2 for bad usage). */
int cli_sidecar(struct cli *c) {
  if (c->nargs || !c->cfg.server)
    return cli_fail(EXIT_USAGE, "usage: moonloop sidecar --workspace DIR --server URL");
  err_t e;
  if (standalone_run(&c->cfg, &e))
    return cli_fail(e.code == ERR_INVALID ? EXIT_USAGE : EXIT_FAILED, "sidecar: %s", e.msg);
  return EXIT_OK;
}
