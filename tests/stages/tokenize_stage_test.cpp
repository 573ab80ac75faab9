// The tokenizer stage without actors, on the stories260K tokenizer (reference ids in its README).

#include <gtest/gtest.h>

#include <filesystem>

#include "stages/tokenize_stage.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

const std::string stories = TROUPE_SHARED_DIR "/models/stories260K/hf";

TEST(tokenize_stage, text_ids_and_errors) {
  TROUPE_REQUIRE_SHARED_MODEL(stories);
  tokenize_stage stage(tokenizer::from_directory(stories), 512, 16);
  tokenize_request r;
  r.request_id = 3;
  r.prompt = "Once upon a time";
  r.priority = 2;
  const timestamp_ns before = steady_now_ns();
  auto ok = stage.run(r);
  const timestamp_ns after = steady_now_ns();
  ASSERT_TRUE(std::holds_alternative<schedule_request>(ok));
  EXPECT_EQ(std::get<schedule_request>(ok).prompt_ids, (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_EQ(std::get<schedule_request>(ok).priority, 2);
  // A duration on the tokenizer's clock, within the call: not a stamp another host would misread.
  EXPECT_GE(std::get<schedule_request>(ok).tokenize_ns, 0);
  EXPECT_LE(std::get<schedule_request>(ok).tokenize_ns, after - before);

  tokenize_request ids;
  ids.kind = prompt_kind::token_ids;
  ids.prompt_token_ids = {1, 600};
  auto bad = stage.run(ids);
  ASSERT_TRUE(std::holds_alternative<request_failed>(bad));
  EXPECT_NE(std::get<request_failed>(bad).message.find("prompt_token_ids[1]"), std::string::npos);

  tokenize_request long_prompt;
  long_prompt.prompt = "Once upon a time there was a little girl named Lily who loved the park";
  auto too_long = stage.run(long_prompt);
  ASSERT_TRUE(std::holds_alternative<request_failed>(too_long));
  EXPECT_EQ(std::get<request_failed>(too_long).code, error_code::prompt_too_long);
}

TEST(tokenize_stage, a_rendered_chat_and_logit_bias_ids_are_checked_against_the_vocabulary) {
  TROUPE_REQUIRE_SHARED_MODEL(stories);
  tokenize_stage stage(tokenizer::from_directory(stories), 512, 512);
  // The door rendered it (no template: a transcript), which is then encoded as `messages` would
  // be: with BOS, since no template wrote it.
  tokenize_request chat;
  chat.kind = prompt_kind::rendered_chat;
  chat.prompt = "user: hi\nassistant:";
  tokenize_request messages;
  messages.kind = prompt_kind::messages;
  messages.messages = {{"user", "hi"}};
  auto a = stage.run(chat), b = stage.run(messages);
  ASSERT_TRUE(std::holds_alternative<schedule_request>(a));
  EXPECT_EQ(std::get<schedule_request>(a).prompt_ids, std::get<schedule_request>(b).prompt_ids);
  EXPECT_EQ(std::get<schedule_request>(a).prompt_ids.front(), 1);
  chat.sampling.logit_bias = {{5, 1.0f}, {512, -1.0f}};
  auto bad = stage.run(chat);
  ASSERT_TRUE(std::holds_alternative<request_failed>(bad));
  EXPECT_EQ(std::get<request_failed>(bad).code, error_code::bad_request);
  EXPECT_NE(std::get<request_failed>(bad).message.find("'logit_bias': token id 512 is outside the vocabulary of 512"),
            std::string::npos)
      << std::get<request_failed>(bad).message;
}

TEST(tokenize_stage, chat_without_a_template_is_a_transcript) {
  TROUPE_REQUIRE_SHARED_MODEL(stories);
  tokenize_stage stage(tokenizer::from_directory(stories), 512, 512);
  EXPECT_FALSE(stage.has_chat_template());
  EXPECT_EQ(stage.render_chat({{"user", "hi"}}), "user: hi\nassistant:");
}

}  // namespace
}  // namespace troupe
