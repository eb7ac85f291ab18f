/*
** units.c: parsing and formatting durations, sizes and times (see units.h).
*/
#include "base/units.h"

#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int units_duration(const char *s, int64_t *ms, err_t *e) {
  if (!s || !*s) return err_set(e, ERR_INVALID, "empty duration");
  const char *p = s;
  double total = 0;
  int parts = 0;
  while (*p) {
    char *end;
    if (!isdigit((unsigned char)*p) && *p != '.')
      return err_set(e, ERR_INVALID, "bad duration '%s': expected a number at '%s'", s, p);
    double v = strtod(p, &end);
    if (end == p || v < 0 || !isfinite(v))
      return err_set(e, ERR_INVALID, "bad duration '%s'", s);
    p = end;
    double unit;
    if (!*p && parts == 0) unit = 1000;          /* a bare number is seconds */
    else if (!strncmp(p, "ms", 2)) unit = 1, p += 2;
    else if (*p == 's') unit = 1000, p++;
    else if (*p == 'm') unit = 60e3, p++;
    else if (*p == 'h') unit = 3600e3, p++;
    else if (*p == 'd') unit = 86400e3, p++;
    else if (*p == 'w') unit = 7 * 86400e3, p++;
    else
      return err_set(e, ERR_INVALID,
                     "bad duration '%s': unknown unit '%s' (use ms, s, m, h, d or w)", s, p);
    total += v * unit;
    parts++;
  }
  if (total > 9.2e15) return err_set(e, ERR_INVALID, "duration '%s' is too long", s);
  *ms = (int64_t)llround(total);
  return 0;
}

int units_size(const char *s, int64_t *bytes, err_t *e) {
  if (!s || !*s) return err_set(e, ERR_INVALID, "empty size");
  char *end;
  double v = strtod(s, &end);
  if (end == s || v < 0 || !isfinite(v))
    return err_set(e, ERR_INVALID, "bad size '%s': expected a number like 64KB or 1MB", s);
  while (*end == ' ') end++;
  double unit;
  if (!*end || !strcasecmp(end, "b")) unit = 1;
  else if (!strcasecmp(end, "kb") || !strcasecmp(end, "k") || !strcasecmp(end, "kib")) unit = 1024.0;
  else if (!strcasecmp(end, "mb") || !strcasecmp(end, "m") || !strcasecmp(end, "mib")) unit = 1048576.0;
  else if (!strcasecmp(end, "gb") || !strcasecmp(end, "g") || !strcasecmp(end, "gib")) unit = 1073741824.0;
  else return err_set(e, ERR_INVALID, "bad size '%s': unknown unit '%s' (use B, KB, MB or GB)", s, end);
  *bytes = (int64_t)llround(v * unit);
  return 0;
}

/* See units.h. */
int64_t units_ms_of(double v) {
  if (v != v) return 0;
  if (v >= (double)UNITS_MS_MAX) return UNITS_MS_MAX;
  if (v <= -(double)UNITS_MS_MAX) return -UNITS_MS_MAX;
  return (int64_t)v;
}

int64_t units_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

uint64_t units_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Write v as exactly n decimal digits at p. */
static void put_digits(char *p, int v, int n) {
  while (n--) {
    p[n] = (char)('0' + v % 10);
    v /= 10;
  }
}

/* Run records show several times each, and are read often: the date is
** computed here (days to civil date, the proleptic Gregorian calendar
** that gmtime also uses) and its digits written without snprintf, for the
** years 0 to 9999 (others, never seen in practice, go through gmtime and
** snprintf). */
void units_rfc3339(int64_t ms, char *out, size_t n) {
  /* The times of one record mostly fall in the same second: the last
  ** second formatted is kept (per thread) and only its fraction redone. */
  static _Thread_local int64_t last_secs = INT64_MIN;
  static _Thread_local char last[20];
  int64_t secs = ms >= 0 ? ms / 1000 : (ms - 999) / 1000;
  int frac = (int)(ms - secs * 1000);
  if (secs == last_secs && n >= 25) {
    memcpy(out, last, 19);
    memcpy(out + 19, ".000Z", 6);
    put_digits(out + 20, frac, 3);
    return;
  }
  int64_t days = secs >= 0 ? secs / 86400 : (secs - 86399) / 86400;
  int sod = (int)(secs - days * 86400);
  /* Howard Hinnant's days_from_civil, inverted: eras of 400 years. */
  int64_t z = days + 719468;
  int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  int64_t doe = z - era * 146097;
  int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  int64_t mp = (5 * doy + 2) / 153;
  int day = (int)(doy - (153 * mp + 2) / 5 + 1);
  int month = (int)(mp < 10 ? mp + 3 : mp - 9);
  int64_t year = yoe + era * 400 + (month <= 2);
  if (n < 25 || year < 0 || year > 9999) {
    time_t t = (time_t)secs;
    struct tm tm;
    gmtime_r(&t, &tm);
    snprintf(out, n, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, frac);
    return;
  }
  memcpy(out, "0000-00-00T00:00:00.000Z", 25);
  put_digits(out, (int)year, 4);
  put_digits(out + 5, month, 2);
  put_digits(out + 8, day, 2);
  put_digits(out + 11, sod / 3600, 2);
  put_digits(out + 14, sod / 60 % 60, 2);
  put_digits(out + 17, sod % 60, 2);
  put_digits(out + 20, frac, 3);
  memcpy(last, out, 19);
  last_secs = secs;
}

/* Read exactly n digits from *p into *v; returns 0 or -1. */
static int digits(const char **p, int n, int *v) {
  *v = 0;
  for (int i = 0; i < n; i++) {
    if (!isdigit((unsigned char)**p)) return -1;
    *v = *v * 10 + (**p - '0');
    (*p)++;
  }
  return 0;
}

int units_parse_rfc3339(const char *s, int64_t *ms, err_t *e) {
  const char *p = s;
  int Y, M, D, h = 0, m = 0, sec = 0, frac = 0;
  if (digits(&p, 4, &Y) || *p++ != '-' || digits(&p, 2, &M) || *p++ != '-' || digits(&p, 2, &D))
    goto bad;
  if (*p == 'T' || *p == 't' || *p == ' ') {
    p++;
    if (digits(&p, 2, &h) || *p++ != ':' || digits(&p, 2, &m)) goto bad;
    if (*p == ':') {
      p++;
      if (digits(&p, 2, &sec)) goto bad;
      if (*p == '.') {
        p++;
        int scale = 100;
        if (!isdigit((unsigned char)*p)) goto bad;
        while (isdigit((unsigned char)*p)) {
          frac += (*p - '0') * scale;
          scale /= 10;
          p++;
        }
      }
    }
  }
  long off = 0;
  int timed = p > s + 10; /* a time of day was given: it needs its zone */
  if (*p == 'Z' || *p == 'z') p++;
  else if (timed && *p != '+' && *p != '-')
    return err_set(e, ERR_INVALID, "bad time '%s': no time zone (it would be read as UTC): add Z "
                   "for UTC or an offset such as +01:00, as RFC 3339 asks (2026-11-29T16:51:24Z)", s);
  else if (*p == '+' || *p == '-') {
    int sign = *p == '-' ? -1 : 1, oh, om;
    p++;
    if (digits(&p, 2, &oh)) goto bad;
    if (*p == ':') p++;
    if (digits(&p, 2, &om)) goto bad;
    off = sign * (oh * 3600L + om * 60L);
  }
  if (*p || M < 1 || M > 12 || D < 1 || h > 23 || m > 59 || sec > 60) goto bad;
  /* The month's days: 2027-02-30 is no day (timegm made it March 2nd). */
  static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  int leap = (Y % 4 == 0 && Y % 100 != 0) || Y % 400 == 0;
  if (D > mdays[M - 1] + (M == 2 && leap))
    return err_set(e, ERR_INVALID, "bad time '%s': %04d-%02d has no day %d", s, Y, M, D);
  struct tm tm = {0};
  tm.tm_year = Y - 1900;
  tm.tm_mon = M - 1;
  tm.tm_mday = D;
  tm.tm_hour = h;
  tm.tm_min = m;
  tm.tm_sec = sec;
  *ms = ((int64_t)timegm(&tm) - off) * 1000 + frac;
  return 0;
bad:
  return err_set(e, ERR_INVALID, "bad time '%s': expected RFC 3339 like 2026-11-29T16:51:24Z", s);
}

void units_fmt_duration(int64_t ms, char *out, size_t n) {
  if (ms < 0) ms = 0;
  if (ms < 1000) snprintf(out, n, "%dms", (int)ms);
  else if (ms < 60000) snprintf(out, n, "%.1fs", ms / 1000.0);
  else if (ms < 3600000) snprintf(out, n, "%dm%02ds", (int)(ms / 60000), (int)(ms / 1000 % 60));
  else if (ms < 86400000) snprintf(out, n, "%dh%02dm", (int)(ms / 3600000), (int)(ms / 60000 % 60));
  else snprintf(out, n, "%dd%dh", (int)(ms / 86400000), (int)(ms / 3600000 % 24));
}

void units_fmt_size(int64_t bytes, char *out, size_t n) {
  if (bytes < 1024) snprintf(out, n, "%d B", (int)bytes);
  else if (bytes < 1048576) snprintf(out, n, "%.1f KB", bytes / 1024.0);
  else if (bytes < 1073741824) snprintf(out, n, "%.1f MB", bytes / 1048576.0);
  else snprintf(out, n, "%.1f GB", bytes / 1073741824.0);
}

/* See units.h. */
void units_fmt_over(int64_t size, int64_t limit, char *size_out, char *limit_out, size_t n) {
  units_fmt_size(size, size_out, n);
  units_fmt_size(limit, limit_out, n);
  if (strcmp(size_out, limit_out)) return;
  snprintf(size_out, n, "%lld bytes", (long long)size);
  snprintf(limit_out, n, "%lld bytes", (long long)limit);
}
