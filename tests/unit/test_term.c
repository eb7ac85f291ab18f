/* Unit tests for term.c: what is escaped for the terminal, and what is not. */
#include <stdlib.h>

#include "base/term.h"
#include "test.h"

/* s escaped (json as term_escape); a static buffer, for CHECK_STR_EQ. */
static const char *esc(const char *s, int json) {
  static char out[512];
  char *e = term_dup(s, json);
  snprintf(out, sizeof out, "%s", e ? e : "(null)");
  free(e);
  return out;
}

TEST(c0_del_and_newline_tab) {
  CHECK_STR_EQ(esc("a\x1b]0;t\x07z", 0), "a\\x1b]0;t\\x07z");
  CHECK_STR_EQ(esc("forged\rline", 0), "forged\\x0dline");
  CHECK_STR_EQ(esc("del\x7f", 0), "del\\x7f");
  CHECK_STR_EQ(esc("two\nlines\tand a tab", 0), "two\nlines\tand a tab");
  /* In JSON text the escapes are JSON's, so it still parses to the same. */
  CHECK_STR_EQ(esc("\x1b[2J\x7f", 1), "\\u001b[2J\\u007f");
}

TEST(c1_as_code_points_and_as_bytes) {
  CHECK_STR_EQ(esc("csi \xc2\x9b", 0), "csi \\u009b");
  CHECK_STR_EQ(esc("nel \xc2\x85", 0), "nel \\u0085");
  CHECK_STR_EQ(esc("raw \x9b byte", 0), "raw \\x9b byte");
  CHECK_STR_EQ(esc("raw \x9b byte", 1), "raw \\ufffd byte");
  /* Overlong forms, surrogates and truncated sequences are not UTF-8. */
  CHECK_STR_EQ(esc("\xc1\x9b", 0), "\\xc1\\x9b");
  CHECK_STR_EQ(esc("\xed\xa0\x80", 0), "\\xed\\xa0\\x80");
  CHECK_STR_EQ(esc("cut \xe2\x80", 0), "cut \\xe2\\x80");
}

TEST(bidi_controls) {
  CHECK_STR_EQ(esc("\xe2\x80\xae" "evil", 0), "\\u202eevil");          /* RLO */
  CHECK_STR_EQ(esc("\xe2\x80\xaa\xe2\x80\xac", 0), "\\u202a\\u202c");  /* LRE, PDF */
  CHECK_STR_EQ(esc("\xe2\x81\xa6\xe2\x81\xa9", 0), "\\u2066\\u2069");  /* LRI, PDI */
  CHECK_STR_EQ(esc("\xe2\x80\x8e\xe2\x80\x8f", 0), "\\u200e\\u200f");  /* LRM, RLM */
  CHECK_STR_EQ(esc("\xd8\x9c", 0), "\\u061c");                          /* ALM */
}

TEST(text_that_stays) {
  const char *ok = "plain, caf\xc3\xa9, \xe2\x9c\x93, \xf0\x9f\x98\x80, \\x1b as text, \xe2\x80\x8b";
  CHECK(term_is_clean(ok, strlen(ok)));
  CHECK_STR_EQ(esc(ok, 0), ok);
  CHECK(!term_is_clean("\x1b", 1));
  CHECK(term_is_clean("", 0));
}

TEST(strs_return_clean_text_as_is) {
  struct term_strs a = {0};
  const char *clean = "step-1";
  CHECK(term_str(&a, clean) == clean);
  CHECK_STR_EQ(term_str(&a, "x\x1b"), "x\\x1b");
  CHECK(term_str(&a, NULL) == NULL);
  CHECK_INT_EQ(a.n, 1);
  term_strs_free(&a);
}

int main(void) {
  RUN(c0_del_and_newline_tab);
  RUN(c1_as_code_points_and_as_bytes);
  RUN(bidi_controls);
  RUN(text_that_stays);
  RUN(strs_return_clean_text_as_is);
  return test_summary();
}
