#include "pipeline/stage_server.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <stdexcept>
#include <vector>

#include <spdlog/spdlog.h>

#include "kvtransfer/kv_tcp.hpp"
#include "model/layer_range.hpp"

namespace troupe {

namespace {

// Waits until `fd` is readable or `stopping` is set, looking every 100 ms; false when stopping.
bool wait_readable(int fd, const std::atomic<bool>& stopping) {
  while (!stopping.load()) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) > 0) return true;
  }
  return false;
}

std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds wait) {
  return std::chrono::steady_clock::now() + wait;
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.starts_with("127.");
}

stage_server::stage_server(model& stage, layer_range layers, stage_server_settings settings)
    : stage_(stage), layers_(layers), settings_(std::move(settings)), limits_(settings_.limits) {
  const model_config& c = stage_.config();
  check_layer_range(layers_, c.num_layers);
  if (layers_.holds_head(c.num_layers)) {
    throw std::runtime_error("pipeline stage server: layers " + layer_range_text(layers_) +
                             " end the model; the last stage runs where the requests are sampled");
  }
  if (!is_loopback_host(settings_.host)) {
    throw std::runtime_error("pipeline stage server: host " + settings_.host +
                             " is not loopback; stage links are plain TCP without credentials so far");
  }
  limits_.hidden_size = c.hidden_size;
  listener_ = kv_tcp_listen(settings_.host, endpoint_, settings_.port);
  thread_ = std::thread([this] { serve(); });
}

stage_server::~stage_server() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  if (listener_ >= 0) ::close(listener_);
}

void stage_server::serve() {
  while (wait_readable(listener_, stopping_)) {
    const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    kv_tcp_prepare_accepted(fd, settings_.stall_timeout);
    try {
      serve_link(fd);
    } catch (const std::exception& e) {
      spdlog::warn("pipeline stage {}: link ended: {}", layer_range_text(layers_), e.what());
    }
    ::close(fd);
  }
}

bool stage_server::send(int fd, const stage_frame_header& header, std::span<const std::byte> payload) {
  std::array<std::byte, stage_frame_header_bytes> head{};
  encode_stage_frame_header(header, head);
  std::string why;
  const kv_tcp_write written = kv_tcp_write_frame(fd, head, payload, deadline_after(settings_.stall_timeout), why);
  if (written != kv_tcp_write::done) {
    spdlog::warn("pipeline stage {}: cannot answer the link: {}", layer_range_text(layers_),
                 why.empty() ? "no room" : why);
    return false;
  }
  return true;
}

void stage_server::send_failure(int fd, const stage_frame_header& about, const std::string& why) {
  ++frames_refused_;
  const std::string text = why.substr(0, stage_failure_max_bytes);
  stage_frame_header failure;
  failure.kind = stage_frame_kind::failure;
  failure.step_id = about.step_id;
  failure.micro_batch = about.micro_batch;
  failure.payload_bytes = text.size();
  send(fd, failure, std::as_bytes(std::span(text.data(), text.size())));
}

bool stage_server::greet(int fd) {
  std::array<std::byte, stage_frame_header_bytes> head{};
  std::string why;
  if (!wait_readable(fd, stopping_) || !kv_tcp_read_exact(fd, head, deadline_after(settings_.stall_timeout), why)) {
    return false;
  }
  const stage_frame_header header = decode_stage_frame_header(head, limits_);
  if (header.kind != stage_frame_kind::hello) {
    send_failure(fd, header, "the link's first frame must be its hello");
    return false;
  }
  std::vector<std::byte> payload(header.payload_bytes);
  if (!kv_tcp_read_exact(fd, payload, deadline_after(settings_.stall_timeout), why)) return false;
  const stage_hello wanted = decode_stage_hello(payload);
  const model_config& c = stage_.config();
  const stage_hello held{layers_.first, layers_.end,  c.num_layers, c.hidden_size,
                         c.vocab_size,  stage_.kv_shape().block_size, stage_.kv_shape().num_blocks};
  std::string mismatch;
  if (wanted.first_layer != held.first_layer || wanted.end_layer != held.end_layer) {
    mismatch = "the link expects layers " + layer_range_text({wanted.first_layer, wanted.end_layer}) +
               ", this stage holds " + layer_range_text(layers_);
  } else if (wanted.num_layers != held.num_layers || wanted.hidden_size != held.hidden_size ||
             wanted.vocab_size != held.vocab_size) {
    mismatch = "the link's model (" + std::to_string(wanted.num_layers) + " layers, hidden " +
               std::to_string(wanted.hidden_size) + ", vocab " + std::to_string(wanted.vocab_size) +
               ") is not this stage's (" + std::to_string(held.num_layers) + " layers, hidden " +
               std::to_string(held.hidden_size) + ", vocab " + std::to_string(held.vocab_size) + ")";
  } else if (wanted.block_size != held.block_size) {
    mismatch = "the link's KV blocks hold " + std::to_string(wanted.block_size) + " tokens, this stage's " +
               std::to_string(held.block_size);
  }
  if (!mismatch.empty()) {
    send_failure(fd, header, "pipeline stage " + layer_range_text(layers_) + ": " + mismatch);
    return false;
  }
  stage_frame_header ack;
  ack.kind = stage_frame_kind::hello_ack;
  ack.payload_bytes = stage_hello_bytes;
  return send(fd, ack, encode_stage_hello(held));
}

void stage_server::serve_link(int fd) {
  if (!greet(fd)) return;
  spdlog::info("pipeline stage {}: link up", layer_range_text(layers_));
  const model_config& c = stage_.config();
  const bool first = layers_.holds_embedding();
  forward_batch batch;
  std::vector<std::byte> arrays;
  std::vector<float> residual_in, residual_out;  // [num_tokens, hidden] each
  std::array<std::byte, stage_frame_header_bytes> head{};
  std::string why;
  while (wait_readable(fd, stopping_)) {
    if (!kv_tcp_read_exact(fd, head, deadline_after(settings_.stall_timeout), why)) return;  // closed
    stage_frame_header header;
    try {
      header = decode_stage_frame_header(head, limits_);
      if (header.kind != stage_frame_kind::work) throw std::invalid_argument("expected a work frame");
      if ((header.hidden_size == 0) != first) {
        throw std::invalid_argument(first ? "the first stage embeds tokens; a residual was sent"
                                          : "a residual is needed by this stage and was not sent");
      }
    } catch (const std::invalid_argument& e) {
      send_failure(fd, header, e.what());  // the stream cannot be trusted past this header
      return;
    }
    arrays.resize(stage_work_array_bytes(header));
    residual_in.resize(static_cast<size_t>(header.num_tokens) * static_cast<size_t>(header.hidden_size));
    const auto deadline = deadline_after(settings_.stall_timeout);
    if (!kv_tcp_read_exact(fd, arrays, deadline, why) ||
        !kv_tcp_read_exact(fd, std::as_writable_bytes(std::span(residual_in)), deadline, why)) {
      spdlog::warn("pipeline stage {}: {}", layer_range_text(layers_), why);
      return;
    }
    try {
      decode_work_arrays(header, arrays, first ? c.vocab_size : 0, batch);
      batch.residual_in = first ? nullptr : residual_in.data();
      residual_out.resize(static_cast<size_t>(header.num_tokens) * static_cast<size_t>(c.hidden_size));
      batch.residual_out = residual_out.data();
      const auto begin = std::chrono::steady_clock::now();
      stage_.forward(batch, nullptr);
      busy_ns_ += static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - begin).count());
    } catch (const std::exception& e) {
      send_failure(fd, header, "pipeline stage " + layer_range_text(layers_) + ": " + e.what());
      continue;
    }
    ++frames_computed_;
    stage_frame_header result;
    result.kind = stage_frame_kind::result;
    result.step_id = header.step_id;
    result.micro_batch = header.micro_batch;
    result.num_tokens = header.num_tokens;
    result.hidden_size = c.hidden_size;
    result.payload_bytes = stage_payload_bytes(result);
    if (!send(fd, result, std::as_bytes(std::span(residual_out)))) return;
  }
}

}  // namespace troupe
