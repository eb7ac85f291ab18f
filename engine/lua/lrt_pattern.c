/*
** lrt_pattern.c: string.find/match/gmatch/gsub under the time budget.
**
** These functions spend all their time inside one C call, where the count
** hook never fires: a backtracking pattern such as ("a*"):rep(3) .. "b" on
** a long string runs for hours, and LuaJIT's plain find is O(n*m). These
** are the same functions (Lua 5.1's matcher, with LuaJIT's ASCII character
** classes, its "pattern too complex" depth limit and its gmatch/gsub
** rules), checking the slice's deadline every PAT_CHECK steps; the sandbox
** installs them in the string library that skill code sees (and in the
** string metatable). Plain finds use memmem, which is linear.
**
** Invariants: a match never runs more than PAT_CHECK steps past the
** slice's deadline (then the slice is killed, as by the hook, and the kill
** is raised where skill code called the function); outside a slice (the
** runtime's own calls) there is no deadline. Results and error messages
** are LuaJIT's.
*/
#include "lua/lrt_int.h"

#include <lauxlib.h>
#include <string.h>

#define PAT_MAXCAPTURES 32
#define PAT_MAXDEPTH 200 /* LuaJIT's LJ_MAX_XLEVEL */
#define PAT_CHECK 0x3fff
#define CAP_UNFINISHED (-1)
#define CAP_POSITION (-2)
#define L_ESC '%'
#define PAT_SPECIALS "^$*+?.([%-"

/* One match in progress: the subject, the captures so far, the recursion
** depth, and the steps counted towards the next deadline check. */
typedef struct {
  const char *src_init, *src_end;
  lua_State *L;
  lrt_t *r;
  int level, depth;
  unsigned steps;
  struct {
    const char *init;
    ptrdiff_t len;
  } capture[PAT_MAXCAPTURES];
} pat_state;

/* One step of a match: every PAT_CHECK steps, kill the slice (and raise
** in the caller of string.find & co.) if it ran past its deadline. */
static void pat_tick(pat_state *ms) {
  if ((++ms->steps & PAT_CHECK) != 0) return;
  lrt_t *r = ms->r;
  if (r->in_slice && !r->killed && lrt__slice_over(r)) {
    lrt__kill_time(r);
    lrt__raise_kill(ms->L, 1);
  }
}

/* LuaJIT's character classes: ASCII only, whatever the locale. */
static int pc_upper(int c) { return c >= 'A' && c <= 'Z'; }
static int pc_lower(int c) { return c >= 'a' && c <= 'z'; }
static int pc_alpha(int c) { return pc_upper(c) || pc_lower(c); }
static int pc_digit(int c) { return c >= '0' && c <= '9'; }
static int pc_alnum(int c) { return pc_alpha(c) || pc_digit(c); }
static int pc_space(int c) { return c == ' ' || (c >= 9 && c <= 13); }
static int pc_cntrl(int c) { return c < 32 || c == 127; }
static int pc_punct(int c) { return c > 32 && c < 127 && !pc_alnum(c); }
static int pc_xdigit(int c) { return pc_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
static int pc_tolower(int c) { return pc_upper(c) ? c + 32 : c; }

/* The index of back reference %l (l is its digit); raises if it is not a
** closed capture. */
static int pat_check_capture(pat_state *ms, int l) {
  l -= '1';
  if (l < 0 || l >= ms->level || ms->capture[l].len == CAP_UNFINISHED)
    return luaL_error(ms->L, "invalid capture index");
  return l;
}

/* The innermost capture still open (for a ')'); raises if none is. */
static int pat_capture_to_close(pat_state *ms) {
  int level = ms->level;
  for (level--; level >= 0; level--)
    if (ms->capture[level].len == CAP_UNFINISHED) return level;
  return luaL_error(ms->L, "invalid pattern capture");
}

/* The end of the single-character class that starts at p ("%a", "[...]",
** or one character); raises on a malformed one. */
static const char *pat_classend(pat_state *ms, const char *p) {
  switch (*p++) {
  case L_ESC:
    if (*p == '\0') luaL_error(ms->L, "malformed pattern (ends with '%%')");
    return p + 1;
  case '[':
    if (*p == '^') p++;
    do { /* look for a `]' */
      if (*p == '\0') luaL_error(ms->L, "malformed pattern (missing ']')");
      if (*(p++) == L_ESC && *p != '\0') p++; /* skip escapes (e.g. `%]') */
    } while (*p != ']');
    return p + 1;
  default:
    return p;
  }
}

/* Whether c is in class %cl (an upper-case class is the complement). */
static int pat_match_class(int c, int cl) {
  int res;
  switch (pc_tolower(cl)) {
  case 'a': res = pc_alpha(c); break;
  case 'c': res = pc_cntrl(c); break;
  case 'd': res = pc_digit(c); break;
  case 'g': res = c > 32 && c < 127; break;
  case 'l': res = pc_lower(c); break;
  case 'p': res = pc_punct(c); break;
  case 's': res = pc_space(c); break;
  case 'u': res = pc_upper(c); break;
  case 'w': res = pc_alnum(c); break;
  case 'x': res = pc_xdigit(c); break;
  case 'z': res = (c == 0); break;
  default: return (cl == c);
  }
  if (pc_upper(cl)) res = !res;
  return res;
}

/* Whether c is in the set "[...]" from p to ec (ec at its ']'). */
static int pat_match_bracket(int c, const char *p, const char *ec) {
  int sig = 1;
  if (*(p + 1) == '^') {
    sig = 0;
    p++; /* skip the `^' */
  }
  while (++p < ec) {
    if (*p == L_ESC) {
      p++;
      if (pat_match_class(c, (unsigned char)*p)) return sig;
    } else if (*(p + 1) == '-' && (p + 2 < ec)) {
      p += 2;
      if ((unsigned char)*(p - 2) <= c && c <= (unsigned char)*p) return sig;
    } else if ((unsigned char)*p == c) {
      return sig;
    }
  }
  return !sig;
}

/* Whether c matches the single-character class from p to ep. */
static int pat_single(int c, const char *p, const char *ep) {
  switch (*p) {
  case '.': return 1;
  case L_ESC: return pat_match_class(c, (unsigned char)*(p + 1));
  case '[': return pat_match_bracket(c, p, ep - 1);
  default: return ((unsigned char)*p == c);
  }
}

static const char *pat_match(pat_state *ms, const char *s, const char *p);

/* %bxy at s: the end of the balanced text, or NULL. */
static const char *pat_balance(pat_state *ms, const char *s, const char *p) {
  if (*p == 0 || *(p + 1) == 0) luaL_error(ms->L, "unbalanced pattern");
  if (*s != *p) return NULL;
  int b = *p, e = *(p + 1), cont = 1;
  while (++s < ms->src_end) {
    if (*s == e) {
      if (--cont == 0) return s + 1;
    } else if (*s == b) {
      cont++;
    }
  }
  return NULL;
}

/* The item p..ep repeated greedily ("*", "+") at s, then the rest of the
** pattern: the end of the match, or NULL. */
static const char *pat_max_expand(pat_state *ms, const char *s, const char *p, const char *ep) {
  ptrdiff_t i = 0;
  while ((s + i) < ms->src_end && pat_single((unsigned char)*(s + i), p, ep)) i++;
  /* try with maximum repetitions; then fewer */
  while (i >= 0) {
    const char *res = pat_match(ms, (s + i), ep + 1);
    if (res) return res;
    i--;
  }
  return NULL;
}

/* The item p..ep repeated lazily ("-") at s, then the rest of the
** pattern: the end of the match, or NULL. */
static const char *pat_min_expand(pat_state *ms, const char *s, const char *p, const char *ep) {
  for (;;) {
    const char *res = pat_match(ms, s, ep + 1);
    if (res != NULL) return res;
    if (s < ms->src_end && pat_single((unsigned char)*s, p, ep)) s++;
    else return NULL;
  }
}

/* Open a capture (what: CAP_UNFINISHED or CAP_POSITION) at s and match
** the rest; the capture is undone if that fails. */
static const char *pat_start_capture(pat_state *ms, const char *s, const char *p, int what) {
  int level = ms->level;
  if (level >= PAT_MAXCAPTURES) luaL_error(ms->L, "too many captures");
  ms->capture[level].init = s;
  ms->capture[level].len = what;
  ms->level = level + 1;
  const char *res = pat_match(ms, s, p);
  if (res == NULL) ms->level--; /* undo capture */
  return res;
}

/* Close the innermost open capture at s and match the rest; reopened if
** that fails. */
static const char *pat_end_capture(pat_state *ms, const char *s, const char *p) {
  int l = pat_capture_to_close(ms);
  ms->capture[l].len = s - ms->capture[l].init; /* close capture */
  const char *res = pat_match(ms, s, p);
  if (res == NULL) ms->capture[l].len = CAP_UNFINISHED; /* undo capture */
  return res;
}

/* A back reference (%1-%9) at s: the end of the repeated text, or NULL. */
static const char *pat_match_capture(pat_state *ms, const char *s, int l) {
  l = pat_check_capture(ms, l);
  size_t len = (size_t)ms->capture[l].len;
  if ((size_t)(ms->src_end - s) >= len && memcmp(ms->capture[l].init, s, len) == 0)
    return s + len;
  return NULL;
}

/* Match pattern p at s: the end of the match, or NULL. Raises "pattern too
** complex" past PAT_MAXDEPTH nested calls, and the kill past the deadline. */
static const char *pat_match(pat_state *ms, const char *s, const char *p) {
  pat_tick(ms);
  if (++ms->depth > PAT_MAXDEPTH) luaL_error(ms->L, "pattern too complex");
init: /* using goto's to optimize tail recursion */
  switch (*p) {
  case '(': /* start capture */
    if (*(p + 1) == ')') s = pat_start_capture(ms, s, p + 2, CAP_POSITION);
    else s = pat_start_capture(ms, s, p + 1, CAP_UNFINISHED);
    break;
  case ')': /* end capture */
    s = pat_end_capture(ms, s, p + 1);
    break;
  case L_ESC:
    switch (*(p + 1)) {
    case 'b': /* balanced string? */
      s = pat_balance(ms, s, p + 2);
      if (s == NULL) break;
      p += 4;
      goto init;
    case 'f': { /* frontier? */
      const char *ep;
      char previous;
      p += 2;
      if (*p != '[') luaL_error(ms->L, "missing '[' after '%%f' in pattern");
      ep = pat_classend(ms, p);
      previous = (s == ms->src_init) ? '\0' : *(s - 1);
      if (pat_match_bracket((unsigned char)previous, p, ep - 1) ||
          !pat_match_bracket((unsigned char)*s, p, ep - 1)) {
        s = NULL;
        break;
      }
      p = ep;
      goto init;
    }
    default:
      if (pc_digit((unsigned char)*(p + 1))) { /* capture results (%0-%9)? */
        s = pat_match_capture(ms, s, (unsigned char)*(p + 1));
        if (s == NULL) break;
        p += 2;
        goto init;
      }
      goto dflt;
    }
    break;
  case '\0': /* end of pattern */
    break;   /* match succeeded */
  case '$':
    if (*(p + 1) != '\0') goto dflt; /* not the last char of the pattern */
    if (s != ms->src_end) s = NULL;  /* check end of string */
    break;
  default:
  dflt: { /* a pattern item */
    const char *ep = pat_classend(ms, p);
    int m = s < ms->src_end && pat_single((unsigned char)*s, p, ep);
    switch (*ep) {
    case '?': {
      const char *res;
      if (m && ((res = pat_match(ms, s + 1, ep + 1)) != NULL)) {
        s = res;
        break;
      }
      p = ep + 1;
      goto init;
    }
    case '*': s = pat_max_expand(ms, s, p, ep); break;
    case '+': s = (m ? pat_max_expand(ms, s + 1, p, ep) : NULL); break;
    case '-': s = pat_min_expand(ms, s, p, ep); break;
    default:
      if (m) {
        s++;
        p = ep;
        goto init;
      }
      s = NULL;
      break;
    }
    break;
  }
  }
  ms->depth--;
  return s;
}

/* Push capture i of the match s..e (i 0 with no captures: the whole match). */
static void pat_push_one(pat_state *ms, int i, const char *s, const char *e) {
  if (i >= ms->level) {
    if (i == 0) lua_pushlstring(ms->L, s, (size_t)(e - s)); /* whole match */
    else luaL_error(ms->L, "invalid capture index");
  } else {
    ptrdiff_t l = ms->capture[i].len;
    if (l == CAP_UNFINISHED) luaL_error(ms->L, "unfinished capture");
    if (l == CAP_POSITION) lua_pushinteger(ms->L, ms->capture[i].init - ms->src_init + 1);
    else lua_pushlstring(ms->L, ms->capture[i].init, (size_t)l);
  }
}

/* Push every capture of the match s..e (or the whole match when there are
** none and s is not NULL); returns how many. */
static int pat_push_captures(pat_state *ms, const char *s, const char *e) {
  int nlevels = (ms->level == 0 && s) ? 1 : ms->level;
  luaL_checkstack(ms->L, nlevels, "too many captures");
  for (int i = 0; i < nlevels; i++) pat_push_one(ms, i, s, e);
  return nlevels;
}

/* Start matching in subject s (ls bytes) for the function running in L. */
static void pat_init(pat_state *ms, lua_State *L, const char *s, size_t ls) {
  ms->L = L;
  ms->r = lrt_from(L);
  ms->src_init = s;
  ms->src_end = s + ls;
  ms->steps = 0;
}

/* Whether pattern p (lp bytes) has a special character: if not, a find is
** a plain search. */
static int pat_has_specials(const char *p, size_t lp) {
  for (size_t i = 0; i < lp; i++)
    if (strchr(PAT_SPECIALS, p[i]) && p[i]) return 1;
  return 0;
}

/* string.find (find 1) and string.match (find 0). */
static int pat_find_aux(lua_State *L, int find) {
  size_t ls, lp;
  const char *s = luaL_checklstring(L, 1, &ls);
  const char *p = luaL_checklstring(L, 2, &lp);
  ptrdiff_t init = (ptrdiff_t)luaL_optinteger(L, 3, 1);
  if (init < 0) init += (ptrdiff_t)ls;
  else init--;
  if (init < 0) init = 0;
  if ((size_t)init > ls) init = (ptrdiff_t)ls;
  if (find && (lua_toboolean(L, 4) || !pat_has_specials(p, lp))) {
    /* plain search: memmem is linear (two-way), unlike a naive search */
    const char *q = lp == 0 ? s + init : memmem(s + init, ls - (size_t)init, p, lp);
    if (q) {
      lua_pushinteger(L, q - s + 1);
      lua_pushinteger(L, q - s + (ptrdiff_t)lp);
      return 2;
    }
  } else {
    pat_state ms;
    const char *s1 = s + init;
    int anchor = (*p == '^');
    if (anchor) p++;
    pat_init(&ms, L, s, ls);
    do {
      const char *res;
      ms.level = ms.depth = 0;
      if ((res = pat_match(&ms, s1, p)) != NULL) {
        if (find) {
          lua_pushinteger(L, s1 - s + 1); /* start */
          lua_pushinteger(L, res - s);    /* end */
          return pat_push_captures(&ms, NULL, 0) + 2;
        }
        return pat_push_captures(&ms, s1, res);
      }
    } while (s1++ < ms.src_end && !anchor);
  }
  lua_pushnil(L);
  return 1;
}

/* core.str_find(s, pattern [, init [, plain]]): string.find. */
static int c_str_find(lua_State *L) { return pat_find_aux(L, 1); }

/* core.str_match(s, pattern [, init]): string.match. */
static int c_str_match(lua_State *L) { return pat_find_aux(L, 0); }

/* The iterator of string.gmatch: upvalues are the subject, the pattern and
** where the next match is looked for. */
static int pat_gmatch_aux(lua_State *L) {
  size_t ls;
  const char *s = lua_tolstring(L, lua_upvalueindex(1), &ls);
  const char *p = lua_tostring(L, lua_upvalueindex(2));
  pat_state ms;
  pat_init(&ms, L, s, ls);
  for (const char *src = s + (size_t)lua_tointeger(L, lua_upvalueindex(3)); src <= ms.src_end;
       src++) {
    const char *e;
    ms.level = ms.depth = 0;
    if ((e = pat_match(&ms, src, p)) != NULL) {
      lua_Integer newstart = e - s;
      if (e == src) newstart++; /* empty match: go at least one position */
      lua_pushinteger(L, newstart);
      lua_replace(L, lua_upvalueindex(3));
      return pat_push_captures(&ms, src, e);
    }
  }
  return 0; /* not found */
}

/* core.str_gmatch(s, pattern): string.gmatch. */
static int c_str_gmatch(lua_State *L) {
  luaL_checkstring(L, 1);
  luaL_checkstring(L, 2);
  lua_settop(L, 2);
  lua_pushinteger(L, 0);
  lua_pushcclosure(L, pat_gmatch_aux, 3);
  return 1;
}

/* Add the replacement string (argument 3, with %0-%9) for the match s..e. */
static void pat_add_s(pat_state *ms, luaL_Buffer *b, const char *s, const char *e) {
  size_t l;
  const char *news = lua_tolstring(ms->L, 3, &l);
  for (size_t i = 0; i < l; i++) {
    if (news[i] != L_ESC) {
      luaL_addchar(b, news[i]);
    } else {
      i++; /* skip ESC */
      if (!pc_digit((unsigned char)news[i])) {
        luaL_addchar(b, news[i]);
      } else if (news[i] == '0') {
        luaL_addlstring(b, s, (size_t)(e - s));
      } else {
        pat_push_one(ms, news[i] - '1', s, e);
        luaL_addvalue(b); /* add capture to accumulated result */
      }
    }
  }
}

/* Add the replacement for the match s..e: from the string, the function or
** the table in argument 3 (nil or false keeps the original text). */
static void pat_add_value(pat_state *ms, luaL_Buffer *b, const char *s, const char *e) {
  lua_State *L = ms->L;
  switch (lua_type(L, 3)) {
  case LUA_TNUMBER:
  case LUA_TSTRING: pat_add_s(ms, b, s, e); return;
  case LUA_TFUNCTION: {
    /* The callback may call gsub again: bound the C stack (lrt.h). */
    lrt_cstack_check(L, "string.gsub");
    lua_pushvalue(L, 3);
    int n = pat_push_captures(ms, s, e);
    lua_call(L, n, 1);
    break;
  }
  case LUA_TTABLE:
    /* An __index metamethod may call gsub again. */
    lrt_cstack_check(L, "string.gsub");
    pat_push_one(ms, 0, s, e);
    lua_gettable(L, 3);
    break;
  }
  if (!lua_toboolean(L, -1)) { /* nil or false? */
    lua_pop(L, 1);
    lua_pushlstring(L, s, (size_t)(e - s)); /* keep original text */
  } else if (!lua_isstring(L, -1)) {
    luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
  }
  luaL_addvalue(b); /* add result to accumulator */
}

/* core.str_gsub(s, pattern, repl [, n]): string.gsub. */
static int c_str_gsub(lua_State *L) {
  size_t srcl;
  const char *src = luaL_checklstring(L, 1, &srcl);
  const char *p = luaL_checkstring(L, 2);
  int tr = lua_type(L, 3);
  lua_Integer max_s = luaL_optinteger(L, 4, (lua_Integer)srcl + 1);
  int anchor = (*p == '^');
  if (anchor) p++;
  lua_Integer n = 0;
  pat_state ms;
  luaL_Buffer b;
  luaL_argcheck(L, tr == LUA_TNUMBER || tr == LUA_TSTRING || tr == LUA_TFUNCTION || tr == LUA_TTABLE,
                3, "string/function/table expected");
  luaL_buffinit(L, &b);
  pat_init(&ms, L, src, srcl);
  while (n < max_s) {
    const char *e;
    ms.level = ms.depth = 0;
    e = pat_match(&ms, src, p);
    if (e) {
      n++;
      pat_add_value(&ms, &b, src, e);
    }
    if (e && e > src) src = e; /* non empty match: skip it */
    else if (src < ms.src_end) luaL_addchar(&b, *src++);
    else break;
    if (anchor) break;
  }
  luaL_addlstring(&b, src, (size_t)(ms.src_end - src));
  luaL_pushresult(&b);
  lua_pushinteger(L, n); /* number of substitutions */
  return 2;
}

/* See lrt_int.h. */
void lrt__patterns_open(lrt_t *r) {
  lrt_register(r, "str_find", c_str_find, NULL);
  lrt_register(r, "str_match", c_str_match, NULL);
  lrt_register(r, "str_gmatch", c_str_gmatch, NULL);
  lrt_register(r, "str_gsub", c_str_gsub, NULL);
}
