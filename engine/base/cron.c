/*
** cron.c: parsing cron expressions and computing their next fire times (see
** cron.h for the syntax and the daylight saving time policy users see).
**
** REPRESENTATION
**
** A parsed expression is one bit set per field: bit v is set when value v
** matches (seconds and minutes in a uint64_t, bits 0-59; hours bits 0-23;
** days of month bits 1-31; months bits 1-12; days of week bits 0-6, a 7 in
** the expression sets bit 0). Five-field expressions match second 0 only.
** Two flags from the text decide the day rule (dom_star, dow_star: the field
** starts with '*') and one the DST policy (fixed: the hour field does not
** start with '*'). A cron_t never changes after cron_parse(), so threads
** share it freely; the tz_t it points to is cached by tz.c and immutable.
**
** FINDING THE NEXT FIRE TIME
**
** Fields are matched on the zone's wall clock ("local" seconds, tz.h). The
** zone's history is a series of periods of constant UTC offset; within one,
** local time is UTC plus a constant, so the first matching instant of the
** period is found by searching wall-clock times, jumping from a failed field
** to the next value its bit set allows (next month, next day, next hour...)
** rather than stepping minute by minute. We walk the periods from the
** starting instant until a match or 5 years.
**
** Between two periods the clock jumps. For interval jobs nothing special
** happens: a skipped wall clock time (gap) is never seen, a repeated one
** (fold) is seen twice, and both are what we want. For fixed-time jobs:
**   gap:  if the job matches a wall clock time inside the gap, it fires at
**         the transition instant, the first one after the gap;
**   fold: in the later period, wall clock times up to the end of the earlier
**         period have already occurred, so the search starts after them
**         (floor_local); this also holds when the start instant is already
**         inside the repeated stretch.
** Since the gap's fire time is the transition instant and the search after
** it starts at the same instant, a job that also matches the first wall
** clock time after the gap yields that instant once, not twice.
**
** "Never fires" is decided when parsing: with the day fields combined by
** AND, some day of the day-of-month set must exist in some month of the
** month set (Feb 29 counts); with OR, every month has every weekday. The
** weekday of a given month and day takes every value over the years, so
** whatever passes this check fires some day; cron_next() stops at 5 years
** all the same (its contract), which also bounds its work.
*/
#include "base/cron.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/mem.h"
#include "base/tz.h"

#define CRON_MAX_EXPR 1024
/* 5 years never hold more than 2 leap days. */
#define CRON_HORIZON_S (INT64_C(1827) * 86400)
/* cron_next() answers for instants in years 1 to 9999. */
#define CRON_MIN_MS INT64_C(-62135596800000)
#define CRON_MAX_MS INT64_C(253402300799999)
#define NONE INT64_MAX

struct cron {
  uint64_t sec, min;
  uint32_t hour, dom;
  uint16_t month;
  uint8_t dow;
  uint8_t dom_star, dow_star; /* the field started with '*' */
  uint8_t fixed;              /* the hour field did not start with '*' */
  uint8_t has_seconds;
  const tz_t *tz;
};

enum { F_SEC, F_MIN, F_HOUR, F_DOM, F_MON, F_DOW };

typedef struct field_def {
  const char *name;
  int lo, hi;        /* values accepted in the text */
  int nvalues;       /* distinct values: the largest useful step */
  const char *const *names;
  int name_base;     /* value of names[0] */
  const char *names_hint;
} field_def_t;

static const char *const MONTH_NAMES[] = {"JAN", "FEB", "MAR", "APR", "MAY", "JUN",
                                          "JUL", "AUG", "SEP", "OCT", "NOV", "DEC", NULL};
static const char *const DAY_NAMES[] = {"SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT", NULL};

static const field_def_t FIELDS[6] = {
    {"second", 0, 59, 60, NULL, 0, NULL},
    {"minute", 0, 59, 60, NULL, 0, NULL},
    {"hour", 0, 23, 24, NULL, 0, NULL},
    {"day-of-month", 1, 31, 31, NULL, 0, NULL},
    {"month", 1, 12, 12, MONTH_NAMES, 1, "JAN-DEC"},
    {"day-of-week", 0, 7, 7, DAY_NAMES, 0, "SUN-SAT"},
};

static const struct {
  const char *name, *expr;
} MACROS[] = {
    {"@yearly", "0 0 1 1 *"}, {"@annually", "0 0 1 1 *"}, {"@monthly", "0 0 1 * *"},
    {"@weekly", "0 0 * * 0"}, {"@daily", "0 0 * * *"},    {"@midnight", "0 0 * * *"},
    {"@hourly", "0 * * * *"},
};

/* Parsing state: the original expression, for messages. */
typedef struct pctx {
  const char *expr;
  err_t *e;
} pctx_t;

/* Set an ERR_INVALID "bad cron expression '<expr>': <problem>" error. */
__attribute__((format(printf, 2, 3))) static int bad(const pctx_t *x, const char *fmt, ...) {
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return err_set(x->e, ERR_INVALID, "bad cron expression '%.300s': %s", x->expr, msg);
}

/* ASCII classes, independent of the locale. */
static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }
static int is_alpha(char ch) { return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z'); }

/* Parse one value (a number or, where the field allows, a name) at *p,
** before end. Advances *p. */
static int parse_value(const pctx_t *x, const field_def_t *f, const char **p, const char *end,
                       int *v) {
  const char *s = *p;
  if (s < end && is_digit(*s)) {
    long n = 0;
    while (s < end && is_digit(*s)) {
      if (n < 100000) n = n * 10 + (*s - '0');
      s++;
    }
    if (n < f->lo || n > f->hi)
      return bad(x, "value %.*s out of range %d-%d in the %s field", (int)(s - *p), *p, f->lo,
                 f->hi, f->name);
    *p = s;
    *v = (int)n;
    return 0;
  }
  if (s < end && is_alpha(*s)) {
    while (s < end && is_alpha(*s)) s++;
    int len = (int)(s - *p);
    if (!f->names)
      return bad(x, "'%.*s' is not a number in the %s field", len, *p, f->name);
    for (int i = 0; f->names[i]; i++) {
      if (len == 3 && !strncasecmp(*p, f->names[i], 3)) {
        *v = f->name_base + i;
        *p = s;
        return 0;
      }
    }
    return bad(x, "unknown name '%.*s' in the %s field (use %s)", len, *p, f->name, f->names_hint);
  }
  if (s >= end) return bad(x, "missing value in the %s field", f->name);
  return bad(x, "unexpected '%c' in the %s field", *s, f->name);
}

/* Parse one field's text [s, end) into *bits. */
static int parse_field(const pctx_t *x, int fi, const char *s, const char *end, uint64_t *bits) {
  const field_def_t *f = &FIELDS[fi];
  /* Day-of-week 7 is Sunday; '*' and open ranges stop at 6. */
  int top = fi == F_DOW ? 6 : f->hi;
  *bits = 0;
  const char *p = s;
  for (;;) {
    const char *item = p;
    int a, b, step = 1, rc;
    if (p < end && *p == ',') return bad(x, "empty list item in the %s field", f->name);
    if (p < end && *p == '*') {
      p++;
      a = f->lo, b = top;
    } else {
      if ((rc = parse_value(x, f, &p, end, &a))) return rc;
      b = a;
      int single = 1;
      if (p < end && *p == '-') {
        single = 0;
        p++;
        if ((rc = parse_value(x, f, &p, end, &b))) return rc;
        if (fi == F_DOW && b == 0 && a > 0) b = 7; /* FRI-SUN */
        if (a > b)
          return bad(x, "range %.*s is backwards in the %s field", (int)(p - item), item, f->name);
      }
      /* a/n runs to the end of the field. */
      if (p < end && *p == '/' && single) b = fi == F_DOW && a == 7 ? 7 : top;
    }
    if (p < end && *p == '/') {
      p++;
      if (p >= end || !is_digit(*p))
        return bad(x, "missing step after '/' in the %s field", f->name);
      long n = 0;
      while (p < end && is_digit(*p)) {
        if (n < 100000) n = n * 10 + (*p - '0');
        p++;
      }
      if (n < 1) return bad(x, "step must be at least 1 in the %s field", f->name);
      if (n > f->nvalues)
        return bad(x, "step %ld out of range 1-%d in the %s field", n, f->nvalues, f->name);
      step = (int)n;
    }
    for (int v = a; v <= b; v += step) *bits |= UINT64_C(1) << (fi == F_DOW && v == 7 ? 0 : v);
    if (p == end) break;
    if (*p != ',') return bad(x, "unexpected '%c' in the %s field", *p, f->name);
    p++;
    if (p == end) return bad(x, "empty list item in the %s field", f->name);
  }
  return 0;
}

/* Does some day of the day-of-month set exist in some month of the set? */
static int days_exist(uint32_t dom, uint16_t month) {
  static const int maxd[13] = {0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  for (int m = 1; m <= 12; m++)
    if ((month >> m & 1) && (dom & ((UINT32_C(2) << maxd[m]) - 2))) return 1;
  return 0;
}

/* Field separators. */
static int is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }

/* Parse the fields of text (5 or 6 separated by blanks) into c. x->expr is
** the expression the user wrote (text differs for macros). */
static int parse_fields(const pctx_t *x, const char *text, cron_t *c) {
  const char *start[7], *stop[7];
  int n = 0;
  for (const char *p = text; *p;) {
    while (is_space(*p)) p++;
    if (!*p) break;
    const char *s = p;
    while (*p && !is_space(*p)) p++;
    if (n < 7) start[n] = s, stop[n] = p;
    n++;
  }
  if (n != 5 && n != 6) return bad(x, "expected 5 or 6 fields, got %d", n);
  c->has_seconds = n == 6;
  int base = n == 6 ? 0 : 1; /* field index of the first text field */
  uint64_t bits[6] = {1, 0, 0, 0, 0, 0}; /* no seconds field: second 0 */
  for (int i = 0; i < n; i++) {
    int rc = parse_field(x, base + i, start[i], stop[i], &bits[base + i]);
    if (rc) return rc;
  }
  c->sec = bits[F_SEC];
  c->min = bits[F_MIN];
  c->hour = (uint32_t)bits[F_HOUR];
  c->dom = (uint32_t)bits[F_DOM];
  c->month = (uint16_t)bits[F_MON];
  c->dow = (uint8_t)bits[F_DOW];
  c->fixed = *start[F_HOUR - base] != '*';
  c->dom_star = *start[F_DOM - base] == '*';
  c->dow_star = *start[F_DOW - base] == '*';
  if ((c->dom_star || c->dow_star) && !days_exist(c->dom, c->month))
    return bad(x, "never fires: no day in the day-of-month field (%.*s) exists in the months of "
                  "the month field (%.*s)",
               (int)(stop[F_DOM - base] - start[F_DOM - base]), start[F_DOM - base],
               (int)(stop[F_MON - base] - start[F_MON - base]), start[F_MON - base]);
  return 0;
}

/* See cron.h. Macros are expanded to their five fields; the zone is loaded
** last, so a bad expression is reported before a bad zone. */
int cron_parse(const char *expr, const char *tz, cron_t **out, err_t *e) {
  if (!out) return err_set(e, ERR_INVALID, "cron_parse: no output pointer");
  *out = NULL;
  if (!expr) return err_set(e, ERR_INVALID, "empty cron expression");
  pctx_t x = {expr, e};
  size_t len = strlen(expr);
  if (len > CRON_MAX_EXPR)
    return bad(&x, "too long (%zu characters, at most %d)", len, CRON_MAX_EXPR);
  const char *p = expr;
  while (is_space(*p)) p++;
  if (!*p) return err_set(e, ERR_INVALID, "empty cron expression");
  cron_t tmp = {0};
  int rc;
  if (*p == '@') {
    /* A macro is the whole expression, surrounding blanks aside. */
    size_t n = len - (size_t)(p - expr);
    while (n && is_space(p[n - 1])) n--;
    const char *text = NULL;
    for (size_t i = 0; i < sizeof MACROS / sizeof MACROS[0]; i++)
      if (strlen(MACROS[i].name) == n && !strncasecmp(p, MACROS[i].name, n)) text = MACROS[i].expr;
    if (!text)
      return bad(&x, "unknown macro (use @yearly, @annually, @monthly, @weekly, @daily, "
                     "@midnight or @hourly)");
    rc = parse_fields(&x, text, &tmp);
  } else {
    rc = parse_fields(&x, p, &tmp);
  }
  if (rc) return rc;
  tz_t *z;
  if ((rc = tz_load(tz, &z, e))) return rc;
  tmp.tz = z;
  cron_t *c = mem_alloc(sizeof *c);
  *c = tmp;
  *out = c;
  return 0;
}

/* See cron.h. */
int cron_has_seconds(const cron_t *c) { return c ? c->has_seconds : 0; }

/* See cron.h. */
int cron_is_fixed_time(const cron_t *c) { return c ? c->fixed : 0; }

/* See cron.h. */
void cron_free(cron_t *c) { free(c); }

/* ---- next fire time ---------------------------------------------------- */

/* a / b rounded toward minus infinity (b > 0). */
static int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/* The lowest set bit of mask at or above from, or -1. */
static int next_bit(uint64_t mask, int from) {
  if (from > 63) return -1;
  uint64_t m = mask & (~UINT64_C(0) << from);
  return m ? __builtin_ctzll(m) : -1;
}

/* Does day d of the month, weekday wd, match? (OR or AND rule: cron.h.) */
static int day_matches(const cron_t *c, int d, int wd) {
  int dom_ok = c->dom >> d & 1, dow_ok = c->dow >> wd & 1;
  return (c->dom_star || c->dow_star) ? (dom_ok && dow_ok) : (dom_ok || dow_ok);
}

/* The first wall clock time in [lo, hi) (local seconds) that c matches, or
** NONE. Each failed field jumps to the next value it allows, so the cost is
** bounded by the days in the range, not its seconds. */
static int64_t match_from(const cron_t *c, int64_t lo, int64_t hi) {
  if (lo >= hi) return NONE;
  int64_t days = floor_div(lo, 86400), y;
  int sod = (int)(lo - days * 86400);
  int h = sod / 3600, mi = sod / 60 % 60, s = sod % 60, mo, d;
  tz_civil_from_days(days, &y, &mo, &d);
  int mdays = tz_days_in_month(y, mo);
  for (;;) {
    if (days * 86400 >= hi) return NONE;
    if (!(c->month >> mo & 1)) {
      int nm = next_bit(c->month, mo + 1);
      if (nm < 0) {
        y++;
        nm = next_bit(c->month, 1);
      }
      mo = nm;
      d = 1;
      days = tz_days_from_civil(y, mo, 1);
      mdays = tz_days_in_month(y, mo);
      h = mi = s = 0;
      continue;
    }
    if (day_matches(c, d, tz_weekday(days))) {
      int nh = next_bit(c->hour, h);
      if (nh >= 0) {
        if (nh != h) h = nh, mi = s = 0;
        int nmi = next_bit(c->min, mi);
        if (nmi < 0) {
          /* No minute left in this hour: try the next hour. */
          mi = s = 0;
          if (++h <= 23) continue;
        } else {
          if (nmi != mi) mi = nmi, s = 0;
          int ns = next_bit(c->sec, s);
          if (ns >= 0) {
            int64_t L = days * 86400 + h * 3600 + mi * 60 + ns;
            return L < hi ? L : NONE;
          }
          /* No second left in this minute: try the next minute. */
          s = 0;
          if (++mi <= 59) continue;
          mi = 0;
          if (++h <= 23) continue;
        }
      }
    }
    /* Next day; when only the day of month matters, straight to the next
    ** one it allows (or the 1st of the next month). */
    int skip = 1;
    if (c->dow == 0x7f && (c->dom_star || c->dow_star)) {
      int nd = next_bit(c->dom, d + 1);
      skip = nd > 0 && nd <= mdays ? nd - d : mdays - d + 1;
    }
    days += skip;
    h = mi = s = 0;
    if ((d += skip) > mdays) {
      d = 1;
      if (++mo > 12) mo = 1, y++;
      mdays = tz_days_in_month(y, mo);
    }
  }
}

/* A fixed-time job passing from period a into period b (at b->start): in a
** gap, return 1 if the job is due at a skipped wall clock time (it then
** fires at b->start); in a fold, raise *floor_local to the first wall clock
** time that did not already occur in a. (The floor only ever rises: wall
** clock times below it have occurred, whatever periods follow.) */
static int boundary(const cron_t *c, const tz_period_t *a, const tz_period_t *b,
                    int64_t *floor_local) {
  int64_t at = b->start;
  if (b->utoff > a->utoff) return match_from(c, at + a->utoff, at + b->utoff) != NONE;
  if (b->utoff < a->utoff && *floor_local < at + a->utoff) *floor_local = at + a->utoff;
  return 0;
}

/* See cron.h. Walks the zone's periods from the first second after after_ms
** (see the top of this file), for at most CRON_HORIZON_S seconds. */
int64_t cron_next(const cron_t *c, int64_t after_ms) {
  if (!c || after_ms < CRON_MIN_MS || after_ms > CRON_MAX_MS) return -1;
  int64_t t = floor_div(after_ms, 1000) + 1; /* first candidate second */
  int64_t limit = t + CRON_HORIZON_S;
  tz_period_t p, prev;
  tz_period(c->tz, t, &p);
  int64_t floor_local = INT64_MIN;
  if (c->fixed && p.start != INT64_MIN) {
    /* We may start right at a transition (a gap run is due now) or inside
    ** the repeated stretch after one (earlier occurrences already ran). */
    tz_period(c->tz, p.start - 1, &prev);
    if (boundary(c, &prev, &p, &floor_local) && p.start >= t) return p.start * 1000;
  }
  for (;;) {
    int64_t end = p.end < limit ? p.end : limit;
    int64_t lo = t + p.utoff;
    if (lo < floor_local) lo = floor_local;
    int64_t L = match_from(c, lo, end + p.utoff);
    if (L != NONE) return (L - p.utoff) * 1000;
    if (p.end >= limit) return -1;
    prev = p;
    t = p.end;
    tz_period(c->tz, t, &p);
    if (c->fixed && boundary(c, &prev, &p, &floor_local)) return t * 1000;
  }
}
