/*
** cli_serve.c: moonloop serve: the engine as a long-running process. It
** watches the workspace and hot-loads its skills (the sidecar: sidecar.h),
** resumes every unfinished run it can claim, executes queued ones, and
** stops cleanly on SIGINT or SIGTERM. "listening on URL" is printed once
** the workspace's skills are registered, and only then are connections
** accepted (before, they wait in the listen backlog): a client that
** connects in serve's first milliseconds never sees a 404 for a skill of
** the workspace. Then, under a service manager ($NOTIFY_SOCKET:
** systemd's Type=notify), READY=1 is sent, and STOPPING=1 when a signal
** asks it to stop.
*/
#include "base/notify.h"
#include "cli/cli.h"
#include "core/engine.h"
#include "server/server.h"
#include "sidecar/sidecar.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

struct serve {
  struct engine en;
  uv_signal_t sigint, sigterm;
  server_t *srv; /* the HTTP API */
  sidecar_t *sc;  /* the workspace watcher */
  const struct config *cfg;
  int stopping;
};

static void on_signal(uv_signal_t *h, int signum) {
  struct serve *sv = h->data;
  if (sv->stopping) {
    /* A second signal: leave now. Everything that matters is durable. */
    fprintf(stderr, "moonloop: second signal, exiting at once\n");
    _exit(1);
  }
  sv->stopping = 1;
  fprintf(stderr, "moonloop: %s, stopping\n", signum == SIGINT ? "interrupted" : "terminated");
  err_t ne;
  if (notify_send("STOPPING=1", &ne)) fprintf(stderr, "moonloop: %s\n", ne.msg);
  /* Still listening for a second signal, without keeping the loop alive. */
  uv_unref((uv_handle_t *)&sv->sigint);
  uv_unref((uv_handle_t *)&sv->sigterm);
  sidecar_stop(sv->sc); /* no new versions while stopping */
  server_stop(sv->srv); /* before the scheduler: pending answers drain first */
  sched_stop(sv->en.sched, sv->en.cfg->shutdown_grace_ms);
}

/* The workspace's skills are registered: say where we serve. */
static void on_ready(void *arg, int loaded, int rejected) {
  struct serve *sv = arg;
  if (sv->stopping) return;
  sched_triggers_live(sv->en.sched); /* cron follows the triggers just loaded */
  /* The store's name for its database: a URL's password is left out. */
  fprintf(stderr, "moonloop: serving %s (workspace %s, %d skill%s", store_path(sv->en.store),
          sv->cfg->workspace, loaded, loaded == 1 ? "" : "s");
  if (rejected) fprintf(stderr, ", %d file%s rejected", rejected, rejected == 1 ? "" : "s");
  fprintf(stderr, ")\n");
  fprintf(stderr, "moonloop: listening on %s\n", server_url(sv->srv));
  fflush(stderr);
  server_ready(sv->srv); /* only now are connections accepted */
  /* The API listens and the workspace is registered: ready. A service
  ** manager that cannot be told is worth a line, not a stop. */
  err_t e;
  if (notify_send("READY=1", &e)) fprintf(stderr, "moonloop: %s\n", e.msg);
}

int cli_serve(struct cli *c) {
  if (c->nargs) return cli_fail(EXIT_USAGE, "usage: moonloop serve [--workspace DIR] [--listen ADDR]");
  struct serve sv;
  memset(&sv, 0, sizeof sv);
  sv.cfg = &c->cfg;
  err_t e;
  char warning[1200];
  if (config_env_warning(&c->cfg, warning, sizeof warning)) fprintf(stderr, "moonloop: %s\n", warning);
  if (engine_open(&sv.en, &c->cfg, SCHED_SERVE, c->verbose, &e)) {
    engine_close(&sv.en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  if (sched_start(sv.en.sched, &e)) {
    engine_close(&sv.en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  /* The HTTP API, on the same loop. A refused address (no token for a
  ** non-loopback one) or a malformed one is a usage error. */
  if (server_start(&sv.en, c->cfg.listen, &sv.srv, &e)) {
    sched_stop(sv.en.sched, 0);
    engine_run(&sv.en);
    engine_close(&sv.en);
    return cli_fail(e.code == ERR_AUTH || e.code == ERR_INVALID ? EXIT_USAGE : EXIT_FAILED, "%s",
                    e.msg);
  }
  uv_signal_init(&sv.en.loop, &sv.sigint);
  uv_signal_init(&sv.en.loop, &sv.sigterm);
  sv.sigint.data = sv.sigterm.data = &sv;
  uv_signal_start(&sv.sigint, on_signal, SIGINT);
  uv_signal_start(&sv.sigterm, on_signal, SIGTERM);
  /* The sidecar: the first scan registers the workspace, then it watches. */
  if (sidecar_start(&sv.en, c->cfg.workspace, on_ready, &sv, &sv.sc, &e)) {
    fprintf(stderr, "moonloop: %s\n", e.msg);
    raise(SIGTERM);
  }
  engine_run(&sv.en);
  server_free(sv.srv); /* after the loop, before the engine closes it */
  engine_close(&sv.en);
  sidecar_free(sv.sc); /* after the engine: no registry answer can come any more */
  return EXIT_OK;
}
