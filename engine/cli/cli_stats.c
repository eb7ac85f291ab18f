/*
** cli_stats.c: moonloop stats [SKILL] [--since 7d] [--until T] [--interval I]:
** the health figures of every skill, or of one, over a window (the store
** computes them: store_stats_overview, store_stats_skill), printed as a
** table with sparklines, or as the API's JSON with --json. With --server
** the figures come from GET /v1/stats or /v1/skills/{id}/stats, and are
** printed the same way.
**
** Sparklines are one character per interval, from the eight block
** elements U+2581..U+2588, scaled to the row's largest value; an interval
** without a value (no ended run to take a percentile of) is a dot, a zero
** is a space. Colour only on a terminal (and never with NO_COLOR).
*/
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/units.h"
#include "cli/cli.h"
#include "cli/client.h"
#include "core/engine.h"

#include <curl/curl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RED "\033[31m"
#define GREEN "\033[32m"
#define DIM "\033[2m"
#define BOLD "\033[1m"
#define CYAN "\033[36m"
#define RESET "\033[0m"

static const char *const blocks[8] = {
  "\xe2\x96\x81", "\xe2\x96\x82", "\xe2\x96\x83", "\xe2\x96\x84",
  "\xe2\x96\x85", "\xe2\x96\x86", "\xe2\x96\x87", "\xe2\x96\x88",
};

/* ---- reading the figures ---------------------------------------------------- */

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

/* The number at o[k], or NAN when it is missing or null. */
static double num(const cJSON *o, const char *k) {
  const cJSON *v = get(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *str(const cJSON *o, const char *k) {
  const cJSON *v = get(o, k);
  return cJSON_IsString(v) ? v->valuestring : "";
}

static int64_t time_at(const cJSON *o, const char *k) {
  int64_t ms = 0;
  if (units_parse_rfc3339(str(o, k), &ms, NULL)) ms = 0;
  return ms;
}

/* ---- formatting ---------------------------------------------------------------- */

/* A count with thousands separators: "1,234,567". */
static void fmt_count(double v, char *out, size_t n) {
  if (isnan(v)) {
    snprintf(out, n, "-");
    return;
  }
  char digits[32];
  snprintf(digits, sizeof digits, "%.0f", v);
  size_t len = strlen(digits), o = 0;
  for (size_t i = 0; i < len && o + 2 < n; i++) {
    if (i && digits[i] != '-' && (len - i) % 3 == 0 && digits[i - 1] != '-') out[o++] = ',';
    out[o++] = digits[i];
  }
  out[o] = 0;
}

/* A large count for people: 950, 12.3k, 4.5M. */
static void fmt_short(double v, char *out, size_t n) {
  if (isnan(v)) snprintf(out, n, "-");
  else if (v < 10000) snprintf(out, n, "%.0f", v);
  else if (v < 1e6) snprintf(out, n, "%.1fk", v / 1e3);
  else if (v < 1e9) snprintf(out, n, "%.1fM", v / 1e6);
  else snprintf(out, n, "%.1fG", v / 1e9);
}

static void fmt_ms(double v, char *out, size_t n) {
  if (isnan(v)) snprintf(out, n, "-");
  else units_fmt_duration((int64_t)v, out, n);
}

static void fmt_rate(double v, char *out, size_t n) {
  if (isnan(v)) snprintf(out, n, "-");
  else snprintf(out, n, "%.1f%%", v * 100);
}

/* Local time "2026-01-31 14:05" of an RFC 3339 time. */
static void fmt_local(int64_t ms, char *out, size_t n) {
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  localtime_r(&t, &tm);
  strftime(out, n, "%Y-%m-%d %H:%M", &tm);
}

/* "+12%", "-3%" or "" for a change from was to now (relative), or "new". */
static void fmt_change(double now, double was, char *out, size_t n) {
  out[0] = 0;
  if (isnan(now) || isnan(was)) return;
  if (was == 0) {
    if (now != 0) snprintf(out, n, "new");
    return;
  }
  double pct = (now - was) / was * 100;
  if (fabs(pct) >= 0.5) snprintf(out, n, "%+.0f%%", pct);
}

/* Print the sparkline of series[*][key]: one character per interval. */
static void spark(FILE *f, const cJSON *series, const char *key, const char *color, int use_color) {
  double max = 0;
  const cJSON *p;
  cJSON_ArrayForEach(p, series) {
    double v = num(p, key);
    if (!isnan(v) && v > max) max = v;
  }
  if (use_color && *color) fputs(color, f);
  cJSON_ArrayForEach(p, series) {
    double v = num(p, key);
    if (isnan(v)) fputs(use_color ? DIM "\xc2\xb7" RESET : "\xc2\xb7", f);
    else if (v <= 0 || max <= 0) fputc(' ', f);
    else fputs(blocks[v >= max ? 7 : (int)(v / max * 7.999)], f);
    if (use_color && isnan(v) && *color) fputs(color, f);
  }
  if (use_color && *color) fputs(RESET, f);
}

/* The interval index each version in versions was loaded in, marked with
** a triangle under the sparkline; spaces elsewhere. */
static void deploy_row(FILE *f, const cJSON *series, const cJSON *versions, int64_t since,
                       int64_t iv) {
  int n = cJSON_GetArraySize(series);
  char *mark = mem_calloc((size_t)n + 1, 1);
  const cJSON *v;
  cJSON_ArrayForEach(v, versions) {
    int64_t at = time_at(v, "loaded_at");
    int64_t k = iv ? (at - since) / iv : -1;
    if (k >= 0 && k < n) mark[k] = 1;
  }
  for (int i = 0; i < n; i++) fputs(mark[i] ? "\xe2\x96\xb2" : " ", f);
  free(mark);
}

/* ---- the two views ----------------------------------------------------------------- */

/* The heading line: what window, cut how. */
static void window_line(FILE *f, const cJSON *st, const char *what, int color) {
  char a[32], b[32];
  fmt_local(time_at(st, "since"), a, sizeof a);
  fmt_local(time_at(st, "until"), b, sizeof b);
  fprintf(f, "%s%s%s  %s -> %s, per %s\n", color ? BOLD : "", what, color ? RESET : "", a, b,
          str(st, "interval"));
}

/* moonloop stats: one row per skill. */
static void print_overview(FILE *f, const cJSON *st, int color) {
  const cJSON *skills = get(st, "skills");
  window_line(f, st, "skills", color);
  if (!cJSON_GetArraySize(skills)) {
    fprintf(f, "no skill has runs in this window, and none is registered\n");
    return;
  }
  int w = 5;
  const cJSON *x;
  cJSON_ArrayForEach(x, skills) {
    int l = (int)strlen(str(x, "skill"));
    if (l > w) w = l;
  }
  if (w > 32) w = 32;
  int nb = cJSON_GetArraySize(get(cJSON_GetArrayItem(skills, 0), "series"));
  fprintf(f, "%s%-*s  %9s %7s %6s %8s %8s  %-*s  %s%s\n", color ? DIM : "", w, "SKILL", "RUNS",
          "FAILED", "FAIL%", "P50", "P95", nb < 12 ? 12 : nb, "RUNS PER INTERVAL", "CHANGE",
          color ? RESET : "");
  cJSON_ArrayForEach(x, skills) {
    const cJSON *t = get(x, "totals"), *p = get(x, "previous");
    const cJSON *d = get(t, "duration_ms");
    char runs[32], failed[32], rate[16], p50[16], p95[16], c1[16], c2[48];
    fmt_count(num(t, "started"), runs, sizeof runs);
    fmt_count(num(t, "failed"), failed, sizeof failed);
    fmt_rate(num(t, "failure_rate"), rate, sizeof rate);
    fmt_ms(num(d, "p50"), p50, sizeof p50);
    fmt_ms(num(d, "p95"), p95, sizeof p95);
    int bad = num(t, "failed") > 0;
    fprintf(f, "%-*.*s  %9s %s%7s %6s%s %8s %8s  ", w, w, str(x, "skill"), runs,
            color && bad ? RED : "", failed, rate, color && bad ? RESET : "", p50, p95);
    spark(f, get(x, "series"), "started", bad ? "" : GREEN, color);
    for (int i = nb; i < 12; i++) fputc(' ', f);
    /* What changed since the window before: runs, failure rate, deploys. */
    fmt_change(num(t, "started"), num(p, "started"), c1, sizeof c1);
    double fr = num(t, "failure_rate"), pfr = num(p, "failure_rate");
    c2[0] = 0;
    if (!isnan(fr) && !isnan(pfr) && fabs(fr - pfr) >= 0.0005)
      snprintf(c2, sizeof c2, "fail %+.1fpt", (fr - pfr) * 100);
    int deployed = cJSON_GetArraySize(get(x, "versions")) > 0;
    fprintf(f, "  %s%s%s%s%s%s", *c1 ? "runs " : "", c1, *c1 && *c2 ? ", " : "", c2,
            (*c1 || *c2) && deployed ? ", " : "", deployed ? "deployed" : "");
    fputc('\n', f);
  }
}

/* One sparkline row of the skill view: label, line, and its largest value. */
static void spark_row(FILE *f, const char *label, const cJSON *series, const char *key,
                      const char *color, int use_color, int is_ms, int is_rate) {
  double max = NAN;
  const cJSON *p;
  cJSON_ArrayForEach(p, series) {
    double v = num(p, key);
    if (!isnan(v) && (isnan(max) || v > max)) max = v;
  }
  fprintf(f, "  %-12s ", label);
  spark(f, series, key, color, use_color);
  char m[32];
  if (is_ms) fmt_ms(max, m, sizeof m);
  else if (is_rate) fmt_rate(max, m, sizeof m);
  else fmt_short(max, m, sizeof m);
  fprintf(f, "  %smax %s%s\n", use_color ? DIM : "", m, use_color ? RESET : "");
}

/* A step list: the slowest, or the most failing. */
static void step_list(FILE *f, const cJSON *list, int slow, int color) {
  if (!cJSON_GetArraySize(list)) {
    fprintf(f, "  %s\n", slow ? "(no step with a duration)" : "(no step failed or retried)");
    return;
  }
  if (slow)
    fprintf(f, "%s  %-28s %8s %8s %8s %8s %9s%s\n", color ? DIM : "", "STEP", "P50", "P95", "P99",
            "MAX", "SAMPLED", color ? RESET : "");
  else
    fprintf(f, "%s  %-28s %8s %8s%s\n", color ? DIM : "", "STEP", "FAILED", "RETRIES",
            color ? RESET : "");
  const cJSON *s;
  cJSON_ArrayForEach(s, list) {
    char a[16], b[16], c[16], d[16], n[32];
    if (slow) {
      fmt_count(num(s, "n"), n, sizeof n);
      fmt_ms(num(s, "p50"), a, sizeof a);
      fmt_ms(num(s, "p95"), b, sizeof b);
      fmt_ms(num(s, "p99"), c, sizeof c);
      fmt_ms(num(s, "max"), d, sizeof d);
      fprintf(f, "  %-28.28s %8s %8s %8s %8s %9s\n", str(s, "step"), a, b, c, d, n);
    } else {
      fmt_count(num(s, "failed"), a, sizeof a);
      fmt_count(num(s, "retries"), b, sizeof b);
      int bad = color && num(s, "failed") > 0;
      fprintf(f, "  %-28.28s %s%8s%s %8s\n", str(s, "step"), bad ? RED : "", a, bad ? RESET : "", b);
    }
  }
}

/* moonloop stats SKILL: totals, a sparkline per figure, steps, versions. */
static void print_skill(FILE *f, const cJSON *st, int color) {
  const cJSON *t = get(st, "totals"), *p = get(st, "previous"), *series = get(st, "series");
  const cJSON *d = get(t, "duration_ms"), *w = get(t, "queue_wait_ms"), *sd = get(t, "step_duration_ms");
  window_line(f, st, str(st, "skill"), color);
  const char *live = str(st, "version");
  if (*live) fprintf(f, "live version %.12s\n", live);
  fputc('\n', f);
  char a[32], b[32], c[32], d1[32], e1[32], g[32];
  fmt_count(num(t, "started"), a, sizeof a);
  fmt_count(num(t, "completed"), b, sizeof b);
  fmt_count(num(t, "failed"), c, sizeof c);
  fmt_count(num(t, "cancelled"), d1, sizeof d1);
  fmt_count(num(t, "active"), e1, sizeof e1);
  fmt_rate(num(t, "failure_rate"), g, sizeof g);
  char was[32];
  fmt_rate(num(p, "failure_rate"), was, sizeof was);
  /* Runs that flow control turned away, when there are any. */
  char sk[48] = "";
  if (num(t, "skipped") > 0) {
    char n[32];
    fmt_count(num(t, "skipped"), n, sizeof n);
    snprintf(sk, sizeof sk, ", %s skipped", n);
  }
  fprintf(f, "  %-12s %s started, %s completed, %s%s failed%s, %s cancelled%s, %s active\n", "runs", a,
          b, color && num(t, "failed") > 0 ? RED : "", c, color ? RESET : "", d1, sk, e1);
  fprintf(f, "  %-12s %s (window before: %s)\n", "failure rate", g, was);
  fmt_ms(num(d, "p50"), a, sizeof a);
  fmt_ms(num(d, "p95"), b, sizeof b);
  fmt_ms(num(d, "p99"), c, sizeof c);
  fmt_ms(num(get(p, "duration_ms"), "p95"), was, sizeof was);
  fprintf(f, "  %-12s p50 %s  p95 %s  p99 %s (window before: p95 %s)\n", "duration", a, b, c, was);
  fmt_ms(num(w, "p50"), a, sizeof a);
  fmt_ms(num(w, "p95"), b, sizeof b);
  fmt_ms(num(w, "p99"), c, sizeof c);
  fprintf(f, "  %-12s p50 %s  p95 %s  p99 %s\n", "queue wait", a, b, c);
  fmt_count(num(t, "steps"), a, sizeof a);
  fmt_count(num(t, "retries"), b, sizeof b);
  fmt_count(num(t, "failed_steps"), c, sizeof c);
  fmt_ms(num(sd, "p50"), d1, sizeof d1);
  fmt_ms(num(sd, "p95"), e1, sizeof e1);
  fmt_ms(num(sd, "p99"), g, sizeof g);
  fprintf(f, "  %-12s %s steps, %s retries, %s failed; p50 %s  p95 %s  p99 %s\n", "steps", a, b, c,
          d1, e1, g);
  fmt_count(num(t, "tokens"), a, sizeof a);
  fprintf(f, "  %-12s %s\n", "llm tokens", a);
  const cJSON *sm = get(st, "step_sample");
  if (num(sm, "runs") < num(sm, "of") || num(sm, "failing_runs") < num(sm, "of_failing")) {
    fmt_count(num(sm, "runs"), a, sizeof a);
    fmt_count(num(sm, "of"), b, sizeof b);
    fprintf(f, "  %s(step durations from the steps of %s of the %s ended runs)%s\n", color ? DIM : "",
            a, b, color ? RESET : "");
  }
  fputc('\n', f);

  spark_row(f, "started", series, "started", GREEN, color, 0, 0);
  spark_row(f, "failed", series, "failed", RED, color, 0, 0);
  spark_row(f, "failure rate", series, "failure_rate", RED, color, 0, 1);
  spark_row(f, "p50", series, "p50", CYAN, color, 1, 0);
  spark_row(f, "p95", series, "p95", CYAN, color, 1, 0);
  spark_row(f, "p99", series, "p99", CYAN, color, 1, 0);
  spark_row(f, "queue p95", series, "queue_wait_p95", "", color, 1, 0);
  spark_row(f, "retries", series, "retries", "", color, 0, 0);
  spark_row(f, "tokens", series, "tokens", "", color, 0, 0);
  fprintf(f, "  %-12s ", "deploys");
  deploy_row(f, series, get(st, "versions"), time_at(st, "since"), (int64_t)num(st, "interval_ms"));
  fputs("\n\n", f);

  fprintf(f, "%sslowest steps%s\n", color ? BOLD : "", color ? RESET : "");
  step_list(f, get(st, "slowest_steps"), 1, color);
  fprintf(f, "\n%smost failing steps%s\n", color ? BOLD : "", color ? RESET : "");
  step_list(f, get(st, "failing_steps"), 0, color);
  fprintf(f, "\n%sversions loaded in the window%s\n", color ? BOLD : "", color ? RESET : "");
  const cJSON *vs = get(st, "versions"), *v;
  if (!cJSON_GetArraySize(vs)) {
    const cJSON *before = get(st, "version_before");
    if (cJSON_IsObject(before)) {
      fmt_local(time_at(before, "loaded_at"), a, sizeof a);
      fprintf(f, "  none (the one before it: %.12s, loaded %s)\n", str(before, "version"), a);
    } else {
      fprintf(f, "  none\n");
    }
  }
  cJSON_ArrayForEach(v, vs) {
    fmt_local(time_at(v, "loaded_at"), a, sizeof a);
    fprintf(f, "  %s  %.12s%s\n", a, str(v, "version"), !strcmp(str(v, "version"), live) ? "  (live)" : "");
  }
}

/* ---- the command ------------------------------------------------------------------------ */

/* A time option: a duration back from now ("7d") or an RFC 3339 time. */
static int parse_when(const char *opt, const char *v, int64_t now, int64_t *out) {
  int64_t ms;
  err_t e;
  if (!units_duration(v, &ms, &e)) *out = now - ms;
  else if (!units_parse_rfc3339(v, &ms, &e)) *out = ms;
  else
    return cli_fail(EXIT_USAGE, "--%s: expected a duration such as 7d or an RFC 3339 time, got '%s'",
                    opt, v);
  return 0;
}

/* The figures through the HTTP API (--server), or NULL after printing why. */
static cJSON *remote_stats(struct cli *c, int *exit_status) {
  CURL *h = curl_easy_init();
  if (!h) {
    *exit_status = cli_fail(EXIT_FAILED, "cannot start an HTTP request (libcurl)");
    return NULL;
  }
  char path[1024];
  if (c->nargs) {
    char *esc = curl_easy_escape(h, c->args[0], 0);
    snprintf(path, sizeof path, "/v1/skills/%s/stats", esc ? esc : "");
    curl_free(esc);
  } else {
    snprintf(path, sizeof path, "/v1/stats");
  }
  const char *keys[3] = {"since", "until", "interval"};
  const char *vals[3] = {c->since ? c->since : "7d", c->until, c->interval};
  for (int i = 0; i < 3; i++) {
    if (!vals[i]) continue;
    char *esc = curl_easy_escape(h, vals[i], 0);
    size_t used = strlen(path);
    snprintf(path + used, sizeof path - used, "%s%s=%s", strchr(path, '?') ? "&" : "?", keys[i],
             esc ? esc : "");
    curl_free(esc);
  }
  curl_easy_cleanup(h);
  long status;
  cJSON *ans = NULL;
  err_t e;
  if (remote_call(&c->cfg, "GET", path, NULL, &status, &ans, &e)) {
    cJSON_Delete(ans);
    *exit_status = cli_fail(e.code == ERR_INVALID ? EXIT_USAGE : EXIT_FAILED, "%s", e.msg);
    return NULL;
  }
  return ans;
}

/* moonloop stats [SKILL]: see the top of this file. */
int cli_stats(struct cli *c) {
  int64_t now = units_now_ms();
  struct stats_query q = {.skill = c->nargs ? c->args[0] : NULL, .until = now};
  if (parse_when("since", c->since ? c->since : "7d", now, &q.since)) return EXIT_USAGE;
  if (c->until && parse_when("until", c->until, now, &q.until)) return EXIT_USAGE;
  err_t e;
  if (c->interval && (units_duration(c->interval, &q.interval, &e) || q.interval <= 0))
    return cli_fail(EXIT_USAGE, "--interval: expected a duration such as 1h, got '%s'", c->interval);
  cJSON *st = NULL;
  if (c->cfg.server) {
    int rc = EXIT_OK;
    if (!(st = remote_stats(c, &rc))) return rc;
  } else {
    struct engine en;
    int orc = cli_open_history(c, &en);
    if (orc == CLI_NO_DB) return cli_fail(EXIT_FAILED, "no figures: there is no database at '%s'", c->cfg.db);
    if (orc) return orc;
    int rc = q.skill ? store_stats_skill(en.store, &q, &st, &e) : store_stats_overview(en.store, &q, &st, &e);
    engine_close(&en);
    if (rc) return cli_fail(rc == ERR_INVALID ? EXIT_USAGE : EXIT_FAILED, "%s", e.msg);
  }
  if (c->json) {
    jsontext_fix_utf8(st); /* step ids are a skill's strings: any bytes */
    char *s = jsontext_print_text(st);
    printf("%s\n", s ? s : "null");
    free(s);
  } else if (q.skill) {
    print_skill(stdout, st, c->color);
  } else {
    print_overview(stdout, st, c->color);
  }
  cJSON_Delete(st);
  return EXIT_OK;
}
