/* Unit tests for json.c: Lua <-> JSON, through a real lua_State with the
** module as the global `json`, plus the C API directly. */
#include <lauxlib.h>
#include <lualib.h>

#include "base/jsontext.h"
#include "lua/json.h"
#include "test.h"

static lua_State *new_state(void) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  json_open(L);
  lua_setglobal(L, "json");
  /* A light userdata that is not json.null, which Lua code cannot make. */
  static int dummy;
  lua_pushlightuserdata(L, &dummy);
  lua_setglobal(L, "lightud");
  return L;
}

/* Run a Lua chunk; returns its first result through tostring, or
** "error: <message>". The text stays valid until the next call. */
static char out_[1 << 17];
static const char *run(lua_State *L, const char *code) {
  lua_settop(L, 0);
  if (luaL_dostring(L, code)) {
    snprintf(out_, sizeof out_, "error: %s", lua_tostring(L, -1));
  } else if (lua_gettop(L) == 0) {
    snprintf(out_, sizeof out_, "(no result)");
  } else {
    lua_getglobal(L, "tostring");
    lua_pushvalue(L, 1);
    lua_call(L, 1, 1);
    size_t n;
    const char *s = lua_tolstring(L, -1, &n);
    if (n >= sizeof out_) n = sizeof out_ - 1;
    memcpy(out_, s, n);
    out_[n] = 0;
  }
  lua_settop(L, 0);
  return out_;
}

#define CHECK_RUN(L, code, expect) CHECK_STR_EQ(run(L, code), expect)

TEST(encode_scalars) {
  lua_State *L = new_state();
  CHECK_RUN(L, "return json.encode(nil)", "null");
  CHECK_RUN(L, "return json.encode(json.null)", "null");
  CHECK_RUN(L, "return json.encode(true)", "true");
  CHECK_RUN(L, "return json.encode(false)", "false");
  CHECK_RUN(L, "return json.encode(42)", "42");
  CHECK_RUN(L, "return json.encode(-1.5)", "-1.5");
  CHECK_RUN(L, "return json.encode(0)", "0");
  CHECK_RUN(L, "return json.encode('hi')", "\"hi\"");
  CHECK_RUN(L, "return json.encode('')", "\"\"");
  lua_close(L);
}

TEST(encode_numbers_are_exact) {
  lua_State *L = new_state();
  CHECK_RUN(L, "return json.encode(0.1)", "0.1");
  CHECK_RUN(L, "return json.encode(123.456)", "123.456");
  /* cJSON alone prints these two as 0.3 and 0.333333333333333 (15 digits). */
  CHECK_RUN(L, "return json.encode(0.1 + 0.2)", "0.30000000000000004");
  CHECK_RUN(L, "return json.encode(1/3)", "0.3333333333333333");
  CHECK_RUN(L, "return json.encode(1e-7)", "1e-07");
  CHECK_RUN(L, "return json.encode(1.5e300)", "1.5e+300");
  CHECK_RUN(L, "local x = 0.1 + 0.2 return json.decode(json.encode(x)) == x", "true");
  CHECK_RUN(L, "local x = 2/3 return json.decode(json.encode(x)) == x", "true");
  CHECK_RUN(L, "local x = -1e-300 / 7 return json.decode(json.encode(x)) == x", "true");
  lua_close(L);
}

TEST(encode_large_integers) {
  lua_State *L = new_state();
  CHECK_RUN(L, "return json.encode(1764435084123)", "1764435084123");
  CHECK_RUN(L, "return json.encode({ts = 1764435084123})", "{\"ts\":1764435084123}");
  /* cJSON alone prints 2^53 as 9.00719925474099e+15, which reads back wrong. */
  CHECK_RUN(L, "return json.encode(2^53)", "9007199254740992");
  CHECK_RUN(L, "return json.encode(-2^53)", "-9007199254740992");
  CHECK_RUN(L, "return json.decode(json.encode(2^53)) == 2^53", "true");
  CHECK_RUN(L, "return json.decode(json.encode(2^53 + 2)) == 2^53 + 2", "true");
  CHECK_RUN(L, "return json.encode(1e15)", "1000000000000000");
  CHECK_RUN(L, "return json.encode(2^60)", "1152921504606846976");
  CHECK_RUN(L, "return json.encode(2^31)", "2147483648");
  CHECK_RUN(L, "return json.encode(-2^31 - 1)", "-2147483649");
  CHECK_RUN(L, "return json.encode(1e20)", "100000000000000000000");
  CHECK_RUN(L, "return json.encode(1e21)", "1e+21");
  lua_close(L);
}

TEST(encode_nan_and_infinity_fail_with_path) {
  lua_State *L = new_state();
  CHECK_RUN(L, "return json.encode({x = 0/0})", "error: json.encode: NaN is not a JSON number at $.x");
  CHECK_RUN(L, "return json.encode({a = {1, math.huge}})",
            "error: json.encode: infinity is not a JSON number at $.a[2]");
  CHECK_RUN(L, "return json.encode(-math.huge)", "error: json.encode: -infinity is not a JSON number at $");
  lua_close(L);
}

TEST(encode_strings) {
  lua_State *L = new_state();
  CHECK_RUN(L, "return json.encode('a\"b\\\\c/')", "\"a\\\"b\\\\c/\"");
  CHECK_RUN(L, "return json.encode('l1\\nl2\\tx\\1\\31')", "\"l1\\nl2\\tx\\u0001\\u001f\"");
  /* UTF-8 passes through as bytes. */
  CHECK_RUN(L, "return json.encode('h\xC3\xA9llo \xE2\x98\x83 \xF0\x9F\x98\x80')",
            "\"h\xC3\xA9llo \xE2\x98\x83 \xF0\x9F\x98\x80\"");
  CHECK_RUN(L, "return json.encode({s = 'a\\0b'})",
            "error: json.encode: cannot encode a string containing a NUL byte at $.s: "
            "NUL bytes are not supported in JSON strings");
  CHECK_RUN(L, "return json.encode({['a\\0b'] = 1})",
            "error: json.encode: cannot encode a key containing a NUL byte at $[\"a\\u0000b\"]: "
            "NUL bytes are not supported in JSON strings");
  lua_close(L);
}

TEST(encode_sequences_as_arrays) {
  lua_State *L = new_state();
  CHECK_RUN(L, "return json.encode({1, 2, 3})", "[1,2,3]");
  CHECK_RUN(L, "return json.encode({{1}, {2, {3}}})", "[[1],[2,[3]]]");
  CHECK_RUN(L, "return json.encode({'a', true, json.null, 1.5})", "[\"a\",true,null,1.5]");
  CHECK_RUN(L, "return json.encode({json.null, json.null})", "[null,null]");
  lua_close(L);
}

TEST(encode_sparse_tables) {
  lua_State *L = new_state();
  CHECK_RUN(L, "return json.encode({[1] = 1, [3] = 3})", "[1,null,3]");
  CHECK_RUN(L, "return json.encode({[2] = 2})", "[null,2]");
  /* Largest key <= 16: an array, however few the keys. */
  CHECK_RUN(L, "return json.encode({[16] = 'x'})",
            "[null,null,null,null,null,null,null,null,null,null,null,null,null,null,null,\"x\"]");
  CHECK_RUN(L, "return json.encode({[17] = 'x'})", "{\"17\":\"x\"}");
  /* 11 keys, largest 20 <= 2 * 11: an array. */
  CHECK_RUN(L, "local t = {1,2,3,4,5,6,7,8,9,10} t[20] = 20 return json.encode(t)",
            "[1,2,3,4,5,6,7,8,9,10,null,null,null,null,null,null,null,null,null,20]");
  /* 4 keys, largest 40 > 2 * 4 and > 16: an object keyed by the decimals. */
  CHECK_RUN(L, "return json.encode({[1] = 'a', [2] = 'b', [3] = 'c', [40] = 'd'})",
            "{\"1\":\"a\",\"2\":\"b\",\"3\":\"c\",\"40\":\"d\"}");
  lua_close(L);
}

TEST(encode_objects) {
  lua_State *L = new_state();
  CHECK_RUN(L, "return json.encode({})", "{}");
  CHECK_RUN(L, "return json.encode({a = 1})", "{\"a\":1}");
  CHECK_RUN(L, "return json.encode({a = {b = {}}})", "{\"a\":{\"b\":{}}}");
  /* Keys are sorted by their bytes. */
  CHECK_RUN(L, "return json.encode({b = 2, a = 1, c = {z = 0, y = json.null}})",
            "{\"a\":1,\"b\":2,\"c\":{\"y\":null,\"z\":0}}");
  /* Mixed keys: an object, number keys as decimal strings. */
  CHECK_RUN(L, "return json.encode({10, 20, a = 3})", "{\"1\":10,\"2\":20,\"a\":3}");
  CHECK_RUN(L, "return json.encode({[1.5] = 'x', [-1] = 'm', [0] = 'z'})",
            "{\"-1\":\"m\",\"0\":\"z\",\"1.5\":\"x\"}");
  CHECK_RUN(L, "return json.encode({[0.1] = 1})", "{\"0.10000000000000001\":1}");
  /* Metamethods are not consulted: the table's own contents are written. */
  CHECK_RUN(L, "return json.encode(setmetatable({b = 1}, {__index = {a = 1}, __len = function() return 3 end}))",
            "{\"b\":1}");
  /* Beyond 2^53 an integer key is no array index. */
  CHECK_RUN(L, "return json.encode({[2^53 + 2] = 1})", "{\"9007199254740994\":1}");
  lua_close(L);
}

TEST(encode_key_order_does_not_depend_on_history) {
  lua_State *L = new_state();
  /* The same keys inserted in other orders, and a table that grew and
  ** shrank, give the same text. */
  CHECK_RUN(L,
            "local a, b = {}, {} "
            "for i = 1, 50 do a['k' .. i] = i end "
            "for i = 50, 1, -1 do b['k' .. i] = i end "
            "for i = 1, 1000 do b['tmp' .. i] = i end "
            "for i = 1, 1000 do b['tmp' .. i] = nil end "
            "return json.encode(a) == json.encode(b) and json.encode(a) == json.encode(a)",
            "true");
  lua_close(L);
}

TEST(encode_bad_keys_name_path_and_type) {
  lua_State *L = new_state();
  CHECK_RUN(L, "return json.encode({a = {[true] = 1}})",
            "error: json.encode: cannot use a boolean as a key at $.a: object keys must be strings or numbers");
  CHECK_RUN(L, "return json.encode({{[{}] = 1}})",
            "error: json.encode: cannot use a table as a key at $[1]: object keys must be strings or numbers");
  CHECK_RUN(L, "return json.encode({[print] = 1})",
            "error: json.encode: cannot use a function as a key at $: object keys must be strings or numbers");
  CHECK_RUN(L, "return json.encode({x = {[1] = 'a', ['1'] = 'b'}})",
            "error: json.encode: the number key 1 and the string key \"1\" clash at $.x: "
            "both would become the same JSON key");
  lua_close(L);
}

TEST(encode_bad_values_name_path_and_type) {
  lua_State *L = new_state();
  CHECK_RUN(L, "return json.encode({result = {cb = print}})",
            "error: json.encode: cannot encode a function at $.result.cb: only JSON values "
            "(nil, booleans, numbers, strings, tables) can be encoded");
  CHECK_RUN(L, "return json.encode({coroutine.create(print)})",
            "error: json.encode: cannot encode a thread (coroutine) at $[1]: only JSON values "
            "(nil, booleans, numbers, strings, tables) can be encoded");
  CHECK_CONTAINS(run(L, "return json.encode({f = io.stdout})"), "cannot encode a userdata at $.f:");
  CHECK_CONTAINS(run(L, "return json.encode({p = lightud})"), "cannot encode a light userdata at $.p:");
  CHECK_CONTAINS(run(L, "return json.encode(print)"), "cannot encode a function at $:");
  lua_close(L);
}

TEST(error_paths) {
  lua_State *L = new_state();
  CHECK_CONTAINS(run(L, "return json.encode({['odd key'] = {{x = print}}})"), " at $[\"odd key\"][1].x:");
  CHECK_CONTAINS(run(L, "return json.encode({['a\"b\\\\'] = print})"), " at $[\"a\\\"b\\\\\"]:");
  CHECK_CONTAINS(run(L, "return json.encode({_ok1 = print})"), " at $._ok1:");
  CHECK_CONTAINS(run(L, "return json.encode({['1abc'] = print})"), " at $[\"1abc\"]:");
  CHECK_CONTAINS(run(L, "return json.encode({[''] = print})"), " at $[\"\"]:");
  CHECK_CONTAINS(run(L, "return json.encode({[1] = 1, [100] = print})"), " at $[100]:");
  CHECK_CONTAINS(run(L, "return json.encode({[1.5] = print})"), " at $[1.5]:");
  /* A long key is cut. */
  CHECK_CONTAINS(run(L, "return json.encode({[string.rep('k', 100)] = print})"),
                 " at $.kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk...:");
  /* A long path keeps its head and its tail. */
  const char *msg = run(L,
                        "local t = {} local cur = t "
                        "for i = 1, 300 do local n = {} cur.a_long_key_name = n cur = n end "
                        "cur.cb = print return json.encode(t)");
  CHECK_CONTAINS(msg, "cannot encode a function at $.a_long_key_name.a_long_key_name");
  CHECK_CONTAINS(msg, "...");
  CHECK_CONTAINS(msg, ".a_long_key_name.a_long_key_name.cb: only JSON values");
  CHECK(strlen(msg) < 600);
  lua_close(L);
}

TEST(encode_cycles) {
  lua_State *L = new_state();
  CHECK_RUN(L, "local t = {} t.a = t return json.encode(t)",
            "error: json.encode: cycle at $.a: a table cannot contain itself");
  CHECK_RUN(L, "local t = {a = {}} t.a.b = t.a return json.encode(t)",
            "error: json.encode: cycle at $.a.b: a table cannot contain itself");
  CHECK_RUN(L, "local t = json.array({}) t[1] = {x = t} return json.encode(t)",
            "error: json.encode: cycle at $[1].x: a table cannot contain itself");
  /* The same table twice, side by side, is no cycle. */
  CHECK_RUN(L, "local s = {1} return json.encode({s, s, {s}})", "[[1],[1],[[1]]]");
  lua_close(L);
}

TEST(encode_depth_limit) {
  lua_State *L = new_state();
  /* 500 nested tables: 499 arrays around an empty object. */
  const char *ok = run(L,
                       "local t = {} local cur = t "
                       "for i = 2, 500 do local n = {} cur[1] = n cur = n end "
                       "return json.encode(t)");
  CHECK_INT_EQ(strlen(ok), 1000);
  CHECK(!strncmp(ok, "[[[[", 4));
  const char *bad = run(L,
                        "local t = {} local cur = t "
                        "for i = 2, 501 do local n = {} cur[1] = n cur = n end "
                        "return json.encode(t)");
  CHECK_CONTAINS(bad, "error: json.encode: tables nested deeper than 500 levels at $[1][1][1]");
  lua_close(L);
}

TEST(array_and_object_markers) {
  lua_State *L = new_state();
  CHECK_RUN(L, "return json.encode(json.array({}))", "[]");
  CHECK_RUN(L, "return json.encode({list = json.array({})})", "{\"list\":[]}");
  CHECK_RUN(L, "return json.encode(json.object(json.array({})))", "{}");
  CHECK_RUN(L, "local t = {} return json.array(t) == t and json.object(t) == t", "true");
  /* Only 1..#t of a marked array is written. */
  CHECK_RUN(L, "local t = json.array({1, 2}) t.x = 3 return json.encode(t)", "[1,2]");
  CHECK_RUN(L, "return getmetatable(json.array({})) == getmetatable(json.decode('[]'))", "true");
  /* json.object leaves other metatables alone. */
  CHECK_RUN(L, "local mt = {} local t = setmetatable({}, mt) json.object(t) return getmetatable(t) == mt",
            "true");
  CHECK_RUN(L, "return getmetatable(json.object(json.decode('[1]')))", "nil");
  /* A marked object stays an object whatever its keys: number keys as the
  ** decimal strings of mixed tables, holes or not. */
  CHECK_RUN(L, "return json.encode(json.object({1, 2}))", "{\"1\":1,\"2\":2}");
  CHECK_RUN(L, "return json.encode(json.object({[3] = 'c', [1] = 'a'}))", "{\"1\":\"a\",\"3\":\"c\"}");
  CHECK_RUN(L, "return json.encode(json.object({}))", "{}");
  CHECK_RUN(L, "return json.encode(json.object(json.decode('[1, [2]]')))", "{\"1\":1,\"2\":[2]}");
  CHECK_RUN(L, "return json.encode({list = {1}, obj = json.object({1})})", "{\"list\":[1],\"obj\":{\"1\":1}}");
  /* The mark keeps the table's metatable, and the text decodes back to the same text. */
  CHECK_RUN(L, "local mt = {} local t = json.object(setmetatable({7}, mt)) "
               "return getmetatable(t) == mt and json.encode(t)", "{\"1\":7}");
  CHECK_RUN(L, "return json.encode(json.decode(json.encode(json.object({5, 6}))))", "{\"1\":5,\"2\":6}");
  /* json.array and json.object each take the other's mark away. */
  CHECK_RUN(L, "return json.encode(json.array(json.object({1, 2})))", "[1,2]");
  CHECK_RUN(L, "return json.encode(json.object(json.array({1, 2})))", "{\"1\":1,\"2\":2}");
  /* The mark does not keep its table alive. */
  CHECK_RUN(L, "local weak = setmetatable({}, {__mode = 'k'}) weak[json.object({1})] = true "
               "collectgarbage() collectgarbage() return next(weak) == nil", "true");
  CHECK_CONTAINS(run(L, "return json.array(5)"), "bad argument #1 to 'json.array' (table expected, got number)");
  CHECK_CONTAINS(run(L, "return json.object('x')"), "bad argument #1 to 'json.object' (table expected, got string)");
  lua_close(L);
}

TEST(lua_misuse_raises) {
  lua_State *L = new_state();
  CHECK_RUN(L, "return json.encode()", "error: bad argument #1 to 'json.encode' (value expected)");
  CHECK_CONTAINS(run(L, "return json.encode({}, 5)"), "bad argument #2 to 'json.encode' (table expected, got number)");
  CHECK_CONTAINS(run(L, "return json.decode()"), "bad argument #1 to 'json.decode' (string expected, got no value)");
  CHECK_CONTAINS(run(L, "return json.decode(42)"), "bad argument #1 to 'json.decode' (string expected, got number)");
  /* A failing call can be caught, and the message is the one above. */
  CHECK_RUN(L, "local ok, err = pcall(json.encode, {f = print}) return ok == false and err:sub(1, 13)",
            "json.encode: ");
  lua_close(L);
}

TEST(json_null) {
  lua_State *L = new_state();
  CHECK_RUN(L, "return type(json.null)", "userdata");
  CHECK_RUN(L, "return json.decode('null') == json.null", "true");
  CHECK_RUN(L, "return json.encode({a = json.null})", "{\"a\":null}");
  lua_pushlightuserdata(L, NULL);
  CHECK(json_is_null(L, -1));
  lua_pushboolean(L, 0);
  CHECK(!json_is_null(L, -1));
  lua_pushnil(L);
  CHECK(!json_is_null(L, -1));
  lua_getglobal(L, "lightud");
  CHECK(!json_is_null(L, -1));
  lua_close(L);
}

TEST(decode_values) {
  lua_State *L = new_state();
  CHECK_RUN(L,
            "local v = json.decode('{\"a\":[1,2,{\"b\":null}],\"c\":\"x\",\"d\":true,\"e\":false,\"f\":-1.5e2}') "
            "return table.concat({#v.a, tostring(v.a[3].b == json.null), v.c, tostring(v.d), tostring(v.e), v.f}, ',')",
            "3,true,x,true,false,-150");
  CHECK_RUN(L, "local v = json.decode('{\"a\":[]}') return getmetatable(v) == nil and getmetatable(v.a) ~= nil",
            "true");
  CHECK_RUN(L, "local a = json.decode('[null,null,1,null]') return #a .. ' ' .. tostring(a[4] == json.null)",
            "4 true");
  CHECK_RUN(L, "return json.decode('{\"k\":null}').k == json.null", "true");
  CHECK_RUN(L, "return json.decode('{\"a\":1,\"a\":2}').a", "2");
  CHECK_RUN(L, "return json.decode('42')", "42");
  CHECK_RUN(L, "return json.decode(' \\n\"s\"\\t ')", "s");
  CHECK_RUN(L, "return json.decode('true')", "true");
  CHECK_RUN(L, "return json.decode('1764435084123') == 1764435084123", "true");
  CHECK_RUN(L, "return json.decode('9007199254740993') == 2^53", "true");
  lua_close(L);
}

TEST(decode_unicode) {
  lua_State *L = new_state();
  CHECK_RUN(L, "return json.decode('\"\\\\u00e9\\\\u2603\\\\ud83d\\\\ude00\"')", "\xC3\xA9\xE2\x98\x83\xF0\x9F\x98\x80");
  CHECK_RUN(L, "return json.decode('\"h\xC3\xA9llo\"')", "h\xC3\xA9llo");
  CHECK_RUN(L, "return json.decode('{\"\xC3\xA9t\xC3\xA9\":1}')['\xC3\xA9t\xC3\xA9']", "1");
  /* An escaped backslash before "u0000" is no NUL escape. */
  CHECK_RUN(L, "return json.decode('\"a\\\\\\\\u0000\"')", "a\\u0000");
  lua_close(L);
}

TEST(decode_errors_give_line_column_and_excerpt) {
  lua_State *L = new_state();
  CHECK_RUN(L, "return json.decode('{\\n  \"a\": tru\\n}')",
            "error: json.decode: invalid JSON at line 2 column 8 near 'tru\\n}'");
  CHECK_RUN(L, "return json.decode('[1,]')", "error: json.decode: invalid JSON at line 1 column 4 near ']'");
  CHECK_RUN(L, "return json.decode('[1, 2, @' .. string.rep('x', 50) .. ']')",
            "error: json.decode: invalid JSON at line 1 column 8 near '@xxxxxxxxxxxxxxxxxxx'");
  CHECK_RUN(L, "return json.decode('{\"a\" 1}')", "error: json.decode: invalid JSON at line 1 column 6 near '1}'");
  /* The excerpt does not split a UTF-8 sequence: 'x' and 9 two-byte letters. */
  CHECK_RUN(L, "return json.decode('[x' .. string.rep('\xC3\xA9', 15))",
            "error: json.decode: invalid JSON at line 1 column 2 near 'x"
            "\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9'");
  /* cJSON stops inside the two-byte letter: the excerpt starts at its first byte. */
  CHECK_RUN(L, "return json.decode('{\xDE\x92}')",
            "error: json.decode: invalid JSON at line 1 column 2 near '\xDE\x92}'");
  CHECK_RUN(L, "return json.decode('[1,\\n\\n  @\\1]')",
            "error: json.decode: invalid JSON at line 3 column 3 near '@\\x01]'");
  lua_close(L);
}

TEST(decode_errors_empty_truncated_trailing) {
  lua_State *L = new_state();
  CHECK_RUN(L, "return json.decode('')", "error: json.decode: empty input");
  CHECK_RUN(L, "return json.decode(' \\n\\t ')", "error: json.decode: empty input");
  CHECK_RUN(L, "return json.decode('[1,2')",
            "error: json.decode: invalid JSON at line 1 column 5: unexpected end of input");
  CHECK_RUN(L, "return json.decode('{\"a\":1')",
            "error: json.decode: invalid JSON at line 1 column 7: unexpected end of input");
  CHECK_RUN(L, "return json.decode('[1] x')",
            "error: json.decode: invalid JSON at line 1 column 5 near 'x': unexpected text after the JSON value");
  CHECK_RUN(L, "return json.decode('{}{}')",
            "error: json.decode: invalid JSON at line 1 column 3 near '{}': unexpected text after the JSON value");
  CHECK_RUN(L, "return json.decode('[1]\\0')",
            "error: json.decode: invalid JSON at line 1 column 4 near '\\x00': unexpected text after the JSON value");
  CHECK_RUN(L, "return json.decode('\"a\\\\u0000b\"')",
            "error: json.decode: invalid JSON at line 1 column 3 near '\\u0000b\"': "
            "\\u0000 (NUL) in strings is not supported");
  /* A number beyond a double's range is an error, not infinity (docs/skills.md). */
  CHECK_RUN(L, "return json.decode('1e400')",
            "error: json.decode: invalid JSON: the number at $ is out of range (a double reaches about 1.8e308)");
  CHECK_RUN(L, "return json.decode('{\"n\": [1, -1e400]}')",
            "error: json.decode: invalid JSON: the number at $.n[2] is out of range (a double reaches about 1.8e308)");
  CHECK_RUN(L, "return json.decode('1e-400')", "0");
  lua_close(L);
}

TEST(decode_depth_limit) {
  lua_State *L = new_state();
  CHECK_RUN(L, "local v = json.decode(string.rep('[', 1000) .. string.rep(']', 1000)) "
               "local d = 0 while v do d = d + 1 v = v[1] end return d",
            "1000");
  CHECK_RUN(L, "return json.decode(string.rep('[', 1001) .. string.rep(']', 1001))",
            "error: json.decode: invalid JSON at line 1 column 1001 near '[]]]]]]]]]]]]]]]]]]]': "
            "nested deeper than 1000 levels");
  lua_close(L);
}

TEST(round_trips_are_exact) {
  static const char *texts[] = {
    "[]",
    "{}",
    "[[],{}]",
    "{\"a\":[]}",
    "[null,null]",
    "{\"a\":null}",
    "{\"a\":{\"b\":[null,{\"c\":null}],\"d\":[[]]}}",
    "[1764435084123,9007199254740992,-9007199254740992,1152921504606846976]",
    "[0.1,1.5,-2.25,1e-07,1e+21,0.30000000000000004,5e-324]",
    "{\"a\":1,\"b\":[true,false],\"c\":\"x\\ny\",\"d\":{\"e\":\"\\u0001\"}}",
    "\"h\xC3\xA9llo \xE2\x98\x83 \xF0\x9F\x98\x80\"",
    "[\"\\\"\\\\/\\b\\f\\n\\r\\t\"]",
    "{\"1\":\"a\",\"2\":\"b\"}",
    "[{\"10\":1,\"9\":2}]",
  };
  lua_State *L = new_state();
  for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
    lua_pushstring(L, texts[i]);
    lua_setglobal(L, "text");
    CHECK_STR_EQ(run(L, "return json.encode(json.decode(text))"), texts[i]);
    CHECK_STR_EQ(run(L, "return json.encode(json.decode(json.encode(json.decode(text))))"), texts[i]);
  }
  /* From Lua values: encode, decode, encode gives the same text. */
  CHECK_RUN(L,
            "local v = {name = 'x', list = json.array({}), obj = {}, n = {1, json.null, 3}, "
            "           deep = {{{{a = {json.null}}}}}, ts = 1764435084123, f = 0.1 + 0.2, s = {[1] = 1, [3] = 3}} "
            "local t1 = json.encode(v) local t2 = json.encode(json.decode(t1)) "
            "return t1 == t2 and t1",
            "{\"deep\":[[[{\"a\":[null]}]]],\"f\":0.30000000000000004,\"list\":[],\"n\":[1,null,3],"
            "\"name\":\"x\",\"obj\":{},\"s\":[1,null,3],\"ts\":1764435084123}");
  lua_close(L);
}

TEST(big_documents) {
  lua_State *L = new_state();
  CHECK_RUN(L,
            "local t = {} for i = 1, 10000 do t[i] = {id = i, name = 'item' .. i, tags = json.array({})} end "
            "local s = json.encode(t) local v = json.decode(s) "
            "local sum = 0 for i = 1, #v do sum = sum + v[i].id end "
            "return #v .. ' ' .. sum .. ' ' .. v[9999].name .. ' ' .. tostring(json.encode(v) == s)",
            "10000 50005000 item9999 true");
  CHECK_RUN(L,
            "local t = {} for i = 1, 10000 do t['k' .. i] = i end "
            "local v = json.decode(json.encode(t)) local n = 0 for k, x in pairs(v) do n = n + 1 end "
            "return n .. ' ' .. v.k777",
            "10000 777");
  CHECK_RUN(L, "local s = string.rep('x', 1000000) return #json.decode(json.encode({s}))[1]", "1000000");
  lua_close(L);
}

TEST(pretty_printing) {
  lua_State *L = new_state();
  CHECK_RUN(L, "return json.encode({a = {1, 2}}, {pretty = true})", "{\n\t\"a\":\t[1, 2]\n}");
  CHECK_RUN(L, "return json.encode({a = {1, 2}}, {pretty = false})", "{\"a\":[1,2]}");
  CHECK_RUN(L, "return json.encode({a = {1, 2}}, {})", "{\"a\":[1,2]}");
  CHECK_RUN(L,
            "local v = {x = {y = {1, json.null, 'z'}}, e = json.array({})} "
            "return json.encode(json.decode(json.encode(v, {pretty = true}))) == json.encode(v)",
            "true");
  lua_close(L);
}

/* ---- the C API ---- */

TEST(c_encode_limit) {
  lua_State *L = new_state();
  err_t e;
  size_t n = 0;
  CHECK_INT_EQ(luaL_dostring(L, "return {1, 2, 3}"), 0);
  char *s = json_encode(L, -1, 7, &n, &e);
  CHECK_STR_EQ(s, "[1,2,3]");
  CHECK_INT_EQ(n, 7);
  free(s);
  e.code = 0;
  CHECK(json_encode(L, -1, 6, &n, &e) == NULL);
  CHECK_INT_EQ(e.code, ERR_TOOBIG);
  CHECK_STR_EQ(e.msg, "JSON text is 7 B, over the limit of 6 B");
  CHECK_INT_EQ(lua_gettop(L), 1);
  lua_settop(L, 0);

  CHECK_INT_EQ(luaL_dostring(L, "return {string.rep('x', 2411724)}"), 0);
  CHECK(json_encode(L, 1, 1048576, &n, &e) == NULL);
  CHECK_INT_EQ(e.code, ERR_TOOBIG);
  CHECK_STR_EQ(e.msg, "JSON text is 2.3 MB, over the limit of 1.0 MB");
  lua_settop(L, 0);
  /* Sizes that round alike also show bytes. */
  CHECK_INT_EQ(luaL_dostring(L, "return string.rep('x', 1048575)"), 0);
  CHECK(json_encode(L, 1, 1048576, &n, &e) == NULL);
  CHECK_STR_EQ(e.msg, "JSON text is 1048577 bytes, over the limit of 1048576 bytes");
  s = json_encode(L, 1, 1048577, &n, &e);
  CHECK(s != NULL);
  CHECK_INT_EQ(n, 1048577);
  free(s);
  s = json_encode(L, 1, 0, NULL, &e);
  CHECK(s != NULL);
  free(s);
  lua_close(L);
}

TEST(c_encode_error_leaves_stack) {
  lua_State *L = new_state();
  err_t e;
  CHECK_INT_EQ(luaL_dostring(L, "return {a = {b = {print}}}"), 0);
  lua_pushinteger(L, 7);
  CHECK(json_encode(L, 1, 0, NULL, &e) == NULL);
  CHECK_INT_EQ(e.code, ERR_INVALID);
  CHECK_CONTAINS(e.msg, "cannot encode a function at $.a.b[1]: ");
  CHECK_INT_EQ(lua_gettop(L), 2);
  CHECK_INT_EQ(lua_tointeger(L, -1), 7);
  lua_close(L);
}

TEST(c_from_lua_tree) {
  lua_State *L = new_state();
  err_t e;
  CHECK_INT_EQ(luaL_dostring(L, "return {n = 5, big = 2^53, ts = 1764435084123, f = 0.1 + 0.2, s = 'x', a = json.array({})}"), 0);
  cJSON *t = json_from_lua(L, -1, &e);
  CHECK(t != NULL);
  CHECK_INT_EQ(lua_gettop(L), 1);
  if (t) {
    CHECK(cJSON_IsObject(t));
    CHECK(cJSON_IsNumber(cJSON_GetObjectItem(t, "n")));
    CHECK(cJSON_IsNumber(cJSON_GetObjectItem(t, "ts")));
    CHECK(cJSON_GetObjectItem(t, "ts")->valuedouble == 1764435084123.0);
    /* Numbers cJSON would print inexactly are raw text, with valuedouble. */
    cJSON *big = cJSON_GetObjectItem(t, "big");
    CHECK(cJSON_IsRaw(big));
    CHECK_STR_EQ(big->valuestring, "9007199254740992");
    CHECK(big->valuedouble == 9007199254740992.0);
    CHECK(cJSON_IsRaw(cJSON_GetObjectItem(t, "f")));
    CHECK_STR_EQ(cJSON_GetObjectItem(t, "s")->valuestring, "x");
    CHECK(cJSON_IsArray(cJSON_GetObjectItem(t, "a")));
    /* json_push reads raw items back as numbers. */
    CHECK_INT_EQ(json_push(L, t, &e), 0);
    lua_setglobal(L, "back");
    CHECK_RUN(L, "return back.big == 2^53 and back.f == 0.1 + 0.2 and back.n == 5 and getmetatable(back.a) ~= nil",
              "true");
    cJSON_Delete(t);
  }
  lua_close(L);
}

TEST(c_push_tree) {
  lua_State *L = new_state();
  err_t e;
  cJSON *t = cJSON_Parse("{\"a\":[1,null,{\"b\":\"c\"}],\"n\":null}");
  CHECK_INT_EQ(json_push(L, t, &e), 0);
  CHECK_INT_EQ(lua_gettop(L), 1);
  lua_setglobal(L, "v");
  CHECK_RUN(L, "return #v.a .. tostring(v.a[2] == json.null) .. v.a[3].b .. tostring(v.n == json.null)",
            "3truectrue");
  cJSON_Delete(t);
  CHECK(json_push(L, NULL, &e) < 0);
  /* A raw item that is not JSON is refused, and nothing stays pushed. */
  t = cJSON_CreateArray();
  cJSON_AddItemToArray(t, cJSON_CreateNumber(1));
  cJSON_AddItemToArray(t, cJSON_CreateRaw("{oops"));
  CHECK_INT_EQ(json_push(L, t, &e), ERR_INVALID);
  CHECK_CONTAINS(e.msg, "raw");
  CHECK_INT_EQ(lua_gettop(L), 0);
  cJSON_Delete(t);
  lua_close(L);
}

TEST(c_decode_push) {
  lua_State *L = new_state();
  err_t e;
  /* The text need not end in NUL: only len bytes are read. */
  const char *s = "[1,2]xyz";
  CHECK_INT_EQ(json_decode_push(L, s, 5, &e), 0);
  CHECK_INT_EQ(lua_gettop(L), 1);
  CHECK_INT_EQ(lua_objlen(L, 1), 2);
  lua_settop(L, 0);
  CHECK_INT_EQ(json_decode_push(L, s, 8, &e), ERR_INVALID);
  CHECK_STR_EQ(e.msg, "invalid JSON at line 1 column 6 near 'xyz': unexpected text after the JSON value");
  CHECK_INT_EQ(lua_gettop(L), 0);
  CHECK_INT_EQ(json_decode_push(L, "{\"a\":1}", 6, &e), ERR_INVALID);
  CHECK_STR_EQ(e.msg, "invalid JSON at line 1 column 7: unexpected end of input");
  CHECK_INT_EQ(json_decode_push(L, "", 0, &e), ERR_INVALID);
  CHECK_STR_EQ(e.msg, "empty input");
  CHECK_INT_EQ(json_decode_push(L, "  7 ", 4, &e), 0);
  CHECK(lua_tonumber(L, -1) == 7);
  lua_close(L);
}

TEST(c_open_sets_no_global) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  CHECK_INT_EQ(json_open(L), 1);
  CHECK(lua_istable(L, -1));
  lua_getglobal(L, "json");
  CHECK(lua_isnil(L, -1));
  lua_pop(L, 1);
  lua_getfield(L, -1, "null");
  CHECK(json_is_null(L, -1));
  lua_pop(L, 1);
  const char *names[] = {"encode", "decode", "array", "object"};
  for (int i = 0; i < 4; i++) {
    lua_getfield(L, -1, names[i]);
    CHECK(lua_iscfunction(L, -1));
    lua_pop(L, 1);
  }
  lua_close(L);
}

/* jsontext_sort_keys: one value prints one way whatever the order of its
** keys, at every depth (objects inside arrays too); arrays keep their
** order; a repeated key keeps its members' order. */
TEST(jsontext_sort_keys) {
  const char *in[][2] = {
      {"{\"b\":2,\"a\":{\"y\":[{\"d\":1,\"c\":2}],\"x\":1}}", "{\"a\":{\"x\":1,\"y\":[{\"c\":2,\"d\":1}]},\"b\":2}"},
      {"[3,{\"z\":0,\"m\":1},1]", "[3,{\"m\":1,\"z\":0},1]"},
      {"{\"k\":1,\"a\":0,\"k\":2}", "{\"a\":0,\"k\":1,\"k\":2}"},
      {"{}", "{}"},
      {"\"s\"", "\"s\""},
  };
  for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
    cJSON *v = cJSON_Parse(in[i][0]);
    jsontext_sort_keys(v);
    char *t = jsontext_print_text(v);
    CHECK_STR_EQ(t, in[i][1]);
    free(t);
    cJSON_Delete(v);
  }
}

/* The JSON writer behind run records (jsontext_put_*): escaping as cJSON
** does, bytes that are not UTF-8 shown as U+FFFD, JSON text embedded as it
** is, text that is not JSON written as a string. */
TEST(jsontext_writer) {
  buf_t b = BUF_INIT;
  jsontext_put_string(&b, "a\"b\\c\n\x01/\xc3\xa9", 10);
  CHECK_STR_EQ(buf_str(&b), "\"a\\\"b\\\\c\\n\\u0001/\xc3\xa9\"");
  buf_reset(&b);
  jsontext_put_string(&b, "x\xffy", 3);
  CHECK_STR_EQ(buf_str(&b), "\"x\xef\xbf\xbdy\"");
  buf_reset(&b);
  jsontext_put_value(&b, " {\"a\": [1, 2]} ", 15);
  CHECK_STR_EQ(buf_str(&b), "{\"a\": [1, 2]}");
  buf_reset(&b);
  jsontext_put_value(&b, "plain words", 11);
  CHECK_STR_EQ(buf_str(&b), "\"plain words\"");
  buf_reset(&b);
  jsontext_put_value(&b, "{\"a\":\"\xff\"}", 9);
  CHECK_STR_EQ(buf_str(&b), "{\"a\":\"\xef\xbf\xbd\"}");
  buf_reset(&b);
  jsontext_put_value(&b, NULL, 0);
  jsontext_put_int(&b, -1234567890123LL);
  CHECK_STR_EQ(buf_str(&b), "null-1234567890123");
  buf_free(&b);
}

/* jsontext_print writes what cJSON_PrintUnformatted writes, byte for
** byte (the HTTP routes and json.encode print with it): escapes, nesting,
** whole numbers in and out of an int's range, negative zero; and an
** invoke's trigger as cJSON printed it. Numbers are exact where cJSON
** rounds them (15 digits within an epsilon: 0.30000000000000004 came back
** as 0.3, 2^53 as 9.00719925474099e+15, the largest double as a text
** that reads back as infinity), indented text too. */
TEST(jsontext_print_is_cjsons) {
  static const char *const docs[] = {
    "0", "-0", "1", "-1", "2147483647", "2147483648", "-2147483649", "3e9", "123456789012345",
    "999999999999999", "1.5", "0.1", "-0.3", "1e-7",
    "\"a\\\"b\\\\c\\n\\u0001/\u00e9\\u001f\\t\\b\\f\\r\"", "\"\"", "true", "false", "null",
    "[]", "{}", "[1,[2,[3,{\"k\":[]}]],\"x\"]", "{\"a\":{\"b\\n\":[1.25,null,true]},\"\":0}",
  };
  for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
    cJSON *v = cJSON_Parse(docs[i]);
    CHECK(v != NULL);
    char *want = cJSON_PrintUnformatted(v), *got = jsontext_print_text(v);
    CHECK_STR_EQ(got, want);
    free(want), free(got);
    cJSON_Delete(v);
  }
  static const char *const exact[][2] = {
    {"0.30000000000000004", "0.30000000000000004"}, {"9007199254740992", "9007199254740992"},
    {"9007199254740993", "9007199254740992"}, {"1.0000000000000002", "1.0000000000000002"},
    {"1e15", "1000000000000000"}, {"12345.678901234567", "12345.678901234567"},
    {"-4.9406564584124654e-324", "-5e-324"}, {"5e-324", "5e-324"}, {"123456789012345680000", "123456789012345683968"},
    {"-1e15", "-1000000000000000"}, {"1.7976931348623157e308", "1.7976931348623157e+308"},
    {"1e21", "1e+21"}, {"[0.1,0.30000000000000004]", "[0.1,0.30000000000000004]"},
  };
  for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++) {
    cJSON *v = cJSON_Parse(exact[i][0]);
    CHECK(v != NULL);
    char *got = jsontext_print_text(v);
    CHECK_STR_EQ(got, exact[i][1]);
    free(got);
    got = jsontext_print_pretty(v);
    if (exact[i][0][0] != '[') CHECK_STR_EQ(got, exact[i][1]);
    else CHECK_STR_EQ(got, "[0.1, 0.30000000000000004]");
    free(got);
    cJSON_Delete(v);
  }
  char trig[128];
  CHECK_INT_EQ(jsontext_invoke_trigger("http", "order \"42\"\n", trig, sizeof trig), 0);
  CHECK_STR_EQ(trig, "{\"kind\":\"invoke\",\"by\":\"http\",\"key\":\"order \\\"42\\\"\\n\"}");
  CHECK_INT_EQ(jsontext_invoke_trigger("http", NULL, trig, 20), -1);
}

int main(void) {
  RUN(jsontext_writer);
  RUN(jsontext_print_is_cjsons);
  RUN(encode_scalars);
  RUN(encode_numbers_are_exact);
  RUN(encode_large_integers);
  RUN(encode_nan_and_infinity_fail_with_path);
  RUN(encode_strings);
  RUN(encode_sequences_as_arrays);
  RUN(encode_sparse_tables);
  RUN(encode_objects);
  RUN(encode_key_order_does_not_depend_on_history);
  RUN(encode_bad_keys_name_path_and_type);
  RUN(encode_bad_values_name_path_and_type);
  RUN(error_paths);
  RUN(encode_cycles);
  RUN(encode_depth_limit);
  RUN(array_and_object_markers);
  RUN(lua_misuse_raises);
  RUN(json_null);
  RUN(decode_values);
  RUN(decode_unicode);
  RUN(decode_errors_give_line_column_and_excerpt);
  RUN(decode_errors_empty_truncated_trailing);
  RUN(decode_depth_limit);
  RUN(round_trips_are_exact);
  RUN(big_documents);
  RUN(pretty_printing);
  RUN(c_encode_limit);
  RUN(c_encode_error_leaves_stack);
  RUN(c_from_lua_tree);
  RUN(c_push_tree);
  RUN(c_decode_push);
  RUN(c_open_sets_no_global);
  RUN(jsontext_sort_keys);
  return test_summary();
}
