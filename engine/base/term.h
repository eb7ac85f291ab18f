/*
** term.h: text from skills, made safe to print on a terminal. A skill
** writes log lines, step ids, errors, event names and outputs; printed raw,
** their control characters would drive the operator's terminal (change its
** title, write its clipboard, clear the screen, forge a line with \r, hide
** a link, reverse the text that follows). Every place that prints such text
** for people goes through term_escape; --json output never does (it stays
** exact).
**
** What is escaped, visibly, as journalctl and git do:
**   - C0 controls but newline and tab, and DEL:     \x1b  \x7f   (\u001b in JSON)
**   - bytes that are not UTF-8 (a lone 0x9b is C1 CSI to some terminals): \x9b
**     (\ufffd in JSON, which cannot hold them: the API shows them so too)
**   - C1 controls U+0080-U+009F:                     \u009b
**   - bidirectional controls U+061C, U+200E, U+200F, U+202A-U+202E,
**     U+2066-U+2069:                                 \u202e
** Everything else, backslashes included, is printed as it is.
*/
#ifndef ML_TERM_H
#define ML_TERM_H
#include <stddef.h>
#include <stdio.h>

#include "base/buf.h"

/* Append len bytes of s to b, escaped. json: s is JSON text, and the
** escapes of C0 and DEL are JSON's own (\u001b), so the result is still
** JSON and decodes to the same value. */
void term_escape(buf_t *b, const char *s, size_t len, int json);

/* Whether len bytes of s need no escaping. */
int term_is_clean(const char *s, size_t len);

/* s escaped (malloc'd; NULL for NULL); json as for
** term_escape. */
char *term_dup(const char *s, int json);

/* Write s escaped to f (NULL writes nothing). json: as term_escape. */
void term_fputs(const char *s, FILE *f, int json);

/* printf to f, the whole result escaped: for lines whose format holds no
** escape sequences of its own (no colours). */
int term_printf(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Escaped strings for one line or one table, freed together: term_str
** returns s itself when it is clean, else an escaped copy that lives until
** term_strs_free. NULL stays NULL; out of memory gives "?". */
struct term_strs {
  char **v;
  size_t n, cap;
};
const char *term_str(struct term_strs *a, const char *s);
void term_strs_free(struct term_strs *a);

#endif
