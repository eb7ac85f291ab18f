/*
** test_vocab.c: the vocabulary tables (engine/base/vocab.h): words map to
** their enums and back, unknown words are VOCAB_NONE, and the word lists
** for messages are the tables' words in order.
*/
#include "base/vocab.h"
#include "test.h"

TEST(words_map_to_their_enums) {
  CHECK_INT_EQ(vocab_run_status("queued"), RUN_QUEUED);
  CHECK_INT_EQ(vocab_run_status("cancelled"), RUN_CANCELLED);
  CHECK_INT_EQ(vocab_step_status("sleeping"), STEP_SLEEPING);
  CHECK_INT_EQ(vocab_step_kind("parallel"), STEP_KIND_PARALLEL);
  CHECK_INT_EQ(vocab_trigger_kind("on_failure"), TRIGGER_ON_FAILURE);
  CHECK_STR_EQ(vocab_run_statuses[RUN_WAITING], "waiting");
  CHECK_STR_EQ(vocab_step_kinds[STEP_KIND_SEND], "send");
}

TEST(unknown_words_are_none) {
  CHECK_INT_EQ(vocab_run_status("abandoned"), VOCAB_NONE);
  CHECK_INT_EQ(vocab_run_status(NULL), VOCAB_NONE);
  CHECK_INT_EQ(vocab_step_status("queued"), VOCAB_NONE); /* a run's, not a step's */
  CHECK_INT_EQ(vocab_step_kind("Run"), VOCAB_NONE);
  CHECK(!vocab_is_trigger_kind("webhook"));
  CHECK(vocab_is_run_status("sleeping"));
}

TEST(ended_statuses_are_the_terminal_ones) {
  CHECK(vocab_run_ended("completed") && vocab_run_ended("failed") && vocab_run_ended("cancelled"));
  CHECK(!vocab_run_ended("running") && !vocab_run_ended("queued") && !vocab_run_ended(NULL));
}

/* words joined with ", " (what the message lists must be). */
static const char *joined(const char *const *words) {
  static char buf[512];
  buf[0] = 0;
  for (int i = 0; words[i]; i++) {
    if (i) strcat(buf, ", ");
    strcat(buf, words[i]);
  }
  return buf;
}

TEST(message_lists_follow_the_tables) {
  CHECK_STR_EQ(VOCAB_RUN_STATUSES, joined(vocab_run_statuses));
  CHECK_STR_EQ(VOCAB_TRIGGER_KINDS, joined(vocab_trigger_kinds));
  CHECK_STR_EQ(VOCAB_STEP_KINDS, joined(vocab_step_kinds));
  CHECK(!strncmp(VOCAB_RUN_STATUSES, "queued, running, sleeping, waiting, completed, failed, "
                 "cancelled", 62));
}

int main(void) {
  RUN(words_map_to_their_enums);
  RUN(unknown_words_are_none);
  RUN(ended_statuses_are_the_terminal_ones);
  RUN(message_lists_follow_the_tables);
  return test_summary();
}
