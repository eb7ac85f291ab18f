/*
** cli_repl.c: moonloop repl: the terminal side of the REPL (repl.c is the
** engine side, lua/repl.lua the Lua side).
**
** On a terminal: line editing, history in a file ($MOONLOOP_HISTORY, else
** ~/.moonloop_history) and tab completion through libedit's readline
** interface, in its callback mode so the engine keeps working while the
** prompt waits (repl_pump every 50 ms: commits, the lease). A chunk that
** ends too early (an open `function`, `{`, `[[`) reads more lines under the
** ">> " prompt. Ctrl-C at the prompt clears the line (and a pending chunk);
** while a chunk runs, it stops that chunk (repl_interrupt). Ctrl-D leaves.
**
** From a pipe or a file (stdin not a terminal): the same chunks, read line
** by line, without prompts or editing; it exits 1 if any chunk raised an
** error (0 if none), so scripts and agents can drive it. step_through's
** questions then read the next lines of the input.
*/
#include "base/mem.h"
#include "base/units.h"
#include "cli/cli.h"
#include "cli/repl.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <editline/readline.h>

#define PROMPT "> "
#define PROMPT_MORE ">> "
#define PUMP_MS 50

static repl_t *the_repl;
static volatile sig_atomic_t got_sigint;

static int on_tty; /* stdin and stdout are a terminal */

/* SIGINT: stop the chunk that runs, or (at a prompt) clear the line. */
static void on_sigint(int sig) {
  (void)sig;
  got_sigint = 1;
  /* The terminal echoed "^C": what the stopped chunk prints starts on a
  ** line of its own (write is async-signal-safe). */
  if (the_repl && repl_interrupt(the_repl) && on_tty) (void)!write(1, "\n", 1);
}

/* A growing chunk of input lines. */
struct chunk {
  char *s;
  size_t len, cap;
};

/* Append a line and its newline. */
static void chunk_add(struct chunk *c, const char *line) {
  size_t n = strlen(line);
  if (c->len + n + 2 > c->cap) {
    c->cap = (c->len + n + 2) * 2;
    c->s = mem_realloc(c->s, c->cap);
  }
  memcpy(c->s + c->len, line, n);
  c->len += n;
  c->s[c->len++] = '\n';
  c->s[c->len] = 0;
}

/* Empty the chunk, keeping its memory. */
static void chunk_reset(struct chunk *c) {
  c->len = 0;
  if (c->s) c->s[0] = 0;
}

/* Whether s holds nothing but spaces. */
static int blank(const char *s) {
  for (; s && *s; s++)
    if (*s != ' ' && *s != '\t' && *s != '\n' && *s != '\r') return 0;
  return 1;
}

/* Add a line to the chunk; once the chunk is complete, evaluate it and
** empty it (a blank chunk is just emptied). Returns repl_eval's status,
** or -1 when nothing was evaluated. */
static int chunk_feed(repl_t *rp, struct chunk *c, const char *line) {
  chunk_add(c, line);
  if (blank(c->s)) {
    chunk_reset(c);
    return -1;
  }
  if (!repl_complete(rp, c->s)) return -1;
  int rc = repl_eval(rp, c->s);
  chunk_reset(c);
  return rc;
}

/* ---- reading from a pipe ---- */

/* Lines of stdin, read with read(2) behind poll(2), so that the engine
** works while the input is slow to come (an agent thinking): its lease is
** renewed and its commits go on. */
static struct {
  char buf[65536];
  size_t start, end;
  int eof;
} in;

/* The next line of stdin without its newline (malloc'd), or NULL at the
** end of the input or on SIGINT. */
static char *pipe_line(repl_t *rp) {
  char *line = NULL;
  size_t len = 0;
  for (;;) {
    char *nl = memchr(in.buf + in.start, '\n', in.end - in.start);
    size_t take = nl ? (size_t)(nl - (in.buf + in.start)) : in.end - in.start;
    if (take || nl) {
      line = mem_realloc(line, len + take + 1);
      memcpy(line + len, in.buf + in.start, take);
      len += take;
      line[len] = 0;
      in.start += take + (nl ? 1 : 0);
    }
    if (nl) break;
    in.start = in.end = 0;
    if (in.eof) {
      if (!line) return NULL;
      break; /* a last line without its newline */
    }
    struct pollfd p = {.fd = 0, .events = POLLIN};
    int n = poll(&p, 1, PUMP_MS);
    if (got_sigint) {
      free(line);
      return NULL;
    }
    if (n == 0 || (n < 0 && errno == EINTR)) {
      if (rp) repl_pump(rp);
      continue;
    }
    ssize_t got = read(0, in.buf, sizeof in.buf);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) in.eof = 1;
    else in.end = (size_t)got;
  }
  if (len && line[len - 1] == '\r') line[--len] = 0;
  return line;
}

/* step_through's questions, from a pipe: the next line. */
static char *pipe_ask(const char *prompt, void *arg) {
  (void)prompt, (void)arg;
  return pipe_line(the_repl);
}

/* Run the chunks of a pipe; 1 if any raised an error. */
static int run_pipe(repl_t *rp) {
  struct chunk c = {0};
  int failed = 0;
  char *line;
  while ((line = pipe_line(rp))) {
    if (chunk_feed(rp, &c, line) > 0) failed = 1;
    free(line);
  }
  /* What is left ends too early: evaluating it reports why. */
  if (c.len && !blank(c.s) && repl_eval(rp, c.s)) failed = 1;
  free(c.s);
  if (got_sigint) return 130; /* stopped by SIGINT */
  return failed ? EXIT_FAILED : EXIT_OK;
}

/* ---- reading from a terminal ---- */

static struct {
  repl_t *rp;
  char *line;
  int done, eof;
  char **matches; /* the completions being handed to libedit */
  size_t next_match;
} term;

/* libedit's callback: a line was entered (NULL: Ctrl-D on an empty line). */
static void on_line(char *line) {
  term.done = 1;
  if (line) term.line = line;
  else term.eof = 1;
  rl_callback_handler_remove();
}

/* Read one line under prompt: 1 with *line (malloc'd), 0 at the end of
** the input (Ctrl-D), -1 on Ctrl-C. With pump, the engine works while it
** waits; without (a question asked from inside the loop), it must not. */
static int tty_read(const char *prompt, char **line, int pump) {
  term.done = term.eof = 0;
  term.line = NULL;
  got_sigint = 0;
  rl_callback_handler_install(prompt, on_line);
  int64_t pumped = units_now_ms();
  while (!term.done) {
    struct pollfd p = {.fd = 0, .events = POLLIN};
    int n = poll(&p, 1, pump ? PUMP_MS : -1);
    if (got_sigint) {
      got_sigint = 0;
      rl_callback_handler_remove(); /* forgets the line typed so far */
      fputs("^C\n", stdout);
      fflush(stdout);
      return -1;
    }
    if (n > 0 && (p.revents & POLLIN)) {
      rl_callback_read_char();
    } else if (n > 0) {
      /* The terminal is gone. */
      rl_callback_handler_remove();
      return 0;
    } else if (n < 0 && errno != EINTR) {
      rl_callback_handler_remove();
      return 0;
    }
    if (pump && units_now_ms() - pumped >= PUMP_MS) {
      repl_pump(term.rp);
      pumped = units_now_ms();
    }
  }
  if (term.eof) return 0;
  *line = term.line;
  return 1;
}

/* step_through's questions, at a terminal (the engine works meanwhile). */
static char *tty_ask(const char *prompt, void *arg) {
  (void)arg;
  char *line;
  return tty_read(prompt, &line, 1) == 1 ? line : NULL;
}

/* libedit's generator: the completions found by complete(), one by one. */
static char *match_next(const char *text, int state) {
  (void)text;
  if (!term.matches) return NULL;
  if (!state) term.next_match = 0;
  char *m = term.matches[term.next_match];
  if (!m) return NULL;
  term.next_match++;
  return mem_strdup(m);
}

/* Free the completions handed to libedit last. */
static void free_matches(void) {
  if (!term.matches) return;
  for (char **m = term.matches; *m; m++) free(*m);
  free(term.matches);
  term.matches = NULL;
}

/* Tab: complete globals and fields ("json.en" -> "json.encode"). */
static char **complete(const char *text, int start, int end) {
  (void)start, (void)end;
  rl_attempted_completion_over = 1; /* never file names */
  free_matches();
  term.matches = repl_completions(term.rp, text);
  return rl_completion_matches(text, match_next);
}

/* $MOONLOOP_HISTORY, else ~/.moonloop_history, or NULL (no history file). */
static const char *history_path(char *buf, size_t n) {
  const char *p = getenv("MOONLOOP_HISTORY");
  if (p && *p) return p;
  const char *home = getenv("HOME");
  if (!home || !*home) return NULL;
  snprintf(buf, n, "%s/.moonloop_history", home);
  return buf;
}

/* The session at a terminal: prompt, history, chunks; returns the exit status. */
static int run_tty(repl_t *rp) {
  char hbuf[4096];
  const char *hist = history_path(hbuf, sizeof hbuf);
  term.rp = rp;
  rl_readline_name = "moonloop";
  rl_catch_signals = 0;
  rl_attempted_completion_function = complete;
  rl_completion_append_character = '\0';
  /* Not '.' nor ':': "json.en" and "s:up" are one word to complete. */
  rl_basic_word_break_characters = " \t\n\"\\'`@$><=;|&{(,)+-*/%^~#[]";
  using_history();
  stifle_history(1000);
  if (hist) read_history(hist);
  printf("moonloop repl: Lua with the engine inside (help() lists its functions; Ctrl-D leaves)\n");
  fflush(stdout);
  struct chunk c = {0};
  for (;;) {
    char *line;
    int r = tty_read(c.len ? PROMPT_MORE : PROMPT, &line, 1);
    if (r < 0) {
      chunk_reset(&c);
      continue;
    }
    if (r == 0) {
      fputc('\n', stdout);
      break;
    }
    if (!blank(line)) {
      add_history(line);
      if (hist) write_history(hist);
    }
    chunk_feed(rp, &c, line);
    free(line);
  }
  free(c.s);
  free_matches();
  return EXIT_OK;
}


/* moonloop repl: open the REPL, then read chunks from the terminal or the
** pipe until the input ends; SIGINT goes to on_sigint meanwhile. */
int cli_repl(struct cli *c) {
  if (c->nargs) return cli_fail(EXIT_USAGE, "usage: moonloop repl [--db PATH] [--workspace DIR]");
  if (c->cfg.server)
    return cli_fail(EXIT_USAGE, "repl runs its own engine on the database (--db); --server is not "
                    "supported");
  int tty = isatty(0);
  on_tty = tty && isatty(1);
  /* Values on stdout, steps and errors on stderr: keep them in order. */
  setvbuf(stdout, NULL, _IOLBF, 0);
  struct repl_opts o = {
    .cfg = &c->cfg, .color = c->color, .load_workspace = 1,
    .ask = tty ? tty_ask : pipe_ask,
  };
  repl_t *rp;
  err_t e;
  if (repl_open(&o, &rp, &e)) return cli_fail(EXIT_FAILED, "%s", e.msg);
  /* No SA_RESTART: a read or poll waiting for input returns at once. */
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  the_repl = rp;
  sigaction(SIGINT, &sa, &old);
  int rc = tty ? run_tty(rp) : run_pipe(rp);
  sigaction(SIGINT, &old, NULL);
  the_repl = NULL;
  repl_close(rp);
  return rc;
}
