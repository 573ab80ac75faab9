// Plugins end to end (include/troupe/plugin.h, issue 28): `troupe serve --plugin` with the example
// plugins (examples/plugins) and misbehaving test plugins (tests/plugins/test_plugins) on
// stories260K, through both doors. A rejection reaches the client as an error naming the plugin;
// a plugin that fails, throws, overruns its budget or returns garbage fails only its request, and
// the server keeps serving; a library the server cannot use stops it at start, named.

#include <gtest/gtest.h>

#include <httplib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

std::string example_plugin(const std::string& name) {
  return std::string(TROUPE_BINARY_DIR) + "/plugins/libtroupe_" + name + ".so";
}
std::string test_plugin(const std::string& name) {
  return std::string(TROUPE_BINARY_DIR) + "/tests/plugins/libtest_plugin_" + name + ".so";
}

const std::string reference_prompt = "Once upon a time";

generate_request tenant_request(const std::string& tenant, int max_tokens) {
  auto r = greedy(reference_prompt, max_tokens);
  r.targets.tenant = tenant;
  return r;
}

// POST /v1/completions; the status and the body.
std::pair<int, nlohmann::json> http_completion(const serve_process& server, const nlohmann::json& body) {
  httplib::Client c("127.0.0.1", server.http_port());
  c.set_read_timeout(60, 0);
  auto res = c.Post("/v1/completions", body.dump(), "application/json");
  if (!res) return {0, nlohmann::json()};
  return {res->status, nlohmann::json::parse(res->body, nullptr, false)};
}

// POST `path` with a JSON body; the status and the parsed body.
std::pair<int, nlohmann::json> http_post(const serve_process& server, const std::string& path,
                                         const nlohmann::json& body) {
  httplib::Client c("127.0.0.1", server.http_port());
  c.set_read_timeout(60, 0);
  auto res = c.Post(path, body.dump(), "application/json");
  if (!res) return {0, nlohmann::json()};
  return {res->status, nlohmann::json::parse(res->body, nullptr, false)};
}

// Every request has ended and given its KV blocks back (bounded wait: 5 s).
void expect_every_block_free(client& c) {
  for (int i = 0; i < 50; ++i) {
    stats_reply s = c.stats();
    if (s.num_running == 0 && s.num_free_blocks == s.num_total_blocks) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stats_reply s = c.stats();
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.num_free_blocks, s.num_total_blocks);
}

bool contains_run(const std::vector<int32_t>& ids, const std::vector<int32_t>& run) {
  return std::search(ids.begin(), ids.end(), run.begin(), run.end()) != ids.end();
}

// The phrase the banned-phrase test bans: in stories260K's greedy continuation of the reference
// prompt, two tokens ("▁named", "▁Lily"; /tokenize gives them without the dummy-prefix token a
// leading space would add).
const std::string banned_text = "named Lily";

TEST(plugins_e2e, banned_phrases_keeps_a_phrase_out_of_greedy_output_through_both_doors) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  // The phrase's token ids, as a user gets them: from the server's /tokenize.
  std::vector<int32_t> phrase;
  {
    serve_process plain({"--http", "on", "--http-port", "0", "--served-model-name", "stories"});
    auto [status, body] = http_post(plain, "/tokenize", {{"prompt", banned_text}, {"add_special_tokens", false}});
    ASSERT_EQ(status, 200) << body.dump();
    phrase = body["tokens"].get<std::vector<int32_t>>();
  }
  ASSERT_GE(phrase.size(), 2u) << "a phrase of one token would test only a banned token";
  serve_process server({"--http", "on", "--http-port", "0", "--served-model-name", "stories", "--plugin",
                        example_plugin("banned_phrases") + ",{\"phrases\": [" + nlohmann::json(phrase).dump() + "]}"});
  client c = server.make_client();
  c.set_timeout(std::chrono::seconds(60));

  // Without naming the plugin: the reference, phrase and all.
  auto plain = c.generate(greedy(reference_prompt, 60));
  EXPECT_EQ(plain.text, stories_reference(reference_prompt).at("completion").get<std::string>());
  ASSERT_NE(plain.text.find(banned_text), std::string::npos) << plain.text;
  ASSERT_TRUE(contains_run(plain.token_ids, phrase));

  // ZeroMQ, naming it: neither the ids nor the text, and the output runs as long.
  auto request = greedy(reference_prompt, 60);
  request.sampling.logits_plugins = {"banned_phrases"};
  auto banned = c.generate(request);
  EXPECT_FALSE(contains_run(banned.token_ids, phrase)) << banned.text;
  EXPECT_EQ(banned.text.find(banned_text), std::string::npos) << banned.text;
  EXPECT_GT(banned.usage.completion_tokens, 10);
  // Up to the phrase's first token the output is the reference's: only the completion is masked.
  const size_t first = plain.text.find(banned_text);
  EXPECT_EQ(banned.text.substr(0, first), plain.text.substr(0, first));

  // HTTP, the `plugins` extra field: the same output.
  auto [status, body] = http_completion(server, {{"model", "stories"},
                                                 {"prompt", reference_prompt},
                                                 {"max_tokens", 60},
                                                 {"temperature", 0},
                                                 {"plugins", {"banned_phrases"}}});
  ASSERT_EQ(status, 200) << body.dump();
  EXPECT_EQ(body["choices"][0]["text"].get<std::string>(), banned.text);

  // A name the server did not load is refused by name at both doors; the server serves on.
  request.sampling.logits_plugins = {"banned_phrases", "nope"};
  try {
    c.generate(request);
    ADD_FAILURE() << "a request naming an unknown plugin was served";
  } catch (const client_error& e) {
    EXPECT_EQ(e.code(), error_code::bad_request);
    EXPECT_NE(std::string(e.what()).find(
                  "field 'plugins[1]': no logits plugin named 'nope' is loaded ('banned_phrases' are)"),
              std::string::npos)
        << e.what();
  }
  auto [bad_status, bad_body] = http_completion(
      server, {{"model", "stories"}, {"prompt", reference_prompt}, {"max_tokens", 5}, {"plugins", {"nope"}}});
  EXPECT_EQ(bad_status, 400) << bad_body.dump();
  EXPECT_NE(bad_body.dump().find("no logits plugin named 'nope'"), std::string::npos) << bad_body.dump();
  EXPECT_EQ(c.generate(greedy(reference_prompt, 5)).usage.completion_tokens, 5);

  // /metrics shows the plugin as a stage of the worker: Prometheus' own parser reads it.
  httplib::Client http("127.0.0.1", server.http_port());
  auto res = http.Get("/metrics");
  ASSERT_TRUE(res && res->status == 200);
  const std::filesystem::path metrics_path =
      std::filesystem::temp_directory_path() / ("troupe-plugins-metrics-" + std::to_string(::getpid()) + ".txt");
  std::ofstream(metrics_path) << res->body;
  const run_result oracle =
      run_command("node " + shell_quote(std::string(TROUPE_ORACLE_DIR) + "/prometheus_oracle.mjs") + " " +
                  shell_quote(metrics_path.string()));
  std::filesystem::remove(metrics_path);
  const nlohmann::json parsed = nlohmann::json::parse(oracle.out, nullptr, false);
  ASSERT_TRUE(parsed.is_object() && parsed.value("ok", false)) << oracle.out << oracle.err;
  auto value = [&](const std::string& name) {
    for (const nlohmann::json& sample : parsed["samples"]) {
      const auto& labels = sample["labels"];
      if (sample["name"] == name && labels.value("plugin", "") == "banned_phrases" &&
          labels.value("hook", "") == "logits" && labels.value("stage", "") == "worker") {
        return sample["value"].get<double>();
      }
    }
    return std::nan("");
  };
  // One call per sampled token of the two requests that named it (the refused one made none).
  EXPECT_EQ(value("troupe:plugin_calls_total"), 2.0 * banned.usage.completion_tokens) << res->body;
  EXPECT_EQ(value("troupe:plugin_errors_total"), 0.0);
  EXPECT_GT(value("troupe:plugin_call_p50_seconds"), 0.0);
  EXPECT_GE(value("troupe:plugin_call_p99_seconds"), value("troupe:plugin_call_p50_seconds"));
}

TEST(plugins_e2e, each_misbehaving_logits_hook_fails_only_its_request) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  serve_process server({"--http", "on", "--http-port", "0", "--plugin",
                        test_plugin("misbehaving") + R"(,{"mode": "logits_by_prompt"})"});
  client c = server.make_client();
  c.set_timeout(std::chrono::seconds(60));
  auto by_first_token = [](int32_t first) {
    generate_request r;
    r.prompt_token_ids = std::vector<int32_t>{first, 20, 30};
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 6;
    r.sampling.ignore_eos = true;
    r.sampling.logits_plugins = {"misbehaving"};
    return r;
  };
  const std::pair<int32_t, const char*> cases[] = {
      {10, "plugin 'misbehaving' failed in its logits hook: the database is down"},
      {11, "plugin 'misbehaving' failed in its logits hook: thrown on purpose"},
      {12, "ms in its logits hook, over its budget of 50 ms"},
      {13, "nan for token 256 (a logit is finite, or -inf to mask its token)"},
      {14, "plugin 'misbehaving' masked every token of the vocabulary"},
  };
  for (const auto& [first, expected] : cases) {
    try {
      c.generate(by_first_token(first));
      ADD_FAILURE() << first << ": served";
    } catch (const client_error& e) {
      EXPECT_EQ(e.code(), error_code::internal) << e.what();
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << first << ": " << e.what();
    }
    EXPECT_EQ(c.generate(by_first_token(40)).usage.completion_tokens, 6) << "after " << first;
  }
  // The failed requests' blocks were given back.
  expect_every_block_free(c);
  // The errors and the overrun are counted on the worker's plugin row.
  httplib::Client http("127.0.0.1", server.http_port());
  auto res = http.Get("/metrics");
  ASSERT_TRUE(res && res->status == 200);
  auto worker_row = [&](const std::string& family) {
    std::istringstream lines(res->body);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind(family + "{", 0) == 0 &&
          line.find(",stage=\"worker\",plugin=\"misbehaving\",hook=\"logits\"} ") != std::string::npos) {
        return std::stod(line.substr(line.rfind(' ') + 1));
      }
    }
    return -1.0;
  };
  EXPECT_EQ(worker_row("troupe:plugin_errors_total"), 5.0) << res->body;
  EXPECT_EQ(worker_row("troupe:plugin_over_budget_total"), 1.0);
  EXPECT_EQ(worker_row("troupe:plugin_calls_total"), 5.0 + 5 * 6);
}

TEST(plugins_e2e, quota_and_redactor_through_both_doors) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  const std::string reference = stories_reference(reference_prompt).at("completion").get<std::string>();
  ASSERT_NE(reference.find("Lily"), std::string::npos) << "the reference continuation names Lily";
  serve_process server({"--http", "on", "--http-port", "0", "--served-model-name", "stories", "--plugin",
                        example_plugin("token_quota") + R"(,{"tokens_per_key": 100, "anonymous": true})", "--plugin",
                        example_plugin("pii_redactor") + R"(,{"word": "Lily"})"});
  client c = server.make_client();
  c.set_timeout(std::chrono::seconds(60));

  // The redactor: the streamed text and the whole text have the name replaced, whatever the
  // tokens' split ("Lily" is more than one token of stories260K).
  std::string streamed;
  auto out = c.generate(tenant_request("alice", 60), [&](const delta_reply& d) { streamed += d.text; });
  std::string expected = reference;
  for (size_t at; (at = expected.find("Lily")) != std::string::npos;) expected.replace(at, 4, "[redacted]");
  EXPECT_EQ(out.text, expected);
  EXPECT_EQ(streamed, expected);
  EXPECT_EQ(out.finish_reason, "length");

  // The quota: alice spent 5 + 60 of 100; the next request is cut to what is left (30), the one
  // after it refused, naming the plugin. Another key is served.
  auto cut = c.generate(tenant_request("alice", 60));
  EXPECT_EQ(cut.usage.completion_tokens, 30);
  try {
    c.generate(tenant_request("alice", 10));
    ADD_FAILURE() << "the request past alice's quota was served";
  } catch (const client_error& e) {
    EXPECT_EQ(e.code(), error_code::bad_request);
    EXPECT_NE(
        std::string(e.what()).find("plugin 'token-quota' rejected the request: the key 'alice' has used its quota"),
        std::string::npos)
        << e.what();
  }
  EXPECT_EQ(c.generate(tenant_request("bob", 8)).usage.completion_tokens, 8);

  // The HTTP door: a 400 JSON error naming the plugin, and bob still served.
  auto [status, body] = http_completion(
      server,
      {{"model", "stories"}, {"prompt", reference_prompt}, {"max_tokens", 10}, {"temperature", 0}, {"user", "alice"}});
  EXPECT_EQ(status, 400) << body.dump();
  EXPECT_NE(body.dump().find("plugin 'token-quota' rejected the request"), std::string::npos) << body.dump();
  auto [ok_status, ok_body] = http_completion(
      server,
      {{"model", "stories"}, {"prompt", reference_prompt}, {"max_tokens", 20}, {"temperature", 0}, {"user", "carol"}});
  ASSERT_EQ(ok_status, 200) << ok_body.dump();
  const std::string text = ok_body["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, expected.substr(0, text.size()));
  EXPECT_NE(text.find("named [redacted]. "), std::string::npos) << text;
}

TEST(plugins_e2e, each_misbehaving_request_hook_fails_only_its_request) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  serve_process server({"--plugin", test_plugin("misbehaving") + R"(,{"mode": "by_tenant"})"});
  client c = server.make_client();
  c.set_timeout(std::chrono::seconds(60));
  const std::pair<const char*, const char*> cases[] = {
      {"error", "plugin 'misbehaving' failed in its request hook: the database is down"},
      {"throw", "plugin 'misbehaving' failed in its request hook: thrown on purpose"},
      {"sleep", "ms in its request hook, over its budget of 50 ms"},
      {"bad_ids", "returned garbage: token id 1073741824 at position 2 of its prompt is outside the vocabulary"},
      {"reject", "plugin 'misbehaving' rejected the request: not today"},
  };
  for (const auto& [mode, expected] : cases) {
    try {
      c.generate(tenant_request(mode, 4));
      ADD_FAILURE() << mode << ": served";
    } catch (const client_error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << mode << ": " << e.what();
    }
    // The server goes on serving, and a plugin's rewrite takes effect.
    EXPECT_EQ(c.generate(tenant_request("pass", 5)).usage.completion_tokens, 5) << "after " << mode;
  }
  EXPECT_EQ(c.generate(tenant_request("rewrite_max_tokens", 20)).usage.completion_tokens, 3);
}

TEST(plugins_e2e, an_output_hook_that_returns_garbage_fails_its_request_and_the_server_serves_on) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  serve_process server({"--plugin", test_plugin("misbehaving") + R"(,{"mode": "huge_text"})"});
  client c = server.make_client();
  c.set_timeout(std::chrono::seconds(60));
  for (int i = 0; i < 2; ++i) {
    try {
      c.generate(tenant_request("", 8));
      ADD_FAILURE() << "served";
    } catch (const client_error& e) {
      EXPECT_NE(std::string(e.what()).find("plugin 'misbehaving' returned garbage: set_text with 2097152 bytes"),
                std::string::npos)
          << e.what();
    }
  }
  // The failed requests' blocks were given back: the scheduler ended them.
  expect_every_block_free(c);
}

TEST(plugins_e2e, an_output_hook_can_stop_a_request) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  serve_process server({"--plugin", test_plugin("misbehaving") + R"(,{"mode": "stop"})"});
  client c = server.make_client();
  c.set_timeout(std::chrono::seconds(60));
  auto out = c.generate(tenant_request("", 40));
  EXPECT_EQ(out.finish_reason, "stop");
  EXPECT_LT(out.usage.completion_tokens, 40);
}

TEST(plugins_e2e, a_library_the_server_cannot_use_stops_it_at_start_naming_the_library) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  const std::pair<std::string, std::string> cases[] = {
      {test_plugin("wrong_version"), "built for plugin ABI 2.0, but this server has ABI 1.2"},
      {test_plugin("missing_symbol"), "exports no troupe_plugin_init"},
      {test_plugin("init_fails"), "troupe_plugin_init failed: the key 'limit' is required"},
      {"/nonexistent/libplugin.so", "cannot be loaded"},
  };
  for (const auto& [library, expected] : cases) {
    const run_result r = run_command("timeout 120 " + shell_quote(troupe_binary.string()) + " serve --model " +
                                     shell_quote(stories_dir) +
                                     " --zmq-endpoint tcp://127.0.0.1:0 --http off --plugin " + shell_quote(library));
    EXPECT_NE(r.exit_code, 0) << library;
    EXPECT_NE(r.exit_code, 124) << library << ": the server started";
    EXPECT_NE((r.out + r.err).find(library), std::string::npos) << r.err;
    EXPECT_NE((r.out + r.err).find(expected), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace troupe::test
