#include <gtest/gtest.h>

#include "model/loader/tokenizer_sources.hpp"
#include "tests/model/loader_test_util.hpp"
#include "text/tokenizer.hpp"

namespace troupe {
namespace {

TEST(loader_tokenizer_sources, reads_hf_directory_and_file) {
  tokenizer_sources dir = load_tokenizer_sources(testing::shared_model_dir() / "hf");
  EXPECT_EQ(dir.tokenizer_json["model"]["type"], "BPE");
  EXPECT_EQ(dir.tokenizer_config["bos_token"], "<s>");
  tokenizer_sources file = load_tokenizer_sources(testing::shared_model_dir() / "hf/tokenizer.json");
  EXPECT_EQ(file.tokenizer_json, dir.tokenizer_json);
  EXPECT_EQ(file.tokenizer_config, dir.tokenizer_config);
  testing::expect_error([] { load_tokenizer_sources("/nonexistent/tok"); }, {"/nonexistent/tok"});
}

TEST(loader_tokenizer_sources, gguf_llama_tokenizer_matches_the_hf_one) {
  tokenizer_sources hf = load_tokenizer_sources(testing::shared_model_dir() / "hf");
  tokenizer_sources gguf = load_tokenizer_sources(testing::shared_model_dir() / "gguf/stories260K-f32.gguf");
  // Same vocabulary and the same ranked merges, derived from the GGUF's scores.
  EXPECT_EQ(gguf.tokenizer_json["model"]["vocab"], hf.tokenizer_json["model"]["vocab"]);
  EXPECT_EQ(gguf.tokenizer_json["model"]["merges"], hf.tokenizer_json["model"]["merges"]);
  EXPECT_EQ(gguf.tokenizer_json["normalizer"], hf.tokenizer_json["normalizer"]);
  EXPECT_EQ(gguf.tokenizer_json["decoder"], hf.tokenizer_json["decoder"]);
  EXPECT_EQ(gguf.tokenizer_config["bos_token"], "<s>");
  EXPECT_EQ(gguf.tokenizer_config["eos_token"], "</s>");
  EXPECT_EQ(gguf.tokenizer_config["add_bos_token"], true);

  // And it encodes like the HF tokenizer (the README's reference ids among others).
  tokenizer from_hf = tokenizer::from_json(hf.tokenizer_json, hf.tokenizer_config);
  tokenizer from_gguf = tokenizer::from_json(gguf.tokenizer_json, gguf.tokenizer_config);
  EXPECT_EQ(from_gguf.encode("Once upon a time"), (std::vector<int32_t>{1, 403, 407, 261, 378}));
  for (const char* text :
       {"Zoo", "Lily wanted", "  two  spaces\nnew line\ttab", "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80",
        "", "She said, \"Hello!\" 123 4567."}) {
    std::vector<int32_t> ids = from_gguf.encode(text);
    EXPECT_EQ(ids, from_hf.encode(text)) << text;
    EXPECT_EQ(from_gguf.decode(ids, true), from_hf.decode(ids, true)) << text;
  }
}

}  // namespace
}  // namespace troupe
