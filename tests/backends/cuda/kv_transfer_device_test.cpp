// KV export and import on the CUDA backend (issue 11, first step), stories260K: a request's KV
// moved GPU to GPU at other block ids continues bitwise equal; moved CPU to GPU and GPU to CPU
// (layouts are the same, dtypes may differ: converted) it continues within tolerance of the
// receiving backend's own run; refusals name the field and write nothing. Skips without a GPU.

#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cpu/cpu_model.hpp"
#include "model/loader/model_loader.hpp"
#include "tests/backends/cuda/cuda_test_util.hpp"
#include "tests/backends/kv_transfer_support.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

using test::kv_transfer_prompt;

const std::vector<int32_t> blocks_a = {5, 2, 9};   // the exporter's blocks
const std::vector<int32_t> blocks_b = {0, 11, 6};  // the importer's: other ids on purpose
constexpr kv_cache_shape pool_shape{16, 4};

class cuda_kv_transfer : public ::testing::Test {
 protected:
  void SetUp() override {
    TROUPE_REQUIRE_GPU();
    TROUPE_REQUIRE_SHARED_MODEL(test::stories260k_dir / "hf");
    loaded_ = std::make_unique<loaded_model>(load_model(load_options{(test::stories260k_dir / "hf").string()}));
  }

  std::unique_ptr<model> gpu(dtype activation) const {
    cuda_options options;
    options.activation = activation;
    return make_cuda_model(loaded_->config, loaded_->weights, pool_shape, options);
  }
  // An f32 cache on the CPU side: the tolerances below separate backend arithmetic from rounding.
  std::unique_ptr<model> cpu() const {
    return make_cpu_model(loaded_->config, loaded_->weights, pool_shape, 1, dtype::f32);
  }
  int num_layers() const { return loaded_->config.num_layers; }

  std::unique_ptr<loaded_model> loaded_;
};

TEST_F(cuda_kv_transfer, gpu_to_gpu_in_the_pool_dtype_continues_bitwise_equal) {
  for (dtype activation : {dtype::f32, dtype::bf16}) {
    auto a = gpu(activation), b = gpu(activation);
    const int32_t next = test::prefill(*a, kv_transfer_prompt, blocks_a);
    const std::vector<float> expected = test::decode_logits(*a, kv_transfer_prompt, next, blocks_a);
    const int half = num_layers() / 2;  // as two layer ranges
    test::move_kv(*a, blocks_a, *b, blocks_b, 0, half, a->kv_dtype());
    test::move_kv(*a, blocks_a, *b, blocks_b, half, num_layers() - half, a->kv_dtype());
    EXPECT_EQ(test::decode_logits(*b, kv_transfer_prompt, next, blocks_b), expected) << dtype_name(activation);
  }
}

TEST_F(cuda_kv_transfer, gpu_to_gpu_without_the_import_differs) {
  auto a = gpu(dtype::f32), b = gpu(dtype::f32);
  const int32_t next = test::prefill(*a, kv_transfer_prompt, blocks_a);
  EXPECT_NE(test::decode_logits(*b, kv_transfer_prompt, next, blocks_b),
            test::decode_logits(*a, kv_transfer_prompt, next, blocks_a));
}

// The exporter computes the prompt's KV; the importer's own run of the same prompt is the
// reference for its decode step after the import.
void expect_cross_backend(model& exporter, model& importer, model& importer_reference, dtype element, float tolerance,
                          const std::string& what) {
  // The exporter's next token for both, even where the reference would pick another.
  const int32_t next = test::prefill(exporter, kv_transfer_prompt, blocks_a);
  test::prefill(importer_reference, kv_transfer_prompt, blocks_a);
  const std::vector<float> expected = test::decode_logits(importer_reference, kv_transfer_prompt, next, blocks_a);
  test::move_kv(exporter, blocks_a, importer, blocks_b, 0, exporter.config().num_layers, element);
  const std::vector<float> logits = test::decode_logits(importer, kv_transfer_prompt, next, blocks_b);
  EXPECT_LT(test::max_abs_difference(logits, expected), tolerance) << what;
}

TEST_F(cuda_kv_transfer, cpu_to_gpu_continues_within_tolerance) {
  for (dtype activation : {dtype::f32, dtype::bf16}) {
    for (dtype element : {dtype::f32, dtype::f16}) {
      auto exporter = cpu();
      auto importer = gpu(activation), reference = gpu(activation);
      // f32 throughout: only the two backends' arithmetic differs. Otherwise a 16-bit rounding of
      // the KV (and, for bf16 pools, bf16 arithmetic on the reference's side): on the CPU alone
      // bf16 KV moves these logits (up to ~18) by 0.08.
      const float tolerance = activation == dtype::f32 && element == dtype::f32 ? 1e-2f : 5e-1f;
      expect_cross_backend(*exporter, *importer, *reference, element, tolerance,
                           std::string("cpu -> gpu ") + std::string(dtype_name(activation)) + " via " +
                               std::string(dtype_name(element)));
    }
  }
}

TEST_F(cuda_kv_transfer, gpu_to_cpu_continues_within_tolerance) {
  for (dtype activation : {dtype::f32, dtype::bf16}) {
    for (dtype element : {dtype::f32, dtype::bf16}) {
      auto exporter = gpu(activation);
      auto importer = cpu(), reference = cpu();
      // f32 throughout: only the two backends' arithmetic differs. Otherwise a 16-bit rounding of
      // the KV (and, for bf16 pools, bf16 arithmetic on the reference's side): on the CPU alone
      // bf16 KV moves these logits (up to ~18) by 0.08.
      const float tolerance = activation == dtype::f32 && element == dtype::f32 ? 1e-2f : 5e-1f;
      expect_cross_backend(*exporter, *importer, *reference, element, tolerance,
                           std::string("gpu ") + std::string(dtype_name(activation)) + " via " +
                               std::string(dtype_name(element)) + " -> cpu");
    }
  }
}

TEST_F(cuda_kv_transfer, refusals_name_the_field_and_write_nothing) {
  auto a = gpu(dtype::bf16), b = gpu(dtype::bf16);
  test::prefill(*a, kv_transfer_prompt, blocks_a);
  test::prefill(*b, kv_transfer_prompt, blocks_b);  // B's pool holds something a write would change
  const int layers = num_layers();
  const kv_span_header good = kv_span_for(a->config(), a->kv_shape(), 3, 0, layers, dtype::f32);
  std::vector<std::byte> span(kv_span_bytes(good));
  a->export_kv(blocks_a, 0, layers, dtype::f32, span);
  std::vector<int32_t> all(pool_shape.num_blocks);
  for (int i = 0; i < pool_shape.num_blocks; ++i) all[i] = i;
  auto pool_of_b = [&] {
    std::vector<std::byte> pool(
        kv_span_bytes(kv_span_for(b->config(), b->kv_shape(), pool_shape.num_blocks, 0, layers, dtype::bf16)));
    b->export_kv(all, 0, layers, dtype::bf16, pool);
    return pool;
  };
  const std::vector<std::byte> before = pool_of_b();
  auto expect_refused = [&](std::vector<int32_t> ids, kv_span_header header, std::vector<std::byte> data,
                            const std::string& field) {
    try {
      b->import_kv(ids, header, data);
      ADD_FAILURE() << "import accepted, expected a refusal naming " << field;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what() << " does not name " << field;
    }
    EXPECT_EQ(pool_of_b(), before) << "refused import (" << field << ") wrote into the pool";
  };
  kv_span_header wrong_head_dim = good;
  wrong_head_dim.head_dim = 16;
  expect_refused({0, 11, 16}, good, span, "block id 16");
  expect_refused(blocks_b, wrong_head_dim, span, "head_dim");
  expect_refused(blocks_b, good, std::vector<std::byte>(span.begin(), span.end() - 1), "data size");
  EXPECT_THROW(a->export_kv(blocks_a, layers - 1, 2, dtype::f32, span), std::invalid_argument);
}

}  // namespace
}  // namespace troupe
