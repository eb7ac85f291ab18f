/* Unit tests for units.c: durations, sizes and RFC 3339 times. */
#include "base/units.h"
#include "test.h"

#include <string.h>

#include <time.h>

static int64_t dur(const char *s) {
  int64_t ms = -1;
  err_t e;
  if (units_duration(s, &ms, &e)) return -1;
  return ms;
}

TEST(durations) {
  CHECK_INT_EQ(dur("500ms"), 500);
  CHECK_INT_EQ(dur("30s"), 30000);
  CHECK_INT_EQ(dur("5m"), 300000);
  CHECK_INT_EQ(dur("2h"), 7200000);
  CHECK_INT_EQ(dur("7d"), 604800000);
  CHECK_INT_EQ(dur("1.5"), 1500);
  CHECK_INT_EQ(dur("1h30m"), 5400000);
  CHECK_INT_EQ(dur("0.25s"), 250);
}

TEST(bad_durations_name_the_problem) {
  int64_t ms;
  err_t e;
  CHECK(units_duration("5 parsecs", &ms, &e) == ERR_INVALID);
  CHECK_CONTAINS(e.msg, "5 parsecs");
  CHECK(units_duration("5x", &ms, &e) == ERR_INVALID);
  CHECK_CONTAINS(e.msg, "unknown unit 'x'");
  CHECK(units_duration("", &ms, &e) == ERR_INVALID);
  CHECK(units_duration("-1s", &ms, &e) == ERR_INVALID);
}

TEST(sizes) {
  int64_t b;
  err_t e;
  CHECK(units_size("1MB", &b, &e) == 0);
  CHECK_INT_EQ(b, 1048576);
  CHECK(units_size("64KB", &b, &e) == 0);
  CHECK_INT_EQ(b, 65536);
  CHECK(units_size("100", &b, &e) == 0);
  CHECK_INT_EQ(b, 100);
  CHECK(units_size("3 lightyears", &b, &e) == ERR_INVALID);
  CHECK_CONTAINS(e.msg, "lightyears");
}

TEST(rfc3339_round_trip) {
  char s[40];
  units_rfc3339(1764435084123LL, s, sizeof s);
  CHECK_STR_EQ(s, "2025-11-29T16:51:24.123Z");
  int64_t ms;
  err_t e;
  CHECK(units_parse_rfc3339(s, &ms, &e) == 0);
  CHECK_INT_EQ(ms, 1764435084123LL);
  CHECK(units_parse_rfc3339("2025-11-29T18:51:24+02:00", &ms, &e) == 0);
  CHECK_INT_EQ(ms, 1764435084000LL);
  CHECK(units_parse_rfc3339("yesterday", &ms, &e) == ERR_INVALID);
  CHECK_CONTAINS(e.msg, "yesterday");
  /* A time of day without its zone is not read as UTC; a day the month
  ** lacks is no day (it became the next month's). A date alone is
  ** midnight UTC. */
  CHECK(units_parse_rfc3339("2026-12-03T07:30:00", &ms, &e) == ERR_INVALID);
  CHECK(strstr(e.msg, "no time zone") != NULL);
  CHECK(units_parse_rfc3339("2026-12-03 07:30", &ms, &e) == ERR_INVALID);
  CHECK(units_parse_rfc3339("2027-02-30T00:00:00Z", &ms, &e) == ERR_INVALID);
  CHECK(strstr(e.msg, "2027-02 has no day 30") != NULL);
  CHECK(units_parse_rfc3339("2028-02-29T00:00:00Z", &ms, &e) == 0);
  CHECK(units_parse_rfc3339("2100-02-29T00:00:00Z", &ms, &e) == ERR_INVALID);
  CHECK(units_parse_rfc3339("2026-12-03", &ms, &e) == 0 && ms == 1796256000000LL);
}

/* units_rfc3339 computes the date itself (and keeps the last second):
** it must agree with gmtime over the years it handles, whatever the order
** of the times it is given. */
TEST(rfc3339_agrees_with_gmtime) {
  char a[40], b[80];
  int64_t ms = -86400000LL * 400;
  uint64_t x = 88172645463325252ULL;
  for (int i = 0; i < 200000; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    /* Neighbours (the same second, the next one) and far jumps, 0 to 9999. */
    ms = i % 3 ? ms + (int64_t)(x % 2500) : (int64_t)(x % 253402300800000ULL);
    if (ms > 253402300799999LL) ms = 0;
    units_rfc3339(ms, a, sizeof a);
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    snprintf(b, sizeof b, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ms % 1000));
    if (strcmp(a, b)) {
      CHECK_STR_EQ(a, b);
      break;
    }
  }
  units_rfc3339(951782400000LL, a, sizeof a); /* a leap day */
  CHECK_STR_EQ(a, "2000-02-29T00:00:00.000Z");
  units_rfc3339(951782400999LL, a, sizeof a); /* the same second again */
  CHECK_STR_EQ(a, "2000-02-29T00:00:00.999Z");
  units_rfc3339(-1, a, sizeof a);
  CHECK_STR_EQ(a, "1969-12-31T23:59:59.999Z");
}

TEST(format_duration) {
  char s[32];
  units_fmt_duration(850, s, sizeof s);
  CHECK_STR_EQ(s, "850ms");
  units_fmt_duration(1234, s, sizeof s);
  CHECK_STR_EQ(s, "1.2s");
  units_fmt_duration(192000, s, sizeof s);
  CHECK_STR_EQ(s, "3m12s");
}

int main(void) {
  RUN(durations);
  RUN(bad_durations_name_the_problem);
  RUN(sizes);
  RUN(rfc3339_round_trip);
  RUN(rfc3339_agrees_with_gmtime);
  RUN(format_duration);
  return test_summary();
}
