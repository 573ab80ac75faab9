// The plugin host against real shared libraries built beside this test (tests/plugins/test_plugins,
// examples/plugins): loading refuses each broken library by name; each misbehaving hook fails
// only its request, with a message naming the plugin; the example plugins do what they say.

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "plugins/plugin_chain.hpp"
#include "plugins/plugin_library.hpp"

namespace troupe {
namespace {

std::string test_plugin(const std::string& name) {
  return std::string(TROUPE_BINARY_DIR) + "/tests/plugins/libtest_plugin_" + name + ".so";
}
std::string example_plugin(const std::string& name) {
  return std::string(TROUPE_BINARY_DIR) + "/plugins/libtroupe_" + name + ".so";
}

plugin_spec spec_of(const std::string& library, const std::string& config = "{}") {
  plugin_spec spec;
  spec.library = library;
  spec.config_json = config;
  return spec;
}

// The message load throws for this spec ("" when it loads).
std::string load_error(const plugin_spec& spec) {
  try {
    plugin_library::load(spec);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(plugin_library, refuses_each_broken_library_naming_it_and_what_was_wrong) {
  const std::string missing = load_error(spec_of("/nonexistent/libnothing.so"));
  EXPECT_NE(missing.find("/nonexistent/libnothing.so: cannot be loaded"), std::string::npos) << missing;

  const std::string symbol = load_error(spec_of(test_plugin("missing_symbol")));
  EXPECT_NE(symbol.find(test_plugin("missing_symbol")), std::string::npos) << symbol;
  EXPECT_NE(symbol.find("exports no troupe_plugin_init"), std::string::npos) << symbol;

  const std::string major = load_error(spec_of(test_plugin("wrong_version")));
  EXPECT_NE(major.find(test_plugin("wrong_version")), std::string::npos) << major;
  EXPECT_NE(major.find("built for plugin ABI 2.0, but this server has ABI 1.2"), std::string::npos) << major;

  const std::string minor = load_error(spec_of(test_plugin("newer_minor")));
  EXPECT_NE(minor.find("built for plugin ABI 1.3"), std::string::npos) << minor;

  const std::string init = load_error(spec_of(test_plugin("init_fails")));
  EXPECT_NE(init.find("troupe_plugin_init failed: the key 'limit' is required"), std::string::npos) << init;

  const std::string thrown = load_error(spec_of(example_plugin("token_quota"), R"({"tokens_per_key": -5})"));
  EXPECT_NE(thrown.find("tokens_per_key must be positive"), std::string::npos) << thrown;
}

TEST(plugin_library, refuses_bad_specs_and_hooks_the_library_lacks) {
  plugin_spec spec = spec_of(example_plugin("pii_redactor"));
  spec.hooks = {"request"};
  const std::string lacking = load_error(spec);
  EXPECT_NE(lacking.find("asks for its request hook, which it does not implement"), std::string::npos) << lacking;
  spec.hooks = {"logit"};
  EXPECT_NE(load_error(spec).find("unknown hook 'logit'"), std::string::npos);
  spec.hooks = {};
  spec.config_json = "[1]";
  EXPECT_NE(load_error(spec).find("its config must be a JSON object"), std::string::npos);
  EXPECT_THROW(parse_plugin_argument(",{}"), std::runtime_error);
  const plugin_spec parsed = parse_plugin_argument("/x/libp.so,{\"a\": 1, \"b\": 2}");
  EXPECT_EQ(parsed.library, "/x/libp.so");
  EXPECT_EQ(parsed.config_json, "{\"a\": 1, \"b\": 2}");
  EXPECT_EQ(load_error(spec_of(example_plugin("pii_redactor"))), "");
}

struct request_case {
  std::vector<int32_t> ids{5, 6, 7};
  sampling_params sampling;
};

// The request hook of the misbehaving plugin in `mode`: its verdict, and the request after it.
std::optional<plugin_verdict> run_request(const std::string& mode, request_case& r) {
  plugin_chain chain({spec_of(test_plugin("misbehaving"), R"({"mode": ")" + mode + R"("})")}, "request");
  return chain.on_request(1, r.ids, "text", "tenant", r.sampling, /*vocab_size=*/100, /*max_model_len=*/64);
}

TEST(plugin_chain, each_misbehaving_request_hook_fails_its_request_with_a_message_naming_the_plugin) {
  const std::pair<const char*, const char*> cases[] = {
      {"reject", "plugin 'misbehaving' rejected the request: not today"},
      {"error", "plugin 'misbehaving' failed in its request hook: the database is down"},
      {"throw", "plugin 'misbehaving' failed in its request hook: thrown on purpose"},
      {"sleep", "over its budget of 50 ms"},
      {"bad_ids", "token id 1073741824 at position 2 of its prompt is outside the vocabulary of 100"},
      {"bad_sampling", "returned garbage: sampling parameter 'top_p'"},
  };
  for (const auto& [mode, expected] : cases) {
    request_case r;
    auto verdict = run_request(mode, r);
    ASSERT_TRUE(verdict) << mode;
    EXPECT_NE(verdict->message.find(expected), std::string::npos) << mode << ": " << verdict->message;
    EXPECT_EQ(verdict->what == plugin_verdict::kind::rejected, std::string(mode) == "reject") << mode;
    EXPECT_EQ(r.ids, (std::vector<int32_t>{5, 6, 7})) << mode << ": a failed hook changes nothing";
  }
}

TEST(plugin_chain, request_hooks_rewrite_ids_and_parameters_in_order) {
  request_case r;
  EXPECT_FALSE(run_request("rewrite_ids", r));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2, 3}));
  request_case s;
  s.sampling.max_tokens = 40;
  EXPECT_FALSE(run_request("rewrite_max_tokens", s));
  EXPECT_EQ(s.sampling.max_tokens, 3);
  EXPECT_FALSE(run_request("pass", s));
  EXPECT_EQ(s.sampling.max_tokens, 3);
}

TEST(plugin_chain, output_hooks_rewrite_stop_and_refuse_garbage) {
  plugin_chain upper({spec_of(test_plugin("misbehaving"), R"({"mode": "upper"})")}, "output");
  std::string text = "hello";
  EXPECT_FALSE(upper.on_output(1, text, false));
  EXPECT_EQ(text, "HELLO");

  plugin_chain stop({spec_of(test_plugin("misbehaving"), R"({"mode": "stop"})")}, "output");
  auto stopped = stop.on_output(1, text, false);
  ASSERT_TRUE(stopped);
  EXPECT_EQ(stopped->what, plugin_verdict::kind::stopped);
  EXPECT_EQ(stopped->message, "plugin 'misbehaving' stopped the request: enough");

  plugin_chain huge({spec_of(test_plugin("misbehaving"), R"({"mode": "huge_text"})")}, "output");
  auto garbage = huge.on_output(1, text, false);
  ASSERT_TRUE(garbage);
  EXPECT_NE(garbage->message.find("returned garbage: set_text with 2097152 bytes (at most 1048576)"), std::string::npos)
      << garbage->message;

  const auto counters = huge.counters();
  ASSERT_EQ(counters.size(), 1u);
  EXPECT_EQ(counters[0].plugin, "misbehaving");
  EXPECT_EQ(counters[0].hook, "output");
  EXPECT_EQ(counters[0].num_calls, 1);
  EXPECT_EQ(counters[0].num_errors, 1);
}

TEST(plugin_chain, a_plugin_without_the_hook_is_not_kept_and_a_configured_name_wins) {
  plugin_spec spec = spec_of(example_plugin("pii_redactor"));
  EXPECT_TRUE(plugin_chain({spec}, "request").empty());
  spec.name = "redact";
  plugin_chain chain({spec}, "output");
  ASSERT_FALSE(chain.empty());
  EXPECT_EQ(chain.counters().at(0).plugin, "redact");
}

TEST(plugin_chain, the_budget_counts_calls_over_it_and_p99_sees_them) {
  plugin_spec spec = spec_of(test_plugin("misbehaving"), R"({"mode": "sleep"})");
  spec.budget_ms = 500;
  plugin_chain generous({spec}, "request");
  request_case r;
  EXPECT_FALSE(generous.on_request(1, r.ids, "", "", r.sampling, 100, 64));
  const auto c = generous.counters().at(0);
  EXPECT_EQ(c.num_over_budget, 0);
  EXPECT_GE(c.p99_ms, 100.0);
  spec.budget_ms = 50;
  plugin_chain strict({spec}, "request");
  EXPECT_TRUE(strict.on_request(1, r.ids, "", "", r.sampling, 100, 64));
  EXPECT_EQ(strict.counters().at(0).num_over_budget, 1);
}

// The PII redactor (examples/plugins/pii_redactor.c) on a stream split at every byte: nothing of
// an address or number leaks, whatever the split.
std::string redact_stream(plugin_chain& chain, int64_t id, const std::string& text, size_t piece) {
  std::string out;
  for (size_t i = 0; i < text.size(); i += piece) {
    std::string delta = text.substr(i, piece);
    EXPECT_FALSE(chain.on_output(id, delta, false));
    out += delta;
  }
  std::string last;
  EXPECT_FALSE(chain.on_output(id, last, true));
  return out + last;
}

TEST(pii_redactor_example, redacts_addresses_and_numbers_split_across_deltas) {
  plugin_chain chain({spec_of(example_plugin("pii_redactor"))}, "output");
  const std::string text = "Write to ann.lee@example.com or call +1 (555) 123-4567. Room 12, a1234567b, ok.";
  const std::string expected = "Write to [email] or call [phone]. Room 12, a1234567b, ok.";
  for (size_t piece : {1, 2, 3, 5, 7, 100}) {
    EXPECT_EQ(redact_stream(chain, static_cast<int64_t>(piece), text, piece), expected) << "pieces of " << piece;
  }
  // A request that ends without its final delta leaves nothing behind.
  std::string held = "mail bob@ex";
  EXPECT_FALSE(chain.on_output(99, held, false));
  EXPECT_EQ(held, "mail ");
  chain.end_request(99);
  std::string fresh = "";
  EXPECT_FALSE(chain.on_output(99, fresh, true));
  EXPECT_EQ(fresh, "");
}

TEST(pii_redactor_example, redacts_its_configured_word_split_across_deltas) {
  plugin_chain chain({spec_of(example_plugin("pii_redactor"), R"({"word": "Lily"})")}, "output");
  EXPECT_EQ(redact_stream(chain, 1, "named Lily. Lily's Lilypad", 1), "named [redacted]. [redacted]'s Lilypad");
  EXPECT_NE(load_error(spec_of(example_plugin("pii_redactor"), R"({"word": "a b"})")).find("word must be"),
            std::string::npos);
}

TEST(token_quota_example, charges_each_key_and_refuses_past_its_quota) {
  plugin_chain chain({spec_of(example_plugin("token_quota"), R"({"tokens_per_key": 20, "anonymous": false})")},
                     "request");
  std::vector<int32_t> ids{1, 2, 3, 4, 5};
  sampling_params sampling;
  sampling.max_tokens = 8;
  EXPECT_FALSE(chain.on_request(1, ids, "", "alice", sampling, 100, 64));  // 13 of 20
  EXPECT_EQ(sampling.max_tokens, 8);
  EXPECT_FALSE(chain.on_request(2, ids, "", "alice", sampling, 100, 64));  // 2 left after the prompt
  EXPECT_EQ(sampling.max_tokens, 2);
  auto refused = chain.on_request(3, ids, "", "alice", sampling, 100, 64);
  ASSERT_TRUE(refused);
  EXPECT_NE(refused->message.find("plugin 'token-quota' rejected the request: the key 'alice' has used its quota"),
            std::string::npos)
      << refused->message;
  sampling.max_tokens = 8;
  EXPECT_FALSE(chain.on_request(4, ids, "", "bob", sampling, 100, 64));  // another key, its own budget
  auto anonymous = chain.on_request(5, ids, "", "", sampling, 100, 64);
  ASSERT_TRUE(anonymous);
  EXPECT_NE(anonymous->message.find("requests need an API key"), std::string::npos);
}

// A row of logits and the history the logits hook sees with it.
struct logits_case {
  std::vector<int32_t> tokens{1, 2, 3};  // the prompt [1, 2], then one output (3)
  size_t num_prompt = 2;
  std::vector<float> logits = std::vector<float>(16, 0.5f);
};

TEST(plugin_library, a_plugin_of_abi_1_0_loads_without_the_logits_hook) {
  plugin_spec spec = spec_of(test_plugin("empty"), R"({"abi_minor": 0})");
  auto old = plugin_library::load(spec);
  EXPECT_EQ(old->plugin().abi_minor, 0u);
  EXPECT_EQ(old->plugin().on_logits, nullptr);
  EXPECT_FALSE(old->runs("logits"));
  EXPECT_TRUE(old->runs("request"));
  plugin_chain chain({spec}, "request");
  EXPECT_TRUE(chain.names_running("logits").empty());
  EXPECT_EQ(chain.names_running("request"), std::vector<std::string>{"empty"});
  // The same library at 1.1 offers its logits hook; asking a 1.0 library for it is refused.
  EXPECT_EQ(plugin_chain({spec_of(test_plugin("empty"))}, "request").names_running("logits"),
            std::vector<std::string>{"empty"});
  spec.hooks = {"logits"};
  EXPECT_NE(load_error(spec).find("asks for its logits hook, which it does not implement"), std::string::npos);
}

TEST(plugin_chain, each_misbehaving_logits_hook_fails_its_request_and_is_counted) {
  plugin_chain chain({spec_of(test_plugin("misbehaving"), R"({"mode": "logits_by_prompt"})")}, "logits");
  ASSERT_FALSE(chain.empty());
  const std::pair<int32_t, const char*> cases[] = {
      {10, "plugin 'misbehaving' failed in its logits hook: the database is down"},
      {11, "plugin 'misbehaving' failed in its logits hook: thrown on purpose"},
      {12, "ms in its logits hook, over its budget of 50 ms"},
      {13, "for token 8 (a logit is finite, or -inf to mask its token)"},
      {14, "plugin 'misbehaving' masked every token of the vocabulary"},
      {15, "returned garbage: logit inf for token 3"},
  };
  for (const auto& [first, expected] : cases) {
    logits_case row;
    row.tokens[0] = first;
    auto verdict = chain.on_logits({"misbehaving"}, 7, row.tokens, row.num_prompt, row.logits);
    ASSERT_TRUE(verdict) << first;
    EXPECT_EQ(verdict->what, plugin_verdict::kind::failed);
    EXPECT_NE(verdict->message.find(expected), std::string::npos) << first << ": " << verdict->message;
  }
  logits_case fine;
  EXPECT_FALSE(chain.on_logits({"misbehaving"}, 7, fine.tokens, fine.num_prompt, fine.logits));
  logits_case one_left;  // every token but the last masked: still a row to sample from
  one_left.tokens[0] = 16;
  EXPECT_FALSE(chain.on_logits({"misbehaving"}, 7, one_left.tokens, one_left.num_prompt, one_left.logits));
  // A name the chain does not run fails the request, naming it.
  auto unknown = chain.on_logits({"misbehaving", "other"}, 7, fine.tokens, fine.num_prompt, fine.logits);
  ASSERT_TRUE(unknown);
  EXPECT_NE(unknown->message.find("plugin 'other' is not a logits plugin this worker runs"), std::string::npos);
  const plugin_counters c = chain.counters().at(0);
  EXPECT_EQ(c.hook, "logits");
  EXPECT_EQ(c.num_calls, 9);
  EXPECT_EQ(c.num_errors, 6);
  EXPECT_EQ(c.num_over_budget, 1);
  EXPECT_GE(c.p99_ms, 100.0);
}

TEST(banned_phrases_example, masks_only_the_token_that_would_complete_a_phrase) {
  plugin_chain chain({spec_of(example_plugin("banned_phrases"), R"({"phrases": [[3, 4, 5], [9], [3, 6]]})")}, "logits");
  ASSERT_EQ(chain.names_running("logits"), std::vector<std::string>{"banned_phrases"});
  auto masked = [&](std::vector<int32_t> tokens, size_t num_prompt) {
    logits_case row;
    row.tokens = std::move(tokens);
    EXPECT_FALSE(chain.on_logits({"banned_phrases"}, 1, row.tokens, num_prompt, row.logits));
    std::vector<int32_t> out;
    for (size_t i = 0; i < row.logits.size(); ++i) {
      if (std::isinf(row.logits[i]))
        out.push_back(static_cast<int32_t>(i));
      else
        EXPECT_EQ(row.logits[i], 0.5f) << "token " << i << " changed but not masked";
    }
    return out;
  };
  // Outputs end with 3: 6 completes [3, 6]; [3, 4, 5] needs 4 first. A one-token phrase: always.
  EXPECT_EQ(masked({1, 2, 3}, 2), (std::vector<int32_t>{6, 9}));
  EXPECT_EQ(masked({1, 2, 3, 4}, 2), (std::vector<int32_t>{5, 9}));
  EXPECT_EQ(masked({1, 2, 7}, 2), (std::vector<int32_t>{9}));
  // Only outputs count: the same 3 and 4 in the prompt ban nothing.
  EXPECT_EQ(masked({3, 4}, 2), (std::vector<int32_t>{9}));
  EXPECT_EQ(masked({3, 4, 8}, 1), (std::vector<int32_t>{9}));
  // Its configuration is checked at start, naming the library.
  EXPECT_NE(load_error(spec_of(example_plugin("banned_phrases"), R"({"phrases": [[1, -2]]})"))
                .find("which is not a token id"),
            std::string::npos);
  EXPECT_NE(load_error(spec_of(example_plugin("banned_phrases"), "{}")).find("\"phrases\" must be a non-empty array"),
            std::string::npos);
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// Candidates as the router hands them to the route hook: instance ids 0..n-1 unless given.
struct route_case {
  std::vector<troupe_route_candidate> candidates;
  std::string tenant;

  route_case(size_t n, std::string tenant_name) : tenant(std::move(tenant_name)) {
    for (size_t i = 0; i < n; ++i) {
      troupe_route_candidate c{};
      c.instance_id = static_cast<int32_t>(i);
      c.node = "node-a";  // a literal: a copied case keeps pointing at valid text
      c.node_len = 6;
      c.prefix_hit_tokens = -1;
      candidates.push_back(c);
    }
  }
  troupe_route_request request() const {
    troupe_route_request r{};
    r.request_id = 3;
    r.tenant = tenant.data();
    r.tenant_len = tenant.size();
    r.num_prompt_ids = 5;
    r.candidates = candidates.data();
    r.num_candidates = candidates.size();
    return r;
  }
};

TEST(plugin_library, a_plugin_of_abi_1_1_loads_without_the_route_hook) {
  auto old = plugin_library::load(spec_of(test_plugin("empty")));
  EXPECT_EQ(old->plugin().abi_minor, 1u);
  EXPECT_EQ(old->plugin().on_route, nullptr);
  EXPECT_FALSE(old->runs("route"));
  EXPECT_TRUE(old->runs("logits"));
  EXPECT_TRUE(plugin_chain({spec_of(test_plugin("empty"))}, "route").empty());
  plugin_spec spec = spec_of(test_plugin("empty"));
  spec.hooks = {"route"};
  EXPECT_NE(load_error(spec).find("asks for its route hook, which it does not implement"), std::string::npos);
}

TEST(plugin_chain, a_route_hook_chooses_passes_or_fails_its_request_naming_the_plugin) {
  plugin_chain chain({spec_of(test_plugin("misbehaving"), R"({"mode": "route_by_tenant"})")}, "route");
  ASSERT_EQ(chain.names_running("route"), std::vector<std::string>{"misbehaving"});

  route_case pick(2, "pick_1");
  plugin_chain::route_answer chosen = chain.on_route(pick.request());
  EXPECT_FALSE(chosen.failure);
  EXPECT_EQ(chosen.chosen, std::optional<size_t>(1));

  route_case none(2, "anyone");
  plugin_chain::route_answer no_opinion = chain.on_route(none.request());
  EXPECT_FALSE(no_opinion.failure);
  EXPECT_FALSE(no_opinion.chosen);

  route_case draining(2, "draining");
  draining.candidates[1].draining = 1;
  const std::pair<route_case, const char*> failures[] = {
      {route_case(2, "error"), "plugin 'misbehaving' failed in its route hook: the database is down"},
      {route_case(2, "throw"), "plugin 'misbehaving' failed in its route hook: thrown on purpose"},
      {route_case(2, "sleep"), "ms in its route hook, over its budget of 50 ms"},
      {route_case(2, "index_9"), "plugin 'misbehaving' returned garbage: it chose candidate 9 of 2"},
      {draining, "plugin 'misbehaving' chose engine instance 1, which is draining"},
  };
  for (const auto& [c, expected] : failures) {
    plugin_chain::route_answer answer = chain.on_route(c.request());
    ASSERT_TRUE(answer.failure) << c.tenant;
    EXPECT_FALSE(answer.chosen);
    EXPECT_NE(answer.failure->message.find(expected), std::string::npos) << c.tenant << ": " << answer.failure->message;
  }
  const plugin_counters counters = chain.counters().at(0);
  EXPECT_EQ(counters.hook, "route");
  EXPECT_EQ(counters.num_calls, 7);
  EXPECT_EQ(counters.num_errors, 5);
  EXPECT_EQ(counters.num_over_budget, 1);
}

TEST(tenant_affinity_example, pins_each_tenant_to_one_instance_and_moves_it_when_that_one_drains_or_goes) {
  plugin_chain chain({spec_of(example_plugin("tenant_affinity"))}, "route");
  ASSERT_EQ(chain.names_running("route"), std::vector<std::string>{"tenant-affinity"});
  auto route = [&](const route_case& c) {
    plugin_chain::route_answer answer = chain.on_route(c.request());
    EXPECT_FALSE(answer.failure) << answer.failure->message;
    return answer.chosen;
  };
  // Anonymous requests are left to the router ("anonymous": "balance", the default).
  EXPECT_FALSE(route(route_case(3, "")));

  // Every tenant sticks to its instance whatever the loads; 40 tenants spread over all three.
  std::map<std::string, size_t> home;
  std::set<size_t> used;
  for (int i = 0; i < 40; ++i) {
    const std::string tenant = "tenant-" + std::to_string(i);
    route_case c(3, tenant);
    const std::optional<size_t> first = route(c);
    ASSERT_TRUE(first) << tenant;
    home[tenant] = *first;
    used.insert(*first);
    c.candidates[*first].num_requests = 50;  // far busier now: it stays
    c.candidates[*first].num_queued_prompt_tokens = 9000;
    EXPECT_EQ(route(c), first) << tenant;
  }
  EXPECT_EQ(used.size(), 3u);

  // Its instance draining: the tenant moves to the least loaded one left, and stays there.
  const std::string tenant = "tenant-0";
  route_case drained(3, tenant);
  const size_t was = home[tenant];
  drained.candidates[was].draining = 1;
  for (size_t i = 0; i < 3; ++i) drained.candidates[i].num_requests = 10;
  const size_t least = (was + 1) % 3;
  drained.candidates[least].num_requests = 2;
  EXPECT_EQ(route(drained), std::optional<size_t>(least));
  route_case after(3, tenant);
  after.candidates[least].num_requests = 30;
  EXPECT_EQ(route(after), std::optional<size_t>(least)) << "moved for good";

  // Its instance gone (not among the candidates): to the least loaded left.
  const std::string other = "tenant-1";
  route_case gone(2, other);
  gone.candidates[0].instance_id = static_cast<int32_t>(home[other] == 0 ? 1 : 0);
  gone.candidates[1].instance_id = static_cast<int32_t>(home[other] == 2 ? 1 : 2);
  gone.candidates[0].num_queued_prompt_tokens = 100;
  EXPECT_EQ(route(gone), std::optional<size_t>(1));
}

}  // namespace
}  // namespace troupe
