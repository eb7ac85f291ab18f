/*
** jsontext.c: JSON text, without Lua: parsing with messages that say where
** and what is wrong, and the UTF-8 rules of what moonloop reads and shows.
** The Lua bridge (json.c) and the HTTP routes (server_route.c) share it.
*/
#include "base/jsontext.h"
#include "base/mem.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXCERPT_BYTES 20   /* bytes of input shown after "near" */
#define PATH_SHOW_BYTES 400

/* See jsontext.h. */
int jsontext_is_ident(const char *s, size_t n) {
  if (n == 0 || (s[0] >= '0' && s[0] <= '9')) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!(c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) return 0;
  }
  return 1;
}

/* JSON whitespace only: cJSON itself skips every byte <= 32, but text after
** the value must be real whitespace to count as nothing. */
static size_t skip_ws(const char *s, size_t len, size_t i) {
  while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
  return i;
}

/* True if parsing failed because the text stopped early. cJSON reports both
** "the last byte is wrong" and "ran out of text" at the last byte; parsing a
** copy with a NUL appended tells them apart, as running out then moves past
** the original end. Only called on the error path. */
static int ends_early(const char *s, size_t len) {
  char *copy = mem_alloc(len + 1);
  memcpy(copy, s, len);
  copy[len] = 0;
  const char *end = NULL;
  cJSON *r = cJSON_ParseWithLengthOpts(copy, len + 1, &end, 0);
  int early = !r && end && (size_t)(end - copy) >= len;
  cJSON_Delete(r);
  free(copy);
  return early;
}

/* How many arrays and objects are open at pos (strings skipped). */
static int depth_at(const char *s, size_t pos) {
  int depth = 0, in_str = 0;
  for (size_t i = 0; i < pos; i++) {
    char ch = s[i];
    if (in_str) {
      if (ch == '\\') i++;
      else if (ch == '"') in_str = 0;
    } else if (ch == '"') in_str = 1;
    else if (ch == '[' || ch == '{') depth++;
    else if (ch == ']' || ch == '}') depth--;
  }
  return depth;
}

/* Fill e with "invalid JSON at line L column C near '...'" plus a reason if
** one is given; pos is the byte offset of the error. */
static int syntax_error(const char *s, size_t len, size_t pos, const char *reason, err_t *e) {
  if (pos > len) pos = len;
  /* cJSON can stop inside a UTF-8 sequence: point at its first byte. */
  while (pos > 0 && pos < len && ((unsigned char)s[pos] & 0xC0) == 0x80) pos--;
  int line = 1;
  size_t bol = 0;
  for (size_t i = 0; i < pos; i++)
    if (s[i] == '\n') line++, bol = i + 1;
  size_t col = pos - bol + 1;
  if (pos == len)
    return err_set(e, ERR_INVALID, "invalid JSON at line %d column %zu: %s", line, col,
                   reason ? reason : "unexpected end of input");

  /* The excerpt shows control bytes as escapes, and stops before a UTF-8
  ** sequence that the 20-byte cut would split. */
  size_t n = len - pos < EXCERPT_BYTES ? len - pos : EXCERPT_BYTES;
  const unsigned char *p = (const unsigned char *)s + pos;
  if (n < len - pos) {
    size_t start = n;
    while (start > 0 && (p[start] & 0xC0) == 0x80) start--;
    n = start;
  }
  char ex[EXCERPT_BYTES * 4 + 1];
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (p[i] == '\n') k += (size_t)sprintf(ex + k, "\\n");
    else if (p[i] == '\r') k += (size_t)sprintf(ex + k, "\\r");
    else if (p[i] == '\t') k += (size_t)sprintf(ex + k, "\\t");
    else if (p[i] < 0x20 || p[i] == 0x7F) k += (size_t)sprintf(ex + k, "\\x%02X", p[i]);
    else ex[k++] = (char)p[i];
  }
  ex[k] = 0;
  return err_set(e, ERR_INVALID, "invalid JSON at line %d column %zu near '%s'%s%s", line, col, ex,
                 reason ? ": " : "", reason ? reason : "");
}

/* Offset of the first \u0000 escape in (valid) JSON text, or len. In valid
** JSON every backslash is inside a string, so skipping each escaped byte is
** enough to read "\\u0000" (a backslash, then text) correctly. */
static size_t find_nul_escape(const char *s, size_t len) {
  const char *p = s, *end = s + len;
  while ((p = memchr(p, '\\', (size_t)(end - p))) && end - p >= 2) {
    if (p[1] == 'u' && end - p >= 6 && !memcmp(p + 2, "0000", 4)) return (size_t)(p - s);
    p += 2;
  }
  return len;
}

/* Whether v holds a number that is not finite (cJSON reads 1e400 as
** infinity). */
static int has_infinite(const cJSON *v) {
  if (cJSON_IsNumber(v)) return !isfinite(v->valuedouble);
  for (const cJSON *c = v->child; c; c = c->next)
    if (has_infinite(c)) return 1;
  return 0;
}

/* Write to out (cap bytes, used so far) the path of the first number in
** v that is not finite; 1 if there is one. A path is formatted only on the
** way to that number (has_infinite picks the child), not for every value. */
static int find_infinite(const cJSON *v, char *out, size_t cap, size_t used) {
  if (cJSON_IsNumber(v)) return !isfinite(v->valuedouble);
  int i = 0;
  for (const cJSON *c = v->child; c; c = c->next, i++) {
    if (!has_infinite(c)) continue;
    int n;
    if (cJSON_IsArray(v)) n = snprintf(out + used, cap - used, "[%d]", i + 1);
    else n = snprintf(out + used, cap - used, jsontext_is_ident(c->string, strlen(c->string)) ? ".%s" : "[\"%s\"]",
                      c->string);
    size_t next = used + (size_t)n < cap ? used + (size_t)n : cap - 1;
    return find_infinite(c, out, cap, next);
  }
  return 0;
}

/* See jsontext.h. */
int jsontext_parse(const char *s, size_t len, cJSON **out, err_t *e) {
  *out = NULL;
  if (!s || skip_ws(s, len, 0) == len) return err_set(e, ERR_INVALID, "empty input");
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(s, len, &end, 0);
  if (!root) {
    size_t pos = end ? (size_t)(end - s) : 0;
    if (pos + 1 >= len && ends_early(s, len)) return syntax_error(s, len, len, NULL, e);
    char reason[64];
    int deep = pos < len && (s[pos] == '[' || s[pos] == '{') && depth_at(s, pos) >= CJSON_NESTING_LIMIT;
    snprintf(reason, sizeof reason, "nested deeper than %d levels", CJSON_NESTING_LIMIT);
    return syntax_error(s, len, pos, deep ? reason : NULL, e);
  }
  size_t pos = skip_ws(s, len, (size_t)(end - s));
  if (pos < len) {
    cJSON_Delete(root);
    return syntax_error(s, len, pos, "unexpected text after the JSON value", e);
  }
  if ((pos = find_nul_escape(s, len)) < len) {
    cJSON_Delete(root);
    return syntax_error(s, len, pos, "\\u0000 (NUL) in strings is not supported", e);
  }
  char path[PATH_SHOW_BYTES] = "$";
  if (find_infinite(root, path, sizeof path, 1)) {
    cJSON_Delete(root);
    return err_set(e, ERR_INVALID, "invalid JSON: the number at %s is out of range "
                   "(a double reaches about 1.8e308)", path);
  }
  *out = root;
  return 0;
}

/* See jsontext.h. */
int jsontext_utf8_valid(const char *str, size_t len) {
  return jsontext_utf8_prefix(str, len) == len;
}

/* See jsontext.h. */
size_t jsontext_utf8_prefix(const char *str, size_t len) {
  const unsigned char *s = (const unsigned char *)str;
  size_t i = 0;
  while (i < len) {
    unsigned char c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t n;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) n = 1, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) n = 2, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) n = 3, cp = c & 0x07;
    else return i;
    if (i + n >= len) return i;
    for (size_t k = 1; k <= n; k++) {
      if ((s[i + k] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    /* Overlong forms, surrogates and code points past U+10FFFF. */
    if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
      return i;
    i += n + 1;
  }
  return i;
}

/* A copy of s (NUL-terminated) with each byte that does not start valid
** UTF-8 replaced by U+FFFD. */
static char *utf8_repaired(const char *s) {
  size_t len = strlen(s), o = 0;
  char *out = mem_alloc(len * 3 + 1);
  for (size_t i = 0; i < len;) {
    size_t ok = jsontext_utf8_prefix(s + i, len - i);
    memcpy(out + o, s + i, ok);
    o += ok, i += ok;
    if (i < len) {
      memcpy(out + o, "\xEF\xBF\xBD", 3);
      o += 3, i++;
    }
  }
  out[o] = 0;
  return out;
}

/* See jsontext.h. */
void jsontext_fix_utf8(cJSON *v) {
  for (; v; v = v->next) {
    if (v->string && !jsontext_utf8_valid(v->string, strlen(v->string))) {
      char *fixed = utf8_repaired(v->string);
      if (!(v->type & cJSON_StringIsConst)) free(v->string);
      v->string = fixed;
      v->type &= ~cJSON_StringIsConst;
    }
    if ((cJSON_IsString(v) || cJSON_IsRaw(v)) && v->valuestring &&
        !jsontext_utf8_valid(v->valuestring, strlen(v->valuestring))) {
      char *fixed = utf8_repaired(v->valuestring);
      free(v->valuestring);
      v->valuestring = fixed;
    }
    if (v->child) jsontext_fix_utf8(v->child);
  }
}

/* ---- helpers for the engine's own JSON values ------------------------- */

/* See jsontext.h. Each segment is compared whole, so a segment of any length is
** looked up as written (no copy into a fixed buffer). */
const cJSON *jsontext_path(const cJSON *v, const char *path) {
  const char *p = path ? path : "";
  while (v && *p) {
    size_t n = strcspn(p, ".");
    const cJSON *c = NULL;
    if (cJSON_IsObject(v))
      for (c = v->child; c; c = c->next)
        if (c->string && !strncmp(c->string, p, n) && c->string[n] == 0) break;
    v = c;
    p += n;
    if (*p == '.') p++;
  }
  return v;
}

/* See jsontext.h. */
char *jsontext_message(const char *msg) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "message", msg);
  char *s = jsontext_print_text(o);
  cJSON_Delete(o);
  return s;
}

/* See jsontext.h. */
void jsontext_cancel_message(const char *reason, char *out, size_t n) {
  cJSON *ev = reason && reason[0] == '{' ? cJSON_Parse(reason) : NULL;
  const cJSON *name = cJSON_GetObjectItem(ev, "name"), *id = cJSON_GetObjectItem(ev, "id");
  if (cJSON_IsString(name))
    snprintf(out, n, "cancelled by event %s (%s)", name->valuestring,
             cJSON_IsString(id) ? id->valuestring : "?");
  else snprintf(out, n, "cancelled: %s", reason ? reason : "on request");
  cJSON_Delete(ev);
}

static void print_string(buf_t *b, const char *str);

/* See jsontext.h. */
int jsontext_invoke_trigger(const char *by, const char *key, char *out, size_t n) {
  buf_t b = BUF_INIT;
  buf_puts(&b, "{\"kind\":\"invoke\",\"by\":");
  print_string(&b, by);
  if (key) {
    buf_puts(&b, ",\"key\":");
    print_string(&b, key);
  }
  buf_add(&b, "}", 1);
  int ok = b.len < n;
  if (ok) memcpy(out, b.p, b.len), out[b.len] = 0;
  buf_free(&b);
  return ok ? 0 : -1;
}

/* The JSON text s as a cJSON value, or null when s is NULL or not JSON. */
static cJSON *parsed_or_null(const char *s) {
  cJSON *v = s ? cJSON_Parse(s) : NULL;
  return v ? v : cJSON_CreateNull();
}

/* See jsontext.h. */
char *jsontext_run_outcome(const char *run_id, const char *status, const char *output,
                       const char *error) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "run_id", run_id);
  cJSON_AddStringToObject(o, "status", status);
  cJSON_AddItemToObject(o, "output", parsed_or_null(output));
  cJSON_AddItemToObject(o, "error", parsed_or_null(error));
  char *s = jsontext_print_text(o);
  cJSON_Delete(o);
  return s;
}

/* ---- writing JSON text ------------------------------------------------ */

/* Append the escape of c ('"', '\\' or a control character) as cJSON
** writes it. */
static void put_escape(buf_t *b, unsigned char c) {
  static const char hex[] = "0123456789abcdef";
  char esc[6] = {'\\', 0};
  size_t el = 2;
  switch (c) {
  case '"': esc[1] = '"'; break;
  case '\\': esc[1] = '\\'; break;
  case '\b': esc[1] = 'b'; break;
  case '\f': esc[1] = 'f'; break;
  case '\n': esc[1] = 'n'; break;
  case '\r': esc[1] = 'r'; break;
  case '\t': esc[1] = 't'; break;
  default:
    memcpy(esc + 1, "u00", 3);
    esc[4] = hex[c >> 4];
    esc[5] = hex[c & 15];
    el = 6;
  }
  buf_add(b, esc, el);
}

/* See jsontext.h: runs of bytes that need nothing are copied whole. */
void jsontext_put_string(buf_t *b, const char *str, size_t n) {
  const unsigned char *s = (const unsigned char *)str;
  buf_add(b, "\"", 1);
  size_t i = 0;
  /* 1 for the bytes that go as they are: printable ASCII but '"' and '\\'. */
  static const unsigned char plain[256] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
  };
  while (i < n) {
    size_t j = i;
    while (j < n && plain[s[j]]) j++;
    if (j > i) buf_add(b, s + i, j - i);
    i = j;
    if (i >= n) break;
    unsigned char c = s[i];
    if (c >= 0x80) {
      size_t ok = jsontext_utf8_prefix(str + i, n - i);
      if (ok) buf_add(b, s + i, ok), i += ok;
      else buf_add(b, "\xEF\xBF\xBD", 3), i++;
      continue;
    }
    put_escape(b, c);
    i++;
  }
  buf_add(b, "\"", 1);
}

/* Whether s[0..n) (trimmed) has the shape of one JSON value: its first and
** last bytes agree (braces, brackets, quotes), or it is a literal, or a
** number's characters only. Not a full parse: text the engine wrote is
** JSON; this only tells it from plain text. */
static int json_shaped(const char *s, size_t n) {
  if (!n) return 0;
  char a = s[0], z = s[n - 1];
  if (a == '{') return z == '}';
  if (a == '[') return z == ']';
  if (a == '"') return n >= 2 && z == '"';
  if (n == 4 && (!memcmp(s, "true", 4) || !memcmp(s, "null", 4))) return 1;
  if (n == 5 && !memcmp(s, "false", 5)) return 1;
  if (a != '-' && (a < '0' || a > '9')) return 0;
  for (size_t i = 0; i < n; i++)
    if (!strchr("0123456789+-.eE", s[i])) return 0;
  return 1;
}

/* See jsontext.h. */
void jsontext_put_value(buf_t *b, const char *s, size_t n) {
  if (!s) {
    buf_add(b, "null", 4);
    return;
  }
  size_t i = skip_ws(s, n, 0);
  while (n > i && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
    n--;
  if (json_shaped(s + i, n - i) && jsontext_utf8_valid(s + i, n - i)) {
    buf_add(b, s + i, n - i);
    return;
  }
  /* Not as expected: parse it (repairing its strings), or show it as text. */
  cJSON *v = cJSON_ParseWithLength(s, n);
  if (!v) {
    jsontext_put_string(b, s, n);
    return;
  }
  jsontext_fix_utf8(v);
  char *t = jsontext_print_text(v);
  cJSON_Delete(v);
  buf_puts(b, t);
  free(t);
}

/* See jsontext.h. */
void jsontext_put_key(buf_t *b, const char *key) {
  size_t n = strlen(key);
  char tmp[64];
  if (n + 3 > sizeof tmp) {
    buf_add(b, "\"", 1);
    buf_add(b, key, n);
    buf_add(b, "\":", 2);
    return;
  }
  tmp[0] = '"';
  memcpy(tmp + 1, key, n);
  tmp[n + 1] = '"';
  tmp[n + 2] = ':';
  buf_add(b, tmp, n + 3);
}

/* See jsontext.h. */
void jsontext_put_int(buf_t *b, int64_t v) {
  char tmp[24];
  int i = (int)sizeof tmp;
  uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
  do {
    tmp[--i] = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (v < 0) tmp[--i] = '-';
  buf_add(b, tmp + i, sizeof tmp - (size_t)i);
}

/* ---- printing a cJSON tree compactly ---- */

/* Append s as cJSON prints a string: quoted, '"', '\\' and control
** characters escaped, every other byte as it is. */
static void print_string(buf_t *b, const char *str) {
  const unsigned char *s = (const unsigned char *)str;
  buf_add(b, "\"", 1);
  for (size_t i = 0;;) {
    size_t j = i;
    while (s[j] >= 32 && s[j] != '"' && s[j] != '\\') j++;
    if (j > i) buf_add(b, s + i, j - i);
    if (!s[j]) break;
    unsigned char c = s[j];
    put_escape(b, c);
    i = j + 1;
  }
  buf_add(b, "\"", 1);
}

/* See jsontext.h. For a normal double no shorter text than its %.15g
** reads back (%g drops trailing zeros), so the search starts there;
** subnormals have fewer significant digits and start at 1. */
void jsontext_number_text(double d, char *out, size_t cap) {
  if (d == floor(d) && fabs(d) < 1e21) {
    snprintf(out, cap, "%.0f", d);
    return;
  }
  for (int prec = fabs(d) < DBL_MIN ? 1 : 15; prec <= 17; prec++) {
    snprintf(out, cap, "%.*g", prec, d);
    if (strtod(out, NULL) == d) return;
  }
}

/* Append d exactly (jsontext_number_text), whole numbers below 1e15 as
** digits without a detour through the format (-0 stays "-0"); NaN and
** infinities as null, as cJSON prints them. */
static void print_number(buf_t *b, double d) {
  if (isnan(d) || isinf(d)) {
    buf_add(b, "null", 4);
    return;
  }
  if (d > -1e15 && d < 1e15 && d == (double)(int64_t)d && !(d == 0 && signbit(d))) {
    jsontext_put_int(b, (int64_t)d);
    return;
  }
  char tmp[40];
  jsontext_number_text(d, tmp, sizeof tmp);
  buf_puts(b, tmp);
}

/* Make the numbers of v that cJSON would round raw items of their exact
** text (jsontext_print_pretty). */
static void exact_numbers(cJSON *v) {
  for (cJSON *c = v ? v->child : NULL; c; c = c->next) exact_numbers(c);
  if (!v || (v->type & 0xFF) != cJSON_Number || isnan(v->valuedouble) || isinf(v->valuedouble)) return;
  char want[40], got[64];
  jsontext_number_text(v->valuedouble, want, sizeof want);
  if (cJSON_PrintPreallocated(v, got, (int)sizeof got, 0) && !strcmp(got, want)) return;
  char *raw = mem_strdup(want);
  v->type = cJSON_Raw | (v->type & ~0xFF);
  v->valuestring = raw;
}

/* See jsontext.h. */
int jsontext_print(buf_t *b, const cJSON *v) {
  if (!v) return -1;
  switch (v->type & 0xFF) {
  case cJSON_NULL: buf_add(b, "null", 4); return 0;
  case cJSON_False: buf_add(b, "false", 5); return 0;
  case cJSON_True: buf_add(b, "true", 4); return 0;
  case cJSON_Number: print_number(b, v->valuedouble); return 0;
  case cJSON_String: print_string(b, v->valuestring ? v->valuestring : ""); return 0;
  case cJSON_Raw:
    if (!v->valuestring) return -1;
    buf_puts(b, v->valuestring);
    return 0;
  case cJSON_Array:
  case cJSON_Object: {
    int obj = (v->type & 0xFF) == cJSON_Object;
    buf_add(b, obj ? "{" : "[", 1);
    for (const cJSON *c = v->child; c; c = c->next) {
      if (obj) {
        if (!c->string) return -1;
        print_string(b, c->string);
        buf_add(b, ":", 1);
      }
      if (jsontext_print(b, c)) return -1;
      if (c->next) buf_add(b, ",", 1);
    }
    buf_add(b, obj ? "}" : "]", 1);
    return 0;
  }
  default: return -1;
  }
}

/* See jsontext.h. */
char *jsontext_print_pretty(cJSON *v) {
  exact_numbers(v);
  return cJSON_Print(v);
}

/* Order of two members for jsontext_sort_keys: by key, then by their
** place before the sort (qsort is not stable). */
struct keyed {
  cJSON *item;
  size_t at;
};
static int keyed_cmp(const void *a, const void *b) {
  const struct keyed *x = a, *y = b;
  int c = strcmp(x->item->string ? x->item->string : "", y->item->string ? y->item->string : "");
  return c ? c : (x->at > y->at) - (x->at < y->at);
}

/* See jsontext.h. */
void jsontext_sort_keys(cJSON *v) {
  if (!v || !(cJSON_IsObject(v) || cJSON_IsArray(v))) return;
  size_t n = 0;
  for (cJSON *c = v->child; c; c = c->next) {
    jsontext_sort_keys(c);
    n++;
  }
  if (!cJSON_IsObject(v) || n < 2) return;
  struct keyed *k = mem_calloc(n, sizeof *k);
  size_t i = 0;
  for (cJSON *c = v->child; c; c = c->next, i++) k[i] = (struct keyed){c, i};
  qsort(k, n, sizeof *k, keyed_cmp);
  /* Relink as cJSON keeps a list: next forward, prev backward, and the
  ** first's prev pointing at the last. */
  for (i = 0; i < n; i++) {
    k[i].item->next = i + 1 < n ? k[i + 1].item : NULL;
    k[i].item->prev = i ? k[i - 1].item : k[n - 1].item;
  }
  v->child = k[0].item;
  free(k);
}

/* See jsontext.h. */
char *jsontext_print_text(const cJSON *v) {
  buf_t b = BUF_INIT;
  if (jsontext_print(&b, v)) {
    buf_free(&b);
    return NULL;
  }
  return buf_take(&b);
}
