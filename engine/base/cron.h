/*
** cron.h: cron schedules for skill triggers, e.g.
** { cron = "*\/30 * * * *", tz = "Europe/Paris" }.
**
** SYNTAX
**
** Five fields, "minute hour day-of-month month day-of-week", or six with a
** seconds field first. Ranges: second and minute 0-59, hour 0-23, day of
** month 1-31, month 1-12 or JAN-DEC, day of week 0-7 or SUN-SAT (0 and 7 are
** both Sunday). Names are case-insensitive. Each field is a comma-separated
** list of items, each one of:
**
**   *          every value
**   n          one value
**   a-b        a range, a <= b (in the day-of-week field "FRI-SUN" = "5-0"
**              is allowed and means 5-7)
**   *\/n a-b/n a/n   every n-th value of *, of a-b, or of a to the end
**
** (In these comments *\/ stands for star-slash, which would end a comment.)
**
** Macros: @yearly = @annually = "0 0 1 1 *", @monthly = "0 0 1 * *",
** @weekly = "0 0 * * 0", @daily = @midnight = "0 0 * * *",
** @hourly = "0 * * * *".
**
** Day of month and day of week: if either field starts with '*' (so "*" or
** "*\/n") a day must match both; if neither does, a day matches when either
** field matches ("0 0 1,15 * MON" fires on the 1st, the 15th and every
** Monday), as in Vixie cron.
**
** Schedules that can never fire ("0 0 30 2 *": February has no 30th) are
** rejected when parsed. Feb 29 is allowed (leap years).
**
** TIME ZONES AND DAYLIGHT SAVING TIME
**
** Fields are matched against the wall clock of the schedule's zone (UTC by
** default). Where the zone's clock jumps, we follow cronie / Vixie cron, and
** tell two kinds of jobs apart by the hour field:
**
**   fixed-time jobs: the hour field does not start with '*' ("30 2 * * *",
**     "0 9-17 * * MON-FRI", "@daily", and also "*\/10 2 * * *");
**   interval jobs: the hour field starts with '*' ("*\/15 * * * *",
**     "0 *\/2 * * *", "@hourly").
**
** (cronie also counts a minute field starting with '*' as "wildcard"; we go
** by the hour field alone, so "*\/10 2 * * *" means "during the 2 o'clock
** hour, once": one run in a gap, first occurrence only in a fold.)
**
** Spring forward (wall clock times skipped, e.g. 02:00-02:59 in Paris on the
** last Sunday of March): a fixed-time job due in the gap runs once, at the
** first instant after the gap (02:30 runs at 03:00 CEST = 01:00 UTC; if
** several of its times fall in the gap it still runs once there). An
** interval job has no runs in the gap; its next match after the gap runs
** normally.
**
** Fall back (wall clock times repeated, e.g. 02:00-02:59 twice in Paris on
** the last Sunday of October): a fixed-time job runs only at the first
** occurrence. An interval job runs at every real instant that matches, so
** "*\/30 * * * *" keeps firing every 30 minutes through both occurrences.
**
** Either way no instant gets two runs, and a fixed-time job neither skips
** nor repeats a day's run.
**
** cron_next() looks at most 5 years ahead and says "none" beyond (so
** "0 0 29 2 *" after Feb 29 2096 has none: 2100 is not a leap year and 2104
** is too far). A cron_t is immutable once parsed: any number of threads may
** use it.
*/
#ifndef ML_CRON_H
#define ML_CRON_H
#include <stdint.h>

#include "base/err.h"

typedef struct cron cron_t;

/* Parse expr for time zone tz (a zone name as for tz_load(); NULL or "" is
** UTC). On error returns ERR_INVALID with a message naming the expression,
** the field and the problem, e.g. "bad cron expression '*\/0 * * * *': step
** must be at least 1 in the minute field"; or the error of tz_load() for a
** bad zone (ERR_NOTFOUND "unknown time zone 'Mars/Olympus'"). */
int cron_parse(const char *expr, const char *tz, cron_t **out, err_t *e);

/* The first fire time strictly after after_ms (ms since the epoch), in ms
** (always a whole second), or -1 if there is none within 5 years. */
int64_t cron_next(const cron_t *c, int64_t after_ms);

/* 1 if the expression had a seconds field (six fields), else 0. */
int cron_has_seconds(const cron_t *c);

/* 1 if c is a fixed-time job for the DST rules above, 0 for an interval job. */
int cron_is_fixed_time(const cron_t *c);

/* Free c (NULL is fine). The zone it refers to stays cached. */
void cron_free(cron_t *c);

#endif
