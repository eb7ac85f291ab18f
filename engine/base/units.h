/*
** units.h: the units users write and read: durations ("500ms" "30s" "5m"
** "2h" "7d" or a number of seconds), sizes ("64KB" "1MB"), and times (unix
** milliseconds inside the engine, RFC 3339 in JSON and on the terminal).
*/
#ifndef ML_UNITS_H
#define ML_UNITS_H
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

/* Parse a duration: a number of seconds ("1.5") or a number with a unit
** (ms, s, m, h, d, w), possibly several ("1h30m"). *ms gets milliseconds. */
int units_duration(const char *s, int64_t *ms, err_t *e);

/* Parse a size: a number of bytes or a number with B, KB, MB, GB (powers of 1024). */
int units_size(const char *s, int64_t *bytes, err_t *e);

/* Wall-clock time in milliseconds since the epoch. */
int64_t units_now_ms(void);

/* The latest time (and longest duration) the engine keeps, in ms:
** 9999-12-31T23:59:59.999Z, and its negative the earliest. Far enough to
** mean "never", near enough that now plus it cannot overflow. */
#define UNITS_MS_MAX INT64_C(253402300799999)

/* A number of ms from Lua (a double) as an int64_t within
** [-UNITS_MS_MAX, UNITS_MS_MAX]: math.huge is "never", not the undefined
** conversion that made it -2^63 (a sleep of math.huge woke at once, and
** its wake time overflowed every sum with it). NaN is 0. */
int64_t units_ms_of(double v);

/* Monotonic time in nanoseconds, for measuring durations. */
uint64_t units_mono_ns(void);

/* Format ms since the epoch as RFC 3339 UTC with milliseconds into out (>= 32 bytes). */
void units_rfc3339(int64_t ms, char *out, size_t n);

/* Parse an RFC 3339 time ("2026-11-29T16:51:24Z", offsets and fractions allowed). */
int units_parse_rfc3339(const char *s, int64_t *ms, err_t *e);

/* Format a duration for people: "850ms", "1.2s", "3m12s", "2h05m", "3d4h". */
void units_fmt_duration(int64_t ms, char *out, size_t n);

/* Format a size for people: "512 B", "1.5 KB", "2.0 MB". */
void units_fmt_size(int64_t bytes, char *out, size_t n);

/* Format a size and the limit it went over, for "X, over the limit of Y":
** as units_fmt_size, or in bytes when rounding would show them equal
** ("1048577 bytes" and "1048576 bytes", not "1.0 MB" twice). */
void units_fmt_over(int64_t size, int64_t limit, char *size_out, char *limit_out, size_t n);

#endif
