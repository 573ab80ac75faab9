// The HTTP door as a plain class, without an actor system: a scripted downstream answers each
// submitted request by posting text deltas back, as the stages would.

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "doors/http_door.hpp"

namespace troupe {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

// Answers every request with `num_pieces` deltas "w0 ", "w1 ", ... (the last finishes it), or
// with the failure it was told to give. Replies come from a thread of their own, as from an actor.
class scripted_downstream : public door_downstream {
 public:
  int num_pieces = 3;
  std::chrono::milliseconds piece_gap{0};
  std::optional<request_failed> fail_with;
  http_door* door = nullptr;

  ~scripted_downstream() override { join_answers(); }

  // Waits for every answering thread. The door must outlive them: one that has not yet seen its
  // request's abort still posts to the door.
  void join_answers() {
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mutex_);
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
  }

  void submit(tokenize_request request) override {
    std::lock_guard lock(mutex_);
    submitted_.push_back(request);
    threads_.emplace_back([this, request] { answer(request); });
  }
  void abort(int64_t request_id) override {
    std::lock_guard lock(mutex_);
    aborted_.push_back(request_id);
  }
  void query_stats(uint64_t tag) override { door->post(stats_answer{tag, 90, 100, 1, 0, {}}); }
  void query_trace(uint64_t tag, duration_ns) override { door->post(trace_answer{tag, {}, {{0, "here"}}, {}}); }

  std::vector<tokenize_request> submitted() {
    std::lock_guard lock(mutex_);
    return submitted_;
  }
  std::vector<int64_t> aborted() {
    std::lock_guard lock(mutex_);
    return aborted_;
  }

 private:
  bool was_aborted(int64_t id) {
    std::lock_guard lock(mutex_);
    return std::find(aborted_.begin(), aborted_.end(), id) != aborted_.end();
  }

  void answer(const tokenize_request& request) {
    if (fail_with) {
      request_failed failed = *fail_with;
      failed.request_id = request.request_id;
      door->post(std::move(failed));
      return;
    }
    for (int i = 0; i < num_pieces; ++i) {
      text_delta d;
      d.delta.request_id = request.request_id;
      d.delta.token_ids = {i};
      d.text = "w" + std::to_string(i) + " ";
      const bool last = i + 1 == num_pieces || was_aborted(request.request_id);
      if (last) {
        d.delta.finish = i + 1 == num_pieces ? finish_reason::length : finish_reason::abort;
        request_metrics m;
        m.num_prompt_tokens = 4;
        m.num_output_tokens = i + 1;
        d.delta.metrics = m;
      }
      door->post(text_batch{{d}});
      if (last) return;
      std::this_thread::sleep_for(piece_gap);
    }
  }

  std::mutex mutex_;
  std::vector<tokenize_request> submitted_;
  std::vector<int64_t> aborted_;
  std::vector<std::thread> threads_;
};

struct door_fixture {
  scripted_downstream downstream;
  request_admission admission{8};
  serving_counters counters;
  std::unique_ptr<http_door> door;

  explicit door_fixture(std::string api_key = {}, std::function<std::string()> extra_metrics = {},
                        std::shared_ptr<const tenant_table> tenants = nullptr) {
    http_options options;
    options.tenants = std::move(tenants);
    options.extra_metrics = std::move(extra_metrics);
    options.port = 0;
    options.api_key = std::move(api_key);
    options.model_name = "tiny";
    options.quantization = "Q4_K_M";
    options.max_connections = 16;
    options.limits.max_model_len = 64;
    door = std::make_unique<http_door>(options, downstream, admission, counters,
                                       [](int32_t id) { return "t" + std::to_string(id); });
    downstream.door = door.get();
    door->start();
  }
  ~door_fixture() {
    door->stop();
    downstream.join_answers();  // before `door` goes: an answer may still be on its way to it
  }

  httplib::Client client() const {
    httplib::Client c("127.0.0.1", door->port());
    c.set_read_timeout(10, 0);
    return c;
  }
};

TEST(http_door, a_completion_is_submitted_answered_and_its_slot_freed) {
  door_fixture f;
  auto res = f.client().Post("/v1/completions", R"({"model":"tiny","prompt":"hi","max_tokens":3,"seed":5,"n":2})",
                             "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json body = json::parse(res->body);
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][0]["text"], "w0 w1 w2 ");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(body["usage"]["completion_tokens"], 6);
  auto submitted = f.downstream.submitted();
  ASSERT_EQ(submitted.size(), 2u);
  EXPECT_EQ(submitted[0].kind, prompt_kind::text);
  EXPECT_EQ(submitted[0].prompt, "hi");
  EXPECT_EQ(*submitted[0].sampling.seed, 5u);
  EXPECT_EQ(*submitted[1].sampling.seed, 6u);
  EXPECT_EQ(request_admission::door_of(submitted[0].request_id), client_door::http);
  EXPECT_EQ(f.admission.num_in_flight(), 0);
}

TEST(http_door, streams_chunks_then_done) {
  door_fixture f;
  auto res = f.client().Post("/v1/chat/completions",
                             R"({"model":"tiny","messages":[{"role":"user","content":"hi"}],"stream":true})",
                             "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  // The door renders the chat itself (here, without a chat template: the transcript).
  EXPECT_EQ(f.downstream.submitted().at(0).kind, prompt_kind::rendered_chat);
  EXPECT_EQ(f.downstream.submitted().at(0).prompt, "user: hi\nassistant:");
  std::string content;
  size_t at = 0;
  int num_events = 0;
  while ((at = res->body.find("data: {", at)) != std::string::npos) {
    auto end = res->body.find("\n\n", at);
    json chunk = json::parse(res->body.substr(at + 6, end - at - 6));
    content += chunk["choices"][0]["delta"].value("content", "");
    ++num_events;
    at = end;
  }
  EXPECT_EQ(num_events, 3);
  EXPECT_EQ(content, "w0 w1 w2 ");
  EXPECT_NE(res->body.find("data: [DONE]\n\n"), std::string::npos);
}

TEST(http_door, engine_failures_and_the_shared_bound_become_statuses) {
  door_fixture f;
  f.downstream.fail_with = request_failed{0, error_code::prompt_too_long, "the prompt has 99 tokens"};
  auto res = f.client().Post("/v1/completions", R"({"model":"tiny","prompt":"long"})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "context_length_exceeded");
  f.downstream.fail_with = request_failed{0, error_code::overloaded, "queue full"};
  res = f.client().Post("/v1/completions", R"({"model":"tiny","prompt":"x","stream":true})", "application/json");
  EXPECT_EQ(res->status, 503);
  // The ZeroMQ door holds 7 of the 8 slots: a request of 2 choices does not fit.
  f.downstream.fail_with.reset();
  ASSERT_TRUE(f.admission.admit(client_door::zmq, 7));
  res = f.client().Post("/v1/completions", R"({"model":"tiny","prompt":"x","n":2})", "application/json");
  EXPECT_EQ(res->status, 429);
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  res = f.client().Post("/v1/completions", R"({"model":"tiny","prompt":"x"})", "application/json");
  EXPECT_EQ(res->status, 200);
  f.admission.release(7);
}

TEST(http_door, a_client_gone_mid_stream_aborts_its_request) {
  door_fixture f;
  // A minute of pieces: the stream ends early only by the abort under test, however slowly a
  // loaded machine lets the door notice the closed connection.
  f.downstream.num_pieces = 30000;
  f.downstream.piece_gap = 2ms;
  {
    httplib::Client c = f.client();
    int num_chunks = 0;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = R"({"model":"tiny","prompt":"x","max_tokens":60,"stream":true})";
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++num_chunks < 3; };
    (void)c.send(req);  // the receiver's `false` closes the connection
  }
  std::vector<int64_t> aborted;
  for (int i = 0; i < 500 && aborted.empty(); ++i) {
    std::this_thread::sleep_for(10ms);
    aborted = f.downstream.aborted();
  }
  ASSERT_EQ(aborted.size(), 1u);
  EXPECT_EQ(aborted[0], f.downstream.submitted().at(0).request_id);
  for (int i = 0; i < 500 && f.admission.num_in_flight() != 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(f.admission.num_in_flight(), 0);  // freed once the engine's abort arrived
}

TEST(http_door, a_client_gone_while_waiting_for_a_whole_completion_aborts_it) {
  door_fixture f;
  f.downstream.num_pieces = 12000;
  f.downstream.piece_gap = 5ms;  // a minute: it ends early only by the abort under test
  {
    httplib::Client c = f.client();
    c.set_read_timeout(1, 200000);  // gives up, and closes its connection, long before that
    auto res = c.Post("/v1/completions", R"({"model":"tiny","prompt":"x","max_tokens":60})", "application/json");
    EXPECT_FALSE(res);
  }
  std::vector<int64_t> aborted;
  for (int i = 0; i < 300 && aborted.empty(); ++i) {
    std::this_thread::sleep_for(10ms);
    aborted = f.downstream.aborted();
  }
  ASSERT_EQ(aborted.size(), 1u);
  EXPECT_EQ(aborted[0], f.downstream.submitted().at(0).request_id);
}

TEST(http_door, keys_health_metrics_and_unknown_paths) {
  door_fixture f("k");
  httplib::Client c = f.client();
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
  EXPECT_EQ(c.Get("/health")->status, 200);
  auto metrics = c.Get("/metrics");
  EXPECT_NE(metrics->body.find("troupe_kv_blocks_free 90\n"), std::string::npos) << metrics->body;
  c.set_bearer_token_auth("k");
  auto models = c.Get("/v1/models");
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "tiny");
  EXPECT_EQ(json::parse(models->body)["data"][0]["quantization"], "Q4_K_M");
  EXPECT_EQ(c.Get("/v1/models/tiny")->status, 200);
  EXPECT_EQ(c.Get("/v1/models/other")->status, 404);
  auto unknown = c.Get("/v2/anything");
  EXPECT_EQ(unknown->status, 404);
  EXPECT_EQ(json::parse(unknown->body)["error"]["type"], "not_found_error");
}

TEST(http_door, unknown_fields_are_ignored_and_named_and_anthropic_gets_its_own_shapes) {
  door_fixture f("k");
  httplib::Client c = f.client();
  // Unknown fields: ignored, listed in a header.
  c.set_bearer_token_auth("k");
  auto chat = c.Post(
      "/v1/chat/completions",
      R"({"model":"tiny","messages":[{"role":"user","content":"hi","x_cache":1}],"reasoning":{"effort":"low"},"max_tokens":3})",
      "application/json");
  ASSERT_EQ(chat->status, 200) << chat->body;
  EXPECT_EQ(chat->get_header_value("X-Troupe-Ignored-Fields"), "messages[0].x_cache, reasoning");
  EXPECT_EQ(json::parse(chat->body)["choices"][0]["message"]["content"], "w0 w1 w2 ");
  // Anthropic's route, with the key as x-api-key; its errors in its shape.
  httplib::Client a = f.client();
  httplib::Headers key = {{"x-api-key", "k"}, {"anthropic-version", "2023-06-01"}};
  auto message =
      a.Post("/v1/messages", key,
             R"({"model":"tiny","max_tokens":3,"system":"Be brief.","messages":[{"role":"user","content":"hi"}]})",
             "application/json");
  ASSERT_EQ(message->status, 200) << message->body;
  const json m = json::parse(message->body);
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["content"][0]["text"], "w0 w1 w2 ");
  EXPECT_EQ(m["stop_reason"], "max_tokens");
  EXPECT_EQ(m["usage"]["output_tokens"], 3);
  // The system prompt went to the template (here the transcript) before the user's turn.
  EXPECT_EQ(f.downstream.submitted().back().prompt, "system: Be brief.\nuser: hi\nassistant:");
  auto refused = a.Post("/v1/messages", R"({"model":"tiny","messages":[]})", "application/json");
  EXPECT_EQ(refused->status, 401);
  EXPECT_EQ(json::parse(refused->body)["error"]["type"], "authentication_error");
  auto bad = a.Post("/v1/messages", key, R"({"model":"tiny","messages":[{"role":"user","content":"hi"}]})",
                    "application/json");
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["type"], "error");
  EXPECT_EQ(json::parse(bad->body)["error"]["type"], "invalid_request_error");
  // No tokenizer in this fixture: /tokenize says so; /version needs no key.
  EXPECT_EQ(a.Post("/tokenize", key, R"({"prompt":"x"})", "application/json")->status, 503);
  EXPECT_EQ(f.client().Get("/version")->status, 200);
}

// /metrics stays open under an API key (as vLLM's) and carries the troupe: families and the
// extension's text; /debug/trace is keyed, checks its window, and lays out the logged requests.
TEST(http_door, metrics_are_open_traces_keyed_and_a_bad_window_named) {
  door_fixture f("k", [] { return std::string("troupe:stage_mailbox_depth{stage=\"tokenizer\"} 2\n"); });
  httplib::Client c = f.client();
  auto metrics = c.Get("/metrics");
  ASSERT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->body.find("troupe:kv_cache_usage_perc{model_name=\"tiny\"} 0.1\n"), std::string::npos)
      << metrics->body;
  EXPECT_NE(metrics->body.find("# TYPE troupe:time_to_first_token_seconds histogram\n"), std::string::npos);
  EXPECT_NE(metrics->body.find("troupe:stage_mailbox_depth{stage=\"tokenizer\"} 2\n"), std::string::npos);

  EXPECT_EQ(c.Get("/debug/trace?seconds=5")->status, 401);
  c.set_bearer_token_auth("k");
  for (const char* bad : {"abc", "0", "-3", "5x", "99999", "nan"}) {
    auto res = c.Get(std::string("/debug/trace?seconds=") + bad);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << bad;
    EXPECT_NE(json::parse(res->body)["error"]["message"].get<std::string>().find(bad), std::string::npos) << res->body;
  }

  request_record r;
  r.request_id = 12345;
  r.arrival = steady_now_ns() - 3'000'000;
  r.first_token = r.arrival + 1'000'000;
  r.finish = r.arrival + 2'000'000;
  r.num_output_tokens = 2;
  f.counters.requests.add(r);
  auto trace = c.Get("/debug/trace?seconds=2.5");
  ASSERT_EQ(trace->status, 200) << trace->body;
  const json events = json::parse(trace->body)["traceEvents"];
  bool named = false, spanned = false, instance = false;
  for (const json& e : events) {
    named |= e["ph"] == "M" && e["args"]["name"] == "request 12345";
    spanned |= e["ph"] == "X" && e["name"] == "request" && e["args"]["request_id"] == "12345";
    instance |= e["ph"] == "M" && e["args"]["name"] == "scheduler instance 0 on here";
  }
  EXPECT_TRUE(named && spanned && instance) << trace->body;
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

TEST(http_door, a_tenants_key_is_let_in_pins_its_tenant_and_brings_its_defaults) {
  door_fixture f("server-key", {},
                 std::make_shared<const tenant_table>(std::vector<tenant_settings>{{"chat", "key-chat", 2, 200, 50}}));
  const std::string body = R"({"model":"tiny","prompt":"hi","max_tokens":3,"user":"someone-else"})";
  auto client = f.client();
  auto wrong = client.Post("/v1/completions", {{"Authorization", "Bearer key-chatty"}}, body, "application/json");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  auto bearer = f.client().Post("/v1/completions", {{"Authorization", "Bearer key-chat"}}, body, "application/json");
  ASSERT_TRUE(bearer);
  ASSERT_EQ(bearer->status, 200) << bearer->body;
  auto server = f.client().Post("/v1/completions", {{"x-api-key", "server-key"}}, body, "application/json");
  ASSERT_TRUE(server);
  ASSERT_EQ(server->status, 200) << server->body;
  const auto submitted = f.downstream.submitted();
  ASSERT_EQ(submitted.size(), 2u);
  EXPECT_EQ(submitted[0].targets.tenant, "chat");  // the key's tenant, not the `user` it claimed
  EXPECT_EQ(submitted[0].priority, 2);
  EXPECT_EQ(submitted[0].targets.ttft_ms, 200);
  EXPECT_EQ(submitted[1].targets.tenant, "someone-else");
  EXPECT_EQ(submitted[1].targets.ttft_ms, 0);
}

}  // namespace
}  // namespace troupe
