/*
** gen_vocab.c: writes the dashboard's vocab.js from base/vocab.h's tables
** at build time (CMakeLists.txt embeds it with the files of web/), so web/app.js
** lists run statuses, trigger kinds and step kinds in the engine's words
** and order, never its own copy.
**
** Output: window.moonloopVocab = {runStatuses: [...], ended: [...],
** stepStatuses: [...], stepKinds: [...], triggerKinds: [...]};
** Usage: gen_vocab OUT.js
*/
#include <stdio.h>

#include "base/vocab.h"

/* Write a word list as a JSON array (the words are plain ASCII). */
static void words(FILE *f, const char *key, const char *const *list, int only_ended) {
  fprintf(f, "  %s: [", key);
  int n = 0;
  for (int i = 0; list[i]; i++) {
    if (only_ended && !vocab_run_ended(list[i])) continue;
    fprintf(f, "%s'%s'", n++ ? ", " : "", list[i]);
  }
  fprintf(f, "],\n");
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: gen_vocab OUT.js\n");
    return 2;
  }
  FILE *f = fopen(argv[1], "w");
  if (!f) {
    perror(argv[1]);
    return 1;
  }
  fprintf(f, "/* generated from engine/base/vocab.h by cmake/gen_vocab.c: do not edit */\n");
  fprintf(f, "'use strict';\nwindow.moonloopVocab = Object.freeze({\n");
  words(f, "runStatuses", vocab_run_statuses, 0);
  words(f, "ended", vocab_run_statuses, 1);
  words(f, "stepStatuses", vocab_step_statuses, 0);
  words(f, "stepKinds", vocab_step_kinds, 0);
  words(f, "triggerKinds", vocab_trigger_kinds, 0);
  fprintf(f, "});\n");
  return fclose(f) ? 1 : 0;
}
