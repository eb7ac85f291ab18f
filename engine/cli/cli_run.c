/*
** cli_run.c: commands that run skills: run, run --resume, invoke; and how
** a finished run's result is printed (cli_report_run, for --server too).
**
** run executes the skill in this process (SCHED_SOLO) to its end; invoke
** queues a run for the engine holding the database, or, with --wait and no
** engine alive, runs it here. Exit statuses: 0 completed, 1 failed or
** cancelled, 2 usage.
*/
#include "base/ids.h"
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/proc.h"
#include "base/term.h"
#include "base/units.h"
#include "base/vocab.h"
#include "cli/cli.h"
#include "cli/client.h"
#include "core/engine.h"

#include <cJSON.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* See cli.h. */
char *cli_data_json(const struct cli *c) {
  if (!c->data) return mem_strdup("null");
  const char *end = NULL;
  cJSON *v = cJSON_ParseWithOpts(c->data, &end, 1);
  if (!v) {
    cli_fail(EXIT_USAGE, "--data is not valid JSON (at character %ld): %.60s",
             end ? (long)(end - c->data) + 1 : 0L, c->data);
    return NULL;
  }
  char *s = jsontext_print_text(v);
  cJSON_Delete(v);
  return s;
}

/* See cli.h: text that is not JSON is printed as it is (escaped too). */
void cli_print_json(FILE *f, const char *json, int pretty, int escape) {
  cJSON *v = json ? cJSON_Parse(json) : NULL;
  char *s = v ? (pretty ? jsontext_print_pretty(v) : jsontext_print_text(v)) : NULL;
  const char *text = s ? s : json ? json : "null";
  if (escape) term_fputs(text, f, 1);
  else fputs(text, f);
  fputc('\n', f);
  free(s);
  cJSON_Delete(v);
}

/* What a run waited for in this process ended with (copied). */
struct outcome {
  int done;
  char *status, *output, *error;
};

/* sched_on_done's callback: keep the outcome for after the loop. */
static void on_done(const struct sched_result *r, void *arg) {
  struct outcome *o = arg;
  o->done = 1;
  o->status = mem_strdup(r->status);
  o->output = r->output ? mem_strdup(r->output) : NULL;
  o->error = r->error ? mem_strdup(r->error) : NULL;
}

/* SIGINT or SIGTERM while a run runs here: the run stops at its next
** step (as serve stops), its lease is let go, and the command says how it
** goes on; before, the signal killed the process without a word and the
** run waited, sleeping, for a lease to end. */
struct stopper {
  uv_signal_t sigint, sigterm;
  struct engine *en;
  int signum;
};

static void on_stop_signal(uv_signal_t *h, int signum) {
  struct stopper *st = h->data;
  if (st->signum) {
    fprintf(stderr, "moonloop: second signal, exiting at once\n");
    _exit(130);
  }
  st->signum = signum;
  sched_stop(st->en->sched, st->en->cfg->shutdown_grace_ms);
}

/* Listen for the signals without keeping the loop alive. */
static void stopper_start(struct stopper *st, struct engine *en) {
  memset(st, 0, sizeof *st);
  st->en = en;
  uv_signal_init(&en->loop, &st->sigint);
  uv_signal_init(&en->loop, &st->sigterm);
  st->sigint.data = st->sigterm.data = st;
  uv_signal_start(&st->sigint, on_stop_signal, SIGINT);
  uv_signal_start(&st->sigterm, on_stop_signal, SIGTERM);
  uv_unref((uv_handle_t *)&st->sigint);
  uv_unref((uv_handle_t *)&st->sigterm);
}

/* Whether the run ended here: not when the signal stopped it (the stop
** lets it go: "abandoned"). */
static int finished(const struct outcome *o, const struct stopper *st) {
  return o->done && !(st->signum && !strcmp(o->status, "abandoned"));
}

/* The end of a command whose run did not finish here: stopped by a signal
** (how it goes on), or not (a failure). */
static int not_finished(const struct stopper *st, const char *run_id) {
  if (!st->signum) return cli_fail(EXIT_FAILED, "run %s did not finish", run_id);
  fprintf(stderr, "moonloop: %s: run %s stopped after its last completed step, which is kept; "
          "`moonloop run --resume %s` goes on with it, or a serve on this database takes it "
          "over\n", st->signum == SIGINT ? "interrupted" : "terminated", run_id, run_id);
  return 128 + st->signum;
}

/* See cli.h: a run taken over by another process ("abandoned") fails too. */
int cli_report_run(const struct cli *c, const char *run_id, const char *status,
                   const char *output, const char *error) {
  if (vocab_run_status(status) == RUN_COMPLETED) {
    cli_print_json(stdout, output, !c->json && isatty(1), !c->json);
    return EXIT_OK;
  }
  if (c->json) {
    cli_print_json(stderr, error ? error : "null", 0, 0);
    return EXIT_FAILED;
  }
  if (!strcmp(status, "abandoned")) {
    fprintf(stderr, "moonloop: run %s was taken over by another process before it finished\n",
            run_id);
    return EXIT_FAILED;
  }
  cJSON *e = error ? cJSON_Parse(error) : NULL;
  cJSON *msg = cJSON_GetObjectItem(e, "message");
  term_printf(stderr, "moonloop: run %s %s: %s\n", run_id, status,
              cJSON_IsString(msg) ? msg->valuestring : error ? error : "(no error recorded)");
  cJSON *tb = cJSON_GetObjectItem(e, "traceback");
  if (cJSON_IsString(tb) && c->verbose) term_printf(stderr, "%s\n", tb->valuestring);
  cJSON_Delete(e);
  return EXIT_FAILED;
}

/* Whether p names a regular file. */
static int is_file(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Run a skill (a file or a registered id) to its end in this process. */
static int run_here(struct cli *c, const char *target, const char *data, const char *trigger) {
  struct engine en;
  err_t e;
  int verbose = c->verbose || (!c->quiet && isatty(2));
  if (engine_open(&en, &c->cfg, SCHED_SOLO, verbose, &e)) {
    engine_close(&en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  struct skill *skill = NULL;
  if (is_file(target) || strstr(target, ".lua")) {
    struct skill_error se;
    if (engine_load_file(&en, target, 0, &skill, &se)) {
      engine_close(&en);
      return cli_fail(EXIT_FAILED, "%s", se.err.msg);
    }
  } else if (engine_load_registered(&en, target, &skill, &e)) {
    engine_close(&en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  char run_id[27];
  struct outcome out = {0};
  if (sched_start(en.sched, &e) ||
      sched_run_new(en.sched, skill, trigger, data, NULL, run_id, &e)) {
    engine_close(&en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  fprintf(stderr, "run %s\n", run_id);
  fflush(stderr);
  sched_on_done(en.sched, run_id, on_done, &out);
  struct stopper st;
  stopper_start(&st, &en);
  engine_run(&en);
  engine_close(&en);
  int rc = finished(&out, &st) ? cli_report_run(c, run_id, out.status, out.output, out.error)
                                : not_finished(&st, run_id);
  free(out.status), free(out.output), free(out.error);
  return rc;
}

/* Take the unfinished run id and go on with it here; note follows its id
** on stderr. With held (not NULL), a run a live process holds is no
** failure: *held is set and nothing is printed (the caller waits). */
static int resume_id(struct cli *c, const char *id, const char *note, int *held) {
  struct engine en;
  err_t e;
  int verbose = c->verbose || (!c->quiet && isatty(2));
  if (engine_open(&en, &c->cfg, SCHED_SOLO, verbose, &e) || sched_start(en.sched, &e)) {
    engine_close(&en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  struct run_row *row = NULL;
  if (store_take_run(en.store, id, sched_owner(en.sched), proc_hostname(), units_now_ms(),
                     &row, &e)) {
    engine_close(&en);
    if (held && e.code == ERR_CONFLICT) {
      *held = 1;
      return EXIT_OK;
    }
    return cli_fail(EXIT_FAILED, "%s", e.msg); /* an unknown run too: the request failed */
  }
  struct outcome out = {0};
  char run_id[27];
  snprintf(run_id, sizeof run_id, "%s", row->id);
  fprintf(stderr, "run %s%s\n", run_id, note);
  sched_on_done(en.sched, run_id, on_done, &out);
  int rc = sched_adopt(en.sched, row, &e);
  store_rows_free(row, 1);
  if (rc) {
    engine_close(&en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  struct stopper st;
  stopper_start(&st, &en);
  engine_run(&en);
  engine_close(&en);
  rc = finished(&out, &st) ? cli_report_run(c, run_id, out.status, out.output, out.error)
                            : not_finished(&st, run_id);
  free(out.status), free(out.output), free(out.error);
  return rc;
}

/* moonloop run FILE-or-SKILL | run --resume RUN_ID. */
int cli_run(struct cli *c) {
  if (c->cfg.server)
    return cli_fail(EXIT_USAGE, "run executes the skill in this process; to run it on the engine "
                    "at %s use: moonloop invoke SKILL --wait --server URL", c->cfg.server);
  if (c->resume) {
    if (c->nargs)
      return cli_fail(EXIT_USAGE, "run --resume RUN_ID takes no other argument, got '%s'",
                      c->args[0]);
    return resume_id(c, c->resume, " (resumed)", NULL);
  }
  if (c->nargs != 1)
    return cli_fail(EXIT_USAGE, "usage: moonloop run FILE-or-SKILL [--data JSON] | run --resume RUN_ID");
  char *data = cli_data_json(c);
  if (!data) return EXIT_USAGE;
  int rc = run_here(c, c->args[0], data, "{\"kind\":\"invoke\",\"by\":\"cli\"}");
  free(data);
  return rc;
}

/* Create a queued run of a registered skill for an engine to pick up, in
** one synced transaction. With a key, a run of the skill that has it
** already is answered instead: run_id gets its id and *repeat is set. */
static int enqueue(struct engine *en, const char *skill_id, const char *data, const char *key,
                   char *run_id, int *repeat, err_t *e) {
  char version[80];
  *repeat = 0;
  if (store_live_version(en->store, skill_id, version, sizeof version, e)) return e->code;
  int64_t now = units_now_ms();
  ids_ulid(now, run_id);
  char trig[SCHED_KEY_MAX * 6 + 96];
  if (jsontext_invoke_trigger("cli", key, trig, sizeof trig))
    return err_set(e, ERR_INVALID, "--key is too long (at most %d bytes)", SCHED_KEY_MAX);
  struct run_row row = {
    .id = run_id, .skill = skill_id, .version = version, .status = "queued",
    .entry = "run", .trigger = trig, .input = data, .created_at = now, .idem = key,
  };
  journal_t *j = journal_new();
  journal_run_new(j, &row);
  int rc = store_commit(en->store, j, e);
  const struct jentry *je = journal_entry(j, 0);
  if (!rc && je->result) {
    snprintf(run_id, 27, "%s", je->result);
    *repeat = 1;
  }
  journal_free(j);
  return rc;
}

/* Whether a run status is final. */
static int terminal(const char *s) {
  return vocab_run_ended(s);
}

/* See cli.h. */
int cli_wait_run(struct engine *en, const char *run_id, int64_t deadline_ms, err_t *e) {
  int64_t seen = -1;
  for (;;) {
    int64_t v = store_data_version(en->store);
    if (v != seen) {
      /* Something was committed since the last look (or this is the first). */
      seen = v;
      char st[32];
      if (store_run_status(en->store, run_id, st, sizeof st, e)) return e->code;
      if (terminal(st)) return 0;
    }
    if (deadline_ms && units_now_ms() >= deadline_ms) return 1;
    usleep(20000);
  }
}

/* See cli.h. */
int cli_wait_arg(const char *s, int64_t *ms) {
  err_t e;
  if (units_duration(s, ms, &e))
    return cli_fail(EXIT_USAGE, "--wait: expected seconds or a duration such as 30s, got '%s'", s);
  return 0;
}

/* Print the stored outcome of a run that ended; the exit status. */
static int report_stored(struct cli *c, struct engine *en, const char *run_id) {
  cJSON *rec;
  err_t e;
  if (store_get_run(en->store, run_id, 0, &rec, &e)) return cli_fail(EXIT_FAILED, "%s", e.msg);
  const char *st = cJSON_GetObjectItem(rec, "status")->valuestring;
  cJSON *err = cJSON_GetObjectItem(rec, "error");
  char *out = jsontext_print_text(cJSON_GetObjectItem(rec, "output"));
  char *ej = cJSON_IsNull(err) ? NULL : jsontext_print_text(err);
  int rc = cli_report_run(c, run_id, st, out, ej);
  free(out), free(ej);
  cJSON_Delete(rec);
  return rc;
}

/* moonloop invoke SKILL [--data JSON] [--key KEY] [--wait]: queue a run
** (--wait: and wait for it to end, watching the database; run it here
** when no engine holds the database). */
int cli_invoke(struct cli *c) {
  if (c->nargs != 1)
    return cli_fail(EXIT_USAGE, "usage: moonloop invoke SKILL [--data JSON] [--key KEY] [--wait]");
  if (c->key && strlen(c->key) > SCHED_KEY_MAX)
    return cli_fail(EXIT_USAGE, "--key is too long (at most %d bytes)", SCHED_KEY_MAX);
  if (c->cfg.server) return client_invoke(c); /* --server: through the HTTP API */
  char *data = cli_data_json(c);
  if (!data) return EXIT_USAGE;
  struct engine en;
  err_t e;
  if (engine_open_store(&en, &c->cfg, &e)) {
    free(data);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  /* With --wait and no engine holding the database, run it here. */
  int alive = store_engine_alive(en.store, units_now_ms());
  if (c->wait && !alive && !c->key) {
    engine_close(&en);
    int rc = run_here(c, c->args[0], data, "{\"kind\":\"invoke\",\"by\":\"cli\"}");
    free(data);
    return rc;
  }
  char run_id[27];
  int repeat;
  int rc = enqueue(&en, c->args[0], data, c->key, run_id, &repeat, &e);
  free(data);
  if (rc) {
    engine_close(&en);
    return cli_fail(EXIT_FAILED, "%s", e.msg); /* an unknown skill too, as with --wait */
  }
  if (!c->wait) {
    if (c->json) printf("{\"run_id\":\"%s\"}\n", run_id);
    else printf("%s\n", run_id);
    if (repeat && !c->json)
      fprintf(stderr, "moonloop: a run with key '%s' was started before: this is its id\n", c->key);
    engine_close(&en);
    return EXIT_OK;
  }
  if (!alive) {
    /* A keyed run with no engine: run it here, unless it has ended or
    ** another process is running it (then wait for that one). */
    char st[32];
    if (store_run_status(en.store, run_id, st, sizeof st, &e)) {
      engine_close(&en);
      return cli_fail(EXIT_FAILED, "%s", e.msg);
    }
    if (!terminal(st)) {
      engine_close(&en);
      int held = 0;
      rc = resume_id(c, run_id, "", &held);
      if (!held) return rc;
      if (engine_open_store(&en, &c->cfg, &e)) return cli_fail(EXIT_FAILED, "%s", e.msg);
    }
  }
  fprintf(stderr, "run %s\n", run_id);
  fflush(stderr);
  if (cli_wait_run(&en, run_id, 0, &e) < 0) rc = cli_fail(EXIT_FAILED, "%s", e.msg);
  else rc = report_stored(c, &en, run_id);
  engine_close(&en);
  return rc;
}
