/*
** trace.c: printing run records for the terminal (see trace.h). Every
** string of a record may come from a skill (ids, names, messages, logs,
** outputs), so every one goes through term.h's escaping (T below; JSON
** through short_json); only the colours are this file's own escapes.
*/
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/term.h"
#include "base/units.h"
#include "base/vocab.h"
#include "cli/trace.h"

#include <stdlib.h>
#include <string.h>

#define GREEN "\033[32m"
#define RED "\033[31m"
#define YELLOW "\033[33m"
#define CYAN "\033[36m"
#define DIM "\033[2m"
#define BOLD "\033[1m"
#define RESET "\033[0m"

static const char *str(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The string at key k of o for printing: "?" when it is missing (printf's
** %s must never get NULL). */
static const char *shown(const cJSON *o, const char *k) {
  const char *s = str(o, k);
  return s ? s : "?";
}

static int64_t time_of(const cJSON *o, const char *k) {
  const char *s = str(o, k);
  int64_t ms = 0;
  if (s && units_parse_rfc3339(s, &ms, NULL)) ms = 0;
  return ms;
}

static const char *status_color(const char *st) {
  if (!st) return "";
  switch (vocab_run_status(st)) {
  case RUN_COMPLETED: return GREEN;
  case RUN_FAILED: return RED;
  case RUN_CANCELLED: return DIM;
  case RUN_SKIPPED: return DIM;
  case RUN_RUNNING: return YELLOW;
  default: break;
  }
  return CYAN;
}

static const char *status_mark(const char *st) {
  if (!st) return "?";
  switch (vocab_run_status(st)) {
  case RUN_COMPLETED: return "\xe2\x9c\x93";
  case RUN_FAILED: return "\xe2\x9c\x97";
  case RUN_CANCELLED: return "-";
  case RUN_SKIPPED: return "-";
  case RUN_SLEEPING: return "z";
  case RUN_WAITING: return "\xe2\x80\xa6";
  default: break;
  }
  return "\xe2\x96\xb8";
}

void trace_fmt_ago(int64_t then_ms, int64_t now_ms, char *out, size_t n) {
  if (!then_ms) {
    snprintf(out, n, "-");
    return;
  }
  char d[32];
  if (now_ms >= then_ms) {
    units_fmt_duration(now_ms - then_ms, d, sizeof d);
    /* Durations under a second read oddly as "850ms ago". */
    snprintf(out, n, "%s ago", now_ms - then_ms < 1000 ? "just now," : d);
    if (now_ms - then_ms < 1000) snprintf(out, n, "just now");
  } else {
    units_fmt_duration(then_ms - now_ms, d, sizeof d);
    snprintf(out, n, "in %s", d);
  }
}

/* The escaped strings of the record being printed. */
#define T(s) term_str(&ts, (s))

/* Compact JSON of v, cut to max bytes (at a character's start) with
** "...", escaped for the terminal (as JSON: it still reads as JSON). */
static char *short_json(const cJSON *v, size_t max) {
  char *s = v ? jsontext_print_text(v) : mem_strdup("null");
  if (s && strlen(s) > max) {
    size_t cut = max - 3;
    while (cut && ((unsigned char)s[cut] & 0xc0) == 0x80) cut--;
    strcpy(s + cut, "...");
  }
  char *e = term_dup(s, 1);
  free(s);
  return e;
}

static const char *trigger_kind(const cJSON *run) {
  const cJSON *t = cJSON_GetObjectItem(run, "trigger");
  const char *k = str(t, "kind");
  return k ? k : "?";
}

/* Why a queued run waits (its record's "queued"), in words: "concurrency
** limit 2 of scope openai, key event.data.team=\"a\"". Empty when it has
** no reason (not queued, or queued for an engine to take it). */
static void queued_text(const cJSON *q, char *out, size_t n) {
  out[0] = 0;
  if (!cJSON_IsObject(q)) return;
  const char *why = str(q, "reason"), *scope = str(q, "scope"), *skill = str(q, "skill");
  const char *key = str(q, "key");
  const char *period = str(q, "period"), *until = str(q, "until");
  const cJSON *lim = cJSON_GetObjectItem(q, "limit"), *pos = cJSON_GetObjectItem(q, "position");
  char amount[64] = "", place[48] = "";
  if (cJSON_IsNumber(lim)) snprintf(amount, sizeof amount, " limit %g%s", lim->valuedouble, period ? " per" : "");
  /* The run record's own (one run read), not a list's. */
  if (cJSON_IsNumber(pos)) snprintf(place, sizeof place, ", number %g in the queue", pos->valuedouble);
  snprintf(out, n, "%s%s%s%s of %s %s%s%s%s%s%s", why ? why : "?", amount, period ? " " : "",
           period ? period : "",
           scope ? "scope" : "skill", scope ? scope : skill ? skill : "?", key ? ", key " : "",
           key ? key : "", until ? ", until " : "", until ? until : "", place);
}

void trace_print_runs(FILE *f, const cJSON *runs, int color, int64_t now) {
  struct term_strs ts = {0};
  int n = cJSON_GetArraySize(runs);
  if (!n) {
    fprintf(f, "no runs\n");
    return;
  }
  fprintf(f, "%s%-26s  %-24s  %-10s  %-10s  %-14s  %9s%s\n", color ? BOLD : "", "RUN", "SKILL",
          "STATUS", "TRIGGER", "STARTED", "DURATION", color ? RESET : "");
  const cJSON *r;
  cJSON_ArrayForEach(r, runs) {
    const char *st = str(r, "status");
    int64_t started = time_of(r, "started_at"), ended = time_of(r, "ended_at");
    int ran = started != 0; /* a queued run has not started: no duration */
    if (!started) started = time_of(r, "created_at");
    char ago[32], dur[32] = "-";
    trace_fmt_ago(started, now, ago, sizeof ago);
    if (ran) units_fmt_duration((ended ? ended : now) - started, dur, sizeof dur);
    char why[400];
    queued_text(cJSON_GetObjectItem(r, "queued"), why, sizeof why);
    fprintf(f, "%-26s  %-24.24s  %s%-10s%s  %-10s  %-14s  %9s%s%s\n", T(shown(r, "id")),
            T(shown(r, "skill")), color ? status_color(st) : "",
            st ? T(st) : "?", color ? RESET : "", T(trigger_kind(r)), ago, dur,
            why[0] ? "  waiting: " : "", why[0] ? T(why) : "");
  }
  term_strs_free(&ts);
}

/* A waterfall bar: the step's place and length within the run. */
static void bar(char *out, size_t n, int64_t t0, int64_t total, int64_t s, int64_t e) {
  const int W = 20;
  int a = 0, b = 1;
  if (total > 0 && s >= t0) {
    a = (int)((s - t0) * W / total);
    b = (int)((e - t0) * W / total);
  }
  if (a >= W) a = W - 1;
  if (b <= a) b = a + 1;
  if (b > W) b = W;
  size_t k = 0;
  for (int i = 0; i < W && k + 4 < n; i++) {
    if (i >= a && i < b) {
      memcpy(out + k, "\xe2\x96\x88", 3);
      k += 3;
    } else {
      out[k++] = i < a ? ' ' : ' ';
    }
  }
  out[k] = 0;
}

static void print_logs(FILE *f, const cJSON *logs, const char *indent, int color) {
  struct term_strs ts = {0};
  const cJSON *l;
  cJSON_ArrayForEach(l, logs) {
    const char *lv = str(l, "level");
    fprintf(f, "%s%s%-5s%s %s\n", indent, color ? DIM : "", lv ? T(lv) : "", color ? RESET : "",
            str(l, "msg") ? T(str(l, "msg")) : "");
  }
  term_strs_free(&ts);
}

#define SHAPE_BRANCH 1 /* a branch of the parallel step before it */
#define SHAPE_LAST 2   /* the last step of its level */

/* The tree of a run's steps, into shape[i]: a parallel's branches are the
** steps right after it whose ids are its own with "/1", "/2", ... in turn
** (a step the skill named "p/1" elsewhere stays a step of its own), and
** each level's last step is marked, for the tree's lines. */
static void tree_shape(const cJSON *steps, unsigned char *shape) {
  const char *par = NULL;
  int k = 0, i = 0, last_top = -1, prev = -1;
  const cJSON *p;
  cJSON_ArrayForEach(p, steps) {
    const char *id = str(p, "id"), *kind = str(p, "kind");
    size_t pl = par ? strlen(par) : 0;
    char want[24];
    snprintf(want, sizeof want, "/%d", k + 1);
    if (par && id && !strncmp(id, par, pl) && !strcmp(id + pl, want)) {
      shape[i] = SHAPE_BRANCH;
      k++;
    } else {
      if (prev >= 0 && (shape[prev] & SHAPE_BRANCH)) shape[prev] |= SHAPE_LAST;
      par = kind && !strcmp(kind, "parallel") ? id : NULL;
      k = 0;
      last_top = i;
    }
    prev = i++;
  }
  if (prev >= 0 && (shape[prev] & SHAPE_BRANCH)) shape[prev] |= SHAPE_LAST;
  if (last_top >= 0) shape[last_top] |= SHAPE_LAST;
}

void trace_print_run(FILE *f, const cJSON *run, int color, int64_t now) {
  struct term_strs ts = {0};
  const char *st = str(run, "status");
  int64_t t0 = time_of(run, "started_at"), t1 = time_of(run, "ended_at");
  if (!t0) t0 = time_of(run, "created_at");
  int64_t total = (t1 ? t1 : now) - t0;
  char dur[32], ago[32];
  units_fmt_duration(total, dur, sizeof dur);
  trace_fmt_ago(t0, now, ago, sizeof ago);
  fprintf(f, "%srun %s%s  %s  %s%s %s%s  %s\n", color ? BOLD : "", T(shown(run, "id")),
          color ? RESET : "", T(shown(run, "skill")), color ? status_color(st) : "", status_mark(st),
          st ? T(st) : "?", color ? RESET : "", dur);
  const char *ver = str(run, "version");
  const cJSON *trig = cJSON_GetObjectItem(run, "trigger");
  fprintf(f, "  version  %.12s\n", ver ? T(ver) : "?");
  const char *kind = str(trig, "kind");
  int tk = vocab_trigger_kind(kind);
  if (tk == TRIGGER_EVENT) {
    const cJSON *ev = cJSON_GetObjectItem(trig, "event");
    fprintf(f, "  trigger  event %s (id %s)\n", str(ev, "name") ? T(str(ev, "name")) : "?",
            str(ev, "id") ? T(str(ev, "id")) : "-");
  } else if (tk == TRIGGER_RERUN || tk == TRIGGER_ON_FAILURE) {
    fprintf(f, "  trigger  %s of run %s\n", T(kind), str(trig, "run_id") ? T(str(trig, "run_id")) : "?");
  } else if (tk == TRIGGER_CRON) {
    fprintf(f, "  trigger  cron %s%s%s, tick %s%s\n", str(trig, "cron") ? T(str(trig, "cron")) : "",
            str(trig, "tz") ? " " : "", str(trig, "tz") ? T(str(trig, "tz")) : "",
            str(trig, "tick") ? T(str(trig, "tick")) : "?",
            cJSON_IsTrue(cJSON_GetObjectItem(trig, "catch_up")) ? " (catch-up after downtime)" : "");
  } else if (str(trig, "step")) {
    fprintf(f, "  trigger  %s by step %s of the parent run\n", kind ? T(kind) : "?",
            T(shown(trig, "step")));
  } else {
    fprintf(f, "  trigger  %s%s%s\n", kind ? T(kind) : "?", str(trig, "by") ? " by " : "",
            str(trig, "by") ? T(str(trig, "by")) : "");
  }
  if (str(run, "parent_id")) fprintf(f, "  parent   %s\n", T(str(run, "parent_id")));
  const cJSON *kid;
  cJSON_ArrayForEach(kid, cJSON_GetObjectItem(run, "children"))
    fprintf(f, "  child    %s  %s  %s\n", T(shown(kid, "id")), T(shown(kid, "skill")),
            T(shown(kid, "status")));
  char why[400];
  queued_text(cJSON_GetObjectItem(run, "queued"), why, sizeof why);
  if (why[0]) fprintf(f, "  queued   waiting: %s\n", T(why));
  char started[40];
  units_rfc3339(t0, started, sizeof started);
  if (time_of(run, "started_at")) fprintf(f, "  started  %s (%s)\n", started, ago);
  else fprintf(f, "  started  %s (created %s, %s)\n", st && !strcmp(st, "queued") ? "not yet" : "never",
               started, ago);
  char *in = short_json(cJSON_GetObjectItem(run, "input"), 200);
  fprintf(f, "  input    %s\n", in ? in : "null");
  free(in);
  const cJSON *logs = cJSON_GetObjectItem(run, "logs");
  if (cJSON_GetArraySize(logs)) print_logs(f, logs, "  log      ", color);
  const cJSON *steps = cJSON_GetObjectItem(run, "steps");
  int n = cJSON_GetArraySize(steps), i = 0;
  if (n) fputc('\n', f);
  unsigned char *shape = mem_calloc((size_t)n + 1, 1);
  tree_shape(steps, shape);
  char par_cont[16] = "";
  const cJSON *p;
  cJSON_ArrayForEach(p, steps) {
    const char *pst = str(p, "status");
    int branch_of = shape[i] & SHAPE_BRANCH, last = (shape[i] & SHAPE_LAST) != 0;
    i++;
    /* A parallel's branches hang under it, one level in. */
    char branch[40], cont[40];
    snprintf(branch, sizeof branch, "%s%s", branch_of ? par_cont : "",
             last ? "\xe2\x94\x94\xe2\x94\x80" : "\xe2\x94\x9c\xe2\x94\x80");
    snprintf(cont, sizeof cont, "%s%s", branch_of ? par_cont : "", last ? "   " : "\xe2\x94\x82  ");
    if (!branch_of) snprintf(par_cont, sizeof par_cont, "%s", last ? "   " : "\xe2\x94\x82  ");
    int64_t s = time_of(p, "started_at"), e = time_of(p, "ended_at");
    char d[32] = "", b[96];
    if (s) units_fmt_duration((e ? e : now) - s, d, sizeof d);
    bar(b, sizeof b, t0, total, s, e ? e : now);
    const char *kindp = str(p, "kind");
    fprintf(f, "  %s %s%s%s %-*s %-6s %8s  %s%s%s\n", branch, color ? status_color(pst) : "",
            status_mark(pst), color ? RESET : "", branch_of ? 25 : 28, T(str(p, "id")),
            kindp && vocab_step_kind(kindp) != STEP_KIND_RUN ? T(kindp) : "", d, color ? CYAN : "", b,
            color ? RESET : "");
    const cJSON *atts = cJSON_GetObjectItem(p, "attempts");
    const cJSON *a;
    if (cJSON_GetArraySize(atts) > 1 ||
        (pst && vocab_step_status(pst) != STEP_COMPLETED && cJSON_GetArraySize(atts))) {
      cJSON_ArrayForEach(a, atts) {
        const char *ast = str(a, "status");
        int64_t as = time_of(a, "started_at"), ae = time_of(a, "ended_at");
        char ad[32] = "";
        if (as && ae) units_fmt_duration(ae - as, ad, sizeof ad);
        const cJSON *nn = cJSON_GetObjectItem(a, "n");
        fprintf(f, "  %s   attempt %d %s%s%s%s%s%s%s\n", cont, nn ? nn->valueint : 0,
                color ? status_color(ast) : "", ast ? T(ast) : "", color ? RESET : "",
                *ad ? " after " : "", ad, str(a, "error") ? ": " : "",
                str(a, "error") ? T(str(a, "error")) : "");
      }
    }
    /* A step that failed without attempts of its own (an invoke whose
    ** child failed, a wait that could not start): its error. */
    const char *perr = str(p, "error") ? str(p, "error") : str(cJSON_GetObjectItem(p, "error"), "message");
    if (perr && !cJSON_GetArraySize(atts))
      fprintf(f, "  %s   %serror%s %s\n", cont, color ? RED : "", color ? RESET : "", T(perr));
    if (str(p, "wake_at") && vocab_step_status(pst) == STEP_SLEEPING) {
      char w[32];
      trace_fmt_ago(time_of(p, "wake_at"), now, w, sizeof w);
      fprintf(f, "  %s   wakes %s\n", cont, w);
    }
    /* The LLM's tokens of the step (llm.chat's usage, all its attempts). */
    const cJSON *use = cJSON_GetObjectItem(p, "usage");
    const cJSON *tot = cJSON_GetObjectItem(use, "total_tokens");
    if (cJSON_IsNumber(tot)) {
      const cJSON *pt = cJSON_GetObjectItem(use, "prompt_tokens");
      const cJSON *ct = cJSON_GetObjectItem(use, "completion_tokens");
      fprintf(f, "  %s   llm tokens %.0f", cont, tot->valuedouble);
      if (cJSON_IsNumber(pt) && cJSON_IsNumber(ct))
        fprintf(f, " (prompt %.0f, completion %.0f)", pt->valuedouble, ct->valuedouble);
      fputc('\n', f);
    }
    char indent[64];
    snprintf(indent, sizeof indent, "  %s   log ", cont);
    print_logs(f, cJSON_GetObjectItem(p, "logs"), indent, color);
    const cJSON *out = cJSON_GetObjectItem(p, "output");
    if (out && !cJSON_IsNull(out)) {
      char *o = short_json(out, 100);
      fprintf(f, "  %s   %s\xe2\x86\x92 %s%s\n", cont, color ? DIM : "", o ? o : "",
              color ? RESET : "");
      free(o);
    }
  }
  free(shape);
  fputc('\n', f);
  const cJSON *out = cJSON_GetObjectItem(run, "output");
  if (out && !cJSON_IsNull(out)) {
    char *o = short_json(out, 400);
    fprintf(f, "  output   %s\n", o ? o : "");
    free(o);
  }
  const cJSON *err = cJSON_GetObjectItem(run, "error");
  if (err && !cJSON_IsNull(err)) {
    const char *m = str(err, "message");
    fprintf(f, "  %serror%s    %s\n", color ? RED : "", color ? RESET : "", m ? T(m) : "");
    const char *tb = str(err, "traceback");
    if (tb) fprintf(f, "%s%s%s\n", color ? DIM : "", T(tb), color ? RESET : "");
  }
  term_strs_free(&ts);
}

/* A skill's last rejected load: where (file:line), when, why, and what
** stays live:
**   rejected skills/x.lua:3, 12s ago (2026-11-29T17:12:59.245Z): unknown key ...
**     version 941f6671a2b3 stays live
** The message's own "file:line: " prefix is not repeated. */
static void print_load_error(FILE *f, const cJSON *err, const char *live, int color) {
  struct term_strs ts = {0};
  const char *file = str(err, "file"), *msg = str(err, "message"), *at = str(err, "at");
  const cJSON *line = cJSON_GetObjectItem(err, "line");
  char where[600] = "";
  if (file && cJSON_IsNumber(line))
    snprintf(where, sizeof where, "%s:%d", file, line->valueint);
  else if (file)
    snprintf(where, sizeof where, "%s", file);
  if (!msg) msg = "?";
  size_t wl = strlen(where);
  if (wl && !strncmp(msg, where, wl) && msg[wl] == ':') msg += wl + 1;
  else if (file && !strncmp(msg, file, strlen(file)) && msg[strlen(file)] == ':')
    msg += strlen(file) + 1;
  while (*msg == ' ') msg++;
  char ago[64] = "";
  int64_t ms = time_of(err, "at");
  if (ms) trace_fmt_ago(ms, units_now_ms(), ago, sizeof ago);
  fprintf(f, "  %srejected%s %s%s%s%s%s%s: %s\n", color ? RED : "", color ? RESET : "",
          wl ? T(where) : "", *ago ? (wl ? ", " : "") : "", ago, at ? " (" : "", at ? T(at) : "",
          at ? ")" : "", T(msg));
  if (live)
    fprintf(f, "    %sversion %.12s stays live%s\n", color ? DIM : "", T(live), color ? RESET : "");
  else
    fprintf(f, "    %sno live version%s\n", color ? DIM : "", color ? RESET : "");
  term_strs_free(&ts);
}

void trace_print_skills(FILE *f, const cJSON *skills, int color, int64_t now) {
  struct term_strs ts = {0};
  if (!cJSON_GetArraySize(skills)) {
    fprintf(f, "no skills registered\n");
    return;
  }
  fprintf(f, "%s%-24s  %-12s  %-8s  %-36s  %-10s  %s%s\n", color ? BOLD : "", "SKILL", "VERSION",
          "VERSIONS", "TRIGGERS", "NEXT", "FILE", color ? RESET : "");
  const cJSON *s;
  cJSON_ArrayForEach(s, skills) {
    char trig[256] = "", next[32] = "-";
    size_t k = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(s, "triggers")) {
      const char *ev = str(t, "event"), *cr = str(t, "cron");
      k += (size_t)snprintf(trig + k, sizeof trig - k, "%s%s%s", k ? ", " : "",
                            ev ? "event " : "cron ", ev ? ev : cr ? cr : "?");
      if (k >= sizeof trig) break;
    }
    int64_t soonest = time_of(s, "next_fire"); /* its cron triggers' (store_read.c) */
    if (soonest) trace_fmt_ago(soonest, now, next, sizeof next);
    const char *ver = str(s, "version");
    fprintf(f, "%-24s  %-12.12s  %-8d  %-36.36s  %-10s  %s\n", T(shown(s, "id")),
            ver ? T(ver) : "(none)", cJSON_GetArraySize(cJSON_GetObjectItem(s, "versions")),
            k ? T(trig) : ver ? "invoke only" : "none (no live version)", next,
            str(s, "file") ? T(str(s, "file")) : "");
    const cJSON *err = cJSON_GetObjectItem(s, "error");
    if (err && !cJSON_IsNull(err)) print_load_error(f, err, ver, color);
  }
  term_strs_free(&ts);
}
