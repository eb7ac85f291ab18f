/* Unit tests for cron.c: next fire times for every field syntax, names,
** the day-of-month / day-of-week rule, seconds, macros, month ends and leap
** years; daylight saving time changes as sequences of consecutive runs; a
** year of daily runs and of interval runs per zone; a brute-force reference
** built on tz_local_to_utc(); error messages; speed.
**
** The expected times of the tables were checked against an independent
** brute-force implementation of the policy over Python's zoneinfo. */
#include <pthread.h>
#include <stdint.h>

#include "base/cron.h"
#include "base/tz.h"
#include "base/units.h"
#include "test.h"

typedef struct next_row {
  const char *expr, *tz, *after, *expected; /* expected NULL: none within 5 years */
} next_row_t;

typedef struct seq_row {
  const char *expr, *tz, *after;
  const char *expected[6]; /* consecutive fire times, NULL-terminated */
} seq_row_t;

static int64_t MS(const char *s) {
  int64_t ms;
  err_t e;
  if (units_parse_rfc3339(s, &ms, &e)) {
    FAILF("bad time in test table: %s", s);
    return 0;
  }
  return ms;
}

static void fmt(int64_t ms, char *out, size_t n) {
  if (ms == -1) snprintf(out, n, "none");
  else units_rfc3339(ms, out, n);
}

static cron_t *parse(const char *expr, const char *tz) {
  cron_t *c = NULL;
  err_t e = {0};
  if (cron_parse(expr, tz, &c, &e)) FAILF("cron_parse(\"%s\", %s): %s", expr, tz ? tz : "NULL", e.msg);
  return c;
}

static int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

static const next_row_t NEXT_ROWS[] = {
    {"* * * * *", "UTC", "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"},
    {"* * * * *", "UTC", "2026-01-01T00:00:30.500Z", "2026-01-01T00:01:00Z"},
    {"* * * * *", "UTC", "2026-01-01T00:00:59.999Z", "2026-01-01T00:01:00Z"},
    {"*/15 * * * *", "UTC", "2026-01-01T00:14:59Z", "2026-01-01T00:15:00Z"},
    {"*/15 * * * *", "UTC", "2026-01-01T00:15:00Z", "2026-01-01T00:30:00Z"},
    {"*/15 * * * *", "UTC", "2026-01-01T23:45:00Z", "2026-01-02T00:00:00Z"},
    {"5 * * * *", "UTC", "2026-01-01T00:05:00Z", "2026-01-01T01:05:00Z"},
    {"0 12 * * *", "UTC", "2026-01-01T12:00:00Z", "2026-01-02T12:00:00Z"},
    {"0 9-17 * * *", "UTC", "2026-01-01T17:30:00Z", "2026-01-02T09:00:00Z"},
    {"0 9-17 * * *", "UTC", "2026-01-01T10:00:00Z", "2026-01-01T11:00:00Z"},
    {"0,20,40 * * * *", "UTC", "2026-01-01T00:41:00Z", "2026-01-01T01:00:00Z"},
    {"10-30/10 * * * *", "UTC", "2026-01-01T00:31:00Z", "2026-01-01T01:10:00Z"},
    {"10-30/10 * * * *", "UTC", "2026-01-01T00:10:00Z", "2026-01-01T00:20:00Z"},
    {"50/5 * * * *", "UTC", "2026-01-01T00:56:00Z", "2026-01-01T01:50:00Z"},
    {"0 */6 * * *", "UTC", "2026-01-01T07:00:00Z", "2026-01-01T12:00:00Z"},
    {"0 1-23/11 * * *", "UTC", "2026-01-01T12:00:00Z", "2026-01-01T23:00:00Z"},
    {"0,30 8,9-10 * * *", "UTC", "2026-01-01T10:30:00Z", "2026-01-02T08:00:00Z"},
    {"0 0 15 * *", "UTC", "2026-01-15T00:00:00Z", "2026-02-15T00:00:00Z"},
    {"0 0 1 6 *", "UTC", "2026-01-01T00:00:00Z", "2026-06-01T00:00:00Z"},
    {"0 0 1 jun,DEC *", "UTC", "2026-06-02T00:00:00Z", "2026-12-01T00:00:00Z"},
    {"0 0 1 Mar-May *", "UTC", "2026-05-02T00:00:00Z", "2027-03-01T00:00:00Z"},
    {"0 0 1 */4 *", "UTC", "2026-01-02T00:00:00Z", "2026-05-01T00:00:00Z"},
    {"0 9 * * MON", "UTC", "2026-01-01T00:00:00Z", "2026-01-05T09:00:00Z"},
    {"0 9 * * mon", "UTC", "2026-01-05T09:00:00Z", "2026-01-12T09:00:00Z"},
    {"0 9 * * 7", "UTC", "2026-01-01T00:00:00Z", "2026-01-04T09:00:00Z"},
    {"0 9 * * 0", "UTC", "2026-01-01T00:00:00Z", "2026-01-04T09:00:00Z"},
    {"0 9 * * SUN", "UTC", "2026-01-01T00:00:00Z", "2026-01-04T09:00:00Z"},
    {"0 9 * * MON-FRI", "UTC", "2026-01-02T09:00:00Z", "2026-01-05T09:00:00Z"},
    {"0 9 * * FRI-SUN", "UTC", "2026-01-04T09:00:00Z", "2026-01-09T09:00:00Z"},
    {"0 9 * * 5-7", "UTC", "2026-01-03T09:00:00Z", "2026-01-04T09:00:00Z"},
    {"0 9 * * 6-0", "UTC", "2026-01-04T09:00:00Z", "2026-01-10T09:00:00Z"},
    {"0 9 * * 1/2", "UTC", "2026-01-05T09:00:00Z", "2026-01-07T09:00:00Z"},
    {"0 0 13 * FRI", "UTC", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"},
    {"0 0 13 * FRI", "UTC", "2026-01-09T00:00:00Z", "2026-01-13T00:00:00Z"},
    {"0 0 13 * FRI", "UTC", "2026-01-13T00:00:00Z", "2026-01-16T00:00:00Z"},
    {"0 0 1,15 * 3", "UTC", "2026-01-01T00:00:00Z", "2026-01-07T00:00:00Z"},
    {"0 0 31 2 MON", "UTC", "2026-02-01T00:00:00Z", "2026-02-02T00:00:00Z"},
    {"0 0 * * FRI", "UTC", "2026-01-09T00:00:00Z", "2026-01-16T00:00:00Z"},
    {"0 0 */2 * MON", "UTC", "2026-01-01T00:00:00Z", "2026-01-05T00:00:00Z"},
    {"0 0 */2 * MON", "UTC", "2026-01-05T00:00:00Z", "2026-01-19T00:00:00Z"},
    {"0 0 1 * */2", "UTC", "2025-12-31T00:00:00Z", "2026-01-01T00:00:00Z"},
    {"0 0 1 * */2", "UTC", "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"},
    {"*/10 * * * * *", "UTC", "2026-01-01T00:00:05Z", "2026-01-01T00:00:10Z"},
    {"*/10 * * * * *", "UTC", "2026-01-01T00:00:50.250Z", "2026-01-01T00:01:00Z"},
    {"30 0 12 * * *", "UTC", "2026-01-01T12:00:30Z", "2026-01-02T12:00:30Z"},
    {"15,45 * * * * *", "UTC", "2026-01-01T00:00:45Z", "2026-01-01T00:01:15Z"},
    {"59 59 23 31 12 *", "UTC", "2026-06-01T00:00:00Z", "2026-12-31T23:59:59Z"},
    {"@yearly", "UTC", "2026-03-01T00:00:00Z", "2027-01-01T00:00:00Z"},
    {"@annually", "UTC", "2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z"},
    {"@monthly", "UTC", "2026-01-31T12:00:00Z", "2026-02-01T00:00:00Z"},
    {"@weekly", "UTC", "2026-01-01T00:00:00Z", "2026-01-04T00:00:00Z"},
    {"@daily", "UTC", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"},
    {"@midnight", "UTC", "2026-01-01T00:00:01Z", "2026-01-02T00:00:00Z"},
    {"@hourly", "UTC", "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z"},
    {"  @DAILY ", "UTC", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"},
    {"0 0 31 * *", "UTC", "2026-01-31T00:00:00Z", "2026-03-31T00:00:00Z"},
    {"0 0 31 * *", "UTC", "2026-03-31T00:00:00Z", "2026-05-31T00:00:00Z"},
    {"0 0 30 * *", "UTC", "2026-01-30T00:00:00Z", "2026-03-30T00:00:00Z"},
    {"0 0 29 * *", "UTC", "2026-01-29T00:00:00Z", "2026-03-29T00:00:00Z"},
    {"0 0 29 * *", "UTC", "2028-01-29T00:00:00Z", "2028-02-29T00:00:00Z"},
    {"0 0 29 2 *", "UTC", "2026-01-01T00:00:00Z", "2028-02-29T00:00:00Z"},
    {"0 0 29 2 *", "UTC", "2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"},
    {"0 0 29 2 *", "UTC", "2096-02-29T00:00:00Z", NULL},
    {"0 0 29 2 *", "UTC", "2099-03-01T00:00:00Z", "2104-02-29T00:00:00Z"},
    {"0 0 28-31 2 *", "UTC", "2100-02-28T00:00:00Z", "2101-02-28T00:00:00Z"},
    {"0 0 1 1 *", "UTC", "2026-12-31T23:59:59Z", "2027-01-01T00:00:00Z"},
    {"59 23 31 12 *", "UTC", "2026-12-31T23:59:00Z", "2027-12-31T23:59:00Z"},
    {"0 0 * * *", "UTC", "2099-12-31T12:00:00Z", "2100-01-01T00:00:00Z"},
    {"0 0 * * *", "", "1969-12-31T12:00:00Z", "1970-01-01T00:00:00Z"},
    {"0 9 * * *", "Asia/Kolkata", "2026-01-01T00:00:00Z", "2026-01-01T03:30:00Z"},
    {"30 23 * * *", "Asia/Kolkata", "2026-01-01T00:00:00Z", "2026-01-01T18:00:00Z"},
    {"0 0 1 * *", "Asia/Kolkata", "2026-01-31T18:29:59Z", "2026-01-31T18:30:00Z"},
    {"0 9 * * *", "Europe/Paris", "2026-07-01T00:00:00Z", "2026-07-01T07:00:00Z"},
    {"0 9 * * *", "Europe/Paris", "2026-01-01T00:00:00Z", "2026-01-01T08:00:00Z"},
    {"0 9 * * MON", "America/New_York", "2026-01-05T13:59:00Z", "2026-01-05T14:00:00Z"},
    {"0 0 * * *", "America/New_York", "2026-01-01T04:59:59Z", "2026-01-01T05:00:00Z"},
    {"0 9 * * *", "Europe/Paris", "2045-07-01T00:00:00Z", "2045-07-01T07:00:00Z"},
    {"0 9 * * *", "Australia/Lord_Howe", "2050-01-01T00:00:00Z", "2050-01-01T22:00:00Z"},
    {"30 2 * * *", "Europe/Paris", "2045-03-25T12:00:00Z", "2045-03-26T01:00:00Z"},
    {"30 2 * * *", "Europe/Paris", "2045-10-28T12:00:00Z", "2045-10-29T00:30:00Z"},
    {"15 2 * * *", "Australia/Lord_Howe", "2026-10-03T12:00:00Z", "2026-10-03T15:30:00Z"},
    {"45 1 * * *", "Australia/Lord_Howe", "2026-04-04T12:00:00Z", "2026-04-04T14:45:00Z"},
    {"45 1 * * *", "Australia/Lord_Howe", "2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"},
    {"0 30 2 * * *", "Europe/Paris", "2026-03-28T12:00:00Z", "2026-03-29T01:00:00Z"},
    {"30 2 * * *", "Europe/Paris", "2026-10-25T01:10:00Z", "2026-10-26T01:30:00Z"},
    {"30 2 * * *", "Europe/Paris", "2026-03-29T00:59:59.500Z", "2026-03-29T01:00:00Z"},
    {"30 2 * * *", "Europe/Paris", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"},
    {"0 2 29 3 *", "Europe/Paris", "2026-01-01T00:00:00Z", "2026-03-29T01:00:00Z"},
    {"0 2 29 3 *", "Europe/Paris", "2026-03-29T01:00:00Z", "2027-03-29T00:00:00Z"},
};

static const seq_row_t SEQ_ROWS[] = {
    {"30 2 * * *", "Europe/Paris", "2026-03-27T12:00:00Z",
     {"2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z", "2026-03-31T00:30:00Z"}},
    {"0 * * * *", "Europe/Paris", "2026-03-28T22:30:00Z",
     {"2026-03-28T23:00:00Z", "2026-03-29T00:00:00Z", "2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z"}},
    {"*/30 * * * *", "Europe/Paris", "2026-03-29T00:00:00Z",
     {"2026-03-29T00:30:00Z", "2026-03-29T01:00:00Z", "2026-03-29T01:30:00Z", "2026-03-29T02:00:00Z"}},
    {"0 2,3 * * *", "Europe/Paris", "2026-03-28T12:00:00Z",
     {"2026-03-29T01:00:00Z", "2026-03-30T00:00:00Z", "2026-03-30T01:00:00Z"}},
    {"30 1-3 * * *", "Europe/Paris", "2026-03-28T23:00:00Z",
     {"2026-03-29T00:30:00Z", "2026-03-29T01:00:00Z", "2026-03-29T01:30:00Z", "2026-03-29T23:30:00Z"}},
    {"*/20 2 * * *", "Europe/Paris", "2026-03-28T12:00:00Z",
     {"2026-03-29T01:00:00Z", "2026-03-30T00:00:00Z", "2026-03-30T00:20:00Z"}},
    {"*/20 * * * * *", "Europe/Paris", "2026-03-29T00:59:30Z",
     {"2026-03-29T00:59:40Z", "2026-03-29T01:00:00Z", "2026-03-29T01:00:20Z"}},
    {"30 2 * * *", "Europe/Paris", "2026-10-24T00:00:00Z",
     {"2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z", "2026-10-27T01:30:00Z"}},
    {"*/30 * * * *", "Europe/Paris", "2026-10-24T23:45:00Z",
     {"2026-10-25T00:00:00Z", "2026-10-25T00:30:00Z", "2026-10-25T01:00:00Z", "2026-10-25T01:30:00Z", "2026-10-25T02:00:00Z"}},
    {"0 * * * *", "Europe/Paris", "2026-10-24T23:30:00Z",
     {"2026-10-25T00:00:00Z", "2026-10-25T01:00:00Z", "2026-10-25T02:00:00Z"}},
    {"0 2 * * *", "Europe/Paris", "2026-10-24T12:00:00Z",
     {"2026-10-25T00:00:00Z", "2026-10-26T01:00:00Z"}},
    {"0 9 * * *", "Europe/Paris", "2026-10-23T12:00:00Z",
     {"2026-10-24T07:00:00Z", "2026-10-25T08:00:00Z", "2026-10-26T08:00:00Z"}},
    {"30 2 * * *", "America/New_York", "2026-03-07T00:00:00Z",
     {"2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"}},
    {"*/30 * * * *", "America/New_York", "2026-03-08T06:00:00Z",
     {"2026-03-08T06:30:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z"}},
    {"15 * * * *", "America/New_York", "2026-03-08T05:30:00Z",
     {"2026-03-08T06:15:00Z", "2026-03-08T07:15:00Z", "2026-03-08T08:15:00Z"}},
    {"30 1 * * *", "America/New_York", "2026-10-31T00:00:00Z",
     {"2026-10-31T05:30:00Z", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"}},
    {"*/30 * * * *", "America/New_York", "2026-11-01T04:45:00Z",
     {"2026-11-01T05:00:00Z", "2026-11-01T05:30:00Z", "2026-11-01T06:00:00Z", "2026-11-01T06:30:00Z", "2026-11-01T07:00:00Z"}},
    {"0 1 * * *", "America/New_York", "2026-10-31T12:00:00Z",
     {"2026-11-01T05:00:00Z", "2026-11-02T06:00:00Z"}},
    {"* 1 * * *", "America/New_York", "2026-11-01T05:57:00Z",
     {"2026-11-01T05:58:00Z", "2026-11-01T05:59:00Z", "2026-11-02T06:00:00Z"}},
    {"30 2 * * *", "Europe/Paris", "2045-03-25T00:00:00Z",
     {"2045-03-25T01:30:00Z", "2045-03-26T01:00:00Z", "2045-03-27T00:30:00Z"}},
    {"30 2 * * *", "Europe/Paris", "2045-10-28T00:00:00Z",
     {"2045-10-28T00:30:00Z", "2045-10-29T00:30:00Z", "2045-10-30T01:30:00Z"}},
    {"*/30 * * * *", "America/New_York", "2045-11-05T04:45:00Z",
     {"2045-11-05T05:00:00Z", "2045-11-05T05:30:00Z", "2045-11-05T06:00:00Z", "2045-11-05T06:30:00Z", "2045-11-05T07:00:00Z"}},
    {"30 2 * * *", "America/New_York", "2045-03-11T00:00:00Z",
     {"2045-03-11T07:30:00Z", "2045-03-12T07:00:00Z", "2045-03-13T06:30:00Z"}},
};

TEST(next_fire_times_table) {
  for (size_t i = 0; i < sizeof NEXT_ROWS / sizeof NEXT_ROWS[0]; i++) {
    const next_row_t *r = &NEXT_ROWS[i];
    cron_t *c = parse(r->expr, r->tz);
    if (!c) continue;
    int64_t got = cron_next(c, MS(r->after));
    int64_t want = r->expected ? MS(r->expected) : -1;
    if (got != want) {
      char g[40], w[40];
      fmt(got, g, sizeof g);
      fmt(want, w, sizeof w);
      FAILF("\"%s\" in %s after %s: got %s, expected %s", r->expr, r->tz, r->after, g, w);
    }
    cron_free(c);
  }
}

/* Several consecutive runs across each change: a double run or a missing
** one shows up as a wrong or extra element. */
TEST(dst_sequences_no_double_no_missing_run) {
  for (size_t i = 0; i < sizeof SEQ_ROWS / sizeof SEQ_ROWS[0]; i++) {
    const seq_row_t *r = &SEQ_ROWS[i];
    cron_t *c = parse(r->expr, r->tz);
    if (!c) continue;
    int64_t t = MS(r->after);
    for (int k = 0; r->expected[k]; k++) {
      int64_t got = cron_next(c, t), want = MS(r->expected[k]);
      if (got != want) {
        char g[40];
        fmt(got, g, sizeof g);
        FAILF("\"%s\" in %s after %s: run %d is %s, expected %s", r->expr, r->tz, r->after,
              k + 1, g, r->expected[k]);
        break;
      }
      t = got;
    }
    cron_free(c);
  }
}

/* A fixed-time daily job runs exactly once per local day, all year, for
** every hour of the day: at its wall clock time, at the first occurrence in
** a fold, at the end of the gap in a gap (tz_local_to_utc() out[0] in all
** three cases). */
TEST(fixed_daily_jobs_run_once_every_local_day) {
  static const char *zones[] = {"Europe/Paris", "America/New_York", "Australia/Lord_Howe"};
  static const int years[] = {2026, 2045};
  static const int minutes[] = {0, 15, 30, 45};
  for (int zi = 0; zi < 3; zi++) {
    tz_t *z;
    err_t e;
    if (tz_load(zones[zi], &z, &e)) {
      FAILF("%s", e.msg);
      continue;
    }
    for (int yi = 0; yi < 2; yi++) {
      int64_t d0 = tz_days_from_civil(years[yi], 1, 1), d1 = tz_days_from_civil(years[yi] + 1, 1, 1);
      for (int h = 0; h < 24; h++) {
        for (int mi = 0; mi < 4; mi++) {
          char expr[32];
          snprintf(expr, sizeof expr, "%d %d * * *", minutes[mi], h);
          cron_t *c = parse(expr, zones[zi]);
          if (!c) continue;
          int64_t out[2];
          tz_local_to_utc(z, d0 * 86400 + h * 3600 + minutes[mi] * 60, out);
          int64_t t = out[0] * 1000 - 1;
          for (int64_t d = d0; d < d1; d++) {
            tz_local_to_utc(z, d * 86400 + h * 3600 + minutes[mi] * 60, out);
            int64_t got = cron_next(c, t);
            if (got != out[0] * 1000) {
              char g[40], w[40];
              fmt(got, g, sizeof g);
              fmt(out[0] * 1000, w, sizeof w);
              FAILF("\"%s\" in %s: got %s, expected %s", expr, zones[zi], g, w);
              break;
            }
            t = got;
          }
          cron_free(c);
        }
      }
    }
  }
}

/* Interval jobs fire at every real instant that matches: in zones whose
** clock moves by whole hours they keep a constant rhythm in UTC across both
** changes (the gap loses the runs the fold gains), so a year holds exactly
** 365 days' worth. Lord Howe moves by 30 minutes: "*\/30" still keeps it. */
TEST(interval_jobs_keep_their_rhythm) {
  static const struct {
    const char *expr, *zone;
    int step;
  } rows[] = {
      {"*/30 * * * *", "Europe/Paris", 1800},     {"0 * * * *", "Europe/Paris", 3600},
      {"*/15 * * * *", "America/New_York", 900},  {"0 * * * *", "America/New_York", 3600},
      {"*/30 * * * *", "Australia/Lord_Howe", 1800}, {"@hourly", "Europe/Paris", 3600},
  };
  static const int years[] = {2026, 2045};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    for (int yi = 0; yi < 2; yi++) {
      cron_t *c = parse(rows[i].expr, rows[i].zone);
      if (!c) continue;
      int64_t from = tz_days_from_civil(years[yi], 1, 1) * 86400000;
      int64_t to = tz_days_from_civil(years[yi] + 1, 1, 1) * 86400000;
      int64_t t = cron_next(c, from - 1), n = 0;
      while (t >= 0 && t < to) {
        int64_t next = cron_next(c, t);
        if (next - t != rows[i].step * 1000LL) {
          char a[40], b[40];
          fmt(t, a, sizeof a);
          fmt(next, b, sizeof b);
          FAILF("\"%s\" in %s: %s then %s", rows[i].expr, rows[i].zone, a, b);
          break;
        }
        t = next;
        n++;
      }
      CHECK_INT_EQ(n, 365LL * 86400 / rows[i].step);
      cron_free(c);
    }
  }
}

/* ---- a brute-force reference ------------------------------------------- */

typedef struct ref {
  char text[128];
  uint64_t min;
  uint32_t hour, dom;
  uint16_t mon;
  uint8_t dow;
  int dom_star, dow_star, fixed;
} ref_t;

static uint64_t rnd_state = 0x9E3779B97F4A7C15ULL;
static uint32_t rnd(uint32_t n) {
  rnd_state = rnd_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (uint32_t)(rnd_state >> 33) % n;
}

/* A random field over lo..hi: its text and bits; *star if it starts with '*'. */
/* Random values stay within lo..hi (days 1-28 exist in every month); '*'
** and '*\/n' cover the whole field, lo..top. */
static uint64_t rnd_field(int lo, int hi, int top, int restrict_pct, const int *steps,
                          int nsteps, char *out, size_t n, int *star) {
  uint64_t bits = 0;
  *star = 0;
  if ((int)rnd(100) >= restrict_pct) {
    snprintf(out, n, "*");
    *star = 1;
    for (int v = lo; v <= top; v++) bits |= 1ULL << v;
    return bits;
  }
  int a = lo + (int)rnd((uint32_t)(hi - lo + 1)), b = lo + (int)rnd((uint32_t)(hi - lo + 1));
  if (a > b) {
    int x = a;
    a = b, b = x;
  }
  switch (rnd(4)) {
  case 0: {
    int s = steps[rnd((uint32_t)nsteps)];
    snprintf(out, n, "*/%d", s);
    *star = 1;
    for (int v = lo; v <= top; v += s) bits |= 1ULL << v;
    break;
  }
  case 1:
    snprintf(out, n, "%d", a);
    bits = 1ULL << a;
    break;
  case 2:
    snprintf(out, n, "%d,%d", a, b);
    bits = 1ULL << a | 1ULL << b;
    break;
  default:
    snprintf(out, n, "%d-%d", a, b);
    for (int v = a; v <= b; v++) bits |= 1ULL << v;
  }
  return bits;
}

static void rnd_ref(ref_t *r) {
  static const int msteps[] = {5, 10, 15, 20, 30}, hsteps[] = {2, 3, 4, 6}, dsteps[] = {2, 3},
                   osteps[] = {2, 3}, wsteps[] = {2, 3};
  char f[5][24];
  int star, hstar;
  r->min = rnd_field(0, 59, 59, 70, msteps, 5, f[0], sizeof f[0], &star);
  r->hour = (uint32_t)rnd_field(0, 23, 23, 60, hsteps, 4, f[1], sizeof f[1], &hstar);
  r->dom = (uint32_t)rnd_field(1, 28, 31, 20, dsteps, 2, f[2], sizeof f[2], &r->dom_star);
  r->mon = (uint16_t)rnd_field(1, 12, 12, 10, osteps, 2, f[3], sizeof f[3], &star);
  r->dow = (uint8_t)rnd_field(0, 6, 6, 25, wsteps, 2, f[4], sizeof f[4], &r->dow_star);
  r->fixed = !hstar;
  snprintf(r->text, sizeof r->text, "%s %s %s %s %s", f[0], f[1], f[2], f[3], f[4]);
}

static int ref_match(const ref_t *r, int64_t L) {
  int64_t days = floor_div(L, 86400), y;
  int sod = (int)(L - days * 86400), m, d;
  if (sod % 60 || !(r->min >> (sod / 60 % 60) & 1) || !(r->hour >> (sod / 3600) & 1)) return 0;
  tz_civil_from_days(days, &y, &m, &d);
  if (!(r->mon >> m & 1)) return 0;
  int a = r->dom >> d & 1, b = r->dow >> tz_weekday(days) & 1;
  return (r->dom_star || r->dow_star) ? a && b : a || b;
}

#define REF_SCAN_S (70 * 86400)

/* Scan wall clock minutes; map each match to instants with the policy of
** cron.h stated in terms of tz_local_to_utc(); keep the earliest after. */
static int64_t ref_next(const ref_t *r, const tz_t *z, int64_t after_s) {
  int64_t best = INT64_MAX;
  for (int64_t L = floor_div(after_s - 27 * 3600, 60) * 60; L < after_s + REF_SCAN_S; L += 60) {
    if (best != INT64_MAX && L - 27 * 3600 > best) break;
    if (!ref_match(r, L)) continue;
    int64_t out[2], cand = INT64_MAX;
    int n = tz_local_to_utc(z, L, out);
    if (r->fixed) { /* the only occurrence, the first one, or the gap's end */
      if (out[0] > after_s) cand = out[0];
    } else if (n >= 1 && out[0] > after_s) {
      cand = out[0];
    } else if (n == 2 && out[1] > after_s) {
      cand = out[1];
    }
    if (cand < best) best = cand;
  }
  return best == INT64_MAX ? -1 : best * 1000;
}

TEST(agrees_with_brute_force) {
  static const char *zones[] = {"UTC",          "Europe/Paris",     "America/New_York",
                                "Australia/Lord_Howe", "Asia/Kolkata", "America/Santiago",
                                "Asia/Tehran",  "Pacific/Chatham",  "America/Havana",
                                "Europe/London"};
  int compared = 0;
  for (int i = 0; i < 600; i++) {
    ref_t r;
    rnd_ref(&r);
    const char *zone = zones[rnd(10)];
    cron_t *c = NULL;
    err_t e;
    if (cron_parse(r.text, zone, &c, &e)) {
      FAILF("\"%s\": %s", r.text, e.msg);
      continue;
    }
    CHECK_INT_EQ(cron_is_fixed_time(c), r.fixed);
    tz_t *z;
    tz_load(zone, &z, &e);
    /* Half of the starts are near a transition. */
    int64_t after = 1577836800 + (int64_t)rnd(30u * 365 * 86400);
    if (rnd(2)) {
      tz_period_t p;
      tz_period(z, after, &p);
      if (p.end != INT64_MAX) after = p.end - 4 * 3600 + (int64_t)rnd(8 * 3600);
    }
    int64_t after_ms = after * 1000 + rnd(1000);
    int64_t want = ref_next(&r, z, after);
    int64_t got = cron_next(c, after_ms);
    if (want == -1) { /* nothing within the scan: cron_next must agree */
      if (got != -1 && got < (after + REF_SCAN_S - 27 * 3600) * 1000) {
        char g[40], a[40];
        fmt(got, g, sizeof g);
        fmt(after_ms, a, sizeof a);
        FAILF("\"%s\" in %s after %s: got %s, reference found none", r.text, zone, a, g);
      }
    } else if (got != want) {
      char g[40], w[40], a[40];
      fmt(got, g, sizeof g);
      fmt(want, w, sizeof w);
      fmt(after_ms, a, sizeof a);
      FAILF("\"%s\" in %s after %s: got %s, reference %s", r.text, zone, a, g, w);
    } else {
      compared++;
    }
    cron_free(c);
  }
  printf("  %d random cases agree\n", compared);
  CHECK(compared > 400);
}

/* ---- parsing -------------------------------------------------------------- */

TEST(invalid_expressions_name_the_problem) {
  static const struct {
    const char *expr, *fragment;
  } rows[] = {
      {"*/0 * * * *", "bad cron expression '*/0 * * * *': step must be at least 1 in the minute field"},
      {"61 * * * *", "bad cron expression '61 * * * *': value 61 out of range 0-59 in the minute field"},
      {"* * * *", "bad cron expression '* * * *': expected 5 or 6 fields, got 4"},
      {"* * * * * * *", "expected 5 or 6 fields, got 7"},
      {"0 0 30 2 *", "bad cron expression '0 0 30 2 *': never fires"},
      {"0 0 31 4,6,9,11 *", "never fires"},
      {"0 0 30,31 FEB *", "never fires"},
      {"0 24 * * *", "value 24 out of range 0-23 in the hour field"},
      {"0 0 0 * *", "value 0 out of range 1-31 in the day-of-month field"},
      {"0 0 32 * *", "value 32 out of range 1-31 in the day-of-month field"},
      {"0 0 * 13 *", "value 13 out of range 1-12 in the month field"},
      {"0 0 * 0 *", "value 0 out of range 1-12 in the month field"},
      {"0 0 * * 8", "value 8 out of range 0-7 in the day-of-week field"},
      {"60 * * * * *", "value 60 out of range 0-59 in the second field"},
      {"0 * * * * 9", "value 9 out of range 0-7 in the day-of-week field"},
      {"99999999999999999999 * * * *", "out of range 0-59 in the minute field"},
      {"0 0 * FOO *", "unknown name 'FOO' in the month field (use JAN-DEC)"},
      {"0 0 * JANUARY *", "unknown name 'JANUARY' in the month field"},
      {"0 0 * * MONDAY", "unknown name 'MONDAY' in the day-of-week field (use SUN-SAT)"},
      {"0 0 * MON *", "unknown name 'MON' in the month field"},
      {"MON * * * *", "'MON' is not a number in the minute field"},
      {"0 0 JAN * *", "'JAN' is not a number in the day-of-month field"},
      {"5-1 * * * *", "range 5-1 is backwards in the minute field"},
      {"0 0 * DEC-JAN *", "range DEC-JAN is backwards in the month field"},
      {"1,,2 * * * *", "empty list item in the minute field"},
      {"1, * * * *", "empty list item in the minute field"},
      {",1 * * * *", "empty list item in the minute field"},
      {"*/ * * * *", "missing step after '/' in the minute field"},
      {"*/61 * * * *", "step 61 out of range 1-60 in the minute field"},
      {"0 */25 * * *", "step 25 out of range 1-24 in the hour field"},
      {"1-2-3 * * * *", "unexpected '-' in the minute field"},
      {"? * * * *", "unexpected '?' in the minute field"},
      {"-1 * * * *", "unexpected '-' in the minute field"},
      {"1/x * * * *", "missing step after '/' in the minute field"},
      {"0 0 L * *", "'L' is not a number in the day-of-month field"},
      {"0 0 * * 1#2", "unexpected '#' in the day-of-week field"},
      {"* 5- * * *", "missing value in the hour field"},
      {"@reboot", "bad cron expression '@reboot': unknown macro"},
      {"@daily 0", "unknown macro"},
      {"@", "unknown macro"},
      {"", "empty cron expression"},
      {"   ", "empty cron expression"},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    cron_t *c = (cron_t *)1;
    err_t e = {0};
    int rc = cron_parse(rows[i].expr, "UTC", &c, &e);
    if (rc != ERR_INVALID) FAILF("\"%s\": rc %d, expected ERR_INVALID", rows[i].expr, rc);
    CHECK_CONTAINS(e.msg, rows[i].fragment);
    CHECK(c == NULL);
  }
  err_t e;
  cron_t *c;
  CHECK_INT_EQ(cron_parse(NULL, NULL, &c, &e), ERR_INVALID);
  char big[2000];
  memset(big, '1', sizeof big - 1);
  big[sizeof big - 1] = 0;
  CHECK_INT_EQ(cron_parse(big, NULL, &c, &e), ERR_INVALID);
  CHECK_CONTAINS(e.msg, "too long");
}

TEST(bad_time_zones) {
  cron_t *c = (cron_t *)1;
  err_t e = {0};
  CHECK_INT_EQ(cron_parse("* * * * *", "Mars/Olympus", &c, &e), ERR_NOTFOUND);
  CHECK_STR_EQ(e.msg, "unknown time zone 'Mars/Olympus'");
  CHECK(c == NULL);
  CHECK_INT_EQ(cron_parse("* * * * *", "../../etc/passwd", &c, &e), ERR_INVALID);
  CHECK_CONTAINS(e.msg, "invalid time zone name");
  /* The expression is checked first. */
  CHECK_INT_EQ(cron_parse("* * *", "Mars/Olympus", &c, &e), ERR_INVALID);
  CHECK_CONTAINS(e.msg, "expected 5 or 6 fields");
}

TEST(has_seconds_and_fixed_time) {
  static const struct {
    const char *expr;
    int seconds, fixed;
  } rows[] = {
      {"* * * * *", 0, 0},      {"0 * * * * *", 1, 0},   {"30 2 * * *", 0, 1},
      {"*/5 2 * * *", 0, 1},    {"0 */2 * * *", 0, 0},   {"0 0 9-17 * * MON", 1, 1},
      {"@daily", 0, 1},         {"@hourly", 0, 0},       {"@weekly", 0, 1},
      {"0 *,3 * * *", 0, 0},    {"0 3,* * * *", 0, 1},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    cron_t *c = parse(rows[i].expr, NULL);
    if (!c) continue;
    if (cron_has_seconds(c) != rows[i].seconds || cron_is_fixed_time(c) != rows[i].fixed)
      FAILF("\"%s\": seconds %d fixed %d, expected %d %d", rows[i].expr, cron_has_seconds(c),
            cron_is_fixed_time(c), rows[i].seconds, rows[i].fixed);
    cron_free(c);
  }
  CHECK_INT_EQ(cron_next(NULL, 0), -1);
  cron_free(NULL);
}

TEST(out_of_range_instants) {
  cron_t *c = parse("* * * * *", "Europe/Paris");
  if (!c) return;
  CHECK_INT_EQ(cron_next(c, INT64_MAX), -1);
  CHECK_INT_EQ(cron_next(c, INT64_MIN), -1);
  CHECK_INT_EQ(cron_next(c, MS("9999-12-31T23:58:00Z")), MS("9999-12-31T23:59:00Z"));
  CHECK_INT_EQ(cron_next(c, -1), 0); /* strictly after -1 ms: the epoch itself */
  CHECK_INT_EQ(cron_next(c, 0), 60000);
  cron_free(c);
}

/* ---- threads and speed -------------------------------------------------- */

static cron_t *shared_cron;

static void *walk_year(void *arg) {
  int64_t *sum = arg, t = 1767225600000LL; /* 2026-01-01 */
  for (int i = 0; i < 20000; i++) {
    t = cron_next(shared_cron, t);
    *sum += t / 1000 % 1000003;
  }
  return NULL;
}

TEST(one_cron_shared_by_threads) {
  shared_cron = parse("*/7 1-3 * * *", "Europe/Paris");
  if (!shared_cron) return;
  int64_t want = 0, sums[4] = {0};
  walk_year(&want);
  pthread_t th[4];
  for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, walk_year, &sums[i]);
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    CHECK_INT_EQ(sums[i], want);
  }
  cron_free(shared_cron);
}

TEST(next_is_fast) {
  static const struct {
    const char *expr, *zone, *after;
  } rows[] = {
      {"*/5 * * * *", "Europe/Paris", "2026-01-01T00:00:00Z"},
      {"30 2 * * *", "Europe/Paris", "2026-01-01T00:00:00Z"},
      {"0 9 * * MON-FRI", "America/New_York", "2045-01-01T00:00:00Z"},
      {"0 0 1 * *", "Australia/Lord_Howe", "2026-01-01T00:00:00Z"},
      {"0 0 29 2 *", "Europe/Paris", "2026-01-01T00:00:00Z"},
      {"*/10 * * * * *", "UTC", "2026-01-01T00:00:00Z"},
  };
  double worst = 0;
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    cron_t *c = parse(rows[i].expr, rows[i].zone);
    if (!c) continue;
    int64_t t = MS(rows[i].after);
    int n = 0;
    uint64_t t0 = units_mono_ns();
    for (int k = 0; k < 2000; k++) {
      t = cron_next(c, t);
      n++;
      if (t < 0) t = MS(rows[i].after); /* start over */
    }
    double ns = (double)(units_mono_ns() - t0) / n;
    printf("  %-18s %-20s %8.0f ns/call\n", rows[i].expr, rows[i].zone, ns);
    if (ns > worst) worst = ns;
    cron_free(c);
  }
  /* Nothing within 5 years: the whole horizon is searched. */
  cron_t *c = parse("0 0 29 2 *", "Europe/Paris");
  if (c) {
    int n = 200;
    uint64_t t0 = units_mono_ns();
    for (int k = 0; k < n; k++) CHECK_INT_EQ(cron_next(c, MS("2096-03-01T00:00:00Z")), -1);
    double ns = (double)(units_mono_ns() - t0) / n;
    printf("  %-18s %-20s %8.0f ns/call (none in 5 years)\n", "0 0 29 2 *", "Europe/Paris", ns);
    if (ns > worst) worst = ns;
    cron_free(c);
  }
  /* Generous for sanitizer builds; a plain build is about 100 times faster. */
  CHECK(worst < 1e6);
}

int main(void) {
  RUN(next_fire_times_table);
  RUN(dst_sequences_no_double_no_missing_run);
  RUN(fixed_daily_jobs_run_once_every_local_day);
  RUN(interval_jobs_keep_their_rhythm);
  RUN(agrees_with_brute_force);
  RUN(invalid_expressions_name_the_problem);
  RUN(bad_time_zones);
  RUN(has_seconds_and_fixed_time);
  RUN(out_of_range_instants);
  RUN(one_cron_shared_by_threads);
  RUN(next_is_fast);
  tz_free_all();
  return test_summary();
}
