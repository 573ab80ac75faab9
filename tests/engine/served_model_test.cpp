// The one setup of a served model that `troupe generate` and `troupe serve` share: what it loads
// and the EOS ids it derives.

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/sampler.hpp"
#include "engine/served_model.hpp"
#include "protocol/protocol_limits.hpp"
#include "tests/scratch_dir.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

const fs::path stories_hf = fs::path(TROUPE_SHARED_DIR) / "models" / "stories260K" / "hf";

// A copy of stories260K whose tokenizer names another EOS token than config.json, as a chat
// model's tokenizer_config names its turn end (<|eot_id|>, <|im_end|>) beside config's EOS.
class chat_like_model {
 public:
  chat_like_model() {
    for (const auto& entry : fs::directory_iterator(stories_hf)) fs::copy(entry.path(), dir_ / entry.path().filename());
    nlohmann::json config = nlohmann::json::parse(std::ifstream(dir_ / "tokenizer_config.json"));
    config["eos_token"] = "<unk>";  // id 0; config.json says 2
    fs::remove(dir_ / "tokenizer_config.json");
    std::ofstream(dir_ / "tokenizer_config.json") << config.dump();
  }
  std::string path() const { return dir_.path().string(); }

 private:
  testing::scratch_dir dir_;
};

TEST(served_model, eos_ids_are_the_models_and_then_the_tokenizers_each_once) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_hf / "config.json");
  chat_like_model model;
  model_spec spec;
  spec.path = model.path();
  spec.num_kv_blocks = 8;
  auto served = load_served_model(spec);
  // serve used to take config.json's ids alone when it had any, so a chat model's turn end
  // stopped `generate` but not `serve`.
  EXPECT_EQ(served->eos_token_ids, (std::vector<int32_t>{2, 0}));

  model_spec plain = spec;
  plain.path = stories_hf.string();
  EXPECT_EQ(load_served_model(plain)->eos_token_ids, (std::vector<int32_t>{2}));
}

TEST(served_model, the_engine_limits_come_from_the_model_and_the_spec) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_hf / "config.json");
  model_spec spec;
  spec.path = stories_hf.string();
  spec.num_kv_blocks = 12;
  spec.block_size = 32;
  spec.max_model_len = 100;
  auto served = load_served_model(spec);
  const engine_config config = served->base_engine_config();
  EXPECT_EQ(config.num_kv_blocks, 12);
  EXPECT_EQ(config.block_size, 32);
  EXPECT_EQ(config.max_model_len, 100);
  EXPECT_TRUE(served->device_note.empty());
}

// A model trained past the longest context served is served at it, so that what /v1/models
// reports is what the request checks allow (issue 25: a context of 2^24 was reported, and a chat
// request without max_tokens, which asks for the whole context, was refused by the engine).
TEST(served_model, a_context_past_the_served_bound_is_capped_from_the_model_and_refused_from_the_spec) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_hf / "config.json");
  testing::scratch_dir dir;
  for (const auto& entry : fs::directory_iterator(stories_hf)) fs::copy(entry.path(), dir / entry.path().filename());
  nlohmann::json config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  config["max_position_embeddings"] = 1 << 24;
  fs::remove(dir / "config.json");
  std::ofstream(dir / "config.json") << config.dump();
  model_spec spec;
  spec.path = dir.path().string();
  spec.num_kv_blocks = 8;
  auto served = load_served_model(spec);
  EXPECT_EQ(served->max_model_len, max_served_model_len);
  sampling_params whole_context;
  whole_context.max_tokens = served->max_model_len;
  EXPECT_EQ(check_sampling_params(whole_context), std::nullopt);

  spec.max_model_len = max_served_model_len + 1;
  try {
    load_served_model(spec);
    FAIL() << "max_model_len 2^20 + 1 accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("1..1048576 (the longest context served), got 1048577"), std::string::npos)
        << e.what();
  }
}

TEST(served_model, bad_specs_are_refused_by_name) {
  model_spec spec;
  EXPECT_THROW(load_served_model(spec), std::runtime_error);  // no path
  spec.path = stories_hf.string();
  spec.backend.nano_batches = 7;
  try {
    load_served_model(spec);
    FAIL() << "nano_batches 7 accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("nano_batches must be 1 to 4"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe
