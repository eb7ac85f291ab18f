/*
** tz.c: time zones from TZif files, read and evaluated by our own code (see
** tz.h). The C library's localtime() works on one process-wide zone set
** through the TZ environment variable, which cannot serve several zones at
** once from several threads; this unit can.
**
** THE TZIF FORMAT (RFC 8536, as written by zic)
**
** A file is a version 1 part followed, for versions 2 and later, by a second
** part and a footer:
**
**   header   "TZif", version (NUL, '2', '3' or '4'), 15 unused bytes, then six
**            32-bit big-endian counts: isutcnt isstdcnt leapcnt timecnt
**            typecnt charcnt
**   data     timecnt transition times   (4 bytes in part 1, 8 in part 2,
**                                        signed, strictly ascending)
**            timecnt type indexes       (1 byte each, < typecnt)
**            typecnt local time types   (6 bytes: int32 utoff seconds east
**                                        of UTC, uint8 isdst, uint8 index of
**                                        the abbreviation in the chars)
**            charcnt abbreviation chars (NUL-terminated strings)
**            leapcnt leap second records (4+4 bytes in part 1, 8+4 in part 2)
**            isstdcnt, isutcnt indicators (1 byte each; only matter to
**                                        POSIX-rule emulation, ignored here)
**   footer   "\n" POSIX TZ string "\n"  (versions 2+; may be empty)
**
** Version 1 readers stop after part 1, which only covers 1901-2038. We skip
** it and read part 2 (64-bit times) when the version is 2 or later.
**
** Semantics: the type of transition i applies from times[i] until the next
** transition. Before the first transition, type 0 applies. After the last
** one the footer's TZ string applies (and to all instants if there are no
** transitions at all); with an empty footer the last type goes on forever.
** "Fat" files list transitions to 2037; "slim" ones stop when the footer can
** take over. Either way instants in 2040 and later come from the footer.
**
** The footer is a POSIX TZ string with the version 3 extensions (hours of a
** rule time from -167 to 167):
**
**   std offset [dst [offset] [,start[/time],end[/time]]]
**
** std and dst are abbreviations, alphabetic ("CET") or quoted ("<+0530>");
** offset is [+-]hh[:mm[:ss]] WEST of UTC ("CET-1" is UTC+1); dst's offset
** defaults to one hour less than std's. A date is "Jn" (1-365, Feb 29 never
** counted), "n" (0-365, Feb 29 counted) or "Mm.w.d" (day d, 0 = Sunday, of
** week w, 1-5 with 5 = last, of month m); time defaults to 02:00:00 and is
** local time as in effect just before the change (standard time for start,
** daylight time for end). Example: "CET-1CEST,M3.5.0,M10.5.0/3". Southern
** zones have start after end in the year; "EST5EDT,0/0,J365/25" is DST all
** year. Without rules we default to the US rules M3.2.0,M11.1.0, like
** tzcode.
**
** Files with leap second records (the right/ zones) count TAI-like seconds
** and are refused: the engine's clock is POSIX time.
**
** INVARIANTS: a loaded tz_t is immutable, so it is shared by all threads
** without locking. Transition times are strictly ascending, type indexes are
** in range, there is at least one type, offsets are within
** [-89999, 93599] seconds (RFC 8536's bound, about +-26h). Loaded zones live
** in a linked list guarded by cache_mu until tz_free_all(). "UTC" (and NULL
** or "") is a built-in zone that needs no file and is never freed.
*/
#include "base/tz.h"
#include "base/mem.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TZ_DEFAULT_DIR "/usr/share/zoneinfo"
#define TZ_MAX_FILE (1 << 20) /* real files are under 4 KB */
#define TZ_MAX_NAME 255
#define TZ_MIN_UTOFF (-89999)
#define TZ_MAX_UTOFF 93599
/* Beyond about a million years the calendar arithmetic is still exact but
** nobody cares; clamping keeps every product far from int64 overflow. */
#define TZ_CLAMP (INT64_C(1) << 45)
/* Any instant showing a given wall clock lies within this of it. */
#define TZ_WINDOW (27 * 3600)

/* One date of a POSIX rule: kind 'J' (n 1-365), 'N' (n 0-365) or 'M'. */
typedef struct rule_date {
  char kind;
  int n, m, w, d;
  int32_t time; /* seconds after local midnight, -167h..167h */
} rule_date_t;

typedef struct posix_tz {
  int32_t std_off, dst_off; /* seconds east of UTC */
  int has_dst;
  rule_date_t start, end;
} posix_tz_t;

struct tz {
  struct tz *next; /* cache chain, guarded by cache_mu */
  char *name;
  int64_t *times;  /* ntimes transition instants, ascending */
  uint8_t *idx;    /* type index of each transition */
  uint32_t ntimes;
  int32_t *utoff;  /* ntypes offsets */
  uint8_t *isdst;  /* ntypes flags */
  uint32_t ntypes;
  int has_footer;  /* footer present and not empty */
  posix_tz_t footer;
};

static int32_t utc_utoff[1] = {0};
static uint8_t utc_isdst[1] = {0};
/* The built-in UTC zone; never written after compile time. */
static tz_t tz_utc = {NULL, "UTC", NULL, NULL, 0, utc_utoff, utc_isdst, 1, 0,
                     {0, 0, 0, {0}, {0}}};

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static tz_t *cache; /* guarded by cache_mu */

/* ---- calendar ---------------------------------------------------------- */

/* a / b rounded toward minus infinity (b > 0). */
static int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/* See tz.h. Howard Hinnant's days_from_civil: exact for the proleptic Gregorian calendar. */
int64_t tz_days_from_civil(int64_t y, int m, int d) {
  y -= m <= 2;
  int64_t era = (y >= 0 ? y : y - 399) / 400;
  int64_t yoe = y - era * 400;
  int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

/* See tz.h; the inverse of the above (Hinnant's civil_from_days). */
void tz_civil_from_days(int64_t days, int64_t *y, int *m, int *d) {
  days += 719468;
  int64_t era = (days >= 0 ? days : days - 146096) / 146097;
  int64_t doe = days - era * 146097;
  int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  int64_t mp = (5 * doy + 2) / 153;
  *d = (int)(doy - (153 * mp + 2) / 5 + 1);
  *m = (int)(mp < 10 ? mp + 3 : mp - 9);
  *y = yoe + era * 400 + (*m <= 2);
}

/* See tz.h. */
int tz_weekday(int64_t days) {
  /* 1970-01-01 was a Thursday. */
  int64_t w = (days + 4) % 7;
  return (int)(w < 0 ? w + 7 : w);
}

/* Gregorian leap year? */
static int is_leap(int64_t y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

/* See tz.h. */
int tz_days_in_month(int64_t y, int m) {
  static const int mdays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return m == 2 && is_leap(y) ? 29 : mdays[m - 1];
}

/* ---- POSIX TZ strings -------------------------------------------------- */

typedef struct cur {
  const char *p, *end;
} cur_t;

/* Is the next character ch? */
static int at(const cur_t *c, char ch) { return c->p < c->end && *c->p == ch; }

/* An abbreviation: 3+ letters, or <...> of letters, digits, '+' and '-'. */
static int p_abbr(cur_t *c) {
  const char *s = c->p;
  if (at(c, '<')) {
    c->p++;
    s = c->p;
    while (c->p < c->end && *c->p != '>') {
      char ch = *c->p;
      if (!((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
            ch == '+' || ch == '-'))
        return -1;
      c->p++;
    }
    if (c->p == s || !at(c, '>')) return -1;
    c->p++;
    return 0;
  }
  while (c->p < c->end && ((*c->p >= 'A' && *c->p <= 'Z') || (*c->p >= 'a' && *c->p <= 'z')))
    c->p++;
  return c->p - s >= 3 ? 0 : -1;
}

/* An unsigned decimal number of at most max. */
static int p_num(cur_t *c, int max, int *v) {
  if (c->p >= c->end || *c->p < '0' || *c->p > '9') return -1;
  int n = 0;
  while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
    n = n * 10 + (*c->p++ - '0');
    if (n > max) return -1;
  }
  *v = n;
  return 0;
}

/* [+-]hh[:mm[:ss]] with hh <= maxh, as signed seconds. */
static int p_hms(cur_t *c, int maxh, int32_t *secs) {
  int sign = 1, h, m = 0, s = 0;
  if (at(c, '+')) c->p++;
  else if (at(c, '-')) sign = -1, c->p++;
  if (p_num(c, maxh, &h)) return -1;
  if (at(c, ':')) {
    c->p++;
    if (p_num(c, 59, &m)) return -1;
    if (at(c, ':')) {
      c->p++;
      if (p_num(c, 59, &s)) return -1;
    }
  }
  *secs = sign * (h * 3600 + m * 60 + s);
  return 0;
}

/* A rule date "Jn", "n" or "Mm.w.d", with an optional "/time". */
static int p_date(cur_t *c, rule_date_t *r) {
  r->time = 7200;
  if (at(c, 'J')) {
    c->p++;
    r->kind = 'J';
    if (p_num(c, 365, &r->n) || r->n < 1) return -1;
  } else if (at(c, 'M')) {
    c->p++;
    r->kind = 'M';
    if (p_num(c, 12, &r->m) || r->m < 1 || !at(c, '.')) return -1;
    c->p++;
    if (p_num(c, 5, &r->w) || r->w < 1 || !at(c, '.')) return -1;
    c->p++;
    if (p_num(c, 6, &r->d)) return -1;
  } else {
    r->kind = 'N';
    if (p_num(c, 365, &r->n)) return -1;
  }
  if (at(c, '/')) {
    c->p++;
    if (p_hms(c, 167, &r->time)) return -1;
  }
  return 0;
}

/* Parse a whole POSIX TZ string (s, n bytes) into f; 0 or -1. */
static int parse_posix(const char *s, size_t n, posix_tz_t *f) {
  cur_t c = {s, s + n};
  int32_t off;
  memset(f, 0, sizeof *f);
  if (p_abbr(&c) || p_hms(&c, 24, &off)) return -1;
  f->std_off = -off; /* POSIX offsets count west */
  if (c.p == c.end) return 0;
  if (p_abbr(&c)) return -1;
  f->has_dst = 1;
  f->dst_off = f->std_off + 3600;
  if (c.p < c.end && *c.p != ',') {
    if (p_hms(&c, 24, &off)) return -1;
    f->dst_off = -off;
  }
  if (c.p == c.end) {
    /* No rules: tzcode's default, the US rules. */
    f->start = (rule_date_t){'M', 0, 3, 2, 0, 7200};
    f->end = (rule_date_t){'M', 0, 11, 1, 0, 7200};
    return 0;
  }
  if (!at(&c, ',')) return -1;
  c.p++;
  if (p_date(&c, &f->start) || !at(&c, ',')) return -1;
  c.p++;
  if (p_date(&c, &f->end)) return -1;
  return c.p == c.end ? 0 : -1;
}

/* The local time (seconds on the wall clock in effect before the change) at
** which rule date r happens in year y. */
static int64_t rule_local(const rule_date_t *r, int64_t y) {
  int64_t jan1 = tz_days_from_civil(y, 1, 1), day;
  if (r->kind == 'J') {
    day = jan1 + r->n - 1 + (is_leap(y) && r->n >= 60); /* Feb 29 is never counted */
  } else if (r->kind == 'N') {
    day = jan1 + r->n;
  } else {
    int64_t first = tz_days_from_civil(y, r->m, 1);
    int dd = (r->d - tz_weekday(first) + 7) % 7 + (r->w - 1) * 7;
    int md = tz_days_in_month(y, r->m);
    while (dd >= md) dd -= 7; /* week 5 means the last one */
    day = first + dd;
  }
  return day * 86400 + r->time;
}

typedef struct ev {
  int64_t at;
  int dst; /* state from this instant on */
} ev_t;

/* The footer's state at instant t (|t| <= TZ_CLAMP), as a period. Events of
** five years around t's year are enough: a rule time is at most 167 hours
** away from its date, so every instant has an event before and after it. */
static void footer_period(const posix_tz_t *f, int64_t t, tz_period_t *p) {
  if (!f->has_dst) {
    *p = (tz_period_t){INT64_MIN, INT64_MAX, f->std_off, 0};
    return;
  }
  int64_t y, days = floor_div(t + f->std_off, 86400);
  int m, d;
  tz_civil_from_days(days, &y, &m, &d);
  ev_t ev[10];
  for (int k = 0; k < 5; k++) {
    ev[2 * k] = (ev_t){rule_local(&f->start, y - 2 + k) - f->std_off, 1};
    ev[2 * k + 1] = (ev_t){rule_local(&f->end, y - 2 + k) - f->dst_off, 0};
  }
  /* Insertion sort by time; on a tie "end" sorts first so that a start at
  ** the same instant wins: "J365/25" ending as the next year starts means
  ** DST all year. */
  for (int i = 1; i < 10; i++) {
    ev_t x = ev[i];
    int j = i - 1;
    while (j >= 0 && (ev[j].at > x.at || (ev[j].at == x.at && ev[j].dst > x.dst))) {
      ev[j + 1] = ev[j];
      j--;
    }
    ev[j + 1] = x;
  }
  int last = -1;
  for (int i = 0; i < 10; i++)
    if (ev[i].at <= t) last = i;
  int next = last + 1;
  while (next < 10 && ev[next].at <= t) next++;
  int dst = last >= 0 ? ev[last].dst : !ev[0].dst;
  p->start = last >= 0 ? ev[last].at : INT64_MIN;
  p->end = next < 10 ? ev[next].at : INT64_MAX;
  p->utoff = dst ? f->dst_off : f->std_off;
  p->is_dst = dst;
}

/* ---- lookups ----------------------------------------------------------- */

/* See tz.h. Before the first transition type 0 rules; from the last one on
** the footer (if any); in between, a binary search of the table. */
void tz_period(const tz_t *z, int64_t unix_s, tz_period_t *p) {
  if (!z) z = &tz_utc;
  int64_t t = unix_s < -TZ_CLAMP ? -TZ_CLAMP : unix_s > TZ_CLAMP ? TZ_CLAMP : unix_s;
  uint32_t n = z->ntimes;
  if (n == 0 || t < z->times[0]) {
    if (n == 0 && z->has_footer) {
      footer_period(&z->footer, t, p);
    } else {
      *p = (tz_period_t){INT64_MIN, n ? z->times[0] : INT64_MAX, z->utoff[0], z->isdst[0]};
    }
  } else {
    /* Binary search for the last transition <= t. */
    uint32_t lo = 0, hi = n; /* times[lo] <= t < times[hi] (times[n] = +inf) */
    while (hi - lo > 1) {
      uint32_t mid = lo + (hi - lo) / 2;
      if (z->times[mid] <= t) lo = mid;
      else hi = mid;
    }
    if (lo == n - 1 && z->has_footer) {
      footer_period(&z->footer, t, p);
      if (p->start < z->times[lo]) p->start = z->times[lo];
    } else {
      *p = (tz_period_t){z->times[lo], hi < n ? z->times[hi] : INT64_MAX, z->utoff[z->idx[lo]],
                         z->isdst[z->idx[lo]]};
    }
  }
  /* Clamped instants belong to a period that reaches them. */
  if (unix_s > TZ_CLAMP && p->end > TZ_CLAMP) p->end = INT64_MAX;
  if (unix_s < -TZ_CLAMP && p->start <= -TZ_CLAMP) p->start = INT64_MIN;
}

/* See tz.h. */
int tz_offset(const tz_t *z, int64_t unix_s, int *is_dst) {
  tz_period_t p;
  tz_period(z, unix_s, &p);
  if (is_dst) *is_dst = p.is_dst;
  return p.utoff;
}

/* See tz.h. */
int tz_local_to_utc(const tz_t *z, int64_t local_s, int64_t out[2]) {
  int64_t L = local_s < -TZ_CLAMP ? -TZ_CLAMP : local_s > TZ_CLAMP ? TZ_CLAMP : local_s;
  int n = 0;
  int64_t gap_end = L; /* unreachable fallback: no gap found */
  int gap_found = 0;
  /* Walk the periods covering [L - window, L + window]: an instant u shows
  ** L when u + utoff(u) == L, i.e. u = L - utoff of its own period. */
  int64_t t = L - TZ_WINDOW;
  for (;;) {
    tz_period_t p;
    tz_period(z, t, &p);
    int64_t u = L - p.utoff;
    if (u >= p.start && u < p.end && u >= t) {
      if (n < 2) out[n] = u;
      n++;
    } else if (!gap_found && u < t) {
      /* This period's wall clock starts after L: if nothing showed L so far,
      ** L was skipped and this period's first instant ends the gap. */
      gap_found = 1;
      gap_end = t;
    }
    if (p.end == INT64_MAX || p.end > L + TZ_WINDOW) break;
    t = p.end;
  }
  if (n == 0) out[0] = gap_end;
  return n > 2 ? 2 : n;
}

/* ---- loading ----------------------------------------------------------- */

/* Big-endian 32- and 64-bit integers, as TZif stores them. */
static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int64_t be64(const uint8_t *p) {
  return (int64_t)((uint64_t)be32(p) << 32 | be32(p + 4));
}

typedef struct hdr {
  int version; /* 1, 2, 3, ... */
  uint32_t isutcnt, isstdcnt, leapcnt, timecnt, typecnt, charcnt;
} hdr_t;

/* Parse a 44-byte header at buf[off]; 0, or -1 with *why set. */
static int parse_hdr(const uint8_t *buf, size_t len, size_t off, hdr_t *h, const char **why) {
  if (len < off || len - off < 44) return *why = "truncated header", -1;
  const uint8_t *p = buf + off;
  if (memcmp(p, "TZif", 4)) return *why = "bad magic", -1;
  h->version = p[4] == 0 ? 1 : (p[4] >= '2' && p[4] <= '9') ? p[4] - '0' : -1;
  if (h->version < 0) return *why = "unknown version", -1;
  h->isutcnt = be32(p + 20);
  h->isstdcnt = be32(p + 24);
  h->leapcnt = be32(p + 28);
  h->timecnt = be32(p + 32);
  h->typecnt = be32(p + 36);
  h->charcnt = be32(p + 40);
  return 0;
}

/* Bytes of a data block with tsize-byte times (uint64: counts are 32-bit). */
static uint64_t block_size(const hdr_t *h, int tsize) {
  return (uint64_t)h->timecnt * (uint64_t)(tsize + 1) + (uint64_t)h->typecnt * 6 + h->charcnt +
         (uint64_t)h->leapcnt * (uint64_t)(tsize + 4) + h->isstdcnt + h->isutcnt;
}

/* Decode a TZif image into z's tables. Returns 0, or -1 with *why set. */
static int parse_tzif(tz_t *z, const uint8_t *buf, size_t len, const char **why) {
  hdr_t h;
  if (parse_hdr(buf, len, 0, &h, why)) return -1;
  size_t off = 44;
  int tsize = 4;
  if (h.version >= 2) {
    uint64_t skip = block_size(&h, 4);
    if (skip > len - off) return *why = "truncated version 1 data", -1;
    off += (size_t)skip;
    int v1 = h.version;
    if (parse_hdr(buf, len, off, &h, why)) return -1;
    if (h.version != v1) return *why = "inconsistent versions", -1;
    off += 44;
    tsize = 8;
  }
  if (h.leapcnt) return *why = "leap seconds", -1;
  if (h.typecnt == 0 || h.typecnt > 256) return *why = "bad type count", -1;
  if (h.charcnt == 0) return *why = "no abbreviations", -1;
  if ((h.isstdcnt && h.isstdcnt != h.typecnt) || (h.isutcnt && h.isutcnt != h.typecnt))
    return *why = "bad indicator counts", -1;
  if (block_size(&h, tsize) > len - off) return *why = "truncated data", -1;

  const uint8_t *tp = buf + off;
  const uint8_t *ip = tp + (size_t)h.timecnt * tsize;
  const uint8_t *ty = ip + h.timecnt;
  const uint8_t *end = buf + off + block_size(&h, tsize);
  z->ntimes = h.timecnt;
  z->ntypes = h.typecnt;
  z->times = mem_alloc(sizeof(int64_t) * (h.timecnt ? h.timecnt : 1));
  z->idx = mem_alloc(h.timecnt ? h.timecnt : 1);
  z->utoff = mem_alloc(sizeof(int32_t) * h.typecnt);
  z->isdst = mem_alloc(h.typecnt);
  for (uint32_t i = 0; i < h.timecnt; i++) {
    z->times[i] =
        tsize == 8 ? be64(tp + 8 * (size_t)i) : (int64_t)(int32_t)be32(tp + 4 * (size_t)i);
    if (i && z->times[i] <= z->times[i - 1]) return *why = "transitions out of order", -1;
    z->idx[i] = ip[i];
    if (ip[i] >= h.typecnt) return *why = "bad type index", -1;
  }
  for (uint32_t i = 0; i < h.typecnt; i++) {
    const uint8_t *p = ty + 6 * (size_t)i;
    int32_t u = (int32_t)be32(p);
    if (u < TZ_MIN_UTOFF || u > TZ_MAX_UTOFF) return *why = "offset out of range", -1;
    if (p[4] > 1) return *why = "bad isdst flag", -1;
    if (p[5] >= h.charcnt) return *why = "bad abbreviation index", -1;
    z->utoff[i] = u;
    z->isdst[i] = p[4];
  }
  if (h.version < 2) return 0;

  /* The footer: "\n" TZ string "\n", right after the data block. */
  if (end >= buf + len || *end != '\n') return *why = "missing footer", -1;
  const uint8_t *s = end + 1;
  const uint8_t *nl = memchr(s, '\n', (size_t)(buf + len - s));
  if (!nl) return *why = "unterminated footer", -1;
  if (nl > s) {
    if (parse_posix((const char *)s, (size_t)(nl - s), &z->footer))
      return *why = "bad TZ string in the footer", -1;
    z->has_footer = 1;
  }
  return 0;
}

/* Free a loaded zone (never the built-in UTC). */
static void zone_free(tz_t *z) {
  if (!z || z == &tz_utc) return;
  free(z->name);
  free(z->times);
  free(z->idx);
  free(z->utoff);
  free(z->isdst);
  free(z);
}

/* Check a zone name before it becomes a path under the zone directory. */
static int check_name(const char *name, err_t *e) {
  size_t n = strlen(name);
  if (n > TZ_MAX_NAME)
    return err_set(e, ERR_INVALID, "invalid time zone name '%.64s...': too long", name);
  if (name[0] == '/')
    return err_set(e, ERR_INVALID, "invalid time zone name '%s': must not start with '/'", name);
  for (const char *p = name; *p; p++) {
    char ch = *p;
    if (!((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
          ch == '_' || ch == '-' || ch == '+' || ch == '.' || ch == '/'))
      return err_set(e, ERR_INVALID, "invalid time zone name '%s': unexpected character '%c'",
                     name, ch);
  }
  /* Components must be non-empty and neither "." nor "..". */
  for (const char *p = name; *p;) {
    const char *q = strchr(p, '/');
    size_t len = q ? (size_t)(q - p) : strlen(p);
    if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
      return err_set(e, ERR_INVALID, "invalid time zone name '%s': '%.*s' is not allowed", name,
                     (int)(len ? len : 2), len ? p : "//");
    if (!q) break;
    p = q + 1;
    if (!*p) return err_set(e, ERR_INVALID, "invalid time zone name '%s': trailing '/'", name);
  }
  return 0;
}

/* Read and decode the file of zone name into a new tz_t. */
static int zone_read(const char *name, tz_t **out, err_t *e) {
  const char *dir = getenv("TZDIR");
  if (!dir || !*dir) dir = TZ_DEFAULT_DIR;
  char path[4096];
  if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
    return err_set(e, ERR_INVALID, "time zone path for '%s' is too long", name);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR || errno == EISDIR || errno == ELOOP)
      return err_set(e, ERR_NOTFOUND, "unknown time zone '%s'", name);
    return err_set(e, ERR_IO, "cannot open time zone file %s: %s", path, strerror(errno));
  }
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    close(fd);
    return err_set(e, ERR_NOTFOUND, "unknown time zone '%s'", name);
  }
  if (st.st_size > TZ_MAX_FILE) {
    close(fd);
    return err_set(e, ERR_INVALID, "time zone '%s': file %s is too large", name, path);
  }
  size_t len = (size_t)st.st_size, got = 0;
  uint8_t *buf = mem_alloc(len);
  while (got < len) {
    ssize_t r = read(fd, buf + got, len - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break; /* a file that shrank reads as truncated */
    got += (size_t)r;
  }
  close(fd);

  int rc = 0;
  const char *why = NULL;
  tz_t *z = mem_calloc(1, sizeof *z);
  z->name = mem_strdup(name);
  if (got < 4 || memcmp(buf, "TZif", 4)) {
    rc = err_set(e, ERR_NOTFOUND, "unknown time zone '%s' (%s is not a TZif file)", name, path);
  } else if (parse_tzif(z, buf, got, &why)) {
    if (!strcmp(why, "leap seconds"))
      rc = err_set(e, ERR_INVALID,
                   "time zone '%s' counts leap seconds, which is not supported "
                   "(use a zone outside right/)", name);
    else
      rc = err_set(e, ERR_INVALID, "time zone '%s': corrupt file %s: %s", name, path, why);
  }
  free(buf);
  if (rc) {
    zone_free(z);
    return rc;
  }
  *out = z;
  return 0;
}

/* See tz.h. */
int tz_load(const char *name, tz_t **out, err_t *e) {
  if (!out) return err_set(e, ERR_INVALID, "tz_load: no output pointer");
  *out = NULL;
  if (!name || !*name || !strcmp(name, "UTC")) {
    *out = &tz_utc;
    return 0;
  }
  int rc = check_name(name, e);
  if (rc) return rc;
  /* Loading under the lock is simple and keeps two threads from reading
  ** the same file twice; it happens once per zone per process. */
  pthread_mutex_lock(&cache_mu);
  tz_t *z;
  for (z = cache; z; z = z->next)
    if (!strcmp(z->name, name)) break;
  if (!z) {
    rc = zone_read(name, &z, e);
    if (!rc) {
      z->next = cache;
      cache = z;
    }
  }
  pthread_mutex_unlock(&cache_mu);
  if (!rc) *out = z;
  return rc;
}

/* See tz.h. */
const char *tz_name(const tz_t *z) { return z ? z->name : tz_utc.name; }

/* See tz.h. The list is detached under the lock and freed outside it. */
void tz_free_all(void) {
  pthread_mutex_lock(&cache_mu);
  tz_t *z = cache;
  cache = NULL;
  pthread_mutex_unlock(&cache_mu);
  while (z) {
    tz_t *next = z->next;
    zone_free(z);
    z = next;
  }
}
