/*
** cli_show.c: commands that read history: runs, trace, skills.
*/
#include "base/jsontext.h"
#include "base/term.h"
#include "base/units.h"
#include "base/vocab.h"
#include "cli/cli.h"
#include "cli/client.h"
#include "cli/trace.h"
#include "core/engine.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* See cli.h. */
int cli_open_history(struct cli *c, struct engine *en) {
  err_t e;
  if (c->cfg.server) return cli_fail(EXIT_USAGE, "--server is not supported yet");
  if (store_absent(c->cfg.db)) {
    en->store = NULL;
    if (!c->quiet)
      fprintf(stderr, "moonloop: no database at '%s': nothing has run here yet (a command that "
              "writes, such as serve, send or invoke, creates it). Is --db, MOONLOOP_DB or the "
              "working folder the one you meant?\n", c->cfg.db);
    return CLI_NO_DB;
  }
  if (engine_open_store(en, &c->cfg, &e)) {
    engine_close(en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  return 0;
}

static void print_json(cJSON *v, int pretty) {
  jsontext_fix_utf8(v);
  char *s = pretty ? jsontext_print_pretty(v) : jsontext_print_text(v);
  printf("%s\n", s);
  free(s);
}

/* One line of `runs --follow` about run r: when it is first seen
** (change "started"), when its status changes ("status") and when it ends
** ("ended"). With --json the line is one JSON object, {"at", "change",
** "run"} with the run record, so a program can read the stream line by
** line; otherwise a row for people, with the run's duration once it ended. */
static void follow_line(const struct cli *c, const cJSON *r, const char *change) {
  const cJSON *st = cJSON_GetObjectItem(r, "status"), *trig = cJSON_GetObjectItem(r, "trigger");
  const cJSON *kind = cJSON_GetObjectItem(trig, "kind");
  char now[40], dur[32] = "";
  units_rfc3339(units_now_ms(), now, sizeof now);
  if (c->json) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "at", now);
    cJSON_AddStringToObject(o, "change", change);
    cJSON_AddItemToObject(o, "run", cJSON_Duplicate(r, 1));
    print_json(o, 0);
    cJSON_Delete(o);
    fflush(stdout);
    return;
  }
  if (!strcmp(change, "ended")) {
    int64_t a = 0, b = 0;
    const cJSON *s1 = cJSON_GetObjectItem(r, "started_at"), *s2 = cJSON_GetObjectItem(r, "ended_at");
    if (cJSON_IsString(s1) && cJSON_IsString(s2) && !units_parse_rfc3339(s1->valuestring, &a, NULL) &&
        !units_parse_rfc3339(s2->valuestring, &b, NULL))
      units_fmt_duration(b - a, dur, sizeof dur);
  }
  const char *status = cJSON_IsString(st) ? st->valuestring : "?";
  int word = vocab_run_status(status);
  const char *color = !c->color ? "" : word == RUN_COMPLETED ? "\033[32m"
                      : word == RUN_FAILED ? "\033[31m" : "\033[33m";
  struct term_strs ts = {0};
  printf("%.8s  %-26s  %-24.24s  %s%-10s%s  %-8s  %s\n", now + 11,
         term_str(&ts, cJSON_GetObjectItem(r, "id")->valuestring),
         term_str(&ts, cJSON_GetObjectItem(r, "skill")->valuestring), color,
         term_str(&ts, status), c->color ? "\033[0m" : "",
         cJSON_IsString(kind) ? term_str(&ts, kind->valuestring) : "?", dur);
  term_strs_free(&ts);
  fflush(stdout);
}

static int terminal_status(const char *s) {
  return vocab_run_ended(s);
}

/* moonloop runs --follow: print runs as they start and end, until
** interrupted. On the database, the list is read again each time another
** process commits (PRAGMA data_version, asked every 20 ms); over --server,
** every 0.3 s. */
static int follow(struct cli *c, struct engine *en, const struct run_filter *f) {
  cJSON *seen = cJSON_CreateObject(); /* id -> last status printed */
  int first = 1;
  for (;;) {
    cJSON *runs = NULL;
    err_t e;
    int64_t version = en ? store_data_version(en->store) : 0; /* before the read */
    if (en) {
      struct run_filter g = *f;
      g.limit = 200;
      if (store_list_runs(en->store, &g, &runs, &e)) {
        cJSON_Delete(seen);
        return cli_fail(EXIT_FAILED, "%s", e.msg);
      }
    } else if (!(runs = client_list_runs(c))) {
      cJSON_Delete(seen);
      return EXIT_FAILED;
    }
    /* Oldest first, so lines come in the order things happened. */
    for (int i = cJSON_GetArraySize(runs) - 1; i >= 0; i--) {
      const cJSON *r = cJSON_GetArrayItem(runs, i);
      const char *id = cJSON_GetObjectItem(r, "id")->valuestring;
      const char *st = cJSON_GetObjectItem(r, "status")->valuestring;
      const cJSON *was = cJSON_GetObjectItem(seen, id);
      int known = cJSON_IsString(was);
      if (known && !strcmp(was->valuestring, st)) continue;
      /* On the first look, only runs still going are news. */
      if (!first || !terminal_status(st))
        follow_line(c, r, terminal_status(st) ? "ended" : known ? "status" : "started");
      if (known) cJSON_ReplaceItemInObject(seen, id, cJSON_CreateString(st));
      else cJSON_AddStringToObject(seen, id, st);
    }
    cJSON_Delete(runs);
    first = 0;
    if (!en) {
      usleep(300000);
      continue;
    }
    /* The database: look again only once another process committed. */
    while (store_data_version(en->store) == version) usleep(20000);
  }
}

int cli_runs(struct cli *c) {
  if (c->cfg.server && !c->follow) return client_runs(c); /* --server: through the HTTP API */
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
  if (c->status && !vocab_is_run_status(c->status))
    return cli_fail(EXIT_USAGE, "--status must be one of %s; got '%s'", VOCAB_RUN_STATUSES,
                    c->status);
  if (c->trigger && !vocab_is_trigger_kind(c->trigger))
    return cli_fail(EXIT_USAGE, "--trigger must be one of %s; got '%s'", VOCAB_TRIGGER_KINDS,
                    c->trigger);
  if (c->follow) {
    if (!c->json) printf("following runs (Ctrl-C to stop)\n");
    if (c->cfg.server) return follow(c, NULL, &f);
    struct engine fen;
    /* (Following waits for runs: where there is no database yet, the
    ** first serve or send creates it.) */
    err_t e;
    if (engine_open_store(&fen, &c->cfg, &e)) {
      engine_close(&fen);
      return cli_fail(EXIT_FAILED, "%s", e.msg);
    }
    int frc = follow(c, &fen, &f);
    engine_close(&fen);
    return frc;
  }
  struct engine en;
  int rc = cli_open_history(c, &en);
  if (rc && rc != CLI_NO_DB) return rc;
  cJSON *runs = rc ? cJSON_CreateArray() : NULL; /* no database: no runs */
  if (!rc && store_list_runs(en.store, &f, &runs, &e)) {
    engine_close(&en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  if (c->json) print_json(runs, 0);
  else trace_print_runs(stdout, runs, c->color, units_now_ms());
  cJSON_Delete(runs);
  if (!rc) engine_close(&en);
  return EXIT_OK;
}

/* moonloop trace RUN_ID [--wait SECONDS]: the run as a tree; --wait first
** waits (up to that long) for the run to end. */
int cli_trace(struct cli *c) {
  int64_t wait_ms = 0;
  if (c->wait_for && cli_wait_arg(c->wait_for, &wait_ms)) return EXIT_USAGE;
  if (c->cfg.server) return client_trace(c); /* --server: through the HTTP API */
  if (c->nargs != 1) return cli_fail(EXIT_USAGE, "usage: moonloop trace RUN_ID [--wait SECONDS]");
  struct engine en;
  int rc = cli_open_history(c, &en);
  if (rc == CLI_NO_DB) return cli_fail(EXIT_FAILED, "no run with id '%s' (there is no database at '%s')",
                                       c->args[0], c->cfg.db);
  if (rc) return rc;
  cJSON *run;
  err_t e;
  if ((wait_ms > 0 && cli_wait_run(&en, c->args[0], units_now_ms() + wait_ms, &e) < 0) ||
      store_get_run(en.store, c->args[0], 1, &run, &e)) {
    engine_close(&en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
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
  int rc = cli_open_history(c, &en);
  if (rc && rc != CLI_NO_DB) return rc;
  cJSON *skills = rc ? cJSON_CreateArray() : NULL; /* no database: no skills */
  err_t e;
  if (!rc && store_list_skills(en.store, &skills, &e)) {
    engine_close(&en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  if (c->json) print_json(skills, 0);
  else trace_print_skills(stdout, skills, c->color, units_now_ms());
  cJSON_Delete(skills);
  if (!rc) engine_close(&en);
  return EXIT_OK;
}
