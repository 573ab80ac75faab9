// Paged attention against a double-precision reference that reads the same pools through the
// same block tables: mixed prefill chunks and decodes, GQA groups, split-K, every activation
// dtype, and pools in every KV dtype (q8_0 and fp8 read through their block formats; the
// reference decodes the same bytes with model/kv_transfer.hpp's kv_decode_f32).

#include <algorithm>
#include <cstring>
#include <numeric>

#include "backends/cuda/paged_attention.hpp"
#include "model/kv_transfer.hpp"
#include "tests/backends/cuda/cuda_test_util.hpp"

namespace troupe::cuda {
namespace {

using namespace troupe::cuda::testing;

struct attention_case {
  int num_heads, num_kv_heads, head_dim, block_size;
  std::vector<int> new_tokens;  // per sequence
  std::vector<int> contexts;    // per sequence, >= new tokens
  int max_context_hint;         // passed to the planner (-1: graph-style, unknown)
};

// The pool's bytes in `kv_type` and the values they decode to (what attention must see).
struct encoded_pool {
  std::vector<std::byte> bytes;
  std::vector<float> values;
};
encoded_pool encode_pool(dtype kv_type, const std::vector<float>& values) {
  encoded_pool pool{std::vector<std::byte>(kv_bytes(kv_type, values.size())), std::vector<float>(values.size())};
  kv_encode_f32(kv_type, values.data(), pool.bytes.data(), values.size());
  kv_decode_f32(kv_type, pool.bytes.data(), pool.values.data(), values.size());
  return pool;
}

void run_case(const attention_case& c, dtype type, uint32_t seed, dtype kv_type) {
  std::mt19937 rng(seed);
  const int seqs = static_cast<int>(c.contexts.size());
  const int group = c.num_heads / c.num_kv_heads, head_dim = c.head_dim;
  std::vector<int32_t> query_start{0}, block_table_start{0}, block_tables;
  int total_blocks = 0;
  for (int s = 0; s < seqs; ++s) {
    query_start.push_back(query_start.back() + c.new_tokens[s]);
    const int blocks = (c.contexts[s] + c.block_size - 1) / c.block_size;
    total_blocks += blocks;
    block_table_start.push_back(block_table_start.back() + blocks);
  }
  // Blocks handed out in a shuffled order, with spare blocks in the pool that nobody owns.
  const int num_blocks = total_blocks + 5;
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  block_tables.assign(ids.begin(), ids.begin() + total_blocks);

  const int tokens = query_start.back();
  const int q_stride = (c.num_heads + 2 * c.num_kv_heads) * head_dim;  // q inside a fused qkv row
  const int64_t pool_elems = int64_t{num_blocks} * c.block_size * c.num_kv_heads * head_dim;
  const std::vector<float> qkv = rounded(type, random_values(tokens * q_stride, rng));
  const encoded_pool k_encoded = encode_pool(kv_type, random_values(pool_elems, rng));
  const encoded_pool v_encoded = encode_pool(kv_type, random_values(pool_elems, rng));
  const std::vector<float>& k_pool = k_encoded.values;
  const std::vector<float>& v_pool = v_encoded.values;

  int num_sms = 0;
  check(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0), "sm count");
  const paged_attention_plan plan =
      plan_paged_attention(query_start, c.num_heads, c.num_kv_heads, head_dim, c.max_context_hint, num_sms);
  device_buffer q_d = to_device(type, qkv), k_d = to_device_raw(k_encoded.bytes), v_d = to_device_raw(v_encoded.bytes);
  device_buffer qs_d = to_device_raw(query_start),
                ctx_d = to_device_raw(std::vector<int32_t>(c.contexts.begin(), c.contexts.end()));
  device_buffer bts_d = to_device_raw(block_table_start), bt_d = to_device_raw(block_tables);
  device_buffer work_d = to_device_raw(plan.work_items);
  device_buffer workspace = poisoned(paged_attention_workspace_floats(plan, c.num_kv_heads, head_dim) * 4);
  device_buffer out = poisoned(static_cast<size_t>(tokens) * c.num_heads * head_dim * element_size(type));

  paged_attention_params p;
  p.q = q_d.get();
  p.q_row_stride = q_stride;
  p.k_cache = k_d.get();
  p.v_cache = v_d.get();
  p.out = out.get();
  p.query_start = qs_d.as<int32_t>();
  p.context_lengths = ctx_d.as<int32_t>();
  p.block_table_start = bts_d.as<int32_t>();
  p.block_tables = bt_d.as<int32_t>();
  p.work_items = work_d.as<int32_t>();
  p.num_work = plan.num_work();
  p.num_splits = plan.num_splits;
  p.rows_per_cta = plan.rows_per_cta;
  if (plan.num_splits > 1) {
    const size_t rows = static_cast<size_t>(plan.num_work()) * c.num_kv_heads * plan.num_splits * plan.rows_per_cta;
    p.partial_out = workspace.as<float>();
    p.partial_max = p.partial_out + rows * head_dim;
    p.partial_sum = p.partial_max + rows;
  }
  p.num_heads = c.num_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.head_dim = head_dim;
  p.block_size = c.block_size;
  p.kv_slot_bytes = static_cast<int64_t>(kv_bytes(kv_type, size_t(c.num_kv_heads) * head_dim));
  p.kv_head_bytes = static_cast<int64_t>(kv_bytes(kv_type, size_t(head_dim)));
  p.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  paged_attention(p, type, kv_type, nullptr);
  const std::vector<float> got = from_device(type, out.get(), static_cast<size_t>(tokens) * c.num_heads * head_dim);

  std::vector<double> ref(got.size());
  for (int s = 0; s < seqs; ++s) {
    const int q_len = c.new_tokens[s], context = c.contexts[s];
    for (int i = 0; i < q_len; ++i) {
      const int row = query_start[s] + i, visible = context - q_len + i + 1;
      for (int h = 0; h < c.num_heads; ++h) {
        const int kv_head = h / group;
        std::vector<double> scores(visible);
        double best = -INFINITY;
        for (int t = 0; t < visible; ++t) {
          const int64_t slot =
              int64_t{block_tables[block_table_start[s] + t / c.block_size]} * c.block_size + t % c.block_size;
          double dot = 0.0;
          for (int d = 0; d < head_dim; ++d) {
            dot += double{qkv[row * q_stride + h * head_dim + d]} *
                   k_pool[(slot * c.num_kv_heads + kv_head) * head_dim + d];
          }
          scores[t] = dot / std::sqrt(static_cast<double>(head_dim));
          best = std::max(best, scores[t]);
        }
        double total = 0.0;
        for (double& score : scores) total += (score = std::exp(score - best));
        for (int t = 0; t < visible; ++t) {
          const int64_t slot =
              int64_t{block_tables[block_table_start[s] + t / c.block_size]} * c.block_size + t % c.block_size;
          for (int d = 0; d < head_dim; ++d) {
            ref[(int64_t{row} * c.num_heads + h) * head_dim + d] +=
                scores[t] / total * v_pool[(slot * c.num_kv_heads + kv_head) * head_dim + d];
          }
        }
      }
    }
  }
  EXPECT_LT(normalized_error(got, ref), type == dtype::f32 ? 1e-5 : tolerance(type))
      << dtype_name(type) << " KV " << dtype_name(kv_type) << " head_dim " << head_dim << " group " << group
      << " splits " << plan.num_splits << " rows/cta " << plan.rows_per_cta;
}

TEST(cuda_paged_attention, mixed_prefill_chunks_and_decodes) {
  TROUPE_REQUIRE_GPU();
  // A fresh prompt, a decode, a chunk continuing a prompt, and a one-token prompt.
  const attention_case c{8, 4, 64, 16, {37, 1, 20, 1}, {37, 100, 70, 1}, 100};
  for (dtype type : activation_types()) run_case(c, type, 11, type);
}

TEST(cuda_paged_attention, every_kv_dtype_under_every_activation_dtype) {
  TROUPE_REQUIRE_GPU();
  const attention_case c{8, 2, 64, 16, {37, 1, 20, 1}, {37, 300, 70, 1}, 300};
  for (dtype type : activation_types()) {
    for (dtype kv : {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0, dtype::fp8_e4m3}) run_case(c, type, 14, kv);
  }
  const attention_case long_decode{32, 8, 128, 16, {1, 1}, {3000, 777}, 3000};  // split-K over q8_0 / fp8
  for (dtype kv : {dtype::q8_0, dtype::fp8_e4m3}) run_case(long_decode, dtype::bf16, 15, kv);
}

TEST(cuda_paged_attention, head_dims_and_groups) {
  TROUPE_REQUIRE_GPU();
  for (int head_dim : {8, 128, 256}) {
    for (int kv_heads : {1, 2, 8}) {
      const attention_case c{8, kv_heads, head_dim, 4, {9, 1, 3}, {9, 33, 50}, 50};
      run_case(c, dtype::bf16, 12 + head_dim + kv_heads, dtype::bf16);
      run_case(c, dtype::f32, 13 + head_dim + kv_heads, dtype::f32);
    }
  }
}

TEST(cuda_paged_attention, split_k_decode_over_long_contexts) {
  TROUPE_REQUIRE_GPU();
  // Few sequences with long contexts: the planner splits the context across CTAs.
  const attention_case c{32, 8, 128, 16, {1, 1}, {3000, 777}, 3000};
  for (dtype type : activation_types()) run_case(c, type, 21, type);
  // Graph-style plan (context unknown): up to 16 splits, many of them empty for short contexts.
  const attention_case graph{4, 2, 64, 16, {1, 1, 1}, {5, 40, 300}, -1};
  for (dtype type : activation_types()) run_case(graph, type, 22, type);
}

TEST(cuda_paged_attention, planner_groups_rows_and_splits_only_when_useful) {
  const std::vector<int32_t> decode{0, 1, 2, 3, 4};
  const paged_attention_plan d = plan_paged_attention(decode, 32, 8, 128, 4096, 132);
  EXPECT_EQ(d.rows_per_cta, 4);  // one token x 4 query heads per kv head
  EXPECT_EQ(d.num_work(), 4);
  EXPECT_EQ(d.num_splits, 9);  // 32 CTAs fill 132 SMs twice over with 9 splits
  const paged_attention_plan short_context = plan_paged_attention(decode, 32, 8, 128, 300, 132);
  EXPECT_EQ(short_context.num_splits, 1);  // 300 tokens do not pay for a split
  const std::vector<int32_t> prefill{0, 100};
  const paged_attention_plan p = plan_paged_attention(prefill, 32, 8, 128, 100, 132);
  EXPECT_EQ(p.rows_per_cta, 64);
  EXPECT_EQ(p.num_work(), 7);  // 400 rows in CTAs of 64
  EXPECT_THROW(plan_paged_attention(decode, 30, 8, 128, 10, 132), std::runtime_error);
}

}  // namespace
}  // namespace troupe::cuda
