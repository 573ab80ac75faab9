#include "pipeline/pipelined_model.hpp"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <spdlog/spdlog.h>

#include "kvtransfer/kv_stage_pairs.hpp"
#include "model/stage_lost_error.hpp"
#include "pipeline/stage_health.hpp"
#include "pipeline/stage_load.hpp"
#include "pipeline/stage_link.hpp"

namespace troupe {

void pipeline_settings::validate() const {
  if (micro_batches < 1 || micro_batches > 64) {
    throw std::runtime_error("pipeline micro_batches must be 1 to 64, got " + std::to_string(micro_batches));
  }
  if (connect_timeout.count() <= 0 || step_timeout.count() <= 0) {
    throw std::runtime_error("pipeline timeouts must be positive");
  }
  if (reconnect_first_delay.count() <= 0 || reconnect_max_delay < reconnect_first_delay) {
    throw std::runtime_error(
        "pipeline reconnect_first_delay_ms must be positive and reconnect_max_delay_ms at least it, got " +
        std::to_string(reconnect_first_delay.count()) + " and " + std::to_string(reconnect_max_delay.count()));
  }
  if (reconnect_attempts < 1 || reconnect_attempts > 1000000) {
    throw std::runtime_error("pipeline reconnect_attempts must be 1 to 1000000, got " +
                             std::to_string(reconnect_attempts));
  }
}

pipeline_settings pipeline_plan::settings() const {
  pipeline_settings settings;
  settings.micro_batches = micro_batches;
  settings.step_timeout = std::chrono::milliseconds(step_timeout_ms);
  settings.connect_timeout = std::chrono::milliseconds(connect_timeout_ms);
  settings.reconnect_first_delay = std::chrono::milliseconds(reconnect_first_delay_ms);
  settings.reconnect_max_delay = std::chrono::milliseconds(reconnect_max_delay_ms);
  settings.reconnect_attempts = reconnect_attempts;
  return settings;
}

void pipeline_plan::validate() const {
  int next = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    const remote_stage& s = stages[i];
    const std::string which = "[pipeline] stage " + std::to_string(i);
    if (!s.endpoint.starts_with("kvtcp://") && !s.endpoint.starts_with("curve://")) {
      throw std::runtime_error(which + ": endpoint \"" + s.endpoint +
                               "\" is not kvtcp://HOST:PORT or curve://HOST:PORT/KEY (what `troupe stage` prints)");
    }
    if (s.layers.first != next || s.layers.end <= s.layers.first) {
      throw std::runtime_error(which + " holds layers " + layer_range_text(s.layers) +
                               "; expected it to start at layer " + std::to_string(next) +
                               " (stages follow one another from layer 0)");
    }
    next = s.layers.end;
  }
  if (failover_wait_ms < 0) {
    throw std::runtime_error("pipeline failover_wait_ms must be 0 or more, got " + std::to_string(failover_wait_ms));
  }
  settings().validate();
}

remote_stage parse_remote_stage(const std::string& text) {
  const size_t at = text.rfind('@');
  if (at == std::string::npos || at == 0 || at + 1 == text.size()) {
    throw std::runtime_error("pipeline stage \"" + text +
                             "\": expected ENDPOINT@FIRST-LAST (kvtcp://HOST:PORT or curve://HOST:PORT/KEY)");
  }
  return {text.substr(0, at), parse_layer_range(text.substr(at + 1), std::numeric_limits<int>::max())};
}

std::vector<std::pair<int, int>> cut_micro_batches(const forward_batch& batch, int count) {
  const int num_seqs = batch.num_seqs();
  count = std::max(1, std::min(count, num_seqs));
  std::vector<std::pair<int, int>> cuts;
  int first = 0;
  for (int i = 0; i < count && first < num_seqs; ++i) {
    // This micro-batch ends at the first sequence boundary at or past its share of the tokens,
    // leaving a sequence for each micro-batch after it.
    const int64_t target = int64_t{batch.num_tokens()} * (i + 1) / count;
    int end = first + 1;
    const int latest_end = num_seqs - (count - 1 - i);
    while (end < latest_end && batch.query_start[static_cast<size_t>(end)] < target) ++end;
    if (i == count - 1) end = num_seqs;
    cuts.emplace_back(first, end);
    first = end;
  }
  return cuts;
}

forward_batch slice_sequences(const forward_batch& batch, int first, int end) {
  forward_batch out;
  const int32_t q0 = batch.query_start[static_cast<size_t>(first)];
  const int32_t q1 = batch.query_start[static_cast<size_t>(end)];
  const int32_t b0 = batch.block_table_start[static_cast<size_t>(first)];
  const int32_t b1 = batch.block_table_start[static_cast<size_t>(end)];
  out.token_ids.assign(batch.token_ids.begin() + q0, batch.token_ids.begin() + q1);
  out.positions.assign(batch.positions.begin() + q0, batch.positions.begin() + q1);
  out.slot_mapping.assign(batch.slot_mapping.begin() + q0, batch.slot_mapping.begin() + q1);
  out.context_lengths.assign(batch.context_lengths.begin() + first, batch.context_lengths.begin() + end);
  out.block_tables.assign(batch.block_tables.begin() + b0, batch.block_tables.begin() + b1);
  for (int s = first; s <= end; ++s) {
    out.query_start.push_back(batch.query_start[static_cast<size_t>(s)] - q0);
    out.block_table_start.push_back(batch.block_table_start[static_cast<size_t>(s)] - b0);
  }
  return out;
}

namespace {

class pipelined_model final : public model, public kv_stage_pairs {
 public:
  pipelined_model(std::unique_ptr<model> last, layer_range last_layers, const std::vector<remote_stage>& remote,
                  const pipeline_settings& settings)
      : last_(std::move(last)), last_layers_(last_layers.resolved(last_->config().num_layers)), settings_(settings) {
    settings_.validate();
    const model_config& c = last_->config();
    std::vector<layer_range> ranges;
    for (const remote_stage& r : remote) ranges.push_back(r.layers);
    ranges.push_back(last_layers_);
    check_pipeline_ranges(ranges, c.num_layers);
    if (remote.empty()) throw std::runtime_error("a pipelined model needs at least one remote stage");
    const stage_hello expected_base{
        0, 0, c.num_layers, c.hidden_size, c.vocab_size, last_->kv_shape().block_size, last_->kv_shape().num_blocks};
    expected_base_ = expected_base;
    remote_ = remote;
    for (size_t i = 0; i < remote_.size(); ++i) links_.push_back(connect(i, settings_.connect_timeout));
    shape_ = last_->kv_shape();
    for (const auto& link : links_) shape_.num_blocks = std::min(shape_.num_blocks, link->num_blocks());
    // Every block counts as written in the first epoch: KV imported for the local layers, as
    // before a stage was ever lost, is trusted.
    block_epoch_.assign(static_cast<size_t>(std::max(shape_.num_blocks, 0)), kv_epoch_);
    wire_links();
    reconnects_.resize(links_.size());
    reconnector_ = std::thread([this] { reconnect_lost_stages(); });
  }

  ~pipelined_model() override {
    {
      std::lock_guard lock(links_mutex_);
      stopping_ = true;
    }
    reconnect_wake_.notify_all();
    if (reconnector_.joinable()) reconnector_.join();
    for (size_t i = 0; i < remote_.size(); ++i) {
      stage_health_board::instance().up(stage_key(i));
      stage_load_board::instance().forget(remote_[i].layers, remote_[i].endpoint);
    }
    stage_load_board::instance().forget(last_layers_, local_stage_name);
    links_.clear();  // joins the link threads before the rest goes
  }

  const model_config& config() const override { return last_->config(); }
  kv_cache_shape kv_shape() const override { return shape_; }
  std::string backend_name() const override {
    std::string text = "pipeline of " + std::to_string(links_.size() + 1) + " stages (";
    for (const auto& link : links_)
      text += "layers " + layer_range_text(link->layers()) + " at " + link->endpoint() + "; ";
    return text + "layers " + layer_range_text(last_layers_) + " here: " + last_->backend_name() + ")";
  }
  dtype kv_dtype() const override { return last_->kv_dtype(); }
  // KV moves stage by stage: each stage's share of the layers goes over its link (its KV frames,
  // pipeline/stage_frame.hpp) or, for the layers here, to the local model. A span is layer-major
  // (model/kv_transfer.hpp), so each stage's share is one contiguous piece of it.
  void export_kv(std::span<const int32_t> block_ids, int first_layer, int num_layers, dtype element,
                 std::span<std::byte> out) const override {
    const kv_span_header whole =
        kv_span_for(config(), shape_, static_cast<int>(block_ids.size()), first_layer, num_layers, element);
    check_kv_transfer(config(), shape_, block_ids, whole, out.size(), kv_transfer_direction::export_from_pool);
    std::lock_guard lock(links_mutex_);  // the links stay while they are used
    for_each_stage_share(whole, [&](int stage, const kv_span_header& share, size_t offset, size_t bytes) {
      if (stage < 0) {
        last_->export_kv(block_ids, share.first_layer, share.num_layers, element, out.subspan(offset, bytes));
        return;
      }
      stage_link& link = *links_[static_cast<size_t>(stage)];
      if (std::string why = link.export_kv(block_ids, share, out.subspan(offset, bytes)); !why.empty()) {
        // From a prefill's forward: a lost stage fails the step as one, so its requests wait for
        // the stage and run again.
        if (!link.broken().empty()) throw stage_lost_error(why);
        throw std::runtime_error(why);
      }
    });
  }

  // An import into a remote stage is trusted as long as no stage restarted since the import of
  // the block's first layer began (the KV plane sends a request's layers in order from 0, so a
  // restart part way through leaves the earlier layers lost: the import fails and the transfer
  // runs again).
  void import_kv(std::span<const int32_t> block_ids, const kv_span_header& header,
                 std::span<const std::byte> data) override {
    check_kv_transfer(config(), shape_, block_ids, header, data.size(), kv_transfer_direction::import_into_pool);
    std::unique_lock lock(links_mutex_);
    wait_for_stages_of(header, lock);
    if (header.first_layer == 0) {
      for (const int32_t block : block_ids) block_epoch_[static_cast<size_t>(block)] = kv_epoch_;
    } else {
      for (const int32_t block : block_ids) {
        if (block_epoch_[static_cast<size_t>(block)] != kv_epoch_) {
          throw std::runtime_error("a pipeline stage restarted while KV was imported into block " +
                                   std::to_string(block) + ": its earlier layers went with it");
        }
      }
    }
    for_each_stage_share(header, [&](int stage, const kv_span_header& share, size_t offset, size_t bytes) {
      if (stage < 0) {
        last_->import_kv(block_ids, share, data.subspan(offset, bytes));
        return;
      }
      if (std::string why =
              links_[static_cast<size_t>(stage)]->import_kv(block_ids, share, data.subspan(offset, bytes));
          !why.empty()) {
        throw std::runtime_error(why);
      }
    });
  }

  // A KV channel per pair of stages (kvtransfer/kv_stage_pairs.hpp): the link carries only the
  // small lease, release and push frames; the KV goes between the stages' own KV planes.
  std::vector<layer_range> remote_stage_layers() const override {
    std::vector<layer_range> layers;
    for (const remote_stage& r : remote_) layers.push_back(r.layers);
    return layers;
  }
  bool stages_keyed() const override {
    return std::all_of(remote_.begin(), remote_.end(),
                       [](const remote_stage& r) { return r.endpoint.starts_with("curve://"); });
  }
  std::vector<kv_stage_route> lease_at_stages(const kv_stage_lease& lease) override {
    std::vector<kv_stage_route> routes(links_.size());
    std::unique_lock lock(links_mutex_);
    for (size_t i = 0; i < links_.size(); ++i) {
      if (std::string why = links_[i]->lease_kv(lease, routes[i]); !why.empty()) {
        for (size_t j = 0; j < i; ++j) (void)links_[j]->release_kv(lease.transfer_id);
        throw std::runtime_error(why);
      }
    }
    // The stages' layers of these blocks are theirs to receive in this KV epoch: a stage that
    // restarts before the engine's own layers are imported fails that import (import_kv).
    for (const int32_t block : lease.block_ids) {
      if (block >= 0 && static_cast<size_t>(block) < block_epoch_.size())
        block_epoch_[static_cast<size_t>(block)] = kv_epoch_;
    }
    return routes;
  }
  void on_stage_lost(std::function<void()> listener) override {
    std::lock_guard lock(listener_mutex_);
    stage_lost_listener_ = std::move(listener);
  }
  void release_at_stages(uint64_t transfer_id) override {
    std::unique_lock lock(links_mutex_);
    for (const auto& link : links_) {
      // A stage that is down holds no lease any more; one that refuses says why in the log.
      if (std::string why = link->release_kv(transfer_id); !why.empty() && link->broken().empty()) {
        spdlog::warn("{}: releasing KV transfer {}: {}", link->endpoint(), transfer_id, why);
      }
    }
  }
  void push_from_stage(size_t stage, const kv_stage_push& push) override {
    // Called inside forward(), whose links stay as they are until it returns.
    if (stage >= links_.size()) throw std::runtime_error("no pipeline stage " + std::to_string(stage));
    links_[stage]->queue_push_kv(push);
  }

  void forward(const forward_batch& batch, float* logits) override {
    if (batch.residual_in != nullptr || batch.residual_out != nullptr) {
      throw std::runtime_error("a pipelined model is the whole model: no residual_in / residual_out");
    }
    install_reconnected_links();
    struct forward_scope {  // in_forward_ ends however the forward does
      pipelined_model& m;
      ~forward_scope() {
        std::lock_guard lock(m.links_mutex_);
        m.in_forward_ = false;
      }
    } scope{*this};
    {
      std::lock_guard lock(links_mutex_);
      for (size_t i = 0; i < links_.size(); ++i) {
        if (std::string why = links_[i]->broken(); !why.empty()) {
          note_if_lost(i);  // on the board before the step's requests hear of it
          throw stage_lost_error(why +
                                 " (the stage is down: its link reconnects with back-off, and steps fail "
                                 "until it is back)");
        }
      }
    }
    check_kv_written_since_reconnect(batch);
    const int wanted = batch.hidden_rows.empty() ? settings_.micro_batches : 1;
    const std::vector<std::pair<int, int>> cuts = cut_micro_batches(batch, wanted);
    const uint64_t step = ++step_id_;
    jobs_.resize(cuts.size());
    slices_.resize(cuts.size());
    {
      std::lock_guard lock(mutex_);
      arrived_.clear();
      passed_.assign(links_.size(), 0);
      stage_failed_ = false;
    }
    for (size_t i = 0; i < cuts.size(); ++i) {
      slices_[i] = slice_sequences(batch, cuts[i].first, cuts[i].second);
      micro_batch_job& job = jobs_[i];
      job.step_id = step;
      job.index = static_cast<uint32_t>(i);
      job.batch = &slices_[i];
      job.failure.clear();
      links_.front()->push(&job);
    }
    // Each micro-batch's local stage runs as it comes back (in order: the links are FIFO), its
    // logits rows placed where the whole batch's logits_rows put them. A disaggregated prefill
    // streams its KV (after_layer_kv) while it computes: a remote stage's layers as soon as every
    // micro-batch has left that stage (wait_for), the local layers one by one inside the last
    // micro-batch's forward, when each is written for all of them.
    std::string failure;
    kv_stream_progress streaming{static_cast<bool>(batch.after_layer_kv)};
    std::exception_ptr local_error;  // the local stage's, rethrown once every micro-batch is back
    std::chrono::nanoseconds local_busy{0};
    for (size_t i = 0; i < cuts.size(); ++i) {
      micro_batch_job* job = wait_for(i, batch, streaming);
      if (!job->failure.empty() || !failure.empty() || streaming.error || local_error) {
        if (failure.empty()) failure = job->failure;
        continue;  // the rest still come back before their buffers may go
      }
      try {
        local_busy += run_local_stage(batch, cuts, i, *job, logits);
      } catch (...) {
        local_error = std::current_exception();
      }
    }
    // The stages' pushes of this step's KV (a channel per pair of stages) are done before the
    // step is: the next may preempt and reuse the blocks they read.
    for (const auto& link : links_) {
      if (std::string why = link->wait_pushes(); !why.empty()) {
        if (!link->broken().empty()) {
          if (failure.empty()) failure = why;
        } else {
          spdlog::warn("{}: a KV push was refused: {}; its decode's lease times out and the request runs again",
                       link->endpoint(), why);
        }
      }
    }
    record_stage_load(local_busy);
    if (!failure.empty() || streaming.error) {
      bool lost = false;
      {
        // On the board before the step's requests hear of it: /health names the stage at once.
        std::lock_guard lock(links_mutex_);
        for (size_t i = 0; i < links_.size(); ++i) lost = note_if_lost(i) || lost;
      }
      reconnect_wake_.notify_all();  // start reconnecting now, not at the next poll
      // The KV stream's own failure as it was thrown (a stage lost while its layers were fetched
      // is a stage_lost_error already).
      if (streaming.error) std::rethrow_exception(streaming.error);
      // A stage that refused a frame still serves: that is this step's own failure.
      if (lost) throw stage_lost_error(failure);
      throw std::runtime_error(failure);
    }
    if (local_error) std::rethrow_exception(local_error);
    mark_kv_written(batch);
  }

 private:
  // Micro-batch i (cuts[i] of `batch`) through the layers here, once it is back from the remote
  // stages: its logits rows go where the whole batch's logits_rows put them, and the last
  // micro-batch carries after_layer_kv (each local layer is then written for all of them).
  // Returns the time it took.
  std::chrono::nanoseconds run_local_stage(const forward_batch& batch, const std::vector<std::pair<int, int>>& cuts,
                                           size_t i, micro_batch_job& job, float* logits) {
    forward_batch& local = slices_[i];
    local.residual_in = job.stream[0].data();
    local.after_layer_kv = i + 1 == cuts.size() ? batch.after_layer_kv : nullptr;
    const auto begin = std::chrono::steady_clock::now();
    if (cuts.size() == 1) {
      local.logits_rows = batch.logits_rows;
      local.hidden_rows = batch.hidden_rows;
      local.hidden_out = batch.hidden_out;
      last_->forward(local, logits);
      return std::chrono::steady_clock::now() - begin;
    }
    const int vocab = config().vocab_size;
    const int32_t row_begin = batch.query_start[static_cast<size_t>(cuts[i].first)];
    const int32_t row_end = batch.query_start[static_cast<size_t>(cuts[i].second)];
    std::vector<size_t> places;  // where each of this micro-batch's logits rows goes
    local.logits_rows.clear();
    for (size_t j = 0; j < batch.logits_rows.size(); ++j) {
      const int32_t row = batch.logits_rows[j];
      if (row >= row_begin && row < row_end) {
        local.logits_rows.push_back(row - row_begin);
        places.push_back(j);
      }
    }
    part_logits_.resize(places.size() * static_cast<size_t>(vocab));
    last_->forward(local, part_logits_.data());
    for (size_t k = 0; k < places.size(); ++k) {
      std::memcpy(logits + places[k] * static_cast<size_t>(vocab), part_logits_.data() + k * static_cast<size_t>(vocab),
                  static_cast<size_t>(vocab) * sizeof(float));
    }
    return std::chrono::steady_clock::now() - begin;
  }

  // Before an import: a stage it writes into that is down is waited for, as long as connecting to
  // it may take, and a reconnected one installed when no forward runs (a decode instance with
  // nothing to decode runs none). Otherwise a decode instance's transfers would fail one after
  // another while its stage restarts, and their requests with them. links_mutex_ held by `lock`.
  void wait_for_stages_of(const kv_span_header& span, std::unique_lock<std::mutex>& lock) {
    const auto deadline = std::chrono::steady_clock::now() + settings_.connect_timeout;
    for (;;) {
      if (!in_forward_) install_reconnected_links_locked();
      bool waiting = false;
      for_each_stage_share(span, [&](int stage, const kv_span_header&, size_t, size_t) {
        if (stage < 0) return;
        const reconnect_state& r = reconnects_[static_cast<size_t>(stage)];
        waiting = waiting || (!links_[static_cast<size_t>(stage)]->broken().empty() && !r.given_up);
      });
      if (!waiting || stopping_ || std::chrono::steady_clock::now() >= deadline) return;
      reconnect_wake_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }

  // Calls fn(stage, share, offset, bytes) for each stage holding some of `whole`'s layers, in
  // layer order: stage is the link's index, or -1 for the layers here; share is `whole` cut to
  // that stage's layers, found at [offset, offset + bytes) of the span.
  template <class Fn>
  void for_each_stage_share(const kv_span_header& whole, Fn&& fn) const {
    kv_span_header one_layer = whole;
    one_layer.num_layers = 1;
    const size_t layer_bytes = kv_span_bytes(one_layer);
    const int end = whole.first_layer + whole.num_layers;
    for (int stage = 0; stage <= static_cast<int>(remote_.size()); ++stage) {
      const bool here = stage == static_cast<int>(remote_.size());
      const layer_range held = here ? last_layers_ : remote_[static_cast<size_t>(stage)].layers;
      const int first = std::max(whole.first_layer, held.first);
      const int last_end = std::min(end, held.end);
      if (first >= last_end) continue;
      kv_span_header share = whole;
      share.first_layer = first;
      share.num_layers = last_end - first;
      fn(here ? -1 : stage, share, static_cast<size_t>(first - whole.first_layer) * layer_bytes,
         static_cast<size_t>(share.num_layers) * layer_bytes);
    }
  }

  // How often the reconnector looks at the links; the back-off between attempts is the
  // settings' (reconnect_first_delay doubling up to reconnect_max_delay, reconnect_attempts).
  static constexpr auto reconnect_poll = std::chrono::milliseconds(100);

  struct reconnect_state {
    int attempts = 0;
    bool reported = false;  // on the board and in the log since the link broke
    std::chrono::steady_clock::time_point next_attempt{};
    bool given_up = false;
    std::unique_ptr<stage_link> replacement;  // connected, not yet installed by forward()
  };

  // What `troupe scale --list` calls the engine's own stage.
  static constexpr const char* local_stage_name = "here";

  // Each stage's compute in the step just done, on the process's board (pipeline/stage_load.hpp).
  void record_stage_load(std::chrono::nanoseconds local_busy) {
    const auto now = std::chrono::steady_clock::now();
    stage_load_board& board = stage_load_board::instance();
    for (size_t i = 0; i < links_.size(); ++i) {
      board.add(remote_[i].layers, remote_[i].endpoint, std::chrono::nanoseconds(links_[i]->take_busy_ns()), now);
      // A stage served from this very process (tests, benches) is this process's CPU already.
      const stage_link::process_cpu cpu = links_[i]->stage_process_cpu();
      if (cpu.pid == 0 || cpu.pid == static_cast<uint32_t>(::getpid())) continue;
      board.report_cpu(remote_[i].layers, remote_[i].endpoint,
                       stage_process_cpu{stage_process_identity(remote_[i].endpoint, cpu.pid), cpu.total_us / 1e6,
                                         cpu.compute_us / 1e6});
    }
    board.add(last_layers_, local_stage_name, local_busy, now);
  }

  std::string stage_key(size_t i) const {
    return "pipeline stage " + layer_range_text(remote_[i].layers) + " at " + remote_[i].endpoint;
  }

  std::unique_ptr<stage_link> connect(size_t i, std::chrono::milliseconds timeout) const {
    stage_hello expected = expected_base_;
    expected.first_layer = remote_[i].layers.first;
    expected.end_layer = remote_[i].layers.end;
    return std::make_unique<stage_link>(remote_[i].endpoint, remote_[i].layers, expected, timeout,
                                        settings_.step_timeout, settings_.keys);
  }

  void wire_links() {
    for (size_t i = 0; i < links_.size(); ++i) {
      stage_link* next = i + 1 < links_.size() ? links_[i + 1].get() : nullptr;
      links_[i]->hand_on_to([this, i, next](micro_batch_job* job) {
        left_stage(i, *job);
        if (next) {
          next->push(job);
        } else {
          arrived(job);
        }
      });
    }
  }

  // The reconnector's thread: every broken link is connected again (the stage process restarted
  // by `troupe launch`, or by hand) with back-off, its state on the health board meanwhile.
  void reconnect_lost_stages() {
    std::unique_lock lock(links_mutex_);
    uint64_t losses_told = 0;
    while (!stopping_) {
      reconnect_wake_.wait_for(lock, reconnect_poll, [this] { return stopping_; });
      if (stopping_) return;
      if (losses_ != losses_told) {
        // Without links_mutex_: the listener fails transfers, whose release comes back here.
        losses_told = losses_;
        lock.unlock();
        {
          std::lock_guard told(listener_mutex_);
          if (stage_lost_listener_) stage_lost_listener_();
        }
        lock.lock();
        if (stopping_) return;
      }
      for (size_t i = 0; i < links_.size() && !stopping_; ++i) {
        reconnect_state& r = reconnects_[i];
        if (r.replacement || r.given_up) continue;
        if (!note_if_lost(i)) continue;
        if (std::chrono::steady_clock::now() < r.next_attempt) continue;
        lock.unlock();  // forward() must not wait for a connection attempt
        std::unique_ptr<stage_link> link;
        std::string why;
        try {
          link = connect(i, std::min(settings_.connect_timeout, settings_.reconnect_max_delay));
          if (link->num_blocks() < shape_.num_blocks) {
            why = "the stage came back with " + std::to_string(link->num_blocks()) + " KV blocks, fewer than the " +
                  std::to_string(shape_.num_blocks) + " the engine schedules";
            link.reset();
          }
        } catch (const std::exception& e) {
          why = e.what();
        }
        lock.lock();
        if (link) {
          spdlog::info(
              "{}: reconnected after {} failed attempts; the KV it held is gone, so requests that had "
              "computed KV fail and run again from their prompt when sent again",
              stage_key(i), r.attempts);
          r = reconnect_state{};
          r.replacement = std::move(link);
          stage_health_board::instance().up(stage_key(i));
          continue;
        }
        ++r.attempts;
        if (r.attempts >= settings_.reconnect_attempts) {
          r.given_up = true;
          spdlog::error("{}: gave up reconnecting after {} attempts: {}", stage_key(i), r.attempts, why);
          stage_health_board::instance().down(
              stage_key(i), "down; gave up reconnecting after " + std::to_string(r.attempts) + " attempts: " + why);
          continue;
        }
        const auto delay = std::min<std::chrono::milliseconds>(
            settings_.reconnect_max_delay, settings_.reconnect_first_delay * (1 << std::min(r.attempts, 16)));
        r.next_attempt = std::chrono::steady_clock::now() + delay;
        stage_health_board::instance().down(stage_key(i), "down; reconnect attempt " + std::to_string(r.attempts) +
                                                              " failed (" + why + "), next in " +
                                                              std::to_string(delay.count()) + " ms");
      }
    }
  }

  // True when link i is down and not yet replaced; the first time, says so on the board and in the
  // log. Called with links_mutex_ held.
  bool note_if_lost(size_t i) {
    reconnect_state& r = reconnects_[i];
    if (r.replacement || r.given_up) return false;
    const std::string broken = links_[i]->broken();
    if (broken.empty()) return false;
    if (!r.reported) {
      r.reported = true;
      ++losses_;
      spdlog::warn("{}; reconnecting (at most {} attempts)", broken, settings_.reconnect_attempts);
      stage_health_board::instance().down(stage_key(i), "down (" + broken + "); reconnecting");
    }
    return true;
  }

  // Called by forward() when it starts, before any micro-batch is in flight: the reconnected
  // links replace the broken ones, and the forward is on until it returns (in_forward_).
  void install_reconnected_links() {
    std::lock_guard lock(links_mutex_);
    install_reconnected_links_locked();
    in_forward_ = true;
  }

  // The reconnected links replace the broken ones, and a new KV epoch begins (the restarted stage
  // holds no KV). Only while no forward runs; links_mutex_ held.
  void install_reconnected_links_locked() {
    bool installed = false;
    for (size_t i = 0; i < links_.size(); ++i) {
      if (!reconnects_[i].replacement) continue;
      links_[i] = std::move(reconnects_[i].replacement);
      installed = true;
    }
    if (!installed) return;
    wire_links();
    ++kv_epoch_;
  }

  // A restarted stage lost the KV of every block written before it came back: a sequence that
  // reads such a block (its context before this step's tokens) would compute a wrong answer.
  void check_kv_written_since_reconnect(const forward_batch& batch) const {
    const int block_size = shape_.block_size;
    for (int s = 0; s < batch.num_seqs(); ++s) {
      const int32_t q0 = batch.query_start[static_cast<size_t>(s)];
      if (q0 >= batch.query_start[static_cast<size_t>(s) + 1]) continue;
      const int32_t first_position = batch.positions[static_cast<size_t>(q0)];
      const int32_t table = batch.block_table_start[static_cast<size_t>(s)];
      const int32_t table_end = batch.block_table_start[static_cast<size_t>(s) + 1];
      const int32_t blocks_read = std::min((first_position + block_size - 1) / block_size, table_end - table);
      for (int32_t k = 0; k < blocks_read; ++k) {
        const int32_t block = batch.block_tables[static_cast<size_t>(table + k)];
        if (block < 0 || static_cast<size_t>(block) >= block_epoch_.size()) continue;  // released (a window)
        if (block_epoch_[static_cast<size_t>(block)] != kv_epoch_) {
          throw stage_lost_error(
              "a pipeline stage restarted since this request's KV was computed, and its layers' "
              "KV went with it (block " +
              std::to_string(block) + "): the request must run again from its prompt");
        }
      }
    }
  }

  void mark_kv_written(const forward_batch& batch) {
    const int block_size = shape_.block_size;
    for (const int32_t slot : batch.slot_mapping) {
      if (slot < 0) continue;
      const size_t block = static_cast<size_t>(slot / block_size);
      if (block < block_epoch_.size()) block_epoch_[block] = kv_epoch_;
    }
  }

  // Called by link i's thread as a micro-batch leaves its stage (computed there, or failed there
  // or before), before the next link or the model may touch it.
  void left_stage(size_t i, const micro_batch_job& job) {
    {
      std::lock_guard lock(mutex_);
      if (i < passed_.size()) ++passed_[i];
      if (!job.failure.empty()) stage_failed_ = true;
    }
    came_back_.notify_all();
  }

  void arrived(micro_batch_job* job) {
    {
      std::lock_guard lock(mutex_);
      arrived_.push_back(job->index);
    }
    came_back_.notify_all();
  }

  // How far a forward's KV stream has come: the remote stages whose layers went to after_layer_kv
  // (in order), and what after_layer_kv threw, if it did (the forward rethrows it once every
  // micro-batch is back, since the links still write into this forward's buffers until then).
  struct kv_stream_progress {
    bool on = false;
    size_t stages_streamed = 0;
    std::exception_ptr error;
  };

  // Micro-batch i once it is back from the remote stages (every link bounds its wait, and a
  // failed one passes the job on, so this returns). Meanwhile, when the forward streams its KV,
  // each remote stage's layers go to after_layer_kv as soon as every micro-batch has left that
  // stage: stage k's KV is fetched over its link while stage k + 1 still computes.
  micro_batch_job* wait_for(size_t i, const forward_batch& batch, kv_stream_progress& streaming) {
    std::unique_lock lock(mutex_);
    for (;;) {
      const size_t next = streaming.stages_streamed;
      if (streaming.on && !streaming.error && !stage_failed_ && next < links_.size() && passed_[next] == jobs_.size()) {
        ++streaming.stages_streamed;
        lock.unlock();
        try {
          const layer_range layers = links_[next]->layers();
          for (int layer = layers.first; layer < layers.end; ++layer) batch.after_layer_kv(layer);
        } catch (...) {
          streaming.error = std::current_exception();
        }
        lock.lock();
        continue;
      }
      if (std::find(arrived_.begin(), arrived_.end(), i) != arrived_.end()) return &jobs_[i];
      came_back_.wait(lock);
    }
  }

  std::unique_ptr<model> last_;
  layer_range last_layers_;
  pipeline_settings settings_;
  kv_cache_shape shape_;  // the smallest pool of all the stages'
  stage_hello expected_base_{};
  std::vector<remote_stage> remote_;
  // links_ and reconnects_ change under links_mutex_; forward() reads links_ without it only
  // between its install_reconnected_links() and its return (in_forward_: the reconnector never
  // replaces one, and an import installs reconnected links only while no forward runs).
  std::vector<std::unique_ptr<stage_link>> links_;
  mutable std::mutex links_mutex_;
  std::condition_variable reconnect_wake_;
  std::vector<reconnect_state> reconnects_;
  bool stopping_ = false;
  bool in_forward_ = false;  // under links_mutex_
  std::thread reconnector_;
  uint64_t losses_ = 0;  // stages noticed lost, under links_mutex_ (the reconnector tells the listener)
  std::mutex listener_mutex_;
  std::function<void()> stage_lost_listener_;
  // Which KV epoch wrote each block: an epoch ends when a lost stage's link is installed again.
  uint32_t kv_epoch_ = 1;
  std::vector<uint32_t> block_epoch_;
  uint64_t step_id_ = 0;
  std::vector<micro_batch_job> jobs_;  // this forward's, one per micro-batch
  std::vector<forward_batch> slices_;  // their arrays
  std::vector<float> part_logits_;     // [rows of one micro-batch, vocab]
  std::mutex mutex_;
  std::condition_variable came_back_;
  std::vector<size_t> arrived_;  // indices of this forward's micro-batches back from the stages
  std::vector<size_t> passed_;   // per link: how many of this forward's micro-batches have left it
  bool stage_failed_ = false;    // a micro-batch of this forward failed at a remote stage
};

}  // namespace

std::unique_ptr<model> make_pipelined_model(std::unique_ptr<model> last_stage, layer_range last_layers,
                                            const std::vector<remote_stage>& remote,
                                            const pipeline_settings& settings) {
  return std::make_unique<pipelined_model>(std::move(last_stage), last_layers, remote, settings);
}

std::unique_ptr<model> make_pipelined_model(std::unique_ptr<model> last_stage, const pipeline_plan& plan,
                                            const kv_channel_keys& keys) {
  plan.validate();
  pipeline_settings settings = plan.settings();
  settings.keys = keys;
  return make_pipelined_model(std::move(last_stage), plan.engine_layers(), plan.stages, settings);
}

}  // namespace troupe
