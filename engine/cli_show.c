/*
** cli_show.c: commands that read history: runs, trace, skills.
*/
#include "cli.h"
#include "client.h"
#include "engine.h"
#include "trace.h"
#include "units.h"

#include <stdlib.h>
#include <string.h>

static int open_store(struct cli *c, struct engine *en) {
  err_t e;
  if (c->cfg.server) return cli_fail(EXIT_USAGE, "--server is not supported yet");
  if (engine_open_store(en, &c->cfg, &e)) {
    engine_close(en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  return 0;
}

static void print_json(cJSON *v, int pretty) {
  char *s = pretty ? cJSON_Print(v) : cJSON_PrintUnformatted(v);
  printf("%s\n", s);
  free(s);
}

int cli_runs(struct cli *c) {
  if (c->cfg.server) return client_runs(c); /* --server: through the HTTP API */
  struct run_filter f = {.skill = c->skill, .status = c->status, .trigger = c->trigger};
  err_t e;
  if (c->since) {
    int64_t ms;
    if (!units_duration(c->since, &ms, &e)) f.since = units_now_ms() - ms;
    else if (!units_parse_rfc3339(c->since, &ms, &e)) f.since = ms;
    else return cli_fail(EXIT_USAGE, "--since: expected a duration such as 7d or an RFC 3339 time, got '%s'", c->since);
  }
  if (c->limit) {
    f.limit = atoi(c->limit);
    if (f.limit <= 0) return cli_fail(EXIT_USAGE, "--limit must be a positive number, got '%s'", c->limit);
  }
  static const char *const statuses[] = {"queued", "running", "sleeping", "waiting",
                                         "completed", "failed", "cancelled", NULL};
  if (c->status) {
    int ok = 0;
    for (const char *const *s = statuses; *s; s++) ok |= !strcmp(*s, c->status);
    if (!ok) return cli_fail(EXIT_USAGE, "--status must be one of queued, running, sleeping, waiting, completed, failed, cancelled; got '%s'", c->status);
  }
  struct engine en;
  int rc = open_store(c, &en);
  if (rc) return rc;
  cJSON *runs;
  if (store_list_runs(en.store, &f, &runs, &e)) {
    engine_close(&en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  if (c->json) print_json(runs, 0);
  else trace_print_runs(stdout, runs, c->color, units_now_ms());
  cJSON_Delete(runs);
  engine_close(&en);
  return EXIT_OK;
}

int cli_trace(struct cli *c) {
  if (c->cfg.server) return client_trace(c); /* --server: through the HTTP API */
  if (c->nargs != 1) return cli_fail(EXIT_USAGE, "usage: moonloop trace RUN_ID");
  struct engine en;
  int rc = open_store(c, &en);
  if (rc) return rc;
  cJSON *run;
  err_t e;
  if (store_get_run(en.store, c->args[0], 1, &run, &e)) {
    engine_close(&en);
    return cli_fail(e.code == ERR_NOTFOUND ? EXIT_FAILED : EXIT_FAILED, "%s", e.msg);
  }
  if (c->json) print_json(run, 0);
  else trace_print_run(stdout, run, c->color, units_now_ms());
  cJSON_Delete(run);
  engine_close(&en);
  return EXIT_OK;
}

int cli_skills(struct cli *c) {
  if (c->cfg.server) return client_skills(c); /* --server: through the HTTP API */
  struct engine en;
  int rc = open_store(c, &en);
  if (rc) return rc;
  cJSON *skills;
  err_t e;
  if (store_list_skills(en.store, &skills, &e)) {
    engine_close(&en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  if (c->json) print_json(skills, 0);
  else trace_print_skills(stdout, skills, c->color);
  cJSON_Delete(skills);
  engine_close(&en);
  return EXIT_OK;
}
