// Plugins end to end (include/troupe/plugin.h, issue 28): `troupe serve --plugin` with the example
// plugins (examples/plugins) and misbehaving test plugins (tests/plugins/test_plugins) on
// stories260K, through both doors. A rejection reaches the client as an error naming the plugin;
// a plugin that fails, throws, overruns its budget or returns garbage fails only its request, and
// the server keeps serving; a library the server cannot use stops it at start, named.

#include <gtest/gtest.h>

#include <httplib.h>

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

TEST(plugins_e2e, quota_and_redactor_through_both_doors) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  const std::string reference = stories_reference(reference_prompt).at("completion").get<std::string>();
  ASSERT_NE(reference.find("Lily"), std::string::npos) << "the reference continuation names Lily";
  serve_process server({"--http", "on", "--http-port", "0", "--served-model-name", "stories",
                        "--plugin", example_plugin("token_quota") + R"(,{"tokens_per_key": 100, "anonymous": true})",
                        "--plugin", example_plugin("pii_redactor") + R"(,{"word": "Lily"})"});
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
    EXPECT_NE(std::string(e.what()).find("plugin 'token-quota' rejected the request: the key 'alice' has used its quota"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(c.generate(tenant_request("bob", 8)).usage.completion_tokens, 8);

  // The HTTP door: a 400 JSON error naming the plugin, and bob still served.
  auto [status, body] = http_completion(server, {{"model", "stories"}, {"prompt", reference_prompt}, {"max_tokens", 10},
                                                 {"temperature", 0}, {"user", "alice"}});
  EXPECT_EQ(status, 400) << body.dump();
  EXPECT_NE(body.dump().find("plugin 'token-quota' rejected the request"), std::string::npos) << body.dump();
  auto [ok_status, ok_body] = http_completion(server, {{"model", "stories"}, {"prompt", reference_prompt},
                                                       {"max_tokens", 20}, {"temperature", 0}, {"user", "carol"}});
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
  for (int i = 0; i < 50; ++i) {
    stats_reply s = c.stats();
    if (s.num_running == 0 && s.num_free_blocks == s.num_total_blocks) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stats_reply s = c.stats();
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.num_free_blocks, s.num_total_blocks);
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
      {test_plugin("wrong_version"), "built for plugin ABI 2.0, but this server has ABI 1.0"},
      {test_plugin("missing_symbol"), "exports no troupe_plugin_init"},
      {test_plugin("init_fails"), "troupe_plugin_init failed: the key 'limit' is required"},
      {"/nonexistent/libplugin.so", "cannot be loaded"},
  };
  for (const auto& [library, expected] : cases) {
    const run_result r = run_command("timeout 120 " + shell_quote(troupe_binary.string()) + " serve --model " +
                                     shell_quote(stories_dir) + " --zmq-endpoint tcp://127.0.0.1:0 --http off --plugin " +
                                     shell_quote(library));
    EXPECT_NE(r.exit_code, 0) << library;
    EXPECT_NE(r.exit_code, 124) << library << ": the server started";
    EXPECT_NE((r.out + r.err).find(library), std::string::npos) << r.err;
    EXPECT_NE((r.out + r.err).find(expected), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace troupe::test
