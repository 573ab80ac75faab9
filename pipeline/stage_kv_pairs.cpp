#include "pipeline/stage_kv_pairs.hpp"

#include <stdexcept>

#include <spdlog/spdlog.h>

namespace troupe {

stage_kv_pairs::stage_kv_pairs(model& stage, layer_range layers, kv_channel_settings channel)
    : stage_(stage), layers_(layers), channel_(std::move(channel)) {
  // The relay frames and pushes go through the sender's thread; made now so that a push never
  // waits for a thread to start, and it opens no socket until it sends.
  sender_ = std::make_unique<kv_sender>(channel_, kv_sender_events{});
}

stage_kv_pairs::~stage_kv_pairs() {
  receiver_.reset();  // no event after this
  sender_.reset();
}

kv_stage_route stage_kv_pairs::lease(const kv_stage_lease& l) {
  kv_expectation e;
  e.transfer_id = l.transfer_id;
  e.request_id = l.request_id;
  e.block_ids = l.block_ids;
  e.num_tokens = l.num_tokens;
  e.deadline = std::chrono::steady_clock::now() + l.timeout;
  e.layers = layers_;
  std::lock_guard lock(mutex_);
  if (!receiver_) {
    kv_receiver_events events;
    events.complete = [this](uint64_t transfer_id, int64_t) { relay(transfer_id); };
    events.failed = [this](uint64_t transfer_id, int64_t request_id, const std::string& why) {
      // The engine's lease waits for this stage's relay: it is told instead, and fails at once.
      if (!open_to_engine(transfer_id, false)) return;
      sender_->give_up(transfer_id, request_id, "pipeline stage " + layer_range_text(layers_) + ": " + why);
    };
    receiver_ = std::make_unique<kv_receiver>(stage_, channel_, std::move(events));
    spdlog::info("pipeline stage {}: KV receiver for its layers at {}", layer_range_text(layers_),
                 receiver_->endpoint());
  }
  receiver_->expect(std::move(e));  // throws std::invalid_argument naming the field
  relays_[l.transfer_id] = relay_target{l.request_id, l.num_tokens, l.timeout, l.relay_endpoint, l.relay_public_key};
  return kv_stage_route{layers_, receiver_->endpoint(), receiver_->public_key()};
}

void stage_kv_pairs::release(uint64_t transfer_id) {
  kv_receiver* receiver = nullptr;
  {
    std::lock_guard lock(mutex_);
    relays_.erase(transfer_id);
    receiver = receiver_.get();
  }
  // Outside the lock: the receiver's events take it, and cancel waits for a frame being written.
  if (receiver) receiver->cancel(transfer_id);
}

void stage_kv_pairs::open_sender_transfer(uint64_t transfer_id, std::chrono::milliseconds timeout) {
  try {
    sender_->open(transfer_id, std::chrono::steady_clock::now() + timeout);
  } catch (const std::invalid_argument&) {
    // Open already: a later chunk of the same request.
  }
}

std::optional<stage_kv_pairs::relay_target> stage_kv_pairs::open_to_engine(uint64_t transfer_id, bool completed) {
  relay_target to;
  {
    std::lock_guard lock(mutex_);
    auto it = relays_.find(transfer_id);
    if (it == relays_.end()) return std::nullopt;  // released meanwhile
    to = std::move(it->second);
    relays_.erase(it);
    if (completed) ++num_relays_;
  }
  open_sender_transfer(transfer_id, to.timeout);
  sender_->ready(transfer_id, to.endpoint, to.public_key);
  return to;
}

void stage_kv_pairs::relay(uint64_t transfer_id) {
  const std::optional<relay_target> to = open_to_engine(transfer_id, true);
  if (!to) return;
  kv_frame_header h;
  h.transfer_id = transfer_id;
  h.request_id = to->request_id;
  h.token_begin = 0;
  h.token_end = to->num_tokens;
  const int block_size = stage_.kv_shape().block_size;
  h.span = kv_span_for(stage_.config(), stage_.kv_shape(), (to->num_tokens + block_size - 1) / block_size,
                       layers_.first, layers_.count(), stage_.kv_dtype());
  h.payload_bytes = 0;
  h.in_place = true;
  if (!sender_->send(h, {})) {
    spdlog::warn("pipeline stage {}: the relay of KV transfer {} was refused by its sender", layer_range_text(layers_),
                 transfer_id);
    return;
  }
  sender_->finish(transfer_id);
}

void stage_kv_pairs::push(const kv_stage_push& p) {
  const kv_span_header& span = p.span;
  if (span.first_layer != layers_.first || span.num_layers != layers_.count()) {
    throw std::invalid_argument("a KV push of layers " + std::to_string(span.first_layer) + "+" +
                                std::to_string(span.num_layers) + "; this stage holds " + layer_range_text(layers_));
  }
  const int block_size = stage_.kv_shape().block_size;
  if (p.token_begin % block_size != 0 ||
      span.num_blocks != (p.token_end + block_size - 1) / block_size - p.token_begin / block_size) {
    throw std::invalid_argument("a KV push of tokens [" + std::to_string(p.token_begin) + ", " +
                                std::to_string(p.token_end) + ") over " + std::to_string(span.num_blocks) +
                                " blocks of " + std::to_string(block_size) + " tokens");
  }
  const size_t bytes = kv_span_bytes(span);
  // Everything the model checks (geometry, element, blocks in the pool) before a buffer is taken.
  check_kv_transfer(stage_.config(), stage_.kv_shape(), p.block_ids, span, bytes,
                    kv_transfer_direction::export_from_pool);
  kv_frame_header h;
  h.transfer_id = p.transfer_id;
  h.request_id = p.request_id;
  h.token_begin = p.token_begin;
  h.token_end = p.token_end;
  h.span = span;
  h.payload_bytes = bytes;
  std::vector<std::byte> payload = sender_->take_buffer(bytes);
  stage_.export_kv(p.block_ids, span.first_layer, span.num_layers, span.element, payload);
  open_sender_transfer(p.transfer_id, p.timeout);
  sender_->ready(p.transfer_id, p.to.endpoint, p.to.public_key);
  if (!sender_->send(h, std::move(payload))) {
    spdlog::warn("pipeline stage {}: the sender refused KV transfer {}'s tokens [{}, {}); its lease times out",
                 layer_range_text(layers_), p.transfer_id, p.token_begin, p.token_end);
    return;
  }
  if (p.last) sender_->finish(p.transfer_id);
}

stage_kv_pairs_stats stage_kv_pairs::stats() const {
  std::lock_guard lock(mutex_);
  stage_kv_pairs_stats s;
  if (receiver_) {
    const kv_receiver_stats in = receiver_->stats();
    s.frames_received = in.num_frames;
    s.bytes_received = in.num_bytes;
    s.frames_refused = in.num_refused;
    s.leases = in.num_expected;
  }
  const kv_sender_stats out = sender_->stats();
  s.frames_pushed = out.num_frames;
  s.bytes_pushed = out.num_bytes;
  s.relays = num_relays_;
  return s;
}

}  // namespace troupe
