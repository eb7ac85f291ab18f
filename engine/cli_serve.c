/*
** cli_serve.c: moonloop serve: the engine as a long-running process. It
** loads the workspace's skills, resumes every unfinished run it can claim,
** executes queued ones, and stops cleanly on SIGINT or SIGTERM.
*/
#include "cli.h"
#include "engine.h"
#include "server.h"

#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

struct serve {
  struct engine en;
  uv_signal_t sigint, sigterm;
  server_t *srv; /* the HTTP API */
  int stopping;
};

static void close_signals(struct serve *sv) {
  uv_close((uv_handle_t *)&sv->sigint, NULL);
  uv_close((uv_handle_t *)&sv->sigterm, NULL);
}

static void on_signal(uv_signal_t *h, int signum) {
  struct serve *sv = h->data;
  if (sv->stopping) {
    /* A second signal: leave now. Everything that matters is durable. */
    fprintf(stderr, "moonloop: second signal, exiting at once\n");
    _exit(1);
  }
  sv->stopping = 1;
  fprintf(stderr, "moonloop: %s, stopping\n", signum == SIGINT ? "interrupted" : "terminated");
  close_signals(sv);
  server_stop(sv->srv); /* before the scheduler: pending answers drain first */
  sched_stop(sv->en.sched);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Load every skill file of the workspace folder, in name order. */
static int load_workspace(struct serve *sv, const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "moonloop: workspace '%s' cannot be read: %m (no skills loaded)\n", dir);
    return 0;
  }
  char *names[4096];
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)) && n < 4096) {
    size_t len = strlen(de->d_name);
    if (de->d_name[0] == '.' || len < 5 || strcmp(de->d_name + len - 4, ".lua")) continue;
    names[n++] = strdup(de->d_name);
  }
  closedir(d);
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  int loaded = 0;
  for (int i = 0; i < n; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    free(names[i]);
    struct skill *s;
    struct skill_error se;
    if (engine_load_file(&sv->en, path, 1, &s, &se)) {
      fprintf(stderr, "moonloop: %s\n", se.err.msg);
      continue;
    }
    loaded++;
  }
  return loaded;
}

int cli_serve(struct cli *c) {
  if (c->nargs) return cli_fail(EXIT_USAGE, "usage: moonloop serve [--workspace DIR] [--listen ADDR]");
  struct serve sv;
  memset(&sv, 0, sizeof sv);
  err_t e;
  if (engine_open(&sv.en, &c->cfg, SCHED_SERVE, c->verbose, &e)) {
    engine_close(&sv.en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  int n = load_workspace(&sv, c->cfg.workspace);
  if (sched_start(sv.en.sched, &e)) {
    engine_close(&sv.en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  /* The HTTP API, on the same loop. A refused address (no token for a
  ** non-loopback one) or a malformed one is a usage error. */
  if (server_start(&sv.en, c->cfg.listen, &sv.srv, &e)) {
    sched_stop(sv.en.sched);
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
  fprintf(stderr, "moonloop: serving %s (workspace %s, %d skill%s)\n", c->cfg.db,
          c->cfg.workspace, n, n == 1 ? "" : "s");
  fprintf(stderr, "moonloop: listening on %s\n", server_url(sv.srv));
  fflush(stderr);
  engine_run(&sv.en);
  server_free(sv.srv); /* after the loop, before the engine closes it */
  engine_close(&sv.en);
  return EXIT_OK;
}
