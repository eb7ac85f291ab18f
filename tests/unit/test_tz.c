/* Unit tests for tz.c: offsets from real zone files (tables and POSIX
** footers), local <-> UTC conversion, name checks, the cache, crafted and
** corrupt TZif files, and a cross-check of every installed zone against the
** C library (which the engine itself must not use: it is process-global). */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/tz.h"
#include "base/units.h"
#include "test.h"

/* Seconds since the epoch of an RFC 3339 time; the test fails on bad input. */
static int64_t T(const char *s) {
  int64_t ms;
  err_t e;
  if (units_parse_rfc3339(s, &ms, &e)) {
    FAILF("bad time in test table: %s", s);
    return 0;
  }
  return ms / 1000;
}

static tz_t *load(const char *name) {
  tz_t *z = NULL;
  err_t e = {0};
  if (tz_load(name, &z, &e)) FAILF("tz_load(%s): %s", name, e.msg);
  return z;
}

TEST(utc_and_default) {
  const char *names[] = {NULL, "", "UTC", "Etc/UTC"};
  for (int i = 0; i < 4; i++) {
    tz_t *z = load(names[i]);
    if (!z) continue;
    int dst = -1;
    CHECK_INT_EQ(tz_offset(z, T("2026-07-01T12:00:00Z"), &dst), 0);
    CHECK_INT_EQ(dst, 0);
    CHECK_INT_EQ(tz_offset(z, T("2061-01-01T00:00:00Z"), NULL), 0);
  }
  tz_t *z = load(NULL);
  CHECK_STR_EQ(tz_name(z), "UTC");
  CHECK(load("UTC") == z);
}

/* Expected values from Python's zoneinfo (an independent reader of the same
** files). Years after 2037 come from the footer of the files. */
static const struct {
  const char *zone, *utc;
  int off, dst;
} OFFSETS[] = {
    {"Europe/Paris", "2026-01-15T12:00:00Z", 3600, 0},
    {"Europe/Paris", "2026-07-01T12:00:00Z", 7200, 1},
    {"Europe/Paris", "2026-03-29T00:59:59Z", 3600, 0},
    {"Europe/Paris", "2026-03-29T01:00:00Z", 7200, 1},
    {"Europe/Paris", "2026-10-25T00:59:59Z", 7200, 1},
    {"Europe/Paris", "2026-10-25T01:00:00Z", 3600, 0},
    {"Europe/Paris", "2045-03-26T00:59:59Z", 3600, 0},
    {"Europe/Paris", "2045-03-26T01:00:00Z", 7200, 1},
    {"Europe/Paris", "2045-10-29T00:59:59Z", 7200, 1},
    {"Europe/Paris", "2045-10-29T01:00:00Z", 3600, 0},
    {"Europe/Paris", "2100-07-01T00:00:00Z", 7200, 1},
    {"Europe/Paris", "1975-07-01T00:00:00Z", 3600, 0},
    {"Europe/Paris", "1944-07-01T00:00:00Z", 7200, 1},
    {"America/New_York", "2026-03-08T06:59:59Z", -18000, 0},
    {"America/New_York", "2026-03-08T07:00:00Z", -14400, 1},
    {"America/New_York", "2026-11-01T05:59:59Z", -14400, 1},
    {"America/New_York", "2026-11-01T06:00:00Z", -18000, 0},
    {"America/New_York", "2045-03-12T06:59:59Z", -18000, 0},
    {"America/New_York", "2045-03-12T07:00:00Z", -14400, 1},
    {"America/New_York", "2045-11-05T05:59:59Z", -14400, 1},
    {"America/New_York", "2045-11-05T06:00:00Z", -18000, 0},
    {"America/New_York", "1960-01-01T00:00:00Z", -18000, 0},
    {"Australia/Lord_Howe", "2026-04-04T14:59:59Z", 39600, 1},
    {"Australia/Lord_Howe", "2026-04-04T15:00:00Z", 37800, 0},
    {"Australia/Lord_Howe", "2026-10-03T15:29:59Z", 37800, 0},
    {"Australia/Lord_Howe", "2026-10-03T15:30:00Z", 39600, 1},
    {"Australia/Lord_Howe", "2050-01-01T00:00:00Z", 39600, 1},
    {"Australia/Lord_Howe", "2050-06-01T00:00:00Z", 37800, 0},
    {"Asia/Kolkata", "2026-06-01T00:00:00Z", 19800, 0},
    {"Asia/Kolkata", "2045-06-01T00:00:00Z", 19800, 0},
    {"Asia/Kolkata", "1942-06-01T00:00:00Z", 19800, 0},
};

TEST(offsets_table) {
  for (size_t i = 0; i < sizeof OFFSETS / sizeof OFFSETS[0]; i++) {
    tz_t *z = load(OFFSETS[i].zone);
    if (!z) continue;
    int dst = -1;
    int off = tz_offset(z, T(OFFSETS[i].utc), &dst);
    if (off != OFFSETS[i].off || dst != OFFSETS[i].dst)
      FAILF("%s at %s: offset %d dst %d, expected %d dst %d", OFFSETS[i].zone, OFFSETS[i].utc,
            off, dst, OFFSETS[i].off, OFFSETS[i].dst);
  }
}

/* Periods: the footer's transitions are reported as period bounds too. */
TEST(periods_reach_the_next_transition) {
  tz_t *z = load("Europe/Paris");
  if (!z) return;
  tz_period_t p;
  tz_period(z, T("2026-07-01T00:00:00Z"), &p); /* from the table */
  CHECK_INT_EQ(p.start, T("2026-03-29T01:00:00Z"));
  CHECK_INT_EQ(p.end, T("2026-10-25T01:00:00Z"));
  CHECK_INT_EQ(p.utoff, 7200);
  tz_period(z, T("2045-12-01T00:00:00Z"), &p); /* from the footer */
  CHECK_INT_EQ(p.start, T("2045-10-29T01:00:00Z"));
  CHECK_INT_EQ(p.end, T("2046-03-25T01:00:00Z"));
  CHECK_INT_EQ(p.utoff, 3600);
  CHECK_INT_EQ(p.is_dst, 0);
  z = load("Asia/Kolkata");
  if (!z) return;
  tz_period(z, T("2045-12-01T00:00:00Z"), &p); /* footer without DST */
  CHECK_INT_EQ(p.start, T("1945-10-14T17:30:00Z")); /* the table's last change */
  CHECK(p.end == INT64_MAX);
  CHECK_INT_EQ(p.utoff, 19800);
  /* Absurd instants do not overflow. */
  CHECK_INT_EQ(tz_offset(z, INT64_MAX, NULL), 19800);
  CHECK_INT_EQ(tz_offset(load("Europe/Paris"), INT64_MIN, NULL), 561); /* LMT */
  tz_period(load("America/New_York"), INT64_MAX, &p);
  CHECK(p.end == INT64_MAX);
}

TEST(local_to_utc_gaps_and_folds) {
  static const struct {
    const char *zone, *local; /* wall clock, written as if UTC */
    int n;
    const char *first, *second;
  } rows[] = {
      {"Europe/Paris", "2026-07-01T12:00:00Z", 1, "2026-07-01T10:00:00Z", NULL},
      {"Europe/Paris", "2026-03-29T01:59:59Z", 1, "2026-03-29T00:59:59Z", NULL},
      {"Europe/Paris", "2026-03-29T02:00:00Z", 0, "2026-03-29T01:00:00Z", NULL}, /* gap */
      {"Europe/Paris", "2026-03-29T02:30:00Z", 0, "2026-03-29T01:00:00Z", NULL},
      {"Europe/Paris", "2026-03-29T03:00:00Z", 1, "2026-03-29T01:00:00Z", NULL},
      {"Europe/Paris", "2026-10-25T02:30:00Z", 2, "2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z"},
      {"Europe/Paris", "2026-10-25T03:00:00Z", 1, "2026-10-25T02:00:00Z", NULL},
      {"Europe/Paris", "2045-03-26T02:30:00Z", 0, "2045-03-26T01:00:00Z", NULL},
      {"Europe/Paris", "2045-10-29T02:00:00Z", 2, "2045-10-29T00:00:00Z", "2045-10-29T01:00:00Z"},
      {"America/New_York", "2026-03-08T02:15:00Z", 0, "2026-03-08T07:00:00Z", NULL},
      {"America/New_York", "2026-11-01T01:30:00Z", 2, "2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z"},
      {"Australia/Lord_Howe", "2026-10-04T02:15:00Z", 0, "2026-10-03T15:30:00Z", NULL},
      {"Australia/Lord_Howe", "2026-04-05T01:45:00Z", 2, "2026-04-04T14:45:00Z", "2026-04-04T15:15:00Z"},
      {"Asia/Kolkata", "2026-01-01T00:00:00Z", 1, "2025-12-31T18:30:00Z", NULL},
      {"UTC", "2026-01-01T00:00:00Z", 1, "2026-01-01T00:00:00Z", NULL},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    tz_t *z = load(rows[i].zone);
    if (!z) continue;
    int64_t out[2] = {0, 0};
    int n = tz_local_to_utc(z, T(rows[i].local), out);
    int ok = n == rows[i].n && out[0] == T(rows[i].first) &&
             (!rows[i].second || out[1] == T(rows[i].second));
    if (!ok) {
      char a[40], b[40];
      units_rfc3339(out[0] * 1000, a, sizeof a);
      units_rfc3339(out[1] * 1000, b, sizeof b);
      FAILF("%s local %s: n=%d %s %s, expected n=%d %s %s", rows[i].zone, rows[i].local, n, a,
            n == 2 ? b : "", rows[i].n, rows[i].first, rows[i].second ? rows[i].second : "");
    }
  }
}

TEST(unknown_zone) {
  tz_t *z = (tz_t *)1;
  err_t e = {0};
  CHECK_INT_EQ(tz_load("Mars/Olympus", &z, &e), ERR_NOTFOUND);
  CHECK_STR_EQ(e.msg, "unknown time zone 'Mars/Olympus'");
  CHECK(z == NULL);
  CHECK_INT_EQ(tz_load("Europe", &z, &e), ERR_NOTFOUND); /* a directory */
  CHECK_CONTAINS(e.msg, "unknown time zone 'Europe'");
  CHECK_INT_EQ(tz_load("zone.tab", &z, &e), ERR_NOTFOUND); /* not a TZif file */
  CHECK_CONTAINS(e.msg, "unknown time zone 'zone.tab'");
  CHECK_INT_EQ(tz_load("right/UTC", &z, &e), ERR_INVALID); /* leap seconds */
  CHECK_CONTAINS(e.msg, "leap seconds");
}

TEST(path_traversal_refused) {
  static const char *bad[] = {"../etc/passwd", "/etc/passwd", "Europe/../../etc/passwd",
                              "Europe/..",     "..",          "./UTC",
                              "Europe//Paris", "Europe/Paris/", "Europe/Par is",
                              "Europe\\Paris", "Europe/Paris\n"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tz_t *z = NULL;
    err_t e = {0};
    int rc = tz_load(bad[i], &z, &e);
    if (rc != ERR_INVALID) FAILF("tz_load(\"%s\") = %d, expected ERR_INVALID", bad[i], rc);
    CHECK_CONTAINS(e.msg, "invalid time zone name");
    CHECK(z == NULL);
  }
  char longname[400];
  memset(longname, 'a', sizeof longname - 1);
  longname[sizeof longname - 1] = 0;
  tz_t *z;
  err_t e;
  CHECK_INT_EQ(tz_load(longname, &z, &e), ERR_INVALID);
  CHECK_CONTAINS(e.msg, "too long");
}

static const char *THREAD_ZONES[] = {"Europe/Paris", "America/New_York", "Asia/Kolkata",
                                     "Australia/Lord_Howe"};

static void *thread_load(void *arg) {
  tz_t **got = arg;
  for (int round = 0; round < 50; round++)
    for (int i = 0; i < 4; i++) {
      tz_t *z = NULL;
      err_t e;
      if (tz_load(THREAD_ZONES[i], &z, &e)) return NULL;
      if (got[i] && got[i] != z) return NULL;
      got[i] = z;
      if (tz_offset(z, 1800000000 + round * 86400, NULL) == 12345) return NULL;
    }
  return arg;
}

TEST(cache_is_shared_across_threads) {
  tz_free_all();
  enum { N = 8 };
  pthread_t th[N];
  tz_t *got[N][4];
  memset(got, 0, sizeof got);
  for (int i = 0; i < N; i++) pthread_create(&th[i], NULL, thread_load, got[i]);
  for (int i = 0; i < N; i++) {
    void *r;
    pthread_join(th[i], &r);
    CHECK(r == got[i]);
  }
  for (int i = 1; i < N; i++)
    for (int k = 0; k < 4; k++) CHECK(got[i][k] == got[0][k] && got[0][k]);
  tz_free_all();
}

/* ---- crafted files --------------------------------------------------- */

static char tmpdir[64];

static void put32(uint8_t **p, uint32_t v) {
  (*p)[0] = v >> 24, (*p)[1] = v >> 16, (*p)[2] = v >> 8, (*p)[3] = v;
  *p += 4;
}

/* A TZif file: version '\0' (1) or '2'.., the given transitions and types
** (abbreviation "XX" for all), then for v2+ the footer. Returns its size. */
static size_t build_tzif(uint8_t *buf, char version, int nt, const int64_t *times,
                         const uint8_t *idx, int ntypes, const int32_t *utoff,
                         const uint8_t *isdst, const char *footer) {
  uint8_t *p = buf;
  for (int part = 0; part < (version ? 2 : 1); part++) {
    int tsize = part ? 8 : 4;
    memcpy(p, "TZif", 4);
    p[4] = (uint8_t)version;
    memset(p + 5, 0, 15);
    p += 20;
    put32(&p, 0), put32(&p, 0), put32(&p, 0); /* isutcnt isstdcnt leapcnt */
    put32(&p, (uint32_t)nt), put32(&p, (uint32_t)ntypes), put32(&p, 3);
    for (int i = 0; i < nt; i++) {
      if (tsize == 8) put32(&p, (uint32_t)((uint64_t)times[i] >> 32));
      put32(&p, (uint32_t)times[i]);
    }
    for (int i = 0; i < nt; i++) *p++ = idx[i];
    for (int i = 0; i < ntypes; i++) {
      put32(&p, (uint32_t)utoff[i]);
      *p++ = isdst[i];
      *p++ = 0;
    }
    memcpy(p, "XX", 3);
    p += 3;
  }
  if (version) p += sprintf((char *)p, "\n%s\n", footer);
  return (size_t)(p - buf);
}

static int write_file(const char *name, const uint8_t *buf, size_t n) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  fwrite(buf, 1, n, f);
  fclose(f);
  return 0;
}

/* Load name from the crafted directory; returns the tz_load code. */
static int load_crafted(const char *name, tz_t **z, err_t *e) {
  setenv("TZDIR", tmpdir, 1);
  int rc = tz_load(name, z, e);
  unsetenv("TZDIR");
  return rc;
}

static int make_tmpdir(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/ml_tz_XXXXXX");
  if (!mkdtemp(tmpdir)) {
    FAILF("mkdtemp: %s", strerror(errno));
    return -1;
  }
  return 0;
}

static void remove_tmpdir(void) {
  DIR *d = opendir(tmpdir);
  if (!d) return;
  struct dirent *de;
  char path[512];
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "%s/%s", tmpdir, de->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(tmpdir);
}

/* Footers with each kind of POSIX rule, in files with no transitions (so
** the footer rules all instants), checked at instants around their changes. */
TEST(posix_footer_rules) {
  static const struct {
    const char *footer, *utc;
    int off, dst;
  } rows[] = {
      {"CET-1CEST,M3.5.0,M10.5.0/3", "2045-03-26T00:59:59Z", 3600, 0},
      {"CET-1CEST,M3.5.0,M10.5.0/3", "2045-03-26T01:00:00Z", 7200, 1},
      {"CET-1CEST,M3.5.0,M10.5.0/3", "2045-10-29T00:59:59Z", 7200, 1},
      {"CET-1CEST,M3.5.0,M10.5.0/3", "2045-10-29T01:00:00Z", 3600, 0},
      {"EST5EDT,M3.2.0,M11.1.0", "2045-03-12T07:00:00Z", -14400, 1},
      {"EST5EDT", "2045-03-12T07:00:00Z", -14400, 1}, /* default US rules */
      {"EST5EDT", "2045-03-12T06:59:59Z", -18000, 0},
      /* Southern hemisphere, 30-minute DST. */
      {"<+1030>-10:30<+11>-11,M10.1.0,M4.1.0", "2050-01-01T00:00:00Z", 39600, 1},
      {"<+1030>-10:30<+11>-11,M10.1.0,M4.1.0", "2050-06-01T00:00:00Z", 37800, 0},
      {"<+1030>-10:30<+11>-11,M10.1.0,M4.1.0", "2050-12-31T23:00:00Z", 39600, 1},
      /* Jn never counts Feb 29: J60 is March 1, also in leap years. */
      {"AAA0BBB,J60/0,J300/0", "2028-02-29T23:59:59Z", 0, 0},
      {"AAA0BBB,J60/0,J300/0", "2028-03-01T00:00:00Z", 3600, 1},
      {"AAA0BBB,J60/0,J300/0", "2027-03-01T00:00:00Z", 3600, 1},
      /* n counts it, from 0: day 59 is Feb 29 in 2028, March 1 in 2027. */
      {"AAA0BBB,59/0,300/0", "2028-02-28T23:59:59Z", 0, 0},
      {"AAA0BBB,59/0,300/0", "2028-02-29T00:00:00Z", 3600, 1},
      {"AAA0BBB,59/0,300/0", "2027-02-28T23:59:59Z", 0, 0},
      {"AAA0BBB,59/0,300/0", "2027-03-01T00:00:00Z", 3600, 1},
      /* Negative rule times (America/Nuuk): 23:00 the day before. */
      {"<-02>2<-01>,M3.5.0/-1,M10.5.0/0", "2045-03-26T00:59:59Z", -7200, 0},
      {"<-02>2<-01>,M3.5.0/-1,M10.5.0/0", "2045-03-26T01:00:00Z", -3600, 1},
      {"<-02>2<-01>,M3.5.0/-1,M10.5.0/0", "2045-10-29T00:59:59Z", -3600, 1},
      {"<-02>2<-01>,M3.5.0/-1,M10.5.0/0", "2045-10-29T01:00:00Z", -7200, 0},
      /* Version 3 hours beyond 24: 26:00 is 02:00 the next day. */
      {"AAA0BBB,M3.2.0/26,M11.1.0/-26", "2045-03-13T01:59:59Z", 0, 0},
      {"AAA0BBB,M3.2.0/26,M11.1.0/-26", "2045-03-13T02:00:00Z", 3600, 1},
      /* DST all year round. */
      {"EST5EDT,0/0,J365/25", "2045-01-01T00:00:00Z", -14400, 1},
      {"EST5EDT,0/0,J365/25", "2045-07-01T00:00:00Z", -14400, 1},
      {"EST5EDT,0/0,J365/25", "2045-12-31T23:59:59Z", -14400, 1},
      /* No DST. */
      {"<+0545>-5:45", "2045-07-01T00:00:00Z", 20700, 0},
      {"<-03>3", "2045-07-01T00:00:00Z", -10800, 0},
  };
  if (make_tmpdir()) return;
  uint8_t buf[512];
  int32_t utoff = 0;
  uint8_t isdst = 0;
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    char name[32];
    snprintf(name, sizeof name, "footer%zu", i);
    size_t n = build_tzif(buf, '2', 0, NULL, NULL, 1, &utoff, &isdst, rows[i].footer);
    write_file(name, buf, n);
    tz_t *z;
    err_t e = {0};
    if (load_crafted(name, &z, &e)) {
      FAILF("footer \"%s\": %s", rows[i].footer, e.msg);
      continue;
    }
    int dst = -1, off = tz_offset(z, T(rows[i].utc), &dst);
    if (off != rows[i].off || dst != rows[i].dst)
      FAILF("footer \"%s\" at %s: offset %d dst %d, expected %d dst %d", rows[i].footer,
            rows[i].utc, off, dst, rows[i].off, rows[i].dst);
  }
  static const char *bad[] = {"CET",
                              "CET-1CEST,M13.5.0,M10.5.0",
                              "CET-1CEST,M3.5.0",
                              "CET-1CEST,M3.6.0,M10.5.0",
                              "CET-1CEST,M3.5.7,M10.5.0",
                              "CET-1CEST,J0,J100",
                              "CET-1CEST,366,100",
                              "CET-1CEST,M3.5.0/168,M10.5.0",
                              "CET-25",
                              "<+05-5",
                              "C-1",
                              "CET-1CEST,M3.5.0,M10.5.0x"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char name[32];
    snprintf(name, sizeof name, "bad%zu", i);
    write_file(name, buf, build_tzif(buf, '2', 0, NULL, NULL, 1, &utoff, &isdst, bad[i]));
    tz_t *z;
    err_t e = {0};
    int rc = load_crafted(name, &z, &e);
    if (rc != ERR_INVALID) FAILF("footer \"%s\" accepted (rc %d)", bad[i], rc);
    else CHECK_CONTAINS(e.msg, "footer");
  }
  tz_free_all();
  remove_tmpdir();
}

/* Version 1 files (32-bit times, no footer) and the table/footer handover. */
TEST(version1_and_table_then_footer) {
  if (make_tmpdir()) return;
  uint8_t buf[512];
  int64_t times[2] = {T("2000-03-26T01:00:00Z"), T("2000-10-29T01:00:00Z")};
  uint8_t idx[2] = {1, 0};
  int32_t utoff[2] = {3600, 7200};
  uint8_t isdst[2] = {0, 1};
  write_file("v1", buf, build_tzif(buf, 0, 2, times, idx, 2, utoff, isdst, NULL));
  write_file("v2", buf,
             build_tzif(buf, '2', 2, times, idx, 2, utoff, isdst, "CET-1CEST,M3.5.0,M10.5.0/3"));
  write_file("v2empty", buf, build_tzif(buf, '2', 2, times, idx, 2, utoff, isdst, ""));
  tz_t *v1, *v2, *v2e;
  err_t e = {0};
  if (load_crafted("v1", &v1, &e) || load_crafted("v2", &v2, &e) ||
      load_crafted("v2empty", &v2e, &e)) {
    FAILF("%s", e.msg);
    remove_tmpdir();
    return;
  }
  CHECK_INT_EQ(tz_offset(v1, T("1999-07-01T00:00:00Z"), NULL), 3600); /* type 0 before */
  CHECK_INT_EQ(tz_offset(v1, T("2000-07-01T00:00:00Z"), NULL), 7200);
  CHECK_INT_EQ(tz_offset(v1, T("2001-07-01T00:00:00Z"), NULL), 3600); /* last type after */
  CHECK_INT_EQ(tz_offset(v2, T("2000-07-01T00:00:00Z"), NULL), 7200);
  CHECK_INT_EQ(tz_offset(v2, T("2000-12-01T00:00:00Z"), NULL), 3600);
  CHECK_INT_EQ(tz_offset(v2, T("2001-07-01T00:00:00Z"), NULL), 7200); /* footer */
  CHECK_INT_EQ(tz_offset(v2e, T("2001-07-01T00:00:00Z"), NULL), 3600); /* empty footer */
  tz_period_t p;
  tz_period(v2, T("2000-12-01T00:00:00Z"), &p);
  CHECK_INT_EQ(p.start, T("2000-10-29T01:00:00Z"));
  CHECK_INT_EQ(p.end, T("2001-03-25T01:00:00Z"));
  tz_free_all();
  remove_tmpdir();
}

/* Every truncation of a real file fails cleanly, and random corruption
** never crashes (the sanitizer build checks the memory accesses). */
TEST(corrupt_files_fail_cleanly) {
  FILE *f = fopen("/usr/share/zoneinfo/Europe/Paris", "rb");
  if (!f) {
    FAILF("cannot read Europe/Paris");
    return;
  }
  static uint8_t orig[8192], buf[8192];
  size_t n = fread(orig, 1, sizeof orig, f);
  fclose(f);
  if (make_tmpdir()) return;
  for (size_t len = 0; len < n; len++) {
    write_file("trunc", orig, len);
    tz_t *z = NULL;
    err_t e = {0};
    int rc = load_crafted("trunc", &z, &e);
    if (rc == 0) FAILF("truncated to %zu of %zu bytes, still accepted", len, n);
    else if (len >= 4 && rc != ERR_INVALID) FAILF("truncated to %zu: rc %d (%s)", len, rc, e.msg);
  }
  uint32_t seed = 12345;
  int accepted = 0;
  for (int round = 0; round < 3000; round++) {
    memcpy(buf, orig, n);
    int flips = 1 + round % 4;
    for (int k = 0; k < flips; k++) {
      seed = seed * 1103515245u + 12345u;
      size_t at = (seed >> 8) % n;
      seed = seed * 1103515245u + 12345u;
      buf[at] ^= (uint8_t)(1u << ((seed >> 16) % 8));
    }
    write_file("flip", buf, n);
    tz_t *z = NULL;
    err_t e = {0};
    if (load_crafted("flip", &z, &e) == 0) {
      accepted++;
      /* Whatever it decoded must be usable. */
      int64_t out[2];
      for (int64_t t = -4000000000LL; t < 5000000000LL; t += 7777777) {
        tz_offset(z, t, NULL);
        tz_local_to_utc(z, t, out);
      }
      tz_free_all();
    }
  }
  CHECK(accepted > 0); /* flips in timestamps and abbreviations stay valid */
  remove_tmpdir();
}

/* ---- every installed zone against the C library ------------------------- */

typedef struct zlist {
  char **names;
  int n, cap;
} zlist_t;

static void collect(const char *root, const char *rel, zlist_t *out) {
  char path[1024];
  snprintf(path, sizeof path, "%s%s%s", root, *rel ? "/" : "", rel);
  DIR *d = opendir(path);
  if (!d) return;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char sub[512], full[1536];
    snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", de->d_name);
    if (!strcmp(sub, "right") || !strcmp(sub, "posix") || !strcmp(sub, "localtime") ||
        !strcmp(sub, "posixrules"))
      continue;
    snprintf(full, sizeof full, "%s/%s", root, sub);
    struct stat st;
    if (stat(full, &st)) continue;
    if (S_ISDIR(st.st_mode)) {
      collect(root, sub, out);
    } else if (S_ISREG(st.st_mode)) {
      FILE *f = fopen(full, "rb");
      char magic[4] = {0};
      if (f) {
        if (fread(magic, 1, 4, f) != 4) magic[0] = 0;
        fclose(f);
      }
      if (memcmp(magic, "TZif", 4)) continue;
      if (out->n == out->cap) {
        out->cap = out->cap ? out->cap * 2 : 256;
        out->names = realloc(out->names, sizeof(char *) * out->cap);
      }
      out->names[out->n++] = strdup(sub);
    }
  }
  closedir(d);
}

static int mismatches;

static void compare_libc(const char *name, tz_t *z, int64_t t) {
  time_t tt = (time_t)t;
  struct tm tm;
  if (!localtime_r(&tt, &tm)) return;
  int dst;
  int off = tz_offset(z, t, &dst);
  if (off != tm.tm_gmtoff || dst != (tm.tm_isdst > 0)) {
    if (++mismatches <= 10) {
      char s[40];
      units_rfc3339(t * 1000, s, sizeof s);
      FAILF("%s at %s: offset %d dst %d, C library says %ld dst %d", name, s, off, dst,
            tm.tm_gmtoff, tm.tm_isdst);
    }
  }
}

/* The C library reads the same files with different code. Compared: both
** sides of every transition from 1900 to 2200 (the table's and the footer's)
** plus pseudo-random instants. setenv("TZ") is fine in this single-threaded
** test; it is what the engine must avoid. */
TEST(every_zone_matches_the_c_library) {
  zlist_t zl = {0};
  collect("/usr/share/zoneinfo", "", &zl);
  CHECK(zl.n > 300);
  int64_t lo = T("1900-01-01T00:00:00Z"), hi = T("2200-01-01T00:00:00Z");
  long checks = 0;
  uint64_t seed = 42;
  for (int i = 0; i < zl.n; i++) {
    tz_t *z = NULL;
    err_t e = {0};
    if (tz_load(zl.names[i], &z, &e)) {
      FAILF("%s: %s", zl.names[i], e.msg);
      continue;
    }
    setenv("TZ", zl.names[i], 1);
    tzset();
    tz_period_t p;
    for (int64_t t = lo; t < hi;) {
      tz_period(z, t, &p);
      if (p.start > lo) {
        compare_libc(zl.names[i], z, p.start - 1);
        compare_libc(zl.names[i], z, p.start);
        checks += 2;
      }
      if (p.end == INT64_MAX) break;
      compare_libc(zl.names[i], z, p.start / 2 + p.end / 2);
      checks++;
      t = p.end;
    }
    for (int k = 0; k < 200; k++) {
      seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
      compare_libc(zl.names[i], z, lo + (int64_t)((seed >> 20) % (uint64_t)(hi - lo)));
      checks++;
    }
  }
  unsetenv("TZ");
  tzset();
  printf("  %d zones, %ld instants compared, %d mismatches\n", zl.n, checks, mismatches);
  for (int i = 0; i < zl.n; i++) free(zl.names[i]);
  free(zl.names);
  tz_free_all();
}

TEST(civil_calendar) {
  int64_t y;
  int m, d;
  CHECK_INT_EQ(tz_days_from_civil(1970, 1, 1), 0);
  CHECK_INT_EQ(tz_days_from_civil(2000, 3, 1), 11017);
  CHECK_INT_EQ(tz_days_from_civil(1969, 12, 31), -1);
  tz_civil_from_days(tz_days_from_civil(2028, 2, 29), &y, &m, &d);
  CHECK(y == 2028 && m == 2 && d == 29);
  tz_civil_from_days(-719468, &y, &m, &d); /* 0000-03-01 */
  CHECK(y == 0 && m == 3 && d == 1);
  CHECK_INT_EQ(tz_weekday(0), 4);                                 /* Thursday */
  CHECK_INT_EQ(tz_weekday(tz_days_from_civil(2026, 3, 29)), 0);   /* Sunday */
  CHECK_INT_EQ(tz_weekday(-1), 3);
  CHECK_INT_EQ(tz_days_in_month(2100, 2), 28);
  CHECK_INT_EQ(tz_days_in_month(2000, 2), 29);
  CHECK_INT_EQ(tz_days_in_month(2026, 12), 31);
  for (int64_t days = -800000; days < 800000; days += 97) {
    tz_civil_from_days(days, &y, &m, &d);
    if (tz_days_from_civil(y, m, d) != days) {
      FAILF("round trip of day %lld", (long long)days);
      break;
    }
  }
}

int main(void) {
  RUN(utc_and_default);
  RUN(offsets_table);
  RUN(periods_reach_the_next_transition);
  RUN(local_to_utc_gaps_and_folds);
  RUN(unknown_zone);
  RUN(path_traversal_refused);
  RUN(cache_is_shared_across_threads);
  RUN(posix_footer_rules);
  RUN(version1_and_table_then_footer);
  RUN(corrupt_files_fail_cleanly);
  RUN(every_zone_matches_the_c_library);
  RUN(civil_calendar);
  tz_free_all();
  return test_summary();
}
