#include "doors/http_door.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <sys/socket.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "doors/access_log.hpp"
#include "doors/api_key.hpp"
#include "doors/chrome_trace.hpp"
#include "doors/http/anthropic_request.hpp"
#include "doors/http/anthropic_response.hpp"
#include "doors/http/chat_plan.hpp"
#include "doors/http/embeddings_response.hpp"
#include "doors/http/connection_stream.hpp"
#include "doors/http/connection_watch.hpp"
#include "doors/http/connection_workers.hpp"
#include "doors/http/generation_session.hpp"
#include "doors/http/metrics_text.hpp"
#include "doors/http/request_reception.hpp"
#include "doors/http/tokenize_endpoints.hpp"
#include "doors/http/server_sent_events.hpp"
#include "engine/process_cpu.hpp"
#include "grammar/guided_grammar.hpp"
#include "net/open_files.hpp"
#include "stages/stage_clock.hpp"

namespace troupe {

namespace {

// A header's value whole: get_header_value goes through a C string, so `Bearer KEY\0junk` read as
// `Bearer KEY` (issue 25). Empty when absent.
std::string whole_header(const httplib::Request& req, const char* name) {
  const auto found = req.headers.find(name);
  return found == req.headers.end() ? std::string() : found->second;
}

// Set on a connection worker's thread when the request it serves was answered before its body
// was read (see install_routes): the connection cannot be kept.
thread_local bool body_left_unread = false;

using json = nlohmann::json;
using namespace std::chrono_literals;

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// An error in the shape of the API the request went to: Anthropic's under /v1/messages, else OpenAI's.
void respond(const httplib::Request& req, httplib::Response& res, const api_error& error) {
  res.status = error.status;
  const bool anthropic = req.path.rfind("/v1/messages", 0) == 0;
  res.set_content(anthropic ? anthropic_error_json(error) : error.to_json(), "application/json");
}

api_error make_error(int status, std::string type, std::string message, std::string code = {}) {
  api_error e;
  e.status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

// cpp-httplib 0.11 listens with a backlog of 5 (a compile-time constant of the packaged
// library): a burst of clients connecting at once overflows it, and the dropped SYNs are retried
// only after a second. listen() on a listening socket raises the backlog in place.
//
// httplib's accept loop is kept, and its request parser and routing; what it does with each
// connection between accept() and a request's headers is not (docs/http_api.md, "Hostile
// clients"): accepted sockets go to the request reception, and a worker runs one request at a
// time through process_request on a stream that carries pipelined bytes over.
class openai_server : public httplib::Server {
 public:
  std::function<void(int)> on_accept;

  bool raise_listen_backlog(int backlog) { return ::listen(svr_sock_, backlog) == 0; }

  // One request read from `stream` and answered; false when the connection is no longer usable.
  bool serve_one(httplib::Stream& stream, bool close_after, bool& closed_by_client) {
    return process_request(stream, close_after, closed_by_client, nullptr);
  }

 private:
  bool process_and_close_socket(socket_t sock) override {
    on_accept(sock);
    return true;
  }
};

// Runs each accepted connection's hand-over where accept() returned: it only queues the socket.
class inline_task_queue : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

// How long writing one piece of a response may wait for the client to read (httplib's default).
constexpr auto write_timeout = 5s;

// The engine events of one HTTP request, handed from post() to its connection thread.
struct event_queue {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<engine_event> events;

  void push(engine_event event) {
    {
      std::lock_guard lock(mutex);
      events.push_back(std::move(event));
    }
    changed.notify_one();
  }

  // Waits at most `timeout` for events; returns what there is.
  std::deque<engine_event> take(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex);
    changed.wait_for(lock, timeout, [&] { return !events.empty(); });
    return std::exchange(events, {});
  }
};

}  // namespace

struct http_door::impl {
  http_options options;
  door_downstream& downstream;
  request_admission& admission;
  const serving_counters& counters;
  token_text_fn token_text;

  // A generation request refused before admission: its error, and its access line.
  void refuse(const httplib::Request& req, httplib::Response& res, const api_error& error) const {
    if (options.access_log) {
      log_refusal(refusal_entry{client_door::http, {}, error.type, error.status, error.message, req.path});
    }
    respond(req, res, error);
  }

  openai_server server;
  std::unique_ptr<request_reception> reception;
  std::unique_ptr<connection_workers> workers;
  std::thread listener;
  std::atomic<bool> listener_done{false};  // its accept loop returned (or never ran: bind failed)
  int bound_port = 0;
  std::atomic<bool> stopping{false};
  std::string timeout_body;  // of the 408 for a request that did not arrive whole in time

  // Engine request id -> the queue of the HTTP request it belongs to, and its choice there.
  std::mutex routes_mutex;
  std::unordered_map<int64_t, std::pair<std::shared_ptr<event_queue>, int>> routes;

  std::mutex stats_mutex;
  std::unordered_map<uint64_t, std::promise<stats_answer>> stats_waiters;
  std::unordered_map<uint64_t, std::promise<std::pair<trace_answer, timestamp_ns>>>
      trace_waiters;  // guarded by stats_mutex

  // Unknown request fields already warned about (each is logged once, then only listed in the
  // response header); bounded, so a client inventing names cannot grow it.
  std::mutex ignored_mutex;
  std::set<std::string> ignored_logged;

  std::atomic<int> num_generating{0};
  std::atomic<int64_t> num_streams_open{0};
  std::array<std::atomic<uint64_t>, 6> num_responses_by_class{};  // [status / 100]

  impl(http_options o, door_downstream& d, request_admission& a, const serving_counters& c, token_text_fn t)
      : options(std::move(o)), downstream(d), admission(a), counters(c), token_text(std::move(t)) {}

  void install_routes();
  void note_ignored_fields(const std::vector<std::string>& fields, httplib::Response& res);
  // CORS: when the request comes from an allowed origin, says so in the response's headers.
  bool allow_origin(const httplib::Request& req, httplib::Response& res) const;
  // A chat rendered and planned (chat_plan.hpp); an error for the client when it cannot be.
  std::optional<api_error> plan(openai_request& request, std::optional<output_parsing>& parsing);
  void serve(http_connection connection);
  // The [[tenants]] tenant whose key the request carries (Bearer or x-api-key), or nullopt.
  std::optional<std::string> tenant_of_request_key(const httplib::Request& req) const {
    const std::string bearer = whole_header(req, "Authorization");
    if (bearer.rfind("Bearer ", 0) == 0) {
      if (auto tenant = options.tenants->tenant_of_key(std::string_view(bearer).substr(7))) return tenant;
    }
    const std::string x_api_key = whole_header(req, "x-api-key");
    if (!x_api_key.empty()) return options.tenants->tenant_of_key(x_api_key);
    return std::nullopt;
  }
  void generate(openai_endpoint endpoint, const httplib::Request& req, httplib::Response& res,
                const httplib::ContentReader& reader);
  std::optional<stats_answer> query_stats(std::chrono::milliseconds timeout);
  // The engine instances' steps of the last `window`, with the moment their ages count back from
  // (the midpoint of this query's round trip, whose half each instance's clock error includes).
  std::optional<std::pair<trace_answer, timestamp_ns>> query_trace(duration_ns window,
                                                                   std::chrono::milliseconds timeout);
  void serve_trace(const httplib::Request& req, httplib::Response& res);
  void abort_unfinished(const generation_session& session) {
    for (int64_t id : session.unfinished_request_ids()) downstream.abort(id);
  }
};

http_door::http_door(http_options options, door_downstream& downstream, request_admission& admission,
                     const serving_counters& counters, token_text_fn token_text)
    : impl_(std::make_unique<impl>(std::move(options), downstream, admission, counters, std::move(token_text))) {}

http_door::~http_door() { stop(); }

int http_door::port() const { return impl_->bound_port; }

int http_door::num_generating() const { return impl_->num_generating.load(); }

void http_door::post(door_event event) {
  auto& s = *impl_;
  if (auto* batch = std::get_if<text_batch>(&event)) {
    std::lock_guard lock(s.routes_mutex);
    for (auto& d : batch->deltas) {
      auto it = s.routes.find(d.delta.request_id);
      if (it == s.routes.end()) continue;
      auto [queue, choice] = it->second;
      if (d.delta.finished()) {
        // The engine is done with it: its slot is free whether or not a client still listens.
        s.routes.erase(it);
        s.admission.release();
      }
      queue->push(engine_event{choice, std::move(d)});
    }
  } else if (auto* failed = std::get_if<request_failed>(&event)) {
    std::lock_guard lock(s.routes_mutex);
    auto it = s.routes.find(failed->request_id);
    if (it == s.routes.end()) return;
    auto [queue, choice] = it->second;
    s.routes.erase(it);
    s.admission.release();
    queue->push(engine_event{choice, std::move(*failed)});
  } else if (auto* stats = std::get_if<stats_answer>(&event)) {
    std::lock_guard lock(s.stats_mutex);
    auto it = s.stats_waiters.find(stats->tag);
    if (it == s.stats_waiters.end()) return;
    it->second.set_value(*stats);
    s.stats_waiters.erase(it);
  } else if (auto* trace = std::get_if<trace_answer>(&event)) {
    const timestamp_ns received = steady_now_ns();
    std::lock_guard lock(s.stats_mutex);
    auto it = s.trace_waiters.find(trace->tag);
    if (it == s.trace_waiters.end()) return;
    it->second.set_value({std::move(*trace), received});
    s.trace_waiters.erase(it);
  }
}

std::optional<stats_answer> http_door::impl::query_stats(std::chrono::milliseconds timeout) {
  const uint64_t tag = admission.next_stats_tag(client_door::http);
  std::future<stats_answer> answer;
  {
    std::lock_guard lock(stats_mutex);
    if (stats_waiters.size() >= 256) return std::nullopt;
    answer = stats_waiters[tag].get_future();
  }
  downstream.query_stats(tag);
  if (answer.wait_for(timeout) == std::future_status::ready) return answer.get();
  std::lock_guard lock(stats_mutex);
  stats_waiters.erase(tag);
  return std::nullopt;
}

std::optional<std::pair<trace_answer, timestamp_ns>> http_door::impl::query_trace(duration_ns window,
                                                                                  std::chrono::milliseconds timeout) {
  const uint64_t tag = admission.next_stats_tag(client_door::http);
  std::future<std::pair<trace_answer, timestamp_ns>> answer;
  {
    std::lock_guard lock(stats_mutex);
    if (trace_waiters.size() >= 16) return std::nullopt;
    answer = trace_waiters[tag].get_future();
  }
  const timestamp_ns sent = steady_now_ns();
  downstream.query_trace(tag, window);
  if (answer.wait_for(timeout) == std::future_status::ready) {
    // The router's ages are before its own reply, which left somewhere within this round trip:
    // the midpoint is off by at most half of it, on top of each instance's own error.
    auto [trace, received] = answer.get();
    const duration_ns half_round_trip = (received - sent + 1) / 2;
    for (trace_instance& i : trace.instances) i.clock_error_ns += half_round_trip;
    return std::pair{std::move(trace), sent + (received - sent) / 2};
  }
  std::lock_guard lock(stats_mutex);
  trace_waiters.erase(tag);
  return std::nullopt;
}

// GET /debug/trace?seconds=N: the last N seconds as a Chrome trace (docs/http_api.md).
void http_door::impl::serve_trace(const httplib::Request& req, httplib::Response& res) {
  constexpr double max_seconds = 3600;
  double seconds = 10;
  if (req.has_param("seconds")) {
    const std::string text = req.get_param_value("seconds");
    size_t used = 0;
    try {
      seconds = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size() || !(seconds > 0) || seconds > max_seconds) {
      api_error e = make_error(400, "invalid_request_error",
                               "query parameter 'seconds': '" + text + "' is not a number of seconds in (0, 3600]");
      e.param = "seconds";
      return respond(req, res, e);
    }
  }
  const auto window = static_cast<duration_ns>(seconds * 1e9);
  auto answer = query_trace(window, 5000ms);
  if (!answer)
    return respond(req, res, make_error(503, "server_error", "the engine instances did not answer within 5 s"));
  if (!answer->first.unavailable.empty())
    return respond(req, res, make_error(503, "server_error", answer->first.unavailable));
  const timestamp_ns now = answer->second;
  trace_window w;
  w.end = now;
  w.begin = now - window;
  w.requests = counters.requests.finished_since(w.begin);
  w.instances = std::move(answer->first.instances);
  for (step_event& step : answer->first.steps) {
    const timestamp_ns start = now - step.age_ns;
    w.steps.push_back(placed_step{start, std::move(step)});
  }
  res.set_content(build_chrome_trace(w), "application/json");
}

void http_door::impl::generate(openai_endpoint endpoint, const httplib::Request& req, httplib::Response& res,
                               const httplib::ContentReader& reader) {
  // The body, bounded: httplib skips a larger Content-Length itself; the rest of a chunked body
  // too large is read and dropped, so that the connection stays usable for the next request,
  // up to a point where draining costs more than the connection is worth.
  std::string body;
  size_t num_dropped = 0;
  const bool read = reader([&](const char* data, size_t length) {
    if (num_dropped == 0 && body.size() + length <= options.max_body_bytes) {
      body.append(data, length);
      return true;
    }
    num_dropped += length;
    body.clear();
    return num_dropped <= 16 * options.max_body_bytes;
  });
  if (num_dropped > 0 || res.status == 413) {
    refuse(req, res,
           make_error(413, "invalid_request_error",
                      "the request body exceeds " + std::to_string(options.max_body_bytes) + " bytes"));
    return;
  }
  if (!read) {
    refuse(req, res, make_error(400, "invalid_request_error", "the request body could not be read"));
    return;
  }
  // A draining server takes no new work (its body was read, so the connection stays usable):
  // a client or balancer retries elsewhere, or here once a restarted server answers.
  if (auto closed = admission.closed_reason()) {
    res.set_header("Retry-After", "1");
    return refuse(req, res, make_error(503, "service_unavailable_error", *closed));
  }
  auto parsed = endpoint == openai_endpoint::anthropic_messages ? parse_anthropic_request(body, options.limits)
                                                                : parse_openai_request(endpoint, body, options.limits);
  if (auto* error = std::get_if<api_error>(&parsed)) return refuse(req, res, *error);
  auto& request = std::get<openai_request>(parsed);
  note_ignored_fields(request.ignored_fields, res);
  if (options.tenants) {
    // A tenant's key pins the tenant (pre-routing let only known keys in).
    if (auto tenant = tenant_of_request_key(req)) request.targets.tenant = *tenant;
    options.tenants->apply_defaults(request.priority, request.targets);
  }
  if (endpoint == openai_endpoint::embeddings) {
    if (options.embedding_size <= 0)
      return refuse(req, res, make_error(404, "not_found_error", "this server serves no embeddings"));
    if (request.embedding_dimensions != 0 && request.embedding_dimensions != options.embedding_size) {
      return refuse(req, res,
                    bad_parameter("dimensions", "'dimensions': this model's embeddings have " +
                                                    std::to_string(options.embedding_size) + " dimensions, not " +
                                                    std::to_string(request.embedding_dimensions)));
    }
    request.sampling.pooling = options.embedding_pooling;
    request.sampling.normalize_embedding = options.embedding_normalize;
  }
  if (request.model != options.model_name) {
    api_error e = make_error(404, "invalid_request_error",
                             "the model '" + request.model + "' does not exist; this server serves '" +
                                 options.model_name + "' (GET /v1/models)",
                             "model_not_found");
    e.param = "model";
    return refuse(req, res, e);
  }

  std::optional<output_parsing> parsing;
  if (auto error = plan(request, parsing)) return refuse(req, res, *error);

  // Each open stream holds a connection thread; keep some for /health and /metrics.
  const int max_generating = std::max(1, options.max_connections - options.reserved_connections);
  if (num_generating.fetch_add(1) >= max_generating) {
    --num_generating;
    res.set_header("Retry-After", "1");
    return refuse(req, res,
                  make_error(503, "overloaded_error",
                             "all " + std::to_string(max_generating) +
                                 " generation connections of this server are busy; retry later"));
  }
  struct generating_slot {
    std::atomic<int>& count;
    ~generating_slot() { --count; }
  };
  auto slot = std::make_shared<generating_slot>(generating_slot{num_generating});

  const int num_choices = request.num_choices();
  const auto first_id = admission.admit(client_door::http, num_choices);
  if (!first_id) {
    res.set_header("Retry-After", "1");
    return refuse(req, res,
                  make_error(429, "rate_limit_error",
                             "the server holds its maximum of " + std::to_string(admission.max_in_flight()) +
                                 " requests in flight; retry later",
                             "too_many_requests"));
  }
  std::shared_ptr<generation_session> session;
  if (request.endpoint == openai_endpoint::embeddings) {
    auto writer = std::make_unique<embeddings_response_builder>(request.model, request.embedding_base64);
    session = std::make_shared<generation_session>(std::move(request), *first_id, std::move(writer), std::nullopt);
  } else if (request.endpoint == openai_endpoint::anthropic_messages) {
    auto writer = std::make_unique<anthropic_response_builder>(
        request.model, fmt::format("msg_{:016x}", static_cast<uint64_t>(*first_id)),
        parsing ? parsing->format.tools : tool_call_syntax::none, static_cast<uint64_t>(*first_id));
    session = std::make_shared<generation_session>(std::move(request), *first_id, std::move(writer), parsing);
  } else {
    session = std::make_shared<generation_session>(std::move(request), *first_id, unix_seconds(), token_text, parsing,
                                                   options.token_is_special);
  }
  auto queue = std::make_shared<event_queue>();
  {
    std::lock_guard lock(routes_mutex);
    for (int choice = 0; choice < num_choices; ++choice) routes[session->request_id(choice)] = {queue, choice};
  }
  for (auto& job : session->engine_requests()) downstream.submit(std::move(job));

  // Nothing is written to the client while these waits last: after the first second its socket
  // is looked at now and then, so a client that gave up is noticed and its work aborted.
  const auto waiting_since = std::chrono::steady_clock::now();
  std::optional<connection_watch> watch;
  auto client_gone = [&] {
    if (std::chrono::steady_clock::now() - waiting_since < 1s) return false;
    if (!watch) watch = connection_watch::find(req.remote_addr, req.remote_port, bound_port);
    return watch->client_gone();
  };
  // False when the wait was given up: the server is stopping or the client went away.
  auto wait_until = [&](auto&& ready) {
    while (!ready() && !session->failure()) {
      if (stopping || client_gone()) return false;
      for (auto& event : queue->take(200ms)) session->apply(std::move(event));
    }
    return true;
  };
  auto give_up = [&] {
    abort_unfinished(*session);
    respond(req, res,
            stopping ? make_error(503, "overloaded_error", "the server is shutting down")
                     : make_error(400, "invalid_request_error", "the client closed the connection"));
  };

  // The status line waits for every choice's first event: a prompt the tokenizer refuses or a
  // full scheduler queue is still an HTTP error, not an error inside a 200 stream.
  if (!wait_until([&] { return session->all_started(); })) return give_up();
  if (session->failure()) {
    abort_unfinished(*session);
    return respond(req, res, *session->failure());
  }

  if (!session->request().stream) {
    if (!wait_until([&] { return session->all_finished(); })) return give_up();
    if (session->failure()) {
      abort_unfinished(*session);
      return respond(req, res, *session->failure());
    }
    res.set_content(session->full_body(), "application/json");
    return;
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  ++num_streams_open;
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, session, queue, slot](size_t, httplib::DataSink& sink) {
        std::string text = session->take_stream_text();
        if (text.empty() && !session->stream_ended()) {
          auto events = queue->take(1000ms);
          const bool idle = events.empty();
          for (auto& event : events) session->apply(std::move(event));
          text = session->take_stream_text();
          if (text.empty()) {
            if (!idle) return !stopping.load();  // events that made no chunk: wait again
            // Idle for a second: a comment line, so a client that has gone is noticed anyway.
            text = sse::keep_alive;
          }
        }
        if (stopping) return false;
        if (!sink.write(text.data(), text.size())) return false;
        if (session->stream_ended()) sink.done();
        return true;
      },
      [this, session](bool) {
        // Runs once the stream ends, written whole or cut off: whatever still runs is aborted,
        // and its KV freed, within a step.
        --num_streams_open;
        abort_unfinished(*session);
      });
}

bool http_door::impl::allow_origin(const httplib::Request& req, httplib::Response& res) const {
  if (options.allowed_origins.empty() || !req.has_header("Origin")) return false;
  const std::string origin = req.get_header_value("Origin");
  const bool any =
      std::find(options.allowed_origins.begin(), options.allowed_origins.end(), "*") != options.allowed_origins.end();
  if (!any && std::find(options.allowed_origins.begin(), options.allowed_origins.end(), origin) ==
                  options.allowed_origins.end()) {
    return false;
  }
  res.set_header("Access-Control-Allow-Origin", any ? "*" : origin);
  if (!any) res.set_header("Vary", "Origin");
  res.set_header("Access-Control-Expose-Headers", "X-Troupe-Ignored-Fields, Retry-After");
  return true;
}

void http_door::impl::note_ignored_fields(const std::vector<std::string>& fields, httplib::Response& res) {
  if (fields.empty()) return;
  std::string list;
  for (const std::string& f : fields) list += (list.empty() ? "" : ", ") + f;
  res.set_header("X-Troupe-Ignored-Fields", list);
  std::lock_guard lock(ignored_mutex);
  for (const std::string& f : fields) {
    if (ignored_logged.size() >= 256 || !ignored_logged.insert(f).second) continue;
    spdlog::warn(
        "http: ignoring the unknown request field '{}' (logged once; listed in each response's "
        "X-Troupe-Ignored-Fields header)",
        f);
  }
}

std::optional<api_error> http_door::impl::plan(openai_request& request, std::optional<output_parsing>& parsing) {
  if (!request.is_chat()) return std::nullopt;
  static const chat_prompt transcript;
  chat_plan planned;
  try {
    planned = plan_chat(request.chat, options.chat ? *options.chat : transcript, options.answer_format,
                        request.sampling.guided, request.guided_param);
  } catch (const chat_plan_error& e) {
    return bad_parameter(e.param, e.message);
  }
  if (!planned.note.empty()) spdlog::info("http: {}", planned.note);
  request.prompts.at(0).text = std::move(planned.prompt);
  request.sampling.skip_special_tokens = planned.skip_special_tokens;
  const bool changed =
      planned.guided.kind != request.sampling.guided.kind || planned.guided.source != request.sampling.guided.source;
  request.sampling.guided = std::move(planned.guided);
  if (changed && is_guided(request.sampling)) {
    // The grammar the plan made (tool calls, the answer after the reasoning) must compile and
    // leave max_tokens room for its shortest output, as any constraint must.
    auto problem = validate_sampling_params(request.sampling, options.limits);
    if (!problem) problem = check_guided_decoding(request.sampling);
    if (problem) {
      const std::string param = problem->field == "max_tokens" ? "max_tokens" : planned.guided_param;
      return bad_parameter(param, "'" + param + "': " + problem->problem);
    }
  }
  parsing = planned.parsing;
  return std::nullopt;
}

void http_door::impl::serve(http_connection connection) {
  connection_stream stream(std::move(connection), write_timeout, stopping, timeout_body);
  bool closed_by_client = false;
  body_left_unread = false;
  const bool usable = server.serve_one(stream, stopping, closed_by_client);
  if (stream.timed_out()) return reception->add_closing(stream.release());
  if (!usable || closed_by_client || stopping || body_left_unread) return;  // the stream closes it
  reception->add_kept(stream.release());
}

void http_door::impl::install_routes() {
  const auto pre_route = [this](const httplib::Request& req, httplib::Response& res) {
    if (allow_origin(req, res) && req.method == "OPTIONS") {
      // A browser's preflight: it carries no key, and is answered here.
      res.status = 204;
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      const std::string asked = req.get_header_value("Access-Control-Request-Headers");
      res.set_header("Access-Control-Allow-Headers",
                     asked.empty() ? "Authorization, Content-Type, x-api-key, anthropic-version" : asked);
      res.set_header("Access-Control-Max-Age", "600");
      return httplib::Server::HandlerResponse::Handled;
    }
    // /metrics, /health and /version stay open, as vLLM's; the API and the traces (which show the
    // traffic) not.
    const bool guarded = req.path.rfind("/v1/", 0) == 0 || req.path.rfind("/debug/", 0) == 0 ||
                         req.path == "/tokenize" || req.path == "/detokenize";
    const bool keyed = !options.api_key.empty() || (options.tenants && options.tenants->has_keys());
    if (!keyed || !guarded) return httplib::Server::HandlerResponse::Unhandled;
    // OpenAI's clients send `Authorization: Bearer <key>`, Anthropic's `x-api-key: <key>`. Each
    // value whole: get_header_value goes through a C string, so `Bearer KEY\0junk` read as
    // `Bearer KEY` and was let in (issue 25).
    const std::string header = whole_header(req, "Authorization");
    const std::string x_api_key = whole_header(req, "x-api-key");
    const std::string prefix = "Bearer ";
    if (header.empty() && x_api_key.empty()) {
      refuse(req, res,
             make_error(401, "invalid_request_error",
                        "missing API key: send the header 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                        "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    const auto known = [this](std::string_view key) {
      const bool server_key = !options.api_key.empty() && api_key_matches(key, options.api_key);
      return server_key || (options.tenants && options.tenants->tenant_of_key(key));
    };
    const bool bearer_ok = header.rfind(prefix, 0) == 0 && known(std::string_view(header).substr(prefix.size()));
    const bool x_ok = !x_api_key.empty() && known(x_api_key);
    if (!bearer_ok && !x_ok) {
      refuse(req, res, make_error(401, "invalid_request_error", "incorrect API key provided", "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  };
  // httplib runs this before it reads a body: a request answered here (a 401) leaves its body on
  // the connection, where the next request would be parsed from it. Such a connection is closed
  // after the answer instead of kept (serve()).
  server.set_pre_routing_handler([pre_route](const httplib::Request& req, httplib::Response& res) {
    const auto handled = pre_route(req, res);
    const std::string length = req.get_header_value("Content-Length");
    const bool has_body = (!length.empty() && length != "0") || req.has_header("Transfer-Encoding");
    if (handled == httplib::Server::HandlerResponse::Handled && has_body) {
      body_left_unread = true;
      res.set_header("Connection", "close");
    }
    return handled;
  });
  server.Post("/v1/completions",
              [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
                generate(openai_endpoint::completions, req, res, reader);
              });
  server.Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
                generate(openai_endpoint::chat_completions, req, res, reader);
              });
  server.Post("/v1/embeddings",
              [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
                generate(openai_endpoint::embeddings, req, res, reader);
              });
  server.Post("/v1/messages",
              [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
                generate(openai_endpoint::anthropic_messages, req, res, reader);
              });
  auto tokenize_route = [this](auto respond_with) {
    return [this, respond_with](const httplib::Request& req, httplib::Response& res) {
      if (!options.text_tokenizer) {
        return respond(req, res, make_error(503, "server_error", "this server has no tokenizer for " + req.path));
      }
      static const chat_prompt transcript;
      const tokenize_context context{*options.text_tokenizer, options.chat ? *options.chat : transcript,
                                     options.answer_format, options.model_name, options.limits};
      auto answer = respond_with(req.body, context);
      if (auto* error = std::get_if<api_error>(&answer)) return respond(req, res, *error);
      res.set_content(std::get<std::string>(answer), "application/json");
    };
  };
  // Anthropic's token count of a would-be message: the prompt the request would render to.
  server.Post("/v1/messages/count_tokens", [this](const httplib::Request& req, httplib::Response& res) {
    nlohmann::ordered_json body = nlohmann::ordered_json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_object() && !body.contains("max_tokens")) body["max_tokens"] = 1;  // not asked for here
    auto parsed = parse_anthropic_request(body.is_object() ? body.dump() : req.body, options.limits);
    if (auto* error = std::get_if<api_error>(&parsed)) return respond(req, res, *error);
    auto& request = std::get<openai_request>(parsed);
    std::optional<output_parsing> parsing;
    if (auto error = plan(request, parsing)) return respond(req, res, *error);
    if (!options.text_tokenizer)
      return respond(req, res, make_error(503, "server_error", "this server has no tokenizer"));
    const bool has_template = options.chat && options.chat->has_template();
    const size_t count = options.text_tokenizer->encode(request.prompts.at(0).text, !has_template).size();
    res.set_content(json{{"input_tokens", count}}.dump(), "application/json");
  });
  server.Post("/tokenize", tokenize_route(tokenize_response));
  server.Post("/detokenize", tokenize_route(detokenize_response));
  server.Get("/version", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(version_response(), "application/json");
  });
  auto model_card = [this] {
    json card{{"id", options.model_name},
              {"object", "model"},
              {"created", unix_seconds()},
              {"owned_by", "troupe"},
              {"max_model_len", options.limits.max_model_len}};
    if (!options.quantization.empty()) card["quantization"] = options.quantization;
    return card;
  };
  server.Get("/v1/models", [model_card](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump_json(json{{"object", "list"}, {"data", json::array({model_card()})}}), "application/json");
  });
  server.Get("/v1/models/(.+)", [this, model_card](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1] != options.model_name) {
      api_error e = make_error(404, "invalid_request_error",
                               "the model '" + std::string(req.matches[1]) + "' does not exist", "model_not_found");
      e.param = "model";
      return respond(req, res, e);
    }
    res.set_content(dump_json(model_card()), "application/json");
  });
  // Healthy when the scheduler answers, not merely when this thread does.
  server.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
    if (auto closed = admission.closed_reason()) {  // draining: a balancer should stop sending here
      res.set_header("Retry-After", "1");
      return respond(req, res, make_error(503, "service_unavailable_error", *closed));
    }
    const std::optional<stats_answer> stats = query_stats(2000ms);
    if (stats && !stats->unavailable.empty()) {
      respond(req, res, make_error(503, "server_error", stats->unavailable));
    } else if (stats) {
      res.set_content("{\"status\":\"ok\"}", "application/json");
    } else {
      respond(req, res, make_error(503, "server_error", "the scheduler did not answer within 2 s"));
    }
  });
  server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    metrics_snapshot m;
    m.num_requests_zmq = admission.num_admitted(client_door::zmq);
    m.num_requests_http = admission.num_admitted(client_door::http);
    m.num_refused_zmq = admission.num_refused(client_door::zmq);
    m.num_refused_http = admission.num_refused(client_door::http);
    m.num_requests_in_flight = admission.num_in_flight();
    m.max_requests_in_flight = admission.max_in_flight();
    m.num_prompt_tokens = counters.num_prompt_tokens;
    m.num_generation_tokens = counters.num_generation_tokens;
    m.num_finished_stop = counters.num_finished_stop;
    m.num_finished_length = counters.num_finished_length;
    m.num_finished_abort = counters.num_finished_abort;
    m.num_failed = counters.num_failed;
    m.num_http_responses_2xx = num_responses_by_class[2];
    m.num_http_responses_4xx = num_responses_by_class[4] + reception->num_refused();
    m.num_http_responses_5xx = num_responses_by_class[5];
    m.num_http_streams_open = num_streams_open;
    const process_cpu_time cpu = process_cpu_while_serving();
    m.process_cpu_seconds = cpu.total_s;
    m.compute_cpu_seconds = cpu.compute_s;
    m.own_process = process_identity();
    if (auto stats = query_stats(2000ms); stats && stats->unavailable.empty()) {
      m.scheduler = metrics_snapshot::scheduler_gauges{stats->num_free_blocks, stats->num_total_blocks,
                                                       stats->num_running, stats->num_waiting};
      m.num_slo_rejections = stats->num_slo_rejections;
      m.num_overload_refusals = stats->num_overload_refusals;
      m.step_models = stats->step_models;
      m.processes = stats->processes;
    }
    m.model_name = options.model_name;
    m.serving = counters.metrics.snapshot();
    if (options.extra_metrics) m.extra = options.extra_metrics();
    res.set_content(render_metrics(m), "text/plain; version=0.0.4");
  });
  server.Get("/debug/trace", [this](const httplib::Request& req, httplib::Response& res) { serve_trace(req, res); });
  // Statuses httplib decides itself (unknown path, 413 before the handler) get OpenAI's shape.
  server.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        if (res.status == 404) {
          respond(req, res, make_error(404, "not_found_error", "no such endpoint: " + req.method + " " + req.path));
        } else if (res.status == 413) {
          respond(req, res, make_error(413, "invalid_request_error", "the request body is too large"));
        } else {
          respond(req, res,
                  make_error(res.status, res.status >= 500 ? "server_error" : "invalid_request_error",
                             "HTTP " + std::to_string(res.status) + " for " + req.method + " " + req.path));
        }
        return httplib::Server::HandlerResponse::Handled;
      }));
  server.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    respond(req, res, make_error(500, "server_error", "internal error: " + what));
  });
  server.set_logger([this](const httplib::Request&, const httplib::Response& res) {
    const int status_class = res.status / 100;
    if (status_class >= 0 && status_class < 6) ++num_responses_by_class[static_cast<size_t>(status_class)];
  });
}

void http_door::start() {
  auto& s = *impl_;
  // A client gone mid-write must cost an error return, not the process.
  std::signal(SIGPIPE, SIG_IGN);
  s.timeout_body =
      make_error(408, "invalid_request_error",
                 "the request did not arrive whole within " + std::to_string(s.options.request_timeout_ms) + " ms")
          .to_json();
  // A client keeps its connection for as many requests as it likes (httplib's default was 5,
  // and every reconnection is a handshake and a trip through the accept queue): between them
  // it waits in the reception, holding no thread.
  reception_options reception;
  reception.max_header_bytes = s.options.max_header_bytes;
  reception.request_timeout = std::chrono::milliseconds(s.options.request_timeout_ms);
  reception.max_body_bytes = s.options.max_body_bytes;
  // Connections waiting for a request: a share of the open-files limit, not all of it. Past the
  // share the one waiting longest is closed, so a flood of idle connections cannot take the
  // descriptors the engine needs, nor keep a client that sends its request from being read.
  reception.max_connections = s.options.max_waiting_connections > 0
                                  ? s.options.max_waiting_connections
                                  : door_connection_share(current_open_files_limit().soft, reception.max_connections);
  s.reception =
      std::make_unique<request_reception>(reception, [&s](http_connection c) { s.workers->submit(std::move(c)); });
  s.workers =
      std::make_unique<connection_workers>(std::max(4, s.options.max_connections), s.options.reserved_connections,
                                           [&s](http_connection c) { s.serve(std::move(c)); });
  s.server.on_accept = [&s](int fd) { s.reception->add_new(fd); };
  s.server.new_task_queue = [] { return new inline_task_queue; };
  s.server.set_payload_max_length(s.options.max_body_bytes);
  s.server.set_tcp_nodelay(true);  // a stream's small events go out as they are written
  s.install_routes();
  if (s.options.port == 0) {
    s.bound_port = s.server.bind_to_any_port(s.options.host);
  } else if (s.server.bind_to_port(s.options.host, s.options.port)) {
    s.bound_port = s.options.port;
  }
  if (s.bound_port <= 0) {
    throw std::runtime_error("http: cannot bind " + s.options.host + ":" + std::to_string(s.options.port));
  }
  if (!s.server.raise_listen_backlog(std::max(128, s.options.max_connections))) {
    spdlog::warn("http: cannot raise the listen backlog: {}", std::strerror(errno));
  }
  s.reception->start();
  s.listener = std::thread([&s] {
    s.server.listen_after_bind();
    s.listener_done = true;
  });
  // cpp-httplib's stop() does nothing until its accept loop runs: a stop() (a SIGTERM right after
  // `serving on`) in between left the loop running and stop()'s join waiting forever (issue 25).
  // The loop starts within microseconds; it is waited for here, so stop() always ends it.
  while (!s.server.is_running() && !s.listener_done) std::this_thread::sleep_for(std::chrono::microseconds(100));
}

void http_door::stop() {
  auto& s = *impl_;
  if (!s.listener.joinable()) return;
  s.stopping = true;
  s.server.stop();
  s.listener.join();
  // The reception first: it hands connections to the workers, and they hand them back.
  s.reception->stop();
  s.workers->stop();
}

}  // namespace troupe
