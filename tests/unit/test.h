/*
** test.h: a small unit test harness. Each tests/unit/test_*.c file is its own
** executable (ctest runs it in its own process with a timeout). Define tests
** with TEST(name) { ... } and list them in main with RUN(name).
**
**   TEST(parses_seconds) { CHECK_INT_EQ(parse("5s"), 5000); }
**   int main(void) { RUN(parses_seconds); return test_summary(); }
*/
#ifndef ML_TEST_H
#define ML_TEST_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures_;
static int test_count_;
static int test_cur_failed_;

#define TEST(name) static void test_##name(void)

#define RUN(name)                                                  \
  do {                                                             \
    test_cur_failed_ = 0;                                          \
    test_count_++;                                                 \
    test_##name();                                                 \
    printf("%s %s\n", test_cur_failed_ ? "FAIL" : "ok  ", #name);  \
    fflush(stdout);                                                \
  } while (0)

#define FAILF(...)                                                 \
  do {                                                             \
    fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                \
    fprintf(stderr, __VA_ARGS__);                                  \
    fprintf(stderr, "\n");                                         \
    test_cur_failed_ = 1;                                          \
    test_failures_++;                                              \
  } while (0)

#define CHECK(cond)                                                \
  do {                                                             \
    if (!(cond)) FAILF("CHECK(%s) failed", #cond);                 \
  } while (0)

#define CHECK_INT_EQ(a, b)                                         \
  do {                                                             \
    long long a_ = (long long)(a), b_ = (long long)(b);            \
    if (a_ != b_) FAILF("%s == %lld, expected %lld", #a, a_, b_);  \
  } while (0)

#define CHECK_STR_EQ(a, b)                                         \
  do {                                                             \
    const char *a_ = (a), *b_ = (b);                               \
    if (!a_ || !b_ || strcmp(a_, b_))                              \
      FAILF("%s == \"%s\", expected \"%s\"", #a, a_ ? a_ : "(null)", \
            b_ ? b_ : "(null)");                                   \
  } while (0)

#define CHECK_CONTAINS(hay, needle)                                \
  do {                                                             \
    const char *h_ = (hay), *n_ = (needle);                        \
    if (!h_ || !strstr(h_, n_))                                    \
      FAILF("%s == \"%s\", expected it to contain \"%s\"", #hay,   \
            h_ ? h_ : "(null)", n_);                               \
  } while (0)

static inline int test_summary(void) {
  printf("%d tests, %d failures\n", test_count_, test_failures_);
  return test_failures_ ? 1 : 0;
}

#endif
