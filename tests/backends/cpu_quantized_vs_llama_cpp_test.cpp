// Quantized models against llama.cpp (issue 21, "How it is checked"). One random model (rows of
// 256 and 512 values, so every block fits; weights scaled so the next-token distributions are
// peaked) is quantized by Troupe's quantizer into every GGUF type (--pure) and the presets
// people download; llama.cpp (node-llama-cpp, tests/oracles/llama_cpp_oracle.mjs, one process
// for all files) loads each file, returns the logits at every position of a 256-token prompt,
// and continues it greedily for 32 tokens. Troupe runs the same file.
//
// Measure and tolerance, from measurement. llama.cpp multiplies quantized weights by
// activations it has itself rounded to 8 bits (Q8_0 blocks of 32 for the legacy types, Q8_K
// blocks of 256 for the k-quants), Troupe by f32 activations: the logits differ by that
// rounding, and by nothing else (the F32 file, where neither rounds, agrees to 1e-5). On this
// model that rounding moves logits of rms ~5 by at most ~0.45 and the distributions by a mean
// KL of ~1e-3 (Q8_0 activations) to ~2e-3 (Q8_K), about what Q8_0 *weights* do (llama.cpp's
// own Q8_0 file against its F32 file: 0.42), while each 2-6 bit type's weight rounding moves
// them by 2 to 22. Per file:
//  - max |logit difference| over the prompt <= logit_bound (0.6) and at most half of what the
//    file's own weight rounding moves (2-6 bit types): a misread tensor would exceed both;
//  - mean KL(llama.cpp || Troupe) over the positions <= kl_bound (4e-3 nats);
//  - top-1 agreement over the 256 positions >= 94 % (measured 94.9-99.6 %: a random model's
//    logits are Gaussian across the vocabulary, so a few positions in a hundred are near-ties
//    within the rounding, and which of them flip moves with any last-bit change upstream of an
//    int8 activation rounding (attention's new summation order put iq4_xs at 94.9 %); 99 %
//    would need the peaked distributions of a trained model);
//  - greedy: Troupe's 32 tokens are llama.cpp's up to the first difference, where the two
//    tokens must be a near-tie for Troupe (margin within 2 * logit_bound); not compared after.
//
// And on stories260K (trained; hidden 64, so only the 32-value block types fit its rows): each
// such type quantized from its F32 GGUF stays close to the F32 model along the reference
// continuations of refs.json (teacher forcing): top-1 agreement with the F32 model and mean KL
// from it bounded per type, and llama.cpp, on the same quantized file, continues the first
// reference prompt greedily as Troupe does (up to a near-tie).

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>

#include "backends/cpu/cpu_model.hpp"
#include "model/loader/gguf_file.hpp"
#include "model/loader/gguf_writer.hpp"
#include "model/loader/model_loader.hpp"
#include "model/model_maker.hpp"
#include "model/model_quantizer.hpp"
#include "model/quant/quantize_presets.hpp"
#include "tests/backends/cpu_greedy_support.hpp"
#include "tests/llama_quantize_oracle.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

constexpr int prompt_length = 256;
constexpr int greedy_steps = 32;
constexpr double min_top1_agreement = 0.94;
constexpr double kl_bound = 4e-3;    // nats, mean over positions
constexpr double logit_bound = 0.6;  // logits of rms ~5 on this model
constexpr double flip_bound = 2 * logit_bound;
// The most of a file's own weight rounding (llama.cpp on it against llama.cpp on the F32 file)
// the difference between the engines may be, for types of 2 to 6 bits.
constexpr double max_share_of_rounding = 0.5;

std::string run_command(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) throw std::runtime_error("cannot run: " + command);
  std::string output;
  char buffer[1 << 16];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe.get())) output.append(buffer, n);
  return output;
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += (out.empty() ? "" : ",") + std::to_string(id);
  return out;
}

// Small weights keep the random model's layers near linear, so a small change of the weights
// (or of the activations, as llama.cpp quantizes them) moves the logits a little, not
// chaotically; a large output projection then makes the next-token distributions peaked.
constexpr float output_scale = 16.0f;

// Writes `in` again as `out` with output.weight multiplied by `factor`.
void scale_output(const std::filesystem::path& in, const std::filesystem::path& out, float factor) {
  const gguf_file file = gguf_file::open(in);
  gguf_writer writer;
  for (const std::string& key : file.keys()) writer.set(key, *file.find(key));
  for (const gguf_tensor_info& info : file.tensors()) {
    std::vector<std::byte> bytes(info.data, info.data + info.num_bytes);
    if (info.name == "output.weight") {
      float* values = reinterpret_cast<float*>(bytes.data());  // F32: the model maker's default type
      for (size_t i = 0; i < bytes.size() / 4; ++i) values[i] *= factor;
    }
    writer.add_tensor(info.name, static_cast<gguf_tensor_type>(info.type), info.dims, std::move(bytes));
  }
  writer.write(out);
}

std::filesystem::path work_dir() {
  return std::filesystem::path(TROUPE_BINARY_DIR) / "cpu_quantized_models" / std::to_string(getpid());
}

// KL(p || q) of two logit vectors' softmax distributions, in nats.
double kl_divergence(const float* p_logits, const float* q_logits, int n) {
  const double p_max = *std::max_element(p_logits, p_logits + n), q_max = *std::max_element(q_logits, q_logits + n);
  double p_sum = 0, q_sum = 0;
  for (int i = 0; i < n; ++i) {
    p_sum += std::exp(p_logits[i] - p_max);
    q_sum += std::exp(q_logits[i] - q_max);
  }
  double kl = 0;
  for (int i = 0; i < n; ++i) {
    const double log_p = p_logits[i] - p_max - std::log(p_sum), log_q = q_logits[i] - q_max - std::log(q_sum);
    kl += std::exp(log_p) * (log_p - log_q);
  }
  return std::max(0.0, kl);
}

// Troupe's logits at every position of `prompt`, one forward. [prompt.size() * vocab]
std::vector<float> prompt_logits(model& m, const std::vector<int32_t>& prompt) {
  const int n = static_cast<int>(prompt.size());
  std::vector<int32_t> blocks;
  for (int b = 0; b * m.kv_shape().block_size < n; ++b) blocks.push_back(b);
  forward_batch batch = test::one_sequence_batch(prompt, 0, n, blocks, m.kv_shape().block_size);
  batch.logits_rows.clear();
  for (int t = 0; t < n; ++t) batch.logits_rows.push_back(t);
  std::vector<float> logits(static_cast<size_t>(n) * m.config().vocab_size);
  m.forward(batch, logits.data());
  return logits;
}

struct oracle_run {
  std::vector<int32_t> generated;
  std::vector<std::vector<float>> prompt_logits;  // [prompt_length][vocab]
};

struct quantized_case {
  std::string type;
  bool pure;
  std::string label() const { return pure ? type + " (pure)" : type; }
  std::string file() const { return (pure ? "pure-" : "preset-") + type + ".gguf"; }
};

const std::vector<quantized_case> cases = {
    {"F32", false},    {"q8_0", true},    {"q4_0", true},  {"q4_1", true},    {"q5_0", true},    {"q5_1", true},
    {"q2_k", true},    {"q3_k", true},    {"q4_k", true},  {"q5_k", true},    {"q6_k", true},    {"iq4_nl", true},
    {"iq4_xs", true},  {"mxfp4", true},   {"Q2_K", false}, {"Q3_K_M", false}, {"Q4_K_S", false}, {"Q4_K_M", false},
    {"Q5_K_S", false}, {"Q5_K_M", false}, {"Q6_K", false}, {"IQ4_XS", false}, {"Q4_0", false},
};

class cpu_quantized_vs_llama_cpp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (run_command("node --version 2>/dev/null").rfind("v", 0) != 0) return;
    if (!test::missing_shared_model(test::stories260k_dir / "hf").empty()) return;
    std::filesystem::remove_all(work_dir());
    model_maker_options options;
    options.hidden_size = 256;
    options.intermediate_size = 512;
    options.num_layers = 2;
    options.num_heads = 4;
    options.num_kv_heads = 2;
    options.seed = 77;
    options.init_stddev = 0.02f;
    options.tokenizer = test::stories260k_dir / "hf";
    options.out = work_dir() / "random";
    const made_model made = make_model(options);
    const std::filesystem::path peaked = work_dir() / "peaked.gguf";
    scale_output(made.gguf_path, peaked, output_scale);

    std::string model_flags;
    for (const quantized_case& c : cases) {
      quantize_options q;
      q.input = peaked;
      q.output = work_dir() / c.file();
      q.type = c.type;
      q.pure = c.pure;
      q.show_progress = false;
      q.num_threads = 2;
      model_quantizer(q).run();
      model_flags += " --model '" + q.output.string() + "'";
    }
    std::mt19937 rng(21);
    std::uniform_int_distribution<int> token(3, made.config.vocab_size - 1);
    prompt_ = {1};
    while (static_cast<int>(prompt_.size()) < prompt_length) prompt_.push_back(token(rng));
    const std::string command = "node " + std::string(TROUPE_ORACLE_DIR) + "/llama_cpp_oracle.mjs" + model_flags +
                                " --f32-kv-cache --all-prompt-logits --prompt-ids " + join_ids(prompt_) + " --steps " +
                                std::to_string(greedy_steps) + " 2>&1";
    std::istringstream lines(run_command(command));
    for (const quantized_case& c : cases) {
      std::string line;
      std::getline(lines, line);
      try {
        const auto json = nlohmann::json::parse(line);
        oracle_[c.label()] = {json.at("generated_ids").get<std::vector<int32_t>>(),
                              json.at("prompt_logits").get<std::vector<std::vector<float>>>()};
      } catch (const std::exception&) {
        oracle_error_ = "llama.cpp could not run " + c.file() + ": " + line.substr(0, 400);
        return;
      }
    }
  }

  static void TearDownTestSuite() {
    std::error_code ignored;
    std::filesystem::remove_all(work_dir(), ignored);
  }

  void expect_agreement(const quantized_case& c) {
    if (oracle_.empty() && oracle_error_.empty()) GTEST_SKIP() << "node or the stories260K tokenizer is missing";
    ASSERT_TRUE(oracle_error_.empty()) << oracle_error_;
    load_options load;
    load.path = work_dir() / c.file();
    load.show_progress = false;
    const loaded_model loaded = load_model(load);
    auto m = make_cpu_model(loaded.config, loaded.weights, {64, 16}, 2);
    const int vocab = loaded.config.vocab_size;
    const oracle_run& theirs = oracle_.at(c.label());
    ASSERT_EQ(theirs.prompt_logits.size(), static_cast<size_t>(prompt_length));

    const std::vector<float> ours = prompt_logits(*m, prompt_);
    int agree = 0;
    double kl_sum = 0, worst_logit = 0;
    for (int t = 0; t < prompt_length; ++t) {
      const float* mine = ours.data() + static_cast<size_t>(t) * vocab;
      const std::vector<float>& llama = theirs.prompt_logits[t];
      ASSERT_EQ(llama.size(), static_cast<size_t>(vocab));
      agree += test::argmax(mine, vocab) == test::argmax(llama.data(), vocab);
      kl_sum += kl_divergence(llama.data(), mine, vocab);
      for (int i = 0; i < vocab; ++i) worst_logit = std::max<double>(worst_logit, std::fabs(mine[i] - llama[i]));
    }
    const double agreement = static_cast<double>(agree) / prompt_length, mean_kl = kl_sum / prompt_length;
    EXPECT_GE(agreement, min_top1_agreement) << c.label();
    EXPECT_LE(mean_kl, kl_bound) << c.label();
    EXPECT_LE(worst_logit, logit_bound) << c.label();
    // What the weights' own rounding moves: llama.cpp on this file against llama.cpp on F32.
    double rounding = 0;
    const oracle_run& f32 = oracle_.at("F32");
    for (int t = 0; t < prompt_length; ++t) {
      for (int i = 0; i < vocab; ++i)
        rounding = std::max<double>(rounding, std::fabs(theirs.prompt_logits[t][i] - f32.prompt_logits[t][i]));
    }
    const bool eight_bits_or_more = c.type == "F32" || c.type == "q8_0" || c.type == "Q8_0";
    if (!eight_bits_or_more) {
      EXPECT_LE(worst_logit, max_share_of_rounding * rounding) << c.label();
    }

    // Greedy: the same tokens until a near-tie, if any.
    const test::greedy_result greedy = test::greedy_generate(*m, prompt_, greedy_steps);
    const std::vector<std::vector<float>> forced = test::teacher_forced_logits(*m, prompt_, theirs.generated);
    int same = 0;
    std::string flip;
    for (int step = 0; step < greedy_steps; ++step) {
      const std::vector<float>& logits = forced[step];
      const int chosen = test::argmax(logits.data(), vocab), expected = theirs.generated[step];
      if (chosen == expected) {
        ++same;
        continue;
      }
      const double margin = logits[chosen] - logits[expected];
      flip = " (near-tie at step " + std::to_string(step) + ": margin " + std::to_string(margin) + ")";
      EXPECT_LE(margin, flip_bound) << c.label() << " step " << step << ": Troupe picks " << chosen << ", llama.cpp "
                                    << expected << ", not a near-tie";
      break;
    }
    if (flip.empty()) {
      EXPECT_EQ(greedy.generated, theirs.generated) << c.label();
    }
    std::printf(
        "[%-15s] top-1 %5.1f %%, mean KL %.2e, max |dlogit| %.3f (the weights' rounding: %.2f), greedy %d/%d same%s\n",
        c.label().c_str(), 100 * agreement, mean_kl, worst_logit, rounding, same, greedy_steps, flip.c_str());
  }

  static inline std::map<std::string, oracle_run> oracle_;
  static inline std::vector<int32_t> prompt_;
  static inline std::string oracle_error_;
};

TEST_F(cpu_quantized_vs_llama_cpp, every_type_and_preset_agrees_with_llama_cpp) {
  for (const quantized_case& c : cases) expect_agreement(c);
}

// stories260K: the types whose 32-value blocks fit its rows of 64, each against the F32 model.
struct stories_case {
  std::string type;
  double min_agreement;  // teacher-forced top-1 agreement with the F32 model's tokens
  double max_kl;         // mean KL(F32 || quantized), nats
};

// Along every reference continuation of refs.json: the share of steps whose top-1 token is the
// F32 model's, and the mean KL(F32 || m).
struct closeness {
  double agreement = 0;
  double mean_kl = 0;
};
closeness closeness_to(model& m, int vocab, const nlohmann::json& refs,
                       const std::vector<std::vector<std::vector<float>>>& f32_logits) {
  int agree = 0, steps = 0;
  double kl_sum = 0;
  for (size_t r = 0; r < refs.at("references").size(); ++r) {
    const auto& ref = refs.at("references")[r];
    const auto expected = ref.at("generated_ids").get<std::vector<int32_t>>();
    const auto logits = test::teacher_forced_logits(m, ref.at("input_ids").get<std::vector<int32_t>>(), expected);
    for (size_t step = 0; step < expected.size(); ++step, ++steps) {
      agree += test::argmax(logits[step].data(), vocab) == expected[step];
      kl_sum += kl_divergence(f32_logits[r][step].data(), logits[step].data(), vocab);
    }
  }
  return {static_cast<double>(agree) / steps, kl_sum / steps};
}

TEST(cpu_quantized_stories260k, each_fitting_type_stays_close_to_f32) {
  const std::filesystem::path f32_path = test::stories260k_dir / "gguf/stories260K-f32.gguf";
  if (auto missing = test::missing_shared_model(f32_path); !missing.empty()) GTEST_SKIP() << missing;
  // Bounds from measurement (q8_0 99.4 %, 2.1e-4; 5-bit >= 97.8 %, <= 1.4e-2; 4-bit >= 88.9 %, <= 6.1e-2).
  const std::vector<stories_case> types = {{"q8_0", 0.98, 1e-3}, {"q5_0", 0.95, 3e-2}, {"q5_1", 0.95, 3e-2},
                                           {"q4_0", 0.85, 0.1},  {"q4_1", 0.85, 0.1},  {"iq4_nl", 0.85, 0.1}};
  const nlohmann::json refs = nlohmann::json::parse(std::ifstream(test::stories260k_dir / "refs.json"));
  const std::filesystem::path dir = work_dir() / "stories";
  std::filesystem::create_directories(dir);

  // The model keeps views into the loaded weights: both live together.
  struct runnable {
    loaded_model loaded;
    std::unique_ptr<model> m;
  };
  auto cpu_model_of = [](const std::filesystem::path& path) {
    load_options load;
    load.path = path;
    load.show_progress = false;
    auto r = std::make_unique<runnable>();
    r->loaded = load_model(load);
    r->m = make_cpu_model(r->loaded.config, r->loaded.weights, {64, 16}, 2);
    return r;
  };
  const auto f32 = cpu_model_of(f32_path);
  model& f32_model = *f32->m;
  const int vocab = f32->loaded.config.vocab_size;
  std::vector<std::vector<std::vector<float>>> f32_logits;  // [reference][step][vocab]
  for (const auto& ref : refs.at("references")) {
    f32_logits.push_back(test::teacher_forced_logits(f32_model, ref.at("input_ids").get<std::vector<int32_t>>(),
                                                     ref.at("generated_ids").get<std::vector<int32_t>>()));
  }

  std::string model_flags;
  for (const stories_case& c : types) {
    quantize_options q;
    q.input = f32_path;
    q.output = dir / (c.type + ".gguf");
    q.type = c.type;
    q.pure = true;
    q.show_progress = false;
    model_quantizer(q).run();
    model_flags += " --model '" + q.output.string() + "'";

    const auto ours = cpu_model_of(q.output);
    const closeness close = closeness_to(*ours->m, vocab, refs, f32_logits);
    EXPECT_GE(close.agreement, c.min_agreement) << c.type;
    EXPECT_LE(close.mean_kl, c.max_kl) << c.type;
    int prefix_total = 0, steps = 0;
    for (const auto& ref : refs.at("references")) {
      const auto expected = ref.at("generated_ids").get<std::vector<int32_t>>();
      const auto greedy = test::greedy_generate(*ours->m, ref.at("input_ids").get<std::vector<int32_t>>(),
                                                static_cast<int>(expected.size()))
                              .generated;
      int prefix = 0;
      while (prefix < static_cast<int>(expected.size()) && greedy[prefix] == expected[prefix]) ++prefix;
      prefix_total += prefix;
      steps += static_cast<int>(expected.size());
    }
    std::string versus_ggml;
    if (testing::llama_quantize_oracle::available()) {
      // The same type from llama.cpp's quantizer (--pure, no imatrix): how far its file is from F32.
      const std::filesystem::path theirs_path = dir / (c.type + ".llama.cpp.gguf");
      testing::llama_quantize_oracle::instance().quantize(f32_path, theirs_path, quant::find_preset(c.type)->file_type,
                                                          {}, true);
      const closeness theirs = closeness_to(*cpu_model_of(theirs_path)->m, vocab, refs, f32_logits);
      versus_ggml = fmt::format("; llama.cpp's quantizer: {:.1f} %, KL {:.2e} (ours / theirs {:.2f})",
                                100 * theirs.agreement, theirs.mean_kl, close.mean_kl / theirs.mean_kl);
      EXPECT_LE(close.mean_kl, 1.1 * theirs.mean_kl) << c.type << ": further from F32 than llama.cpp's quantizer";
    }
    std::printf(
        "[stories260K %-6s] top-1 agreement with F32 %5.1f %%, mean KL %.2e, free greedy matches F32 for %d of %d "
        "tokens%s\n",
        c.type.c_str(), 100 * close.agreement, close.mean_kl, prefix_total, steps, versus_ggml.c_str());
  }

  // llama.cpp loads each quantized file and continues the first reference prompt as Troupe does.
  if (run_command("node --version 2>/dev/null").rfind("v", 0) != 0) return;
  const auto& first = refs.at("references")[0];
  const auto prompt = first.at("input_ids").get<std::vector<int32_t>>();
  constexpr int steps = 60;
  std::istringstream lines(run_command("node " + std::string(TROUPE_ORACLE_DIR) + "/llama_cpp_oracle.mjs" +
                                       model_flags + " --f32-kv-cache --prompt-ids " + join_ids(prompt) + " --steps " +
                                       std::to_string(steps) + " 2>&1"));
  for (const stories_case& c : types) {
    std::string line;
    std::getline(lines, line);
    std::vector<int32_t> theirs;
    try {
      theirs = nlohmann::json::parse(line).at("generated_ids").get<std::vector<int32_t>>();
    } catch (const std::exception&) {
      FAIL() << "llama.cpp could not run stories260K " << c.type << ": " << line.substr(0, 400);
    }
    const auto quantized = cpu_model_of(dir / (c.type + ".gguf"));
    const auto forced = test::teacher_forced_logits(*quantized->m, prompt, theirs);
    int same = 0;
    for (; same < steps; ++same) {
      const int chosen = test::argmax(forced[same].data(), vocab);
      if (chosen == theirs[same]) continue;
      EXPECT_LE(forced[same][chosen] - forced[same][theirs[same]], flip_bound)
          << "stories260K " << c.type << " step " << same << ": not a near-tie";
      break;
    }
    std::printf("[stories260K %-6s] llama.cpp's greedy continuation equals Troupe's for %d of %d tokens\n",
                c.type.c_str(), same, steps);
  }
}

}  // namespace
}  // namespace troupe
