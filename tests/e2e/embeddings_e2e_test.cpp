// /v1/embeddings through the real server and the official `openai` npm client (which asks for
// base64 and decodes it): stories260K's embeddings of a batch of inputs (text and token ids),
// compared with the same pooling done here over the hidden states of a float64 forward pass
// written from the Hugging Face definitions (tests/oracles/llama_reference.mjs), not by Troupe's
// code; the batch's order kept; last-token pooling by default and mean pooling when the model's
// sentence-transformers config says so (modules.json, 1_Pooling/config.json, 2_Normalize).

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

json run_node(const std::string& script, const json& plan, const std::string& tag) {
  const fs::path path =
      fs::temp_directory_path() / ("troupe-embeddings-" + tag + "-" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << plan.dump();
  const run_result node = run_command("node " TROUPE_ORACLE_DIR "/" + script + " " +
                                      (script == "openai_client.mjs" ? "@" : "") + path.string());
  fs::remove(path);
  return json::parse(node.out.empty() ? "null" : node.out, nullptr, false);
}

// The reference's final hidden states of each prompt, pooled and normalized here.
std::vector<std::vector<double>> reference_embeddings(const std::string& model_dir,
                                                      const std::vector<std::vector<int>>& prompts, bool mean) {
  json runs = json::array();
  for (const auto& ids : prompts)
    runs.push_back({{"model", model_dir}, {"prompt_ids", ids}, {"forced_ids", json::array()}, {"hidden_states", true}});
  const fs::path path =
      fs::temp_directory_path() / ("troupe-embeddings-reference-" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << json{{"runs", runs}}.dump();
  const run_result node = run_command("node " TROUPE_ORACLE_DIR "/llama_reference.mjs " + path.string());
  fs::remove(path);
  std::vector<std::vector<double>> out;
  std::istringstream lines(node.out);
  std::string line;
  while (std::getline(lines, line)) {
    const json hidden = json::parse(line)["hidden"];
    std::vector<double> v(hidden[0].size(), 0.0);
    if (mean) {
      for (const auto& row : hidden) {
        for (size_t j = 0; j < v.size(); ++j) v[j] += row[j].get<double>() / static_cast<double>(hidden.size());
      }
    } else {
      for (size_t j = 0; j < v.size(); ++j) v[j] = hidden.back()[j].get<double>();
    }
    double norm = 0.0;
    for (double x : v) norm += x * x;
    for (double& x : v) x /= std::sqrt(norm);
    out.push_back(std::move(v));
  }
  EXPECT_EQ(out.size(), prompts.size()) << node.err;
  return out;
}

void expect_embeddings_match(const serve_process& server, const std::string& model_dir, bool mean) {
  const std::vector<json> inputs = {"Once upon a time", "Lily wanted", "Zoo", json::array({1, 403, 407, 261})};
  const json plan = {
      {"base_url", "http://127.0.0.1:" + std::to_string(server.http_port()) + "/v1"},
      {"requests", json::array({{{"api", "embeddings"}, {"params", {{"model", "m"}, {"input", inputs}}}}})}};
  const json results = run_node("openai_client.mjs", plan, mean ? "mean" : "last");
  ASSERT_TRUE(results.is_array() && results[0]["ok"].get<bool>()) << results.dump();
  const json& data = results[0]["data"];
  ASSERT_EQ(data.size(), inputs.size());
  // The prompts the server ran: text tokenized as it tokenizes (BOS first), ids as they are.
  httplib::Client c("127.0.0.1", server.http_port());
  std::vector<std::vector<int>> prompts;
  for (const auto& input : inputs) {
    if (input.is_array()) {
      prompts.push_back(input.get<std::vector<int>>());
    } else {
      prompts.push_back(
          json::parse(c.Post("/tokenize", json{{"prompt", input}}.dump(), "application/json")->body)["tokens"]
              .get<std::vector<int>>());
    }
  }
  const auto expected = reference_embeddings(model_dir, prompts, mean);
  ASSERT_EQ(expected.size(), inputs.size());
  int total_tokens = 0;
  for (const auto& p : prompts) total_tokens += static_cast<int>(p.size());
  EXPECT_EQ(results[0]["usage"]["prompt_tokens"], total_tokens);
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ(data[i]["index"], i);  // in the order of the inputs
    const auto got = data[i]["embedding"].get<std::vector<double>>();
    ASSERT_EQ(got.size(), expected[i].size());
    double worst = 0.0, norm = 0.0;
    for (size_t j = 0; j < got.size(); ++j) {
      worst = std::max(worst, std::fabs(got[j] - expected[i][j]));
      norm += got[j] * got[j];
    }
    EXPECT_LT(worst, 1e-4) << "input " << i << (mean ? " (mean)" : " (last)");
    EXPECT_NEAR(norm, 1.0, 1e-4);
  }
  // Different inputs, different vectors (the test would pass on a constant otherwise).
  double distance = 0.0;
  for (size_t j = 0; j < expected[0].size(); ++j) distance += std::fabs(expected[0][j] - expected[1][j]);
  EXPECT_GT(distance, 1e-2);
}

TEST(embeddings_e2e, last_and_mean_pooling_equal_the_float64_reference_in_batch_order) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  if (!fs::exists(TROUPE_ORACLE_DIR "/node_modules/openai/package.json")) GTEST_SKIP() << "no openai npm package";
  {
    serve_process server({"--http-port", "0", "--served-model-name", "m"});
    expect_embeddings_match(server, stories_dir, /*mean=*/false);
    EXPECT_NE(server.log().find("embeddings: last-token pooling"), std::string::npos) << server.log();
  }
  // A copy of the model that says, as sentence-transformers models do, to pool by the mean.
  const fs::path dir = fs::temp_directory_path() / ("troupe-mean-pooled-" + std::to_string(::getpid()));
  fs::create_directories(dir / "1_Pooling");
  for (const auto& entry : fs::directory_iterator(stories_dir)) fs::copy(entry.path(), dir / entry.path().filename());
  std::ofstream(dir / "modules.json")
      << R"([{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
    {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
    {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}])";
  std::ofstream(dir / "1_Pooling" / "config.json") << R"({"word_embedding_dimension":64,"pooling_mode_cls_token":false,
    "pooling_mode_mean_tokens":true,"pooling_mode_max_tokens":false,"pooling_mode_lasttoken":false})";
  {
    serve_process server({"--http-port", "0", "--served-model-name", "m"}, {}, dir.string());
    expect_embeddings_match(server, dir.string(), /*mean=*/true);
    EXPECT_NE(server.log().find("embeddings: mean pooling"), std::string::npos) << server.log();
    // A dimension it does not have is refused by name.
    httplib::Client c("127.0.0.1", server.http_port());
    auto bad = c.Post("/v1/embeddings", R"({"model":"m","input":"x","dimensions":32})", "application/json");
    EXPECT_EQ(bad->status, 400);
    EXPECT_EQ(json::parse(bad->body)["error"]["param"], "dimensions");
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace troupe::test
