#include "pipeline/stage_server.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include <spdlog/spdlog.h>

#include "engine/process_cpu.hpp"
#include "kvtransfer/kv_tcp.hpp"
#include "pipeline/stage_pair_frames.hpp"

namespace troupe {

namespace {

constexpr std::chrono::milliseconds stop_check{100};

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
  limits_.hidden_size = c.hidden_size;
  // The most one KV frame may carry: the stage's whole pool for its layers, as f32 (the widest).
  limits_.max_kv_bytes = kv_span_bytes(
      kv_span_for(c, stage_.kv_shape(), stage_.kv_shape().num_blocks, layers_.first, layers_.count(), dtype::f32));
  if (settings_.keys.empty()) {
    if (!is_loopback_host(settings_.host)) {
      throw std::runtime_error("pipeline stage server: host " + settings_.host +
                               " is not loopback; without the cluster's credentials stage links are plain TCP, "
                               "which only loopback may carry");
    }
    listener_ = kv_tcp_listen(settings_.host, endpoint_, settings_.port);
  } else {
    curve_ =
        curve_stage_server(settings_.host, settings_.port, settings_.keys, stage_max_frame_bytes(limits_), endpoint_);
  }
  mark_serving_began();  // what loading the stage's layers cost is no request's
  thread_ = std::thread([this] { serve(); });
}

stage_server::~stage_server() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  if (listener_ >= 0) ::close(listener_);
}

void stage_server::serve() {
  while (!stopping_.load()) {
    try {
      if (curve_) {
        serve_link(*curve_, true);
        continue;
      }
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(stop_check.count())) <= 0) continue;
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      kv_tcp_prepare_accepted(fd, settings_.stall_timeout);
      serve_link(*tcp_stage_channel(fd), false);
    } catch (const std::exception& e) {
      spdlog::warn("pipeline stage {}: link ended: {}", layer_range_text(layers_), e.what());
    }
  }
}

bool stage_server::send(stage_channel& channel, const stage_frame_header& header, std::span<const std::byte> payload) {
  std::array<std::byte, stage_frame_header_bytes> head{};
  encode_stage_frame_header(header, head);
  const std::string why = channel.write(head, payload, deadline_after(settings_.stall_timeout));
  if (!why.empty()) spdlog::warn("pipeline stage {}: cannot answer the link: {}", layer_range_text(layers_), why);
  return why.empty();
}

void stage_server::send_failure(stage_channel& channel, const stage_frame_header& about, const std::string& why) {
  ++frames_refused_;
  const std::string text = why.substr(0, stage_failure_max_bytes);
  stage_frame_header failure;
  failure.kind = stage_frame_kind::failure;
  failure.step_id = about.step_id;
  failure.micro_batch = about.micro_batch;
  failure.payload_bytes = text.size();
  send(channel, failure, std::as_bytes(std::span(text.data(), text.size())));
}

bool stage_server::greet(stage_channel& channel, const stage_frame_header& header) {
  std::vector<std::byte> payload(header.payload_bytes);
  if (const std::string why = channel.read(payload, deadline_after(settings_.stall_timeout)); !why.empty())
    return false;
  const stage_hello wanted = decode_stage_hello(payload);
  const model_config& c = stage_.config();
  const stage_hello held{layers_.first,
                         layers_.end,
                         c.num_layers,
                         c.hidden_size,
                         c.vocab_size,
                         stage_.kv_shape().block_size,
                         stage_.kv_shape().num_blocks};
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
    send_failure(channel, header, "pipeline stage " + layer_range_text(layers_) + ": " + mismatch);
    return false;
  }
  stage_frame_header ack;
  ack.kind = stage_frame_kind::hello_ack;
  ack.payload_bytes = stage_hello_bytes;
  if (!send(channel, ack, encode_stage_hello(held))) return false;
  spdlog::info("pipeline stage {}: link up", layer_range_text(layers_));
  return true;
}

void stage_server::serve_link(stage_channel& channel, bool framed) {
  const bool first = layers_.holds_embedding();
  bool greeted = false;
  std::array<std::byte, stage_frame_header_bytes> head{};
  while (!stopping_.load()) {
    if (!channel.readable(stop_check)) continue;
    if (!channel.read_header(head, deadline_after(settings_.stall_timeout)).empty()) return;  // closed or stalled
    stage_frame_header header;
    try {
      header = decode_stage_frame_header(head, limits_);
      if (header.kind == stage_frame_kind::hello) {
        greeted = greet(channel, header);  // a new link (over ZeroMQ the same socket's next peer)
        if (!greeted && !framed) return;
        continue;
      }
      const bool pair = header.kind == stage_frame_kind::kv_lease || header.kind == stage_frame_kind::kv_release ||
                        header.kind == stage_frame_kind::kv_push;
      if (header.kind != stage_frame_kind::work && header.kind != stage_frame_kind::kv_export &&
          header.kind != stage_frame_kind::kv_import && !pair) {
        throw std::invalid_argument("expected a hello, a work or a KV frame");
      }
      if (!greeted) throw std::invalid_argument("a work or KV frame before the link's hello");
      if (pair) {
        pair_kv(channel, header);
        continue;
      }
      if (header.kind != stage_frame_kind::work) {
        move_kv(channel, header);
        continue;
      }
      if ((header.hidden_size == 0) != first) {
        throw std::invalid_argument(first ? "the first stage embeds tokens; a residual was sent"
                                          : "a residual is needed by this stage and was not sent");
      }
    } catch (const std::invalid_argument& e) {
      send_failure(channel, header, e.what());
      if (!framed) return;  // a stream cannot be trusted past a bad header; a message can
      continue;
    }
    compute(channel, header);
  }
}

std::string stage_server::skip(stage_channel& channel, uint64_t bytes) {
  std::array<std::byte, 65536> sink{};
  const auto deadline = deadline_after(settings_.stall_timeout);
  while (bytes > 0) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(bytes, sink.size()));
    if (std::string why = channel.read(std::span(sink.data(), take), deadline); !why.empty()) return why;
    bytes -= take;
  }
  return "";
}

void stage_server::move_kv(stage_channel& channel, const stage_frame_header& header) {
  const bool exporting = header.kind == stage_frame_kind::kv_export;
  const auto deadline = deadline_after(settings_.stall_timeout);
  std::vector<std::byte> request_bytes(stage_kv_request_bytes(header));  // bounded by max_block_ids
  if (std::string why = channel.read(request_bytes, deadline); !why.empty()) throw std::runtime_error(why);
  const uint64_t data_bytes = header.payload_bytes - request_bytes.size();
  stage_kv_request request;
  try {
    decode_kv_request(header, request_bytes, request);
    const kv_span_header& span = request.span;
    if (span.num_layers < 1 || span.first_layer < layers_.first ||
        int64_t{span.first_layer} + span.num_layers > layers_.end) {
      throw std::invalid_argument("KV of layers " + std::to_string(span.first_layer) + "+" +
                                  std::to_string(span.num_layers) + " is not in this stage (layers " +
                                  layer_range_text(layers_) + ")");
    }
    // Everything the model checks (geometry, element, blocks in the pool, no block twice in an
    // import), before a byte of data is read or an export's buffer allocated.
    check_kv_transfer(stage_.config(), stage_.kv_shape(), request.block_ids, span,
                      exporting ? kv_span_bytes(span) : data_bytes,
                      exporting ? kv_transfer_direction::export_from_pool : kv_transfer_direction::import_into_pool);
  } catch (const std::invalid_argument& e) {
    send_failure(channel, header, "pipeline stage " + layer_range_text(layers_) + ": " + e.what());
    if (std::string why = skip(channel, data_bytes); !why.empty()) throw std::runtime_error(why);
    return;
  }
  stage_frame_header answer;
  answer.step_id = header.step_id;
  try {
    if (exporting) {
      kv_data_.resize(kv_span_bytes(request.span));
      stage_.export_kv(request.block_ids, request.span.first_layer, request.span.num_layers, request.span.element,
                       kv_data_);
      answer.kind = stage_frame_kind::kv_data;
      answer.payload_bytes = kv_data_.size();
    } else {
      kv_data_.resize(data_bytes);
      if (std::string why = channel.read(kv_data_, deadline); !why.empty()) throw std::runtime_error(why);
      stage_.import_kv(request.block_ids, request.span, kv_data_);
      answer.kind = stage_frame_kind::kv_done;
    }
  } catch (const std::invalid_argument& e) {
    send_failure(channel, header, "pipeline stage " + layer_range_text(layers_) + ": " + e.what());
    return;
  }
  ++kv_frames_;
  const std::span<const std::byte> payload =
      exporting ? std::span<const std::byte>(kv_data_) : std::span<const std::byte>{};
  if (!send(channel, answer, payload)) throw std::runtime_error("the link took no KV answer");
}

void stage_server::pair_kv(stage_channel& channel, const stage_frame_header& header) {
  // The header's checks bounded the payload (block ids and a route's text).
  std::vector<std::byte> payload(header.payload_bytes);
  if (std::string why = channel.read(payload, deadline_after(settings_.stall_timeout)); !why.empty())
    throw std::runtime_error(why);
  stage_frame_header answer;
  answer.step_id = header.step_id;
  answer.kind = stage_frame_kind::kv_done;
  std::string text;
  try {
    {
      std::lock_guard lock(pairs_mutex_);
      if (!pairs_) {
        kv_channel_settings channel_settings;
        channel_settings.bind_host = settings_.host;
        channel_settings.keys = settings_.keys;
        channel_settings.max_payload_bytes = limits_.max_kv_bytes;
        channel_settings.max_buffered_bytes = std::max<uint64_t>(limits_.max_kv_bytes, uint64_t(256) << 20);
        pairs_ = std::make_unique<stage_kv_pairs>(stage_, layers_, std::move(channel_settings));
      }
    }
    if (header.kind == stage_frame_kind::kv_lease) {
      const kv_stage_route route = pairs_->lease(decode_stage_kv_lease(header, payload));
      text = kv_stage_route_text(route);
      answer.kind = stage_frame_kind::kv_lease_ack;
    } else if (header.kind == stage_frame_kind::kv_release) {
      pairs_->release(decode_stage_kv_release(payload));
    } else {
      pairs_->push(decode_stage_kv_push(header, payload));
    }
  } catch (const std::invalid_argument& e) {
    send_failure(channel, header, "pipeline stage " + layer_range_text(layers_) + ": " + e.what());
    return;
  }
  ++kv_frames_;
  answer.payload_bytes = text.size();
  if (!send(channel, answer, std::as_bytes(std::span(text.data(), text.size()))))
    throw std::runtime_error("the link took no KV answer");
}

stage_kv_pairs_stats stage_server::kv_pair_stats() const {
  std::lock_guard lock(pairs_mutex_);
  return pairs_ ? pairs_->stats() : stage_kv_pairs_stats{};
}

process_cpu_time stage_server::process_cpu_now() {
  // A census of the process's threads reads /proc: a few times a second, not once a frame.
  const auto now = std::chrono::steady_clock::now();
  if (now - cpu_read_at_ >= cpu_refresh_interval) {
    cpu_ = process_cpu_while_serving();
    cpu_read_at_ = now;
  }
  return cpu_;
}

void stage_server::compute(stage_channel& channel, const stage_frame_header& header) {
  const model_config& c = stage_.config();
  const bool first = layers_.holds_embedding();
  arrays_.resize(stage_work_array_bytes(header));
  residual_in_.resize(static_cast<size_t>(header.num_tokens) * static_cast<size_t>(header.hidden_size));
  const auto deadline = deadline_after(settings_.stall_timeout);
  std::string why = channel.read(arrays_, deadline);
  if (why.empty()) why = channel.read(std::as_writable_bytes(std::span(residual_in_)), deadline);
  if (!why.empty()) throw std::runtime_error(why);
  uint64_t computed_ns = 0;
  try {
    decode_work_arrays(header, arrays_, first ? c.vocab_size : 0, batch_);
    batch_.residual_in = first ? nullptr : residual_in_.data();
    residual_out_.resize(static_cast<size_t>(header.num_tokens) * static_cast<size_t>(c.hidden_size));
    batch_.residual_out = residual_out_.data();
    const auto begin = std::chrono::steady_clock::now();
    const int64_t cpu_begin = thread_cpu_ns();
    stage_.forward(batch_, nullptr);
    add_step_cpu_ns(thread_cpu_ns() - cpu_begin);  // this thread's share of the step is compute
    computed_ns = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - begin).count());
    busy_ns_ += computed_ns;
  } catch (const std::exception& e) {
    send_failure(channel, header, "pipeline stage " + layer_range_text(layers_) + ": " + e.what());
    return;
  }
  ++frames_computed_;
  stage_frame_header result;
  result.kind = stage_frame_kind::result;
  result.step_id = header.step_id;
  result.micro_batch = header.micro_batch;
  result.num_tokens = header.num_tokens;
  result.hidden_size = c.hidden_size;
  result.compute_us = static_cast<uint32_t>(std::min<uint64_t>(computed_ns / 1000, UINT32_MAX));
  const process_cpu_time cpu = process_cpu_now();
  result.process_cpu_us = static_cast<uint64_t>(cpu.total_s * 1e6);
  result.compute_cpu_us = static_cast<uint64_t>(cpu.compute_s * 1e6);
  result.process_id = static_cast<uint32_t>(::getpid());
  result.payload_bytes = stage_payload_bytes(result);
  if (!send(channel, result, std::as_bytes(std::span(residual_out_))))
    throw std::runtime_error("the link took no result");
}

}  // namespace troupe
