/*
** ids.h: identifiers. Run and event ids are ULIDs (26 characters of
** Crockford base32: 48 bits of milliseconds then 80 random bits), so they
** sort by creation time. Skill versions are SHA-256 hex digests of the source.
*/
#ifndef ML_IDS_H
#define ML_IDS_H
#include <stddef.h>
#include <stdint.h>

#define IDS_ULID_LEN 26
#define IDS_SHA256_HEX 64

/* Write a new ULID for time ms into out (>= 27 bytes). Ids made in the same
** millisecond by one process increase monotonically. */
void ids_ulid(int64_t ms, char *out);

/* Write into out (>= 27 bytes) the ULID for time ms whose other 80 bits
** come from key (its SHA-256): the same key and time always give the same
** id (a child run made again by a replay of the step that creates it). */
void ids_ulid_derived(int64_t ms, const char *key, char *out);

/* Write the lowercase hex SHA-256 of data into out (>= 65 bytes). */
void ids_sha256_hex(const void *data, size_t len, char *out);

/* Fill buf with n random bytes from the OS (falls back to a seeded PRNG). */
void ids_random(void *buf, size_t n);

/* A uniformly distributed double in [0, 1) (for jitter). */
double ids_random_unit(void);

#endif
