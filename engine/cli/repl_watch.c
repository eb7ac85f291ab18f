/*
** repl_watch.c: what the REPL shows and asks while runs go on (see
** repl_int.h for how the REPL's files divide the work).
**
** Steps are printed from the scheduler's observer, as their rows become
** durable, for the runs the REPL watches: the run it waits for and the
** child runs that run starts (up to MAX_WATCH), one line per step event on
** stderr: "  ✓ fetch   12ms  {...}", child runs' steps indented under their
** skill's name. A step completed by step_through's skip is printed as
** skipped (the skips are remembered until their row comes by).
**
** step_through: the scheduler's pause handler only notes the step (it is
** called from inside the loop, where nothing may block); repl_eval then
** asks the question through repl_ask_cb, between loop turns, and answers.
** At most one question is pending at a time.
*/
#include "base/mem.h"
#include "base/term.h"
#include "base/units.h"
#include "base/vocab.h"
#include "cli/repl_int.h"

#include <ctype.h>
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* See repl_int.h. */
const char *repl__col(const struct repl *rp, const char *c) { return rp->color ? c : ""; }

/* ---- what is printed while runs go on ---- */

/* The index of run_id among the watched runs, or -1. */
static int watch_index(const struct repl *rp, const char *run_id) {
  for (int i = 0; i < rp->nwatch; i++)
    if (!strcmp(rp->watch[i], run_id)) return i;
  return -1;
}

/* See repl_int.h. */
void repl__watch_add(struct repl *rp, const char *run_id, const char *skill) {
  if (rp->nwatch >= MAX_WATCH || watch_index(rp, run_id) >= 0) return;
  snprintf(rp->watch[rp->nwatch], sizeof rp->watch[0], "%s", run_id);
  snprintf(rp->watch_skill[rp->nwatch], sizeof rp->watch_skill[0], "%s", skill ? skill : "?");
  rp->nwatch++;
}

/* Compact JSON cut to max bytes (on a UTF-8 boundary), with "...". */
static void short_json(const char *json, char *out, size_t max) {
  const char *s = json ? json : "null";
  size_t n = strlen(s);
  if (n < max) {
    memcpy(out, s, n + 1);
    return;
  }
  size_t k = max - 4;
  while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
  memcpy(out, s, k);
  memcpy(out + k, "...", 4);
}

/* Whether (run_id, seq) was completed by a skip; forgets it. */
static int take_skip(struct repl *rp, const char *run_id, int seq) {
  for (int i = 0; i < rp->nskips; i++) {
    if (rp->skips[i].seq == seq && !strcmp(rp->skips[i].run_id, run_id)) {
      rp->skips[i] = rp->skips[--rp->nskips];
      return 1;
    }
  }
  return 0;
}

/* One line per step event: "  ✓ fetch   12ms  {...}". Steps of child
** runs are indented under their skill's name. */
static void print_step(struct repl *rp, int w, const struct step_row *st) {
  char d[32], raw[96], pre[96];
  struct term_strs ts = {0}; /* step ids, outputs and errors are the skill's: escaped */
  const char *id = term_str(&ts, st->id ? st->id : "?");
  if (w > 0) snprintf(pre, sizeof pre, "    %s: ", term_str(&ts, rp->watch_skill[w]));
  else snprintf(pre, sizeof pre, "  ");
  int64_t ms = st->ended_at && st->started_at ? st->ended_at - st->started_at : 0;
  units_fmt_duration(ms, d, sizeof d);
  int status = vocab_step_status(st->status);
  if (status == STEP_COMPLETED) {
    short_json(st->output, raw, 72);
    char *v = term_dup(raw, 1);
    if (take_skip(rp, st->run_id, st->seq))
      fprintf(stderr, "%s%s\xe2\x86\xb7%s %-24s %8s  skipped with %s\n", pre, repl__col(rp, C_YELLOW),
              repl__col(rp, C_RESET), id, "", v ? v : "?");
    else
      fprintf(stderr, "%s%s\xe2\x9c\x93%s %-24s %s%8s%s  %s\n", pre, repl__col(rp, C_GREEN),
              repl__col(rp, C_RESET), id, repl__col(rp, C_DIM), d, repl__col(rp, C_RESET),
              v ? v : "?");
    free(v);
  } else if (status == STEP_FAILED) {
    fprintf(stderr, "%s%s\xe2\x9c\x97%s %-24s %s%8s%s  %s\n", pre, repl__col(rp, C_RED), repl__col(rp, C_RESET),
            id, repl__col(rp, C_DIM), d, repl__col(rp, C_RESET),
            st->error ? term_str(&ts, st->error) : "failed");
  } else if (status == STEP_RUNNING && st->retry_at) {
    units_fmt_duration(st->retry_at - units_now_ms(), d, sizeof d);
    fprintf(stderr, "%s%s\xe2\x86\xbb%s %-24s attempt %d failed: %s; retrying in %s\n", pre,
            repl__col(rp, C_YELLOW), repl__col(rp, C_RESET), id, st->attempts,
            rp->last_attempt_error ? term_str(&ts, rp->last_attempt_error) : "error", d);
  } else if (status == STEP_SLEEPING) {
    units_fmt_duration(st->wake_at - units_now_ms(), d, sizeof d);
    fprintf(stderr, "%s%sz%s %-24s sleeping for %s\n", pre, repl__col(rp, C_CYAN), repl__col(rp, C_RESET), id, d);
  } else if (status == STEP_WAITING) {
    const char *what = vocab_step_kind(st->kind) == STEP_KIND_INVOKE ? "its child run" : "an event";
    if (st->wake_at) {
      units_fmt_duration(st->wake_at - units_now_ms(), d, sizeof d);
      fprintf(stderr, "%s%s\xe2\x80\xa6%s %-24s waiting for %s (at most %s)\n", pre, repl__col(rp, C_CYAN),
              repl__col(rp, C_RESET), id, what, d);
    } else {
      fprintf(stderr, "%s%s\xe2\x80\xa6%s %-24s waiting for %s\n", pre, repl__col(rp, C_CYAN),
              repl__col(rp, C_RESET), id, what);
    }
  }
  /* "running" rows without a retry (a body waiting on I/O) say nothing new. */
  term_strs_free(&ts);
}

/* See repl_int.h: every entry of each durable group, in order. */
void repl__observe(const struct jentry *je, void *arg) {
  struct repl *rp = arg;
  int w;
  switch (je->kind) {
  case J_RUN_NEW:
    if (je->u.run.parent_id && watch_index(rp, je->u.run.parent_id) >= 0) {
      repl__watch_add(rp, je->u.run.id, je->u.run.skill);
      fprintf(stderr, "    %s\xe2\x96\xb8%s ", repl__col(rp, C_CYAN), repl__col(rp, C_RESET));
      term_printf(stderr, "child run %s (%s)\n", je->u.run.id, je->u.run.skill);
    }
    break;
  case J_ATTEMPT:
    if (watch_index(rp, je->u.attempt.run_id) < 0) break;
    free(rp->last_attempt_error);
    rp->last_attempt_error = je->u.attempt.error ? mem_strdup(je->u.attempt.error) : NULL;
    break;
  case J_STEP:
    if ((w = watch_index(rp, je->u.step.run_id)) >= 0) print_step(rp, w, &je->u.step);
    break;
  case J_LOG:
    if ((w = watch_index(rp, je->u.log.run_id)) >= 0) {
      fprintf(stderr, "%s      ", repl__col(rp, C_DIM));
      term_printf(stderr, "%s: %s", je->u.log.level, je->u.log.msg);
      fprintf(stderr, "%s\n", repl__col(rp, C_RESET));
    }
    break;
  default:
    break;
  }
}

/* ---- step_through: the pause handler ---- */

/* The JSON of a Lua expression (lua/repl.lua's value_json); malloc'd, or
** NULL with the problem in msg. */
static char *value_json(struct repl *rp, const char *expr, char *msg, size_t n) {
  lua_State *L = lrt_L(rp->en.lrt);
  int top = lua_gettop(L);
  err_t e;
  if (repl__call_module(rp, "value_json", expr, 2, &e)) {
    snprintf(msg, n, "%.1000s", e.msg);
    lua_settop(L, top);
    return NULL;
  }
  char *js = lua_isstring(L, -2) ? mem_strdup(lua_tostring(L, -2)) : NULL;
  if (!js) snprintf(msg, n, "%s", lua_isstring(L, -1) ? lua_tostring(L, -1) : "no value");
  lua_settop(L, top);
  return js;
}

/* s without its leading and trailing spaces (in place). */
static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
  return s;
}

/* See repl_int.h: note the step, and let repl_eval ask (one question at a
** time: a second run reaching a step meanwhile just runs it). */
enum run_pause_decision repl__on_pause(const struct run_pause_step *p, char **value, void *arg) {
  struct repl *rp = arg;
  (void)value;
  if (rp->pause.pending) return PAUSE_RUN; /* one question at a time */
  rp->pause.pending = 1;
  snprintf(rp->pause.run_id, sizeof rp->pause.run_id, "%s", p->run_id);
  snprintf(rp->pause.step_id, sizeof rp->pause.step_id, "%s", p->step_id ? p->step_id : "?");
  snprintf(rp->pause.kind, sizeof rp->pause.kind, "%s", p->kind ? p->kind : "?");
  rp->pause.seq = p->seq;
  return PAUSE_WAIT;
}

/* See repl_int.h: read answers until one decides; the run then goes on. */
void repl__answer_pause(struct repl *rp) {
  enum run_pause_decision d = PAUSE_STOP;
  char *value = NULL;
  fprintf(stderr, "  %s\xe2\x96\xb8%s ", repl__col(rp, C_CYAN), repl__col(rp, C_RESET));
  term_printf(stderr, "next: %s (%s)\n", rp->pause.step_id, rp->pause.kind);
  for (;;) {
    if (rp->interrupted || !rp->ask) break;
    char *line = rp->ask("step> ", rp->ask_arg);
    if (!line) break; /* end of input, or Ctrl-C: stop */
    char *a = trim(line);
    int decided = 1;
    if (!*a || !strcmp(a, "r") || !strcmp(a, "run")) {
      d = PAUSE_RUN;
    } else if (!strcmp(a, "q") || !strcmp(a, "quit") || !strcmp(a, "stop")) {
      d = PAUSE_STOP;
    } else if (a[0] == 's' && (!a[1] || isspace((unsigned char)a[1])) &&
               !strcmp(rp->pause.kind, "parallel")) {
      /* A parallel's record is not all it journals: each branch is a step
      ** of its own (seq + i), which its replay reads back. A skip records
      ** the parallel alone, and the run then fails on its first branch. */
      term_printf(stderr, "  '%s' is a step.parallel: it cannot be skipped here (its branches are "
                  "steps of their own, which a skip would not record); Enter runs it, q stops the "
                  "run (it stays resumable)\n", rp->pause.step_id);
      decided = 0;
    } else if (a[0] == 's' && (!a[1] || isspace((unsigned char)a[1]))) {
      char *expr = trim(a + 1), *asked = NULL, msg[1100];
      if (!*expr) {
        asked = rp->ask("value> ", rp->ask_arg);
        expr = asked ? trim(asked) : NULL;
      }
      if (!expr) {
        d = PAUSE_STOP;
      } else if ((value = value_json(rp, expr, msg, sizeof msg))) {
        d = PAUSE_SKIP;
        if (rp->nskips < MAX_SKIPS) {
          snprintf(rp->skips[rp->nskips].run_id, sizeof rp->skips[0].run_id, "%s",
                   rp->pause.run_id);
          rp->skips[rp->nskips++].seq = rp->pause.seq;
        }
      } else {
        term_printf(stderr, "  %s\n", msg);
        decided = 0;
      }
      free(asked);
    } else {
      fprintf(stderr, "  Enter runs the step; s VALUE skips it, completing it with VALUE (a Lua "
              "expression, such as s {ok = true}); q stops the run (it stays resumable)\n");
      decided = 0;
    }
    free(line);
    if (decided) break;
  }
  rp->pause.pending = 0;
  err_t e;
  if (run_pause_answer(rp->en.sched, rp->pause.run_id, d, value, &e))
    term_printf(stderr, "  %s\n", e.msg);
  free(value);
}
