#pragma once
// The OpenAI-compatible HTTP door (docs/http_api.md): POST /v1/completions,
// POST /v1/chat/completions (streamed as server-sent events or whole), Anthropic's POST
// /v1/messages, POST /v1/embeddings, GET /v1/models, POST /tokenize and /detokenize, GET /version, GET /health,
// GET /metrics, GET /debug/trace. Plain class over cpp-httplib: a connection waits for its request's
// headers on one reception thread (doors/http/request_reception), then is served on one of a
// fixed pool of threads, which blocks on the request's own queue of engine events; the actor
// system reaches it through post(), the stages through door_downstream, as the ZeroMQ door.
//
// A client that goes away mid-stream is noticed when a write fails (a token or, when idle, an SSE
// comment each second); its requests are then aborted, which frees their KV blocks.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "doors/door_events.hpp"
#include "doors/http/openai_request.hpp"
#include "doors/http/openai_response.hpp"
#include "doors/reply_router.hpp"
#include "doors/request_admission.hpp"
#include "doors/tenant_table.hpp"
#include "text/chat_format.hpp"
#include "text/chat_prompt.hpp"
#include "text/tokenizer.hpp"

namespace troupe {

struct http_options {
  std::string host = "127.0.0.1";
  int port = 8000;      // 0: any free port (port() says which)
  std::string api_key;  // empty: none asked for; else `Authorization: Bearer <key>` on /v1/*
  // [[tenants]]: their keys are let in too (and pin the request's tenant), their defaults fill
  // what a request leaves unset. Null: none.
  std::shared_ptr<const tenant_table> tenants;
  size_t max_body_bytes = 4u << 20;  // larger bodies: 413
  // A request's line, headers and body must all arrive within this, from its first byte (from
  // the connection's opening for its first request): else 408 and the connection is closed.
  // Time spent waiting for a free worker thread is not counted.
  int request_timeout_ms = 10000;
  size_t max_header_bytes = 64u << 10;  // a request line and headers larger: 431, connection closed
  // Requests served at once, each on a worker thread (an open stream holds one);
  // reserved_connections of the threads serve only GET /health and /metrics, and generation
  // requests beyond max_connections - reserved_connections get 503. Connections waiting for a
  // request hold no thread.
  int max_connections = 256;
  int reserved_connections = 8;
  // Connections waiting for a request at once (holding a descriptor, no thread); past it the one
  // waiting longest is closed. 0: a sixth of the open-files limit (16..4096), so a flood of idle
  // connections cannot take the descriptors the engine needs.
  size_t max_waiting_connections = 0;
  // [frontend] access_log: a line for each generation request refused here before admission
  // (doors/access_log.hpp), as the reply router writes one for each that ends.
  bool access_log = false;
  std::string model_name;    // what /v1/models lists and requests must name
  std::string quantization;  // shown by /v1/models ("Q4_K_M", "bf16"); empty: not shown
  // CORS: origins whose pages may call the API ("*": any); a preflight (OPTIONS) from one of them
  // is answered without a key, and responses to them carry Access-Control-Allow-Origin. Empty: no
  // CORS headers at all, so browsers keep other sites' pages out.
  std::vector<std::string> allowed_origins;
  // More families for GET /metrics in the text format (e.g. per-stage gauges), appended to the
  // door's own; called on the connection thread of each scrape.
  std::function<std::string()> extra_metrics;
  openai_limits limits;
  // The served model's text side: its tokenizer (/tokenize, /detokenize; null: those answer 503),
  // the chat prompt chats are rendered with (null: a plain transcript), and how its answers
  // are written (tool calls, reasoning), read from the template or named by --tool-call-parser.
  std::shared_ptr<const troupe::tokenizer> text_tokenizer;
  std::shared_ptr<const chat_prompt> chat;
  chat_format answer_format;
  // /v1/embeddings: how a prompt's hidden states are pooled (the model's config says), and the
  // vectors' length (the model's hidden size; 0: embeddings are not served).
  pooling_kind embedding_pooling = pooling_kind::last;
  bool embedding_normalize = true;
  int embedding_size = 0;
  // Which tokens are special (a text that skips them shows none of their bytes in logprobs).
  token_special_fn token_is_special;
};

class http_door : public door_inbox {
 public:
  http_door(http_options options, door_downstream& downstream, request_admission& admission,
            const serving_counters& counters, token_text_fn token_text);
  ~http_door() override;
  http_door(const http_door&) = delete;
  http_door& operator=(const http_door&) = delete;

  // Binds (throws std::runtime_error naming host and port when it cannot) and starts serving.
  void start();
  void stop();
  int port() const;
  // Generation requests on connection threads now, from admission until their response (or
  // stream, to its `[DONE]`) is written: a drain waits for it to reach 0 before stop().
  int num_generating() const;

  // Thread-safe: engine events for this door's requests, handed to the waiting connections.
  void post(door_event event) override;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe
