/*
** cli_control.c: commands that change what runs: send, cancel, rerun.
** Each writes straight into the database in one synced transaction, so
** exit status 0 means the change is durable, whether an engine runs or not.
*/
#include "base/ids.h"
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/proc.h"
#include "base/units.h"
#include "base/vocab.h"
#include "cli/cli.h"
#include "cli/client.h"
#include "core/engine.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int open_store(struct cli *c, struct engine *en) {
  err_t e;
  if (engine_open_store(en, &c->cfg, &e)) {
    engine_close(en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  return 0;
}

/* Commit one journal of entries; the first entry's answer goes to *result. */
static int commit_one(struct engine *en, journal_t *j, char **result, err_t *e) {
  int rc = store_commit(en->store, j, e);
  if (!rc && result) {
    const struct jentry *je = journal_entry(j, 0);
    *result = je->result ? mem_strdup(je->result) : NULL;
  }
  journal_free(j);
  return rc;
}

int cli_send(struct cli *c) {
  if (c->nargs != 1) return cli_fail(EXIT_USAGE, "usage: moonloop send NAME [--data JSON] [--id KEY]");
  const char *name = c->args[0];
  if (!*name || strlen(name) > 256)
    return cli_fail(EXIT_USAGE, "bad event name '%.40s': 1 to 256 characters", name);
  char *data = cli_data_json(c);
  if (!data) return EXIT_USAGE;
  if ((int64_t)strlen(data) > c->cfg.event_limit) {
    char sz[32], lim[32];
    units_fmt_over((int64_t)strlen(data), c->cfg.event_limit, sz, lim, sizeof sz);
    free(data);
    return cli_fail(EXIT_USAGE, "the event's data is %s, over the limit of %s (limits.event)", sz, lim);
  }
  if (c->cfg.server) { /* --server: through the HTTP API */
    int rc = client_send(c, data);
    free(data);
    return rc;
  }
  struct engine en;
  int rc = open_store(c, &en);
  if (rc) {
    free(data);
    return rc;
  }
  err_t e;
  if (c->id && store_event_key_clash(en.store, c->id, name, &e)) {
    free(data);
    engine_close(&en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  int64_t now = units_now_ms();
  char id[27];
  ids_ulid(now, id);
  journal_t *j = journal_new();
  struct event_row ev = {.id = id, .name = name, .data = data, .idem = c->id, .ts = now};
  journal_event(j, &ev);
  char *got = NULL;
  rc = commit_one(&en, j, &got, &e);
  free(data);
  engine_close(&en);
  if (rc) return cli_fail(EXIT_FAILED, "%s", e.msg);
  int dup = got && strcmp(got, id);
  if (c->json) printf("{\"id\":\"%s\",\"duplicate\":%s}\n", got ? got : id, dup ? "true" : "false");
  else printf("%s\n", got ? got : id);
  if (dup && !c->json) fprintf(stderr, "moonloop: an event with id key '%s' was accepted before; this repeat is ignored\n", c->id);
  free(got);
  return EXIT_OK;
}

int cli_cancel(struct cli *c) {
  if (c->nargs != 1) return cli_fail(EXIT_USAGE, "usage: moonloop cancel RUN_ID");
  if (c->cfg.server) return client_cancel(c); /* --server: through the HTTP API */
  struct engine en;
  int rc = open_store(c, &en);
  if (rc) return rc;
  err_t e;
  /* An engine that died (crashed, killed) still holds its runs until its
  ** lease expires, and a cancellation of a held run only asks its owner.
  ** Reap the leases of dead processes on this host first, as `serve` does
  ** when it starts: their runs are then unowned, and cancelled now, before
  ** any engine resumes them (a run that crashes the engine on every
  ** restart can be cancelled with no engine running). Only dead ones
  ** (now 0: no lease counts as expired): a live engine, even a frozen one
  ** past its lease, keeps its runs, and is fenced per run if it comes back. */
  if (store_reap(en.store, proc_hostname(), 0, &e) < 0)
    fprintf(stderr, "moonloop: cancel: %s (going on)\n", e.msg);
  journal_t *j = journal_new();
  struct cancel_row cr = {.run_id = c->args[0], .reason = "cancelled from the command line",
                          .at = units_now_ms()};
  journal_cancel(j, &cr);
  char *got = NULL;
  rc = commit_one(&en, j, &got, &e);
  engine_close(&en);
  if (rc) return cli_fail(EXIT_FAILED, "%s", e.msg);
  if (!got || !strcmp(got, "notfound")) {
    free(got);
    return cli_fail(EXIT_FAILED, "no run with id '%s'", c->args[0]);
  }
  if (!strncmp(got, "ended:", 6)) {
    cli_fail(EXIT_FAILED, "run %s is already %s: nothing to cancel", c->args[0], got + 6);
    free(got);
    return EXIT_FAILED;
  }
  if (c->json) printf("{\"run_id\":\"%s\",\"status\":\"%s\"}\n", c->args[0], got);
  else if (vocab_run_status(got) == RUN_CANCELLED) printf("cancelled %s\n", c->args[0]);
  else printf("cancelling %s: the engine running it stops it within a moment\n", c->args[0]);
  free(got);
  return EXIT_OK;
}

int cli_rerun(struct cli *c) {
  if (c->nargs != 1) return cli_fail(EXIT_USAGE, "usage: moonloop rerun RUN_ID [--key KEY]");
  if (c->key && strlen(c->key) > SCHED_KEY_MAX)
    return cli_fail(EXIT_USAGE, "--key is too long (at most %d bytes)", SCHED_KEY_MAX);
  if (c->cfg.server) return client_rerun(c); /* --server: through the HTTP API */
  struct engine en;
  int rc = open_store(c, &en);
  if (rc) return rc;
  cJSON *run = NULL;
  err_t e;
  if (store_get_run(en.store, c->args[0], 0, &run, &e)) {
    engine_close(&en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  const char *skill_id = cJSON_GetObjectItem(run, "skill")->valuestring;
  char *version;
  if (store_rerun_version(en.store, skill_id, cJSON_GetObjectItem(run, "version")->valuestring,
                          &version, &e)) {
    cJSON_Delete(run);
    engine_close(&en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  char *input = jsontext_print_text(cJSON_GetObjectItem(run, "input"));
  char id[27], *trig = sched_rerun_trigger(run, c->key);
  int64_t now = units_now_ms();
  ids_ulid(now, id);
  struct run_row row = {.id = id, .skill = skill_id, .version = version, .status = "queued",
                        .entry = "run", .trigger = trig, .input = input, .created_at = now,
                        .idem = c->key};
  journal_t *j = journal_new();
  journal_run_new(j, &row);
  char *first = NULL; /* a repeated key: the run it started before (store__put_keyed_run) */
  rc = commit_one(&en, j, &first, &e);
  if (first) snprintf(id, sizeof id, "%s", first);
  free(first);
  int alive = store_engine_alive(en.store, now);
  free(trig);
  free(input);
  free(version);
  cJSON_Delete(run);
  engine_close(&en);
  if (rc) return cli_fail(EXIT_FAILED, "%s", e.msg);
  if (c->json) printf("{\"run_id\":\"%s\"}\n", id);
  else printf("%s\n", id);
  if (!alive && !c->json)
    fprintf(stderr, "moonloop: queued; no engine is running: start `moonloop serve`, or run it here "
            "with `moonloop run --resume %s`\n", id);
  return EXIT_OK;
}

int cli_prune(struct cli *c) {
  if (c->nargs || !c->older_than)
    return cli_fail(EXIT_USAGE, "usage: moonloop prune --older-than 30d");
  int64_t ms;
  err_t e;
  if (units_duration(c->older_than, &ms, &e))
    return cli_fail(EXIT_USAGE, "--older-than: %s", e.msg);
  if (c->cfg.server) return cli_fail(EXIT_USAGE, "%s", cli_needs_file("prune", c->cfg.server));
  struct engine en;
  int rc = open_store(c, &en);
  if (rc) return rc;
  int64_t runs, events;
  rc = store_prune(en.store, units_now_ms() - ms, &runs, &events, &e);
  engine_close(&en);
  if (rc) return cli_fail(EXIT_FAILED, "%s", e.msg);
  if (c->json) printf("{\"runs\":%lld,\"events\":%lld}\n", (long long)runs, (long long)events);
  else printf("pruned %lld run%s and %lld event%s older than %s\n", (long long)runs,
              runs == 1 ? "" : "s", (long long)events, events == 1 ? "" : "s", c->older_than);
  return EXIT_OK;
}
