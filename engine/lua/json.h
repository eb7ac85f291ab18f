/*
** json.h: the bridge between Lua values and JSON text, through cJSON.
** Skills see it as the `json` module: json.encode, json.decode, json.null,
** json.array, json.object.
**
** Lua -> JSON (json_from_lua, json_encode, json.encode):
**   - nil -> null; booleans -> booleans; json.null (a light userdata holding
**     NULL) -> null.
**   - Strings are written as their bytes; control characters are escaped.
**     A string or key holding a NUL byte is an error (cJSON strings end at NUL).
**   - Numbers: NaN and +/-infinity are errors. Every number is written so it
**     reads back as the same double: integral values below 1e21 in magnitude
**     as plain digits (1764435084123, 9007199254740992), other values with the
**     fewest of 15, 16 or 17 significant digits that give back the same double.
**     cJSON prints some numbers inexactly (it rounds to 15 digits and prints
**     large integers in exponent form), so those are cJSON_Raw items in the
**     tree, holding the exact text, with valuedouble set as well.
**   - Tables: a table carrying the array metatable (json.array, or any array
**     from json.decode) -> array of t[1..#t]; its other keys are not written.
**     A table marked by json.object -> always an object, whatever its keys:
**     empty -> {}, number keys written as decimal strings as for mixed keys
**     below ({1, 2} -> {"1":1,"2":2}). The mark is kept beside the table,
**     not in its metatable, so a table keeps its own metatable; json.array
**     and json.object each take the other's mark away.
**     Otherwise by its keys: empty -> {}; all keys positive integers forming
**     the sequence 1..n -> array; all keys positive integers with holes ->
**     array with null in the holes when the largest key <= 2 * the number of
**     keys or <= 16, else an object keyed by the decimal integers. Any other
**     mix of string and number keys -> object, number keys written as decimal
**     strings (integers without ".0", other numbers with %.17g); a number key
**     and a string key that give the same text (1 and "1") are an error. Keys
**     of other types (booleans, tables, functions...) are an error.
**   - Functions, threads, full userdata, cdata and non-NULL light userdata are
**     errors. So are cycles and nesting deeper than JSON_MAX_DEPTH tables.
**   - Object keys are sorted by their bytes, so equal tables give the same
**     text whatever order their keys were inserted in.
**   - Errors name the path of the value: $ for the root, .name for identifier
**     keys, ["odd key"] for other string keys, [3] for array indexes and
**     number keys (1-based, as in Lua). Example: "cannot encode a function at
**     $.result.cb: only JSON values (nil, booleans, numbers, strings, tables)
**     can be encoded".
**
** JSON -> Lua (json_push, json_decode_push, json.decode):
**   - objects -> plain tables (duplicate keys: the last wins); arrays -> tables
**     carrying the array metatable, so they encode back as arrays even when
**     empty; null -> json.null everywhere (keys and array lengths survive);
**     numbers -> Lua numbers (doubles); strings and booleans as they are.
**   - Nesting is limited by cJSON (CJSON_NESTING_LIMIT, 1000 levels).
**   - Errors give line and column (1-based, columns in bytes) and up to 20
**     bytes of text from the error on: "invalid JSON at line 2 column 8 near
**     'tru}'". Empty input, text after the value, and the escape \u0000 (which
**     cJSON would silently cut the string at) are errors too, and so is a
**     number beyond a double's range (1e400, which would read as infinity:
**     "invalid JSON: the number at $ is out of range ..."; jsontext.c).
**
** Round trip: for JSON text nested at most JSON_MAX_DEPTH deep, encoding the
** decoded value and decoding and encoding that again gives the same text.
*/
#ifndef ML_JSON_H
#define ML_JSON_H
#include <stddef.h>

#include <cJSON.h>
#include <lua.h>

#include "base/err.h"
#include "base/jsontext.h"

/* The most text json_from_lua and json.encode produce: 64 MB. */
#define JSON_MAX_TEXT ((size_t)64 << 20)

/* The deepest nesting of tables json_from_lua accepts. */
#define JSON_MAX_DEPTH 500

/* Push onto L the Lua value for a cJSON item (see the rules above). Returns 0,
** or a negative code with L's stack unchanged (too deep, Lua stack exhausted,
** a malformed tree). */
int json_push(lua_State *L, const cJSON *item, err_t *e);

/* Parse len bytes of JSON text at s (need not be NUL-terminated) and push its
** Lua value. Invalid text -> ERR_INVALID with a message naming line, column
** and an excerpt; nothing is pushed then. */
int json_decode_push(lua_State *L, const char *s, size_t len, err_t *e);

/* json_decode_push for text a skill hands over (json.decode, an HTTP
** response's .json): while the running slice is bounded, cJSON's tree
** may take at most its run's memory budget (lrt_json_cap), as it lives
** outside the Lua heap: past it, ERR_TOOBIG naming limits.run_memory. The
** engine's own journal is read with json_decode_push: what it holds was
** encoded under the same bound. */
int json_decode_bounded(lua_State *L, const char *s, size_t len, err_t *e);

/* What a JSON tree takes per value besides its strings, as json.c counts
** it against lrt_json_cap: cJSON's item and the allocator's header. */
#define JSON_TREE_VALUE_BYTES 80

/* Build a cJSON tree (caller frees with cJSON_Delete) from the Lua value at
** idx. On failure returns NULL and e names the path and the reason. L's stack
** is left as it was. */
cJSON *json_from_lua(lua_State *L, int idx, err_t *e);

/* Encode the Lua value at idx as compact JSON text, NUL-terminated, malloc'd
** (caller frees), its length in *len (len may be NULL). limit is the most
** bytes allowed (0: no limit); over it -> NULL and ERR_TOOBIG with a message
** giving both sizes ("2.3 MB, over the limit of 1.0 MB"). */
char *json_encode(lua_State *L, int idx, size_t limit, size_t *len, err_t *e);

/* Push the module table {encode=, decode=, null=, array=, object=}; sets no
** global. json.encode(v [, {pretty=true}]) returns the text (pretty: cJSON's
** layout, indented with tabs) and json.decode(text) the value; both raise
** "json.encode: <message>" / "json.decode: <message>" on failure. Returns 1 (the values pushed), so it also works as a lua_CFunction
** loader, e.g. in package.preload. */
int json_open(lua_State *L);

/* True if the value at idx is json.null. */
int json_is_null(lua_State *L, int idx);

#endif
