#include "engine/kv_stream_out.hpp"

#include <spdlog/spdlog.h>

namespace troupe {

kv_stream_out::kv_stream_out(const model& m, kv_sender& sender, std::chrono::milliseconds timeout)
    : model_(m), sender_(sender), timeout_(timeout), block_size_(m.kv_shape().block_size) {}

void kv_stream_out::start(int64_t request_id, uint64_t transfer_id) {
  auto [it, fresh] = streams_.try_emplace(request_id);
  stream& s = it->second;
  if (!fresh && s.transfer_id == transfer_id) {
    s.num_tokens_sent = 0;  // back after a preemption: its KV is computed (and sent) again
    return;
  }
  if (!fresh) sender_.cancel(s.transfer_id);  // an earlier run of the id never finished
  s = stream{transfer_id};
  sender_.open(transfer_id, std::chrono::steady_clock::now() + timeout_);
}

void kv_stream_out::forget(int64_t request_id, bool preempted) {
  auto it = streams_.find(request_id);
  if (it == streams_.end()) return;
  if (preempted && !it->second.last_chunk_sent) return;  // start() will come again
  if (!it->second.last_chunk_sent) sender_.cancel(it->second.transfer_id);
  streams_.erase(it);
}

bool kv_stream_out::prepare(const step_plan& plan, const std::vector<const std::vector<int32_t>*>& tables) {
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
    step_.push_back(e);
  }
  return !step_.empty();
}

void kv_stream_out::on_layer_written(int layer) {
  const dtype element = model_.kv_dtype();
  for (step_entry& e : step_) {
    if (e.state->broken) continue;
    const int first_block = e.token_begin / block_size_;
    const int end_block = (e.token_end + block_size_ - 1) / block_size_;
    std::span<const int32_t> ids(e.block_table->data() + first_block, static_cast<size_t>(end_block - first_block));
    kv_frame_header header;
    header.transfer_id = e.state->transfer_id;
    header.request_id = e.request_id;
    header.token_begin = e.token_begin;
    header.token_end = e.token_end;
    header.span = kv_span_for(model_.config(), model_.kv_shape(), static_cast<int>(ids.size()), layer, 1, element);
    header.payload_bytes = kv_span_bytes(header.span);
    std::vector<std::byte> payload(header.payload_bytes);
    model_.export_kv(ids, layer, 1, element, payload);
    if (!sender_.send(header, std::move(payload))) {
      spdlog::warn("kv stream: the sender refused layer {} of request {} (transfer {}); its receiver will time out",
                   layer, e.request_id, e.state->transfer_id);
      e.state->broken = true;
    }
  }
}

void kv_stream_out::finish_step() {
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
