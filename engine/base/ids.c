/*
** ids.c: ULIDs, SHA-256 digests and random numbers (see ids.h).
*/
#include "base/ids.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

static const char crockford[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

static pthread_mutex_t ulid_lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t ulid_last_ms = -1;
static unsigned char ulid_last_rand[10];

void ids_random(void *buf, size_t n) {
  unsigned char *p = buf;
  while (n > 0) {
    ssize_t got = getrandom(p, n, 0);
    if (got <= 0) break;
    p += got;
    n -= (size_t)got;
  }
  /* getrandom only fails on ancient kernels; a weak fallback keeps ids unique enough. */
  static unsigned long long x;
  if (n > 0 && !x) x = (unsigned long long)time(NULL) ^ (unsigned long long)(uintptr_t)&x;
  while (n > 0) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    *p++ = (unsigned char)x;
    n--;
  }
}

double ids_random_unit(void) {
  uint64_t r;
  ids_random(&r, sizeof r);
  return (double)(r >> 11) / 9007199254740992.0;
}

static void ulid_encode(const unsigned char b[16], char *out);

void ids_ulid(int64_t ms, char *out) {
  unsigned char b[16];
  pthread_mutex_lock(&ulid_lock);
  if (ms <= ulid_last_ms) {
    /* Same (or earlier) millisecond: increment the last random part, so
    ** ids from one process stay strictly increasing. */
    ms = ulid_last_ms;
    for (int i = 9; i >= 0; i--)
      if (++ulid_last_rand[i] != 0) break;
  } else {
    ids_random(ulid_last_rand, sizeof ulid_last_rand);
    ulid_last_ms = ms;
  }
  for (int i = 0; i < 6; i++) b[i] = (unsigned char)((uint64_t)ms >> (40 - 8 * i));
  memcpy(b + 6, ulid_last_rand, 10);
  pthread_mutex_unlock(&ulid_lock);
  ulid_encode(b, out);
}

/* See ids.h: the time part as ids_ulid's, the 80 other bits the start of
** the SHA-256 of key. */
void ids_ulid_derived(int64_t ms, const char *key, char *out) {
  unsigned char b[16], md[32];
  unsigned int mdlen = 0;
  EVP_Digest(key, strlen(key), md, &mdlen, EVP_sha256(), NULL);
  for (int i = 0; i < 6; i++) b[i] = (unsigned char)((uint64_t)ms >> (40 - 8 * i));
  memcpy(b + 6, md, 10);
  ulid_encode(b, out);
}

/* 128 bits into 26 base32 digits (out: 27 bytes with the NUL): from the
** last digit (the lowest 5 bits) up; the first carries the top 3 bits.
** (A bit at a time, it cost 2,600 instructions, 1.5% of a run's start.) */
static void ulid_encode(const unsigned char b[16], char *out) {
  uint64_t hi = 0, lo = 0;
  for (int i = 0; i < 8; i++) {
    hi = hi << 8 | b[i];
    lo = lo << 8 | b[8 + i];
  }
  for (int i = 25; i >= 0; i--) {
    out[i] = crockford[lo & 31];
    lo = lo >> 5 | hi << 59;
    hi >>= 5;
  }
  out[26] = 0;
}

void ids_sha256_hex(const void *data, size_t len, char *out) {
  unsigned char md[32];
  unsigned int mdlen = 0;
  EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL);
  for (unsigned i = 0; i < 32; i++) sprintf(out + 2 * i, "%02x", md[i]);
  out[64] = 0;
}
