/*
** jsontext.h: JSON text without Lua: parsing with clear errors, and UTF-8.
*/
#ifndef ML_JSONTEXT_H
#define ML_JSONTEXT_H
#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "base/buf.h"
#include "base/err.h"

/* Parse len bytes of JSON text at s (need not be NUL-terminated) into *out
** (caller frees), with the same rules and messages as json.decode (json_decode_push):
** empty input, text after the value, \u0000 and numbers past a double's
** range (1e400) are errors too. */
int jsontext_parse(const char *s, size_t len, cJSON **out, err_t *e);

/* Whether len bytes are valid UTF-8 (no overlongs, no surrogates). */
int jsontext_utf8_valid(const char *s, size_t len);

/* How many of len bytes at s, from the start, are valid UTF-8. */
size_t jsontext_utf8_prefix(const char *s, size_t len);

/* Replace, in every string and key of the tree v (and its siblings), each
** byte that does not start valid UTF-8 with U+FFFD. The store keeps what
** skills wrote byte for byte; what it shows (runs, traces, answers) is
** valid UTF-8 so that strict JSON readers can read it. */
void jsontext_fix_utf8(cJSON *v);

/* Whether n bytes at s form a Lua identifier (paths show them as .name). */
int jsontext_is_ident(const char *s, size_t n);

/* ---- writing JSON text straight into a buffer (no cJSON tree) ----------
** For answers read often (run records, run lists): no allocation per value. */

/* Append n bytes of s as a JSON string: quoted, escaped as cJSON escapes
** ('"', '\\', control characters), each byte that does not start valid
** UTF-8 replaced by U+FFFD (as jsontext_fix_utf8 does). */
void jsontext_put_string(buf_t *b, const char *s, size_t n);

/* Append the JSON text s (n bytes) as a value. Text the engine wrote is
** JSON already: it goes as it is when it is valid UTF-8 and has the shape
** of one value (an object, a list, a string, a number, true, false, null).
** Otherwise it is parsed (and printed again with its strings repaired to
** UTF-8), or, when it is no JSON at all, written as a string. NULL s
** appends null. */
void jsontext_put_value(buf_t *b, const char *s, size_t n);

/* Append "key": (the key is the caller's literal: no escaping). */
void jsontext_put_key(buf_t *b, const char *key);

/* Append a whole number. */
void jsontext_put_int(buf_t *b, int64_t v);

/* Append the value v (with its children) as compact JSON text, the text
** cJSON_PrintUnformatted gives, byte for byte, except for numbers: each
** is written exactly (jsontext_number_text), where cJSON writes 15
** significant digits when they come within an epsilon of the value
** (0.30000000000000004 came back 0.3, 2^53 as 9.00719925474099e+15).
** -1 (b holds part of it) for a tree cJSON cannot print either (an
** invalid item, a string without text). Use it, not cJSON's printers,
** for any text a user's values pass through. */
int jsontext_print(buf_t *b, const cJSON *v);

/* v as compact JSON text (malloc'd), as jsontext_print; NULL where
** cJSON_PrintUnformatted gives NULL. */
char *jsontext_print_text(const cJSON *v);

/* Sort the members of every object in v by key (byte order; members of
** one key keep their order), in place: two values that differ only in
** the order of their keys then print the same, for comparing as text. */
void jsontext_sort_keys(cJSON *v);

/* The exact text of the finite number d: plain digits for a whole number
** below 1e21, else the shortest %.<p>g that reads back as d (out: at
** least 40 bytes). */
void jsontext_number_text(double d, char *out, size_t cap);

/* v as indented JSON text (malloc'd), as cJSON_Print gives it but with
** every number exact: those cJSON would round become raw items of v
** holding their exact text first (v is changed so). */
char *jsontext_print_pretty(cJSON *v);

/* ---- the engine's own JSON values (the run context and the store share them) ---- */

/* The value at a dotted path of keys in v ("data.request_id"), or NULL when
** a key is missing or a value on the way is not an object. Keys are
** compared case-sensitively; an empty path gives v itself. */
const cJSON *jsontext_path(const cJSON *v, const char *path);

/* {"message": msg} as compact JSON text, the shape of a run's error record
** (malloc'd; NULL only when out of memory). */
char *jsontext_message(const char *msg);

/* The message (in out, n bytes) of a run cancelled for reason: a message
** ("cancelled: its parent run ended") or the JSON of the event that
** cancelled it ("cancelled by event NAME (ID)"). One wording, whichever
** process ends the run: its owner, or the store for a run nobody holds. */
void jsontext_cancel_message(const char *reason, char *out, size_t n);

/* The trigger of a run started by invoke, as JSON text in out (n bytes):
** {"kind":"invoke","by":by} with "key" when the start has an idempotency
** key (the run's record shows it there). 0, or -1 when it does not fit. */
int jsontext_invoke_trigger(const char *by, const char *key, char *out, size_t n);

/* A finished run's outcome as its parent gets it, compact JSON text:
** {run_id, status, output, error}; output and error are JSON texts (NULL or
** text that is not JSON gives null). malloc'd. */
char *jsontext_run_outcome(const char *run_id, const char *status, const char *output,
                       const char *error);

#endif
