// The tokenize stages a process's tokenizer actors share (stages/shared_tokenize_stages.hpp): one
// per key while any holder lives, made again once the last is gone, nothing kept when making
// fails. On the stories260K tokenizer.

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <stdexcept>
#include <thread>
#include <vector>

#include "stages/shared_tokenize_stages.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

const std::string stories = TROUPE_SHARED_DIR "/models/stories260K/hf";

TEST(shared_tokenize_stages, one_stage_per_key_while_held_and_made_again_once_released) {
  TROUPE_REQUIRE_SHARED_MODEL(stories);
  shared_tokenize_stages stages;
  int num_made = 0;
  auto make = [&](int max_model_len) {
    return [&num_made, max_model_len] {
      ++num_made;
      return std::make_shared<const tokenize_stage>(tokenizer::from_directory(stories), 512, max_model_len);
    };
  };
  auto a = stages.get("stories/512/64", make(64));
  auto b = stages.get("stories/512/64", make(64));
  EXPECT_EQ(a, b) << "a second actor of the same spec loaded its own tokenizer";
  auto c = stages.get("stories/512/128", make(128));
  EXPECT_NE(a, c);
  EXPECT_EQ(num_made, 2);
  a.reset();
  b.reset();  // the pool ended: its stage goes
  auto d = stages.get("stories/512/64", make(64));
  EXPECT_EQ(num_made, 3);
  EXPECT_EQ(d.use_count(), 1) << "the cache holds its stages weakly";
}

TEST(shared_tokenize_stages, a_failed_make_keeps_nothing_and_the_next_caller_makes_again) {
  TROUPE_REQUIRE_SHARED_MODEL(stories);
  shared_tokenize_stages stages;
  EXPECT_THROW(
      stages.get("k", []() -> std::shared_ptr<const tokenize_stage> { throw std::runtime_error("no tokenizer.json"); }),
      std::runtime_error);
  auto made = stages.get(
      "k", [] { return std::make_shared<const tokenize_stage>(tokenizer::from_directory(stories), 512, 64); });
  EXPECT_TRUE(made);
}

TEST(shared_tokenize_stages, a_pool_spawned_at_once_loads_once) {
  TROUPE_REQUIRE_SHARED_MODEL(stories);
  shared_tokenize_stages stages;
  std::atomic<int> num_made{0};
  std::vector<std::shared_ptr<const tokenize_stage>> got(4);
  std::vector<std::thread> pool;
  for (size_t i = 0; i < got.size(); ++i) {
    pool.emplace_back([&, i] {
      got[i] = stages.get("pool", [&] {
        ++num_made;
        return std::make_shared<const tokenize_stage>(tokenizer::from_directory(stories), 512, 64);
      });
    });
  }
  for (auto& t : pool) t.join();
  EXPECT_EQ(num_made.load(), 1);
  for (const auto& stage : got) EXPECT_EQ(stage, got.front());
}

}  // namespace
}  // namespace troupe
