#include "kvtransfer/kv_layer_streamer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace troupe {

kv_layer_streamer::kv_layer_streamer(const model& m, kv_sender& sender, std::chrono::milliseconds timeout,
                                     kv_device_path device, kv_stage_pair_path stage_pairs)
    : model_(m),
      sender_(sender),
      device_(std::move(device)),
      stage_pairs_(std::move(stage_pairs)),
      timeout_(timeout),
      block_size_(m.kv_shape().block_size) {
  if (stage_pairs_) remote_layers_ = stage_pairs_.pairs->remote_stage_layers();
}

void kv_layer_streamer::start(int64_t request_id, uint64_t transfer_id) {
  auto [it, fresh] = streams_.try_emplace(request_id);
  stream& s = it->second;
  if (!fresh && s.transfer_id == transfer_id) {
    s.num_tokens_sent = 0;  // back after a preemption: its KV is computed (and sent) again
    return;
  }
  if (!fresh) {
    sender_.cancel(s.transfer_id);  // an earlier run of the id never finished
    if (device_) device_.destinations->erase(s.transfer_id);
    if (stage_pairs_) stage_pairs_.destinations->erase(s.transfer_id);
  }
  s = stream{};
  s.transfer_id = transfer_id;
  s.deadline = std::chrono::steady_clock::now() + timeout_;
  sender_.open(transfer_id, s.deadline);
}

void kv_layer_streamer::forget(int64_t request_id, bool preempted) {
  auto it = streams_.find(request_id);
  if (it == streams_.end()) return;
  if (preempted && !it->second.last_chunk_sent) return;  // start() will come again
  if (!it->second.last_chunk_sent) sender_.cancel(it->second.transfer_id);
  if (device_) device_.destinations->erase(it->second.transfer_id);
  if (stage_pairs_) stage_pairs_.destinations->erase(it->second.transfer_id);
  streams_.erase(it);
}

bool kv_layer_streamer::prepare(const step_plan& plan, const std::vector<const std::vector<int32_t>*>& tables) {
  step_.clear();
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    const scheduled_sequence& s = plan.sequences[i];
    auto it = streams_.find(s.request_id);
    if (it == streams_.end() || it->second.broken || it->second.last_chunk_sent) continue;
    step_entry e;
    e.request_id = s.request_id;
    e.state = &it->second;
    e.block_table = tables[i];
    e.token_begin = it->second.num_tokens_sent / block_size_ * block_size_;
    e.token_end = s.num_computed_tokens + s.num_new_tokens();
    e.last_chunk = s.sample;
    if (device_ && !e.state->peer) {
      // The copies need the decode side's blocks before the first layer is written. They are
      // usually here already; otherwise the decode side's answer is a few messages away.
      e.state->peer = device_.destinations->take(e.state->transfer_id, e.state->deadline);
      if (!e.state->peer) {
        spdlog::warn(
            "kv stream: no device destination for request {} (transfer {}) by its deadline; its receiver "
            "will time out",
            e.request_id, e.state->transfer_id);
        e.state->broken = true;
        continue;
      }
      // The decode side counts its deadline from the reservation this destination comes from;
      // so do the copies (kv_sender does the same for its frames at the ready).
      e.state->deadline = std::max(e.state->deadline, std::chrono::steady_clock::now() + timeout_);
    }
    if (stage_pairs_ && !e.state->routes_known && !take_stage_routes(e)) continue;
    step_.push_back(e);
  }
  return !step_.empty();
}

bool kv_layer_streamer::take_stage_routes(step_entry& e) {
  // The decode side's answer is usually here already (the router forwards it while the prefill
  // is queued); otherwise it is a few messages away.
  std::optional<kv_device_destination> answer =
      stage_pairs_.destinations->take(e.state->transfer_id, e.state->deadline);
  if (!answer) {
    spdlog::warn(
        "kv stream: no answer from the decode side for request {} (transfer {}) by its deadline; its "
        "receiver will time out",
        e.request_id, e.state->transfer_id);
    e.state->broken = true;
    return false;
  }
  e.state->routes_known = true;
  e.state->deadline = std::max(e.state->deadline, std::chrono::steady_clock::now() + timeout_);
  std::vector<kv_stage_route>& routes = answer->stage_routes;
  if (routes.empty()) return true;  // a decode instance that is no pipeline: every layer from here
  std::string why;
  if (routes.size() != remote_layers_.size()) {
    why = "the decode side has " + std::to_string(routes.size()) + " remote stages, this prefill " +
          std::to_string(remote_layers_.size());
  }
  for (size_t i = 0; why.empty() && i < routes.size(); ++i) {
    if (routes[i].layers != remote_layers_[i]) {
      why = "the decode's stage " + std::to_string(i) + " holds layers " + layer_range_text(routes[i].layers) +
            ", this prefill's " + layer_range_text(remote_layers_[i]);
    } else if (!routes[i].public_key.empty() && !stage_pairs_.pairs->stages_keyed()) {
      why = "the decode's stage " + std::to_string(i) + " takes KV over CURVE, and this prefill's stages have no keys";
    }
  }
  if (!why.empty()) {
    const std::string text = "the pipelines are not cut alike (" + why +
                             "); [pipeline] kv_stage_pairs = false sends every layer through the engines";
    spdlog::warn("kv stream: request {} (transfer {}): {}", e.request_id, e.state->transfer_id, text);
    e.state->broken = true;
    sender_.give_up(e.state->transfer_id, e.request_id, text);
    return false;
  }
  e.state->routes = std::move(routes);
  return true;
}

size_t kv_layer_streamer::remote_stage_of(int layer) const {
  for (size_t i = 0; i < remote_layers_.size(); ++i) {
    if (remote_layers_[i].holds(layer)) return i;
  }
  return remote_layers_.size();
}

void kv_layer_streamer::push_from_stage(step_entry& e, std::span<const int32_t> ids, size_t stage) {
  const layer_range& layers = remote_layers_[stage];
  kv_stage_push push;
  push.transfer_id = e.state->transfer_id;
  push.request_id = e.request_id;
  push.token_begin = e.token_begin;
  push.token_end = e.token_end;
  push.span = kv_span_for(model_.config(), model_.kv_shape(), static_cast<int>(ids.size()), layers.first,
                          layers.count(), model_.kv_dtype());
  push.block_ids.assign(ids.begin(), ids.end());
  push.last = e.last_chunk;
  push.timeout = std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                            e.state->deadline - std::chrono::steady_clock::now()));
  push.to = e.state->routes[stage];
  try {
    stage_pairs_.pairs->push_from_stage(stage, push);  // queued: the forward waits for it
  } catch (const std::exception& error) {
    break_stream(e, layers.end - 1, error.what());
  }
}

void kv_layer_streamer::on_layer_written(int layer) {
  const dtype element = model_.kv_dtype();
  const size_t remote_stage = remote_stage_of(layer);
  for (step_entry& e : step_) {
    if (e.state->broken) continue;
    const int first_block = e.token_begin / block_size_;
    const int end_block = (e.token_end + block_size_ - 1) / block_size_;
    std::span<const int32_t> ids(e.block_table->data() + first_block, static_cast<size_t>(end_block - first_block));
    if (device_) {
      copy_in_place(e, ids, first_block, layer);
      continue;
    }
    if (!e.state->routes.empty() && remote_stage < remote_layers_.size()) {
      // The stage sends all its layers at once, when the last of them is written.
      if (layer + 1 == remote_layers_[remote_stage].end) push_from_stage(e, ids, remote_stage);
      continue;
    }
    kv_frame_header header;
    header.transfer_id = e.state->transfer_id;
    header.request_id = e.request_id;
    header.token_begin = e.token_begin;
    header.token_end = e.token_end;
    header.span = kv_span_for(model_.config(), model_.kv_shape(), static_cast<int>(ids.size()), layer, 1, element);
    header.payload_bytes = kv_span_bytes(header.span);
    std::vector<std::byte> payload = sender_.take_buffer(header.payload_bytes);  // a sent frame's, recycled
    model_.export_kv(ids, layer, 1, element, payload);
    if (!sender_.send(header, std::move(payload))) {
      spdlog::warn("kv stream: the sender refused layer {} of request {} (transfer {}); its receiver will time out",
                   layer, e.request_id, e.state->transfer_id);
      e.state->broken = true;
    }
  }
}

void kv_layer_streamer::copy_in_place(step_entry& e, std::span<const int32_t> ids, int first_block, int layer) {
  const kv_device_destination& peer = *e.state->peer;
  if (static_cast<size_t>(first_block) + ids.size() > peer.block_ids.size()) {
    break_stream(e, layer,
                 "the decode side reserved " + std::to_string(peer.block_ids.size()) + " blocks, tokens up to " +
                     std::to_string(e.token_end) + " need " + std::to_string(first_block + ids.size()));
    return;
  }
  const std::span<const int32_t> peer_ids = std::span(peer.block_ids).subspan(first_block, ids.size());
  // NCCL: the receiver posts its receive when the frame arrives, so the frame goes first and the
  // copy is only posted (completed at finish_step). CUDA IPC: the frame says the copy is done.
  const bool frame_first = device_.copier->frame_first();
  if (!frame_first && !copy_layer(e, ids, peer_ids, layer)) return;
  kv_frame_header header;
  header.transfer_id = e.state->transfer_id;
  header.request_id = e.request_id;
  header.token_begin = e.token_begin;
  header.token_end = e.token_end;
  header.span =
      kv_span_for(model_.config(), model_.kv_shape(), static_cast<int>(ids.size()), layer, 1, model_.kv_dtype());
  header.payload_bytes = 0;
  header.in_place = true;
  std::vector<std::byte> payload;
  if (frame_first) {
    // The frame names its send's place in the pair's order: frames of different transfers may
    // be handed over in another order than their sends are posted.
    header.sequenced = true;
    payload = encode_kv_frame_sequence(device_.copier->next_sequence(peer.pool_handle));
    header.payload_bytes = payload.size();
  }
  if (!sender_.send(header, std::move(payload))) {
    break_stream(e, layer, "the sender refused its in-place frame");
    return;
  }
  if (frame_first) copy_layer(e, ids, peer_ids, layer);
}

bool kv_layer_streamer::copy_layer(step_entry& e, std::span<const int32_t> ids, std::span<const int32_t> peer_ids,
                                   int layer) {
  try {
    device_.copier->copy_to(e.state->peer->pool_handle, ids, peer_ids, layer, 1, e.state->deadline);
  } catch (const std::exception& error) {
    break_stream(e, layer, error.what());
    return false;
  }
  return true;
}

void kv_layer_streamer::complete_device_copies() {
  // A stream that broke during the step may have posted sends of earlier layers: waited for too.
  for (step_entry& e : step_) {
    if (!e.state->peer) continue;
    try {
      device_.copier->complete(e.state->peer->pool_handle, e.state->deadline);
    } catch (const std::exception& error) {
      if (e.state->broken) continue;
      spdlog::warn("kv stream: the KV of request {} (transfer {}) did not complete: {}; its receiver will time out",
                   e.request_id, e.state->transfer_id, error.what());
      e.state->broken = true;
    }
  }
}

void kv_layer_streamer::break_stream(step_entry& e, int layer, const std::string& why) {
  spdlog::warn("kv stream: layer {} of request {} (transfer {}) not sent: {}; its receiver is told", layer,
               e.request_id, e.state->transfer_id, why);
  e.state->broken = true;
  sender_.give_up(e.state->transfer_id, e.request_id, "layer " + std::to_string(layer) + " was not sent: " + why);
}

void kv_layer_streamer::finish_step() {
  // Before a step's blocks can be written again, the copies it posted are complete.
  if (device_ && device_.copier->frame_first()) complete_device_copies();
  for (step_entry& e : step_) {
    if (e.state->broken) continue;
    e.state->num_tokens_sent = e.token_end;
    if (e.last_chunk) {
      e.state->last_chunk_sent = true;
      sender_.finish(e.state->transfer_id);
    }
  }
  step_.clear();
}

}  // namespace troupe
