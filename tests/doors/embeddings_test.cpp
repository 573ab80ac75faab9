// /v1/embeddings' pieces: the request (inputs as text or ids, encoding_format, dimensions), the
// response body with its vectors in input order (floats or base64 of little-endian float32), and
// the pooling a model's sentence-transformers config asks for.

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "doors/http/embedding_pooling.hpp"
#include "doors/http/embeddings_response.hpp"
#include "doors/http/generation_session.hpp"
#include "doors/http/openai_request.hpp"

namespace troupe {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

TEST(embeddings, inputs_become_one_engine_request_each_that_samples_one_token) {
  openai_limits limits;
  limits.max_model_len = 128;
  auto parsed =
      parse_openai_request(openai_endpoint::embeddings,
                           R"({"model":"m","input":["a","b",[1,2]],"encoding_format":"base64","stream":true})", limits);
  ASSERT_TRUE(std::holds_alternative<openai_request>(parsed)) << std::get<api_error>(parsed).message;
  const auto& r = std::get<openai_request>(parsed);
  ASSERT_EQ(r.prompts.size(), 3u);
  EXPECT_EQ(r.prompts[2].kind, prompt_kind::token_ids);
  EXPECT_TRUE(r.embedding_base64);
  EXPECT_EQ(r.sampling.max_tokens, 1);
  EXPECT_EQ(r.sampling.num_speculative_tokens, 0);
  EXPECT_EQ(r.ignored_fields, std::vector<std::string>{"stream"});
  for (const char* bad : {R"({"model":"m"})", R"({"model":"m","input":""})", R"({"model":"m","input":5})",
                          R"({"model":"m","input":"x","encoding_format":"int8"})"}) {
    auto e = parse_openai_request(openai_endpoint::embeddings, bad, limits);
    ASSERT_TRUE(std::holds_alternative<api_error>(e)) << bad;
    EXPECT_EQ(std::get<api_error>(e).status, 400);
  }
  // 2048 inputs are one request; more are refused, naming the field.
  json many = {{"model", "m"}, {"input", json::array()}};
  for (int i = 0; i < 2049; ++i) many["input"].push_back("x");
  auto too_many = parse_openai_request(openai_endpoint::embeddings, many.dump(), limits);
  ASSERT_TRUE(std::holds_alternative<api_error>(too_many));
  EXPECT_EQ(std::get<api_error>(too_many).param, "input");
}

TEST(embeddings, the_body_lists_vectors_in_input_order_as_floats_or_base64) {
  openai_request r;
  r.endpoint = openai_endpoint::embeddings;
  r.model = "m";
  r.prompts.resize(2);
  const std::vector<std::vector<float>> vectors = {{0.5f, -1.0f, 0.25f}, {1.0f, 0.0f, -0.125f}};
  for (bool base64 : {false, true}) {
    generation_session session(r, 2, std::make_unique<embeddings_response_builder>("m", base64), std::nullopt);
    // The second input finishes first: the body still lists them by index.
    for (int choice : {1, 0}) {
      text_delta d;
      d.delta.request_id = session.request_id(choice);
      d.delta.token_ids = {7};
      d.delta.finish = finish_reason::length;
      d.delta.embedding = vectors[static_cast<size_t>(choice)];
      request_metrics m;
      m.num_prompt_tokens = 3 + choice;
      m.num_output_tokens = 1;
      d.delta.metrics = m;
      session.apply({choice, d});
    }
    ASSERT_TRUE(session.all_finished());
    const json body = json::parse(session.full_body());
    EXPECT_EQ(body["object"], "list");
    EXPECT_EQ(body["usage"]["prompt_tokens"], 7);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(body["data"][i]["index"], i);
      EXPECT_EQ(body["data"][i]["object"], "embedding");
      if (!base64) {
        EXPECT_EQ(body["data"][i]["embedding"].get<std::vector<float>>(), vectors[static_cast<size_t>(i)]);
      } else {
        EXPECT_EQ(body["data"][i]["embedding"], base64_floats(vectors[static_cast<size_t>(i)]));
      }
    }
  }
  // 0.5f is 00 00 00 3f: "AAAAPw==".
  EXPECT_EQ(base64_floats({0.5f}), "AAAAPw==");
  EXPECT_EQ(base64_floats({0.5f, 0.5f, 0.5f}), "AAAAPwAAAD8AAAA/");
}

TEST(embeddings, the_models_sentence_transformers_config_chooses_the_pooling) {
  const fs::path dir = fs::temp_directory_path() / ("troupe-pooling-" + std::to_string(::getpid()));
  fs::create_directories(dir / "1_Pooling");
  EXPECT_EQ(read_pooling_settings(dir).pooling, pooling_kind::last);  // no modules.json: the default
  EXPECT_TRUE(read_pooling_settings(dir).normalize);
  std::ofstream(dir / "modules.json") << R"([{"path":"","type":"sentence_transformers.models.Transformer"},
      {"path":"1_Pooling","type":"sentence_transformers.models.Pooling"}])";
  std::ofstream(dir / "1_Pooling" / "config.json") << R"({"pooling_mode_mean_tokens":true})";
  const pooling_settings mean = read_pooling_settings(dir);
  EXPECT_EQ(mean.pooling, pooling_kind::mean);
  EXPECT_FALSE(mean.normalize);  // no Normalize module
  std::ofstream(dir / "1_Pooling" / "config.json") << R"({"pooling_mode_cls_token":true})";
  try {
    read_pooling_settings(dir);
    FAIL() << "CLS pooling was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("1_Pooling"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace troupe
