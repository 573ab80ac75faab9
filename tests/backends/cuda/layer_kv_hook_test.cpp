// forward_batch::after_layer_kv on the CUDA backend (issue 11): the hook is called once per layer,
// in order, during the forward, and each layer's KV exported from inside the hook equals what the
// CPU backend (the reference: same weights, same batch) exports from its own hook for that layer.
// The GPU's blocks first hold another prompt's KV, so an export that ran before the layer was
// written would read that prompt's values, not the reference's. Skips without a GPU.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backends/cpu/cpu_model.hpp"
#include "model/loader/model_loader.hpp"
#include "tests/backends/cuda/cuda_test_util.hpp"
#include "tests/backends/kv_transfer_support.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

using cuda::testing::normalized_error;

constexpr kv_cache_shape pool_shape{16, 4};
// Another prompt of the same length, written into the same blocks before the one under test.
const std::vector<int32_t> other_prompt = {1, 300, 301, 302, 303, 304, 305, 306, 307, 308, 309};

// What one model's hook saw: the layers in call order and, per layer, the f32 values of the
// written token slots of `blocks` (K then V, tokens [0, num_tokens) of each sequence).
struct hook_record {
  std::vector<int> layers;
  std::map<int, std::vector<float>> kv;  // layer -> values
};

struct sequence_blocks {
  std::vector<int32_t> blocks;
  int num_tokens = 0;
};

// Exports layer `layer` of every sequence's blocks as f32 and keeps the slots its tokens wrote
// (the tail of a partly filled block is whatever the pool held).
std::vector<float> written_kv(const model& m, int layer, const std::vector<sequence_blocks>& sequences) {
  const int block_size = m.kv_shape().block_size;
  const int row = m.config().num_kv_heads * m.config().head_dim;  // floats per token slot
  std::vector<float> values;
  for (const sequence_blocks& s : sequences) {
    const int num_blocks = static_cast<int>(s.blocks.size());
    const kv_span_header header = kv_span_for(m.config(), m.kv_shape(), num_blocks, layer, 1, dtype::f32);
    std::vector<std::byte> span(kv_span_bytes(header));  // [1, 2, num_blocks, block_size, kv_heads, head_dim]
    m.export_kv(s.blocks, layer, 1, dtype::f32, span);
    const auto* floats = reinterpret_cast<const float*>(span.data());
    for (int side = 0; side < 2; ++side) {
      for (int b = 0; b < num_blocks; ++b) {
        for (int slot = 0; slot < block_size && b * block_size + slot < s.num_tokens; ++slot) {
          const float* at = floats + ((static_cast<size_t>(side) * num_blocks + b) * block_size + slot) * row;
          values.insert(values.end(), at, at + row);
        }
      }
    }
  }
  return values;
}

// Runs `batch` on `m` with a hook that records the layer and exports it on the spot.
hook_record forward_recording(model& m, forward_batch batch, const std::vector<sequence_blocks>& sequences) {
  hook_record record;
  batch.after_layer_kv = [&](int layer) {
    record.layers.push_back(layer);
    record.kv[layer] = written_kv(m, layer, sequences);
  };
  std::vector<float> logits(static_cast<size_t>(batch.num_logits()) * m.config().vocab_size);
  m.forward(batch, logits.data());
  return record;
}

// Two sequences' prefill (or decode) in one batch: tokens [computed[i], tokens[i].size()) of each.
forward_batch two_sequence_batch(const std::vector<std::vector<int32_t>>& tokens, const std::vector<int>& computed,
                                 const std::vector<sequence_blocks>& sequences, int block_size) {
  forward_batch batch;
  batch.query_start = {0};
  batch.block_table_start = {0};
  for (size_t s = 0; s < tokens.size(); ++s) {
    const int total = static_cast<int>(tokens[s].size());
    for (int t = computed[s]; t < total; ++t) {
      batch.token_ids.push_back(tokens[s][t]);
      batch.positions.push_back(t);
      batch.slot_mapping.push_back(int64_t{sequences[s].blocks[t / block_size]} * block_size + t % block_size);
    }
    batch.query_start.push_back(static_cast<int32_t>(batch.token_ids.size()));
    batch.logits_rows.push_back(static_cast<int32_t>(batch.token_ids.size()) - 1);
    batch.context_lengths.push_back(total);
    batch.block_tables.insert(batch.block_tables.end(), sequences[s].blocks.begin(), sequences[s].blocks.end());
    batch.block_table_start.push_back(static_cast<int32_t>(batch.block_tables.size()));
  }
  return batch;
}

class cuda_layer_kv_hook : public ::testing::Test {
 protected:
  void SetUp() override {
    TROUPE_REQUIRE_GPU();
    TROUPE_REQUIRE_SHARED_MODEL(test::stories260k_dir / "hf");
    loaded_ = std::make_unique<loaded_model>(load_model(load_options{(test::stories260k_dir / "hf").string()}));
  }

  std::unique_ptr<model> gpu(dtype activation, int nano_batches = 1) const {
    cuda_options options;
    options.activation = activation;
    options.nano_batches = nano_batches;
    options.min_nano_batch_rows = 1;  // the test's short sequences still get a lane each
    return make_cuda_model(loaded_->config, loaded_->weights, pool_shape, options);
  }
  // An f32 cache on the CPU side, as the f32 GPU pools the hooks are compared with.
  std::unique_ptr<model> cpu() const {
    return make_cpu_model(loaded_->config, loaded_->weights, pool_shape, 1, dtype::f32);
  }
  int num_layers() const { return loaded_->config.num_layers; }

  // Every layer once, in order, and each layer's exported KV within `tolerance` of the CPU's.
  void expect_like_cpu(const hook_record& gpu_record, const hook_record& cpu_record, double tolerance,
                       const std::string& what) const {
    std::vector<int> in_order(num_layers());
    for (int i = 0; i < num_layers(); ++i) in_order[i] = i;
    EXPECT_EQ(gpu_record.layers, in_order) << what;
    ASSERT_EQ(cpu_record.layers, in_order) << what;
    for (int layer = 0; layer < num_layers(); ++layer) {
      const std::vector<float>& got = gpu_record.kv.at(layer);
      const std::vector<float>& want = cpu_record.kv.at(layer);
      ASSERT_EQ(got.size(), want.size()) << what << ", layer " << layer;
      EXPECT_LT(normalized_error(got, want), tolerance) << what << ", layer " << layer;
    }
  }

  std::unique_ptr<loaded_model> loaded_;
};

TEST_F(cuda_layer_kv_hook, prefill_exports_each_layer_as_the_cpu_computes_it) {
  const std::vector<sequence_blocks> sequences = {{{5, 2, 9}, static_cast<int>(test::kv_transfer_prompt.size())}};
  const int block_size = pool_shape.block_size;
  const forward_batch batch = test::one_sequence_batch(
      test::kv_transfer_prompt, 0, static_cast<int>(test::kv_transfer_prompt.size()), sequences[0].blocks, block_size);
  auto reference = cpu();
  const hook_record cpu_record = forward_recording(*reference, batch, sequences);
  // f32 pool: only the two backends' arithmetic differs; bf16: the pool rounds each value.
  for (auto [activation, tolerance] : {std::pair{dtype::f32, 1e-3}, std::pair{dtype::bf16, 3e-2}}) {
    auto device = gpu(activation);
    test::prefill(*device, other_prompt, sequences[0].blocks);  // the blocks hold something else first
    const hook_record gpu_record = forward_recording(*device, batch, sequences);
    expect_like_cpu(gpu_record, cpu_record, tolerance, std::string("prefill, ") + std::string(dtype_name(activation)));
  }
}

TEST_F(cuda_layer_kv_hook, nano_batches_report_a_layer_once_every_lane_wrote_it) {
  const std::vector<sequence_blocks> sequences = {{{5, 2, 9}, 11}, {{1, 12, 7}, 11}};
  const std::vector<std::vector<int32_t>> prompts = {test::kv_transfer_prompt,
                                                     {1, 365, 323, 353, 322, 383, 432, 378, 261, 407, 403}};
  const forward_batch batch = two_sequence_batch(prompts, {0, 0}, sequences, pool_shape.block_size);
  auto reference = cpu();
  const hook_record cpu_record = forward_recording(*reference, batch, sequences);
  auto device = gpu(dtype::f32, 2);
  device->forward(two_sequence_batch({other_prompt, other_prompt}, {0, 0}, sequences, pool_shape.block_size),
                  std::vector<float>(2 * loaded_->config.vocab_size).data());
  expect_like_cpu(forward_recording(*device, batch, sequences), cpu_record, 1e-3, "two nano-batches");
}

TEST_F(cuda_layer_kv_hook, a_decode_shaped_step_with_the_hook_reports_every_layer) {
  // One new token per sequence with every row's logits: the shape CUDA graphs replay, which a
  // step with the hook must not (a graph cannot stop between layers).
  const std::vector<sequence_blocks> sequences = {{{5, 2, 9}, 12}, {{1, 12, 7}, 12}};
  std::vector<std::vector<int32_t>> prompts = {test::kv_transfer_prompt, test::kv_transfer_prompt};
  prompts[1][3] = 300;
  const int block_size = pool_shape.block_size;
  auto reference = cpu();
  auto device = gpu(dtype::f32);
  for (model* m : {static_cast<model*>(reference.get()), static_cast<model*>(device.get())}) {
    std::vector<float> logits(2 * loaded_->config.vocab_size);
    m->forward(two_sequence_batch(prompts, {0, 0}, sequences, block_size), logits.data());
  }
  // The graph of this size exists once steps of it ran without the hook; they feed another token
  // than the step under test, so its slot holds other KV until that step writes it.
  std::vector<std::vector<int32_t>> warm = prompts;
  for (auto& p : warm) p.push_back(43);
  for (auto& p : prompts) p.push_back(42);
  std::vector<float> logits(2 * loaded_->config.vocab_size);
  device->forward(two_sequence_batch(warm, {11, 11}, sequences, block_size), logits.data());
  device->forward(two_sequence_batch(warm, {11, 11}, sequences, block_size), logits.data());
  const forward_batch step = two_sequence_batch(prompts, {11, 11}, sequences, block_size);
  const hook_record cpu_record = forward_recording(*reference, step, sequences);
  expect_like_cpu(forward_recording(*device, step, sequences), cpu_record, 1e-3, "decode-shaped step");
}

}  // namespace
}  // namespace troupe
