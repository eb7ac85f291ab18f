/*
** tz.h: time zones, read from the system's TZif files (/usr/share/zoneinfo,
** or $TZDIR) by our own code, so that converting between an instant and a
** zone's wall clock touches no process-wide state (no setenv("TZ"), no
** localtime). Everything here is thread-safe.
**
** Instants are seconds since the Unix epoch (UTC). A "local" time is the
** wall clock of a zone written as seconds since 1970-01-01T00:00:00 on that
** wall clock, i.e. local = instant + UTC offset; broken-down dates come from
** tz_civil_from_days() on floor(local / 86400).
**
** A zone's history is a sequence of periods of constant UTC offset. At a
** transition where the offset grows (spring forward) some local times never
** happen (a gap); where it shrinks (fall back) some local times happen twice
** (a fold). tz_local_to_utc() reports both cases.
*/
#ifndef ML_TZ_H
#define ML_TZ_H
#include <stdint.h>

#include "base/err.h"

typedef struct tz tz_t;

/* A stretch of time with one UTC offset: instants in [start, end). start is
** INT64_MIN before the first known transition, end INT64_MAX when no further
** transition is known. */
typedef struct tz_period {
  int64_t start, end;
  int32_t utoff;  /* seconds east of UTC */
  int is_dst;
} tz_period_t;

/* Load the zone called name ("UTC", "Europe/Paris"; NULL or "" mean UTC).
** Zones are cached: *out is shared, immutable, and valid until tz_free_all().
** Errors: ERR_INVALID for a malformed name (".." components, a leading "/",
** odd characters) or a corrupt or unsupported file; ERR_NOTFOUND "unknown
** time zone 'X'" when there is no such zone; ERR_IO. */
int tz_load(const char *name, tz_t **out, err_t *e);

/* The name the zone was loaded under ("UTC" for the default). */
const char *tz_name(const tz_t *z);

/* UTC offset in seconds (east positive) at instant unix_s; *is_dst (may be
** NULL) gets 1 when daylight saving time is in effect. */
int tz_offset(const tz_t *z, int64_t unix_s, int *is_dst);

/* The period of constant offset that contains instant unix_s. */
void tz_period(const tz_t *z, int64_t unix_s, tz_period_t *p);

/* The instants whose wall clock in z reads local_s. Returns how many: 1
** usually, 2 in a fold (out[0] < out[1]: first and second occurrence), 0 in a
** gap, in which case out[0] is the first instant after the gap (the
** transition, whose wall clock reads the end of the gap). */
int tz_local_to_utc(const tz_t *z, int64_t local_s, int64_t out[2]);

/* Free every cached zone. Only call it when no tz_t (nor a cron_t, which
** holds one) is in use any more, e.g. at exit or between tests. */
void tz_free_all(void);

/* Proleptic Gregorian calendar: days since 1970-01-01 for a date (m 1-12,
** d 1-31; out-of-range days roll over), and back. Valid for any year that
** fits the result in int64_t. */
int64_t tz_days_from_civil(int64_t y, int m, int d);
void tz_civil_from_days(int64_t days, int64_t *y, int *m, int *d);

/* Day of week (0 = Sunday) of a day counted from 1970-01-01. */
int tz_weekday(int64_t days);

/* Days in month m (1-12) of year y. */
int tz_days_in_month(int64_t y, int m);

#endif
